// row_window: channels-first (NCW, NCHW, NCDHW) layers whose kernel is one row (KD = KH =
// 1) at W stride 1, row_window_cl's twin for rows that are contiguous along W:
// causal-conv1d (4 taps), LFM's 3-tap short convolution, Conformer's 31-tap rows, or a
// 1xK kernel over the rows of a 2-D or 3-D tensor. A thread owns RUN consecutive outputs
// of one output row (RUN whole 16-byte vectors of VEC elements), loads the LOADS aligned
// input vectors its window covers, all in flight together, keeps the row's KW weights as
// f32 and stores RUN / VEC output vectors. Consecutive threads take consecutive runs of
// a row, so a warp's stores are 32 x RUN elements in a row and its loads overlap their
// neighbours' by a vector or two (L1 serves those). No shared memory, no barrier. (The FMA
// rotation, depth_reuse_fma's plane walk, staged these rows through a shared-memory ring:
// 64-73% of the floor on the H200, runs 351 and 359.)
// The window's first element (input column ow0 - PW) is element M = (-PW) mod VEC of the
// first vector, M a template parameter so every register index folds at compile time.
// Rows are whole vectors (IW and OW multiples of VEC: the descriptor checks; activations
// are 16-byte aligned: the engine checks), so a vector lies wholly inside a row or wholly
// outside it.
// Taps in the padding are skipped, not multiplied by zero (a non-finite weight there
// leaves the output alone, as in the oracle); only runs whose loads leave the row, or
// rows wholly in the D or H padding, test them.

// Input row (n, c) at output row (od, oh) of a one-row kernel: its column 0 (a valid row
// where it lies in the D or H padding, which nothing is loaded from) and whether it
// exists. Shared by row_window and wgrad_window.
template <typename T>
__device__ __forceinline__ const T* one_row_input(const ConvArgs& a, const T* x, long long nc, int od, int oh,
                                                  bool& row_inside) {
    const int zd = od * a.sd - a.pd, zh = oh * a.sh - a.ph;
    row_inside = zd >= 0 && zd < a.id && zh >= 0 && zh < a.ih;
    return x + ((nc * a.id + (row_inside ? zd : 0)) * a.ih + (row_inside ? zh : 0)) * (long long)a.iw;
}

// Whether column col of a row lies in it (EDGE; inside the row every one does), and the
// LOADS aligned vectors from column v0, all in flight together (zeros outside the row).
template <bool EDGE>
__device__ __forceinline__ bool column_in_row(const ConvArgs& a, bool row_inside, int col) {
    return !EDGE || (row_inside && col >= 0 && col < a.iw);
}
template <typename T, int LOADS, bool EDGE>
__device__ __forceinline__ void row_vector_loads(const ConvArgs& a, const T* xrow, bool row_inside, int v0,
                                                 uint4 (&raw)[LOADS]) {
    constexpr int VEC = 16 / (int)sizeof(T);
#pragma unroll
    for (int i = 0; i < LOADS; ++i)
        raw[i] = column_in_row<EDGE>(a, row_inside, v0 + i * VEC) ? __ldg(reinterpret_cast<const uint4*>(xrow + v0 + i * VEC))
                                                                 : make_uint4(0u, 0u, 0u, 0u);
}

// One thread's run from its LOADS vectors starting at column v0 of the input row xrow.
// EDGE: some load leaves the row (or the row is padding), so each load and tap is tested.
template <typename T, int KW, int DW, int RUN, int M, int EPI, bool EDGE>
__device__ __forceinline__ void window_row_run(const ConvArgs& a, const EpiArgs& e, const T* xrow, T* yrun,
                                               long long at0, const float* wf, long long c, bool row_inside,
                                               int v0, int ow0) {
    constexpr int VEC = 16 / (int)sizeof(T);
    constexpr int SPAN = (KW - 1) * DW + 1;
    constexpr int LOADS = (M + RUN + SPAN - 1 + VEC - 1) / VEC;
    uint4 raw[LOADS];
    row_vector_loads<T, LOADS, EDGE>(a, xrow, row_inside, v0, raw);
    float xf[LOADS * VEC];
#pragma unroll
    for (int i = 0; i < LOADS; ++i) unpack16(raw[i], T(), xf + i * VEC);
    float acc[RUN];
#pragma unroll
    for (int o = 0; o < RUN; ++o) {
        acc[o] = 0.f;
#pragma unroll
        for (int k = 0; k < KW; ++k) {
            const int j = M + o + k * DW;  // window element: column v0 + j
            if (!column_in_row<EDGE>(a, row_inside, v0 + j)) continue;
            acc[o] = fmaf(xf[j], wf[k], acc[o]);
        }
    }
#pragma unroll
    for (int v = 0; v < RUN / VEC; ++v) {
        if (EDGE && ow0 + v * VEC >= a.ow) break;  // past the row's last output vector
        epilogue_n<T, EPI, VEC, 0>(e, acc + v * VEC, c, at0 + v * VEC);
        Vec16<T, VEC>::store(yrun + v * VEC, acc + v * VEC);
    }
}

template <typename T, int KW, int DW, int RUN, int M, int MINB, int EPI>
__global__ void __launch_bounds__(256, MINB) row_window_dwconv(ConvArgs a, EpiArgs e) {
    constexpr int VEC = 16 / (int)sizeof(T);
    constexpr int SPAN = (KW - 1) * DW + 1;
    constexpr int LOADS = (M + RUN + SPAN - 1 + VEC - 1) / VEC;
    static_assert(RUN % VEC == 0, "a run is whole output vectors");
    static_assert(M >= 0 && M < VEC, "the window starts inside its first vector");
    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ w = static_cast<const T*>(a.w);
    T* __restrict__ y = static_cast<T*>(a.y);
    const int runs = (a.ow + RUN - 1) / RUN;
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long row = t / runs;  // output row (n, c, od, oh)
    const int run = (int)(t - row * runs);
    if (row >= a.n * a.c * a.od * a.oh) return;
    const int oh = (int)(row % a.oh);
    const int od = (int)((row / a.oh) % a.od);
    const long long nc = row / ((long long)a.oh * a.od);
    const long long c = nc % a.c;
    bool row_inside;
    const T* xrow = one_row_input(a, x, nc, od, oh, row_inside);
    const int ow0 = run * RUN;
    const int v0 = ow0 - a.pw - M;  // the first loaded column, a multiple of VEC
    float wf[KW];
#pragma unroll
    for (int k = 0; k < KW; ++k) wf[k] = to_f32(__ldg(w + c * KW + k));
    const long long at0 = row * a.ow + ow0;
    T* yrun = y + at0;
    if (row_inside && v0 >= 0 && v0 + LOADS * VEC <= a.iw && ow0 + RUN <= a.ow)
        window_row_run<T, KW, DW, RUN, M, EPI, false>(a, e, xrow, yrun, at0, wf, c, row_inside, v0, ow0);
    else
        window_row_run<T, KW, DW, RUN, M, EPI, true>(a, e, xrow, yrun, at0, wf, c, row_inside, v0, ow0);
}
