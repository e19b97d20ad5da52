//! Where a range session's answers go: frames on its TCP (or TLS) connection, or one slot
//! each of the ring its client handed over; and how an error reaches the client on each.

use std::time::{Duration, Instant};

use dquant_transport::record::RECORD_HEADER_LEN;
use dquant_transport::shm::RingSink;
use dquant_transport::tcp::FrameSink;
use dquant_transport::{BatchSink, BufferPool, DataStream, FrameWriter, SinkError};

use super::RangeError;

/// Sends the error frame, then half-closes and reads what the client still sends until it
/// hangs up (at most 2 s). A client that reads ahead has requests in flight when an error
/// stops us; closing with them unread would make the kernel reset the connection, and a
/// reset can overtake the error frame, so the client would see a truncated stream instead of
/// the message.
fn fail_and_linger(w: &mut FrameWriter<DataStream>, message: &str) {
    use std::io::{ErrorKind, Read};
    if w.fail(message).is_err() {
        return;
    }
    let s = w.get_ref().socket();
    if s.shutdown(std::net::Shutdown::Write).is_err() {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let mut sink = [0u8; 16 << 10];
    while Instant::now() < deadline {
        match (&*s).read(&mut sink) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::Interrupted | ErrorKind::WouldBlock | ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
}

/// Where one request's answers go, record by record.
pub(crate) trait RecordOut {
    /// Writes one answer: Ok(false) when the client went away, Err with the message for it
    /// when the transport cannot carry the answer.
    fn put(&mut self, head: &[u8; RECORD_HEADER_LEN], payload: &[u8]) -> Result<bool, RangeError>;
}

impl RecordOut for FrameSink<'_> {
    fn put(&mut self, head: &[u8; RECORD_HEADER_LEN], payload: &[u8]) -> Result<bool, RangeError> {
        Ok(self.write(head).is_ok() && self.write(payload).is_ok())
    }
}

/// Answers into a shared-memory ring: each in one slot, counted.
struct RingOut<'a> {
    sink: &'a mut RingSink,
    bytes: u64,
}

impl RecordOut for RingOut<'_> {
    fn put(&mut self, head: &[u8; RECORD_HEADER_LEN], payload: &[u8]) -> Result<bool, RangeError> {
        let len = RECORD_HEADER_LEN + payload.len();
        let put = self
            .sink
            .reserve(len)
            .map(|room| {
                let (h, p) = room.split_at_mut(RECORD_HEADER_LEN);
                h.copy_from_slice(head);
                p.copy_from_slice(payload);
            })
            .and_then(|()| self.sink.commit(len));
        match put {
            Ok(()) => {
                self.bytes += len as u64;
                Ok(true)
            }
            Err(SinkError::Failed(m)) => Err(RangeError::Ring(m)),
            Err(_) => Ok(false),
        }
    }
}

/// Where a session's answers go.
pub(super) enum Out {
    /// Frames on its TCP (or TLS) connection.
    Tcp {
        w: FrameWriter<DataStream>,
        buffers: BufferPool,
    },
    /// Slots of the ring its client handed over (the emulated DMA path).
    Ring(RingSink),
}

impl Out {
    /// What the link has held the writer back so far (`None` for a ring).
    pub(super) fn waited(&self) -> Option<Duration> {
        match self {
            Out::Tcp { w, .. } => Some(w.waited()),
            Out::Ring(_) => None,
        }
    }

    /// Writes one request's answers (`answer` puts them) and hands them to the client:
    /// what `answer` said, whether the client still takes answers, and the bytes sent.
    pub(super) fn request(
        &mut self,
        answer: impl FnOnce(&mut dyn RecordOut) -> Result<bool, RangeError>,
    ) -> (Result<bool, RangeError>, bool, u64) {
        match self {
            Out::Tcp { w, buffers } => {
                let mut sink = FrameSink::direct(buffers.clone(), w);
                let answered = answer(&mut sink);
                let flushed = sink.flush().is_ok();
                let bytes = sink.bytes();
                drop(sink);
                let flushed = flushed && (!matches!(answered, Ok(true)) || w.flush().is_ok());
                (answered, flushed, bytes)
            }
            Out::Ring(sink) => {
                let mut out = RingOut { sink, bytes: 0 };
                let answered = answer(&mut out);
                (answered, true, out.bytes)
            }
        }
    }

    pub(super) fn fail(&mut self, m: &str) {
        match self {
            Out::Tcp { w, .. } => fail_and_linger(w, m),
            Out::Ring(sink) => sink.fail(m),
        }
    }

    pub(super) fn finish(&mut self) {
        if let Out::Ring(sink) = self {
            let _ = sink.finish();
        }
    }
}
