// Shared by every evokernel kernel: the argument block (mirrored by `ConvArgs` in
// src/cuda/mod.rs; keep the two in the same order) and dtype conversions.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

struct ConvArgs {
    const void* x;   // input, NCDHW or NDHWC
    const void* w;   // weight [C, 1, KD, KH, KW]
    void* y;         // output, same layout as the input
    long long n, c;
    int id, ih, iw;  // input spatial sizes (leading 1s below 3-D)
    int od, oh, ow;  // output spatial sizes
    int kd, kh, kw;
    int sd, sh, sw;  // strides
    int dd, dh, dw;  // dilations
    int pd, ph, pw;  // padding before (padding after is implied by the output size)
    unsigned* flag;  // tensor-core kernels write `epoch` here when an output is not finite
    unsigned epoch;  // this launch's number (see repair.cu)
};

// The fused epilogue's operands (mirrored by `EpiArgs` in src/cuda/mod.rs), every
// kernel's second parameter. Not in ConvArgs: growing that struct past its 128 bytes
// changed ptxas's register allocation of depth_reuse_fma_cl (127 -> 116 registers, 7%
// more instructions, x3d-ndhwc 10% slower) even with no epilogue.
struct EpiArgs {
    const void* bias;      // [C] per-channel bias, or null
    const void* residual;  // a tensor of the output's shape and layout, or null
};

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// The fused epilogue (src/epilogue.rs), the last template argument EPI of every kernel:
// bits 0-1 the activation (0 none, 1 ReLU, 2 SiLU, 3 GELU tanh), bit 2 a per-channel
// bias, bit 3 a residual tensor of the output's shape added after the activation. f32
// math before the one rounding to T; EPI = 0 compiles to the plain store.
// v * sigmoid(z) with one ex2 and one reciprocal on the SFU (an IEEE division cost the
// seed 39% with bias + SiLU). Where 1 + e^-z overflows the quotient is 0, so v = -Inf
// gives -Inf * 0 = NaN, as x / (1 + exp(-x)) does in the oracle and in PyTorch.
// For bf16 outputs one SFU op does: sigmoid(z) = 0.5 + 0.5 tanh(z / 2) with tanh.approx
// (relative error about 2^-11, under bf16's 2^-9 rounding); the SFU's 16 ops per clock
// per SM made two of them per output cost the seed 14% (run 58).
template <typename T> struct IsBf16 { static constexpr bool value = false; };
template <> struct IsBf16<__nv_bfloat16> { static constexpr bool value = true; };

template <typename T>
__device__ __forceinline__ float times_sigmoid(float v, float z) {
    if constexpr (IsBf16<T>::value) {
        float t;
        asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(0.5f * z));
        // tanh.approx(-Inf) is -1: v = -Inf gives -Inf * 0 = NaN as in the oracle.
        return v * fmaf(0.5f, t, 0.5f);
    } else {
        return v * __fdividef(1.f, 1.f + __expf(-z));
    }
}

template <int ACT, typename T>
__device__ __forceinline__ float activate(float v) {
    if constexpr (ACT == 1) {
        return v < 0.f ? 0.f : v;  // NaN stays NaN, as in PyTorch
    } else if constexpr (ACT == 2) {
        return times_sigmoid<T>(v, v);
    } else if constexpr (ACT == 3) {
        // 0.5 v (1 + tanh(u)) = v sigmoid(2u), u = sqrt(2/pi) (v + 0.044715 v^3)
        return times_sigmoid<T>(v, 1.5957691216f * v * fmaf(0.044715f * v, v, 1.f));
    } else {
        return v;
    }
}

// Channel c's bias (0 without one): load it once where a thread's channel is fixed.
template <typename T, int EPI>
__device__ __forceinline__ float bias_of(const EpiArgs& e, long long c) {
    if constexpr ((EPI & 4) != 0) return to_f32(__ldg(static_cast<const T*>(e.bias) + c));
    else return 0.f;
}

// The residual at flat index i (0 without one).
template <typename T, int EPI>
__device__ __forceinline__ float residual_at(const EpiArgs& e, long long i) {
    if constexpr ((EPI & 8) != 0) return to_f32(__ldg(static_cast<const T*>(e.residual) + i));
    else return 0.f;
}

// The epilogue with the bias and residual already loaded; T is the output's type.
template <int EPI, typename T>
__device__ __forceinline__ float finish(float v, float bias, float residual) {
    if constexpr ((EPI & 4) != 0) v += bias;
    v = activate<EPI & 3, T>(v);
    if constexpr ((EPI & 8) != 0) v += residual;
    return v;
}

// Output i (flat index in the output's layout) of channel c.
template <typename T, int EPI>
__device__ __forceinline__ float epilogue(const EpiArgs& e, float v, long long c, long long i) {
    if constexpr (EPI == 0) return v;
    else return finish<EPI, T>(v, bias_of<T, EPI>(e, c), residual_at<T, EPI>(e, i));
}

// N consecutive outputs from flat index i: of one channel c (CSTEP 0, channels-first
// rows) or of channels c, c + 1, ... (CSTEP 1, channels-last pixels).
template <typename T, int EPI, int N, int CSTEP>
__device__ __forceinline__ void epilogue_n(const EpiArgs& e, float* f, long long c, long long i) {
    if constexpr (EPI != 0) {
#pragma unroll
        for (int k = 0; k < N; ++k) f[k] = epilogue<T, EPI>(e, f[k], c + k * CSTEP, i + k);
    }
}

