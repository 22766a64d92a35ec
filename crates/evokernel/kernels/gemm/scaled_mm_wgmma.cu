// scaled_mm_wgmma: D[M, N] = scale_a * scale_b * (A[M, K] @ B[K, N]) (+ bias[N]), A and B
// float8 e4m3, f32 accumulation, D in TOut: the Hopper rung of the GEMM ladder (issue 18).
// Warpgroup MMA (`wgmma.mma_async` m64nBNk32 e4m3, both operands from shared memory through
// 128-byte-swizzled descriptors) fed by a producer warpgroup through a ring of STAGES
// buffers guarded by mbarriers:
//   - A [M, K] row-major: one TMA load a stage (`cp.async.bulk.tensor.2d`, box 128 bytes x
//     BM rows, 128-byte swizzle; rows and K past the end read as zeros);
//   - B prepacked (src/gemm/pack.rs, tiles of BN rows of 128 bytes, K-major, chunk c of
//     row r at c ^ (r % 8)): that is TMA's 128-byte swizzle already, so a stage's tile is
//     one 1-D bulk copy (`cp.async.bulk`), no tensor map.
// CONSUMERS warpgroups (BM = 64 x CONSUMERS) each own 64 rows x BN columns of D in
// registers (setmaxnreg moves the producer's registers to them). A stage is one 128-deep K
// step (128 bytes of e4m3), which is also block-wise scaling's group: under SCALING 2 each
// stage's products go to `part` (wgmma's scale-d = 0 starts it) and are scaled into `acc`.
// Clusters (CLUSTER 2): the two blocks of a cluster take vertically adjacent tiles (same
// B tile) and each loads half of the B stage, multicast into both blocks' rings: B's
// L2-to-SM traffic halves. Each block's empty barriers then count the releases of both
// blocks' consumer warps, and a producer waits for its ring's last releases before its
// block exits (the peer still arrives on its barriers until then).
// Block order (GROUP_M): tiles run in panels of GROUP_M tile rows so the B tiles a wave
// reads stay in L2. A block loops over tiles blockIdx.x + i * gridDim.x: one tile with a
// block a tile, persistent with a block a SM (the ring runs on across tiles, so the
// producer loads the next tile while the consumers write this one). Split-K (SPLIT):
// blockIdx.z takes a run of K steps and writes its scaled f32 sums to `partial[z]`; `scaled_mm_splitk_finalize` adds the splits in order
// (deterministic), adds the bias and converts.
// Scaling: 0 per-tensor, 1 row-wise (scale_a[row] * scale_b[col]), 2 block-wise
// (scale_a[k / 128][row] * scale_b[k / 128][col / 128]: A's scales M-fastest, so a warp's
// rows read them in one coalesced load). bias is f32 [N] or null. The mbarrier and TmaMap
// pieces are common.cuh's.

struct ScaledMmWgmmaArgs {
    TmaMap a_map;                   // A [M, K] e4m3: box 128 B x BM rows, 128-byte swizzle
    const unsigned char* b_packed;  // PackedB's bytes for tiles BN x 128
    void* d;                        // [M, N] TOut
    const float* scale_a;
    const float* scale_b;
    const float* bias;              // [N] or null
    float* partial;                 // split-K: [splits, M, N] f32; else null
    int m, n, k;
    int steps_per_split;            // K steps (128 bytes each) a split takes
    int splits;                     // splits that have K steps (gridDim.z)
};

extern __shared__ unsigned char smm_raw[];  // the kernel's dynamic shared memory

// smm_raw's address in the shared window, read from the symbol.
__device__ __forceinline__ unsigned smm_raw_addr() {
    unsigned a;
    asm("mov.u32 %0, smm_raw;\n" : "=r"(a));
    return a;
}

