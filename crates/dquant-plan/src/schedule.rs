//! A plan applied to its sources' sizes: which tokens each sample of each rank reads.

use std::ops::Range;

use serde::Serialize;

use crate::blend::Blender;
use crate::cursor::Cursor;
use crate::error::PlanError;
use crate::limits::Limits;
use crate::mixture::Mixture;
use crate::permute::{epoch_key, Permutation};
use crate::plan::Plan;

/// What the caller learned about source `d` by opening it: the schedule needs only its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SourceInfo {
    /// Tokens in the source, all documents together.
    pub tokens: u64,
}

/// One sample of the stream: which source it comes from and which of its tokens it holds.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SampleRef {
    /// Global sample index (the position in the stream of all ranks together).
    pub global: u64,
    /// Index of the source in the plan's `sources`.
    pub source: usize,
    /// Which epoch of that source the sample belongs to (0-based): a source drawn more often
    /// than it has samples wraps into further epochs, each shuffled differently.
    pub epoch: u64,
    /// Which sample of the source's epoch it is, after shuffling: `tokens.start / seq_len`.
    pub index: u64,
    /// The tokens to read from the source: `[index * seq_len, index * seq_len + seq_len + 1)`,
    /// always `seq_len + 1` of them and within the source.
    pub tokens: Range<u64>,
}

/// One batch of a rank: `batch_size` consecutive samples of its local stream (fewer at the
/// end when the plan keeps the last batch, or when resuming in the middle of a batch).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Batch {
    /// The batch's index in the rank's stream: local samples
    /// `[index * batch_size, (index + 1) * batch_size)`.
    pub index: u64,
    /// Its samples, in order.
    pub samples: Vec<SampleRef>,
}

/// A validated plan bound to its sources' token counts. Holds O(#sources) numbers and answers
/// every question about the stream without reading a token. Cheap to clone.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    seq_len: u64,
    batch_size: u64,
    rank: u64,
    world: u64,
    drop_last: bool,
    shuffle: bool,
    seed: u64,
    /// Samples per epoch of each source (`S_d`).
    per_epoch: Vec<u64>,
    /// `Σ_d S_d`.
    epoch_samples: u64,
    /// Global samples in the plan.
    total: u64,
    /// Samples this plan's rank gets.
    rank_samples: u64,
    /// The blend at sample 0.
    blender: Blender,
}

impl Schedule {
    /// Validates `plan`, and binds it to the token counts of its sources (`sources[d]` for
    /// `plan.sources[d]`). Fails if a source is too small for one sample, or if the plan's
    /// length does not fit in 64 bits.
    pub fn new(plan: &Plan, sources: &[SourceInfo]) -> Result<Self, PlanError> {
        plan.validate()?;
        if sources.len() != plan.sources.len() {
            return Err(PlanError::invalid(
                "sources",
                format!(
                    "the plan has {} sources but {} token counts were given",
                    plan.sources.len(),
                    sources.len()
                ),
            ));
        }
        let seq_len = u64::from(plan.seq_len);
        let per_epoch = samples_per_epoch(plan, sources)?;
        let epoch_samples = per_epoch
            .iter()
            .try_fold(0u64, |s, &n| s.checked_add(n))
            .ok_or_else(|| {
                PlanError::invalid("sources", "more than 2^64 - 1 samples in one epoch")
            })?;
        let total = match (plan.samples, plan.epochs) {
            (Some(n), _) => n,
            (None, e) => {
                let e = e.unwrap_or(1);
                epoch_samples.checked_mul(u64::from(e)).ok_or_else(|| {
                    PlanError::invalid(
                        "epochs",
                        format!("{e} epochs of {epoch_samples} samples is more than 2^64 - 1"),
                    )
                })?
            }
        };
        // The weights were checked by `validate`; without stages the mixture is constant.
        let mixture = Mixture::resolve(plan, total)?;
        let limits = Limits::of(plan, &per_epoch)?;
        let total = match &limits {
            Some(l) => l.total(&mixture, total)?,
            None => total,
        };
        let mut blender = Blender::with_mixture(mixture);
        if let Some(l) = limits.filter(|l| l.renormalizes()) {
            blender = blender.renormalizing(l.all().to_vec());
        }
        let (rank, world, batch_size) = (
            u64::from(plan.rank),
            u64::from(plan.world),
            u64::from(plan.batch_size),
        );
        let rank_samples = if plan.drop_last {
            total / world / batch_size * batch_size
        } else {
            share(total, rank, world)
        };
        Ok(Schedule {
            seq_len,
            batch_size,
            rank,
            world,
            drop_last: plan.drop_last,
            shuffle: plan.shuffle,
            seed: plan.seed,
            per_epoch,
            epoch_samples,
            total,
            rank_samples,
            blender,
        })
    }

