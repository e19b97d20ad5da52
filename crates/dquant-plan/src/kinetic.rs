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
    /// Per node, the winner of its subtree (a source, or [`NONE`]).
    winner: Vec<usize>,
    /// Per node, the first sample at which its winner must be recomputed.
    until: Vec<f64>,
}

impl Tournament {
    pub fn new(sources: usize) -> Self {
        let width = sources.next_power_of_two();
        let mut winner = vec![NONE; 2 * width];
        winner[width..width + sources]
            .iter_mut()
            .enumerate()
            .for_each(|(d, w)| *w = d);
        let mut until = vec![f64::NEG_INFINITY; 2 * width];
        until[width..].iter_mut().for_each(|u| *u = f64::INFINITY);
        Tournament {
            width,
            winner,
            until,
        }
    }

    /// Forgets every winner (the counts moved other than by one draw).
    pub fn forget(&mut self) {
        self.until[1..self.width]
            .iter_mut()
            .for_each(|u| *u = f64::NEG_INFINITY);
    }

    /// Source `d`'s count changed: its path to the root must be recomputed.
    pub fn touched(&mut self, d: usize) {
        let mut k = (self.width + d) / 2;
        while k >= 1 {
            self.until[k] = f64::NEG_INFINITY;
            k /= 2;
        }
    }

    /// The source with the largest error at sample `x` (the lowest index on ties).
    pub fn winner(&mut self, x: f64, weights: &[f64], counts: &[u64]) -> usize {
        self.refresh(1, x, weights, counts);
        self.winner[1]
    }

    fn refresh(&mut self, k: usize, x: f64, weights: &[f64], counts: &[u64]) {
        if self.until[k] > x {
            return;
        }
        let (l, r) = (2 * k, 2 * k + 1);
        self.refresh(l, x, weights, counts);
        self.refresh(r, x, weights, counts);
        let (a, b) = (self.winner[l], self.winner[r]);
        let err = |d: usize| weights[d] * x - counts[d] as f64;
        let (win, lose) = match (a, b) {
            (_, NONE) => (a, NONE),
            (NONE, _) => (b, NONE),
            // Megatron's scan keeps the lower index unless the other is strictly larger.
            _ if err(b) > err(a) => (b, a),
            _ => (a, b),
        };
        let cert = if lose == NONE {
            f64::INFINITY
        } else {
            certificate(weights[win], weights[lose], err(win) - err(lose), x)
        };
        self.winner[k] = win;
        self.until[k] = cert.min(self.until[l]).min(self.until[r]);
    }
}

/// Until which sample a winner of weight `ww` that leads a loser of weight `wl` by `lead` at
/// sample `x` (both `f64` errors there) surely still leads, as `f64` arithmetic decides.
fn certificate(ww: f64, wl: f64, lead: f64, x: f64) -> f64 {
    if ww == wl {
        // Equal weights: `fl(w * x)` is the same for both, so the order is the counts' (a
        // draw of either recomputes the node).
        return f64::INFINITY;
    }
    // The real lead at `y >= x` is at least `lead - slack(x) + (ww - wl)(y - x)`, with the
    // weights' difference itself a little off; it decides the f64 comparison while above
    // `slack(y)`.
    let g = lead - 2.0 * slack(x);
    let rate = (ww - wl) - 1e-16 - 1e-15;
    if g <= 0.0 {
        return x + 1.0;
    }
    if rate >= 0.0 {
        return f64::INFINITY;
    }
    (x + g / -rate * (1.0 - 1e-9)).max(x + 1.0)
}
