// wgrad_mma: grad-weight (and grad-bias) on tensor cores, bf16/f16, channels-first, unit
// stride along H and W and unit dilation along H (any stride and dilation along D, any
// dilation DW along W).
// Deterministic like wgrad.cu: fixed slices, fixed order, the same f32 partials
// [splits][C][TAPS + 1] and the same finalize kernel (wgrad.cu's wgrad_finalize_dwconv).
//
// For one channel and one output row oh, grad_weight[kd, kh, kw] gets
//   sum over w of x[id(kd), oh - ph + kh, w] * gy[oh, w + pw - kw * DW]
// an MMA C[(kd, kh), kw] += A[(kd, kh), w] * B[w, kw] with A the KD*KH input rows the
// output row reads (M = 16) and B the grad-output row as a Toeplitz matrix (N = 8 per
// tile), the reduction running along W (K = 16 per step). Successive output rows share
// KH-1 of their KH input rows per depth: A's rows are kept in registers in slots
// (ih + ph) mod KH, and each output row loads only its one new row per depth. Output row
// oh then finds tap kh in slot (oh + kh) mod KH, so there is one accumulator set per
// phase oh mod KH (rows of a band are unrolled by KH), unrotated when an item is done.
//
// The K order inside an MMA is free as long as A and B agree: thread (g = lane / 4,
// q = lane % 4) holds k = {2q, 2q+1, 2q+8, 2q+9}, mapped here to columns 4q..4q+3 of the
// step, so A's part is one 8-byte load per row. B's part reads the warp's copy of the
// grad-output row in shared memory (zero margins, so Toeplitz entries past the tile read
// 0), stored twice, one element apart, so each thread's pairs are 4-byte aligned.
//
// Work item: (n, od, a band of BK*KH output rows, a tile of TW outputs along W). Zeros
// that stand in for padding, the tile's edges and the Toeplitz corners multiply real
// values: where an input is NaN or Inf that gives NaN where the oracle (which skips
// them) has +-Inf or a finite value. Any non-finite input reaches some accumulator, so
// an item whose accumulators are not all finite is summed again by an exact scalar loop
// that skips what the oracle skips, and its MMA sums are dropped.
template <int KS, int KW, int DW>
struct WgradMmaTile {
    // Outputs of a W tile: the 16*KS input columns from floor4(ow0 - pw) cover them.
    static constexpr int TW = ((16 * KS - 3 - (KW - 1) * DW) / 4) * 4;
    static_assert(TW >= 4, "k-steps too few for the kernel width");
};

