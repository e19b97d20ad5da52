//! The produce loop driven over the in-memory pair with a simulated clock (no sockets,
//! threads or sleeps): every batch once and in order under back-pressure, idle flushes by
//! the clock, errors after the batches before them. `simulation.rs` runs the same loop under
//! random schedules, with these helpers.

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
pub(super) fn dataset(dir: &Path, n: usize, big: Option<u16>) -> String {
    let mut tokens: Vec<u16> = (0..n).map(|i| (i * 7919 % 30_000) as u16).collect();
    if let Some(b) = big {
        tokens[5000] = b;
    }
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    let path = dir.join("tokens.u16");
    std::fs::write(&path, bytes).unwrap();
    path.display().to_string()
}

pub(super) fn plan(uri: &str, output: OutputDType, wire: &str) -> Plan {
    let mut source = Source::new(uri);
    source.dtype = Some("u16".into());
    let mut p = Plan::new(vec![source], 63, 4);
    p.seed = 3;
    p.output = output;
    p.wire_codec = wire.into();
    p
}

fn pipeline(p: &Plan) -> Box<Pipeline> {
    pipeline_at(p, Cursor::START)
}

/// `p`'s pipeline over its local sources, opened at `cursor`.
pub(super) fn pipeline_at(p: &Plan, cursor: Cursor) -> Box<Pipeline> {
    Box::new(
        Pipeline::open(p, cursor, |_, s| {
            Ok(Box::new(LocalSource::open(Path::new(&s.uri), s)?))
        })
        .unwrap(),
    )
}

pub(super) fn producer(p: &Plan) -> Producer {
    producer_on(p, None)
}

/// A producer whose pipeline reads, and whose compressed batches are encoded ahead, on
/// `pool` (when given).
fn producer_on(p: &Plan, pool: Option<Arc<WorkerPool>>) -> Producer {
    let mut pl = pipeline(p);
    pl.set_worker_pool(pool);
    Producer::new(pl, p.output, p.parsed_wire_codec().unwrap()).encoding_ahead(64 << 20)
}

/// No pool, and a pool of two workers that takes a share of every batch, however fast its
/// reads.
fn pools() -> [Option<Arc<WorkerPool>>; 2] {
    let pool = WorkerPool::new(2).unwrap().min_share_of(Duration::ZERO);
    [None, Some(Arc::new(pool))]
}

/// One received record: its header and its tokens decoded.
pub(super) fn decode(record: &[u8]) -> (BatchHeader, Vec<u32>) {
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
pub(super) fn local(p: &Plan) -> Vec<(u64, usize, Cursor, Vec<u32>)> {
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
        let pl = pipeline_at(&p, cursor);
        let mut prod = Producer::new(pl, p.output, p.parsed_wire_codec().unwrap());
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

/// A sink that says its backlog is `backlog` (the memory pair cannot tell).
struct Backlogged<'a> {
    inner: &'a mut dyn BatchSink,
    backlog: f64,
}

impl BatchSink for Backlogged<'_> {
    fn reserve(&mut self, len: usize) -> Result<&mut [u8], SinkError> {
        self.inner.reserve(len)
    }
    fn commit(&mut self, len: usize) -> Result<(), SinkError> {
        self.inner.commit(len)
    }
    fn backlog(&self) -> Option<f64> {
        Some(self.backlog)
    }
    fn finish(&mut self) -> Result<(), SinkError> {
        self.inner.finish()
    }
    fn fail(&mut self, message: &str) {
        self.inner.fail(message)
    }
}

/// The transport preset's level follows the sink's backlog: a sender that waits for records
/// (backlog 0) takes the stream down a level a window, to 1; records waiting to be sent take
/// it back up to the plan's 5. Every record names its level, and one reader decodes the whole
/// stream to the in-process batches. A sink that cannot tell keeps the plan's level.
#[test]
fn the_stream_level_follows_the_transports_backlog() {
    use crate::stream_level::{FLOOR, WINDOW};
    let dir = tempfile::tempdir().unwrap();
    let uri = dataset(dir.path(), 200_000, None);
    let p = plan(&uri, OutputDType::I32, "transport");
    let want = local(&p);
    let n = want.len();
    let mut prod = producer(&p).fitting_level();
    assert_eq!(prod.stream_level(), Some(5));
    let (mut pair_sink, mut source) = pair(1 << 12);
    let mut levels = Vec::new();
    let mut got = Vec::new();
    let mut d = Decoder::new();
    // One reader, in order: a stream's records decode only so.
    let mut take = |source: &mut MemorySource| {
        while let Some(r) = source.next_record() {
            let head: &[u8; RECORD_HEADER_LEN] = r[..RECORD_HEADER_LEN].try_into().unwrap();
            let h = BatchHeader::parse(head).unwrap();
            let mut tokens = vec![0u32; h.tokens()];
            d.decode(h.codec, &r[RECORD_HEADER_LEN..], &mut tokens)
                .unwrap();
            levels.push(h.codec.compression.zstd_level().unwrap());
            got.push(tokens);
        }
    };
    let w = WINDOW as usize;
    // Idle for 24 windows, then backed up.
    let backed_up = 24 * w;
    assert!(n > backed_up + 8 * w, "{n} batches");
    for i in 0..n {
        let backlog = if i < backed_up { 0.0 } else { 1.0 };
        let mut sink = Backlogged {
            inner: &mut pair_sink,
            backlog,
        };
        assert!(matches!(prod.step(&mut sink).unwrap(), Step::Batch { .. }));
        sink.inner
            .flush_if_idle(Instant::now() + MAX_FRAME_AGE)
            .unwrap();
        take(&mut source);
    }
    assert!(matches!(prod.step(&mut pair_sink).unwrap(), Step::End));
    pair_sink.finish().unwrap();
    take(&mut source);
    assert_eq!(got.len(), n);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, &w.3, "batch {i}");
    }
    // Down a level a window from 5 to the floor, then back up: each window's last batch,
    // whose backlog closes it, is the first at the new level.
    let mut changes: Vec<(usize, i32)> = vec![(0, levels[0])];
    for (i, pair) in levels.windows(2).enumerate() {
        if pair[0] != pair[1] {
            changes.push((i + 1, pair[1]));
        }
    }
    let end = |k: usize| k * w - 1;
    let up = backed_up / w;
    let expect = [
        (0, 5),
        (end(1), 4),
        (end(2), 3),
        (end(3), 2),
        (end(4), FLOOR),
        (end(up + 1), 2),
        (end(up + 2), 3),
        (end(up + 3), 4),
        (end(up + 4), 5),
    ];
    assert_eq!(changes, expect);

    // Without a backlog to go by, the plan's level throughout.
    let mut prod = producer(&p).fitting_level();
    let (mut sink, mut source) = pair(1 << 12);
    while let Step::Batch { .. } = prod.step(&mut sink).unwrap() {
        sink.flush_if_idle(Instant::now() + MAX_FRAME_AGE).unwrap();
        while let Some(r) = source.next_record() {
            let head: &[u8; RECORD_HEADER_LEN] = r[..RECORD_HEADER_LEN].try_into().unwrap();
            let h = BatchHeader::parse(head).unwrap();
            assert_eq!(h.codec.compression.zstd_level(), Some(5));
        }
    }
}
