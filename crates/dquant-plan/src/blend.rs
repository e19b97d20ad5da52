//! Megatron-Core's blending rule as a stream that never builds an index.
//!
//! Megatron-Core's `BlendedDataset` fills two arrays with one entry per sample
//! (`build_blending_indices` in `megatron/core/datasets/helpers.cpp`): for sample `i` it picks
//! the source whose count lags furthest behind its weight,
//! `argmax_d (w_d * max(i, 1) - count_d)`, the first such source on ties, and records which
//! sample of that source it is. We keep the rule (so a dquant blend draws its sources in the
//! same order Megatron does) but not the arrays: [`Blender`] holds only the per-source counts,
//! O(#sources) memory, and computes the next pick in O(#sources) time.
//!
//! The arithmetic is Megatron's, operation for operation in `f64`: weights normalized by their
//! sum ([`crate::normalize_weights`], numpy's `w / w.sum()`), `max(i, 1)` as a double (so samples 0
//! and 1 both compare against one sample's worth of weight), errors `w_d * i - count_d`, and a
//! strict `>` so the lowest index wins a tie. IEEE arithmetic without fused operations gives the
//! same picks on every machine.
//!
//! Not storing the arrays would make jumping to sample `i` ([`Blender::seek`]) a replay of the
//! rule from the start: nanoseconds a sample, minutes at 10^10. Instead a far seek climbs to
//! the exact counts from a proven upper bound a short window before `i` ([`crate::climb`]:
//! microseconds for tens of sources), and [`Blender::restore`] checks a cursor's counts
//! exactly the same way. Blends with renormalizing limits still replay. Cursors also carry
//! the counts ([`crate::Cursor::blend`]), which restore in O(#sources) plus that check.

use std::sync::Arc;

use crate::climb::{counts_at, Rule};
use crate::error::PlanError;
use crate::kinetic::Tournament;
use crate::mixture::Mixture;
use crate::weights::checked_weights;

/// From this many sources on, a pick asks a [`Tournament`] (O(log #sources) nodes, plus those
/// whose certificates ran out) instead of scanning every source. Measured per draw at steady
/// state, scan against tournament, with weights 1..n, equal, and of 13 values: even at 16
/// sources (34 ns each with 13 values), the tournament ahead from 24 (24-41 ns against
/// 45-90), 2-5x ahead at 100; `cargo bench -p dquant-plan -- scale/batch` at world 4096:
/// 3.0 ms against the scan's 5.4 at 100 sources.
pub const TOURNAMENT_FROM: usize = 24;

/// How many draws [`Blender::seek_until`] makes between asks of its stop condition: about a
/// millisecond of replay with a few sources, so a deadline is met closely and the ask costs
/// nothing.
pub const SEEK_CHECK_EVERY: u64 = 1 << 16;

/// From how many draws ahead a seek climbs ([`crate::climb`], microseconds) rather than
/// replays (about 12 ns a draw), plus 64 a source: the climb's steps cost O(#sources) each.
pub const JUMP_FROM: u64 = 1 << 14;

/// The state of Megatron's blending loop after some number of samples: which source the next
/// global sample comes from, and which of that source's samples it is.
///
/// As an [`Iterator`] it yields `(source, j)` forever: global sample `position()` is the `j`-th
/// sample drawn from `source` (0-based).
#[derive(Clone, Debug)]
pub struct Blender {
    /// Normalized weights.
    weights: Vec<f64>,
    /// Samples drawn from each source so far.
    counts: Vec<u64>,
    /// The next global sample index (the sum of `counts`).
    position: u64,
    /// With many sources, where picks come from (a cache of the argmax; see `kinetic`).
    tournament: Option<Tournament>,
    /// Weights that change during the run ([`crate::mixture`]); `None`: `weights` throughout.
    mixture: Option<Arc<Mixture>>,
    /// The mixture's segment holding `position`.
    segment: usize,
    /// Per-source limits when exhausted sources leave the blend ([`crate::limits`]).
    limits: Option<Arc<Vec<u64>>>,
    /// How many sources have reached their limit.
    exhausted: usize,
}

impl PartialEq for Blender {
    /// Equal blenders draw the same stream: same weights, mixture and limits, same state (the
    /// tournament is a cache of it, the segment and the exhausted count follow from the
    /// position and counts).
    fn eq(&self, other: &Self) -> bool {
        fn state(b: &Blender) -> impl PartialEq + '_ {
            (&b.weights, &b.counts, b.position, &b.mixture, &b.limits)
        }
        state(self) == state(other)
    }
}

