// depth_reuse_cl: depth_reuse.cu's rotation on channels-last (NDHWC) data, in place.
// A block owns (n, one band of 16 output rows, a chunk of output depths, 8 channels = one
// 16-byte vector per pixel, a region of COLS 8-wide tiles); one warp per (channel, tile)
// keeps KD rotating accumulators, so each input slice is read, transposed and loaded as
// A fragments once for all KD output depths it reaches (streaming_cl reads it KD times).
// Slices arrive pixel-major by 16-byte cp.async into a staging ring, STAGES slices ahead
// (each thread's pixel sources worked out once), and step s transposes slice s + 1 from
// its staging slot into the other of two channel-major buffers ([channel][row][column], as
// streaming_cl) while other warps run slice s's MMAs: one barrier a step. (Loading slice
// s + 1 into registers during step s left 23% of stall samples on the loads and a third
// of the instructions on their addresses: docs/perf.md, run 302.) A finished depth is
// staged channel-major (two stages) and leaves after the next step's barrier as 16-byte
// pixel vectors. Every fill writes every cell (zeros outside).
// TRANS = 1 (sm_90): a warp transposes four 8-pixel groups at once, ldmatrix.trans from
// the staging slot (a group's 8 pixel vectors are one 8x8 matrix, rows 16 bytes) and
// stmatrix of the transposed fragments into the 8 channel planes: 2 instructions for what
// took each of 32 lanes 2 LDS.128, 8 PRMT and 8 STS.32, and 16 shared-memory wavefronts
// where those took ~24 (the STS.32 rows 48 bytes apart met in pairs). A channel plane is
// then an odd number of 16-byte chunks, so the 8 rows a stmatrix writes (one a channel)
// fall in distinct bank groups.
// Stride 1, dilation 1, KW <= 9, C a multiple of 8; T is bf16 or f16.
// A block's share in both forms: CG channels from c0 (8, or 16 in the producer form; the
// channel group varies fastest: neighbours share 32-byte sectors in L2), a region of COLS
// tile columns from col0, output depths [d0, d1) of balanced chunks, 16 output rows from
// h0, image n. Tiles start at column 8j - S (P = pw rounded up to 8 is input column 0's
// tile column, S = P - pw), nt of them a row.
template <int COLS, int DCHUNK, int CG = 8>
struct ClBlock {
    int P, S, nt, col0, d0, d1, h0;
    long long n, c0;
    __device__ __forceinline__ explicit ClBlock(const ConvArgs& a) {
        P = (a.pw + 7) & ~7;
        S = P - a.pw;
        const int mt = (a.oh + 15) / 16;
        nt = (a.ow + S + 7) / 8;
        const int col_regions = (nt + COLS - 1) / COLS;
        const int groups = (int)(a.c / CG);
        const int chunks = (a.od + DCHUNK - 1) / DCHUNK;
        const int per_chunk = (a.od + chunks - 1) / chunks;  // balanced chunks
        long long b = blockIdx.x;
        const int g = (int)(b % groups);
        b /= groups;
        col0 = (int)(b % col_regions) * COLS;
        b /= col_regions;
        d0 = (int)(b % chunks) * per_chunk;
        b /= chunks;
        h0 = (int)(b % mt) * 16;
        n = b / mt;
        d1 = min(d0 + per_chunk, a.od);
        c0 = (long long)g * CG;
    }
};

// Pixel pair e, e + 1 (e even; columns of one slice row of PIX pixels) of a pixel-major
// staging slot of H 16-byte vectors a pixel, vector h, into the 8 channel planes from
// plane 8h, PLANE elements apart, rows WS apart: one lane's share of a slice's transpose.
template <typename T, int PIX, int WS, int PLANE, int H = 1>
__device__ __forceinline__ void transpose_pixel_pair(const uint4* slot, int e, T* buf, int h = 0) {
    const int r = e / PIX, col = e - r * PIX;
    const uint4 v0 = slot[e * H + h], v1 = slot[(e + 1) * H + h];
    buf += h * 8 * PLANE;
    const T* e0 = reinterpret_cast<const T*>(&v0);
    const T* e1 = reinterpret_cast<const T*>(&v1);
#pragma unroll
    for (int q = 0; q < 8; ++q) *reinterpret_cast<unsigned*>(buf + q * PLANE + r * WS + col) = pack2(e0[q], e1[q]);
}

