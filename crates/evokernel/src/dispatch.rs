//! Which kernel computes a spec when the user names none: a forced config first, then
//! the fastest tuned result for this device and spec, then a ranking of the variants
//! measured on the public suite (docs/perf.md). `naive` applies to every spec the
//! kernels' 32-bit per-dimension indices can address, so only sizes past 2^31 along one
//! dimension have no GPU answer (the CPU backend takes those).

use serde::{Deserialize, Serialize};

use crate::cuda::ConvArgs;
use crate::engine::ConvProblem;
use crate::pass::Pass;
use crate::spec::{ConvSpec, DType, Layout};
use crate::tune::{TuneCache, TuneTarget};
use crate::variants::{check_config, kernel_hash, registry, Config, Variant};

/// The dispatcher's answer and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    pub variant: String,
    pub config: String,
    /// "forced", "tuned: 0.287 ms", or "ranked" with the rule that decided.
    pub reason: String,
}

/// Expected order of the variants on `spec`, fastest first (lower is better), from the
/// H100 measurements of the public suite: the tensor-core paths win wherever their
/// 16-row tiles are filled, lose badly on 1-D rows (15 of 16 tile rows are padding:
/// causal-conv1d 1.09-2.6 ms vs smem_tile 0.12 ms); streaming, with warps sized to the
/// slice, beats tensor_core even with one output depth (convnext: 0.093 vs 0.102 ms).
/// `on_copies`: `v` is a channels-first grad-weight kernel run on channels-first copies
/// of channels-last `spec` (`kernel_problem`).
fn rank(v: &dyn Variant, spec: &ConvSpec, on_copies: bool) -> (u32, &'static str) {
    let [od, oh, _] = spec.output3();
    let rows_fill_tiles = oh >= 8;
    let unit_steps = spec.stride3() == [1, 1, 1] && spec.dilation3() == [1, 1, 1];
    // Reusing each slice for KD output depths pays where there are several of both: seed
    // 0.335 vs streaming 0.463 ms, video-vae 0.254 vs 0.342, x3d 0.149 vs 0.164; with one
    // depth (convnext) it is 2x slower, each block starting a pipeline for one slice.
    let deep = spec.kernel3()[0] >= 2 && od >= 8;
    // The same rotation on FMA pipes costs taps per output, where the tensor-core tiles
    // cost one MMA per kernel row whatever its width: with rows of 3 taps it wins (x3d
    // 0.116 vs depth_reuse 0.150 ms, video-vae 0.145 vs 0.262), with 5 it loses (seed
    // 0.524 vs 0.344); f32 has no tensor-core path (seed-f32 0.531 vs smem_tile 1.49).
    // Run 48, docs/perf.md.
    let fma_rows = spec.kernel3()[2] <= 3 || spec.dtype() == DType::F32;
    // Output rows narrower than a 16-column tile: tensor_core fills 14 of 16 columns
    // and smem_tile's tiles are mostly halo; after the FMA rotation row_reuse is next
    // (x3d-m-res4, W 14: 0.131 ms vs naive 0.266, smem_tile 0.428, tensor_core 0.560;
    // run 98, docs/perf.md).
    let narrow = spec.output3()[2] < 16;
    // Grad-weight: 3-wide kernel rows over output rows shorter than 96 (FMA tiles ahead
    // of tensor cores there).
    let short_3_wide = spec.kernel3()[2] <= 3 && spec.output3()[2] < 96;
    // row_reuse holds a slice's weights in registers: past ~128 taps it spills (replknet
    // 31x31: 34 ms vs naive 3.4, run 98).
    let few_taps = spec.kernel3()[1] * spec.kernel3()[2] <= 128;
    let small_plane = oh * spec.output3()[2] <= 28 * 28;
    let one_d = od == 1 && oh == 1;
    // Kernel rows of at most 3 taps at H stride >= 2: each output row adds all but at
    // most one of its window's input rows.
    let strided_3_rows = spec.kernel3()[1] <= 3 && spec.stride3()[1] >= 2;
    // 2-D kernel rows of 5 and more taps: wgrad_strip_cl's default runs of up to 14
    // outputs a thread (run 251: convnext-t-nhwc 0.061 ms vs wgrad_tile_cl 0.087).
    let wide_rows_2d = od == 1 && !one_d && spec.kernel3()[2] >= 5;
    // 3-D kernel rows of 5 and more taps on channels-last data: wgrad_mma on
    // channels-first copies ahead (below).
    let wide_rows_3d = od > 1 && spec.kernel3()[2] >= 5 && spec.layout() == Layout::ChannelsLast;
    // 2-D channels-last rows of >= 5 taps on planes past 28 x 28 where wgrad_mma_cl
    // takes the spec: its 16 channels in two barrier groups ahead of wgrad_strip_cl (H200
    // runs 352-353, same calls: convnext-nhwc, 56 x 56, 0.0755-0.0848 vs 0.106-0.114 ms);
    // on 28 x 28 behind it (convnext-t-nhwc 0.0762-0.0803 vs 0.0623-0.0643).
    // (Asked only by the two grad-weight arms below: `applies` walks wgrad_mma_cl's space.)
    let mma_cl_2d =
        || wide_rows_2d && !small_plane && crate::variants::WgradMmaCl.applies(spec).is_ok();
    // The copies cost a read and a write of both tensors, which tensor cores pay back
    // where the FMA kernels have many taps a row and depths to sum (runs 258-260).
    if on_copies {
        return match v.name() {
            // Behind wgrad_mma_cl where it applies (below).
            "wgrad_mma" if wide_rows_3d => (
                1,
                "grad-weight on tensor cores (3-D, kernel rows of >= 5 taps)",
            ),
            _ => (4, "grad-weight behind the channels-last kernels"),
        };
    }
    // depth_reuse's default walks planes (one kernel depth, no depth padding, output rows
    // of 16-byte multiples for its stores); f32 has no tensor-core path.
    let plane_walk =
        crate::variants::depth_reuse::walks_planes_by_default(spec) && spec.dtype() != DType::F32;
    // 3-wide rows over depths whose output rows make one producer region of 16-21 tiles:
    // depth_reuse's tensor cores ahead of the FMA rotation on the H200 (runs 350, 355:
    // video-vae-causal forward 0.120 vs 0.131 ms, grad-input 0.125 vs 0.137, three rounds
    // in one call; a tie on the H100, run 315: 0.132 vs 0.133). Narrower rows keep the FMA
    // rotation (x3d, 8 tiles: 0.101 vs 0.146).
    let wide_tc_rows = deep
        && rows_fill_tiles
        && spec.dtype() != DType::F32
        && crate::variants::depth_reuse::one_wide_region_by_default(spec);
    let rotates_rows = crate::variants::row_rotation_cl::rotates_rows_by_default(spec);
    // 1-D channels-last rows that row_window_cl takes (below).
    let window_1d = one_d && crate::variants::RowWindowCl.applies(spec).is_ok();
    // 1-D channels-first rows of few taps that row_window takes (below); Conformer's 31
    // taps stay on the rotation (0.027 vs 0.037 ms, run 364).
    let window_1d_cf =
        one_d && spec.kernel3()[2] <= 8 && crate::variants::RowWindow.applies(spec).is_ok();
    match v.name() {
        // With one kernel depth too, where there are depths to walk (run 237, 4 x 192 x
        // 16 x 56 x 56, 1x3x3: 0.067 vs depth_reuse's plane walk 0.085 ms; in 2-D, 3x3,
        // the plane walk wins: 0.042 vs 0.059). Rows that are not whole 16-byte chunks
        // come in 4-byte pieces (x3d-m-res4, W 14: 0.061 vs row_reuse 0.132 ms, run 298).
        "depth_reuse" if wide_tc_rows => (
            0,
            "tensor cores, each slice feeding every output depth (one producer region a row)",
        ),
        "depth_reuse_fma" if (deep || (plane_walk && od >= 8)) && fma_rows => (
            0,
            "FMA rotation, each slice feeding every output depth (short kernel rows or f32)",
        ),
        // Channels-last 1-D rows (Mamba's short conv1d): nothing to share between
        // threads, so a register window a thread and no shared memory (H200, run 357, two
        // rounds: mamba2-conv1d 0.056 vs depth_reuse_fma_cl 0.072 ms, hybrid-shortconv
        // 0.223 vs 0.325, causal-conv1d-nwc 0.045 vs 0.052; grad-input alike).
        "row_window_cl" if window_1d => (0, "1-D channels-last rows, a register window a thread"),
        // On channels-last data the FMA rotation needs no transposes (run 52): x3d 0.110 vs
        // depth_reuse_cl 0.205 ms, video-vae 0.184 vs 0.333, the seed 0.606 vs 0.650,
        // mobilenet-s2 0.061 vs channels_last 0.112, causal-conv1d-nwc 0.063 vs 0.082. With
        // one depth and 7-wide rows it loses (convnext 0.202 vs streaming_cl 0.175).
        // Also on small planes, where streaming_cl has few tiles to spread (convnext-t-nhwc,
        // 28x28: 0.128 vs streaming_cl 0.158 ms; convnext-nhwc, 56x56, stays with
        // streaming_cl: 0.172 vs 0.194; runs 98-99). Walking planes it takes convnext-nhwc
        // too (run 240: 0.087-0.094 vs streaming_cl 0.172 ms in run 99).
        // Kernels of >= 5 rows (3 at unit steps in 2-D) and one depth on channels-last
        // data: each input row read once by a block, where output-row tiles re-read their
        // halo rows (see rotates_rows_by_default).
        "row_rotation_cl" if rotates_rows => (
            0,
            "input rows rotated through the output rows they feed (one kernel depth, >= 5 kernel rows or 3 at unit steps)",
        ),
        // Kernel rows of 5 taps and more over depths: depth_reuse_cl's producer form,
        // where the FMA rotation pays taps per output (run 324, the NDHWC seed 0.523 vs
        // depth_reuse_fma_cl 0.584 ms, dgrad 0.534 vs 0.603; f16 0.538 vs 0.590). With
        // 3-wide rows the FMA rotation stays ahead (x3d-ndhwc 0.117 vs 0.200, video-vae-ndhwc
        // 0.180 vs 0.302); with 16 channels a block (runs 328-329: the seed 0.336) still
        // behind there across calls (0.148 and 0.196 vs run 327's 0.117 and 0.185).
        "depth_reuse_cl"
            if rows_fill_tiles
                && deep
                && !fma_rows
                && crate::variants::depth_reuse_cl::producer_config(spec).is_some() =>
        {
            (
                0,
                "tensor cores on channels-last data, a producer warp staging slices by TMA (kernel rows of >= 5 taps)",
            )
        }
        "depth_reuse_fma_cl"
            if !rotates_rows
                && !window_1d
                && (fma_rows
                || deep
                || spec.taps() <= 9
                || small_plane
                || crate::variants::depth_reuse_fma_cl::walks_planes_by_default(spec)) =>
        {
            (
                0,
                "FMA rotation on channels-last data (several depths, short rows, few taps, f32, a small plane, or planes walked)",
            )
        }
        // 1-D channels-first rows of <= 8 taps, a register window a thread (H200, run 364,
        // same call, two rounds): causal-conv1d 0.039 vs depth_reuse_fma 0.047 ms
        // (grad-input 0.042 vs 0.049), lfm-shortconv-k3 0.072 vs 0.086 (0.069 vs 0.088).
        "row_window" if window_1d_cf => (
            0,
            "1-D channels-first rows of few taps, a register window a thread",
        ),
        // 1-D rows walked as a sequence of planes (run 247): conformer-k31 0.029 vs
        // smem_tile 0.042 ms, causal-conv1d 0.056 vs 0.073, lfm-shortconv-k3 0.105 vs 0.136.
        "depth_reuse_fma"
            if one_d
                && !window_1d_cf
                && crate::variants::depth_reuse_fma::walks_planes_by_default(spec) =>
        {
            (0, "FMA tiles walking the rows of a 1-D layer through a slice ring")
        }
        "depth_reuse" if rows_fill_tiles && deep => (
            1,
            "tensor cores, each slice feeding every output depth it reaches",
        ),
        // One kernel depth: its blocks walk planes through the TMA ring (run 233,
        // convnext-7x7: 0.058 vs streaming 0.089 ms).
        "depth_reuse" if rows_fill_tiles && plane_walk => {
            (1, "tensor cores, each block walking planes through a TMA ring")
        }
        "streaming" if rows_fill_tiles => (2, "tensor cores, 16-byte async copies"),
        "depth_reuse_fma" if deep => (3, "FMA rotation, each slice feeding every output depth"),
        "tensor_core" if rows_fill_tiles && !narrow => (4, "tensor cores"),
        // Channels-last rotation, same-run A/B against streaming_cl (docs/perf.md, run 41):
        // video-vae 0.336 vs 0.456 ms, x3d 0.217 vs 0.233, the seed a tie (0.661 vs 0.658,
        // f16 0.673 vs 0.678); with one depth slower (convnext 0.214 vs 0.175).
        "depth_reuse_cl" if rows_fill_tiles && deep => (
            5,
            "tensor cores on channels-last data, each slice feeding every output depth",
        ),
        // The transposes into and out of shared memory pay off with many taps per
        // output: 27 (x3d) 1.2x, 49 (convnext) 1.5x, 75 (seed) 2.6x faster than
        // channels_last; with 9 (3x3 2-D) 1.6x slower (docs/perf.md, run 32).
        "streaming_cl" if rows_fill_tiles && spec.taps() >= 27 => {
            (6, "tensor cores on channels-last data (many taps)")
        }
        // Kernels past the register budget (smem_tile refuses over 128 taps): weights in
        // shared memory, rows rolled (run 99).
        "large_kernel" if !few_taps => (7, "shared-memory slices and weights (large kernel)"),
        "large_kernel" => (
            18,
            "shared-memory weights (smem_tile keeps them in registers)",
        ),
        "smem_tile" if unit_steps && !narrow => {
            (7, "shared-memory tiles (few output rows for tensor cores)")
        }
        // Without depths to rotate through, a tiled FMA kernel like smem_tile: even on
        // convnext (0.155 vs 0.152 ms), behind on causal-conv1d (0.087 vs 0.074).
        "depth_reuse_fma" => (8, "FMA tiles through a slice ring"),
        "depth_reuse_fma_cl" => (8, "FMA rotation on channels-last data"),
        "channels_last" => (9, "channels-last kernel"),
        "row_rotation_cl" => (9, "input rows rotated through the output rows they feed"),
        // Unmeasured on 1xK rows of 2-D and 3-D tensors: behind the rotations there.
        "row_window_cl" => (9, "one-row kernels, a register window a thread"),
        // Unmeasured on 1xK rows of 2-D and 3-D tensors; behind the rotation on many taps.
        "row_window" => (9, "one-row channels-first kernels, a register window a thread"),
        "streaming_cl" => (11, "tensor cores on channels-last data (few taps)"),
        "tensor_core" | "streaming" | "depth_reuse" | "depth_reuse_cl" if narrow => {
            (16, "tensor cores on rows narrower than a tile")
        }
        "tensor_core" | "streaming" | "depth_reuse" | "depth_reuse_cl" => {
            (12, "tensor cores on short rows or one depth")
        }
        // Faster than naive where there are output rows to share (runs 44-46): odd-dilated
        // 0.030 vs 0.058 ms, mobilenet-s2 0.127 vs 0.226, seed-f32 3.08 vs 5.2, x3d 0.395
        // vs 0.93; with one row (1-D) about even: causal-conv1d 0.334 vs 0.343, its NWC
        // twin 0.407 vs 0.372 (run 45).
        "row_reuse" if oh >= 2 && few_taps => (13, "outputs down a column sharing input rows"),
        "row_reuse" if !few_taps => (17, "outputs down a column (weights past its registers)"),
        "naive" => (14, "the general kernel (no faster variant applies)"),
        "row_reuse" => (15, "outputs down a column (one output row: nothing shared)"),
        // Strided/dilated tiles lost to naive on odd-dilated (0.086 vs 0.061 ms, run 23).
        "smem_tile" => (16, "shared-memory tiles"),
        // Tensor cores where there are tap rows to fill the MMA's 16 rows with; 1-D rows
        // leave 15 of 16 empty.
        // Not on rows narrower than its 16-column steps (x3d-m-res4, W 14: 0.428 vs wgrad
        // 0.347 ms, run 101).
        // With 3-wide kernel rows the FMA tiles win where rows are short (x3d, 56 wide:
        // 0.140 vs 0.166 ms, run 208): an MMA's 8 columns hold 3 taps; on rows of 96 and
        // more the MMA's per-row work spreads further (video-vae-causal, 128 wide: 0.189 vs
        // 0.197 in run 208, 0.180 vs 0.197 alone in run 207).
        "wgrad_mma" if short_3_wide && spec.kernel3()[0] * spec.kernel3()[1] >= 3 && !narrow => (
            1,
            "grad-weight on tensor cores (3-wide kernel rows of short rows: FMA tiles ahead)",
        ),
        "wgrad_mma" if spec.kernel3()[0] * spec.kernel3()[1] >= 3 && !narrow => (
            0,
            "grad-weight on tensor cores (input rows kept in registers)",
        ),
        "wgrad_mma" => (2, "grad-weight on tensor cores (few tap rows or narrow rows)"),
        // wgrad_mma's rows on channels-last data, each slot transposed in shared memory
        // (run 345, same call): ahead of wgrad_mma on channels-first copies on 3-D rows of
        // >= 5 taps (the NDHWC seed 0.560 vs 0.626 ms, seed-f16-ndhwc 0.559 vs 0.622, and
        // no copies' workspace), behind wgrad_tile_cl on 3-wide rows (x3d-ndhwc 0.232 vs
        // 0.175, video-vae-ndhwc 0.371 vs 0.276).
        "wgrad_mma_cl" if wide_rows_3d || mma_cl_2d() => (
            0,
            "grad-weight on tensor cores, channels-last slots transposed in shared memory (2-D and 3-D, kernel rows of >= 5 taps)",
        ),
        "wgrad_mma_cl" => (
            5,
            "grad-weight on tensor cores from channels-last slots (FMA tiles ahead here)",
        ),
        // Channels-last grad-weight from shared-memory tiles (docs/perf.md, runs 106-110):
        // wins on every 2-D and 3-D case against wgrad and wgrad_cl (mobilenet-s1-nhwc
        // 0.063 vs 0.149 ms, convnext-nhwc 0.217 vs 0.417, x3d-ndhwc 0.358 vs 0.823, the
        // NDHWC seed 1.35 vs 2.26, mobilenet-s2 0.090 vs 0.126); on 1-D rows it loses
        // (causal-conv1d-nwc 0.155 vs wgrad 0.119, mamba2 0.219 vs wgrad_cl 0.121).
        // Channels-last grad-weight streaming rows through a ring (run 217, same call,
        // defaults): ahead of wgrad_tile_cl where a step's new rows are all a window
        // needs and more, 3 rows at H stride 2 (mobilenet-s2 0.066 vs 0.074 ms), and on
        // 1-D rows (causal-conv1d-nwc 0.070 vs wgrad 0.107; mamba2 even with wgrad_cl,
        // 0.118 vs 0.120; behind it on hybrid-shortconv, 0.438 vs 0.421); behind
        // wgrad_tile_cl on 3-D (x3d-ndhwc 0.227 vs 0.179, the NDHWC seed 1.49 vs 1.00) and
        // 3x3 at stride 1 (mobilenet-s1-nhwc 0.046 vs 0.043). On 2-D rows of >= 5 taps its
        // runs of up to 14 outputs put it ahead (run 253: convnext-t-nhwc 0.065 vs 0.093,
        // convnext-nhwc 0.113 vs 0.144, efficientnet-k5s2 0.055 vs 0.068); on 3-D ones not
        // (seed-f16-ndhwc 0.885 vs 0.818).
        "wgrad_strip_cl" if mma_cl_2d() => (
            1,
            "grad-weight on channels-last rows streamed through a ring (tensor cores ahead here)",
        ),
        "wgrad_strip_cl"
            if (one_d && spec.c() < 4096 && !window_1d)
                || (strided_3_rows && od == 1)
                || wide_rows_2d =>
        {
            (
                0,
                "grad-weight on channels-last rows streamed through a ring (1-D, 3 rows at H stride >= 2, or 2-D rows of >= 5 taps)",
            )
        }
        "wgrad_strip_cl" if wide_rows_3d => (
            2,
            "grad-weight on channels-last rows streamed through a ring (tiles and copies ahead here)",
        ),
        "wgrad_strip_cl" => (
            1,
            "grad-weight on channels-last rows streamed through a ring (tiles ahead here)",
        ),
        "wgrad_tile_cl" if wide_rows_3d => (
            1,
            "grad-weight on channels-last data from shared-memory tiles (tensor cores on copies ahead here)",
        ),
        "wgrad_tile_cl" if (strided_3_rows && od == 1 && !one_d) || wide_rows_2d => (
            1,
            "grad-weight on channels-last data from shared-memory tiles (the row ring ahead here)",
        ),
        "wgrad_tile_cl" if !one_d => (
            0,
            "grad-weight on channels-last data from shared-memory tiles",
        ),
        "wgrad_tile_cl" => (3, "grad-weight from shared-memory tiles (1-D rows: behind wgrad)"),
        // Channels-last grad-weight, same-call A/B against wgrad (docs/perf.md, run 91):
        // wgrad_cl wins on 1-D specs with thousands of channels (mamba2 0.121 vs 0.148,
        // hybrid-shortconv 0.428 vs 0.548); it loses elsewhere (causal-conv1d-nwc, 2048
        // channels, 0.178 vs 0.122).
        "wgrad_cl" if one_d && spec.c() >= 4096 && !window_1d => (
            0,
            "grad-weight on channels-last 1-D data, several channels a lane",
        ),
        // Channels-first grad-weight on FMA pipes from shared-memory tiles (docs/perf.md,
        // runs 195-197): ahead of tensor cores on 3-wide kernel rows over short rows (x3d
        // 0.140 vs 0.166 ms in run 208; behind on video-vae-causal's 128-wide rows since
        // wgrad_mma's shared ring, run 207), the only fast kernel in f32 (the seed 0.68
        // vs wgrad's 5.38), past wgrad_mma's 16x16 taps (RepLKNet 0.83 vs 2.38) and on 1-D
        // rows (conformer-k31 0.044 vs 0.167, causal-conv1d 0.077 vs 0.136); behind wgrad
        // on rows narrower than 16 (x3d-m-res4 0.53 vs 0.23).
        "wgrad_tile" if !narrow && short_3_wide => (
            0,
            "grad-weight from shared-memory tiles on FMA pipes (3-wide kernel rows)",
        ),
        "wgrad_tile" if !narrow => (
            1,
            "grad-weight from shared-memory tiles on FMA pipes (input rows widened once)",
        ),
        "wgrad_tile" => (
            3,
            "grad-weight from shared-memory tiles (rows narrower than 16: behind wgrad)",
        ),
        "wgrad" => (2, "the grad-weight kernel"),
        // 1-D channels-last rows, row_window_cl's register window on the backward (run
        // 363, H200, same call): mamba2-conv1d 0.062 ms vs wgrad_cl 0.109, hybrid-shortconv
        // 0.214 vs 0.395, causal-conv1d-nwc 0.049 vs wgrad_strip_cl 0.065. Unmeasured on
        // one-row kernels of 2-D and 3-D tensors.
        "wgrad_window_cl" if window_1d => (
            0,
            "1-D channels-last grad-weight, a register window a thread",
        ),
        // 1-D channels-first rows of <= 8 taps, row_window's register window on the
        // backward (H200, run 366, same call, two rounds): causal-conv1d 0.044 ms vs
        // wgrad_tile 0.053, lfm-shortconv-k3 0.072 vs 0.092; behind on conformer-k31's 31
        // taps (0.076 vs 0.035, run 365). Unmeasured on 2-D and 3-D tensors.
        "wgrad_window" if window_1d_cf => (
            0,
            "1-D channels-first grad-weight of few taps, a register window a thread",
        ),
        "wgrad_window" => (
            10,
            "grad-weight of one-row channels-first kernels (many taps, or 2-D and 3-D: unmeasured)",
        ),
        "wgrad_window_cl" => (
            10,
            "grad-weight of one-row channels-last kernels (unmeasured on 2-D and 3-D tensors)",
        ),
        "wgrad_cl" => (
            2,
            "grad-weight on channels-last data (few channels or one depth: wgrad wins)",
        ),
        // Behind the forward kernels on the flipped twin wherever those apply; on
        // channels-last data a thread per 16 bytes of channels shares the index work.
        // A thread per stride cell loads each grad_output vector once for the cell's
        // positions (docs/perf.md, run 288).
        "dgrad_cell_cl" => (
            18,
            "the grad-input gather on channels-last data, a stride cell a thread",
        ),
        "dgrad_gather_cl" => (
            19,
            "the grad-input gather on channels-last data (strided or padded past the kernel)",
        ),
        "dgrad_gather" => (
            20,
            "the grad-input gather (strided or padded past the kernel)",
        ),
        _ => (10, "unranked variant"),
    }
}