// CV consecutive channels of one channels-last pixel (CV 1, 2 or 4; one 2-, 4-, 8- or
// 16-byte load or store) to floats and back: the channels-last FMA kernels' shared reads
// and output stores.
template <typename T, int CV>
__device__ __forceinline__ void channels_to_f32(const T* p, float* f) {
    if constexpr (CV == 1) {
        f[0] = to_f32(*p);
    } else if constexpr (sizeof(T) == 4) {  // float, CV 2 or 4
        if constexpr (CV == 2) {
            const float2 v = *reinterpret_cast<const float2*>(p);
            f[0] = v.x; f[1] = v.y;
        } else {
            const float4 v = *reinterpret_cast<const float4*>(p);
            f[0] = v.x; f[1] = v.y; f[2] = v.z; f[3] = v.w;
        }
    } else {  // bf16 / f16, CV 2 or 4: one 4- or 8-byte load
        unsigned u[CV / 2];
        if constexpr (CV == 2) {
            u[0] = *reinterpret_cast<const unsigned*>(p);
        } else {
            const uint2 v = *reinterpret_cast<const uint2*>(p);
            u[0] = v.x; u[1] = v.y;
        }
#pragma unroll
        for (int i = 0; i < CV; ++i) f[i] = to_f32(reinterpret_cast<const T*>(u)[i]);
    }
}

template <typename T, int CV>
__device__ __forceinline__ void channels_from_f32(T* p, const float* f) {
    if constexpr (CV == 1) {
        *p = from_f32<T>(f[0]);
    } else if constexpr (sizeof(T) == 4) {
        if constexpr (CV == 2) *reinterpret_cast<float2*>(p) = make_float2(f[0], f[1]);
        else *reinterpret_cast<float4*>(p) = make_float4(f[0], f[1], f[2], f[3]);
    } else {
        T h[CV];
#pragma unroll
        for (int i = 0; i < CV; ++i) h[i] = from_f32<T>(f[i]);
        if constexpr (CV == 2) *reinterpret_cast<unsigned*>(p) = *reinterpret_cast<const unsigned*>(h);
        else *reinterpret_cast<uint2*>(p) = *reinterpret_cast<const uint2*>(h);
    }
}

// A thread's run of OUT_W finished channels-last outputs (CV channels each) stored from
// `out` (pixel stride c; columns past ow_end skipped), the fused epilogue applied, then
// the accumulators zeroed for their next output: the channels-last FMA kernels' store.
// The pixel stride comes through an opaque move: otherwise the compiler keeps OUT_W
// 64-bit output pointers live across the walk (spills on the seed, depth_reuse_fma_cl).
template <typename T, int CV, int OUT_W, int EPI>
__device__ __forceinline__ void store_run_cl(const EpiArgs& e, const T* y, T* out, int ow, int ow_end, long long c,
                                             const float* bias, float (*done)[CV]) {
    int cstride;
    asm volatile("mov.b32 %0, %1;" : "=r"(cstride) : "r"((int)c));
#pragma unroll
    for (int o = 0; o < OUT_W; ++o)
        if (ow + o < ow_end) {
            if constexpr (EPI != 0) {
                float res[CV];
                if constexpr ((EPI & 8) != 0)
                    channels_to_f32<T, CV>(static_cast<const T*>(e.residual) + (out - y) + o * cstride, res);
#pragma unroll
                for (int v = 0; v < CV; ++v) done[o][v] = finish<EPI, T>(done[o][v], bias[v], res[v]);
            }
            channels_from_f32<T, CV>(out + o * cstride, done[o]);
        }
#pragma unroll
    for (int o = 0; o < OUT_W; ++o)
#pragma unroll
        for (int v = 0; v < CV; ++v) done[o][v] = 0.f;
}

// VEC consecutive elements (16 bytes) to floats and back; p must be 16-byte aligned.
template <typename T, int VEC> struct Vec16;
// Eight 16-bit floats packed in 16 bytes, as floats (global and shared loads alike).
__device__ __forceinline__ void unpack8(const uint4& u, __nv_bfloat16, float* f) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) { const float2 t = __bfloat1622float2(h[i]); f[2 * i] = t.x; f[2 * i + 1] = t.y; }
}
__device__ __forceinline__ void unpack8(const uint4& u, __half, float* f) {
    const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) { const float2 t = __half22float2(h[i]); f[2 * i] = t.x; f[2 * i + 1] = t.y; }
}

// 16 raw bytes of T as floats (16 / sizeof(T) of them).
__device__ __forceinline__ void unpack16(const uint4& u, float, float* f) {
    f[0] = __uint_as_float(u.x); f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z); f[3] = __uint_as_float(u.w);
}
template <typename H>
__device__ __forceinline__ void unpack16(const uint4& u, H, float* f) { unpack8(u, H(), f); }

template <> struct Vec16<__nv_bfloat16, 8> {
    static __device__ __forceinline__ void load(const __nv_bfloat16* p, float* f) {
        unpack8(__ldg(reinterpret_cast<const uint4*>(p)), __nv_bfloat16(), f);
    }
    static __device__ __forceinline__ void store(__nv_bfloat16* p, const float* f) {
        uint4 u;
        __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
        for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
        *reinterpret_cast<uint4*>(p) = u;
    }
};
template <> struct Vec16<__half, 8> {
    static __device__ __forceinline__ void load(const __half* p, float* f) {
        unpack8(__ldg(reinterpret_cast<const uint4*>(p)), __half(), f);
    }
    static __device__ __forceinline__ void store(__half* p, const float* f) {
        uint4 u;
        __half2* h = reinterpret_cast<__half2*>(&u);
#pragma unroll
        for (int i = 0; i < 4; ++i) h[i] = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
        *reinterpret_cast<uint4*>(p) = u;
    }
};
template <> struct Vec16<float, 4> {
    static __device__ __forceinline__ void load(const float* p, float* f) {
        float4 v = __ldg(reinterpret_cast<const float4*>(p));
        f[0] = v.x; f[1] = v.y; f[2] = v.z; f[3] = v.w;
    }
    static __device__ __forceinline__ void store(float* p, const float* f) {
        *reinterpret_cast<float4*>(p) = make_float4(f[0], f[1], f[2], f[3]);
    }
};

