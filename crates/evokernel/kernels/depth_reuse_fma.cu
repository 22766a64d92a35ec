// depth_reuse_fma: depth_reuse's rotation on the FMA pipes, for f32 (exact: every
// product is an FFMA in f32, as in smem_tile) and for any dtype where tensor-core tiles
// do not fit. Input slice z reaches output depths z - kd, kd < KD, so each thread keeps
// KD rotating rows of OUT_W accumulators and every slice is read from shared memory
// once, not KD times (smem_tile reads KD slices per output depth: the seed's f32 took
// 1.50 ms, 20% of its floor, docs/perf.md).
// A block owns (n, c, a chunk of DCHUNK output depths, a region of TY output rows x
// TX * OUT_W output columns); thread (tx, ty) owns OUT_W consecutive outputs of one row.
// Slices arrive by 16-byte cp.async into a ring of STAGES + 1 slices of the region (STAGES
// 0: 2 KD slices, KD of them behind each barrier).
// Slice column 0 holds input column g0 = (region's first output column) * SW - pw - S,
// a multiple of the vector E (S = (-pw) mod E), so every copy is aligned; a thread's
// window starts at column tx * OUT_W * SW (a multiple of E) and its taps at + S.
// The weights stay in registers (KD * KH * KW of them). Depth steps are unit; H stride
// and dilation are arguments, W's (SW, DW) compiled in.
// COPY: bytes an async copy moves. 16 where input rows are whole chunks (the width a
// multiple of E); 4 where they are not (f32 of any width, 16-bit types of even width:
// X3D's and ResNet's 14- and 28-wide planes): a chunk then goes as 4-byte pieces, those
// past the row's end zero-filled (only a row's last chunk can straddle its end: chunks
// start on multiples of E from column 0).
// PLANES (KD = 1, no depth padding): the N x C x D planes, each a run of H x W elements
// in (n, c, d) order, are walked as one sequence of depths, so a block's ring and table
// run across planes (a 1-D or 2-D layer's block had one slice: its copies never
// overlapped its FMAs). Planes of a chunk may change channel: each slot carries its
// plane's weights as f32 after the slice, written by the fetch that fills it.
template <typename T, int KD, int KH, int KW, int OUT_W, int SW, int DW, int S, int COPY, int TX, int TY,
          int DCHUNK, int STAGES, int MINB, bool TABLE, int PLANES, int EPI>
