// depth_reuse_cl: depth_reuse.cu's rotation on channels-last (NDHWC) data, in place.
// A block owns (n, one band of 16 output rows, a chunk of output depths, 8 channels = one
// 16-byte vector per pixel, a region of COLS 8-wide tiles); one warp per (channel, tile)
// keeps KD rotating accumulators, so each input slice is read, transposed and loaded as
// A fragments once for all KD output depths it reaches (streaming_cl reads it KD times).
// The slice ring holds two channel-major slices ([channel][row][column], as streaming_cl)
// of just the region: step s loads slice s + 1's pixel vectors into registers first, runs
// slice s's MMAs while they arrive, then stores them transposed into the other buffer.
// A finished depth is staged channel-major (two stages) and leaves after the step's one
// barrier as 16-byte pixel vectors. Every fill writes every cell (zeros outside).
// Stride 1, dilation 1, KW <= 9, C a multiple of 8; T is bf16 or f16.
template <typename T, int KD, int KH, int KW, int COLS, int DCHUNK, int MINB, int EPI>
__global__ void __launch_bounds__(8 * COLS * 32, MINB) depth_reuse_cl_dwconv(ConvArgs a, EpiArgs e) {
    constexpr int CG = 8;                    // channels of one 16-byte vector
    constexpr int HS = 16 + KH - 1;          // slice rows
    constexpr int PIX = (COLS + 1) * 8;      // slice columns filled (8 halo columns)
    constexpr int WS = tc_row_stride(COLS);  // >= PIX, odd 16-byte chunks: no ldmatrix conflicts
    constexpr int PLANE = HS * WS;           // one channel of one slice
    constexpr int SLICE = CG * PLANE;
    constexpr int PAIRS = HS * PIX / 2;      // pixel pairs a fill moves
    constexpr int THREADS = CG * COLS * 32;
    constexpr int U = (PAIRS + THREADS - 1) / THREADS;  // pairs per thread
    // Stage row stride: a warp stores 8 rows x 4 words of its tile, so rows must land on
    // distinct 4-bank groups (8 elements for one column; 8 more otherwise). ncu measured
    // 24% of shared wavefronts as conflicts with COLS * 8 + 2 (docs/perf.md, run 42).
    constexpr int SW = COLS == 1 ? 8 : COLS * 8 + 8;
    constexpr int SP = 16 * SW;              // one channel of a stage
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* ring = reinterpret_cast<T*>(smem_raw);
    T* stages = ring + 2 * SLICE;
    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ w = static_cast<const T*>(a.w);
    T* __restrict__ y = static_cast<T*>(a.y);
    const int P = (a.pw + 7) & ~7, S = P - a.pw;
    const int mt = (a.oh + 15) / 16, nt = (a.ow + S + 7) / 8;
    const int col_regions = (nt + COLS - 1) / COLS;
    const int groups = (int)(a.c / CG);
    const int chunks = (a.od + DCHUNK - 1) / DCHUNK;
    const int per_chunk = (a.od + chunks - 1) / chunks;  // balanced chunks
    long long b = blockIdx.x;
    const int g = (int)(b % groups);  // fastest: neighbours share 32-byte sectors in L2
    b /= groups;
    const int col0 = (int)(b % col_regions) * COLS;
    b /= col_regions;
    const int d0 = (int)(b % chunks) * per_chunk;
    b /= chunks;
    const int h0 = (int)(b % mt) * 16;
    const long long n = b / mt;
    const int d1 = min(d0 + per_chunk, a.od);
    const long long c0 = (long long)g * CG;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int ch = warp / COLS, tj = warp - ch * COLS;
    const bool has_tile = col0 + tj < nt;
    const int steps = d1 - d0 + KD - 1;

    // Slice of step s (padded depth d0 + s): its pixel pairs into registers, then (after
    // the MMAs) transposed into a buffer. Pair e covers slice columns 2e', 2e' + 1 of row r.
    uint4 v[U][2];
    auto load = [&](int s) {
        const int zd = d0 + s - a.pd;
        const bool din = s < steps && zd >= 0 && zd < a.id;
#pragma unroll
        for (int k = 0; k < U; ++k) {
            const int e = 2 * (k * THREADS + (int)threadIdx.x);
            const int r = e / PIX, col = e - r * PIX;
            const int zh = h0 - a.ph + r;
            const bool row_in = e < HS * PIX && din && zh >= 0 && zh < a.ih;
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int zw = 8 * col0 + col + i - P;
                v[k][i] = make_uint4(0u, 0u, 0u, 0u);
                if (row_in && zw >= 0 && zw < a.iw)
                    v[k][i] = __ldg(reinterpret_cast<const uint4*>(
                        x + (((n * a.id + zd) * a.ih + zh) * (long long)a.iw + zw) * a.c + c0));
            }
        }
    };
    auto store = [&](int buffer) {
        T* buf = ring + buffer * SLICE;
#pragma unroll
        for (int k = 0; k < U; ++k) {
            const int e = 2 * (k * THREADS + (int)threadIdx.x);
            if (e >= HS * PIX) continue;
            const int r = e / PIX, col = e - r * PIX;
            const T* e0 = reinterpret_cast<const T*>(&v[k][0]);
            const T* e1 = reinterpret_cast<const T*>(&v[k][1]);
#pragma unroll
            for (int q = 0; q < CG; ++q)
                *reinterpret_cast<unsigned*>(buf + q * PLANE + r * WS + col) = pack2(e0[q], e1[q]);
        }
    };
    // The depth staged in stage `st` leaves as pixel vectors: two neighbouring columns
    // per thread (stage column sc = output column + S - 8 * col0).
    auto write_out = [&](int od, int st) {
        const T* stage = stages + st * CG * SP;
        const int rows = min(16, a.oh - h0);
        constexpr int CPAIRS = COLS * 4;
        for (int p = threadIdx.x; p < rows * CPAIRS; p += THREADS) {
            const int r = p / CPAIRS, sc = 2 * (p - r * CPAIRS);
            uint4 o[2];
            T* e0 = reinterpret_cast<T*>(&o[0]);
            T* e1 = reinterpret_cast<T*>(&o[1]);
#pragma unroll
            for (int q = 0; q < CG; ++q) {
                const unsigned u = *reinterpret_cast<const unsigned*>(stage + q * SP + r * SW + sc);
                const unsigned short lo = (unsigned short)(u & 0xffffu), hi = (unsigned short)(u >> 16);
                e0[q] = *reinterpret_cast<const T*>(&lo);
                e1[q] = *reinterpret_cast<const T*>(&hi);
            }
            T* out = y + (((n * a.od + od) * a.oh + h0 + r) * (long long)a.ow) * a.c + c0;
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int col = 8 * col0 + sc + i - S;
                if (col >= 0 && col < a.ow) *reinterpret_cast<uint4*>(out + (long long)col * a.c) = o[i];
            }
        }
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

    load(0);
    store(0);
    __syncthreads();
    // As in depth_reuse.cu: steps KD at a time, so depth d0 + s - kd's accumulator
    // (u - kd) mod KD is a compile-time index.
    for (int sb = 0; sb < steps; sb += KD) {
#pragma unroll
        for (int u = 0; u < KD; ++u) {
            const int s = sb + u;
            if (s >= steps) break;
            const int cur = s & 1;
            if (s + 1 < steps) load(s + 1);
            const bool finishes = s >= KD - 1;  // depth d0 + s - KD + 1 has had all its slices
            if (has_tile) {
                rotate_slice<T, KD, KH>(lane_addr + (unsigned)(cur * SLICE * (int)sizeof(T)), WS * sizeof(T), s, u, d1 - d0, bf, acc);
                if (finishes) {
                    float* done = acc[(u + 1) % KD];
                    probe_fragment(probe, done);
                    epilogue_fragment_cl<T, EPI>(a, e, done, c0 + ch, bias, n, d0 + s - (KD - 1), h0,
                                                 8 * (col0 + tj) + 2 * (lane & 3) - S, lane);
                    T* st = stages + (s & 1) * CG * SP + ch * SP + (lane >> 2) * SW + tj * 8 + 2 * (lane & 3);
                    *reinterpret_cast<unsigned*>(st) = pack2(from_f32<T>(done[0]), from_f32<T>(done[1]));
                    *reinterpret_cast<unsigned*>(st + 8 * SW) = pack2(from_f32<T>(done[2]), from_f32<T>(done[3]));
                    done[0] = done[1] = done[2] = done[3] = 0.f;
                }
            }
            // Buffer cur ^ 1 was last read at step s - 1, before the barrier that ended it.
            if (s + 1 < steps) store(cur ^ 1);
            __syncthreads();
            if (finishes) write_out(d0 + s - (KD - 1), s & 1);
        }
    }
    if (!isfinite(probe) && a.flag) *a.flag = a.epoch;
}
