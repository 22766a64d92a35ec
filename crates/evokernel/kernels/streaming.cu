// streaming: the tensor_core formulation with blocks that slide along output depth.
// A block owns (n, c, a chunk of DCHUNK output depths) and keeps a ring of KD + STAGES
// padded input slices in shared memory: each slice is fetched from global memory once
// per block, STAGES slices ahead of the tensor-core work of output depth od, by 16-byte
// cp.async.cg (L2 only, no L1 traffic). To make both those copies and ldmatrix rows
// 16-byte aligned, input column 0 sits at tile column P = pw rounded up to 8, and the
// 8-wide output tiles start at w0 = 8j - S with S = P - pw (the first may begin left of
// column 0; those outputs are masked). Rows and columns of padding are zeroed once and
// never written again; depth padding is zeroed when its slice comes round.
// Warps sweep runs of SEG tiles along a 16-row band (band_run: half the ldmatrix reads).
// Stride 1, dilation 1, KW <= 9, input width a multiple of 8; T is bf16 or f16.

template <typename T, int KD, int KH, int KW, int WARPS, int DCHUNK, int STAGES, int SEG, int EPI>
__global__ void __launch_bounds__(WARPS * 32) streaming_dwconv(ConvArgs a, EpiArgs e) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* ring = reinterpret_cast<T*>(smem_raw);
    constexpr int NBUF = KD + STAGES;  // KD slices in use, STAGES in flight
    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ w = static_cast<const T*>(a.w);
    T* __restrict__ y = static_cast<T*>(a.y);
    const int P = (a.pw + 7) & ~7, S = P - a.pw;
    const int mt = (a.oh + 15) / 16, nt = (a.ow + S + 7) / 8;
    const int hs = mt * 16 + KH - 1;
    const int ws = tc_row_stride(nt);
    const int slice = hs * ws;
    const int chunks = (a.od + DCHUNK - 1) / DCHUNK;
    const long long b = blockIdx.x;
    const int d0 = (int)(b % chunks) * DCHUNK;
    const int d1 = min(d0 + DCHUNK, a.od);
    const long long nc = b / chunks;
    const long long c = nc % a.c;
    const T* xin = x + nc * (long long)a.id * a.ih * a.iw;
    const T zero = from_f32<T>(0.f);
    const float bias = bias_of<T, EPI>(e, c);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    for (int i = threadIdx.x; i < NBUF * slice; i += blockDim.x) ring[i] = zero;
    __syncthreads();

    const unsigned ring_base = (unsigned)__cvta_generic_to_shared(ring);
    const int chunks16 = a.iw / 8;  // 16-byte pieces per input row
    // Fetches padded depth z (input depth z - pd) into its ring buffer; past the last
    // slice this block needs it commits an empty group, so every step commits one.
    const int zlast = d1 + KD - 2;
    auto fetch = [&](int z) {
        if (z > zlast) {
            cp_async_commit();
            return;
        }
        T* buf = ring + (z % NBUF) * slice;
        const int zd = z - a.pd;
        const bool inside = zd >= 0 && zd < a.id;
        for (int j = threadIdx.x; j < a.ih * chunks16; j += blockDim.x) {
            const int r = j / chunks16, k = j - r * chunks16;
            const int off = (r + a.ph) * ws + P + 8 * k;
            if (inside) {
                cp_async16(ring_base + (unsigned)(((z % NBUF) * slice + off) * (int)sizeof(T)),
                           xin + ((long long)zd * a.ih + r) * a.iw + 8 * k);
            } else {
                *reinterpret_cast<uint4*>(buf + off) = make_uint4(0u, 0u, 0u, 0u);
            }
        }
        cp_async_commit();
    };

    unsigned bf[KD * KH][2];
    band_fragments<T, KD * KH, KW>(w + c * (KD * KH * KW), lane, bf);

    for (int k = 0; k < KD + STAGES - 1; ++k) fetch(d0 + k);
    float probe = 0.f;
    for (int od = d0; od < d1; ++od) {
        fetch(od + KD + STAGES - 1);
        cp_async_wait<STAGES>();  // slices up to od + KD - 1 have landed
        __syncthreads();
        const long long plane_out = (nc * a.od + od) * (long long)a.oh * a.ow;
        T* yout = y + plane_out;
        if constexpr (SEG == 1) {
            // One tile at a time, one x4 fragment per kernel row: the code of b922b36,
            // kept verbatim since band_run's SEG == 1 path measured 8% slower on the
            // seed (docs/perf.md, run 26).
            const int mat = lane >> 3;
            const int arow = (lane & 7) + ((mat & 1) << 3);
            const int acol = (mat >> 1) << 3;
            for (int t = warp; t < mt * nt; t += WARPS) {
                const int h0 = (t / nt) * 16, tcol = (t % nt) * 8, w0 = tcol - S;
                float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                for (int kd = 0; kd < KD; ++kd) {
                    const int buf = (od + kd) % NBUF;
#pragma unroll
                    for (int kh = 0; kh < KH; ++kh) {
                        const unsigned addr = ring_base +
                            (unsigned)((buf * slice + (h0 + arow + kh) * ws + tcol + acol) * (int)sizeof(T));
                        unsigned af[4];
                        ldmatrix_x4(addr, af);
                        Mma<T>::run(acc, af, bf[kd * KH + kh]);
                    }
                }
                probe_fragment(probe, acc);
                float res[4];
                load_c_residual<T, EPI>(a, e, plane_out, h0, w0, lane, res);
                store_c_fragment<EPI>(yout, acc, h0, w0, lane, a, bias, res);
            }
        } else {
            // Runs of up to SEG tiles along one band; a longer run reuses more window halves
            // (tile reads (SEG + 1) / (2 SEG) of full fragments) but splits work more coarsely.
            const int runs = (nt + SEG - 1) / SEG;
            for (int u = warp; u < mt * runs; u += WARPS) {
                const int h0 = (u / runs) * 16, j0 = (u % runs) * SEG, n = min(SEG, nt - j0);
                const unsigned row0 = ring_base + (unsigned)((h0 + (lane & 15)) * ws * (int)sizeof(T));
                const unsigned row_bytes = ws * sizeof(T), slice_bytes = slice * sizeof(T);
                float acc[SEG][4];
                band_run<T, KD * KH, SEG>(
                    [&](int q) {
                        const int kd = q / KH, kh = q % KH;
                        return row0 + ((od + kd) % NBUF) * slice_bytes + kh * row_bytes;
                    },
                    j0, n, bf, acc);
#pragma unroll
                for (int j = 0; j < SEG; ++j) {
                    if (j < n) {
                        probe_fragment(probe, acc[j]);
                        float res[4];
                        load_c_residual<T, EPI>(a, e, plane_out, h0, 8 * (j0 + j) - S, lane, res);
                        store_c_fragment<EPI>(yout, acc[j], h0, 8 * (j0 + j) - S, lane, a, bias, res);
                    }
                }
            }
        }
        __syncthreads();
    }
    cp_async_wait<0>();
    if (!isfinite(probe) && a.flag) *a.flag = a.epoch;
}