// One element: channel counts that are not a multiple of the 16-byte vector.
template <typename T> struct Vec16<T, 1> {
    static __device__ __forceinline__ void load(const T* p, float* f) { f[0] = to_f32(p[0]); }
    static __device__ __forceinline__ void store(T* p, const float* f) { p[0] = from_f32<T>(f[0]); }
};

// One 16-byte chunk of shared memory (16 / sizeof(T) elements) as floats; p 16-byte aligned.
__device__ __forceinline__ void shared_chunk_to_f32(const float* p, float* f) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    f[0] = v.x; f[1] = v.y; f[2] = v.z; f[3] = v.w;
}
template <typename H>
__device__ __forceinline__ void shared_chunk_to_f32(const H* p, float* f) {
    unpack8(*reinterpret_cast<const uint4*>(p), H(), f);
}

__device__ __forceinline__ void store_elem(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_elem(float* p, __half v) { *p = __half2float(v); }
__device__ __forceinline__ void store_elem(float* p, __nv_bfloat16 v) { *p = __bfloat162float(v); }
__device__ __forceinline__ void store_elem(__half* p, __half v) { *p = v; }
__device__ __forceinline__ void store_elem(__nv_bfloat16* p, __nv_bfloat16 v) { *p = v; }

// Copies the KD zero-padded input slices a block needs into shared memory: tile row
// (s * hs + r), column col holds input (zd0 + s * dstep, r - ph, col - pw), or 0
// outside. Rows hold the whole input row (ws >= pw + iw).
// Interior rows move as 16-byte vectors when rows are 16-byte aligned, each thread
// issuing all its loads before its stores (several loads in flight instead of one).
template <typename T, typename S, int KD>
__device__ __forceinline__ void fill_slices(const T* __restrict__ xin, S* tile, int zd0, int dstep,
                                            int hs, int ws, const ConvArgs& a) {
    constexpr int VEC = 16 / sizeof(T);
    constexpr int U = 4;
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    // Padding cells: whole rows outside the input, and the left/right margins.
    for (int row = threadIdx.x >> 5; row < KD * hs; row += warps) {
        const int s = row / hs, r = row - s * hs;
        const int zd = zd0 + s * dstep, zh = r - a.ph;
        const bool inside = zd >= 0 && zd < a.id && zh >= 0 && zh < a.ih;
        S* dst = tile + row * ws;
        for (int col = lane; col < ws; col += 32)
            if (!inside || col < a.pw || col >= a.pw + a.iw) dst[col] = S(0.f);
    }
    const bool vec_ok = (a.iw % VEC) == 0;
    const int per_row = vec_ok ? a.iw / VEC : a.iw;
    const int total = KD * hs * per_row;
    for (int base = 0; base < total; base += U * blockDim.x) {
        uint4 v[U];
        T e1[U];
        int dst_off[U];
#pragma unroll
        for (int k = 0; k < U; ++k) {
            dst_off[k] = -1;
            const int j = base + k * blockDim.x + threadIdx.x;
            if (j >= total) continue;
            const int row = j / per_row, chunk = j - row * per_row;
            const int s = row / hs, r = row - s * hs;
            const int zd = zd0 + s * dstep, zh = r - a.ph;
            if (zd < 0 || zd >= a.id || zh < 0 || zh >= a.ih) continue;
            const long long src = ((long long)zd * a.ih + zh) * a.iw + (long long)chunk * (vec_ok ? VEC : 1);
            if (vec_ok) v[k] = __ldg(reinterpret_cast<const uint4*>(xin + src));
            else e1[k] = xin[src];
            dst_off[k] = row * ws + a.pw + chunk * (vec_ok ? VEC : 1);
        }
#pragma unroll
        for (int k = 0; k < U; ++k) {
            if (dst_off[k] < 0) continue;
            if (vec_ok) {
                const T* e = reinterpret_cast<const T*>(&v[k]);
#pragma unroll
                for (int q = 0; q < VEC; ++q) store_elem(tile + dst_off[k] + q, e[q]);
            } else {
                store_elem(tile + dst_off[k], e1[k]);
            }
        }
    }
}

// The work items of the grad-weight tile kernels (wgrad_tile.cu, wgrad_tile_cl.cu): the
// output tiles of TH rows x TW columns of every (n, od), columns fastest, and this block's
// slice [lo, hi) of them (blockIdx.y of gridDim.y).
struct TileItem {
    long long n;
    int od, oh0, ow0;
};
template <int TH, int TW>
struct TileItems {
    int tiles_h, tiles_w;
    long long lo, hi;
    bool narrow;  // 64-bit divisions cost ~70 instructions each: 32-bit ones where items fit
    __device__ __forceinline__ explicit TileItems(const ConvArgs& a) {
        tiles_h = (a.oh + TH - 1) / TH;
        tiles_w = (a.ow + TW - 1) / TW;
        const long long items = a.n * a.od * (long long)tiles_h * tiles_w;
        const int split = blockIdx.y, splits = gridDim.y;
        lo = items * split / splits;
        hi = items * (split + 1) / splits;
        narrow = items < 2147483647LL;
    }
    __device__ __forceinline__ TileItem at(long long it, const ConvArgs& a) const {
        TileItem t;
        int tw, th;
        if (narrow) {
            unsigned r = (unsigned)it;
            tw = (int)(r % (unsigned)tiles_w);
            r /= (unsigned)tiles_w;
            th = (int)(r % (unsigned)tiles_h);
            r /= (unsigned)tiles_h;
            t.od = (int)(r % (unsigned)a.od);
            t.n = r / (unsigned)a.od;
        } else {
            tw = (int)(it % tiles_w);
            long long r = it / tiles_w;
            th = (int)(r % tiles_h);
            r /= tiles_h;
            t.od = (int)(r % a.od);
            t.n = r / a.od;
        }
        t.oh0 = th * TH;
        t.ow0 = tw * TW;
        return t;
    }
};

// Hopper data movement shared by the kernels that use it (depth_reuse.cu, wgrad_mma.cu,
// wgrad_tile_cl.cu, gemm/scaled_mm_wgmma.cu):
// mbarriers, TMA tensor copies and their sm_80 stand-ins.
// A TMA tensor map (CUtensorMap) as a kernel parameter, and the pair a kernel takes as
// its third parameter (Rust: cuda::TmaMaps, same layout): the input's and the
// output-shaped tensor's (y, or grad-output for grad-weight kernels).
struct alignas(64) TmaMap {
    unsigned long long opaque[16];
};
struct TmaMaps {
    TmaMap input, output;
};
// (sm_80 has mbarriers too, with the older forms: no `_` sink, test_wait for try_wait.)
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#else
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    unsigned done = 0;
    do {
#if __CUDA_ARCH__ >= 900
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
#else
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
#endif
    } while (!done);
}
// Two mbarriers of one arrival each at bars and bars + 8 (a kernel's two buffers), set up
// by one thread before any thread waits on them.
__device__ __forceinline__ void mbar_init_pair(unsigned bars, bool leader) {
    if (leader) {
        mbar_init(bars, 1);
        mbar_init(bars + 8, 1);
    }
    __syncthreads();
}
#if __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Generic-proxy writes to shared memory made visible to the TMA unit (async proxy).
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// One box of a [planes][D][H][W] tensor map at column w, row h, depth d of plane nc into
// shared memory at dst (128-byte aligned; a box's first column a multiple of 16 bytes),
// completing bar's transaction bytes. The TMA unit writes zeros where the box leaves
// the tensor, which is a convolution's padding.
__device__ __forceinline__ void tma_load_4d(unsigned dst, const TmaMap* map, int w, int h, int d, int nc, unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(w), "r"(h), "r"(d), "r"(nc), "r"(bar)
        : "memory");
}
// One box of a 5-D tensor map at coordinates (c0, c1, c2, c3, c4), innermost first (a
// channels-last [N][D][H][W][C] tensor: channel, column, row, depth, image), the same way.
__device__ __forceinline__ void tma_load_5d(unsigned dst, const TmaMap* map, int c0, int c1, int c2, int c3, int c4,
                                            unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, %6}], [%7];\n" ::"r"(dst),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar)
        : "memory");
}
// A staged box from shared memory at src to global memory at (w, h, d, nc); the TMA unit
// drops what lies outside the tensor. Returns once all but this thread's PENDING latest
// stores have read their boxes (0: this one too).
template <int PENDING = 0>
__device__ __forceinline__ void tma_store_4d(const TmaMap* map, unsigned src, int w, int h, int d, int nc) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(
                     reinterpret_cast<unsigned long long>(map)),
                 "r"(w), "r"(h), "r"(d), "r"(nc), "r"(src)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    // The caller writes the stage again soon: wait until the store has read it.
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(PENDING) : "memory");
}
#else
// Arrives once this thread's earlier cp.async copies have landed.
__device__ __forceinline__ void mbar_arrive_copies(unsigned bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// 16 bytes, or 16 zero bytes where !ok (src is then not read).
__device__ __forceinline__ void cp_async16_zfill(unsigned dst, const void* src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0));
}
#endif

