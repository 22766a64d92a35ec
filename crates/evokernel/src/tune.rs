//! The autotuner: search over a variant's config space (exhaustive or evolutionary) and
//! the persisted cache of the best config per device, driver, spec key and variant.
//! It knows nothing of how a kernel works: candidates are measured by a cost function
//! that returns a time, or `None` for a candidate that was wrong or failed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::cache::{cache_dir, write_atomic};
use crate::error::{Error, Result};
use crate::tensor::SplitMix64;
use crate::variants::{Config, Param};

/// How to search a space.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub enum Strategy {
    /// Every config.
    Exhaustive,
    /// A population evolved by tournament selection, uniform crossover, one-step
    /// mutation and elitism, within a budget of timed candidates and seconds.
    Evolutionary {
        population: usize,
        max_candidates: usize,
        max_seconds: f64,
        seed: u64,
    },
}

impl Strategy {
    /// Short description for tables.
    pub fn label(&self) -> String {
        match self {
            Strategy::Exhaustive => "exhaustive".into(),
            Strategy::Evolutionary {
                population,
                max_candidates,
                ..
            } => format!("evolutionary (pop {population}, <= {max_candidates})"),
        }
    }
}

/// One measured candidate.
#[derive(Clone, Debug, Serialize)]
pub struct Trial {
    pub config: String,
    /// Median ms, or None when the candidate failed verification or did not run.
    pub ms: Option<f64>,
    pub error: Option<String>,
}

/// The outcome of a search.
#[derive(Clone, Debug, Serialize)]
pub struct SearchResult {
    pub best: Option<(Config, f64)>,
    pub trials: Vec<Trial>,
    pub space_size: usize,
    pub seconds: f64,
    /// The finalists re-measured side by side (`confirm`), when they were.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub confirmed: Vec<Confirmation>,
}

/// A finalist of a search re-measured by [`SearchResult::confirm`].
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Confirmation {
    pub config: String,
    /// Its time in the search.
    pub search_ms: f64,
    /// Its re-measurements, in order (empty where one failed: it is then dropped).
    pub ms: Vec<f64>,
}

impl Confirmation {
    /// The median of the re-measurements.
    pub fn median_ms(&self) -> Option<f64> {
        let mut v = self.ms.clone();
        v.sort_by(f64::total_cmp);
        (!v.is_empty()).then(|| v[v.len() / 2])
    }
}

/// Progress of a search, for a progress bar.
pub struct SearchProgress<'a> {
    pub done: usize,
    pub planned: usize,
    pub best_ms: Option<f64>,
    pub last: &'a Trial,
}

