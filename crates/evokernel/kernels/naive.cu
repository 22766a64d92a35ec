// naive: one thread per output element, any spec. The first rung of the ladder and the
// fallback every spec has. Kernel sizes are template arguments so the tap loops unroll;
// indices are 64-bit so tensors past 2^31 elements are safe.
template <typename T, bool CHANNELS_LAST, int KD, int KH, int KW, int EPI>
__global__ void __launch_bounds__(256) naive_dwconv(ConvArgs a, EpiArgs e) {
    T* __restrict__ y = static_cast<T*>(a.y);
    const long long spatial = (long long)a.od * a.oh * a.ow;
    const long long total = a.n * a.c * spatial;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long n, c, s;
        if (CHANNELS_LAST) {
            c = i % a.c;
            s = (i / a.c) % spatial;
            n = i / (a.c * spatial);
        } else {
            s = i % spatial;
            c = (i / spatial) % a.c;
            n = i / (spatial * a.c);
        }
        const int ow = (int)(s % a.ow);
        const int oh = (int)((s / a.ow) % a.oh);
        const int od = (int)(s / ((long long)a.ow * a.oh));
        const float acc = direct_output<T, CHANNELS_LAST, KD, KH, KW>(a, n, c, od, oh, ow);
        y[i] = from_f32<T>(epilogue<T, EPI>(e, acc, c, i));
    }
}
