// naive: one thread per output element, any spec. The first rung of the ladder and the
// fallback every spec has. Kernel sizes are template arguments so the tap loops unroll;
// indices are 64-bit so tensors past 2^31 elements are safe.
template <typename T, bool CHANNELS_LAST, int KD, int KH, int KW>
__global__ void __launch_bounds__(256) naive_dwconv(ConvArgs a) {
    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ w = static_cast<const T*>(a.w);
    T* __restrict__ y = static_cast<T*>(a.y);
    const long long spatial = (long long)a.od * a.oh * a.ow;
    const long long total = a.n * a.c * spatial;
    const long long in_spatial = (long long)a.id * a.ih * a.iw;
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
        float acc = 0.f;
#pragma unroll
        for (int kd = 0; kd < KD; ++kd) {
            const int zd = od * a.sd + kd * a.dd - a.pd;
            if (zd < 0 || zd >= a.id) continue;
#pragma unroll
            for (int kh = 0; kh < KH; ++kh) {
                const int zh = oh * a.sh + kh * a.dh - a.ph;
                if (zh < 0 || zh >= a.ih) continue;
#pragma unroll
                for (int kw = 0; kw < KW; ++kw) {
                    const int zw = ow * a.sw + kw * a.dw - a.pw;
                    if (zw < 0 || zw >= a.iw) continue;
                    const long long pos = ((long long)zd * a.ih + zh) * a.iw + zw;
                    const long long xi = CHANNELS_LAST ? (n * in_spatial + pos) * a.c + c
                                                       : (n * a.c + c) * in_spatial + pos;
                    acc = fmaf(to_f32(x[xi]), to_f32(w[((c * KD + kd) * KH + kh) * KW + kw]), acc);
                }
            }
        }
        y[i] = from_f32<T>(acc);
    }
}