/// Runs `strategy` over `all`, the valid configs of `space` (those that fit the
/// device; see `Variant::fits`): nothing outside `all` is measured. `cost` measures a candidate: `Ok(ms)`, or `Err` with
/// the reason (wrong result, launch failure), which is recorded and the candidate
/// discarded; `prepare` is told the next candidates ahead of time (to compile them while
/// the current one is timed). `initial` configs (e.g. the variant's default) open the
/// evolutionary population. No config is measured twice.
pub fn search(
    all: Vec<Config>,
    space: &[Param],
    strategy: Strategy,
    initial: &[Config],
    mut prepare: impl FnMut(&[Config]),
    mut cost: impl FnMut(&Config) -> std::result::Result<f64, String>,
    mut progress: impl FnMut(SearchProgress),
) -> SearchResult {
    let valid: std::collections::HashSet<Config> = all.iter().cloned().collect();
    let start = Instant::now();
    let mut seen: HashMap<Config, Option<f64>> = HashMap::new();
    let mut trials: Vec<Trial> = Vec::new();
    let mut best: Option<(Config, f64)> = None;
    let mut measure = |c: &Config, planned: usize, seen: &mut HashMap<Config, Option<f64>>| {
        let (ms, error) = match cost(c) {
            Ok(ms) if ms.is_finite() && ms > 0.0 => (Some(ms), None),
            Ok(ms) => (None, Some(format!("non-positive time {ms}"))),
            Err(e) => (None, Some(e)),
        };
        seen.insert(c.clone(), ms);
        if let Some(ms) = ms {
            if best.as_ref().is_none_or(|(_, b)| ms < *b) {
                best = Some((c.clone(), ms));
            }
        }
        trials.push(Trial {
            config: c.to_string(),
            ms,
            error,
        });
        progress(SearchProgress {
            done: trials.len(),
            planned,
            best_ms: best.as_ref().map(|b| b.1),
            last: trials.last().expect("just pushed"),
        });
    };
    match strategy {
        Strategy::Exhaustive => {
            prepare(&all);
            for c in &all {
                measure(c, all.len(), &mut seen);
            }
        }
        Strategy::Evolutionary {
            population,
            max_candidates,
            max_seconds,
            seed,
        } => {
            let mut rng = SplitMix64::new(seed);
            if all.is_empty() {
                return SearchResult {
                    best,
                    trials,
                    space_size: 0,
                    seconds: start.elapsed().as_secs_f64(),
                    confirmed: Vec::new(),
                };
            }
            let budget = max_candidates.min(all.len()).max(1);
            let deadline = Duration::from_secs_f64(max_seconds.max(0.0));
            let out_of_budget = |seen: &HashMap<Config, Option<f64>>| {
                seen.len() >= budget || start.elapsed() > deadline
            };
            // Small budgets get a small population, so that several generations of
            // children (the part that exploits what was learned) fit in.
            let population = population.min((budget / 3).max(2));
            // Initial population: the `initial` configs, then distinct random ones.
            let mut order: Vec<usize> = (0..all.len()).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
            }
            let mut first: Vec<Config> = initial
                .iter()
                .filter(|c| all.contains(c))
                .cloned()
                .collect();
            for &i in &order {
                if first.len() >= population.min(budget) {
                    break;
                }
                if !first.contains(&all[i]) {
                    first.push(all[i].clone());
                }
            }
            prepare(&first);
            for c in &first {
                if out_of_budget(&seen) {
                    break;
                }
                measure(c, budget, &mut seen);
            }
            let mut stale = 0;
            while !out_of_budget(&seen) && stale < 50 {
                // Ranked survivors: the best `population` measured configs (elitism).
                let mut ranked: Vec<(&Config, f64)> =
                    seen.iter().filter_map(|(c, m)| m.map(|m| (c, m))).collect();
                ranked.sort_by(|a, b| a.1.total_cmp(&b.1));
                ranked.truncate(population.max(2));
                let mut children = Vec::new();
                // Exploit: half the children are unseen one-step neighbours of the best.
                if let Some((best_cfg, _)) = ranked.first() {
                    let mut near = neighbours(best_cfg, space);
                    for i in (1..near.len()).rev() {
                        near.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
                    }
                    for n in near {
                        if children.len() >= population.max(2).div_ceil(2) {
                            break;
                        }
                        if valid.contains(&n) && !seen.contains_key(&n) && !children.contains(&n) {
                            children.push(n);
                        }
                    }
                }
                // Explore: the rest by tournament, crossover and mutation.
                for _ in 0..population.max(2) * 4 {
                    if children.len() >= population.max(2) {
                        break;
                    }
                    let child = if ranked.len() >= 2 {
                        let a = tournament(&ranked, &mut rng);
                        let b = tournament(&ranked, &mut rng);
                        mutate(&crossover(a, b, &mut rng), space, &mut rng)
                    } else {
                        all[(rng.next_u64() % all.len() as u64) as usize].clone()
                    };
                    if valid.contains(&child)
                        && !seen.contains_key(&child)
                        && !children.contains(&child)
                    {
                        children.push(child);
                    }
                }
                if children.is_empty() {
                    // The neighbourhood is exhausted: take an unseen config at random.
                    stale += 1;
                    if let Some(c) = all.iter().find(|c| !seen.contains_key(*c)) {
                        children.push(c.clone());
                    } else {
                        break;
                    }
                }
                prepare(&children);
                for c in &children {
                    if out_of_budget(&seen) {
                        break;
                    }
                    measure(c, budget, &mut seen);
                }
            }
        }
    }
    SearchResult {
        best,
        trials,
        space_size: all.len(),
        seconds: start.elapsed().as_secs_f64(),
        confirmed: Vec::new(),
    }
}

/// Every config one step away from `c` in one parameter.
fn neighbours(c: &Config, space: &[Param]) -> Vec<Config> {
    let mut out = Vec::new();
    for p in space {
        if let Some(i) = c
            .values
            .get(p.name)
            .and_then(|v| p.values.iter().position(|x| x == v))
        {
            for j in [i.wrapping_sub(1), i + 1] {
                if let Some(&v) = p.values.get(j) {
                    let mut n = c.clone();
                    n.values.insert(p.name.to_string(), v);
                    out.push(n);
                }
            }
        }
    }
    out
}

fn tournament<'a>(ranked: &[(&'a Config, f64)], rng: &mut SplitMix64) -> &'a Config {
    let i = (rng.next_u64() % ranked.len() as u64) as usize;
    let j = (rng.next_u64() % ranked.len() as u64) as usize;
    if ranked[i].1 <= ranked[j].1 {
        ranked[i].0
    } else {
        ranked[j].0
    }
}

fn crossover(a: &Config, b: &Config, rng: &mut SplitMix64) -> Config {
    let mut c = a.clone();
    for (k, v) in c.values.iter_mut() {
        if rng.next_u64() & 1 == 1 {
            if let Some(bv) = b.values.get(k) {
                *v = *bv;
            }
        }
    }
    c
}

/// Moves one parameter to a neighbouring value (or a random one, sometimes).
fn mutate(c: &Config, space: &[Param], rng: &mut SplitMix64) -> Config {
    let mut c = c.clone();
    if space.is_empty() {
        return c;
    }
    let p = &space[(rng.next_u64() % space.len() as u64) as usize];
    if let Some(v) = c.values.get_mut(p.name) {
        let i = p.values.iter().position(|x| x == v).unwrap_or(0);
        let j = match rng.next_u64() % 4 {
            0 => (rng.next_u64() % p.values.len() as u64) as usize,
            1 | 2 => (i + 1).min(p.values.len() - 1),
            _ => i.saturating_sub(1),
        };
        *v = p.values[j];
    }
    c
}

