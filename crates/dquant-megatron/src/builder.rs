//! `BlendedMegatronDatasetBuilder.build()`: which datasets each split gets, of what size.
//!
//! The rules, as Megatron-Core applies them:
//! - one `blend` shared by the splits (cut by the `split` string), or a `blend_per_split`;
//! - a single prefix without weights is a plain GPT dataset per split;
//! - with weights, each source is built for `ceil(ceil(size * weight) * (1 + surplus))`
//!   samples (`mid_level_dataset_surplus`), and the blend for the sum of the
//!   `ceil(size * weight)`;
//! - without weights, each source is built for one epoch and weighted by its length; the blend
//!   is `min(size, total)` samples, or exhaustive when the size is `None`.
//!
//! Sources are read through a callback giving each prefix's sequence lengths, so this module
//! stays pure: the caller decides whether they come from local files, S3 or an agent.

use std::collections::HashMap;
use std::sync::Arc;

use crate::blending::{blending_indices, exhaustive_blending_indices};
use crate::cache::IndexStore;
use crate::datasets::{BlendedDataset, GptDataset, TopLevel};
use crate::gpt_index::{GptIndex, GptParams};
use crate::numpy_float::{normalize, numpy_isclose, python_sum};
use crate::split::{document_range, split_matrix, Split, SplitMatrix};
use crate::MegatronError;

/// Dataset prefixes, with weights or without (`blend` in Megatron's config).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Blend {
    pub prefixes: Vec<String>,
    pub weights: Option<Vec<f64>>,
}

/// The part of `GPTDatasetConfig` (and of the builder's `sizes`) that decides samples.
///
/// Its JSON form (serde's, every field named) is what a client sends an agent to have the
/// samples built there, and what keys the agent's cache of built indices.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildConfig {
    pub random_seed: u32,
    pub sequence_length: u32,
    pub blend: Option<Blend>,
    pub blend_per_split: Option<[Option<Blend>; 3]>,
    pub split: Option<String>,
    /// The builder's `sizes`: samples per split (`None`: one epoch, or exhaustive).
    pub num_samples: [Option<u64>; 3],
    pub mid_level_dataset_surplus: f64,
    pub add_extra_token_to_sequence: bool,
    pub drop_last_partial_validation_sequence: bool,
}

impl BuildConfig {
    /// Megatron-Core's defaults for everything but the blend, split and sizes.
    pub fn new(random_seed: u32, sequence_length: u32) -> Self {
        BuildConfig {
            random_seed,
            sequence_length,
            blend: None,
            blend_per_split: None,
            split: None,
            num_samples: [None; 3],
            mid_level_dataset_surplus: 0.005,
            add_extra_token_to_sequence: true,
            drop_last_partial_validation_sequence: true,
        }
    }

    /// Every prefix named, each once, in order of first mention.
    pub fn prefixes(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let blends = self
            .blend
            .iter()
            .chain(self.blend_per_split.iter().flatten().flatten());
        for p in blends.flat_map(|b| &b.prefixes) {
            if !out.contains(p) {
                out.push(p.clone());
            }
        }
        out
    }

    fn params(&self, split: Split) -> GptParams {
        GptParams {
            sequence_length: self.sequence_length,
            add_extra_token_to_sequence: self.add_extra_token_to_sequence,
            random_seed: self.random_seed,
            drop_last_partial_sequence: split != Split::Valid
                || self.drop_last_partial_validation_sequence,
        }
    }
}

/// What `build()` returns: the sources by index, and each split's dataset or `None`.
#[derive(Clone, Debug)]
pub struct Built {
    pub sources: Vec<String>,
    pub splits: [Option<TopLevel>; 3],
}

/// Gives a source's sequence lengths (Megatron's int32 `sequence_lengths`) by prefix.
pub type LengthsOf<'a> = dyn FnMut(&str) -> Result<Arc<[i32]>, MegatronError> + 'a;

/// Builds the three splits. `lengths(prefix)` gives a source's sequence lengths.
pub fn build(config: &BuildConfig, lengths: &mut LengthsOf<'_>) -> Result<Built, MegatronError> {
    build_cached(config, lengths, None)
}

/// What a build may allocate: set by a process that builds for others (an agent), so that
/// a config cannot make it allocate more than it can hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuildLimits {
    /// Entries of one GPT dataset's document index (its documents x epochs).
    pub max_index_entries: u64,
}

