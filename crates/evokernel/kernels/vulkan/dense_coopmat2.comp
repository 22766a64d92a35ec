#version 450
// dense_coopmat2 (Vulkan, VK_NV_cooperative_matrix2): dense_coopmat's implicit GEMM with
// workgroup-scope cooperative matrices: the workgroup's whole BM x BN tile is one
// accumulator, each K step one BM x BK by BK x BN product, and the driver's compiler
// splits it among the subgroups and picks the instructions (dense_coopmat splits it by
// hand into 16 x 16 subgroup tiles). The gather is dense_coopmat's: the GEMM is M =
// outputs (n, d, h, w), N = Cout, K = taps x Cin_pad (Cin rounded up to BK so a K step
// reads one tap); A's rows are the input pixels tap t of output m reads (zero in the
// padding or past Cin), B the weights packed by the host as [tap][Cin_pad][Cout_pad8].
// Each invocation loads its 16-byte pieces of step s + 1 (AHEAD = 2: s + 2, a second
// register set holding s + 1) into registers (a pixel index a row computed once plus the
// tap's fixed offset; taps followed by counters) while the workgroup multiplies step s
// from one of two shared buffers (rows padded by 16 bytes), then stores step s + 1 to the
// other: one barrier a step. The loops have no branch but the loop's own: loads past the
// last step read valid addresses (B's step clamped, A's taps past the kernel found
// outside the input) and their stores go to the buffer no one reads again, so NVIDIA's
// compiler schedules a step as one block (H200 run 428, the branches removed: ResNet-50's
// 14 x 14 at 96 x 128 0.0387 -> 0.0361 ms, 7 x 7 0.0522 -> 0.0491, the VAE decoder 0.3857
// -> 0.3627; late loads keep theirs, below). The epilogue converts the
// accumulator to f16 through shared memory and writes 16-byte row pieces. (Handing B to
// the compiler's tensor-addressed loads, and the epilogue to a tensor-addressed store,
// ran 1.2-1.4x and 1.05-1.2x slower on NVIDIA's driver: run 381.) Needs SPIR-V 1.6 (the
// host compiles it for Vulkan 1.3) and the device's workgroup-scope, flexible-dimension
// f16 x f16 + f32 matrices; the workgroup size is one the device lists for them.
#extension GL_KHR_memory_scope_semantics : enable
#extension GL_KHR_cooperative_matrix : enable
#extension GL_NV_cooperative_matrix2 : enable
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : enable
#extension GL_KHR_shader_subgroup_basic : enable

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int BM = 64;        // output pixels a workgroup
layout(constant_id = 2) const int BN = 64;        // output channels a workgroup
layout(constant_id = 3) const int THREADS = 128;  // the workgroup's invocations
layout(constant_id = 4) const int KD = 1;
layout(constant_id = 5) const int KH = 1;
layout(constant_id = 6) const int KW = 1;
layout(constant_id = 7) const int SH = 1;
layout(constant_id = 8) const int SW = 1;
layout(constant_id = 9) const int DH = 1;
layout(constant_id = 10) const int DW = 1;
// 16-byte pieces of shared memory: max(2 * STAGE, BM * C_ROW) (the host's shared_bytes).
layout(constant_id = 11) const int SMEM = 1;
layout(constant_id = 12) const int BK = 32;       // K a step: 16, 32 or 64
// K split into SPLITS contiguous ranges of steps, a workgroup each (tiles too few to fill
// the GPU): each stores its f32 partial tile in the scratch buffer and counts itself in on
// its tile's counter; the last to arrive adds the partials in split order (the same bits
// whatever order they finish in), writes the f16 outputs and resets the counter.
layout(constant_id = 13) const int SPLITS = 1;
// K steps whose global loads are in flight while a step multiplies: 1 (the next step's,
// one register set) or 2 (the next two, two sets: each load has two multiplies to land).
layout(constant_id = 14) const int AHEAD = 1;
// Products a K step is multiplied in (the host's #define; 1 without it): 1 (one BM x BK
// by BK x BN product) or 2 or 4 of K = BK / PRODUCTS each from the same shared stage,
// written out (not a loop: NVIDIA's compiler made the one-product step 6-11% slower
// through a loop of one trip, run 410). LATE_LOADS (AHEAD = 2 only): see the main loop.
#ifndef PRODUCTS
#define PRODUCTS 1
#endif
const int A_PER_ROW = BK / 8;
// Shared rows in 16-byte units (8 halves), padded by one.
const int A_ROW = BK / 8 + 1, B_ROW = BN / 8 + 1, C_ROW = BN / 8 + 1;
const int A_TILE = BM * A_ROW, B_TILE = BK * B_ROW;
const int STAGE = A_TILE + B_TILE;
const int A_PIECES = BM * (BK / 8), B_PIECES = BK * (BN / 8);
// Pieces an invocation loads a step. B's are an exact multiple; A's need not be (BM a
// multiple of the matrices' granularity, not of a power of two, so that the tiles fill
// the GPU's SMs): the last round's invocations past A_PIECES load nothing.
const int A_LOADS = (A_PIECES + THREADS - 1) / THREADS, B_LOADS = B_PIECES / THREADS;
const bool A_EXACT = A_PIECES % THREADS == 0;

