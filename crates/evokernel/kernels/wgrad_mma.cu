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
// The K order is free as long as A and B agree: thread (g = lane / 4, q = lane % 4)
// holds k = {2q, 2q+1, 2q+8, 2q+9} of a step, mapped here to 4 consecutive columns, and
// k-steps go in pairs: steps 2i and 2i+1 give lane q columns 32i + 8q .. + 7 (an odd
// last step: 32i + 4q .. + 3). So a row's A part is one 16-byte load per pair of steps,
// and B's part (the grad-output row where the ring put it; zero margins, so Toeplitz
// entries past the tile read 0) 5 aligned 4-byte words and 4 byte-permutes per pair.
// (Shared-memory wavefronts bound the kernel, run 205: 30 a row with one step a load,
// 21 this way; lanes' blocks of 4 KS columns would load fewer words but put two lanes
// on one bank.) Where KD*KH < 16, A's last row is all
// ones, so C's row 15, column 0 sums the grad-output: grad-bias for free.
//
// Each output row's new input rows and its grad-output row arrive through a per-warp ring
// of R slots in shared memory, copied R - 1 rows ahead with cp.async (8-byte chunks,
// zero-filled where out of range), so the loads' latency hides behind the MMAs of the
// rows before (run 70: loading them at the top of the row left the seed latency-bound at
// 0.683 ms). Data that is not 8-byte aligned in whole 4-column chunks is copied by the
// same ring synchronously, element by element.
//
// Work item: (n, od, a band of BK*KH output rows, a tile of TW outputs along W). Zeros
// that stand in for padding, the tile's edges and the Toeplitz corners multiply real
// values: where an input is NaN or Inf that gives NaN where the oracle (which skips
// them) has +-Inf or a finite value. Any non-finite input reaches some accumulator, so
// an item whose accumulators are not all finite is summed again by an exact scalar loop
// that skips what the oracle skips, and its MMA sums are dropped.
// A tile's first column and width are multiples of this: 4 for 8-byte cp.async chunks,
// 8 with TMA copies, whose first column must be a multiple of 16 bytes.
__host__ __device__ constexpr int wgrad_mma_align(bool tma) { return tma ? 8 : 4; }

template <int KS, int KW, int DW, bool TMA>
struct WgradMmaTile {
    // Outputs of a W tile: the 16*KS input columns from floor_ALIGN(ow0 - pw) cover them
    // (with TMA a multiple of 8 outputs, so every tile's grad-output box starts aligned).
    static constexpr int ALIGN = wgrad_mma_align(TMA);
    static constexpr int TW = ((16 * KS - (ALIGN - 1) - (KW - 1) * DW) / ALIGN) * ALIGN;
    static_assert(TW >= ALIGN, "k-steps too few for the kernel width");
};

// One ring slot: the KD input rows of 16*KS columns (from XOFF) of RPS output rows, and
// their grad-output rows between zero margins (LEFT before: the Toeplitz reads reach
// (8*NT - 1)*DW + ALIGN elements left of the tile, the last one for the word below an
// odd start; zeros after it up to 16*KS + 4 columns). cp.async copies (RPS = 1): the
// input rows first, then the grad-output row. TMA copies: the grad-output rows first,
// each TMA destination and the slot 128-byte aligned (multiples of 64 elements); with
// RPS > 1 (one tile a row) the grad-output rows are GYROW apart, read as one box that
// runs past the row's end, so each row's zeros past the tensor's edge are the next
// row's left margin and its own right one. Input rows: [kd][RPS][16*KS]. Mirrored by
// WgradMma::shared_bytes.
// SW > 0 (shared depths): one ring for the block's SW warps, which take SW consecutive
// output depths of an item: a slot holds their SW grad-output row sets ([SW][RPS] rows
// GYROW apart, each warp's left margin the zeros past the row before) and the SW + KD - 1
// input depths they read between them (warp w's depth kd at w + kd), so each input row
// is copied once for the block instead of once a warp and output depth.
template <int KD, int KS, int NT, int DW, int TW, bool TMA, int RPS, int SW = 0>
struct WgradMmaRing {
    static constexpr int XROW = 16 * KS;
    static constexpr int ALIGN = wgrad_mma_align(TMA);
    static constexpr int LEFT = ((ALIGN + (8 * NT - 1) * DW + 3) / 4) * 4;
    __host__ __device__ static constexpr int up64(int v) { return (v + 63) / 64 * 64; }
    __host__ __device__ static constexpr int up8(int v) { return (v + 7) / 8 * 8; }
    static constexpr int GYROW = RPS > 1 ? up8((16 * KS + 4 > TW + LEFT) ? 16 * KS + 4 : TW + LEFT) : 0;
    static constexpr int GYBOX = RPS > 1 ? GYROW : TW;  // the grad-output box's columns
    // The grad-output row's first element, and the input rows'.
    static constexpr int GY = TMA ? up64(LEFT) : KD * XROW + LEFT;
    static constexpr int GDEP = SW > 0 ? SW : 1, XDEP = SW > 0 ? SW + KD - 1 : KD;
    static constexpr int XOFF = TMA ? up64(GY + (RPS > 1 ? GDEP * RPS * GYROW : 16 * KS + 4)) : 0;
    static constexpr int XKD = RPS * XROW;  // between depths
    static constexpr int SLOT = TMA ? up64(XOFF + XDEP * XKD) : GY + 16 * KS + 4 + 4;
    static_assert(RPS == 1 || TMA, "several rows a slot only with TMA boxes");
    static_assert(SW == 0 || (TMA && RPS > 1), "shared depths: TMA boxes of whole-row slots");
    static constexpr int XCH = KD * 4 * KS;  // 8-byte chunks of the input rows
    static constexpr int GCH = TW / 4;       // 8-byte chunks of the grad-output row
    static_assert(SLOT % 4 == 0 && GY % 4 == 0, "8-byte aligned copies");
    static_assert(!TMA || (SLOT % 64 == 0 && GY % 64 == 0 && XOFF % 64 == 0), "128-byte aligned TMA boxes");
};

