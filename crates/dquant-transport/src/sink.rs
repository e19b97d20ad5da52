//! The producer side of every transport: where an agent's produce loop puts batch records.
//!
//! A record is a [`crate::BatchHeader`] and its payload, written in place: the loop asks for
//! room ([`BatchSink::reserve`]), makes the batch straight into it (from a dataset that stores
//! the output dtype, one read from the page cache), then publishes it
//! ([`BatchSink::commit`]). TCP frames, the shared-memory ring and the in-memory pair used by
//! tests all implement this trait, so the agent has one produce loop and a new transport
//! (RDMA writes into registered buffers) is one more implementation.

use std::time::Instant;

/// Why a sink takes no more records.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum SinkError {
    /// The consumer went away or the session was cancelled: stop producing, there is nobody
    /// to tell.
    #[error("{0}")]
    Gone(String),
    /// The transport cannot carry the record (too large for a ring slot, a broken ring);
    /// the message is for the consumer.
    #[error("{0}")]
    Failed(String),
    /// An in-memory pair is full: step the consumer, then retry (only
    /// [`crate::memory::MemorySink`] says this; the other sinks wait instead).
    #[error("the in-memory transport is full")]
    Full,
}

/// `buf` grown (never shrunk) to `len` bytes, for a sink that makes a record in memory of its
/// own: the size comes from a plan, so a failed allocation is the session's error, not an
/// abort of the agent that hosts every other session.
pub fn record_room(buf: &mut Vec<u8>, len: usize) -> Result<&mut [u8], SinkError> {
    let more = len.saturating_sub(buf.len());
    buf.try_reserve_exact(more).map_err(|_| {
        SinkError::Failed(format!("cannot allocate {len} bytes for one batch record"))
    })?;
    buf.resize(len, 0);
    Ok(&mut buf[..len])
}

/// Where batch records go. Calls come in the order `reserve` → `commit` (any number of
/// times, with `flush_if_idle` between records), then `finish` or `fail` once.
pub trait BatchSink: Send {
    /// The largest record this transport carries, if it has a limit (a ring slot). The
    /// produce loop checks a plan's full batch against it before the first batch.
    fn max_record_len(&self) -> Option<usize> {
        None
    }

    /// Whether the next record is to be made in the consumer's output dtype whatever the
    /// wire codec: every reader of it takes that form (a shared stream whose subscribers all
    /// read its shared-memory ring, where a compressed record would only be decoded again).
    /// Asked before each record; `false` by default.
    fn output_dtype_next(&mut self) -> bool {
        false
    }

    /// Room for the next record, `len` bytes (the header and the largest payload it may
    /// have), contiguous. Waits while the transport is full (back-pressure). Reserving again
    /// without a commit returns the same room.
    fn reserve(&mut self, len: usize) -> Result<&mut [u8], SinkError>;

    /// Publishes the first `len` bytes of the room [`reserve`](BatchSink::reserve) gave as
    /// one record.
    fn commit(&mut self, len: usize) -> Result<(), SinkError>;

    /// Lets the consumer have what was committed when the transport is idle, so a consumer
    /// that keeps up gets each record as soon as it is made; `now` is the caller's clock
    /// (simulated in tests). Transports that deliver every commit at once ignore it.
    fn flush_if_idle(&mut self, now: Instant) -> Result<(), SinkError> {
        let _ = now;
        Ok(())
    }

    /// How much of the transport's room is taken by records committed and not yet sent, 0 to
    /// 1, where it can tell: near 1 the link or the consumer holds the producer back (it
    /// waits in [`reserve`](BatchSink::reserve)); near 0 the sender waits for the producer.
    /// `None` (the default): the transport cannot tell.
    fn backlog(&self) -> Option<f64> {
        None
    }

    /// Ends the stream: everything committed is delivered, then the end.
    fn finish(&mut self) -> Result<(), SinkError>;

    /// Ends the stream with an error: everything committed is delivered, then `message`.
    fn fail(&mut self, message: &str);
}
