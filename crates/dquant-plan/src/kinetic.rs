//! Megatron's blend argmax in O(log #sources) per draw: a kinetic tournament.
//!
//! Why: a rank of `world` walks `world` draws of the blend per sample, and the plain rule scans
//! every source per draw, so a batch costs O(world × #sources) (tens of ms at world 4096 with
//! 1,000 sources). No crate keeps the exact argmax of lines whose offsets move, so it is here.
//!
//! Source `d`'s error at sample `x` is the line `w_d * x - count_d`. A tournament tree keeps,
//! at each node, the winner of its subtree (the largest error, the lowest index on ties) and
//! the sample up to which that stays true: its *certificate* (when the runner-up's line could
//! cross the winner's) and its children's, whichever ends first. A draw changes one source's
//! count, which invalidates its path to the root; a query at `x` recomputes only the invalidated
//! and expired nodes. Comparisons are Megatron's own `f64` arithmetic, evaluated at the query's
//! sample, so the winner is the full scan's exactly; a certificate only decides when to look
//! again, and ends early by more than `f64` rounding can account for, never late.
//!
//! A climb's matches are coin tosses: the drawn source drops to about the lowest error, so
//! above the leaves its subtree's winner meets the sibling's, two sources of about equal
//! error (1,000 sources, weights 1..1000: the path's side won 28-62% at each level, and the
//! outcome changed from one draw to the next a third of the time). A branch on them is
//! mispredicted about as often as it is taken, so the climb decides each level by conditional
//! moves of indices ([`select_unpredictable`]: a select of floats would be compiled to a
//! branch again), and a certificate's "never" is a division by zero, not a select. A batch of
//! 8 at world 4096 × 1,000 sources went from 2.81-2.90 to 1.78-1.88 ms, at 512 from 347-364
//! to 234-273 µs (`scale/batch`, alternated builds, AMD EPYC, 2026-11-28). Where the matches
//! are predictable (equal weights: the counts decide, in index order) the branches were as
//! fast, within this VM's noise.

use std::hint::select_unpredictable;

/// Sample-count slack of a certificate: `f64` errors `fl(fl(w * x) - c)` are within
/// `2^-53 * (w * x + |error|)` of the real ones each, and errors stay below 2^20 in magnitude
/// (they lie in `[-1, #sources - 1]`), so two of them are within this of their real
/// difference.
fn slack(x: f64) -> f64 {
    1e-9 + 1e-15 * x
}

/// An empty leaf (the tree is a power of two wide).
const NONE: usize = usize::MAX;

#[derive(Clone, Debug)]
pub(crate) struct Tournament {
    /// Leaves start here: node `k` has children `2k`, `2k + 1`; the root is 1.
    width: usize,
    /// Per node, its winner and until when it holds (one cache line for both, which a
    /// climb reads and writes together).
    nodes: Vec<Node>,
    /// Leaves touched since the last query (at most [`MAX_DIRTY`]; more are left to the
    /// top-down pass alone).
    dirty: Vec<usize>,
    /// Per source, its weight and its count as `f64`, side by side: a match reads both from
    /// one place, with no conversion.
    lines: Vec<Line>,
    /// Whether `lines` holds the blend's counts: not after [`Tournament::forget`], until the
    /// next query copies them.
    synced: bool,
}

/// Source `d`'s error line `w * x - c`.
#[derive(Clone, Copy, Debug)]
struct Line {
    w: f64,
    /// The count as Megatron's `f64` arithmetic sees it (exact below 2^53).
    c: f64,
}

impl Line {
    /// Megatron's error at sample `x`: `w * x - c` in `f64`.
    #[inline(always)]
    fn error(self, x: f64) -> f64 {
        self.w * x - self.c
    }
}

/// A node of the tree.
#[derive(Clone, Copy, Debug)]
struct Node {
    /// The winner of its subtree (a source, or [`NONE`]).
    winner: usize,
    /// The first sample at which its winner must be recomputed.
    until: f64,
}

/// Touched leaves whose paths a query recomputes bottom up: one a draw, so one between two
/// queries of a blend's walk.
const MAX_DIRTY: usize = 4;

impl Tournament {
    /// A tournament over sources of these weights, all counts 0.
    pub fn new(weights: &[f64]) -> Self {
        let sources = weights.len();
        let width = sources.next_power_of_two();
        let inner = Node {
            winner: NONE,
            until: f64::NEG_INFINITY,
        };
        let mut nodes = vec![inner; 2 * width];
        for (d, leaf) in nodes[width..].iter_mut().enumerate() {
            leaf.winner = if d < sources { d } else { NONE };
            leaf.until = f64::INFINITY;
        }
        Tournament {
            width,
            nodes,
            dirty: Vec::with_capacity(MAX_DIRTY),
            lines: weights.iter().map(|&w| Line { w, c: 0.0 }).collect(),
            synced: true,
        }
    }

