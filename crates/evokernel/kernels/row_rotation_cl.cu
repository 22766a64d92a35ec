// row_rotation_cl: channels-last layers of one kernel depth (2-D, or 3-D with a 1 x KH x KW
// kernel) at any H stride and dilation. A block owns (a plane, CB = LANES * CV channels,
// a strip of TX runs of OUT_W outputs along W, a chunk of at most ROWS output rows) and
// walks the chunk's input rows once, in order: each input row feeds every output row it
// reaches from accumulators that rotate through registers (NA output rows live at once),
// so the block reads its input rows once where a tile of output rows re-reads its halo
// (depth_reuse_fma_cl's plane walk: 19 input rows for 8 output rows at stride 2, and a
// ring of 19-row slices that held it to 3 blocks an SM on efficientnet-k5s2).
// Thread t takes channel vector t % LANES and run t / LANES. A ring slot is one input row,
// [pixel][CB channels], each run's pixels shifted SKEW bytes past the run before so the
// runs a warp reads fall in other banks. Rows arrive by 16-byte cp.async, one chunk of E
// channels of one pixel each, their sources worked out once per thread. H stride and
// dilation are compiled in (the rotation's period SH * NA is unrolled), as are W's.
template <typename T, int KH, int KW, int SH, int DH, int SW, int DW, int OUT_W, int CV, int LANES, int TX,
          int ROWS, int STAGES, int MINB, int EPI>
__global__ void __launch_bounds__(LANES * TX, MINB) row_rotation_cl_dwconv(ConvArgs a, EpiArgs e) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    constexpr int THREADS = LANES * TX;
    constexpr int E = 16 / (int)sizeof(T);  // channels per 16-byte chunk
    constexpr int CB = LANES * CV;          // channels per block
    static_assert(CB % E == 0, "a block's channels are whole chunks");
    constexpr int CPP = CB / E;             // chunks per pixel
    constexpr int PIXB = CB * (int)sizeof(T);
    constexpr int RUNPX = OUT_W * SW;       // pixels from one run's window to the next's
    constexpr int SKEW = PIXB % 128;        // mirrors slot_bytes in the descriptor
    constexpr int SPAN = (OUT_W - 1) * SW + (KW - 1) * DW + 1;
    constexpr int WS = (TX * OUT_W - 1) * SW + (KW - 1) * DW + 1;  // pixels of a slot
    constexpr int SLOT = (WS * PIXB + ((WS - 1) / RUNPX) * SKEW + 15) / 16 * 16;
    constexpr int SPANH = (KH - 1) * DH + 1;  // input rows one output row reads
    constexpr int NA = (SPANH + SH - 1) / SH;  // output rows live at once
    constexpr int PERIOD = SH * NA;           // steps after which the slots repeat
    constexpr int FILLS = WS * CPP;
    constexpr int FPT = (FILLS + THREADS - 1) / THREADS;  // a thread's chunks of a row
    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ w = static_cast<const T*>(a.w);
    T* __restrict__ y = static_cast<T*>(a.y);

    // Blocks in (plane, channel group, strip, row chunk) order: a plane's chunks, which
    // share their edge rows, run side by side.
    const int chunks = (a.oh + ROWS - 1) / ROWS;
    const int per_chunk = (a.oh + chunks - 1) / chunks;  // balanced, as in depth_reuse.cu
    const int strips = (a.ow + TX * OUT_W - 1) / (TX * OUT_W);
    const int groups = (int)((a.c + CB - 1) / CB);
    long long b = blockIdx.x;
    const int chunk = (int)(b % chunks);
    b /= chunks;
    const int strip = (int)(b % strips);
    b /= strips;
    const int cg = (int)(b % groups);
    const long long plane = b / groups;  // n * od + output depth
    const int r0 = chunk * per_chunk, rows = min(per_chunk, a.oh - r0);
    if (rows <= 0) return;
    const long long n = plane / a.od;
    const int zd = (int)(plane % a.od) * a.sd - a.pd;  // the one input depth it reads
    const bool depth_inside = zd >= 0 && zd < a.id;
    const T* xin = x + (n * a.id + (depth_inside ? zd : 0)) * (long long)a.ih * a.iw * a.c;
    const int c0 = cg * CB, ow0 = strip * TX * OUT_W;
    const int gh0 = r0 * a.sh - a.ph, gw0 = ow0 * SW - a.pw;
    // Where this thread's fill chunks come from in an input row (-1: padding or past the
    // channels, zero-filled) and where they land in a slot.
    int src[FPT];
    unsigned dst[FPT];
