//! What a reader hands out: a batch borrowed until the next call ([`Batch`]), or one that
//! owns its memory ([`OwnedBatch`]), both typed views of the tokens in the plan's output
//! dtype, never copies of them.
//!
//! Every batch is a record in memory: a ring slot the agent wrote (shared memory), or a
//! [`HeapRecord`] the batch was made or decoded into (in-process, TCP). Heap records come
//! from a small pool and go back to it when the batch is dropped, so a reader reuses a few
//! buffers rather than allocating one per batch.

use std::ops::Deref;
use std::sync::{Arc, Mutex, PoisonError};

use dquant_plan::{Cursor, DocStarts, Origins, OutputDType};
use dquant_transport::record::RECORD_HEADER_LEN;
use dquant_transport::RecordView;

/// One batch, borrowed from the reader: `samples × sample_len` tokens, row-major.
#[derive(Debug)]
pub struct Batch<'a> {
    /// Index of this batch in the rank's stream.
    pub index: u64,
    pub samples: usize,
    /// `seq_len + 1`.
    pub sample_len: usize,
    pub tokens: Tokens<'a>,
    /// Where documents start inside each sample, when the plan has `boundaries`: expand
    /// them with [`DocStarts::position_ids`], [`DocStarts::loss_mask`] and
    /// [`DocStarts::cu_seqlens`].
    pub docs: Option<&'a DocStarts>,
    /// Each sample's origins (source documents and the runs of tokens in them), when the
    /// plan has `provenance`.
    pub origins: Option<&'a Origins>,
}

/// A batch's tokens in the plan's output dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tokens<'a> {
    U16(&'a [u16]),
    I32(&'a [i32]),
    I64(&'a [i64]),
}

impl Tokens<'_> {
    /// The raw little-endian bytes, as [`crate::Reader::read`] delivers them.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Tokens::U16(t) => bytemuck::cast_slice(t),
            Tokens::I32(t) => bytemuck::cast_slice(t),
            Tokens::I64(t) => bytemuck::cast_slice(t),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Tokens::U16(t) => t.len(),
            Tokens::I32(t) => t.len(),
            Tokens::I64(t) => t.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Views `bytes` (8-byte aligned: records start on 8-byte boundaries and their 48-byte
/// header keeps the payload there) as tokens of `output`.
pub(crate) fn tokens_of(output: OutputDType, bytes: &[u8]) -> Tokens<'_> {
    match output {
        OutputDType::U16 => Tokens::U16(bytemuck::cast_slice(bytes)),
        OutputDType::I32 => Tokens::I32(bytemuck::cast_slice(bytes)),
        OutputDType::I64 => Tokens::I64(bytemuck::cast_slice(bytes)),
    }
}

/// A batch that owns its memory: unlike [`Batch`], it may outlive later batches and the
/// reader, move to other threads, and be dropped in any order (a Python array is one). Its
/// tokens are where the batch was made, never copied for the hand-over: the ring slot the
/// agent wrote over shared memory (see [`dquant_transport::ring::RingConsumer`] on how long
/// kept views pin it), or the buffer the batch was assembled or decoded into, which goes back
/// to the reader's pool when the batch is dropped.
pub struct OwnedBatch {
    /// Index of this batch in the rank's stream.
    pub index: u64,
    pub samples: usize,
    /// `seq_len + 1`.
    pub sample_len: usize,
    pub output: OutputDType,
    /// Where a resumed reader continues after this batch.
    pub cursor: Cursor,
    /// Where documents start inside each sample, when the plan has `boundaries`.
    pub docs: Option<DocStarts>,
    /// Each sample's origins, when the plan has `provenance`.
    pub origins: Option<Origins>,
    pub(crate) record: RecordView,
    /// Payload bytes after the record header.
    pub(crate) len: usize,
    pub(crate) in_ring: bool,
}

impl OwnedBatch {
    /// The tokens' little-endian bytes (`samples × sample_len × itemsize`).
    pub fn bytes(&self) -> &[u8] {
        &self.record[RECORD_HEADER_LEN..][..self.len]
    }

    /// The tokens in the plan's output dtype, row-major.
    pub fn tokens(&self) -> Tokens<'_> {
        tokens_of(self.output, self.bytes())
    }

    /// Whether the tokens live in a shared-memory ring slot (else in a heap buffer).
    pub fn in_ring(&self) -> bool {
        self.in_ring
    }
}

impl std::fmt::Debug for OwnedBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedBatch")
            .field("index", &self.index)
            .field("samples", &self.samples)
            .field("sample_len", &self.sample_len)
            .field("output", &self.output)
            .field("cursor", &self.cursor)
            .field("in_ring", &self.in_ring())
            .finish()
    }
}

/// Buffers of u64 words (so every output dtype is aligned) for heap records.
#[derive(Clone, Default)]
pub(crate) struct RecordPool(Arc<Mutex<Vec<Vec<u64>>>>);

/// Buffers a reader's pool keeps for reuse.
const POOL_KEEP: usize = 4;

impl RecordPool {
    /// A record of `len` bytes (contents unspecified), from the pool when it has a buffer.
    pub fn get(&self, len: usize) -> HeapRecord {
        let mut words = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
            .unwrap_or_default();
        words.resize(len.div_ceil(8), 0);
        HeapRecord {
            words,
            len,
            pool: self.clone(),
        }
    }
}

/// A record in a pooled heap buffer; the buffer goes back to the pool when it drops.
pub(crate) struct HeapRecord {
    words: Vec<u64>,
    len: usize,
    pool: RecordPool,
}

impl HeapRecord {
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut::<u64, u8>(&mut self.words)[..self.len]
    }

    /// Shortens the record to `len` bytes.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}

impl Deref for HeapRecord {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &bytemuck::cast_slice::<u64, u8>(&self.words)[..self.len]
    }
}

impl Drop for HeapRecord {
    fn drop(&mut self) {
        let mut p = self.pool.0.lock().unwrap_or_else(PoisonError::into_inner);
        if p.len() < POOL_KEEP {
            p.push(std::mem::take(&mut self.words));
        }
    }
}
