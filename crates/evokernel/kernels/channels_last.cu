// channels_last: NDHWC input; each thread owns VEC consecutive channels (one 16-byte
// vector) of OUT_W consecutive outputs along W, so every input and output access is a
// coalesced 16-byte load or store across the warp. Any stride, dilation and padding.
template <typename T, int VEC, int OUT_W, int KD, int KH, int KW>
__global__ void __launch_bounds__(256) channels_last_dwconv(ConvArgs a) {
    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ w = static_cast<const T*>(a.w);
    T* __restrict__ y = static_cast<T*>(a.y);
    constexpr int TAPS = KD * KH * KW;
    const int cvecs = (int)(a.c / VEC);
    const int groups_w = (a.ow + OUT_W - 1) / OUT_W;
    const long long total = a.n * a.od * a.oh * (long long)groups_w * cvecs;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int cv = (int)(i % cvecs);
        long long r = i / cvecs;
        const int gw = (int)(r % groups_w);
        r /= groups_w;
        const int oh = (int)(r % a.oh);
        r /= a.oh;
        const int od = (int)(r % a.od);
        const long long n = r / a.od;
        const int ow0 = gw * OUT_W;
        const long long c0 = (long long)cv * VEC;
        float acc[OUT_W][VEC];
#pragma unroll
        for (int o = 0; o < OUT_W; ++o)
#pragma unroll
            for (int v = 0; v < VEC; ++v) acc[o][v] = 0.f;
#pragma unroll
        for (int kd = 0; kd < KD; ++kd) {
            const int zd = od * a.sd + kd * a.dd - a.pd;
            if (zd < 0 || zd >= a.id) continue;
#pragma unroll
            for (int kh = 0; kh < KH; ++kh) {
                const int zh = oh * a.sh + kh * a.dh - a.ph;
                if (zh < 0 || zh >= a.ih) continue;
                const T* row = x + (((n * a.id + zd) * a.ih + zh) * (long long)a.iw) * a.c + c0;
#pragma unroll
                for (int kw = 0; kw < KW; ++kw) {
                    const int t = (kd * KH + kh) * KW + kw;
                    float wv[VEC];
#pragma unroll
                    for (int v = 0; v < VEC; ++v) wv[v] = to_f32(w[(c0 + v) * TAPS + t]);
#pragma unroll
                    for (int o = 0; o < OUT_W; ++o) {
                        const int zw = (ow0 + o) * a.sw + kw * a.dw - a.pw;
                        if (ow0 + o >= a.ow || zw < 0 || zw >= a.iw) continue;
                        float xv[VEC];
                        Vec16<T, VEC>::load(row + (long long)zw * a.c, xv);
#pragma unroll
                        for (int v = 0; v < VEC; ++v) acc[o][v] = fmaf(xv[v], wv[v], acc[o][v]);
                    }
                }
            }
        }
        T* out = y + (((n * a.od + od) * a.oh + oh) * (long long)a.ow + ow0) * a.c + c0;
#pragma unroll
        for (int o = 0; o < OUT_W; ++o)
            if (ow0 + o < a.ow) Vec16<T, VEC>::store(out + (long long)o * a.c, acc[o]);
    }
}
