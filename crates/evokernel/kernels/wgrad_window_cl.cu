// wgrad_window_cl: grad-weight and grad-bias of channels-last one-row kernels (KD = KH = 1)
// at W stride 1, row_window_cl's shape on the backward: a thread owns one 16-byte vector of
// VEC channels and, for its split and group, every (splits x groups)-th run of RUN outputs
// (a fixed order: the same bits every run), loads each run's RUN + SPAN - 1 input vectors
// and RUN grad_output vectors up front (SPAN = (KW - 1) * DW + 1) and sums input x
// grad_output into VEC x KW f32 accumulators in registers, grad_output alone into VEC more
// (grad-bias). wgrad_cl splits its work by rows and segments of rows, and 1-D layers of
// few rows left it few threads (mamba2-conv1d 0.111 ms, 38% of the floor: H200, run 360).
// Writes wgrad's partials [splits][C][KW + 1] (the last slot grad-bias), which
// wgrad_finalize adds in split order; a block's groups add theirs first, in group order,
// through shared memory. No atomics. Taps in the padding are skipped, never multiplied by
// 0 (a non-finite grad_output times a padded 0 would be NaN where PyTorch has none); only
// runs that touch a row's ends (or rows in the D or H padding, which add to grad-bias
// alone) test them.
// Arguments: a.x = input, a.w = grad_output, a.y = the f32 partials; C % VEC == 0 and
// 16-byte aligned activations (the engine checks). Compiled after row_window_cl.cu, whose
// WindowRun and window_loads it uses.

// One run's sums into acc[k * VEC + v] (tap k, channel v) and bacc[v].
template <typename T, int KW, int DW, int RUN, bool EDGE>
__device__ __forceinline__ void wgrad_window_run(const ConvArgs& a, const T* xrun, const T* gyrun, bool row_inside,
                                                 int iw0, int ow0, float* acc, float* bacc) {
    constexpr int VEC = 16 / (int)sizeof(T);
    constexpr int SPAN = (KW - 1) * DW + 1;
    constexpr int LOADS = RUN + SPAN - 1;
    auto in_row = [&](int i) { return window_in_row<EDGE>(a, row_inside, iw0, i); };
    auto output = [&](int o) { return !EDGE || ow0 + o < a.ow; };
    // The loads first, so they are all in flight together.
    uint4 raw[LOADS], graw[RUN];
    window_loads<T, LOADS, EDGE>(a, xrun, row_inside, iw0, raw);
#pragma unroll
    for (int o = 0; o < RUN; ++o)
        graw[o] = output(o) ? __ldg(reinterpret_cast<const uint4*>(gyrun + (long long)o * a.c)) : make_uint4(0u, 0u, 0u, 0u);
    // Input vector i as floats once, in a ring of SPAN (indices fold at compile time).
    float win[SPAN][VEC];
#pragma unroll
    for (int i = 0; i < SPAN - 1; ++i) unpack16(raw[i], T(), win[i]);
#pragma unroll
    for (int o = 0; o < RUN; ++o) {
        unpack16(raw[o + SPAN - 1], T(), win[(o + SPAN - 1) % SPAN]);
        if (!output(o)) continue;
        float g[VEC];
        unpack16(graw[o], T(), g);
#pragma unroll
        for (int v = 0; v < VEC; ++v) bacc[v] += g[v];
#pragma unroll
        for (int k = 0; k < KW; ++k) {
            if (!in_row(o + k * DW)) continue;
            const float* xv = win[(o + k * DW) % SPAN];
#pragma unroll
            for (int v = 0; v < VEC; ++v) acc[k * VEC + v] = fmaf(xv[v], g[v], acc[k * VEC + v]);
        }
    }
}

template <typename T, int KW, int DW, int RUN, int EPI>
__global__ void __launch_bounds__(256) wgrad_window_cl_dwconv(ConvArgs a, EpiArgs) {
    constexpr int VEC = 16 / (int)sizeof(T);
    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ gy = static_cast<const T*>(a.w);
    float* __restrict__ partials = static_cast<float*>(a.y);
    const long long vectors = a.c / VEC;
    // Block (vectors, groups): threadIdx.x a channel vector, threadIdx.y a group of the
    // split's runs. Groups let a few splits (few partials) still fill the SMs with threads;
    // their sums meet in shared memory at the end, in group order.
    const long long cv = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int groups = blockDim.y;
    const int split = blockIdx.y, splits = gridDim.y;
    const int runs = (a.ow + RUN - 1) / RUN;
    const long long items = a.n * a.od * a.oh * runs;
    const long long c0 = cv * VEC;

    float acc[KW * VEC], bacc[VEC];
#pragma unroll
    for (int i = 0; i < KW * VEC; ++i) acc[i] = 0.f;
#pragma unroll
    for (int v = 0; v < VEC; ++v) bacc[v] = 0.f;
    const long long step = (long long)splits * groups;
    for (long long it = (long long)split * groups + threadIdx.y; cv < vectors && it < items; it += step) {
        const long long row = it / runs;  // output row (n, od, oh)
        const WindowRun<T, KW, DW, RUN> r(a, x, row, (int)(it - row * runs), cv);
        const T* gyrun = gy + (row * a.ow + r.ow0) * a.c + r.c0;
        if (r.inside)
            wgrad_window_run<T, KW, DW, RUN, false>(a, r.xrun(a), gyrun, r.row_inside, r.iw0, r.ow0, acc, bacc);
        else
            wgrad_window_run<T, KW, DW, RUN, true>(a, r.xrun(a), gyrun, r.row_inside, r.iw0, r.ow0, acc, bacc);
    }

    pdl_launch_dependents();  // the finalize may launch (it waits for this grid)
    float* out = partials + ((long long)split * a.c + c0) * (KW + 1);
    if (groups == 1) {
        if (cv >= vectors) return;
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
#pragma unroll
            for (int k = 0; k < KW; ++k) out[v * (KW + 1) + k] = acc[k * VEC + v];
            out[v * (KW + 1) + KW] = bacc[v];
        }
        return;
    }
    // One slot (a tap, then grad-bias) at a time through shared memory: [VEC][threads],
    // consecutive threads on consecutive words both ways. Every thread reaches the
    // barriers (those past the channels wrote zeros).
    __shared__ float red[VEC][256];
    const int tid = threadIdx.y * blockDim.x + threadIdx.x;
#pragma unroll
    for (int k = 0; k <= KW; ++k) {
#pragma unroll
        for (int v = 0; v < VEC; ++v) red[v][tid] = k < KW ? acc[k * VEC + v] : bacc[v];
        __syncthreads();
        if (threadIdx.y == 0 && cv < vectors) {
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                float sum = red[v][threadIdx.x];
                for (int g = 1; g < groups; ++g) sum += red[v][g * blockDim.x + threadIdx.x];
                out[v * (KW + 1) + k] = sum;
            }
        }
        __syncthreads();
    }
}
