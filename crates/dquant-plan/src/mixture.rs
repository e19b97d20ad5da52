//! Mixture schedules: blend weights that change over a run (stages, annealing), with
//! Megatron's rule carried across the changes by exact per-source counts.
//!
//! # The rule
//! A plan's sources' `weight`s hold from sample 0; each of its `[[stages]]` gives new weights
//! from its start (`start_sample`, or `start_fraction` of the run's samples, rounded down).
//! With `interpolate = "step"` (the default) the weights jump at each start; with
//! `"linear"` they move linearly from one start to the next, and hold after the last.
//!
//! Each source `d` has a *target* `T_d(i)`: the weight it was owed over samples `0..i`, the
//! integral of its (normalized) weight. Global sample `i` comes from
//! `argmax_d (T_d(max(i, 1)) − count_d(i))`, ties to the lowest `d`. Before the first stage
//! `T_d(i) = w_d · i`, so this is Megatron-Core's `build_blending_indices` exactly, in the
//! same `f64` operations; after a change it is the same greedy rule on the new weights,
//! starting from the errors the counts carry. So the stream's state is still only the
//! per-source counts at a position: a cursor's `blend` resumes it in O(#sources) across any
//! stage boundary, and every source stays within `[−1, #sources − 1]` samples of its target
//! at every prefix.
//!
//! # Changing a running job's schedule
//! Samples below a position depend only on the segments of the schedule that start below it,
//! so a plan whose stages differ only from there on continues a cursor with nothing lost or
//! repeated ([`Mixture::agrees_below`], used by [`crate::check_plan_change`]).

use crate::error::PlanError;
use crate::plan::{Interpolate, Plan};
use crate::weights::normalize_weights;

/// A resolved mixture schedule: weights as a function of the global sample index.
#[derive(Clone, Debug, PartialEq)]
pub struct Mixture {
    segments: Vec<Segment>,
}

/// Weights over samples `start..end`: moving linearly from `from` to `to` (equal for a step
/// schedule and for the last segment), with each source's target at `start` in `base`.
#[derive(Clone, Debug, PartialEq)]
struct Segment {
    start: u64,
    /// `u64::MAX` for the last segment.
    end: u64,
    from: Vec<f64>,
    to: Vec<f64>,
    base: Vec<f64>,
}

impl Segment {
    /// Source `d`'s target at sample `i` (in this segment).
    #[inline]
    fn target(&self, d: usize, i: u64) -> f64 {
        // From sample 0 Megatron's `max(i, 1)`: the first segment's constant target is
        // `0.0 + w_d * max(i, 1)`, Megatron's own value.
        let dx = if self.start == 0 {
            (i as f64).max(1.0)
        } else {
            (i - self.start) as f64
        };
        let (a, b) = (self.from[d], self.to[d]);
        if a == b {
            self.base[d] + a * dx
        } else {
            let len = (self.end - self.start) as f64;
            self.base[d] + a * dx + (b - a) * dx * dx / (2.0 * len)
        }
    }
}

impl Mixture {
    /// The plan's schedule over a run of `total` samples (which `start_fraction`s resolve
    /// against). Stage starts must increase and lie inside the run.
    pub fn resolve(plan: &Plan, total: u64) -> Result<Self, PlanError> {
        let mut points: Vec<(u64, Vec<f64>)> = Vec::with_capacity(plan.stages.len() + 1);
        let first: Vec<f64> = plan.sources.iter().map(|s| s.weight).collect();
        points.push((0, normalize_weights(&first)));
        for (k, s) in plan.stages.iter().enumerate() {
            let (field, start) = match (s.start_sample, s.start_fraction) {
                (Some(n), _) => ("start_sample", n),
                (None, Some(f)) => ("start_fraction", (f * total as f64).floor() as u64),
                (None, None) => unreachable!("a validated plan's stages have a start"),
            };
            let field = format!("stages[{k}].{field}");
            let prev = points.last().map_or(0, |p| p.0);
            if start <= prev {
                return Err(PlanError::invalid(
                    field,
                    format!("resolves to sample {start}, not after the previous start ({prev})"),
                ));
            }
            if start >= total {
                return Err(PlanError::invalid(
                    field,
                    format!("resolves to sample {start}, at or past the run's {total} samples"),
                ));
            }
            points.push((start, normalize_weights(&s.weights)));
        }
        Ok(Self::from_points(points, plan.interpolate))
    }

    /// Constant normalized `weights`.
    pub(crate) fn constant(weights: Vec<f64>) -> Self {
        Self::from_points(vec![(0, weights)], Interpolate::Step)
    }

    /// A schedule from its breakpoints (sample, normalized weights), the first at 0.
    fn from_points(points: Vec<(u64, Vec<f64>)>, interpolate: Interpolate) -> Self {
        let n = points[0].1.len();
        let mut segments: Vec<Segment> = Vec::with_capacity(points.len());
        for (k, (start, w)) in points.iter().enumerate() {
            let next = points.get(k + 1);
            let to = match (interpolate, next) {
                (Interpolate::Linear, Some((_, w1))) => w1.clone(),
                _ => w.clone(),
            };
            let base = match segments.last() {
                None => vec![0.0; n],
                Some(prev) => (0..n).map(|d| prev.target(d, *start)).collect(),
            };
            segments.push(Segment {
                start: *start,
                end: next.map_or(u64::MAX, |p| p.0),
                from: w.clone(),
                to,
                base,
            });
        }
        Mixture { segments }
    }

    /// Whether the weights never change (no stages).
    pub fn is_constant(&self) -> bool {
        self.segments.len() == 1
    }

