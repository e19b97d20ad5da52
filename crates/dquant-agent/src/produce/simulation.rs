//! The produce loop under thousands of random schedules, in the spirit of quinn-proto's
//! tests: the very [`run`] the agent runs, over the in-memory pair, with a consumer that
//! takes records when a seeded generator says so, a simulated clock, and faults at random
//! points: the agent draining, the client cancelling, the client hanging up, a producer
//! panicking. No sockets, threads or sleeps; a failing schedule prints its seed.
//!
//! Whatever the schedule, the consumer receives the plan's batches in order, each once and
//! exactly as made in-process, and then:
//! - after the end: all of them;
//! - after a drain: a message whose cursor resumes exactly after the batches it got;
//! - after a producer's panic at batch k: exactly the k batches before it, then the error;
//! - after a cancel or a hang-up: a prefix.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dquant_plan::Plan;
use dquant_transport::memory::{pair, End, MemorySink, MemorySource};
use dquant_transport::tcp::MAX_FRAME_AGE;
use dquant_transport::BatchHeader;

use super::tests::{dataset, decode, local, pipeline_at, plan, producer};
use super::*;
use crate::faults::Fault;

/// Schedules per codec: three thousand in all, about a second.
const SCHEDULES: u64 = 1500;

/// splitmix64: a seeded generator with no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// In `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Some step in `0..n`, one time in `one_in` (else never).
    fn sometimes(&mut self, one_in: u64, n: u64) -> Option<u64> {
        (self.below(one_in) == 0).then(|| self.below(n))
    }
}

/// Simulated time: an instant that moves only when told to.
struct Clock {
    start: Instant,
    nanos: AtomicU64,
}

impl Clock {
    fn new() -> Self {
        Clock {
            start: Instant::now(),
            nanos: AtomicU64::new(0),
        }
    }

    fn now(&self) -> Instant {
        self.start + Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }

    fn advance(&self, by: Duration) {
        self.nanos
            .fetch_add(by.as_nanos() as u64, Ordering::Relaxed);
    }
}

/// The consumer and the clock, driven from inside the sink: each time the producer asks
/// for room, the consumer may take records, the clock moves on, and the client may hang up.
struct Sim {
    sink: MemorySink,
    source: MemorySource,
    rng: Rng,
    clock: Arc<Clock>,
    got: Vec<(BatchHeader, Vec<u32>)>,
    reserves: u64,
    hang_up_at: Option<u64>,
}

impl Sim {
    fn take(&mut self, at_most: u64) {
        for _ in 0..at_most {
            match self.source.next_record() {
                Some(r) => self.got.push(decode(&r)),
                None => return,
            }
        }
    }

    fn tick(&mut self) {
        let step = MAX_FRAME_AGE.mul_f64(self.rng.below(300) as f64 / 100.0);
        self.clock.advance(step);
    }
}

impl BatchSink for Sim {
    fn reserve(&mut self, len: usize) -> Result<&mut [u8], SinkError> {
        self.reserves += 1;
        if self.hang_up_at == Some(self.reserves) {
            self.source.close();
        }
        let n = self.rng.below(3);
        self.take(n);
        self.tick();
        // A full pair: the consumer takes what is delivered, or time passes until the held
        // records are flushed to it; it never stalls for good.
        while matches!(self.sink.reserve(len), Err(SinkError::Full)) {
            self.tick();
            self.sink.flush_if_idle(self.clock.now())?;
            let n = 1 + self.rng.below(2);
            self.take(n);
        }
        self.sink.reserve(len)
    }

    fn commit(&mut self, len: usize) -> Result<(), SinkError> {
        self.sink.commit(len)
    }

    fn flush_if_idle(&mut self, now: Instant) -> Result<(), SinkError> {
        self.sink.flush_if_idle(now)
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        self.sink.finish()
    }

    fn fail(&mut self, message: &str) {
        self.sink.fail(message)
    }
}

