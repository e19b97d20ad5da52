//! The host API: a [`Reader`] that hands a plan's batches to the trainer.
//!
//! This crate provides the original design's `open(path, action, offload=false)` half: the
//! plan runs in-process ([`Reader::local`]), reading sources through `dquant-storage` and
//! laying each batch out in the plan's output dtype in one reused, 8-byte-aligned buffer.
//! [`Reader::next_batch`] lends that buffer as a typed slice (no copy); [`Reader::read`]
//! streams the same bytes into a caller's buffer, as the original `read(fd, buf)` did. The
//! offloaded path (an agent doing the same work near the data) produces byte-identical
//! batches for the same plan; it is built on this crate's types.

use std::path::Path;

use dquant_codec::kernels::store_plain;
use dquant_codec::{CodecError, Width};
use dquant_format::{DType, FormatError};
use dquant_plan::{Cursor, OutputDType, Plan, PlanError, RankIter, Schedule, SourceInfo};
use dquant_storage::{Dataset, OpenOptions, ReadBuffers, StorageError};

/// Errors of the host API.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Plan(#[from] PlanError),
    #[error("sources[{index}] ({uri}): {source}")]
    Source {
        index: usize,
        uri: String,
        #[source]
        source: StorageError,
    },
    /// A token does not fit the plan's output dtype (e.g. `u16` for a 100k vocabulary).
    #[error("sources[{index}] ({uri}): {source}")]
    Output {
        index: usize,
        uri: String,
        #[source]
        source: CodecError,
    },
}

/// One batch, borrowed from the reader's buffer: `samples × sample_len` tokens, row-major.
#[derive(Debug)]
pub struct Batch<'a> {
    /// Index of this batch in the rank's stream.
    pub index: u64,
    pub samples: usize,
    /// `seq_len + 1`.
    pub sample_len: usize,
    pub tokens: Tokens<'a>,
}

