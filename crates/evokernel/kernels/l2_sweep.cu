// l2_sweep: reads a buffer of twice the L2 (a.x, a.n 16-byte vectors) before a timed
// launch, so that what the kernel before left in L2, dirty lines among it, is written
// back and evicted here and not inside the next timing (bench's `Protocol::sweep_l2`:
// cuDNN's grad-weight leaves tens of MB dirty, and the kernel timed after it in the
// A B A B alternation paid ~9%, run 263). The buffer is zeros; a.y gets a word only if
// the XOR of what was read is not 0, so the reads cannot be dropped.
template <int EPI>
__global__ void __launch_bounds__(256) l2_sweep(ConvArgs a, EpiArgs) {
    const uint4* __restrict__ p = static_cast<const uint4*>(a.x);
    unsigned acc = 0;
    for (long long i = blockIdx.x * 256LL + threadIdx.x; i < a.n; i += (long long)gridDim.x * 256) {
        const uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc != 0) *static_cast<unsigned*>(a.y) = acc;
}
