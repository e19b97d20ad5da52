//! Provenance, both ways: for a global sample, the step and rank that receive it and the
//! source tokens it holds; for a token range of a source (a document), every global sample that
//! holds any of it.
//!
//! Why it can be computed rather than searched: every step of the plan is invertible
//! arithmetic. Packing is by token offsets (sample `k` of a source is tokens
//! `[k * seq_len, k * seq_len + seq_len + 1)`), the shuffle is a keyed bijection with an
//! inverse ([`Permutation::invert`]), sharding is `i % world`, and the blend's draws are
//! positions in one deterministic sequence ([`BlendIndex`]). So a document's samples come
//! from its token range through the inverse of each step, in time proportional to the answer:
//! no index array to scan, as Megatron's would need.

use std::collections::BTreeMap;
use std::ops::Range;

use crate::blend::Blender;
use crate::error::PlanError;
use crate::permute::{epoch_key, Permutation};
use crate::schedule::{SampleRef, Schedule};

/// Where one global sample goes and what it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    /// The batch index, in its rank's stream, of the batch that receives it.
    pub step: u64,
    /// The rank that receives it: `sample % world`.
    pub rank: u64,
    /// Its source, the source's epoch, and the source tokens it holds.
    pub sample: SampleRef,
}

/// The blend's positions: its counts at any sample, and where a source's `j`-th draw falls.
///
/// Counts at a sample come from the certified climb ([`crate::Blender::seek`] far ahead:
/// microseconds, no replay from 0). The index keeps the counts at the checkpoints it was asked
/// about (every `every` samples), so a draw's position is a binary search over checkpoints
/// and a replay of at most `every` draws. Blends with renormalizing limits, which the climb
/// does not take, replay from the nearest checkpoint below instead.
#[derive(Clone, Debug)]
pub struct BlendIndex {
    every: u64,
    /// Counts at samples `c × every`, by `c`, as far as computed.
    checkpoints: BTreeMap<u64, Vec<u64>>,
    /// The blend at sample 0.
    start: Blender,
}

/// Checkpoint spacing of [`Schedule::blend_index`]: a look-up replays at most this many draws
/// (tens of microseconds).
pub const BLEND_CHECKPOINT_EVERY: u64 = 1 << 12;

/// The most checkpoints an index keeps (a few MiB with a handful of sources): a whole-plan
/// question with millions of answers asks for tens of millions, and any of them is a climb
/// away, so past this the cache starts again rather than grow.
pub const MAX_CHECKPOINTS: usize = 1 << 16;

impl BlendIndex {
    /// The index of `blender`'s stream (from sample 0), checkpointed every `every` samples.
    pub fn new(blender: &Blender, every: u64) -> Self {
        let mut start = blender.clone();
        start.seek(0);
        BlendIndex {
            every: every.max(1),
            checkpoints: BTreeMap::new(),
            start,
        }
    }

    /// A blender at checkpoint `c`: from the nearest known checkpoint at or below it.
    fn checkpoint(&mut self, c: u64) -> Blender {
        let mut b = self.start.clone();
        if let Some((_, counts)) = self.checkpoints.range(..=c).next_back() {
            b.set_state(counts);
        }
        b.seek(c * self.every);
        if b.counts().len() > 1 {
            if self.checkpoints.len() >= MAX_CHECKPOINTS {
                self.checkpoints.clear();
            }
            self.checkpoints.insert(c, b.counts().to_vec());
        }
        b
    }

    /// The blend's state before global sample `n`: how many of samples `0..n` each source
    /// gave, in a blender positioned there.
    pub fn blender_at(&mut self, n: u64) -> Blender {
        let mut b = self.checkpoint(n / self.every);
        b.seek(n);
        b
    }

    /// Per-source counts of samples `0..n`.
    pub fn counts_at(&mut self, n: u64) -> Vec<u64> {
        self.blender_at(n).counts().to_vec()
    }

