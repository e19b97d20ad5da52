//! Per-source limits: at most `max_epochs` or `max_samples` of a source in a run, and what
//! the run does when one is reached.
//!
//! # The rules
//! Source `d`'s limit is `L_d = max_samples`, or `max_epochs × S_d`.
//! - `when_exhausted = "stop"`: the run ends at the last sample `N` at which every limited
//!   source's target (its integrated weight, [`crate::mixture`]) is at most `L_d − 1`. The
//!   blend keeps every count within one sample above its target, so no source is ever drawn
//!   past its limit, and the source that binds has delivered between `L_d − #sources` and
//!   `L_d` samples. `N` comes from the targets alone: no replay, O(#sources × log N) at
//!   open. (A single source stops at exactly `L_d`.)
//! - `when_exhausted = "renormalize"` (Megatron's exhaustive blending, Streaming's
//!   `choose`): a source whose count reaches `L_d` leaves the blend, and the live sources
//!   share what the exhausted ones are still owed in proportion to their current weights:
//!   `T'_d(i) = T_d(i) + w_d(i) / W_live(i) × Σ_exhausted (T_e(i) − L_e)`. With constant
//!   weights that is `w_d / W_live × (i − Σ_exhausted L_e)`: the live sources blend as if the
//!   exhausted ones had only ever had their `L_e` samples. The rule needs only the counts, so
//!   a cursor still resumes in O(#sources). When every source is limited the run has exactly
//!   `Σ_d L_d` samples (or fewer, if the plan's length is shorter), every source drawn exactly
//!   `L_d` times.

use crate::error::PlanError;
use crate::mixture::Mixture;
use crate::plan::{Plan, WhenExhausted};

/// The resolved limits of a plan's sources (`u64::MAX`: unlimited).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    max: Vec<u64>,
    when: WhenExhausted,
}

impl Limits {
    /// The plan's limits, given each source's samples per epoch; `None` when no source has
    /// one.
    pub fn of(plan: &Plan, per_epoch: &[u64]) -> Result<Option<Self>, PlanError> {
        if plan
            .sources
            .iter()
            .all(|s| s.max_epochs.is_none() && s.max_samples.is_none())
        {
            return Ok(None);
        }
        let mut max = Vec::with_capacity(per_epoch.len());
        for (d, (s, &n)) in plan.sources.iter().zip(per_epoch).enumerate() {
            max.push(match (s.max_samples, s.max_epochs) {
                (Some(m), _) => m,
                (None, Some(e)) => e.checked_mul(n).ok_or_else(|| {
                    PlanError::invalid(
                        format!("sources[{d}].max_epochs"),
                        format!("{e} epochs of {n} samples is more than 2^64 - 1"),
                    )
                })?,
                (None, None) => u64::MAX,
            });
        }
        Ok(Some(Limits {
            max,
            when: plan.when_exhausted,
        }))
    }

    /// All limits, by source.
    pub fn all(&self) -> &[u64] {
        &self.max
    }

    /// Whether exhausted sources leave the blend (else the run stops).
    pub fn renormalizes(&self) -> bool {
        self.when == WhenExhausted::Renormalize
    }

    /// The run's length under these limits, for a plan of `total` samples blended by
    /// `mixture`.
    pub fn total(&self, mixture: &Mixture, total: u64) -> Result<u64, PlanError> {
        if self.renormalizes() {
            let all = self
                .max
                .iter()
                .try_fold(0u64, |s, &m| (m != u64::MAX).then(|| s.saturating_add(m)));
            return Ok(all.map_or(total, |sum| sum.min(total)));
        }
        if self.max.len() == 1 {
            return Ok(total.min(self.max[0]));
        }
        // The largest N with T_d(N) <= L_d - 1 for every limited d: T is non-decreasing, so
        // the valid N are a prefix.
        let fits = |n: u64| {
            let k = mixture.segment_at(n);
            self.max
                .iter()
                .enumerate()
                .filter(|(_, &m)| m != u64::MAX)
                .all(|(d, &m)| mixture.target(k, d, n) <= m as f64 - 1.0)
        };
        if total == 0 || fits(total) {
            return Ok(total);
        }
        let (mut lo, mut hi) = (0u64, total);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid.max(1)) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        if lo == 0 {
            let d = (0..self.max.len())
                .find(|&d| mixture.target(0, d, 1) > self.max[d] as f64 - 1.0)
                .unwrap_or(0);
            return Err(PlanError::invalid(
                format!("sources[{d}]"),
                format!(
                    "its limit of {} samples is reached before the run's first sample at its \
                     weight; raise it, or use when_exhausted = \"renormalize\"",
                    self.max[d]
                ),
            ));
        }
        Ok(lo)
    }
}
