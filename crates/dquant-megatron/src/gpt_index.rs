//! One `GPTDataset`'s three index arrays, built as Megatron-Core builds them.
//!
//! - The *document index* lists the split's documents once per epoch, shuffled (the last
//!   epoch shuffled on its own when it is used for less than 80% of its samples: Megatron's
//!   "separate final epoch").
//! - The *sample index* cuts that stream into samples of `sequence_length` (+1 with the extra
//!   token) tokens: row `s` is the document-index position and token offset where sample `s`
//!   starts (`helpers.cpp::build_sample_idx`, integer for integer).
//! - The *shuffle index* is a shuffled `arange` of the samples (two ranges when the final
//!   epoch is separate).
//!
//! The dtypes are Megatron's (int32 or int64 sample rows, uint32 or int64 shuffle entries),
//! so the arrays are the very ones Megatron would cache, and cost what they cost there.

use std::ops::Range;

use crate::alloc::vec_for;
use crate::random_state::RandomState;
use crate::MegatronError;

/// What a GPT dataset's indices depend on besides its documents.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GptParams {
    pub sequence_length: u32,
    pub add_extra_token_to_sequence: bool,
    pub random_seed: u32,
    /// False only for a validation split with `drop_last_partial_validation_sequence = False`.
    pub drop_last_partial_sequence: bool,
}

impl GptParams {
    /// Tokens a sample holds before padding: `sequence_length` (+1).
    pub fn sample_tokens(&self) -> u64 {
        u64::from(self.sequence_length) + self.extra() as u64
    }

    fn extra(&self) -> i64 {
        i64::from(self.add_extra_token_to_sequence)
    }
}

/// Sample-index rows, in Megatron's dtype: int32 while every document-index position and
/// document length fits, int64 beyond.
#[derive(Clone, Debug, PartialEq)]
pub enum SampleIndex {
    I32(Vec<[i32; 2]>),
    I64(Vec<[i64; 2]>),
}

impl SampleIndex {
    pub fn rows(&self) -> usize {
        match self {
            SampleIndex::I32(v) => v.len(),
            SampleIndex::I64(v) => v.len(),
        }
    }

    /// Row `i`: (document-index position, token offset).
    pub fn row(&self, i: usize) -> (i64, i64) {
        match self {
            SampleIndex::I32(v) => (i64::from(v[i][0]), i64::from(v[i][1])),
            SampleIndex::I64(v) => (v[i][0], v[i][1]),
        }
    }
}

/// Shuffle-index entries, in Megatron's dtype: uint32 below 2^32 - 2 samples, int64 beyond.
#[derive(Clone, Debug, PartialEq)]
pub enum ShuffleIndex {
    U32(Vec<u32>),
    I64(Vec<i64>),
}