    /// Forgets every winner (the counts moved other than by one draw); the next query reads
    /// the counts whole.
    pub fn forget(&mut self) {
        self.nodes[1..self.width]
            .iter_mut()
            .for_each(|n| n.until = f64::NEG_INFINITY);
        self.dirty.clear();
        self.synced = false;
    }

    /// Source `d`'s count changed to `count`: its path to the root must be recomputed. The
    /// next query climbs it ([`Tournament::climb`]); past [`MAX_DIRTY`] paths, its nodes are
    /// marked due for the top-down pass instead.
    pub fn touched(&mut self, d: usize, count: u64) {
        self.lines[d].c = as_f64(count);
        if self.dirty.len() < MAX_DIRTY {
            self.dirty.push(d);
            return;
        }
        let mut k = (self.width + d) / 2;
        while k >= 1 {
            self.nodes[k].until = f64::NEG_INFINITY;
            k /= 2;
        }
    }

    /// The source with the largest error at sample `x` (the lowest index on ties), given
    /// the blend's `counts` (read whole only after [`Tournament::forget`]).
    ///
    /// A draw's path is recomputed bottom up first: a loop, not a recursion, whose
    /// certificates (divisions) are off the chain from one level to the next.
    /// A node whose other child is not current yet (another touched path, an expired
    /// certificate) comes out with `until <= x`, as every ancestor of a node due does, so the
    /// top-down pass after it recomputes exactly the nodes still due.
    pub fn winner(&mut self, x: f64, counts: &[u64]) -> usize {
        if !self.synced {
            self.lines
                .iter_mut()
                .zip(counts)
                .for_each(|(l, &c)| l.c = as_f64(c));
            self.synced = true;
        }
        debug_assert!(self
            .dirty
            .iter()
            .all(|&d| self.lines[d].c == as_f64(counts[d])));
        for i in 0..self.dirty.len() {
            self.climb(self.dirty[i], x);
        }
        self.dirty.clear();
        // The root is nearly always current after the climb: no call then.
        if self.nodes[1].until <= x {
            self.refresh(1, x);
        }
        self.nodes[1].winner
    }

    /// Recomputes leaf `d`'s path at sample `x`, bottom up. Only the largest error so far
    /// (`maxsd`) and the winner's index (`cmov`) pass from one level to the next; the
    /// sibling's error, and each level's certificate, wait on nothing else.
    fn climb(&mut self, d: usize, x: f64) {
        let lines = &self.lines;
        let mut child = self.width + d;
        let mut win = d;
        let (mut best, mut up_until) = (lines[d].error(x), f64::INFINITY);
        while child > 1 {
            let (k, sib) = (child / 2, child ^ 1);
            let Node {
                winner: other,
                until: sib_until,
            } = self.nodes[sib];
            // An empty sibling stands as the winner itself with an error of -inf: it never
            // wins, and a line never crosses itself.
            let (o, o_err) = match lines.get(other) {
                Some(l) => (other, l.error(x)),
                None => (win, f64::NEG_INFINITY),
            };
            // Megatron's scan keeps the lower index unless the other is strictly larger; the
            // lower index is the left child's, the sibling's when `child` is odd.
            let takes = (o_err > best) | ((o_err >= best) & (child & 1 == 1));
            let lose = select_unpredictable(takes, win, o);
            win = select_unpredictable(takes, o, win);
            let cert = certificate(lines[win].w, lines[lose].w, (o_err - best).abs(), x);
            best = max(best, o_err);
            // The sibling's side first: only the last `min` waits on the level below.
            up_until = min(min(cert, sib_until), up_until);
            self.nodes[k] = Node {
                winner: win,
                until: up_until,
            };
            child = k;
        }
    }

    fn refresh(&mut self, k: usize, x: f64) {
        if self.nodes[k].until > x {
            return;
        }
        let (l, r) = (2 * k, 2 * k + 1);
        self.refresh(l, x);
        self.refresh(r, x);
        self.combine(k, x);
    }

    /// Node `k`'s winner at sample `x` from its children's, and until when it holds (no
    /// later than either child's).
    #[inline]
    fn combine(&mut self, k: usize, x: f64) {
        let (l, r) = (2 * k, 2 * k + 1);
        let (a, b) = (self.nodes[l].winner, self.nodes[r].winner);
        let (win, cert) = match (self.lines.get(a), self.lines.get(b)) {
            (_, None) => (a, f64::INFINITY),
            (None, _) => (b, f64::INFINITY),
            (Some(la), Some(lb)) => {
                let (ea, eb) = (la.error(x), lb.error(x));
                // Megatron's scan keeps the lower index unless the other is strictly larger.
                let right = eb > ea;
                let (win, lose) = (
                    select_unpredictable(right, b, a),
                    select_unpredictable(right, a, b),
                );
                let (ww, wl) = (self.lines[win].w, self.lines[lose].w);
                (win, certificate(ww, wl, (eb - ea).abs(), x))
            }
        };
        self.nodes[k] = Node {
            winner: win,
            until: min(min(cert, self.nodes[l].until), self.nodes[r].until),
        };
    }
}