#pragma unroll
    for (int i = 0; i < FPT; ++i) {
        const int j = threadIdx.x + i * THREADS;
        const int px = j / CPP, k = j - px * CPP;
        const int gw = gw0 + px, ch = c0 + k * E;
        src[i] = gw >= 0 && gw < a.iw && ch < a.c ? gw * (int)a.c + ch : -1;
        dst[i] = (unsigned)(px * PIXB + (px / RUNPX) * SKEW + k * 16);
    }
    const unsigned ring = (unsigned)__cvta_generic_to_shared(smem_raw);
    const int steps = (rows - 1) * SH + SPANH;
    const int row_elems = a.iw * (int)a.c;
    auto fetch = [&](int s, int buffer) {
        if (s < steps) {
            const int g = gh0 + s;
            const bool row_inside = depth_inside && g >= 0 && g < a.ih;
            const T* row = xin + (row_inside ? g : 0) * row_elems;
            const unsigned slot = ring + (unsigned)(buffer * SLOT);
#pragma unroll
            for (int i = 0; i < FPT; ++i) {
                if (FILLS % THREADS != 0 && threadIdx.x + i * THREADS >= FILLS) break;
                if (row_inside && src[i] >= 0) {
                    cp_async16(slot + dst[i], row + src[i]);
                } else {
                    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(slot + dst[i]), "r"(0u));
                }
            }
        }
        cp_async_commit();
    };

    const int lane_c = threadIdx.x % LANES, tx = threadIdx.x / LANES;
    const int c = c0 + lane_c * CV;
    const int ow = ow0 + tx * OUT_W;
    const bool active = ow < a.ow && c < a.c;
    float wr[KH * KW][CV];
#pragma unroll
    for (int t = 0; t < KH * KW; ++t)
#pragma unroll
        for (int v = 0; v < CV; ++v) wr[t][v] = active ? to_f32(w[(long long)(c + v) * (KH * KW) + t]) : 0.f;
    float bias[CV];
#pragma unroll
    for (int v = 0; v < CV; ++v) bias[v] = active ? bias_of<T, EPI>(e, c + v) : 0.f;
    T* yrow = y + ((plane * a.oh + r0) * a.ow + ow) * a.c + c;
    const unsigned char* window = smem_raw + tx * (RUNPX * PIXB + SKEW) + lane_c * CV * (int)sizeof(T);

    float acc[NA][OUT_W][CV];
#pragma unroll
    for (int q = 0; q < NA; ++q)
#pragma unroll
        for (int o = 0; o < OUT_W; ++o)
#pragma unroll
            for (int v = 0; v < CV; ++v) acc[q][o][v] = 0.f;
    // Step s reads input row gh0 + s; with u = s mod PERIOD known after unrolling, kernel
    // row kh feeds output row (s - kh DH) / SH where that divides, in slot ((u - kh DH) /
    // SH) mod NA; output row (s - SPANH + 1) / SH has had its last row.
    walk_slices<PERIOD, STAGES>(steps, fetch, [&](int s, int u, int cur) {
        if (!active) return;
        const unsigned char* slot = window + cur * SLOT;
        float win[SPAN][CV];
#pragma unroll
        for (int p = 0; p < SPAN; ++p)
            channels_to_f32<T, CV>(reinterpret_cast<const T*>(slot + p * PIXB + (p / RUNPX) * SKEW), win[p]);
#pragma unroll
        for (int kh = 0; kh < KH; ++kh) {
            const int rel = u - kh * DH;
            if (((rel % SH) + SH) % SH != 0) continue;
            // Rows before the chunk would dirty slots still to be used; those past its
            // end are never stored.
            if (s < kh * DH) continue;
            auto& to = acc[((rel / SH) % NA + NA) % NA];
#pragma unroll
            for (int kw = 0; kw < KW; ++kw)
#pragma unroll
                for (int o = 0; o < OUT_W; ++o)
#pragma unroll
                    for (int v = 0; v < CV; ++v) to[o][v] = fmaf(win[o * SW + kw * DW][v], wr[kh * KW + kw][v], to[o][v]);
        }
        const int last = u - (SPANH - 1);
        if (((last % SH) + SH) % SH != 0 || s < SPANH - 1) return;
        const int r = (s - (SPANH - 1)) / SH;
        auto& done = acc[((last / SH) % NA + NA) % NA];
        // r < rows: the walk ends with the chunk's last row, so rows past it never finish.
        store_run_cl<T, CV, OUT_W, EPI>(e, y, yrow + (long long)r * a.ow * a.c, ow, a.ow, a.c, bias, done);
    });
}