layout(std430, set = 0, binding = 0) readonly buffer Input { uvec4 x[]; };   // f16 x 8
layout(std430, set = 0, binding = 1) readonly buffer Weight { uvec4 w[]; };  // packed
layout(std430, set = 0, binding = 2) writeonly buffer Output { uvec4 y[]; };
// Scratch (SPLITS > 1): the partial tiles [tile][split][BM][BN] f32, then a counter a tile
// (zero between launches).
layout(std430, set = 0, binding = 3) coherent buffer Partials { float part[]; };
layout(std430, set = 0, binding = 3) coherent buffer PartialVectors { vec4 part4[]; };
layout(std430, set = 0, binding = 3) coherent buffer Counters { uint counter[]; };

// Mirrored by vulkan::dense_coopmat2 (dense_push_fields, then the GEMM's sizes; 4-byte
// fields, 92 bytes).
layout(push_constant) uniform Push {
    int n, cin, cout, cpi, cpo;
    int id, ih, iw, od, oh, ow;
    int sd, dd, pd, ph, pw;
    int channels_last;
    int m_total;      // n * od * oh * ow
    int tiles_n;      // BN-column tiles
    int steps_tap;    // K steps a tap: Cin_pad / BK
    uint groups;      // workgroups that have work: tiles x SPLITS
    int cout_pad8;    // packed B's row length
} p;

shared uvec4 smem[SMEM];
shared bool last_split;

