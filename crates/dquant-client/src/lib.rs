//! The host API: [`open`] a plan, then take its batches with [`Reader::next_batch`] (a typed,
//! zero-copy view) or [`Reader::read`] (bytes into your buffer, as the original design's
//! `read(fd, buf)`).
//!
//! The original design's `open(path, action, offload)` maps to [`open`]`(uri, plan, offload)`:
//! - [`Offload::Yes`]: the agent at `uri` runs the plan near the data and sends finished
//!   batches. From `dquant://HOST:PORT` they stream over TCP and this process decodes the
//!   wire codec into its batch buffer; from the agent's Unix socket path they land in a
//!   shared-memory ring this process created, already in the output dtype, and
//!   [`Reader::next_batch`] views them in place ([`Transport`]).
//! - [`Offload::No`]: the same [`Pipeline`] runs in this process. Sources are local paths, or
//!   datasets on an agent (relative names when `uri` names one, or full `dquant://` URIs),
//!   whose tokens are pulled by range.
//!
//! Both produce byte-identical batches for the same plan and cursor; the tests check it.

pub mod shm;

use std::net::TcpStream;
use std::time::Duration;

use dquant_codec::kernels::store_plain;
use dquant_codec::{CodecError, Compression, Decoder};
use dquant_engine::{EngineError, Pipeline};
use dquant_plan::{Cursor, OutputDType, Plan, PlanError, Source};
use dquant_proto::v1::OpenRequest;
use dquant_remote::open_source;
use dquant_transport::{BatchHeader, RecordReader, WireError};

pub use dquant_engine::{SourceError, TokenSource};
pub use dquant_remote::{AgentUri, Control, Transport};

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
        source: SourceError,
    },
    /// A token does not fit the plan's output dtype (e.g. `u16` for a 100k vocabulary), or
    /// its wire codec (`context` then says which).
    #[error("sources[{index}] ({uri}): {context}{source}")]
    Output {
        index: usize,
        uri: String,
        context: String,
        #[source]
        source: CodecError,
    },
    /// The agent refused or failed; its message, verbatim.
    #[error("{0}")]
    Agent(String),
    /// The agent has no such dataset; its message, verbatim.
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Connect(SourceError),
    #[error("{0}")]
    Wire(#[from] WireError),
    #[error("{0}")]
    Usage(String),
}

impl ClientError {
    /// An error from talking to an agent: what the agent said, verbatim, or why it could not
    /// be reached.
    fn from_agent(e: SourceError) -> Self {
        match e {
            SourceError::Agent(m) => ClientError::Agent(m),
            SourceError::NotFound(m) => ClientError::NotFound(m),
            e => ClientError::Connect(e),
        }
    }

    /// Whether a dataset the plan names does not exist: a local file, or a dataset an agent
    /// does not have (bindings map this to their language's file-not-found error).
    pub fn is_not_found(&self) -> bool {
        match self {
            ClientError::NotFound(_) => true,
            ClientError::Source { source, .. } => source.is_not_found(),
            _ => false,
        }
    }
}

/// The engine's errors keep their variant: a bad plan, a source, a token that does not fit.
impl From<EngineError> for ClientError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Plan(e) => ClientError::Plan(e),
            EngineError::Source { index, uri, source } => {
                ClientError::Source { index, uri, source }
            }
            EngineError::Output {
                index,
                uri,
                context,
                source,
            } => ClientError::Output {
                index,
                uri,
                context,
                source,
            },
            e => ClientError::Usage(e.to_string()),
        }
    }
}

/// Where a plan runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offload {
    /// On the agent named by the URI; batches arrive over its data plane.
    Yes,
    /// In this process.
    No,
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
    mem: BatchMem,
}

enum BatchMem {
    /// u64 words, so that every output dtype is aligned; returned to `pool` on drop.
    Heap {
        words: Vec<u64>,
        len: usize,
        pool: BufferPool,
    },
    /// A ring slot: the payload follows the record header.
    Ring {
        view: dquant_transport::ring::RingView,
        len: usize,
    },
}

