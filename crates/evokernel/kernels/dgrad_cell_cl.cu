// dgrad_cell_cl: grad-input of strided channels-last specs, a thread per stride cell (the
// SD x SH x SW grad_input positions whose taps come from the same few grad_output
// positions) and 16 bytes of channels (VEC = 8 halves or 4 floats). dgrad_gather_cl's
// thread per position re-derived its taps with divisions and tests per position and
// re-loaded each grad_output vector for every position it feeds (mobilenet-s2: 65% of
// issue slots busy, DRAM 24%, docs/perf.md run 287). Here the tap pattern is compile-time
// (kernel, stride, dilation and the padding before are template arguments): each
// grad_output row of the cell's window is loaded once into registers and feeds every
// (position, tap) pair it meets; the index work is done once a cell.
// Per axis, grad_input position i = c * S + r (cell c, residue r) takes tap k from
// grad_output c + q where r + P - k * D = q * S; each tap feeds one residue.
// Arguments (the forward's geometry): a.x = grad_output, a.w = weight [C, taps],
// a.y = grad_input. C % VEC == 0 (the launcher checks). EPI must be 0.
// W_SMEM: the weight as f32 [taps][C] in shared memory, as in dgrad_gather_cl.
// WHOLE: the cell's whole window is loaded up front (raw 16-byte words) and the positions
// are summed and stored one at a time (mobilenet-s2 0.070 -> 0.058 ms, docs/perf.md run
// 370); else a window row at a time with every position's sums held (wide windows).
template <int K, int S, int D, int P>
struct CellAxis {
    __device__ static constexpr int fdiv(int a) { return a >= 0 ? a / S : -((-a + S - 1) / S); }
    __device__ static constexpr bool feeds(int r, int k) { return r + P - k * D == fdiv(r + P - k * D) * S; }
    __device__ static constexpr int q(int r, int k) { return fdiv(r + P - k * D); }
    // The window: the offsets some (residue, tap) pair reads.
    __device__ static constexpr int bound(bool lowest) {
        int b = lowest ? 1 << 30 : -(1 << 30);
        for (int r = 0; r < S; ++r)
            for (int k = 0; k < K; ++k)
                if (feeds(r, k)) b = lowest ? (q(r, k) < b ? q(r, k) : b) : (q(r, k) > b ? q(r, k) : b);
        return b;
    }
    static constexpr int QMIN = bound(true);
    static constexpr int QMAX = bound(false);
    static constexpr int Q = QMAX - QMIN + 1;
    // Whether some (residue, tap) reads window offset qq (gaps inside it are not loaded).
    __device__ static constexpr bool used(int qq) {
        for (int r = 0; r < S; ++r)
            for (int k = 0; k < K; ++k)
                if (feeds(r, k) && q(r, k) == qq) return true;
        return false;
    }
};

template <typename I, typename T, bool W_SMEM, bool WHOLE, int KD, int KH, int KW, int SD, int SH, int SW,
          class AD, class AH, class AW>