// A warp's part of a slice's transpose by ldmatrix.trans + stmatrix (sm_90), its shared
// offsets worked out once. Round it takes 8-pixel groups 4 (first + it * step) .. + 3
// (pixels 8q .. 8q + 7, one slice row: PIX is a multiple of 8); lane l names row l mod 8
// of matrix l / 8 for both instructions: pixel 8q + (l mod 8) to read, channel l mod 8's
// 8 columns of the group to write. A round past the last group repeats it (the same
// values to the same cells). With H 16-byte vectors a pixel (16 channels: H = 2), group g
// is vector g mod H of pixels 8q .. 8q + 7, q = g / H, into channel planes 8h ..
// SW32: the slot holds the TMA's 32-byte swizzle (CU_TENSOR_MAP_SWIZZLE_32B: a 32-byte
// pixel's 16-byte halves swapped where shared address bit 7 is set). Unswizzled, the 8
// rows of one matrix (pixels 32 bytes apart) met in pairs on the same banks; swizzled,
// pixels 8q + 4 .. 8q + 7 read the other half's banks. `base`: the slots' shared base
// (128-byte aligned; slots a multiple of 256 bytes, so bit 7 of base + offset is slot +
// offset's).
template <typename T, int GROUPS, int PIX, int WS, int PLANE, int ROUNDS, int H = 1, bool SW32 = false>
struct GroupTranspose {
    unsigned from[ROUNDS], to[ROUNDS];
    int live;  // rounds with a group of their own (warp-uniform)
    __device__ __forceinline__ GroupTranspose(int first, int step, int lane, unsigned base = 0) {
        static_assert(!SW32 || H == 2, "the 32-byte swizzle spans one pixel of 16 channels");
        const int k = lane & 7;
        live = 0;
#pragma unroll
        for (int it = 0; it < ROUNDS; ++it) {
            if (4 * (first + it * step) < GROUPS) live = it + 1;
            const int g = min(4 * (first + it * step) + (lane >> 3), GROUPS - 1);
            const int q = g / H, h = g - q * H;
            const int r = (8 * q) / PIX, col = 8 * q - r * PIX;
            from[it] = (unsigned)(((8 * q + k) * H + h) * 16);
            if (SW32) from[it] ^= ((base + from[it]) >> 3) & 16u;
            to[it] = (unsigned)(((8 * h + k) * PLANE + r * WS + col) * (int)sizeof(T));
        }
    }
    // Staging slot at shared address `slot` into the channel planes at `buf`, BATCH
    // rounds' loads issued before their stores: one load -> store chain a round left the
    // producer warp waiting on each load (short scoreboard, H100 run 324) while the tile
    // warps waited on it (ring_full).
    static constexpr int BATCH = ROUNDS < 8 ? ROUNDS : 8;
    __device__ __forceinline__ void run(unsigned slot, unsigned buf) const {
#if __CUDA_ARCH__ >= 900
#pragma unroll
        for (int b0 = 0; b0 < ROUNDS; b0 += BATCH) {
            if (b0 >= live) break;
            unsigned f[BATCH][4];
#pragma unroll
            for (int i = 0; i < BATCH; ++i) {
                const int it = b0 + i;
                if (it >= ROUNDS || it >= live) break;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                             : "=r"(f[i][0]), "=r"(f[i][1]), "=r"(f[i][2]), "=r"(f[i][3])
                             : "r"(slot + from[it])
                             : "memory");
            }
#pragma unroll
            for (int i = 0; i < BATCH; ++i) {
                const int it = b0 + i;
                if (it >= ROUNDS || it >= live) break;
                asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(buf + to[it]),
                             "r"(f[i][0]), "r"(f[i][1]), "r"(f[i][2]), "r"(f[i][3])
                             : "memory");
            }
        }
#endif
    }
};

// Elements of an output stage's row (host: depth_reuse_cl::stage_row): a warp stores 8
// rows x 4 words of its tile, so rows must land on distinct 4-bank groups (8 elements for
// one column; 8 more otherwise). ncu measured 24% of shared wavefronts as conflicts with
// COLS * 8 + 2 (docs/perf.md, run 42).
__host__ __device__ constexpr int cl_stage_row(int cols) { return cols == 1 ? 8 : cols * 8 + 8; }

