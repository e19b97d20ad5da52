//! The agent's one produce loop: a plan's batches made into records on any transport.
//!
//! [`Producer`] is deterministic and does no I/O of its own beyond the plan's sources: each
//! [`Producer::step`] makes one batch record in a [`BatchSink`], and [`run`] drives steps
//! with the wall clock until the end, an error, a consumer that goes away or a cancel. TCP
//! frames, the shared-memory ring and the in-memory pair are all just sinks, so tests drive
//! the very loop the agent runs with an in-memory sink and simulated time (see the tests
//! below), and a new transport needs no loop of its own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use dquant_codec::encode_width;
use dquant_engine::record::{Payload, Record};
use dquant_engine::{
    plain_codec, plain_record, plain_record_len, put_trailer, EncodeAhead, EngineError, Pipeline,
    RecordEncoder,
};
use dquant_plan::{Cursor, OutputDType, WireCodec};
use dquant_remote::shutdown_message;
use dquant_transport::record::RECORD_HEADER_LEN;
use dquant_transport::{BatchSink, SinkError};

use crate::faults::{self, Faults, Site};
use crate::metrics::Meter;
use crate::stream_level::StreamLevel;

/// What one session moved, for the log line at its end.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stats {
    pub records: u64,
    pub tokens: u64,
    pub wire_bytes: u64,
}

/// Why a step made no record.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProduceError {
    /// The plan failed (a source, a token that does not fit): the consumer is told.
    #[error("{0}")]
    Engine(#[from] EngineError),
    /// The transport took no more records; see [`SinkError`].
    #[error("{0}")]
    Sink(#[from] SinkError),
    /// Making the batch panicked (a bug): the session ends with this message, the agent
    /// serves on ([`crate::faults`]).
    #[error("{0}")]
    Panicked(String),
}

/// What a step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// One record was committed: `tokens` tokens in `bytes` record bytes.
    Batch { tokens: u64, bytes: u64 },
    /// The stream has no more batches.
    End,
}

/// A plan's pipeline and the codec policy of its session.
pub(crate) struct Producer {
    pipeline: Box<Pipeline>,
    output: OutputDType,
    /// `None` when batches travel in the output dtype itself: made straight into the
    /// transport's room by [`Pipeline::next_batch_into`].
    encoder: Option<RecordEncoder>,
    /// Batches compressed on the agent's worker pool, a few ahead of the one delivered
    /// ([`Producer::encoding_ahead`]); `None`: each on the session's thread, when delivered.
    ahead: Option<EncodeAhead>,
    /// A stream codec's zstd level, fitted to the transport's backlog (`None` for other
    /// codecs, and until [`Producer::fitting_level`]).
    level: Option<StreamLevel>,
    wire: WireCodec,
    /// Room for the largest record: header and the largest payload a full batch can have.
    room: usize,
    /// The same in the output dtype (a sink may ask for that form, [`Producer::step`]).
    plain_room: usize,
    /// Where each batch made is counted (the agent's metrics, by tenant).
    meter: Meter,
    /// The cursor once every batch committed so far is consumed (batches encoded ahead are
    /// not: a drained stream resumes at the first of them).
    delivered: Cursor,
    /// Faults tests arm (debug builds), and where this producer runs.
    faults: (Faults, Site),
}

impl Producer {
    /// A producer of `pipeline`'s batches for a consumer that wants `output`, travelling in
    /// `wire` (a shared-memory ring passes the output dtype's plain codec: memory is not a
    /// link).
    pub fn new(pipeline: Box<Pipeline>, output: OutputDType, wire: WireCodec) -> Self {
        let plain = wire == WireCodec::Fixed(plain_codec(output));
        let room = record_room(&pipeline, output, wire);
        let plain_room = plain_record_len(&pipeline, output);
        // Checks that cannot fail are skipped: a u16 dataset always fits a u16 wire.
        let encoder = (!plain).then(|| RecordEncoder::new(wire, pipeline.max_token_bound()));
        let delivered = pipeline.cursor();
        Producer {
            pipeline,
            output,
            encoder,
            ahead: None,
            level: None,
            wire,
            room,
            plain_room,
            meter: Meter::off(),
            delivered,
            faults: (Faults::default(), Site::Session),
        }
    }

