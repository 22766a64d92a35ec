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

template <typename T, int KD, int KH, int KW, int BANDS, int COLS, int DCHUNK, int STAGES, int MINB, int EPI>
__global__ void __launch_bounds__(BANDS * COLS * 32, MINB) depth_reuse_dwconv(ConvArgs a, EpiArgs e) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    constexpr int HS = BANDS * 16 + KH - 1;  // slice rows: the region's bands and their halo
    constexpr int PIECES = COLS + 1;         // 16-byte pieces per slice row (8 halo columns)
    constexpr int WS = tc_row_stride(COLS);
    constexpr int SLICE_BYTES = HS * WS * (int)sizeof(T);
    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ w = static_cast<const T*>(a.w);
    T* __restrict__ y = static_cast<T*>(a.y);
    const int P = (a.pw + 7) & ~7, S = P - a.pw;
    const int mt = (a.oh + 15) / 16, nt = (a.ow + S + 7) / 8;
    const int col_regions = (nt + COLS - 1) / COLS;
    const int regions = ((mt + BANDS - 1) / BANDS) * col_regions;
    const int chunks = (a.od + DCHUNK - 1) / DCHUNK;
    // Regions vary fastest so neighbours sharing halo rows run together (L2 hits).
    const long long b = blockIdx.x;
    const int region = (int)(b % regions);
    const int per_chunk = (a.od + chunks - 1) / chunks;  // balanced: 33 = 11 + 11 + 11, not 16 + 16 + 1
    const int d0 = (int)((b / regions) % chunks) * per_chunk;
    const int d1 = min(d0 + per_chunk, a.od);
    const long long nc = b / ((long long)regions * chunks);
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
    band_fragments<T, KD * KH, KW>(w + c * (KD * KH * KW), lane, bf);

    // This warp's tile: band tb, column tj of the region.
    const int tb = warp / COLS, tj = warp - tb * COLS;
    const bool has_tile = band0 + tb < mt && col0 + tj < nt;
    const int h0 = (band0 + tb) * 16, w0 = (col0 + tj) * 8 - S;
    const int mat = lane >> 3;
    const int arow = (lane & 7) + ((mat & 1) << 3), acol = (mat >> 1) << 3;
    const unsigned lane_addr = ring + (unsigned)(((tb * 16 + arow) * WS + tj * 8 + acol) * (int)sizeof(T));
    const long long plane = (long long)a.oh * a.ow;

    const float bias = bias_of<T, EPI>(e, c);
    float acc[KD][4];
#pragma unroll
    for (int q = 0; q < KD; ++q) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.f;
    float probe = 0.f;
    // At step s, depth d0 + s - kd sits in accumulator slot (u - kd) mod KD (walk_slices).
    walk_slices<KD, STAGES>(steps, fetch, [&](int s, int u, int cur) {
        if (has_tile) {
            // Depth d0 + s - KD + 1 completes in this step: its residuals load first, so
            // their latency hides behind the slice's MMAs.
            const long long plane_out = (nc * a.od + d0 + s - (KD - 1)) * plane;
            float res[4];
            if (s >= KD - 1) load_c_residual<T, EPI>(a, e, plane_out, h0, w0, lane, res);
            rotate_slice<T, KD, KH>(lane_addr + (unsigned)(cur * SLICE_BYTES), WS * sizeof(T), s, u, d1 - d0, bf, acc);
            if (s >= KD - 1) {  // depth d0 + s - KD + 1 has had all its slices
                float* done = acc[(u + 1) % KD];
                probe_fragment(probe, done);
                store_c_fragment<EPI>(y + plane_out, done, h0, w0, lane, a, bias, res);
                done[0] = done[1] = done[2] = done[3] = 0.f;
            }
        }
    });
    if (!isfinite(probe) && a.flag) *a.flag = a.epoch;
}
