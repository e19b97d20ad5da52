//! The blend's per-source counts at any sample without replaying from 0: a certified "climb"
//! from a proven upper bound down to the exact state, a short window before the sample.
//!
//! Why: Megatron's greedy rule has no closed form for its counts (they depend on every earlier
//! tie-break), and replaying it costs about 12 ns a sample: two minutes to reach 10^10. Every
//! bare cursor, `locate`, `audit` and seek paid that. Two facts make a jump exact instead:
//!
//! 1. **Monotonicity** (exact in f64, ties included). If counts `a ≤ b` coordinate-wise at the
//!    same position, then after one step of the rule `a' ≤ b'`. Errors `fl(τ_d − c_d)` fall as
//!    `c_d` grows; if `a` picked `p` and `b` picked `q ≠ p` with `a_p = b_p`, then
//!    `E^a_p = E^b_p ≤ E^b_q ≤ E^a_q ≤ E^a_p`, all equal, and the lowest-index tie rule cannot
//!    pick both `p < q` and `q < p`.
//! 2. **An upper corner.** The true count never exceeds `U_d(i) = ⌊τ_d(i − 1) + 1 + σ⌋`: when
//!    `d` was last drawn its error was the largest, so at least the mean, 0 (up to rounding,
//!    which `σ` covers with room to spare; too large a `σ` costs a step, never exactness).
//!
//! The climb starts from `U` at `m = n − window`. `ΣU − m = g ≥ 0` is how far above the truth
//! it is. The truth `t ≤ U` with `t ≠ U` lies under some child `U − e_y`, and by
//! monotonicity stays under it. Every child is `U` less one unit at one index, so the children
//! are tracked as a set of indices (a child whose pick differs from `U`'s becomes `U − e_p`).
//! When all children are one state, it is an upper bound one closer: `g` falls by one. At
//! `g = 0` the bound is the state. A short replay carries it to `n`.
//!
//! Only the running time is empirical (no bound is proven on how fast the children merge): a
//! few steps a level with balanced weights, up to about `0.2 / w_min` with very skewed ones.
//! If a window runs out it grows fourfold; at worst the answer is the plain replay. Measured
//! at 10^10 (`cargo bench -p dquant-plan -- climb`, 2 vCPU): 0.3 µs with 2 sources, 2 µs with
//! 16, 13–55 µs with 50 (equal weights, and weights 1..=50), 3.5–72 ms with 1,000 (weights
//! 1..=1000: the smallest is 2·10^-6), against two minutes of replay.
//!
//! Stages are the same rule with piecewise targets ([`crate::Mixture`]): the proof needs only
//! that every state at a position sees the same f64 targets, and targets that never fall.
//! Limits that renormalize change the rule when a source runs out; those blends replay.

use crate::mixture::Mixture;

/// The rule of a blend without limits: constant weights, or a mixture of stages.
pub(crate) struct Rule<'a> {
    pub(crate) weights: &'a [f64],
    pub(crate) mixture: Option<&'a Mixture>,
}

impl Rule<'_> {
    fn sources(&self) -> usize {
        self.weights.len()
    }

    fn segment_at(&self, x: u64) -> usize {
        self.mixture.map_or(0, |m| m.segment_at(x))
    }

    fn segment_end(&self, seg: usize) -> u64 {
        self.mixture.map_or(u64::MAX, |m| m.segment_end(seg))
    }

    /// Source `d`'s target at position `x` (in segment `seg`), in the rule's own f64
    /// operations: `w_d * max(x, 1)`, or the mixture's.
    #[inline]
    fn target(&self, seg: usize, d: usize, x: u64) -> f64 {
        match self.mixture {
            Some(m) => m.target(seg, d, x),
            None => self.weights[d] * (x as f64).max(1.0),
        }
    }

    /// The pick at `x` given counts `c`, and its error: the largest `τ_d − c_d`, the lowest
    /// index on ties.
    #[inline]
    fn argmax(&self, seg: usize, x: u64, c: &[u64]) -> (usize, f64) {
        let mut best = (0, self.target(seg, 0, x) - c[0] as f64);
        for (d, &cd) in c.iter().enumerate().skip(1) {
            let e = self.target(seg, d, x) - cd as f64;
            if e > best.1 {
                best = (d, e);
            }
        }
        best
    }

    /// The counts at `n` of the run holding `c` at `x`, by replaying each draw.
    fn replay(&self, mut x: u64, mut c: Vec<u64>, n: u64) -> Vec<u64> {
        let mut seg = self.segment_at(x);
        while x < n {
            let (p, _) = self.argmax(seg, x, &c);
            c[p] += 1;
            x += 1;
            if x >= self.segment_end(seg) {
                seg += 1;
            }
        }
        c
    }

    /// Lemma 2's corner at position `m ≥ 2`: an upper bound on every count there.
    fn corner(&self, m: u64) -> Vec<u64> {
        let segments = self.mixture.map_or(1, Mixture::segments);
        let sigma = (8 + segments) as f64 * (m as f64 + 1.0) * 2f64.powi(-50) + 2f64.powi(-30);
        let seg = self.segment_at(m - 1);
        // Targets never fall (integrals of non-negative weights), so the sup over the run
        // is the target at m − 1. Float rounding of the sum is monotone: still a bound.
        (0..self.sources())
            .map(|d| (self.target(seg, d, m - 1) + 1.0 + sigma).floor().max(0.0) as u64)
            .collect()
    }
}

