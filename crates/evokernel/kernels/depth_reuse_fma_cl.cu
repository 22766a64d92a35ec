// depth_reuse_fma_cl: depth_reuse_fma's rotation on channels-last data, with no
// transposes: channels are contiguous in memory and in shared memory, so lanes split
// the channels and a pixel's CV channels are one shared load for a lane.
// A block owns (n, a group of CB = LANES * CV channels, a chunk of DCHUNK output depths,
// a region of TY output rows x TX runs of OUT_W outputs along W). Thread t takes channel
// vector t % LANES, row (t / LANES) % TY and run t / (LANES * TY): a warp's lanes read
// neighbouring channels of one or a few rows, never of two runs of one row (those sit
// OUT_W pixels apart, the same banks). Slices arrive by 16-byte cp.async (E channels of
// one pixel each) into a ring of STAGES + 1 slices laid out [row][pixel][CB channels];
// rows are padded so the few rows a warp reads fall in different banks. KD rotating rows
// of OUT_W x CV accumulators per thread; the weights of the thread's CV channels stay in
// registers. Unit depth steps; H stride and dilation are arguments, W's compiled in;
// the channel count is a multiple of E (16-byte pixel vectors).
// PLANES (one kernel depth, no depth padding): the N x D planes, one run of H x W x C
// each in (n, d) order, are walked as the depths of one image (ConvSpec::
// planes_as_depths), so a block's chunk runs across images: a 2-D layer's block had one
// slice, its copies never overlapping its FMAs, and filled its source table for it.
template <typename T, int KD, int KH, int KW, int OUT_W, int SW, int DW, int CV, int LANES, int TX, int TY,
          int DCHUNK, int STAGES, int MINB, bool TABLE, int PLANES, int EPI>
__global__ void __launch_bounds__(LANES * TX * TY, MINB) depth_reuse_fma_cl_dwconv(ConvArgs a, EpiArgs e) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    constexpr int E = 16 / (int)sizeof(T);  // channels per 16-byte chunk
    constexpr int CB = LANES * CV;          // channels per block
    static_assert(CB % E == 0, "a block's channels are whole chunks");
    constexpr int CPP = CB / E;             // chunks per pixel
    constexpr int SPAN = (OUT_W - 1) * SW + (KW - 1) * DW + 1;
    constexpr int WS = (TX * OUT_W - 1) * SW + (KW - 1) * DW + 1;  // pixels per slice row
    // Row stride in chunks, padded so that consecutive rows start one warp-row segment
    // (LANES * CV channels) apart in the banks. Mirrors row_chunks in the descriptor.
    constexpr int SEG = (CB * (int)sizeof(T)) % 128 / 16;
    constexpr int RAW = WS * CPP;
    constexpr int ROW_CH = SEG == 0 ? RAW : RAW + ((SEG - RAW % 8) % 8 + 8) % 8;
    const int hs = (TY - 1) * a.sh + (KH - 1) * a.dh + 1;
    const int slice_elems = hs * ROW_CH * E;
    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ w = static_cast<const T*>(a.w);
    T* __restrict__ y = static_cast<T*>(a.y);

    const int runs = (a.ow + OUT_W - 1) / OUT_W;
    const int col_regions = (runs + TX - 1) / TX;
    const int regions = ((a.oh + TY - 1) / TY) * col_regions;
    // Output and input depths (PLANES: the planes of every image; then id = od).
    const int od = PLANES ? (int)a.n * a.od : a.od, id = PLANES ? od : a.id;
    const int chunks = (od + DCHUNK - 1) / DCHUNK;
    const int groups = (int)((a.c + CB - 1) / CB);
    const long long b = blockIdx.x;
    const int region = (int)(b % regions);
    const int per_chunk = (od + chunks - 1) / chunks;  // balanced, as in depth_reuse.cu
    const int d0 = (int)((b / regions) % chunks) * per_chunk;
    const int d1 = min(d0 + per_chunk, od);
    const long long rest = b / ((long long)regions * chunks);
    const int cg = (int)(rest % groups);
    const long long n = PLANES ? 0 : rest / groups;
    const int c0 = cg * CB;
    const int oh0 = (region / col_regions) * TY, ow0 = (region % col_regions) * TX * OUT_W;
    const int gh0 = oh0 * a.sh - a.ph, gw0 = ow0 * SW - a.pw;
    const T* xin = x + n * (long long)id * a.ih * a.iw * a.c;
    // Where slice chunk j comes from (offset in an input depth slice, or -1), worked out
    // once into a table before the ring when a block has at least 4 steps, as in
    // depth_reuse_fma.cu; the ring holds at most as many slices as a block has steps.
    const int fills = hs * WS * CPP;
    auto source_of = [&](int j) {
        const int k = j % CPP, px = j / CPP;
        const int r = px / WS, col = px - r * WS;
        const int gh = gh0 + r, gw = gw0 + col, ch = c0 + k * E;
        const bool inside = gh >= 0 && gh < a.ih && gw >= 0 && gw < a.iw && ch < a.c;
        return inside ? (gh * a.iw + gw) * (int)a.c + ch : -1;
    };
    int* fill_table = reinterpret_cast<int*>(smem_raw);
    const int table_bytes = TABLE ? (fills * 4 + 15) & ~15 : 0;
    T* ring = reinterpret_cast<T*>(smem_raw + table_bytes);
    const unsigned ring_addr = (unsigned)__cvta_generic_to_shared(smem_raw) + table_bytes;
    if constexpr (TABLE) {
        for (int j = threadIdx.x; j < fills; j += LANES * TX * TY) fill_table[j] = source_of(j);
        __syncthreads();
    }
    const long long depth_plane = (long long)a.ih * a.iw * a.c;

    const int steps = d1 - d0 + KD - 1;
    auto fetch = [&](int s, int buffer) {
        if (s < steps) {
            const int zd = d0 + s - a.pd;
            const bool depth_inside = zd >= 0 && zd < id;
            const T* src = xin + (depth_inside ? zd : 0) * depth_plane;
            const unsigned buf = ring_addr + (unsigned)(buffer * slice_elems * (int)sizeof(T));
            for (int j = threadIdx.x; j < fills; j += LANES * TX * TY) {
                const int off = TABLE ? fill_table[j] : source_of(j);
                const int r = j / (WS * CPP);  // a multiply and shift: a constant divisor
                const unsigned dst = buf + (unsigned)((r * (ROW_CH - WS * CPP) + j) * 16);
                if (depth_inside && off >= 0) {
                    cp_async16(dst, src + off);
                } else {
                    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(dst), "r"(0u));
                }
            }
        }
        cp_async_commit();
    };

    const int lane_c = threadIdx.x % LANES;
    const int ty = (threadIdx.x / LANES) % TY, tx = threadIdx.x / (LANES * TY);
    const int c = c0 + lane_c * CV;
    const int oh = oh0 + ty, ow = ow0 + tx * OUT_W;
    const bool active = oh < a.oh && ow < a.ow && c < a.c;

    float wr[KD * KH * KW][CV];
