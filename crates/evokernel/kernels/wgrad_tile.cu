// wgrad_tile: grad-weight (and grad-bias) on channels-first data from shared-memory tiles
// on the FMA pipes, deterministic like wgrad: each block sums a fixed range of work
// items of one channel in a fixed order into the f32 partials [splits][C][TAPS + 1] (the
// last slot grad-bias) that wgrad_finalize adds in split order. No atomics.
//
// Why: wgrad reads every input from global memory once per tap row with per-product edge
// tests (ncu run 68: issue-bound, ALU 55%, 3 integer instructions a product; seed-f32
// 5.35 ms, 16x its FMA bound), and wgrad_mma fills an m16n8k16 with KD*KH x KW taps (3x3x3:
// 27 of 128) and is latency-bound (run 182). Here the FMA pipes do the products and
// nothing else:
// - A work item is TH output rows x TW outputs of one (n, od) of the block's channel. One
//   thread copies it into shared memory as two TMA boxes -- the KD x HT x XW input window
//   (from a 16-byte aligned column OFF elements left of the first tap's; the boxes' zero
//   fill is the padding and the tails) and the TH x TW grad_output tile -- into one of two
//   buffers, the next item's boxes in flight while this one is summed.
// - Thread (segment s, depth kd, tap-row group kg, worker w) takes V = 8 consecutive
//   outputs of each of RW output rows and the RB kernel rows kh = kg*RB.. of depth kd. It
//   walks the input rows those read: each input row is read (16-byte loads) and widened
//   to f32 once and meets the RB grad_output rows that reach it (kept in registers, a
//   rotation of RB slots), V*KW FMAs each (ncu on the seed, run 196: FFMA 64% of the
//   instructions, the widening shifts and masks 16%, 74% of issue slots busy).
// - Zeros in the buffers (padding, tails) multiply real values: where one is NaN or Inf
//   that makes NaN where the oracle (which skips them) has +-Inf or a finite value. Any
//   non-finite input reaches the item's accumulators, so a thread whose item sums are not
//   all finite sums its part again from shared memory with every out-of-range product
//   skipped; its FMA sums are dropped.
// Unit stride and dilation along H (the rotation); any stride and dilation along W and D
// (the TMA boxes: unit depth dilation, or KD = 1; rows 16-byte multiples).
// Arguments: a.x = input, a.w = grad_output, a.y = the f32 partials; grid (C, splits);
// block: SEGS * KD * KG * WK threads rounded up to a warp.

// 16 bytes of shared memory (p 16-byte aligned) as floats. bf16 widens by a shift (low
// half) and a mask (high half): one instruction an element where __bfloat1622float2 takes
// a byte-permute and a shift for the high half.
__device__ __forceinline__ void wgrad_tile_chunk(const float* p, float* f) { shared_chunk_to_f32(p, f); }
__device__ __forceinline__ void wgrad_tile_chunk(const __half* p, float* f) { shared_chunk_to_f32(p, f); }
__device__ __forceinline__ void wgrad_tile_chunk(const __nv_bfloat16* p, float* f) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

template <typename T>
struct WgradTileGeom {
    static constexpr int EPV = 16 / (int)sizeof(T);  // elements of a 16-byte vector
    static constexpr int V = 8;                       // outputs a thread takes of a row
    // A region's elements rounded up to 128 bytes (TMA destinations).
    __host__ __device__ static constexpr int region(int elems) {
        return (elems + 128 / (int)sizeof(T) - 1) / (128 / (int)sizeof(T)) * (128 / (int)sizeof(T));
    }
};