__device__ __forceinline__ void dgrad_cell_cl_body(const ConvArgs& a, float* ws) {
    constexpr int VEC = 16 / sizeof(T);
    constexpr int TAPS = KD * KH * KW;
    constexpr int CELL = SD * SH * SW;
    const T* __restrict__ gy = static_cast<const T*>(a.x);
    const T* __restrict__ w = static_cast<const T*>(a.w);
    T* __restrict__ gx = static_cast<T*>(a.y);
    const I vecs = (I)(a.c / VEC);
    const int cdn = (a.id + SD - 1) / SD, chn = (a.ih + SH - 1) / SH, cwn = (a.iw + SW - 1) / SW;
    const I total = (I)a.n * (I)cdn * (I)chn * (I)cwn * vecs;
    if (W_SMEM) weight_to_taps_major(w, (int)a.c, TAPS, ws);
    for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < total; i += (I)gridDim.x * blockDim.x) {
        const I p = i / vecs;
        const int c0 = (int)(i - p * vecs) * VEC;
        const I p1 = p / (I)cwn;
        const int cw = (int)(p - p1 * (I)cwn);
        const I p2 = p1 / (I)chn;
        const int ch = (int)(p1 - p2 * (I)chn);
        const I n = p2 / (I)cdn;
        const int cd = (int)(p2 - n * (I)cdn);
        const T* gyn = gy + (long long)n * a.od * a.oh * a.ow * a.c + c0;
        const T* wc = w + (long long)c0 * TAPS;
        T* gxn = gx + (long long)n * a.id * a.ih * a.iw * a.c + c0;
        auto add_tap = [&](float* o, const float* g, int tap) {
            add_weighted_tap<T, VEC, TAPS, W_SMEM>(o, g, tap, ws, wc, (int)a.c, c0);
        };
        auto store_position = [&](int rd, int rh, int rw, const float* o) {
            const int id = cd * SD + rd, ih = ch * SH + rh, iw = cw * SW + rw;
            if (id < a.id && ih < a.ih && iw < a.iw)
                Vec16<T, VEC>::store(gxn + (((long long)id * a.ih + ih) * a.iw + iw) * a.c, o);
        };
        // Whether window row (qd, qh) lies inside grad_output (rows outside add nothing).
        auto row_inside = [&](int qd, int qh) {
            const int od = cd + qd, oh = ch + qh;
            return od >= 0 && od < a.od && oh >= 0 && oh < a.oh;
        };
        // A window row of grad_output vectors as raw 16-byte words, each loaded once (zero
        // outside grad_output along W: zero bits are 0 in every T).
        auto load_row = [&](int qd, int qh, uint4* raw) {
            const int od = cd + qd, oh = ch + qh;
            const bool in = row_inside(qd, qh);
            const T* row = gyn + ((long long)od * a.oh + oh) * a.ow * a.c;
#pragma unroll
            for (int qw = 0; qw < AW::Q; ++qw) {
                const int ow = cw + AW::QMIN + qw;
                raw[qw] = in && AW::used(AW::QMIN + qw) && ow >= 0 && ow < a.ow
                              ? __ldg(reinterpret_cast<const uint4*>(row + (long long)ow * a.c))
                              : make_uint4(0, 0, 0, 0);
            }
        };
        if constexpr (WHOLE) {
            // Every row of the window in flight at once, before the first multiply (one load
            // latency a cell, not one a row: mobilenet-s2 waited on each row's loads, docs/perf.md
            // run 365), then a position at a time: its taps summed, then stored, so a thread
            // holds the raw window and one position's sums (the row form holds every position's).
            uint4 win[AD::Q * AH::Q][AW::Q];
#pragma unroll
            for (int qd = AD::QMIN; qd <= AD::QMAX; ++qd)
#pragma unroll
                for (int qh = AH::QMIN; qh <= AH::QMAX; ++qh)
                    if (AD::used(qd) && AH::used(qh)) load_row(qd, qh, win[(qd - AD::QMIN) * AH::Q + qh - AH::QMIN]);
#pragma unroll
            for (int rd = 0; rd < SD; ++rd)
#pragma unroll
                for (int rh = 0; rh < SH; ++rh)
#pragma unroll
                    for (int rw = 0; rw < SW; ++rw) {
                        float o[VEC];
#pragma unroll
                        for (int v = 0; v < VEC; ++v) o[v] = 0.f;
#pragma unroll
                        for (int kd = 0; kd < KD; ++kd) {
                            if (!AD::feeds(rd, kd)) continue;
#pragma unroll
                            for (int kh = 0; kh < KH; ++kh) {
                                if (!AH::feeds(rh, kh) || !row_inside(AD::q(rd, kd), AH::q(rh, kh))) continue;
                                const uint4* raw = win[(AD::q(rd, kd) - AD::QMIN) * AH::Q + AH::q(rh, kh) - AH::QMIN];
#pragma unroll
                                for (int kw = 0; kw < KW; ++kw) {
                                    if (!AW::feeds(rw, kw)) continue;
                                    float g[VEC];
                                    unpack16(raw[AW::q(rw, kw) - AW::QMIN], T(), g);
                                    add_tap(o, g, (kd * KH + kh) * KW + kw);
                                }
                            }
                        }
                        store_position(rd, rh, rw, o);
                    }
            continue;
        }
        // A row at a time (fewer registers for wide windows): every position's sums held.
        float acc[CELL][VEC];
#pragma unroll
        for (int e = 0; e < CELL; ++e)
#pragma unroll
            for (int v = 0; v < VEC; ++v) acc[e][v] = 0.f;
#pragma unroll
        for (int qd = AD::QMIN; qd <= AD::QMAX; ++qd) {
#pragma unroll
            for (int qh = AH::QMIN; qh <= AH::QMAX; ++qh) {
                if (!AD::used(qd) || !AH::used(qh) || !row_inside(qd, qh)) continue;
                uint4 raw[AW::Q];
                load_row(qd, qh, raw);
                float g[AW::Q][VEC];
#pragma unroll
                for (int qw = 0; qw < AW::Q; ++qw) unpack16(raw[qw], T(), g[qw]);
#pragma unroll
                for (int rd = 0; rd < SD; ++rd)
#pragma unroll
                    for (int kd = 0; kd < KD; ++kd) {
                        if (!AD::feeds(rd, kd) || AD::q(rd, kd) != qd) continue;
#pragma unroll
                        for (int rh = 0; rh < SH; ++rh)
#pragma unroll
                            for (int kh = 0; kh < KH; ++kh) {
                                if (!AH::feeds(rh, kh) || AH::q(rh, kh) != qh) continue;
#pragma unroll
                                for (int rw = 0; rw < SW; ++rw)
#pragma unroll
                                    for (int kw = 0; kw < KW; ++kw) {
                                        if (!AW::feeds(rw, kw)) continue;
                                        add_tap(acc[(rd * SH + rh) * SW + rw], g[AW::q(rw, kw) - AW::QMIN],
                                                (kd * KH + kh) * KW + kw);
                                    }
                            }
                    }
            }
        }
#pragma unroll
        for (int rd = 0; rd < SD; ++rd)
#pragma unroll
            for (int rh = 0; rh < SH; ++rh)
#pragma unroll
                for (int rw = 0; rw < SW; ++rw) store_position(rd, rh, rw, acc[(rd * SH + rh) * SW + rw]);
    }
}

