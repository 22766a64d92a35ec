#version 450
// naive (Vulkan): one invocation per output, any depthwise spec (1-3 spatial dims as
// [D, H, W] with leading 1s, stride, dilation, padding before; both layouts), f32,
// multiply-adds in the oracle's tap order; the portable anchor of the Vulkan ladder.
// Padding taps are skipped, not multiplied by 0 (a NaN/Inf input poisons exactly the
// outputs whose window covers it, as in the oracle).
layout(local_size_x = 256) in;

layout(std430, set = 0, binding = 0) readonly buffer Input { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Weight { float w[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Output { float y[]; };

// Mirrored by vulkan::naive::Push (same order, 4-byte fields).
layout(push_constant) uniform Push {
    int n, c, id, ih, iw, od, oh, ow, kd, kh, kw;
    int sd, sh, sw, dd, dh, dw, pd, ph, pw;
    int channels_last;
    uint total;
} p;

void main() {
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < p.total; i += step) {
        uint r = i;
        int ch, b, d, h, v;
        if (p.channels_last != 0) {
            ch = int(r % uint(p.c)); r /= uint(p.c);
            v = int(r % uint(p.ow)); r /= uint(p.ow);
            h = int(r % uint(p.oh)); r /= uint(p.oh);
            d = int(r % uint(p.od)); b = int(r / uint(p.od));
        } else {
            v = int(r % uint(p.ow)); r /= uint(p.ow);
            h = int(r % uint(p.oh)); r /= uint(p.oh);
            d = int(r % uint(p.od)); r /= uint(p.od);
            ch = int(r % uint(p.c)); b = int(r / uint(p.c));
        }
        float acc = 0.0;
        for (int a = 0; a < p.kd; ++a) {
            int zi = d * p.sd - p.pd + a * p.dd;
            if (zi < 0 || zi >= p.id) continue;
            for (int e = 0; e < p.kh; ++e) {
                int yi = h * p.sh - p.ph + e * p.dh;
                if (yi < 0 || yi >= p.ih) continue;
                for (int f = 0; f < p.kw; ++f) {
                    int xi = v * p.sw - p.pw + f * p.dw;
                    if (xi < 0 || xi >= p.iw) continue;
                    uint at = p.channels_last != 0
                        ? (((uint(b) * uint(p.id) + uint(zi)) * uint(p.ih) + uint(yi)) * uint(p.iw) + uint(xi)) * uint(p.c) + uint(ch)
                        : (((uint(b) * uint(p.c) + uint(ch)) * uint(p.id) + uint(zi)) * uint(p.ih) + uint(yi)) * uint(p.iw) + uint(xi);
                    acc = fma(x[at], w[((ch * p.kd + a) * p.kh + e) * p.kw + f], acc);
                }
            }
        }
        y[i] = acc;
    }
}
