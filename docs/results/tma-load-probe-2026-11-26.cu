// Probe (run 177, H100 80GB HBM3, nvcc 13.0): TMA tensor loads of a 4-D 2-byte tensor
// (box 96 x 20) at start columns -8, -2, 2, 6, 8. Build and run one a process:
//   nvcc -arch=sm_90 -O2 -o tma_load tma-load-probe.cu -lcuda; for w in -8 -2 2 6 8; do ./tma_load $w; done
// Outcome: -8 and 8 succeed; -2, 2 and 6 are illegal instructions. The innermost start
// coordinate must be a multiple of 16 bytes (negative multiples are fine and zero-fill),
// so depth_reuse keeps its tiles shifted by S (input column 0 at a multiple of 8) with
// the producer too; run 176's unshifted tiles (P = pw) failed this way. The store probe's
// failures at -6 (tma-store-probe) may be the same alignment rule rather than the sign.
#include <cuda.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
struct alignas(64) Map { CUtensorMap m; };
__global__ void load_kernel(const __grid_constant__ Map map, int w, unsigned bytes, unsigned short* out) {
    extern __shared__ __align__(1024) unsigned char smem[];
    __shared__ __align__(8) unsigned long long bar;
    unsigned b = (unsigned)__cvta_generic_to_shared(&bar), dst = (unsigned)__cvta_generic_to_shared(smem);
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(b));
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(b), "r"(bytes) : "memory");
        asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
                     ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(&map.m)), "r"(w), "r"(0), "r"(0), "r"(0), "r"(b) : "memory");
        unsigned done = 0;
        while (!done) asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\nselp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(b) : "memory");
        for (int i = 0; i < 4; ++i) out[i] = reinterpret_cast<unsigned short*>(smem)[i];
    }
}
int main(int argc, char** argv) {
    cuInit(0); cudaFree(0);
    int w = atoi(argv[1]);
    const unsigned long long W = 80, H = 45, D = 4, P = 2;
    CUdeviceptr x; cuMemAlloc(&x, W * H * D * P * 2);
    unsigned short* host = (unsigned short*)malloc(W * H * D * P * 2);
    for (unsigned long long i = 0; i < W * H * D * P; ++i) host[i] = (unsigned short)(i % W + 1);
    cuMemcpyHtoD(x, host, W * H * D * P * 2);
    Map map; memset(&map, 0, sizeof map);
    cuuint64_t dims[4] = {W, H, D, P}, strides[3] = {2 * W, 2 * W * H, 2 * W * H * D};
    cuuint32_t box[4] = {96, 20, 1, 1}, el[4] = {1, 1, 1, 1};
    CUresult r = cuTensorMapEncodeTiled(&map.m, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, (void*)x, dims, strides, box, el,
        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    unsigned short* out; cudaMalloc(&out, 8);
    load_kernel<<<1, 32, 65536 / 2>>>(map, w, 96 * 20 * 2, out);
    cudaError_t e = cudaDeviceSynchronize();
    unsigned short v[4] = {0}; if (e == cudaSuccess) cudaMemcpy(v, out, 8, cudaMemcpyDeviceToHost);
    printf("load at column %3d: encode %d, %s, first elements %u %u %u %u\n", w, r, cudaGetErrorName(e), v[0], v[1], v[2], v[3]);
    return 0;
}
