// dgrad_gather: grad-input for any spec, the first rung of the dgrad ladder and the one
// strided specs use (unit-stride specs also run as the forward of the flipped kernel,
// src/engine/cuda_plan.rs). One thread per grad_input element gathers every (output,
// tap) pair that read it: o * stride + k * dilation - pad = i. f32 accumulation.
// Strides are template arguments (division by a constant is a multiply), and tensors
// under 2^31 elements decode their indices in 32 bits: 64-bit divisions made the first
// version instruction-bound (mobilenet-s2 1.32 ms, 6x PyTorch's, run 66).
// Arguments (the forward's geometry): a.x = grad_output (the forward output's shape),
// a.w = weight, a.y = grad_input (the forward input's shape). EPI must be 0.
template <int S>
__device__ __forceinline__ bool tap_output(int i, int k, int dil, int pad, int out, int& o) {
    const int num = i + pad - k * dil;
    if (num < 0) return false;
    if (S != 1 && num % S != 0) return false;
    o = num / S;
    return o < out;
}

template <typename I, typename T, bool CHANNELS_LAST, int KD, int KH, int KW, int SD, int SH, int SW>
__device__ __forceinline__ void dgrad_gather_body(const ConvArgs& a) {
    const T* __restrict__ gy = static_cast<const T*>(a.x);
    const T* __restrict__ w = static_cast<const T*>(a.w);
    T* __restrict__ gx = static_cast<T*>(a.y);
    const I spatial = (I)a.id * a.ih * a.iw;
    const I ospatial = (I)a.od * a.oh * a.ow;
    const I total = (I)a.n * (I)a.c * spatial;
    const I cs = (I)a.c;
    for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < total; i += (I)gridDim.x * blockDim.x) {
        I n, c, s;
        if (CHANNELS_LAST) {
            const I p = i / cs;
            c = i - p * cs;
            n = p / spatial;
            s = p - n * spatial;
        } else {
            const I p = i / spatial;
            s = i - p * spatial;
            n = p / cs;
            c = p - n * cs;
        }
        const int iw = (int)(s % (I)a.iw);
        const I s2 = s / (I)a.iw;
        const int ih = (int)(s2 % (I)a.ih);
        const int id = (int)(s2 / (I)a.ih);
        const T* wc = w + (long long)c * (KD * KH * KW);
        const long long obase = CHANNELS_LAST ? (long long)n * ospatial * a.c + c
                                              : ((long long)n * a.c + c) * ospatial;
        const long long ostep = CHANNELS_LAST ? a.c : 1;
        float acc = 0.f;
#pragma unroll
        for (int kd = 0; kd < KD; ++kd) {
            int od;
            if (!tap_output<SD>(id, kd, a.dd, a.pd, a.od, od)) continue;
#pragma unroll
            for (int kh = 0; kh < KH; ++kh) {
                int oh;
                if (!tap_output<SH>(ih, kh, a.dh, a.ph, a.oh, oh)) continue;
#pragma unroll
                for (int kw = 0; kw < KW; ++kw) {
                    int ow;
                    if (!tap_output<SW>(iw, kw, a.dw, a.pw, a.ow, ow)) continue;
                    const long long o = ((long long)od * a.oh + oh) * a.ow + ow;
                    acc = fmaf(to_f32(__ldg(wc + (kd * KH + kh) * KW + kw)),
                               to_f32(__ldg(gy + obase + o * ostep)), acc);
                }
            }
        }
        gx[i] = from_f32<T>(acc);
    }
}

template <typename T, bool CHANNELS_LAST, int KD, int KH, int KW, int SD, int SH, int SW, int EPI>
__global__ void __launch_bounds__(256) dgrad_gather_dwconv(ConvArgs a, EpiArgs) {
    static_assert(EPI == 0, "grad-input has no fused epilogue");
    const long long total = a.n * a.c * (long long)a.id * a.ih * a.iw;
    if (total + (long long)gridDim.x * blockDim.x < 2147483647LL)
        dgrad_gather_body<unsigned, T, CHANNELS_LAST, KD, KH, KW, SD, SH, SW>(a);
    else
        dgrad_gather_body<long long, T, CHANNELS_LAST, KD, KH, KW, SD, SH, SW>(a);
}
