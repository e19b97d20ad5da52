//! Where documents begin inside each sample, and the trainer outputs made from that.
//!
//! Megatron-Core's GPTDataset gives a trainer `position_ids` that restart at each document
//! (`reset_position_ids`), a `loss_mask` that drops end-of-document targets
//! (`eod_mask_loss`) and, for variable-length attention kernels, `cu_seqlens`. All three
//! follow from one small fact per sample: the input positions where a document starts. The
//! agent knows it near the data (from the end-of-document token, or from the index's true
//! document starts), ships it as a few u32 per sample ([`DocStarts`]), and the consumer
//! expands it into per-token arrays only when asked. That keeps the wire and the ring at the
//! size of the tokens, and makes every expansion one function used by every API.
//!
//! # The rule
//! A sample is `seq_len + 1` tokens; its inputs are tokens `0..seq_len`, its labels tokens
//! `1..=seq_len`. Its *starts* are the positions `b` in `1..=seq_len` at which a document
//! begins (a document beginning at token 0 changes nothing, so it is not listed). With
//! `boundaries = "eod"` they are `i + 1` for every input position `i` holding the EOD token,
//! which is what Megatron's `_get_ltor_masks_and_position_ids` computes; with
//! `"documents"`, the index's document starts that fall in the sample. Then, for input
//! position `i`:
//! - `position_ids[i] = i − max{b ∈ starts ∪ {0} : b ≤ i}`;
//! - `loss_mask[i] = 0` when `i + 1` is a start (the target is another document's first
//!   token; with EOD boundaries, exactly when input `i` is the EOD token), else 1;
//! - `cu_seqlens` of a batch (THD packing, samples laid end to end) is `k × seq_len + b` for
//!   every sample `k` and `b ∈ {0} ∪ starts, b < seq_len`, then `samples × seq_len`.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How a plan finds document boundaries inside samples (its `boundaries` field).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Boundaries {
    /// A document ends with the plan's `eod` token (Megatron's `eod_mask_loss` and
    /// `reset_position_ids` rule).
    Eod,
    /// The sources' document indices give where each document starts (corpora without EOD
    /// tokens too).
    Documents,
}

impl Boundaries {
    /// The name used in plans.
    pub fn as_str(self) -> &'static str {
        match self {
            Boundaries::Eod => "eod",
            Boundaries::Documents => "documents",
        }
    }
}

impl fmt::Display for Boundaries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The document starts of each sample of a batch (see the [module docs](self) for the rule).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DocStarts {
    seq_len: u32,
    /// `samples + 1` entries: sample `k`'s starts are `starts[offsets[k]..offsets[k + 1]]`.
    offsets: Vec<u32>,
    starts: Vec<u32>,
}

/// Why a batch's document starts were refused (a corrupt or hostile peer sent them).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("document starts: {0}")]
pub struct DocStartsError(pub String);

impl DocStarts {
    /// No samples yet, for samples of `seq_len + 1` tokens.
    pub fn new(seq_len: u32) -> Self {
        DocStarts {
            seq_len,
            offsets: vec![0],
            starts: Vec::new(),
        }
    }

    /// Empties it for a batch of samples of `seq_len + 1` tokens, keeping its memory.
    pub fn clear(&mut self, seq_len: u32) {
        self.seq_len = seq_len;
        self.offsets.clear();
        self.offsets.push(0);
        self.starts.clear();
    }

    /// Adds the next sample with these starts, which must be ascending and within
    /// `1..=seq_len` (the producer's own computation guarantees it; a peer's data goes
    /// through [`DocStarts::from_parts`]).
    pub fn push_sample(&mut self, starts: impl IntoIterator<Item = u32>) {
        self.starts.extend(starts);
        self.end_sample();
    }

    /// Adds a start to the sample being built (ascending, within `1..=seq_len`); finish the
    /// sample with [`end_sample`](DocStarts::end_sample).
    #[inline]
    pub fn push_start(&mut self, b: u32) {
        self.starts.push(b);
    }

    /// Ends the sample built by [`push_start`](DocStarts::push_start) calls (none: a sample
    /// within one document).
    pub fn end_sample(&mut self) {
        debug_assert!(self.valid_tail());
        self.offsets.push(self.starts.len() as u32);
    }