void main() {
    uint g = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (g >= p.groups) return;  // the whole workgroup: before any barrier
    const int tid = int(gl_LocalInvocationID.x);
    const int a_piece = tid % A_PER_ROW, cin8 = p.cin / 8, cout8 = p.cout_pad8 / 8;
    // Whether this invocation has an A piece in round i (every round but the last where
    // A is not exact: a constant the compiler folds).
    #define A_HAS(i) (A_EXACT || (i) < A_LOADS - 1 || tid + (i) * THREADS < A_PIECES)
    const int steps = KD * KH * KW * p.steps_tap;

    // Workgroup g's tile and split (SETUP_TILE; PERSISTENT: again for each tile it takes).
    // A tile's splits are neighbours in the grid (they run at once). This invocation's A
    // pieces: row (tid + i * THREADS) / A_PER_ROW, piece tid % A_PER_ROW of the row's BK
    // channels. The row's output pixel is decomposed once: its first tap's input position
    // (d, h, w) and that position's pixel index, to which a tap adds a fixed offset (the
    // input is linear in d, h, w); pieces past the tile (A not exact) are never loaded nor
    // stored (A_HAS), rows past M never in range. Its B pieces: their offsets within a
    // step's BK rows, or -1 past Cout. The split's steps [s0, s1), and the next step to
    // load as counters: its tap (kd, kh, kw) and channel step within the tap (no division
    // a step; the same in every invocation).
    uint tile, split;
    int m0, n0, s0, s1, ld_cs, ld_kw, ld_kh, ld_kd;
    // B_BLOCK_ROWS (the host's #define; vulkan::dense_winograd_coopmat2): a batch of GEMMs,
    // each B_BLOCK_ROWS rows of M (a multiple of BM) against its own block of packed B
    // (the weight buffer holds the blocks one after another): the tile's block is m0 /
    // B_BLOCK_ROWS.
#ifdef B_BLOCK_ROWS
    int b_block;
    #define B_BLOCK_SETUP() b_block = (m0 / B_BLOCK_ROWS) * steps * BK * cout8;
    #define B_STEP(s) (b_block + min(s, steps - 1) * BK * cout8)
#else
    #define B_BLOCK_SETUP()
    #define B_STEP(s) min(s, steps - 1) * BK * cout8
#endif
    int a_pix[A_LOADS], a_d[A_LOADS], a_h[A_LOADS], a_w[A_LOADS], b_off[B_LOADS];
    #define SETUP_TILE()                                                                          \
    {                                                                                             \
        tile = g / uint(SPLITS);                                                                  \
        split = g % uint(SPLITS);                                                                 \
        m0 = int(tile / uint(p.tiles_n)) * BM;                                                    \
        n0 = int(tile % uint(p.tiles_n)) * BN;                                                    \
        for (int i = 0; i < A_LOADS; ++i) {                                                       \
            const int m = m0 + min((tid + i * THREADS) / A_PER_ROW, BM - 1);                      \
            int q = min(m, p.m_total - 1);                                                        \
            const int ow_ = q % p.ow; q /= p.ow;                                                  \
            const int oh_ = q % p.oh; q /= p.oh;                                                  \
            const int od_ = q % p.od;                                                             \
            const int b = q / p.od;                                                               \
            const int d0 = od_ * p.sd - p.pd;                                                     \
            a_d[i] = m < p.m_total ? d0 : -(1 << 20);                                             \
            a_h[i] = oh_ * SH - p.ph;                                                             \
            a_w[i] = ow_ * SW - p.pw;                                                             \
            a_pix[i] = ((b * p.id + d0) * p.ih + a_h[i]) * p.iw + a_w[i];                         \
        }                                                                                         \
        for (int i = 0; i < B_LOADS; ++i) {                                                       \
            const int piece = tid + i * THREADS, k = piece / (BN / 8), c = n0 / 8 + piece % (BN / 8); \
            b_off[i] = c < cout8 ? k * cout8 + c : -1;                                            \
        }                                                                                         \
        B_BLOCK_SETUP()                                                                           \
        s0 = int(split) * steps / SPLITS;                                                         \
        s1 = (int(split) + 1) * steps / SPLITS;                                                   \
        ld_cs = s0 % p.steps_tap;                                                                 \
        ld_kw = (s0 / p.steps_tap) % KW;                                                          \
        ld_kh = (s0 / (p.steps_tap * KW)) % KH;                                                   \
        ld_kd = s0 / (p.steps_tap * KW * KH);                                                     \
    }
    SETUP_TILE();

    uvec4 ra0[A_LOADS], rb0[B_LOADS], ra1[A_LOADS], rb1[B_LOADS];
    // Step s's pieces into registers ra, rb, then the counters to step s + 1.
    #define LOAD_STEP(s, ra, rb)                                                                        \
    {                                                                                             \
        const int dd_ = ld_kd * p.dd, dh_ = ld_kh * DH, dw_ = ld_kw * DW;                         \
        const int tap_pix = (dd_ * p.ih + dh_) * p.iw + dw_, ci = ld_cs * BK + a_piece * 8;       \
        for (int i = 0; i < A_LOADS; ++i) {                                                       \
            const bool inside = A_HAS(i) && uint(a_d[i] + dd_) < uint(p.id) &&                  \
                                uint(a_h[i] + dh_) < uint(p.ih) && uint(a_w[i] + dw_) < uint(p.iw) && \
                                ci < p.cin;                                                       \
            ra[i] = inside ? x[(a_pix[i] + tap_pix) * cin8 + ci / 8] : uvec4(0);                  \
        }                                                                                         \
        const int b_step = B_STEP(s);                                                             \
        for (int i = 0; i < B_LOADS; ++i) rb[i] = b_off[i] >= 0 ? w[b_step + b_off[i]] : uvec4(0); \
        const bool wrap_cs = ld_cs + 1 == p.steps_tap, wrap_kw = wrap_cs && ld_kw + 1 == KW;     \
        const bool wrap_kh = wrap_kw && ld_kh + 1 == KH;                                          \
        ld_cs = wrap_cs ? 0 : ld_cs + 1;                                                          \
        ld_kw = wrap_kw ? 0 : ld_kw + int(wrap_cs);                                               \
        ld_kh = wrap_kh ? 0 : ld_kh + int(wrap_kw);                                               \
        ld_kd += int(wrap_kh);                                                                    \
    }
    // Registers ra, rb into shared buffer `buf`.
    #define STORE_STEP(buf, ra, rb)                                                                      \
    {                                                                                             \
        for (int i = 0; i < A_LOADS; ++i) {                                                       \
            const int piece = tid + i * THREADS;                                                  \
            if (A_HAS(i)) smem[(buf) * STAGE + (piece / A_PER_ROW) * A_ROW + piece % A_PER_ROW] = ra[i]; \
        }                                                                                         \
        for (int i = 0; i < B_LOADS; ++i) {                                                       \
            const int piece = tid + i * THREADS;                                                  \
            smem[(buf) * STAGE + A_TILE + (piece / (BN / 8)) * B_ROW + piece % (BN / 8)] = rb[i]; \
        }                                                                                         \
    }

    coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> acc =
        coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(0.0);
    // Step s multiplies from buffer s & 1 while step s + 1's loads are in flight into the
    // registers, which then go to buffer (s + 1) & 1; one barrier a step. Product j of a
    // step: A's columns [j MK, (j + 1) MK) (MK / 8 pieces a row in), B's rows the same.
    const int MK = BK / PRODUCTS;
    #define LOAD_MATRICES(buf, a, b, j)                                                           \
    {                                                                                             \
        coopMatLoad(a, smem, (buf) * STAGE + (j) * (MK / 8), A_ROW, gl_CooperativeMatrixLayoutRowMajor); \
        coopMatLoad(b, smem, (buf) * STAGE + A_TILE + (j) * MK * B_ROW, B_ROW,                    \
                    gl_CooperativeMatrixLayoutRowMajor);                                          \
    }
    #define PRODUCT(buf, j)                                                                       \
    {                                                                                             \
        coopmat<float16_t, gl_ScopeWorkgroup, BM, MK, gl_MatrixUseA> a;                           \
        coopmat<float16_t, gl_ScopeWorkgroup, MK, BN, gl_MatrixUseB> b;                           \
        LOAD_MATRICES(buf, a, b, j)                                                               \
        acc = coopMatMulAdd(a, b, acc);                                                           \
    }
    // FRAGS_AHEAD's two register sets (below): A0, B0 the first product's, A1, B1 the
    // second's.
#if PRODUCTS == 1
    // (The one-product step's own text: through PRODUCT(buf, 0) the SPIR-V gains the zero
    // offsets' arithmetic.)
    #define MULTIPLY_STEP(buf)                                                                    \
    {                                                                                             \
        coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA> a;                           \
        coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> b;                           \
        coopMatLoad(a, smem, (buf) * STAGE, A_ROW, gl_CooperativeMatrixLayoutRowMajor);           \
        coopMatLoad(b, smem, (buf) * STAGE + A_TILE, B_ROW, gl_CooperativeMatrixLayoutRowMajor);  \
        acc = coopMatMulAdd(a, b, acc);                                                           \
    }
    #define FRAGS_LOAD(buf, A0, B0, A1, B1) LOAD_MATRICES(buf, A0, B0, 0)
    #define FRAGS_MUL(A0, B0, A1, B1) { acc = coopMatMulAdd(A0, B0, acc); }
#elif PRODUCTS == 2
    #define MULTIPLY_STEP(buf) { PRODUCT(buf, 0) PRODUCT(buf, 1) }
    #define FRAGS_LOAD(buf, A0, B0, A1, B1) { LOAD_MATRICES(buf, A0, B0, 0) LOAD_MATRICES(buf, A1, B1, 1) }
    #define FRAGS_MUL(A0, B0, A1, B1) { acc = coopMatMulAdd(A0, B0, acc); acc = coopMatMulAdd(A1, B1, acc); }
#else
    #define MULTIPLY_STEP(buf) { PRODUCT(buf, 0) PRODUCT(buf, 1) PRODUCT(buf, 2) PRODUCT(buf, 3) }
#endif

    // One tile a pass (PERSISTENT, the host's #define: the workgroup's tiles g, g + the
    // grid, ..., one workgroup an SM, so a tile's first loads fly under the last one's
    // epilogue).
    LOAD_STEP(s0, ra0, rb0);
    for (;;) {
        acc = coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(0.0);

#ifdef FRAGS_AHEAD
        // FRAGS_AHEAD (the host's #define; AHEAD = 1, early loads, 1 or 2 products): two
        // register sets of the step's A and B matrices taking turns. At step s one set holds
        // step s (read from shared memory before the last barrier) and the other is read from
        // buffer (s + 1) & 1, stored a barrier ago, before the product; the registers loaded
        // for step s + 2 then go to buffer s & 1, whose matrices are already in registers. So
        // after each barrier the MMAs start on operands in registers instead of waiting for
        // their shared reads (run 429: 14 x 14 at 96 x 128 0.0361 -> 0.0344 ms, video-vae-3d
        // at 128 x 128 0.2907 -> 0.2672; 184 registers where the one set took 134).
        coopmat<float16_t, gl_ScopeWorkgroup, BM, MK, gl_MatrixUseA> a00, a01, a10, a11;
        coopmat<float16_t, gl_ScopeWorkgroup, MK, BN, gl_MatrixUseB> b00, b01, b10, b11;
        STORE_STEP(s0 & 1, ra0, rb0);
        barrier();
        FRAGS_LOAD(s0 & 1, a00, b00, a01, b01);
        if (s0 + 1 < s1) {
            LOAD_STEP(s0 + 1, ra0, rb0);
            STORE_STEP((s0 + 1) & 1, ra0, rb0);
        }
        barrier();
        for (int s = s0; s < s1; s += 2) {
            FRAGS_LOAD((s + 1) & 1, a10, b10, a11, b11);
            LOAD_STEP(s + 2, ra0, rb0);
            FRAGS_MUL(a00, b00, a01, b01);
            STORE_STEP(s & 1, ra0, rb0);
            barrier();
            if (s + 1 >= s1) break;
            FRAGS_LOAD(s & 1, a00, b00, a01, b01);
            LOAD_STEP(s + 3, ra0, rb0);
            FRAGS_MUL(a10, b10, a11, b11);
            STORE_STEP((s + 1) & 1, ra0, rb0);
            barrier();
        }
#else
        STORE_STEP(s0 & 1, ra0, rb0);
        if (AHEAD == 1) {
            barrier();
            for (int s = s0; s < s1; ++s) {
                LOAD_STEP(s + 1, ra0, rb0);
                MULTIPLY_STEP(s & 1);
                STORE_STEP((s + 1) & 1, ra0, rb0);
                barrier();
            }
        } else {
            // Two register sets taking turns (a loop of two steps: the sets are named, not
            // indexed): at step s shared buffer s & 1 holds step s and one set step s + 1,
            // while the other set loads step s + 2. Loads stay in step order (the counters).
            if (s0 + 1 < s1) LOAD_STEP(s0 + 1, ra1, rb1);
            barrier();
            // LATE_LOADS (the host's #define): each step's loads go out after its multiply, so
            // their address work issues behind the step's MMAs instead of ahead of its shared
            // reads (the driver keeps this order; run 419: faster at 192 x 64, slower at 96 x
            // 128, where the loads then wait on registers the MMAs still read).
            // With late loads the loop keeps its branches past the last step: they pin the
            // loads after the multiply, which one block lets the compiler hoist (56 x 56 at
            // 192 x 64: 0.0501 ms with 189b0c2's text, 0.0514 without the branches in run
            // 428, 0.0509 with them back in run 431).
#ifdef LATE_LOADS
            #define BEFORE_END(c) if (c)
#else
            #define BEFORE_END(c)
#endif
            for (int s = s0; s < s1; s += 2) {
#ifdef LATE_LOADS
                MULTIPLY_STEP(s & 1);
                BEFORE_END(s + 2 < s1) LOAD_STEP(s + 2, ra0, rb0);
#else
                LOAD_STEP(s + 2, ra0, rb0);
                MULTIPLY_STEP(s & 1);
#endif
                BEFORE_END(s + 1 < s1) STORE_STEP((s + 1) & 1, ra1, rb1);
                barrier();
                if (s + 1 >= s1) break;
#ifdef LATE_LOADS
                MULTIPLY_STEP((s + 1) & 1);
                BEFORE_END(s + 3 < s1) LOAD_STEP(s + 3, ra1, rb1);
#else
                LOAD_STEP(s + 3, ra1, rb1);
                MULTIPLY_STEP((s + 1) & 1);
#endif
                BEFORE_END(s + 2 < s1) STORE_STEP(s & 1, ra0, rb0);
                barrier();
            }
        }
#endif

        if (SPLITS > 1) {
            coopMatStore(acc, part, (tile * uint(SPLITS) + split) * uint(BM * BN), BN,
                         gl_CooperativeMatrixLayoutRowMajor);
            // Every invocation's stores out of the workgroup before one counts the split in.
            memoryBarrierBuffer();
            barrier();
            const uint counters = p.groups * uint(BM * BN);  // the counters' first index
            if (tid == 0) last_split = atomicAdd(counter[counters + tile], 1u) == uint(SPLITS - 1);
            barrier();
            if (!last_split) return;
            memoryBarrierBuffer();
            if (tid == 0) counter[counters + tile] = 0u;  // ready for the next launch
            // The partials in split order, 8 outputs a piece.
            for (int piece = tid; piece < BM * (BN / 8); piece += THREADS) {
                const int r = piece / (BN / 8), c = piece % (BN / 8);
                const int m = m0 + r, co = n0 + c * 8;
                vec4 lo = vec4(0.0), hi = vec4(0.0);
                for (int sp = 0; sp < SPLITS; ++sp) {
                    const uint at = ((tile * uint(SPLITS) + uint(sp)) * uint(BM * BN) + uint(r * BN + c * 8)) / 4u;
                    lo += part4[at];
                    hi += part4[at + 1u];
                }
                if (m < p.m_total && co < p.cout)
                    y[(m * p.cout + co) / 8] = uvec4(packFloat2x16(f16vec2(lo.xy)), packFloat2x16(f16vec2(lo.zw)),
                                                     packFloat2x16(f16vec2(hi.xy)), packFloat2x16(f16vec2(hi.zw)));
            }
            return;
        }

        // Epilogue: the f16 tile into shared rows of BN halves, then 16-byte pieces out.
        // PERSISTENT: the next tile's first loads go out before it (their latency behind the
        // epilogue's work), the next tile's stores after a barrier behind its shared reads.
        const int e_m0 = m0, e_n0 = n0;
#ifdef PERSISTENT
        g += gl_NumWorkGroups.x * gl_NumWorkGroups.y;
        const bool more = g < p.groups;
        if (more) {
            SETUP_TILE();
            LOAD_STEP(s0, ra0, rb0);
        }
#endif
        {
            coopmat<float16_t, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> h =
                coopmat<float16_t, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(acc);
            coopMatStore(h, smem, 0, C_ROW, gl_CooperativeMatrixLayoutRowMajor);
        }
        barrier();
        for (int piece = tid; piece < BM * (BN / 8); piece += THREADS) {
            const int r = piece / (BN / 8), c = piece % (BN / 8);
            const int m = e_m0 + r, co = e_n0 + c * 8;
            if (m < p.m_total && co < p.cout) y[(m * p.cout + co) / 8] = smem[r * C_ROW + c];
        }
#ifdef PERSISTENT
        if (!more) break;
        barrier();
#else
        break;
#endif
    }
}