// Programmatic dependent launch (sm_90 and later; no-ops before): a grad-weight plan's
// finalize is launched as a dependent of its main kernel (cuda::Device::
// launch_dependent_on) and waits here for that kernel's completion and writes; the main
// kernels let it launch once each block is past its main loop.
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Tensor-core pieces shared by tensor_core.cu and streaming.cu.
template <typename T> struct Mma;
template <> struct Mma<__nv_bfloat16> {
    static __device__ __forceinline__ void run(float* d, const unsigned* a, const unsigned* b) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};
template <> struct Mma<__half> {
    static __device__ __forceinline__ void run(float* d, const unsigned* a, const unsigned* b) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

template <typename T>
__device__ __forceinline__ unsigned pack2(T lo, T hi) {
    unsigned short l = *reinterpret_cast<unsigned short*>(&lo);
    unsigned short h = *reinterpret_cast<unsigned short*>(&hi);
    return (unsigned)l | ((unsigned)h << 16);
}

// Row stride of the shared tile, in elements: holds NT*8 + 8 columns (the last window
// starts at 8*(NT-1) and is 16 long), a multiple of 8 (16-byte ldmatrix rows) and an odd
// number of 16-byte chunks so the 8 rows of one ldmatrix phase hit 8 distinct bank groups.
__host__ __device__ constexpr int tc_row_stride(int nt) {
    return ((nt + 1) % 2 == 1) ? (nt + 1) * 8 : (nt + 2) * 8;
}

// Two neighbouring pixels' 8 channels from channel-major storage (channel q's pair of
// columns at s + q * plane) as two 16-byte pixel vectors: the channels-last kernels'
// way out of their stages (streaming_cl, depth_reuse_cl).
template <typename T>
__device__ __forceinline__ void unpack_pixel_pair(const T* s, int plane, uint4 (&o)[2]) {
    T* e0 = reinterpret_cast<T*>(&o[0]);
    T* e1 = reinterpret_cast<T*>(&o[1]);
#pragma unroll
    for (int q = 0; q < 8; ++q) {
        const unsigned u = *reinterpret_cast<const unsigned*>(s + q * plane);
        const unsigned short lo = (unsigned short)(u & 0xffffu), hi = (unsigned short)(u >> 16);
        e0[q] = *reinterpret_cast<const T*>(&lo);
        e1[q] = *reinterpret_cast<const T*>(&hi);
    }
}

// Elements of a channel plane (a multiple of 8) grown to an odd number of 16-byte chunks:
// 8 rows of one stmatrix, one a plane, then fall in 8 distinct bank groups.
__host__ __device__ constexpr int channel_plane_odd_chunks(int elements) {
    return (elements / 8) % 2 == 1 ? elements : elements + 8;
}


// Output (n, c, od, oh, ow) summed tap by tap over in-bounds inputs only, straight from
// global memory: the naive kernel's body, and the exact answer the tensor-core kernels
// fall back to (see store_c_fragment). Branch-free: every tap loads a clamped (always
// valid) address and a select drops the out-of-bounds ones, so all the loads of an
// output are independent and in flight together; skipping, not adding 0 * w, keeps
// an Inf weight over padding from making NaN (the oracle's rule).
template <typename T, bool CHANNELS_LAST, int KD, int KH, int KW>
__device__ __forceinline__ float direct_output(const ConvArgs& a, long long n, long long c, int od,
                                               int oh, int ow) {
    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ wc = static_cast<const T*>(a.w) + c * (KD * KH * KW);
    const long long in_spatial = (long long)a.id * a.ih * a.iw;
    // Elements between neighbours along W, and the first element of (n, c).
    const long long step = CHANNELS_LAST ? a.c : 1;
    const T* __restrict__ xb = CHANNELS_LAST ? x + n * in_spatial * a.c + c : x + (n * a.c + c) * in_spatial;
    float acc = 0.f;
#pragma unroll
    for (int kd = 0; kd < KD; ++kd) {
        const int zd = od * a.sd + kd * a.dd - a.pd;
        const bool okd = zd >= 0 && zd < a.id;
        const int zdc = min(max(zd, 0), a.id - 1);
#pragma unroll
        for (int kh = 0; kh < KH; ++kh) {
            const int zh = oh * a.sh + kh * a.dh - a.ph;
            const bool okh = okd && zh >= 0 && zh < a.ih;
            const int zhc = min(max(zh, 0), a.ih - 1);
            const T* __restrict__ row = xb + ((long long)zdc * a.ih + zhc) * a.iw * step;
#pragma unroll
            for (int kw = 0; kw < KW; ++kw) {
                const int zw = ow * a.sw + kw * a.dw - a.pw;
                const bool ok = okh && zw >= 0 && zw < a.iw;
                const int zwc = min(max(zw, 0), a.iw - 1);
                const float v = to_f32(row[zwc * step]);
                const float wt = to_f32(wc[(kd * KH + kh) * KW + kw]);
                acc = ok ? fmaf(v, wt, acc) : acc;
            }
        }
    }
    return acc;
}

// The banded B matrix multiplies every input of a 16-wide window, so one NaN or Inf
// input turns all 8 outputs of a tile NaN (x * 0 = NaN), not only those whose window
// holds it. The tensor-core kernels therefore flag a launch with a non-finite output,
// and repair.cu, launched right after, recomputes exactly the non-finite outputs of a
// flagged launch: that propagates like PyTorch, and a finite output cannot have been
// contaminated. (Repairing inside the kernel cost streaming 15%: the tail's registers
// made ptxas rematerialize addresses in the hot loop.)
// The plane starts at flat index `plane` of y.
template <typename T, int KD, int KH, int KW, int EPI>
__device__ void repair_plane(const ConvArgs& a, const EpiArgs& e, long long nc, int od, T* y, long long plane) {
    T* yout = y + plane;
    for (long long i = threadIdx.x; i < (long long)a.oh * a.ow; i += blockDim.x) {
        if (isfinite(to_f32(yout[i]))) continue;
        const int oh = (int)(i / a.ow), ow = (int)(i % a.ow);
        const float v = direct_output<T, false, KD, KH, KW>(a, nc / a.c, nc % a.c, od, oh, ow);
        yout[i] = from_f32<T>(epilogue<T, EPI>(e, v, nc % a.c, plane + i));
    }
}

// The residuals of one m16n8 fragment (the elements store_c_fragment writes) of the plane
// that starts at flat index `plane`, loaded ahead so their latency hides behind MMAs.
// Rows and columns past the plane's ends are never stored; their reads are clamped.
template <typename T, int EPI>
__device__ __forceinline__ void load_c_residual(const ConvArgs& a, const EpiArgs& e, long long plane, int h0, int w0,
                                                int lane, float* r) {
    if constexpr ((EPI & 8) != 0) {
        const T* res = static_cast<const T*>(e.residual) + plane;
        const int col = w0 + (lane & 3) * 2;
        const int c0 = min(max(col, 0), a.ow - 1), c1 = min(max(col + 1, 0), a.ow - 1);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const T* row = res + (long long)min(h0 + (lane >> 2) + half * 8, a.oh - 1) * a.ow;
            // (One 4-byte load for both columns made depth_reuse spill: stack 32 -> 56 B.)
            r[2 * half] = to_f32(__ldg(row + c0));
            r[2 * half + 1] = to_f32(__ldg(row + c1));
        }
    }
}