// A finished depth's accumulator fragment (tile tj of channel ch) into its stage
// ([channel][16 rows][SW]) as element pairs, for the storers to move out.
template <typename T, int COLS>
__device__ __forceinline__ void stage_fragment_cl(T* stage, int ch, int tj, int lane, const float* done) {
    constexpr int SW = cl_stage_row(COLS), SP = 16 * SW;
    T* st = stage + ch * SP + (lane >> 2) * SW + tj * 8 + 2 * (lane & 3);
    *reinterpret_cast<unsigned*>(st) = pack2(from_f32<T>(done[0]), from_f32<T>(done[1]));
    *reinterpret_cast<unsigned*>(st + 8 * SW) = pack2(from_f32<T>(done[2]), from_f32<T>(done[3]));
}

// A depth staged channel-major at `stage` ([8 H channels][16 rows][SW]) leaves as 16-byte
// pixel vectors of channels c0.., two neighbouring columns a thread, threads `first`,
// `first + stride`, .. (stage column sc = output column + S - 8 * col0). With H = 2
// (16 channels) neighbouring threads take a pixel pair's two halves, so one store
// instruction writes whole 32-byte sectors. Both forms below.
template <typename T, int COLS, int H = 1>
__device__ __forceinline__ void store_stage_cl(const ConvArgs& a, const T* stage, long long n, long long od, int h0,
                                               int col0, int S, long long c0, int first, int stride) {
    constexpr int SW = cl_stage_row(COLS), SP = 16 * SW, CPAIRS = COLS * 4;
    T* __restrict__ y = static_cast<T*>(a.y);
    const int rows = min(16, a.oh - h0);
    for (int ph = first; ph < rows * CPAIRS * H; ph += stride) {
        const int p = ph / H, h = ph - p * H;
        const int r = p / CPAIRS, sc = 2 * (p - r * CPAIRS);
        uint4 o[2];
        unpack_pixel_pair(stage + h * 8 * SP + r * SW + sc, SP, o);
        T* out = y + (((n * a.od + od) * a.oh + h0 + r) * (long long)a.ow) * a.c + c0 + 8 * h;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int col = 8 * col0 + sc + i - S;
            if (col >= 0 && col < a.ow) *reinterpret_cast<uint4*>(out + (long long)col * a.c) = o[i];
        }
    }
}

