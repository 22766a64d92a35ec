// scaled_mm_mma: D[M, N] = scale_a * scale_b * (A[M, K] @ B[K, N]) (+ bias[N]), A and B
// float8 e4m3, f32 accumulation, D in TOut. The ladder's lower rung and the GEMM's
// correctness anchor (issue 18): warp-level `mma.sync.m16n8k32.e4m3` (sm_89+), no TMA,
// no wgmma. A is row-major [M, K] (K % 16 == 0, rows 16-byte aligned); B comes
// prepacked (src/gemm/pack.rs): N x K tiles of BN rows of BK bytes, each row's 16-byte
// chunks swizzled by the row (chunk c of row r at c ^ (r % (BK / 16))), tiles n-tile
// major, zero-padded at the edges. A block computes a BM x BN tile of D with WM x WN
// warps; each warp (BM / WM) x (BN / WN) of it as 16 x 8 MMA tiles. K steps of BK bytes
// flow through two shared-memory buffers (cp.async): step s + 1's copies in flight while
// step s is multiplied.
// Scaling (SCALING): 0 per-tensor (scale_a[0] * scale_b[0]), 1 row-wise (scale_a[row] *
// scale_b[col]), 2 block-wise (scale_a[k / 128][row] * scale_b[k / 128][col / 128]: the
// products of each 128-deep K group are summed apart, then scaled into the total; BK
// divides 128). bias is f32 [N] or null.

struct ScaledMmArgs {
    const unsigned char* a;         // [M, K] e4m3
    const unsigned char* b_packed;  // PackedB's bytes for tiles BN x BK
    void* d;                        // [M, N] TOut
    const float* scale_a;
    const float* scale_b;
    const float* bias;              // [N] or null
    int m, n, k;
};

__device__ __forceinline__ void smm_copy16(unsigned dst, const void* src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0));
}

