#version 450
// dense_direct (Vulkan): direct convolution, dense or grouped, the RDNA plan's config
// struct as specialization constants. A workgroup of TX x TY invocations computes a tile
// of (TY * OPY) rows x (TX * OPX) columns of one output depth slice for KO output
// channels of one group. It walks the group's input channels CI_T at a time: the input
// patch those outputs read (KD slices of HS x WS, zero padding included, rows padded by
// LDS_PAD floats against bank conflicts) and the matching weights ([CI_T][taps][KO]) go
// to shared memory, then each invocation accumulates OPY x OPX outputs x KO channels in
// registers (its outputs strided by TX and TY, so neighbouring invocations read
// neighbouring shared words). Loop bounds are specialization constants: the driver's
// compiler unrolls them. Buffers of ELEM (f32, f16 or bf16: the host's prelude), f32 in
// shared memory and registers. Any stride, dilation and padding, both layouts (loads
// are coalesced along channels in channels-last, along W in channels-first).
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int TX = 8;
layout(constant_id = 2) const int TY = 8;
layout(constant_id = 3) const int OPX = 1;
layout(constant_id = 4) const int OPY = 1;
layout(constant_id = 5) const int KO = 8;
layout(constant_id = 6) const int CI_T = 8;
layout(constant_id = 7) const int LDS_PAD = 0;
layout(constant_id = 8) const int KD = 1;
layout(constant_id = 9) const int KH = 1;
layout(constant_id = 10) const int KW = 1;
layout(constant_id = 11) const int SH = 1;
layout(constant_id = 12) const int SW = 1;
layout(constant_id = 13) const int DH = 1;
layout(constant_id = 14) const int DW = 1;
layout(constant_id = 15) const int HS = 1;  // (TY*OPY - 1)*SH + (KH - 1)*DH + 1
layout(constant_id = 16) const int WS = 1;  // (TX*OPX - 1)*SW + (KW - 1)*DW + 1
const int BH = TY * OPY, BW = TX * OPX, TAPS = KD * KH * KW, ROW = WS + LDS_PAD;

layout(std430, set = 0, binding = 0) readonly buffer Input { ELEM x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Weight { ELEM w[]; };  // [co][ci/g][kd][kh][kw]
layout(std430, set = 0, binding = 2) writeonly buffer Output { ELEM y[]; };

// Mirrored by vulkan::dense_direct (same order, 4-byte fields; 96 bytes).
layout(push_constant) uniform Push {
    int n, cin, cout, cpi, cpo;
    int id, ih, iw, od, oh, ow;
    int sd, dd, pd, ph, pw;
    int channels_last;
    int tiles_w, tiles_h, co_tiles;  // co_tiles: KO-channel tiles a group
    uint groups;                     // workgroups that have work
    int pad0, pad1, pad2;
} p;

shared float xs[CI_T * KD * HS * ROW];
shared float ws[CI_T * TAPS * KO];

void main() {
    uint g = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (g >= p.groups) return;  // the whole workgroup: before any barrier
    const int tw = int(g % uint(p.tiles_w)); g /= uint(p.tiles_w);
    const int th = int(g % uint(p.tiles_h)); g /= uint(p.tiles_h);
    const uint kts = uint(p.cout / p.cpo * p.co_tiles);
    const int kt = int(g % kts); g /= kts;
    const int d = int(g % uint(p.od));
    const int b = int(g / uint(p.od));
    const int grp = kt / p.co_tiles, ct = kt % p.co_tiles;
    const int co0 = grp * p.cpo + ct * KO, ko_n = min(KO, p.cpo - ct * KO);
    const int h0 = th * BH, w0 = tw * BW;
    const int lid = int(gl_LocalInvocationID.x), tx = lid % TX, ty = lid / TX;

    float acc[OPY * OPX * KO];
    for (int i = 0; i < OPY * OPX * KO; ++i) acc[i] = 0.0;

    for (int c0 = 0; c0 < p.cpi; c0 += CI_T) {
        // The patch: channels fastest in channels-last memory, W fastest in channels-first.
        for (int i = lid; i < CI_T * KD * HS * WS; i += TX * TY) {
            int ci, s, r, col;
            if (p.channels_last != 0) {
                ci = i % CI_T; const int rest = i / CI_T;
                col = rest % WS; r = (rest / WS) % HS; s = rest / (WS * HS);
            } else {
                col = i % WS; r = (i / WS) % HS; s = (i / (WS * HS)) % KD; ci = i / (WS * HS * KD);
            }
            const int z = d * p.sd - p.pd + s * p.dd;
            const int yy = h0 * SH - p.ph + r;
            const int xx = w0 * SW - p.pw + col;
            const int c = c0 + ci;
            float v = 0.0;
            if (c < p.cpi && z >= 0 && z < p.id && yy >= 0 && yy < p.ih && xx >= 0 && xx < p.iw) {
                const uint cc = uint(grp * p.cpi + c);
                const uint at = p.channels_last != 0
                    ? (((uint(b) * uint(p.id) + uint(z)) * uint(p.ih) + uint(yy)) * uint(p.iw) + uint(xx)) * uint(p.cin) + cc
                    : (((uint(b) * uint(p.cin) + cc) * uint(p.id) + uint(z)) * uint(p.ih) + uint(yy)) * uint(p.iw) + uint(xx);
                v = LOAD(x[at]);
            }
            xs[((ci * KD + s) * HS + r) * ROW + col] = v;
        }
        for (int i = lid; i < CI_T * TAPS * KO; i += TX * TY) {
            const int k = i % KO, t = (i / KO) % TAPS, ci = i / (KO * TAPS);
            float v = 0.0;
            if (k < ko_n && c0 + ci < p.cpi)
                v = LOAD(w[(uint(co0 + k) * uint(p.cpi) + uint(c0 + ci)) * uint(TAPS) + uint(t)]);
            ws[i] = v;
        }
        barrier();
        for (int ci = 0; ci < CI_T; ++ci)
            for (int s = 0; s < KD; ++s)
                for (int e = 0; e < KH; ++e)
                    for (int f = 0; f < KW; ++f) {
                        const int t = (s * KH + e) * KW + f;
                        float wv[KO];
                        for (int k = 0; k < KO; ++k) wv[k] = ws[(ci * TAPS + t) * KO + k];
                        for (int j = 0; j < OPY; ++j)
                            for (int q = 0; q < OPX; ++q) {
                                const int py = ty + j * TY, px = tx + q * TX;
                                const float xv = xs[((ci * KD + s) * HS + py * SH + e * DH) * ROW + px * SW + f * DW];
                                for (int k = 0; k < KO; ++k)
                                    acc[(j * OPX + q) * KO + k] = fma(xv, wv[k], acc[(j * OPX + q) * KO + k]);
                            }
                    }
        barrier();
    }

    for (int j = 0; j < OPY; ++j)
        for (int q = 0; q < OPX; ++q) {
            const int oy = h0 + ty + j * TY, ox = w0 + tx + q * TX;
            if (oy >= p.oh || ox >= p.ow) continue;
            for (int k = 0; k < ko_n; ++k) {
                const uint co = uint(co0 + k);
                const uint at = p.channels_last != 0
                    ? (((uint(b) * uint(p.od) + uint(d)) * uint(p.oh) + uint(oy)) * uint(p.ow) + uint(ox)) * uint(p.cout) + co
                    : (((uint(b) * uint(p.cout) + co) * uint(p.od) + uint(d)) * uint(p.oh) + uint(oy)) * uint(p.ow) + uint(ox);
                y[at] = STORE(acc[(j * OPX + q) * KO + k]);
            }
        }
}
