// wgrad_window: grad-weight and grad-bias of channels-first one-row kernels (KD = KH = 1)
// at W stride 1, row_window's shape on the backward. A block owns one channel (a row's
// KW taps and its bias) and one split of the channel's runs; each thread takes every
// (blockDim x splits)-th run of RUN outputs (whole 16-byte vectors) in a fixed order,
// loads the run's aligned input window and its RUN / VEC grad_output vectors up front and
// sums input x grad_output into KW f32 accumulators, grad_output alone into one more
// (grad-bias); AHEAD = 1 issues the next item's loads before this one's sums. The block's threads then add their sums in a fixed tree (warp shuffles,
// then the warps in order through shared memory): the same bits every run. Writes wgrad's
// partials [splits][C][KW + 1], which wgrad_finalize adds in split order. No atomics.
// (wgrad_tile staged these rows through shared-memory tiles: causal-conv1d 0.053 ms, 59%
// of the floor; H200, run 351.)
// Taps in the padding are skipped, never multiplied by 0 (a non-finite grad_output times
// a padded 0 would be NaN where PyTorch has none); rows wholly in the D or H padding add
// to grad-bias alone. Arguments: a.x = input, a.w = grad_output, a.y = the f32 partials;
// rows of whole vectors (the descriptor checks). Compiled after row_window.cu, whose
// one_row_input and row_vector_loads it uses.

// One work item: run `run` of output row q = (n, od, oh) of the block's channel c, for a
// kernel of RUN outputs an item whose window starts at element M of its LOADS vectors.
template <typename T, int RUN, int M, int LOADS>
struct WgradRowItem {
    const T* xrow;   // the input row's column 0
    const T* gyrun;  // the run's first grad_output
    int v0, ow0;     // the first loaded input column (a multiple of VEC), the first output
    bool row_inside, inside;  // the row exists; every load and output lies inside it
    __device__ __forceinline__ WgradRowItem(const ConvArgs& a, const T* x, const T* gy, long long c, long long it,
                                            int runs, int rows) {
        const long long q = it / runs;
        const int run = (int)(it - q * runs);
        const int oh = (int)(q % a.oh);
        const int od = (int)((q / a.oh) % a.od);
        const long long nc = (q / rows) * a.c + c;
        constexpr int VEC = 16 / (int)sizeof(T);
        xrow = one_row_input(a, x, nc, od, oh, row_inside);
        ow0 = run * RUN;
        v0 = ow0 - a.pw - M;
        gyrun = gy + (nc * rows + (long long)od * a.oh + oh) * a.ow + ow0;
        inside = row_inside && v0 >= 0 && v0 + LOADS * VEC <= a.iw && ow0 + RUN <= a.ow;
    }
};

// The item's loads (EDGE: each one tested; zeros outside the row and past its last
// output). AHEAD issues them an item ahead of the sums, tested, so a thread's next loads
// fly while it adds.
template <typename T, int RUN, int M, int LOADS, int GLOADS, bool EDGE>
__device__ __forceinline__ void wgrad_row_loads(const ConvArgs& a, const WgradRowItem<T, RUN, M, LOADS>& r,
                                                uint4 (&raw)[LOADS], uint4 (&graw)[GLOADS]) {
    constexpr int VEC = 16 / (int)sizeof(T);
    row_vector_loads<T, LOADS, EDGE>(a, r.xrow, r.row_inside, r.v0, raw);
#pragma unroll
    for (int v = 0; v < GLOADS; ++v)
        graw[v] = !EDGE || r.ow0 + v * VEC < a.ow ? __ldg(reinterpret_cast<const uint4*>(r.gyrun + v * VEC))
                                                  : make_uint4(0u, 0u, 0u, 0u);
}

// One run's sums into acc[k] (tap k) and acc[KW] (grad-bias) from its loaded vectors.
template <typename T, int KW, int DW, int RUN, int M, bool EDGE, int LOADS>
__device__ __forceinline__ void wgrad_row_sums(const ConvArgs& a, const WgradRowItem<T, RUN, M, LOADS>& r,
                                               const uint4 (&raw)[LOADS],
                                               const uint4 (&graw)[RUN * sizeof(T) / 16], float* acc) {
    constexpr int VEC = 16 / (int)sizeof(T);
    float xf[LOADS * VEC], g[RUN];
#pragma unroll
    for (int i = 0; i < LOADS; ++i) unpack16(raw[i], T(), xf + i * VEC);
#pragma unroll
    for (int v = 0; v < RUN / VEC; ++v) unpack16(graw[v], T(), g + v * VEC);
#pragma unroll
    for (int o = 0; o < RUN; ++o) {
        // Outputs past the row's end were loaded as zeros and add nothing to grad-bias.
        acc[KW] += g[o];
#pragma unroll
        for (int k = 0; k < KW; ++k) {
            const int j = M + o + k * DW;  // window element: column v0 + j
            if (EDGE && (r.ow0 + o >= a.ow || !column_in_row<EDGE>(a, r.row_inside, r.v0 + j))) continue;
            acc[k] = fmaf(xf[j], g[o], acc[k]);
        }
    }
}

