//! Blend weights: checked and normalized as Megatron-Core normalizes them.
//!
//! In a module of its own because the plan (to validate), the mixture (to normalize each
//! stage) and the blender (to draw) all need the same rule, and none of them should reach into
//! another for it.

use crate::error::PlanError;

/// Normalizes blend weights to sum to 1, as Megatron-Core's `normalize` does
/// (`w / numpy.sum(w)`).
///
/// The sum is taken left to right, which is what numpy computes for up to 8 weights (above
/// that numpy sums pairwise, and the last bit of a normalized weight may differ).
pub fn normalize_weights(weights: &[f64]) -> Vec<f64> {
    let sum: f64 = weights.iter().fold(0.0, |s, &w| s + w);
    weights.iter().map(|&w| w / sum).collect()
}

/// `weights` normalized, after checking that there is at least one and that each is finite
/// and positive before and after normalization; the error names the first that is not, as
/// `sources[d].weight`.
pub fn checked_weights(weights: &[f64]) -> Result<Vec<f64>, PlanError> {
    if weights.is_empty() {
        return Err(PlanError::invalid(
            "sources",
            "at least one source is required",
        ));
    }
    if let Some((d, w)) = first_non_positive(weights) {
        return Err(PlanError::invalid(
            format!("sources[{d}].weight"),
            format!("must be a finite number > 0 (got {w})"),
        ));
    }
    let normalized = normalize_weights(weights);
    if let Some((d, w)) = first_non_positive(&normalized) {
        // Only reachable when the sum overflows or a weight underflows relative to it.
        return Err(PlanError::invalid(
            format!("sources[{d}].weight"),
            format!("is out of proportion to the others (normalized to {w})"),
        ));
    }
    Ok(normalized)
}

/// The first weight that is not a finite number above zero, with its index.
fn first_non_positive(weights: &[f64]) -> Option<(usize, f64)> {
    weights
        .iter()
        .copied()
        .enumerate()
        .find(|&(_, w)| !(w.is_finite() && w > 0.0))
}
