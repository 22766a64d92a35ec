// streaming_cl: the streaming tensor-core formulation on channels-last (NDHWC) data, read
// and written in place (no transpose pass around the kernel). A block owns (n, one band
// of 16 output rows, a chunk of DCHUNK output depths, 8 channels = one 16-byte vector per
// pixel) and slides along depth over a ring of KD + 1 input slices in shared memory, stored
// channel-major ([channel][row][column]) so the banded tiles read them with ldmatrix as in
// streaming.cu. The fill transposes: a thread loads one pixel's 8 channels as a 16-byte
// vector (two neighbouring pixels per thread, each channel's pair one 4-byte store).
// Outputs go back the same way: accumulators are staged channel-major, then leave as one
// 16-byte vector per pixel. Every fill writes every cell (zeros outside the input).
// Warps: WPC per channel, each a run of up to SEG tiles of the band (nt <= WPC * SEG).
// OSTAGES output stages: 2 let a depth's write-out overlap the next depth's tiles; 1
// (wide rows, where two do not fit in shared memory) costs a barrier.
// Stride 1, dilation 1, KW <= 9, C a multiple of 8; T is bf16 or f16.
template <typename T, int KD, int KH, int KW, int WPC, int SEG, int DCHUNK, int OSTAGES, int EPI>
__global__ void __launch_bounds__(8 * WPC * 32) streaming_cl_dwconv(ConvArgs a, EpiArgs e) {
    constexpr int CG = 8;  // channels of one 16-byte vector
    constexpr int U = 2;   // fill pixel pairs in flight per thread (4: spills at 1024 threads)
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* ring = reinterpret_cast<T*>(smem_raw);
    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ w = static_cast<const T*>(a.w);
    T* __restrict__ y = static_cast<T*>(a.y);
    const int P = (a.pw + 7) & ~7, S = P - a.pw;
    const int nt = (a.ow + S + 7) / 8;
    const int ws = tc_row_stride(nt);
    const int plane = (16 + KH - 1) * ws;  // one channel of one slice
    const int slice = CG * plane;
    const int groups = (int)(a.c / CG);
    const int chunks = (a.od + DCHUNK - 1) / DCHUNK;
    const int mt = (a.oh + 15) / 16;
    long long b = blockIdx.x;
    const int g = (int)(b % groups);  // fastest: neighbours share 32-byte sectors in L2
    b /= groups;
    const int d0 = (int)(b % chunks) * DCHUNK;
    b /= chunks;
    const int h0 = (int)(b % mt) * 16;
    const long long n = b / mt;
    const int d1 = min(d0 + DCHUNK, a.od);
    const long long c0 = (long long)g * CG;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int ch = warp / WPC, j0 = (warp % WPC) * SEG, nrun = max(0, min(SEG, nt - j0));

    constexpr int NBUF = KD + 1;  // KD slices in use, one filling
    // Padded depth z (input depth z - pd) into buffer z % NBUF. A thread takes two
    // neighbouring cells of a row (ws is even) and writes each channel's pair as one
    // 4-byte store.
    auto fill = [&](int z) {
        T* buf = ring + (z % NBUF) * slice;
        const int zd = z - a.pd;
        const bool din = zd >= 0 && zd < a.id;
        for (int base = 0; base < plane; base += 2 * U * blockDim.x) {
            uint4 v[U][2];
#pragma unroll
            for (int k = 0; k < U; ++k) {
                const int e = base + 2 * (k * blockDim.x + threadIdx.x);
                const int r = e / ws, col = e - r * ws;
                const int zh = h0 - a.ph + r;
                const bool row_in = e < plane && din && zh >= 0 && zh < a.ih;
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    const int zw = col + i - P;
                    v[k][i] = make_uint4(0u, 0u, 0u, 0u);
                    if (row_in && zw >= 0 && zw < a.iw)
                        v[k][i] = __ldg(reinterpret_cast<const uint4*>(
                            x + (((n * a.id + zd) * a.ih + zh) * (long long)a.iw + zw) * a.c + c0));
                }
            }
#pragma unroll
            for (int k = 0; k < U; ++k) {
                const int e = base + 2 * (k * blockDim.x + threadIdx.x);
                if (e >= plane) continue;
                const T* e0 = reinterpret_cast<const T*>(&v[k][0]);
                const T* e1 = reinterpret_cast<const T*>(&v[k][1]);
#pragma unroll
                for (int q = 0; q < CG; ++q)
                    *reinterpret_cast<unsigned*>(buf + q * plane + e) = pack2(e0[q], e1[q]);
            }
        }
    };

    unsigned bf[KD * KH][2];
    band_fragments<T, KD * KH, KW>(w + (c0 + ch) * (KD * KH * KW), lane, bf);
    const float bias = bias_of<T, EPI>(e, c0 + ch);
    for (int z = d0; z < d0 + KD; ++z) fill(z);
    __syncthreads();
    const unsigned row_bytes = ws * sizeof(T), slice_bytes = slice * sizeof(T);
    const unsigned row0 = (unsigned)__cvta_generic_to_shared(ring) +
                          (unsigned)((ch * plane + (lane & 15) * ws) * (int)sizeof(T));
    // Outputs are staged channel-major ([channel][16 rows][ws]) in OSTAGES buffers after the
    // ring and leave one depth later, two neighbouring columns per thread (4-byte reads
    // from an even column; output column = stage column - S).
    T* stages = ring + NBUF * slice;
    const int sp = 16 * ws;  // one channel of a stage
    auto write_out = [&](int od) {
        const T* stage = stages + (od % OSTAGES) * CG * sp;
        const int rows = min(16, a.oh - h0);
        const int c_lo = S & ~1, pairs = (S + a.ow - c_lo + 1) / 2;
        for (int p = threadIdx.x; p < rows * pairs; p += blockDim.x) {
            const int r = p / pairs, sc = c_lo + 2 * (p - r * pairs);
            const T* s = stage + r * ws + sc;
            uint4 v[2];
            unpack_pixel_pair(s, sp, v);
            T* out = y + (((n * a.od + od) * a.oh + h0 + r) * (long long)a.ow) * a.c + c0;
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int col = sc + i - S;
                if (col >= 0 && col < a.ow) *reinterpret_cast<uint4*>(out + (long long)col * a.c) = v[i];
            }
        }
    };
    // One barrier per depth: within a depth a warp writes out the previous depth, fills
    // the slice after next into the buffer the previous depth consumed, runs its tiles
    // and stages them; warps at different steps overlap memory and tensor work.
    float probe = 0.f;
    for (int od = d0; od < d1; ++od) {
        if (od > d0) write_out(od - 1);
        if (od + 1 < d1) fill(od + KD);
        float acc[SEG][4];
        band_run<T, KD * KH, SEG>(
            [&](int q) {
                const int kd = q / KH, kh = q % KH;
                return row0 + ((od + kd) % NBUF) * slice_bytes + kh * row_bytes;
            },
            j0, nrun, bf, acc);
        // One stage (when two do not fit): every thread's write-out of the previous
        // depth must be done before this depth's outputs overwrite it.
        if constexpr (OSTAGES == 1) __syncthreads();
        T* stage = stages + (od % OSTAGES) * CG * sp + ch * sp;
#pragma unroll
        for (int j = 0; j < SEG; ++j) {
            if (j >= nrun) continue;
            probe_fragment(probe, acc[j]);
            const int col = 8 * (j0 + j) + 2 * (lane & 3), row = lane >> 2;
            epilogue_fragment_cl<T, EPI>(a, e, acc[j], c0 + ch, bias, n, od, h0, col - S, lane);
            T* s = stage + row * ws + col;
            *reinterpret_cast<unsigned*>(s) = pack2(from_f32<T>(acc[j][0]), from_f32<T>(acc[j][1]));
            *reinterpret_cast<unsigned*>(s + 8 * ws) =
                pack2(from_f32<T>(acc[j][2]), from_f32<T>(acc[j][3]));
        }
        __syncthreads();
    }
    write_out(d1 - 1);
    if (!isfinite(probe) && a.flag) *a.flag = a.epoch;
}