    /// Compresses batches on the pipeline's worker pool, as many ahead as fit half of
    /// `budget` bytes (the session's prefetch budget), and one more than the pool has
    /// threads (one queued while each encodes), when the wire
    /// codec compresses (plain and bit-packed codecs cost no more than the copy) and the
    /// pool has two workers or more. Fewer than two ahead would overlap nothing. Otherwise
    /// each batch is compressed on the session's thread.
    pub fn encoding_ahead(mut self, budget: usize) -> Self {
        // A stream codec's batches share one zstd stream, compressed in order on the
        // session's thread: split over the pool's threads (one stream a lane) the lanes lose
        // each other's history, and code stores 1.0-1.1× whole-file zstd -3 instead of 0.83×
        // (`dquant bench codecs --lanes`).
        let compresses = self.wire.compresses() && !self.wire.compression().is_stream();
        // One worker only moves the compression off the session's thread: on 2 cores that
        // cost more (batches crossing cores) than the reads it overlaps saved.
        let Some(pool) = self
            .pipeline
            .worker_pool()
            .filter(|p| compresses && p.workers() >= 2)
        else {
            return self;
        };
        let tokens = self.pipeline.schedule().batch_tokens() as usize;
        let per_batch = self.room + 4 * tokens;
        let window = (budget / 2 / per_batch.max(1)).min(pool.readers());
        if window >= 2 {
            let (bound, l) = (self.pipeline.max_token_bound(), self.pipeline.sample_len());
            self.ahead = Some(EncodeAhead::new(pool.clone(), self.wire, bound, l, window));
        }
        self
    }

    /// Fits a stream codec's zstd level to the transport (see [`crate::stream_level`]): from
    /// the plan's level down to 1 while the sender waits for records, back up while records
    /// wait to be sent. Transports that cannot tell their backlog keep the plan's level, as
    /// do other codecs.
    pub fn fitting_level(mut self) -> Self {
        self.level = self
            .encoder
            .as_ref()
            .and_then(RecordEncoder::stream_level)
            .map(StreamLevel::new);
        self
    }

    /// The zstd level the stream's next batch is compressed at, when the codec is a stream.
    #[cfg(test)]
    pub fn stream_level(&self) -> Option<i32> {
        self.encoder.as_ref().and_then(RecordEncoder::stream_level)
    }

    /// Checks `faults` before each batch, as a producer at `site` (tests' fault injection).
    pub fn with_faults(mut self, faults: Faults, site: Site) -> Self {
        self.faults = (faults, site);
        self
    }

    /// Counts each batch made in `meter`.
    pub fn with_meter(mut self, meter: Meter) -> Self {
        self.meter = meter;
        self
    }

    /// Where the stream stands: the cursor once every batch committed so far is consumed.
    pub fn cursor(&self) -> Cursor {
        self.delivered.clone()
    }

    /// Bytes of room a record may need (what [`BatchSink::reserve`] is asked for).
    pub fn room(&self) -> usize {
        self.room
    }

    /// Makes the next batch record in `sink`. Room is reserved before the batch is taken
    /// from the pipeline, so a sink that is full ([`SinkError::Full`]) loses nothing: step
    /// again once it has room.
    ///
    /// A sink whose readers all take the output dtype ([`BatchSink::output_dtype_next`])
    /// gets the batch in it, not in the wire codec, once the batches encoded ahead (taken
    /// from the pipeline before it) are delivered.
    pub fn step(&mut self, sink: &mut dyn BatchSink) -> Result<Step, ProduceError> {
        if self.encoder.is_none() {
            return self.step_plain(sink);
        }
        let plain = sink.output_dtype_next();
        let queued = self.ahead.as_ref().map_or(0, EncodeAhead::in_flight);
        if plain && queued == 0 {
            return self.step_plain(sink);
        }
        if self.ahead.is_some() {
            return self.step_ahead(sink, !plain);
        }
        sink.reserve(self.room)?;
        // Once a batch (room reserved: a step the sink refused is taken again).
        self.fit_level(sink.backlog());
        self.step_encoded(sink)
    }

