//! `wgrad_window_cl`: grad-weight and grad-bias of channels-last one-row kernels at W
//! stride 1 (Mamba's short conv1d), `row_window_cl`'s register window on the backward:
//! a thread a 16-byte channel vector, its split's runs of outputs in a fixed order, wgrad's
//! partials and finalize (kernels/wgrad_window_cl.cu). Deterministic.

use super::row_window_cl::{channel_vectors, one_row_window, window_blocks, window_runs};
use super::wgrad::Wgrad;
use super::{cuda_type, default_launches, grid_x, Config, Launch, Param, Variant};
use crate::error::Result;
use crate::pass::Pass;
use crate::spec::ConvSpec;

pub struct WgradWindowCl;

typed_params!(Params {
    run,
    block,
    groups,
    splits
});

/// Split counts the space offers (grid y): every count to 16, then powers of two and whole
/// waves of 132 SMs' 1-2 blocks.
const SPLITS: [i64; 26] = [
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 24, 32, 33, 48, 64, 66, 96, 128, 132,
    256,
];

/// Blocks of 256 threads an H100 or H200 holds at once at `run = 4` (132 SMs, two blocks
/// of <= 128 registers a thread each): the default fills them.
const RESIDENT_BLOCKS: usize = 264;

impl Params {
    /// Channel vectors a block (threadIdx.x).
    fn vectors(&self) -> usize {
        self.block / self.groups
    }
    /// Blocks along the channels (grid x).
    fn column_blocks(&self, spec: &ConvSpec) -> usize {
        channel_vectors(spec).div_ceil(self.vectors())
    }
}

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
        one_row_window(spec)?;
        default_launches(self, spec)
    }
    fn space(&self, _spec: &ConvSpec) -> Vec<Param> {
        vec![
            // Outputs a work item: more spread the window's extra loads, fewer leave
            // registers for the loads in flight.
            Param {
                name: "run",
                values: vec![2, 4, 8],
            },
            window_blocks(),
            // Groups of a block's threads on the same channel vectors, each its own runs,
            // added in shared memory at the end: threads without more partials.
            Param {
                name: "groups",
                values: vec![1, 2, 4, 8, 16, 32],
            },
            Param {
                name: "splits",
                values: SPLITS.to_vec(),
            },
        ]
    }
    fn default_config(&self, spec: &ConvSpec) -> Config {
        // Four outputs an item (118 registers: raw loads, the window, the sums), warps of
        // 32 channel vectors (512 contiguous bytes a load) and the rest of the block's 256
        // threads in groups; splits to fill the resident blocks in one or two waves, each
        // thread at least two items, the partials under 1/16 of the bytes the pass reads
        // (as wgrad_cl's rule). Run 362 (H200): the old grid of 256 channel vectors a
        // block left a third of the slots empty (mamba2-conv1d 0.089 ms at 64 splits, the
        // time halving with each doubling of splits up to 32).
        let run = 4;
        let block = 256;
        let vectors = channel_vectors(spec).next_power_of_two().clamp(8, 32);
        let p = Params {
            run,
            block,
            groups: block / vectors,
            splits: 1,
        };
        let columns = p.column_blocks(spec);
        let by_items = (window_runs(spec, run) / (2 * p.groups)).max(1);
        let by_bytes = Wgrad::splits_within(spec, 16);
        let cap = by_items.min(by_bytes);
        // Fill of the slots by the last wave (one or two waves), the fewer blocks on a tie.
        let fill = |s: usize| {
            let blocks = columns * s;
            let waves = blocks.div_ceil(RESIDENT_BLOCKS);
            (
                blocks * 1000 / (waves * RESIDENT_BLOCKS),
                std::cmp::Reverse(blocks),
            )
        };
        let splits = SPLITS
            .iter()
            .map(|&s| s as usize)
            .filter(|&s| s <= cap && (s == 1 || columns * s <= 2 * RESIDENT_BLOCKS))
            .max_by_key(|&s| fill(s))
            .unwrap_or(1);
        Params { splits, ..p }.config(self.name())
    }
    fn fits(&self, spec: &ConvSpec, config: &Config) -> std::result::Result<(), String> {
        // A block wider than the channels (and wider than 8 vectors) leaves half or more of
        // its threads idle: a narrower one with more groups does the same work.
        let p = Params::read(config).map_err(|e| e.to_string())?;
        let wide = channel_vectors(spec).next_power_of_two().max(8);
        if p.vectors() > wide {
            return Err(format!(
                "{} channel vectors a block for {} in the spec",
                p.vectors(),
                channel_vectors(spec)
            ));
        }
        Ok(())
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
                grid_x(self, spec, p.column_blocks(spec))?,
                p.splits as u32,
                1,
            ),
            block: (p.vectors() as u32, p.groups as u32, 1),
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
    fn splits_fill_the_resident_blocks_within_the_items_and_the_partials_budget() {
        let v = WgradWindowCl;
        let pick = |spec: &ConvSpec| {
            let c = v.default_config(spec);
            (c.get("groups").unwrap(), c.get("splits").unwrap())
        };
        // mamba2-conv1d: 672 channel vectors in 21 blocks of 32 x 8 groups; 12 splits fill
        // 252 of 264 slots (24 fill two waves as well: the fewer blocks win).
        let mamba = one_d(4, 5376, 2048);
        assert_eq!(pick(&mamba), (8, 12));
        // causal-conv1d-nwc: 8 blocks of channels, 33 splits one whole wave.
        assert_eq!(pick(&one_d(8, 2048, 2048)), (8, 33));
        // hybrid-shortconv: 48 blocks; 11 splits two whole waves (5 would fill 91% of one).
        assert_eq!(pick(&one_d(1, 12288, 16384)), (8, 11));
        // Few channels: blocks of 8 vectors, 32 groups; short rows leave one split (each
        // thread two items), longer ones as many as the items and partials allow.
        assert_eq!(pick(&one_d(1, 64, 40)), (32, 1));
        assert_eq!(pick(&one_d(2, 64, 640)), (32, 5));
        let c = v.default_config(&mamba);
        let l = v.launch(&mamba, &c, 132).unwrap();
        assert_eq!((l.grid, l.block), ((21, 12, 1), (32, 8, 1)));
        assert_eq!(v.partial_splits(&mamba, &c).unwrap(), Some(12));
        // Blocks far wider than the channels are pruned; the default never is.
        let narrow = one_d(1, 64, 640);
        let wide = Config::new(
            "wgrad_window_cl",
            &[("run", 4), ("block", 256), ("groups", 2), ("splits", 1)],
        );
        assert!(v.fits(&narrow, &wide).is_err());
        assert!(v.fits(&narrow, &v.default_config(&narrow)).is_ok());
        // The same domain as the forward's window: not two kernel rows.
        let mut p = ConvParams::seed();
        p.layout = Layout::ChannelsLast;
        assert!(v.applies(&p.validate().unwrap()).is_err());
        assert!(v.applies(&mamba).is_ok());
    }
}
