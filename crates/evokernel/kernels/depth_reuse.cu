// depth_reuse: streaming's tensor-core formulation with every A fragment feeding all KD
// output depths it contributes to. Input slice z reaches output depths z - kd, kd < KD,
// at the same (h, w); streaming loads each slice's fragments once per output depth (KD
// times), and the ldmatrix reads that fill the shared-memory pipe are what bound it
// (docs/perf.md, runs 6-7). Here each warp owns one 16x8 output tile and keeps KD
// rotating accumulators for it, so a block walks its slices once: slice z's fragments
// feed KD accumulators, and after slice z the depth z - KD + 1 is complete and leaves.
// (Run 8 tried the rotation with ~5 tiles per warp: 60 accumulators, 154 registers.)
// MINB is the blocks per SM the registers are capped for. (Two tiles per warp, for more
// independent MMA chains, measured 1.1-1.3x slower: docs/perf.md, run 37.)
// A block owns (n, c, a chunk of DCHUNK output depths, a region of BANDS x COLS tiles);
// its ring holds STAGES + 1 slices of just that region: one consumed, STAGES in flight
// by cp.async (one step of 5-15 MMAs per warp is much shorter than an L2 round trip).
// Tiling as in streaming.cu: input column 0 at tile column P = pw rounded up to 8, tiles
// starting at 8j - S, S = P - pw. Stride 1, dilation 1, KW <= 9, input width a multiple
// of 8; T is bf16 or f16.
// PRODUCER = 1: a block has one more warp that only copies slices, and the ring's slots
// are handed over by mbarriers instead of a block barrier a slice: full[slot] completes
// when the producer's copies into it land, empty[slot] when every tile warp has read it.
// Tile warps then issue only ldmatrix, MMAs and stores, and drift up to the ring's depth
// apart instead of meeting at a barrier every slice. On sm_90 one thread of the producer
// copies a slice with one TMA tensor copy (its zero fill is the padding): with 16-byte
// cp.async a lane, the producer warp spent ~320 instructions a slice and was the
// bottleneck (run 166: it never waited for a free slot while the tile warps waited for
// full ones), and a bulk copy a row still ~12 a row (uniform operands, an ELECT loop).
// Slots are 128-byte aligned for the TMA. Slices wholly in the depth padding are neither
// copied nor multiplied (zero contributions; the oracle skips padding too).

template <typename T>
__device__ __forceinline__ unsigned short bits16(T v) {
    return *reinterpret_cast<unsigned short*>(&v);
}

// The TMA tensor maps (TmaMaps, common.cuh; [N*C][D][H][W], encoded on the host per launch, zeroed where unused):
// the input with a box of one slice of a block's region, and the output with a box of
// one output depth of the region's columns [col0 * 8, col0 * 8 + BW) (zeroed, and
// stores go straight from registers, where output rows are not 16-byte multiples). A
// TMA copy's first column must be a multiple of 16 bytes (-8 or 0, not -6 or 2: probed
// on the H100, docs/perf.md runs 170 and 177; also why tiles stay shifted by S), and a
// region's own columns start at col0 * 8 - S: so the box is the aligned inside of the
// region, BW = COLS * 8 - 8 where S > 0, and its first S and last 8 - S columns go from
// registers.

// PLANES (KD = 1, no depth padding, with the producer): a 2-D layer (or a 1xKxK 3-D one)
// has one slice an output plane and no depths to rotate through, and a block of one plane
// starts and drains its pipeline for one slice (convnext-7x7: 2x slower than streaming,
// run 34). So a block walks a chunk of consecutive planes instead, the ring and the
// stores running across planes; chunks = gridDim.x / regions. Planes go in (channel,
// image, depth) order (PlaneWalk), so a channel's B fragments serve N x D planes: the
// producer warp builds them (taps loaded a channel ahead) into the slot of the channel's
// first plane, and the tile warps read them there with one LDS.64 a kernel row. (Built
// by every tile warp every plane, the taps' loads and packing were ~60 instructions an
// MMA, run 225; by the producer every plane, its ~300 dependent instructions a plane
// paced the block, run 228.) A warp of its own stores the output planes.