template <typename T, int KD, int KH, int KW, int COLS, int DCHUNK, int STAGES, int TRANS, int MINB, int EPI>
__global__ void __launch_bounds__(8 * COLS * 32, MINB) depth_reuse_cl_dwconv(ConvArgs a, EpiArgs e) {
    constexpr int CG = 8;                    // channels of one 16-byte vector
    constexpr int HS = 16 + KH - 1;          // slice rows
    constexpr int PIX = (COLS + 1) * 8;      // slice columns filled (8 halo columns)
    constexpr int WS = tc_row_stride(COLS);  // >= PIX, odd 16-byte chunks: no ldmatrix conflicts
    constexpr int PLANE = TRANS ? channel_plane_odd_chunks(HS * WS) : HS * WS;  // one channel of one slice
    constexpr int SLICE = CG * PLANE;
    constexpr int PAIRS = HS * PIX / 2;      // pixel pairs a fill moves
    constexpr int THREADS = CG * COLS * 32;
    constexpr int U = (PAIRS + THREADS - 1) / THREADS;  // pairs per thread
    constexpr int NST = STAGES + 1;                     // staging slots
    constexpr int FU = (HS * PIX + THREADS - 1) / THREADS;  // pixels a thread copies
    constexpr int SW = cl_stage_row(COLS);
    constexpr int SP = 16 * SW;              // one channel of a stage
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* ring = reinterpret_cast<T*>(smem_raw);
    T* stages = ring + 2 * SLICE;
    // The staging ring, pixel-major: slot [row][column][8 channels].
    const unsigned char* staging = reinterpret_cast<const unsigned char*>(stages + 2 * CG * SP);
    const unsigned staging_addr = (unsigned)__cvta_generic_to_shared(staging);
    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ w = static_cast<const T*>(a.w);
    const ClBlock<COLS, DCHUNK> blk(a);
    const int P = blk.P, S = blk.S, nt = blk.nt, col0 = blk.col0, d0 = blk.d0, d1 = blk.d1, h0 = blk.h0;
    const long long n = blk.n, c0 = blk.c0;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int ch = warp / COLS, tj = warp - ch * COLS;
    const bool has_tile = col0 + tj < nt;
    const int steps = d1 - d0 + KD - 1;

    // Slice s (padded depth d0 + s) into staging slot s mod NST: pixel j of the slot
    // (row j / PIX, column j mod PIX) from its offset in an input depth slice, or zeros.
    int src[FU];
#pragma unroll
    for (int i = 0; i < FU; ++i) {
        const int j = i * THREADS + (int)threadIdx.x;
        const int r = j / PIX, col = j - r * PIX;
        const int zh = h0 - a.ph + r, zw = 8 * col0 + col - P;
        src[i] = j < HS * PIX && zh >= 0 && zh < a.ih && zw >= 0 && zw < a.iw ? (zh * a.iw + zw) * (int)a.c : -1;
    }
    // TRANS: this warp's part of every slice's transpose (GroupTranspose), rounds w,
    // w + WARPS, .. of 8-pixel groups.
    constexpr int WARPS = THREADS / 32, GROUPS = HS * PIX / 8;
    constexpr int TROUNDS = TRANS ? (GROUPS + 4 * WARPS - 1) / (4 * WARPS) : 1;
    const GroupTranspose<T, GROUPS, PIX, WS, PLANE, TROUNDS> groups_t(warp, WARPS, lane);
    const T* xn = x + n * a.id * (long long)a.ih * a.iw * a.c + c0;
    auto fetch = [&](int s) {
        if (s < steps) {
            const int zd = d0 + s - a.pd;
            const bool din = zd >= 0 && zd < a.id;
            const T* xd = xn + (din ? zd : 0) * (long long)a.ih * a.iw * a.c;
            const unsigned slot = staging_addr + (unsigned)((s % NST) * HS * PIX * 16);
#pragma unroll
            for (int i = 0; i < FU; ++i) {
                const int j = i * THREADS + (int)threadIdx.x;
                if ((HS * PIX) % THREADS != 0 && j >= HS * PIX) break;
                if (din && src[i] >= 0) {
                    cp_async16(slot + j * 16, xd + src[i]);
                } else {
                    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(slot + j * 16), "r"(0u));
                }
            }
        }
        cp_async_commit();
    };
    // Slice s's staged pixel pairs, transposed into channel-major buffer `buffer`. Pair e
    // covers slice columns 2e', 2e' + 1 of row r.
    auto transpose = [&](int s, int buffer) {
        const uint4* slot = reinterpret_cast<const uint4*>(staging + (s % NST) * HS * PIX * 16);
        T* buf = ring + buffer * SLICE;
#if __CUDA_ARCH__ >= 900
        if constexpr (TRANS) {
            groups_t.run((unsigned)__cvta_generic_to_shared(slot), (unsigned)__cvta_generic_to_shared(buf));
            return;
        }
#endif
#pragma unroll
        for (int k = 0; k < U; ++k) {
            const int e = 2 * (k * THREADS + (int)threadIdx.x);
            if (e < HS * PIX) transpose_pixel_pair<T, PIX, WS, PLANE>(slot, e, buf);
        }
    };
    auto write_out = [&](int od, int st) {
        store_stage_cl<T, COLS>(a, stages + st * CG * SP, n, od, h0, col0, S, c0, (int)threadIdx.x, THREADS);
    };

    unsigned bf[KD * KH][2];
    band_fragments<T, KD * KH, KW>(w + (c0 + ch) * (KD * KH * KW), lane, bf);
    const float bias = bias_of<T, EPI>(e, c0 + ch);
    const int mat = lane >> 3;
    const int arow = (lane & 7) + ((mat & 1) << 3), acol = (mat >> 1) << 3;
    const unsigned lane_addr = (unsigned)__cvta_generic_to_shared(ring) +
                               (unsigned)((ch * PLANE + arow * WS + tj * 8 + acol) * (int)sizeof(T));
    float acc[KD][4];
#pragma unroll
    for (int q = 0; q < KD; ++q) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.f;
    float probe = 0.f;

