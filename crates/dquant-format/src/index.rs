//! Sequence and document boundaries, the part of a dataset that is not token ids.
//!
//! We keep Megatron-Core's two-level model exactly, because a converted file must be
//! byte-identical to one Megatron writes: a *sequence* is a contiguous run of tokens (one entry
//! of `sequence_lengths`), and a *document* is a run of sequences (`document_indices`). Most
//! datasets have one sequence per document; Megatron's `add_document(tokens, lengths)` can
//! split a document into several.

use std::ops::Range;

use crate::error::FormatError;

/// Boundaries of sequences and documents over a token stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DocIndex {
    /// Token offset where each sequence starts, then the total token count
    /// (`sequences() + 1` entries, starting at 0, non-decreasing).
    seq_offsets: Vec<u64>,
    /// Sequence index at which each document starts, then the sequence count
    /// (`documents() + 1` entries; Megatron's `document_indices`).
    doc_seq: Vec<u64>,
}

impl DocIndex {
    /// Validates and builds an index.
    pub fn new(seq_offsets: Vec<u64>, doc_seq: Vec<u64>) -> Result<Self, FormatError> {
        let err = |m: String| Err(FormatError::Index(m));
        if seq_offsets.first() != Some(&0) {
            return err("sequence offsets must start at 0".into());
        }
        if let Some(i) = seq_offsets.windows(2).position(|w| w[1] < w[0]) {
            return err(format!(
                "sequence {} starts at token {} before sequence {} (token {})",
                i + 1,
                seq_offsets[i + 1],
                i,
                seq_offsets[i]
            ));
        }
        let n_seq = seq_offsets.len() as u64 - 1;
        if doc_seq.first() != Some(&0) {
            return err("document indices must start at 0".into());
        }
        if let Some(i) = doc_seq.windows(2).position(|w| w[1] < w[0]) {
            return err(format!(
                "document {} starts at sequence {} before document {} (sequence {})",
                i + 1,
                doc_seq[i + 1],
                i,
                doc_seq[i]
            ));
        }
        if doc_seq.last() != Some(&n_seq) {
            return err(format!(
                "document indices end at sequence {} but there are {n_seq} sequences",
                doc_seq.last().copied().unwrap_or(0)
            ));
        }
        Ok(DocIndex {
            seq_offsets,
            doc_seq,
        })
    }

    /// One sequence and one document holding all `tokens` (none if `tokens` is 0): what a raw
    /// token file without document markers means.
    pub fn single(tokens: u64) -> Self {
        let mut b = DocIndexBuilder::new();
        if tokens > 0 {
            b.push_document(tokens);
        }
        b.finish()
    }

    pub fn tokens(&self) -> u64 {
        *self.seq_offsets.last().unwrap_or(&0)
    }

    pub fn sequences(&self) -> usize {
        self.seq_offsets.len() - 1
    }

    pub fn documents(&self) -> usize {
        self.doc_seq.len() - 1
    }

    /// Sequence start offsets plus the total (`sequences() + 1` entries).
    pub fn seq_offsets(&self) -> &[u64] {
        &self.seq_offsets
    }

    /// Megatron's `document_indices` (`documents() + 1` entries).
    pub fn doc_seq(&self) -> &[u64] {
        &self.doc_seq
    }

    /// Tokens of sequence `i`.
    pub fn sequence_len(&self, i: usize) -> u64 {
        self.seq_offsets[i + 1] - self.seq_offsets[i]
    }

    /// Token range of document `d`.
    pub fn document(&self, d: usize) -> Range<u64> {
        self.seq_offsets[self.doc_seq[d] as usize]..self.seq_offsets[self.doc_seq[d + 1] as usize]
    }

    /// The offsets of the documents that start strictly inside `range` (after its first
    /// token, before its end), ascending and without repeats (empty documents start where
    /// the next one does). O(log documents + the starts found).
    pub fn starts_in(&self, range: Range<u64>) -> impl Iterator<Item = u64> + '_ {
        let docs = &self.doc_seq[..self.documents()];
        let start_of = |s: &u64| self.seq_offsets[*s as usize];
        let d0 = docs.partition_point(|s| start_of(s) <= range.start);
        let mut last = range.start;
        docs[d0..]
            .iter()
            .map(start_of)
            .take_while(move |&s| s < range.end)
            .filter(move |&s| {
                let new = s > last;
                last = s;
                new
            })
    }

    /// The runs of the tokens `range` inside documents, in order: `(document, offset into it,
    /// length)`, empty documents skipped. One search for the first document; the next ones
    /// follow it. Stops at the index's end: the lengths add up to less than the range then.
    pub fn pieces(&self, range: Range<u64>) -> impl Iterator<Item = (usize, u64, u64)> + '_ {
        let mut doc = self.locate(range.start).map(|(d, _)| d);
        let mut t = range.start;
        std::iter::from_fn(move || loop {
            let d = doc.filter(|&d| t < range.end && d < self.documents())?;
            let r = self.document(d);
            doc = Some(d + 1);
            let end = r.end.min(range.end);
            if end > t {
                let piece = (d, t - r.start, end - t);
                t = end;
                return Some(piece);
            }
        })
    }

    /// The document holding token `t`, and `t`'s offset inside it. Empty documents are
    /// skipped; `None` past the end.
    pub fn locate(&self, t: u64) -> Option<(usize, u64)> {
        if t >= self.tokens() {
            return None;
        }
        let seq = self.seq_offsets.partition_point(|&o| o <= t) - 1;
        let doc = self.doc_seq.partition_point(|&s| s <= seq as u64) - 1;
        Some((doc, t - self.document(doc).start))
    }
}

