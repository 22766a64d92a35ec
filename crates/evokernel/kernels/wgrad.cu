// wgrad: grad-weight (and grad-bias) for any spec, deterministic: the same bits on every
// run. Each block sums a fixed slice of one channel's (CF) or 32 channels' (CL)
// reduction domain, the batch and the output rows, in a fixed order into f32 partials
// (workspace [splits][C][TAPS + 1], the last slot grad-bias); wgrad_finalize adds the
// partials of each weight in split order. No atomics anywhere.
//
// A work item is a run of V outputs along W of one output row. The block's warps form
// G groups, one per RB tap rows (kd, kh): warp w belongs to group w % G, so the groups
// walk the same items at about the same time and share the loads through L1. For each
// of its tap rows a thread loads the SPAN inputs the run's taps read into registers once
// and does V * KW multiply-adds from them (accumulators: RB x KW). Unrolling all tap
// rows in one thread (run 66) made a loop body too large for the instruction cache and
// ran the seed 25x slower than its FMA bound). At most 256 threads, 3 blocks an SM.
// Arguments: a.x = input, a.w = grad_output, a.y = the f32 partials; the forward's
// geometry; grid (channel blocks, splits, ZB), block G * (warps per group) warps, where
// the GT tap-row groups are split into ZB blocks of G <= 8 (ZB = 1 up to 8 groups).
// grad-bias is always summed (group 0, a few adds per item; written by z block 0), so one
// specialization serves both; wgrad_finalize's EPI bit 2 writes it.
template <typename I, typename T, bool CHANNELS_LAST, int KD, int KH, int KW, int SW, int DIL_W,
          int V, int RB>
