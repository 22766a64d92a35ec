#version 450
// depth_rotate_cl (Vulkan): the FMA depth rotation on channels-last data with lanes over
// channels (depth_reuse_fma_cl's method in portable GLSL), for depthwise specs with depth
// stride and dilation 1. An invocation owns CV consecutive channels and a run of OUT_W
// outputs of OUT_H output rows; neighbouring invocations own neighbouring channels, so
// every load is coalesced across the workgroup with no shared memory for the input.
// Walking down the depth, each input slice's row segments are read once into registers
// and accumulated into the KD output depths they feed (acc[j] is output depth base + j;
// after a slice the oldest is complete, is stored, and the others shift down). Buffers of
// ELEM (f32, f16 or bf16: the host's prelude), f32 arithmetic.
// CV (a #define from the host: 1, 2 or 4): a pixel's CV channels are one 4-16 byte load
// and store (VELEM), every FMA a CV-wide vector one; with CV = 1 the loads, one 2-byte
// element each, bound the shader on many-tap rows (70 loads for 196 FMAs a run of 7x7).
// OUT_H > 1: each input row segment an invocation reads feeds every output row of its
// run that reaches it: (OUT_H - 1) * SH + (KH - 1) * DH + 1 segments a slice instead of
// OUT_H * KH.
// The channel's weights stay in registers (at most 80 an invocation: the host refuses
// more; weights in shared memory ran 3-8x slower, H100 run 271), or with WROW each
// kernel row's are read where they are used (L1 serves them: a warp's loads of one tap
// are consecutive): on a layer of one depth slice an invocation meets each weight once
// a run, and 49 of them held in registers capped what else it could hold.
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int KD = 1;
layout(constant_id = 2) const int KH = 1;
layout(constant_id = 3) const int KW = 1;
layout(constant_id = 4) const int OUT_W = 1;
layout(constant_id = 5) const int SW = 1;
layout(constant_id = 6) const int DW = 1;
layout(constant_id = 7) const int OUT_H = 1;
layout(constant_id = 8) const int SH = 1;
layout(constant_id = 9) const int DH = 1;
layout(constant_id = 10) const int WROW = 0;
const int SEG = (OUT_W - 1) * SW + (KW - 1) * DW + 1;  // inputs a row segment spans
const int RH = (OUT_H - 1) * SH + (KH - 1) * DH + 1;   // input rows a slice's run reads
const int TAPS = KD * KH * KW;

