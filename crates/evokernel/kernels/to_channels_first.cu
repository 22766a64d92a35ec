// to_channels_first: CC channels of a channels-last tensor [N][S][C] (S = D*H*W) copied
// into a channels-first one [N][CC][S]: the operands of a channels-first grad-weight
// kernel run on channels-last data, a chunk of channels at a time (engine/cuda_plan.rs).
// a.x = the chunk's first channel in the source, a.y = the copy, a.n and a.c = the
// source's N and C (C is its row length), S = od*oh*ow (OUTPUT_SHAPED: grad-output)
// or id*ih*iw.
//
// 64 x TC tiles (positions x channels) through shared memory, so both sides move whole
// 16-byte vectors: vectors of V channels at one position in, vectors of V positions of
// one channel out, 8 lanes writing one channel's 128 contiguous bytes (run 257: a lane a
// channel wrote 16-byte pieces of 32 rows and ptxas split each into four 4-byte stores;
// L2-bound at 0.5 TB/s). Vector v of tile row s sits at v ^ ((s / V) mod CH), CH = the
// vectors a row: the 8 lanes of one channel read 8 rows s / V apart from distinct banks.
// Tiles that are ragged (past S or CC) or data not 16-byte aligned take the same route an
// element at a time.
template <int BYTES> struct ElementBits;
template <> struct ElementBits<2> { using type = unsigned short; };
template <> struct ElementBits<4> { using type = unsigned; };

// TC: the channels of a tile, chosen by the launcher (cuda/run.rs), whose grid's y covers
// CC channels in tiles of TC.
template <typename T, int CC, int TC, bool OUTPUT_SHAPED, int EPI>
__global__ void __launch_bounds__(256) to_channels_first(ConvArgs a, EpiArgs) {
    static_assert(sizeof(T) == 2 || sizeof(T) == 4, "16- or 32-bit elements");
    using Bits = typename ElementBits<sizeof(T)>::type;
    constexpr int V = 16 / (int)sizeof(T);
    constexpr int TS = 64;
    constexpr int CH = TC / V > 0 ? TC / V : 1;  // vectors a tile row
    __shared__ __align__(16) Bits tile[TS * TC];
    const long long S = OUTPUT_SHAPED ? (long long)a.od * a.oh * a.ow : (long long)a.id * a.ih * a.iw;
    const long long C = a.c;
    const Bits* __restrict__ src = static_cast<const Bits*>(a.x);
    Bits* __restrict__ dst = static_cast<Bits*>(a.y);
    const long long s_tiles = (S + TS - 1) / TS;
    const int c0 = blockIdx.y * TC;
    // Whole vectors on both sides: rows of C and of S in whole vectors, aligned bases.
    const bool vec = TC % V == 0 && C % V == 0 && S % V == 0 && CC % V == 0 &&
                     ((reinterpret_cast<unsigned long long>(src) |
                       reinterpret_cast<unsigned long long>(dst)) % 16) == 0;
    for (long long t = blockIdx.x; t < a.n * s_tiles; t += gridDim.x) {
        const long long n = t / s_tiles, s0 = (t - n * s_tiles) * TS;
        const Bits* in = src + (n * S + s0) * C + c0;
        Bits* out = dst + (n * CC + c0) * S + s0;
        if (vec && s0 + TS <= S && c0 + TC <= CC) {
            for (int i = threadIdx.x; i < TS * CH; i += 256) {
                const int s = i / CH, v = i - s * CH;
                *reinterpret_cast<uint4*>(&tile[s * TC + (v ^ ((s / V) % CH)) * V]) =
                    __ldcs(reinterpret_cast<const uint4*>(in + s * C + v * V));
            }
            __syncthreads();
            constexpr int S_VECS = TS / V;  // output vectors a channel row of the tile
            for (int i = threadIdx.x; i < TC * S_VECS; i += 256) {
                const int sv = i % S_VECS, c = i / S_VECS;
                const Bits* col = &tile[sv * V * TC + ((c / V) ^ (sv % CH)) * V + c % V];
                unsigned w[4];
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    if constexpr (sizeof(T) == 2)
                        w[k] = col[2 * k * TC] | ((unsigned)col[(2 * k + 1) * TC] << 16);
                    else
                        w[k] = col[k * TC];
                }
                // An explicit vector store: through a plain uint4 assignment ptxas split
                // it into four 4-byte ones.
                __stcg(reinterpret_cast<uint4*>(out + c * S + sv * V), make_uint4(w[0], w[1], w[2], w[3]));
            }
        } else {
            const int ns = (int)(S - s0 < TS ? S - s0 : TS), nc = CC - c0 < TC ? CC - c0 : TC;
            for (int i = threadIdx.x; i < TS * TC; i += 256) {
                const int s = i / TC, c = i - s * TC;
                if (s < ns && c < nc) tile[s * TC + c] = in[s * C + c];
            }
            __syncthreads();
            for (int i = threadIdx.x; i < TS * TC; i += 256) {
                const int c = i / TS, s = i - c * TS;
                if (s < ns && c < nc) out[c * S + s] = tile[s * TC + c];
            }
        }
        __syncthreads();
    }
}
