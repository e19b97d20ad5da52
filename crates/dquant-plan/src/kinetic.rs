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
    pub fn new(sources: usize) -> Self {
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
        }
    }

    /// Forgets every winner (the counts moved other than by one draw).
    pub fn forget(&mut self) {
        self.nodes[1..self.width]
            .iter_mut()
            .for_each(|n| n.until = f64::NEG_INFINITY);
        self.dirty.clear();
    }

    /// Source `d`'s count changed: its path to the root must be recomputed. The next query
    /// climbs it ([`Tournament::climb`]); past [`MAX_DIRTY`] paths, its nodes are marked due
    /// for the top-down pass instead.
    pub fn touched(&mut self, d: usize) {
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

    /// The source with the largest error at sample `x` (the lowest index on ties).
    ///
    /// A draw's path is recomputed bottom up first: a loop, not a recursion, whose
    /// certificates (divisions) are off the chain from one level to the next.
    /// A node whose other child is not current yet (another touched path, an expired
    /// certificate) comes out with `until <= x`, as every ancestor of a node due does, so the
    /// top-down pass after it recomputes exactly the nodes still due.
    pub fn winner(&mut self, x: f64, weights: &[f64], counts: &[u64]) -> usize {
        for i in 0..self.dirty.len() {
            self.climb(self.dirty[i], x, weights, counts);
        }
        self.dirty.clear();
        self.refresh(1, x, weights, counts);
        self.nodes[1].winner
    }

    /// Recomputes leaf `d`'s path at sample `x`, bottom up. The winner coming up the path
    /// keeps its error from the level below, so each level waits only on one comparison; the
    /// sibling's error and the certificates do not depend on the level below.
    fn climb(&mut self, d: usize, x: f64, weights: &[f64], counts: &[u64]) {
        let err = |d: usize| error(weights[d], x, counts[d]);
        let mut child = self.width + d;
        let (mut up, mut up_err, mut up_until) = (d, err(d), f64::INFINITY);
        while child > 1 {
            let (k, sib) = (child / 2, child ^ 1);
            let Node {
                winner: other,
                until: sib_until,
            } = self.nodes[sib];
            let (win, win_err, cert) = if other == NONE {
                (up, up_err, f64::INFINITY)
            } else {
                let other_err = err(other);
                // Megatron's scan keeps the lower index unless the other is strictly larger;
                // the lower index is the left child's. Unequal errors (nearly always) decide
                // alone, so one branch is a coin toss, not two (the side's and the
                // comparison's). Selects in place of the branch measured 12-37% slower:
                // predicted, a branch lets the next level start early.
                let up_wins = if up_err != other_err {
                    up_err > other_err
                } else {
                    child & 1 == 0
                };
                let (win, lose, win_err, lead) = if up_wins {
                    (up, other, up_err, up_err - other_err)
                } else {
                    (other, up, other_err, other_err - up_err)
                };
                (
                    win,
                    win_err,
                    certificate(weights[win], weights[lose], lead, x),
                )
            };
            // The sibling's side first: only the last `min` waits on the level below.
            up_until = min(min(cert, sib_until), up_until);
            self.nodes[k] = Node {
                winner: win,
                until: up_until,
            };
            (up, up_err, child) = (win, win_err, k);
        }
    }

    fn refresh(&mut self, k: usize, x: f64, weights: &[f64], counts: &[u64]) {
        if self.nodes[k].until > x {
            return;
        }
        let (l, r) = (2 * k, 2 * k + 1);
        self.refresh(l, x, weights, counts);
        self.refresh(r, x, weights, counts);
        self.combine(k, x, weights, counts);
    }

    /// Node `k`'s winner at sample `x` from its children's, and until when it holds (no
    /// later than either child's).
    #[inline]
    fn combine(&mut self, k: usize, x: f64, weights: &[f64], counts: &[u64]) {
        let (l, r) = (2 * k, 2 * k + 1);
        let (a, b) = (self.nodes[l].winner, self.nodes[r].winner);
        let err = |d: usize| error(weights[d], x, counts[d]);
        let (win, cert) = match (a, b) {
            (_, NONE) => (a, f64::INFINITY),
            (NONE, _) => (b, f64::INFINITY),
            _ => {
                let (ea, eb) = (err(a), err(b));
                // Megatron's scan keeps the lower index unless the other is strictly larger.
                let (win, lose, lead) = if eb > ea {
                    (b, a, eb - ea)
                } else {
                    (a, b, ea - eb)
                };
                (win, certificate(weights[win], weights[lose], lead, x))
            }
        };
        self.nodes[k] = Node {
            winner: win,
            until: min(min(cert, self.nodes[l].until), self.nodes[r].until),
        };
    }
}

/// Megatron's error of a source of weight `w` and count `c` at sample `x`: `w * x - c` in
/// `f64`. A count is far below 2^63, where `c as i64 as f64` is `c as f64` exactly; the signed
/// conversion is one instruction, the unsigned one five on x86-64's baseline.
#[inline(always)]
fn error(w: f64, x: f64, c: u64) -> f64 {
    debug_assert!(c < 1 << 63);
    w * x - c as i64 as f64
}

/// The larger of two times (never NaN here), as [`min`].
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
/// Computed whole and chosen at the end, without branches: which of the two lines grows
/// faster is a coin toss from one level of a climb to the next, and its branch, mispredicted
/// half the time, cost more than the division it skipped (`scale/batch`, criterion).
#[inline(always)]
fn certificate(ww: f64, wl: f64, lead: f64, x: f64) -> f64 {
    // The real lead at `y >= x` is at least `lead - slack(x) + (ww - wl)(y - x)`, with the
    // weights' difference itself a little off; it decides the f64 comparison while above
    // `slack(y)`. A lead within the slack (`g <= 0`) gives `x + 1` through the `max`.
    let g = lead - 2.0 * slack(x);
    let rate = (ww - wl) - 1e-16 - 1e-15;
    let until = max(x + g / -rate * (1.0 - 1e-9), x + 1.0);
    // Equal weights: `fl(w * x)` is the same for both, so the order is the counts' (a draw of
    // either recomputes the node). A loser that grows no faster never catches up.
    let never = (ww == wl) | (rate >= 0.0);
    f64::from_bits(select(never, f64::INFINITY.to_bits(), until.to_bits()))
}

/// `if c { a } else { b }` as a mask, which the compiler keeps branch-free.
#[inline(always)]
fn select(c: bool, a: u64, b: u64) -> u64 {
    let m = (c as u64).wrapping_neg();
    (a & m) | (b & !m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blend::scan;

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
            let mut t = Tournament::new(n);
            let mut x = 1.0;
            for step in 0..5_000 {
                for _ in 0..next() % (2 * MAX_DIRTY as u64 + 2) {
                    let d = (next() % n as u64) as usize;
                    counts[d] += 1;
                    t.touched(d);
                }
                x += (next() % 3) as f64;
                let want = scan(x, &weights, &counts);
                assert_eq!(
                    t.winner(x, &weights, &counts),
                    want,
                    "{n} sources, step {step}"
                );
                counts[want] += 1;
                t.touched(want);
                x += 1.0;
            }
        }
    }
}