impl Blender {
    /// A blender at sample 0 over sources with these (unnormalized) weights.
    ///
    /// Every weight must be finite and positive; the error names the first that is not, as
    /// `sources[d].weight`.
    pub fn new(weights: &[f64]) -> Result<Self, PlanError> {
        Ok(Self::with_mixture(Mixture::constant(checked_weights(
            weights,
        )?)))
    }

    /// A blender at sample 0 whose weights follow `mixture` (a constant one is
    /// [`Blender::new`]'s). Picks with stages scan every source: O(#sources) a draw.
    pub fn with_mixture(mixture: Mixture) -> Self {
        let weights = mixture.first_weights().to_vec();
        let constant = mixture.is_constant();
        Blender {
            counts: vec![0; weights.len()],
            tournament: (constant && weights.len() >= TOURNAMENT_FROM)
                .then(|| Tournament::new(&weights)),
            weights,
            position: 0,
            mixture: (!constant).then(|| Arc::new(mixture)),
            segment: 0,
            limits: None,
            exhausted: 0,
        }
    }

    /// The same blender where a source whose count reaches `max[d]` leaves the blend and the
    /// others share its weight ([`crate::limits`]; `u64::MAX`: no limit). Picks after the
    /// first exhaustion scan every source.
    pub fn renormalizing(mut self, max: Vec<u64>) -> Self {
        self.limits = Some(Arc::new(max));
        self.exhausted = self.count_exhausted();
        self
    }

    fn count_exhausted(&self) -> usize {
        match &self.limits {
            Some(m) => self
                .counts
                .iter()
                .zip(m.iter())
                .filter(|(c, m)| c >= m)
                .count(),
            None => 0,
        }
    }

    /// Source `d`'s weight at the current position.
    fn weight(&self, d: usize) -> f64 {
        match &self.mixture {
            Some(m) => m.weight(self.segment, d, self.position),
            None => self.weights[d],
        }
    }

    /// The pick once a source is exhausted: the largest renormalized error among the live
    /// sources, the lowest index on ties.
    fn pick_renormalized(&self, max: &[u64]) -> usize {
        let i = self.position.max(1);
        let owed = |d: usize| self.target_at(d, i, self.segment);
        let live = |d: &usize| self.counts[*d] < max[*d];
        let n = self.counts.len();
        let surplus: f64 = (0..n)
            .filter(|d| !live(d))
            .map(|d| owed(d) - self.counts[d] as f64)
            .sum();
        let w_live: f64 = (0..n).filter(live).map(|d| self.weight(d)).sum();
        let n_live = (0..n).filter(live).count() as f64;
        let share = |d: usize| match w_live > 0.0 {
            true => self.weight(d) / w_live,
            false => 1.0 / n_live,
        };
        let mut best = None;
        for d in (0..n).filter(live) {
            let err = owed(d) + share(d) * surplus - self.counts[d] as f64;
            if best.is_none_or(|(_, b)| err > b) {
                best = Some((d, err));
            }
        }
        // Every source exhausted: the schedule ends the run before, so this is not reached
        // by a plan's stream; draw the first to stay total.
        best.map_or(0, |(d, _)| d)
    }

    /// Source `d`'s target at sample `i`, which lies in the mixture's `segment`: what it is
    /// owed (`w_d * i` without stages).
    fn target_at(&self, d: usize, i: u64, segment: usize) -> f64 {
        match &self.mixture {
            Some(m) => m.target(segment, d, i),
            None => self.weights[d] * i as f64,
        }
    }

    /// Its weights as a function of the sample: the mixture it follows, or the constant one
    /// of its weights.
    pub fn mixture(&self) -> Mixture {
        match &self.mixture {
            Some(m) => (**m).clone(),
            None => Mixture::constant(self.weights.clone()),
        }
    }

    /// The normalized weights (from sample 0).
    pub fn weights(&self) -> &[f64] {
        &self.weights
    }

    /// The global index of the next sample.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// How many of the samples `0..position()` came from each source.
    pub fn counts(&self) -> &[u64] {
        &self.counts
    }