    /// Global samples in the plan (all ranks together, before `drop_last`).
    pub fn total_samples(&self) -> u64 {
        self.total
    }

    /// Samples in one epoch of source `d`: `(tokens_d - 1) / seq_len`.
    ///
    /// # Panics
    /// If `d` is not a source of the plan.
    pub fn samples_per_epoch(&self, d: usize) -> u64 {
        self.per_epoch[d]
    }

    /// Samples in one pass over every source: `Σ_d samples_per_epoch(d)`.
    pub fn epoch_samples(&self) -> u64 {
        self.epoch_samples
    }

    /// Number of sources.
    pub fn sources(&self) -> usize {
        self.per_epoch.len()
    }

    /// Tokens per sample minus one (the plan's `seq_len`).
    pub fn seq_len(&self) -> u64 {
        self.seq_len
    }

    /// Tokens per sample: `seq_len + 1`.
    pub fn sample_len(&self) -> usize {
        self.seq_len as usize + 1
    }

    /// Tokens in a full batch: `batch_size × sample_len`.
    pub fn batch_tokens(&self) -> u64 {
        self.batch_size * (self.seq_len + 1)
    }

    /// Samples per batch per rank.
    pub fn batch_size(&self) -> u64 {
        self.batch_size
    }

    /// This plan's rank.
    pub fn rank(&self) -> u64 {
        self.rank
    }

    /// Number of ranks.
    pub fn world(&self) -> u64 {
        self.world
    }

    /// Whether each source's epochs are shuffled (the plan's `shuffle`).
    pub fn shuffles(&self) -> bool {
        self.shuffle
    }

    /// The plan's seed, which keys every epoch's shuffle.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Whether the incomplete end of the stream is dropped (the plan's `drop_last`).
    pub fn drop_last(&self) -> bool {
        self.drop_last
    }

    /// Samples this plan's rank gets: with `drop_last`, as many full batches as every rank can
    /// fill; without, every global sample `i` with `i % world == rank`.
    pub fn rank_samples(&self) -> u64 {
        self.rank_samples
    }

    /// Batches this plan's rank gets (the last one short when the plan keeps it).
    pub fn rank_batches(&self) -> u64 {
        self.rank_samples.div_ceil(self.batch_size)
    }

    /// The blend's weights as a function of the global sample (constant without stages).
    pub fn mixture(&self) -> Mixture {
        self.blender.mixture()
    }

    /// The blend at global sample 0: an endless stream of `(source, j)`.
    pub fn blender(&self) -> Blender {
        self.blender.clone()
    }

    /// Where the `j`-th sample drawn from source `d` lies, for global sample `global`: epoch
    /// `j / S_d`, position `j % S_d` shuffled within that epoch. O(1).
    ///
    /// # Panics
    /// If `d` is not a source of the plan.
    pub fn source_sample(&self, global: u64, d: usize, j: u64) -> SampleRef {
        self.source_sample_cached(global, d, j, &mut None)
    }

