// dgrad_gather: grad-input for any spec, the first rung of the dgrad ladder and the one
// strided specs use (unit-stride specs also run as the forward of the flipped kernel,
// src/engine/backward.rs). One thread per grad_input element gathers every (output,
// tap) pair that read it: o * stride + k * dilation - pad = i. f32 accumulation.
// Arguments (the forward's geometry): a.x = grad_output (the forward output's shape),
// a.w = weight, a.y = grad_input (the forward input's shape). EPI must be 0.
template <int STRIDE>
__device__ __forceinline__ bool tap_output(int i, int k, int dil, int pad, int stride, int out, int& o) {
    const int num = i + pad - k * dil;
    if (num < 0) return false;
    const int s = STRIDE > 0 ? STRIDE : stride;
    if (s != 1 && num % s != 0) return false;
    o = s == 1 ? num : num / s;
    return o < out;
}

template <typename T, bool CHANNELS_LAST, int KD, int KH, int KW, int UNIT_STRIDE, int EPI>
__global__ void __launch_bounds__(256) dgrad_gather_dwconv(ConvArgs a, EpiArgs) {
    static_assert(EPI == 0, "grad-input has no fused epilogue");
    const T* __restrict__ gy = static_cast<const T*>(a.x);
    const T* __restrict__ w = static_cast<const T*>(a.w);
    T* __restrict__ gx = static_cast<T*>(a.y);
    constexpr int S = UNIT_STRIDE ? 1 : 0;  // 0: the stride is read at run time
    const long long spatial = (long long)a.id * a.ih * a.iw;
    const long long ospatial = (long long)a.od * a.oh * a.ow;
    const long long total = a.n * a.c * spatial;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long n, c, s;
        if (CHANNELS_LAST) {
            c = i % a.c;
            s = (i / a.c) % spatial;
            n = i / (a.c * spatial);
        } else {
            s = i % spatial;
            c = (i / spatial) % a.c;
            n = i / (spatial * a.c);
        }
        const int iw = (int)(s % a.iw);
        const int ih = (int)((s / a.iw) % a.ih);
        const int id = (int)(s / ((long long)a.iw * a.ih));
        const T* wc = w + c * (KD * KH * KW);
        float acc = 0.f;
#pragma unroll
        for (int kd = 0; kd < KD; ++kd) {
            int od;
            if (!tap_output<S>(id, kd, a.dd, a.pd, a.sd, a.od, od)) continue;
#pragma unroll
            for (int kh = 0; kh < KH; ++kh) {
                int oh;
                if (!tap_output<S>(ih, kh, a.dh, a.ph, a.sh, a.oh, oh)) continue;
#pragma unroll
                for (int kw = 0; kw < KW; ++kw) {
                    int ow;
                    if (!tap_output<S>(iw, kw, a.dw, a.pw, a.sw, a.ow, ow)) continue;
                    const long long o = ((long long)od * a.oh + oh) * a.ow + ow;
                    const long long at = CHANNELS_LAST ? (n * ospatial + o) * a.c + c
                                                       : (n * a.c + c) * ospatial + o;
                    acc = fmaf(to_f32(__ldg(wc + (kd * KH + kh) * KW + kw)), to_f32(__ldg(gy + at)), acc);
                }
            }
        }
        gx[i] = from_f32<T>(acc);
    }
}
