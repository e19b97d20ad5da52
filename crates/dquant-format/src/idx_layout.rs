//! A Megatron `.idx` written a byte range at a time, from slices of its document index.
//!
//! `dquant mount` shows every dataset as a Megatron prefix. Its `.idx` for a 100 M-document
//! corpus is over 2 GB, and the mount must neither hold it nor build it up front. So the file
//! is laid out from three counts alone ([`IdxLayout`]: its length, where each array starts),
//! and any byte range of it is rendered from just the index values that range covers,
//! fetched through a callback. The bytes are [`encode_idx`](crate::megatron::encode_idx)'s,
//! range for range; the tests hold that.

use std::ops::Range;

use crate::dtype::DType;
use crate::error::FormatError;
use crate::megatron::{HEADER_LEN, MAGIC, VERSION};

/// Which values of a document index a range of the file needs (the two arrays of
/// [`DocIndex`](crate::DocIndex)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdxPart {
    /// Token offset where each sequence starts, then the token count (sequences + 1).
    SequenceOffsets,
    /// Sequence where each document starts, then the sequence count (documents + 1).
    DocumentSequences,
}

/// The shape of a Megatron `.idx`: its dtype code and the lengths of its arrays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdxLayout {
    dtype: DType,
    sequences: u64,
    /// Entries of `document_indices`: documents + 1.
    doc_entries: u64,
}

/// Bytes per entry of `sequence_lengths` (i32), and of `sequence_pointers` and
/// `document_indices` (i64).
const LEN_BYTES: u64 = 4;
const WORD_BYTES: u64 = 8;

impl IdxLayout {
    pub fn new(dtype: DType, sequences: u64, documents: u64) -> Self {
        IdxLayout {
            dtype,
            sequences,
            doc_entries: documents + 1,
        }
    }

    /// The file's length in bytes.
    pub fn len(&self) -> u64 {
        self.pointers_at() + WORD_BYTES * (self.sequences + self.doc_entries)
    }

    /// Never: even an empty index has its header.
    pub fn is_empty(&self) -> bool {
        false
    }

    fn lengths_at(&self) -> u64 {
        HEADER_LEN as u64
    }

    fn pointers_at(&self) -> u64 {
        self.lengths_at() + LEN_BYTES * self.sequences
    }

    fn documents_at(&self) -> u64 {
        self.pointers_at() + WORD_BYTES * self.sequences
    }

    fn header(&self) -> Vec<u8> {
        let mut h = Vec::with_capacity(HEADER_LEN);
        h.extend_from_slice(MAGIC);
        h.extend_from_slice(&VERSION.to_le_bytes());
        h.push(self.dtype.code());
        h.extend_from_slice(&self.sequences.to_le_bytes());
        h.extend_from_slice(&self.doc_entries.to_le_bytes());
        h
    }

    /// Appends the bytes of `range` (clamped to the file) to `out`. `values(part, r)` gives
    /// the values `r` of one part of the index, exactly `r`'s length of them; it is called
    /// at most once per array the range touches, for only the entries the range covers.
    pub fn render<E: From<FormatError>>(
        &self,
        range: Range<u64>,
        out: &mut Vec<u8>,
        mut values: impl FnMut(IdxPart, Range<u64>) -> Result<Vec<u64>, E>,
    ) -> Result<(), E> {
        let range = range.start.min(self.len())..range.end.min(self.len());
        let header = 0..HEADER_LEN as u64;
        copy_overlap(&self.header(), header.start, &range, out);
        // sequence_lengths[i] = offsets[i + 1] - offsets[i]
        if let Some(e) = self.entries(&range, self.lengths_at(), LEN_BYTES, self.sequences) {
            let v = values(IdxPart::SequenceOffsets, e.start..e.end + 1)?;
            let bytes = encode_lengths(&v, e.start)?;
            copy_overlap(&bytes, self.lengths_at() + LEN_BYTES * e.start, &range, out);
        }
        // sequence_pointers[i] = offsets[i] * itemsize
        if let Some(e) = self.entries(&range, self.pointers_at(), WORD_BYTES, self.sequences) {
            let item = self.dtype.itemsize() as u64;
            let v = values(IdxPart::SequenceOffsets, e.clone())?;
            let bytes = encode_words(v.iter().map(|o| o.saturating_mul(item)));
            copy_overlap(
                &bytes,
                self.pointers_at() + WORD_BYTES * e.start,
                &range,
                out,
            );
        }
        if let Some(e) = self.entries(&range, self.documents_at(), WORD_BYTES, self.doc_entries) {
            let v = values(IdxPart::DocumentSequences, e.clone())?;
            let bytes = encode_words(v.into_iter());
            copy_overlap(
                &bytes,
                self.documents_at() + WORD_BYTES * e.start,
                &range,
                out,
            );
        }
        Ok(())
    }