    /// Moves to the position where each source `d` has been drawn `counts[d]` times (the
    /// blend's state after `Σ counts` samples, as [`Blender::counts`] gave it): O(#sources),
    /// where [`Blender::seek`] replays.
    ///
    /// The counts are checked against the weights: the rule keeps every source within
    /// `#sources` samples of its share (`w_d * position`; its error `w_d * i - count_d` stays
    /// in `[-1, #sources - 1]`), so counts far from it (another plan's, or altered) are refused
    /// by name. Then, for a blend without limits, exactly: the counts must be the blend's at
    /// their position ([`crate::climb`], microseconds). With renormalizing limits only the
    /// band and the limits are checked.
    pub fn restore(&mut self, counts: &[u64]) -> Result<(), PlanError> {
        let n = self.weights.len();
        if counts.len() != n {
            return Err(PlanError::Cursor(format!(
                "blend has {} counts, the plan has {n} sources",
                counts.len()
            )));
        }
        let position = counts
            .iter()
            .try_fold(0u64, |s, &c| s.checked_add(c))
            .ok_or_else(|| PlanError::Cursor("blend counts add up to more than 2^64 - 1".into()))?;
        let i = position as f64;
        // Generous slack for the rounding of `w_d * i` in f64 (a relative 2^-52).
        let slack = 1.0 + i * 1e-12;
        let segment = self.mixture.as_ref().map_or(0, |m| m.segment_at(position));
        if let Some(max) = &self.limits {
            if let Some(d) = (0..n).find(|&d| counts[d] > max[d]) {
                return Err(PlanError::Cursor(format!(
                    "blend[{d}] = {} is past source {d}'s limit of {} samples",
                    counts[d], max[d]
                )));
            }
        }
        // Once a source is exhausted the live ones follow renormalized targets, which the
        // band below does not describe: only the limits are checked then.
        let renormalized = self
            .limits
            .as_ref()
            .is_some_and(|max| (0..n).any(|d| counts[d] >= max[d]));
        for (d, &c) in counts.iter().enumerate().filter(|_| !renormalized) {
            let share = self.target_at(d, position, segment);
            let err = share - c as f64;
            if err < -1.0 - slack || err > n as f64 - 1.0 + slack {
                return Err(PlanError::Cursor(format!(
                    "blend[{d}] = {c} is not this plan's blend after {position} samples \
                     (source {d}'s share is {share:.1})"
                )));
            }
        }
        self.check_exact(counts, position)?;
        self.counts.copy_from_slice(counts);
        self.position = position;
        self.segment = segment;
        self.exhausted = self.count_exhausted();
        if let Some(t) = &mut self.tournament {
            t.forget();
        }
        Ok(())
    }

    /// Draws global sample `position()`: its source and its index among that source's samples.
    /// O(#sources).
    #[inline]
    pub fn next_pick(&mut self) -> (usize, u64) {
        let d = self.pick();
        let j = self.counts[d];
        self.draw(d);
        (d, j)
    }

    /// Counts a draw of source `d`.
    #[inline]
    fn draw(&mut self, d: usize) {
        self.counts[d] += 1;
        if let Some(m) = &self.limits {
            if self.counts[d] == m[d] {
                self.exhausted += 1;
            }
        }
        self.position += 1;
        if let Some(t) = &mut self.tournament {
            t.touched(d, self.counts[d]);
        }
        if let Some(m) = &self.mixture {
            if self.position >= m.segment_end(self.segment) {
                self.segment += 1;
            }
        }
    }

    /// Megatron's argmax, without drawing.
    #[inline]
    fn pick(&mut self) -> usize {
        if self.weights.len() == 1 {
            return 0;
        }
        if self.exhausted > 0 {
            if let Some(max) = &self.limits {
                return self.pick_renormalized(max);
            }
        }
        if let Some(m) = &self.mixture {
            return m.argmax(self.segment, self.position, &self.counts);
        }
        let i = (self.position as f64).max(1.0);
        match &mut self.tournament {
            Some(t) => t.winner(i, &self.counts),
            None => scan(i, &self.weights, &self.counts),
        }
    }

    /// Moves to global sample `i`, so that the next [`Blender::next_pick`] draws sample `i`.
    ///
    /// The counts at `i` have no closed form (they depend on every earlier tie-break). Near
    /// ahead this replays the rule from the current position; further ([`JUMP_FROM`] draws
    /// plus 64 a source) it climbs to them ([`crate::climb`]), exactly. With renormalizing
    /// limits it replays: from the current position when `i` is ahead, from 0 otherwise.
    /// O(1) with a single source.
    pub fn seek(&mut self, i: u64) {
        // A stop condition that never fires lets the replay run to its end.
        let reached = self.seek_until(i, &mut || false);
        debug_assert!(reached);
    }

