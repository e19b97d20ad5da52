//! The shared-memory transport, host side: this process creates a ring
//! ([`dquant_transport::ring`]), hands it to the agent over the agent's Unix socket, and reads
//! each batch where the agent wrote it.
//!
//! The agent writes every batch record (a [`BatchHeader`] and the tokens in the plan's output
//! dtype) into one slot, so a batch is viewed in place: no copy, no decode, and no syscall
//! while the agent keeps the ring non-empty. The Unix socket stays open beside the ring: the
//! agent's end closing is how a dead agent is noticed, and an agent that fails a session
//! writes its message there before it marks the ring aborted.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use dquant_plan::Plan;
use dquant_proto::v1::OpenReply;
use dquant_transport::frame::MAX_PAYLOAD;
use dquant_transport::record::RECORD_HEADER_LEN;
use dquant_transport::ring::layout::PAGE;
use dquant_transport::ring::{RingConsumer, RingError, RingView};
use dquant_transport::{BatchHeader, BufferPool, FrameReader, WireError};

use dquant_remote::{hello_of, AgentUri};

use crate::ClientError;

/// Bytes of batches a ring holds by default: the TCP path's default prefetch (8 frames of
/// 1 MiB).
pub const DEFAULT_RING_BYTES: u64 = 8 << 20;

/// The slot size for `plan`: one whole batch record (header and tokens in the output
/// dtype), page aligned. Slots are sized to the batch rather than fixed at 1 MiB: a slot
/// holds exactly one batch, so a smaller one would not fit it and a larger one is memory
/// the batch never uses.
pub fn slot_size(plan: &Plan) -> u64 {
    let record = RECORD_HEADER_LEN as u64 + plan.batch_bytes();
    record.div_ceil(PAGE) * PAGE
}

/// Slots in a ring of `slot_size` slots unless the address says `slots=N`: enough for
/// [`DEFAULT_RING_BYTES`], at least 4 (so the agent can run ahead while the consumer holds
/// one and wakes are batched) and at most 1024.
pub fn default_slots(slot_size: u64) -> u32 {
    DEFAULT_RING_BYTES.div_ceil(slot_size).clamp(4, 1024) as u32
}

/// A session's ring and the socket it was handed over on.
pub(crate) struct Shm {
    ring: RingConsumer,
    sock: UnixStream,
    /// The batch [`next`](Shm::next) took, until the next call or
    /// [`take_held`](Shm::take_held).
    held: Option<RingView>,
    /// What a [`wait_ready`](Shm::wait_ready) that did not time out took: the next batch,
    /// the end, or the error, for the next [`next`](Shm::next).
    pending: Option<Result<Option<RingView>, RingError>>,
}

fn connect_err(path: &Path) -> impl Fn(std::io::Error) -> ClientError + '_ {
    move |source| {
        ClientError::Connect(dquant_engine::SourceError::Connect {
            addr: path.display().to_string(),
            source,
        })
    }
}

impl Shm {
    /// Creates a ring for `plan`'s batches and hands it to the agent for the session in
    /// `reply`.
    pub fn connect(uri: &AgentUri, plan: &Plan, reply: &OpenReply) -> Result<Shm, ClientError> {
        let path = if uri.is_unix() {
            PathBuf::from(&uri.authority)
        } else if !reply.socket_path.is_empty() {
            PathBuf::from(&reply.socket_path)
        } else {
            return Err(ClientError::Usage(format!(
                "transport=shm: the agent at {} has no Unix socket; start it on this host with `dquant serve --socket PATH` and use that path as its address",
                uri.authority
            )));
        };
        let hello = hello_of(reply).map_err(ClientError::from_agent)?;
        let size = slot_size(plan);
        let slots = uri.slots.unwrap_or_else(|| default_slots(size));
        let ring_err = |e: RingError| ClientError::Agent(format!("shared-memory ring: {e}"));
        let (mut ring, fds) =
            RingConsumer::create_with(slots, size, uri.verify).map_err(ring_err)?;
        let sock = UnixStream::connect(&path).map_err(connect_err(&path))?;
        fds.send_with(&sock, &hello.encode()).map_err(ring_err)?;
        // Our copies of the descriptors go now: the agent holds its own.
        drop(fds);
        let peer = sock.try_clone().map_err(connect_err(&path))?;
        ring.set_peer(OwnedFd::from(peer));
        Ok(Shm {
            ring,
            sock,
            held: None,
            pending: None,
        })
    }

