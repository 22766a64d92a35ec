// flip_weight: the weight with every kernel dim reversed (w[c, K - 1 - k]), the operand
// of grad-input computed as the forward of the flipped kernel. Reversing the flattened
// taps of one channel reverses each dim at once. a.w = weight, a.y = the flipped copy.
template <typename T, int TAPS, int EPI>
__global__ void __launch_bounds__(256) flip_weight_dwconv(ConvArgs a, EpiArgs) {
    const T* __restrict__ w = static_cast<const T*>(a.w);
    T* __restrict__ out = static_cast<T*>(a.y);
    const long long total = a.c * TAPS;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long c = i / TAPS;
        const int t = (int)(i - c * TAPS);
        out[i] = w[c * TAPS + (TAPS - 1 - t)];
    }
}
