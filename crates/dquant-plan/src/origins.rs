//! Where each sample of a batch came from, in the sources' documents: the data of a plan's
//! `provenance = true`, shipped in the batch record's trailer through every transport.
//!
//! A sample's `seq_len + 1` tokens are runs inside consecutive documents of one source (packing
//! crosses document boundaries). Each run is a *piece*: its document's index in the source
//! dataset and its length; only the first piece can start inside its document, so a sample
//! holds one offset. `dquant locate` prints the same pieces, computed from the plan alone.

/// The pieces of every sample of a batch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Origins {
    /// `samples + 1` entries: sample `k`'s pieces are `offsets[k]..offsets[k + 1]`.
    offsets: Vec<u32>,
    /// Per sample: its source's index in the plan.
    sources: Vec<u32>,
    /// Per sample: the token offset of its first piece inside that piece's document.
    first_offsets: Vec<u64>,
    /// Per piece: the document's index in its source dataset.
    documents: Vec<u64>,
    /// Per piece: its tokens.
    lengths: Vec<u32>,
}

/// One run of a sample's tokens inside one document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OriginPiece {
    /// The source's index in the plan.
    pub source: u32,
    /// The document's index in the source dataset.
    pub document: u64,
    /// The run's first token inside the document.
    pub offset: u64,
    /// Tokens in the run.
    pub length: u32,
}

/// The columns of [`Origins`]: per sample its piece count, source and offset into its first
/// piece's document; per piece its document and length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OriginParts<'a> {
    /// Per sample: its pieces.
    pub counts: Vec<u32>,
    /// Per sample: its source.
    pub sources: &'a [u32],
    /// Per sample: the offset into its first piece's document.
    pub first_offsets: &'a [u64],
    /// Per piece: its document.
    pub documents: &'a [u64],
    /// Per piece: its tokens.
    pub lengths: &'a [u32],
}

/// Why a batch's origins were refused (a corrupt or hostile peer sent them).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("provenance: {0}")]
pub struct OriginsError(pub String);

impl Origins {
    /// No samples yet.
    pub fn new() -> Self {
        Origins {
            offsets: vec![0],
            ..Default::default()
        }
    }

    /// Empties it, keeping its memory.
    pub fn clear(&mut self) {
        self.offsets.clear();
        self.offsets.push(0);
        self.sources.clear();
        self.first_offsets.clear();
        self.documents.clear();
        self.lengths.clear();
    }

    /// Adds the next sample: from `source`, starting `first_offset` tokens into the first of
    /// `pieces` (`(document, length)` in order).
    pub fn push_sample(
        &mut self,
        source: u32,
        first_offset: u64,
        pieces: impl IntoIterator<Item = (u64, u32)>,
    ) {
        for (doc, len) in pieces {
            self.documents.push(doc);
            self.lengths.push(len);
        }
        self.sources.push(source);
        self.first_offsets.push(first_offset);
        self.offsets.push(self.documents.len() as u32);
    }

    /// Samples held.
    pub fn samples(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Pieces held, all samples together.
    pub fn pieces(&self) -> usize {
        self.documents.len()
    }

    /// Sample `k`'s pieces, in order.
    ///
    /// # Panics
    /// If `k >= samples()`.
    pub fn sample(&self, k: usize) -> impl Iterator<Item = OriginPiece> + '_ {
        let range = self.offsets[k] as usize..self.offsets[k + 1] as usize;
        let (source, first) = (self.sources[k], range.start);
        range.map(move |i| OriginPiece {
            source,
            document: self.documents[i],
            offset: if i == first { self.first_offsets[k] } else { 0 },
            length: self.lengths[i],
        })
    }