    /// The weights from sample 0, normalized.
    pub fn first_weights(&self) -> &[f64] {
        &self.segments[0].from
    }

    /// How many segments it has (stages + 1).
    pub(crate) fn segments(&self) -> usize {
        self.segments.len()
    }

    /// The index of the segment holding sample `i`.
    pub(crate) fn segment_at(&self, i: u64) -> usize {
        self.segments.partition_point(|s| s.start <= i) - 1
    }

    /// Where segment `k` ends (`u64::MAX` for the last).
    #[inline]
    pub(crate) fn segment_end(&self, k: usize) -> u64 {
        self.segments[k].end
    }

    /// Source `d`'s target at sample `i`, which lies in segment `k`.
    #[inline]
    pub(crate) fn target(&self, k: usize, d: usize, i: u64) -> f64 {
        self.segments[k].target(d, i)
    }

    /// Source `d`'s weight at sample `i`, which lies in segment `k`.
    #[inline]
    pub(crate) fn weight(&self, k: usize, d: usize, i: u64) -> f64 {
        let seg = &self.segments[k];
        let (a, b) = (seg.from[d], seg.to[d]);
        if a == b {
            return a;
        }
        let len = (seg.end - seg.start) as f64;
        a + (b - a) * (i - seg.start) as f64 / len
    }

    /// The pick at sample `i` (in segment `k`) given the counts: the largest
    /// `T_d(i) − count_d`, the lowest index on ties.
    #[inline]
    pub(crate) fn argmax(&self, k: usize, i: u64, counts: &[u64]) -> usize {
        let seg = &self.segments[k];
        let mut best = 0;
        let mut best_err = seg.target(0, i) - counts[0] as f64;
        for (d, &c) in counts.iter().enumerate().skip(1) {
            let err = seg.target(d, i) - c as f64;
            if err > best_err {
                best_err = err;
                best = d;
            }
        }
        best
    }

    /// Whether every sample below `reach` gets the same weights (and so the same blend) under
    /// both schedules: the segments that start below `reach` are equal, whole (a linear
    /// segment's slope depends on where it ends). `Err` names the first sample where they
    /// differ.
    pub fn agrees_below(&self, other: &Mixture, reach: u64) -> Result<(), u64> {
        let below = |m: &'_ Mixture| m.segments.iter().filter(|s| s.start < reach).count();
        let (a, b) = (below(self), below(other));
        for k in 0..a.max(b) {
            let (x, y) = (self.segments.get(k), other.segments.get(k));
            let same = match (x, y) {
                (Some(x), Some(y)) => {
                    // A constant segment's values do not depend on where it ends (the next
                    // segment's start, compared in its turn); a ramp's slope does.
                    let constant = x.from == x.to && y.from == y.to;
                    x.start == y.start
                        && x.from == y.from
                        && x.to == y.to
                        && (constant || x.end == y.end)
                }
                _ => false,
            };
            if !same {
                let starts = [x, y].iter().flatten().map(|s| s.start).min();
                return Err(starts.unwrap_or(0));
            }
        }
        Ok(())
    }

    /// The segment starts after sample 0, for reports.
    pub fn starts(&self) -> impl Iterator<Item = u64> + '_ {
        self.segments.iter().skip(1).map(|s| s.start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mix(points: &[(u64, &[f64])], interpolate: Interpolate) -> Mixture {
        let points = points
            .iter()
            .map(|(s, w)| (*s, normalize_weights(w)))
            .collect();
        Mixture::from_points(points, interpolate)
    }

    #[test]
    fn targets_integrate_the_weights() {
        let m = mix(&[(0, &[1.0, 1.0]), (10, &[0.0, 1.0])], Interpolate::Step);
        assert_eq!(m.target(0, 0, 0), 0.5, "Megatron's max(i, 1)");
        assert_eq!(m.target(0, 0, 10), 5.0);
        assert_eq!(m.segment_at(10), 1);
        assert_eq!(m.target(1, 0, 14), 5.0);
        assert_eq!(m.target(1, 1, 14), 9.0);
        let l = mix(&[(0, &[1.0, 0.0]), (10, &[0.0, 1.0])], Interpolate::Linear);
        // Weight of source 1 grows from 0 to 1 over 10 samples: its target at 10 is 5.
        assert!((l.target(0, 1, 10) - 5.0).abs() < 1e-12);
        assert!((l.target(0, 0, 10) - 5.0).abs() < 1e-12);
        assert_eq!(l.segment_at(10), 1);
        assert!((l.target(1, 1, 12) - 7.0).abs() < 1e-12);
    }

    #[test]
    fn agreement_below_a_position() {
        let a = mix(&[(0, &[1.0, 1.0]), (100, &[1.0, 3.0])], Interpolate::Step);
        let b = mix(&[(0, &[1.0, 1.0]), (150, &[1.0, 3.0])], Interpolate::Step);
        assert_eq!(a.agrees_below(&b, 100), Ok(()));
        assert_eq!(a.agrees_below(&b, 101), Err(100));
        let c = mix(&[(0, &[1.0, 1.0])], Interpolate::Step);
        assert_eq!(a.agrees_below(&c, 100), Ok(()));
        assert_eq!(c.agrees_below(&a, 101), Err(100));
        // Linear: a segment's slope depends on its end, so moving it changes earlier samples.
        let la = mix(&[(0, &[1.0, 1.0]), (100, &[1.0, 3.0])], Interpolate::Linear);
        let lb = mix(&[(0, &[1.0, 1.0]), (150, &[1.0, 3.0])], Interpolate::Linear);
        assert_eq!(la.agrees_below(&lb, 50), Err(0));
    }
}
