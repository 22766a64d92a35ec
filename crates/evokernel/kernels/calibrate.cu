// Calibration micro-benchmarks: the device's own FP32 FMA and bf16 tensor-core rates,
// from which each case's floor is computed (MEASURE.md). Results are written so the
// compiler cannot drop the work.
#define CAL_CHAINS 8

struct CalArgs {
    float* out;
    unsigned seed;
};

template <int ITERS>
__global__ void __launch_bounds__(256) fma_rate(CalArgs a) {
    float* out = a.out;
    const float seed = (float)a.seed;
    float v[CAL_CHAINS];
#pragma unroll
    for (int j = 0; j < CAL_CHAINS; ++j) v[j] = seed + threadIdx.x + j;
    const float m = 0.9999f, b = 1e-6f;
    for (int i = 0; i < ITERS; ++i) {
#pragma unroll
        for (int j = 0; j < CAL_CHAINS; ++j) v[j] = fmaf(v[j], m, b);
    }
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < CAL_CHAINS; ++j) s += v[j];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

// One warp issues independent m16n8k16 bf16 MMAs with f32 accumulators.
template <int ITERS>
__global__ void __launch_bounds__(256) mma_rate(CalArgs a) {
    float* out = a.out;
    const unsigned seed = a.seed;
    unsigned a0 = seed ^ threadIdx.x, a1 = a0 * 3u, a2 = a0 * 5u, a3 = a0 * 7u;
    unsigned b0 = a0 * 11u, b1 = a0 * 13u;
    float acc[CAL_CHAINS][4];
#pragma unroll
    for (int j = 0; j < CAL_CHAINS; ++j)
#pragma unroll
        for (int k = 0; k < 4; ++k) acc[j][k] = 0.f;
    for (int i = 0; i < ITERS; ++i) {
#pragma unroll
        for (int j = 0; j < CAL_CHAINS; ++j) {
            asm volatile(
                "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                : "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
                : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
        }
    }
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < CAL_CHAINS; ++j) s += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