    /// Its columns, as a batch record carries them.
    pub fn parts(&self) -> OriginParts<'_> {
        OriginParts {
            counts: self.offsets.windows(2).map(|w| w[1] - w[0]).collect(),
            sources: &self.sources,
            first_offsets: &self.first_offsets,
            documents: &self.documents,
            lengths: &self.lengths,
        }
    }

    /// Rebuilds origins from a peer's parts, checking that they fit together and that every
    /// sample's pieces add up to `sample_len` tokens, each piece at least one.
    pub fn from_parts(
        sample_len: u32,
        counts: &[u32],
        sources: Vec<u32>,
        first_offsets: Vec<u64>,
        documents: Vec<u64>,
        lengths: Vec<u32>,
    ) -> Result<Self, OriginsError> {
        let bad = |m: String| Err(OriginsError(m));
        let n = counts.len();
        if sources.len() != n || first_offsets.len() != n {
            return bad(format!(
                "{n} samples, but {} sources and {} offsets",
                sources.len(),
                first_offsets.len()
            ));
        }
        if documents.len() != lengths.len() {
            return bad(format!(
                "{} documents but {} lengths",
                documents.len(),
                lengths.len()
            ));
        }
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0u32);
        let mut at = 0usize;
        for (k, &c) in counts.iter().enumerate() {
            let end = at.saturating_add(c as usize);
            let Some(run) = lengths.get(at..end) else {
                return bad(format!(
                    "sample {k}'s {c} pieces run past the {} sent",
                    lengths.len()
                ));
            };
            let total: u64 = run.iter().map(|&l| u64::from(l)).sum();
            if c == 0 || run.contains(&0) || total != u64::from(sample_len) {
                return bad(format!(
                    "sample {k}'s {c} pieces hold {total} tokens; a sample holds {sample_len}, in pieces of at least one"
                ));
            }
            at = end;
            offsets.push(at as u32);
        }
        if at != lengths.len() {
            return bad(format!(
                "{} pieces sent, the samples count {at}",
                lengths.len()
            ));
        }
        Ok(Origins {
            offsets,
            sources,
            first_offsets,
            documents,
            lengths,
        })
    }
}

/// Bytes of a batch record's provenance section at most, for batches of `batch_size` samples
/// of `seq_len + 1` tokens: an 8-byte head, 16 bytes a sample, and 12 a piece, when every
/// token is a document of its own; padded to 8 bytes. What a producer reserves room for.
pub fn origin_section_bound(batch_size: u32, seq_len: u32) -> u64 {
    let samples = u64::from(batch_size);
    let pieces = samples * (u64::from(seq_len) + 1);
    (8 + 16 * samples + 12 * pieces).div_ceil(8) * 8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_round_trip_through_parts_and_bad_parts_are_named() {
        let mut o = Origins::new();
        o.push_sample(1, 7, [(4, 3), (5, 2)]);
        o.push_sample(0, 0, [(9, 5)]);
        let got: Vec<OriginPiece> = o.sample(0).collect();
        assert_eq!(
            got,
            [
                OriginPiece {
                    source: 1,
                    document: 4,
                    offset: 7,
                    length: 3
                },
                OriginPiece {
                    source: 1,
                    document: 5,
                    offset: 0,
                    length: 2
                },
            ]
        );
        let p = o.parts();
        assert_eq!(p.counts, [2, 1]);
        let (s, f, d, l) = (p.sources, p.first_offsets, p.documents, p.lengths);
        let back =
            Origins::from_parts(5, &p.counts, s.to_vec(), f.to_vec(), d.to_vec(), l.to_vec());
        assert_eq!(back.unwrap(), o);
        let err = |counts: &[u32], lengths: Vec<u32>| {
            let n = counts.len();
            Origins::from_parts(
                5,
                counts,
                vec![0; n],
                vec![0; n],
                vec![0; lengths.len()],
                lengths,
            )
            .unwrap_err()
            .to_string()
        };
        assert_eq!(
            err(&[2], vec![3, 3]),
            "provenance: sample 0's 2 pieces hold 6 tokens; a sample holds 5, in pieces of at least one"
        );
        assert_eq!(
            err(&[1, 1], vec![5]),
            "provenance: sample 1's 1 pieces run past the 1 sent"
        );
        assert_eq!(
            err(&[1], vec![5, 5]),
            "provenance: 2 pieces sent, the samples count 1"
        );
        assert_eq!(
            err(&[2], vec![5, 0]),
            "provenance: sample 0's 2 pieces hold 5 tokens; a sample holds 5, in pieces of at least one"
        );
        assert_eq!(origin_section_bound(1, 1), 8 + 16 + 24);
    }
}