// Writes one m16n8 f32 accumulator fragment as T through the epilogue (bias and
// residuals loaded before: bias_of, load_c_residual): rows h0 + lane/4 (+8), columns
// w0 + 2*(lane%4) (+1); the two columns go as one 4-byte store when aligned.
template <int EPI, typename T>
__device__ __forceinline__ void store_c_fragment(T* yout, const float* acc, int h0, int w0, int lane,
                                                 const ConvArgs& a, float bias, const float* res) {
    const int col = w0 + (lane & 3) * 2;  // may be negative for shifted tiles
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = h0 + (lane >> 2) + half * 8;
        if (row >= a.oh) continue;
        T* p = yout + (long long)row * a.ow + col;
        const float v0 = finish<EPI, T>(acc[2 * half], bias, res[2 * half]);
        const float v1 = finish<EPI, T>(acc[2 * half + 1], bias, res[2 * half + 1]);
        const T lo = from_f32<T>(v0), hi = from_f32<T>(v1);
        if (col >= 0 && col + 1 < a.ow && (reinterpret_cast<unsigned long long>(p) & 3) == 0) {
            *reinterpret_cast<unsigned*>(p) = pack2(lo, hi);
        } else {
            if (col >= 0 && col < a.ow) p[0] = lo;
            if (col + 1 >= 0 && col + 1 < a.ow) p[1] = hi;
        }
    }
}