    /// [`Schedule::source_sample`], reusing the permutation in `cache` when it is the one of
    /// this sample's epoch (a stream stays in one epoch of a source for many samples, and
    /// building a permutation costs as much as applying it).
    fn source_sample_cached(
        &self,
        global: u64,
        d: usize,
        j: u64,
        cache: &mut Option<(u64, Permutation)>,
    ) -> SampleRef {
        let n = self.per_epoch[d];
        let (epoch, pos) = (j / n, j % n);
        let index = if self.shuffle {
            if cache.as_ref().is_some_and(|(e, _)| *e != epoch) {
                *cache = None;
            }
            let (_, perm) = cache.get_or_insert_with(|| {
                (
                    epoch,
                    Permutation::new(n, epoch_key(self.seed, d as u64, epoch)),
                )
            });
            perm.apply(pos)
        } else {
            pos
        };
        let start = index * self.seq_len;
        SampleRef {
            global,
            source: d,
            epoch,
            index,
            tokens: start..start + self.seq_len + 1,
        }
    }

    /// Global sample `i`, or `None` past the end of the plan. One seek of the blend
    /// ([`Blender::seek`]: a climb, or with renormalizing limits a replay from 0): for a
    /// stream, use [`Schedule::iter_rank`].
    pub fn sample(&self, i: u64) -> Option<SampleRef> {
        if i >= self.total {
            return None;
        }
        let mut b = self.blender();
        b.seek(i);
        let (d, j) = b.next_pick();
        Some(self.source_sample(i, d, j))
    }

    /// This plan's rank's samples from `cursor` on, to the end of its share.
    ///
    /// The rest of the stream is the global samples from the cursor's watermark on, less those
    /// it lists as `delivered`; rank `r` takes the `k`-th of them when
    /// `(consumed_samples + k) % world == r` (see [`Cursor`]), so a cursor saved on any number
    /// of ranks resumes on any other. Its `epoch` is not used. Costs O(#sources) with the
    /// cursor's `blend` counts, else one [`Blender::seek`] to the watermark; then O(world ×
    /// #sources) per sample, O(#sources) memory.
    pub fn iter_rank(&self, cursor: Cursor) -> Result<RankIter, PlanError> {
        self.iter_rank_until(cursor, &mut || false)
    }

    /// [`Schedule::iter_rank`] that gives up with [`PlanError::Stopped`] when `stop` says so
    /// while the blend replays to the cursor (see [`Blender::seek_until`]): a server bounds
    /// the time one request may take with it.
    pub fn iter_rank_until(
        &self,
        cursor: Cursor,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<RankIter, PlanError> {
        let watermark = self.check_cursor(&cursor)?;
        let c = cursor.consumed_samples;
        let local = share(c, self.rank, self.world).min(self.rank_samples);
        let mut blender = self.blender();
        let positioned = local < self.rank_samples;
        if !cursor.blend.is_empty() {
            blender.restore(&cursor.blend)?;
        } else if positioned && !blender.seek_until(watermark, stop) {
            let reached = blender.position();
            return Err(PlanError::Stopped {
                reached,
                target: watermark,
            });
        }
        let known = positioned || !cursor.blend.is_empty();
        let mut it = RankIter {
            row: Row {
                virt: c,
                counts: known.then(|| blender.counts().to_vec()),
                skip_at: 0,
                epoch: cursor.epoch,
            },
            perms: vec![None; self.sources()],
            schedule: self.clone(),
            blender,
            virt: c,
            skip: cursor.delivered,
            skip_at: 0,
            local,
        };
        if positioned {
            it.settle();
            it.walk_to(local.saturating_mul(self.world).saturating_add(self.rank));
        }
        Ok(it)
    }

    /// The plain cursor after `consumed_samples` global samples (its `epoch` filled in; no
    /// blend counts, nothing delivered past it).
    pub fn cursor_at(&self, consumed_samples: u64) -> Cursor {
        Cursor::new(consumed_samples / self.epoch_samples, consumed_samples)
    }

    /// The cursor after every rank consumed `local_samples_consumed` more samples from `from`:
    /// `from.consumed_samples + local_samples_consumed * world`, capped at the plan's total.
    pub fn cursor_after(&self, local_samples_consumed: u64, from: &Cursor) -> Cursor {
        let c = local_samples_consumed
            .saturating_mul(self.world)
            .saturating_add(from.consumed_samples)
            .min(self.total);
        self.cursor_at(c)
    }
}

/// Samples each source gives in one epoch: its tokens less one, in whole `seq_len`s (the last
/// sample's label is the next sample's first token). A source with no whole sample is an error.
fn samples_per_epoch(plan: &Plan, sources: &[SourceInfo]) -> Result<Vec<u64>, PlanError> {
    let seq_len = u64::from(plan.seq_len);
    let mut per_epoch = Vec::with_capacity(sources.len());
    for (d, (info, src)) in sources.iter().zip(&plan.sources).enumerate() {
        if info.tokens <= seq_len {
            return Err(PlanError::invalid(
                format!("sources[{d}]"),
                format!(
                    "{} has {} tokens, fewer than seq_len + 1 = {}",
                    src.uri,
                    info.tokens,
                    seq_len + 1
                ),
            ));
        }
        per_epoch.push((info.tokens - 1) / seq_len);
    }
    Ok(per_epoch)
}

/// How much of one source a run consumed up to a cursor.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SourceUse {
    /// Samples drawn from it.
    pub samples: u64,
    /// Those samples in epochs of it: `samples / samples_per_epoch`.
    pub epochs: f64,
}