__device__ __forceinline__ void wgrad_body(const ConvArgs& a) {
    constexpr int TAPS = KD * KH * KW;
    constexpr int ROWS = KD * KH;  // tap rows (kd, kh)
    constexpr int GT = (ROWS + RB - 1) / RB;  // tap-row groups in all
    // At most 8 groups a block (256 threads): more (RepLKNet's 31 x 31: 16 groups of two
    // rows) are split over blockIdx.z, each z block the same items for its own groups.
    constexpr int ZB = (GT + 7) / 8;
    constexpr int G = (GT + ZB - 1) / ZB;  // tap-row groups a block
    constexpr int SPAN = (V - 1) * SW + (KW - 1) * DIL_W + 1;
    constexpr int NACC = RB * KW + 1;
    static_assert(RB >= 1 && RB <= ROWS, "a tap-row group holds 1..KD*KH rows");
    static_assert(RB * KW <= 64, "accumulators must fit the registers");
    static_assert(G <= 8, "at most 8 tap-row groups (256 threads)");
    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ gy = static_cast<const T*>(a.w);
    float* __restrict__ partials = static_cast<float*>(a.y);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int group = warp % G, gwarp = warp / G, gwarps = warps / G;
    const int split = blockIdx.y, splits = gridDim.y;
    long long c;
    int worker, workers;
    if (CHANNELS_LAST) {
        c = blockIdx.x * 32LL + lane;  // a warp covers 32 channels: coalesced loads
        worker = gwarp;
        workers = gwarps;
    } else {
        c = blockIdx.x;
        worker = gwarp * 32 + lane;
        workers = gwarps * 32;
    }
    const bool live = c < a.c;
    const I runs = (I)((a.ow + V - 1) / V);
    const long long all = a.n * a.od * a.oh * (long long)runs;
    const I lo = (I)(all * split / splits), hi = (I)(all * (split + 1) / splits);
    const long long ispatial = (long long)a.id * a.ih * a.iw;
    const long long step = CHANNELS_LAST ? a.c : 1;  // elements between W neighbours

    float acc[RB][KW];
#pragma unroll
    for (int r = 0; r < RB; ++r)
#pragma unroll
        for (int k = 0; k < KW; ++k) acc[r][k] = 0.f;
    float bacc = 0.f;

    for (I it = lo + worker; live && it < hi; it += workers) {
        // I is 32-bit where the items fit: 64-bit divisions here cost more than the
        // item's multiply-adds.
        const I row = it / runs;
        const int ow0 = (int)(it - row * runs) * V;
        const I t = row / (I)a.oh;
        const int oh = (int)(row - t * (I)a.oh);
        const I n_ = t / (I)a.od;
        const int od = (int)(t - n_ * (I)a.od);
        const long long n = (long long)n_;
        const long long orow = CHANNELS_LAST
            ? ((n * a.od + od) * a.oh + oh) * (long long)a.ow * a.c + c
            : ((n * a.c + c) * a.od + od) * (long long)a.oh * a.ow + (long long)oh * a.ow;
        float g[V];
#pragma unroll
        for (int v = 0; v < V; ++v) {
            const int ow = ow0 + v;
            g[v] = ow < a.ow ? to_f32(__ldg(gy + orow + ow * step)) : 0.f;
        }
        if (group == 0) {
#pragma unroll
            for (int v = 0; v < V; ++v) bacc += g[v];
        }
        const int iw0 = ow0 * SW - a.pw;
        const bool interior = iw0 >= 0 && iw0 + SPAN <= a.iw && ow0 + V <= a.ow;
        const long long ibase = CHANNELS_LAST ? n * ispatial * a.c + c : (n * a.c + c) * ispatial;
#pragma unroll
        for (int r = 0; r < RB; ++r) {
            const int q = (blockIdx.z * G + group) * RB + r;
            if (q >= ROWS) break;
            const int kd = q / KH, kh = q - (q / KH) * KH;
            const int id = od * a.sd - a.pd + kd * a.dd;
            const int ih = oh * a.sh - a.ph + kh * a.dh;
            if (id < 0 || id >= a.id || ih < 0 || ih >= a.ih) continue;
            const T* xr = x + ibase + ((long long)id * a.ih + ih) * a.iw * step + iw0 * step;
            float xs[SPAN];
            if (interior) {
#pragma unroll
                for (int j = 0; j < SPAN; ++j) xs[j] = to_f32(__ldg(xr + j * step));
#pragma unroll
                for (int k = 0; k < KW; ++k)
#pragma unroll
                    for (int v = 0; v < V; ++v) acc[r][k] = fmaf(g[v], xs[v * SW + k * DIL_W], acc[r][k]);
            } else {
                // Padding and the run's tail are skipped, not multiplied by 0: a
                // non-finite value times 0 would be NaN where PyTorch has none.
#pragma unroll
                for (int j = 0; j < SPAN; ++j) {
                    const int p = iw0 + j;
                    xs[j] = (p >= 0 && p < a.iw) ? to_f32(__ldg(xr + j * step)) : 0.f;
                }
#pragma unroll
                for (int k = 0; k < KW; ++k)
#pragma unroll
                    for (int v = 0; v < V; ++v) {
                        const int p = iw0 + v * SW + k * DIL_W;
                        if (ow0 + v < a.ow && p >= 0 && p < a.iw)
                            acc[r][k] = fmaf(g[v], xs[v * SW + k * DIL_W], acc[r][k]);
                    }
            }
        }
    }

    pdl_launch_dependents();  // the finalize may launch (it waits for this grid)
    // Block sum of each accumulator in a fixed order: CF, a butterfly within each warp
    // then the group's warps in order; CL (a channel per lane), the group's warps in
    // order. Warp g (< G) adds group g's warps.
    __shared__ float red[8][32];
    float* out = partials + ((long long)split * a.c + c) * (TAPS + 1);
#pragma unroll
    for (int i = 0; i < NACC; ++i) {
        const int r = i / KW, k = i - (i / KW) * KW;
        float v = i < RB * KW ? acc[r][k] : bacc;
        if (!CHANNELS_LAST) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        }
        red[warp][lane] = v;
        __syncthreads();
        if (warp < G) {
            float s = 0.f;
            const int l = CHANNELS_LAST ? lane : 0;
            for (int w = warp; w < warps; w += G) s += red[w][l];
            const int q = (blockIdx.z * G + warp) * RB + r;
            const bool is_bias = i == RB * KW;
            if (live && (CHANNELS_LAST || lane == 0) &&
                (is_bias ? warp == 0 && blockIdx.z == 0 : q < ROWS))
                out[is_bias ? TAPS : q * KW + k] = s;
        }
        __syncthreads();
    }
}

