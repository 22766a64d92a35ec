// wgrad_strip_cl: grad-weight (and grad-bias) on channels-last data, streaming strips of
// output rows through a ring of shared-memory slots; deterministic like wgrad (f32
// partials [splits][C][TAPS + 1] in a fixed order, wgrad_finalize adds them in split
// order; no atomics).
//
// wgrad_tile_cl copies whole tiles with their halo rows (mobilenet-s2: 17 input rows for
// 8 output rows) into two 53 KB buffers: two blocks an SM, one tile in flight each, and
// the halo copied twice. Here the outputs are columns (n, od, strip of SEGS * TW
// outputs) of OH rows, walked one output row a step; a step's slot holds only the input
// rows that row adds to the window (SH of them, or the whole window where the stride
// exceeds it: NEW rows for each of the KD depths) and its grad-output row, so the
// window's other rows are the P slots before it. Each block takes a fixed slice of all
// columns' rows (the same count, +-1: whole bands of rows left blocks 30% apart, run
// 213); where the slice starts a column, P prologue steps only load. The ring holds RING
// slots: P read back, RING - P loaded ahead, so up to RING - P rows fly while one is
// summed.
// Threads (CV * SEGS, G): x a vector of VEC channels (CB = CV * VEC) of one of the SEGS
// segments of TW outputs, y a group of RB tap rows (kd, kh). Per step and tap row a
// thread reads its WT input vectors and TW grad-output vectors into registers once and
// does TW * KW * VEC multiply-adds from them; the segments' sums are added in segment
// order at the end.
// Padding, rows and outputs past the end are skipped, never multiplied by 0 (a non-finite
// grad_output times a padded 0 would be NaN where PyTorch has none), as in wgrad_tile_cl:
// segments whose window lies inside the input, or whose grad-output row is finite, take
// the plain loop (zeros from the fill add exactly 0).
// Arguments: a.x = input, a.w = grad_output, a.y = the f32 partials; grid (channel
// blocks, splits); dynamic shared memory RING slots of KD * NEW * WTS + TWS positions of
// CB channels (with TMA each region 128-byte aligned). TMA: thread 0 issues a step's two
// boxes ([KD][NEW][WTS][CB] of the input at (c0, iw0, first new row, id0, n), [TWS][CB]
// of grad-output) on the slot's mbarrier; depth dilation 1 (or KD = 1). Off Hopper (or
// tma = 0) every thread's cp.async copies fill the same layout.

struct WgradStripItem {
    int n, od, ow0;
    int id0;  // input depth of kd = 0
};

template <typename T, int VEC, int CB, int KD, int KH, int KW, int SH, int SW, int DH, int DW, int TW, int SEGS,
          int RB, int RING, int LB, bool TMA>
