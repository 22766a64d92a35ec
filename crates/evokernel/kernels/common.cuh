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
};

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