    /// Takes the next batch (releasing the one held): its header, or `None` at the end.
    /// The record is checked to be exactly the header and `h.tokens()` tokens of `output`, so
    /// the tokens are [`payload`](Shm::payload)`(bytes)`, or the view
    /// [`take_held`](Shm::take_held) hands over, after the record header.
    pub fn next(
        &mut self,
        plan_sample_len: usize,
        batch_size: usize,
        output: dquant_plan::OutputDType,
    ) -> Result<Option<BatchHeader>, ClientError> {
        self.held = None;
        let next = match self.pending.take() {
            Some(r) => r,
            None => self.ring.take(Duration::MAX),
        };
        let view = match next {
            Ok(Some(v)) => v,
            Ok(None) => return Ok(None),
            Err(e) => return Err(self.ring_error(e)),
        };
        let h = check_record(&view, plan_sample_len, batch_size, output)?;
        self.held = Some(view);
        Ok(Some(h))
    }

    /// Waits at most `timeout` for the next batch (or the end, or an error), which the next
    /// [`next`](Shm::next) then returns; false if the time ran out first.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<bool, ClientError> {
        if self.pending.is_none() {
            match self.ring.take(timeout) {
                Err(RingError::Timeout(_)) => return Ok(false),
                r => self.pending = Some(r),
            }
        }
        Ok(true)
    }

    /// The held batch as a view of its own, which may outlive later batches and the reader
    /// ([`RingConsumer::take`]).
    pub fn take_held(&mut self) -> Option<RingView> {
        self.held.take()
    }

    /// Detaches batches that views have kept for long, now rather than in the next
    /// [`take`](Shm::take) ([`RingConsumer::make_room`]).
    pub fn make_room(&mut self) -> Result<(), ClientError> {
        self.ring.make_room().map_err(|e| self.ring_error(e))
    }

    fn ring_error(&self, e: RingError) -> ClientError {
        match e {
            RingError::ProducerGone { complete } => self.agent_gone(complete),
            e => ClientError::Agent(format!("shared-memory ring: {e}")),
        }
    }

    /// The held batch's `bytes` payload bytes, after its record header (none once handed
    /// over).
    pub fn payload(&self, bytes: usize) -> &[u8] {
        match &self.held {
            Some(v) => &v[RECORD_HEADER_LEN..][..bytes],
            None => &[],
        }
    }

    /// The error for an agent that stopped without ending the stream: the message it left on
    /// the socket, or, if it died, what was delivered.
    fn agent_gone(&self, complete: u64) -> ClientError {
        let _ = self.sock.set_read_timeout(Some(Duration::from_secs(1)));
        if let Ok(s) = self.sock.try_clone() {
            let pool = BufferPool::new(1, MAX_PAYLOAD);
            let mut buf = pool.get();
            if let Err(WireError::Remote(m)) = FrameReader::new(s).next_into(&mut buf) {
                return ClientError::Agent(m);
            }
        }
        ClientError::Agent(format!(
            "agent went away after delivering {complete} complete batches through shared memory; resume from the reader's cursor"
        ))
    }

    /// Stops the agent's side (dropping the ring tells it too).
    pub fn shutdown(&self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

/// Checks that a ring record is exactly a batch header and `h.tokens()` tokens of `output`
/// for this plan; returns the header.
fn check_record(
    record: &[u8],
    plan_sample_len: usize,
    batch_size: usize,
    output: dquant_plan::OutputDType,
) -> Result<BatchHeader, ClientError> {
    let len = record.len();
    let bad = |what: String| ClientError::Agent(format!("shared-memory ring: {what}"));
    if len < RECORD_HEADER_LEN {
        return Err(bad(format!(
            "a {len}-byte batch record is shorter than its header"
        )));
    }
    let mut hb = [0u8; RECORD_HEADER_LEN];
    hb.copy_from_slice(&record[..RECORD_HEADER_LEN]);
    let h = BatchHeader::parse(&hb).map_err(|e| ClientError::Wire(WireError::from(e)))?;
    crate::check_shape(&h, plan_sample_len, batch_size)?;
    let want = dquant_engine::plain_codec(output);
    let bytes = h.tokens() * output.itemsize();
    if h.codec != want || h.payload_len as usize != bytes || RECORD_HEADER_LEN + bytes != len {
        return Err(bad(format!(
            "batch {} holds {} bytes of {} in a {len}-byte record; expected {bytes} bytes of {want}",
            h.index, h.payload_len, h.codec
        )));
    }
    Ok(h)
}
