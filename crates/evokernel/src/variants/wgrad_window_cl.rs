//! `wgrad_window_cl`: grad-weight and grad-bias of channels-last one-row kernels at W
//! stride 1 (Mamba's short conv1d), `row_window_cl`'s register window on the backward:
//! a thread a 16-byte channel vector, its split's runs of outputs in a fixed order, wgrad's
//! partials and finalize (kernels/wgrad_window_cl.cu). Deterministic.

use super::row_window_cl::{channel_vectors, one_row_window, window_runs};
use super::wgrad::Wgrad;
use super::{cuda_type, grid_x, Config, Launch, Param, Variant};
use crate::error::Result;
use crate::pass::Pass;
use crate::spec::ConvSpec;

pub struct WgradWindowCl;

typed_params!(Params { run, block, splits });

/// Split counts the space offers (grid y).
const SPLITS: [i64; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];

impl Variant for WgradWindowCl {
    fn name(&self) -> &'static str {
        "wgrad_window_cl"
    }
    fn pass(&self) -> Pass {
        Pass::Wgrad
    }
    fn source(&self) -> &'static str {
        // Over row_window_cl.cu's run decoding and window loads.
        concat!(
            include_str!("../../kernels/row_window_cl.cu"),
            include_str!("../../kernels/wgrad_window_cl.cu")
        )
    }
    fn applies(&self, spec: &ConvSpec) -> std::result::Result<(), String> {
        one_row_window(spec)
    }
    fn space(&self, _spec: &ConvSpec) -> Vec<Param> {
        vec![
            // Outputs a work item: more spread the window's extra loads, fewer leave
            // registers for the loads in flight.
            Param {
                name: "run",
                values: vec![2, 4, 8],
            },
            Param {
                name: "block",
                values: vec![128, 256],
            },
            Param {
                name: "splits",
                values: SPLITS.to_vec(),
            },
        ]
    }
    fn default_config(&self, spec: &ConvSpec) -> Config {
        // Not measured yet. Four outputs an item (116-124 registers: raw loads, the
        // window, the sums); splits for ~64 K threads, each at least two items, the
        // partials under 1/16 of the bytes the pass reads (as wgrad_cl's rule).
        let run = 4;
        let want = (65536 / channel_vectors(spec).max(1)).max(1);
        let by_items = (window_runs(spec, run) / 2).max(1);
        let read = (spec.input_len() + spec.output_len()) * spec.dtype().size_bytes();
        let by_bytes = (read / 16 / Wgrad::partial_bytes(spec, 1)).max(1);
        let cap = want.min(by_items).min(by_bytes);
        let splits = SPLITS
            .iter()
            .copied()
            .filter(|&s| s as usize <= cap)
            .max()
            .unwrap_or(SPLITS[0]);
        Params {
            run,
            block: 256,
            splits: splits as usize,
        }
        .config(self.name())
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        let p = Params::parse(self, spec, config)?;
        Ok(format!(
            "wgrad_window_cl_dwconv<{}, {}, {}, {}>",
            cuda_type(spec.dtype()),
            spec.kernel3()[2],
            spec.dilation3()[2],
            p.run
        ))
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, _sms: u32) -> Result<Launch> {
        let p = Params::parse(self, spec, config)?;
        Ok(Launch {
            grid: (
                grid_x(self, spec, channel_vectors(spec).div_ceil(p.block))?,
                p.splits as u32,
                1,
            ),
            block: (p.block as u32, 1, 1),
            shared_bytes: 0,
        })
    }
    fn partial_splits(&self, spec: &ConvSpec, config: &Config) -> Result<Option<usize>> {
        Ok(Some(Params::parse(self, spec, config)?.splits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{ConvParams, DType, Layout};

    fn one_d(n: i64, c: i64, w: i64) -> ConvSpec {
        ConvParams {
            n,
            c,
            input: vec![w],
            kernel: vec![4],
            stride: vec![],
            dilation: vec![],
            padding: vec![[3, 0]],
            layout: Layout::ChannelsLast,
            dtype: DType::Bf16,
        }
        .validate()
        .unwrap()
    }

    #[test]
    fn splits_fill_the_gpu_within_the_items_and_the_partials_budget() {
        let v = WgradWindowCl;
        // mamba2-conv1d: 672 channel vectors; 97 threads' worth asked, the partials cap
        // (176 MB read / 16 over 107 KB a split) at 102: 64.
        let mamba = one_d(4, 5376, 2048);
        assert_eq!(v.default_config(&mamba).get("splits"), Some(64));
        // Short rows: a split's partials (C x 5 taps x 4 bytes) against a 16th of the 4
        // bytes a position reads leave one split under 80 outputs a row.
        assert_eq!(v.default_config(&one_d(1, 64, 40)).get("splits"), Some(1));
        assert_eq!(v.default_config(&one_d(2, 64, 640)).get("splits"), Some(16));
        let l = v.launch(&mamba, &v.default_config(&mamba), 132).unwrap();
        assert_eq!((l.grid, l.block.0), ((3, 64, 1), 256));
        assert_eq!(
            v.partial_splits(&mamba, &v.default_config(&mamba)).unwrap(),
            Some(64)
        );
        // The same domain as the forward's window: not two kernel rows.
        let mut p = ConvParams::seed();
        p.layout = Layout::ChannelsLast;
        assert!(v.applies(&p.validate().unwrap()).is_err());
        assert!(v.applies(&mamba).is_ok());
    }
}
