// large_kernel: smem_tile for kernels whose taps do not fit in registers (RepLKNet's
// 31x31, 961 taps). One block per (n, c, output depth); its KD input slices widened to
// f32 in shared memory (zero padding included), and the channel's weights there too,
// each kernel row padded to a multiple of 4 so it is read as float4 broadcasts. A thread
// computes OUT_W consecutive outputs of one row: per kernel row, the (OUT_W - 1) * SW +
// (KW - 1) * DW + 1 inputs it reads go to registers once (float4s), then KW x OUT_W FMAs.
// The kernel-row loops stay rolled (KD * KH iterations of an unrolled KW x OUT_W body):
// unrolled, 961 taps would be ~8000 instructions and spill.
template <typename T, int KD, int KH, int KW, int OUT_W, int SW, int DW, int EPI>
__global__ void __launch_bounds__(256) large_kernel_dwconv(ConvArgs a, EpiArgs e) {
    extern __shared__ __align__(16) float tile[];
    constexpr int KW4 = (KW + 3) / 4 * 4;  // a kernel row's floats in shared memory
    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ w = static_cast<const T*>(a.w);
    T* __restrict__ y = static_cast<T*>(a.y);
    const int groups_w = (a.ow + OUT_W - 1) / OUT_W;
    constexpr int SPAN = (OUT_W - 1) * SW + (KW - 1) * DW + 1;
    constexpr int WIN4 = (SPAN + 3) / 4;
    const int hs = (a.oh - 1) * a.sh + (KH - 1) * a.dh + 1;
    // Mirrors shared_bytes in variants/large_kernel.rs.
    const int ws = max(((groups_w - 1) * OUT_W * SW + 4 * WIN4 + 3) & ~3, (a.pw + a.iw + 3) & ~3);
    float* wsm = tile + KD * hs * ws;
    const long long b = blockIdx.x;
    const int od = (int)(b % a.od);
    const long long nc = b / a.od;
    const long long c = nc % a.c;
    const long long plane = (long long)a.id * a.ih * a.iw;
    const T* xin = x + nc * plane;

    fill_slices<T, float, KD>(xin, tile, od * a.sd - a.pd, a.dd, hs, ws, a);
    for (int t = threadIdx.x; t < KD * KH * KW4; t += blockDim.x) {
        const int r = t / KW4, kw = t - r * KW4;
        wsm[t] = kw < KW ? to_f32(w[c * (KD * KH * KW) + r * KW + kw]) : 0.f;
    }
    __syncthreads();

    const long long plane_out = (nc * a.od + od) * (long long)a.oh * a.ow;
    T* yout = y + plane_out;
    for (int t = threadIdx.x; t < a.oh * groups_w; t += blockDim.x) {
        const int oh = t / groups_w;
        const int ow0 = (t - oh * groups_w) * OUT_W;
        float acc[OUT_W];
#pragma unroll
        for (int o = 0; o < OUT_W; ++o) acc[o] = 0.f;
#pragma unroll 1
        for (int kd = 0; kd < KD; ++kd) {
#pragma unroll 1
            for (int kh = 0; kh < KH; ++kh) {
                const float* row = tile + (kd * hs + oh * a.sh + kh * a.dh) * ws + ow0 * SW;
                const float* wrow = wsm + (kd * KH + kh) * KW4;
                float win[WIN4 * 4];
#pragma unroll
                for (int q = 0; q < WIN4; ++q) {
                    const float4 v = *reinterpret_cast<const float4*>(row + 4 * q);
                    win[4 * q] = v.x; win[4 * q + 1] = v.y; win[4 * q + 2] = v.z; win[4 * q + 3] = v.w;
                }
#pragma unroll
                for (int q = 0; q < KW4 / 4; ++q) {
                    // Every thread reads the same weights: a broadcast, no bank conflict.
                    const float4 wv = *reinterpret_cast<const float4*>(wrow + 4 * q);
                    const float wq[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
                    for (int k = 0; k < 4; ++k) {
                        const int kw = 4 * q + k;
                        if (kw < KW) {
#pragma unroll
                            for (int o = 0; o < OUT_W; ++o)
                                acc[o] = fmaf(win[o * SW + kw * DW], wq[k], acc[o]);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int o = 0; o < OUT_W; ++o)
            if (ow0 + o < a.ow) {
                const long long at = (long long)oh * a.ow + ow0 + o;
                yout[at] = from_f32<T>(epilogue<T, EPI>(e, acc[o], c, plane_out + at));
            }
    }
}
