//! Batch records through a shared-memory ring (the emulated DMA path), both ends: the agent
//! writes each record into a slot of the ring the consumer created and mapped
//! ([`RingSink`]), and the consumer reads it in place ([`RingSource`]). The Unix socket the
//! ring was handed over on stays open beside it: the agent's end closing is how a dead agent
//! is noticed.
//!
//! Each slot holds one record: the [`crate::BatchHeader`] then the tokens already in the
//! plan's output dtype (memory is not a link: no wire codec). Errors go to the consumer as an
//! error frame on the Unix socket the ring came over, *before* the ring is marked aborted, so
//! the consumer finds the message when it sees the abort, after the last complete batch.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::frame::MAX_PAYLOAD;
use crate::receive::{copy_payload, record_header, BatchSource, ReceiveError, RecordView};
use crate::record::MAX_HELLO_LEN;
use crate::ring::{RingConsumer, RingError, RingFds, RingProducer, RingView, MAX_HANDSHAKE_EXTRA};
use crate::sink::{BatchSink, SinkError};
use crate::{BatchHeader, BufferPool, FrameReader, FrameWriter, Hello, RecordError, WireError};

/// How often a producer waiting for a free slot checks whether its session was cancelled.
const RING_POLL: Duration = Duration::from_millis(250);

// Every hello, a tenant token's included, fits the ring hand-over's one message.
const _: () = assert!(MAX_HELLO_LEN <= MAX_HANDSHAKE_EXTRA);

/// A ring a consumer offered on the agent's Unix socket: its descriptors, and the hello of
/// the session it is for (the agent checks that before it maps anything).
pub struct RingOffer {
    fds: RingFds,
    pub hello: Hello,
    /// The consumer subscribes to a shared stream and takes a reader block of the stream's
    /// shared ring instead, if the agent answers with one ([`crate::ring::Answer`]).
    pub shared: bool,
}