// A plane walk's position: depth d of image n of channel c, channel slowest.
struct PlaneWalk {
    int d, n, c;
    __device__ PlaneWalk(int index, const ConvArgs& a) {
        d = index % a.od;
        const int t = index / a.od;
        n = t % (int)a.n;
        c = t / (int)a.n;
    }
    // Whether this plane is its channel's first.
    __device__ bool first() const { return d == 0 && n == 0; }
    __device__ void next(const ConvArgs& a) {
        if (++d < a.od) return;
        d = 0;
        if (++n < (int)a.n) return;
        n = 0;
        ++c;
    }
    // The plane's index in an [N][C][D] stack of planes (input and output alike: od = id).
    __device__ long long plane(const ConvArgs& a) const { return ((long long)n * a.c + c) * a.od + d; }
};

// SPLIT (with the producer): a row has several regions, so the stored box is the
// aligned inside of the region and its edge columns go from registers; 0 where the region
// is the whole row (the box from column 0 covers it; the edge code cost the seed 14%,
// run 178).
// STAGED (with the producer, on sm_90, where output rows are 16-byte multiples and the box
// has columns; the host decides, mirroring tensor_maps): 0 where depths leave from
// registers; else through the stages and a TMA store, 1 where the tiles' shift S is even
// (a lane's two columns are one 4-byte word), 2 where it is odd (two 2-byte halves).
// Known at compile time, the steady step carries neither the other path nor the parity test.
template <typename T, int KD, int KH, int KW, int BANDS, int COLS, int DCHUNK, int STAGES, int MINB, int PRODUCER, int SPLIT, int STAGED, int PLANES, int EPI>
__global__ void __launch_bounds__((BANDS * COLS + PRODUCER + PLANES) * 32, MINB) depth_reuse_dwconv(ConvArgs a, EpiArgs e, const __grid_constant__ TmaMaps maps) {
    static_assert(!PLANES || (KD == 1 && PRODUCER), "PLANES walks planes of KD = 1 with the producer");
    extern __shared__ __align__(128) unsigned char smem_raw[];
    constexpr int HS = BANDS * 16 + KH - 1;  // slice rows: the region's bands and their halo
    constexpr int PIECES = COLS + 1;         // 16-byte pieces per slice row (8 halo columns)
    constexpr int WS = tc_row_stride(COLS);
    constexpr int SLICE_BYTES = HS * WS * (int)sizeof(T);
    constexpr int SLOT_BYTES = PRODUCER ? (SLICE_BYTES + 127) / 128 * 128 : SLICE_BYTES;
    // With the producer, after the ring: the mbarriers (full and empty a slot, staged and
    // free a stage), then OST stages of one output depth of the region (at most RW columns).
    constexpr int NBUF = STAGES + 1;
    constexpr int RW = COLS * 8, STAGE_BYTES = BANDS * 16 * RW * (int)sizeof(T);
    // Output stages. A plane walk's steps are short: with two stages stored by the producer
    // as its loads let it, tile warps waited on the store of two steps before (run 224:
    // 2.4 us a step), so there eight, stored by a warp of its own (after the producer) as
    // soon as each is staged, STORES_READING of them left reading while it goes on: a
    // stage is free once the store OST - 3 planes later is issued. (With four stages and
    // three reading, a stage was freed only once the next plane was staged and every step
    // waited for all tile warps' previous one, run 227; waiting for each read left the
    // storer behind, runs 230-232.) Walking depths, KD stages where KD is 2-4 (else 2, the
    // shared memory of deeper kernels' stages kept): the tile warps take KD steps a round,
    // so a step's stage, (u + 1) mod KD, and its wait's parity are known without
    // arithmetic (see `step`).
    constexpr int OST = PLANES ? 8 : (KD >= 2 && KD <= 4 ? KD : 2);
    constexpr int STORES_READING = OST - 3;  // PLANES: the storer's stores left reading
    // (PLANES: stages 1024-byte aligned, a 128-byte swizzle's atom.)
    constexpr int STAGE_ALIGN = PLANES ? 1024 : 128;
    constexpr int STAGE_OFFSET = PLANES ? (NBUF * SLOT_BYTES + 8 * (2 * NBUF + 2 * OST) + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN
                                        : NBUF * SLOT_BYTES + (8 * (2 * NBUF + 2 * OST) + 127) / 128 * 128;
    // PLANES: after the stages, a slot's B fragments (KH rows x 32 lanes x 8 bytes) and bias.
    constexpr int FRAG_OFFSET = STAGE_OFFSET + OST * STAGE_BYTES, FRAG_BYTES = KH * 256 + 16;
    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ w = static_cast<const T*>(a.w);
    T* __restrict__ y = static_cast<T*>(a.y);
    const int P = (a.pw + 7) & ~7, S = P - a.pw;
    const int mt = (a.oh + 15) / 16, nt = (a.ow + S + 7) / 8;
    const int col_regions = (nt + COLS - 1) / COLS;
    const int regions = ((mt + BANDS - 1) / BANDS) * col_regions;
    // PLANES: "depths" d0..d1 are planes of the walk's (c, n, d) sequence (the host keeps
    // it under 2^31).
    const int chunks = PLANES ? (int)(gridDim.x / regions) : (a.od + DCHUNK - 1) / DCHUNK;
    const int total = PLANES ? (int)(a.n * a.c * a.od) : a.od;
    // Regions vary fastest so neighbours sharing halo rows run together (L2 hits).
    const long long b = blockIdx.x;
    const int region = (int)(b % regions);
    const int per_chunk = (total + chunks - 1) / chunks;  // balanced: 33 = 11 + 11 + 11, not 16 + 16 + 1
    // (PLANES: the last chunks may be empty.)
    const int d0 = PLANES ? min((int)((b / regions) % chunks) * per_chunk, total) : (int)((b / regions) % chunks) * per_chunk;
    const int d1 = min(d0 + per_chunk, total);
    const long long nc = PLANES ? 0 : b / ((long long)regions * chunks);
    const long long c = nc % a.c;
    const int band0 = (region / col_regions) * BANDS, col0 = (region % col_regions) * COLS;
    const T* xin = x + nc * (long long)a.id * a.ih * a.iw;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned ring = (unsigned)__cvta_generic_to_shared(smem_raw);

    // Step s reads padded depth d0 + s (input depth d0 + s - pd) into buffer s mod (STAGES + 1);
    // past the last step it commits an empty group, so every step commits one.
    const int steps = d1 - d0 + KD - 1;
    auto fetch = [&](int s, int buffer) {
        if (s < steps) {
            const int zd = d0 + s - a.pd;
            const bool depth_inside = zd >= 0 && zd < a.id;
            const unsigned buf = ring + (unsigned)(buffer * SLICE_BYTES);
            for (int j = threadIdx.x; j < HS * PIECES; j += blockDim.x) {
                const int r = j / PIECES, k = j - r * PIECES;
                const int gh = band0 * 16 + r - a.ph;  // input row
                const int gw = (col0 + k) * 8 - P;     // input column, a multiple of 8
                const unsigned dst = buf + (unsigned)((r * WS + 8 * k) * (int)sizeof(T));
                if (depth_inside && gh >= 0 && gh < a.ih && gw >= 0 && gw < a.iw) {
                    cp_async16(dst, xin + ((long long)zd * a.ih + gh) * a.iw + gw);
                } else {
                    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(dst), "r"(0u));
                }
            }
        }
        cp_async_commit();
    };

    unsigned bf[KD * KH][2];
    if constexpr (!PLANES) band_fragments<T, KD * KH, KW>(w + c * (KD * KH * KW), lane, bf);

    // This warp's tile: band tb, column tj of the region.
    const int tb = warp / COLS, tj = warp - tb * COLS;
    const bool has_tile = band0 + tb < mt && col0 + tj < nt;
    const int h0 = (band0 + tb) * 16, w0 = (col0 + tj) * 8 - S;
    const int mat = lane >> 3;
    const int arow = (lane & 7) + ((mat & 1) << 3), acol = (mat >> 1) << 3;
    const unsigned lane_addr = ring + (unsigned)(((tb * 16 + arow) * WS + tj * 8 + acol) * (int)sizeof(T));
    const long long plane = (long long)a.oh * a.ow;

    float bias = bias_of<T, EPI>(e, c);
    PlaneWalk walk(d0, a);  // PLANES: the plane of the next step
    float acc[KD][4];
#pragma unroll
    for (int q = 0; q < KD; ++q) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.f;
    float probe = 0.f;
    // At step s, depth d0 + s - kd sits in accumulator slot (u - kd) mod KD (walk_slices).
    // steady: s >= KD - 1 and s < d1 - d0, so every depth the slice reaches is this
    // block's and one completes (no predicates; most steps of a long chunk).
    // (Built only where used: an unused one still cost x3d's block-barrier walk a spill.)
    const CFragmentAt at = PRODUCER ? CFragmentAt(h0, w0, lane, a) : CFragmentAt();
    const unsigned full = ring + NBUF * SLOT_BYTES, empty = full + 8 * NBUF;
    const unsigned staged = empty + 8 * NBUF, stage_free = staged + 8 * OST;
    const int BW = COLS * 8 - (SPLIT && S > 0 ? 8 : 0);  // the stored box's columns (host: tensor_maps)
    static_assert(STAGED == 0 || PRODUCER, "staged output depths need the producer");
#if __CUDA_ARCH__ >= 900
    // Whole output depths of the region leave by one TMA store each (full 32-byte sectors:
    // a warp's 8-column fragment rows are 16 bytes, two sectors where the tiles are
    // shifted, and the partial writes kept L2 at 83% of its peak, run 167's ncu).
    constexpr bool tma_out = STAGED != 0;
#else
    constexpr bool tma_out = false;
#endif
    // This lane's two columns relative to the box (odd where S is) and whether each is
    // inside it; the stage holds the box's rows BW apart. Walking planes with rows of
    // 128 bytes, swizzled (the output map's CU_TENSOR_MAP_SWIZZLE_128B): a fragment
    // store's 8 rows fell on the same 4 banks (ncu, run 229: L1 85% busy), the 16-byte
    // chunks of row r are XORed with r mod 8 (address bits 4-6 with 7-9).
    // (A whole-row region has col0 = 0: SPLIT = 0 says so at compile time.)
    const int box0 = SPLIT ? col0 * 8 : 0;  // the box's first output column
    const int stage_col = w0 - box0 + (lane & 3) * 2;
    const bool in0 = stage_col >= 0 && stage_col < BW, in1 = stage_col + 1 >= 0 && stage_col + 1 < BW;
    const bool swizzled = PLANES && BW * (int)sizeof(T) == 128;
    auto stage_addr = [&](unsigned addr) { return swizzled ? addr ^ (((addr >> 7) & 7u) << 4) : addr; };
    const unsigned lane_stage = ring + STAGE_OFFSET + (unsigned)(((tb * 16 + (lane >> 2)) * BW + stage_col) * (int)sizeof(T));
    // Whether every steady step's slice (depths d0 + KD - 1 - pd to d1 - 1 - pd) is inside
    // the input, so steady steps skip the per-slice test (padding within the kernel).
    const bool steady_inside = d0 + KD - 1 - a.pd >= 0 && d1 - 1 - a.pd < a.id;
    // (Called with a literal `steady`: after inlining the predicates fold away.)
    // round: the parity of the consumer's round of KD steps (s = round * KD + u), 0 where
    // there are no rounds (the block-barrier walk stores from registers).
    auto step = [&](int s, int u, int cur, bool steady, unsigned round) {
        // Depth d0 + s - KD + 1 completes in this step: its residuals load first, so
        // their latency hides behind the slice's MMAs.
        const long long plane_out = (PLANES ? walk.plane(a) : nc * a.od + d0 + s - (KD - 1)) * plane;
        if constexpr (PLANES) {
            if (s == 0 || walk.first()) {
                // A new channel: its fragments and bias, as the producer left them with
                // the slice.
                const unsigned char* frag = smem_raw + FRAG_OFFSET + cur * FRAG_BYTES;
#pragma unroll
                for (int q = 0; q < KH; ++q) {
                    const uint2 v = reinterpret_cast<const uint2*>(frag)[q * 32 + lane];
                    bf[q][0] = v.x;
                    bf[q][1] = v.y;
                }
                bias = *reinterpret_cast<const float*>(frag + KH * 256);
            }
            walk.next(a);
        }
        float res[4];
        if (steady || s >= KD - 1) load_c_residual<T, EPI>(a, e, plane_out, h0, w0, lane, res);
        // With the producer a slice of depth padding is never copied (it adds nothing);
        // the block-barrier walk copies zeros and multiplies them (as measured before).
        const int zd = d0 + s - a.pd;
        if (PRODUCER == 0 || PLANES || (steady && steady_inside) || (zd >= 0 && zd < a.id))
            rotate_slice<T, KD, KH>(lane_addr + (unsigned)(cur * SLOT_BYTES), WS * sizeof(T), s, u, d1 - d0, bf, acc, steady);
        if (steady || s >= KD - 1) {  // depth d0 + s - KD + 1 has had all its slices
            float* done = acc[(u + 1) % KD];
            probe_fragment(probe, done);
            if constexpr (tma_out) {
                // Depth q of the chunk into stage q mod OST, once the store of depth
                // q - OST has read it; the producer (walking planes, the storer) stores the
                // depth when every tile is in.
                // Use k = q / OST of a stage waits for the phase of use k - 1 (for k = 0 the
                // parity 1 of a fresh mbarrier's "previous" phase passes at once). Walking
                // depths with OST = KD, step s = r * KD + u of round r: q = (r - 1) * KD +
                // u + 1, so the stage is (u + 1) mod KD and the parity r's (`round`),
                // flipped where u + 1 = KD.
                const int q = s - (KD - 1);
                constexpr bool BY_ROUND = !PLANES && OST == KD;
                const unsigned b = BY_ROUND ? (unsigned)(u + 1) % OST : (unsigned)q % OST;
                const unsigned parity = BY_ROUND ? (round ^ (u + 1 == KD)) & 1 : (((unsigned)q / OST) & 1) ^ 1;
                mbar_wait(stage_free + 8 * b, parity);
                const unsigned dst = lane_stage + b * STAGE_BYTES;
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const T lo = from_f32<T>(finish<EPI, T>(done[2 * half], bias, res[2 * half]));
                    const T hi = from_f32<T>(finish<EPI, T>(done[2 * half + 1], bias, res[2 * half + 1]));
                    const unsigned row = dst + half * 8 * BW * (int)sizeof(T);
                    if constexpr (SPLIT == 0) {
                        // The whole row: every column of the region right of 0 is in the box.
                        if constexpr (STAGED == 1) {
                            if (stage_col >= 0)
                                asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(stage_addr(row)), "r"(pack2(lo, hi)));
                        } else {
                            if (stage_col >= 0) asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(stage_addr(row)), "h"(bits16(lo)));
                            if (stage_col + 1 >= 0)
                                asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(stage_addr(row + 2)), "h"(bits16(hi)));
                        }
                    } else if (STAGED == 1 && in0 && in1) {
                        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(stage_addr(row)), "r"(pack2(lo, hi)));
                    } else {
                        if (in0) asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(stage_addr(row)), "h"(bits16(lo)));
                        if (in1) asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(stage_addr(row + 2)), "h"(bits16(hi)));
                        if constexpr (SPLIT != 0) {
                            // The region's columns outside the box, from registers.
                            T* p = y + plane_out + at.off + half * 8LL * a.ow;
                            if (!in0 && (at.mask & (1u << (2 * half)))) p[0] = lo;
                            if (!in1 && (at.mask & (2u << (2 * half)))) p[1] = hi;
                        }
                    }
                }