layout(std430, set = 0, binding = 0) readonly buffer Input { VELEM x[]; };
// The weight as CV-element vectors (c is a whole number of them): a tap's CV channels are
// one load, where CV element loads took CV issue slots (with WROW, 150 of the seed's
// loads a slice against 60 for its input).
layout(std430, set = 0, binding = 1) readonly buffer Weight { VELEM w[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Output { VELEM y[]; };

// Mirrored by vulkan::depth_rotate_cl (same order, 4-byte fields).
layout(push_constant) uniform Push {
    int n, c, id, ih, iw, od, oh, ow;
    int sh, dh, pd, ph, pw;
    int runs_w;    // runs of OUT_W outputs a row
    int c_blocks;  // workgroups across the channels
    uint groups;   // workgroups that have work
    int runs_h;    // runs of OUT_H output rows
    int cvs;       // channel vectors a pixel: c / CV
} p;

// Tap t of channel vector v's CV channels, one load. The host uploads the weight tap-major,
// [KD][KH][KW][C] (its [C][KD][KH][KW] transposed): a warp's lanes, on consecutive
// channels, read one tap's consecutive elements (channel-major, lanes sat TAPS elements
// apart: 32 sectors a warp-wide load, the invocation's only loads on a 2-D layer besides
// its run's).
VEC weight(int v, int t) { return LOADV(w[t * p.cvs + v]); }

void main() {
    uint g = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (g >= p.groups) return;
    const int cb = int(g % uint(p.c_blocks)); g /= uint(p.c_blocks);
    const int run = int(g % uint(p.runs_w)); g /= uint(p.runs_w);
    const int row = int(g % uint(p.runs_h)) * OUT_H;  // the run's first output row
    const int b = int(g / uint(p.runs_h));
    const int lane = int(gl_LocalInvocationID.x);
    const int cv = cb * int(gl_WorkGroupSize.x) + lane;  // the invocation's channel vector
    if (cv >= p.cvs) return;  // no barrier below
    const int ow0 = run * OUT_W;

    VEC wt[WROW != 0 ? 1 : TAPS];
    if (WROW == 0) [[unroll]] for (int t = 0; t < TAPS; ++t) wt[t] = weight(cv, t);
    // acc[(j * OUT_H + h) * OUT_W + o]: output depth base + j, row row + h, column ow0 + o.
    VEC acc[KD * OUT_H * OUT_W];
    [[unroll]] for (int i = 0; i < KD * OUT_H * OUT_W; ++i) acc[i] = VEC(0.0);

    for (int zi = -p.pd; zi + p.pd - (KD - 1) < p.od; ++zi) {
        if (zi >= 0 && zi < p.id) {
            // Input row r of the run feeds output row h with kernel row e where
            // r = h * SH + e * DH (all compile-time: the loops unroll to fixed registers).
            [[unroll]] for (int r = 0; r < RH; ++r) {
                // Rows between dilated taps feed no output row of the run: not read.
                bool feeds = false;
                [[unroll]] for (int h = 0; h < OUT_H; ++h)
                    feeds = feeds || (r >= h * SH && (r - h * SH) % DH == 0 && (r - h * SH) / DH < KH);
                const int yi = row * SH - p.ph + r;
                if (!feeds || yi < 0 || yi >= p.ih) continue;
                // The row segment, read once: zero where it lands in the padding.
                const uint pix = (uint(b) * uint(p.id) + uint(zi)) * uint(p.ih) + uint(yi);
                VEC seg[SEG];
                [[unroll]] for (int s = 0; s < SEG; ++s) {
                    const int xi = ow0 * SW - p.pw + s;
                    seg[s] = (xi >= 0 && xi < p.iw)
                        ? LOADV(x[(pix * uint(p.iw) + uint(xi)) * uint(p.cvs) + uint(cv)])
                        : VEC(0.0);
                }
                [[unroll]] for (int h = 0; h < OUT_H; ++h) {
                    const int de = r - h * SH;
                    if (de < 0 || de % DH != 0 || de / DH >= KH) continue;
                    const int e = de / DH;
                    // Output depth base + j reads this slice with tap a = KD - 1 - j.
                    [[unroll]] for (int j = 0; j < KD; ++j)
                        [[unroll]] for (int f = 0; f < KW; ++f) {
                            const int tap = ((KD - 1 - j) * KH + e) * KW + f;
                            const VEC wv = WROW != 0 ? weight(cv, tap) : wt[WROW != 0 ? 0 : tap];
                            [[unroll]] for (int o = 0; o < OUT_W; ++o)
                                acc[(j * OUT_H + h) * OUT_W + o] = fma(seg[o * SW + f * DW], wv, acc[(j * OUT_H + h) * OUT_W + o]);
                        }
                }
            }
        }
        const int base_od = zi + p.pd - (KD - 1);
        if (base_od >= 0)
            [[unroll]] for (int h = 0; h < OUT_H; ++h) {
                if (row + h >= p.oh) break;
                [[unroll]] for (int o = 0; o < OUT_W; ++o) {
                    const int v = ow0 + o;
                    if (v >= p.ow) break;
                    y[(((uint(b) * uint(p.od) + uint(base_od)) * uint(p.oh) + uint(row + h)) * uint(p.ow) + uint(v)) * uint(p.cvs) + uint(cv)] = STOREV(acc[h * OUT_W + o]);
                }
            }
        [[unroll]] for (int j = 0; j + 1 < KD; ++j)
            [[unroll]] for (int i = 0; i < OUT_H * OUT_W; ++i)
                acc[j * OUT_H * OUT_W + i] = acc[(j + 1) * OUT_H * OUT_W + i];
        [[unroll]] for (int i = 0; i < OUT_H * OUT_W; ++i) acc[(KD - 1) * OUT_H * OUT_W + i] = VEC(0.0);
    }
}