__device__ __forceinline__ void wgrad_strip_cl_body(const ConvArgs& a, const TmaMaps& maps) {
    constexpr int TAPS = KD * KH * KW;
    constexpr int ROWS = KD * KH;
    constexpr int HW = (KH - 1) * DH + 1;        // input rows a window spans
    constexpr int NEW = SH < HW ? SH : HW;       // rows a step loads per depth
    constexpr int LEAD = HW - NEW;               // window rows already in earlier slots
    constexpr int P = (LEAD + NEW - 1) / NEW;    // slots a window reaches back
    constexpr int AHEAD = RING - P;              // steps loaded ahead of the one summed
    constexpr int TWS = TW * SEGS;               // outputs of a strip row
    constexpr int WT = (TW - 1) * SW + (KW - 1) * DW + 1;    // input columns a segment reads
    constexpr int WTS = (TWS - 1) * SW + (KW - 1) * DW + 1;  // input columns of a strip
    constexpr int CV = CB / VEC;
    constexpr int XPOS = KD * NEW * WTS;
    constexpr int PER_POS = CB * (int)sizeof(T) / LB;
    constexpr int EPL = LB / (int)sizeof(T);
    constexpr int ALIGN = TMA ? 128 / (int)sizeof(T) : 1;
    constexpr int GOFF = (XPOS * CB + ALIGN - 1) / ALIGN * ALIGN;
    constexpr int SLOT = GOFF + (TWS * CB + ALIGN - 1) / ALIGN * ALIGN;
    static_assert(AHEAD >= 1, "the ring holds a window's slots and one more");
    static_assert(CB % VEC == 0 && (CB * (int)sizeof(T)) % LB == 0, "whole vectors and copies a block");
    static_assert(LB == 4 || LB == 8 || LB == 16, "cp.async copies 4, 8 or 16 bytes");
    static_assert(RB >= 1 && RB <= ROWS, "a group holds 1..KD*KH tap rows");
    static_assert(RB * KW * VEC <= 64, "accumulators must fit the registers");
    static_assert(!TMA || (CB * (int)sizeof(T)) % 16 == 0, "a TMA box's rows are 16-byte multiples");
    static_assert(!TMA || (WTS <= 256 && TWS <= 256 && CB <= 256), "TMA box extents are at most 256");
#if __CUDA_ARCH__ >= 900
    constexpr bool COPY_TMA = TMA;
#else
    constexpr bool COPY_TMA = false;
#endif

    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ gy = static_cast<const T*>(a.w);
    float* __restrict__ partials = static_cast<float*>(a.y);
    extern __shared__ __align__(128) unsigned char wgrad_strip_smem[];
    T* smem = reinterpret_cast<T*>(wgrad_strip_smem);

    // One group holds every tap row where RB = ROWS: a constant, so are the rows' slots.
    const int lane = threadIdx.x % CV, seg = threadIdx.x / CV, group = RB == ROWS ? 0 : threadIdx.y;
    const int tid = threadIdx.x + CV * SEGS * group;
    const int nthreads = CV * SEGS * blockDim.y;
    const long long C = a.c;
    const long long c0 = (long long)blockIdx.x * CB;

    // The block's output rows: a fixed slice of the rows of every column (n, od, strip),
    // columns in order, so every block sums the same number of rows (+-1). A column's
    // first row of the slice comes after P prologue steps that only load.
    const int strips = (a.ow + TWS - 1) / TWS;
    const long long total = a.n * a.od * (long long)strips * a.oh;
    const long long lo = total * blockIdx.y / gridDim.y, hi = total * (blockIdx.y + 1) / gridDim.y;
    auto column_at = [&](long long col) {
        WgradStripItem t;
        t.ow0 = (int)(col % strips) * TWS;
        const long long r = col / strips;
        t.od = (int)(r % a.od);
        t.n = (int)(r / a.od);
        t.id0 = t.od * a.sd - a.pd;
        return t;
    };

    // A cursor over the block's steps: output row r (oh of column col), pro prologue
    // steps still to go before it (a step loads the rows of output row oh - pro; only
    // pro = 0 is summed).
    struct Cursor {
        long long r, col;
        int oh, pro, slot;
        unsigned parity;  // of the slot's fill this step is
        WgradStripItem t;
    };
    auto start = [&](Cursor& c) {
        c.r = lo;
        c.col = lo / a.oh;
        c.oh = (int)(lo - c.col * a.oh);
        c.pro = P;
        c.slot = 0;
        c.parity = 0;
        if (lo < hi) c.t = column_at(c.col);
    };
    auto advance = [&](Cursor& c) {
        if (c.pro > 0) {
            --c.pro;
        } else {
            ++c.r;
            if (++c.oh == a.oh) {
                c.oh = 0;
                c.pro = P;
                if (c.r < hi) c.t = column_at(++c.col);
            }
        }
        if (++c.slot == RING) {
            c.slot = 0;
            c.parity ^= 1u;
        }
    };

    __shared__ __align__(8) unsigned long long wgrad_strip_bars[RING];
    const unsigned bars = (unsigned)__cvta_generic_to_shared(wgrad_strip_bars);
#if __CUDA_ARCH__ >= 900
    if constexpr (COPY_TMA) {
        if (tid == 0)
            for (int s = 0; s < RING; ++s) mbar_init(bars + 8u * s, 1);
        __syncthreads();
    }
#endif

    // Issues the copies of step c into its slot (one commit group on the cp.async path).
    auto fetch = [&](const Cursor& c) {
        const WgradStripItem& t = c.t;
        const int first = (c.oh - c.pro) * SH - a.ph + LEAD;  // the step's first new input row
        const int iw0 = t.ow0 * SW - a.pw;
        T* slot = smem + (long long)c.slot * SLOT;
#if __CUDA_ARCH__ >= 900
        if constexpr (COPY_TMA) {
            if (tid == 0) {
                const unsigned dst = (unsigned)__cvta_generic_to_shared(slot);
                const unsigned bar = bars + 8u * c.slot;
                const bool grad = c.pro == 0;
                mbar_expect_tx(bar, (unsigned)((XPOS + (grad ? TWS : 0)) * CB * sizeof(T)));
                tma_load_5d(dst, &maps.input, (int)c0, iw0, first, t.id0, t.n, bar);
                if (grad)
                    tma_load_5d(dst + (unsigned)(GOFF * sizeof(T)), &maps.output, (int)c0, t.ow0, c.oh, t.od,
                                t.n, bar);
            }
            return;
        }
#endif
        const unsigned base = (unsigned)__cvta_generic_to_shared(slot);
        const int positions = XPOS + (c.pro == 0 ? TWS : 0);
        for (int e = tid; e < positions * PER_POS; e += nthreads) {
            const int pos = e / PER_POS, part = e - pos * PER_POS;
            const long long ch = c0 + part * EPL;
            const T* src = gy;
            bool ok = ch < C;
            unsigned dst;
            if (pos < XPOS) {
                const int kd = pos / (NEW * WTS), rc = pos - kd * (NEW * WTS);
                const int r = rc / WTS, col = rc - r * WTS;
                const int id = t.id0 + kd, ih = first + r, iw = iw0 + col;
                ok = ok && id >= 0 && id < a.id && ih >= 0 && ih < a.ih && iw >= 0 && iw < a.iw;
                if (ok) src = x + (((long long)t.n * a.id + id) * a.ih + ih) * a.iw * C + (long long)iw * C + ch;
                dst = base + (unsigned)((pos * CB + part * EPL) * sizeof(T));
            } else {
                const int j = pos - XPOS, ow = t.ow0 + j;
                ok = ok && ow < a.ow;
                if (ok)
                    src = gy + (((long long)t.n * a.od + t.od) * a.oh + c.oh) * a.ow * C + (long long)ow * C + ch;
                dst = base + (unsigned)((GOFF + j * CB + part * EPL) * sizeof(T));
            }
            cl_copy_async<LB>(dst, src, ok);
        }
        cp_async_commit();
    };

    float acc[RB][KW][VEC];
    float bacc[VEC];
#pragma unroll
    for (int r = 0; r < RB; ++r)
#pragma unroll
        for (int k = 0; k < KW; ++k)
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[r][k][e] = 0.f;
#pragma unroll
    for (int e = 0; e < VEC; ++e) bacc[e] = 0.f;

    // Sums step c (pro = 0): this segment's TW outputs of row oh.
    auto sum_step = [&](const Cursor& c) {
        const WgradStripItem& t = c.t;
        const int ow_first = t.ow0 + seg * TW;
        if (ow_first >= a.ow) return;  // a segment past the row's end
        const int oh = c.oh;
        const bool tail = ow_first + TW > a.ow;
        const int iw0 = ow_first * SW - a.pw;
        const bool cols_inside = iw0 >= 0 && iw0 + WT <= a.iw;
        float g[TW][VEC];
        const T* gs = smem + (long long)c.slot * SLOT + GOFF + seg * TW * CB + lane * VEC;
#pragma unroll
        for (int j = 0; j < TW; ++j) cl_read_f32<VEC>(gs + j * CB, g[j]);
        bool plain = !tail && cols_inside;
        if (group == 0 || !plain) {
            // Outputs past the end hold zeros: the row sums are grad-bias's terms.
            float rs[VEC];
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                rs[e] = g[0][e];
#pragma unroll
                for (int j = 1; j < TW; ++j) rs[e] += g[j][e];
            }
            if (group == 0) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) bacc[e] += rs[e];
            }
            if (!plain && !tail) {
                plain = true;
#pragma unroll
                for (int e = 0; e < VEC; ++e) plain = plain && fabsf(rs[e]) <= 3.402823466e38f;
            }
        }