template <typename T, bool CHANNELS_LAST, int KD, int KH, int KW, int SW, int DIL_W, int V,
          int RB, int EPI>
__global__ void __launch_bounds__(256, 3) wgrad_dwconv(ConvArgs a, EpiArgs) {
    const long long items = a.n * a.od * a.oh * (long long)((a.ow + V - 1) / V);
    if (items + (long long)blockDim.x < 2147483647LL)
        wgrad_body<unsigned, T, CHANNELS_LAST, KD, KH, KW, SW, DIL_W, V, RB>(a);
    else
        wgrad_body<long long, T, CHANNELS_LAST, KD, KH, KW, SW, DIL_W, V, RB>(a);
}

// Adds the SPLITS partials of each weight (and of grad-bias) and rounds once to T. A
// block takes 256 / PARTS consecutive slots; the PARTS threads of a slot each sum one
// contiguous chunk of SPLITS / PARTS splits in split order, then the chunk sums are added
// in chunk order: a fixed order, so the same bits every run. One thread per slot summing
// every split ran latency-bound (mobilenet: 1440 slots, a chain of 256 loads each).
// a.x = the partials, a.y = grad_weight [C, TAPS], a.w = grad_bias [C] (EPI bit 2) or null.
template <typename T, int TAPS, int SPLITS, int PARTS, int EPI>
__global__ void __launch_bounds__(256) wgrad_finalize_dwconv(ConvArgs a, EpiArgs) {
    static_assert(SPLITS % PARTS == 0 && 256 % PARTS == 0, "PARTS divides SPLITS and 256");
    constexpr int PER_BLOCK = 256 / PARTS;  // slots a block takes per step
    constexpr int CHUNK = SPLITS / PARTS;
    __shared__ float sums[256];
    const float* __restrict__ partials = static_cast<const float*>(a.x);
    T* __restrict__ gw = static_cast<T*>(a.y);
    T* __restrict__ gb = static_cast<T*>(const_cast<void*>(a.w));
    constexpr int SLOTS = TAPS + ((EPI & 4) != 0 ? 1 : 0);
    const long long total = a.c * SLOTS;
    const int part = threadIdx.x / PER_BLOCK, j = threadIdx.x - part * PER_BLOCK;
    pdl_wait();  // launched as the main kernel's dependent: its partials are complete here
    // The loop bound is the same for every thread of a block: the barriers are uniform.
    for (long long base = blockIdx.x * (long long)PER_BLOCK; base < total;
         base += (long long)gridDim.x * PER_BLOCK) {
        const long long i = base + j;
        const long long c = i / SLOTS;
        const int t = (int)(i - c * SLOTS);
        float s = 0.f;
        if (i < total) {
#pragma unroll 8
            for (int p = part * CHUNK; p < (part + 1) * CHUNK; ++p)
                s += partials[((long long)p * a.c + c) * (TAPS + 1) + t];
        }
        if (PARTS > 1) {
            sums[threadIdx.x] = s;
            __syncthreads();
            if (part == 0) {
#pragma unroll
                for (int q = 1; q < PARTS; ++q) s += sums[q * PER_BLOCK + j];
            }
            __syncthreads();
        }
        if (part == 0 && i < total) {
            if (t < TAPS) gw[c * TAPS + t] = from_f32<T>(s);
            else gb[c] = from_f32<T>(s);
        }
    }
}