/// Why an offer could not be taken.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OfferError {
    #[error("{0}")]
    Ring(#[from] RingError),
    #[error("{0}")]
    Hello(#[from] RecordError),
}

impl RingOffer {
    /// Receives an offer on `sock`: the ring's descriptors with the session's hello.
    pub fn receive(sock: &UnixStream) -> Result<Self, OfferError> {
        let (fds, extra, shared) = RingFds::recv_tagged(sock)?;
        let hello = Hello::parse(&extra)?;
        Ok(RingOffer { fds, hello, shared })
    }

    /// Maps the offered ring as its producer: a sink for the session's batch records, whose
    /// errors go to `sock`, ended by a set `cancel`.
    pub fn accept(self, sock: UnixStream, cancel: Arc<AtomicBool>) -> Result<RingSink, RingError> {
        let mut ring = RingProducer::attach(self.fds)?;
        let peer = sock
            .try_clone()
            .map_err(|source| RingError::Io { op: "dup", source })?;
        ring.set_peer(OwnedFd::from(peer));
        Ok(RingSink::new(ring, sock, cancel))
    }
}

/// The producer side of a ring a consumer handed over, with the socket it came on.
pub struct RingSink {
    /// `None` once the stream is finished or failed.
    ring: Option<RingProducer>,
    sock: UnixStream,
    cancel: Arc<AtomicBool>,
    slot_size: usize,
    /// How long the consumer may leave every slot full before the stream is given up.
    idle_limit: Option<Duration>,
}

impl RingSink {
    /// Gives the stream up when the consumer takes no batch for `limit` (it stopped
    /// reading): the agent frees the session, and the consumer, should it come back, finds
    /// the producer gone after the batches it had.
    pub fn with_idle_limit(mut self, limit: Duration) -> Self {
        self.idle_limit = Some(limit);
        self
    }

    /// A sink into `ring`; error messages go to `sock`; a set `cancel` ends the stream.
    pub fn new(ring: RingProducer, sock: UnixStream, cancel: Arc<AtomicBool>) -> Self {
        let slot_size = usize::try_from(ring.layout().slot_size).unwrap_or(usize::MAX);
        RingSink {
            ring: Some(ring),
            sock,
            cancel,
            slot_size,
            idle_limit: None,
        }
    }

    /// The ring's shape (for logs), while the stream is open.
    pub fn layout(&self) -> Option<&crate::ring::layout::Layout> {
        self.ring.as_ref().map(|r| r.layout())
    }

    /// Whether the ring's batches carry their crc32c (the consumer asked for them).
    pub fn checksums(&self) -> bool {
        self.ring.as_ref().is_some_and(|r| r.checksums())
    }

    fn ring(&mut self) -> Result<&mut RingProducer, SinkError> {
        self.ring
            .as_mut()
            .ok_or_else(|| SinkError::Gone("the ring's stream has ended".into()))
    }
}

fn ring_error(e: RingError) -> SinkError {
    match e {
        RingError::ConsumerGone => SinkError::Gone("client went away".into()),
        e => SinkError::Failed(e.to_string()),
    }
}

impl BatchSink for RingSink {
    fn max_record_len(&self) -> Option<usize> {
        Some(self.slot_size)
    }

    fn reserve(&mut self, len: usize) -> Result<&mut [u8], SinkError> {
        if len > self.slot_size {
            return Err(SinkError::Failed(format!(
                "the ring's slots hold {} bytes; a record needs {len}",
                self.slot_size
            )));
        }
        let waiting = Instant::now();
        loop {
            if self.cancel.load(Ordering::Relaxed) {
                return Err(SinkError::Gone("closed by the client".into()));
            }
            if let Some(limit) = self.idle_limit.filter(|&l| waiting.elapsed() >= l) {
                return Err(SinkError::Gone(format!(
                    "the consumer took no batch for {} s (the agent's consumer_idle_secs); \
                     session released",
                    limit.as_secs()
                )));
            }
            // A free slot first, then the record straight into it: from a dataset that
            // stores the output dtype, that is one read from the page cache into the
            // consumer's memory.
            match self.ring()?.reserve_timeout(RING_POLL) {
                Ok(_) => break,
                Err(RingError::Timeout(_)) => continue,
                Err(e) => return Err(ring_error(e)),
            }
        }
        // The slot is free now and stays ours: reserving it again cannot wait.
        let slot = self
            .ring()?
            .reserve_timeout(Duration::ZERO)
            .map_err(ring_error)?;
        Ok(&mut slot.into_mut()[..len])
    }

    fn commit(&mut self, len: usize) -> Result<(), SinkError> {
        // The slot reserved last is still the ring's next: reserving it again cannot wait.
        let ring = self.ring()?;
        let slot = ring.reserve_timeout(Duration::ZERO).map_err(ring_error)?;
        slot.commit(len).map_err(ring_error)
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        // A slot reserved for a batch that turned out not to exist is simply never committed.
        if let Some(ring) = self.ring.take() {
            ring.close();
        }
        Ok(())
    }

    fn fail(&mut self, message: &str) {
        if let Ok(s) = self.sock.try_clone() {
            let _ = FrameWriter::new(s).fail(message);
        }
        // Dropping the producer marks the ring aborted, after the message is on the socket.
        self.ring = None;
    }
}

/// The consumer side of a ring this process created and handed to an agent, with the socket
/// it went over.
pub struct RingSource {
    ring: RingConsumer,
    sock: UnixStream,
    /// The record [`next_header`](BatchSource::next_header) took, until the next call or
    /// [`take_record`](BatchSource::take_record).
    held: Option<RingView>,
    /// What a [`wait_ready`](BatchSource::wait_ready) that did not time out took: the next
    /// record, the end, or the error, for the next `next_header`.
    pending: Option<Result<Option<RingView>, RingError>>,
}

impl RingSource {
    /// The consumer of `ring`, handed over on `sock`.
    pub fn new(ring: RingConsumer, sock: UnixStream) -> Self {
        RingSource {
            ring,
            sock,
            held: None,
            pending: None,
        }
    }

    fn ring_error(&self, e: RingError) -> ReceiveError {
        match e {
            RingError::ProducerGone { complete } => self.producer_gone(complete),
            e => ReceiveError::Transport(format!("shared-memory ring: {e}")),
        }
    }

    /// The error for a producer that stopped without ending the stream.
    fn producer_gone(&self, complete: u64) -> ReceiveError {
        left_message(&self.sock).unwrap_or_else(|| {
            ReceiveError::Producer(format!(
                "agent went away after delivering {complete} complete batches through shared memory; resume from the reader's cursor"
            ))
        })
    }
}

/// The message a producer that stopped without ending its ring left on `sock` (it writes it
/// there before it marks the ring aborted), if any: waits at most 1 s for it.
fn left_message(sock: &UnixStream) -> Option<ReceiveError> {
    let _ = sock.set_read_timeout(Some(Duration::from_secs(1)));
    let s = sock.try_clone().ok()?;
    let pool = BufferPool::new(1, MAX_PAYLOAD);
    let mut buf = pool.get();
    match FrameReader::new(s).next_into(&mut buf) {
        Err(WireError::Remote(m)) => Some(ReceiveError::Producer(m)),
        _ => None,
    }
}

/// The consumer side of a range session's ring: the agent answers each requested range as
/// one record (a [`crate::RangeHeader`] and its payload in the session's wire codec) in one
/// slot, and the requests go the other way as frames on the socket the ring was handed over
/// on ([`RingRecords::requests`]).
pub struct RingRecords {
    ring: RingConsumer,
    sock: UnixStream,
}

impl RingRecords {
    /// The consumer of `ring`, handed over on `sock`.
    pub fn new(ring: RingConsumer, sock: UnixStream) -> Self {
        RingRecords { ring, sock }
    }

    /// The socket requests are written to.
    pub fn requests(&self) -> &UnixStream {
        &self.sock
    }

    /// Calls `f` with the next record, in place, then frees its slot. Waits at most
    /// `timeout`. The end of the ring, and a producer that went away (with the message it
    /// left, if any), are errors: a range session's records end only when its client closes
    /// it.
    pub fn with_next<T>(
        &mut self,
        timeout: Duration,
        f: impl FnOnce(&[u8]) -> T,
    ) -> Result<T, ReceiveError> {
        match self.ring.next(timeout) {
            Ok(Some(slot)) => Ok(f(&slot)),
            Ok(None) => Err(ReceiveError::Producer(
                "the agent closed the session's shared-memory ring while answers were due".into(),
            )),
            Err(RingError::ProducerGone { .. }) => {
                Err(left_message(&self.sock).unwrap_or_else(|| {
                    ReceiveError::Producer("the agent went away in the middle of a request".into())
                }))
            }
            Err(e) => Err(ReceiveError::Transport(format!("shared-memory ring: {e}"))),
        }
    }

    /// Ends the session: the agent sees the socket close.
    pub fn shutdown(&self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

impl BatchSource for RingSource {
    fn next_header(&mut self) -> Result<Option<BatchHeader>, ReceiveError> {
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
        let h = record_header(&view, "shared-memory ring")?;
        self.held = Some(view);
        Ok(Some(h))
    }

    fn take_record(&mut self) -> Option<RecordView> {
        self.held.take().map(|v| Box::new(v) as RecordView)
    }

    fn shared_memory(&self) -> bool {
        true
    }

    fn shared_ring(&self) -> bool {
        self.ring.is_shared()
    }

    fn read_payload(&mut self, out: &mut [u8]) -> Result<(), ReceiveError> {
        copy_payload(self.held.as_deref(), out, "shared-memory ring")
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<bool, ReceiveError> {
        if self.pending.is_none() {
            match self.ring.take(timeout) {
                Err(RingError::Timeout(_)) => return Ok(false),
                r => self.pending = Some(r),
            }
        }
        Ok(true)
    }

    fn make_room(&mut self) -> Result<(), ReceiveError> {
        self.ring.make_room().map_err(|e| self.ring_error(e))
    }

    fn shutdown(&mut self) {
        if self.ring.is_shared() {
            // The agent reuses a shared ring's slots once this reader's socket is gone: the
            // batches still viewed are copied out first.
            let _ = self.ring.detach_all();
        }
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}
