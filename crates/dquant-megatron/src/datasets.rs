//! The built datasets, and what sample `i` of each is made of.
//!
//! A [`GptDataset`] maps a sample through its shuffle index to a sample-index row pair and
//! reads the documents between them (`_query_document_sample_shuffle_indices`); a
//! [`BlendedDataset`] first picks the dataset and its sample. Either way a sample is a list of
//! [`Piece`]s (a sequence of one source, an offset and a length) plus the padding Megatron
//! adds to a short last validation sample: the reader fetches the pieces, nothing else.

use std::sync::Arc;

use crate::blending::BlendingIndices;
use crate::gpt_index::{GptIndex, GptParams};
use crate::split::Split;
use crate::MegatronError;

/// Tokens of one sequence of one source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Index into [`Built::sources`](crate::Built::sources).
    pub source: usize,
    /// The sequence (Megatron's `IndexedDataset` element).
    pub sequence: u64,
    pub offset: u64,
    pub length: u64,
}

/// What one sample is made of.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// `dataset_id` of a blended dataset's sample (`None` for a lone GPT dataset).
    pub dataset_id: Option<i16>,
    pub pieces: Vec<Piece>,
    /// Pad tokens after the pieces (only a partial last validation sample has any).
    pub pad: u64,
}

/// A `GPTDataset`: one source's split, with its indices.
#[derive(Clone, Debug)]
pub struct GptDataset {
    pub source: usize,
    pub split: Split,
    /// The `num_samples` it was built for (`None`: one epoch).
    pub num_samples: Option<u64>,
    pub params: GptParams,
    pub index: GptIndex,
    /// The source's sequence lengths (shared by its splits).
    pub lengths: Arc<[i32]>,
}

impl GptDataset {
    pub fn len(&self) -> u64 {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The pieces of sample `idx`, appended to `out.pieces`; sets `out.pad`.
    pub fn sample_into(&self, idx: u64, out: &mut Sample) -> Result<(), MegatronError> {
        let len = self.len();
        if idx >= len {
            return Err(MegatronError::IndexOutOfRange {
                split: self.split.name(),
                index: idx,
                len,
            });
        }
        let extra = self.params.add_extra_token_to_sequence as i64;
        let row = self.index.shuffle_index.get(idx as usize) as usize;
        let (beg, beg_off) = self.index.sample_index.row(row);
        let (end, end_off) = self.index.sample_index.row(row + 1);
        let doc = |i: i64| self.index.document_index[i as usize] as u64;
        let seq_len = |s: u64| i64::from(self.lengths[s as usize]);
        let mut push = |sequence: u64, offset: i64, length: i64| {
            out.pieces.push(Piece {
                source: self.source,
                sequence,
                offset: offset as u64,
                length: length.max(0) as u64,
            })
        };
        if beg == end {
            push(doc(beg), beg_off, end_off - beg_off + extra);
        } else {
            for i in beg..=end {
                let s = doc(i);
                let offset = if i > beg { 0 } else { beg_off };
                let length = if i < end {
                    seq_len(s) - offset
                } else {
                    end_off + extra
                };
                push(s, offset, length);
            }
        }
        let got: u64 = out.pieces.iter().map(|p| p.length).sum();
        out.pad = self.params.sample_tokens().saturating_sub(got);
        Ok(())
    }
}

/// A `BlendedDataset` over GPT datasets of one split.
#[derive(Clone, Debug)]
pub struct BlendedDataset {
    pub datasets: Vec<GptDataset>,
    /// The weights as Megatron keeps them (normalized for a sized blend, counts otherwise).
    pub weights: Vec<f64>,
    pub size: Option<u64>,
    pub indices: BlendingIndices,
}

impl BlendedDataset {
    pub fn len(&self) -> u64 {
        self.indices.dataset.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What Megatron returns for a split: a GPT dataset or a blend of them.
#[derive(Clone, Debug)]
pub enum TopLevel {
    Gpt(GptDataset),
    Blended(BlendedDataset),
}

impl TopLevel {
    pub fn len(&self) -> u64 {
        match self {
            TopLevel::Gpt(d) => d.len(),
            TopLevel::Blended(b) => b.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn split(&self) -> Split {
        match self {
            TopLevel::Gpt(d) => d.split,
            TopLevel::Blended(b) => b.datasets[0].split,
        }
    }

    /// Tokens a sample holds, padding included: `sequence_length` (+1).
    pub fn sample_tokens(&self) -> u64 {
        match self {
            TopLevel::Gpt(d) => d.params.sample_tokens(),
            TopLevel::Blended(b) => b.datasets[0].params.sample_tokens(),
        }
    }

    /// What sample `idx` is made of (`out` is cleared first).
    pub fn sample_into(&self, idx: u64, out: &mut Sample) -> Result<(), MegatronError> {
        out.pieces.clear();
        out.dataset_id = None;
        out.pad = 0;
        match self {
            TopLevel::Gpt(d) => d.sample_into(idx, out),
            TopLevel::Blended(b) => {
                let len = b.len();
                if idx >= len {
                    return Err(MegatronError::IndexOutOfRange {
                        split: self.split().name(),
                        index: idx,
                        len,
                    });
                }
                let d = b.indices.dataset[idx as usize];
                out.dataset_id = Some(d);
                b.datasets[d as usize].sample_into(b.indices.sample[idx as usize] as u64, out)
            }
        }
    }

    pub fn sample(&self, idx: u64) -> Result<Sample, MegatronError> {
        let mut s = Sample::default();
        self.sample_into(idx, &mut s)?;
        Ok(s)
    }
}
