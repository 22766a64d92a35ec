// row_window_cl: channels-last layers whose kernel is one row (KD = KH = 1) at W stride 1:
// Mamba's and hybrid models' short causal conv1d (4 taps over thousands of channels), or
// a 1xK kernel over the rows of a 2-D or 3-D tensor. Nothing to share between threads, so
// no shared memory and no barrier: a thread owns one 16-byte vector of VEC channels and
// RUN consecutive outputs of one output row, loads the RUN + SPAN - 1 input vectors the
// run reads (SPAN = (KW - 1) * DW + 1) up front, each once, and keeps its VEC x KW
// weights in registers as f32. Consecutive threads take consecutive channel vectors, so
// a warp's loads and stores are 512 contiguous bytes of one pixel. (The FMA rotation,
// depth_reuse_fma_cl, staged these rows through a shared-memory ring at 56% of the
// floor: H200, run 350.)
// Taps in the padding are skipped, not multiplied by zero (a non-finite weight there
// leaves the output alone, as in the oracle); only runs that touch a row's ends, or rows
// wholly in the D or H padding, test them (a run whose loads are inside the row has all
// its outputs: iw0 + LOADS <= iw puts its last at ow - 1 - the padding after, or before).
// Where run `run` (RUN outputs from column run * RUN) of output row `row` (n, od, oh)
// reads, for the thread of channel vector cv: its first channel, its first output and input column, whether
// its input row exists (not in the D or H padding), where the row starts, and whether every load lies inside the row (then
// no load or tap needs a test; such a run has all its outputs: iw0 + LOADS <= iw puts its
// last at ow - 1 - the padding after, or before). Shared by row_window_cl and
// wgrad_window_cl.
template <typename T, int KW, int DW, int RUN>
struct WindowRun {
    static constexpr int LOADS = RUN + (KW - 1) * DW;
    int ow0, iw0;
    bool row_inside, inside;
    const T* xrow;  // the input row's column 0 at channel c0 (a valid row where padding)
    long long c0;   // the thread's first channel
    __device__ __forceinline__ WindowRun(const ConvArgs& a, const T* x, long long row, int run, long long cv) {
        const int oh = (int)(row % a.oh);
        const int od = (int)((row / a.oh) % a.od);
        const long long n = row / ((long long)a.oh * a.od);
        c0 = cv * (16 / (long long)sizeof(T));
        const int zd = od * a.sd - a.pd, zh = oh * a.sh - a.ph;
        row_inside = zd >= 0 && zd < a.id && zh >= 0 && zh < a.ih;
        ow0 = run * RUN;
        iw0 = ow0 - a.pw;
        xrow = x + (((n * a.id + (row_inside ? zd : 0)) * a.ih + (row_inside ? zh : 0)) * (long long)a.iw) * a.c + c0;
        inside = row_inside && iw0 >= 0 && iw0 + LOADS <= a.iw;
    }
    // The run's first load (dereferenced only inside the row).
    __device__ __forceinline__ const T* xrun(const ConvArgs& a) const { return xrow + (long long)iw0 * a.c; }
};

// Whether input vector i of a run starting at column iw0 lies in its row (EDGE; inside the
// row every one does), and the run's LOADS input vectors, all in flight together (zeros
// outside the row). Shared by row_window_cl and wgrad_window_cl.
template <bool EDGE>
__device__ __forceinline__ bool window_in_row(const ConvArgs& a, bool row_inside, int iw0, int i) {
    return !EDGE || (row_inside && iw0 + i >= 0 && iw0 + i < a.iw);
}
template <typename T, int LOADS, bool EDGE>
__device__ __forceinline__ void window_loads(const ConvArgs& a, const T* xrun, bool row_inside, int iw0, uint4 (&raw)[LOADS]) {
#pragma unroll
    for (int i = 0; i < LOADS; ++i)
        raw[i] = window_in_row<EDGE>(a, row_inside, iw0, i) ? __ldg(reinterpret_cast<const uint4*>(xrun + (long long)i * a.c))
                                                            : make_uint4(0u, 0u, 0u, 0u);
}