#pragma unroll
        for (int r = 0; r < RB; ++r) {
            const int q = group * RB + r;
            if (q >= ROWS) break;
            const int kd = q / KH, kh = q - (q / KH) * KH;
            const int id = t.id0 + kd, ih = oh * SH - a.ph + kh * DH;
            if (id < 0 || id >= a.id || ih < 0 || ih >= a.ih) continue;  // padding rows: skipped
            // The tap row's slot (o steps back) and row in it.
            const int rel = kh * DH - LEAD;
            const int o = rel >= 0 ? 0 : -((-rel + NEW - 1) / NEW);
            int s = c.slot + o;
            if (s < 0) s += RING;
            const T* xr = smem + (long long)s * SLOT + ((kd * NEW + rel - o * NEW) * WTS + seg * TW * SW) * CB +
                          lane * VEC;
            float v[WT][VEC];
#pragma unroll
            for (int p = 0; p < WT; ++p) cl_read_f32<VEC>(xr + p * CB, v[p]);
            if (plain) {
#pragma unroll
                for (int j = 0; j < TW; ++j)
#pragma unroll
                    for (int k = 0; k < KW; ++k)
#pragma unroll
                        for (int e = 0; e < VEC; ++e) acc[r][k][e] = fmaf(g[j][e], v[j * SW + k * DW][e], acc[r][k][e]);
            } else {
#pragma unroll
                for (int j = 0; j < TW; ++j) {
                    if (ow_first + j >= a.ow) break;
#pragma unroll
                    for (int k = 0; k < KW; ++k) {
                        const int iw = iw0 + j * SW + k * DW;
                        if (iw < 0 || iw >= a.iw) continue;
#pragma unroll
                        for (int e = 0; e < VEC; ++e)
                            acc[r][k][e] = fmaf(g[j][e], v[j * SW + k * DW][e], acc[r][k][e]);
                    }
                }
            }
        }
    };

    Cursor prod, cons;
    start(prod);
    start(cons);