/// A count as Megatron's `f64` arithmetic sees it. A count is far below 2^63, where
/// `c as i64 as f64` is `c as f64` exactly; the signed conversion is one instruction, the
/// unsigned one five on x86-64's baseline.
#[inline(always)]
fn as_f64(c: u64) -> f64 {
    debug_assert!(c < 1 << 63);
    c as i64 as f64
}

/// The larger of two values (never NaN here), as [`min`].
#[inline]
fn max(a: f64, b: f64) -> f64 {
    if a > b {
        a
    } else {
        b
    }
}

/// The smaller of two times (never NaN here: certificates are finite or ±∞): one `minsd`,
/// where `f64::min`'s NaN handling costs four more instructions on the climb's chain.
#[inline]
fn min(a: f64, b: f64) -> f64 {
    if a < b {
        a
    } else {
        b
    }
}

/// Until which sample a winner of weight `ww` that leads a loser of weight `wl` by `lead` at
/// sample `x` (both `f64` errors there) surely still leads, as `f64` arithmetic decides.
///
/// Computed whole, without branches or selects: which of the two lines grows faster is a coin
/// toss from one level of a climb to the next, and its branch, mispredicted half the time,
/// cost more than the division it skipped (`scale/batch`, criterion). "Never" is a division
/// by zero (`+inf`).
#[inline(always)]
fn certificate(ww: f64, wl: f64, lead: f64, x: f64) -> f64 {
    // The real lead at `y >= x` is at least `lead - slack(x) + (ww - wl)(y - x)`, with the
    // weights' difference itself a little off; it decides the f64 comparison while above
    // `slack(y)`. A lead within the slack stands as the least positive one: it gives `x + 1`
    // through the last `max`, unless the loser never catches up.
    let g = max(lead - 2.0 * slack(x), f64::MIN_POSITIVE);
    let closing = (wl - ww) + 1e-16 + 1e-15;
    // Equal weights: `fl(w * x)` is the same for both, so the order is the counts' (a draw of
    // either recomputes the node). A loser that grows no faster never catches up. Both close
    // at rate 0.
    let distinct = ((ww != wl) as u64).wrapping_neg();
    let closing = f64::from_bits(max(closing, 0.0).to_bits() & distinct);
    max(x + g / closing * (1.0 - 1e-9), x + 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blend::scan;

    /// The certificate as a branch says it: never for equal weights or a loser that grows
    /// no faster, else the crossing time less the slack, at least `x + 1`. The branch-free
    /// one gives the same sample exactly, leads within the slack and empty siblings (a lead
    /// of `+inf` against the winner itself) included.
    #[test]
    fn certificates_are_the_branching_rules_exactly() {
        let by_branch = |ww: f64, wl: f64, lead: f64, x: f64| {
            let rate = (ww - wl) - 1e-16 - 1e-15;
            if ww == wl || rate >= 0.0 {
                return f64::INFINITY;
            }
            let g = lead - 2.0 * slack(x);
            max(x + g / -rate * (1.0 - 1e-9), x + 1.0)
        };
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut unit = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        let weights = [0.0, 1e-6, 0.001, 0.001 + 1e-15, 0.25, 0.5, 1.0];
        for _ in 0..20_000 {
            let ww = weights[(unit() * 7.0) as usize];
            let wl = weights[(unit() * 7.0) as usize];
            let x = (unit() * 2f64.powi((unit() * 62.0) as i32))
                .floor()
                .max(1.0);
            let lead = match (unit() * 4.0) as u32 {
                0 => 0.0,
                1 => slack(x) * unit() * 2.0,
                2 => f64::INFINITY,
                _ => unit() * 1000.0,
            };
            let (got, want) = (certificate(ww, wl, lead, x), by_branch(ww, wl, lead, x));
            assert_eq!(got, want, "ww {ww} wl {wl} lead {lead} x {x}");
        }
    }

    /// Several draws between two queries (more than the climbs take, so some paths are left
    /// to the top-down pass), at samples that jump ahead (certificates expire), give the full
    /// scan's winner, ties included.
    #[test]
    fn many_draws_between_queries_give_the_scans_winner() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for n in [2usize, 3, 64, 300, 1000] {
            // Few distinct weights, so ties between leaves are common.
            let weights: Vec<f64> = (0..n).map(|_| (next() % 4 + 1) as f64 / n as f64).collect();
            let mut counts = vec![0u64; n];
            let mut t = Tournament::new(&weights);
            let mut x = 1.0;
            for step in 0..5_000 {
                for _ in 0..next() % (2 * MAX_DIRTY as u64 + 2) {
                    let d = (next() % n as u64) as usize;
                    counts[d] += 1;
                    t.touched(d, counts[d]);
                }
                x += (next() % 3) as f64;
                let want = scan(x, &weights, &counts);
                assert_eq!(t.winner(x, &counts), want, "{n} sources, step {step}");
                counts[want] += 1;
                t.touched(want, counts[want]);
                x += 1.0;
            }
        }
    }
}
