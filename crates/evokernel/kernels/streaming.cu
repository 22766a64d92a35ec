// streaming: the tensor_core formulation with blocks that slide along output depth.
// A block owns (n, c, a chunk of DCHUNK output depths) and keeps a ring of KD + 1 padded
// input slices in shared memory: each slice is fetched from global memory once per
// block (cp.async, 4-byte pieces), STAGES slices ahead of the tensor-core work of
// output depth od. Rows and columns of padding are zeroed once and never
// written again; depth padding is zeroed when its slice comes round.
// Stride 1, dilation 1, KW <= 9, even W padding and width (cp.async alignment); T is
// bf16 or f16. Mma, pack2 and tc_row_stride are in common.cuh.

__device__ __forceinline__ void cp_async4(unsigned dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

template <typename T, int KD, int KH, int KW, int WARPS, int DCHUNK, int STAGES>
__global__ void __launch_bounds__(WARPS * 32) streaming_dwconv(ConvArgs a) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* ring = reinterpret_cast<T*>(smem_raw);
    constexpr int NBUF = KD + STAGES;  // KD slices in use, STAGES in flight
    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ w = static_cast<const T*>(a.w);
    T* __restrict__ y = static_cast<T*>(a.y);
    const int mt = (a.oh + 15) / 16, nt = (a.ow + 7) / 8;
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
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    for (int i = threadIdx.x; i < NBUF * slice; i += blockDim.x) ring[i] = zero;
    __syncthreads();

    const unsigned ring_base = (unsigned)__cvta_generic_to_shared(ring);
    const int pairs = a.iw / 2;
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
        for (int j = threadIdx.x; j < a.ih * pairs; j += blockDim.x) {
            const int r = j / pairs, k = j - r * pairs;
            const int off = (r + a.ph) * ws + a.pw + 2 * k;
            if (inside) {
                cp_async4(ring_base + (unsigned)(((z % NBUF) * slice + off) * (int)sizeof(T)),
                          xin + ((long long)zd * a.ih + r) * a.iw + 2 * k);
            } else {
                buf[off] = zero;
                buf[off + 1] = zero;
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

    for (int k = 0; k < KD + STAGES - 1; ++k) fetch(d0 + k);
    const int mat = lane >> 3;
    const int arow = (lane & 7) + ((mat & 1) << 3);
    const int acol = (mat >> 1) << 3;
    for (int od = d0; od < d1; ++od) {
        fetch(od + KD + STAGES - 1);
        cp_async_wait<STAGES>();  // slices up to od + KD - 1 have landed
        __syncthreads();
        T* yout = y + (nc * a.od + od) * (long long)a.oh * a.ow;
        for (int t = warp; t < mt * nt; t += WARPS) {
            const int h0 = (t / nt) * 16, w0 = (t % nt) * 8;
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int kd = 0; kd < KD; ++kd) {
                const int buf = (od + kd) % NBUF;
#pragma unroll
                for (int kh = 0; kh < KH; ++kh) {
                    const unsigned addr = ring_base +
                        (unsigned)((buf * slice + (h0 + arow + kh) * ws + w0 + acol) * (int)sizeof(T));
                    unsigned af[4];
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                                 : "=r"(af[0]), "=r"(af[1]), "=r"(af[2]), "=r"(af[3])
                                 : "r"(addr));
                    Mma<T>::run(acc, af, bf[kd * KH + kh]);
                }
            }
            store_c_fragment(yout, acc, h0, w0, lane, a);
        }
        __syncthreads();
    }
    cp_async_wait<0>();
}