impl BuildLimits {
    /// No limit but the allocator's.
    pub const NONE: Self = BuildLimits {
        max_index_entries: u64::MAX,
    };
}

/// [`build`], reading each GPT dataset's indices from `store` when it has them and keeping
/// there the ones it builds.
pub fn build_cached(
    config: &BuildConfig,
    lengths: &mut LengthsOf<'_>,
    store: Option<&dyn IndexStore>,
) -> Result<Built, MegatronError> {
    build_within(config, lengths, store, BuildLimits::NONE)
}

/// [`build_cached`] within `limits`: an index over them is refused before it is allocated
/// (one read from `store` is not: it was built within some limit).
pub fn build_within(
    config: &BuildConfig,
    lengths: &mut LengthsOf<'_>,
    store: Option<&dyn IndexStore>,
    limits: BuildLimits,
) -> Result<Built, MegatronError> {
    check_sizes_and_weights(config)?;
    let sources = config.prefixes();
    let mut loaded = HashMap::new();
    for (i, p) in sources.iter().enumerate() {
        loaded.insert(p.clone(), (i, lengths(p)?));
    }
    let b = Builder {
        config,
        loaded,
        store,
        limits,
    };
    let splits = match (&config.blend, &config.blend_per_split) {
        (Some(blend), None) => {
            let matrix = split_matrix(config.split.as_deref().ok_or_else(|| {
                MegatronError::Config("split must be provided when blend is given".into())
            })?)?;
            b.shared_blend(blend, &matrix)?
        }
        (None, Some(per_split)) => b.blend_per_split(per_split)?,
        (Some(_), Some(_)) => {
            return Err(MegatronError::Config(
                "blend and blend_per_split are incompatible".into(),
            ))
        }
        (None, None) => {
            return Err(MegatronError::Config(
                "give blend or blend_per_split (Megatron's mock data is not served)".into(),
            ))
        }
    };
    Ok(Built { sources, splits })
}

/// The builder's constructor check: a split without a size cannot have weights.
fn check_sizes_and_weights(config: &BuildConfig) -> Result<(), MegatronError> {
    for split in Split::ALL {
        let blend = match (&config.blend, &config.blend_per_split) {
            (_, Some(per)) => match &per[split as usize] {
                Some(b) => b,
                None => continue,
            },
            (Some(b), None) => b,
            (None, None) => continue,
        };
        if let Some(w) = &blend.weights {
            if w.len() != blend.prefixes.len() {
                return Err(MegatronError::Config(format!(
                    "{} prefixes but {} weights",
                    blend.prefixes.len(),
                    w.len()
                )));
            }
        }
        if blend.prefixes.is_empty() {
            return Err(MegatronError::Config(format!(
                "the {} blend names no prefix",
                split.name()
            )));
        }
        if config.num_samples[split as usize].is_none() && blend.weights.is_some() {
            return Err(MegatronError::Config(format!(
                "the {} split has weights but no number of samples (Megatron-Core requires one with the other)",
                split.name()
            )));
        }
    }
    Ok(())
}

struct Builder<'a> {
    config: &'a BuildConfig,
    loaded: HashMap<String, (usize, Arc<[i32]>)>,
    store: Option<&'a dyn IndexStore>,
    limits: BuildLimits,
}

/// What a GPT dataset's indices depend on, as a cache key: the source (its name, sequences
/// and tokens), its documents, the samples asked for and every parameter.
fn index_key(
    prefix: &str,
    lengths: &[i32],
    docs: &std::ops::Range<u64>,
    n: Option<u64>,
    params: &GptParams,
) -> String {
    let tokens: i64 = lengths.iter().map(|&l| i64::from(l)).sum();
    format!(
        "gpt-index v1 {prefix:?} sequences={} tokens={tokens} documents={docs:?} \
         num_samples={n:?} {params:?}",
        lengths.len()
    )
}

/// A GPT dataset's indices: from `store` when it has them, else built (and kept there).
fn gpt_index(
    store: Option<&dyn IndexStore>,
    key: &str,
    lengths: &[i32],
    docs: std::ops::Range<u64>,
    n: Option<u64>,
    params: &GptParams,
    limits: BuildLimits,
) -> Result<GptIndex, MegatronError> {
    if let Some(ix) = store.and_then(|s| s.load(key)) {
        return Ok(ix);
    }
    let ix = GptIndex::build_within(lengths, docs, n, params, limits.max_index_entries)?;
    if let Some(s) = store {
        s.store(key, &ix);
    }
    Ok(ix)
}

