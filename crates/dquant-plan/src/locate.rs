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

/// The blend's positions, answered from checkpoints of its per-source counts taken every
/// `every` samples as a replay passes them.
///
/// Megatron's rule has no closed form for the counts at a sample (they depend on every earlier
/// tie-break), so a question about sample `n` replays from the checkpoint below it: at most
/// `every` draws. The checkpoints are made once, by replaying up to the furthest sample asked
/// about, and kept: `8 × #sources` bytes per `every` samples.
#[derive(Clone, Debug)]
pub struct BlendIndex {
    every: u64,
    /// Counts at samples `0, every, 2 × every, ...`, `#sources` each, back to back.
    checkpoints: Vec<u64>,
    /// The replay that made them, at the last checkpoint.
    front: Blender,
}

/// Checkpoint spacing of [`Schedule::blend_index`]: a look-up replays at most this many draws
/// (tens of microseconds), and the index holds `8 × #sources` bytes per this many samples.
pub const BLEND_CHECKPOINT_EVERY: u64 = 1 << 12;

impl BlendIndex {
    /// The index of `blender`'s stream (from sample 0), checkpointed every `every` samples.
    pub fn new(blender: &Blender, every: u64) -> Self {
        let mut front = blender.clone();
        front.seek(0);
        BlendIndex {
            every: every.max(1),
            checkpoints: front.counts().to_vec(),
            front,
        }
    }

    fn sources(&self) -> usize {
        self.front.counts().len()
    }

    /// Checkpoints made so far.
    fn made(&self) -> u64 {
        (self.checkpoints.len() / self.sources()) as u64
    }

    /// Makes the checkpoints up to the one at or below sample `n`.
    fn extend_to(&mut self, n: u64) {
        let want = n / self.every + 1;
        while self.made() < want {
            let next = self.made() * self.every;
            self.front.seek(next);
            self.checkpoints.extend_from_slice(self.front.counts());
        }
    }

    /// A blender at checkpoint `c`.
    fn at_checkpoint(&self, c: u64) -> Blender {
        let k = self.sources();
        let counts = &self.checkpoints[c as usize * k..(c as usize + 1) * k];
        let mut b = self.front.clone();
        if b.position() != c * self.every {
            // A checkpoint is this stream's own state: restore cannot refuse it.
            b.restore(counts).unwrap_or_else(|e| unreachable!("{e}"));
        }
        b
    }

    /// The blend's state before global sample `n`: how many of samples `0..n` each source
    /// gave, in a blender positioned there.
    pub fn blender_at(&mut self, n: u64) -> Blender {
        if self.sources() == 1 {
            let mut b = self.front.clone();
            b.seek(n);
            return b;
        }
        self.extend_to(n);
        let mut b = self.at_checkpoint(n / self.every);
        b.seek(n);
        b
    }

    /// Per-source counts of samples `0..n`.
    pub fn counts_at(&mut self, n: u64) -> Vec<u64> {
        self.blender_at(n).counts().to_vec()
    }

    /// The global sample that is the `j`-th draw of source `d`, if it comes before `limit`.
    pub fn position_of(&mut self, d: usize, j: u64, limit: u64) -> Option<u64> {
        if self.sources() == 1 {
            return (j < limit).then_some(j);
        }
        let k = self.sources();
        // Checkpoints up to the limit; the last one whose count of d is at most j is where the
        // draw's replay starts (counts only grow).
        self.extend_to(limit.saturating_sub(1));
        let (mut lo, mut hi) = (0, self.made());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.checkpoints[mid as usize * k + d] <= j {
                true => lo = mid + 1,
                false => hi = mid,
            }
        }
        let mut b = self.at_checkpoint(lo.checked_sub(1)?);
        while b.position() < limit {
            let (src, drawn) = b.next_pick();
            if src == d && drawn == j {
                return Some(b.position() - 1);
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
        let (per_epoch, seq_len) = (self.samples_per_epoch(d), self.seq_len());
        if tokens.is_empty() || range.start >= end {
            return Vec::new();
        }
        // Sample k holds [k L, k L + L + 1): it meets [a, b) when k L < b and k L + L + 1 > a.
        let first = tokens.start.saturating_sub(1) / seq_len;
        let last = ((tokens.end - 1) / seq_len).min(per_epoch - 1);
        if first > last {
            return Vec::new();
        }
        // Draws of d in the range: j in [counts_at(start), counts_at(end)).
        let j_lo = index.counts_at(range.start)[d];
        let j_hi = index.counts_at(end)[d];
        let mut out = Vec::new();
        for epoch in j_lo / per_epoch..j_hi.div_ceil(per_epoch) {
            let perm = self
                .shuffles()
                .then(|| Permutation::new(per_epoch, epoch_key(self.seed(), d as u64, epoch)));
            for k in first..=last {
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