template <typename T, int KD, int KH, int KW, int SW, int DW, int TH, int TW, int RW, int RB, int OFF, bool TMA>
__device__ __forceinline__ void wgrad_tile_body(const ConvArgs& a, const TmaMaps& maps) {
    using G = WgradTileGeom<T>;
    constexpr int EPV = G::EPV, V = G::V;
    constexpr int TAPS = KD * KH * KW;
    constexpr int SEGS = TW / V;
    constexpr int KG = (KH + RB - 1) / RB;  // tap-row groups of a depth
    constexpr int WK = TH / RW;             // workers
    constexpr int NT = SEGS * KD * KG * WK;
    constexpr int HT = TH + KH - 1;                              // input rows a tile reads per depth
    constexpr int WT = (TW - 1) * SW + (KW - 1) * DW + 1;        // input columns a tile row reads
    constexpr int XW = (OFF + WT + EPV - 1) / EPV * EPV;         // a window row in shared memory
    constexpr int SPAN = (V - 1) * SW + (KW - 1) * DW + 1;       // input columns a segment reads
    constexpr int NX = (OFF + SPAN + EPV - 1) / EPV;             // its 16-byte loads
    constexpr int NG = V / EPV > 0 ? V / EPV : 1;                // a grad_output segment's
    constexpr int GOFF = G::region(KD * HT * XW);
    constexpr int STAGE = GOFF + G::region(TH * TW);
    static_assert(TW % V == 0 && TH % RW == 0 && RB >= 1 && RB <= KH, "tile, workers and groups divide");
    static_assert(V % EPV == 0, "segments start 16-byte aligned");
    static_assert(OFF >= 0 && OFF < EPV, "the window starts at most one vector left of the first tap");
    static_assert(NT <= 256, "at most 256 threads");
    static_assert(2 * RB * KW + RB * V + SPAN <= 160, "values a thread holds must fit the registers");
#if __CUDA_ARCH__ >= 900
    constexpr bool COPY_TMA = TMA;
#else
    constexpr bool COPY_TMA = false;
#endif

    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ gy = static_cast<const T*>(a.w);
    float* __restrict__ partials = static_cast<float*>(a.y);
    extern __shared__ __align__(128) unsigned char wgrad_tile_smem_raw[];
    T* smem = reinterpret_cast<T*>(wgrad_tile_smem_raw);

    const int tid = threadIdx.x;
    const bool active = tid < NT;
    const int seg = tid % SEGS;
    const int kd = (tid / SEGS) % KD;
    const int kg = (tid / (SEGS * KD)) % KG;
    const int worker = tid / (SEGS * KD * KG);
    const int kh0 = kg * RB, r0 = worker * RW;
    const long long c = blockIdx.x;
    const long long C = a.c;

    const TileItems<TH, TW> items(a);
    const long long lo = items.lo, hi = items.hi;

    __shared__ __align__(8) unsigned long long wgrad_tile_bars[2];
    const unsigned bars = (unsigned)__cvta_generic_to_shared(wgrad_tile_bars);
    unsigned phases = 0;
#if __CUDA_ARCH__ >= 900
    if constexpr (COPY_TMA) mbar_init_pair(bars, tid == 0);
#endif
    // Copies item it (t) into buffer b: the window's first column is OFF left of the
    // first tap's (ow0 * SW - pw), a multiple of 16 bytes.
    auto fetch = [&](long long it, const TileItem& t, int b) {
        if (it >= hi) return;
        const long long n = t.n;
        const int od = t.od, oh0 = t.oh0, ow0 = t.ow0;
        const int xc0 = ow0 * SW - a.pw - OFF, ih0 = oh0 - a.ph, id0 = od * a.sd - a.pd;
        const int nc = (int)(n * C + c);
        T* buf = smem + b * STAGE;
#if __CUDA_ARCH__ >= 900
        if constexpr (COPY_TMA) {
            if (tid == 0) {
                const unsigned dst = (unsigned)__cvta_generic_to_shared(buf);
                const unsigned bar = bars + 8u * b;
                mbar_expect_tx(bar, (unsigned)((KD * HT * XW + TH * TW) * sizeof(T)));
                tma_load_4d(dst, &maps.input, xc0, ih0, id0, nc, bar);
                tma_load_4d(dst + (unsigned)(GOFF * sizeof(T)), &maps.output, ow0, oh0, od, nc, bar);
            }
            return;
        }
#endif
        // Element by element, zeros outside (off Hopper, or rows the TMA cannot take).
        const long long plane = (long long)a.ih * a.iw;
        const T* xn = x + (long long)nc * a.id * plane;
        for (int i = tid; i < KD * HT * XW; i += blockDim.x) {
            const int col = i % XW, row = (i / XW) % HT, d = i / (XW * HT);
            const int id = id0 + d * a.dd, ih = ih0 + row, iw = xc0 + col;
            const bool ok = id >= 0 && id < a.id && ih >= 0 && ih < a.ih && iw >= 0 && iw < a.iw;
            buf[i] = ok ? xn[id * plane + (long long)ih * a.iw + iw] : from_f32<T>(0.f);
        }
        const T* gn = gy + ((long long)nc * a.od + od) * a.oh * (long long)a.ow;
        for (int i = tid; i < TH * TW; i += blockDim.x) {
            const int j = i % TW, r = i / TW;
            const int oh = oh0 + r, ow = ow0 + j;
            const bool ok = oh < a.oh && ow < a.ow;
            buf[GOFF + i] = ok ? gn[(long long)oh * a.ow + ow] : from_f32<T>(0.f);
        }
    };

    // This thread's sums over the items (tot) and one item's (acc).
    float tot[RB][KW], bacc = 0.f;
#pragma unroll
    for (int u = 0; u < RB; ++u)
#pragma unroll
        for (int k = 0; k < KW; ++k) tot[u][k] = 0.f;

    // Sums item (n, od, oh0, ow0) from buffer buf into tot (and grad-output into bacc).
    auto sum_item = [&](const T* buf, int od, int oh0, int ow0) {
        const int id = od * a.sd - a.pd + kd * a.dd;
        const bool depth_ok = id >= 0 && id < a.id;
        float acc[RB][KW];
#pragma unroll
        for (int u = 0; u < RB; ++u)
#pragma unroll
            for (int k = 0; k < KW; ++k) acc[u][k] = 0.f;
        float g[RB][V];  // grad_output rows: output row i in slot i % RB
        const T* gs = buf + GOFF + r0 * TW + seg * V;
        const T* xs = buf + (kd * HT + r0 + kh0) * XW + seg * V * SW;
        // Input row r0 + kh0 + rr meets output rows r0 + rr - u (kernel row kh0 + u).
        // Unrolled: which rows meet is then known to the compiler (guards around each u
        // made ptxas widen a row once per u, run 195).
#pragma unroll
        for (int rb = 0; rb < RW + RB - 1; rb += RB) {
#pragma unroll
            for (int p = 0; p < RB; ++p) {
                const int rr = rb + p;
                if (rr >= RW + RB - 1) break;
                if (rr < RW) {
#pragma unroll
                    for (int v = 0; v < NG; ++v) wgrad_tile_chunk(gs + rr * TW + v * EPV, &g[p][v * EPV]);
#pragma unroll
                    for (int j = 0; j < V; ++j) bacc += g[p][j];
                }
                // (Input rows past the last kernel row of a partial last group are not read.)
                if (!depth_ok || rr > RW + KH - 2 - kh0) continue;
                float xv[NX * EPV];
#pragma unroll
                for (int v = 0; v < NX; ++v) wgrad_tile_chunk(xs + rr * XW + v * EPV, &xv[v * EPV]);
#pragma unroll
                for (int u = 0; u < RB; ++u) {
                    const int i = rr - u;  // output row (relative to r0)
                    if (i < 0 || i >= RW || kh0 + u >= KH) continue;
                    const int slot = (p - u + RB) % RB;
#pragma unroll
                    for (int j = 0; j < V; ++j)
#pragma unroll
                        for (int k = 0; k < KW; ++k)
                            acc[u][k] = fmaf(g[slot][j], xv[OFF + j * SW + k * DW], acc[u][k]);
                }
            }
        }
        if (!depth_ok) return;
        bool bad = false;
#pragma unroll
        for (int u = 0; u < RB; ++u)
#pragma unroll
            for (int k = 0; k < KW; ++k) bad |= !isfinite(acc[u][k]);
        if (!bad) {
#pragma unroll
            for (int u = 0; u < RB; ++u)
#pragma unroll
                for (int k = 0; k < KW; ++k) tot[u][k] += acc[u][k];
            return;
        }
        // A non-finite value met: this thread's part again, out-of-range products skipped.
        const int ow_s = ow0 + seg * V;
#pragma unroll
        for (int u = 0; u < RB; ++u) {
            const int kh = kh0 + u;
            if (kh >= KH) continue;
#pragma unroll
            for (int k = 0; k < KW; ++k) {
                float s = tot[u][k];
#pragma unroll 1
                for (int i = 0; i < RW; ++i) {
                    const int oh = oh0 + r0 + i, ih = oh - a.ph + kh;
                    if (oh >= a.oh || ih < 0 || ih >= a.ih) continue;
                    const T* gr = buf + GOFF + (r0 + i) * TW + seg * V;
                    const T* xr = buf + (kd * HT + r0 + i + kh) * XW;
#pragma unroll 1
                    for (int j = 0; j < V; ++j) {
                        const int ow = ow_s + j, iw = ow * SW - a.pw + k * DW;
                        if (ow >= a.ow || iw < 0 || iw >= a.iw) continue;
                        s = fmaf(to_f32(gr[j]), to_f32(xr[OFF + (seg * V + j) * SW + k * DW]), s);
                    }
                }
                tot[u][k] = s;
            }
        }
    };

    // Each item's position is worked out once, when its copies are issued.
    TileItem cur = items.at(lo, a);
    fetch(lo, cur, 0);
    if constexpr (!COPY_TMA) __syncthreads();
    int b = 0;
    for (long long it = lo; it < hi; ++it) {
        const TileItem next = items.at(it + 1, a);
        fetch(it + 1, next, b ^ 1);
        if constexpr (COPY_TMA) {
            mbar_wait(bars + 8u * b, (phases >> b) & 1u);
            phases ^= 1u << b;
        }
        if (active) sum_item(smem + b * STAGE, cur.od, cur.oh0, cur.ow0);
        __syncthreads();  // buffer b is refilled next; (copies) buffer b ^ 1 is complete
        b ^= 1;
        cur = next;
    }

    // Every thread's sums in a fixed order (workers, then segments): the same bits every
    // run. The tile buffers are free now.
    constexpr int NV = RB * KW + 1;
    float* red = reinterpret_cast<float*>(wgrad_tile_smem_raw);
    if (active) {
#pragma unroll
        for (int u = 0; u < RB; ++u)
#pragma unroll
            for (int k = 0; k < KW; ++k) red[(u * KW + k) * NT + tid] = tot[u][k];
        red[(NV - 1) * NT + tid] = bacc;
    }
    __syncthreads();
    pdl_launch_dependents();  // the finalize may launch (it waits for this grid)
    float* out = partials + ((long long)blockIdx.y * C + c) * (TAPS + 1);
    for (int t = tid; t < TAPS + 1; t += blockDim.x) {
        float s = 0.f;
        if (t == TAPS) {
            // grad-bias: the depth-0 threads of the first tap-row group saw every output.
            for (int w = 0; w < WK; ++w)
                for (int q = 0; q < SEGS; ++q) s += red[(NV - 1) * NT + q + SEGS * KD * KG * w];
        } else {
            const int d = t / (KH * KW), kh = (t / KW) % KH, k = t % KW;
            const int grp = kh / RB, u = kh - grp * RB;
            for (int w = 0; w < WK; ++w)
                for (int q = 0; q < SEGS; ++q)
                    s += red[(u * KW + k) * NT + q + SEGS * (d + KD * (grp + KG * w))];
        }
        out[t] = s;
    }
}

// RW: output rows a worker takes (TH / RW workers); RB: kernel rows a thread takes; OFF:
// elements between the window's 16-byte aligned first column and the first tap's.
// TMA: the buffers are filled by TMA boxes (maps: the input and grad_output as
// [planes][D][H][W] tensors; the Rust side encodes them); elsewhere the threads copy.
// MINB: blocks an SM must hold (the register cap).
template <typename T, int KD, int KH, int KW, int SW, int DW, int TH, int TW, int RW, int RB, int OFF, int TMA,
          int MINB, int EPI>
__global__ void __launch_bounds__(256, MINB)
    wgrad_tile_dwconv(ConvArgs a, EpiArgs, const __grid_constant__ TmaMaps maps) {
    wgrad_tile_body<T, KD, KH, KW, SW, DW, TH, TW, RW, RB, OFF, TMA != 0>(a, maps);
}