/// Batch buffers handed out with [`OwnedBatch`]es and given back when they drop, so a reader
/// reuses a few buffers rather than allocating one per batch.
type BufferPool = std::sync::Arc<std::sync::Mutex<Vec<Vec<u64>>>>;

/// Buffers a reader's pool keeps for reuse.
const POOL_KEEP: usize = 4;

impl OwnedBatch {
    /// The tokens' little-endian bytes (`samples × sample_len × itemsize`).
    pub fn bytes(&self) -> &[u8] {
        match &self.mem {
            BatchMem::Heap { words, len, .. } => &bytemuck::cast_slice::<u64, u8>(words)[..*len],
            BatchMem::Ring { view, len } => {
                &view[dquant_transport::record::RECORD_HEADER_LEN..][..*len]
            }
        }
    }

    /// The tokens in the plan's output dtype, row-major.
    pub fn tokens(&self) -> Tokens<'_> {
        tokens_of(self.output, self.bytes())
    }

    /// Whether the tokens live in a shared-memory ring slot (else in a heap buffer).
    pub fn in_ring(&self) -> bool {
        matches!(self.mem, BatchMem::Ring { .. })
    }
}

impl Drop for OwnedBatch {
    fn drop(&mut self) {
        if let BatchMem::Heap { words, pool, .. } = &mut self.mem {
            let mut p = pool.lock().unwrap_or_else(|e| e.into_inner());
            if p.len() < POOL_KEEP {
                p.push(std::mem::take(words));
            }
        }
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

/// Views `bytes` (8-byte aligned) as tokens of `output`.
fn tokens_of(output: OutputDType, bytes: &[u8]) -> Tokens<'_> {
    match output {
        OutputDType::U16 => Tokens::U16(bytemuck::cast_slice(bytes)),
        OutputDType::I32 => Tokens::I32(bytemuck::cast_slice(bytes)),
        OutputDType::I64 => Tokens::I64(bytemuck::cast_slice(bytes)),
    }
}

/// Opens `plan` from its start; see [`open_at`].
pub fn open(uri: &str, plan: &Plan, offload: Offload) -> Result<Reader, ClientError> {
    open_at(uri, plan, Cursor::START, offload)
}

/// Opens `plan` at `cursor`. `uri` is an agent's address ([`AgentUri`]: `dquant://HOST:PORT`,
/// or its Unix socket path for shared memory), or empty for none (only with
/// [`Offload::No`]; sources are then local paths or full `dquant://` URIs).
pub fn open_at(
    uri: &str,
    plan: &Plan,
    cursor: Cursor,
    offload: Offload,
) -> Result<Reader, ClientError> {
    let agent = if uri.is_empty() {
        None
    } else {
        Some(AgentUri::parse(uri).map_err(ClientError::Usage)?)
    };
    match (offload, agent) {
        (Offload::Yes, None) => Err(ClientError::Usage(
            "offload needs an agent: pass its URI, dquant://HOST:PORT or a Unix socket path".into(),
        )),
        (Offload::Yes, Some(a)) => Reader::remote(&a, plan, cursor),
        (Offload::No, a) => {
            let control = match a {
                Some(a) => Some(Control::connect(&a.authority).map_err(ClientError::Connect)?),
                None => None,
            };
            Reader::local_with(plan, cursor, |_, s| {
                open_source(s, control.as_ref(), &plan.wire_codec)
            })
        }
    }
}

// Both variants are big; a reader holds exactly one, for its whole life.
#[allow(clippy::large_enum_variant)]
enum Engine {
    Local {
        pipeline: Box<Pipeline>,
        batch_size: usize,
    },
    Remote {
        control: Control,
        session: u64,
        records: RecordReader<TcpStream>,
        decoder: Decoder,
        payload: Vec<u8>,
        decoded: Vec<u32>,
        batch_size: usize,
        ended: bool,
    },
    Shm {
        control: Control,
        session: u64,
        shm: shm::Shm,
        batch_size: usize,
        ended: bool,
    },
}

/// Streams one rank's batches of a plan.
pub struct Reader {
    engine: Engine,
    output: OutputDType,
    sample_len: usize,
    rank_batches: u64,
    rank_samples: u64,
    /// Batch storage as u64 words, so every output dtype can be viewed without a copy.
    batch: Vec<u64>,
    batch_len: usize,
    batch_index: u64,
    samples_in_batch: usize,
    /// The cursor once the buffered batch is consumed.
    batch_cursor: Cursor,
    /// Bytes of the current batch already handed out by `read`.
    read_pos: usize,
    /// Position after the last batch fully handed out.
    cursor: Cursor,
    /// Buffers of dropped [`OwnedBatch`]es, for the next batches.
    pool: BufferPool,
}

impl Reader {
    /// Runs `plan` in this process, starting at `cursor` ([`Cursor::START`] for the beginning).
    /// Sources are local paths (Megatron prefixes, `.dqb` files, or raw files with a `dtype`)
    /// or `dquant://` URIs of datasets on agents.
    pub fn local(plan: &Plan, cursor: Cursor) -> Result<Self, ClientError> {
        Self::local_with(plan, cursor, |_, s| open_source(s, None, ""))
    }