/// Builds a [`DocIndex`] incrementally while tokens stream past, in O(documents) memory.
#[derive(Clone, Debug)]
pub struct DocIndexBuilder {
    seq_offsets: Vec<u64>,
    doc_seq: Vec<u64>,
}

impl Default for DocIndexBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl DocIndexBuilder {
    pub fn new() -> Self {
        DocIndexBuilder {
            seq_offsets: vec![0],
            doc_seq: vec![0],
        }
    }

    /// Appends a sequence of `len` tokens to the current document.
    pub fn push_sequence(&mut self, len: u64) {
        let end = self.tokens() + len;
        self.seq_offsets.push(end);
    }

    /// Ends the current document (after the sequences pushed since the last one).
    pub fn end_document(&mut self) {
        self.doc_seq.push(self.seq_offsets.len() as u64 - 1);
    }

    /// A document of one sequence.
    pub fn push_document(&mut self, len: u64) {
        self.push_sequence(len);
        self.end_document();
    }

    pub fn tokens(&self) -> u64 {
        *self.seq_offsets.last().unwrap_or(&0)
    }

    /// The index. Sequences pushed since the last [`end_document`](Self::end_document) form a
    /// last document: every sequence belongs to a document (what [`DocIndex::new`] checks), so
    /// what a writer stores can be read back.
    pub fn finish(mut self) -> DocIndex {
        if self.doc_seq.last() != Some(&(self.seq_offsets.len() as u64 - 1)) {
            self.end_document();
        }
        DocIndex {
            seq_offsets: self.seq_offsets,
            doc_seq: self.doc_seq,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_and_locate() {
        let mut b = DocIndexBuilder::new();
        b.push_sequence(3);
        b.push_sequence(2);
        b.end_document();
        b.push_document(4);
        let ix = b.finish();
        assert_eq!(ix.seq_offsets(), &[0, 3, 5, 9]);
        assert_eq!(ix.doc_seq(), &[0, 2, 3]);
        assert_eq!(ix.documents(), 2);
        assert_eq!(ix.document(1), 5..9);
        assert_eq!(ix.locate(4), Some((0, 4)));
        assert_eq!(ix.locate(5), Some((1, 0)));
        assert_eq!(ix.locate(9), None);
        assert_eq!(
            DocIndex::new(ix.seq_offsets().to_vec(), ix.doc_seq().to_vec()).unwrap(),
            ix
        );
        assert_eq!(DocIndex::single(0).documents(), 0);
        assert_eq!(DocIndex::single(7).document(0), 0..7);
    }

    #[test]
    fn starts_inside_a_range() {
        // Documents at 0, 3 (two sequences: 3..5, 5..6), an empty one at 6, then 6 and 10.
        let ix = DocIndex::new(vec![0, 3, 5, 6, 6, 10, 12], vec![0, 1, 3, 3, 4, 5, 6]).unwrap();
        let starts = |r: std::ops::Range<u64>| ix.starts_in(r).collect::<Vec<_>>();
        assert_eq!(starts(0..12), [3, 6, 10]);
        assert_eq!(starts(3..7), [6]);
        assert_eq!(starts(2..4), [3]);
        assert_eq!(starts(6..10), Vec::<u64>::new());
        assert_eq!(starts(4..5), Vec::<u64>::new());
        assert_eq!(starts(9..12), [10]);
    }

    #[test]
    fn pieces_of_a_range_skip_empty_documents_and_stop_at_the_end() {
        // Documents 0..3, 3..6, two empty ones at 6, then 6..10 and 10..12.
        let ix = DocIndex::new(vec![0, 3, 5, 6, 6, 10, 12], vec![0, 1, 3, 3, 4, 5, 6]).unwrap();
        let pieces = |r: std::ops::Range<u64>| ix.pieces(r).collect::<Vec<_>>();
        assert_eq!(pieces(2..11), [(0, 2, 1), (1, 0, 3), (4, 0, 4), (5, 0, 1)]);
        assert_eq!(pieces(4..6), [(1, 1, 2)]);
        assert_eq!(pieces(0..12).iter().map(|p| p.2).sum::<u64>(), 12);
        assert_eq!(pieces(11..14), [(5, 1, 1)]);
        assert_eq!(pieces(5..5), []);
        assert_eq!(pieces(12..13), []);
    }

    #[test]
    fn invalid_indices_are_named() {
        assert_eq!(
            DocIndex::new(vec![0, 5, 3], vec![0, 2])
                .unwrap_err()
                .to_string(),
            "invalid document index: sequence 2 starts at token 3 before sequence 1 (token 5)"
        );
        assert_eq!(
            DocIndex::new(vec![0, 5], vec![0, 2])
                .unwrap_err()
                .to_string(),
            "invalid document index: document indices end at sequence 2 but there are 1 sequences"
        );
    }
}
