// wgrad_cl: grad-weight (and grad-bias) on channels-last data, deterministic like wgrad:
// each block sums a fixed slice of the output rows in a fixed order into the f32 partials
// [splits][C][TAPS + 1] (the last slot grad-bias) that wgrad_finalize adds in split order.
// No atomics.
//
// A lane owns VEC adjacent channels (4, 8 or 16 bytes of them) and RB tap rows (kd, kh):
// each load moves VEC channels, where wgrad's channels-last path moves 2 bytes a lane and
// runs latency-bound (mobilenet-s2 0.119 ms, PyTorch 0.08-0.11; seed-ndhwc 3.37 ms;
// docs/perf.md runs 85-87). Walking an output row, a lane keeps the inputs of its kernel
// window in a register ring of R positions (R >= the window's span, a multiple of SW, so a
// position keeps its slot from one chunk of U = R / SW outputs to the next and every
// index below is a compile-time constant after unrolling): an output costs SW input loads
// per tap row, one grad_output load and RB * KW * VEC multiply-adds.
// Block (CV, G, WK): threadIdx.x a channel vector, .y a group of RB tap rows, .z one of WK
// workers taking every WK-th output row of the block's slice. Grid (channel blocks,
// splits). Padding and the tail of a row are skipped, never multiplied by 0 (a non-finite
// grad_output times a padded 0 would be NaN where PyTorch has none).
// Arguments: a.x = input, a.w = grad_output, a.y = the f32 partials; C % VEC == 0 and
// 16-byte aligned tensors (the launcher and the engine check).

// Whether position j = u*SW + k*DW of a chunk is read by an earlier output (u' < u), so it
// is in the ring already.
__host__ __device__ constexpr bool wgrad_cl_seen(int k, int SW, int DW, int KW) {
    for (int d = 1; d * SW <= (KW - 1) * DW; ++d) {
        const int rel = k * DW + d * SW;  // the position's offset from output u - d's first tap
        if (rel % DW == 0 && rel / DW < KW) return true;
    }
    return false;
}

// Whether chunk position j (>= 0) is read by an output before the row's first (u < 0):
// the prologue loads these, as the previous chunk would have.
__host__ __device__ constexpr bool wgrad_cl_before_row(int j, int SW, int DW, int KW) {
    for (int k = 0; k < KW; ++k) {
        const int rel = k * DW - j;  // = -u * SW for the output u that reads j with tap k
        if (rel > 0 && rel % SW == 0) return true;
    }
    return false;
}

__device__ __forceinline__ float2 wgrad_cl_pair(unsigned u, __half) {
    return __half22float2(*reinterpret_cast<const __half2*>(&u));
}
__device__ __forceinline__ float2 wgrad_cl_pair(unsigned u, __nv_bfloat16) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u));
}

// The raw bytes of a lane's vector: 4, 8 or 16.
template <int B> struct WgradClRaw;
template <> struct WgradClRaw<4> {
    using type = unsigned;
    static __device__ __forceinline__ type zero() { return 0u; }
};
template <> struct WgradClRaw<8> {
    using type = uint2;
    static __device__ __forceinline__ type zero() { return make_uint2(0u, 0u); }
};
template <> struct WgradClRaw<16> {
    using type = uint4;
    static __device__ __forceinline__ type zero() { return make_uint4(0u, 0u, 0u, 0u); }
};

// A lane's vector from p, or zeros where `ok` is false (padding, the row's end).
template <typename T, int VEC>
__device__ __forceinline__ typename WgradClRaw<VEC * sizeof(T)>::type wgrad_cl_fetch(const T* p, bool ok) {
    using R = WgradClRaw<VEC * sizeof(T)>;
    return ok ? __ldg(reinterpret_cast<const typename R::type*>(p)) : R::zero();
}

