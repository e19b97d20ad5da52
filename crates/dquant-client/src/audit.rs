//! How much of each source a run had consumed at a given global sample: samples, tokens,
//! epochs, and the documents touched (at least one token read) and completed (every token
//! read), for `dquant audit` and any checkpoint.
//!
//! The counts come from the blend's positions ([`dquant_plan::BlendIndex`]). Documents need
//! the shuffle of the source's epoch in progress: once a source has a whole epoch behind it,
//! every document a sample can reach was touched and completed; within its first epoch, the
//! drawn samples are the first `p` positions of that epoch's permutation. Those are counted
//! exactly by enumerating the smaller side (the `p` drawn positions, or the rest), up to
//! [`EXACT_BUDGET`] permutation steps a source; past it the report gives the expectation
//! under a uniform shuffle and says so (`exact: false`).

use std::ops::Range;

use dquant_format::DocIndex;
use dquant_plan::permute::epoch_key;
use dquant_plan::{Permutation, Schedule};
use serde::Serialize;

/// The most permutation steps an exact document count may take per source (about a quarter
/// of a second).
pub const EXACT_BUDGET: u64 = 1 << 23;

/// One source's consumption up to a global sample.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SourceAudit {
    pub source: usize,
    pub uri: String,
    /// Samples drawn from it.
    pub samples: u64,
    /// Tokens those samples hold (`seq_len + 1` each).
    pub tokens: u64,
    /// `samples` in epochs of the source.
    pub epochs: f64,
    /// Documents in the source.
    pub documents: u64,
    /// Documents with at least one token in a drawn sample.
    pub documents_touched: f64,
    /// Documents whose every token was in a drawn sample.
    pub documents_completed: f64,
    /// `documents_touched / documents`.
    pub touched_share: f64,
    /// Whether the document counts are exact (else the expectation under a uniform shuffle).
    pub exact: bool,
}

/// Documents of `index` touched and completed when source `d` of `s` has given `drawn`
/// samples, and whether the counts are exact.
pub(crate) fn documents(s: &Schedule, d: usize, index: &DocIndex, drawn: u64) -> (f64, f64, bool) {
    let per_epoch = s.samples_per_epoch(d);
    // Computed again on each pass, not kept: a corpus may hold 10^8 documents.
    let spans =
        || (0..index.documents()).filter_map(|doc| s.samples_meeting(d, index.document(doc)));
    if drawn >= per_epoch {
        let reach = spans().count() as f64;
        return (reach, reach, true);
    }
    if !s.shuffles() {
        let (mut touched, mut completed) = (0u64, 0u64);
        for k in spans() {
            touched += u64::from(k.start < drawn);
            completed += u64::from(k.end <= drawn);
        }
        return (touched as f64, completed as f64, true);
    }
    let side = drawn.min(per_epoch - drawn);
    if side > EXACT_BUDGET {
        let (t, c) = expected(spans(), per_epoch, drawn);
        return (t, c, false);
    }
    let perm = Permutation::new(per_epoch, epoch_key(s.seed(), d as u64, 0));
    // Per sample of the epoch, whether it is on the enumerated side; then per document, how
    // many of its samples are.
    let (positions, counting_drawn) = match drawn <= per_epoch - drawn {
        true => (0..drawn, true),
        false => (drawn..per_epoch, false),
    };
    let mut on_side: Vec<u64> = positions.map(|pos| perm.apply(pos)).collect();
    on_side.sort_unstable();
    let (mut touched, mut completed) = (0u64, 0u64);
    for k in spans() {
        let lo = on_side.partition_point(|&x| x < k.start);
        let hi = on_side.partition_point(|&x| x < k.end);
        let n = (hi - lo) as u64;
        let all = k.end - k.start;
        let drawn_here = if counting_drawn { n } else { all - n };
        touched += u64::from(drawn_here > 0);
        completed += u64::from(drawn_here == all);
    }
    (touched as f64, completed as f64, true)
}

/// Expected documents touched and completed when `drawn` of `per_epoch` samples were drawn
/// uniformly without replacement: a document of `m` samples is untouched with probability
/// `C(S - m, p) / C(S, p)` and complete with `C(S - m, p - m) / C(S, p)`.
fn expected(spans: impl Iterator<Item = Range<u64>>, per_epoch: u64, drawn: u64) -> (f64, f64) {
    let mut by_m: std::collections::BTreeMap<u64, u64> = Default::default();
    for k in spans {
        *by_m.entry(k.end - k.start).or_default() += 1;
    }
    let (s, p) = (per_epoch as f64, drawn as f64);
    let (mut touched, mut completed) = (0.0, 0.0);
    for (&m, &n) in &by_m {
        let (mut none, mut all) = (1.0f64, 1.0f64);
        for t in 0..m {
            let t = t as f64;
            none *= ((s - p - t) / (s - t)).max(0.0);
            all *= ((p - t) / (s - t)).max(0.0);
            if none == 0.0 && all == 0.0 {
                break;
            }
        }
        touched += n as f64 * (1.0 - none);
        completed += n as f64 * all;
    }
    (touched, completed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expectation_of_a_uniform_draw() {
        // 2 of 4 samples drawn: a one-sample document is touched and complete with
        // probability 1/2; a two-sample one is touched with 1 - C(2,2)/C(4,2) = 5/6 and
        // complete with C(2,0)/C(4,2) = 1/6.
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        let (t, c) = expected(std::iter::once(0..1), 4, 2);
        assert!(close(t, 0.5) && close(c, 0.5), "{t} {c}");
        let (t, c) = expected(std::iter::once(1..3), 4, 2);
        assert!(close(t, 5.0 / 6.0) && close(c, 1.0 / 6.0), "{t} {c}");
        // Three samples of four drawn, a three-sample document: never untouched; complete
        // only when the one undrawn sample is the fourth: 1/4.
        let (t, c) = expected([0..3, 0..3].into_iter(), 4, 3);
        assert!(close(t, 2.0) && close(c, 0.5), "{t} {c}");
    }
}