/// How much of each source the global samples below `cursor`'s watermark drew, given each
/// source's samples per epoch: from the cursor's blend counts (a single source's count is the
/// watermark itself). `None` for a cursor of several sources past sample 0 without counts.
pub fn source_use(per_epoch: &[u64], cursor: &Cursor) -> Option<Vec<SourceUse>> {
    let watermark = cursor.watermark()?;
    let counts = match (per_epoch.len(), cursor.blend.is_empty()) {
        (1, _) => vec![watermark],
        (n, true) if watermark == 0 => vec![0; n],
        (n, false) if cursor.blend.len() == n => cursor.blend.clone(),
        _ => return None,
    };
    Some(
        counts
            .iter()
            .zip(per_epoch)
            .map(|(&samples, &n)| SourceUse {
                samples,
                epochs: samples as f64 / n.max(1) as f64,
            })
            .collect(),
    )
}

/// How many of the positions `0..n` go to `rank`: those with `i % world == rank`.
pub(crate) fn share(n: u64, rank: u64, world: u64) -> u64 {
    if n > rank {
        (n - rank - 1) / world + 1
    } else {
        0
    }
}

/// One rank's samples in order, from a cursor to the end of its share (see
/// [`Schedule::iter_rank`]). Owns what it needs (O(#sources) and the cursor's `delivered`),
/// so it can move to another thread or task.
#[derive(Clone, Debug)]
pub struct RankIter {
    schedule: Schedule,
    /// At the global sample of stream position `virt` (delivered samples drawn past).
    blender: Blender,
    /// Position in the stream of all ranks together: the cursor's `consumed_samples` plus the
    /// samples of the rest of the stream passed since.
    virt: u64,
    /// The cursor's `delivered`: global samples the walk draws but does not count.
    skip: Vec<u64>,
    /// How many of `skip` the blender has passed.
    skip_at: usize,
    /// Index of the next sample in this rank's local stream.
    local: u64,
    /// The cursor once every rank has consumed `local` samples.
    row: Row,
    /// Per source, the permutation of the epoch it was last read in.
    perms: Vec<Option<(u64, Permutation)>>,
}

/// The walk's state where a cursor stands, kept as the walk passes it.
#[derive(Clone, Debug)]
struct Row {
    virt: u64,
    /// The blend's counts there; `None` at a cursor without counts that was never walked from.
    counts: Option<Vec<u64>>,
    skip_at: usize,
    epoch: u64,
}

impl RankIter {
    /// Index of the next sample in this rank's local stream (samples already yielded, counting
    /// those before the cursor).
    pub fn local_position(&self) -> u64 {
        self.local
    }

