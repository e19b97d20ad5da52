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
    batch_header, plain_codec, put_trailer, EncodeAhead, EngineError, Pipeline, RecordEncoder,
};
use dquant_plan::{Cursor, OutputDType, WireCodec};
use dquant_remote::shutdown_message;
use dquant_transport::record::RECORD_HEADER_LEN;
use dquant_transport::{BatchSink, SinkError};

use crate::faults::{self, Faults, Site};
use crate::metrics::Meter;

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
    wire: WireCodec,
    /// Room for the largest record: header and the largest payload a full batch can have.
    room: usize,
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
        // Checks that cannot fail are skipped: a u16 dataset always fits a u16 wire.
        let encoder = (!plain).then(|| RecordEncoder::new(wire, pipeline.max_token_bound()));
        let delivered = pipeline.cursor();
        Producer {
            pipeline,
            output,
            encoder,
            ahead: None,
            wire,
            room,
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
        let compresses = self.wire.compresses();
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
    pub fn step(&mut self, sink: &mut dyn BatchSink) -> Result<Step, ProduceError> {
        if self.encoder.is_none() {
            return self.step_plain(sink);
        }
        if self.ahead.is_some() {
            return self.step_ahead(sink);
        }
        sink.reserve(self.room)?;
        self.step_encoded(sink)
    }

    /// The next batch encoded ahead on the worker pool; the session's thread meanwhile takes
    /// more batches from the pipeline (reads, packing, fit checks) for the pool.
    fn step_ahead(&mut self, sink: &mut dyn BatchSink) -> Result<Step, ProduceError> {
        let room = sink.reserve(self.room)?;
        let Some(ahead) = self.ahead.as_mut() else {
            return Err(EngineError::Usage("a step ahead without workers".into()).into());
        };
        ahead.fill(&mut self.pipeline, self.output.width());
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
        put_trailer(&mut e.header, e.docs.as_ref(), &e.cursor.blend, body)?;
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
        let sample_len = self.pipeline.sample_len();
        let width = self.output.width();
        let room = sink.reserve(self.room)?;
        let (head, body) = room.split_at_mut(RECORD_HEADER_LEN);
        let Some(b) = self.pipeline.next_batch_into(width, body)? else {
            return Ok(Step::End);
        };
        let tokens = b.samples * sample_len;
        let payload_len = width.encoded_len(tokens);
        let mut h = batch_header(plain_codec(self.output), &b, sample_len, payload_len)?;
        put_trailer(&mut h, b.docs.as_ref(), &b.cursor.blend, body)?;
        head.copy_from_slice(&h.encode());
        let len = RECORD_HEADER_LEN + h.payload_len as usize;
        sink.commit(len)?;
        self.delivered = b.cursor;
        Ok(Step::Batch {
            tokens: tokens as u64,
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
        put_trailer(&mut header, b.docs, &b.cursor.blend, body)?;
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
    let tokens = pipeline.schedule().batch_tokens() as usize;
    let payload = if wire == WireCodec::Fixed(plain_codec(output)) {
        tokens * output.itemsize()
    } else {
        wire.max_encoded_len(tokens)
    };
    (RECORD_HEADER_LEN + payload).saturating_add(pipeline.trailer_bound())
}

/// Why a plan's batches cannot go over a transport whose records hold `max` bytes.
pub(crate) fn too_large(max: usize, room: usize, output: OutputDType) -> String {
    format!("the transport's records hold {max} bytes; this plan's batches need {room} ({output})")
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
            let m = too_large(max, producer.room(), producer.output);
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
    step.unwrap_or_else(|m| Err(ProduceError::Panicked(m)))
}

#[cfg(test)]
mod tests {
    //! The produce loop driven with the in-memory transport and a simulated clock: no
    //! sockets, no threads, no sleeps.

    use std::cell::Cell;
    use std::path::Path;
    use std::time::Duration;

    use dquant_codec::Decoder;
    use std::sync::Arc;

    use dquant_engine::{LocalSource, WorkerPool};
    use dquant_plan::{Plan, Source};
    use dquant_transport::memory::{pair, End, MemorySource};
    use dquant_transport::tcp::MAX_FRAME_AGE;
    use dquant_transport::BatchHeader;

    use super::*;

    /// A raw u16 token file of `n` tokens, with `big` (if any) at token 5000.
    fn dataset(dir: &Path, n: usize, big: Option<u16>) -> String {
        let mut tokens: Vec<u16> = (0..n).map(|i| (i * 7919 % 30_000) as u16).collect();
        if let Some(b) = big {
            tokens[5000] = b;
        }
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        let path = dir.join("tokens.u16");
        std::fs::write(&path, bytes).unwrap();
        path.display().to_string()
    }

    fn plan(uri: &str, output: OutputDType, wire: &str) -> Plan {
        let mut source = Source::new(uri);
        source.dtype = Some("u16".into());
        let mut p = Plan::new(vec![source], 63, 4);
        p.seed = 3;
        p.output = output;
        p.wire_codec = wire.into();
        p
    }

    fn pipeline(p: &Plan) -> Box<Pipeline> {
        Box::new(
            Pipeline::open(p, Cursor::START, |_, s| {
                Ok(Box::new(LocalSource::open(Path::new(&s.uri), s)?))
            })
            .unwrap(),
        )
    }

    fn producer(p: &Plan) -> Producer {
        producer_on(p, None)
    }

    /// A producer whose pipeline reads, and whose compressed batches are encoded ahead, on
    /// `pool` (when given).
    fn producer_on(p: &Plan, pool: Option<Arc<WorkerPool>>) -> Producer {
        let mut pl = pipeline(p);
        pl.set_worker_pool(pool);
        Producer::new(pl, p.output, p.parsed_wire_codec().unwrap()).encoding_ahead(64 << 20)
    }

    /// No pool, and a pool of two workers.
    fn pools() -> [Option<Arc<WorkerPool>>; 2] {
        [None, Some(Arc::new(WorkerPool::new(2).unwrap()))]
    }

    /// One received record: its header and its tokens decoded.
    fn decode(record: &[u8]) -> (BatchHeader, Vec<u32>) {
        let head: &[u8; RECORD_HEADER_LEN] = record[..RECORD_HEADER_LEN].try_into().unwrap();
        let h = BatchHeader::parse(head).unwrap();
        let payload = &record[RECORD_HEADER_LEN..];
        assert_eq!(payload.len(), h.payload_len as usize);
        let mut tokens = vec![0u32; h.tokens()];
        Decoder::new()
            .decode(h.codec, payload, &mut tokens)
            .unwrap();
        (h, tokens)
    }

    fn drain(source: &mut MemorySource, got: &mut Vec<(BatchHeader, Vec<u32>)>) {
        while let Some(r) = source.next_record() {
            got.push(decode(&r));
        }
    }

    /// The plan's batches in-process: (index, samples, cursor, tokens).
    fn local(p: &Plan) -> Vec<(u64, usize, Cursor, Vec<u32>)> {
        let mut pl = pipeline(p);
        let mut out = Vec::new();
        while let Some(b) = pl.next_batch().unwrap() {
            out.push((b.index, b.samples, b.cursor, b.tokens.to_vec()));
        }
        out
    }

    #[test]
    fn the_stream_through_a_small_memory_pair_equals_the_in_process_one() {
        let dir = tempfile::tempdir().unwrap();
        let uri = dataset(dir.path(), 20_000, None);
        let cases = [
            (OutputDType::U16, "u16"),
            (OutputDType::I32, "auto+zstd:1"),
            (OutputDType::I64, "auto+lz4"),
            (OutputDType::I32, "bits:16"),
            (OutputDType::U16, "auto"),
            (OutputDType::I32, "u16+zstd:3"),
        ];
        for ((output, wire), pool) in cases.into_iter().flat_map(|c| pools().map(|p| (c, p))) {
            let p = plan(&uri, output, wire);
            let want = local(&p);
            let pooled = pool.is_some();
            let mut prod = producer_on(&p, pool);
            assert_eq!(prod.ahead.is_some(), pooled && wire.contains('z'), "{wire}");
            let (mut sink, mut source) = pair(2);
            let mut got = Vec::new();
            let mut t = Instant::now();
            let mut fulls = 0;
            loop {
                match prod.step(&mut sink) {
                    Ok(Step::Batch { .. }) => sink.flush_if_idle(t).unwrap(),
                    Ok(Step::End) => break,
                    Err(ProduceError::Sink(SinkError::Full)) => {
                        // Nothing was taken from the pipeline: make room and step again.
                        fulls += 1;
                        t += MAX_FRAME_AGE;
                        sink.flush_if_idle(t).unwrap();
                        drain(&mut source, &mut got);
                    }
                    Err(e) => panic!("{wire}: {e}"),
                }
            }
            sink.finish().unwrap();
            drain(&mut source, &mut got);
            assert_eq!(source.end(), Some(End::Finished));
            assert!(fulls > 0, "{wire}: the pair never filled up");
            assert_eq!(got.len(), want.len(), "{wire}");
            for ((h, tokens), (index, samples, cursor, w)) in got.iter().zip(&want) {
                assert_eq!((h.index, h.samples as usize), (*index, *samples), "{wire}");
                assert_eq!(
                    (h.cursor_epoch, h.cursor_consumed),
                    (cursor.epoch, cursor.consumed_samples)
                );
                assert_eq!(h.sample_len, 64);
                assert_eq!(tokens, w, "{wire}: batch {index}");
            }
        }
    }

    #[test]
    fn idle_flushes_follow_the_simulated_clock() {
        let dir = tempfile::tempdir().unwrap();
        let uri = dataset(dir.path(), 20_000, None);
        let p = plan(&uri, OutputDType::I32, "auto+lz4");
        let mut prod = producer(&p);
        let (mut sink, mut source) = pair(100);
        let t0 = Instant::now();
        let step = |prod: &mut Producer, sink: &mut dyn BatchSink, at: Instant| {
            assert!(matches!(prod.step(sink).unwrap(), Step::Batch { .. }));
            sink.flush_if_idle(at).unwrap();
        };
        // The stream's first record goes out at once (time to first batch).
        step(&mut prod, &mut sink, t0);
        assert_eq!((source.next_record().is_some(), sink.held()), (true, 0));
        // Small records wait for company ...
        step(&mut prod, &mut sink, t0);
        step(&mut prod, &mut sink, t0 + MAX_FRAME_AGE / 2);
        assert_eq!((source.next_record().is_some(), sink.held()), (false, 2));
        // ... until the first of them has waited MAX_FRAME_AGE.
        step(&mut prod, &mut sink, t0 + MAX_FRAME_AGE);
        assert_eq!(sink.held(), 0);
        let mut got = Vec::new();
        drain(&mut source, &mut got);
        assert_eq!(got.iter().map(|r| r.0.index).collect::<Vec<_>>(), [1, 2, 3]);
        // A consumer that has not taken what it was given gets nothing more, however long
        // the records wait: it would only fall further behind in smaller pieces.
        let t1 = t0 + 10 * MAX_FRAME_AGE;
        step(&mut prod, &mut sink, t1);
        step(&mut prod, &mut sink, t1 + Duration::from_millis(1));
        step(&mut prod, &mut sink, t1 + MAX_FRAME_AGE);
        assert_eq!(sink.held(), 0, "an idle consumer gets the aged records");
        step(&mut prod, &mut sink, t1 + 5 * MAX_FRAME_AGE);
        assert_eq!(sink.held(), 1, "a lagging consumer is not flushed to");
        drain(&mut source, &mut got);
        assert_eq!(got.len(), 6);
    }

    #[test]
    fn a_token_over_a_fixed_wire_codec_fails_after_the_batches_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let uri = dataset(dir.path(), 20_000, Some(60_000));
        for (wire, pool) in ["bits:15", "bits:15+zstd:1"]
            .into_iter()
            .flat_map(|w| pools().map(|p| (w, p)))
        {
            let mut p = plan(&uri, OutputDType::I32, wire);
            p.shuffle = false;
            let mut prod = producer_on(&p, pool);
            let (mut sink, mut source) = pair(usize::MAX);
            let clock = Cell::new(Instant::now());
            let tick = || {
                clock.set(clock.get() + Duration::from_micros(100));
                clock.get()
            };
            let no = AtomicBool::new(false);
            let (outcome, stats) = run(&mut prod, &mut sink, &no, &no, tick);
            let want = format!(
                "sources[0] ({uri}): wire codec {wire}: token 60000 at offset 5000 does not fit in bits:15 (max 32767); it needs 16 bits: use bits:16 or wider"
            );
            assert!(
                matches!(&outcome, Outcome::Failed(m) if *m == want),
                "{outcome:?}"
            );
            // Token 5000 is in sample 79 (tokens 4977..5041) of batch 19: the batches before
            // it are delivered first, also when later ones were taken ahead.
            assert_eq!(stats.records, 19);
            let mut got = Vec::new();
            drain(&mut source, &mut got);
            assert_eq!(got.len(), 19);
            assert_eq!(source.end(), Some(End::Failed(want)));
        }
    }

    #[test]
    fn cancel_and_a_consumer_that_hangs_up_stop_the_loop_quietly() {
        let dir = tempfile::tempdir().unwrap();
        let uri = dataset(dir.path(), 20_000, None);
        let p = plan(&uri, OutputDType::U16, "auto+zstd:1");
        let (mut sink, mut source) = pair(usize::MAX);
        let (outcome, stats) = run(
            &mut producer(&p),
            &mut sink,
            &AtomicBool::new(true),
            &AtomicBool::new(false),
            Instant::now,
        );
        assert!(matches!(&outcome, Outcome::Stopped(m) if m == "closed by the client"));
        assert_eq!(stats, Stats::default());
        source.close();
        let (outcome, _) = run(
            &mut producer(&p),
            &mut sink,
            &AtomicBool::new(false),
            &AtomicBool::new(false),
            Instant::now,
        );
        assert!(matches!(&outcome, Outcome::Stopped(m) if m == "client went away"));
        assert_eq!(source.end(), None);
    }

    #[test]
    fn a_plan_whose_batches_exceed_the_transport_s_records_is_refused_up_front() {
        struct Tiny(dquant_transport::memory::MemorySink);
        impl BatchSink for Tiny {
            fn max_record_len(&self) -> Option<usize> {
                Some(4096)
            }
            fn reserve(&mut self, len: usize) -> Result<&mut [u8], SinkError> {
                self.0.reserve(len)
            }
            fn commit(&mut self, len: usize) -> Result<(), SinkError> {
                self.0.commit(len)
            }
            fn finish(&mut self) -> Result<(), SinkError> {
                self.0.finish()
            }
            fn fail(&mut self, message: &str) {
                self.0.fail(message)
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let uri = dataset(dir.path(), 20_000, None);
        let p = plan(&uri, OutputDType::I64, "i64");
        assert_eq!(producer(&p).room(), RECORD_HEADER_LEN + 4 * 64 * 8);
        let mut p = p;
        p.batch_size = 16;
        let (sink, source) = pair(10);
        let (outcome, stats) = run(
            &mut producer(&p),
            &mut Tiny(sink),
            &AtomicBool::new(false),
            &AtomicBool::new(false),
            Instant::now,
        );
        let want = "the transport's records hold 4096 bytes; this plan's batches need 8240 (i64)";
        assert!(
            matches!(&outcome, Outcome::Failed(m) if m == want),
            "{outcome:?}"
        );
        assert_eq!(stats.records, 0);
        assert_eq!(source.end(), Some(End::Failed(want.into())));
    }

    #[test]
    fn a_drain_ends_the_stream_after_the_batch_in_hand_with_the_resume_cursor() {
        for pool in pools() {
            drain_resumes_after_the_delivered_batches(pool);
        }
    }

    /// Batches encoded ahead but not delivered are not skipped: the resume cursor is the
    /// delivered batches'.
    fn drain_resumes_after_the_delivered_batches(pool: Option<Arc<WorkerPool>>) {
        let dir = tempfile::tempdir().unwrap();
        let uri = dataset(dir.path(), 20_000, None);
        let p = plan(&uri, OutputDType::U16, "auto+zstd:1");
        let (mut sink, mut source) = pair(usize::MAX);
        let (cancel, draining) = (AtomicBool::new(false), AtomicBool::new(false));
        // The clock is asked once per step: the agent starts shutting down during step 7.
        let steps = Cell::new(0);
        let tick = || {
            steps.set(steps.get() + 1);
            if steps.get() == 7 {
                draining.store(true, Ordering::Relaxed);
            }
            Instant::now()
        };
        let mut prod = producer_on(&p, pool);
        let (outcome, stats) = run(&mut prod, &mut sink, &cancel, &draining, tick);
        // Seven batches of 4 samples were made and delivered; the consumer resumes after them.
        let want = "agent shutting down; resume from consumed_samples 28";
        assert!(
            matches!(&outcome, Outcome::Drained(m) if m == want),
            "{outcome:?}"
        );
        assert_eq!(stats.records, 7);
        let mut got = Vec::new();
        drain(&mut source, &mut got);
        assert_eq!(got.len(), 7);
        assert_eq!(source.end(), Some(End::Failed(want.into())));
        // Resuming from that cursor continues with the eighth batch exactly: the two parts
        // together are the whole stream.
        let whole = |cursor: Cursor| {
            let pl = Pipeline::open(&p, cursor, |_, s| {
                Ok(Box::new(LocalSource::open(Path::new(&s.uri), s)?))
            })
            .unwrap();
            let mut prod = Producer::new(Box::new(pl), p.output, p.parsed_wire_codec().unwrap());
            let (mut sink, mut source) = pair(usize::MAX);
            let no = AtomicBool::new(false);
            run(&mut prod, &mut sink, &no, &no, Instant::now);
            let mut out = Vec::new();
            drain(&mut source, &mut out);
            out
        };
        got.extend(whole(Cursor::new(0, 28)));
        assert_eq!(got, whole(Cursor::START));
    }
}