template <typename T, int KD, int KH, int KW, int DW, int KS, int NT, int BK, bool VEC>
__device__ __forceinline__ void wgrad_mma_body(const ConvArgs& a, unsigned short* smem) {
    constexpr int ROWS = KD * KH;
    constexpr int TAPS = ROWS * KW;
    constexpr int TW = WgradMmaTile<KS, KW, DW>::TW;
    constexpr int BH = BK * KH;  // output rows of a band
    constexpr int GW = (TW + 31) / 32;  // grad-output elements a lane stages per row
    // Grad-output row buffer: LEFT zeros, TW values, zeros to 16*KS (+2 for the copy).
    constexpr int LEFT = ((3 + (8 * NT - 1) * DW + 1) / 2) * 2;
    constexpr int GLEN = LEFT + 16 * KS + 2;
    // The second copy GOFF elements on, GOFF*2 bytes = 64 mod 128: the two copies' reads
    // fall in different banks.
    constexpr int GOFF = ((GLEN + 63) / 64) * 64 + 32;
    static_assert(ROWS <= 16, "KD*KH tap rows fill one 16-row MMA tile");
    static_assert(KW <= 8 * NT && NT <= 2, "N tiles of 8 taps");
    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ gy = static_cast<const T*>(a.w);
    float* __restrict__ partials = static_cast<float*>(a.y);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int g = lane >> 2, q = lane & 3;
    const long long c = blockIdx.x;
    const int split = blockIdx.y, splits = gridDim.y;
    // Per-warp shared memory: the two copies of the grad-output row, then f32 sums.
    unsigned short* gbuf = smem + warp * (GOFF + GLEN);
    float* wacc_all = reinterpret_cast<float*>(smem + warps * (GOFF + GLEN));
    float* wacc = wacc_all + warp * (TAPS + 1);
    for (int i = lane; i < GOFF + GLEN; i += 32) gbuf[i] = 0;
    for (int i = lane; i < TAPS + 1; i += 32) wacc[i] = 0.f;
    __syncwarp();

    const int bands = (a.oh + BH - 1) / BH, tiles = (a.ow + TW - 1) / TW;
    const long long items = a.n * a.od * (long long)bands * tiles;
    const long long lo = items * split / splits, hi = items * (split + 1) / splits;
    const long long plane = (long long)a.ih * a.iw;
    // The columns' offset from the tile's first output: floor4(ow0 - pw) + pw - ow0, the
    // same for every tile (TW is a multiple of 4).
    const int off = ((-a.pw) & ~3) + a.pw;  // -pw rounded down to a multiple of 4, + pw
    // This thread's A rows: m = g and g + 8 -> (kd, slot).
    int kd_r[2], slot_r[2];
    bool row_live[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const int m = g + 8 * j;
        kd_r[j] = m / KH;
        slot_r[j] = m % KH;
        row_live[j] = m < ROWS;
    }
    // B reads: element (k-step s, column 4q + e, tap n) is the row buffer at
    // LEFT + off + 16 s + 4q + e - n * DW; pairs from the copy where they are aligned.
    // Copy 1 holds element i at GOFF + i - 1: an odd start is even there.
    const unsigned short* bptr[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        const int base = LEFT + off + 4 * q - (t * 8 + g) * DW;
        bptr[t] = (base & 1) ? gbuf + GOFF + base - 1 : gbuf + base;
    }
    float bacc = 0.f;

    for (long long it = lo + warp; it < hi; it += warps) {
        const int tile = (int)(it % tiles);
        long long r = it / tiles;
        const int band = (int)(r % bands);
        r /= bands;
        const int od = (int)(r % a.od);
        const long long n = r / a.od;
        const int ow0 = tile * TW, oh0 = band * BH, oh1 = min(oh0 + BH, a.oh);
        const int cb = ow0 + off - a.pw;  // first input column of the item's K range
        const T* xc = x + (n * a.c + c) * (long long)a.id * plane;
        const T* gyp = gy + ((n * a.c + c) * a.od + od) * (long long)a.oh * a.ow;
        const T* xp[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int id = od * a.sd - a.pd + kd_r[j] * a.dd;
            const bool ok = row_live[j] && id >= 0 && id < a.id;
            xp[j] = ok ? xc + id * plane : nullptr;
        }
        unsigned af[KS][4];
#pragma unroll
        for (int s = 0; s < KS; ++s)
#pragma unroll
            for (int e = 0; e < 4; ++e) af[s][e] = 0u;
        // Loads input row ih into this thread's A row j (zeros where out of range).
        auto load_row = [&](int j, int ih) {
            const bool ok = xp[j] != nullptr && ih >= 0 && ih < a.ih;
            const T* src = ok ? xp[j] + (long long)ih * a.iw : nullptr;
#pragma unroll
            for (int s = 0; s < KS; ++s) {
                const int col = cb + 16 * s + 4 * q;
                unsigned lo2 = 0u, hi2 = 0u;
                if (VEC) {
                    // 4-column chunks are wholly inside or outside the row (iw % 4 == 0).
                    if (ok && col >= 0 && col < a.iw) {
                        const uint2 v = __ldg(reinterpret_cast<const uint2*>(src + col));
                        lo2 = v.x;
                        hi2 = v.y;
                    }
                } else if (ok) {
                    unsigned short h[4];
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int cc = col + e;
                        h[e] = (cc >= 0 && cc < a.iw)
                            ? __ldg(reinterpret_cast<const unsigned short*>(src + cc))
                            : (unsigned short)0;
                    }
                    lo2 = h[0] | ((unsigned)h[1] << 16);
                    hi2 = h[2] | ((unsigned)h[3] << 16);
                }
                af[s][j] = lo2;
                af[s][j + 2] = hi2;
            }
        };
        // The first KH-1 rows of the band's first output row: slots 0..KH-2.
#pragma unroll
        for (int j = 0; j < 2; ++j)
            if (slot_r[j] < KH - 1) load_row(j, oh0 - a.ph + slot_r[j]);

        float acc[KH][NT][4];
#pragma unroll
        for (int p = 0; p < KH; ++p)
#pragma unroll
            for (int t = 0; t < NT; ++t)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[p][t][e] = 0.f;

        // Grad-output row values this lane stages, loaded one row ahead.
        unsigned short gnext[GW];
        auto fetch_gy = [&](int oh) {
#pragma unroll
            for (int k = 0; k < GW; ++k) {
                const int e = lane + 32 * k, ow = ow0 + e;
                gnext[k] = (oh < oh1 && e < TW && ow < a.ow)
                    ? __ldg(reinterpret_cast<const unsigned short*>(gyp + (long long)oh * a.ow + ow))
                    : (unsigned short)0;
            }
        };
        fetch_gy(oh0);

        for (int ohb = oh0; ohb < oh1; ohb += KH) {
#pragma unroll
            for (int p = 0; p < KH; ++p) {
                const int oh = ohb + p;
                if (oh >= oh1) break;
                // Stage this row's grad-output (both copies), then fetch the next.
                __syncwarp();
#pragma unroll
                for (int k = 0; k < GW; ++k) {
                    const int e = lane + 32 * k;
                    if (e < TW) {
                        gbuf[LEFT + e] = gnext[k];
                        gbuf[GOFF + LEFT + e - 1] = gnext[k];
                        T v;
                        *reinterpret_cast<unsigned short*>(&v) = gnext[k];
                        bacc += to_f32(v);
                    }
                }
                __syncwarp();
                fetch_gy(oh + 1);
                // The new input row of each depth enters slot (p + KH - 1) mod KH.
                const int snew = (p + KH - 1) % KH;
#pragma unroll
                for (int j = 0; j < 2; ++j)
                    if (slot_r[j] == snew) load_row(j, oh - a.ph + KH - 1);
#pragma unroll
                for (int s = 0; s < KS; ++s) {
#pragma unroll
                    for (int t = 0; t < NT; ++t) {
                        const unsigned short* bp = bptr[t] + 16 * s;
                        unsigned b[2];
                        b[0] = *reinterpret_cast<const unsigned*>(bp);
                        b[1] = *reinterpret_cast<const unsigned*>(bp + 2);
                        Mma<T>::run(acc[p][t], af[s], b);
                    }
                }
            }
        }

        // Every non-finite input reaches an accumulator; such an item is summed exactly.
        bool bad = false;
#pragma unroll
        for (int p = 0; p < KH; ++p)
#pragma unroll
            for (int t = 0; t < NT; ++t)
#pragma unroll
                for (int e = 0; e < 4; ++e) bad |= !isfinite(acc[p][t][e]);
        if (__any_sync(0xffffffffu, bad)) {
            const int owe = min(ow0 + TW, a.ow);
            for (int tap = lane; tap < TAPS; tap += 32) {
                const int kd = tap / (KH * KW), kh = (tap / KW) % KH, kw = tap % KW;
                const int id = od * a.sd - a.pd + kd * a.dd;
                float s = 0.f;
                if (id >= 0 && id < a.id) {
                    for (int oh = oh0; oh < oh1; ++oh) {
                        const int ih = oh - a.ph + kh;
                        if (ih < 0 || ih >= a.ih) continue;
                        const T* xr = xc + id * plane + (long long)ih * a.iw;
                        const T* gr = gyp + (long long)oh * a.ow;
                        for (int ow = ow0; ow < owe; ++ow) {
                            const int iw = ow - a.pw + kw * DW;
                            if (iw >= 0 && iw < a.iw) s = fmaf(to_f32(gr[ow]), to_f32(xr[iw]), s);
                        }
                    }
                }
                wacc[tap] += s;
            }
        } else {
            // Unrotate: output row phase p found tap kh in slot (p + kh) mod KH. Within
            // one phase the threads' taps are distinct; phases go in order.
#pragma unroll
            for (int p = 0; p < KH; ++p) {
#pragma unroll
                for (int t = 0; t < NT; ++t)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int j = e >> 1;
                        const int kw = t * 8 + 2 * q + (e & 1);
                        if (row_live[j] && kw < KW) {
                            const int kh = (slot_r[j] - p + KH) % KH;
                            wacc[(kd_r[j] * KH + kh) * KW + kw] += acc[p][t][e];
                        }
                    }
                __syncwarp();
            }
        }
        __syncwarp();
    }

    // grad-bias: a fixed butterfly of the lanes' sums.
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) bacc += __shfl_xor_sync(0xffffffffu, bacc, o);
    if (lane == 0) wacc[TAPS] += bacc;
    __syncthreads();
    // The block's warps in order.
    float* out = partials + ((long long)split * a.c + c) * (TAPS + 1);
    for (int t = threadIdx.x; t < TAPS + 1; t += blockDim.x) {
        float s = 0.f;
        for (int w = 0; w < warps; ++w) s += wacc_all[w * (TAPS + 1) + t];
        out[t] = s;
    }
}

template <typename T, int KD, int KH, int KW, int DW, int KS, int NT, int BK, int EPI>
__global__ void __launch_bounds__(256, 2) wgrad_mma_dwconv(ConvArgs a, EpiArgs) {
    extern __shared__ __align__(16) unsigned short wgrad_mma_smem[];
    // 8-byte input loads need 4-column chunks that rows never straddle.
    const bool vec = a.iw % 4 == 0 && (reinterpret_cast<unsigned long long>(a.x) & 7) == 0;
    if (vec)
        wgrad_mma_body<T, KD, KH, KW, DW, KS, NT, BK, true>(a, wgrad_mma_smem);
    else
        wgrad_mma_body<T, KD, KH, KW, DW, KS, NT, BK, false>(a, wgrad_mma_smem);
}