impl Builder<'_> {
    /// `_build_megatron_dataset_splits`: one source's GPT datasets, one per split present.
    fn gpt_splits(
        &self,
        prefix: &str,
        matrix: &SplitMatrix,
        sizes: &[Option<u64>; 3],
    ) -> Result<[Option<GptDataset>; 3], MegatronError> {
        let (source, lengths) = &self.loaded[prefix];
        // The splits draw from their own RandomState each: build them side by side.
        let built: Vec<(Split, Result<GptIndex, MegatronError>)> = std::thread::scope(|scope| {
            let jobs: Vec<_> = Split::ALL
                .into_iter()
                .filter_map(|split| Some((split, matrix[split as usize]?)))
                .map(|(split, bookends)| {
                    let docs = document_range(bookends, lengths.len() as u64);
                    let params = self.config.params(split);
                    let n = sizes[split as usize];
                    let (store, limits) = (self.store, self.limits);
                    let job = move || {
                        let key = index_key(prefix, lengths, &docs, n, &params);
                        gpt_index(store, &key, lengths, docs, n, &params, limits)
                    };
                    (split, scope.spawn(job))
                })
                .collect();
            jobs.into_iter()
                .map(|(split, job)| {
                    (
                        split,
                        job.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                    )
                })
                .collect()
        });
        let mut out: [Option<GptDataset>; 3] = [None, None, None];
        for (split, index) in built {
            out[split as usize] = Some(GptDataset {
                source: *source,
                split,
                num_samples: sizes[split as usize],
                params: self.config.params(split),
                index: index.map_err(|e| e.in_dataset(prefix, split))?,
                lengths: lengths.clone(),
            });
        }
        Ok(out)
    }

    /// All splits from one blend, cut by the split string.
    fn shared_blend(
        &self,
        blend: &Blend,
        matrix: &SplitMatrix,
    ) -> Result<[Option<TopLevel>; 3], MegatronError> {
        let sizes = self.config.num_samples;
        let weights = blend.weights.as_deref().map(normalize);
        if blend.prefixes.len() == 1 && weights.is_none() {
            let gpt = self.gpt_splits(&blend.prefixes[0], matrix, &sizes)?;
            return Ok(gpt.map(|d| d.map(TopLevel::Gpt)));
        }
        let mut per_source = self.sources(blend, matrix, &sizes, weights.as_deref())?;
        let mut out: [Option<TopLevel>; 3] = [None, None, None];
        for split in Split::ALL {
            if matrix[split as usize].is_none() {
                continue;
            }
            let top = self.blended(
                &mut per_source,
                weights.as_deref(),
                split,
                sizes[split as usize],
            )?;
            out[split as usize] = Some(top);
        }
        Ok(out)
    }

    /// Each split from its own blend (`blend_per_split`).
    fn blend_per_split(
        &self,
        per: &[Option<Blend>; 3],
    ) -> Result<[Option<TopLevel>; 3], MegatronError> {
        let mut out: [Option<TopLevel>; 3] = [None, None, None];
        for split in Split::ALL {
            let Some(blend) = &per[split as usize] else {
                continue;
            };
            let mut matrix: SplitMatrix = [None; 3];
            matrix[split as usize] = Some((0.0, 1.0));
            let mut sizes = [Some(0); 3];
            sizes[split as usize] = self.config.num_samples[split as usize];
            let weights = blend.weights.as_deref().map(normalize);
            if blend.prefixes.len() == 1 {
                let mut gpt = self.gpt_splits(&blend.prefixes[0], &matrix, &sizes)?;
                out[split as usize] = gpt[split as usize].take().map(TopLevel::Gpt);
                continue;
            }
            let mut per_source = self.sources(blend, &matrix, &sizes, weights.as_deref())?;
            let top = self.blended(
                &mut per_source,
                weights.as_deref(),
                split,
                sizes[split as usize],
            )?;
            out[split as usize] = Some(top);
        }
        Ok(out)
    }

    /// The mid-level datasets of a blend, built for their share of each split's size.
    fn sources(
        &self,
        blend: &Blend,
        matrix: &SplitMatrix,
        sizes: &[Option<u64>; 3],
        weights: Option<&[f64]>,
    ) -> Result<PerSource, MegatronError> {
        let (targets, buffers) = match weights {
            None => (Vec::new(), vec![[None; 3]; blend.prefixes.len()]),
            Some(w) => (
                size_per_split_per_dataset(w, sizes, 0.0)?,
                size_per_split_per_dataset(w, sizes, self.config.mid_level_dataset_surplus)?,
            ),
        };
        let sources = blend
            .prefixes
            .iter()
            .zip(&buffers)
            .map(|(p, sizes)| self.gpt_splits(p, matrix, sizes))
            .collect::<Result<_, _>>()?;
        Ok(PerSource { sources, targets })
    }

    /// The top-level dataset of a split: weights and size as the builder chooses them.
    fn blended(
        &self,
        per_source: &mut PerSource,
        weights: Option<&[f64]>,
        split: Split,
        size: Option<u64>,
    ) -> Result<TopLevel, MegatronError> {
        let datasets = per_source.take(split);
        let (weights, size) = match (weights, size) {
            (Some(w), Some(_)) => {
                let size = per_source
                    .targets
                    .iter()
                    .map(|t| t[split as usize].unwrap_or(0))
                    .sum();
                (w.to_vec(), Some(size))
            }
            (None, size) => {
                let lens: Vec<f64> = datasets.iter().map(|d| d.len() as f64).collect();
                let total: u64 = datasets.iter().map(|d| d.len()).sum();
                (lens, size.map(|s| s.min(total)))
            }
            (Some(_), None) => {
                return Err(MegatronError::Config(
                    "Using client-specified weights requires client-specified size".into(),
                ))
            }
        };
        Ok(TopLevel::Blended(blended_dataset(datasets, weights, size)?))
    }
}