// Arrives on the barrier at the same shared address in block `rank` of the cluster. The
// default (.release.cta) semantics, as CUTLASS's ClusterBarrier.
__device__ __forceinline__ void smm_bar_arrive_in(unsigned bar, unsigned rank) {
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(bar), "r"(rank));
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}

__device__ __forceinline__ unsigned smm_cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}

// Every thread of every block of the cluster (barrier inits visible to the peer).
__device__ __forceinline__ void smm_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void smm_tma_2d(unsigned dst, const TmaMap* map, int x, int y, unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(x), "r"(y), "r"(bar)
        : "memory");
}

__device__ __forceinline__ void smm_bulk_copy(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

// The same bytes into the same shared offset of every block in `mask`, each block's
// barrier at `bar`'s offset told of them.
__device__ __forceinline__ void smm_bulk_copy_multicast(unsigned dst, const void* src, unsigned bytes, unsigned bar,
                                                        unsigned short mask) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], %4;\n" ::"r"(dst),
        "l"(src), "r"(bytes), "r"(bar), "h"(mask)
        : "memory");
}

// A stage's place in the ring (stage g: slot g % STAGES, round parity (g / STAGES) & 1),
// followed a step at a time: no division by the ring's size in the consumers' mainloop.
struct SmmRingPos {
    int slot;
    unsigned parity;
};
template <int STAGES>
__device__ __forceinline__ SmmRingPos smm_ring_next(SmmRingPos r) {
    return r.slot + 1 == STAGES ? SmmRingPos{0, r.parity ^ 1u} : SmmRingPos{r.slot + 1, r.parity};
}

// A consumer warpgroup's own barrier (named barrier `id`, its 128 threads).
__device__ __forceinline__ void smm_bar_sync_warpgroup(int id) {
    asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory");
}

// The type the epilogue writes: TOut, or the f32 partials of split-K.
template <typename TOut, bool SPLIT> struct SmmStore { using type = TOut; };
template <typename TOut> struct SmmStore<TOut, true> { using type = float; };

// Two adjacent values of a row, converted, as one 4- or 8-byte shared store.
__device__ __forceinline__ void smm_store_pair(float* p, const float* v) {
    *reinterpret_cast<float2*>(p) = make_float2(v[0], v[1]);
}
__device__ __forceinline__ void smm_store_pair(__nv_bfloat16* p, const float* v) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v[0], v[1]);
}
__device__ __forceinline__ void smm_store_pair(__half* p, const float* v) {
    *reinterpret_cast<__half2*>(p) = __floats2half2_rn(v[0], v[1]);
}

// A K-major, 128-byte-swizzled operand in shared memory: rows of 128 bytes, 8-row groups
// 1024 bytes apart (the stride byte offset), the leading offset unused under swizzling.
__device__ __forceinline__ unsigned long long smm_desc(unsigned addr) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) |
           (1ull << 62);
}

__device__ __forceinline__ void smm_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void smm_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void smm_wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Tells the compiler a register the async MMA writes is read or written here (so it does
// not move the access across the wgmma's wait).
__device__ __forceinline__ void smm_fence_reg(float& r) { asm volatile("" : "+f"(r)::"memory"); }

__device__ __forceinline__ void smm_wgmma_n64(float* d, unsigned long long da, unsigned long long db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(scale_d));
}

__device__ __forceinline__ void smm_wgmma_n128(float* d, unsigned long long da, unsigned long long db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(scale_d));
}

__device__ __forceinline__ void smm_wgmma_n192(float* d, unsigned long long da, unsigned long long db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95}, %96, %97, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
        : "l"(da), "l"(db), "r"(scale_d));
}

__device__ __forceinline__ void smm_wgmma_n256(float* d, unsigned long long da, unsigned long long db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, %128, %129, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(da), "l"(db), "r"(scale_d));
}

