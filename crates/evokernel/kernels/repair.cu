// repair: launched right after a tensor-core kernel (common.cuh, repair_plane). Does
// nothing unless that launch flagged a non-finite output; then recomputes every
// non-finite output exactly. One block per (n, c, output depth) plane, grid-strided.
template <typename T, int KD, int KH, int KW>
__global__ void __launch_bounds__(256) repair_dwconv(ConvArgs a) {
    if (*static_cast<volatile unsigned*>(a.flag) != a.epoch) return;
    T* y = static_cast<T*>(a.y);
    const long long planes = a.n * a.c * a.od;
    for (long long p = blockIdx.x; p < planes; p += gridDim.x)
        repair_plane<T, KD, KH, KW>(a, p / a.od, (int)(p % a.od), y + p * (long long)a.oh * a.ow);
}
