#version 450
// depth_rotate (Vulkan): the FMA rotation of depth_reuse_fma in portable GLSL, for
// depthwise specs with depth stride and dilation 1 (3-D; 1-2-D specs are one slice). A
// workgroup owns a band of ROWS output rows of one (n, c) plane and walks down its
// depth: each input slice's band (zero padding included) goes to shared memory once and
// feeds the KD output depths it reaches, whose partial sums each invocation keeps in
// registers (acc[j] is output depth base + j; after a slice the oldest is complete, is
// stored, and the others shift down). Input traffic is one read of each slice where the
// tiled shader reads it KD times. Each invocation owns ITEMS runs of OUT_H x OUT_W
// outputs of the band (fixed across slices: its sums stay in registers). Buffers of ELEM (f32, f16
// or bf16: the host's prelude), f32 in shared memory and registers. Both layouts.
//
// Two slice buffers: an invocation loads its part of the next slice into registers
// before it multiplies the current one and stores it after, so the loads' latency hides
// behind the FMAs and one barrier a slice suffices (the first form loaded, waited at a
// barrier, multiplied, waited again: 2.5-3.4x the CUDA kernel, run 152). Where each fill
// element comes from within a depth plane is worked out once (FILL_K offsets a
// invocation). Each kernel row's window (the OUT_W outputs' inputs) is read from shared
// memory once and feeds all KD x KW taps of that row (the first form read shared memory
// once per multiply-add).
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int KD = 1;
layout(constant_id = 2) const int KH = 1;
layout(constant_id = 3) const int KW = 1;
layout(constant_id = 4) const int OUT_W = 1;
layout(constant_id = 5) const int ROWS = 1;
layout(constant_id = 6) const int SW = 1;
layout(constant_id = 7) const int DW = 1;
layout(constant_id = 8) const int HS = 1;    // (ROWS-1)*sh + (KH-1)*dh + 1
layout(constant_id = 9) const int WS = 1;    // every column the band reads
layout(constant_id = 10) const int ITEMS = 1;
layout(constant_id = 11) const int FILL_K = 1;  // ceil(HS * WS / invocations)
// WALK > 0 (channels-first, KD = 1, no depth padding): the N x C x D input planes are one
// sequence of slices, each its own output plane, and a workgroup walks WALK consecutive
// ones (their channels' weights loaded as the channel changes), so that each plane's
// loads go out under the previous plane's FMAs (a 1-D or 2-D layer has one slice a plane:
// without the walk a workgroup loaded, waited and multiplied once).
layout(constant_id = 12) const int WALK = 0;
// DIRECT (channels-first): no band in shared memory; each invocation reads its runs'
// windows from the buffer (L1 serves the neighbours' overlap) with no barrier. For
// one-slice planes of short kernels (a 1-D row's band was 16 KB, and a workgroup's shared
// memory costs occupancy on NVIDIA's driver, run 275); the host gives HS = WS = 1.
layout(constant_id = 13) const int DIRECT = 0;
layout(constant_id = 14) const int SH = 1;
layout(constant_id = 15) const int DH = 1;
// OUT_H: an invocation's run spans OUT_H output rows (ROWS is a multiple): each input row
// of the band is read from shared memory once for all the rows it feeds (with one row a
// run, a 7x7 kernel read each window row 7 times: 12 loads for 42 FMAs).
layout(constant_id = 16) const int OUT_H = 1;
// VOFF >= 0 (DIRECT, channels-first rows that are whole CV-vectors, SW = DW = 1): a run's
// window is read as aligned CV-element vectors, the first starting VOFF elements before
// the window (one element a load put a 1-D row's 2-byte loads 8 bytes apart: 7 loads of
// a warp-wide instruction each for 4 outputs).
layout(constant_id = 17) const int VOFF = -1;
// DIRECT == 2: DIRECT with VOFF's vectors, each read one slice ahead: a row's vectors for
// slice z + 1 are loaded into the registers slice z's row has just been unpacked from, so
// a load has the rest of the slice's FMAs to land (DIRECT 1 waited on each slice's loads
// from L2 or memory at its first FMA).
const int WIN = (OUT_W - 1) * SW + (KW - 1) * DW + 1;  // inputs a run's kernel row spans
const int RIN = (OUT_H - 1) * SH + (KH - 1) * DH + 1;  // input rows a run's rows span
#ifdef CV
const int VCH = ((VOFF > 0 ? VOFF : 0) + WIN + CV - 1) / CV;  // vectors a run's window spans
#endif