/// Which search `tune` runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SearchKind {
    /// Exhaustive for spaces of up to 16 configs, else evolutionary.
    #[default]
    Auto,
    Exhaustive,
    Evolutionary,
}

impl std::str::FromStr for SearchKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(SearchKind::Auto),
            "exhaustive" => Ok(SearchKind::Exhaustive),
            "evolutionary" | "evo" => Ok(SearchKind::Evolutionary),
            _ => Err(Error::parse(
                "search",
                s,
                "expected auto, exhaustive or evolutionary",
            )),
        }
    }
}

/// One part of a space, for an exhaustive search split across runs (GPU calls too short
/// for the whole space, or several machines): the space's places in a fixed shuffled
/// order (the same on every machine) dealt round-robin, part `index` of `count` (`K/N` on
/// the command line, K from 1) taking the `index`-th of each `count`, kept in the space's
/// order. The shuffle gives every part a like mix: dealt in the space's own order, a
/// parameter whose count of values `count` divides went whole into single parts (runs
/// 405-407: with N = 2, one part held every `ahead` 1 config, the other every `ahead` 2).
/// The parts' leaders are then compared side by side by the person (`bench --config`); a
/// part's best is not the space's, so a sharded search records nothing in the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    /// From 1 to `count`.
    pub index: usize,
    pub count: usize,
}

impl Shard {
    /// This part of `all`, in `all`'s order.
    pub fn take<T>(&self, all: Vec<T>) -> Vec<T> {
        let mut order: Vec<usize> = (0..all.len()).collect();
        let mut rng = SplitMix64::new(SHARD_SHUFFLE_SEED);
        for i in (1..order.len()).rev() {
            order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
        }
        let mut mine = vec![false; all.len()];
        for (dealt, &place) in order.iter().enumerate() {
            mine[place] = dealt % self.count == self.index - 1;
        }
        all.into_iter()
            .zip(mine)
            .filter_map(|(c, m)| m.then_some(c))
            .collect()
    }
}

/// The shard shuffle's seed: fixed, so that every run deals a space the same way.
const SHARD_SHUFFLE_SEED: u64 = 0x5348_4152_4453;

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl std::str::FromStr for Shard {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::parse("shard", s, "expected K/N with 1 <= K <= N, e.g. 1/2");
        let (k, n) = s.split_once('/').ok_or_else(bad)?;
        let (index, count) = (
            k.trim().parse::<usize>().map_err(|_| bad())?,
            n.trim().parse::<usize>().map_err(|_| bad())?,
        );
        if index == 0 || index > count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}

/// How to tune: the search, an evolutionary budget (candidates; default a quarter of
/// the space) and time limit, whether to ignore cached results, and the part of the
/// space an exhaustive search covers.
#[derive(Clone, Debug)]
pub struct TunePlan {
    pub search: SearchKind,
    pub max_candidates: Option<usize>,
    pub max_seconds: f64,
    pub retune: bool,
    /// Exhaustive search only: this part of the space (nothing is cached).
    pub shard: Option<Shard>,
}

impl Default for TunePlan {
    fn default() -> Self {
        TunePlan {
            search: SearchKind::Auto,
            max_candidates: None,
            max_seconds: 60.0,
            retune: false,
            shard: None,
        }
    }
}

impl TunePlan {
    /// Refuses a plan that cannot run: a shard of a search that is not exhaustive (an
    /// evolutionary search's candidates depend on what it has measured, so its parts
    /// would not add up to one search).
    pub fn check(&self) -> Result<()> {
        match (self.shard, self.search) {
            (Some(s), search) if search != SearchKind::Exhaustive => Err(Error::parse(
                "shard",
                &s.to_string(),
                "a shard splits an exhaustive search: add --search exhaustive",
            )),
            _ => Ok(()),
        }
    }

    /// The candidates of the valid configs `all`: the shard's part, or all of them.
    pub fn candidates(&self, all: Vec<Config>) -> Vec<Config> {
        match self.shard {
            Some(s) => s.take(all),
            None => all,
        }
    }

    /// Whether the search's best goes into the cache: not a shard's.
    pub fn records(&self) -> bool {
        self.shard.is_none()
    }

    /// Whether a cached result answers instead of a search: not with `retune`, nor for a
    /// shard (its search is asked for, whatever the cache holds).
    pub fn reads_cache(&self) -> bool {
        !self.retune && self.shard.is_none()
    }

    /// How the search is described in reports: the strategy's label, and the shard.
    pub fn label(&self, strategy: &Strategy) -> String {
        match self.shard {
            Some(s) => format!("{} (shard {s})", strategy.label()),
            None => strategy.label(),
        }
    }

    /// The strategy for a space of `size` valid configs.
    pub fn strategy(&self, size: usize, seed: u64) -> Strategy {
        let evolutionary = Strategy::Evolutionary {
            population: 6.min(size.max(1)),
            max_candidates: self.max_candidates.unwrap_or((size / 4).max(6)),
            max_seconds: self.max_seconds,
            seed,
        };
        match self.search {
            SearchKind::Exhaustive => Strategy::Exhaustive,
            SearchKind::Evolutionary => evolutionary,
            SearchKind::Auto if size <= 16 => Strategy::Exhaustive,
            SearchKind::Auto => evolutionary,
        }
    }
}