/// Where a variant's config comes from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Source {
    /// `--config` / `EVOKERNEL_CONFIG`.
    Forced,
    /// The tune cache for this device, driver and spec, with its time.
    Tuned(f64),
    /// Tuned for the nearest spec of the same kernel, strides, layout and dtype.
    Nearest,
    Default,
}

impl Source {
    pub fn label(self) -> &'static str {
        match self {
            Source::Forced => "forced",
            Source::Tuned(_) => "tuned",
            Source::Nearest => "tuned for a nearby spec",
            Source::Default => "default",
        }
    }
}

/// The problem `v`'s kernel computes for `problem` (its spec, and the key its tuned
/// results are stored under): the problem itself for a variant of its pass; for a
/// forward variant and grad-input, the forward of the flipped twin (unit strides only);
/// `None` when `v` cannot serve the pass.
pub fn kernel_problem(v: &dyn Variant, problem: &ConvProblem) -> Option<ConvProblem> {
    match (problem.pass, v.pass()) {
        // A grad-weight kernel that takes only channels-first data runs a channels-last
        // problem on channels-first copies of it (a chunk of channels at a time, as the
        // plan's memory allows: engine/cuda_plan.rs).
        (Pass::Wgrad, Pass::Wgrad) => {
            let spec = &problem.spec;
            let twin = (spec.layout() == Layout::ChannelsLast && v.applies(spec).is_err())
                .then(|| spec.with_layout(Layout::ChannelsFirst))
                .filter(|twin| v.applies(twin).is_ok());
            Some(ConvProblem {
                spec: twin.unwrap_or_else(|| spec.clone()),
                ..problem.clone()
            })
        }
        (a, b) if a == b => Some(problem.clone()),
        (Pass::Dgrad, Pass::Forward) => problem.spec.dgrad_twin().map(ConvProblem::new),
        _ => None,
    }
}