template <int BN>
__device__ __forceinline__ void smm_wgmma(float* d, unsigned long long da, unsigned long long db, int scale_d) {
    if constexpr (BN == 64) smm_wgmma_n64(d, da, db, scale_d);
    else if constexpr (BN == 128) smm_wgmma_n128(d, da, db, scale_d);
    else if constexpr (BN == 192) smm_wgmma_n192(d, da, db, scale_d);
    else smm_wgmma_n256(d, da, db, scale_d);
}

template <typename TOut, int BN, int CONSUMERS, int STAGES, int GROUP_M, int SCALING, bool BIAS, bool SPLIT, int CLUSTER, int FOLD>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__((CONSUMERS + 1) * 128, 1)
    scaled_mm_wgmma(const __grid_constant__ ScaledMmWgmmaArgs p) {
    constexpr int BM = 64 * CONSUMERS;
    constexpr int BK = 128;  // bytes of K a stage: the swizzle span and the block-wise group
    constexpr int A_BYTES = BM * BK, B_BYTES = BN * BK, STAGE_BYTES = A_BYTES + B_BYTES;
    constexpr int B_SHARE = B_BYTES / CLUSTER;  // the part of a B stage this block loads
    constexpr int RELEASES = CLUSTER * CONSUMERS * 4;  // consumer warps releasing a stage
    // The epilogue's staging: a consumer warpgroup's 64 rows x 128 bytes of columns, rows
    // padded by 16 bytes so a warp's eight fragment rows fall in distinct banks.
    using TStore = typename SmmStore<TOut, SPLIT>::type;  // split-K writes f32 partials
    constexpr int EPI_COLS = 128 / sizeof(TStore), EPI_PITCH = 128 + 16, EPI_BYTES = 64 * EPI_PITCH;
    static_assert(BN % EPI_COLS == 0, "whole staging chunks a tile");
    constexpr int ACC = BN / 2;  // f32 accumulators a thread: 64 rows x BN over 128 threads
    static_assert(BN == 64 || BN == 128 || BN == 192 || BN == 256, "wgmma N of 64, 128, 192 or 256");
    static_assert(CONSUMERS >= 1 && CONSUMERS <= 3, "one to three consumer warpgroups");
    // setmaxnreg: the producer's registers go to the consumers. Four warpgroups share 64K
    // registers: 24 + 3 x 160 (a 64 x 128 total and one partial set fit; 64 x 256 does not).
    constexpr int PRODUCER_REGS = CONSUMERS == 3 ? 24 : 40, CONSUMER_REGS = CONSUMERS == 3 ? 160 : 232;
    static_assert(CONSUMERS < 3 || (BN <= 128 && FOLD == 1), "three consumers: 160 registers hold BN <= 128, one partial set");
    static_assert(STAGES >= 2, "a ring of at least two stages");
    static_assert(CLUSTER == 1 || CLUSTER == 2, "clusters of one or two blocks");
    static_assert(SCALING != 2 || BN <= 192, "block-wise scaling: a total and a partial set of BN <= 192 in 232 registers");
    static_assert(FOLD == 1 || (SCALING == 2 && FOLD == 2 && BN <= 128), "two partial sets: block-wise, BN <= 128 (registers)");
    // The swizzle pattern repeats every 1024 bytes: stages start on 1024-byte boundaries.
    // `smem_at` is the ring's shared-window address, from the symbol (a constant to ptxas:
    // converting the generic pointer costs a read of the cluster rank and arithmetic that
    // ptxas recomputes inside the mainloop).
    const unsigned raw_at = smm_raw_addr(), pad = (1024 - (raw_at & 1023)) & 1023;
    unsigned char* smem = smm_raw + pad;
    const unsigned smem_at = raw_at + pad;
    const unsigned full0 = smem_at + STAGES * STAGE_BYTES + CONSUMERS * EPI_BYTES, empty0 = full0 + STAGES * 8;

    // A cluster's tile: CLUSTER vertically adjacent tiles, this block's the rank-th.
    const int rank = CLUSTER > 1 ? (int)smm_cluster_rank() : 0;
    const int tiles_m = (p.m + BM * CLUSTER - 1) / (BM * CLUSTER), tiles_n = (p.n + BN - 1) / BN,
              tiles = tiles_m * tiles_n;
    // Tile `id` in panels of GROUP_M tile rows, N tiles inside a panel: (m0, n_tile).
    auto tile_at = [&](int id, int& m0, int& n_tile) {
        const int per_panel = GROUP_M * tiles_n;
        const int first_m = (id / per_panel) * GROUP_M;
        const int panel_rows = min(tiles_m - first_m, GROUP_M);
        m0 = (first_m + (id % per_panel) % panel_rows) * BM * CLUSTER + rank * BM;
        n_tile = (id % per_panel) / panel_rows;
    };

    const int k_steps = (p.k + BK - 1) / BK;
    const int s_begin = SPLIT ? blockIdx.z * p.steps_per_split : 0;
    const int s_end = SPLIT ? min(k_steps, s_begin + p.steps_per_split) : k_steps;
    const int steps = s_end - s_begin;

    const int tid = threadIdx.x;
    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full0 + 8 * s, 1);
            mbar_init(empty0 + 8 * s, RELEASES);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    if constexpr (CLUSTER > 1) smm_cluster_sync();
    else __syncthreads();

    // A block takes tiles blockIdx.x, + gridDim.x, ... (one tile when the grid has one
    // block a tile; persistent when it has one a SM: the producer then fills the next
    // tile's stages while the consumers write this one's). The producer's `g` counts stages
    // through the ring across tiles; the consumers follow the same sequence as a `pos`.
    if (tid < 128) {
        // Producer warpgroup: gives its registers to the consumers; one thread issues
        // every copy.
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS) : "memory");
        if (tid == 0) {
            int g = 0;
            for (int tile = blockIdx.x / CLUSTER; tile < tiles; tile += gridDim.x / CLUSTER) {
                int m0, n_tile;
                tile_at(tile, m0, n_tile);
                const unsigned char* bsrc = p.b_packed + ((long long)n_tile * k_steps + s_begin) * B_BYTES + rank * B_SHARE;
                for (int it = 0; it < steps; ++it, ++g) {
                    const int st = g % STAGES, round = g / STAGES;
                    if (round > 0) mbar_wait(empty0 + 8 * st, (round - 1) & 1);
                    const unsigned a_dst = smem_at + st * STAGE_BYTES;
                    mbar_expect_tx(full0 + 8 * st, STAGE_BYTES);
                    smm_tma_2d(a_dst, &p.a_map, (s_begin + it) * BK, m0, full0 + 8 * st);
                    if constexpr (CLUSTER > 1)
                        smm_bulk_copy_multicast(a_dst + A_BYTES + rank * B_SHARE, bsrc + (long long)it * B_BYTES, B_SHARE,
                                                full0 + 8 * st, (unsigned short)((1 << CLUSTER) - 1));
                    else
                        smm_bulk_copy(a_dst + A_BYTES, bsrc + (long long)it * B_BYTES, B_BYTES, full0 + 8 * st);
                }
            }
            // The peer block arrives on this block's barriers until its consumers are done:
            // wait for every stage's last release before the block may exit.
            if constexpr (CLUSTER > 1)
                for (int i = 0; i < STAGES; ++i, ++g)
                    if (g >= STAGES) mbar_wait(empty0 + 8 * (g % STAGES), (g / STAGES - 1) & 1);
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS) : "memory");

    // Consumer warpgroup c: rows m0 + 64c .. + 63 of each tile.
    // The warpgroup index broadcast from lane 0 (as CUTLASS's canonical_warp_group_idx):
    // the compiler then knows it is warp-uniform, and the descriptors built from it stay in
    // uniform registers instead of being moved there (R2UR) before every wgmma.
    const int c = __shfl_sync(0xffffffffu, tid / 128, 0) - 1, t = tid % 128, warp = t / 32, lane = t % 32;
    float acc[ACC];
    // A consumer warp hands stage st back to the producers of every block of the cluster.
    auto release = [&](int st) {
        if (lane == 0) {
            if constexpr (CLUSTER > 1)
                for (int r = 0; r < CLUSTER; ++r) smm_bar_arrive_in(empty0 + 8 * st, r);
            else
                mbar_arrive(empty0 + 8 * st);
        }
    };

    // Stage 0's descriptors, built once: a stage's are these plus its offset in the
    // descriptor's 16-byte units (the ring stays far inside the 18-bit address field).
    const unsigned long long da0 = smm_desc(smem_at + c * 64 * BK), db0 = smm_desc(smem_at + A_BYTES);
    // Waits for the ring stage at `at`, issues its four k32 MMAs into `d` (scale-d 0 on the
    // first when `fresh`) and commits them as one group.
    auto issue = [&](SmmRingPos at, float* d, bool fresh) {
        mbar_wait(full0 + 8 * at.slot, at.parity);
        const unsigned long long da = da0 + at.slot * (STAGE_BYTES >> 4), db = db0 + at.slot * (STAGE_BYTES >> 4);
        smm_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 32; ++kk)
            // +32 bytes of K a step: +2 in the descriptor's 16-byte address units.
            smm_wgmma<BN>(d, da + 2 * kk, db + 2 * kk, fresh && kk == 0 ? 0 : 1);
        smm_wgmma_commit();
    };

    SmmRingPos pos{0, 0};  // the next stage to consume, across tiles
    for (int tile = blockIdx.x / CLUSTER; tile < tiles; tile += gridDim.x / CLUSTER) {
        int m0, n_tile;
        tile_at(tile, m0, n_tile);
        const int n0 = n_tile * BN;
        // This thread's rows (two) and the column of its first value in each 8-column block.
        const int row0 = m0 + 64 * c + warp * 16 + lane / 4, row1 = row0 + 8;
        const int col_base = n0 + (lane % 4) * 2;

        if constexpr (SCALING == 2) {
            // Block-wise: each stage's products land in a partial set (wgmma's scale-d 0
            // starts it), then are scaled into acc. FOLD 1: one set, waited for, folded
            // (the other consumer warpgroup's MMAs run meanwhile). FOLD 2: two sets, stage
            // it + 1's MMAs run while stage it's set is folded (wait_group 1). Only the
            // landed set's registers may be touched between the issue and the wait, else
            // ptxas serializes every wgmma (C7514, run 120). A stage's scales are loaded
            // right after its MMAs are issued (FOLD 1: a stage ahead), so their latency
            // hides behind MMAs.
            float part0[ACC], part1[FOLD == 2 ? ACC : 1];
#pragma unroll
            for (int i = 0; i < ACC; ++i) acc[i] = 0.f;
            // A stage's scales: A's of this thread's two rows, then B's of each 64-column
            // piece of the tile (one piece up to BN = 128, whose tiles sit inside one
            // 128-column B block; three at BN = 192, whose tiles straddle two).
            constexpr int PIECES = BN > 128 ? BN / 64 : 1, NS = 2 + PIECES;
            // A pointer a row of A and one a B piece, each a K step further after every
            // stage's load (no index arithmetic in the mainloop); after the split's last
            // stage they stay, so the look-ahead past it rereads that stage. A row past M
            // or a piece past N reads the last one's scale: its products are never stored.
            const int ngroups = (p.n + 127) / 128;
            const float* pa0 = p.scale_a + (long long)s_begin * p.m + min(row0, p.m - 1);
            const float* pa1 = p.scale_a + (long long)s_begin * p.m + min(row1, p.m - 1);
            const float* pb[PIECES];
#pragma unroll
            for (int q = 0; q < PIECES; ++q)
                pb[q] = p.scale_b + (long long)s_begin * ngroups + min((n0 + 64 * q) / 128, ngroups - 1);
            int unloaded = steps;  // stages of this split whose scales are not loaded yet
            // The next stage's scales into s (called once a stage, in order).
            auto scales = [&](float* s) {
                s[0] = *pa0;
                s[1] = *pa1;
#pragma unroll
                for (int q = 0; q < PIECES; ++q) s[2 + q] = *pb[q];
                if (--unloaded > 0) {
                    pa0 += p.m;
                    pa1 += p.m;
#pragma unroll
                    for (int q = 0; q < PIECES; ++q) pb[q] += ngroups;
                }
            };
            auto landed = [&](float* set, SmmRingPos at, const float* s) {
#pragma unroll
                for (int i = 0; i < ACC; ++i) smm_fence_reg(set[i]);
                release(at.slot);
                float s0[PIECES], s1[PIECES];
#pragma unroll
                for (int q = 0; q < PIECES; ++q) s0[q] = s[0] * s[2 + q], s1[q] = s[1] * s[2 + q];
#pragma unroll
                for (int j = 0; j < BN / 8; ++j) {
                    const int q = j / (BN / 8 / PIECES);
                    acc[4 * j + 0] = fmaf(set[4 * j + 0], s0[q], acc[4 * j + 0]);
                    acc[4 * j + 1] = fmaf(set[4 * j + 1], s0[q], acc[4 * j + 1]);
                    acc[4 * j + 2] = fmaf(set[4 * j + 2], s1[q], acc[4 * j + 2]);
                    acc[4 * j + 3] = fmaf(set[4 * j + 3], s1[q], acc[4 * j + 3]);
                }
            };
            if constexpr (FOLD == 1) {
                float now[NS], next[NS];
                scales(now);
                for (int it = 0; it < steps; ++it, pos = smm_ring_next<STAGES>(pos)) {
                    issue(pos, part0, true);
                    scales(next);
                    smm_wgmma_wait<0>();
                    landed(part0, pos, now);
#pragma unroll
                    for (int q = 0; q < NS; ++q) now[q] = next[q];
                }
            } else {
                // Rounds of two stages while a third follows (no branch between an issue
                // and its wait: ptxas's check is not path-sensitive), then the last one or two.
                float sa[NS], sb[NS];
                issue(pos, part0, true);
                scales(sa);
                int it = 0;
                for (; it + 2 < steps; it += 2) {
                    const SmmRingPos p1 = smm_ring_next<STAGES>(pos), p2 = smm_ring_next<STAGES>(p1);
                    issue(p1, part1, true);
                    scales(sb);
                    smm_wgmma_wait<1>();
                    landed(part0, pos, sa);
                    issue(p2, part0, true);
                    scales(sa);
                    smm_wgmma_wait<1>();
                    landed(part1, p1, sb);
                    pos = p2;
                }
                if (it + 1 < steps) {
                    const SmmRingPos p1 = smm_ring_next<STAGES>(pos);
                    issue(p1, part1, true);
                    scales(sb);
                    smm_wgmma_wait<1>();
                    landed(part0, pos, sa);
                    smm_wgmma_wait<0>();
                    landed(part1, p1, sb);
                    pos = smm_ring_next<STAGES>(p1);
                } else {
                    smm_wgmma_wait<0>();
                    landed(part0, pos, sa);
                    pos = smm_ring_next<STAGES>(pos);
                }
            }
        } else {
            int prev = 0;  // the slot of the stage issued before
            for (int it = 0; it < steps; ++it, pos = smm_ring_next<STAGES>(pos)) {
                issue(pos, acc, it == 0);
                // The previous stage's MMAs have landed once at most this one is in flight.
                smm_wgmma_wait<1>();
                if (it > 0) release(prev);
                prev = pos.slot;
            }
            smm_wgmma_wait<0>();
            // The tile's last stage goes back to the producer (the next tile reuses it).
            release(prev);
        }
#pragma unroll
        for (int i = 0; i < ACC; ++i) smm_fence_reg(acc[i]);

        // Epilogue through shared memory (run 127: direct 2- and 4-byte stores from the
        // fragments, eight rows a warp instruction, took 25% of the 8192^3 GEMM). Per chunk
        // of 128 bytes of columns: the fragments, scaled (and biased), go to this warpgroup's
        // staging rows; then 16-byte row pieces go out, eight threads a 128-byte row.
        // Value 4j + 2h + e of a thread is (row h, column 8j + 2 (lane % 4) + e).
        const float st_scale = SCALING == 0 ? p.scale_a[0] * p.scale_b[0] : 1.f;
        float sa[2] = {1.f, 1.f};
        if (SCALING == 1) {
            sa[0] = row0 < p.m ? p.scale_a[row0] : 0.f;
            sa[1] = row1 < p.m ? p.scale_a[row1] : 0.f;
        }
        unsigned char* staged = smem + STAGES * STAGE_BYTES + c * EPI_BYTES;
        TStore* out = SPLIT ? reinterpret_cast<TStore*>(p.partial + (long long)blockIdx.z * p.m * p.n)
                            : reinterpret_cast<TStore*>(p.d);
        const bool whole_pieces = (p.n * (int)sizeof(TStore)) % 16 == 0;  // rows start 16-byte aligned
#pragma unroll
        for (int q = 0; q < BN / EPI_COLS; ++q) {
#pragma unroll
            for (int jj = 0; jj < EPI_COLS / 8; ++jj) {
                const int j = q * (EPI_COLS / 8) + jj;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float v[2];
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int col = min(col_base + 8 * j + e, p.n - 1);  // past N: staged, never written
                        v[e] = acc[4 * j + 2 * h + e] * st_scale;
                        if (SCALING == 1) v[e] *= sa[h] * p.scale_b[col];
                        if (BIAS && !SPLIT) v[e] += p.bias[col];
                    }
                    const int r = warp * 16 + lane / 4 + 8 * h, cl = 8 * jj + (lane % 4) * 2;
                    smm_store_pair(reinterpret_cast<TStore*>(staged + r * EPI_PITCH) + cl, v);
                }
            }
            smm_bar_sync_warpgroup(1 + c);
            constexpr int PIECES = 128 / 16, VEC = 16 / sizeof(TStore);
