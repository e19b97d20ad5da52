//! Batch records through a shared-memory ring (the emulated DMA path): the agent writes each
//! record into a slot of the ring the consumer created and mapped, and the consumer reads it
//! in place.
//!
//! Each slot holds one record: the [`crate::BatchHeader`] then the tokens already in the
//! plan's output dtype (memory is not a link: no wire codec). Errors go to the consumer as an
//! error frame on the Unix socket the ring came over, *before* the ring is marked aborted, so
//! the consumer finds the message when it sees the abort, after the last complete batch.

use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::ring::{RingError, RingProducer};
use crate::sink::{BatchSink, SinkError};
use crate::FrameWriter;

/// How often a producer waiting for a free slot checks whether its session was cancelled.
const RING_POLL: Duration = Duration::from_millis(250);

/// The producer side of a ring a consumer handed over, with the socket it came on.
pub struct RingSink {
    /// `None` once the stream is finished or failed.
    ring: Option<RingProducer>,
    sock: UnixStream,
    cancel: Arc<AtomicBool>,
    slot_size: usize,
}

impl RingSink {
    /// A sink into `ring`; error messages go to `sock`; a set `cancel` ends the stream.
    pub fn new(ring: RingProducer, sock: UnixStream, cancel: Arc<AtomicBool>) -> Self {
        let slot_size = usize::try_from(ring.layout().slot_size).unwrap_or(usize::MAX);
        RingSink {
            ring: Some(ring),
            sock,
            cancel,
            slot_size,
        }
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
        loop {
            if self.cancel.load(Ordering::Relaxed) {
                return Err(SinkError::Gone("closed by the client".into()));
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