    /// The cursor to checkpoint once every rank has consumed what this one has yielded, with
    /// the blend's counts (several sources) and what the starting cursor listed as delivered
    /// past it.
    pub fn cursor(&self) -> Cursor {
        let s = &self.schedule;
        let blend = match &self.row.counts {
            Some(c) if s.sources() > 1 => c.clone(),
            _ => Vec::new(),
        };
        Cursor {
            epoch: self.row.epoch,
            consumed_samples: self.row.virt,
            blend,
            delivered: self.skip[self.row.skip_at..].to_vec(),
        }
    }

    /// The rest of the current batch: the samples up to the next multiple of `batch_size` in
    /// the local stream (a whole batch unless resumed mid-batch, or at a short last batch).
    pub fn next_batch(&mut self) -> Option<Batch> {
        let bs = self.schedule.batch_size;
        let index = self.local / bs;
        let n = (bs - self.local % bs).min(self.schedule.rank_samples - self.local);
        if n == 0 {
            return None;
        }
        let samples: Vec<SampleRef> = self.by_ref().take(n as usize).collect();
        Some(Batch { index, samples })
    }

    /// Draws past the delivered samples at the blender's position.
    #[inline]
    fn settle(&mut self) {
        while self.skip.get(self.skip_at) == Some(&self.blender.position()) {
            self.blender.next_pick();
            self.skip_at += 1;
        }
    }

    /// Walks the stream to position `target`, keeping the cursor where every rank has
    /// consumed `local` samples as it passes it.
    fn walk_to(&mut self, target: u64) {
        let s = &self.schedule;
        let row_end = self.local.saturating_mul(s.world).min(s.total);
        if s.sources() == 1 && self.skip_at == self.skip.len() {
            // One source and nothing left to skip: the blend is the position itself, so the
            // walk is a jump (O(1) where world draws would be O(world)).
            if row_end > self.row.virt && (self.virt..=target).contains(&row_end) {
                self.jump(row_end);
                self.snapshot();
            }
            self.jump(target);
            return;
        }
        loop {
            if self.virt == row_end && row_end > self.row.virt {
                self.snapshot();
            }
            if self.virt >= target {
                return;
            }
            self.blender.next_pick();
            self.virt += 1;
            self.settle();
        }
    }

    /// Moves a single-source walk with nothing to skip to stream position `to` at once.
    fn jump(&mut self, to: u64) {
        if to > self.virt {
            let at = self.blender.position() + (to - self.virt);
            self.blender.seek(at);
            self.virt = to;
        }
    }

    fn snapshot(&mut self) {
        self.row.virt = self.virt;
        self.row.epoch = self.virt / self.schedule.epoch_samples;
        self.row.skip_at = self.skip_at;
        match &mut self.row.counts {
            Some(c) => c.copy_from_slice(self.blender.counts()),
            None => self.row.counts = Some(self.blender.counts().to_vec()),
        }
    }
}

impl Iterator for RankIter {
    type Item = SampleRef;

    #[inline]
    fn next(&mut self) -> Option<SampleRef> {
        let (rank_samples, world, rank, total) = {
            let s = &self.schedule;
            (s.rank_samples, s.world, s.rank, s.total)
        };
        if self.local >= rank_samples {
            return None;
        }
        let global = self.blender.position();
        let (d, j) = self.blender.next_pick();
        self.virt += 1;
        self.settle();
        self.local += 1;
        let next = if self.local < rank_samples {
            self.local.saturating_mul(world).saturating_add(rank)
        } else {
            self.local.saturating_mul(world).min(total)
        };
        self.walk_to(next);
        Some(
            self.schedule
                .source_sample_cached(global, d, j, &mut self.perms[d]),
        )
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = usize::try_from(self.schedule.rank_samples - self.local).unwrap_or(usize::MAX);
        (n, Some(n))
    }
}

impl ExactSizeIterator for RankIter {}