// store_c_fragment with its per-tile work done once, for a tile that writes many planes
// (the depth-rotation kernels): where this lane's two rows are in a plane and which of
// its elements exist. Both columns go as one 4-byte store where the pair is aligned in
// the plane written (rows eight apart share the parity: 8 * ow is even).
struct CFragmentAt {
    long long off;  // element offset of row h0 + lane/4, column w0 + 2*(lane%4) in a plane
    unsigned mask;  // bit 2*half + i: element (half, i) exists; bit 4: off is even
    __device__ __forceinline__ CFragmentAt() : off(0), mask(0) {}
    __device__ __forceinline__ CFragmentAt(int h0, int w0, int lane, const ConvArgs& a) {
        const int col = w0 + (lane & 3) * 2, row = h0 + (lane >> 2);
        off = (long long)row * a.ow + col;
        mask = (off & 1) == 0 ? 16u : 0u;
#pragma unroll
        for (int half = 0; half < 2; ++half)
#pragma unroll
            for (int i = 0; i < 2; ++i)
                if (row + 8 * half < a.oh && col + i >= 0 && col + i < a.ow) mask |= 1u << (2 * half + i);
    }
};

// The plane starts at element `plane` of y.
template <int EPI, typename T>
__device__ __forceinline__ void store_c_fragment_at(T* y, long long plane, const float* acc, const CFragmentAt& at,
                                                    const ConvArgs& a, float bias, const float* res) {
    const bool even = (plane & 1) == 0;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        T* p = y + plane + at.off + half * 8LL * a.ow;
        const T lo = from_f32<T>(finish<EPI, T>(acc[2 * half], bias, res[2 * half]));
        const T hi = from_f32<T>(finish<EPI, T>(acc[2 * half + 1], bias, res[2 * half + 1]));
        const unsigned both = 3u << (2 * half);
        if (even && (at.mask & (both | 16u)) == (both | 16u)) {
            *reinterpret_cast<unsigned*>(p) = pack2(lo, hi);
        } else {
            if (at.mask & (1u << (2 * half))) p[0] = lo;
            if (at.mask & (2u << (2 * half))) p[1] = hi;
        }
    }
}

// The epilogue of one m16n8 accumulator fragment of channel-last output (channel c,
// output depth od of image n) before it is staged: rows r0 + lane/4 (+8), columns col,
// col + 1 (col = 8j + 2*(lane%4) - S, possibly outside the row: those are never written,
// so their residual reads are clamped in bounds).
template <typename T, int EPI>
__device__ __forceinline__ void epilogue_fragment_cl(const ConvArgs& a, const EpiArgs& e, float* acc, long long c, float bias,
                                                     long long n, int od, int r0, int col, int lane) {
    if constexpr (EPI != 0) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = min(r0 + (lane >> 2) + half * 8, a.oh - 1);
            const long long pix = ((n * a.od + od) * a.oh + row) * (long long)a.ow;
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int cc = min(max(col + i, 0), a.ow - 1);
                acc[2 * half + i] = finish<EPI, T>(acc[2 * half + i], bias, residual_at<T, EPI>(e, (pix + cc) * a.c + c));
            }
        }
    }
}

// A non-finite input makes a whole 8-wide row of a C fragment non-finite, so the first
// column of this lane's two rows tells; summed over all tiles (NaN and Inf survive a
// sum) it costs two FADDs a tile. An overflowing sum only triggers a needless repair.
__device__ __forceinline__ void probe_fragment(float& probe, const float* acc) {
    probe += acc[0] + acc[2];
}

// The banded Toeplitz B fragments (m16n8k16, "col" layout) of ROWS kernel rows of width
// KW: B[k][n] = w[k - n] for 0 <= k - n < KW, else 0. This lane holds n = lane/4 and
// k = 2*(lane%4) + {0, 1} (+8), packed two per register.
template <typename T, int ROWS, int KW>
__device__ __forceinline__ void band_fragments(const T* __restrict__ wc, int lane, unsigned (*bf)[2]) {
    const int n = lane >> 2, k0 = (lane & 3) * 2;
    const T zero = from_f32<T>(0.f);
#pragma unroll
    for (int q = 0; q < ROWS; ++q) {
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

// band_fragments in two halves, so a kernel can load the next channel's taps while it
// multiplies with these (depth_reuse's PLANES). (band_fragments written through these
// compiled to different SASS for depth_reuse and streaming: kept as measured.)
template <typename T, int ROWS, int KW>
__device__ __forceinline__ void band_taps(const T* __restrict__ wc, int lane, T (*e)[4]) {
    const int n = lane >> 2, k0 = (lane & 3) * 2;
    const T zero = from_f32<T>(0.f);
#pragma unroll
    for (int q = 0; q < ROWS; ++q) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int tap = k0 + (j & 1) + (j >> 1) * 8 - n;
            e[q][j] = (tap >= 0 && tap < KW) ? wc[q * KW + tap] : zero;
        }
    }
}
template <typename T, int ROWS>
__device__ __forceinline__ void band_pack(const T (*e)[4], unsigned (*bf)[2]) {
#pragma unroll
    for (int q = 0; q < ROWS; ++q) {
        bf[q][0] = pack2(e[q][0], e[q][1]);
        bf[q][1] = pack2(e[q][2], e[q][3]);
    }
}