    /// [`Blender::seek`] that asks `stop` every [`SEEK_CHECK_EVERY`] draws whether to give
    /// up, so a far cursor (a hostile or mistaken one: 2^62 takes centuries) cannot hold a
    /// thread past its caller's deadline. Returns whether it reached `i`; when it did not,
    /// the blender stands somewhere between where it was and `i`.
    pub fn seek_until(&mut self, i: u64, stop: &mut dyn FnMut() -> bool) -> bool {
        if self.weights.len() == 1 {
            self.counts[0] = i;
            self.position = i;
            self.segment = self.mixture.as_ref().map_or(0, |m| m.segment_at(i));
            return true;
        }
        if self.jumps_to(i) {
            return true;
        }
        if i < self.position {
            self.counts.iter_mut().for_each(|c| *c = 0);
            self.position = 0;
            self.segment = 0;
            self.exhausted = 0;
            if let Some(t) = &mut self.tournament {
                t.forget();
            }
        }
        while self.position < i {
            if self.position.is_multiple_of(SEEK_CHECK_EVERY) && stop() {
                return false;
            }
            let d = self.pick();
            self.draw(d);
        }
        true
    }
}

impl Blender {
    /// The rule without limits, for the climb; `None` with limits (they change the rule
    /// when a source runs out).
    fn climbable(&self) -> Option<Rule<'_>> {
        self.limits.is_none().then(|| Rule {
            weights: &self.weights,
            mixture: self.mixture.as_deref(),
        })
    }

    /// Refuses `counts` that are not the blend's own state after `position` samples, naming
    /// the first source that differs.
    fn check_exact(&self, counts: &[u64], position: u64) -> Result<(), PlanError> {
        let Some(rule) = self.climbable() else {
            return Ok(());
        };
        let Some(want) = counts_at(&rule, position) else {
            return Ok(());
        };
        match counts.iter().zip(&want).position(|(a, b)| a != b) {
            None => Ok(()),
            Some(d) => Err(PlanError::Cursor(format!(
                "blend[{d}] = {} is not this plan's blend after {position} samples (it gives {})",
                counts[d], want[d]
            ))),
        }
    }

    /// Moves to global sample `i` by the certified climb ([`crate::climb`]) when that beats
    /// replaying to it: a blend without limits, `i` further than [`JUMP_FROM`] draws (more
    /// with many sources) past where a replay would start. Returns whether it moved.
    fn jumps_to(&mut self, i: u64) -> bool {
        let k = self.weights.len() as u64;
        let from = if i >= self.position { self.position } else { 0 };
        if k == 1 || i - from <= JUMP_FROM + 64 * k {
            return false;
        }
        let Some(rule) = self.climbable() else {
            return false;
        };
        let Some(counts) = counts_at(&rule, i) else {
            return false;
        };
        self.set_state(&counts);
        true
    }

    /// Moves to the state `counts`, known to be this blend's own (a climb's result, or a
    /// checkpoint taken from it): [`Blender::restore`] without its checks.
    pub(crate) fn set_state(&mut self, counts: &[u64]) {
        let position = counts.iter().sum();
        self.counts.copy_from_slice(counts);
        self.position = position;
        self.segment = self.mixture.as_ref().map_or(0, |m| m.segment_at(position));
        self.exhausted = self.count_exhausted();
        if let Some(t) = &mut self.tournament {
            t.forget();
        }
    }
}

impl Iterator for Blender {
    type Item = (usize, u64);

    #[inline]
    fn next(&mut self) -> Option<(usize, u64)> {
        Some(self.next_pick())
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::MAX, None)
    }
}