// Step s's first column for lane q within a k-range of KS steps (pairs of steps: the
// K order above).
__host__ __device__ constexpr int wgrad_mma_kcol(int s, int ks, int q) {
    return s < ks / 2 * 2 ? 32 * (s / 2) + 8 * q + 4 * (s % 2) : 32 * (s / 2) + 4 * q;
}

__device__ __forceinline__ void cp_async8_zfill(unsigned dst, const void* src, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src),
                 "r"(ok ? 8 : 0));
}

// Two 16-bit elements (their bits) as one 32-bit fragment register, h[0] in the low half.
__device__ __forceinline__ unsigned pack_pair(const unsigned short* h) {
    return h[0] | ((unsigned)h[1] << 16);
}

// CLG > 0: channels-last data (wgrad_mma_cl.cu), a block of CLG channels, a warp each,
// all on the same item. One TMA box a tensor a slot lands [rows][columns][CLG channels]
// in a block-wide staging ring; once in, the block's warps transpose it (ldmatrix.trans
// + stmatrix, 8 columns x 8 channels a matrix) into each warp's one slot of the
// channels-first layout, which the MMA rows below then read unchanged.
// GRP (channels-last, 16 channels, Hopper): the block's warps in GRP groups of 8 channels,
// each transposing its own channels and meeting at its own barrier, so one group can run
// its MMA rows while the other transposes; a staging slot is refilled once every group
// has arrived on its empty barrier.
template <typename T, int KD, int KH, int KW, int DW, int KS, int NT, int BK, int R, bool VEC, bool TMA, int RPS, int SW, int CLG = 0, int GRP = 1>
__device__ __forceinline__ void wgrad_mma_body(const ConvArgs& a, unsigned short* smem, const TmaMaps& maps) {
    constexpr int ROWS = KD * KH;
    constexpr int TAPS = ROWS * KW;
    constexpr int TW = WgradMmaTile<KS, KW, DW, TMA>::TW;
    using Ring = WgradMmaRing<KD, KS, NT, DW, TW, TMA, RPS, SW>;
    // TMA copies on Hopper; elsewhere the same layout is filled by cp.async.
#if __CUDA_ARCH__ >= 900
    constexpr bool COPY_TMA = TMA;
#else
    constexpr bool COPY_TMA = false;
#endif
    constexpr int BH = BK * KH;  // output rows of a band
    constexpr bool ONES = ROWS < 16;  // A's row 15 all ones: C[15][0] is grad-bias
    constexpr int XK = (Ring::XCH + 31) / 32, GK = (Ring::GCH + 31) / 32;
    static_assert(ROWS <= 16, "KD*KH tap rows fill one 16-row MMA tile");
    static_assert(KW <= 8 * NT && NT <= 2, "N tiles of 8 taps");
    static_assert(R == 2 || R == 4 || R == 8, "a power-of-two ring");
    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ gy = static_cast<const T*>(a.w);
    float* __restrict__ partials = static_cast<float*>(a.y);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int g = lane >> 2, q = lane & 3;
    constexpr bool CL = CLG > 0;
    static_assert(!CL || (TMA && SW == 0 && (CLG == 8 || CLG == 16)), "channels-last: TMA boxes of 8 or 16 channels");
    static_assert(GRP == 1 || (CLG == 16 && GRP == 2), "groups of 8 channels");
    // Off Hopper the block fills each staging slot together: one group.
    constexpr int GROUPS = CL && COPY_TMA ? GRP : 1;
    constexpr bool SPLIT = GROUPS > 1;
    constexpr int GWARPS = CL ? CLG / GROUPS : 1;  // a group's warps
    const int group = warp / GWARPS, gwarp = warp - group * GWARPS;
    // The warp's channel (channels-last: the block's CLG channels from c0, a warp each).
    const long long c0 = (long long)blockIdx.x * (CL ? CLG : 1);
    const long long c = CL ? c0 + warp : c0;
    const int split = blockIdx.y, splits = gridDim.y;
    // Shared memory: every warp's ring (SW: the block's one ring), then every warp's f32
    // sums, then (TMA) every ring's R slot barriers, 8-byte aligned.
    constexpr bool SHARED = SW > 0;
    // Channels-last: every warp's one slot (TSLOT apart: the 8 rows of an stmatrix, a
    // channel each, on distinct bank groups), then the block's staging ring of R slots.
    constexpr int TSLOT = Ring::SLOT + 8;
    constexpr int SG = (RPS * Ring::GYBOX * CLG + 63) / 64 * 64;  // staging: the input box's start
    constexpr int STG = (SG + KD * RPS * Ring::XROW * CLG + 63) / 64 * 64;
    const int rings = SHARED ? 1 : warps, my_ring = SHARED ? 0 : warp;
    unsigned short* ring = CL ? smem + warp * TSLOT : smem + my_ring * (R * Ring::SLOT);
    unsigned short* staging = smem + (warps * TSLOT + 63) / 64 * 64;  // 128-byte aligned TMA boxes
    float* wacc_all = reinterpret_cast<float*>(CL ? staging + R * STG : smem + rings * (R * Ring::SLOT));
    float* wacc = wacc_all + warp * (TAPS + 1);
    const unsigned bars = ((unsigned)__cvta_generic_to_shared(wacc_all + warps * (TAPS + 1)) + 7u) / 8u * 8u +
                          (unsigned)((CL ? 0 : my_ring) * R * 8);
    // This warp's grad-output rows and input depths in a slot (SW: its part of the block's).
    const int gy_at = SHARED ? warp * RPS * Ring::GYROW : 0, x_at = SHARED ? warp * Ring::XKD : 0;
    // The ring's owners: the warp, or the block. A ring's leader issues its TMA boxes.
    const int owner = SHARED || CL ? (int)threadIdx.x : lane, owners = SHARED || CL ? (int)blockDim.x : 32;
    auto sync_owners = [&]() {
        if constexpr (SHARED || CL)
            __syncthreads();
        else
            __syncwarp();
    };
    // A group's warps (barriers 1, 2: 0 is __syncthreads').
    auto sync_group = [&]() {
        if constexpr (SPLIT)
            asm volatile("bar.sync %0, %1;\n" ::"r"(1 + group), "n"(32 * GWARPS) : "memory");
        else
            sync_owners();
    };
    // Zero margins once: the copies only ever write the rows and the row's TW values.
    if constexpr (CL) {
        for (int i = 4 * owner; i < warps * TSLOT; i += 4 * owners) *reinterpret_cast<uint2*>(smem + i) = make_uint2(0u, 0u);
    } else {
        for (int i = 4 * owner; i < R * Ring::SLOT; i += 4 * owners) *reinterpret_cast<uint2*>(ring + i) = make_uint2(0u, 0u);
    }
    for (int i = lane; i < TAPS + 1; i += 32) wacc[i] = 0.f;
#if __CUDA_ARCH__ >= 900
    if constexpr (COPY_TMA) {
        // The zeros are written before any TMA copy lands in the same slots.
        fence_proxy_async();
        if (owner == 0) {
            for (int i = 0; i < R; ++i) mbar_init(bars + 8 * i, 1);
            // SPLIT: R empty barriers after the full ones, one arrival a group.
            if constexpr (SPLIT)
                for (int i = 0; i < R; ++i) mbar_init(bars + 8 * (R + i), GROUPS);
        }
    }
#endif
    sync_owners();
    const unsigned ring_s = (unsigned)__cvta_generic_to_shared(ring);
    const unsigned smem_s = (unsigned)__cvta_generic_to_shared(smem), stage_s = (unsigned)__cvta_generic_to_shared(staging);
    // Each slot's barrier completes once per row copied into it: the parity to wait
    // for is bit `slot` here, flipped per wait (warp-uniform).
    unsigned phases = 0;
    // SPLIT, the leader: the empty barriers' parities to wait for (1 first: a fresh
    // barrier's previous phase counts as complete).
    unsigned empties = ~0u;

    const int bands = (a.oh + BH - 1) / BH, tiles = (a.ow + TW - 1) / TW;
    // Output depths of an item: 1 a warp, or SW for the block (warp w takes the w-th).
    const int od_groups = SHARED ? (a.od + SW - 1) / SW : a.od;
    const long long items = a.n * od_groups * (long long)bands * tiles;
    const long long lo = items * split / splits, hi = items * (split + 1) / splits;
    const long long plane = (long long)a.ih * a.iw;
    // The columns' offset from the tile's first output: floor4(ow0 - pw) + pw - ow0
    // (floor8 with TMA), the same for every tile (TW is a multiple of 4, or 8).
    const int off = ((-a.pw) & -Ring::ALIGN) + a.pw;
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
    // B: element (pair i, column 8q + e, tap n) is the slot's grad-output row at
    // GY + off + 32 i + 8q + e - n DW (relative to the tile's first output); an odd last
    // step's (column 4q + e) at GY + off + 32 i + 4q + e - n DW. Read as 4-byte words from
    // the even element at or below, shifted by one element where the start is odd (the
    // same parity either way).
    int bword[NT], bword_last[NT];
    unsigned bsel[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        const int base = Ring::GY + off + 8 * q - (t * 8 + g) * DW;
        bword[t] = base & ~1;
        bword_last[t] = (base - 4 * q) & ~1;
        bsel[t] = (base & 1) ? 0x5432u : 0x3210u;
    }
    // This lane's copies of a row: input chunk i = lane + 32 k is depth i / (4 KS),
    // columns 4 (i % (4 KS)) .. + 3.
    int xch_at[XK];
#pragma unroll
    for (int k = 0; k < XK; ++k) {
        const int i = lane + 32 * k, kd = i / (4 * KS), ch = i - kd * (4 * KS);
        xch_at[k] = kd * Ring::XKD + 4 * ch;
    }
    float bacc = 0.f;
    const unsigned one = IsBf16<T>::value ? 0x3F803F80u : 0x3C003C00u;

    // An element's offset from its channel's first: channels-last data steps C a pixel.
    const long long es = CL ? a.c : 1;
    for (long long it = lo + (SHARED || CL ? 0 : warp); it < hi; it += SHARED || CL ? 1 : warps) {
        const int tile = (int)(it % tiles);
        long long r = it / tiles;
        const int band = (int)(r % bands);
        r /= bands;
        const int odg = (int)(r % od_groups);
        const long long n = r / od_groups;
        // SW: a warp past the last output depth still fills and waits with the block, and
        // sums nothing (its grad-output rows are zeros; its input rows serve the others).
        const int od = SHARED ? odg * SW + warp : odg;
        const bool live = CL ? c < a.c : !SHARED || od < a.od;
        const int ow0 = tile * TW, oh0 = band * BH, oh1 = min(oh0 + BH, a.oh);
        const int cb = ow0 + off - a.pw;  // first input column of the item's K range
        const T* xc = CL ? x + n * a.id * plane * a.c + c : x + (n * a.c + c) * (long long)a.id * plane;
        const T* gyp = CL ? gy + (n * a.od + od) * (long long)a.oh * a.ow * a.c + c
                          : gy + ((n * a.c + c) * a.od + od) * (long long)a.oh * a.ow;
        // Per chunk: its source at the band's first new input row (advanced one row per
        // issued row: issue() is called for rows 0, 1, 2, ... in order) and whether its
        // depth and columns exist; the same for the grad-output chunk.
        const int ih_first = oh0 - a.ph + KH - 1;
        const int nc = (int)(n * a.c + c), id0 = od * a.sd - a.pd;
        const T* xsrc[XK];
        bool xok[XK];
#pragma unroll
        for (int k = 0; k < XK; ++k) {
            const int i = lane + 32 * k, kd = i / (4 * KS), col = cb + (xch_at[k] - kd * Ring::XKD);
            const int id = od * a.sd - a.pd + kd * a.dd;
            xok[k] = i < Ring::XCH && id >= 0 && id < a.id && col >= 0 && col < a.iw;
            xsrc[k] = xc + id * plane + (long long)ih_first * a.iw + col;
        }
        const T* gsrc[GK];
        bool gok[GK];
#pragma unroll
        for (int k = 0; k < GK; ++k) {
            const int i = lane + 32 * k, ow = ow0 + 4 * i;
            gok[k] = i < Ring::GCH && ow < a.ow;
            gsrc[k] = gyp + (long long)oh0 * a.ow + ow;
        }
        // Copies the rows of slot group gi (rows gi*RPS.., RPS of them) into slot gi mod R.
        auto issue = [&](int gi) {
            const int rr = gi * RPS, oh = oh0 + rr;
            if (oh < oh1) {
                const int ih = oh - a.ph + KH - 1;
                const bool ihok = ih >= 0 && ih < a.ih;
                const int slot = (gi & (R - 1)) * Ring::SLOT;
                if constexpr (CL) {
                    const int st = (gi & (R - 1)) * STG;
#if __CUDA_ARCH__ >= 900
                    // The block's leader: the CLG channels' grad-output rows and their KD
                    // depths of input rows, one box each ([rows][columns][channels]).
                    if (owner == 0) {
                        const unsigned sl = (unsigned)(gi & (R - 1));
                        if constexpr (SPLIT) {
                            // Every group has transposed the slot's last boxes.
                            mbar_wait(bars + 8u * (R + sl), (empties >> sl) & 1u);
                            empties ^= 1u << sl;
                        }
                        const unsigned bar = bars + 8u * sl, dst = stage_s + 2u * st;
                        mbar_expect_tx(bar, (unsigned)(RPS * (Ring::GYBOX + KD * Ring::XROW) * CLG * sizeof(T)));
                        tma_load_5d(dst, &maps.output, (int)c0, ow0, oh, od, (int)n, bar);
                        tma_load_5d(dst + 2u * SG, &maps.input, (int)c0, cb, ih, id0, (int)n, bar);
                    }
#else
                    // Off Hopper the same boxes by 16-byte loads of 8 channels, zeros past
                    // the edges (synchronous: the syncs around each slot order them).
                    constexpr int HG = CLG / 8, GCHK = RPS * Ring::GYBOX * HG;
                    const T* gyn = gy + (n * a.od + od) * (long long)a.oh * a.ow * a.c + c0;
                    const T* xn = x + n * a.id * plane * a.c + c0;
                    for (int i = owner; i < GCHK + KD * RPS * Ring::XROW * HG; i += owners) {
                        const int h = i % HG;
                        uint4 v = make_uint4(0u, 0u, 0u, 0u);
                        int at;
                        if (i < GCHK) {
                            const int col = (i / HG) % Ring::GYBOX, r = i / (HG * Ring::GYBOX);
                            const int oo = oh + r, ow = ow0 + col;
                            if (oo < a.oh && ow < a.ow)
                                v = __ldg(reinterpret_cast<const uint4*>(gyn + ((long long)oo * a.ow + ow) * a.c + 8 * h));
                            at = (r * Ring::GYBOX + col) * CLG + 8 * h;
                        } else {
                            const int j = i - GCHK, col = (j / HG) % Ring::XROW, rr = j / (HG * Ring::XROW);
                            const int id = id0 + rr / RPS, ihh = ih + rr % RPS, iw = cb + col;
                            if (id >= 0 && id < a.id && ihh >= 0 && ihh < a.ih && iw >= 0 && iw < a.iw)
                                v = __ldg(reinterpret_cast<const uint4*>(
                                    xn + ((id * (long long)a.ih + ihh) * a.iw + iw) * a.c + 8 * h));
                            at = SG + (rr * Ring::XROW + col) * CLG + 8 * h;
                        }
                        *reinterpret_cast<uint4*>(staging + st + at) = v;
                    }
#endif
                } else if constexpr (COPY_TMA) {
#if __CUDA_ARCH__ >= 900
                    // The ring's leader: the grad-output rows (GYBOX columns from the tile's
                    // first output; SW depths from the block's first) and the KD (SW + KD -
                    // 1) input rows of each (depths id0.., unit dilation) as two boxes;
                    // zeros past the edges.
                    if (owner == 0) {
                        const unsigned bar = bars + 8u * (unsigned)(gi & (R - 1)), dst = ring_s + 2u * slot;
                        mbar_expect_tx(bar, (unsigned)(RPS * (Ring::GDEP * Ring::GYBOX + Ring::XDEP * Ring::XROW) *
                                                       sizeof(T)));
                        tma_load_4d(dst + 2u * Ring::GY, &maps.output, ow0, oh, od, nc, bar);
                        tma_load_4d(dst + 2u * Ring::XOFF, &maps.input, cb, ih, id0, nc, bar);
                    }
#endif
                } else if constexpr (VEC) {
                    const unsigned dst = ring_s + 2u * slot;
                    // The slot's RPS rows (more than 1 only in a TMA layout built off
                    // Hopper: the same places the boxes would fill, zeros past the edges).
#pragma unroll
                    for (int r = 0; r < RPS; ++r) {
                        // (Row 0's checks are the issue's own: ptxas keeps RPS = 1's code
                        // as it was only with them spelled so.)
                        const bool ihok_r = RPS == 1 ? ihok : ih + r >= 0 && ih + r < a.ih;
                        const bool ohok_r = RPS == 1 || oh + r < a.oh;
                        // Only lanes with a chunk copy: a zero-filled copy past the slot's
                        // rows would land in the next slot.
#pragma unroll
                        for (int k = 0; k < XK; ++k) {
                            // SW: warp w copies its depth w, the last warp the ones past it
                            // too (each block depth once).
                            const bool mine = !SHARED || warp == SW - 1 || lane + 32 * k < 4 * KS;
                            if (lane + 32 * k < Ring::XCH && mine) {
                                const bool ok = xok[k] && ihok_r;
                                // Source-size 0 reads nothing; the address is kept inside x.
                                cp_async8_zfill(dst + 2u * (Ring::XOFF + x_at + r * Ring::XROW + xch_at[k]),
                                                ok ? xsrc[k] : x, ok);
                            }
                            xsrc[k] += a.iw;
                        }
#pragma unroll
                        for (int k = 0; k < GK; ++k) {
                            if (lane + 32 * k < Ring::GCH) {
                                const bool ok = gok[k] && ohok_r;
                                cp_async8_zfill(dst + 2u * (Ring::GY + gy_at + r * Ring::GYROW + 4 * (lane + 32 * k)),
                                                ok ? gsrc[k] : gy, ok);
                            }
                            gsrc[k] += a.ow;
                        }
                    }
                } else {
                    // Element by element, masked: rows of any width and alignment.
                    for (int i = lane; i < Ring::XCH; i += 32) {
                        const int kd = i / (4 * KS), ch = i - kd * (4 * KS), col = cb + 4 * ch;
                        const int id = od * a.sd - a.pd + kd * a.dd;
                        const bool ok = ihok && id >= 0 && id < a.id;
                        unsigned short h[4];
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            h[e] = ok && col + e >= 0 && col + e < a.iw
                                ? __ldg(reinterpret_cast<const unsigned short*>(
                                      xc + id * plane + (long long)ih * a.iw + col + e))
                                : (unsigned short)0;
                        *reinterpret_cast<uint2*>(ring + slot + Ring::XOFF + kd * Ring::XROW + 4 * ch) =
                            make_uint2(pack_pair(h), pack_pair(h + 2));
                    }
                    for (int i = lane; i < Ring::GCH; i += 32) {
                        const int ow = ow0 + 4 * i;
                        unsigned short h[4];
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            h[e] = ow + e < a.ow
                                ? __ldg(reinterpret_cast<const unsigned short*>(
                                      gyp + (long long)oh * a.ow + ow + e))
                                : (unsigned short)0;
                        *reinterpret_cast<uint2*>(ring + slot + Ring::GY + 4 * i) =
                            make_uint2(pack_pair(h), pack_pair(h + 2));
                    }
                }
            }
            if constexpr (!COPY_TMA) cp_async_commit();
        };
        unsigned af[KS][4];
#pragma unroll
        for (int s = 0; s < KS; ++s)
#pragma unroll
            for (int e = 0; e < 4; ++e) af[s][e] = (ONES && e % 2 == 1 && g == 7) ? one : 0u;
        // The previous item's readers of the ring are done before it is refilled (SPLIT:
        // the empty barriers say so for the staging, the groups' barriers for their slots).
        if constexpr (!SPLIT) sync_owners();
#pragma unroll
        for (int gi = 0; gi < R - 1; ++gi) issue(gi);
        // The band's first output row also reads input rows oh0 - ph + 0..KH-2 (slots
        // 0..KH-2): straight from global memory into A (channels-last: element by element).
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            if (!live || !row_live[j] || slot_r[j] >= KH - 1) continue;
            const int id = od * a.sd - a.pd + kd_r[j] * a.dd, ih = oh0 - a.ph + slot_r[j];
            const bool ok = id >= 0 && id < a.id && ih >= 0 && ih < a.ih;
            const T* src = CL ? xc + (id * plane + (long long)ih * a.iw) * es : xc + id * plane + (long long)ih * a.iw;
#pragma unroll
            for (int s = 0; s < KS; ++s) {
                const int col = cb + wgrad_mma_kcol(s, KS, q);
                unsigned short h[4];
                if (VEC && !CL && ok && col >= 0 && col < a.iw) {
                    const uint2 v = __ldg(reinterpret_cast<const uint2*>(src + col));
                    af[s][j] = v.x;
                    af[s][j + 2] = v.y;
                    continue;
                }
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    h[e] = (!VEC || CL) && ok && col + e >= 0 && col + e < a.iw
                        ? __ldg(reinterpret_cast<const unsigned short*>(CL ? src + (col + e) * es : src + col + e))
                        : (unsigned short)0;
                af[s][j] = pack_pair(h);
                af[s][j + 2] = pack_pair(h + 2);
            }
        }

        float acc[KH][NT][4];
#pragma unroll
        for (int p = 0; p < KH; ++p)
#pragma unroll
            for (int t = 0; t < NT; ++t)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[p][t][e] = 0.f;

        // One output row of phase p: its grad-output row at src + GY, its new input rows
        // (one a depth) at xsub, XKD apart.
        auto row = [&](int p, const unsigned short* src, const unsigned short* xsub) {
            if constexpr (!ONES) {
                for (int e = lane; e < TW; e += 32) {
                    T tv;
                    *reinterpret_cast<unsigned short*>(&tv) = src[Ring::GY + e];
                    bacc += to_f32(tv);
                }
            }
            // The new input row of each depth enters slot (p + KH - 1) mod KH.
            const int snew = (p + KH - 1) % KH;
#pragma unroll
            for (int j = 0; j < 2; ++j)
                if (slot_r[j] == snew && row_live[j]) {
                    const unsigned short* xr = xsub + kd_r[j] * Ring::XKD;
#pragma unroll
                    for (int i = 0; i < KS / 2; ++i) {
                        // (A TMA slot's rows are 16-byte aligned; cp.async slots 8-byte.)
                        uint4 v;
                        if constexpr (TMA) {
                            v = *reinterpret_cast<const uint4*>(xr + 32 * i + 8 * q);
                        } else {
                            const uint2 lo = *reinterpret_cast<const uint2*>(xr + 32 * i + 8 * q);
                            const uint2 hi = *reinterpret_cast<const uint2*>(xr + 32 * i + 8 * q + 4);
                            v = make_uint4(lo.x, lo.y, hi.x, hi.y);
                        }
                        af[2 * i][j] = v.x;
                        af[2 * i][j + 2] = v.y;
                        af[2 * i + 1][j] = v.z;
                        af[2 * i + 1][j + 2] = v.w;
                    }
                    if constexpr (KS % 2 == 1) {
                        const uint2 v = *reinterpret_cast<const uint2*>(xr + 32 * (KS / 2) + 4 * q);
                        af[KS - 1][j] = v.x;
                        af[KS - 1][j + 2] = v.y;
                    }
                }
#pragma unroll
            for (int i = 0; i < KS / 2; ++i) {
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    const unsigned* w = reinterpret_cast<const unsigned*>(src + bword[t] + 32 * i);
                    const unsigned w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3], w4 = w[4];
                    unsigned b[2];
                    b[0] = __byte_perm(w0, w1, bsel[t]);
                    b[1] = __byte_perm(w1, w2, bsel[t]);
                    Mma<T>::run(acc[p][t], af[2 * i], b);
                    b[0] = __byte_perm(w2, w3, bsel[t]);
                    b[1] = __byte_perm(w3, w4, bsel[t]);
                    Mma<T>::run(acc[p][t], af[2 * i + 1], b);
                }
            }
            if constexpr (KS % 2 == 1) {
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    const unsigned* w = reinterpret_cast<const unsigned*>(src + bword_last[t] + 32 * (KS / 2));
                    const unsigned w0 = w[0], w1 = w[1], w2 = w[2];
                    unsigned b[2];
                    b[0] = __byte_perm(w0, w1, bsel[t]);
                    b[1] = __byte_perm(w1, w2, bsel[t]);
                    Mma<T>::run(acc[p][t], af[KS - 1], b);
                }
            }
        };
        // Channels-last: staging slot gi's boxes into every warp's slot, 8 columns x 8
        // channels a matrix, four matrices a round, the block's warps taking turns. A lane
        // names row k of matrix lane / 8 twice: column k of the staged block to load
        // (transposed: lane t then holds channel t / 4's columns 2 (t % 4), + 1) and
        // channel k's row of 8 columns to store.
        auto transpose = [&](int gi) {
            if constexpr (CL) {
                constexpr int HG = CLG / 8, GB = Ring::GYBOX / 8, XB = Ring::XROW / 8;
                // SPLIT: only the group's 8 channels (h = group), by its warps.
                constexpr int NB = (SPLIT ? 1 : HG) * (RPS * GB + KD * RPS * XB), ROUNDS = (NB + 3) / 4;
                static_assert(Ring::GYBOX % 8 == 0 && Ring::XROW % 8 == 0, "whole 8-column blocks");
                const unsigned from0 = stage_s + 2u * (unsigned)((gi & (R - 1)) * STG), to0 = smem_s;
                const int k = lane & 7;
                for (int ri = SPLIT ? gwarp : warp; ri < ROUNDS; ri += SPLIT ? GWARPS : warps) {
                    const int b = min(4 * ri + (lane >> 3), NB - 1);
                    const int h = SPLIT ? group : b % HG, bb = SPLIT ? b : b / HG;
                    int from, to;
                    if (bb < RPS * GB) {
                        const int r = bb / GB, w8 = bb - r * GB;
                        from = (r * Ring::GYBOX + 8 * w8 + k) * CLG + 8 * h;
                        to = Ring::GY + r * Ring::GYROW + 8 * w8;
                    } else {
                        const int x8 = bb - RPS * GB, rr = x8 / XB, w8 = x8 - rr * XB;
                        from = SG + (rr * Ring::XROW + 8 * w8 + k) * CLG + 8 * h;
                        to = Ring::XOFF + rr * Ring::XROW + 8 * w8;
                    }
                    to += (8 * h + k) * TSLOT;
                    unsigned f[4];
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                                 : "=r"(f[0]), "=r"(f[1]), "=r"(f[2]), "=r"(f[3])
                                 : "r"(from0 + 2u * from)
                                 : "memory");
#if __CUDA_ARCH__ >= 900
                    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(to0 + 2u * to),
                                 "r"(f[0]), "r"(f[1]), "r"(f[2]), "r"(f[3])
                                 : "memory");
#else
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const int row = __shfl_sync(0xffffffffu, to, 8 * i + (lane >> 2));
                        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(to0 + 2u * row + 4u * (lane & 3)), "r"(f[i])
                                     : "memory");
                    }