/// One schedule of `seed` over plan `p` (whose in-process batches are `want`).
/// Returns how it ended: 0 finished, 1 drained, 2 failed (a panic), 3 stopped.
fn schedule(seed: u64, p: &Plan, want: &[(u64, usize, Cursor, Vec<u32>)]) -> usize {
    let mut rng = Rng(seed);
    let n = want.len() as u64;
    let capacity = 1 + rng.below(5) as usize;
    let drain_at = rng.sometimes(4, n + 2);
    let cancel_at = rng.sometimes(8, n + 2);
    let hang_up_at = rng.sometimes(8, n + 2).map(|r| r + 1);
    let panic_at = rng.sometimes(8, n);

    let faults = Faults::default();
    if let Some(batch) = panic_at {
        faults.arm(Fault::PanicAtBatch {
            site: Site::Session,
            batch,
        });
    }
    let mut prod = producer(p).with_faults(faults, Site::Session);
    let (sink, source) = pair(capacity);
    let clock = Arc::new(Clock::new());
    let mut sim = Sim {
        sink,
        source,
        rng,
        clock: clock.clone(),
        got: Vec::new(),
        reserves: 0,
        hang_up_at,
    };
    let (cancel, draining) = (AtomicBool::new(false), AtomicBool::new(false));
    let steps = Cell::new(0u64);
    let now = || {
        // Asked once per step: the flags rise at their step.
        if drain_at == Some(steps.get()) {
            draining.store(true, Ordering::Relaxed);
        }
        if cancel_at == Some(steps.get()) {
            cancel.store(true, Ordering::Relaxed);
        }
        steps.set(steps.get() + 1);
        clock.now()
    };
    let (outcome, stats) = run(&mut prod, &mut sim, &cancel, &draining, now);
    if !matches!(&outcome, Outcome::Stopped(_)) {
        sim.take(u64::MAX);
    }
    check(&outcome, stats, &sim, want, panic_at, p);
    match outcome {
        Outcome::Finished => 0,
        Outcome::Drained(_) => 1,
        Outcome::Failed(_) => 2,
        Outcome::Stopped(_) => 3,
    }
}

/// The invariants of the module docs.
fn check(
    outcome: &Outcome,
    stats: Stats,
    sim: &Sim,
    want: &[(u64, usize, Cursor, Vec<u32>)],
    panic_at: Option<u64>,
    p: &Plan,
) {
    let got = &sim.got;
    assert!(got.len() <= want.len(), "more batches than the plan has");
    for ((h, tokens), (index, samples, cursor, w)) in got.iter().zip(want) {
        assert_eq!((h.index, h.samples as usize), (*index, *samples));
        assert_eq!(
            (h.cursor_epoch, h.cursor_consumed),
            (cursor.epoch, cursor.consumed_samples)
        );
        assert!(tokens == w, "batch {index}: other tokens");
    }
    let delivered_cursor = got.last().map_or(0, |(h, _)| h.cursor_consumed);
    match outcome {
        Outcome::Finished => {
            assert_eq!(got.len(), want.len());
            assert_eq!(sim.source.end(), Some(End::Finished));
        }
        Outcome::Drained(m) => {
            assert_eq!(*m, shutdown_message(delivered_cursor));
            assert_eq!(
                stats.records,
                got.len() as u64,
                "a drain delivers what was made"
            );
            assert_eq!(sim.source.end(), Some(End::Failed(m.clone())));
            assert_resumes(p, delivered_cursor, &want[got.len()..]);
        }
        Outcome::Failed(m) => {
            let k = panic_at.expect("only an injected panic fails this plan");
            assert!(m.starts_with("internal error on the agent"), "{m}");
            assert_eq!(
                got.len() as u64,
                k,
                "the batches before the panic, then the error"
            );
            assert_eq!(sim.source.end(), Some(End::Failed(m.clone())));
        }
        // A cancel or a hang-up: what arrived is a prefix (checked above).
        Outcome::Stopped(_) => {}
    }
}

/// A pipeline opened at `consumed` makes exactly the batches `rest`.
fn assert_resumes(p: &Plan, consumed: u64, rest: &[(u64, usize, Cursor, Vec<u32>)]) {
    let mut pl = pipeline_at(p, Cursor::new(0, consumed));
    for (_, _, cursor, w) in rest {
        let b = pl
            .next_batch()
            .unwrap()
            .expect("the resumed stream is as long");
        assert_eq!(b.cursor, *cursor);
        assert!(b.tokens.to_vec() == *w, "the resumed stream differs");
    }
    assert!(
        pl.next_batch().unwrap().is_none(),
        "the resumed stream is longer"
    );
}

#[test]
fn every_random_schedule_delivers_each_batch_once_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let uri = dataset(dir.path(), 3_000, None);
    let mut ends = [0u64; 4];
    for (output, wire) in [(OutputDType::U16, "u16"), (OutputDType::I32, "auto+zstd:1")] {
        let p = plan(&uri, output, wire);
        let want = local(&p);
        assert!(want.len() > 5, "a plan of several batches");
        for seed in 0..SCHEDULES {
            let seed = seed ^ (wire.len() as u64) << 32;
            match std::panic::catch_unwind(|| schedule(seed, &p, &want)) {
                Ok(end) => ends[end] += 1,
                Err(e) => {
                    let m = crate::faults::panic_message(e.as_ref()).to_string();
                    panic!("schedule {seed:#x} ({wire}) failed: {m}");
                }
            }
        }
    }
    // Every way of ending was met, often: the schedules test what they say.
    assert!(ends.iter().all(|&n| n > SCHEDULES / 20), "{ends:?}");
    assert_eq!(ends.iter().sum::<u64>(), 2 * SCHEDULES);
}