/// One variant's tuning outcome.
#[derive(Clone, Debug, Serialize)]
pub struct TuneRow {
    pub variant: String,
    /// True when the result came from the cache and nothing was timed.
    pub from_cache: bool,
    pub default_config: String,
    pub default_ms: Option<f64>,
    pub best_config: Option<String>,
    pub best_ms: Option<f64>,
    pub space_size: usize,
    /// Candidates timed (compiled, verified, measured or failed).
    pub timed: usize,
    pub failed: usize,
    pub seconds: f64,
    pub strategy: String,
    /// Every candidate timed, with its time or why it failed.
    pub trials: Vec<crate::tune::Trial>,
    /// The finalists re-measured side by side, where the tuner confirms (the best's time
    /// is then its median there).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub confirmed: Vec<Confirmation>,
}

/// `YYYY-MM-DDTHH:MM:SSZ` from the system clock (civil-from-days, no time-zone data).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

impl SearchResult {
    /// The trials as the cache keeps them.
    /// Re-measures the `finalists` fastest configs of the search `rounds` times each,
    /// interleaved (A B C A B C), and makes the best the finalist with the lowest median
    /// of its re-measurements, that median its time. A search times each config once,
    /// minutes apart from the others: clocks and heat drift between them by more than
    /// the gaps among the leaders (run 150: the exhaustive search's 0.055 ms leader ran
    /// 0.061 beside the others), so the leaders are compared again side by side. A
    /// finalist whose re-measurement fails is dropped; the best stays the search's where
    /// none is left.
    pub fn confirm(
        &mut self,
        finalists: usize,
        rounds: usize,
        mut cost: impl FnMut(&Config) -> std::result::Result<f64, String>,
    ) {
        let mut ranked: Vec<(Config, f64)> = self
            .trials
            .iter()
            .filter_map(|t| Some((t.config.parse::<Config>().ok()?, t.ms?)))
            .collect();
        ranked.sort_by(|a, b| a.1.total_cmp(&b.1));
        ranked.dedup_by(|a, b| a.0 == b.0);
        ranked.truncate(finalists);
        if ranked.len() < 2 || rounds == 0 {
            return;
        }
        let mut confirmed: Vec<Confirmation> = ranked
            .iter()
            .map(|(c, ms)| Confirmation {
                config: c.to_string(),
                search_ms: *ms,
                ms: Vec::new(),
            })
            .collect();
        let mut failed = vec![false; ranked.len()];
        for _ in 0..rounds {
            for (i, (c, _)) in ranked.iter().enumerate() {
                if failed[i] {
                    continue;
                }
                match cost(c) {
                    Ok(ms) if ms.is_finite() && ms > 0.0 => confirmed[i].ms.push(ms),
                    _ => failed[i] = true,
                }
            }
        }
        for (i, f) in failed.iter().enumerate() {
            if *f {
                confirmed[i].ms.clear();
            }
        }
        let best = ranked
            .iter()
            .zip(&confirmed)
            .filter_map(|((c, _), k)| Some((c.clone(), k.median_ms()?)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        if best.is_some() {
            self.best = best;
        }
        self.confirmed = confirmed;
    }

    pub fn trial_records(&self) -> Vec<TrialRecord> {
        self.trials
            .iter()
            .map(|t| TrialRecord {
                config: t.config.clone(),
                ms: t.ms,
            })
            .collect()
    }
}

impl TuneRow {
    /// A variant found in the cache: nothing timed.
    pub fn cached(
        variant: &str,
        default_config: String,
        entry: &CacheEntry,
        space_size: usize,
    ) -> Self {
        TuneRow {
            variant: variant.to_string(),
            from_cache: true,
            default_config,
            default_ms: None,
            best_config: Some(entry.config.clone()),
            best_ms: Some(entry.ms),
            space_size,
            timed: 0,
            failed: 0,
            seconds: 0.0,
            strategy: format!("cached {}", entry.date_utc),
            trials: Vec::new(),
            confirmed: Vec::new(),
        }
    }

    /// A variant searched with `strategy`; `best_config` is the winner as reports name it.
    pub fn searched(
        variant: &str,
        default_config: String,
        default_ms: Option<f64>,
        best_config: Option<String>,
        strategy: String,
        result: SearchResult,
    ) -> Self {
        TuneRow {
            variant: variant.to_string(),
            from_cache: false,
            default_config,
            default_ms,
            best_config,
            best_ms: result.best.as_ref().map(|b| b.1),
            space_size: result.space_size,
            timed: result.trials.len(),
            failed: result.trials.iter().filter(|t| t.ms.is_none()).count(),
            seconds: result.seconds,
            strategy,
            trials: result.trials,
            confirmed: result.confirmed,
        }
    }
}

/// One case's tuning: a row per variant tuned (or found in the cache).
#[derive(Clone, Debug, Serialize)]
pub struct TuneReport {
    pub name: String,
    pub spec: String,
    pub key: String,
    pub cache: String,
    pub cache_warning: Option<String>,
    pub rows: Vec<TuneRow>,
}

// ---------------------------------------------------------------------------------------
// The persisted cache.

const FORMAT: u32 = 1;

/// What tuned numbers hold for: a device, its driver and the NVRTC that compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TuneTarget {
    pub device: String,
    pub driver: String,
    pub nvrtc: String,
}

impl TuneTarget {
    pub fn new(device: &str, driver: &str, nvrtc: &str) -> Self {
        TuneTarget {
            device: device.into(),
            driver: driver.into(),
            nvrtc: nvrtc.into(),
        }
    }
}

/// One timed candidate of a tuning run, kept with the winner.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TrialRecord {
    pub config: String,
    /// Median milliseconds, or none when the candidate failed or was wrong.
    pub ms: Option<f64>,
}