// 16-byte global -> shared copies through L2 only (no L1 allocation), in commit groups.
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// An LB-byte cp.async that zero-fills where !ok (the channels-last grad-weight pieces of
// wgrad_tile_cl.cu and wgrad_strip_cl.cu, depth_reuse_fma.cu's rows that are not 16-byte
// multiples), and VEC channels read from shared memory as floats.
template <int LB>
__device__ __forceinline__ void cl_copy_async(unsigned dst, const void* src, bool ok) {
    // src-size 0 fills the LB bytes with zeros and reads nothing.
    if (LB == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(LB),
                     "r"(ok ? LB : 0));
}

// VEC channels at p (shared memory, VEC * sizeof(T)-byte aligned) as floats: one 4- or
// 8-byte read.
__device__ __forceinline__ float2 cl_pair_f32(unsigned u, __half) {
    return __half22float2(*reinterpret_cast<const __half2*>(&u));
}
__device__ __forceinline__ float2 cl_pair_f32(unsigned u, __nv_bfloat16) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u));
}
template <int VEC>
__device__ __forceinline__ void cl_read_f32(const float* p, float* f) {
    static_assert(VEC == 1 || VEC == 2, "f32 vectors of 4 or 8 bytes");
    if (VEC == 1) {
        f[0] = p[0];
    } else {
        const float2 t = *reinterpret_cast<const float2*>(p);
        f[0] = t.x;
        f[VEC - 1] = t.y;
    }
}
template <int VEC, typename H>
__device__ __forceinline__ void cl_read_f32(const H* p, float* f) {
    static_assert(VEC == 2 || VEC == 4, "16-bit vectors of 4 or 8 bytes");
    if (VEC == 2) {
        const float2 t = cl_pair_f32(*reinterpret_cast<const unsigned*>(p), H());
        f[0] = t.x;
        f[1] = t.y;
    } else {
        const uint2 u = *reinterpret_cast<const uint2*>(p);
        const float2 lo = cl_pair_f32(u.x, H()), hi = cl_pair_f32(u.y, H());
        f[0] = lo.x;
        f[1] = lo.y;
        f[VEC - 2] = hi.x;
        f[VEC - 1] = hi.y;
    }
}

// The slice walk of the depth-rotation kernels with a ring of STAGES + 1 slices
// (depth_reuse.cu, depth_reuse_fma.cu, depth_reuse_fma_cl.cu): fetch(s, buffer) issues
// slice s's copies and commits one group (an empty one past the last slice); step(s, u,
// buffer) consumes slice s. Steps come KD at a time so that u = s mod KD is a
// compile-time constant after unrolling, and with it each output depth's accumulator
// slot. One barrier per slice: it makes slice s visible and frees slice s - 1's buffer,
// which is refilled right after it.
template <int KD, int STAGES, typename Fetch, typename Step>
__device__ __forceinline__ void walk_slices(int steps, Fetch&& fetch, Step&& step) {
    constexpr int NBUF = STAGES + 1;
#pragma unroll
    for (int k = 0; k < STAGES; ++k) fetch(k, k);
    int cur = 0;
    for (int sb = 0; sb < steps; sb += KD) {
#pragma unroll
        for (int u = 0; u < KD; ++u) {
            const int s = sb + u;
            if (s >= steps) break;
            cp_async_wait<STAGES - 1>();
            __syncthreads();
            fetch(s + STAGES, cur == 0 ? NBUF - 1 : cur - 1);
            step(s, u, cur);
            cur = cur == NBUF - 1 ? 0 : cur + 1;
        }
    }
    cp_async_wait<0>();
}

// The weight [C][taps] as f32 [taps][C] in shared memory, so a tap's 16 bytes of
// channels are one or two 16-byte shared loads (the channels-last grad-input gathers);
// the block's threads share the copy and meet at a barrier after it.
template <typename T>
__device__ __forceinline__ void weight_to_taps_major(const T* __restrict__ w, int c, int taps, float* ws) {
    const int n = c * taps;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const int ch = j / taps;
        ws[(j - ch * taps) * c + ch] = to_f32(w[j]);
    }
    __syncthreads();
}

// o += weight[tap] * g over a thread's VEC channels c0..: from the f32 [taps][C] copy in
// shared memory (W_SMEM, weight_to_taps_major) or from the weight's [C][taps] rows (wc =
// the weight at channel c0) in global memory. The channels-last grad-input gathers' tap.
template <typename T, int VEC, int TAPS, bool W_SMEM>
__device__ __forceinline__ void add_weighted_tap(float* o, const float* g, int tap, const float* ws, const T* wc,
                                                 int c, int c0) {
    if (W_SMEM) {
        const float4* wv = reinterpret_cast<const float4*>(ws + tap * c + c0);
#pragma unroll
        for (int x = 0; x < VEC / 4; ++x) {
            const float4 f = wv[x];
            o[4 * x] = fmaf(f.x, g[4 * x], o[4 * x]);
            o[4 * x + 1] = fmaf(f.y, g[4 * x + 1], o[4 * x + 1]);
            o[4 * x + 2] = fmaf(f.z, g[4 * x + 2], o[4 * x + 2]);
            o[4 * x + 3] = fmaf(f.w, g[4 * x + 3], o[4 * x + 3]);
        }
    } else {
#pragma unroll
        for (int v = 0; v < VEC; ++v) o[v] = fmaf(to_f32(__ldg(wc + v * TAPS + tap)), g[v], o[v]);
    }
}