    /// The global sample that is the `j`-th draw of source `d`, if it comes before `limit`.
    pub fn position_of(&mut self, d: usize, j: u64, limit: u64) -> Option<u64> {
        if self.start.counts().len() == 1 {
            return (j < limit).then_some(j);
        }
        // The last checkpoint below the limit whose count of d is at most j: the draw lies
        // after it, and before the next (counts only grow).
        let (mut lo, mut hi) = (0, limit.saturating_sub(1) / self.every + 1);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            match self.checkpoint(mid).counts()[d] <= j {
                true => lo = mid,
                false => hi = mid,
            }
        }
        let mut b = self.checkpoint(lo);
        while b.position() < limit {
            let (src, drawn) = b.next_pick();
            if src == d && drawn == j {
                return Some(b.position() - 1);
            }
            if src == d && drawn > j {
                return None;
            }
        }
        None
    }
}

impl Schedule {
    /// An index of this plan's blend positions ([`BlendIndex`]), empty until asked.
    pub fn blend_index(&self) -> BlendIndex {
        BlendIndex::new(&self.blender(), BLEND_CHECKPOINT_EVERY)
    }

    /// Global samples that some rank receives: all of them, or with `drop_last` those in the
    /// full batches of every rank.
    pub fn delivered_samples(&self) -> u64 {
        match self.drop_last() {
            true => {
                self.total_samples() / self.world() / self.batch_size()
                    * self.batch_size()
                    * self.world()
            }
            false => self.total_samples(),
        }
    }

    /// The samples `k` of an epoch of source `d` whose token windows meet `tokens`, or `None`
    /// when none do (an empty range, or one past the last whole sample). Sample `k` holds
    /// `[k L, k L + L + 1)`: it meets `[a, b)` when `k L < b` and `k L + L + 1 > a`.
    pub fn samples_meeting(&self, d: usize, tokens: Range<u64>) -> Option<Range<u64>> {
        let (per_epoch, seq_len) = (self.samples_per_epoch(d), self.seq_len());
        if tokens.is_empty() {
            return None;
        }
        let first = tokens.start.saturating_sub(1) / seq_len;
        let last = ((tokens.end - 1) / seq_len).min(per_epoch - 1);
        (first <= last).then_some(first..last + 1)
    }

    /// Where global sample `i` goes (step and rank in an uninterrupted run) and which source
    /// tokens it holds. Errors name a sample past the plan, or one `drop_last` drops.
    pub fn locate(&self, index: &mut BlendIndex, i: u64) -> Result<Location, PlanError> {
        if i >= self.delivered_samples() {
            let why = match i < self.total_samples() {
                true => "past the last full batch of every rank (drop_last)",
                false => "past the end of the plan",
            };
            return Err(PlanError::invalid(
                "sample",
                format!(
                    "{i} is {why}: {} samples are delivered",
                    self.delivered_samples()
                ),
            ));
        }
        let (d, j) = index.blender_at(i).next_pick();
        let world = self.world();
        Ok(Location {
            step: i / world / self.batch_size(),
            rank: i % world,
            sample: self.source_sample(i, d, j),
        })
    }

    /// Every delivered global sample in `range` that holds any of source `d`'s tokens
    /// `tokens`, ascending. Through the inverse of each step: the samples of the source whose
    /// token windows meet `tokens`, in each epoch of it that `range` reaches, unshuffled and
    /// placed in the blend. Time grows with the answer and the epochs reached, not with
    /// `range`.
    pub fn samples_holding(
        &self,
        index: &mut BlendIndex,
        d: usize,
        tokens: Range<u64>,
        range: Range<u64>,
    ) -> Vec<u64> {
        let end = range.end.min(self.delivered_samples());
        let per_epoch = self.samples_per_epoch(d);
        let Some(window) = self
            .samples_meeting(d, tokens)
            .filter(|_| range.start < end)
        else {
            return Vec::new();
        };
        // Draws of d in the range: j in [counts_at(start), counts_at(end)).
        let j_lo = index.counts_at(range.start)[d];
        let j_hi = index.counts_at(end)[d];
        let mut out = Vec::new();
        for epoch in j_lo / per_epoch..j_hi.div_ceil(per_epoch) {
            let perm = self
                .shuffles()
                .then(|| Permutation::new(per_epoch, epoch_key(self.seed(), d as u64, epoch)));
            for k in window.clone() {
                let pos = perm.as_ref().map_or(k, |p| p.invert(k));
                let j = epoch * per_epoch + pos;
                if (j_lo..j_hi).contains(&j) {
                    out.extend(index.position_of(d, j, end));
                }
            }
        }
        out.sort_unstable();
        out
    }
}