    /// Tells the stream's level what the transport's backlog is before a batch is made.
    fn fit_level(&mut self, backlog: Option<f64>) {
        let (Some(level), Some(backlog)) = (self.level.as_mut(), backlog) else {
            return;
        };
        if let (Some(l), Some(enc)) = (level.observe(backlog), self.encoder.as_mut()) {
            enc.set_stream_level(l);
        }
    }

    /// The next batch encoded ahead on the worker pool; the session's thread meanwhile takes
    /// more batches from the pipeline (reads, packing, fit checks) for the pool, when
    /// `refill`.
    fn step_ahead(&mut self, sink: &mut dyn BatchSink, refill: bool) -> Result<Step, ProduceError> {
        let room = sink.reserve(self.room)?;
        let Some(ahead) = self.ahead.as_mut() else {
            return Err(EngineError::Usage("a step ahead without workers".into()).into());
        };
        if refill || ahead.in_flight() == 0 {
            ahead.fill(&mut self.pipeline, self.output.width());
        }
        let Some(next) = ahead.next_encoded() else {
            return Ok(Step::End);
        };
        let mut e = next?;
        let (head, body) = room.split_at_mut(RECORD_HEADER_LEN);
        let Some(data) = body.get_mut(..e.payload.len()) else {
            let m = format!("batch {}: encoded past its room", e.header.index);
            return Err(EngineError::Usage(m).into());
        };
        data.copy_from_slice(&e.payload);
        let mut header = e.header;
        put_trailer(&mut header, e.trailer(), body)?;
        e.header = header;
        head.copy_from_slice(&e.header.encode());
        let len = RECORD_HEADER_LEN + e.header.payload_len as usize;
        sink.commit(len)?;
        let tokens = e.tokens;
        self.delivered = e.cursor.clone();
        ahead.recycle(e);
        Ok(Step::Batch {
            tokens,
            bytes: len as u64,
        })
    }

    /// A batch in the output dtype, made where the record goes: from a dataset that stores
    /// that dtype, one read from the page cache into the transport's memory.
    fn step_plain(&mut self, sink: &mut dyn BatchSink) -> Result<Step, ProduceError> {
        let room = sink.reserve(self.plain_room)?;
        let Some((h, b)) = plain_record(&mut self.pipeline, self.output, room)? else {
            return Ok(Step::End);
        };
        let len = RECORD_HEADER_LEN + h.payload_len as usize;
        sink.commit(len)?;
        self.delivered = b.cursor;
        Ok(Step::Batch {
            tokens: u64::from(h.samples) * u64::from(h.sample_len),
            bytes: len as u64,
        })
    }

    /// A batch encoded in the wire codec (checked to fit the output dtype too, so an agent
    /// fails exactly where, and as, the in-process reader would).
    fn step_encoded(&mut self, sink: &mut dyn BatchSink) -> Result<Step, ProduceError> {
        let sample_len = self.pipeline.sample_len();
        let Some(b) = self.pipeline.next_batch_checked(self.output.width())? else {
            return Ok(Step::End);
        };
        let tokens = b.tokens.len() as u64;
        let Some(enc) = self.encoder.as_mut() else {
            return Err(EngineError::Usage("an encoded step without an encoder".into()).into());
        };
        let Record {
            mut header,
            payload,
        } = enc.encode(&b, sample_len)?;
        let room = sink.reserve(self.room)?;
        let (head, body) = room.split_at_mut(RECORD_HEADER_LEN);
        let data = &mut body[..header.payload_len as usize];
        match payload {
            Payload::Bytes(p) => data.copy_from_slice(p),
            Payload::Plain { width, tokens } => {
                encode_width(width, tokens, data).map_err(|source| EngineError::Encode {
                    index: header.index,
                    source,
                })?
            }
        }
        put_trailer(&mut header, b.trailer(), body)?;
        head.copy_from_slice(&header.encode());
        let len = RECORD_HEADER_LEN + header.payload_len as usize;
        sink.commit(len)?;
        self.delivered = b.cursor.clone();
        Ok(Step::Batch {
            tokens,
            bytes: len as u64,
        })
    }
}