    /// Runs `plan` in this process over sources opened by `open`.
    pub fn local_with(
        plan: &Plan,
        cursor: Cursor,
        open: impl FnMut(usize, &Source) -> Result<Box<dyn TokenSource>, SourceError>,
    ) -> Result<Self, ClientError> {
        let pipeline = Pipeline::open(plan, cursor, open)?;
        let start = pipeline.cursor();
        let s = pipeline.schedule();
        let (rank_batches, rank_samples) = (s.rank_batches(), s.rank_samples());
        Ok(Self::new(
            Engine::Local {
                batch_size: plan.batch_size as usize,
                pipeline: Box::new(pipeline),
            },
            plan,
            start,
            rank_batches,
            rank_samples,
        ))
    }

    /// Opens `plan` on the agent at `agent` and connects its data plane: TCP frames or a
    /// shared-memory ring, as [`AgentUri::transport`] says.
    pub fn remote(agent: &AgentUri, plan: &Plan, cursor: Cursor) -> Result<Self, ClientError> {
        plan.validate()?;
        let control = Control::connect(&agent.authority).map_err(ClientError::Connect)?;
        let reply = control
            .open(OpenRequest {
                plan_json: plan.to_json(),
                epoch: cursor.epoch,
                consumed_samples: cursor.consumed_samples,
            })
            .map_err(ClientError::from_agent)?;
        let start = Cursor {
            epoch: reply.start_epoch,
            consumed_samples: reply.start_consumed_samples,
        };
        let batch_size = plan.batch_size as usize;
        let engine = match agent.transport() {
            Transport::Tcp => {
                let (_writer, records) = control
                    .connect_data(&reply)
                    .map_err(ClientError::from_agent)?;
                Engine::Remote {
                    control,
                    session: reply.session,
                    records,
                    decoder: Decoder::new(),
                    payload: Vec::new(),
                    decoded: Vec::new(),
                    batch_size,
                    ended: false,
                }
            }
            Transport::Shm => {
                let shm = match shm::Shm::connect(agent, plan, &reply) {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = control.close(reply.session);
                        return Err(e);
                    }
                };
                Engine::Shm {
                    control,
                    session: reply.session,
                    shm,
                    batch_size,
                    ended: false,
                }
            }
        };
        Ok(Self::new(
            engine,
            plan,
            start,
            reply.rank_batches,
            reply.rank_samples,
        ))
    }

    fn new(
        engine: Engine,
        plan: &Plan,
        start: Cursor,
        rank_batches: u64,
        rank_samples: u64,
    ) -> Self {
        Reader {
            engine,
            output: plan.output,
            sample_len: plan.sample_len(),
            rank_batches,
            rank_samples,
            batch: Vec::new(),
            batch_len: 0,
            batch_index: 0,
            samples_in_batch: 0,
            batch_cursor: start,
            read_pos: 0,
            cursor: start,
            pool: BufferPool::default(),
        }
    }

    /// The dtype batches land in.
    pub fn output(&self) -> OutputDType {
        self.output
    }

    /// Tokens per sample: `seq_len + 1`.
    pub fn sample_len(&self) -> usize {
        self.sample_len
    }