// MINB: blocks of 256 threads an SM the registers are capped for; 0 gives ptxas no
// minimum (mobilenet-s2: 85 registers, 2 blocks, latency-bound at 25% occupancy, run 288;
// an explicit 1 or 2 takes 109).
template <typename T, bool W_SMEM, bool WHOLE, int KD, int KH, int KW, int SD, int SH, int SW, int DD, int DH,
          int DW, int PD, int PH, int PW, int MINB, int EPI>
__global__ void __launch_bounds__(256, MINB) dgrad_cell_cl_dwconv(ConvArgs a, EpiArgs) {
    static_assert(EPI == 0, "grad-input has no fused epilogue");
    using AD = CellAxis<KD, SD, DD, PD>;
    using AH = CellAxis<KH, SH, DH, PH>;
    using AW = CellAxis<KW, SW, DW, PW>;
    static_assert(SD * SH * SW * (16 / sizeof(T)) <= 64, "a cell's accumulators past 64 registers");
    static_assert(AW::Q * (16 / sizeof(T)) <= 64, "a window row past 64 registers");
    static_assert(!WHOLE || AD::Q * AH::Q * AW::Q <= 12, "a whole window past 48 registers of raw words");
    extern __shared__ __align__(16) float ws[];  // W_SMEM: the weight, [taps][C]
    const long long cells = (long long)((a.id + SD - 1) / SD) * ((a.ih + SH - 1) / SH) * ((a.iw + SW - 1) / SW);
    const long long total = a.n * cells * (a.c / (16 / sizeof(T)));
    if (total + (long long)gridDim.x * blockDim.x < 2147483647LL)
        dgrad_cell_cl_body<unsigned, T, W_SMEM, WHOLE, KD, KH, KW, SD, SH, SW, AD, AH, AW>(a, ws);
    else
        dgrad_cell_cl_body<long long, T, W_SMEM, WHOLE, KD, KH, KW, SD, SH, SW, AD, AH, AW>(a, ws);
}
