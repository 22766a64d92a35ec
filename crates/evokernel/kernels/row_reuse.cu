// row_reuse: any spec (stride, dilation, padding, both layouts). A thread computes OUT_H
// outputs down one output column (consecutive output rows); neighbouring threads take
// neighbouring columns (channels-first) or channels (channels-last), so loads coalesce.
// Output row j with kernel row kh reads input row oh0 * SH + j * SH + kh * DH - ph: pairs
// (j, kh) landing on the same row share one load of its KW taps. SH and DH are compile-
// time, so the sharing is resolved when the loops unroll: with SH = DH (odd-dilated's 2
// and 2) OUT_H outputs of KH rows read KH + OUT_H - 1 rows, not OUT_H x KH. naive reloads
// every tap of every output and is instruction-bound (docs/perf.md, run 35).
template <typename T, bool CHANNELS_LAST, int KD, int KH, int KW, int SH, int DH, int OUT_H, int EPI>
__global__ void __launch_bounds__(256) row_reuse_dwconv(ConvArgs a, EpiArgs e) {
    constexpr int RSPAN = (OUT_H - 1) * SH + (KH - 1) * DH + 1;  // input rows a thread spans
    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ w = static_cast<const T*>(a.w);
    T* __restrict__ y = static_cast<T*>(a.y);
    const long long groups_h = (a.oh + OUT_H - 1) / OUT_H;
    const long long total = a.n * a.c * a.od * groups_h * a.ow;
    const long long in_spatial = (long long)a.id * a.ih * a.iw;
    const long long step = CHANNELS_LAST ? a.c : 1;  // elements between W neighbours
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long r = i, n, c;
        if (CHANNELS_LAST) { c = r % a.c; r /= a.c; }
        const int ow = (int)(r % a.ow); r /= a.ow;
        const int oh0 = (int)(r % groups_h) * OUT_H; r /= groups_h;
        const int od = (int)(r % a.od); r /= a.od;
        if (CHANNELS_LAST) { n = r; } else { c = r % a.c; n = r / a.c; }
        const T* __restrict__ xb = CHANNELS_LAST ? x + n * in_spatial * a.c + c : x + (n * a.c + c) * in_spatial;
        const T* __restrict__ wc = w + c * (KD * KH * KW);
        // The W taps' columns are the same for every row: clamp and test them once.
        int zw[KW];
        bool okw[KW];
#pragma unroll
        for (int kw = 0; kw < KW; ++kw) {
            const int col = ow * a.sw + kw * a.dw - a.pw;
            okw[kw] = col >= 0 && col < a.iw;
            zw[kw] = min(max(col, 0), a.iw - 1);
        }
        float acc[OUT_H];
#pragma unroll
        for (int j = 0; j < OUT_H; ++j) acc[j] = 0.f;
#pragma unroll
        for (int kd = 0; kd < KD; ++kd) {
            const int zd = od * a.sd + kd * a.dd - a.pd;
            const bool okd = zd >= 0 && zd < a.id;
            const int zdc = min(max(zd, 0), a.id - 1);
            float wt[KH][KW];
#pragma unroll
            for (int kh = 0; kh < KH; ++kh)
#pragma unroll
                for (int kw = 0; kw < KW; ++kw) wt[kh][kw] = to_f32(wc[(kd * KH + kh) * KW + kw]);
            // Input rows in order, so each output still sums its taps in (kd, kh, kw) order.
#pragma unroll
            for (int rr = 0; rr < RSPAN; ++rr) {
                bool used = false;
#pragma unroll
                for (int j = 0; j < OUT_H; ++j)
#pragma unroll
                    for (int kh = 0; kh < KH; ++kh) used |= j * SH + kh * DH == rr;
                if (!used) continue;
                // Clamped, always-valid rows and a select instead of a branch: all of a
                // thread's loads can be in flight at once (with branches, each row's
                // loads waited for the previous row's: latency-bound).
                const int zh = oh0 * SH + rr - a.ph;
                const bool okr = okd && zh >= 0 && zh < a.ih;
                const int zhc = min(max(zh, 0), a.ih - 1);
                const T* __restrict__ row = xb + ((long long)zdc * a.ih + zhc) * a.iw * step;
                float v[KW];
#pragma unroll
                for (int kw = 0; kw < KW; ++kw) v[kw] = to_f32(row[zw[kw] * step]);
#pragma unroll
                for (int j = 0; j < OUT_H; ++j)
#pragma unroll
                    for (int kh = 0; kh < KH; ++kh)
                        if (j * SH + kh * DH == rr) {
#pragma unroll
                            for (int kw = 0; kw < KW; ++kw)
                                acc[j] = okr && okw[kw] ? fmaf(v[kw], wt[kh][kw], acc[j]) : acc[j];
                        }
            }
        }
        const long long base = CHANNELS_LAST
            ? (((n * a.od + od) * a.oh + oh0) * (long long)a.ow + ow) * a.c + c
            : (((n * a.c + c) * a.od + od) * a.oh + oh0) * (long long)a.ow + ow;
#pragma unroll
        for (int j = 0; j < OUT_H; ++j)
            if (oh0 + j < a.oh) {
                const long long at = base + (long long)j * a.ow * step;
                y[at] = from_f32<T>(epilogue<T, EPI>(e, acc[j], c, at));
            }
    }
}