/// The key `v`'s tuned results for `problem` are stored under: its kernel problem's,
/// except where the kernel runs on channels-first copies, whose time includes the copies
/// and so belongs to the channels-last problem itself.
pub fn tune_key(problem: &ConvProblem, kernel: &ConvProblem) -> String {
    if kernel.spec.layout() != problem.spec.layout() {
        problem.key()
    } else {
        kernel.key()
    }
}

/// The config variant `v` runs `problem` with: a forced one, else the tuned one for this
/// device and driver (tuned with this epilogue, else for the plain convolution), else
/// the variant's default (configs that do not check are skipped).
pub fn config_for(
    v: &dyn Variant,
    problem: &ConvProblem,
    target: &TuneTarget,
    cache: &TuneCache,
    forced: &[Config],
) -> (Config, Source) {
    let kernel = &kernel_problem(v, problem).unwrap_or_else(|| problem.clone());
    let spec = &kernel.spec;
    if let Some(c) = forced
        .iter()
        .filter(|c| c.variant == v.name())
        .map(|c| crate::variants::forced_over_default(v, spec, c))
        .find(|c| check_config(v, spec, c).is_ok())
    {
        return (c, Source::Forced);
    }
    let hash = kernel_hash(v, &target.nvrtc);
    // The plain convolution's key (the spec's alone), whose configs fit any epilogue.
    let plain = |p: &ConvProblem| ConvProblem::new(p.spec.clone());
    let tuned = cache
        .get_current(target, &tune_key(problem, kernel), v.name(), &hash)
        .or_else(|| {
            cache.get_current(
                target,
                &tune_key(&plain(problem), &plain(kernel)),
                v.name(),
                &hash,
            )
        })
        .and_then(|e| Some((e.config.parse::<Config>().ok()?, e.ms)))
        .filter(|(c, _)| check_config(v, spec, c).is_ok());
    if let Some((c, ms)) = tuned {
        return (c, Source::Tuned(ms));
    }
    // Untuned: the config tuned for the nearest spec of the same shape family, if it
    // fits this one.
    let near = cache
        .nearest(target, spec, v.name(), &hash)
        .into_iter()
        .find_map(|(e, _)| {
            let c = e.config.parse::<Config>().ok()?;
            check_config(v, spec, &c).ok().map(|_| c)
        });
    match near {
        Some(c) => (c, Source::Nearest),
        None => (v.default_config(spec), Source::Default),
    }
}

