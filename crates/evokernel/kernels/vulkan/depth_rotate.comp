#version 450
// depth_rotate (Vulkan): the FMA rotation of depth_reuse_fma in portable GLSL, for
// depthwise specs with depth stride and dilation 1 (3-D; 1-2-D specs are one slice). A
// workgroup owns a band of ROWS output rows of one (n, c) plane and walks down its
// depth: each input slice's band (zero padding included) goes to shared memory once and
// feeds the KD output depths it reaches, whose partial sums each invocation keeps in
// registers (acc[j] is output depth base + j; after a slice the oldest is complete, is
// stored, and the others shift down). Input traffic is one read of each slice where the
// tiled shader reads it KD times. Each invocation owns ITEMS runs of OUT_W outputs of
// the band (fixed across slices: its sums stay in registers). Buffers of ELEM (f32, f16
// or bf16: the host's prelude), f32 in shared memory and registers. Both layouts.
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int KD = 1;
layout(constant_id = 2) const int KH = 1;
layout(constant_id = 3) const int KW = 1;
layout(constant_id = 4) const int OUT_W = 1;
layout(constant_id = 5) const int ROWS = 1;
layout(constant_id = 6) const int SW = 1;
layout(constant_id = 7) const int DW = 1;
layout(constant_id = 8) const int HS = 1;    // (ROWS-1)*sh + (KH-1)*dh + 1
layout(constant_id = 9) const int WS = 1;    // every column the band reads
layout(constant_id = 10) const int ITEMS = 1;

layout(std430, set = 0, binding = 0) readonly buffer Input { ELEM x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Weight { ELEM w[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Output { ELEM y[]; };

// Mirrored by vulkan::depth_rotate (same order, 4-byte fields).
layout(push_constant) uniform Push {
    int n, c, id, ih, iw, od, oh, ow;
    int sh, dh, pd, ph, pw;
    int channels_last;
    uint groups;  // bands x planes: the workgroups that have work
} p;

shared float band[HS * WS];

void main() {
    const uint g = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (g >= p.groups) return;  // the whole workgroup: before any barrier
    const int bands = (p.oh + ROWS - 1) / ROWS;
    const int bnd = int(g % uint(bands));
    const uint plane = g / uint(bands);
    const int ch = int(plane % uint(p.c));
    const int b = int(plane / uint(p.c));
    const int h0 = bnd * ROWS;
    const uint lid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
    const int groups_w = (p.ow + OUT_W - 1) / OUT_W;
    const int rows = min(ROWS, p.oh - h0);
    const int items = rows * groups_w;

    // Weights of this channel in registers: all KD x KH x KW taps.
    float wt[KD * KH * KW];
    for (int t = 0; t < KD * KH * KW; ++t) wt[t] = LOAD(w[ch * KD * KH * KW + t]);

    float acc[ITEMS * KD * OUT_W];
    for (int i = 0; i < ITEMS * KD * OUT_W; ++i) acc[i] = 0.0;

    // Input slice zi feeds output depths zi + pd - a (a = 0..KD-1); after it, output
    // depth zi + pd - (KD - 1) is complete. Slices past the input are zero: skipped, but
    // their outputs still complete.
    for (int zi = -p.pd; zi + p.pd - (KD - 1) < p.od; ++zi) {
        const bool live = zi >= 0 && zi < p.id;
        if (live) {
            for (uint i = lid; i < uint(HS * WS); i += wg) {
                const int r = int(i) / WS, col = int(i) % WS;
                const int yi = h0 * p.sh - p.ph + r, xi = col - p.pw;
                float v = 0.0;
                if (yi >= 0 && yi < p.ih && xi >= 0 && xi < p.iw) {
                    const uint at = p.channels_last != 0
                        ? (((uint(b) * uint(p.id) + uint(zi)) * uint(p.ih) + uint(yi)) * uint(p.iw) + uint(xi)) * uint(p.c) + uint(ch)
                        : (((uint(b) * uint(p.c) + uint(ch)) * uint(p.id) + uint(zi)) * uint(p.ih) + uint(yi)) * uint(p.iw) + uint(xi);
                    v = LOAD(x[at]);
                }
                band[i] = v;
            }
            barrier();
        }
        const int base_od = zi + p.pd - (KD - 1);  // acc[.][0] is this output depth
        for (int it = 0; it < ITEMS; ++it) {
            const int t = int(lid) + it * int(wg);
            if (t >= items) continue;
            const int row = t / groups_w, ow0 = (t % groups_w) * OUT_W;
            if (live) {
                // Output depth base_od + j reads this slice with tap a = KD - 1 - j.
                for (int j = 0; j < KD; ++j) {
                    const int a = KD - 1 - j;
                    for (int e = 0; e < KH; ++e) {
                        const int at = (row * p.sh + e * p.dh) * WS + ow0 * SW;
                        for (int f = 0; f < KW; ++f) {
                            const float wv = wt[(a * KH + e) * KW + f];
                            for (int o = 0; o < OUT_W; ++o)
                                acc[(it * KD + j) * OUT_W + o] = fma(band[at + o * SW + f * DW], wv, acc[(it * KD + j) * OUT_W + o]);
                        }
                    }
                }
            }
            if (base_od >= 0) {
                const int oh = h0 + row;
                for (int o = 0; o < OUT_W; ++o) {
                    const int v = ow0 + o;
                    if (v >= p.ow) break;
                    const uint at = p.channels_last != 0
                        ? (((uint(b) * uint(p.od) + uint(base_od)) * uint(p.oh) + uint(oh)) * uint(p.ow) + uint(v)) * uint(p.c) + uint(ch)
                        : (((uint(b) * uint(p.c) + uint(ch)) * uint(p.od) + uint(base_od)) * uint(p.oh) + uint(oh)) * uint(p.ow) + uint(v);
                    y[at] = STORE(acc[(it * KD) * OUT_W + o]);
                }
            }
            // Rotate: the oldest depth leaves, a fresh one enters at the top.
            for (int j = 0; j + 1 < KD; ++j)
                for (int o = 0; o < OUT_W; ++o)
                    acc[(it * KD + j) * OUT_W + o] = acc[(it * KD + j + 1) * OUT_W + o];
            for (int o = 0; o < OUT_W; ++o) acc[(it * KD + KD - 1) * OUT_W + o] = 0.0;
        }
        if (live) barrier();  // the band is reloaded by the next live slice
    }
}
