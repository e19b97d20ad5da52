//! `BlendedDataset`'s two index arrays: which dataset each blended sample comes from, and
//! which of that dataset's samples it is (`helpers.cpp::build_blending_indices` and
//! `build_exhaustive_blending_indices`).
//!
//! Both are Megatron's greedy rule: sample `s` goes to the dataset whose count lags its
//! share the most (`weight * max(s, 1) - count`, first dataset on ties). The exhaustive
//! variant takes exactly `sizes[d]` samples from each dataset and stops when all are spent.
//! The arithmetic is the same double-precision expression, evaluated in the same order (and,
//! as in an x86-64 build of the helpers, never fused into one multiply-add).

use crate::alloc::vec_for;
use crate::MegatronError;

/// Dataset and per-dataset sample of every blended sample.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlendingIndices {
    /// `dataset_index` (int16 in Megatron: fewer than 32,767 datasets).
    pub dataset: Vec<i16>,
    /// `dataset_sample_index`.
    pub sample: Vec<i64>,
}

impl BlendingIndices {
    fn with_capacity(n: u64) -> Result<Self, MegatronError> {
        Ok(BlendingIndices {
            dataset: vec_for(n, "the blend's dataset index")?,
            sample: vec_for(n, "the blend's dataset sample index")?,
        })
    }

    /// Samples drawn from each of `datasets` datasets.
    pub fn counts(&self, datasets: usize) -> Vec<u64> {
        let mut c = vec![0u64; datasets];
        for &d in &self.dataset {
            c[d as usize] += 1;
        }
        c
    }
}

/// `build_blending_indices(weights, size)`: `size` samples in proportion to `weights`
/// (normalized by the caller, as Megatron normalizes them).
pub fn blending_indices(weights: &[f64], size: u64) -> Result<BlendingIndices, MegatronError> {
    let mut current = vec![0i64; weights.len()];
    let mut out = BlendingIndices::with_capacity(size)?;
    for s in 0..size {
        let best = most_behind(0..weights.len(), weights, &current, s);
        out.dataset.push(best as i16);
        out.sample.push(current[best]);
        current[best] += 1;
    }
    Ok(out)
}

/// Of `candidates`, the dataset furthest behind its share (`weight × max(s, 1) − count`)
/// when sample `s` is drawn; the first of equals, as helpers.cpp's strict `>` picks it.
fn most_behind(
    candidates: impl IntoIterator<Item = usize>,
    weights: &[f64],
    counts: &[i64],
    s: u64,
) -> usize {
    let at = (s as f64).max(1.0);
    let error = |d: usize| weights[d] * at - counts[d] as f64;
    let mut candidates = candidates.into_iter();
    let Some(mut best) = candidates.next() else {
        return 0;
    };
    let mut best_error = error(best);
    for d in candidates {
        let e = error(d);
        if e > best_error {
            best = d;
            best_error = e;
        }
    }
    best
}

/// `build_exhaustive_blending_indices(sizes)`: exactly `sizes[d]` samples of dataset `d`,
/// interleaved in proportion to the sizes. Every size must be positive.
pub fn exhaustive_blending_indices(sizes: &[u64]) -> Result<BlendingIndices, MegatronError> {
    let total: u64 = sizes.iter().sum();
    let weights: Vec<f64> = sizes.iter().map(|&s| s as f64 / total as f64).collect();
    let mut counts = vec![0i64; sizes.len()];
    // std::set<int32_t> in helpers.cpp: visited in increasing order.
    let mut unspent: Vec<usize> = (0..sizes.len()).filter(|&d| sizes[d] > 0).collect();
    let mut out = BlendingIndices::with_capacity(total)?;
    let mut s = 0u64;
    while !unspent.is_empty() {
        let best = most_behind(unspent.iter().copied(), &weights, &counts, s);
        out.dataset.push(best as i16);
        out.sample.push(counts[best]);
        counts[best] += 1;
        if counts[best] as u64 == sizes[best] {
            unspent.retain(|&d| d != best);
        }
        s += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_blend_follows_the_weights_and_breaks_ties_to_the_first() {
        let b = blending_indices(&[0.5, 0.5], 6).unwrap();
        assert_eq!(b.dataset, [0, 1, 0, 1, 0, 1]);
        assert_eq!(b.sample, [0, 0, 1, 1, 2, 2]);
        let b = blending_indices(&[0.25, 0.75], 8).unwrap();
        assert_eq!(b.counts(2), [2, 6]);
    }

    #[test]
    fn exhaustive_blend_spends_every_dataset_exactly() {
        let b = exhaustive_blending_indices(&[3, 1, 5]).unwrap();
        assert_eq!(b.counts(3), [3, 1, 5]);
        for d in 0..3i16 {
            let seen: Vec<i64> = (0..b.dataset.len())
                .filter(|&i| b.dataset[i] == d)
                .map(|i| b.sample[i])
                .collect();
            assert_eq!(seen, (0..seen.len() as i64).collect::<Vec<_>>());
        }
    }
}
