// direct: any spec (stride, dilation, padding, both layouts), like naive, with OUT_W
// neighbouring outputs along W per thread. naive spends about 12 instructions per tap
// per output on bounds, clamped addresses and a weight load, and is issue-bound
// (docs/perf.md, run 35). Here each tap's weight is loaded once for OUT_W outputs, the
// (j * sw + kw * dw) offsets are computed once per thread, rows outside the input are
// skipped whole, and a thread whose W window lies inside the input reads its taps
// without any per-tap test; only threads at the W borders take the clamped path.
template <typename T, bool CHANNELS_LAST, int KD, int KH, int KW, int OUT_W>
__global__ void __launch_bounds__(256) direct_dwconv(ConvArgs a) {
    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ w = static_cast<const T*>(a.w);
    T* __restrict__ y = static_cast<T*>(a.y);
    const long long groups_w = (a.ow + OUT_W - 1) / OUT_W;
    const long long total = a.n * a.c * a.od * a.oh * groups_w;
    const long long in_spatial = (long long)a.id * a.ih * a.iw;
    const long long step = CHANNELS_LAST ? a.c : 1;  // elements between W neighbours
    // Tap (j, kw)'s column relative to the thread's first input column.
    int offs[OUT_W][KW];
#pragma unroll
    for (int j = 0; j < OUT_W; ++j)
#pragma unroll
        for (int kw = 0; kw < KW; ++kw) offs[j][kw] = j * a.sw + kw * a.dw;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long r = i, n, c;
        if (CHANNELS_LAST) { c = r % a.c; r /= a.c; }
        const int gw = (int)(r % groups_w); r /= groups_w;
        const int oh = (int)(r % a.oh); r /= a.oh;
        const int od = (int)(r % a.od); r /= a.od;
        if (CHANNELS_LAST) { n = r; } else { c = r % a.c; n = r / a.c; }
        const int ow0 = gw * OUT_W;
        const int zw0 = ow0 * a.sw - a.pw;  // input column of output ow0's first tap
        const bool w_inside = zw0 >= 0 && zw0 + offs[OUT_W - 1][KW - 1] < a.iw;
        const T* __restrict__ xb = CHANNELS_LAST ? x + n * in_spatial * a.c + c : x + (n * a.c + c) * in_spatial;
        const T* __restrict__ wc = w + c * (KD * KH * KW);
        float acc[OUT_W];
#pragma unroll
        for (int j = 0; j < OUT_W; ++j) acc[j] = 0.f;
#pragma unroll
        for (int kd = 0; kd < KD; ++kd) {
            const int zd = od * a.sd + kd * a.dd - a.pd;
            if (zd < 0 || zd >= a.id) continue;
#pragma unroll
            for (int kh = 0; kh < KH; ++kh) {
                const int zh = oh * a.sh + kh * a.dh - a.ph;
                if (zh < 0 || zh >= a.ih) continue;
                const T* __restrict__ row = xb + ((long long)zd * a.ih + zh) * a.iw * step;
                float wt[KW];
#pragma unroll
                for (int kw = 0; kw < KW; ++kw) wt[kw] = to_f32(wc[(kd * KH + kh) * KW + kw]);
                if (w_inside) {
                    const T* __restrict__ p = row + (long long)zw0 * step;
#pragma unroll
                    for (int kw = 0; kw < KW; ++kw)
#pragma unroll
                        for (int j = 0; j < OUT_W; ++j)
                            acc[j] = fmaf(to_f32(p[offs[j][kw] * step]), wt[kw], acc[j]);
                } else {
#pragma unroll
                    for (int kw = 0; kw < KW; ++kw)
#pragma unroll
                        for (int j = 0; j < OUT_W; ++j) {
                            const int zw = zw0 + offs[j][kw];
                            const bool ok = zw >= 0 && zw < a.iw;
                            const float v = to_f32(row[min(max(zw, 0), a.iw - 1) * step]);
                            acc[j] = ok ? fmaf(v, wt[kw], acc[j]) : acc[j];
                        }
                }
            }
        }
        const long long base = CHANNELS_LAST
            ? (((n * a.od + od) * a.oh + oh) * (long long)a.ow + ow0) * a.c + c
            : (((n * a.c + c) * a.od + od) * a.oh + oh) * (long long)a.ow + ow0;
#pragma unroll
        for (int j = 0; j < OUT_W; ++j)
            if (ow0 + j < a.ow) y[base + j * step] = from_f32<T>(acc[j]);
    }
}
