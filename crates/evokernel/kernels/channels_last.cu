// channels_last: NDHWC input. A block owns a range of CB channels (blockIdx.y) and walks
// output positions; each thread owns VEC consecutive channels (one 16-byte vector) of
// OUT_W consecutive outputs along W, so input and output accesses are 16-byte vectors
// coalesced across the warp. The block's weights sit in shared memory tap-major
// ([tap][channel], f32), so one tap's weights for a thread are two 16-byte reads instead
// of VEC scattered global loads. Any stride, dilation and padding; VEC is 16 bytes of
// channels when C is a multiple of it, else 1 (scalar accesses, any C).
// ROLL keeps the depth loop rolled: a fully unrolled 3x5x5 body of OUT_W x VEC FMAs
// per tap overflows the instruction cache (ncu: top stall no_instruction). MINB asks
// ptxas for registers enough for MINB resident 256-thread blocks (0: no request; 4: <= 64;
// the profile found the rolled seed kernel occupancy-limited at 76).
template <typename T, int VEC, int OUT_W, int KD, int KH, int KW, int ROLL, int MINB, int EPI>
__global__ void __launch_bounds__(256, MINB) channels_last_dwconv(ConvArgs a, EpiArgs e) {
    extern __shared__ __align__(16) float wsh[];
    constexpr int TAPS = KD * KH * KW;
    constexpr int CB = 64;
    constexpr int CV = CB / VEC;  // thread columns over channels
    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ w = static_cast<const T*>(a.w);
    T* __restrict__ y = static_cast<T*>(a.y);
    const long long cbase = (long long)blockIdx.y * CB;
    // With 16-byte vectors a thread's VEC/4 float4 pieces are interleaved across
    // threads, [tap][piece][cv][4], so a quarter-warp's float4 reads hit distinct banks;
    // [tap][channel] made them 2-way conflicts (ncu: 50% of shared wavefronts).
    for (int i = threadIdx.x; i < TAPS * CB; i += blockDim.x) {
        const int t = i / CB, r = i - t * CB;
        int cl = r;
        if constexpr (VEC % 4 == 0) {
            const int q = r / (CV * 4), rem = r - q * (CV * 4);
            cl = (rem >> 2) * VEC + q * 4 + (rem & 3);
        }
        wsh[i] = (cbase + cl < a.c) ? to_f32(w[(cbase + cl) * TAPS + t]) : 0.f;
    }
    __syncthreads();

    const int cv = threadIdx.x % CV;
    const long long c0 = cbase + (long long)cv * VEC;
    if (c0 >= a.c) return;
    const int groups_w = (a.ow + OUT_W - 1) / OUT_W;
    const long long positions = a.n * a.od * a.oh * (long long)groups_w;
    const int per_block = blockDim.x / CV;
    for (long long p = (long long)blockIdx.x * per_block + threadIdx.x / CV; p < positions;
         p += (long long)gridDim.x * per_block) {
        long long r = p;
        const int gw = (int)(r % groups_w);
        r /= groups_w;
        const int oh = (int)(r % a.oh);
        r /= a.oh;
        const int od = (int)(r % a.od);
        const long long n = r / a.od;
        const int ow0 = gw * OUT_W;
        float acc[OUT_W][VEC];
#pragma unroll
        for (int o = 0; o < OUT_W; ++o)
#pragma unroll
            for (int v = 0; v < VEC; ++v) acc[o][v] = 0.f;
#pragma unroll(ROLL ? 1 : KD)
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
                    const float* wt = wsh + ((kd * KH + kh) * KW + kw) * CB;
                    float wv[VEC];
                    if constexpr (VEC % 4 == 0) {
#pragma unroll
                        for (int v = 0; v < VEC; v += 4) {
                            const float4 q = *reinterpret_cast<const float4*>(wt + ((v / 4) * CV + cv) * 4);
                            wv[v] = q.x; wv[v + 1] = q.y; wv[v + 2] = q.z; wv[v + 3] = q.w;
                        }
                    } else {
#pragma unroll
                        for (int v = 0; v < VEC; ++v) wv[v] = wt[cv * VEC + v];
                    }
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
        const long long at = (((n * a.od + od) * a.oh + oh) * (long long)a.ow + ow0) * a.c + c0;
        T* out = y + at;
#pragma unroll
        for (int o = 0; o < OUT_W; ++o)
            if (ow0 + o < a.ow) {
                epilogue_n<T, EPI, VEC, 1>(e, acc[o], c0, at + (long long)o * a.c);
                Vec16<T, VEC>::store(out + (long long)o * a.c, acc[o]);
            }
    }
}
