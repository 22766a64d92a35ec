// wgrad_tile_cl: grad-weight (and grad-bias) on channels-last data from shared-memory
// tiles, deterministic like wgrad: each block sums a fixed range of work items in a fixed
// order into the f32 partials [splits][C][TAPS + 1] (the last slot grad-bias) that
// wgrad_finalize adds in split order. No atomics.
//
// wgrad and wgrad_cl read every input from global memory once per tap row that uses it,
// with few loads in flight (ncu run 104, mobilenet-s1-nhwc: 11-30% achieved occupancy,
// 0.15 ms against cuDNN's 0.039). Here a block copies a whole work item -- TH output rows
// x TW outputs of one (n, od), CB channels: the grad_output tile and the KD x HT x WT
// input positions its taps read -- into shared memory with cp.async (zero fill outside
// the input), the next item's copies in flight while the current one is summed.
// Threads (CV, G, WK): x a vector of VEC channels (CB = CV * VEC), y a group of RB tap
// rows (kd, kh), z a worker taking every WK-th output row of the tile. Per output row and
// tap row a thread reads the WT input vectors and TW grad_output vectors into registers
// once and does TW * KW * VEC multiply-adds from them: lanes of a warp read adjacent
// channels, so the shared reads have no bank conflicts.
// Padding, rows and outputs past the end are skipped, never multiplied by 0 (a non-finite
// grad_output times a padded 0 would be NaN where PyTorch has none): items whose window
// lies inside the input take a path without checks.
// Arguments: a.x = input, a.w = grad_output, a.y = the f32 partials; grid (channel
// blocks, splits); dynamic shared memory 2 * (KD * HT * WT + TH * TW) * CB elements
// (with TMA each of the four regions starts 128-byte aligned).
// C * sizeof(T) and CB * sizeof(T) are multiples of LB (the copy size, 4, 8 or 16 bytes)
// and the tensors 16-byte aligned (the descriptor and the engine check).
// TMA (ncu run 191, mobilenet-s2: half the warp samples and a quarter of the instructions
// were the cp.async loop's address and bounds arithmetic, 10 warps an SM): one thread
// issues an item's two boxes instead -- [KD][HT][WT][CB] of the input at (c0, iw0, ih0,
// id0, n), [TH][TW][CB] of grad_output -- on a per-buffer mbarrier; the boxes' zero fill
// is the padding and the tail. The host picks it where C * sizeof(T) and CB * sizeof(T)
// are multiples of 16 and depth dilation is 1 (or KD is); off Hopper the cp.async copies
// fill the same layout.

// One work item's geometry.
struct WgradTileItem {
    long long n;
    int od, oh0, ow0;
    int id0, ih0, iw0;  // input position of the window's first tap
};

