// smem_tile: one block per (n, c, output depth). The KD input slices the block needs
// are widened to f32 into shared memory once, zero padding included, so the compute
// loop has no bounds checks; the weights live in registers; each thread computes
// OUT_W consecutive outputs of one row from a register window of the
// (OUT_W - 1) * SW + (KW - 1) * DW + 1 inputs they read (OUT_W a multiple of 4: the
// window is read as float4s). Any stride and dilation: SW, DW (along W) index the
// window at compile time; the others are arguments.
template <typename T, int KD, int KH, int KW, int OUT_W, int SW, int DW, int EPI>
__global__ void __launch_bounds__(256) smem_tile_dwconv(ConvArgs a, EpiArgs e) {
    extern __shared__ __align__(16) float tile[];
    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ w = static_cast<const T*>(a.w);
    T* __restrict__ y = static_cast<T*>(a.y);
    const int groups_w = (a.ow + OUT_W - 1) / OUT_W;
    constexpr int SPAN = (OUT_W - 1) * SW + (KW - 1) * DW + 1;
    constexpr int WIN4 = (SPAN + 3) / 4;
    const int hs = (a.oh - 1) * a.sh + (KH - 1) * a.dh + 1;
    // Mirrors shared_bytes in variants/smem_tile.rs.
    const int ws = max(((groups_w - 1) * OUT_W * SW + 4 * WIN4 + 3) & ~3, (a.pw + a.iw + 3) & ~3);
    const long long b = blockIdx.x;
    const int od = (int)(b % a.od);
    const long long nc = b / a.od;
    const long long c = nc % a.c;
    const long long plane = (long long)a.id * a.ih * a.iw;
    const T* xin = x + nc * plane;

    fill_slices<T, float, KD>(xin, tile, od * a.sd - a.pd, a.dd, hs, ws, a);
    float wr[KD * KH * KW];
#pragma unroll
    for (int t = 0; t < KD * KH * KW; ++t) wr[t] = to_f32(w[c * (KD * KH * KW) + t]);
    __syncthreads();

    const long long plane_out = (nc * a.od + od) * (long long)a.oh * a.ow;
    T* yout = y + plane_out;
    for (int t = threadIdx.x; t < a.oh * groups_w; t += blockDim.x) {
        const int oh = t / groups_w;
        const int ow0 = (t - oh * groups_w) * OUT_W;
        float acc[OUT_W];
#pragma unroll
        for (int o = 0; o < OUT_W; ++o) acc[o] = 0.f;
#pragma unroll
        for (int kd = 0; kd < KD; ++kd) {
#pragma unroll
            for (int kh = 0; kh < KH; ++kh) {
                // The window as float4s: lanes are OUT_W floats apart, so scalar reads
                // were 8-way bank conflicts (ncu: half of all shared wavefronts); 16-byte
                // reads are 2-way. Rows are 16-byte aligned and padded to a multiple of 4.
                const float* row = tile + (kd * hs + oh * a.sh + kh * a.dh) * ws + ow0 * SW;
                float win[WIN4 * 4];
#pragma unroll
                for (int q = 0; q < WIN4; ++q) {
                    const float4 v = *reinterpret_cast<const float4*>(row + 4 * q);
                    win[4 * q] = v.x; win[4 * q + 1] = v.y; win[4 * q + 2] = v.z; win[4 * q + 3] = v.w;
                }
#pragma unroll
                for (int kw = 0; kw < KW; ++kw)
#pragma unroll
                    for (int o = 0; o < OUT_W; ++o)
                        acc[o] = fmaf(win[o * SW + kw * DW], wr[(kd * KH + kh) * KW + kw], acc[o]);
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
