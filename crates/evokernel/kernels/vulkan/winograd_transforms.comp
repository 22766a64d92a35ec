#version 450
// The transforms of Winograd F(2x2, 3x3) around dense_coopmat2's GEMM
// (vulkan::dense_winograd_coopmat2): 16 GEMMs, one per point of the 4 x 4 transformed
// tile, M = the output's 2 x 2 tiles, K = Cin, N = Cout. NHWC / NDHWC f16, channels
// multiples of 8; an invocation takes one tile's 8 channels (16-byte pieces), in f32.
//   Input (the default): the 4 x 4 input patch of tile m (zero outside the input) to
//     V[p][m][c] = (B^T d B)[p], p = 4 i + j, rows m of tiles .. mpad zero (the GEMM's
//     tiles read them; their outputs are never read).
//   OUTPUT_TRANSFORM (the host's #define): the GEMM's products M[p][m][co] to the 2 x 2
//     outputs (A^T M A), those inside the output written.
// The tiles: m = ((b * od + d) * th + ty) * tw + tx over the output's depth slices (a
// kernel of one tap in depth: output slice d reads input slice d * sd - pd, zero outside).

layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) readonly buffer Source { uvec4 src[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Destination { uvec4 dst[]; };

// Mirrored by vulkan::dense_winograd_coopmat2 (4-byte fields).
layout(push_constant) uniform Push {
    int channels8;    // Cin / 8 (input) or Cout / 8 (output)
    int id, ih, iw, od, oh, ow;
    int sd, pd, ph, pw;
    int th, tw;       // 2 x 2 tiles along H and W
    int tiles;        // n * od * th * tw
    int mpad;         // the GEMM's rows a point (tiles rounded up to its tile height)
} p;

// 8 halves as two vec4s and back.
void unpack8(uvec4 v, out vec4 lo, out vec4 hi) {
    lo = vec4(unpackHalf2x16(v.x), unpackHalf2x16(v.y));
    hi = vec4(unpackHalf2x16(v.z), unpackHalf2x16(v.w));
}
uvec4 pack8(vec4 lo, vec4 hi) {
    return uvec4(packHalf2x16(lo.xy), packHalf2x16(lo.zw), packHalf2x16(hi.xy), packHalf2x16(hi.zw));
}

void main() {
    const int item = int((gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * gl_WorkGroupSize.x
                         + gl_LocalInvocationID.x);
    const int c8 = item % p.channels8, m = item / p.channels8;
#ifndef OUTPUT_TRANSFORM
    if (m >= p.mpad) return;
    vec4 lo[16], hi[16];
    for (int i = 0; i < 16; ++i) { lo[i] = vec4(0.0); hi[i] = vec4(0.0); }
    if (m < p.tiles) {
        int q = m;
        const int tx = q % p.tw; q /= p.tw;
        const int ty = q % p.th; q /= p.th;
        const int d = q % p.od;
        const int b = q / p.od;
        const int z = d * p.sd - p.pd, y0 = 2 * ty - p.ph, x0 = 2 * tx - p.pw;
        if (uint(z) < uint(p.id)) {
            for (int i = 0; i < 4; ++i) {
                for (int j = 0; j < 4; ++j) {
                    const int y = y0 + i, x = x0 + j;
                    if (uint(y) < uint(p.ih) && uint(x) < uint(p.iw))
                        unpack8(src[(((b * p.id + z) * p.ih + y) * p.iw + x) * p.channels8 + c8],
                                lo[4 * i + j], hi[4 * i + j]);
                }
            }
        }
    }
    // B^T d: rows d0 - d2, d1 + d2, d2 - d1, d1 - d3; then the same along the columns.
    vec4 tlo[16], thi[16];
    for (int j = 0; j < 4; ++j) {
        tlo[j] = lo[j] - lo[8 + j];       thi[j] = hi[j] - hi[8 + j];
        tlo[4 + j] = lo[4 + j] + lo[8 + j]; thi[4 + j] = hi[4 + j] + hi[8 + j];
        tlo[8 + j] = lo[8 + j] - lo[4 + j]; thi[8 + j] = hi[8 + j] - hi[4 + j];
        tlo[12 + j] = lo[4 + j] - lo[12 + j]; thi[12 + j] = hi[4 + j] - hi[12 + j];
    }
    const int point = p.mpad * p.channels8;  // V's stride between points
    const int at = m * p.channels8 + c8;
    for (int i = 0; i < 4; ++i) {
        const int r = 4 * i;
        dst[(r + 0) * point + at] = pack8(tlo[r] - tlo[r + 2], thi[r] - thi[r + 2]);
        dst[(r + 1) * point + at] = pack8(tlo[r + 1] + tlo[r + 2], thi[r + 1] + thi[r + 2]);
        dst[(r + 2) * point + at] = pack8(tlo[r + 2] - tlo[r + 1], thi[r + 2] - thi[r + 1]);
        dst[(r + 3) * point + at] = pack8(tlo[r + 1] - tlo[r + 3], thi[r + 1] - thi[r + 3]);
    }
#else
    if (m >= p.tiles) return;
    const int point = p.mpad * p.channels8;
    const int at = m * p.channels8 + c8;
    vec4 lo[16], hi[16];
    for (int i = 0; i < 16; ++i) unpack8(src[i * point + at], lo[i], hi[i]);
    // A^T M: rows M0 + M1 + M2, M1 - M2 - M3; then the same along the columns.
    vec4 tlo[8], thi[8];
    for (int j = 0; j < 4; ++j) {
        tlo[j] = lo[j] + lo[4 + j] + lo[8 + j];      thi[j] = hi[j] + hi[4 + j] + hi[8 + j];
        tlo[4 + j] = lo[4 + j] - lo[8 + j] - lo[12 + j]; thi[4 + j] = hi[4 + j] - hi[8 + j] - hi[12 + j];
    }
    int q = m;
    const int tx = q % p.tw; q /= p.tw;
    const int ty = q % p.th; q /= p.th;
    const int d = q % p.od;
    const int b = q / p.od;
    for (int i = 0; i < 2; ++i) {
        const int r = 4 * i, y = 2 * ty + i;
        if (y >= p.oh) break;
        const vec4 l0 = tlo[r] + tlo[r + 1] + tlo[r + 2], h0 = thi[r] + thi[r + 1] + thi[r + 2];
        const vec4 l1 = tlo[r + 1] - tlo[r + 2] - tlo[r + 3], h1 = thi[r + 1] - thi[r + 2] - thi[r + 3];
        const int row = ((b * p.od + d) * p.oh + y) * p.ow;
        dst[(row + 2 * tx) * p.channels8 + c8] = pack8(l0, h0);
        if (2 * tx + 1 < p.ow) dst[(row + 2 * tx + 1) * p.channels8 + c8] = pack8(l1, h1);
    }
#endif
}