#pragma unroll
    for (int t = 0; t < KD * KH * KW; ++t)
#pragma unroll
        for (int v = 0; v < CV; ++v) wr[t][v] = active ? to_f32(w[(long long)(c + v) * (KD * KH * KW) + t]) : 0.f;

    const int win_off = ty * a.sh * ROW_CH * E + tx * OUT_W * SW * CB + lane_c * CV;
    const long long pixel_plane = (long long)a.oh * a.ow;
    T* ypix = y + ((n * od + d0) * pixel_plane + (long long)oh * a.ow + ow) * a.c + c;
    float bias[CV];
#pragma unroll
    for (int v = 0; v < CV; ++v) bias[v] = active ? bias_of<T, EPI>(e, c + v) : 0.f;

    float acc[KD][OUT_W][CV];
#pragma unroll
    for (int q = 0; q < KD; ++q)
#pragma unroll
        for (int o = 0; o < OUT_W; ++o)
#pragma unroll
            for (int v = 0; v < CV; ++v) acc[q][o][v] = 0.f;
    walk_slices<KD, STAGES>(steps, fetch, [&](int s, int u, int cur) {
        if (active) {
            const T* slice = ring + cur * slice_elems + win_off;
#pragma unroll
            for (int kh = 0; kh < KH; ++kh) {
                const T* row = slice + kh * a.dh * ROW_CH * E;
                float win[SPAN][CV];
#pragma unroll
                for (int p = 0; p < SPAN; ++p) channels_to_f32<T, CV>(row + p * CB, win[p]);
#pragma unroll
                for (int kd = 0; kd < KD; ++kd) {
                    // Depths before the chunk (first KD - 1 steps) would dirty slots
                    // still to be used; those past its end are never stored.
                    if (s - kd < 0) continue;
                    auto& dst = acc[(u - kd + KD) % KD];
#pragma unroll
                    for (int kw = 0; kw < KW; ++kw) {
                        const float* wv = wr[(kd * KH + kh) * KW + kw];
#pragma unroll
                        for (int o = 0; o < OUT_W; ++o)
#pragma unroll
                            for (int v = 0; v < CV; ++v)
                                dst[o][v] = fmaf(win[o * SW + kw * DW][v], wv[v], dst[o][v]);
                    }
                }
            }
            if (s >= KD - 1) {  // depth d0 + s - KD + 1 has had all its slices
                auto& done = acc[(u + 1) % KD];
                T* out = ypix + (long long)(s - (KD - 1)) * pixel_plane * a.c;
                store_run_cl<T, CV, OUT_W, EPI>(e, y, out, ow, a.ow, a.c, bias, done);
            }
        }
    });
}