__device__ __forceinline__ void wgrad_cl_words(unsigned u, float, float* f) { f[0] = __uint_as_float(u); }
__device__ __forceinline__ void wgrad_cl_words(unsigned u, __half, float* f) {
    const float2 t = wgrad_cl_pair(u, __half()); f[0] = t.x; f[1] = t.y;
}
__device__ __forceinline__ void wgrad_cl_words(unsigned u, __nv_bfloat16, float* f) {
    const float2 t = wgrad_cl_pair(u, __nv_bfloat16()); f[0] = t.x; f[1] = t.y;
}

// A raw vector as VEC floats.
template <typename T, int VEC>
__device__ __forceinline__ void wgrad_cl_unpack(unsigned u, float* f) { wgrad_cl_words(u, T(), f); }
template <typename T, int VEC>
__device__ __forceinline__ void wgrad_cl_unpack(uint2 u, float* f) {
    constexpr int H = VEC / 2;  // floats a word holds
    wgrad_cl_words(u.x, T(), f); wgrad_cl_words(u.y, T(), f + H);
}
template <typename T, int VEC>
__device__ __forceinline__ void wgrad_cl_unpack(uint4 u, float* f) {
    constexpr int H = VEC / 4;
    wgrad_cl_words(u.x, T(), f); wgrad_cl_words(u.y, T(), f + H);
    wgrad_cl_words(u.z, T(), f + 2 * H); wgrad_cl_words(u.w, T(), f + 3 * H);
}

// Taps k whose position is new at each output (not read by an earlier one), and k's index
// among them.
__host__ __device__ constexpr int wgrad_cl_new_taps(int SW, int DW, int KW) {
    int n = 0;
    for (int k = 0; k < KW; ++k) n += wgrad_cl_seen(k, SW, DW, KW) ? 0 : 1;
    return n;
}
__host__ __device__ constexpr int wgrad_cl_new_index(int k, int SW, int DW, int KW) {
    int n = 0;
    for (int i = 0; i < k; ++i) n += wgrad_cl_seen(i, SW, DW, KW) ? 0 : 1;
    return n;
}

// Registers of values a lane may hold (mirrored by the descriptor): accumulators, ring and
// the chunk's raw vectors.
#define MAX_WGRAD_CL_VALUES 100

// One work item: outputs [s0, s1) of one output row, its RB tap rows at xr (ok: the row
// exists), the grad_output row at gyr. Each chunk's vectors are fetched together before
// its multiply-adds. (Fetching the next chunk's during the current one's, run 90, held
// twice the vectors: 128 registers, slower on every case.)
// BIAS: this lane's group sums grad-bias too.
template <bool BIAS, typename T, int VEC, int KW, int SW, int DW, int RB>
__device__ __forceinline__ void wgrad_cl_walk(const ConvArgs& a, const T* gyr, const T* const* xr,
                                              const bool* ok, int s0, int s1,
                                              float (&acc)[RB][KW][VEC], float (&bacc)[VEC]) {
    constexpr int SPAN = (KW - 1) * DW + 1;
    constexpr int R = (SPAN + SW - 1) / SW * SW;
    constexpr int U = R / SW;
    constexpr int JMAX = (U - 1) * SW + (KW - 1) * DW;
    constexpr int NK = wgrad_cl_new_taps(SW, DW, KW);
    using Raw = typename WgradClRaw<VEC * sizeof(T)>::type;
    const long long C = a.c;
    bool all_ok = true;
#pragma unroll
    for (int r = 0; r < RB; ++r) all_ok &= ok[r];

    float ring[RB][R][VEC];
    const int pb = s0 * SW - a.pw;  // input position of the item's chunk position 0
#pragma unroll
    for (int r = 0; r < RB; ++r)
#pragma unroll
        for (int j = 0; j < R; ++j) {
            if (!wgrad_cl_before_row(j, SW, DW, KW)) continue;
            const int p = pb + j;
            wgrad_cl_unpack<T, VEC>(
                wgrad_cl_fetch<T, VEC>(xr[r] + (long long)p * C, ok[r] && p >= 0 && p < a.iw), ring[r][j]);
        }

    for (int ow0 = s0; ow0 < s1; ow0 += U) {
        // The chunk's loads all issue before its first multiply-add (no branch between).
        const int p0 = ow0 * SW - a.pw;
        Raw gc[U], xc[RB][U][NK > 0 ? NK : 1];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            gc[u] = wgrad_cl_fetch<T, VEC>(gyr + (long long)(ow0 + u) * C, ow0 + u < s1);
#pragma unroll
            for (int r = 0; r < RB; ++r)
#pragma unroll
                for (int k = 0; k < KW; ++k) {
                    if (wgrad_cl_seen(k, SW, DW, KW)) continue;
                    const int p = p0 + u * SW + k * DW;
                    xc[r][u][wgrad_cl_new_index(k, SW, DW, KW)] =
                        wgrad_cl_fetch<T, VEC>(xr[r] + (long long)p * C, ok[r] && p >= 0 && p < a.iw);
                }
        }
        const bool fast = all_ok && p0 >= 0 && p0 + JMAX < a.iw && ow0 + U <= s1;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            float g[VEC];
            wgrad_cl_unpack<T, VEC>(gc[u], g);  // zeros past s1
            if (BIAS) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) bacc[e] += g[e];
            }