__global__ void __launch_bounds__(TX * TY, MINB) depth_reuse_fma_dwconv(ConvArgs a, EpiArgs e) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    constexpr int E = 16 / (int)sizeof(T);                 // elements per 16-byte chunk
    static_assert(COPY == 16 || COPY == 4, "copies of whole chunks or of 4-byte pieces");
    constexpr int PIECE = COPY / (int)sizeof(T);           // elements a copy moves
    constexpr int SPAN = (OUT_W - 1) * SW + (KW - 1) * DW + 1;
    constexpr int NCH = (S + SPAN + E - 1) / E;             // chunks per thread window
    constexpr int STEP = OUT_W * SW;                        // columns between windows
    static_assert(STEP % E == 0, "windows must start on 16-byte chunks");
    constexpr int FILL_CH = (TX - 1) * STEP / E + NCH;      // chunks a slice row holds
    // Row stride in chunks, = TX * STEP / E mod 8 (8 chunks: the 32 banks), so that any 8
    // consecutive threads, whose LDS.128 go out together, sit on distinct chunks mod 8
    // (distinct banks) wherever their row breaks: thread t starts at t * STEP / E mod 8.
    // Mirrored by slice_row_chunks in the descriptor.
    constexpr int ROW_CH = FILL_CH + ((TX * (STEP / E) - FILL_CH) % 8 + 8) % 8;
    constexpr int WS = ROW_CH * E;
    const int hs = (TY - 1) * a.sh + (KH - 1) * a.dh + 1;  // slice rows
    const int slice_elems = hs * WS;
    static_assert(!PLANES || KD == 1, "PLANES walks planes of KD = 1");
    constexpr int TAPS = KD * KH * KW, WEIGHT_BYTES = PLANES ? (TAPS * 4 + 15) / 16 * 16 : 0;
    // A slot: the slice, then (PLANES) its plane's weights. Mirrors shared_bytes.
    const int slot_bytes = slice_elems * (int)sizeof(T) + WEIGHT_BYTES;
    const T* __restrict__ x = static_cast<const T*>(a.x);
    const T* __restrict__ w = static_cast<const T*>(a.w);
    T* __restrict__ y = static_cast<T*>(a.y);

    const int col_groups = (a.ow + OUT_W - 1) / OUT_W;
    const int col_regions = (col_groups + TX - 1) / TX;
    const int regions = ((a.oh + TY - 1) / TY) * col_regions;
    // Output and input depths (PLANES: every plane; then id = od; the host keeps the
    // count under 2^31).
    const int od = PLANES ? (int)(a.n * a.c) * a.od : a.od, id = PLANES ? od : a.id;
    const int chunks = (od + DCHUNK - 1) / DCHUNK;
    const long long b = blockIdx.x;
    const int region = (int)(b % regions);
    const int per_chunk = (od + chunks - 1) / chunks;  // balanced, as in depth_reuse.cu
    const int d0 = (int)((b / regions) % chunks) * per_chunk;
    const int d1 = min(d0 + per_chunk, od);
    const long long nc = PLANES ? 0 : b / ((long long)regions * chunks);
    const long long c = nc % a.c;  // (PLANES: each step's own, below)
    const int oh0 = (region / col_regions) * TY, ow0 = (region % col_regions) * TX * OUT_W;
    const int gh0 = oh0 * a.sh - a.ph;
    const int g0 = ow0 * SW - a.pw - S;
    const T* xin = x + nc * (long long)id * a.ih * a.iw;
    // PLANES: walked plane p (of image p / (C * D)) is channel (p / D) mod C's.
    auto plane_channel = [&](int p) { return (long long)(p / a.od) % a.c; };
    // Where slice chunk j comes from: its offset in an input depth plane, or -1 for
    // padding. It is the same every step but for the depth, so with TABLE (blocks of at
    // least 4 steps) the block works it out once into a table at the start of shared
    // memory and each copy costs one LDS instead of ~45 instructions of index math (seed
    // f32 0.532 -> 0.491 ms, run 51); offsets held in registers instead spilled. The ring
    // follows the table and holds at most as many slices as a block has steps.
    const int fills = hs * FILL_CH;
    auto source_of = [&](int j) {
        const int r = j / FILL_CH, k = j - r * FILL_CH;
        const int gh = gh0 + r, gw = g0 + k * E;
        return (gh >= 0 && gh < a.ih && gw >= 0 && gw < a.iw) ? gh * a.iw + gw : -1;
    };
    int* fill_table = reinterpret_cast<int*>(smem_raw);
    const int table_bytes = TABLE ? (fills * 4 + 15) & ~15 : 0;
    T* ring = reinterpret_cast<T*>(smem_raw + table_bytes);
    const unsigned ring_addr = (unsigned)__cvta_generic_to_shared(smem_raw) + table_bytes;
    if constexpr (TABLE) {
        for (int j = threadIdx.x; j < fills; j += TX * TY) fill_table[j] = source_of(j);
        __syncthreads();
    }
    const long long depth_plane = (long long)a.ih * a.iw;

    // Step s reads padded depth d0 + s into buffer s mod (STAGES + 1); every step commits a group.
    const int steps = d1 - d0 + KD - 1;
    auto fetch = [&](int s, int buffer) {
        if (s < steps) {
            const int zd = d0 + s - a.pd;
            const bool depth_inside = zd >= 0 && zd < id;
            const T* src = xin + (depth_inside ? zd : 0) * depth_plane;
            // (Without PLANES as before them: the same SASS.)
            const unsigned buf = ring_addr + (unsigned)(PLANES ? buffer * slot_bytes : buffer * slice_elems * (int)sizeof(T));
            if constexpr (PLANES) {
                // The plane's weights, read through L1: the planes of a chunk share a few
                // channels.
                float* wslot = reinterpret_cast<float*>(smem_raw + table_bytes + buffer * slot_bytes +
                                                        slice_elems * (int)sizeof(T));
                const long long pc = plane_channel(zd);
                for (int t = threadIdx.x; t < TAPS; t += TX * TY) wslot[t] = to_f32(__ldg(w + pc * TAPS + t));
            }
            for (int j = threadIdx.x; j < fills; j += TX * TY) {
                const int off = TABLE ? fill_table[j] : source_of(j);
                const int r = j / FILL_CH;  // a multiply and shift: FILL_CH is a constant
                const unsigned dst = buf + (unsigned)(((r * (ROW_CH - FILL_CH)) + j) * 16);
                if constexpr (COPY == 16) {
                    if (depth_inside && off >= 0) {
                        cp_async16(dst, src + off);
                    } else {
                        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(dst), "r"(0u));
                    }
                } else {
                    // The chunk's elements inside the row (its first is, where off >= 0).
                    const int inside = depth_inside && off >= 0 ? a.iw - (g0 + (j - r * FILL_CH) * E) : 0;
#pragma unroll
                    for (int p = 0; p < E / PIECE; ++p) {
                        const bool ok = p * PIECE < inside;
                        cl_copy_async<COPY>(dst + p * COPY, ok ? src + off + p * PIECE : src, ok);
                    }
                }
            }
        }
        cp_async_commit();
    };

    float wr[KD * KH * KW];
    if constexpr (!PLANES) {
#pragma unroll
        for (int t = 0; t < KD * KH * KW; ++t) wr[t] = to_f32(w[c * (KD * KH * KW) + t]);
    }

    const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;
    const int oh = oh0 + ty, ow = ow0 + tx * OUT_W;
    const bool active = oh < a.oh && ow < a.ow;
    const int win_off = ty * a.sh * WS + tx * STEP;
    const long long plane = (long long)a.oh * a.ow;
    T* yrow = y + (nc * od + d0) * plane + (long long)oh * a.ow + ow;
    const bool full_vector = ow + OUT_W <= a.ow && (a.ow % E) == 0 && (OUT_W % E) == 0;

    float bias = PLANES ? 0.f : bias_of<T, EPI>(e, c);
    float acc[KD][OUT_W];