#endif
                }
            }
        };
        // Slot group gi's rows are in: slot (gi - 1) mod R was read by the rows before,
        // so it is refilled R - 1 ahead first.
        int gi = 0, sub = 0;
        auto enter_slot = [&]() {
            sync_group();
            issue(gi + R - 1);
            if constexpr (CL) {
#if __CUDA_ARCH__ >= 900
                const unsigned sl = (unsigned)(gi & (R - 1));
                mbar_wait(bars + 8u * sl, (phases >> sl) & 1u);
                phases ^= 1u << sl;
#endif
                transpose(gi);
                sync_group();
                // SPLIT: this group is done with the staging slot.
                if constexpr (SPLIT)
                    if (gwarp == 0 && lane == 0) mbar_arrive(bars + 8u * (R + (unsigned)(gi & (R - 1))));
            } else if constexpr (COPY_TMA) {
                const unsigned sl = (unsigned)(gi & (R - 1));
                mbar_wait(bars + 8u * sl, (phases >> sl) & 1u);
                phases ^= 1u << sl;
            } else {
                cp_async_wait<R - 1>();
                sync_owners();
            }
        };
        for (int ohb = oh0; ohb < oh1; ohb += KH) {
            if (RPS % KH == 0 && ohb + KH <= oh1) {
                // A slot holds whole phase cycles of KH rows: a cycle's rows run without
                // tests or branches between them, so ptxas can overlap one row's MMA
                // chain with the next row's (each phase has its own accumulators).
                if (sub == 0) enter_slot();
                const unsigned short* slot = ring + (CL ? 0 : (gi & (R - 1)) * Ring::SLOT);
                const unsigned short* src = slot + gy_at + sub * Ring::GYROW;
                const unsigned short* xsub = slot + Ring::XOFF + x_at + sub * Ring::XROW;
                if (live) {
#pragma unroll
                    for (int p = 0; p < KH; ++p) row(p, src + p * Ring::GYROW, xsub + p * Ring::XROW);
                }
                sub += KH;
                if (sub == RPS) {
                    sub = 0;
                    ++gi;
                }
                continue;
            }
#pragma unroll
            for (int p = 0; p < KH; ++p) {
                if (ohb + p >= oh1) break;
                if (sub == 0) enter_slot();
                const unsigned short* slot = ring + (CL ? 0 : (gi & (R - 1)) * Ring::SLOT);
                const unsigned short* src = slot + gy_at + sub * Ring::GYROW;
                const unsigned short* xsub = slot + Ring::XOFF + x_at + sub * Ring::XROW;
                if (++sub == RPS) {
                    sub = 0;
                    ++gi;
                }
                if (live) row(p, src, xsub);
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
                        const T* xr = CL ? xc + (id * plane + (long long)ih * a.iw) * es : xc + id * plane + (long long)ih * a.iw;
                        const T* gr = CL ? gyp + (long long)oh * a.ow * es : gyp + (long long)oh * a.ow;
                        for (int ow = ow0; ow < owe; ++ow) {
                            const int iw = ow - a.pw + kw * DW;
                            if (iw >= 0 && iw < a.iw) s = fmaf(to_f32(CL ? gr[ow * es] : gr[ow]), to_f32(CL ? xr[iw * es] : xr[iw]), s);
                        }
                    }
                }
                wacc[tap] += s;
            }
            if constexpr (ONES) {
                for (int oh = oh0; oh < oh1; ++oh)
                    for (int ow = ow0 + lane; ow < owe; ow += 32)
                        bacc += to_f32(CL ? gyp[((long long)oh * a.ow + ow) * es] : gyp[(long long)oh * a.ow + ow]);
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
            // C[15][0]: the ones row against the untapped grad-output column.
            if (ONES && lane == 28) {
#pragma unroll
                for (int p = 0; p < KH; ++p) bacc += acc[p][0][2];
            }
        }
        __syncwarp();
    }

    // grad-bias: a fixed butterfly of the lanes' sums.
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) bacc += __shfl_xor_sync(0xffffffffu, bacc, o);
    if (lane == 0) wacc[TAPS] += bacc;
    __syncthreads();
    pdl_launch_dependents();  // the finalize may launch (it waits for this grid)
    if constexpr (CL) {
        // A warp a channel: its own sums.
        if (c < a.c) {
            float* out = partials + ((long long)split * a.c + c) * (TAPS + 1);
            for (int t = lane; t < TAPS + 1; t += 32) out[t] = wacc[t];
        }
        return;
    }
    // The block's warps in order.
    float* out = partials + ((long long)split * a.c + c) * (TAPS + 1);
    for (int t = threadIdx.x; t < TAPS + 1; t += blockDim.x) {
        float s = 0.f;
        for (int w = 0; w < warps; ++w) s += wacc_all[w * (TAPS + 1) + t];
        out[t] = s;
    }
}