// walk_slices with one barrier per KD slices: group g (slices g KD .. g KD + KD - 1) sits
// in buffers (g mod 2) KD + u, the next group's copies in flight under this group's
// FMAs (2 KD buffers). walk_slices' barrier a slice held x3d's FMA rotation 31% of its
// samples (docs/perf.md, run 290).
template <int KD, typename Fetch, typename Step>
__device__ __forceinline__ void walk_slice_groups(int steps, Fetch&& fetch, Step&& step) {
#pragma unroll
    for (int u = 0; u < KD; ++u) fetch(u, u);
    for (int sb = 0, half = 0; sb < steps; sb += KD, half = KD - half) {
        cp_async_wait<0>();
        __syncthreads();
#pragma unroll
        for (int u = 0; u < KD; ++u) fetch(sb + KD + u, KD - half + u);
#pragma unroll
        for (int u = 0; u < KD; ++u) {
            const int s = sb + u;
            if (s >= steps) break;
            step(s, u, half + u);
        }
    }
    cp_async_wait<0>();
}

// Two 8x8 b16 matrices (rows 0-7 and 8-15 from lanes 0-15's addresses): one 16x8 half
// of an A fragment.
__device__ __forceinline__ void ldmatrix_x2(unsigned addr, unsigned* af) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(af[0]), "=r"(af[1])
                 : "r"(addr));
}

// Four 8x8 b16 matrices from shared memory: one 16x16 A fragment of m16n8k16.
__device__ __forceinline__ void ldmatrix_x4(unsigned addr, unsigned* af) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(af[0]), "=r"(af[1]), "=r"(af[2]), "=r"(af[3])
                 : "r"(addr));
}

// One slice's tensor-core work in the depth-rotation kernels (depth_reuse.cu,
// depth_reuse_cl.cu): the A fragment of each kernel row kh (at base + kh * row_bytes)
// feeds every output depth the slice reaches. At step s (slice s of the chunk), with u =
// s mod KD known at compile time after unrolling, depth s - kd sits in accumulator
// (u - kd) mod KD; depths outside [0, depths) belong to other chunks and are skipped.
// steady (a literal at the call, folded after inlining): every depth the slice reaches
// is in [0, depths) (s >= KD - 1 and s < depths), so no MMA needs its predicate. (Loading
// row kh + 1's fragment before row kh's MMAs: no gain on the seed, x3d and video-vae 2%
// slower, run 165; ptxas serializes the loads again at 80 registers.)
template <typename T, int KD, int KH>
__device__ __forceinline__ void rotate_slice(unsigned base, unsigned row_bytes, int s, int u, int depths,
                                             const unsigned (*bf)[2], float (*acc)[4], bool steady = false) {
#pragma unroll
    for (int kh = 0; kh < KH; ++kh) {
        unsigned af[4];
        ldmatrix_x4(base + kh * row_bytes, af);
#pragma unroll
        for (int kd = 0; kd < KD; ++kd)
            if (steady || (s - kd >= 0 && s - kd < depths)) Mma<T>::run(acc[(u - kd + KD) % KD], af, bf[kd * KH + kh]);
    }
}

// One warp's run of n <= SEG 8-wide output tiles j0.. in one 16-row band, into acc.
// The 16-wide input window of tile j is the window of tile j-1 shifted by 8 columns, so
// its left half is already in registers: each tile loads one new 16x8 piece per kernel
// row (ldmatrix.x2) instead of a whole 16x16 fragment, halving the shared-memory reads
// per output. Kernel rows go outside, tiles inside: SEG accumulators stay live, the
// window half only for one row (the other order kept KD*KH halves live: 127 registers).
// row_addr(q): shared address of column 0 of this lane's row (lane % 16) of kernel row q.
template <typename T, int Q, int SEG, typename RowAddr>
__device__ __forceinline__ void band_run(RowAddr row_addr, int j0, int n, const unsigned (*bf)[2],
                                         float (*acc)[4]) {
    constexpr unsigned PIECE = 8 * sizeof(T);  // bytes of 8 columns
#pragma unroll
    for (int j = 0; j < SEG; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    if constexpr (SEG == 1) {
        // Nothing to reuse: one x4 load per kernel row (lanes 16-31 address the right
        // half); two x2 loads measured 8-15% slower (docs/perf.md, run 25). streaming.cu
        // keeps its own older seg=1 loop, 8% faster again on the seed (run 26); this
        // path serves streaming_cl's one-tile runs.
        if (n < 1) return;
        const unsigned half = ((threadIdx.x >> 4) & 1) * PIECE;
#pragma unroll
        for (int q = 0; q < Q; ++q) {
            unsigned af[4];
            ldmatrix_x4(row_addr(q) + j0 * PIECE + half, af);
            Mma<T>::run(acc[0], af, bf[q]);
        }
        return;
    }
#pragma unroll
    for (int q = 0; q < Q; ++q) {
        const unsigned base = row_addr(q) + j0 * PIECE;
        unsigned af[4];
        ldmatrix_x2(base, af);
#pragma unroll
        for (int j = 0; j < SEG; ++j) {
            if (j < n) {
                ldmatrix_x2(base + (j + 1) * PIECE, af + 2);
                Mma<T>::run(acc[j], af, bf[q]);
                af[0] = af[2];
                af[1] = af[3];
            }
        }
    }
}
