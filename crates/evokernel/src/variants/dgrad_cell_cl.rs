//! `dgrad_cell_cl`: grad-input of strided channels-last specs, a thread per stride cell
//! (the SD x SH x SW grad_input positions fed by the same few grad_output positions) and
//! 16 bytes of channels (kernels/dgrad_cell_cl.cu). The tap pattern is compile-time, so
//! each grad_output vector of a cell's window is loaded once and feeds every position
//! it reaches; `dgrad_gather_cl`'s thread per position stays the rung below and the
//! fallback where a cell's registers would not fit.

use super::dgrad_gather_cl::{takes_channel_vectors, weight_smem_bytes};
use super::{cuda_type, grid_stride_launch, grid_stride_space, Config, Launch, Param, Variant};
use crate::error::Result;
use crate::pass::Pass;
use crate::spec::ConvSpec;

pub struct DgradCellCl;

typed_params!(Params {
    block,
    waves,
    minblocks,
    window
});

/// Floats a thread may hold for a cell's accumulators, and again for one window row of
/// grad_output (mirrors the kernel's static_asserts).
const CELL_FLOATS: usize = 64;

/// Grad-output positions along one axis that a cell's window spans: from the lowest to
/// the highest offset q some residue r and tap k meet, r + P - k D = q S (CellAxis in the
/// kernel).
fn window(k: usize, s: usize, d: usize, p: usize) -> usize {
    let s = s as i64;
    let offsets = (0..s).flat_map(|r| {
        (0..k as i64)
            .map(move |k| r + p as i64 - k * d as i64)
            .filter(move |x| x.rem_euclid(s) == 0)
            .map(move |x| x / s)
    });
    let (lo, hi) = offsets.fold((i64::MAX, i64::MIN), |(lo, hi), q| (lo.min(q), hi.max(q)));
    (hi - lo + 1) as usize
}

/// Grad-output positions of a window row (the W axis), what a thread loads at once.
fn row_window(spec: &ConvSpec) -> usize {
    window(
        spec.kernel3()[2],
        spec.stride3()[2],
        spec.dilation3()[2],
        spec.pad_before3()[2],
    )
}

/// Grad-output vectors of a cell's whole window (gaps included, as the kernel's array).
fn whole_window(spec: &ConvSpec) -> usize {
    let (k, s, d, p) = (
        spec.kernel3(),
        spec.stride3(),
        spec.dilation3(),
        spec.pad_before3(),
    );
    (0..3).map(|a| window(k[a], s[a], d[a], p[a])).product()
}

/// Whole windows the kernel takes (its static_assert: 12 raw 16-byte words, 48 registers).
const WHOLE_WINDOW_VECTORS: usize = 12;

/// The whole window up front wherever the kernel takes it (run 370: mobilenet-s2 0.0585 ms
/// against 0.0640 a row at a time, efficientnet-k5s2 0.0798 against 0.0831).
fn default_window(spec: &ConvSpec) -> i64 {
    i64::from(whole_window(spec) <= WHOLE_WINDOW_VECTORS)
}

/// The register cap. A row at a time, from the floats a thread holds (a cell's
/// accumulators and a window row): 4 blocks (64 registers) where they are <= 48
/// (mobilenet-s2, 32 + 16: 0.089 -> 0.078 ms, 32 bytes spilled), 3 (80) where <= 64
/// (efficientnet-k5s2, 32 + 24: 0.092 -> 0.089, 40 bytes spilled; at 64 registers 88
/// bytes and 0.110), else ptxas's choice (run 289). The whole window, from its raw words
/// and one position's sums and inputs (2 x VEC floats): mobilenet-s2's 16 + 16 take 59
/// registers unspilled, efficientnet-k5s2's 36 + 16 take 80 (ptxas, both unspilled).
fn default_minblocks(spec: &ConvSpec) -> i64 {
    let v = spec.dtype().per_16_bytes();
    if default_window(spec) == 1 {
        return match 4 * whole_window(spec) + 2 * v {
            0..=32 => 4,
            33..=56 => 3,
            _ => 0,
        };
    }
    let cell: usize = spec.stride3().iter().product();
    match (cell + row_window(spec)) * v {
        0..=48 => 4,
        49..=64 => 3,
        _ => 0,
    }
}

/// Cells along each axis: ceil(input / stride).
fn cells(spec: &ConvSpec) -> usize {
    let (i, s) = (spec.input3(), spec.stride3());
    (0..3).map(|a| i[a].div_ceil(s[a])).product()
}