// TMA: the ring is filled by TMA tensor copies (maps: the input, and grad-output as the
// output-shaped tensor; boxes of 16*KS columns x KD depths and TW columns). The host
// picks it only where rows are 16-byte multiples and depth dilation is 1 (the engine
// hands over 16-byte aligned tensors), so only the vectorized body is built.
// RPS: output rows a slot holds (TMA only; more than 1 only where a tile is the whole
// row), so a warp issues its two boxes once per RPS rows.
// SHARE: the block's warps take consecutive output depths of an item from one ring
// (WgradMmaRing's SW; TMA, whole-row slots, unit depth stride and dilation).
// WARPS and MINB: the block's warps and how many blocks an SM must hold (the register cap).
template <typename T, int KD, int KH, int KW, int DW, int KS, int NT, int BK, int R, int TMA, int RPS, int SHARE, int WARPS, int MINB, int EPI>
__global__ void __launch_bounds__(WARPS * 32, MINB) wgrad_mma_dwconv(ConvArgs a, EpiArgs, const __grid_constant__ TmaMaps maps) {
    extern __shared__ __align__(128) unsigned short wgrad_mma_smem[];
    if constexpr (TMA != 0) {
        wgrad_mma_body<T, KD, KH, KW, DW, KS, NT, BK, R, true, true, RPS, SHARE ? WARPS : 0>(a, wgrad_mma_smem, maps);
    } else {
        // 8-byte copies need 4-column chunks that rows never straddle, in both tensors.
        const bool vec = a.iw % 4 == 0 && a.ow % 4 == 0 &&
                         ((reinterpret_cast<unsigned long long>(a.x) |
                           reinterpret_cast<unsigned long long>(a.w)) & 7) == 0;
        if (vec)
            wgrad_mma_body<T, KD, KH, KW, DW, KS, NT, BK, R, true, false, 1, 0>(a, wgrad_mma_smem, maps);
        else
            wgrad_mma_body<T, KD, KH, KW, DW, KS, NT, BK, R, false, false, 1, 0>(a, wgrad_mma_smem, maps);
    }
}
