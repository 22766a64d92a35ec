#version 450
// dense_winograd (Vulkan): Winograd F(2x2, 3x3) for dense or grouped convolution with
// 3 x 3 kernels (1 x 3 x 3 in 3-D), stride 1 and dilation 1 in H and W. The host
// transforms the weights once (U = G g G^T, 16 floats per output and input channel,
// f32, binding 1). A workgroup of TX x TY invocations takes TX x TY output tiles of
// 2 x 2 of one output depth slice for KO output channels of one group; per step of CI_T
// input channels the (2 TY + 2) x (2 TX + 2) input patch (zero padding included) and the
// step's U go to shared memory; each invocation transforms its tile's 4 x 4 inputs
// (V = B^T d B) and accumulates U . V for its KO channels (16 multiply-adds a channel
// pair where the direct form takes 36), then writes Y = A^T M A. Activations of ELEM
// (f32, f16 or bf16: the host's prelude), the transforms in f32. Both layouts.
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int TX = 8;
layout(constant_id = 2) const int TY = 4;
layout(constant_id = 3) const int KO = 4;
layout(constant_id = 4) const int CI_T = 8;
const int PH = 2 * TY + 2, PW = 2 * TX + 2;

layout(std430, set = 0, binding = 0) readonly buffer Input { ELEM x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Transformed { float u[]; };  // [co][ci/g][16]
layout(std430, set = 0, binding = 2) writeonly buffer Output { ELEM y[]; };

// Mirrored by vulkan::dense_winograd (same order, 4-byte fields; 80 bytes).
layout(push_constant) uniform Push {
    int n, cin, cout, cpi, cpo;
    int id, ih, iw, od, oh, ow;
    int sd, dd, pd, ph, pw;
    int channels_last;
    int tiles_w, tiles_h, co_tiles;  // workgroup tiles along W and H; KO-channel tiles a group
} p;

shared float xs[CI_T * PH * PW];
shared float us[CI_T * KO * 16];

void main() {
    uint g = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    const uint kts = uint(p.cout / p.cpo * p.co_tiles);
    const uint total = uint(p.tiles_w) * uint(p.tiles_h) * kts * uint(p.od) * uint(p.n);
    if (g >= total) return;  // the whole workgroup: before any barrier
    const int tw = int(g % uint(p.tiles_w)); g /= uint(p.tiles_w);
    const int th = int(g % uint(p.tiles_h)); g /= uint(p.tiles_h);
    const int kt = int(g % kts); g /= kts;
    const int d = int(g % uint(p.od));
    const int b = int(g / uint(p.od));
    const int grp = kt / p.co_tiles, ct = kt % p.co_tiles;
    const int co0 = grp * p.cpo + ct * KO, ko_n = min(KO, p.cpo - ct * KO);
    const int h0 = th * 2 * TY, w0 = tw * 2 * TX;  // the workgroup's first output row, column
    const int lid = int(gl_LocalInvocationID.x), tx = lid % TX, ty = lid / TX;
    const int z = d * p.sd - p.pd;  // the one input slice (kernel depth 1)
    const bool z_in = z >= 0 && z < p.id;

    float m[KO * 16];
    for (int i = 0; i < KO * 16; ++i) m[i] = 0.0;

    for (int c0 = 0; c0 < p.cpi; c0 += CI_T) {
        for (int i = lid; i < CI_T * PH * PW; i += TX * TY) {
            int ci, r, col;
            if (p.channels_last != 0) {
                ci = i % CI_T; const int rest = i / CI_T; col = rest % PW; r = rest / PW;
            } else {
                col = i % PW; r = (i / PW) % PH; ci = i / (PW * PH);
            }
            const int yy = h0 - p.ph + r, xx = w0 - p.pw + col, c = c0 + ci;
            float v = 0.0;
            if (z_in && c < p.cpi && yy >= 0 && yy < p.ih && xx >= 0 && xx < p.iw) {
                const uint cc = uint(grp * p.cpi + c);
                const uint at = p.channels_last != 0
                    ? (((uint(b) * uint(p.id) + uint(z)) * uint(p.ih) + uint(yy)) * uint(p.iw) + uint(xx)) * uint(p.cin) + cc
                    : (((uint(b) * uint(p.cin) + cc) * uint(p.id) + uint(z)) * uint(p.ih) + uint(yy)) * uint(p.iw) + uint(xx);
                v = LOAD(x[at]);
            }
            xs[(ci * PH + r) * PW + col] = v;
        }
        for (int i = lid; i < CI_T * KO * 16; i += TX * TY) {
            const int j = i % 16, k = (i / 16) % KO, ci = i / (16 * KO);
            float v = 0.0;
            if (k < ko_n && c0 + ci < p.cpi)
                v = u[(uint(co0 + k) * uint(p.cpi) + uint(c0 + ci)) * 16u + uint(j)];
            us[i] = v;
        }
        barrier();
        for (int ci = 0; ci < CI_T; ++ci) {
            // d: this tile's 4 x 4 inputs; V = B^T d B.
            float dd[16];
            const int base = (ci * PH + 2 * ty) * PW + 2 * tx;
            for (int r = 0; r < 4; ++r)
                for (int c = 0; c < 4; ++c) dd[r * 4 + c] = xs[base + r * PW + c];
            float t[16];  // B^T d
            for (int c = 0; c < 4; ++c) {
                t[0 * 4 + c] = dd[0 * 4 + c] - dd[2 * 4 + c];
                t[1 * 4 + c] = dd[1 * 4 + c] + dd[2 * 4 + c];
                t[2 * 4 + c] = dd[2 * 4 + c] - dd[1 * 4 + c];
                t[3 * 4 + c] = dd[1 * 4 + c] - dd[3 * 4 + c];
            }
            float v[16];  // (B^T d) B
            for (int r = 0; r < 4; ++r) {
                v[r * 4 + 0] = t[r * 4 + 0] - t[r * 4 + 2];
                v[r * 4 + 1] = t[r * 4 + 1] + t[r * 4 + 2];
                v[r * 4 + 2] = t[r * 4 + 2] - t[r * 4 + 1];
                v[r * 4 + 3] = t[r * 4 + 1] - t[r * 4 + 3];
            }
            for (int k = 0; k < KO; ++k)
                for (int j = 0; j < 16; ++j)
                    m[k * 16 + j] = fma(us[(ci * KO + k) * 16 + j], v[j], m[k * 16 + j]);
        }
        barrier();
    }

    const int oy0 = h0 + 2 * ty, ox0 = w0 + 2 * tx;
    for (int k = 0; k < ko_n; ++k) {
        // Y = A^T M A, A^T = [1 1 1 0; 0 1 -1 -1].
        float a[8];  // A^T M: 2 x 4
        for (int c = 0; c < 4; ++c) {
            a[0 * 4 + c] = m[k * 16 + 0 * 4 + c] + m[k * 16 + 1 * 4 + c] + m[k * 16 + 2 * 4 + c];
            a[1 * 4 + c] = m[k * 16 + 1 * 4 + c] - m[k * 16 + 2 * 4 + c] - m[k * 16 + 3 * 4 + c];
        }
        const uint co = uint(co0 + k);
        for (int r = 0; r < 2; ++r) {
            const float out2[2] = float[2](a[r * 4 + 0] + a[r * 4 + 1] + a[r * 4 + 2],
                                           a[r * 4 + 1] - a[r * 4 + 2] - a[r * 4 + 3]);
            const int oy = oy0 + r;
            if (oy >= p.oh) continue;
            for (int c = 0; c < 2; ++c) {
                const int ox = ox0 + c;
                if (ox >= p.ow) continue;
                const uint at = p.channels_last != 0
                    ? (((uint(b) * uint(p.od) + uint(d)) * uint(p.oh) + uint(oy)) * uint(p.ow) + uint(ox)) * uint(p.cout) + co
                    : (((uint(b) * uint(p.cout) + co) * uint(p.od) + uint(d)) * uint(p.oh) + uint(oy)) * uint(p.ow) + uint(ox);
                y[at] = STORE(out2[c]);
            }
        }
    }
}
