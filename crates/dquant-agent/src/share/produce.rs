//! A shared stream's producer thread: the plan run once, each record into the stream's
//! window and, while the stream has one, its shared ring ([`super::broadcast`]).
//!
//! The producer takes a new ring's [`Writer`] at its next record and writes the ring from
//! then on: records in the output dtype (a plan without a wire codec, or any plan while
//! every subscriber reads the ring) are made straight in the ring's next slot, and the
//! window gets a copy only for subscribers that do not read the ring; other records are made
//! in the wire codec for the window and put into the ring once, decoded. It reads the ring's
//! mailbox (joins, leaves) before each record and while it waits.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, PoisonError};
use std::time::Instant;

use dquant_engine::plain_codec;
use dquant_plan::WireCodec;
use dquant_remote::shutdown_message;
use dquant_transport::record::RECORD_HEADER_LEN;
use dquant_transport::sink::record_room;
use dquant_transport::{BatchHeader, BatchSink, SinkError};

use super::broadcast::{close, Writer, STEP};
use super::{End, NewStream, Pos, SharedStream, Slot, RECHECK};
use crate::produce::{run, Outcome, Producer};

/// The producer thread: waits for the group, then runs the plan into the window until the
/// end, a failure, a drain, or nobody left to deliver to.
pub(super) fn produce(stream: Arc<SharedStream>, new: NewStream, drain: &AtomicBool) {
    let mut sink = WindowSink {
        stream: stream.clone(),
        drain,
        buf: Vec::new(),
        plain: new.wire == WireCodec::Fixed(plain_codec(new.output)),
        next_plain: false,
        ring: None,
        in_ring: false,
    };
    if !wait_for_group(&mut sink, &new, drain) {
        let end = End::Stopped("every subscriber left".into());
        return finish(sink, stream, end);
    }
    let mut producer = Producer::new(new.pipeline, new.output, new.wire)
        .with_meter(new.meter)
        .with_faults(new.faults, crate::faults::Site::SharedStream)
        .encoding_ahead(new.encode_budget);
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
    finish(sink, stream, end);
}

/// Waits until `new.group` subscribers have joined (or its group wait passed, or the agent
/// drains), taking shared-memory subscribers into the ring meanwhile; `false` when every
/// subscriber left.
fn wait_for_group(sink: &mut WindowSink<'_>, new: &NewStream, drain: &AtomicBool) -> bool {
    let stream = sink.stream.clone();
    let deadline = Instant::now() + new.group_wait;
    loop {
        sink.tend_ring();
        let w = stream.lock();
        let n = w.subscribers();
        if n == 0 {
            return false;
        }
        if n >= new.group || Instant::now() >= deadline || drain.load(Ordering::Relaxed) {
            return true;
        }
        // A join notifies `room` under this lock: none is missed between check and wait.
        let wait = if sink.ring.is_some() { STEP } else { RECHECK };
        drop(
            stream
                .room
                .wait_timeout(w, wait)
                .unwrap_or_else(PoisonError::into_inner),
        );
    }
}

/// The stream ends as `end`, then its ring, which no longer starts again. The producer lets
/// go of the stream first: once every subscriber has left, the name is free again.
fn finish(mut sink: WindowSink<'_>, stream: Arc<SharedStream>, end: End) {
    let ring = sink.ring.take().map(|w| {
        // A drain may have come before the ring had every record the window has: its
        // readers resume from where the ring ends.
        let ring_end = match &end {
            End::Drained(_) => End::Drained(shutdown_message(w.position().consumed)),
            end => end.clone(),
        };
        (w, ring_end)
    });
    drop(sink);
    stream.end(end.clone());
    close(stream, &end);
    if let Some((w, end)) = ring {
        w.end(end);
    }
}

/// The producer's sink: each record goes into the window once it has room, and into the
/// stream's shared ring.
struct WindowSink<'a> {
    stream: Arc<SharedStream>,
    drain: &'a AtomicBool,
    buf: Vec<u8>,
    /// The plan's records are the ring's form (the output dtype): they can be made in it.
    plain: bool,
    /// The next record is made in the output dtype, whatever the wire codec
    /// ([`BatchSink::output_dtype_next`]): every subscriber reads the ring.
    next_plain: bool,
    /// The stream's shared ring, once the producer took its writer.
    ring: Option<Writer>,
    /// The room [`BatchSink::reserve`] gave last is the ring's next slot, not `buf`.
    in_ring: bool,
}

