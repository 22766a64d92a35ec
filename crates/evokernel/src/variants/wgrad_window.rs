//! `wgrad_window`: grad-weight and grad-bias of channels-first one-row kernels at W stride
//! 1 (causal-conv1d), `row_window`'s register window on the backward: a block a channel
//! and a split of its runs, the threads' sums added in a fixed tree, wgrad's partials and
//! finalize (kernels/wgrad_window.cu). Deterministic.

use super::row_window::{one_row_channels_first, vector_runs, window_offset};
use super::row_window_cl::{window_blocks, window_runs};
use super::wgrad::Wgrad;
use super::{cuda_type, default_launches, grid_x, Config, Launch, Param, Variant};
use crate::error::Result;
use crate::pass::Pass;
use crate::spec::ConvSpec;

pub struct WgradWindow;

typed_params!(Params {
    run,
    block,
    splits,
    ahead
});

/// Split counts the space offers (grid y).
const SPLITS: [i64; 10] = [1, 2, 3, 4, 6, 8, 12, 16, 32, 64];

impl Variant for WgradWindow {
    fn name(&self) -> &'static str {
        "wgrad_window"
    }
    fn pass(&self) -> Pass {
        Pass::Wgrad
    }
    fn source(&self) -> &'static str {
        // Over row_window.cu's row decoding and aligned loads.
        concat!(
            include_str!("../../kernels/row_window.cu"),
            include_str!("../../kernels/wgrad_window.cu")
        )
    }
    fn applies(&self, spec: &ConvSpec) -> std::result::Result<(), String> {
        one_row_channels_first(spec)?;
        default_launches(self, spec)
    }
    fn space(&self, spec: &ConvSpec) -> Vec<Param> {
        vec![
            vector_runs(spec),
            window_blocks(),
            Param {
                name: "splits",
                values: SPLITS.to_vec(),
            },
            // 1: the next item's loads issued before this one's sums (80 registers on
            // causal-conv1d where 0 needs 40: a third of the threads an SM).
            Param {
                name: "ahead",
                values: vec![0, 1],
            },
        ]
    }
    fn default_config(&self, spec: &ConvSpec) -> Config {
        // Two output vectors an item, as row_window's forward; a block of 128 a channel;
        // splits for about three items a thread, the partials under 1/16 of the bytes the
        // pass reads. A thread's items run one after another, each waiting for its loads,
        // so fewer items a thread and more blocks in turn ran faster (H200, run 365, the
        // exhaustive tune on causal-conv1d: 1 split 0.053 ms, 8 items a thread; 3 splits
        // 0.047; 32 splits, a quarter of the threads idle, 0.109).
        let run = 2 * spec.dtype().per_16_bytes();
        let block = 128;
        // Items a thread / 3, rounded (a block's items: the runs of one channel's rows).
        let by_items = ((2 * window_runs(spec, run) + 3 * block) / (6 * block)).max(1);
        let by_bytes = Wgrad::splits_within(spec, 16);
        let cap = by_items.min(by_bytes);
        let splits = SPLITS
            .iter()
            .map(|&s| s as usize)
            .filter(|&s| s <= cap)
            .max()
            .unwrap_or(1);
        Params {
            run,
            block,
            splits,
            ahead: 0,
        }
        .config(self.name())
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        let p = Params::parse(self, spec, config)?;
        Ok(format!(
            "wgrad_window_dwconv<{}, {}, {}, {}, {}, {}>",
            cuda_type(spec.dtype()),
            spec.kernel3()[2],
            spec.dilation3()[2],
            p.run,
            window_offset(spec),
            p.ahead
        ))
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, _sms: u32) -> Result<Launch> {
        let p = Params::parse(self, spec, config)?;
        Ok(Launch {
            grid: (grid_x(self, spec, spec.c())?, p.splits as u32, 1),
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

    fn one_d(n: i64, c: i64, w: i64, k: i64, pad: [i64; 2]) -> ConvSpec {
        ConvParams {
            n,
            c,
            input: vec![w],
            kernel: vec![k],
            stride: vec![],
            dilation: vec![],
            padding: vec![pad],
            layout: Layout::ChannelsFirst,
            dtype: DType::Bf16,
        }
        .validate()
        .unwrap()
    }

    #[test]
    fn a_block_a_channel_with_splits_to_fill_the_gpu() {
        let v = WgradWindow;
        let splits = |s: &ConvSpec| v.default_config(s).get("splits").unwrap();
        // causal-conv1d: 1024 runs of 16 a channel, 3 splits (2.7 items a thread).
        let causal = one_d(8, 2048, 2048, 4, [3, 0]);
        assert_eq!(splits(&causal), 3);
        // conformer-k31: 1024 runs a channel too; lfm-shortconv-k3 2048: 4 (5 allowed).
        assert_eq!(splits(&one_d(16, 512, 1024, 31, [15, 15])), 3);
        assert_eq!(splits(&one_d(8, 2048, 4096, 3, [2, 0])), 4);
        // A few short rows: one split.
        assert_eq!(splits(&one_d(1, 16, 64, 4, [3, 0])), 1);
        let l = v.launch(&causal, &v.default_config(&causal), 132).unwrap();
        assert_eq!((l.grid, l.block.0), ((2048, 3, 1), 128));
        // The forward window's domain: channels-first rows of whole vectors.
        assert!(v.applies(&causal).is_ok());
        assert!(v
            .applies(&causal.with_layout(Layout::ChannelsLast))
            .is_err());
        assert!(v.applies(&one_d(8, 64, 60, 4, [3, 0])).is_err());
    }
}