__device__ __forceinline__ void smm_mma(float* c, const unsigned* a, const unsigned* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Byte offset of (row r, byte c) in a swizzled BN x BK tile (PackedB::offset within a
// tile; the Rust test `kernel_b_addressing_is_the_packs` mirrors it).
template <int BK>
__device__ __forceinline__ int smm_b_offset(int r, int c) {
    constexpr int CHUNKS = BK / 16;
    return r * BK + (((c >> 4) ^ (r % CHUNKS)) << 4) + (c & 15);
}

template <typename TOut, int BM, int BN, int BK, int WM, int WN, int SCALING, bool BIAS>
__global__ void __launch_bounds__(WM * WN * 32) scaled_mm_mma(ScaledMmArgs p) {
    constexpr int THREADS = WM * WN * 32;
    constexpr int TM = BM / WM / 16;  // MMA tiles a warp along M
    constexpr int TN = BN / WN / 8;   // and along N
    constexpr int APAD = 16;          // bytes after each A row: fragment reads spread over banks
    constexpr int AROW = BK + APAD;
    constexpr int A_BYTES = BM * AROW, B_BYTES = BN * BK;
    constexpr int GROUP = 128;  // block-wise scaling's K group
    static_assert(BM % (WM * 16) == 0 && BN % (WN * 8) == 0, "whole MMA tiles a warp");
    static_assert(BK == 32 || BK == 64 || BK == 128, "BK is one of the pack's row sizes");
    static_assert(SCALING != 2 || GROUP % BK == 0, "block-wise scaling: BK divides 128");
    extern __shared__ __align__(16) unsigned char smm_smem[];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WN, wn = warp - (warp / WN) * WN;
    const int g = lane >> 2, t = lane & 3;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int k_tiles = (p.k + BK - 1) / BK;
    const unsigned char* btile = p.b_packed + (long long)blockIdx.x * k_tiles * B_BYTES;

    // Issues K step s's copies into buffer s & 1 and commits one group (empty past the end).
    auto fetch = [&](int s) {
        if (s < k_tiles) {
            unsigned char* as = smm_smem + (s & 1) * (A_BYTES + B_BYTES);
            const unsigned abase = (unsigned)__cvta_generic_to_shared(as);
            const unsigned bbase = abase + A_BYTES;
            constexpr int ACH = BM * (BK / 16);
            for (int q = tid; q < ACH; q += THREADS) {
                const int r = q / (BK / 16), ch = q - r * (BK / 16);
                const int row = m0 + r, kk = s * BK + ch * 16;
                const bool ok = row < p.m && kk < p.k;
                smm_copy16(abase + r * AROW + ch * 16, ok ? p.a + (long long)row * p.k + kk : p.a, ok);
            }
            const unsigned char* bsrc = btile + (long long)s * B_BYTES;
            for (int q = tid; q < B_BYTES / 16; q += THREADS) smm_copy16(bbase + q * 16, bsrc + q * 16, true);
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };

    float acc[TM][TN][4];
    float part[TM][TN][4];  // block-wise: the current 128-deep group's sums
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = part[i][j][e] = 0.f;

    // Rows and columns of this thread's accumulators: (i, e) -> row, (j, e) -> column.
    auto row_of = [&](int i, int e) { return m0 + wm * (BM / WM) + i * 16 + g + (e >= 2 ? 8 : 0); };
    auto col_of = [&](int j, int e) { return n0 + wn * (BN / WN) + j * 8 + t * 2 + (e & 1); };

    // Adds the group ending at K step s into the total with its block-wise scales.
    auto promote = [&](int s) {
        const int kg = s * BK / GROUP;
        const int ngroups = (p.n + GROUP - 1) / GROUP;
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int row = row_of(i, e), col = col_of(j, e);
                    const float sa = row < p.m ? p.scale_a[(long long)kg * p.m + row] : 0.f;
                    const float sb = col < p.n ? p.scale_b[(long long)kg * ngroups + col / GROUP] : 0.f;
                    acc[i][j][e] = fmaf(part[i][j][e], sa * sb, acc[i][j][e]);
                    part[i][j][e] = 0.f;
                }
    };

    fetch(0);
    for (int s = 0; s < k_tiles; ++s) {
        fetch(s + 1);
        asm volatile("cp.async.wait_group 1;\n" ::);
        __syncthreads();
        const unsigned char* as = smm_smem + (s & 1) * (A_BYTES + B_BYTES);
        const unsigned char* bs = as + A_BYTES;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 32) {
            unsigned af[TM][4], bf[TN][2];
#pragma unroll
            for (int i = 0; i < TM; ++i) {
                const unsigned char* ar = as + (wm * (BM / WM) + i * 16 + g) * AROW + kk + t * 4;
                af[i][0] = *reinterpret_cast<const unsigned*>(ar);
                af[i][1] = *reinterpret_cast<const unsigned*>(ar + 8 * AROW);
                af[i][2] = *reinterpret_cast<const unsigned*>(ar + 16);
                af[i][3] = *reinterpret_cast<const unsigned*>(ar + 8 * AROW + 16);
            }
#pragma unroll
            for (int j = 0; j < TN; ++j) {
                const int r = wn * (BN / WN) + j * 8 + g;
                bf[j][0] = *reinterpret_cast<const unsigned*>(bs + smm_b_offset<BK>(r, kk + t * 4));
                bf[j][1] = *reinterpret_cast<const unsigned*>(bs + smm_b_offset<BK>(r, kk + 16 + t * 4));
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) smm_mma(SCALING == 2 ? part[i][j] : acc[i][j], af[i], bf[j]);
        }
        if (SCALING == 2 && ((s + 1) * BK % GROUP == 0 || s + 1 == k_tiles)) promote(s);
        __syncthreads();  // buffer s & 1 is refilled by the next step's fetch
    }
    asm volatile("cp.async.wait_group 0;\n" ::);

    TOut* d = static_cast<TOut*>(p.d);
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = row_of(i, e), col = col_of(j, e);
                if (row >= p.m || col >= p.n) continue;
                float v = acc[i][j][e];
                if (SCALING == 0) v *= p.scale_a[0] * p.scale_b[0];
                if (SCALING == 1) v *= p.scale_a[row] * p.scale_b[col];
                if (BIAS) v += p.bias[col];
                d[(long long)row * p.n + col] = from_f32<TOut>(v);
            }
}
