//! Exact resume at scale: cursors that carry the blend's state and what was delivered past
//! them, checked before use, and merged across the sub-ranks of a run.
//!
//! Why: a cursor of one number (`consumed_samples`) forces two costs at scale. Resuming must
//! replay Megatron's blend from sample 0 (minutes at 10^10 samples), and it only works on the
//! topology it was saved on, because DataLoader workers run ahead of each other and their
//! positions do not reduce to one number. A [`Cursor`] therefore may carry the per-source
//! counts at its watermark (resume in O(#sources)) and the samples past the watermark that were
//! delivered already; [`merge_cursors`] folds the cursors of all sub-ranks of a run into one
//! such cursor, which any number of ranks and workers resumes from with nothing lost and
//! nothing repeated.

use crate::cursor::Cursor;
use crate::error::PlanError;
use crate::schedule::{share, Schedule};

/// The most samples a cursor may list as delivered past its watermark. Workers' prefetch
/// spreads sub-ranks by a few batches each, so real cursors list thousands; the bound keeps a
/// hostile or mistaken cursor from costing more memory than a small batch window.
pub const MAX_DELIVERED: usize = 1 << 22;

impl Schedule {
    /// Checks `c` against this schedule, before anything is sized from it, and returns its
    /// watermark.
    pub(crate) fn check_cursor(&self, c: &Cursor) -> Result<u64, PlanError> {
        let (consumed, total) = (c.consumed_samples, self.total_samples());
        if consumed > total {
            return Err(PlanError::Cursor(format!(
                "consumed_samples {consumed} is past the end of the plan ({total} samples)"
            )));
        }
        let n = c.delivered.len();
        if n > MAX_DELIVERED {
            return Err(PlanError::Cursor(format!(
                "delivered lists {n} samples, more than {MAX_DELIVERED}"
            )));
        }
        let watermark = c.watermark().ok_or_else(|| {
            PlanError::Cursor(format!(
                "delivered lists {n} samples, more than consumed_samples {consumed}"
            ))
        })?;
        check_delivered(&c.delivered, watermark, total)?;
        if !c.blend.is_empty() {
            let sum = c.blend.iter().fold(0u64, |s, &x| s.saturating_add(x));
            if c.blend.len() == self.sources() && sum != watermark {
                return Err(PlanError::Cursor(format!(
                    "blend adds up to {sum} samples, the cursor's watermark is {watermark} \
                     (consumed_samples {consumed} less {n} delivered)"
                )));
            }
        }
        Ok(watermark)
    }
}

/// `delivered` ascends strictly, from `watermark` on, below `total`.
fn check_delivered(delivered: &[u64], watermark: u64, total: u64) -> Result<(), PlanError> {
    if let Some(&first) = delivered.first() {
        if first < watermark {
            return Err(PlanError::Cursor(format!(
                "delivered[0] = {first} is below the watermark {watermark}"
            )));
        }
    }
    if let Some(k) = delivered.windows(2).position(|w| w[0] >= w[1]) {
        return Err(PlanError::Cursor(format!(
            "delivered is not strictly ascending: [{k}] = {} then [{}] = {}",
            delivered[k],
            k + 1,
            delivered[k + 1]
        )));
    }
    if let Some(&last) = delivered.last() {
        if last >= total {
            return Err(PlanError::Cursor(format!(
                "delivered[{}] = {last} is past the end of the plan ({total} samples)",
                delivered.len() - 1
            )));
        }
    }
    Ok(())
}

impl Cursor {
    /// The cursor of the same stream after `consumed_samples` (at least this cursor's): the
    /// samples this cursor lists as delivered that lie past the new watermark stay listed.
    /// The blend's counts are not known there (a reader that receives only
    /// `consumed_samples` with each batch rebuilds its cursor with this), so `blend` is empty
    /// unless the position did not move.
    pub fn moved_to(&self, epoch: u64, consumed_samples: u64) -> Cursor {
        if consumed_samples <= self.consumed_samples {
            return Cursor {
                epoch,
                ..self.clone()
            };
        }
        let (_, at) = self.global_of(consumed_samples);
        Cursor {
            epoch,
            consumed_samples,
            blend: Vec::new(),
            delivered: self.delivered[at..].to_vec(),
        }
    }