template <typename T, int VEC, int CB, int KD, int KH, int KW, int SW, int DW, int RB, int TH, int TW, int LB, bool TMA>
__device__ __forceinline__ void wgrad_tile_cl_body(const ConvArgs& a, const TmaMaps& maps) {
    constexpr int TAPS = KD * KH * KW;
    constexpr int ROWS = KD * KH;
    constexpr int WT = (TW - 1) * SW + (KW - 1) * DW + 1;  // input positions a tile row reads
    constexpr int CV = CB / VEC;
    constexpr int PER_POS = CB * (int)sizeof(T) / LB;  // copies per position
    static_assert(CB % VEC == 0 && (CB * (int)sizeof(T)) % LB == 0, "whole vectors and copies a block");
    static_assert(LB == 4 || LB == 8 || LB == 16, "cp.async copies 4, 8 or 16 bytes");
    static_assert(RB >= 1 && RB <= ROWS, "a group holds 1..KD*KH tap rows");
    static_assert(RB * KW * VEC <= 64, "accumulators must fit the registers");
    constexpr int EPL = LB / (int)sizeof(T);  // elements a copy moves
    static_assert(!TMA || (CB * (int)sizeof(T)) % 16 == 0, "a TMA box's rows are 16-byte multiples");
#if __CUDA_ARCH__ >= 900
    constexpr bool COPY_TMA = TMA;
#else
    constexpr bool COPY_TMA = false;
#endif
    // A region's elements rounded up to 128 bytes where the TMA writes it.
    auto region = [](int elems) {
        constexpr int A = TMA ? 128 / (int)sizeof(T) : 1;
        return (elems + A - 1) / A * A;
    };

    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ gy = static_cast<const T*>(a.w);
    float* __restrict__ partials = static_cast<float*>(a.y);
    extern __shared__ __align__(128) unsigned char wgrad_tile_smem[];
    T* smem = reinterpret_cast<T*>(wgrad_tile_smem);

    const int HT = (TH - 1) * a.sh + (KH - 1) * a.dh + 1;  // input rows a tile reads per kd
    const int XPOS = KD * HT * WT;
    const int GOFF = region(XPOS * CB);            // grad_output's region in a buffer
    const int STAGE = GOFF + region(TH * TW * CB);  // elements of one buffer
    const int lane = threadIdx.x, group = threadIdx.y, worker = threadIdx.z;
    const int workers = blockDim.z;
    const int tid = lane + CV * (group + blockDim.y * worker);
    const int nthreads = CV * blockDim.y * blockDim.z;
    const long long C = a.c;
    const long long c0 = (long long)blockIdx.x * CB;

    const TileItems<TH, TW> items(a);
    const long long lo = items.lo, hi = items.hi;
    auto item_at = [&](long long it) {
        const TileItem d = items.at(it, a);
        WgradTileItem t;
        t.n = d.n;
        t.od = d.od;
        t.oh0 = d.oh0;
        t.ow0 = d.ow0;
        t.id0 = t.od * a.sd - a.pd;
        t.ih0 = t.oh0 * a.sh - a.ph;
        t.iw0 = t.ow0 * SW - a.pw;
        return t;
    };

    // Issues item it's copies into buffer b and commits one group (an empty one past hi).
    // A thread copies one LB-byte part of every pstep-th position: its channels, and so
    // their check, stay the same; threads past the last whole set of parts idle.
    const int pstep = nthreads / PER_POS;
    const int part = tid % PER_POS, p0 = tid / PER_POS;
    const long long cpart = c0 + part * EPL;
    const bool copies = p0 < pstep && cpart < C;
    // TMA: one mbarrier a buffer, completed once per item copied into it; bit b of
    // `phases` is the parity buffer b's next wait is for.
    __shared__ __align__(8) unsigned long long wgrad_tile_bars[2];
    const unsigned bars = (unsigned)__cvta_generic_to_shared(wgrad_tile_bars);
    unsigned phases = 0;
#if __CUDA_ARCH__ >= 900
    if constexpr (COPY_TMA) mbar_init_pair(bars, tid == 0);
#endif
    auto fetch = [&](long long it, const WgradTileItem& t, int b) {
#if __CUDA_ARCH__ >= 900
        if constexpr (COPY_TMA) {
            if (it < hi && tid == 0) {
                const unsigned dst = (unsigned)__cvta_generic_to_shared(smem + (long long)b * STAGE);
                const unsigned bar = bars + 8u * b;
                mbar_expect_tx(bar, (unsigned)((XPOS + TH * TW) * CB * sizeof(T)));
                tma_load_5d(dst, &maps.input, (int)c0, t.iw0, t.ih0, t.id0, (int)t.n, bar);
                tma_load_5d(dst + (unsigned)(GOFF * sizeof(T)), &maps.output, (int)c0, t.ow0, t.oh0, t.od, (int)t.n,
                            bar);
            }
            return;
        }
#endif
        if (it < hi && copies) {
            const T* xn = x + t.n * a.id * (long long)a.ih * a.iw * C + cpart;  // n's input
            const T* gn = gy + (t.n * a.od + t.od) * (long long)a.oh * a.ow * C + cpart;
            const unsigned base = (unsigned)__cvta_generic_to_shared(smem + (long long)b * STAGE + cpart - c0);
#pragma unroll
            for (int kd = 0; kd < KD; ++kd) {
                const int id = t.id0 + kd * a.dd;
                const bool plane = id >= 0 && id < a.id;
                const T* xp = xn + (long long)id * a.ih * a.iw * C;
                const unsigned bp = base + (unsigned)(kd * HT * WT * CB * sizeof(T));
                for (int pos = p0; pos < HT * WT; pos += pstep) {
                    const int row = pos / WT, col = pos - row * WT;
                    const int ih = t.ih0 + row, iw = t.iw0 + col;
                    const bool ok = plane && ih >= 0 && ih < a.ih && iw >= 0 && iw < a.iw;
                    cl_copy_async<LB>(bp + (unsigned)(pos * CB * sizeof(T)),
                                        ok ? xp + ((long long)ih * a.iw + iw) * C : gy, ok);
                }
            }
            const unsigned bg = base + (unsigned)(GOFF * sizeof(T));
            for (int pos = p0; pos < TH * TW; pos += pstep) {
                const int i = pos / TW, j = pos - i * TW;
                const int oh = t.oh0 + i, ow = t.ow0 + j;
                const bool ok = oh < a.oh && ow < a.ow;
                cl_copy_async<LB>(bg + (unsigned)(pos * CB * sizeof(T)),
                                    ok ? gn + ((long long)oh * a.ow + ow) * C : gy, ok);
            }
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

    // Sums buffer b (item t). INTERIOR: every output of the tile exists and every tap of it
    // reads inside the input. Elsewhere the buffer holds zeros at padding and past the
    // end: a row of finite grad_outputs (its sums finite) times those zeros adds exactly 0,
    // so such rows take the same plain loop; rows with a non-finite grad_output and items
    // with outputs past the end (TAIL: a padded grad_output 0 could meet a non-finite
    // input) skip those positions one by one.
    auto sum_item = [&](const T* buf, const WgradTileItem& t, bool interior, bool tail) {
        const T* xs = buf + lane * VEC;
        const T* gs = buf + GOFF + lane * VEC;
        for (int i = worker; i < TH; i += workers) {
            if (tail && t.oh0 + i >= a.oh) break;
            float g[TW][VEC];
#pragma unroll
            for (int j = 0; j < TW; ++j) cl_read_f32<VEC>(gs + (i * TW + j) * CB, g[j]);
            bool plain = interior;
            if (group == 0 || !interior) {
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
                if (!interior) {
                    plain = !tail;
#pragma unroll
                    for (int e = 0; e < VEC; ++e) plain = plain && fabsf(rs[e]) <= 3.402823466e38f;
                }
            }
#pragma unroll
            for (int r = 0; r < RB; ++r) {
                const int q = group * RB + r;
                if (q >= ROWS) break;
                const int kd = q / KH, kh = q - (q / KH) * KH;
                const int row = i * a.sh + kh * a.dh;
                if (!interior) {
                    const int id = t.id0 + kd * a.dd, ih = t.ih0 + row;
                    if (id < 0 || id >= a.id || ih < 0 || ih >= a.ih) continue;
                }
                const T* xr = xs + ((kd * HT + row) * WT) * CB;
                float v[WT][VEC];
#pragma unroll
                for (int p = 0; p < WT; ++p) cl_read_f32<VEC>(xr + p * CB, v[p]);
                if (plain) {
#pragma unroll
                    for (int j = 0; j < TW; ++j)
#pragma unroll
                        for (int k = 0; k < KW; ++k)
#pragma unroll
                            for (int e = 0; e < VEC; ++e)
                                acc[r][k][e] = fmaf(g[j][e], v[j * SW + k * DW][e], acc[r][k][e]);
                } else {
#pragma unroll
                    for (int j = 0; j < TW; ++j) {
                        if (t.ow0 + j >= a.ow) break;
#pragma unroll
                        for (int k = 0; k < KW; ++k) {
                            const int iw = t.iw0 + j * SW + k * DW;
                            if (iw < 0 || iw >= a.iw) continue;
#pragma unroll
                            for (int e = 0; e < VEC; ++e)
                                acc[r][k][e] = fmaf(g[j][e], v[j * SW + k * DW][e], acc[r][k][e]);
                        }
                    }
                }
            }
        }
    };

    // Two buffers: item it + 1's copies fly while item it is summed. Each item's
    // geometry is worked out once, when its copies are issued.
    WgradTileItem cur = item_at(lo);
    fetch(lo, cur, 0);
    int b = 0;
    for (long long it = lo; it < hi; ++it) {
        const WgradTileItem next = item_at(it + 1);
        fetch(it + 1, next, b ^ 1);
        if constexpr (COPY_TMA) {
            mbar_wait(bars + 8u * b, (phases >> b) & 1u);
            phases ^= 1u << b;
        } else {
            cp_async_wait<1>();
            __syncthreads();
        }
        const bool tail = cur.oh0 + TH > a.oh || cur.ow0 + TW > a.ow;
        const bool interior = !tail && cur.id0 >= 0 && cur.id0 + (KD - 1) * a.dd < a.id && cur.ih0 >= 0 &&
                              cur.ih0 + HT <= a.ih && cur.iw0 >= 0 && cur.iw0 + WT <= a.iw;
        sum_item(smem + (long long)b * STAGE, cur, interior, tail);
        __syncthreads();  // buffer b is refilled by the next iteration's fetch
        b ^= 1;
        cur = next;
    }
    cp_async_wait<0>();

    pdl_launch_dependents();  // the finalize may launch (it waits for this grid)
    // Workers' sums in worker order (a fixed order: the same bits every run), then one
    // partial per (channel, tap). The tile buffers are free now.
    constexpr int NACC = RB * KW * VEC + VEC;
    float* red = reinterpret_cast<float*>(wgrad_tile_smem);
    const int plane = CV * blockDim.y;  // threads of one worker
    float* out = partials + ((long long)blockIdx.y * C + c0 + lane * VEC) * (TAPS + 1);
#pragma unroll
    for (int i = 0; i < NACC; ++i) {
        const int r = i / (KW * VEC), k = (i / VEC) % KW, e = i % VEC;
        const bool is_bias = i >= RB * KW * VEC;
        float v = is_bias ? bacc[e] : acc[r][k][e];
        if (workers > 1) {
            __syncthreads();
            red[tid] = v;
            __syncthreads();
            if (worker == 0)
                for (int w = 1; w < workers; ++w) v += red[tid + w * plane];
        }
        const int q = group * RB + r;
        const bool mine = is_bias ? group == 0 : q < ROWS;
        if (worker == 0 && mine && c0 + lane * VEC + e < C)
            out[(long long)e * (TAPS + 1) + (is_bias ? TAPS : q * KW + k)] = v;
    }
}

// MINB: blocks of 256 threads an SM must hold, a register cap (1: 255, 2: 128, 3: 85,
// 4: 64 a thread) for more resident warps.
// TMA: the buffers are filled by TMA boxes (maps: the input and grad_output as 5-D
// [N][D][H][W][C] tensors; the Rust side encodes them).
template <typename T, int VEC, int CB, int KD, int KH, int KW, int SW, int DW, int RB, int TH, int TW, int LB,
          int TMA, int MINB, int EPI>
__global__ void __launch_bounds__(256, MINB)
    wgrad_tile_cl_dwconv(ConvArgs a, EpiArgs, const __grid_constant__ TmaMaps maps) {
    wgrad_tile_cl_body<T, VEC, CB, KD, KH, KW, SW, DW, RB, TH, TW, LB, TMA != 0>(a, maps);
}