/// The most steps a climb's window may take before [`counts_at`] gives up (about a second):
/// at positions near 2^62 the rounding slack puts the corner thousands of samples above the
/// truth, and a hostile cursor must not hold a thread. The caller then replays, asking its
/// stop condition as it goes.
pub(crate) const MAX_WINDOW: u64 = 1 << 26;

/// The counts of the rule's blend after `n` samples, exactly (see the module doc); `None`
/// when that takes a window over [`MAX_WINDOW`].
pub(crate) fn counts_at(rule: &Rule<'_>, n: u64) -> Option<Vec<u64>> {
    let k = rule.sources();
    if k == 1 {
        return Some(vec![n]);
    }
    let mut window = 16 + 2 * k as u64;
    while window <= MAX_WINDOW {
        // Samples 0 and 1 share `max(i, 1)`: a climb starts at 2 or later.
        if n < window.saturating_add(2) {
            return Some(rule.replay(0, vec![0; k], n));
        }
        if let Some((x, u)) = climb(rule, n - window, window) {
            return Some(rule.replay(x, u, n));
        }
        window = window.saturating_mul(4);
    }
    None
}

/// The climb from position `m`: the run's exact state at some position `x ≤ m + budget`, or
/// `None` if certifying it takes more than `budget` steps.
fn climb(rule: &Rule<'_>, m: u64, budget: u64) -> Option<(u64, Vec<u64>)> {
    let k = rule.sources();
    let mut u = rule.corner(m);
    // Lemma 2 makes this non-negative; were the slack ever wrong, replay instead of trusting.
    let mut g = u.iter().sum::<u64>().checked_sub(m)?;
    let spawn = |u: &[u64], kids: &mut Vec<usize>| {
        kids.clear();
        kids.extend((0..u.len()).filter(|&y| u[y] > 0));
    };
    let (mut kids, mut next, mut seen) =
        (Vec::with_capacity(k), Vec::with_capacity(k), vec![false; k]);
    if g > 0 {
        spawn(&u, &mut kids);
    }
    let (mut x, mut seg) = (m, rule.segment_at(m));
    for _ in 0..budget {
        if g == 0 {
            return Some((x, u));
        }
        let (p, best) = rule.argmax(seg, x, &u);
        // Child U − e_y has U's errors but at y, where its error is larger: it picks p or y.
        // Picking y, it becomes U − e_p once U draws p.
        next.clear();
        for &y in &kids {
            let mut to = y;
            if y != p {
                let ey = rule.target(seg, y, x) - u[y].saturating_sub(1) as f64;
                if ey > best || (ey == best && y < p) {
                    to = p;
                }
            }
            if !seen[to] {
                seen[to] = true;
                next.push(to);
            }
        }
        next.iter().for_each(|&y| seen[y] = false);
        std::mem::swap(&mut kids, &mut next);
        u[p] += 1;
        x += 1;
        if x >= rule.segment_end(seg) {
            seg += 1;
        }
        if kids.len() == 1 {
            let y = kids[0];
            u[y] -= 1;
            g -= 1;
            if g > 0 {
                spawn(&u, &mut kids);
            }
        }
    }
    (g == 0).then_some((x, u))
}