#pragma unroll 1
    for (int k = 0; k < AHEAD; ++k) {
        if (prod.r < hi) {
            fetch(prod);
            advance(prod);
        } else if (!COPY_TMA) {
            cp_async_commit();
        }
    }
#pragma unroll 1
    while (cons.r < hi) {
        if constexpr (COPY_TMA) {
            mbar_wait(bars + 8u * cons.slot, cons.parity);
        } else {
            cp_async_wait<AHEAD - 1>();
            __syncthreads();
        }
        if (cons.pro == 0) sum_step(cons);
        __syncthreads();  // the slot AHEAD steps on is free: its last reader was this step
        if (prod.r < hi) {
            fetch(prod);
            advance(prod);
        } else if (!COPY_TMA) {
            cp_async_commit();
        }
        advance(cons);
    }
    if constexpr (!COPY_TMA) cp_async_wait<0>();
    __syncthreads();

    pdl_launch_dependents();  // the finalize may launch (it waits for this grid)
    // Segments' sums in segment order (the same bits every run), then one partial per
    // (channel, tap). Every copy has landed: the slots are free.
    constexpr int NACC = RB * KW * VEC + VEC;
    float* red = reinterpret_cast<float*>(wgrad_strip_smem);
    float* out = partials + ((long long)blockIdx.y * C + c0 + lane * VEC) * (TAPS + 1);
#pragma unroll
    for (int i = 0; i < NACC; ++i) {
        const int r = i / (KW * VEC), k = (i / VEC) % KW, e = i % VEC;
        const bool is_bias = i >= RB * KW * VEC;
        float v = is_bias ? bacc[e] : acc[r][k][e];
        if (SEGS > 1) {
            __syncthreads();
            red[tid] = v;
            __syncthreads();
            if (seg == 0)
#pragma unroll
                for (int w = 1; w < SEGS; ++w) v += red[tid + w * CV];
        }
        const int q = group * RB + r;
        const bool mine = is_bias ? group == 0 : q < ROWS;
        if (seg == 0 && mine && c0 + lane * VEC + e < C)
            out[(long long)e * (TAPS + 1) + (is_bias ? TAPS : q * KW + k)] = v;
    }
}

// MINB: blocks of 256 threads an SM must hold, a register cap.
template <typename T, int VEC, int CB, int KD, int KH, int KW, int SH, int SW, int DH, int DW, int TW, int SEGS,
          int RB, int RING, int LB, int TMA, int MINB, int EPI>
__global__ void __launch_bounds__(256, MINB)
    wgrad_strip_cl_dwconv(ConvArgs a, EpiArgs, const __grid_constant__ TmaMaps maps) {
    wgrad_strip_cl_body<T, VEC, CB, KD, KH, KW, SH, SW, DH, DW, TW, SEGS, RB, RING, LB, TMA != 0>(a, maps);
}