/// The variant and config for `spec` on `device` with `driver`; `Err` says why no GPU
/// kernel can take the spec.
pub fn choose(
    problem: &ConvProblem,
    target: &TuneTarget,
    cache: &TuneCache,
    forced: &[Config],
) -> Result<Choice, String> {
    let spec = &problem.spec;
    ConvArgs::new(spec, 0, 0, 0).map_err(|e| e.to_string())?;
    let picks: Vec<(&'static dyn Variant, Config, Source, ConvSpec)> = registry()
        .into_iter()
        .filter_map(|v| {
            let k = kernel_problem(v, problem)?;
            v.applies(&k.spec).ok()?;
            let (c, s) = config_for(v, problem, target, cache, forced);
            Some((v, c, s, k.spec))
        })
        .collect();
    let choice = |v: &dyn Variant, c: &Config, reason: String| Choice {
        variant: v.name().into(),
        config: c.to_string(),
        reason,
    };
    if let Some((v, c, _, _)) = picks.iter().find(|p| p.2 == Source::Forced) {
        return Ok(choice(*v, c, "forced".into()));
    }
    let tuned = picks
        .iter()
        .filter_map(|(v, c, s, _)| match s {
            Source::Tuned(ms) => Some((v, c, *ms)),
            _ => None,
        })
        .min_by(|a, b| a.2.total_cmp(&b.2));
    if let Some((v, c, ms)) = tuned {
        return Ok(choice(
            *v,
            c,
            format!("tuned: {ms:.3} ms, fastest in the tune cache for this device"),
        ));
    }
    // On copies, ranked by the problem's own (channels-last) spec.
    let ranked = |v: &dyn Variant, k: &ConvSpec| {
        let on_copies = k.layout() != spec.layout();
        rank(v, if on_copies { spec } else { k }, on_copies)
    };
    let (v, c, _, k) = picks
        .iter()
        .min_by_key(|(v, _, _, k)| ranked(*v, k).0)
        .ok_or_else(|| format!("no variant applies to {problem}"))?;
    let how = if v.pass() != problem.pass {
        " (grad-input as the forward of the flipped kernel)"
    } else if k.layout() != spec.layout() {
        " (on channels-first copies of the data, a chunk of channels at a time)"
    } else {
        ""
    };
    Ok(choice(*v, c, format!("ranked: {}{how}", ranked(*v, k).1)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suite::public_suite;
    use crate::tune::CacheEntry;

    fn h100() -> TuneTarget {
        TuneTarget::new("H100", "13.0", "13.0")
    }

    fn empty_cache() -> TuneCache {
        TuneCache::open(&std::env::temp_dir().join("evk-dispatch-none/tune.json"))
    }

    /// The ranking picks the variant that was fastest with default configs on the H100
    /// for every public-suite case (docs/perf.md, runs 19, 29, 34-38 and 48-52) and every
    /// case of the channels-last suite (runs 32-33, 41 and 49-52).
    #[test]
    fn ranking_matches_the_measured_winner_of_every_public_case() {
        let winners = [
            ("seed-bf16", "depth_reuse"),
            ("seed-bf16-ndhwc", "depth_reuse_cl"),
            ("seed-f16", "depth_reuse"),
            ("seed-f32", "depth_reuse_fma"),
            ("x3d-3x3x3", "depth_reuse_fma"),
            ("video-vae-causal", "depth_reuse"),
            ("convnext-7x7", "depth_reuse"),
            ("mobilenet-s2", "depth_reuse_fma_cl"),
            ("causal-conv1d", "row_window"),
            ("odd-dilated", "row_reuse"),
        ];
        let channels_last = [
            ("x3d-ndhwc", "depth_reuse_fma_cl"),
            ("video-vae-ndhwc", "depth_reuse_fma_cl"),
            ("convnext-nhwc", "row_rotation_cl"),
            ("mobilenet-s1-nhwc", "row_rotation_cl"),
            ("seed-f16-ndhwc", "depth_reuse_cl"),
            ("causal-conv1d-nwc", "row_window_cl"),
        ];
        let cl_suite = crate::suite::channels_last_suite().unwrap();
        let cache = empty_cache();
        for case in public_suite().unwrap().into_iter().chain(cl_suite) {
            let want = winners
                .iter()
                .chain(&channels_last)
                .find(|w| w.0 == case.name)
                .unwrap()
                .1;
            let c = choose(&case.spec.clone().into(), &h100(), &cache, &[]).unwrap();
            assert_eq!(c.variant, want, "{}: {}", case.name, c.reason);
            assert!(c.reason.starts_with("ranked"));
        }
        // The models suite, runs 98-99 (default configs, same call); the 1-D rows walked
        // by depth_reuse_fma from run 247; the few-tap ones in row_window's registers from
        // run 364 (H200).
        let models = [
            ("conformer-k31", "depth_reuse_fma"),
            ("mamba2-conv1d", "row_window_cl"),
            ("hybrid-shortconv", "row_window_cl"),
            ("lfm-shortconv-k3", "row_window"),
            ("replknet-31x31", "large_kernel"),
            ("efficientnet-k5s2", "row_rotation_cl"),
            ("x3d-m-res4", "depth_reuse_fma"),
            ("video-vae-decoder", "depth_reuse"),
            ("convnext-t-nhwc", "row_rotation_cl"),
        ];
        for case in crate::suite::models_suite().unwrap() {
            let Some(want) = models.iter().find(|w| w.0 == case.name) else {
                continue;
            };
            let c = choose(&case.spec.clone().into(), &h100(), &cache, &[]).unwrap();
            assert_eq!(c.variant, want.1, "{}: {}", case.name, c.reason);
        }
        // One kernel depth, run 237: 1xKxK 3-D layers with 3-wide rows on FMA pipes, wider
        // ones and 2-D layers walking planes.
        let spec = |input: Vec<i64>, kernel: Vec<i64>, padding: Vec<[i64; 2]>| {
            crate::spec::ConvParams {
                n: 4,
                c: 192,
                input,
                kernel,
                stride: vec![],
                dilation: vec![],
                padding,
                layout: crate::Layout::ChannelsFirst,
                dtype: DType::Bf16,
            }
            .validate()
            .unwrap()
        };
        for (s, want) in [
            (
                spec(
                    vec![16, 56, 56],
                    vec![1, 3, 3],
                    vec![[0, 0], [1, 1], [1, 1]],
                ),
                "depth_reuse_fma",
            ),
            (
                spec(
                    vec![16, 56, 56],
                    vec![1, 5, 5],
                    vec![[0, 0], [2, 2], [2, 2]],
                ),
                "depth_reuse",
            ),
            (
                spec(vec![56, 56], vec![3, 3], vec![[1, 1], [1, 1]]),
                "depth_reuse",
            ),
        ] {
            let c = choose(&s.clone().into(), &h100(), &cache, &[]).unwrap();
            assert_eq!(c.variant, want, "{s}: {}", c.reason);
        }
    }

    #[test]
    fn channels_last_grad_weight_runs_channels_first_kernels_on_copies() {
        let cl = crate::suite::channels_last_suite().unwrap();
        let seed = &cl.iter().find(|c| c.name == "seed-f16-ndhwc").unwrap().spec;
        let problem = ConvProblem::new(seed.clone())
            .with_pass(Pass::Wgrad)
            .with_epilogue(crate::epilogue::Epilogue {
                bias: true,
                ..Default::default()
            });
        let mma = crate::variants::find("wgrad_mma").unwrap();
        let k = kernel_problem(mma, &problem).unwrap();
        assert_eq!(k.spec, seed.with_layout(Layout::ChannelsFirst));
        assert_eq!((k.pass, k.epilogue), (problem.pass, problem.epilogue));
        // Tuned under the channels-last problem's own key (the copies are in its time).
        assert_eq!(tune_key(&problem, &k), problem.key());
        assert_eq!(tune_key(&k, &k), k.key());
        // The channels-last kernels run on the data as it is.
        let tile_cl = crate::variants::find("wgrad_tile_cl").unwrap();
        assert_eq!(kernel_problem(tile_cl, &problem).unwrap(), problem);
        // A channels-first problem: the channels-last kernels do not apply, no copies.
        let cf = ConvProblem::new(seed.with_layout(Layout::ChannelsFirst)).with_pass(Pass::Wgrad);
        assert!(kernel_problem(tile_cl, &cf).is_some_and(|k| tile_cl.applies(&k.spec).is_err()));
        // grad-input and the forward never run on copies.
        let fwd = crate::variants::find("depth_reuse").unwrap();
        for pass in [Pass::Forward, Pass::Dgrad] {
            let other = ConvProblem::new(seed.clone()).with_pass(pass);
            assert!(
                kernel_problem(fwd, &other).is_none_or(|k| k.spec.layout() == Layout::ChannelsLast)
            );
            assert!(kernel_problem(mma, &other).is_none());
        }
    }

    #[test]
    fn grad_weight_ranking_pins_the_measured_winners() {
        // Runs 106-110 (docs/perf.md): wgrad_tile_cl against wgrad and wgrad_cl in the
        // same calls on every channels-last case; 1-D rows from run 91; x3d-m-res4 (W 14)
        // from run 101: wgrad 0.347 vs wgrad_mma 0.428 ms.
        // wgrad_strip_cl against all three on every channels-last case, run 217; its wide
        // runs on 2-D rows of >= 5 taps, run 251; wgrad_mma_cl ahead of it on convnext-nhwc
        // and behind on convnext-t-nhwc, H200 runs 352-353; wgrad_window_cl on the 1-D rows,
        // H200 run 363; wgrad_window on channels-first 1-D rows of few taps, run 366.
        // Channels-first: wgrad_tile against wgrad_mma and wgrad at defaults, run 197;
        // video-vae-causal from run 208 (wgrad_mma's shared ring).
        let winners = [
            ("seed-bf16", "wgrad_mma"),
            ("seed-f32", "wgrad_tile"),
            ("x3d-3x3x3", "wgrad_tile"),
            ("video-vae-causal", "wgrad_mma"),
            ("convnext-7x7", "wgrad_mma"),
            ("causal-conv1d", "wgrad_window"),
            ("conformer-k31", "wgrad_tile"),
            ("lfm-shortconv-k3", "wgrad_window"),
            ("replknet-31x31", "wgrad_tile"),
            ("video-vae-decoder", "wgrad_mma"),
            ("x3d-m-res4", "wgrad"),
            ("seed-bf16-ndhwc", "wgrad_mma_cl"),
            ("mobilenet-s2", "wgrad_strip_cl"),
            ("x3d-ndhwc", "wgrad_tile_cl"),
            ("video-vae-ndhwc", "wgrad_tile_cl"),
            ("convnext-nhwc", "wgrad_mma_cl"),
            ("mobilenet-s1-nhwc", "wgrad_tile_cl"),
            ("seed-f16-ndhwc", "wgrad_mma_cl"),
            ("causal-conv1d-nwc", "wgrad_window_cl"),
            ("mamba2-conv1d", "wgrad_window_cl"),
            ("hybrid-shortconv", "wgrad_window_cl"),
            ("convnext-t-nhwc", "wgrad_strip_cl"),
            ("efficientnet-k5s2", "wgrad_strip_cl"),
        ];
        let cases: Vec<_> = public_suite()
            .unwrap()
            .into_iter()
            .chain(crate::suite::channels_last_suite().unwrap())
            .chain(crate::suite::models_suite().unwrap())
            .collect();
        let cache = empty_cache();
        for (name, want) in winners {
            let case = cases.iter().find(|c| c.name == name).unwrap();
            let problem = ConvProblem {
                spec: case.spec.clone(),
                epilogue: Default::default(),
                pass: Pass::Wgrad,
            };
            let c = choose(&problem, &h100(), &cache, &[]).unwrap();
            assert_eq!(c.variant, want, "{name}: {}", c.reason);
        }
    }

    #[test]
    fn forced_beats_tuned_beats_ranked() {
        let spec = public_suite().unwrap().remove(0).spec;
        let dir = std::env::temp_dir().join(format!("evk-dispatch-{}", std::process::id()));
        let mut cache = TuneCache::open(&dir.join("tune.json"));
        for (variant, config, ms) in [
            ("tensor_core", "tensor_core:warps=8", 0.9),
            ("smem_tile", "smem_tile:block=128,out_w=4", 0.5),
        ] {
            cache
                .record(CacheEntry {
                    device: "H100".into(),
                    driver: "13.0".into(),
                    spec_key: spec.key(),
                    variant: variant.into(),
                    config: config.into(),
                    ms,
                    date_utc: "2026-11-22".into(),
                    kernel_hash: kernel_hash(crate::variants::find(variant).unwrap(), "13.0"),
                    trials: Vec::new(),
                })
                .unwrap();
        }
        let c = choose(&spec.clone().into(), &h100(), &cache, &[]).unwrap();
        assert_eq!(c.config, "smem_tile:block=128,out_w=4");
        assert!(c.reason.starts_with("tuned"));
        // The same entries under another NVRTC (so another kernel hash) are stale.
        let other_nvrtc = TuneTarget::new("H100", "13.0", "12.8");
        let c = choose(&spec.clone().into(), &other_nvrtc, &cache, &[]).unwrap();
        assert!(c.reason.starts_with("ranked"), "{}", c.reason);
        // Another device's results do not count.
        assert_eq!(
            choose(
                &spec.clone().into(),
                &TuneTarget::new("H200", "13.0", "13.0"),
                &cache,
                &[]
            )
            .unwrap()
            .variant,
            "depth_reuse"
        );
        // An untuned spec of the same family takes the nearest tuned config of the
        // variant the ranking picks (here: half the channels of the tuned spec).
        let mut p = crate::spec::ConvParams::seed();
        p.c = 256;
        let near = p.validate().unwrap();
        cache
            .record(CacheEntry {
                device: "H100".into(),
                driver: "13.0".into(),
                spec_key: spec.key(),
                variant: "depth_reuse".into(),
                config:
                    "depth_reuse:bands=1,cols=11,dchunk=16,minblocks=2,planes=0,producer=0,stages=2"
                        .into(),
                ms: 0.4,
                date_utc: "2026-11-22".into(),
                kernel_hash: kernel_hash(crate::variants::find("depth_reuse").unwrap(), "13.0"),
                trials: Vec::new(),
            })
            .unwrap();
        let v = crate::variants::find("depth_reuse").unwrap();
        let (c, s) = config_for(v, &near.clone().into(), &h100(), &cache, &[]);
        assert_eq!(s, Source::Nearest);
        assert_eq!(
            c.to_string(),
            "depth_reuse:bands=1,cols=11,dchunk=16,minblocks=2,planes=0,producer=0,stages=2"
        );
        let forced: Config = "naive:block=128,waves=8".parse().unwrap();
        let c = choose(&spec.clone().into(), &h100(), &cache, &[forced]).unwrap();
        assert_eq!((c.variant.as_str(), c.reason.as_str()), ("naive", "forced"));
        // A forced config that names one parameter: the default for the rest.
        let cl = crate::suite::public_case("seed-bf16-ndhwc");
        let v = crate::variants::find("depth_reuse_cl").unwrap();
        let one: Config = "depth_reuse_cl:warp_channels=1".parse().unwrap();
        let (c, s) = config_for(
            v,
            &cl.clone().into(),
            &h100(),
            &cache,
            std::slice::from_ref(&one),
        );
        let mut expected = v.default_config(&cl);
        expected.values.insert("warp_channels".into(), 1);
        assert_eq!((c, s), (expected, Source::Forced));
        assert!(crate::variants::check_forced(&[one], &cl).is_ok());
        // Completed by the defaults it may still be refused, and says why.
        let barrier: Config = "depth_reuse_cl:producer=0".parse().unwrap();
        let err = crate::variants::check_forced(&[barrier], &cl)
            .unwrap_err()
            .to_string();
        assert!(err.contains("producer=0 takes channels=8"), "{err}");
        assert_eq!(err.matches("does not fit").count(), 1, "{err}");
        std::fs::remove_dir_all(dir).ok();
    }

    /// A per-dimension size past the kernels' 32-bit indices is refused with a clear
    /// error before any kernel sees it (total sizes past 2^31 are fine: offsets are
    /// 64-bit in every kernel).
    #[test]
    fn sizes_past_the_kernels_indices_are_refused_up_front() {
        let params = |w: i64| crate::ConvParams {
            n: 1,
            c: 1,
            input: vec![w],
            kernel: vec![3],
            stride: vec![],
            dilation: vec![],
            padding: vec![],
            layout: crate::Layout::ChannelsFirst,
            dtype: crate::DType::Bf16,
        };
        let err = params(3_000_000_000).validate().unwrap_err().to_string();
        assert!(err.contains("2147483647"), "{err}");
        let big = params(i32::MAX as i64).validate().unwrap();
        assert!(choose(&big.clone().into(), &h100(), &empty_cache(), &[]).is_ok());
    }
}