#pragma unroll
    for (int q = 0; q < KD; ++q)
#pragma unroll
        for (int o = 0; o < OUT_W; ++o) acc[q][o] = 0.f;
    auto consume = [&](int s, int u, int cur) {
        if (active) {
            if constexpr (PLANES) {
                // This plane's weights and bias (one broadcast LDS.128 for four taps).
                const float4* wslot = reinterpret_cast<const float4*>(
                    smem_raw + table_bytes + cur * slot_bytes + slice_elems * (int)sizeof(T));
#pragma unroll
                for (int q = 0; q < TAPS / 4; ++q) {
                    const float4 v = wslot[q];
                    wr[4 * q] = v.x;
                    wr[4 * q + 1] = v.y;
                    wr[4 * q + 2] = v.z;
                    wr[4 * q + 3] = v.w;
                }
#pragma unroll
                for (int t = TAPS / 4 * 4; t < TAPS; ++t) wr[t] = reinterpret_cast<const float*>(wslot)[t];
                bias = bias_of<T, EPI>(e, plane_channel(d0 + s));
            }
            // The residuals of the depth this step completes, as raw 16-byte vectors loaded
            // ahead of the FMAs (unpacked at the store).
            constexpr int RV = (EPI & 8) != 0 ? OUT_W / E : 0;
            uint4 res_raw[RV > 0 ? RV : 1];
            if constexpr (RV > 0) {
                if (s >= KD - 1 && full_vector) {
                    const uint4* rp = reinterpret_cast<const uint4*>(
                        static_cast<const T*>(e.residual) + ((yrow - y) + (long long)(s - (KD - 1)) * plane));
#pragma unroll
                    for (int q = 0; q < RV; ++q) res_raw[q] = __ldg(rp + q);
                }
            }
            const T* slice = (PLANES ? reinterpret_cast<const T*>(smem_raw + table_bytes + cur * slot_bytes)
                                     : ring + cur * slice_elems) + win_off;
#pragma unroll
            for (int kh = 0; kh < KH; ++kh) {
                const T* row = slice + kh * a.dh * WS;
                float win[NCH * E];
#pragma unroll
                for (int q = 0; q < NCH; ++q) shared_chunk_to_f32(row + q * E, win + q * E);
#pragma unroll
                for (int kd = 0; kd < KD; ++kd) {
                    // Depths before the chunk (first KD - 1 steps) would dirty slots
                    // still to be used; those past its end are never stored.
                    if (s - kd < 0) continue;
                    float* dst = acc[(u - kd + KD) % KD];
#pragma unroll
                    for (int kw = 0; kw < KW; ++kw) {
                        const float wv = wr[(kd * KH + kh) * KW + kw];
#pragma unroll
                        for (int o = 0; o < OUT_W; ++o) dst[o] = fmaf(win[S + o * SW + kw * DW], wv, dst[o]);
                    }
                }
            }
            if (s >= KD - 1) {  // depth d0 + s - KD + 1 has had all its slices
                float* done = acc[(u + 1) % KD];
                T* out = yrow + (long long)(s - (KD - 1)) * plane;
                const long long at = out - y;
                if (full_vector) {
                    if constexpr (EPI != 0) {
                        float res[OUT_W];
#pragma unroll
                        for (int q = 0; q < RV; ++q) unpack16(res_raw[q], T(), res + q * E);
#pragma unroll
                        for (int o = 0; o < OUT_W; ++o) done[o] = finish<EPI, T>(done[o], bias, RV > 0 ? res[o] : 0.f);
                    }
#pragma unroll
                    for (int q = 0; q < OUT_W / E; ++q) Vec16<T, E>::store(out + q * E, done + q * E);
                } else {
#pragma unroll
                    for (int o = 0; o < OUT_W; ++o)
                        if (ow + o < a.ow)
                            out[o] = from_f32<T>(finish<EPI, T>(done[o], bias, residual_at<T, EPI>(e, at + o)));
                }
#pragma unroll
                for (int o = 0; o < OUT_W; ++o) done[o] = 0.f;
            }
        }
    };
    // STAGES 0: KD slices a barrier (walk_slice_groups); else a barrier a slice with
    // STAGES slices in flight.
    if constexpr (STAGES == 0)
        walk_slice_groups<KD>(steps, fetch, consume);
    else
        walk_slices<KD, STAGES>(steps, fetch, consume);
}