#pragma unroll
    for (int k = 0; k < STAGES; ++k) fetch(k);
    cp_async_wait<STAGES - 1>();
    __syncthreads();
    transpose(0, 0);
    fetch(STAGES);
    // As in depth_reuse.cu: steps KD at a time, so depth d0 + s - kd's accumulator
    // (u - kd) mod KD is a compile-time index. At step s's barrier: slice s + 1 has landed
    // (groups 0 .. s + 1 of s + STAGES + 1 are done), slice s is in buffer s & 1, and
    // every reader of buffer (s + 1) & 1, of staging slot s mod NST and of the stage the
    // depth finished at step s - 1 went to is past step s - 1.
    for (int sb = 0; sb < steps; sb += KD) {
#pragma unroll
        for (int u = 0; u < KD; ++u) {
            const int s = sb + u;
            if (s >= steps) break;
            const int cur = s & 1;
            cp_async_wait<STAGES - 1>();
            __syncthreads();
            if (s >= KD) write_out(d0 + s - KD, (s - 1) & 1);  // finished at step s - 1
            fetch(s + 1 + STAGES);
            if (s + 1 < steps) transpose(s + 1, cur ^ 1);
            if (has_tile) {
                rotate_slice<T, KD, KH>(lane_addr + (unsigned)(cur * SLICE * (int)sizeof(T)), WS * sizeof(T), s, u, d1 - d0, bf, acc);
                if (s >= KD - 1) {  // depth d0 + s - KD + 1 has had all its slices
                    float* done = acc[(u + 1) % KD];
                    probe_fragment(probe, done);
                    epilogue_fragment_cl<T, EPI>(a, e, done, c0 + ch, bias, n, d0 + s - (KD - 1), h0,
                                                 8 * (col0 + tj) + 2 * (lane & 3) - S, lane);
                    stage_fragment_cl<T, COLS>(stages + (s & 1) * CG * SP, ch, tj, lane, done);
                    done[0] = done[1] = done[2] = done[3] = 0.f;
                }
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();
    write_out(d0 + steps - KD, (steps - 1) & 1);
    if (!isfinite(probe) && a.flag) *a.flag = a.epoch;
}

// PRODUCER form (depth_reuse_cl_producer_dwconv): the same rotation without a block
// barrier a step. depth_reuse_cl's one barrier a slice held 8 tile warps of 15 MMAs each
// in step (30% / 21% of stall samples, runs 302 and 308), and three trims of the step's
// work moved it by -5%, +2% and +3% (runs 303, 309, 321); the NCDHW kernel got past the
// same wall with a producer warp and mbarriers (runs 165-171). Warps here: CG x COLS tile
// warps (one per (channel, tile), as above), then a producer and STORERS storers.
// - Producer: one TMA box a slice (channels c0.., the region's PIX columns, HS rows, one
//   depth of image n; zeros outside the tensor are the padding) into staging slot
//   s mod NST, NST slices ahead; it transposes the slot into channel-major ring slot
//   s mod NBUF with ldmatrix.trans + stmatrix (a warp's four 8-pixel groups a pair), once
//   every tile warp has released that ring slot (ring_empty), and hands it over
//   (ring_full, every producer lane arrives after its own stores). On sm_80 the producer's
//   lanes copy the slot with 16-byte cp.async and transpose lane by lane.
// - Tile warps: wait ring_full, rotate_slice, release (ring_empty, every lane); a finished
//   depth's fragments go through the epilogue into output stage k mod OST once the storer
//   has read that stage's previous depth (stage_free), then staged (every lane arrives).
// - Storers: wait staged, move the stage out as 16-byte pixel vectors (pixel pairs dealt
//   round the storers' lanes), release it. One storer warp issued ~310 instructions a
//   depth (unpacking channel planes into pixel vectors) and held the tile warps on
//   stage_free (~26 retries a wait, H100 run 324): more storers split that work.
// NBUF ring slots and OST output stages bound how far the tile warps run ahead of the
// slowest of them and of the storers (4 and 3 gained nothing on the seed: run 333).
// Channel planes are an odd number of 16-byte chunks (stmatrix rows on distinct banks).
// CG = 16: a block owns 16 channels, 32 bytes a pixel, so its TMA boxes and its storers'
// stores cover whole 32-byte sectors (with 8 channels the box and every store fill half
// of each sector: the L2 bound of run 327); each pixel is H = 2 16-byte vectors, and the
// boxes land 32-byte swizzled (GroupTranspose's SW32: run 332 took the ldmatrix bank
// conflicts away and moved the tile warps' waits from ring_full to stage_free).
// CPW channels a tile warp (1 or 2): with 2, half the warps each slot and stage waits for,
// and two independent MMA chains a warp (twice the weight and accumulator registers).
// PRODUCERS producer warps (1 or 2) share each slice's transposes (GroupTranspose rounds
// dealt alternately); the first issues the TMA boxes once both have read a staging slot
// (named barrier 1; on sm_80 also once its cp.async copies have landed). Both arrive on
// ring_full.
template <typename T, int KD, int KH, int KW, int COLS, int CG, int DCHUNK, int STAGES, int STORERS, int NBUF,
          int OST, int CPW, int PRODUCERS, int MINB, int EPI>
__global__ void __launch_bounds__((CG / CPW * COLS + PRODUCERS + STORERS) * 32, MINB)
    depth_reuse_cl_producer_dwconv(ConvArgs a, EpiArgs e, const __grid_constant__ TmaMaps maps) {
    static_assert(CG == 8 || CG == 16, "a block owns 8 or 16 channels");
    static_assert(CPW == 1 || CPW == 2, "one or two channels a tile warp");
    static_assert(PRODUCERS == 1 || PRODUCERS == 2, "one or two producer warps");
    static_assert(sizeof(T) == 2, "16-byte vectors of 8 channels");
    constexpr int H = CG / 8;  // 16-byte vectors a pixel
    constexpr int HS = 16 + KH - 1;
    constexpr int PIX = (COLS + 1) * 8;
    constexpr int WS = tc_row_stride(COLS);
    constexpr int PLANE = channel_plane_odd_chunks(HS * WS);
    constexpr int SLICE = CG * PLANE;
    constexpr int SLICE_BYTES = SLICE * (int)sizeof(T);
    static_assert(NBUF >= 3 && OST >= 2, "a slot filling, one read, one free; a stage written, one read");
    constexpr int NST = STAGES + 1;            // staging slots (pixel-major, TMA boxes)
    constexpr int STAGING_BYTES = (HS * PIX * 16 * H + 127) / 128 * 128;
    static_assert(CG == 8 || STAGING_BYTES % 256 == 0, "swizzled slots: whole 256-byte swizzle atoms");
    constexpr int SW = cl_stage_row(COLS);
    constexpr int SP = 16 * SW;
    constexpr int TW = CG / CPW * COLS;        // tile warps
    constexpr int GROUPS = HS * PIX / 8 * H;   // (8-pixel group, 16-byte vector) pairs a slice
    // Shared memory: staging slots (128-byte aligned for the TMA), ring slots, output
    // stages, then the mbarriers (host: depth_reuse_cl::producer_shared_bytes).
    constexpr int RING_OFFSET = NST * STAGING_BYTES;
    constexpr int STAGE_OFFSET = RING_OFFSET + NBUF * SLICE_BYTES;
    constexpr int BAR_OFFSET = (STAGE_OFFSET + OST * CG * SP * (int)sizeof(T) + 7) / 8 * 8;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const unsigned base = (unsigned)__cvta_generic_to_shared(smem_raw);
    const unsigned staging_full = base + BAR_OFFSET;
    const unsigned ring_full = staging_full + 8 * NST, ring_empty = ring_full + 8 * NBUF;
    const unsigned staged = ring_empty + 8 * NBUF, stage_free = staged + 8 * OST;
    T* stages = reinterpret_cast<T*>(smem_raw + STAGE_OFFSET);
    const T* __restrict__ w = static_cast<const T*>(a.w);
    const ClBlock<COLS, DCHUNK, CG> blk(a);
    const int P = blk.P, S = blk.S, nt = blk.nt, col0 = blk.col0, d0 = blk.d0, d1 = blk.d1, h0 = blk.h0;
    const long long n = blk.n, c0 = blk.c0;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int steps = d1 - d0 + KD - 1;
    const int depths = d1 - d0;
    const int tile_warps = CG / CPW * min(COLS, nt - col0);

    if (threadIdx.x == 0) {
        for (int i = 0; i < NST; ++i) mbar_init(staging_full + 8 * i, 1);
        for (int i = 0; i < NBUF; ++i) {
            mbar_init(ring_full + 8 * i, 32 * PRODUCERS);
            mbar_init(ring_empty + 8 * i, tile_warps * 32);
        }
        for (int i = 0; i < OST; ++i) {
            mbar_init(staged + 8 * i, tile_warps * 32);
            mbar_init(stage_free + 8 * i, STORERS * 32);
        }
#if __CUDA_ARCH__ >= 900
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
    }
    __syncthreads();

    // (One producer tested as `warp == TW`: the code of the GPU-tested one-producer kernel.)
    if (PRODUCERS == 1 ? warp == TW : warp >= TW && warp < TW + PRODUCERS) {
        // The producers (producer pi's transpose: rounds pi, pi + PRODUCERS, .. of the
        // slice's groups, four a round). 16 channels: the TMA's 32-byte swizzle (host:
        // depth_reuse_cl::tensor_maps). Producer 0 alone fills the staging slots.
        // (pi spelled out as 0 for one producer: with `warp - TW` ptxas did not fold the
        // refill's `pi == 0` tests, and the one-producer kernel grew by 400 instructions)
        const int pi = PRODUCERS > 1 ? warp - TW : 0;
        constexpr int ROUNDS = ((GROUPS + 3) / 4 + PRODUCERS - 1) / PRODUCERS;
        const GroupTranspose<T, GROUPS, PIX, WS, PLANE, ROUNDS, H, CG == 16> transpose(pi, PRODUCERS, lane, base);
        // Both producers at one point of the slice walk (a no-op for one).
        auto producers_meet = [] {
            if constexpr (PRODUCERS > 1) asm volatile("bar.sync 1, %0;\n" ::"r"(32 * PRODUCERS) : "memory");
        };
        const int zw = 8 * col0 - P, zh = h0 - a.ph;
        auto fill = [&](int s) {  // slice s (padded depth d0 + s) into its staging slot
            if (s >= steps) {
#if __CUDA_ARCH__ < 900
                cp_async_commit();
#endif
                return;
            }
            const int zd = d0 + s - a.pd;
            const unsigned slot = base + (unsigned)((s % NST) * STAGING_BYTES);
#if __CUDA_ARCH__ >= 900
            if (lane == 0) {
                mbar_expect_tx(staging_full + 8 * (s % NST), (unsigned)(HS * PIX * 16 * H));
                tma_load_5d(slot, &maps.input, (int)c0, zw, zh, zd, (int)n, staging_full + 8 * (s % NST));
            }
#else
            const T* xn = static_cast<const T*>(a.x) + n * a.id * (long long)a.ih * a.iw * a.c + c0;
            for (int j = lane; j < HS * PIX * H; j += 32) {
                const int px = j / H, h = j - px * H;
                const int r = px / PIX, col = px - r * PIX;
                const int gh = zh + r, gw = zw + col;
                if (zd >= 0 && zd < a.id && gh >= 0 && gh < a.ih && gw >= 0 && gw < a.iw) {
                    cp_async16(slot + j * 16, xn + (((long long)zd * a.ih + gh) * a.iw + gw) * a.c + 8 * h);
                } else {
                    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(slot + j * 16), "r"(0u));
                }
            }
            cp_async_commit();
#endif
        };
        if (pi == 0) {
#pragma unroll 1
            for (int k = 0; k < NST; ++k) fill(k);
        }
#pragma unroll 1
        for (int s = 0; s < steps; ++s) {
            const int st = s % NST, rb = s % NBUF;
            const unsigned slot = base + (unsigned)(st * STAGING_BYTES);
            const unsigned ring = base + (unsigned)(RING_OFFSET + rb * SLICE_BYTES);
#if __CUDA_ARCH__ >= 900
            mbar_wait(staging_full + 8 * st, (unsigned)(s / NST) & 1);
#else
            cp_async_wait<NST - 1>();  // producer 0's copies (producer 1 has none)
            __syncwarp();
            producers_meet();  // slice s landed, for the other producer too
#endif
            if (s >= NBUF) mbar_wait(ring_empty + 8 * rb, (unsigned)(s / NBUF - 1) & 1);
#if __CUDA_ARCH__ >= 900
            transpose.run(slot, ring);
#else
            for (int p = lane + 32 * pi; p < HS * PIX / 2 * H; p += 32 * PRODUCERS)
                transpose_pixel_pair<T, PIX, WS, PLANE, H>(
                    reinterpret_cast<const uint4*>(smem_raw + st * STAGING_BYTES), 2 * (p / H),
                    reinterpret_cast<T*>(smem_raw + RING_OFFSET + rb * SLICE_BYTES), p % H);
#endif
            mbar_arrive(ring_full + 8 * rb);  // every lane, after its own stores
            // Every lane (of both producers) has read the staging slot: it takes slice
            // s + NST (the TMA writes it through the async proxy after these generic reads).
            // Each producer fences its own reads against the async proxy before they meet.
            __syncwarp();
#if __CUDA_ARCH__ >= 900
            fence_proxy_async();
#endif
            producers_meet();
            if (pi == 0) fill(s + NST);
        }
#if __CUDA_ARCH__ < 900
        cp_async_wait<0>();
#endif
        return;
    }
    if (warp >= TW + PRODUCERS) {
        // The storers: depth d0 + q leaves from stage q mod OST.
#pragma unroll 1
        for (int q = 0; q < depths; ++q) {
            const int sb = q % OST;
            mbar_wait(staged + 8 * sb, (unsigned)(q / OST) & 1);
            store_stage_cl<T, COLS, H>(a, stages + sb * CG * SP, n, d0 + q, h0, col0, S, c0,
                                       (warp - TW - PRODUCERS) * 32 + lane, STORERS * 32);
            mbar_arrive(stage_free + 8 * sb);  // every lane, after its own reads
        }
        return;
    }

    // Tile warps: channels ch .. ch + CPW - 1 of tile column tj.
    const int ch = warp / COLS * CPW, tj = warp - warp / COLS * COLS;
    if (col0 + tj >= nt) return;  // not counted in tile_warps
    unsigned bf[CPW][KD * KH][2];
    float bias[CPW];
#pragma unroll
    for (int c = 0; c < CPW; ++c) {
        band_fragments<T, KD * KH, KW>(w + (c0 + ch + c) * (KD * KH * KW), lane, bf[c]);
        bias[c] = bias_of<T, EPI>(e, c0 + ch + c);
    }
    const int mat = lane >> 3;
    const int arow = (lane & 7) + ((mat & 1) << 3), acol = (mat >> 1) << 3;
    const unsigned lane_addr =
        base + (unsigned)(RING_OFFSET + (ch * PLANE + arow * WS + tj * 8 + acol) * (int)sizeof(T));
    float acc[CPW][KD][4];
#pragma unroll
    for (int c = 0; c < CPW; ++c)
#pragma unroll
        for (int q = 0; q < KD; ++q) acc[c][q][0] = acc[c][q][1] = acc[c][q][2] = acc[c][q][3] = 0.f;
    float probe = 0.f;
    // As in the block-barrier form: steps KD at a time, so depth d0 + s - kd's accumulator
    // (u - kd) mod KD is a compile-time index.
#pragma unroll 1
    for (int sb = 0; sb < steps; sb += KD) {
#pragma unroll
        for (int u = 0; u < KD; ++u) {
            const int s = sb + u;
            if (s >= steps) break;
            const int rb = s % NBUF;
            mbar_wait(ring_full + 8 * rb, (unsigned)(s / NBUF) & 1);
#pragma unroll
            for (int c = 0; c < CPW; ++c)
                rotate_slice<T, KD, KH>(lane_addr + (unsigned)(rb * SLICE_BYTES + c * PLANE * (int)sizeof(T)),
                                        WS * sizeof(T), s, u, depths, bf[c], acc[c]);
            mbar_arrive(ring_empty + 8 * rb);  // every lane, after its own reads
            if (s >= KD - 1) {  // depth d0 + q has had all its slices
                const int q = s - (KD - 1), sbuf = q % OST;
#pragma unroll
                for (int c = 0; c < CPW; ++c) {
                    float* done = acc[c][(u + 1) % KD];
                    probe_fragment(probe, done);
                    epilogue_fragment_cl<T, EPI>(a, e, done, c0 + ch + c, bias[c], n, d0 + q, h0,
                                                 8 * (col0 + tj) + 2 * (lane & 3) - S, lane);
                }
                if (q >= OST) mbar_wait(stage_free + 8 * sbuf, (unsigned)(q / OST - 1) & 1);
#pragma unroll
                for (int c = 0; c < CPW; ++c) {
                    float* done = acc[c][(u + 1) % KD];
                    stage_fragment_cl<T, COLS>(stages + sbuf * CG * SP, ch + c, tj, lane, done);
                    done[0] = done[1] = done[2] = done[3] = 0.f;
                }
                mbar_arrive(staged + 8 * sbuf);  // every lane, after its own stores
            }
        }
    }
    if (!isfinite(probe) && a.flag) *a.flag = a.epoch;
}
