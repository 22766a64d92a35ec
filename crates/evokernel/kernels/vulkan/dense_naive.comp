#version 450
// dense_naive (Vulkan): one invocation per output of a dense or grouped convolution, any
// spec (1-3 spatial dims as [D, H, W] with leading 1s, stride, dilation, padding before;
// both layouts), multiply-adds in the oracle's (ci, kd, kh, kw) order; the portable
// anchor of the dense ladder. Padding taps are skipped, not multiplied by 0 (a NaN/Inf
// input poisons exactly the outputs whose window covers it). Buffers of ELEM (f32, f16
// or bf16: the host's prelude), f32 arithmetic.
layout(local_size_x = 256) in;

layout(std430, set = 0, binding = 0) readonly buffer Input { ELEM x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Weight { ELEM w[]; };  // [co][ci/g][kd][kh][kw]
layout(std430, set = 0, binding = 2) writeonly buffer Output { ELEM y[]; };

// Mirrored by vulkan::dense_naive (same order, 4-byte fields; 116 bytes).
layout(push_constant) uniform Push {
    int n, cin, cout, cpi, cpo;
    int id, ih, iw, od, oh, ow, kd, kh, kw;
    int sd, sh, sw, dd, dh, dw, pd, ph, pw;
    int channels_last;
    uint total;
} p;

uint input_at(int b, int c, int z, int yy, int xx) {
    return p.channels_last != 0
        ? (((uint(b) * uint(p.id) + uint(z)) * uint(p.ih) + uint(yy)) * uint(p.iw) + uint(xx)) * uint(p.cin) + uint(c)
        : (((uint(b) * uint(p.cin) + uint(c)) * uint(p.id) + uint(z)) * uint(p.ih) + uint(yy)) * uint(p.iw) + uint(xx);
}

void main() {
    const uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < p.total; i += step) {
        uint r = i;
        int co, b, d, h, v;
        if (p.channels_last != 0) {
            co = int(r % uint(p.cout)); r /= uint(p.cout);
            v = int(r % uint(p.ow)); r /= uint(p.ow);
            h = int(r % uint(p.oh)); r /= uint(p.oh);
            d = int(r % uint(p.od)); b = int(r / uint(p.od));
        } else {
            v = int(r % uint(p.ow)); r /= uint(p.ow);
            h = int(r % uint(p.oh)); r /= uint(p.oh);
            d = int(r % uint(p.od)); r /= uint(p.od);
            co = int(r % uint(p.cout)); b = int(r / uint(p.cout));
        }
        const int c0 = co / p.cpo * p.cpi;
        float sum = 0.0;
        for (int ci = 0; ci < p.cpi; ++ci)
            for (int a = 0; a < p.kd; ++a) {
                const int z = d * p.sd + a * p.dd - p.pd;
                if (z < 0 || z >= p.id) continue;
                for (int e = 0; e < p.kh; ++e) {
                    const int yy = h * p.sh + e * p.dh - p.ph;
                    if (yy < 0 || yy >= p.ih) continue;
                    for (int f = 0; f < p.kw; ++f) {
                        const int xx = v * p.sw + f * p.dw - p.pw;
                        if (xx < 0 || xx >= p.iw) continue;
                        const uint wat = (((uint(co) * uint(p.cpi) + uint(ci)) * uint(p.kd) + uint(a)) * uint(p.kh) + uint(e)) * uint(p.kw) + uint(f);
                        sum = fma(LOAD(w[wat]), LOAD(x[input_at(b, c0 + ci, z, yy, xx)]), sum);
                    }
                }
            }
        y[i] = STORE(sum);
    }
}
