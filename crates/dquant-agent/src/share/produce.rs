//! A shared stream's producer thread: the plan run once, each record into the stream's
//! window (and its shared ring).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, PoisonError};
use std::time::Instant;

use dquant_remote::shutdown_message;
use dquant_transport::record::RECORD_HEADER_LEN;
use dquant_transport::sink::record_room;
use dquant_transport::{BatchHeader, BatchSink, SinkError};

use super::{End, NewStream, Pos, SharedStream, Slot, RECHECK};
use crate::produce::{run, Outcome, Producer};

/// The producer thread: waits for the group, then runs the plan into the window until the
/// end, a failure, a drain, or nobody left to deliver to.
pub(super) fn produce(stream: Arc<SharedStream>, new: NewStream, drain: &AtomicBool) {
    let deadline = Instant::now() + new.group_wait;
    let mut w = stream.lock();
    loop {
        let n = w.subscribers();
        if n == 0 {
            drop(w);
            return stream.end(End::Stopped("every subscriber left".into()));
        }
        if n >= new.group || Instant::now() >= deadline || drain.load(Ordering::Relaxed) {
            break;
        }
        // A join notifies `room` under this lock: none is missed between check and wait.
        w = stream
            .room
            .wait_timeout(w, RECHECK)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
    drop(w);
    let mut producer = Producer::new(new.pipeline, new.output, new.wire)
        .with_meter(new.meter)
        .with_faults(new.faults, crate::faults::Site::SharedStream)
        .encoding_ahead(new.encode_budget);
    let mut sink = WindowSink {
        stream: stream.clone(),
        drain,
        buf: Vec::new(),
    };
    let never = AtomicBool::new(false);
    let (outcome, stats) = run(&mut producer, &mut sink, &never, drain, Instant::now);
    let end = match outcome {
        Outcome::Finished => End::Finished,
        // However it stopped, a drain delivers every record made, then where to resume.
        _ if drain.load(Ordering::Relaxed) => {
            End::Drained(shutdown_message(stream.lock().head().consumed))
        }
        outcome => End::from(outcome),
    };
    tracing::info!(
        share = %stream.name,
        tenant = %stream.tenant,
        records = stats.records,
        tokens = stats.tokens,
        wire_bytes = stats.wire_bytes,
        end = ?end,
        "shared stream ended"
    );
    stream.end(end);
}

/// The producer's sink: each record goes into the window once it has room.
struct WindowSink<'a> {
    stream: Arc<SharedStream>,
    drain: &'a AtomicBool,
    buf: Vec<u8>,
}

impl BatchSink for WindowSink<'_> {
    fn reserve(&mut self, len: usize) -> Result<&mut [u8], SinkError> {
        let s = &self.stream;
        let mut w = s.lock();
        while !w.has_room() || w.subscribers() == 0 {
            if w.subscribers() == 0 {
                return Err(SinkError::Gone("every subscriber left".into()));
            }
            if self.drain.load(Ordering::Relaxed) {
                return Err(SinkError::Gone("the agent is shutting down".into()));
            }
            w = s
                .room
                .wait_timeout(w, RECHECK)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        drop(w);
        if self.buf.capacity() == 0 {
            self.buf = s.spares.take();
        }
        record_room(&mut self.buf, len)
    }

    fn commit(&mut self, len: usize) -> Result<(), SinkError> {
        let head: [u8; RECORD_HEADER_LEN] = self.buf[..RECORD_HEADER_LEN]
            .try_into()
            .map_err(|_| SinkError::Failed("a record shorter than its header".into()))?;
        let h = BatchHeader::parse(&head).map_err(|e| SinkError::Failed(e.to_string()))?;
        let mut record = std::mem::take(&mut self.buf);
        record.truncate(len);
        let s = &self.stream;
        let slot = Arc::new(Slot {
            wire: record,
            tokens: h.tokens() as u64,
            crcs: OnceLock::new(),
            plain: OnceLock::new(),
            spares: s.spares.clone(),
        });
        let to = Pos {
            epoch: h.cursor_epoch,
            consumed: h.cursor_consumed,
        };
        let pushed = s.lock().push(slot, to);
        s.fresh.notify_all();
        match pushed {
            true => Ok(()),
            false => Err(SinkError::Failed("the window lost its room".into())),
        }
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        // The producer thread ends the stream with the run's outcome.
        Ok(())
    }

    fn fail(&mut self, _message: &str) {}
}