/// A batch's tokens in the plan's output dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tokens<'a> {
    U16(&'a [u16]),
    I32(&'a [i32]),
    I64(&'a [i64]),
}

impl Tokens<'_> {
    /// The raw little-endian bytes, as [`Reader::read`] delivers them.
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

fn output_width(o: OutputDType) -> Width {
    match o {
        OutputDType::U16 => Width::U16,
        OutputDType::I32 => Width::I32,
        OutputDType::I64 => Width::I64,
    }
}

/// Streams one rank's batches of a plan.
pub struct Reader {
    schedule: Schedule,
    iter: RankIter,
    uris: Vec<String>,
    sources: Vec<Dataset>,
    bufs: Vec<ReadBuffers>,
    output: OutputDType,
    sample_len: usize,
    /// Batch storage as u64 words, so every output dtype can be viewed without a copy.
    batch: Vec<u64>,
    batch_len: usize,
    batch_index: u64,
    samples_in_batch: usize,
    /// Bytes of the current batch already handed out by `read`.
    read_pos: usize,
    tokens: Vec<u32>,
    /// Position after the last batch fully handed out.
    cursor: Cursor,
}

impl Reader {
    /// Runs `plan` in this process, starting at `cursor` ([`Cursor::START`] for the beginning).
    /// Sources are local paths: Megatron prefixes, `.dqb` files, or raw files with a `dtype`.
    pub fn local(plan: &Plan, cursor: Cursor) -> Result<Self, ClientError> {
        plan.validate()?;
        let mut sources = Vec::new();
        for (index, s) in plan.sources.iter().enumerate() {
            let err = |source| ClientError::Source {
                index,
                uri: s.uri.clone(),
                source,
            };
            if s.uri.starts_with("dquant://") {
                return Err(err(StorageError::Usage(
                    "dquant:// sources are served by an agent; in-process mode reads local paths"
                        .into(),
                )));
            }
            let raw_dtype = match &s.dtype {
                Some(d) => Some(
                    d.parse::<DType>()
                        .map_err(|e: FormatError| err(StorageError::Usage(e.to_string())))?,
                ),
                None => None,
            };
            let opts = OpenOptions {
                raw_dtype,
                eod: s.eod,
            };
            sources.push(Dataset::open(Path::new(&s.uri), &opts).map_err(err)?);
        }
        let infos: Vec<SourceInfo> = sources
            .iter()
            .map(|d| SourceInfo { tokens: d.tokens() })
            .collect();
        let schedule = Schedule::new(plan, &infos)?;
        let iter = schedule.iter_rank(cursor)?;
        let start = iter.cursor();
        Ok(Reader {
            bufs: sources.iter().map(|_| ReadBuffers::new()).collect(),
            uris: plan.sources.iter().map(|s| s.uri.clone()).collect(),
            sources,
            output: plan.output,
            sample_len: plan.seq_len as usize + 1,
            schedule,
            iter,
            batch: Vec::new(),
            batch_len: 0,
            batch_index: 0,
            samples_in_batch: 0,
            read_pos: 0,
            tokens: Vec::new(),
            cursor: start,
        })
    }

    /// The plan's resolved schedule (sizes, samples per epoch, ...).
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Where a resumed reader would continue: after the last batch handed out whole.
    pub fn cursor(&self) -> Cursor {
        self.cursor
    }

    /// Fills the batch buffer with the next batch; false at the end.
    fn fill(&mut self) -> Result<bool, ClientError> {
        let Some(b) = self.iter.next_batch() else {
            return Ok(false);
        };
        let width = output_width(self.output);
        let item = self.output.itemsize();
        let sample_bytes = self.sample_len * item;
        let bytes = b.samples.len() * sample_bytes;
        self.batch.resize(bytes.div_ceil(8), 0);
        let out: &mut [u8] = &mut bytemuck::cast_slice_mut(&mut self.batch)[..bytes];
        for (k, s) in b.samples.iter().enumerate() {
            let d = s.source;
            self.sources[d]
                .read(s.tokens.clone(), &mut self.tokens, &mut self.bufs[d])
                .map_err(|source| ClientError::Source {
                    index: d,
                    uri: self.uris[d].clone(),
                    source,
                })?;
            store_plain(
                width,
                &self.tokens,
                &mut out[k * sample_bytes..(k + 1) * sample_bytes],
            )
            .map_err(|e| ClientError::Output {
                index: d,
                uri: self.uris[d].clone(),
                source: e.at_base(s.tokens.start),
            })?;
        }
        self.batch_len = bytes;
        self.batch_index = b.index;
        self.samples_in_batch = b.samples.len();
        self.read_pos = 0;
        Ok(true)
    }

    fn view(&self) -> Batch<'_> {
        let n = self.batch_len / self.output.itemsize();
        let words = &self.batch[..];
        let tokens = match self.output {
            OutputDType::U16 => Tokens::U16(&bytemuck::cast_slice(words)[..n]),
            OutputDType::I32 => Tokens::I32(&bytemuck::cast_slice(words)[..n]),
            OutputDType::I64 => Tokens::I64(&bytemuck::cast_slice(words)[..n]),
        };
        Batch {
            index: self.batch_index,
            samples: self.samples_in_batch,
            sample_len: self.sample_len,
            tokens,
        }
    }

    /// The next batch, borrowed from the reader (valid until the next call); `None` at the end.
    /// The cursor moves past it.
    pub fn next_batch(&mut self) -> Result<Option<Batch<'_>>, ClientError> {
        if !self.fill()? {
            return Ok(None);
        }
        self.read_pos = self.batch_len;
        self.cursor = self.iter.cursor();
        Ok(Some(self.view()))
    }

    /// Copies the next bytes of the stream (batches back to back, in the output dtype) into
    /// `buf`, as the original `read(fd, buf)`. Returns the bytes written; 0 at the end.
    pub fn read(&mut self, buf: &mut [u8]) -> Result<usize, ClientError> {
        let mut n = 0;
        while n < buf.len() {
            if self.read_pos == self.batch_len && !self.fill()? {
                break;
            }
            let src = &bytemuck::cast_slice::<u64, u8>(&self.batch)[self.read_pos..self.batch_len];
            let k = src.len().min(buf.len() - n);
            buf[n..n + k].copy_from_slice(&src[..k]);
            n += k;
            self.read_pos += k;
            if self.read_pos == self.batch_len {
                self.cursor = self.iter.cursor();
            }
        }
        Ok(n)
    }
}