    fn valid_tail(&self) -> bool {
        let from = *self.offsets.last().unwrap_or(&0) as usize;
        let tail = &self.starts[from..];
        tail.windows(2).all(|w| w[0] < w[1])
            && tail.iter().all(|&b| (1..=self.seq_len).contains(&b))
    }

    /// Builds it from per-sample counts and the starts back to back, checking each sample's
    /// starts are ascending and within `1..=seq_len`.
    pub fn from_parts(
        seq_len: u32,
        counts: &[u32],
        starts: Vec<u32>,
    ) -> Result<Self, DocStartsError> {
        let mut offsets = Vec::with_capacity(counts.len() + 1);
        offsets.push(0u32);
        let mut at = 0usize;
        for (k, &n) in counts.iter().enumerate() {
            let end = at.saturating_add(n as usize);
            let Some(s) = starts.get(at..end) else {
                return Err(DocStartsError(format!(
                    "sample {k} claims {n} starts but only {} remain",
                    starts.len() - at
                )));
            };
            let bad = s.windows(2).any(|w| w[0] >= w[1])
                || s.iter().any(|&b| !(1..=seq_len).contains(&b));
            if bad {
                return Err(DocStartsError(format!(
                    "sample {k}'s starts {s:?} are not ascending within 1..={seq_len}"
                )));
            }
            at = end;
            offsets.push(at as u32);
        }
        if at != starts.len() {
            return Err(DocStartsError(format!(
                "{} starts for counts that sum to {at}",
                starts.len()
            )));
        }
        Ok(DocStarts {
            seq_len,
            offsets,
            starts,
        })
    }

    /// Samples it holds.
    pub fn samples(&self) -> usize {
        self.offsets.len() - 1
    }

    /// The plan's `seq_len`: input positions per sample.
    pub fn seq_len(&self) -> u32 {
        self.seq_len
    }

    /// Sample `k`'s starts, ascending, within `1..=seq_len`.
    ///
    /// # Panics
    /// If `k` is not below [`samples`](DocStarts::samples).
    pub fn sample(&self, k: usize) -> &[u32] {
        &self.starts[self.offsets[k] as usize..self.offsets[k + 1] as usize]
    }

    /// `samples + 1` offsets into [`starts`](DocStarts::starts): sample `k`'s are
    /// `starts[offsets[k]..offsets[k + 1]]` (the C API's view).
    pub fn offsets(&self) -> &[u32] {
        &self.offsets
    }

    /// Every sample's starts, back to back.
    pub fn starts(&self) -> &[u32] {
        &self.starts
    }

    /// Input tokens of the batch: `samples × seq_len`.
    pub fn positions(&self) -> usize {
        self.samples() * self.seq_len as usize
    }

    /// `position_ids` (`samples × seq_len`, row-major), restarting at 0 at each document start:
    /// one counting run per document, built as it is filled (no zeroing pass).
    pub fn position_ids<T: From<u32>>(&self) -> Vec<T> {
        let l = self.seq_len as usize;
        let mut v = Vec::with_capacity(self.positions());
        for k in 0..self.samples() {
            let mut at = 0;
            let ends = self.sample(k).iter().map(|&b| (b as usize).min(l));
            for end in ends.chain(std::iter::once(l)) {
                v.extend((0..(end - at) as u32).map(T::from));
                at = end;
            }
        }
        v
    }

    /// `loss_mask` (`samples × seq_len`, row-major): `zero` where the target is the first token
    /// of another document, `one` elsewhere (filled with `one` as it is made, then the zeros
    /// set).
    pub fn loss_mask<T: Copy>(&self, one: T, zero: T) -> Vec<T> {
        let l = self.seq_len as usize;
        let mut v = vec![one; self.positions()];
        for k in 0..self.samples() {
            for &b in self.sample(k) {
                v[k * l + b as usize - 1] = zero;
            }
        }
        v
    }