layout(std430, set = 0, binding = 0) readonly buffer Input { ELEM x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Weight { ELEM w[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Output { ELEM y[]; };
// CV (a #define from the host where the data is channels-first, OUT_W divides the output
// rows and CV, 4 or 2, divides OUT_W): a run's OUT_W outputs leave as OUT_W / CV vector
// stores, through this alias of the output. One element a store put a warp's 32 stores
// OUT_W elements apart: OUT_W times the sectors a coalesced store writes.
#ifdef CV
layout(std430, set = 0, binding = 2) writeonly buffer OutputRuns { VELEM yv[]; };
// The input as CV-element vectors in 32-bit words (VRAW), which registers hold across a
// slice without 16-bit arithmetic types.
layout(std430, set = 0, binding = 0) readonly buffer InputRuns { VRAW xr[]; };
#endif

// Mirrored by vulkan::depth_rotate (same order, 4-byte fields).
layout(push_constant) uniform Push {
    int n, c, id, ih, iw, od, oh, ow;
    int pd, ph, pw;
    int channels_last;
    uint groups;  // bands x planes (WALK: x walks): the workgroups that have work
} p;

shared float band[2 * HS * WS];

// Whether input row r of a run's rows feeds one of its OUT_H output rows (a kernel row
// (r - i * SH) / DH, whole and in range: a constant once the loops unroll).
bool feeds(int r) {
    bool f = false;
    for (int i = 0; i < OUT_H; ++i) {
        const int d = r - i * SH;
        f = f || (d >= 0 && d % DH == 0 && d / DH < KH);
    }
    return f;
}

#ifdef CV
// Input row r of the run at band row `row`, columns from ow0 - pw - VOFF, of the slice
// at element `slice`: the window's aligned vectors (zero outside the input; vectors are
// wholly inside or outside a row, whose length and start are multiples of CV).
void fetch_row(uint slice, int h0, int row, int ow0, int r, out VRAW v[VCH]) {
    const int yi = (h0 + row) * SH - p.ph + r;
    const bool in_row = yi >= 0 && yi < p.ih;
    const uint from = slice + uint(max(yi, 0)) * uint(p.iw);
    const int c0 = ow0 - p.pw - VOFF;
    [[unroll]] for (int k = 0; k < VCH; ++k) {
        const int xc = c0 + k * CV;
        v[k] = in_row && xc >= 0 && xc < p.iw ? xr[(from + uint(xc)) / uint(CV)] : VRAW(0);
    }
}
#endif

void main() {
    const uint g = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (g >= p.groups) return;  // the whole workgroup: before any barrier
    const int bands = (p.oh + ROWS - 1) / ROWS;
    const int bnd = int(g % uint(bands));
    const uint plane = g / uint(bands);
    // WALK: this workgroup's slices q in [q0, q1) of the N x C x D planes.
    const int planes = p.n * p.c * p.id;
    const int q0 = WALK > 0 ? int(plane) * WALK : 0;
    const int q1 = WALK > 0 ? min(q0 + WALK, planes) : 0;
    int ch = WALK > 0 ? (q0 / p.id) % p.c : int(plane % uint(p.c));
    const int b = int(plane / uint(p.c));
    const int h0 = bnd * ROWS;
    const int lid = int(gl_LocalInvocationID.x), wg = int(gl_WorkGroupSize.x);
    const int groups_w = (p.ow + OUT_W - 1) / OUT_W;
    const int rows = min(ROWS, p.oh - h0);
    const int items = (rows + OUT_H - 1) / OUT_H * groups_w;

    // Element strides: along W, and between depth planes; the plane's first element.
    const bool cl = p.channels_last != 0;
    const uint ew = cl ? uint(p.c) : 1u;
    const uint dstride = uint(p.ih) * uint(p.iw) * ew;
    // (WALK: slice q's plane is at q * dstride: base 0.)
    const uint base = WALK > 0 ? 0u
                    : cl ? uint(b) * uint(p.id) * dstride + uint(ch)
                         : (uint(b) * uint(p.c) + uint(ch)) * uint(p.id) * dstride;
    // This invocation's fill elements: their offset in a depth plane, or -1 (padding or
    // past the band).
    int src[FILL_K];
    for (int k = 0; k < FILL_K; ++k) {
        const int i = lid + k * wg;
        const int r = i / WS, col = i - r * WS;
        const int yi = h0 * SH - p.ph + r, xi = col - p.pw;
        src[k] = (i < HS * WS && yi >= 0 && yi < p.ih && xi >= 0 && xi < p.iw)
            ? int((uint(yi) * uint(p.iw) + uint(xi)) * ew) : -1;
    }

    // Weights of this channel in registers: all KD x KH x KW taps.
    float wt[KD * KH * KW];
    for (int t = 0; t < KD * KH * KW; ++t) wt[t] = LOAD(w[ch * KD * KH * KW + t]);

    // Run it's sums: output depth base + j, row i of its rows, column o of its columns.
    float acc[ITEMS * KD * OUT_H * OUT_W];
    #define ACC(it, j, i, o) acc[(((it) * KD + (j)) * OUT_H + (i)) * OUT_W + (o)]
    for (int i = 0; i < ITEMS * KD * OUT_H * OUT_W; ++i) acc[i] = 0.0;

    // Input slice zi feeds output depths zi + pd - a (a = 0..KD-1); after it, output
    // depth zi + pd - (KD - 1) is complete. Slices past the input are zero: skipped, but
    // their outputs still complete.
    // (WALK: slices q0.. q1, all live, each completing its own output plane.)
    const int z0 = WALK > 0 ? q0 : -p.pd, z1 = WALK > 0 ? q1 : p.od + KD - 1 - p.pd;
    const int zlive = WALK > 0 ? q1 : p.id;  // live slices are [max(z0, 0), zlive)
    float pre[FILL_K];
    // Slice z's fill into pre (zeros where there is no input).
    #define FETCH(z)                                                                     \
        for (int k = 0; k < FILL_K; ++k)                                                 \
            pre[k] = src[k] >= 0 ? LOAD(x[base + uint(z) * dstride + uint(src[k])]) : 0.0;
    #define PUT(buf)                                                                     \
        for (int k = 0; k < FILL_K; ++k) {                                               \
            const int i = lid + k * wg;                                                  \
            if (i < HS * WS) band[(buf) * HS * WS + i] = pre[k];                         \
        }
#ifdef CV
    // DIRECT 2: run `it`'s row r's vectors of the slice to multiply next (PRE_N: 1 where
    // there are none, so that the array is declared either way).
    const int PRE_N = DIRECT == 2 ? ITEMS * RIN * VCH : 1;
    VRAW pre_v[PRE_N];
    #define FETCH_RUNS(z)                                                                \
        for (int it = 0; it < ITEMS; ++it) {                                             \
            const int t = lid + it * wg;                                                 \
            if (t >= items) continue;                                                    \
            const int grp = t / groups_w, ow0 = (t - grp * groups_w) * OUT_W;            \
            [[unroll]] for (int r = 0; r < RIN; ++r) {                                   \
                if (!feeds(r)) continue;                                                 \
                VRAW v[VCH];                                                             \
                fetch_row(base + uint(z) * dstride, h0, grp * OUT_H, ow0, r, v);         \
                for (int k = 0; k < VCH; ++k) pre_v[(it * RIN + r) * VCH + k] = v[k];   \
            }                                                                            \
        }
    if (DIRECT == 2 && max(z0, 0) < min(z1, zlive)) { FETCH_RUNS(max(z0, 0)); }
#endif
    // The first live slice goes in before the walk.
    int cur = 0;
    if (DIRECT == 0) {
        if (max(z0, 0) < min(z1, zlive)) {
            FETCH(max(z0, 0));
            PUT(0);
        }
        barrier();
    }
    for (int zi = z0; zi < z1; ++zi) {
        const bool live = zi >= 0 && zi < zlive;
        // The next live slice's loads go out before this one's multiply-adds.
        const bool next = zi + 1 >= 0 && zi + 1 < min(z1, zlive);
        if (DIRECT == 0 && live && next) { FETCH(zi + 1); }
        if (WALK > 0 && zi > q0 && zi % p.id == 0) {
            // A new channel's weights (L1 serves the workgroup's identical loads).
            ch = (zi / p.id) % p.c;
            for (int t = 0; t < KD * KH * KW; ++t) wt[t] = LOAD(w[ch * KD * KH * KW + t]);
        }
        const int base_od = WALK > 0 ? 0 : zi + p.pd - (KD - 1);  // acc[.][0]'s depth
        for (int it = 0; it < ITEMS; ++it) {
            const int t = lid + it * wg;
            if (t >= items) continue;
            const int grp = t / groups_w, ow0 = (t - grp * groups_w) * OUT_W;
            const int row = grp * OUT_H;  // the run's first row in the band
            if (live) {
                // Input row r of the run's rows feeds its row i with kernel row
                // (r - i * SH) / DH where that is whole and in range (constants once the
                // loops unroll).
                [[unroll]] for (int r = 0; r < RIN; ++r) {
                    if (!feeds(r)) continue;
                    float win[WIN];
                    if (DIRECT != 0) {
#ifdef CV
                        if (VOFF >= 0) {
                            VRAW v[VCH];
                            if (DIRECT == 2) {
                                // This slice's vectors, loaded a slice ago; the next
                                // slice's take their registers.
                                for (int k = 0; k < VCH; ++k) v[k] = pre_v[(it * RIN + r) * VCH + k];
                                if (next) {
                                    VRAW n[VCH];
                                    fetch_row(base + uint(zi + 1) * dstride, h0, row, ow0, r, n);
                                    for (int k = 0; k < VCH; ++k) pre_v[(it * RIN + r) * VCH + k] = n[k];
                                }
                            } else {
                                fetch_row(base + uint(zi) * dstride, h0, row, ow0, r, v);
                            }
                            [[unroll]] for (int k = 0; k < VCH; ++k) {
                                const VEC u = UNPACKV(v[k]);
                                for (int l = 0; l < CV; ++l) {
                                    const int q = k * CV + l - VOFF;
                                    if (q >= 0 && q < WIN) win[q] = u[l];
                                }
                            }
                        } else
#endif
                        {
                            // Input row r of the run, an element a load; its columns
                            // ow0 * SW - pw + q.
                            const int yi = (h0 + row) * SH - p.ph + r;
                            const bool in_row = yi >= 0 && yi < p.ih;
                            const uint from = base + uint(zi) * dstride + uint(max(yi, 0)) * uint(p.iw);
                            for (int q = 0; q < WIN; ++q) {
                                const int xi = ow0 * SW - p.pw + q;
                                win[q] = in_row && xi >= 0 && xi < p.iw ? LOAD(x[from + uint(xi)]) : 0.0;
                            }
                        }
                    } else {
                        const int at = cur * HS * WS + (row * SH + r) * WS + ow0 * SW;
                        for (int q = 0; q < WIN; ++q) win[q] = band[at + q];
                    }
                    for (int i = 0; i < OUT_H; ++i) {
                        const int d = r - i * SH;
                        if (d < 0 || d % DH != 0 || d / DH >= KH) continue;
                        const int e = d / DH;
                        // Output depth base_od + j reads this slice with tap a = KD - 1 - j.
                        for (int j = 0; j < KD; ++j)
                            for (int f = 0; f < KW; ++f) {
                                const float wv = wt[((KD - 1 - j) * KH + e) * KW + f];
                                for (int o = 0; o < OUT_W; ++o)
                                    ACC(it, j, i, o) = fma(win[o * SW + f * DW], wv, ACC(it, j, i, o));
                            }
                    }
                }
            }
            if (base_od >= 0) {
                for (int i = 0; i < OUT_H; ++i) {
                    if (row + i >= rows) break;
                    const int oh = h0 + row + i;
#ifdef CV
                    // Channels-first: the run's outputs are consecutive and start at a
                    // multiple of OUT_W (a multiple of CV; the rows' length is one too).
                    const uint at0 = WALK > 0
                        ? (uint(zi) * uint(p.oh) + uint(oh)) * uint(p.ow) + uint(ow0)
                        : (((uint(b) * uint(p.c) + uint(ch)) * uint(p.od) + uint(base_od)) * uint(p.oh) + uint(oh)) * uint(p.ow) + uint(ow0);
                    for (int v = 0; v < OUT_W; v += CV) {
#if CV == 2
                        yv[(at0 + uint(v)) / 2u] = STOREV(VEC(ACC(it, 0, i, v), ACC(it, 0, i, v + 1)));
#else
                        yv[(at0 + uint(v)) / 4u] = STOREV(VEC(ACC(it, 0, i, v), ACC(it, 0, i, v + 1), ACC(it, 0, i, v + 2), ACC(it, 0, i, v + 3)));
#endif
                    }
#else
                    for (int o = 0; o < OUT_W; ++o) {
                        const int v = ow0 + o;
                        if (v >= p.ow) break;
                        const uint at = WALK > 0
                            ? (uint(zi) * uint(p.oh) + uint(oh)) * uint(p.ow) + uint(v)
                            : cl
                            ? (((uint(b) * uint(p.od) + uint(base_od)) * uint(p.oh) + uint(oh)) * uint(p.ow) + uint(v)) * uint(p.c) + uint(ch)
                            : (((uint(b) * uint(p.c) + uint(ch)) * uint(p.od) + uint(base_od)) * uint(p.oh) + uint(oh)) * uint(p.ow) + uint(v);
                        y[at] = STORE(ACC(it, 0, i, o));
                    }
#endif
                }
            }
            // Rotate: the oldest depth leaves, a fresh one enters at the top.
            for (int j = 0; j + 1 < KD; ++j)
                for (int i = 0; i < OUT_H; ++i)
                    for (int o = 0; o < OUT_W; ++o) ACC(it, j, i, o) = ACC(it, j + 1, i, o);
            for (int i = 0; i < OUT_H; ++i)
                for (int o = 0; o < OUT_W; ++o) ACC(it, KD - 1, i, o) = 0.0;
        }
        // The other buffer was last read before the previous barrier: fill it, then wait
        // once so every invocation sees it (and is done with this one).
        if (DIRECT == 0) {
            if (live && next) {
                PUT(cur ^ 1);
                cur ^= 1;
            }
            barrier();
        }
    }
}