/// Bytes of room one of `pipeline`'s batch records may need in `wire` for a consumer of
/// `output`: the header, the largest payload a full batch can have, and the trailer.
pub(crate) fn record_room(pipeline: &Pipeline, output: OutputDType, wire: WireCodec) -> usize {
    if wire == WireCodec::Fixed(plain_codec(output)) {
        return plain_record_len(pipeline, output);
    }
    let tokens = pipeline.schedule().batch_tokens() as usize;
    (RECORD_HEADER_LEN + wire.max_encoded_len(tokens)).saturating_add(pipeline.trailer_bound())
}

/// A plan whose records do not fit the transport's (a ring's slots have a size).
#[derive(Debug, thiserror::Error)]
#[error("the transport's records hold {max} bytes; this plan's batches need {room} ({output})")]
pub(crate) struct TooLarge {
    pub max: usize,
    pub room: usize,
    pub output: OutputDType,
}

/// How a stream driven by [`run`] ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Every batch was delivered, then the end.
    Finished,
    /// The consumer went away or the session was cancelled (why, for the log).
    Stopped(String),
    /// The stream failed; the consumer was told this message after the last good batch.
    Failed(String),
    /// The agent is shutting down: after the last batch made, the consumer was told where
    /// to resume (this message).
    Drained(String),
}

/// Drives `producer` into `sink` until the end, an error, a consumer that goes away,
/// `cancel`, or `drain` (the agent is shutting down: the batch being made is finished, then
/// the consumer gets its resume cursor); `now` is the clock idle flushes go by.
pub(crate) fn run(
    producer: &mut Producer,
    sink: &mut dyn BatchSink,
    cancel: &AtomicBool,
    drain: &AtomicBool,
    now: impl Fn() -> Instant,
) -> (Outcome, Stats) {
    let mut stats = Stats::default();
    if let Some(max) = sink.max_record_len().filter(|&max| producer.room() > max) {
        {
            let m = TooLarge {
                max,
                room: producer.room(),
                output: producer.output,
            }
            .to_string();
            sink.fail(&m);
            return (Outcome::Failed(m), stats);
        }
    }
    loop {
        if cancel.load(Ordering::Relaxed) {
            return (Outcome::Stopped("closed by the client".into()), stats);
        }
        if drain.load(Ordering::Relaxed) {
            let m = shutdown_message(producer.cursor().consumed_samples);
            sink.fail(&m);
            return (Outcome::Drained(m), stats);
        }
        let step = step_contained(producer, sink, stats.records, &now);
        match step {
            Ok((Step::Batch { tokens, bytes }, ())) => {
                producer.meter.add(1, tokens, bytes);
                producer.meter.drawn(producer.pipeline.drawn());
                producer.meter.batch_reads(producer.pipeline.batch_reads());
                stats.records += 1;
                stats.tokens += tokens;
                stats.wire_bytes += bytes;
            }
            Ok((Step::End, ())) => {
                return match sink.finish() {
                    Ok(()) => (Outcome::Finished, stats),
                    Err(e) => (Outcome::Stopped(e.to_string()), stats),
                }
            }
            Err(ProduceError::Sink(SinkError::Gone(m))) => return (Outcome::Stopped(m), stats),
            Err(e) => {
                // Batches before the failure are delivered; then the error, verbatim.
                let m = e.to_string();
                sink.fail(&m);
                return (Outcome::Failed(m), stats);
            }
        }
    }
}

/// One step of `producer` (batch number `made`) and the idle flush after it; a panic in
/// either ends the stream with [`ProduceError::Panicked`] instead of the agent's thread.
fn step_contained(
    producer: &mut Producer,
    sink: &mut dyn BatchSink,
    made: u64,
    now: &impl Fn() -> Instant,
) -> Result<(Step, ()), ProduceError> {
    let step = faults::catch(
        "a producer",
        producer,
        |p| {
            p.faults.0.before_batch(p.faults.1, made);
            p.step(sink)
                .and_then(|s| Ok((s, sink.flush_if_idle(now())?)))
        },
        |p| Some(p.cursor().consumed_samples),
    );
    step.unwrap_or_else(|p| Err(ProduceError::Panicked(p.0)))
}

#[cfg(all(test, debug_assertions))]
mod simulation;
#[cfg(test)]
mod tests;