template <typename T, int KW, int DW, int RUN, int M, int AHEAD, int EPI>
__global__ void __launch_bounds__(256) wgrad_window_dwconv(ConvArgs a, EpiArgs) {
    constexpr int VEC = 16 / (int)sizeof(T);
    constexpr int SPAN = (KW - 1) * DW + 1;
    constexpr int LOADS = (M + RUN + SPAN - 1 + VEC - 1) / VEC;
    constexpr int GLOADS = RUN / VEC;
    static_assert(RUN % VEC == 0, "a run is whole grad_output vectors");
    using Item = WgradRowItem<T, RUN, M, LOADS>;
    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ gy = static_cast<const T*>(a.w);
    float* __restrict__ partials = static_cast<float*>(a.y);
    const long long c = blockIdx.x;
    const int split = blockIdx.y, splits = gridDim.y;
    const int runs = (a.ow + RUN - 1) / RUN;
    const int rows = a.od * a.oh;  // output rows of one image's channel
    const long long items = a.n * rows * (long long)runs;
    const long long step = (long long)blockDim.x * splits;

    float acc[KW + 1];
#pragma unroll
    for (int k = 0; k <= KW; ++k) acc[k] = 0.f;
    long long it = (long long)split * blockDim.x + threadIdx.x;
    if constexpr (AHEAD == 0) {
        // Each item's loads, then its sums (40 registers: every SM holds 2048 threads).
        for (; it < items; it += step) {
            const Item cur(a, x, gy, c, it, runs, rows);
            uint4 raw[LOADS], graw[GLOADS];
            if (cur.inside) {
                wgrad_row_loads<T, RUN, M, LOADS, GLOADS, false>(a, cur, raw, graw);
                wgrad_row_sums<T, KW, DW, RUN, M, false>(a, cur, raw, graw, acc);
            } else {
                wgrad_row_loads<T, RUN, M, LOADS, GLOADS, true>(a, cur, raw, graw);
                wgrad_row_sums<T, KW, DW, RUN, M, true>(a, cur, raw, graw, acc);
            }
        }
    } else if (it < items) {
        // The next item's loads in flight during this one's sums (twice the registers).
        Item cur(a, x, gy, c, it, runs, rows);
        uint4 raw[LOADS], graw[GLOADS];
        wgrad_row_loads<T, RUN, M, LOADS, GLOADS, true>(a, cur, raw, graw);
        for (;;) {
            const long long next = it + step;
            const Item nxt(a, x, gy, c, next < items ? next : it, runs, rows);
            uint4 nraw[LOADS], ngraw[GLOADS];
            if (next < items) wgrad_row_loads<T, RUN, M, LOADS, GLOADS, true>(a, nxt, nraw, ngraw);
            if (cur.inside)
                wgrad_row_sums<T, KW, DW, RUN, M, false>(a, cur, raw, graw, acc);
            else
                wgrad_row_sums<T, KW, DW, RUN, M, true>(a, cur, raw, graw, acc);
            if (next >= items) break;
            it = next;
            cur = nxt;
#pragma unroll
            for (int i = 0; i < LOADS; ++i) raw[i] = nraw[i];
#pragma unroll
            for (int v = 0; v < GLOADS; ++v) graw[v] = ngraw[v];
        }
    }

    pdl_launch_dependents();  // the finalize may launch (it waits for this grid)
    // The block's sums: a shuffle tree in each warp, then warp 0 adds the warps in order.
    __shared__ float warp_sums[8][KW + 1];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int k = 0; k <= KW; ++k) {
        float v = acc[k];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0) warp_sums[warp][k] = v;
    }
    __syncthreads();
    if (threadIdx.x <= KW) {
        float sum = 0.f;
        for (int w = 0; w < (int)(blockDim.x >> 5); ++w) sum += warp_sums[w][threadIdx.x];
        partials[((long long)split * a.c + c) * (KW + 1) + threadIdx.x] = sum;
    }
}