impl WindowSink<'_> {
    /// Takes a new ring's writer in, reads its mailbox and puts into it the window's records
    /// it does not have; a ring that fails there ends (its members are told why), and the
    /// stream goes on without it.
    fn tend_ring(&mut self) {
        if self.ring.is_none() {
            self.ring = Writer::take(&self.stream);
            if let Some(Err(e)) = self.ring.as_ref().map(|w| w.fits(&self.stream.info)) {
                return self.end_ring(End::Failed(e.to_string()));
            }
        }
        let Some(w) = self.ring.as_mut() else {
            return;
        };
        w.read_mail();
        match w.catch_up(self.drain) {
            Ok(()) => {}
            // Draining: the stream ends, and the ring with it, saying where to resume.
            Err(_) if self.drain.load(Ordering::Relaxed) => {}
            Err(e) => self.end_ring(ring_end(e)),
        }
    }

    fn end_ring(&mut self, end: End) {
        if let Some(w) = self.ring.take() {
            w.end(end);
        }
    }

    /// Waits until the window has room for the next record, tending the ring meanwhile.
    fn wait_for_window(&mut self) -> Result<(), SinkError> {
        let s = self.stream.clone();
        loop {
            let w = s.lock();
            if w.subscribers() == 0 {
                return Err(SinkError::Gone("every subscriber left".into()));
            }
            if w.has_room() {
                return Ok(());
            }
            if self.drain.load(Ordering::Relaxed) {
                return Err(SinkError::Gone("the agent is shutting down".into()));
            }
            let wait = if self.ring.is_some() { STEP } else { RECHECK };
            drop(
                s.room
                    .wait_timeout(w, wait)
                    .unwrap_or_else(PoisonError::into_inner),
            );
            self.tend_ring();
        }
    }

    /// Whether every subscriber reads the ring (which this producer writes).
    fn all_in_ring(&self) -> bool {
        self.ring
            .as_ref()
            .is_some_and(|w| !self.stream.read_outside(&w.sessions()))
    }

    /// Whether the next record can be made in the ring: it is in the ring's form, and every
    /// subscriber reads the ring. Waits for the ring's room then; a ring that fails ends.
    fn ring_ready(&mut self) -> Result<bool, SinkError> {
        let plain = self.plain || self.next_plain;
        let Some(w) = self.ring.as_mut().filter(|_| plain) else {
            return Ok(false);
        };
        if self.stream.read_outside(&w.sessions()) {
            return Ok(false);
        }
        match w.wait_room(self.drain) {
            Ok(()) => Ok(true),
            Err(e) if self.drain.load(Ordering::Relaxed) => Err(e),
            Err(e) => {
                self.end_ring(ring_end(e));
                Ok(false)
            }
        }
    }

    /// Publishes the record made in the ring's next slot (`len` bytes), then pushes it into
    /// the window for the stream's positions (with a copy for subscribers outside the ring).
    fn commit_in_ring(&mut self, len: usize) -> Result<(), SinkError> {
        let Some(w) = self.ring.as_mut() else {
            return Err(SinkError::Failed(
                "a record made in a ring that ended".into(),
            ));
        };
        let sessions = w.sessions();
        let record = &w.room()?[..len];
        let h = parse_header(record)?;
        let to = Pos {
            epoch: h.cursor_epoch,
            consumed: h.cursor_consumed,
        };
        let tokens = h.tokens() as u64;
        if !self.stream.push_from_ring(record, tokens, to, &sessions) {
            return Err(SinkError::Failed("the window lost its room".into()));
        }
        let committed = w.commit(len);
        match committed {
            Ok(()) => w.written(tokens, len as u64),
            Err(e) => self.end_ring(ring_end(e)),
        }
        Ok(())
    }
}

/// How a ring ends when its writing failed.
fn ring_end(e: SinkError) -> End {
    match e {
        SinkError::Gone(m) => End::Stopped(m),
        e => End::Failed(e.to_string()),
    }
}

fn parse_header(record: &[u8]) -> Result<BatchHeader, SinkError> {
    let head: &[u8; RECORD_HEADER_LEN] = record
        .get(..RECORD_HEADER_LEN)
        .and_then(|h| h.try_into().ok())
        .ok_or_else(|| SinkError::Failed("a record shorter than its header".into()))?;
    BatchHeader::parse(head).map_err(|e| SinkError::Failed(e.to_string()))
}

impl BatchSink for WindowSink<'_> {
    /// While every subscriber reads the ring, records are made in the output dtype straight
    /// in it, whatever the wire codec: nobody would read the wire form (a compressed record
    /// would be decoded again for the ring).
    fn output_dtype_next(&mut self) -> bool {
        self.tend_ring();
        self.next_plain = self.all_in_ring();
        self.next_plain
    }

    fn reserve(&mut self, len: usize) -> Result<&mut [u8], SinkError> {
        self.wait_for_window()?;
        self.tend_ring();
        self.in_ring = self.ring_ready()?;
        if self.in_ring {
            return match self.ring.as_mut() {
                Some(w) => Ok(&mut w.room()?[..len]),
                None => Err(SinkError::Failed("the shared ring ended".into())),
            };
        }
        if self.buf.capacity() == 0 {
            self.buf = self.stream.spares.take();
        }
        record_room(&mut self.buf, len)
    }

    fn commit(&mut self, len: usize) -> Result<(), SinkError> {
        if self.in_ring {
            return self.commit_in_ring(len);
        }
        let h = parse_header(&self.buf)?;
        let mut record = std::mem::take(&mut self.buf);
        record.truncate(len);
        let s = &self.stream;
        let slot = Arc::new(Slot {
            wire: record,
            tokens: h.tokens() as u64,
            crcs: OnceLock::new(),
            plain: OnceLock::new(),
            spares: s.spares.clone(),
            ring_only: false,
        });
        let to = Pos {
            epoch: h.cursor_epoch,
            consumed: h.cursor_consumed,
        };
        let pushed = s.lock().push(slot, to);
        s.fresh.notify_all();
        if !pushed {
            return Err(SinkError::Failed("the window lost its room".into()));
        }
        // The ring gets it now, in the output dtype (unless the agent drains meanwhile: the
        // ring then ends where its records do, [`finish`]).
        self.tend_ring();
        Ok(())
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        // The producer thread ends the stream with the run's outcome.
        Ok(())
    }

    fn fail(&mut self, _message: &str) {}
}