#pragma unroll
            for (int i = 0; i < 64 * PIECES / 128; ++i) {
                const int piece = t + 128 * i, r = piece / PIECES, x = piece % PIECES;
                const int row = m0 + 64 * c + r, col = n0 + q * EPI_COLS + x * VEC;
                if (row >= p.m || col >= p.n) continue;
                const unsigned char* src = staged + r * EPI_PITCH + x * 16;
                TStore* dst = out + (long long)row * p.n + col;
                if (whole_pieces && col + VEC <= p.n) {
                    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
                } else {
                    for (int e = 0; e < VEC && col + e < p.n; ++e) dst[e] = reinterpret_cast<const TStore*>(src)[e];
                }
            }
            smm_bar_sync_warpgroup(1 + c);  // the staging rows are rewritten by the next chunk
        }
    }
}

// Split-K's second half: D = sum over splits (in split order: the same bits every run)
// plus the bias, converted. One thread an element.
template <typename TOut, bool BIAS>
__global__ void scaled_mm_splitk_finalize(const __grid_constant__ ScaledMmWgmmaArgs p) {
    const long long total = (long long)p.m * p.n;
    TOut* d = static_cast<TOut*>(p.d);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        float v = 0.f;
        for (int z = 0; z < p.splits; ++z) v += p.partial[z * total + i];
        if (BIAS) v += p.bias[i % p.n];
        d[i] = from_f32<TOut>(v);
    }
}
