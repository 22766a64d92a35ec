// streaming: the tensor_core formulation with blocks that slide along depth, reading
// each input slice once and using each A fragment for every output depth it feeds.
// A block owns (n, c, a chunk of DCHUNK output depths). Input slices (zero-padded in H
// and W) stream through a ring of STAGES + 1 shared-memory buffers by 16-byte
// cp.async.cg, STAGES slices ahead of use. For the slice in hand, a warp loads the A
// fragment of each (tile, kh) once with ldmatrix and adds it into the accumulators of
// all KD output depths that slice contributes to (accumulator slots rotate with depth,
// unrolled by KD so every slot index is a compile-time constant); an output depth is
// stored when its last slice has been added. Each warp owns TPW 16x8 output tiles.
// To make both the 16-byte copies and the ldmatrix rows aligned, input column 0 sits at
// tile column P = pw rounded up to 8 and the 8-wide output tiles start at w0 = 8j - S,
// S = P - pw (outputs left of column 0 are masked). Padding rows and columns are zeroed
// once; depth padding is zeroed when its slice comes round.
// Stride 1, dilation 1, KW <= 9, input width a multiple of 8; T is bf16 or f16.

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

template <typename T, int KD, int KH, int KW, int WARPS, int DCHUNK, int STAGES, int TPW>
__global__ void __launch_bounds__(WARPS * 32) streaming_dwconv(ConvArgs a) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* ring = reinterpret_cast<T*>(smem_raw);
    constexpr int NBUF = STAGES + 1;
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
    const int dlen = min(DCHUNK, a.od - d0);
    const int nslices = dlen + KD - 1;
    const long long nc = b / chunks;
    const long long c = nc % a.c;
    const T* xin = x + nc * (long long)a.id * a.ih * a.iw;
    T* yplane = y + nc * (long long)a.od * a.oh * a.ow;
    const T zero = from_f32<T>(0.f);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    for (int i = threadIdx.x; i < NBUF * slice; i += blockDim.x) ring[i] = zero;
    __syncthreads();

    const unsigned ring_base = (unsigned)__cvta_generic_to_shared(ring);
    const int chunks16 = a.iw / 8;
    // Fetches the block's slice s (padded depth d0 + s) into buffer s % NBUF; past the
    // last slice it commits an empty group, so every step commits exactly one.
    auto fetch = [&](int s) {
        if (s < nslices) {
            const int zd = d0 + s - a.pd;
            const bool inside = zd >= 0 && zd < a.id;
            T* buf = ring + (s % NBUF) * slice;
            for (int j = threadIdx.x; j < a.ih * chunks16; j += blockDim.x) {
                const int r = j / chunks16, k = j - r * chunks16;
                const int off = (r + a.ph) * ws + P + 8 * k;
                if (inside)
                    cp_async16(ring_base + (unsigned)(((s % NBUF) * slice + off) * (int)sizeof(T)),
                               xin + ((long long)zd * a.ih + r) * a.iw + 8 * k);
                else
                    *reinterpret_cast<uint4*>(buf + off) = make_uint4(0u, 0u, 0u, 0u);
            }
        }
        cp_async_commit();
    };

    unsigned bf[KD * KH][2];
    {
        const int n = lane >> 2, k0 = (lane & 3) * 2;
        const T* wc = w + c * (KD * KH * KW);
#pragma unroll
        for (int q = 0; q < KD * KH; ++q) {
            T e[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int tap = k0 + (j & 1) + (j >> 1) * 8 - n;
                e[j] = (tap >= 0 && tap < KW) ? wc[q * KW + tap] : zero;
            }
            bf[q][0] = pack2(e[0], e[1]);
            bf[q][1] = pack2(e[2], e[3]);
        }
    }

    float acc[TPW][KD][4];
#pragma unroll
    for (int i = 0; i < TPW; ++i)
#pragma unroll
        for (int k = 0; k < KD; ++k)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][k][e] = 0.f;

    for (int k = 0; k < STAGES; ++k) fetch(k);
    const int mat = lane >> 3;
    const int arow = (lane & 7) + ((mat & 1) << 3);
    const int acol = (mat >> 1) << 3;
    const int tiles = mt * nt;
    for (int sb = 0; sb < nslices; sb += KD) {
#pragma unroll
        for (int u = 0; u < KD; ++u) {
            const int s = sb + u;
            if (s >= nslices) break;
            fetch(s + STAGES);
            cp_async_wait<STAGES>();  // slices up to s have landed
            __syncthreads();
            const unsigned buf_base = ring_base + (unsigned)((s % NBUF) * slice * (int)sizeof(T));
#pragma unroll
            for (int i = 0; i < TPW; ++i) {
                const int t = warp + i * WARPS;
                if (t >= tiles) continue;
                const int h0 = (t / nt) * 16, tcol = (t % nt) * 8;
#pragma unroll
                for (int kh = 0; kh < KH; ++kh) {
                    const unsigned addr =
                        buf_base + (unsigned)(((h0 + arow + kh) * ws + tcol + acol) * (int)sizeof(T));
                    unsigned af[4];
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                                 : "=r"(af[0]), "=r"(af[1]), "=r"(af[2]), "=r"(af[3])
                                 : "r"(addr));
#pragma unroll
                    for (int kd = 0; kd < KD; ++kd) {
                        const int q = s - kd;  // output depth (block-local) this slice feeds via kd
                        if (q >= 0 && q < dlen) Mma<T>::run(acc[i][(u - kd + KD) % KD], af, bf[kd * KH + kh]);
                    }
                }
            }
            const int q = s - (KD - 1);  // its last slice was this one
            if (q >= 0 && q < dlen) {
                T* yout = yplane + (long long)(d0 + q) * a.oh * a.ow;
#pragma unroll
                for (int i = 0; i < TPW; ++i) {
                    const int t = warp + i * WARPS;
                    float* slot = acc[i][(u - (KD - 1) + KD) % KD];
                    if (t < tiles) store_c_fragment(yout, slot, (t / nt) * 16, (t % nt) * 8 - S, lane, a);
#pragma unroll
                    for (int e = 0; e < 4; ++e) slot[e] = 0.f;
                }
            }
            __syncthreads();  // buffer s % NBUF is refilled STAGES steps later
        }
    }
    cp_async_wait<0>();
}