    /// Batches in this rank's whole stream (from the start, not from the cursor).
    pub fn rank_batches(&self) -> u64 {
        self.rank_batches
    }

    /// Samples in this rank's whole stream.
    pub fn rank_samples(&self) -> u64 {
        self.rank_samples
    }

    /// The plan's resolved schedule, when it runs in this process.
    pub fn schedule(&self) -> Option<&dquant_plan::Schedule> {
        match &self.engine {
            Engine::Local { pipeline, .. } => Some(pipeline.schedule()),
            Engine::Remote { .. } | Engine::Shm { .. } => None,
        }
    }

    /// Whether the plan runs on an agent.
    pub fn is_offloaded(&self) -> bool {
        !matches!(self.engine, Engine::Local { .. })
    }

    /// How batches arrive: `None` in-process, else the transport from the agent.
    pub fn transport(&self) -> Option<Transport> {
        match self.engine {
            Engine::Local { .. } => None,
            Engine::Remote { .. } => Some(Transport::Tcp),
            Engine::Shm { .. } => Some(Transport::Shm),
        }
    }

    /// Where a resumed reader would continue: after the last batch handed out whole.
    pub fn cursor(&self) -> Cursor {
        self.cursor
    }

    /// Waits at most `timeout` for the next batch to be at hand: true once the next
    /// [`next_owned`](Reader::next_owned), [`next_batch`](Reader::next_batch) or first batch
    /// of a [`read`](Reader::read) will not wait on the agent (a batch, the end or an error
    /// has arrived), false when `timeout` ran out first. Nothing is consumed: the cursor
    /// stays, and a false answer can simply be followed by another call.
    ///
    /// This is how a caller that must stay responsive while an agent is slow waits in
    /// slices: an interpreter checks for Ctrl-C between calls. In-process plans are always
    /// ready (making a batch is work, not waiting). Over TCP a batch whose first bytes have
    /// arrived counts as ready, though its last bytes may still be on the way.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<bool, ClientError> {
        if self.read_pos < self.batch_len {
            return Ok(true);
        }
        match &mut self.engine {
            Engine::Local { .. } => Ok(true),
            Engine::Remote { ended: true, .. } | Engine::Shm { ended: true, .. } => Ok(true),
            Engine::Remote { records, .. } => {
                if records.has_buffered() {
                    return Ok(true);
                }
                readable(records.get_ref().get_ref(), timeout)
            }
            Engine::Shm { shm, .. } => shm.wait_ready(timeout),
        }
    }

    /// Fills the batch buffer with the next batch; false at the end.
    fn fill(&mut self) -> Result<bool, ClientError> {
        let item = self.output.itemsize();
        let width = self.output.width();
        let Reader {
            engine,
            batch,
            sample_len,
            ..
        } = self;
        let (bytes, index, samples, cursor) = match engine {
            Engine::Local {
                pipeline,
                batch_size,
            } => {
                let full = *batch_size * *sample_len * item;
                let Some(b) = pipeline.next_batch_into(width, batch_bytes(batch, full))? else {
                    return Ok(false);
                };
                (b.samples * *sample_len * item, b.index, b.samples, b.cursor)
            }
            Engine::Remote {
                records,
                decoder,
                payload,
                decoded,
                batch_size,
                ended,
                ..
            } => {
                if *ended {
                    return Ok(false);
                }
                let Some(hb) = records.next_header()? else {
                    *ended = true;
                    return Ok(false);
                };
                let h = BatchHeader::parse(&hb).map_err(WireError::from)?;
                check_shape(&h, *sample_len, *batch_size)?;
                let n = h.tokens();
                dquant_remote::check_payload_len(h.codec, n, h.payload_len)
                    .map_err(ClientError::from_agent)?;
                let bytes = n * item;
                let out = batch_bytes(batch, bytes);
                let direct = h.codec.compression == Compression::None && h.codec.width == width;
                if direct && h.payload_len as usize == bytes {
                    // The wire already holds the output dtype: frames copy straight into
                    // the batch buffer.
                    records.read_exact(out, "batch payload")?;
                } else {
                    payload.resize(h.payload_len as usize, 0);
                    records.read_exact(payload, "batch payload")?;
                    decoded.resize(n, 0);
                    decoder
                        .decode(h.codec, payload, decoded)
                        .map_err(|e| ClientError::Agent(format!("batch {}: {e}", h.index)))?;
                    store_plain(width, decoded, out)
                        .map_err(|e| ClientError::Agent(format!("batch {}: {e}", h.index)))?;
                }
                let cursor = cursor_of(&h);
                (bytes, h.index, h.samples as usize, cursor)
            }
            Engine::Shm {
                shm,
                batch_size,
                ended,
                ..
            } => {
                if *ended {
                    return Ok(false);
                }
                let Some(h) = shm.next(*sample_len, *batch_size, self.output)? else {
                    *ended = true;
                    return Ok(false);
                };
                let cursor = cursor_of(&h);
                (h.tokens() * item, h.index, h.samples as usize, cursor)
            }
        };
        self.batch_len = bytes;
        self.batch_index = index;
        self.samples_in_batch = samples;
        self.batch_cursor = cursor;
        self.read_pos = 0;
        Ok(true)
    }

    /// The current batch's bytes: in the ring slot for shared memory, else in `batch`.
    fn batch_bytes(&self) -> &[u8] {
        match &self.engine {
            Engine::Shm { shm, .. } => shm.payload(self.batch_len),
            _ => &bytemuck::cast_slice::<u64, u8>(&self.batch)[..self.batch_len],
        }
    }

    fn view(&self) -> Batch<'_> {
        // Both homes are 8-byte aligned: `batch` is u64 words, and ring payloads start 48
        // bytes into page-aligned slots.
        let tokens = tokens_of(self.output, self.batch_bytes());
        Batch {
            index: self.batch_index,
            samples: self.samples_in_batch,
            sample_len: self.sample_len,
            tokens,
        }
    }

    /// The next batch, borrowed from the reader (valid until the next call); `None` at the end.
    /// The cursor moves past it. Over shared memory the view is the ring slot the agent wrote;
    /// the slot goes back to the agent at the next call (or when the reader is dropped).
    ///
    /// A batch that [`Reader::read`] has only partly delivered must be finished with `read`
    /// first: `next_batch` then fails rather than skip the rest of it.
    pub fn next_batch(&mut self) -> Result<Option<Batch<'_>>, ClientError> {
        self.check_whole("next_batch")?;
        if !self.fill()? {
            return Ok(None);
        }
        self.read_pos = self.batch_len;
        self.cursor = self.batch_cursor;
        Ok(Some(self.view()))
    }

    /// The next batch as an [`OwnedBatch`], which may outlive later batches and the reader;
    /// `None` at the end. The cursor moves past it. Nothing is copied to hand it over: over
    /// shared memory it is a view of the ring slot, else the buffer the batch was made in
    /// (the reader takes a fresh or recycled one for the next batch).
    pub fn next_owned(&mut self) -> Result<Option<OwnedBatch>, ClientError> {
        self.check_whole("next_owned")?;
        if !self.fill()? {
            return Ok(None);
        }
        self.cursor = self.batch_cursor;
        // The batch leaves the reader: the next `read` or `next_batch` fills anew.
        let len = std::mem::take(&mut self.batch_len);
        self.read_pos = 0;
        let mem = match &mut self.engine {
            Engine::Shm { shm, .. } => BatchMem::Ring {
                view: shm.take_held().expect("fill holds the batch it took"),
                len,
            },
            _ => {
                let recycled = self
                    .pool
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .pop()
                    .unwrap_or_default();
                BatchMem::Heap {
                    words: std::mem::replace(&mut self.batch, recycled),
                    len,
                    pool: self.pool.clone(),
                }
            }
        };
        Ok(Some(OwnedBatch {
            index: self.batch_index,
            samples: self.samples_in_batch,
            sample_len: self.sample_len,
            output: self.output,
            cursor: self.cursor,
            mem,
        }))
    }

    /// Over shared memory, copies out the batches that [`OwnedBatch`]es have kept for long
    /// now, rather than in the next [`next_owned`](Reader::next_owned) (see
    /// [`dquant_transport::ring::RingConsumer::make_room`]); a no-op otherwise. A caller
    /// whose batches other threads may write (an interpreter) calls this while they cannot.
    pub fn make_room(&mut self) -> Result<(), ClientError> {
        match &mut self.engine {
            Engine::Shm { shm, .. } => shm.make_room(),
            _ => Ok(()),
        }
    }

    /// Refuses `op` (a call that takes a whole batch) while `read` has delivered only part
    /// of the current one: it would skip the rest.
    fn check_whole(&self, op: &str) -> Result<(), ClientError> {
        if self.read_pos < self.batch_len {
            return Err(ClientError::Usage(format!(
                "{op}: batch {} is partly read ({} of {} bytes); finish it with read() first",
                self.batch_index, self.read_pos, self.batch_len
            )));
        }
        Ok(())
    }

    /// Copies the next bytes of the stream (batches back to back, in the output dtype) into
    /// `buf`, as the original `read(fd, buf)`. Returns the bytes written; 0 at the end.
    pub fn read(&mut self, buf: &mut [u8]) -> Result<usize, ClientError> {
        let mut n = 0;
        while n < buf.len() {
            if self.read_pos == self.batch_len && !self.fill()? {
                break;
            }
            let src = &self.batch_bytes()[self.read_pos..];
            let k = src.len().min(buf.len() - n);
            buf[n..n + k].copy_from_slice(&src[..k]);
            n += k;
            self.read_pos += k;
            if self.read_pos == self.batch_len {
                self.cursor = self.batch_cursor;
            }
        }
        Ok(n)
    }

    /// Ends an offloaded session now (dropping the reader does too).
    pub fn close(self) {}
}