#if __CUDA_ARCH__ >= 900
                fence_proxy_async();
#endif
                __syncwarp();
                if (lane == 0) mbar_arrive(staged + 8 * b);
            } else if constexpr (PRODUCER != 0) {
                store_c_fragment_at<EPI>(y, plane_out, done, at, a, bias, res);
            } else {
                store_c_fragment<EPI>(y + plane_out, done, h0, w0, lane, a, bias, res);
            }
            done[0] = done[1] = done[2] = done[3] = 0.f;
        }
    };
    if constexpr (PRODUCER == 0) {
        walk_slices<KD, STAGES>(steps, fetch, [&](int s, int u, int cur) {
            if (has_tile) step(s, u, cur, false, 0);
        });
    } else {
        const int tile_warps = min(BANDS, mt - band0) * min(COLS, nt - col0);
#if __CUDA_ARCH__ >= 900
        // The producer's expect_tx; walking planes, every producer lane (its fragments).
        // (There the slots are handed over lane by lane, full and empty: ordered through
        // one lane and __syncwarp, racecheck reported the fragments' reads and writes,
        // run 234.)
        constexpr unsigned FULL_ARRIVALS = PLANES ? 32 : 1;
#else
        // Each producer lane once its copies land (and, walking planes, once it has
        // written its fragments).
        constexpr unsigned FULL_ARRIVALS = PLANES ? 64 : 32;
#endif
        if (threadIdx.x == 0) {
            for (int i = 0; i < NBUF; ++i) {
                mbar_init(full + 8 * i, FULL_ARRIVALS);
                mbar_init(empty + 8 * i, tile_warps * (PLANES ? 32 : 1));
            }
            for (int i = 0; i < OST; ++i) {
                mbar_init(staged + 8 * i, tile_warps);
                mbar_init(stage_free + 8 * i, 1);
            }
        }
        __syncthreads();
        if (PLANES && warp == BANDS * COLS + 1) {
#if __CUDA_ARCH__ >= 900
            // The storer: output plane q leaves by one TMA store once every tile warp has
            // staged it.
            if (lane != 0 || !tma_out) return;
            PlaneWalk out(d0, a);
            for (int q = 0; q < d1 - d0; ++q, out.next(a)) {
                const unsigned b = (unsigned)q % OST;
                mbar_wait(staged + 8 * b, ((unsigned)q / OST) & 1);
                // The stage of plane q - STORES_READING has been read (see OST).
                tma_store_4d<STORES_READING>(&maps.output, ring + STAGE_OFFSET + b * STAGE_BYTES, box0, band0 * 16, out.d,
                                             out.n * (int)a.c + out.c);
                if (q >= STORES_READING) mbar_arrive(stage_free + 8 * ((unsigned)(q - STORES_READING) % OST));
            }
            asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
            return;
        }
        if (warp == BANDS * COLS) {
            // The producer: slice s into slot s mod NBUF once its last reader is done.
            int cur = 0, use = 0;
            // PLANES: at a channel's first plane every producer lane writes its lane's
            // fragments into slot cur's area (taps loaded a channel ahead), before the slot
            // is full; the walk then moves to the next plane.
            T taps[PLANES ? KH : 1][4];
            PlaneWalk in(d0, a);
            if constexpr (PLANES) {
                if (d0 < d1) band_taps<T, KH, KW>(w + (long long)in.c * (KH * KW), lane, taps);
            }
            auto put_fragments = [&](int s) {
                if constexpr (PLANES) {
                    if (s == 0 || in.first()) {
                        unsigned f[KH][2];
                        band_pack<T, KH>(taps, f);
                        unsigned char* frag = smem_raw + FRAG_OFFSET + cur * FRAG_BYTES;
#pragma unroll
                        for (int q = 0; q < KH; ++q)
                            reinterpret_cast<uint2*>(frag)[q * 32 + lane] = make_uint2(f[q][0], f[q][1]);
                        if (lane == 0) *reinterpret_cast<float*>(frag + KH * 256) = bias_of<T, EPI>(e, in.c);
                        if (in.c + 1 < a.c) band_taps<T, KH, KW>(w + (long long)(in.c + 1) * (KH * KW), lane, taps);
                        __syncwarp();
                    }
                }
            };
#if __CUDA_ARCH__ >= 900
            if (!PLANES && lane != 0) return;
            // Output depth q of the chunk, once every tile warp has staged it.
            auto store_depth = [&](int q) {
                const unsigned b = (unsigned)q % OST;
                mbar_wait(staged + 8 * b, ((unsigned)q / OST) & 1);
                tma_store_4d(&maps.output, ring + STAGE_OFFSET + b * STAGE_BYTES, box0, band0 * 16, d0 + q, (int)nc);
                mbar_arrive(stage_free + 8 * b);
            };
            for (int s = 0; s < steps; ++s) {
                if (use > 0) mbar_wait(empty + 8 * cur, (use - 1) & 1);
                put_fragments(s);
                const int zd = PLANES ? in.d : d0 + s - a.pd;
                const int znc = PLANES ? in.n * (int)a.c + in.c : (int)nc;
                if constexpr (PLANES) in.next(a);
                if (PLANES && lane != 0) {
                    // (lane 0 copies the slice; the others hand over their fragments)
                    mbar_arrive(full + 8 * cur);
                } else if (zd >= 0 && zd < a.id) {
                    mbar_expect_tx(full + 8 * cur, SLICE_BYTES);
                    tma_load_4d(ring + (unsigned)(cur * SLOT_BYTES), &maps.input, col0 * 8 - P, band0 * 16 - a.ph, zd,
                                 znc, full + 8 * cur);
                } else {
                    mbar_arrive(full + 8 * cur);
                }
                if (++cur == NBUF) {
                    cur = 0;
                    ++use;
                }
                // The tile warps have finished step s - NBUF (its slot was free), so the
                // depth that step completed is staged: this wait does not block.
                if (!PLANES && tma_out && s - NBUF - (KD - 1) >= 0) store_depth(s - NBUF - (KD - 1));
            }
            if (!PLANES && tma_out) {
                for (int q = max(steps - NBUF - (KD - 1), 0); q < d1 - d0; ++q) store_depth(q);
                asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
            }
#else
            for (int s = 0; s < steps; ++s) {
                if (use > 0) mbar_wait(empty + 8 * cur, (use - 1) & 1);
                if constexpr (PLANES) {
                    put_fragments(s);
                    mbar_arrive(full + 8 * cur);
                }
                const int zd = PLANES ? in.d : d0 + s - a.pd;
                const long long zplane = PLANES ? in.plane(a) : 0;
                if constexpr (PLANES) in.next(a);
                if (zd >= 0 && zd < a.id) {
                    const T* slice = PLANES ? x + zplane * a.ih * a.iw : xin + (long long)zd * a.ih * a.iw;
                    const unsigned buf = ring + (unsigned)(cur * SLOT_BYTES);
#pragma unroll 4
                    for (int j = lane; j < HS * PIECES; j += 32) {
                        const int r = j / PIECES, k = j - r * PIECES;
                        const int gh = band0 * 16 + r - a.ph, gw = (col0 + k) * 8 - P;
                        const bool ok = gh >= 0 && gh < a.ih && gw >= 0 && gw < a.iw;
                        cp_async16_zfill(buf + (unsigned)((r * WS + 8 * k) * (int)sizeof(T)),
                                  ok ? slice + (long long)gh * a.iw + gw : slice, ok);
                    }
                }
                mbar_arrive_copies(full + 8 * cur);
                if (++cur == NBUF) {
                    cur = 0;
                    ++use;
                }
            }
            cp_async_wait<0>();
#endif
            return;
        }
        if (!has_tile) return;
        // Slots in turn; where the ring holds whole rounds of KD slices (NBUF a multiple of
        // KD >= 2), a round's slots are base + u, base moving a round at a time, so a step's
        // slot is an immediate offset and only a round updates the ring's state.
        constexpr bool RING_BY_ROUND = KD >= 2 && NBUF % KD == 0;
        int cur = 0, base = 0;
        unsigned parity = 0;
        unsigned round = 0;
        auto consume = [&](int s, int u, bool steady) {
            const int slot = RING_BY_ROUND ? base + u : cur;
            mbar_wait(full + 8 * slot, parity);
            step(s, u, slot, steady, round);
            __syncwarp();
            if (PLANES || lane == 0) mbar_arrive(empty + 8 * slot);
            if (!RING_BY_ROUND && ++cur == NBUF) {
                cur = 0;
                parity ^= 1;
            }
        };
        for (int sb = 0; sb < steps; sb += KD, round ^= 1) {
            if (sb >= KD - 1 && sb + KD <= d1 - d0) {
#pragma unroll
                for (int u = 0; u < KD; ++u) consume(sb + u, u, true);
            } else {
#pragma unroll
                for (int u = 0; u < KD; ++u) {
                    if (sb + u >= steps) break;
                    consume(sb + u, u, false);
                }
            }
            if (RING_BY_ROUND) {
                base += KD;
                if (base == NBUF) {
                    base = 0;
                    parity ^= 1;
                }
            }
        }
    }
    if (!isfinite(probe) && a.flag) *a.flag = a.epoch;
}
