//! Samples as one token stream: how an agent serves a build's samples over a range session,
//! and how its client asks for them.
//!
//! An agent that built the indices serves the samples of all three splits as one virtual
//! dataset, so the range sessions every dquant client already speaks (narrowed, compressed,
//! checked frames; see `dquant-agent`'s `serve_ranges`) carry them without a protocol of
//! their own. Sample `i` of a split is one *record* of [`RECORD_HEADER`] + `sample_tokens`
//! tokens: its `dataset_id` (0 outside a blend), its count of pad tokens, then its tokens with
//! each pad sent as 0 (Megatron's pad id may be -1, which no token is). The splits follow
//! each other, train first. Both ends derive every offset from [`RecordLayout`], so they
//! cannot disagree.

use std::ops::Range;

use crate::datasets::{Sample, TopLevel};
use crate::{Built, MegatronError};

/// Tokens before a sample's own in its record: `dataset_id`, pad count.
pub const RECORD_HEADER: u64 = 2;

/// One split's place in the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitRecords {
    pub samples: u64,
    /// Tokens of one sample (`sequence_length`, +1 with the extra token).
    pub sample_tokens: u64,
    pub blended: bool,
    /// The stream's token where the split's first record starts.
    pub start: u64,
}

impl SplitRecords {
    /// Tokens of one record.
    pub fn record_tokens(&self) -> u64 {
        RECORD_HEADER + self.sample_tokens
    }
}

/// Where each split's records lie in the stream (`None`: Megatron gives no dataset).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordLayout {
    pub splits: [Option<SplitRecords>; 3],
    /// Tokens in the whole stream.
    pub tokens: u64,
}

impl RecordLayout {
    /// Tokens of the largest record of any split (0 when no split is present).
    pub fn max_record_tokens(&self) -> u64 {
        let present = self.splits.iter().flatten();
        present.map(SplitRecords::record_tokens).max().unwrap_or(0)
    }

    /// The layout of `built`'s splits.
    pub fn of(built: &Built) -> Result<Self, MegatronError> {
        let shape = built.splits.each_ref().map(|s| {
            s.as_ref()
                .map(|t| (t.len(), t.sample_tokens(), is_blended(t)))
        });
        Self::new(shape)
    }

    /// The layout of splits of `(samples, sample_tokens, blended)`, train first; an error
    /// when the stream would pass 2^64 tokens.
    pub fn new(shape: [Option<(u64, u64, bool)>; 3]) -> Result<Self, MegatronError> {
        let mut start = 0u64;
        let mut splits = [None; 3];
        for (out, s) in splits.iter_mut().zip(shape) {
            let Some((samples, sample_tokens, blended)) = s else {
                continue;
            };
            let r = SplitRecords {
                samples,
                sample_tokens,
                blended,
                start,
            };
            start = r
                .record_tokens()
                .checked_mul(samples)
                .and_then(|n| n.checked_add(start))
                .ok_or(MegatronError::TooLarge {
                    what: "the served sample stream",
                    elements: samples,
                })?;
            *out = Some(r);
        }
        Ok(RecordLayout {
            splits,
            tokens: start,
        })
    }

    /// Split `split`'s records, or an error naming it when Megatron gives it no dataset.
    pub fn split(&self, split: usize) -> Result<&SplitRecords, MegatronError> {
        self.splits
            .get(split)
            .and_then(Option::as_ref)
            .ok_or_else(|| MegatronError::Config(format!("split {split} has no dataset")))
    }

    /// The stream's tokens of sample `idx` of `split`.
    pub fn record(&self, split: usize, idx: u64) -> Result<Range<u64>, MegatronError> {
        let s = self.split(split)?;
        if idx >= s.samples {
            return Err(MegatronError::IndexOutOfRange {
                split: crate::Split::ALL[split].name(),
                index: idx,
                len: s.samples,
            });
        }
        let start = s.start + idx * s.record_tokens();
        Ok(start..start + s.record_tokens())
    }

    /// The split and sample whose record holds stream token `at`, and `at`'s offset in it.
    pub fn locate(&self, at: u64) -> Option<(usize, u64, u64)> {
        self.splits.iter().enumerate().find_map(|(i, s)| {
            let s = s.as_ref()?;
            let rel = at.checked_sub(s.start)?;
            let (idx, off) = (rel / s.record_tokens(), rel % s.record_tokens());
            (idx < s.samples).then_some((i, idx, off))
        })
    }
}

fn is_blended(t: &TopLevel) -> bool {
    matches!(t, TopLevel::Blended(_))
}

/// A record's header for `sample`.
pub fn header(sample: &Sample) -> [u32; RECORD_HEADER as usize] {
    // dataset ids index the blend's datasets, and pads are fewer than a sample's tokens
    // (a u32 `sequence_length`, +1), so both fit.
    let id = sample.dataset_id.map_or(0, |d| d as u32);
    [id, sample.pad.min(u64::from(u32::MAX)) as u32]
}

/// What a record's header says: `(dataset_id, pad)`, checked against the record's size.
pub fn parse_header(h: &[u32], sample_tokens: u64) -> Result<(u32, u64), MegatronError> {
    match h {
        [id, pad, ..] if u64::from(*pad) <= sample_tokens => Ok((*id, u64::from(*pad))),
        [_, pad, ..] => Err(MegatronError::Config(format!(
            "a served sample says it has {pad} pad tokens, more than its {sample_tokens}"
        ))),
        _ => Err(MegatronError::Config(
            "a served sample has no header".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_follow_each_other_and_locate_inverts_record() {
        let l = RecordLayout::new([Some((3, 5, false)), None, Some((2, 9, true))]).unwrap();
        assert_eq!(l.tokens, 3 * 7 + 2 * 11);
        assert_eq!(l.record(0, 2).unwrap(), 14..21);
        assert_eq!(l.record(2, 0).unwrap(), 21..32);
        for split in [0usize, 2] {
            let n = l.split(split).unwrap().samples;
            for idx in 0..n {
                let r = l.record(split, idx).unwrap();
                assert_eq!(l.locate(r.start), Some((split, idx, 0)));
                assert_eq!(l.locate(r.end - 1), Some((split, idx, r.end - 1 - r.start)));
            }
        }
        assert_eq!(l.locate(l.tokens), None);
        assert_eq!(
            l.split(1).unwrap_err().to_string(),
            "split 1 has no dataset"
        );
        assert_eq!(
            l.record(0, 3).unwrap_err().to_string(),
            "index 3 is out of range for the train dataset of 3 samples"
        );
    }

    #[test]
    fn a_stream_past_u64_is_refused() {
        let e = RecordLayout::new([Some((u64::MAX / 4, 8, false)), None, None]).unwrap_err();
        assert!(matches!(e, MegatronError::TooLarge { .. }), "{e}");
    }

    #[test]
    fn headers_round_trip_and_bad_pads_are_refused() {
        let s = Sample {
            dataset_id: Some(3),
            pieces: vec![],
            pad: 7,
        };
        assert_eq!(parse_header(&header(&s), 9).unwrap(), (3, 7));
        assert_eq!(
            parse_header(&header(&s), 6).unwrap_err().to_string(),
            "a served sample says it has 7 pad tokens, more than its 6"
        );
    }
}