/// One remembered best config, with every trial of the run that found it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CacheEntry {
    pub device: String,
    pub driver: String,
    /// `ConvProblem::key()`: the spec's key (dtype and layout included) and epilogue.
    pub spec_key: String,
    pub variant: String,
    pub config: String,
    pub ms: f64,
    pub date_utc: String,
    /// `variants::kernel_hash`: the kernel source, the common header and the NVRTC
    /// version it was tuned with. An entry whose hash differs from today's is stale and
    /// ignored (entries written before it was recorded have none).
    #[serde(default)]
    pub kernel_hash: String,
    #[serde(default)]
    pub trials: Vec<TrialRecord>,
}

impl CacheEntry {
    fn slot(&self) -> (&str, &str, &str, &str) {
        (&self.device, &self.driver, &self.spec_key, &self.variant)
    }
}

#[derive(Serialize, Deserialize)]
struct CacheFile {
    format: u32,
    entries: Vec<CacheEntry>,
}

/// `tune.json`: best config per (device, driver, spec key, variant).
#[derive(Debug)]
pub struct TuneCache {
    path: PathBuf,
    entries: Vec<CacheEntry>,
    /// What was wrong with the file when it was read, if anything (it is then rebuilt).
    pub warning: Option<String>,
}

fn read_entries(path: &Path) -> (Vec<CacheEntry>, Option<String>) {
    match std::fs::read_to_string(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (Vec::new(), None),
        Err(e) => (
            Vec::new(),
            Some(format!(
                "cannot read {}: {e}; starting empty",
                path.display()
            )),
        ),
        Ok(text) => match serde_json::from_str::<CacheFile>(&text) {
            Ok(f) if f.format == FORMAT => (f.entries, None),
            Ok(f) => (
                Vec::new(),
                Some(format!(
                    "{} has format {} (this evokernel writes {FORMAT}); it will be rebuilt",
                    path.display(),
                    f.format
                )),
            ),
            Err(e) => (
                Vec::new(),
                Some(format!(
                    "{} is corrupt ({e}); it will be rebuilt",
                    path.display()
                )),
            ),
        },
    }
}

/// An exclusive lock file beside the cache, so concurrent tuners merge instead of
/// overwriting each other. A lock older than 30 s is taken as abandoned.
struct LockFile(PathBuf);

impl LockFile {
    fn acquire(path: &Path) -> Result<Self> {
        let lock = path.with_extension("json.lock");
        if let Some(dir) = lock.parent() {
            std::fs::create_dir_all(dir).map_err(|source| Error::Io {
                action: "cannot create cache folder",
                path: dir.to_path_buf(),
                source,
            })?;
        }
        let start = Instant::now();
        loop {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&lock)
            {
                Ok(_) => return Ok(LockFile(lock)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let stale = std::fs::metadata(&lock)
                        .and_then(|m| m.modified())
                        .map(|t| t.elapsed().unwrap_or_default() > Duration::from_secs(30))
                        .unwrap_or(false);
                    if stale || start.elapsed() > Duration::from_secs(60) {
                        let _ = std::fs::remove_file(&lock);
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(source) => {
                    return Err(Error::Io {
                        action: "cannot create lock file",
                        path: lock,
                        source,
                    })
                }
            }
        }
    }
}

impl Drop for LockFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl TuneCache {
    /// The cache in evokernel's cache folder.
    pub fn open_default() -> Self {
        Self::open(&cache_dir().join("tune.json"))
    }