impl ShuffleIndex {
    pub fn len(&self) -> usize {
        match self {
            ShuffleIndex::U32(v) => v.len(),
            ShuffleIndex::I64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, i: usize) -> u64 {
        match self {
            ShuffleIndex::U32(v) => u64::from(v[i]),
            // Entries are a permutation of 0..len: never negative.
            ShuffleIndex::I64(v) => v[i] as u64,
        }
    }
}

/// A GPT dataset's document, sample and shuffle indices.
#[derive(Clone, Debug, PartialEq)]
pub struct GptIndex {
    pub document_index: Vec<i32>,
    pub sample_index: SampleIndex,
    pub shuffle_index: ShuffleIndex,
    pub num_epochs: u64,
    pub separate_final_epoch: bool,
}

impl GptIndex {
    /// Samples: `len(GPTDataset)`.
    pub fn len(&self) -> u64 {
        self.sample_index.rows().saturating_sub(1) as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Builds the indices of the documents `documents` of a dataset whose sequence lengths
    /// are `lengths`, for at least `num_samples` samples (`None`: one epoch).
    pub fn build(
        lengths: &[i32],
        documents: Range<u64>,
        num_samples: Option<u64>,
        p: &GptParams,
    ) -> Result<Self, MegatronError> {
        Self::build_within(lengths, documents, num_samples, p, u64::MAX)
    }

    /// [`build`](Self::build), refused before anything is allocated when the document index
    /// (documents x epochs: many epochs of tiny documents grow it far past the samples)
    /// would hold more than `max_entries` entries (the error names no source: the caller
    /// adds it).
    pub fn build_within(
        lengths: &[i32],
        documents: Range<u64>,
        num_samples: Option<u64>,
        p: &GptParams,
        max_entries: u64,
    ) -> Result<Self, MegatronError> {
        // Megatron-Core builds samples of one token too (its sample index divides by the
        // length); zero would divide by zero there.
        if p.sequence_length == 0 {
            return Err(MegatronError::Config(
                "sequence_length must be at least 1, not 0".into(),
            ));
        }
        let docs = usize::try_from(documents.start).unwrap_or(usize::MAX)
            ..usize::try_from(documents.end).unwrap_or(usize::MAX);
        let Some(split_lengths) = lengths.get(docs.clone()) else {
            return Err(MegatronError::Config(format!(
                "documents {documents:?} are beyond the dataset's {} sequences",
                lengths.len()
            )));
        };
        let tokens_per_epoch: i64 = split_lengths.iter().map(|&l| i64::from(l)).sum();
        let num_epochs = num_epochs(tokens_per_epoch, num_samples, p)?;
        let entries = (docs.len() as u64).saturating_mul(num_epochs);
        if entries > max_entries {
            return Err(MegatronError::OverLimit {
                documents: docs.len() as u64,
                epochs: num_epochs,
                entries,
                max: max_entries,
            });
        }
        let separate = separate_final_epoch(tokens_per_epoch, num_epochs, num_samples, p)?;
        let mut rng = RandomState::new(p.random_seed);
        let document_index = document_index(docs, num_epochs, separate.is_some(), &mut rng)?;
        let widest = lengths.iter().copied().max().unwrap_or(0) as u64;
        let narrow = (document_index.len() as u64).max(widest) <= i32::MAX as u64;
        let sample_index = if narrow {
            SampleIndex::I32(sample_index(
                lengths,
                &document_index,
                num_epochs,
                tokens_per_epoch,
                p,
            )?)
        } else {
            SampleIndex::I64(sample_index(
                lengths,
                &document_index,
                num_epochs,
                tokens_per_epoch,
                p,
            )?)
        };
        let samples = sample_index.rows().saturating_sub(1) as u64;
        let first = separate.unwrap_or(samples);
        let shuffle_index = shuffle_index(first, samples, &mut rng)?;
        Ok(GptIndex {
            document_index,
            sample_index,
            shuffle_index,
            num_epochs,
            separate_final_epoch: separate.is_some(),
        })
    }
}

/// `GPTDataset._get_num_epochs`: the fewest epochs (at least one) whose tokens cover
/// `num_samples` samples.
fn num_epochs(tokens: i64, num_samples: Option<u64>, p: &GptParams) -> Result<u64, MegatronError> {
    let Some(n) = num_samples else { return Ok(1) };
    let requested = i128::from(n) * i128::from(p.sequence_length) + i128::from(p.extra());
    if tokens <= 0 {
        // Megatron-Core loops forever here.
        return Err(MegatronError::Config(format!(
            "{n} samples requested from documents that hold no tokens"
        )));
    }
    let epochs = ((requested + i128::from(tokens) - 1) / i128::from(tokens)).max(1);
    u64::try_from(epochs).map_err(|_| MegatronError::Config(format!("{n} samples is too many")))
}

/// Megatron's separate-final-epoch rule: `Some(samples before the final epoch)` when the final
/// epoch contributes fewer than 80% of an epoch's samples, so it is shuffled apart.
fn separate_final_epoch(
    tokens: i64,
    epochs: u64,
    num_samples: Option<u64>,
    p: &GptParams,
) -> Result<Option<u64>, MegatronError> {
    let (Some(n), true) = (num_samples, epochs > 1) else {
        return Ok(None);
    };
    // Python's integers: 128 bits hold any epochs x tokens here without overflow.
    let (seq, extra) = (i128::from(p.sequence_length), i128::from(p.extra()));
    let sans_final = ((i128::from(epochs) - 1) * i128::from(tokens) - extra).div_euclid(seq);
    let from_final = i128::from(n) - sans_final;
    let per_epoch = (i128::from(tokens) - extra).div_euclid(seq);
    if from_final < 0 || from_final > per_epoch + 1 {
        return Err(MegatronError::Config(format!(
            "final epoch would hold {from_final} samples of {per_epoch} (Megatron-Core asserts)"
        )));
    }
    let threshold = (0.80 * per_epoch as f64) as i128;
    // At most the whole sample count, which must fit an allocation later: saturating is safe.
    let sans_final = u64::try_from(sans_final).unwrap_or(u64::MAX);
    Ok((from_final < threshold).then_some(sans_final))
}

/// `_build_document_index`: the split's documents once per epoch, shuffled.
fn document_index(
    docs: Range<usize>,
    epochs: u64,
    separate: bool,
    rng: &mut RandomState,
) -> Result<Vec<i32>, MegatronError> {
    let per_epoch = docs.len() as u64;
    let total = per_epoch.saturating_mul(epochs);
    let mut out = vec_for(total, "the document index")?;
    for _ in 0..epochs {
        // Megatron's document index is int32: so are its document numbers.
        out.extend(docs.clone().map(|d| d as i32));
    }
    if separate && epochs > 1 {
        let (first, last) = out.split_at_mut(docs.len() * (epochs as usize - 1));
        rng.shuffle(first);
        rng.shuffle(last);
    } else {
        rng.shuffle(&mut out);
    }
    Ok(out)
}

/// Integers a sample-index row can be stored in.
trait Row: Copy {
    fn from_i64(v: i64) -> Self;
}

impl Row for i32 {
    fn from_i64(v: i64) -> Self {
        // Callers choose i32 only when every value fits (Megatron's own rule).
        v as i32
    }
}

impl Row for i64 {
    fn from_i64(v: i64) -> Self {
        v
    }
}

/// Samples `build_sample_idx` makes from `tokens` tokens an epoch.
/// (In 128 bits, as Python's integers would not overflow; the count is then checked
/// against what can be allocated.)
fn sample_count(epochs: u64, tokens: i64, p: &GptParams) -> i128 {
    let all = i128::from(epochs) * i128::from(tokens) - i128::from(p.extra());
    if p.drop_last_partial_sequence {
        // C++ integer division truncates toward zero (all is -1 at the least).
        all / i128::from(p.sequence_length)
    } else {
        // helpers.cpp divides in single precision: the same float, the same count.
        (all as f32 / p.sequence_length as f32).ceil() as i128
    }
}

/// `helpers.cpp::build_sample_idx`, statement for statement.
fn sample_index<T: Row>(
    lengths: &[i32],
    document_index: &[i32],
    epochs: u64,
    tokens: i64,
    p: &GptParams,
) -> Result<Vec<[T; 2]>, MegatronError> {
    let count = sample_count(epochs, tokens, p).max(0);
    let mut out = vec_for(
        u64::try_from(count + 1).unwrap_or(u64::MAX),
        "the sample index",
    )?;
    // The allocation above succeeded: the count fits in memory, so in usize.
    let num_samples = count as usize;
    if num_samples > 0 && document_index.is_empty() {
        return Err(MegatronError::Config("samples from no documents".into()));
    }
    let extra = p.extra();
    let len_of = |di: usize| i64::from(lengths[document_index[di] as usize]);
    let (mut di, mut offset) = (0usize, 0i64);
    out.push([T::from_i64(0), T::from_i64(0)]);
    while out.len() <= num_samples {
        let mut remaining = i64::from(p.sequence_length) + extra;
        while remaining != 0 {
            let doc_len = len_of(di) - offset;
            remaining -= doc_len;
            if remaining <= 0 {
                offset += remaining + doc_len - extra;
                remaining = 0;
            } else {
                if di == document_index.len() - 1 {
                    offset = len_of(di) - extra;
                    break;
                }
                di += 1;
                offset = 0;
            }
        }
        out.push([T::from_i64(di as i64), T::from_i64(offset)]);
    }
    Ok(out)
}

/// `_build_shuffle_index(first, total)`: `0..first` shuffled, then `first..total` shuffled.
fn shuffle_index(
    first: u64,
    total: u64,
    rng: &mut RandomState,
) -> Result<ShuffleIndex, MegatronError> {
    fn build<T: Copy>(
        first: u64,
        total: u64,
        rng: &mut RandomState,
        of: impl Fn(u64) -> T,
    ) -> Result<Vec<T>, MegatronError> {
        let mut v = vec_for(total, "the shuffle index")?;
        v.extend((0..total).map(of));
        let (a, b) = v.split_at_mut(first as usize);
        rng.shuffle(a);
        if first != total {
            rng.shuffle(b);
        }
        Ok(v)
    }
    Ok(if total >= u64::from(u32::MAX) - 1 {
        ShuffleIndex::I64(build(first, total, rng, |i| i as i64)?)
    } else {
        ShuffleIndex::U32(build(first, total, rng, |i| i as u32)?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(seq: u32) -> GptParams {
        GptParams {
            sequence_length: seq,
            add_extra_token_to_sequence: true,
            random_seed: 1234,
            drop_last_partial_sequence: true,
        }
    }

    #[test]
    fn samples_cover_the_epochs_tokens_with_one_token_of_overlap() {
        let lengths = [5, 7, 3, 9, 4];
        let ix = GptIndex::build(&lengths, 0..5, None, &params(4)).unwrap();
        // 28 tokens, samples of 4 (+1): (28 - 1) / 4 = 6.
        assert_eq!(ix.len(), 6);
        assert_eq!(ix.num_epochs, 1);
        let mut docs = ix.document_index.clone();
        docs.sort_unstable();
        assert_eq!(docs, [0, 1, 2, 3, 4]);
        let mut shuffled: Vec<u64> = (0..6).map(|i| ix.shuffle_index.get(i)).collect();
        shuffled.sort_unstable();
        assert_eq!(shuffled, [0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn more_samples_than_an_epoch_take_more_epochs() {
        let lengths = [5, 7, 3, 9, 4];
        let ix = GptIndex::build(&lengths, 1..4, Some(10), &params(4)).unwrap();
        // 19 tokens an epoch; 10 samples need 41 tokens: 3 epochs.
        assert_eq!(ix.num_epochs, 3);
        assert!(ix.len() >= 10);
        assert_eq!(ix.document_index.len(), 9);
    }

    #[test]
    fn an_absurd_number_of_samples_is_an_error_not_an_abort() {
        let e = GptIndex::build(&[5, 7], 0..2, Some(u64::MAX / 8), &params(4)).unwrap_err();
        // 2^61 samples of 4 (+1) tokens from 12 tokens an epoch: 2^63 / 12 epochs of 2 documents.
        assert_eq!(
            e.to_string(),
            "the document index would hold 1537228672809129302 entries: more than this process can allocate"
        );
    }

    #[test]
    fn a_document_index_over_the_limit_is_refused_before_it_is_made() {
        // 1,000 samples of 4 (+1) tokens from two documents of 12 tokens: 334 epochs.
        let e = GptIndex::build_within(&[5, 7], 0..2, Some(1000), &params(4), 667).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the document index would hold 668 entries (2 documents x 334 epochs), above the \
             limit of 667"
        );
        assert!(e.is_over_limit());
        let ix = GptIndex::build_within(&[5, 7], 0..2, Some(1000), &params(4), 668).unwrap();
        assert_eq!(ix.document_index.len(), 668);
    }

    #[test]
    fn samples_from_an_empty_split_are_an_error_not_a_hang() {
        let e = GptIndex::build(&[5, 7], 1..1, Some(3), &params(4)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "3 samples requested from documents that hold no tokens"
        );
    }
}