    /// The entries of the array at `at` (`count` entries of `size` bytes) that `range`
    /// overlaps, if any.
    fn entries(&self, range: &Range<u64>, at: u64, size: u64, count: u64) -> Option<Range<u64>> {
        let end = at + size * count;
        let (lo, hi) = (range.start.max(at), range.end.min(end));
        (lo < hi).then(|| (lo - at) / size..(hi - at).div_ceil(size))
    }
}

/// `sequence_lengths` entries from `first` on, from the offsets around them.
fn encode_lengths(offsets: &[u64], first: u64) -> Result<Vec<u8>, FormatError> {
    let mut out = Vec::with_capacity(4 * offsets.len());
    for (i, w) in offsets.windows(2).enumerate() {
        let seq = first + i as u64;
        let len = w[1].checked_sub(w[0]).ok_or_else(|| {
            FormatError::Index(format!(
                "sequence {} starts at token {} before sequence {seq} (token {})",
                seq + 1,
                w[1],
                w[0]
            ))
        })?;
        let len = i32::try_from(len).map_err(|_| FormatError::Unrepresentable {
            what: format!("sequence {seq} ({len} tokens)"),
            detail: "Megatron stores sequence lengths as int32".into(),
        })?;
        out.extend_from_slice(&len.to_le_bytes());
    }
    Ok(out)
}

fn encode_words(values: impl Iterator<Item = u64>) -> Vec<u8> {
    values.flat_map(|v| (v as i64).to_le_bytes()).collect()
}

/// Appends the part of `bytes` (which sit at file offset `at`) that falls inside `range`.
fn copy_overlap(bytes: &[u8], at: u64, range: &Range<u64>, out: &mut Vec<u8>) {
    let end = at + bytes.len() as u64;
    let (lo, hi) = (range.start.max(at), range.end.min(end));
    if lo < hi {
        out.extend_from_slice(&bytes[(lo - at) as usize..(hi - at) as usize]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::megatron::encode_idx;
    use crate::{DocIndex, DocIndexBuilder};

    fn sample() -> DocIndex {
        let mut b = DocIndexBuilder::new();
        for d in 0..7u64 {
            for s in 0..(d % 3 + 1) {
                b.push_sequence(5 + 3 * d + s);
            }
            b.end_document();
        }
        b.push_document(0);
        b.finish()
    }

    fn render_all(layout: &IdxLayout, ix: &DocIndex, range: Range<u64>) -> (Vec<u8>, usize) {
        let mut out = Vec::new();
        let mut calls = 0;
        layout
            .render::<FormatError>(range, &mut out, |part, r| {
                calls += 1;
                let all = match part {
                    IdxPart::SequenceOffsets => ix.seq_offsets(),
                    IdxPart::DocumentSequences => ix.doc_seq(),
                };
                Ok(all[r.start as usize..r.end as usize].to_vec())
            })
            .unwrap();
        (out, calls)
    }

    #[test]
    fn every_range_equals_the_encoded_file() {
        let ix = sample();
        for dt in [DType::U16, DType::I32] {
            let whole = encode_idx(dt, &ix).unwrap();
            let layout = IdxLayout::new(dt, ix.sequences() as u64, ix.documents() as u64);
            assert_eq!(layout.len(), whole.len() as u64);
            let n = whole.len() as u64;
            for start in 0..n {
                for end in start..=n {
                    let (got, calls) = render_all(&layout, &ix, start..end);
                    assert_eq!(got, &whole[start as usize..end as usize], "{start}..{end}");
                    assert!(calls <= 3);
                }
            }
            // Past the end: clamped.
            assert_eq!(
                render_all(&layout, &ix, n - 3..n + 100).0,
                &whole[n as usize - 3..]
            );
            assert!(render_all(&layout, &ix, n + 1..n + 9).0.is_empty());
        }
    }

    #[test]
    fn fetches_only_the_entries_a_range_covers() {
        let ix = sample();
        let layout = IdxLayout::new(DType::U16, ix.sequences() as u64, ix.documents() as u64);
        let mut asked = Vec::new();
        let mut out = Vec::new();
        // Bytes 4..8 of sequence_lengths: entry 1, which needs offsets 1 and 2.
        let at = HEADER_LEN as u64 + 4;
        layout
            .render::<FormatError>(at..at + 4, &mut out, |p, r| {
                asked.push((p, r.clone()));
                Ok(ix.seq_offsets()[r.start as usize..r.end as usize].to_vec())
            })
            .unwrap();
        assert_eq!(asked, vec![(IdxPart::SequenceOffsets, 1..3)]);
        assert_eq!(out, (ix.sequence_len(1) as i32).to_le_bytes());
    }

    #[test]
    fn offsets_that_go_back_are_refused() {
        let layout = IdxLayout::new(DType::U16, 2, 1);
        let at = HEADER_LEN as u64;
        let err = layout
            .render::<FormatError>(at..at + 8, &mut Vec::new(), |_, _| Ok(vec![0, 9, 4]))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid document index: sequence 2 starts at token 4 before sequence 1 (token 9)"
        );
    }
}