    /// The global sample at stream position `v` (at least `consumed_samples`): the
    /// `v - consumed_samples`-th sample from the watermark on that is not delivered, and how
    /// many of `delivered` lie below it.
    fn global_of(&self, v: u64) -> (u64, usize) {
        let watermark = self.watermark().unwrap_or(0);
        let mut g = watermark.saturating_add(v.saturating_sub(self.consumed_samples));
        let mut at = 0;
        while at < self.delivered.len() && self.delivered[at] <= g {
            g += 1;
            at += 1;
        }
        (g, at)
    }
}

/// Merges the cursors of the `cursors.len()` sub-ranks of one run (`cursors[r]` is where
/// sub-rank `r` of that many stands: its reader's cursor after the last batch the training
/// loop received from it) into one cursor that any number of ranks resumes from.
///
/// Sub-rank `r` has delivered every stream position below its cursor's `consumed_samples` that
/// is `r` modulo the number of sub-ranks. The merged cursor's watermark is the slowest
/// sub-rank's; what faster ones delivered past it is listed in `delivered`. Its `blend` is the
/// slowest cursor's (empty if that one has none); its `epoch` too.
pub fn merge_cursors(cursors: &[Cursor]) -> Result<Cursor, PlanError> {
    let world = cursors.len() as u64;
    let slowest = cursors
        .iter()
        .min_by_key(|c| c.consumed_samples)
        .ok_or_else(|| PlanError::Cursor("no cursors to merge".into()))?;
    let from = slowest.consumed_samples;
    let to = cursors
        .iter()
        .map(|c| c.consumed_samples)
        .max()
        .unwrap_or(from);
    let ahead: u64 = cursors
        .iter()
        .enumerate()
        .map(|(r, c)| share(c.consumed_samples, r as u64, world) - share(from, r as u64, world))
        .sum();
    let listed = slowest.delivered.len() as u64;
    if to - from > MAX_DELIVERED as u64 * world.max(1) || ahead + listed > MAX_DELIVERED as u64 {
        return Err(PlanError::Cursor(format!(
            "the sub-ranks are {} samples apart, more than a run's prefetch leaves ({} at most \
             delivered past the slowest)",
            to - from,
            MAX_DELIVERED
        )));
    }
    for (r, c) in cursors.iter().enumerate() {
        if !is_subset(&c.delivered, &slowest.delivered) {
            return Err(PlanError::Cursor(format!(
                "cursor {r} is not from the same run as the others: its delivered samples \
                 are not the slowest cursor's"
            )));
        }
    }
    let mut delivered = Vec::with_capacity((ahead + listed) as usize);
    let mut old = slowest.delivered.iter().copied().peekable();
    let mut g = slowest.watermark().unwrap_or(0);
    for v in from..to {
        // Global sample `g` holds stream position `v`: past the slowest cursor's own
        // delivered samples, which keep their place in the merged list.
        while old.peek() == Some(&g) {
            delivered.push(g);
            old.next();
            g += 1;
        }
        if v < cursors[(v % world) as usize].consumed_samples {
            delivered.push(g);
        }
        g += 1;
    }
    delivered.extend(old.filter(|&d| d >= g));
    delivered.dedup();
    Ok(Cursor {
        epoch: slowest.epoch,
        consumed_samples: from + ahead,
        blend: slowest.blend.clone(),
        delivered,
    })
}

/// Whether every element of `a` is in `b` (both ascending).
fn is_subset(a: &[u64], b: &[u64]) -> bool {
    let mut b = b.iter();
    a.iter().all(|x| b.any(|y| y == x))
}
