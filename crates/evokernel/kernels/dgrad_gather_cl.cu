// dgrad_gather_cl: grad-input by a gather on channels-last data, a thread per 16 bytes of
// channels (VEC = 8 halves or 4 floats) at one grad_input position: index decoding, tap
// tests and the grad_output loads are shared by VEC channels, and each load and the store
// move 16 bytes. The strided channels-last specs need it: dgrad_gather's thread per
// element was issue-bound (mobilenet-s2 0.596 ms, 2.6x PyTorch, docs/perf.md run 68).
// o * stride + k * dilation - pad = i as in dgrad_gather; f32 accumulation.
// W_SMEM: each block first stores the weight as f32 [taps][C] in shared memory, so a
// tap's VEC weights are two 16-byte shared loads; read from [C][taps] in global memory
// they were VEC loads each touching ~32 sectors a warp (v1: 0.173 ms on mobilenet-s2, 28%
// of floor, run 84). Without it (C * taps * 4 bytes over the launcher's limit) the
// global loads remain.
// Arguments (the forward's geometry): a.x = grad_output, a.w = weight [C, taps],
// a.y = grad_input. C % VEC == 0 (the launcher checks). EPI must be 0.
template <int S>
__device__ __forceinline__ bool tap_output_cl(int i, int k, int dil, int pad, int out, int& o) {
    const int num = i + pad - k * dil;
    if (num < 0) return false;
    if (S != 1 && num % S != 0) return false;
    o = num / S;
    return o < out;
}

template <typename I, typename T, bool W_SMEM, int KD, int KH, int KW, int SD, int SH, int SW>
__device__ __forceinline__ void dgrad_gather_cl_body(const ConvArgs& a, float* ws) {
    constexpr int VEC = 16 / sizeof(T);
    constexpr int TAPS = KD * KH * KW;
    const T* __restrict__ gy = static_cast<const T*>(a.x);
    const T* __restrict__ w = static_cast<const T*>(a.w);
    T* __restrict__ gx = static_cast<T*>(a.y);
    const I vecs = (I)(a.c / VEC);  // channel vectors a position
    const I total = (I)a.n * (I)a.id * (I)a.ih * (I)a.iw * vecs;
    if (W_SMEM) weight_to_taps_major(w, (int)a.c, TAPS, ws);
    for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < total; i += (I)gridDim.x * blockDim.x) {
        const I p = i / vecs;
        const int c0 = (int)(i - p * vecs) * VEC;
        const I p1 = p / (I)a.iw;
        const int iw = (int)(p - p1 * (I)a.iw);
        const I p2 = p1 / (I)a.ih;
        const int ih = (int)(p1 - p2 * (I)a.ih);
        const I n = p2 / (I)a.id;
        const int id = (int)(p2 - n * (I)a.id);
        const T* gyn = gy + (long long)n * a.od * a.oh * a.ow * a.c + c0;
        const T* wc = w + (long long)c0 * TAPS;
        float acc[VEC];
#pragma unroll
        for (int v = 0; v < VEC; ++v) acc[v] = 0.f;
#pragma unroll
        for (int kd = 0; kd < KD; ++kd) {
            int od;
            if (!tap_output_cl<SD>(id, kd, a.dd, a.pd, a.od, od)) continue;
#pragma unroll
            for (int kh = 0; kh < KH; ++kh) {
                int oh;
                if (!tap_output_cl<SH>(ih, kh, a.dh, a.ph, a.oh, oh)) continue;
#pragma unroll
                for (int kw = 0; kw < KW; ++kw) {
                    int ow;
                    if (!tap_output_cl<SW>(iw, kw, a.dw, a.pw, a.ow, ow)) continue;
                    float g[VEC];
                    Vec16<T, VEC>::load(gyn + (((long long)od * a.oh + oh) * a.ow + ow) * a.c, g);
                    add_weighted_tap<T, VEC, TAPS, W_SMEM>(acc, g, (kd * KH + kh) * KW + kw, ws, wc, (int)a.c, c0);
                }
            }
        }
        Vec16<T, VEC>::store(gx + p * (long long)a.c + c0, acc);
    }
}

template <typename T, bool W_SMEM, int KD, int KH, int KW, int SD, int SH, int SW, int EPI>
__global__ void __launch_bounds__(256) dgrad_gather_cl_dwconv(ConvArgs a, EpiArgs) {
    static_assert(EPI == 0, "grad-input has no fused epilogue");
    extern __shared__ __align__(16) float ws[];  // W_SMEM: the weight, [taps][C]
    const long long total = a.n * (long long)a.id * a.ih * a.iw * (a.c / (16 / sizeof(T)));
    if (total + (long long)gridDim.x * blockDim.x < 2147483647LL)
        dgrad_gather_cl_body<unsigned, T, W_SMEM, KD, KH, KW, SD, SH, SW>(a, ws);
    else
        dgrad_gather_cl_body<long long, T, W_SMEM, KD, KH, KW, SD, SH, SW>(a, ws);
}