impl Variant for DgradCellCl {
    fn name(&self) -> &'static str {
        "dgrad_cell_cl"
    }
    fn pass(&self) -> Pass {
        Pass::Dgrad
    }
    fn source(&self) -> &'static str {
        include_str!("../../kernels/dgrad_cell_cl.cu")
    }
    fn applies(&self, spec: &ConvSpec) -> std::result::Result<(), String> {
        takes_channel_vectors(spec)?;
        let v = spec.dtype().per_16_bytes();
        let cell: usize = spec.stride3().iter().product();
        if cell * v > CELL_FLOATS {
            return Err(format!(
                "a stride cell of {cell} positions x {v} channels passes {CELL_FLOATS} accumulators a thread; use dgrad_gather_cl"
            ));
        }
        let row = row_window(spec) * v;
        if row > CELL_FLOATS {
            return Err(format!(
                "a window row of {row} grad_output values passes {CELL_FLOATS} registers a thread; use dgrad_gather_cl"
            ));
        }
        Ok(())
    }
    fn space(&self, spec: &ConvSpec) -> Vec<Param> {
        let mut space = grid_stride_space();
        // Blocks of 256 threads an SM the registers are capped for (`__launch_bounds__`);
        // 0 names no minimum.
        space.push(Param {
            name: "minblocks",
            values: vec![0, 1, 2, 3, 4, 5, 6],
        });
        // 1: the whole window's loads in flight before the first multiply; 0: a row at a time.
        space.push(Param {
            name: "window",
            values: if whole_window(spec) <= WHOLE_WINDOW_VECTORS {
                vec![0, 1]
            } else {
                vec![0]
            },
        });
        space
    }
    fn default_config(&self, spec: &ConvSpec) -> Config {
        Config::new(
            self.name(),
            &[
                ("block", 256),
                ("waves", 16),
                ("minblocks", default_minblocks(spec)),
                ("window", default_window(spec)),
            ],
        )
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        let p = Params::parse(self, spec, config)?;
        let [kd, kh, kw] = spec.kernel3();
        let [sd, sh, sw] = spec.stride3();
        let [dd, dh, dw] = spec.dilation3();
        let [pd, ph, pw] = spec.pad_before3();
        Ok(format!(
            "dgrad_cell_cl_dwconv<{}, {}, {}, {kd}, {kh}, {kw}, {sd}, {sh}, {sw}, {dd}, {dh}, {dw}, {pd}, {ph}, {pw}, {}>",
            cuda_type(spec.dtype()),
            weight_smem_bytes(spec).is_some(),
            p.window == 1,
            p.minblocks,
        ))
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, sms: u32) -> Result<Launch> {
        let p = Params::parse(self, spec, config)?;
        let threads = spec.n() * cells(spec) * (spec.c() / spec.dtype().per_16_bytes());
        let mut launch = grid_stride_launch(threads as u64, p.block as u64, p.waves as u64, sms);
        launch.shared_bytes = weight_smem_bytes(spec).unwrap_or(0);
        Ok(launch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{ConvParams, DType, Layout};

    #[test]
    fn window_spans_the_offsets_a_cell_reads() {
        // 3 taps, stride 2, padding 1: residue 0 reads offset 0, residue 1 offsets 0 and 1.
        assert_eq!(window(3, 2, 1, 1), 2);
        // 7 taps, stride 2, padding 3: offsets -1..=2 (3 - 6 = -3 is met by no residue).
        assert_eq!(window(7, 2, 1, 3), 4);
        // Unit stride: the kernel's K offsets.
        assert_eq!(window(5, 1, 1, 2), 5);
        // 7 taps dilated by 2 at stride 2, padding 6: offsets -3..=3.
        assert_eq!(window(7, 2, 2, 6), 7);
    }

    #[test]
    fn whole_windows_up_front_where_the_kernel_takes_them() {
        let mut p = ConvParams::seed();
        p.layout = Layout::ChannelsLast;
        p.c = 24;
        p.kernel = vec![1, 3, 3];
        p.stride = vec![1, 2, 2];
        p.padding = vec![[0, 0], [1, 1], [1, 1]];
        // mobilenet-s2's 3x3 at stride 2: offsets 0 and 1 on H and W.
        let spec = p.clone().validate().unwrap();
        assert_eq!(whole_window(&spec), 4);
        assert_eq!(DgradCellCl.default_config(&spec).get("window"), Some(1));
        assert_eq!(DgradCellCl.default_config(&spec).get("minblocks"), Some(4));
        // 3x3x3 at stride 2 on every axis: 8 vectors, still whole, 3 blocks.
        p.kernel = vec![3, 3, 3];
        p.stride = vec![2, 2, 2];
        p.padding = vec![[1, 1]; 3];
        let spec = p.clone().validate().unwrap();
        assert_eq!(whole_window(&spec), 8);
        assert_eq!(DgradCellCl.default_config(&spec).get("minblocks"), Some(3));
        // 5x5x5 at stride 2: 27 vectors, a row at a time only.
        p.kernel = vec![5, 5, 5];
        p.padding = vec![[2, 2]; 3];
        let spec = p.validate().unwrap();
        assert_eq!(whole_window(&spec), 27);
        assert_eq!(DgradCellCl.default_config(&spec).get("window"), Some(0));
        let space = DgradCellCl.space(&spec);
        assert_eq!(
            space.iter().find(|q| q.name == "window").unwrap().values,
            vec![0]
        );
    }

    #[test]
    fn takes_channels_last_cells_that_fit_registers() {
        let mut p = ConvParams::seed();
        p.layout = Layout::ChannelsLast;
        p.c = 24;
        p.stride = vec![1, 2, 2];
        assert!(DgradCellCl.applies(&p.clone().validate().unwrap()).is_ok());
        p.stride = vec![2, 2, 2]; // 8 positions x 8 halves: 64
        assert!(DgradCellCl.applies(&p.clone().validate().unwrap()).is_ok());
        p.stride = vec![1, 4, 4]; // 16 positions x 8 halves
        assert!(DgradCellCl.applies(&p.clone().validate().unwrap()).is_err());
        p.dtype = DType::F32; // 16 x 4 floats
        assert!(DgradCellCl.applies(&p.clone().validate().unwrap()).is_ok());
        p.c = 22;
        assert!(DgradCellCl.applies(&p.clone().validate().unwrap()).is_err());
        p.c = 24;
        p.layout = Layout::ChannelsFirst;
        assert!(DgradCellCl.applies(&p.validate().unwrap()).is_err());
    }
}
