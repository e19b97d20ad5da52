//! The consumer side of every transport: where a reader takes batch records from.
//!
//! A record arrives as a checked [`BatchHeader`], then its payload: copied out of a byte
//! stream ([`BatchSource::read_payload`], TCP frames), or left where the producer wrote it
//! and handed over whole ([`BatchSource::take_record`], a shared-memory ring slot or an
//! in-process buffer), so the consumer reads it in place. The host API has one reader over
//! `dyn BatchSource`; a new transport is one more implementation.

use std::ops::Deref;
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::record::RECORD_HEADER_LEN;
use crate::{BatchHeader, WireError};

/// A record the consumer may keep: its bytes (the header, then the payload) stay valid, and
/// in place, for as long as the view lives, whatever is received after it.
pub type RecordView = Box<dyn Deref<Target = [u8]> + Send + Sync>;

/// Why no record could be received.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReceiveError {
    /// The byte stream is broken, or the producer sent an error frame
    /// ([`WireError::Remote`], its message verbatim).
    #[error("{0}")]
    Wire(#[from] WireError),
    /// The producer failed or went away without ending the stream; its message, or what was
    /// delivered before it went.
    #[error("{0}")]
    Producer(String),
    /// The transport itself failed (a ring that breaks its protocol).
    #[error("{0}")]
    Transport(String),
    /// A producer in this process failed: its own error, for the caller to inspect
    /// (`downcast`) and report as such.
    #[error("{0}")]
    Source(Box<dyn std::error::Error + Send + Sync>),
}

/// Where a consumer takes batch records from.
pub trait BatchSource: Send {
    /// The next record's header, or `None` at the clean end of the stream. Its payload is
    /// then taken with [`take_record`](BatchSource::take_record) or
    /// [`read_payload`](BatchSource::read_payload) before the next call.
    fn next_header(&mut self) -> Result<Option<BatchHeader>, ReceiveError>;

    /// The whole record whose header [`next_header`](BatchSource::next_header) returned, when
    /// the transport left it in memory this process may keep (the header's `payload_len`
    /// bytes follow the header). `None` when its bytes must be copied out.
    fn take_record(&mut self) -> Option<RecordView> {
        None
    }

    /// Whether taken records live in memory another process writes (a shared-memory ring
    /// slot), rather than in this process's heap.
    fn shared_memory(&self) -> bool {
        false
    }

    /// Whether records come from a shared stream's ring that the agent writes once for every
    /// subscriber on this host (rather than from a ring of this session's own).
    fn shared_ring(&self) -> bool {
        false
    }

    /// Copies the payload of the record whose header [`next_header`](BatchSource::next_header)
    /// returned into `out`, exactly `payload_len` bytes.
    fn read_payload(&mut self, out: &mut [u8]) -> Result<(), ReceiveError>;

    /// Waits at most `timeout` for the next record (or the end, or an error) to be at hand:
    /// false if the time ran out first. Nothing is consumed.
    fn wait_ready(&mut self, timeout: Duration) -> Result<bool, ReceiveError>;

    /// Copies out records that taken views have kept for long, now rather than in the next
    /// `next_header` (rings only; see `RingConsumer::make_room`).
    fn make_room(&mut self) -> Result<(), ReceiveError> {
        Ok(())
    }

    /// Stops the producer's side now (dropping the source does too).
    fn shutdown(&mut self);
}

/// Copies the payload of a `record` held in memory (header, then payload) into `out`, which
/// must be exactly its length: how a transport that keeps records whole serves
/// [`BatchSource::read_payload`]. `transport` names it in the error.
pub fn copy_payload(
    record: Option<&[u8]>,
    out: &mut [u8],
    transport: &str,
) -> Result<(), ReceiveError> {
    match record.and_then(|r| r.get(RECORD_HEADER_LEN..)) {
        Some(p) if p.len() == out.len() => {
            out.copy_from_slice(p);
            Ok(())
        }
        _ => Err(ReceiveError::Transport(format!(
            "{transport}: no record with a {}-byte payload is held",
            out.len()
        ))),
    }
}

/// The header of a record held whole in memory (a ring slot, an in-process buffer), checked
/// to be followed by exactly its payload: how a transport that keeps records whole serves
/// [`BatchSource::next_header`]. `transport` names it in the error.
pub fn record_header(record: &[u8], transport: &str) -> Result<BatchHeader, ReceiveError> {
    let len = record.len();
    let bad = |what: String| ReceiveError::Transport(format!("{transport}: {what}"));
    let Some(head) = record.first_chunk::<RECORD_HEADER_LEN>() else {
        return Err(bad(format!(
            "a {len}-byte batch record is shorter than its header"
        )));
    };
    let h = BatchHeader::parse(head).map_err(WireError::from)?;
    if RECORD_HEADER_LEN + h.payload_len as usize != len {
        return Err(bad(format!(
            "batch {} holds {} bytes of {} in a {len}-byte record",
            h.index, h.payload_len, h.codec
        )));
    }
    Ok(h)
}

/// A record held whole in this process's heap, handed over in place when its payload is
/// 8-byte aligned (as a typed view of its tokens needs); `None` leaves it held, for the
/// reader to copy its payload out.
pub fn take_in_place(held: &mut Option<Vec<u8>>) -> Option<RecordView> {
    let aligned = held
        .as_ref()
        .is_some_and(|r| (r.as_ptr() as usize + RECORD_HEADER_LEN).is_multiple_of(8));
    if !aligned {
        return None;
    }
    held.take().map(|r| Box::new(r) as RecordView)
}

/// Waits on `changed` while `pending` holds for the state in `state`, at most until
/// `deadline` (`None`: for as long as it takes): false if the deadline passed first. How a
/// transport in memory waits for its next record or its end.
pub fn wait_until<T>(
    state: &Mutex<T>,
    changed: &Condvar,
    deadline: Option<Instant>,
    pending: impl FnMut(&mut T) -> bool,
) -> bool {
    let s = state.lock().unwrap_or_else(PoisonError::into_inner);
    match deadline {
        None => {
            drop(changed.wait_while(s, pending));
            true
        }
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            let waited = changed.wait_timeout_while(s, left, pending);
            let (guard, timeout) = waited.unwrap_or_else(PoisonError::into_inner);
            drop(guard);
            !timeout.timed_out()
        }
    }
}