#pragma unroll
            for (int r = 0; r < RB; ++r) {
#pragma unroll
                for (int k = 0; k < KW; ++k) {
                    if (wgrad_cl_seen(k, SW, DW, KW)) continue;
                    wgrad_cl_unpack<T, VEC>(xc[r][u][wgrad_cl_new_index(k, SW, DW, KW)],
                                            ring[r][(u * SW + k * DW) % R]);
                }
                if (fast) {
#pragma unroll
                    for (int k = 0; k < KW; ++k)
#pragma unroll
                        for (int e = 0; e < VEC; ++e)
                            acc[r][k][e] = fmaf(g[e], ring[r][(u * SW + k * DW) % R][e], acc[r][k][e]);
                } else {
                    // Padding, missing tap rows and the item's tail are skipped, not
                    // multiplied by 0.
#pragma unroll
                    for (int k = 0; k < KW; ++k) {
                        const int p = p0 + u * SW + k * DW;
                        if (!ok[r] || ow0 + u >= s1 || p < 0 || p >= a.iw) continue;
#pragma unroll
                        for (int e = 0; e < VEC; ++e)
                            acc[r][k][e] = fmaf(g[e], ring[r][(u * SW + k * DW) % R][e], acc[r][k][e]);
                    }
                }
            }
        }
    }
}