    /// `cu_seqlens` of the batch as one packed sequence of `samples × seq_len` tokens
    /// (appended to `out`, which is cleared first), and the longest segment (`max_seqlen`).
    /// A segment never spans two samples.
    pub fn cu_seqlens(&self, out: &mut Vec<i32>) -> i32 {
        out.clear();
        let l = self.seq_len as i64;
        let mut max = 0i64;
        let mut last = 0i64;
        for k in 0..self.samples() {
            let base = k as i64 * l;
            let inner = self
                .sample(k)
                .iter()
                .map(|&b| i64::from(b))
                .filter(|&b| b < l);
            for at in std::iter::once(0).chain(inner) {
                let at = base + at;
                if at > last {
                    max = max.max(at - last);
                }
                out.push(at as i32);
                last = at;
            }
        }
        let end = self.samples() as i64 * l;
        max = max.max(end - last);
        out.push(end as i32);
        max as i32
    }
}

/// Bytes of a batch record's document-start section at most, for batches of `batch_size`
/// samples of `seq_len + 1` tokens: its 8-byte head, then the smaller of a list and a
/// bitmask, which is never over `batch_size × ⌈seq_len / 8⌉` bytes; padded to 8 bytes. This
/// is what a producer reserves room for.
pub fn doc_section_bound(batch_size: u32, seq_len: u32) -> u64 {
    let bitmask = u64::from(batch_size) * u64::from(seq_len).div_ceil(8);
    (8 + bitmask).div_ceil(8) * 8
}

#[cfg(test)]
mod tests {
    use super::*;

    fn starts(seq_len: u32, samples: &[&[u32]]) -> DocStarts {
        let mut d = DocStarts::new(seq_len);
        for s in samples {
            d.push_sample(s.iter().copied());
        }
        d
    }

    #[test]
    fn expands_to_megatron_outputs() {
        // Megatron: tokens [5, 1, 9, 1, 1, 3] with EOD 1 give loss_mask [1,0,1,0,0,1]
        // and position_ids [0,1,0,1,0,0].
        let d = starts(6, &[&[2, 4, 5], &[]]);
        assert_eq!(
            d.position_ids::<i64>(),
            [0, 1, 0, 1, 0, 0, 0, 1, 2, 3, 4, 5]
        );
        assert_eq!(
            d.loss_mask(1.0f32, 0.0),
            [1., 0., 1., 0., 0., 1., 1., 1., 1., 1., 1., 1.]
        );
        let mut cu = Vec::new();
        assert_eq!(d.cu_seqlens(&mut cu), 6);
        assert_eq!(cu, [0, 2, 4, 5, 6, 12]);
    }

    #[test]
    fn a_start_at_seq_len_masks_the_last_target_only() {
        let d = starts(4, &[&[4], &[1]]);
        assert_eq!(d.position_ids::<u32>(), [0, 1, 2, 3, 0, 0, 1, 2]);
        assert_eq!(d.loss_mask(1u8, 0), [1, 1, 1, 0, 0, 1, 1, 1]);
        let mut cu = Vec::new();
        assert_eq!(d.cu_seqlens(&mut cu), 4);
        assert_eq!(cu, [0, 4, 5, 8]);
    }

    #[test]
    fn from_parts_refuses_what_no_producer_sends() {
        let ok = DocStarts::from_parts(4, &[1, 0, 2], vec![4, 1, 3]).unwrap();
        assert_eq!(ok, starts(4, &[&[4], &[], &[1, 3]]));
        let err = |counts: &[u32], s: Vec<u32>| {
            DocStarts::from_parts(4, counts, s).unwrap_err().to_string()
        };
        assert_eq!(
            err(&[2], vec![1]),
            "document starts: sample 0 claims 2 starts but only 1 remain"
        );
        assert_eq!(
            err(&[2], vec![3, 3]),
            "document starts: sample 0's starts [3, 3] are not ascending within 1..=4"
        );
        assert_eq!(
            err(&[1], vec![5]),
            "document starts: sample 0's starts [5] are not ascending within 1..=4"
        );
        assert_eq!(
            err(&[1], vec![0]),
            "document starts: sample 0's starts [0] are not ascending within 1..=4"
        );
        assert_eq!(
            err(&[1], vec![1, 2]),
            "document starts: 2 starts for counts that sum to 1"
        );
    }

    #[test]
    fn the_section_bound_covers_a_bitmask() {
        assert_eq!(doc_section_bound(1, 1), 16);
        assert_eq!(doc_section_bound(8, 4096), 8 + 8 * 512);
        assert_eq!(doc_section_bound(3, 9), 16);
    }
}