struct PerSource {
    sources: Vec<[Option<GptDataset>; 3]>,
    /// Per source, the samples it is meant to give each split (empty without weights).
    targets: Vec<[Option<u64>; 3]>,
}

impl PerSource {
    /// Every source's dataset of `split` (built for every split the matrix holds).
    fn take(&mut self, split: Split) -> Vec<GptDataset> {
        self.sources
            .iter_mut()
            .filter_map(|s| s[split as usize].take())
            .collect()
    }
}

/// `_get_size_per_split_per_dataset`.
fn size_per_split_per_dataset(
    weights: &[f64],
    sizes: &[Option<u64>; 3],
    surplus: f64,
) -> Result<Vec<[Option<u64>; 3]>, MegatronError> {
    if !numpy_isclose(python_sum(weights), 1.0) {
        return Err(MegatronError::Config("the weights do not sum to 1".into()));
    }
    Ok(weights
        .iter()
        .map(|&w| {
            sizes.map(|s| s.map(|t| (((t as f64 * w).ceil()) * (1.0 + surplus)).ceil() as u64))
        })
        .collect())
}

/// `BlendedDataset(datasets, weights, size)`: checks, then the blending indices.
fn blended_dataset(
    datasets: Vec<GptDataset>,
    weights: Vec<f64>,
    size: Option<u64>,
) -> Result<BlendedDataset, MegatronError> {
    if datasets.len() >= 32767 {
        return Err(MegatronError::Config(format!(
            "{} datasets in one blend; Megatron-Core allows fewer than 32767",
            datasets.len()
        )));
    }
    if let Some(k) = weights.iter().position(|&w| w.is_nan() || w <= 0.0) {
        return Err(MegatronError::Config(format!(
            "dataset {k} of the {} blend has weight {} (an empty split of a source?); Megatron-Core requires every weight to be positive",
            datasets[0].split.name(),
            weights[k]
        )));
    }
    let (weights, indices) = match size {
        Some(size) => {
            let w = normalize(&weights);
            let ix = blending_indices(&w, size)?;
            (w, ix)
        }
        None => {
            let sizes: Vec<u64> = weights.iter().map(|&w| w as u64).collect();
            (weights, exhaustive_blending_indices(&sizes)?)
        }
    };
    for (k, (&want, d)) in indices
        .counts(datasets.len())
        .iter()
        .zip(&datasets)
        .enumerate()
    {
        if want > d.len() {
            return Err(MegatronError::Oversampled {
                split: d.split.name(),
                dataset: k,
                requested: want,
                available: d.len(),
            });
        }
    }
    Ok(BlendedDataset {
        datasets,
        weights,
        size,
        indices,
    })
}