// SEG: outputs per work item along W (0: whole rows); 1-D and short-row problems need
// several items a row to fill the GPU.
template <typename I, typename T, int VEC, int KD, int KH, int KW, int SW, int DW, int RB, int SEG>
__device__ __forceinline__ void wgrad_cl_body(const ConvArgs& a) {
    constexpr int TAPS = KD * KH * KW;
    constexpr int ROWS = KD * KH;
    constexpr int SPAN = (KW - 1) * DW + 1;
    constexpr int R = (SPAN + SW - 1) / SW * SW;
    constexpr int U = R / SW;
    constexpr int NK = wgrad_cl_new_taps(SW, DW, KW);
    static_assert(RB >= 1 && RB <= ROWS, "a group holds 1..KD*KH tap rows");
    static_assert(RB * (KW + R) * VEC + (RB * U * NK + U) * (VEC * (int)sizeof(T) / 4) <= MAX_WGRAD_CL_VALUES,
                  "accumulators, ring and fetched vectors must fit the registers");
    static_assert(VEC * sizeof(T) == 4 || VEC * sizeof(T) == 8 || VEC * sizeof(T) == 16,
                  "a lane loads 4, 8 or 16 bytes");
    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ gy = static_cast<const T*>(a.w);
    float* __restrict__ partials = static_cast<float*>(a.y);

    const int nvec = (int)(a.c / VEC);
    const int cv = blockIdx.x * blockDim.x + threadIdx.x;
    const int group = threadIdx.y, worker = threadIdx.z, workers = blockDim.z;
    const bool live = cv < nvec;
    const int segw = SEG > 0 ? (SEG + U - 1) / U * U : a.ow;
    const I segs = (I)((a.ow + segw - 1) / segw);
    const I items = (I)(a.n * a.od * a.oh) * segs;
    const int split = blockIdx.y, splits = gridDim.y;
    const I lo = (I)((long long)items * split / splits);
    const I hi = (I)((long long)items * (split + 1) / splits);
    const long long C = a.c;

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

    for (I it = lo + worker; live && it < hi; it += workers) {
        const I row = it / segs;
        const int s0 = (int)(it - row * segs) * segw;
        const int s1 = min(s0 + segw, a.ow);
        const I t = row / (I)a.oh;
        const int oh = (int)(row - t * (I)a.oh);
        const I n_ = t / (I)a.od;
        const int od = (int)(t - n_ * (I)a.od);
        const long long n = (long long)n_;
        const T* gyr = gy + ((n * a.od + od) * a.oh + oh) * (long long)a.ow * C + cv * VEC;
        const T* xr[RB];
        bool ok[RB];
        bool any = false;
#pragma unroll
        for (int r = 0; r < RB; ++r) {
            const int q = group * RB + r;
            const int kd = q / KH, kh = q - (q / KH) * KH;
            const int id = od * a.sd - a.pd + kd * a.dd;
            const int ih = oh * a.sh - a.ph + kh * a.dh;
            ok[r] = q < ROWS && id >= 0 && id < a.id && ih >= 0 && ih < a.ih;
            any |= ok[r];
            // Input position 0 of the row (a valid row where this one is missing).
            xr[r] = x + ((n * a.id + (ok[r] ? id : 0)) * a.ih + (ok[r] ? ih : 0)) * (long long)a.iw * C + cv * VEC;
        }
        if (group == 0)  // group 0 sums grad-bias over every row
            wgrad_cl_walk<true, T, VEC, KW, SW, DW, RB>(a, gyr, xr, ok, s0, s1, acc, bacc);
        else if (any)
            wgrad_cl_walk<false, T, VEC, KW, SW, DW, RB>(a, gyr, xr, ok, s0, s1, acc, bacc);
    }

    pdl_launch_dependents();  // the finalize may launch (it waits for this grid)
    // Workers' sums in worker order (a fixed order: the same bits every run), then one
    // partial per (channel, tap).
    constexpr int NACC = RB * KW * VEC + VEC;
    __shared__ float red[256];
    const int lin = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const int plane = blockDim.x * blockDim.y;  // threads of one worker
    float* out = partials + ((long long)split * C + (long long)cv * VEC) * (TAPS + 1);
#pragma unroll
    for (int i = 0; i < NACC; ++i) {
        const int r = i / (KW * VEC), k = (i / VEC) % KW, e = i % VEC;
        const bool is_bias = i >= RB * KW * VEC;
        float v = is_bias ? bacc[e] : acc[r][k][e];
        if (workers > 1) {
            red[lin] = v;
            __syncthreads();
            if (worker == 0) {
                v = 0.f;
                for (int w = 0; w < workers; ++w) v += red[lin + w * plane];
            }
            __syncthreads();
        }
        const int q = group * RB + r;
        if (live && worker == 0 && (is_bias ? group == 0 : q < ROWS))
            out[(long long)e * (TAPS + 1) + (is_bias ? TAPS : q * KW + k)] = v;
    }
}

template <typename T, int VEC, int KD, int KH, int KW, int SW, int DW, int RB, int SEG, int EPI>
__global__ void __launch_bounds__(256) wgrad_cl_dwconv(ConvArgs a, EpiArgs) {
    if (a.n * a.od * a.oh * (long long)a.ow + (long long)blockDim.z < 2147483647LL)
        wgrad_cl_body<unsigned, T, VEC, KD, KH, KW, SW, DW, RB, SEG>(a);
    else
        wgrad_cl_body<long long, T, VEC, KD, KH, KW, SW, DW, RB, SEG>(a);
}
