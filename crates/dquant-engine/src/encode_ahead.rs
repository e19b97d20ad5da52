//! Compressing a session's next batches on the worker pool while the session reads more.
//!
//! One session that compresses on its own thread is bound by that thread: in the lab,
//! `auto+zstd:1` filled 69–78% of the link while the producing thread was 85–90% busy, and a
//! BlueField has 8 to 16 cores. [`EncodeAhead`] takes batches from the pipeline up to
//! `window` ahead of the one being delivered, hands each to the [`WorkerPool`] to encode, and
//! gives them back strictly in order. Reading and packing stay on the session's thread (the
//! pipeline is one stream); compression, the costly part, spreads over the pool.
//!
//! Nothing changes for the consumer: the same records, in the same order. A batch the
//! pipeline fails on is queued as its error, behind the batches before it, so they are
//! delivered first, exactly as without workers. Memory: at most `window` batches (tokens and
//! encoded payload) besides the transport's prefetch; the caller sizes `window` from its
//! prefetch budget.

use std::collections::VecDeque;
use std::sync::mpsc;
use std::sync::Arc;

use dquant_codec::{Codec, Width};
use dquant_plan::{Cursor, DocStarts, Origins, WireCodec};
use dquant_wire::BatchHeader;

use crate::batch::BatchInfo;
use crate::batch::Trailer;
use crate::pipeline::Pipeline;
use crate::record::{batch_header, checked_codec};
use crate::worker_pool::WorkerPool;
use crate::EngineError;

/// A batch encoded ahead, in order.
pub struct Encoded {
    /// Its header; `payload_len` counts the encoded tokens alone (no cursor trailer yet).
    pub header: BatchHeader,
    pub payload: Vec<u8>,
    /// The cursor once it is consumed (its `blend` is the batch's cursor trailer).
    pub cursor: Cursor,
    /// Its document starts, when the plan has boundaries.
    pub docs: Option<DocStarts>,
    /// Its origins, when the plan has provenance.
    pub origins: Option<Origins>,
    /// Tokens in the batch.
    pub tokens: u64,
    /// The batch's tokens, kept to be reused for a later batch.
    buf: Vec<u32>,
}

impl Encoded {
    /// What its record's trailer carries.
    pub fn trailer(&self) -> Trailer<'_> {
        Trailer {
            docs: self.docs.as_ref(),
            origins: self.origins.as_ref(),
            blend: &self.cursor.blend,
        }
    }
}

/// A batch in flight: its encoding's result to come, or the error the pipeline gave.
enum Ahead {
    Job {
        index: u64,
        result: mpsc::Receiver<Result<Encoded, EngineError>>,
    },
    Failed(EngineError),
}

/// Encodes a pipeline's batches on a pool, up to `window` ahead, delivered in order.
pub struct EncodeAhead {
    pool: Arc<WorkerPool>,
    wire: WireCodec,
    /// No token of the plan's sources exceeds this (fit checks that cannot fail are skipped).
    bound: u32,
    sample_len: usize,
    window: usize,
    queue: VecDeque<Ahead>,
    /// Buffers of delivered batches, for the next ones.
    spare: Vec<(Vec<u32>, Vec<u8>)>,
    /// The pipeline has no more batches (or failed): take none.
    ended: bool,
}

impl EncodeAhead {
    /// Encodes batches in `wire` on `pool`, at most `window` (≥ 1) ahead; `bound` is the
    /// pipeline's [`max_token_bound`](Pipeline::max_token_bound).
    pub fn new(
        pool: Arc<WorkerPool>,
        wire: WireCodec,
        bound: u32,
        sample_len: usize,
        window: usize,
    ) -> Self {
        EncodeAhead {
            pool,
            wire,
            bound,
            sample_len,
            window: window.max(1),
            queue: VecDeque::new(),
            spare: Vec::new(),
            ended: false,
        }
    }

    /// Takes batches from `pipeline` (each checked to fit `width`, the consumer's dtype, and
    /// the wire codec) until `window` are in flight or the stream ends or fails.
    pub fn fill(&mut self, pipeline: &mut Pipeline, width: Width) {
        while !self.ended && self.queue.len() < self.window {
            let next = pipeline.next_batch_checked(width).and_then(|b| match b {
                None => Ok(None),
                Some(b) => {
                    let codec = checked_codec(self.wire, self.bound, &b, self.sample_len)?;
                    let (mut buf, payload) = self.spare.pop().unwrap_or_default();
                    buf.clear();
                    buf.extend_from_slice(b.tokens);
                    Ok(Some((codec, b.info(), buf, payload)))
                }
            });
            match next {
                Ok(Some((codec, info, buf, payload))) => self.spawn(codec, info, buf, payload),
                Ok(None) => self.ended = true,
                Err(e) => {
                    self.queue.push_back(Ahead::Failed(e));
                    self.ended = true;
                }
            }
        }
    }

    /// Hands batch `info` (its tokens in `buf`) to the pool to encode in `codec`.
    fn spawn(&mut self, codec: Codec, info: BatchInfo, buf: Vec<u32>, mut payload: Vec<u8>) {
        let index = info.index;
        let sample_len = self.sample_len;
        let result = self.pool.encode_job(move |enc| {
            enc.encode(codec, &buf, &mut payload)
                .map_err(|source| EngineError::Encode { index, source })
                .and_then(|()| batch_header(codec, &info, sample_len, payload.len()))
                .map(|header| Encoded {
                    header,
                    payload,
                    cursor: info.cursor,
                    docs: info.docs,
                    origins: info.origins,
                    tokens: buf.len() as u64,
                    buf,
                })
        });
        self.queue.push_back(Ahead::Job { index, result });
    }

    /// The next batch in order, once encoded; `None` after the last. An error is the
    /// pipeline's or the encoder's for that batch (the stream ends there).
    pub fn next_encoded(&mut self) -> Option<Result<Encoded, EngineError>> {
        Some(match self.queue.pop_front()? {
            Ahead::Failed(e) => Err(e),
            Ahead::Job { index, result } => result.recv().unwrap_or_else(|_| {
                Err(EngineError::Usage(format!(
                    "batch {index}: its encoding ended without a result (a worker thread failed)"
                )))
            }),
        })
    }

    /// Batches taken from the pipeline and not delivered yet (they come before any other).
    pub fn in_flight(&self) -> usize {
        self.queue.len()
    }

    /// Gives a delivered batch's buffers back for later batches.
    pub fn recycle(&mut self, e: Encoded) {
        if self.spare.len() < self.window {
            self.spare.push((e.buf, e.payload));
        }
    }
}
