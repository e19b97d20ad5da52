//! A batch as the pipeline hands it out: its tokens borrowed (`TokenBatch`) and where it sits
//! in the stream (`BatchInfo`).
//!
//! Apart from the pipeline so that what consumes a batch (fit checks, record encoding) depends
//! on these types and not on the pipeline that makes them.

use dquant_plan::{Cursor, DocStarts, Origins};

/// One batch of tokens, borrowed from the pipeline.
pub struct TokenBatch<'a> {
    /// Index of the batch in the rank's stream.
    pub index: u64,
    /// `samples × sample_len` tokens, row-major.
    pub tokens: &'a [u32],
    pub samples: usize,
    /// The cursor once this batch is consumed.
    pub cursor: Cursor,
    /// For each sample: its source and the source offset of its first token.
    pub provenance: &'a [(usize, u64)],
    /// The plan's source URIs, as the plan spelled them (for error messages).
    pub uris: &'a [String],
    /// Each sample's document starts, when the plan has boundaries.
    pub docs: Option<&'a DocStarts>,
    /// Each sample's origins, when the plan has `provenance`.
    pub origins: Option<&'a Origins>,
}

/// What a batch record's trailer carries after the tokens, borrowed from the batch
/// ([`crate::put_trailer`]): one list of the sections, so each kind of batch names them once.
#[derive(Clone, Copy, Debug)]
pub struct Trailer<'a> {
    /// The document starts, when the plan has boundaries.
    pub docs: Option<&'a DocStarts>,
    /// The origins, when the plan has provenance.
    pub origins: Option<&'a Origins>,
    /// The blend's counts at the cursor after the batch (empty for a single source).
    pub blend: &'a [u64],
}

impl TokenBatch<'_> {
    /// What its record's trailer carries.
    pub fn trailer(&self) -> Trailer<'_> {
        Trailer {
            docs: self.docs,
            origins: self.origins,
            blend: &self.cursor.blend,
        }
    }

    /// Where this batch sits in the stream.
    pub fn info(&self) -> BatchInfo {
        BatchInfo {
            index: self.index,
            samples: self.samples,
            cursor: self.cursor.clone(),
            docs: self.docs.cloned(),
            origins: self.origins.cloned(),
        }
    }
}

impl BatchInfo {
    /// What its record's trailer carries.
    pub fn trailer(&self) -> Trailer<'_> {
        Trailer {
            docs: self.docs.as_ref(),
            origins: self.origins.as_ref(),
            blend: &self.cursor.blend,
        }
    }
}

/// Where a batch written by [`Pipeline::next_batch_into`] sits in the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchInfo {
    pub index: u64,
    pub samples: usize,
    /// The cursor once this batch is consumed.
    pub cursor: Cursor,
    /// Each sample's document starts, when the plan has boundaries.
    pub docs: Option<DocStarts>,
    /// Each sample's origins, when the plan has `provenance`.
    pub origins: Option<Origins>,
}