    /// Reads the cache; a missing, corrupt or foreign-format file gives an empty cache
    /// and a warning, never an error.
    pub fn open(path: &Path) -> Self {
        let (entries, warning) = read_entries(path);
        TuneCache {
            path: path.to_path_buf(),
            entries,
            warning,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn entries(&self) -> &[CacheEntry] {
        &self.entries
    }

    /// The entry for a slot, stale or not.
    pub fn get(
        &self,
        device: &str,
        driver: &str,
        spec_key: &str,
        variant: &str,
    ) -> Option<&CacheEntry> {
        self.entries
            .iter()
            .find(|e| e.slot() == (device, driver, spec_key, variant))
    }

    /// Current entries of `variant` on `target` tuned for other specs of the same kernel,
    /// strides, dilations, layout and dtype as `spec`, nearest first (spec distance),
    /// with their distance.
    pub fn nearest(
        &self,
        target: &TuneTarget,
        spec: &crate::spec::ConvSpec,
        variant: &str,
        kernel_hash: &str,
    ) -> Vec<(&CacheEntry, f64)> {
        let mut near: Vec<(&CacheEntry, f64)> = self
            .entries
            .iter()
            .filter(|e| {
                e.device == target.device
                    && e.driver == target.driver
                    && e.variant == variant
                    && e.kernel_hash == kernel_hash
            })
            .filter_map(|e| {
                let other = crate::spec::ConvSpec::from_key(&e.spec_key).ok()?;
                Some((e, spec.distance(&other)?))
            })
            .collect();
        near.sort_by(|a, b| a.1.total_cmp(&b.1));
        near
    }

    /// The entry for `variant` on `target`, only if it was tuned on the kernel source
    /// and NVRTC of today (`kernel_hash`).
    pub fn get_current(
        &self,
        target: &TuneTarget,
        spec_key: &str,
        variant: &str,
        kernel_hash: &str,
    ) -> Option<&CacheEntry> {
        self.get(&target.device, &target.driver, spec_key, variant)
            .filter(|e| e.kernel_hash == kernel_hash)
    }

    /// Records an entry and writes the file: under the lock, re-reads what others wrote
    /// since, merges (the new entry replaces its slot), and replaces the file atomically.
    pub fn record(&mut self, entry: CacheEntry) -> Result<()> {
        let _lock = LockFile::acquire(&self.path)?;
        let (mut merged, _) = read_entries(&self.path);
        merged.retain(|e| e.slot() != entry.slot());
        merged.push(entry);
        let text = serde_json::to_string_pretty(&CacheFile {
            format: FORMAT,
            entries: merged.clone(),
        })
        .map_err(|e| Error::Io {
            action: "cannot serialize tune cache",
            path: self.path.clone(),
            source: std::io::Error::other(e),
        })?;
        write_atomic(&self.path, text.as_bytes())?;
        self.entries = merged;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Confirmation re-times the leaders side by side: a leader whose search time was a
    /// lucky low (drift) loses to the one that is faster beside it; the best's time is its
    /// median there; a finalist failing its re-measurement is dropped.
    #[test]
    fn confirmation_compares_the_leaders_side_by_side() {
        let space = vec![Param {
            name: "x",
            values: (0..8).collect(),
        }];
        let all = enumerate("v", &space);
        // True times: x=3 fastest (1.0), x=5 next (1.05); the search saw x=5 at 0.9
        // (measured while the clocks ran high).
        let truth = |c: &Config| 1.0 + (c.values["x"] - 3).abs() as f64 * 0.025;
        let mut r = search(
            all.clone(),
            &space,
            Strategy::Exhaustive,
            &[],
            |_| {},
            |c| Ok(if c.values["x"] == 5 { 0.9 } else { truth(c) }),
            |_| {},
        );
        assert_eq!(r.best.as_ref().unwrap().0.values["x"], 5);
        let mut calls = Vec::new();
        r.confirm(3, 3, |c| {
            calls.push(c.values["x"]);
            Ok(truth(c))
        });
        let (best, ms) = r.best.clone().unwrap();
        assert_eq!((best.values["x"], ms), (3, 1.0));
        // Interleaved: the three finalists (5, 3 and one of 2 / 4) each round in turn.
        assert_eq!(calls.len(), 9);
        assert_eq!(&calls[..3], &calls[3..6]);
        assert_eq!(r.confirmed.len(), 3);
        assert_eq!(r.confirmed[0].search_ms, 0.9);
        assert_eq!(r.confirmed[0].median_ms(), Some(1.05));
        // A finalist that fails is dropped; nothing left keeps the search's best.
        let honest = || {
            let all = all.clone();
            search(
                all,
                &space,
                Strategy::Exhaustive,
                &[],
                |_| {},
                |c| Ok(truth(c)),
                |_| {},
            )
        };
        let mut again = honest();
        again.confirm(2, 2, |c| {
            if c.values["x"] == 3 {
                Err("launch failed".into())
            } else {
                Ok(truth(c))
            }
        });
        let (best, _) = again.best.clone().unwrap();
        assert_ne!(best.values["x"], 3);
        assert!(again.confirmed.iter().any(|k| k.ms.is_empty()));
        let mut none = honest();
        none.confirm(3, 2, |_| Err("device lost".into()));
        assert_eq!(none.best.as_ref().unwrap().0.values["x"], 3);
    }
    use crate::variants::enumerate;

    fn space() -> Vec<Param> {
        vec![
            Param {
                name: "a",
                values: (1..=8).collect(),
            },
            Param {
                name: "b",
                values: (1..=6).collect(),
            },
            Param {
                name: "c",
                values: vec![1, 2, 3, 4],
            },
        ]
    }

    /// A smooth bowl with its minimum at a=6, b=2, c=3, plus a ridge of failures.
    fn synthetic(c: &Config) -> std::result::Result<f64, String> {
        let (a, b, cc) = (
            c.get("a").unwrap(),
            c.get("b").unwrap(),
            c.get("c").unwrap(),
        );
        if a == 1 && b == 1 {
            return Err("wrong result".into());
        }
        let d = ((a - 6).pow(2) + (b - 2).pow(2) + (cc - 3).pow(2)) as f64;
        Ok(1.0 + 0.05 * d)
    }

    #[test]
    fn enumerate_is_the_cartesian_product() {
        let all = enumerate("v", &space());
        assert_eq!(all.len(), 8 * 6 * 4);
        let unique: std::collections::HashSet<_> = all.iter().collect();
        assert_eq!(unique.len(), all.len());
    }

    #[test]
    fn exhaustive_finds_the_minimum_and_records_failures() {
        let r = search(
            enumerate("v", &space()),
            &space(),
            Strategy::Exhaustive,
            &[],
            |_| {},
            synthetic,
            |_| {},
        );
        let (best, ms) = r.best.unwrap();
        assert_eq!(best.to_string(), "v:a=6,b=2,c=3");
        assert_eq!(ms, 1.0);
        assert_eq!(r.trials.len(), 192);
        assert_eq!(r.trials.iter().filter(|t| t.error.is_some()).count(), 4);
    }

    #[test]
    fn shards_split_the_space_into_disjoint_parts_that_cover_it() {
        let all = enumerate("v", &space());
        let shards: Vec<Shard> = ["1/5", "2/5", "3/5", "4/5", "5/5"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let parts: Vec<Vec<Config>> = shards.iter().map(|s| s.take(all.clone())).collect();
        let mut joined: Vec<String> = parts.iter().flatten().map(|c| c.to_string()).collect();
        assert_eq!(joined.len(), all.len(), "disjoint");
        joined.sort();
        let mut want: Vec<String> = all.iter().map(|c| c.to_string()).collect();
        want.sort();
        assert_eq!(joined, want, "covering");
        // Like sizes: the parts differ by at most one config.
        let sizes: Vec<usize> = parts.iter().map(Vec::len).collect();
        assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
        // Like mixes: in halves, every value of every parameter is in both (a two-valued
        // parameter last in the space's order went whole into one half when dealt in order).
        for half in ["1/2", "2/2"] {
            let part = half.parse::<Shard>().unwrap().take(all.clone());
            for p in space() {
                for v in &p.values {
                    assert!(
                        part.iter().any(|c| c.values[p.name] == *v),
                        "{half} lacks {}={v}",
                        p.name
                    );
                }
            }
            // In the space's order, and the same part on every call.
            let places: Vec<usize> = part
                .iter()
                .map(|c| all.iter().position(|a| a == c).unwrap())
                .collect();
            assert!(places.windows(2).all(|w| w[0] < w[1]));
            assert_eq!(part, half.parse::<Shard>().unwrap().take(all.clone()));
        }
        assert_eq!(shards[1].to_string(), "2/5");
        for bad in ["0/2", "3/2", "1/0", "2", "a/b", "1/2/3", ""] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_shard_is_only_of_an_exhaustive_search_and_caches_nothing() {
        let shard = Some("2/3".parse().unwrap());
        let plan = TunePlan {
            search: SearchKind::Evolutionary,
            shard,
            ..TunePlan::default()
        };
        assert!(plan
            .check()
            .unwrap_err()
            .to_string()
            .contains("--search exhaustive"));
        let plan = TunePlan {
            search: SearchKind::Exhaustive,
            shard,
            ..TunePlan::default()
        };
        plan.check().unwrap();
        assert!(!plan.records() && !plan.reads_cache());
        assert_eq!(plan.label(&Strategy::Exhaustive), "exhaustive (shard 2/3)");
        let all = enumerate("v", &space());
        assert_eq!(plan.candidates(all.clone()).len(), all.len() / 3);
        // Without a shard: the whole space, cached, and the cache read unless retuning.
        let whole = TunePlan::default();
        assert!(whole.records() && whole.reads_cache());
        assert_eq!(whole.candidates(all.clone()), all);
    }

    #[test]
    fn evolutionary_gets_within_3_percent_on_a_quarter_of_the_space() {
        let mut hits = 0;
        for seed in 0..20 {
            let strategy = Strategy::Evolutionary {
                population: 6,
                max_candidates: 48,
                max_seconds: 60.0,
                seed,
            };
            let mut timed = 0;
            let r = search(
                enumerate("v", &space()),
                &space(),
                strategy,
                &[],
                |_| {},
                |c| {
                    timed += 1;
                    synthetic(c)
                },
                |_| {},
            );
            assert!(timed <= 48, "timed {timed}");
            assert_eq!(timed, r.trials.len());
            let distinct: std::collections::HashSet<_> =
                r.trials.iter().map(|t| &t.config).collect();
            assert_eq!(distinct.len(), r.trials.len(), "a config was timed twice");
            if r.best.unwrap().1 <= 1.03 {
                hits += 1;
            }
        }
        assert!(hits >= 18, "only {hits}/20 seeds got within 3%");
    }

    /// A space like streaming's on a 2-D problem: one parameter changes nothing.
    #[test]
    fn evolutionary_with_a_small_budget_and_a_flat_parameter() {
        let space = vec![
            Param {
                name: "warps",
                values: vec![4, 8],
            },
            Param {
                name: "dchunk",
                values: vec![4, 8, 16, 32, 64],
            },
            Param {
                name: "stages",
                values: vec![1, 2, 3],
            },
        ];
        let cost = |c: &Config| -> std::result::Result<f64, String> {
            let (w, s) = (c.get("warps").unwrap(), c.get("stages").unwrap());
            if s == 3 && w == 8 {
                return Err("too much shared memory".into());
            }
            Ok(match (w, s) {
                (8, 1) => 0.086,
                (8, 2) => 0.092,
                (4, 1) => 0.107,
                _ => 0.110,
            })
        };
        let default = Config::new("v", &[("warps", 4), ("dchunk", 8), ("stages", 1)]);
        let mut hits = 0;
        for seed in 0..20 {
            let strategy = Strategy::Evolutionary {
                population: 6,
                max_candidates: 7,
                max_seconds: 60.0,
                seed,
            };
            let r = search(
                enumerate("v", &space),
                &space,
                strategy,
                std::slice::from_ref(&default),
                |_| {},
                cost,
                |_| {},
            );
            assert!(r.trials.len() <= 7);
            assert_eq!(r.trials[0].config, default.to_string());
            if r.best.unwrap().1 <= 0.086 * 1.03 {
                hits += 1;
            }
        }
        assert!(hits >= 16, "only {hits}/20 seeds found the best");
    }

    #[test]
    fn configs_outside_the_valid_set_are_never_measured() {
        let space = space();
        let fits = |c: &Config| c.get("a").unwrap() < 4;
        let all: Vec<Config> = enumerate("v", &space).into_iter().filter(fits).collect();
        for strategy in [
            Strategy::Exhaustive,
            Strategy::Evolutionary {
                population: 6,
                max_candidates: 40,
                max_seconds: 60.0,
                seed: 3,
            },
        ] {
            let r = search(
                all.clone(),
                &space,
                strategy,
                &[],
                |cs: &[Config]| assert!(cs.iter().all(fits)),
                |c: &Config| {
                    assert!(fits(c), "measured {c}");
                    synthetic(c)
                },
                |_| {},
            );
            assert_eq!(r.space_size, all.len());
            assert!(!r.trials.is_empty());
        }
        let empty = search(
            Vec::new(),
            &space,
            Strategy::Exhaustive,
            &[],
            |_| {},
            synthetic,
            |_| {},
        );
        assert!(empty.best.is_none() && empty.trials.is_empty());
    }

    #[test]
    fn cache_round_trips_and_replaces_its_slot() {
        let dir = std::env::temp_dir().join(format!("evk-tune-{}", std::process::id()));
        let path = dir.join("tune.json");
        let entry = |cfg: &str, ms| CacheEntry {
            device: "H100".into(),
            driver: "13.0".into(),
            spec_key: "k".into(),
            variant: "streaming".into(),
            config: cfg.into(),
            ms,
            date_utc: "2026-11-22".into(),
            kernel_hash: String::new(),
            trials: Vec::new(),
        };
        let mut c = TuneCache::open(&path);
        assert!(c.warning.is_none() && c.entries().is_empty());
        c.record(entry("streaming:warps=4", 0.5)).unwrap();
        c.record(entry("streaming:warps=8", 0.4)).unwrap();
        let again = TuneCache::open(&path);
        assert_eq!(again.entries().len(), 1);
        assert_eq!(
            again.get("H100", "13.0", "k", "streaming").unwrap().config,
            "streaming:warps=8"
        );
        assert!(again.get("H200", "13.0", "k", "streaming").is_none());
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn corrupt_or_foreign_files_are_reported_and_rebuilt() {
        let dir = std::env::temp_dir().join(format!("evk-tune-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tune.json");
        std::fs::write(&path, "{ not json").unwrap();
        let mut c = TuneCache::open(&path);
        assert!(c.warning.as_deref().unwrap().contains("corrupt"));
        c.record(CacheEntry {
            device: "d".into(),
            driver: "1".into(),
            spec_key: "k".into(),
            variant: "v".into(),
            config: "v:".into(),
            ms: 1.0,
            date_utc: "x".into(),
            kernel_hash: String::new(),
            trials: Vec::new(),
        })
        .unwrap();
        assert!(TuneCache::open(&path).warning.is_none());
        std::fs::write(&path, r#"{"format": 99, "entries": []}"#).unwrap();
        assert!(TuneCache::open(&path)
            .warning
            .as_deref()
            .unwrap()
            .contains("format 99"));
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn concurrent_writers_leave_a_valid_file_with_every_entry() {
        let dir = std::env::temp_dir().join(format!("evk-tune-par-{}", std::process::id()));
        let path = dir.join("tune.json");
        std::thread::scope(|s| {
            for t in 0..4 {
                let path = path.clone();
                s.spawn(move || {
                    for i in 0..10 {
                        let mut c = TuneCache::open(&path);
                        c.record(CacheEntry {
                            device: "d".into(),
                            driver: "1".into(),
                            spec_key: format!("k{t}-{i}"),
                            variant: "v".into(),
                            config: "v:".into(),
                            ms: 1.0,
                            date_utc: "x".into(),
                            kernel_hash: String::new(),
                            trials: Vec::new(),
                        })
                        .unwrap();
                    }
                });
            }
        });
        let c = TuneCache::open(&path);
        assert!(c.warning.is_none());
        assert_eq!(c.entries().len(), 40);
        std::fs::remove_dir_all(dir).ok();
    }
}