/// Whether `sock` has bytes to read (or its end or an error) within `timeout`; a signal
/// cuts the wait short and counts as not yet.
fn readable(sock: &TcpStream, timeout: Duration) -> Result<bool, ClientError> {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let t = Timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as _,
        tv_nsec: timeout.subsec_nanos() as _,
    };
    let mut fds = [PollFd::new(sock, PollFlags::IN)];
    match poll(&mut fds, Some(&t)) {
        // Errors and hang-ups count as ready: the read that follows reports them.
        Ok(n) => Ok(n > 0),
        Err(rustix::io::Errno::INTR) => Ok(false),
        Err(e) => Err(ClientError::Wire(WireError::Io(std::io::Error::from(e)))),
    }
}

/// Where a resumed reader continues after the batch of header `h`.
fn cursor_of(h: &BatchHeader) -> Cursor {
    Cursor {
        epoch: h.cursor_epoch,
        consumed_samples: h.cursor_consumed,
    }
}

/// Refuses a batch record whose shape the plan cannot produce (a corrupt or hostile agent).
pub(crate) fn check_shape(
    h: &BatchHeader,
    sample_len: usize,
    batch_size: usize,
) -> Result<(), ClientError> {
    if h.sample_len as usize != sample_len || h.samples == 0 || h.samples as usize > batch_size {
        return Err(ClientError::Agent(format!(
            "agent sent a batch of {} samples of {} tokens; the plan has batches of up to {batch_size} samples of {sample_len}",
            h.samples, h.sample_len
        )));
    }
    Ok(())
}

/// The first `bytes` bytes of the 8-byte-aligned batch buffer, grown as needed.
fn batch_bytes(batch: &mut Vec<u64>, bytes: usize) -> &mut [u8] {
    batch.resize(bytes.div_ceil(8), 0);
    &mut bytemuck::cast_slice_mut(batch)[..bytes]
}

impl Drop for Reader {
    fn drop(&mut self) {
        let (control, session, ended) = match &self.engine {
            Engine::Local { .. } => return,
            Engine::Remote {
                control,
                session,
                records,
                ended,
                ..
            } => {
                let _ = records
                    .get_ref()
                    .get_ref()
                    .shutdown(std::net::Shutdown::Both);
                (control, session, ended)
            }
            Engine::Shm {
                control,
                session,
                shm,
                ended,
                ..
            } => {
                shm.shutdown();
                (control, session, ended)
            }
        };
        if !*ended {
            let _ = control.close(*session);
        }
    }
}