// One thread's run: RUN outputs from LOADS input vectors starting at xrun. EDGE: the run
// touches the row's ends (or the row is padding), so each load and tap is tested; inside
// the row none is (the common case, its own copy of the code).
template <typename T, int KW, int DW, int RUN, int EPI, bool EDGE>
__device__ __forceinline__ void slide_run(const ConvArgs& a, const EpiArgs& e, const T* xrun, T* yrun, long long at0,
                                          const float* wf, long long c0, bool row_inside, int iw0, int ow0) {
    constexpr int VEC = 16 / (int)sizeof(T);
    constexpr int SPAN = (KW - 1) * DW + 1;
    constexpr int LOADS = RUN + SPAN - 1;
    auto in_row = [&](int i) { return window_in_row<EDGE>(a, row_inside, iw0, i); };
    uint4 raw[LOADS];
    window_loads<T, LOADS, EDGE>(a, xrun, row_inside, iw0, raw);
    // Input vector i as floats once, in a ring of SPAN (indices fold at compile time).
    float win[SPAN][VEC];
#pragma unroll
    for (int i = 0; i < SPAN - 1; ++i) unpack16(raw[i], T(), win[i]);
#pragma unroll
    for (int o = 0; o < RUN; ++o) {
        unpack16(raw[o + SPAN - 1], T(), win[(o + SPAN - 1) % SPAN]);
        if (!EDGE || ow0 + o < a.ow) {
            float acc[VEC];
#pragma unroll
            for (int v = 0; v < VEC; ++v) acc[v] = 0.f;
#pragma unroll
            for (int k = 0; k < KW; ++k) {
                if (!in_row(o + k * DW)) continue;
                const float* xv = win[(o + k * DW) % SPAN];
#pragma unroll
                for (int v = 0; v < VEC; ++v) acc[v] = fmaf(xv[v], wf[v * KW + k], acc[v]);
            }
            epilogue_n<T, EPI, VEC, 1>(e, acc, c0, at0 + (long long)o * a.c);
            Vec16<T, VEC>::store(yrun + (long long)o * a.c, acc);
        }
    }
}

template <typename T, int KW, int DW, int RUN, int MINB, int EPI>
__global__ void __launch_bounds__(256, MINB) row_window_cl_dwconv(ConvArgs a, EpiArgs e) {
    constexpr int VEC = 16 / (int)sizeof(T);
    constexpr int SPAN = (KW - 1) * DW + 1;
    constexpr int LOADS = RUN + SPAN - 1;
    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ w = static_cast<const T*>(a.w);
    T* __restrict__ y = static_cast<T*>(a.y);
    const long long vectors = a.c / VEC;
    const int runs = (a.ow + RUN - 1) / RUN;
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long cv = t % vectors;
    const long long q = t / vectors;
    const int run = (int)(q % runs);
    const long long row = q / runs;  // output row (n, od, oh)
    if (row >= a.n * a.od * a.oh) return;
    const WindowRun<T, KW, DW, RUN> r(a, x, row, run, cv);
    const long long c0 = r.c0;
    // Channel c0 + v's taps: VEC x KW consecutive elements, as KW vectors where the weight
    // is 16-byte aligned (c0 is a multiple of VEC; the plan does not require it of weights:
    // else element by element).
    float wf[VEC * KW];
    const T* wt = w + c0 * KW;
    if ((reinterpret_cast<unsigned long long>(w) & 15) == 0) {
#pragma unroll
        for (int k = 0; k < KW; ++k) unpack16(__ldg(reinterpret_cast<const uint4*>(wt) + k), T(), wf + k * VEC);
    } else {
#pragma unroll
        for (int j = 0; j < VEC * KW; ++j) wf[j] = to_f32(__ldg(wt + j));
    }
    const T* xrun = r.xrun(a);
    T* yrun = y + (row * a.ow + r.ow0) * a.c + c0;
    const long long at0 = (row * a.ow + r.ow0) * a.c + c0;

    if (r.inside)
        slide_run<T, KW, DW, RUN, EPI, false>(a, e, xrun, yrun, at0, wf, c0, r.row_inside, r.iw0, r.ow0);
    else
        slide_run<T, KW, DW, RUN, EPI, true>(a, e, xrun, yrun, at0, wf, c0, r.row_inside, r.iw0, r.ow0);
}
