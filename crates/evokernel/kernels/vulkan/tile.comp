#version 450
// tile (Vulkan): smem_tile's method in portable GLSL. A workgroup takes a band of ROWS
// output rows of one (n, c, output depth) plane: the KD input slices the band reads go
// to shared memory once (zero padding included, so the loop has no bounds checks), then
// each invocation computes OUT_W consecutive outputs of a row from there. The config
// (workgroup size, OUT_W, ROWS, kernel size, W stride and dilation, the shared tile's
// shape) is specialization constants: one pipeline per config, sized by the host from
// the device's limits (vulkan::tile). Buffers of ELEM (f32, f16 or bf16: the host's
// prelude), f32 in registers and shared memory; any stride and dilation, both layouts.
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int KD = 1;
layout(constant_id = 2) const int KH = 1;
layout(constant_id = 3) const int KW = 1;
layout(constant_id = 4) const int OUT_W = 1;
layout(constant_id = 5) const int ROWS = 1;
layout(constant_id = 6) const int SW = 1;
layout(constant_id = 7) const int DW = 1;
layout(constant_id = 8) const int HS = 1;   // shared rows a slice: (ROWS-1)*sh + (KH-1)*dh + 1
layout(constant_id = 9) const int WS = 1;   // floats a shared row: every column the band reads

layout(std430, set = 0, binding = 0) readonly buffer Input { ELEM x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Weight { ELEM w[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Output { ELEM y[]; };

// Mirrored by vulkan::tile::Push (same order, 4-byte fields).
layout(push_constant) uniform Push {
    int n, c, id, ih, iw, od, oh, ow;
    int sd, sh, dd, dh, pd, ph, pw;
    int channels_last;
    uint groups;  // bands x planes: the workgroups that have work
} p;

shared float tile[KD * HS * WS];

void main() {
    const uint g = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (g >= p.groups) return;  // the whole workgroup: before any barrier
    const int bands = (p.oh + ROWS - 1) / ROWS;
    const int band = int(g % uint(bands));
    uint plane = g / uint(bands);
    const int d = int(plane % uint(p.od)); plane /= uint(p.od);
    const int ch = int(plane % uint(p.c));
    const int b = int(plane / uint(p.c));
    const int h0 = band * ROWS;
    const uint lid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;

    for (uint i = lid; i < uint(KD * HS * WS); i += wg) {
        const int s = int(i) / (HS * WS), r = (int(i) / WS) % HS, col = int(i) % WS;
        const int zi = d * p.sd - p.pd + s * p.dd;
        const int yi = h0 * p.sh - p.ph + r;
        const int xi = col - p.pw;
        float v = 0.0;
        if (zi >= 0 && zi < p.id && yi >= 0 && yi < p.ih && xi >= 0 && xi < p.iw) {
            const uint at = p.channels_last != 0
                ? (((uint(b) * uint(p.id) + uint(zi)) * uint(p.ih) + uint(yi)) * uint(p.iw) + uint(xi)) * uint(p.c) + uint(ch)
                : (((uint(b) * uint(p.c) + uint(ch)) * uint(p.id) + uint(zi)) * uint(p.ih) + uint(yi)) * uint(p.iw) + uint(xi);
            v = LOAD(x[at]);
        }
        tile[i] = v;
    }
    barrier();

    const int groups_w = (p.ow + OUT_W - 1) / OUT_W;
    const int rows = min(ROWS, p.oh - h0);
    for (uint t = lid; t < uint(rows * groups_w); t += wg) {
        const int row = int(t) / groups_w;
        const int ow0 = (int(t) % groups_w) * OUT_W;
        float acc[OUT_W];
        for (int o = 0; o < OUT_W; ++o) acc[o] = 0.0;
        // Taps in the oracle's (kd, kh, kw) order.
        for (int a = 0; a < KD; ++a)
            for (int e = 0; e < KH; ++e) {
                const int base = (a * HS + row * p.sh + e * p.dh) * WS + ow0 * SW;
                for (int f = 0; f < KW; ++f) {
                    const float wt = LOAD(w[((ch * KD + a) * KH + e) * KW + f]);
                    for (int o = 0; o < OUT_W; ++o)
                        acc[o] = fma(tile[base + o * SW + f * DW], wt, acc[o]);
                }
            }
        const int oh = h0 + row;
        for (int o = 0; o < OUT_W; ++o) {
            const int v = ow0 + o;
            if (v >= p.ow) break;
            const uint at = p.channels_last != 0
                ? (((uint(b) * uint(p.od) + uint(d)) * uint(p.oh) + uint(oh)) * uint(p.ow) + uint(v)) * uint(p.c) + uint(ch)
                : (((uint(b) * uint(p.c) + uint(ch)) * uint(p.od) + uint(d)) * uint(p.oh) + uint(oh)) * uint(p.ow) + uint(v);
            y[at] = STORE(acc[o]);
        }
    }
}