/// Megatron's argmax over every source: the largest error `w_d * i - count_d`, the lowest
/// index on ties.
#[inline]
pub(crate) fn scan(i: f64, weights: &[f64], counts: &[u64]) -> usize {
    let mut best = 0;
    let mut best_err = weights[0] * i - counts[0] as f64;
    for (d, (&w, &c)) in weights.iter().zip(counts).enumerate().skip(1) {
        let err = w * i - c as f64;
        if err > best_err {
            best_err = err;
            best = d;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn megatron_quirk_max_i_1() {
        // Weights 0.5/0.5: at i = 0 both errors are 0.5 -> source 0. At i = 1 (max(1,1) = 1):
        // errors -0.5 and 0.5 -> source 1. Then alternating.
        let b = Blender::new(&[1.0, 1.0]).unwrap();
        let picks: Vec<usize> = b.take(6).map(|(d, _)| d).collect();
        assert_eq!(picks, [0, 1, 0, 1, 0, 1]);

        // 0.25/0.75: i=0: .25 vs .75 -> 1; i=1 (as 1): .25 vs -.25 -> 0; i=2: .5-1 vs 1.5-1 -> 1;
        // i=3: .75-1 vs 2.25-2 = -.25 vs .25 -> 1; i=4: 1-1 vs 3-3 -> tie -> 0.
        let b = Blender::new(&[1.0, 3.0]).unwrap();
        let picks: Vec<(usize, u64)> = b.take(5).collect();
        assert_eq!(picks, [(1, 0), (0, 0), (1, 1), (1, 2), (0, 1)]);
    }

    #[test]
    fn seek_forward_backward_and_single_source() {
        let mut a = Blender::new(&[0.2, 0.3, 0.5]).unwrap();
        let stream: Vec<(usize, u64)> = a.clone().take(1000).collect();
        for i in [999, 0, 500, 17, 17, 18, 998] {
            a.seek(i);
            assert_eq!(a.position(), i);
            assert_eq!(a.counts().iter().sum::<u64>(), i);
            assert_eq!(a.next_pick(), stream[i as usize], "seek({i})");
        }
        let mut one = Blender::new(&[5.0]).unwrap();
        one.seek(1 << 60);
        assert_eq!(one.next_pick(), (0, 1 << 60));
    }

    #[test]
    fn a_far_seek_stops_when_asked_and_a_near_one_is_unaffected() {
        // Renormalizing limits keep the climb out: the seek replays, asking as it goes.
        let mut b = Blender::new(&[0.5, 0.5])
            .unwrap()
            .renormalizing(vec![u64::MAX, u64::MAX]);
        let mut asks = 0;
        let mut stop = || {
            asks += 1;
            asks > 3
        };
        assert!(!b.seek_until(1 << 62, &mut stop));
        // Asked at draws 0, 2^16, 2 × 2^16 and 3 × 2^16: it stopped at the fourth ask.
        assert_eq!(b.position(), 3 * SEEK_CHECK_EVERY);
        assert_eq!(asks, 4);
        let mut c = Blender::new(&[0.5, 0.5]).unwrap();
        assert!(c.seek_until(1000, &mut || false));
        let mut d = Blender::new(&[0.5, 0.5]).unwrap();
        d.seek(1000);
        assert_eq!(c, d);
        // Without limits the same far seek climbs there at once, never asking.
        let mut e = Blender::new(&[0.5, 0.5]).unwrap();
        assert!(e.seek_until(1 << 62, &mut || unreachable!("a climb does not ask")));
        // (Not 2^61 each: at 2^62, `0.5 * i` in f64 is a multiple of 512, and the rule with it.)
        assert_eq!(e.counts().iter().sum::<u64>(), 1 << 62);
    }

    /// Picks through the tournament are the full scan's, over long runs of weights of every
    /// kind (all equal: ties everywhere; a few values: ties within groups; spread over six
    /// orders of magnitude; one source dominating), and after seeks and restores.
    #[test]
    fn tournament_picks_equal_the_full_scan() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for case in 0..16 {
            let n = [64, 100, 257, 1000][case % 4];
            let weights: Vec<f64> = (0..n)
                .map(|d| match case / 4 {
                    0 => 1.0,
                    1 => (next() % 5 + 1) as f64,
                    2 => 10f64.powf((next() % 6_000) as f64 / 1000.0),
                    _ => {
                        if d == 7 {
                            1e4
                        } else {
                            1.0 + (next() % 100) as f64 / 100.0
                        }
                    }
                })
                .collect();
            let mut fast = Blender::new(&weights).unwrap();
            fast.tournament = Some(Tournament::new(&fast.weights));
            let mut plain = fast.clone();
            plain.tournament = None;
            for step in 0..30_000u64 {
                assert_eq!(
                    fast.next_pick(),
                    plain.next_pick(),
                    "case {case} step {step}"
                );
            }
            let counts = plain.counts().to_vec();
            fast.seek(777);
            plain.seek(777);
            assert_eq!(
                fast.next_pick(),
                plain.next_pick(),
                "case {case} after seek"
            );
            fast.restore(&counts).unwrap();
            plain.restore(&counts).unwrap();
            for step in 0..5_000u64 {
                assert_eq!(
                    fast.next_pick(),
                    plain.next_pick(),
                    "case {case} restored {step}"
                );
            }
        }
    }

    #[test]
    fn weight_errors_name_the_source() {
        assert_eq!(
            Blender::new(&[1.0, -0.5]).unwrap_err().to_string(),
            "sources[1].weight: must be a finite number > 0 (got -0.5)"
        );
        assert_eq!(
            Blender::new(&[f64::NAN]).unwrap_err().to_string(),
            "sources[0].weight: must be a finite number > 0 (got NaN)"
        );
        assert_eq!(
            Blender::new(&[]).unwrap_err().to_string(),
            "sources: at least one source is required"
        );
        assert_eq!(
            Blender::new(&[f64::MAX, f64::MAX]).unwrap_err().to_string(),
            "sources[0].weight: is out of proportion to the others (normalized to 0)"
        );
    }
}
