// Probe (run 170, H100 80GB HBM3, driver 580, nvcc 13.0): which TMA tensor stores of a
// 4-D 2-byte tensor are legal. Build and run on the GPU machine, one case a process
// (an illegal instruction ends the context):
//   nvcc -arch=sm_90 -O2 -o tma_store tma_store-probe.cu -lcuda; for i in 0 1 2 3 4 5 6 7; do ./tma_store $i; done
// Outcome:
//   box 80x16 at (0,0)                       cudaSuccess
//   box 88x16 at (0,0) wider than W          cudaSuccess (the columns past W are dropped)
//   box 88x16 at (-6,0)                      cudaErrorIllegalInstruction
//   box 80x16 at (-6,0)                      cudaErrorIllegalInstruction
//   box 80x16 at (0,40) rows past H          cudaSuccess
//   box 80x16 smem +128                      cudaSuccess
//   box 80x16 smem +16                       cudaErrorMisalignedAddress
//   box 48x32 at (-6,0) small                cudaErrorIllegalInstruction
// So a store may run past the right and bottom edges but not start left of (or above)
// the tensor, and its shared source must be 128-byte aligned: depth_reuse stores whole
// rows through the TMA only (docs/perf.md, runs 170-171).
#include <cuda.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
struct alignas(64) Map { CUtensorMap m; };
__global__ void store_kernel(const __grid_constant__ Map map, int w, int h, int d, int nc, int rows, int cols, int smem_off) {
    extern __shared__ __align__(1024) unsigned char smem[];
    unsigned short* s = reinterpret_cast<unsigned short*>(smem + smem_off);
    for (int i = threadIdx.x; i < rows * cols; i += blockDim.x) s[i] = (unsigned short)(i + 1);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned src = (unsigned)__cvta_generic_to_shared(s);
        asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(
                         reinterpret_cast<unsigned long long>(&map.m)), "r"(w), "r"(h), "r"(d), "r"(nc), "r"(src) : "memory");
        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
    }
}
int run(const char* name, unsigned long long W, unsigned long long H, unsigned long long D, unsigned long long P,
        unsigned bw, unsigned bh, int w, int h, int smem_off) {
    CUdeviceptr y; cuMemAlloc(&y, W * H * D * P * 2); cuMemsetD8(y, 0, W * H * D * P * 2);
    Map map; memset(&map, 0, sizeof map);
    cuuint64_t dims[4] = {W, H, D, P}, strides[3] = {2 * W, 2 * W * H, 2 * W * H * D};
    cuuint32_t box[4] = {bw, bh, 1, 1}, el[4] = {1, 1, 1, 1};
    CUresult r = cuTensorMapEncodeTiled(&map.m, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, (void*)y, dims, strides, box, el,
        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) { printf("%-40s encode failed %d\n", name, r); return 0; }
    store_kernel<<<1, 128, 32768>>>(map, w, h, 1, 1, bh, bw, smem_off);
    cudaError_t e = cudaDeviceSynchronize();
    unsigned short v[4] = {0}; if (e == cudaSuccess) cuMemcpyDtoH(v, y + 2 * (W * H * (D + 1) + 0), 8);
    printf("%-40s %s first elems of plane (1,1): %u %u %u %u\n", name, cudaGetErrorName(e), v[0], v[1], v[2], v[3]);
    return e == cudaSuccess;
}
int main(int argc, char** argv) {
    cuInit(0); cudaFree(0);
    int which = atoi(argv[1]), k = 0;
#define CASE(...) if (k++ == which) run(__VA_ARGS__)
    CASE("box 80x16 at (0,0)", 80, 45, 59, 4, 80, 16, 0, 0, 0);
    CASE("box 88x16 at (0,0) wider than W", 80, 45, 59, 4, 88, 16, 0, 0, 0);
    CASE("box 88x16 at (-6,0)", 80, 45, 59, 4, 88, 16, -6, 0, 0);
    CASE("box 80x16 at (-6,0)", 80, 45, 59, 4, 80, 16, -6, 0, 0);
    CASE("box 80x16 at (0,40) rows past H", 80, 45, 59, 4, 80, 16, 0, 40, 0);
    CASE("box 80x16 smem +128", 80, 45, 59, 4, 80, 16, 0, 0, 128);
    CASE("box 80x16 smem +16", 80, 45, 59, 4, 80, 16, 0, 0, 16);
    CASE("box 48x32 at (-6,0) small", 40, 20, 3, 4, 48, 32, -6, 0, 0);
    return 0;
}
