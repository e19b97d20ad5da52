//! The failover's clock, driven with simulated instants.

use super::*;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

/// When down replica `i` is due, `urgent` or not.
fn at(h: &Health, i: usize, urgent: bool) -> Instant {
    h.retry_at(i, h.down[i].as_ref().expect("down"), urgent)
}

/// Asserts `wait` is the jittered form of `full`: between half of it and all of it.
fn jittered_from(wait: Duration, full: Duration) {
    assert!(
        wait >= full / 2 && wait <= full,
        "{wait:?} is not within [{:?}, {full:?}]",
        full / 2
    );
}

#[test]
fn a_failed_replica_is_due_after_its_backoff_and_reopened_once() {
    let t0 = Instant::now();
    let mut h = Health::with_seed(3, 1);
    h.failed(1, "connection refused", t0);
    assert!(h.is_up(0) && !h.is_up(1) && h.is_up(2));
    assert_eq!(h.error(1), "connection refused");
    jittered_from(at(&h, 1, false) - t0, FIRST_BACKOFF);
    assert_eq!(h.next_due(false), Some(at(&h, 1, false)));
    assert_eq!(h.due(at(&h, 1, false) - ms(1), false), Vec::<usize>::new());
    assert_eq!(h.due(t0 + secs(1), false), vec![1]);
    // Being reopened: not handed out again while that runs.
    assert_eq!(h.due(t0 + secs(5), false), Vec::<usize>::new());
    assert_eq!(h.next_due(false), None);
    h.reopened(1, None, t0 + secs(5));
    assert!(h.is_up(1));
    assert_eq!(h.error(1), "");
}

#[test]
fn failed_reopens_double_the_backoff_up_to_its_cap() {
    let mut now = Instant::now();
    let mut h = Health::with_seed(2, 2);
    h.failed(0, "reset", now);
    for full in [1, 2, 4, 8, 16, 30, 30, 30] {
        let due = at(&h, 0, false);
        jittered_from(due - now, secs(full));
        now = due;
        assert_eq!(h.due(now, false), vec![0]);
        h.reopened(0, Some("connection refused"), now);
    }
    assert_eq!(h.error(0), "connection refused");
    assert!(h.is_up(1), "the other replica is untouched");
}

#[test]
fn a_replica_back_up_starts_its_backoff_afresh_when_it_fails_again() {
    let t0 = Instant::now();
    let mut h = Health::with_seed(2, 3);
    h.failed(0, "a", t0);
    h.due(t0 + secs(1), false);
    h.reopened(0, Some("b"), t0 + secs(1));
    jittered_from(at(&h, 0, false) - (t0 + secs(1)), secs(2));
    h.due(t0 + secs(3), false);
    h.reopened(0, None, t0 + secs(3));
    h.failed(0, "c", t0 + secs(10));
    jittered_from(at(&h, 0, false) - (t0 + secs(10)), FIRST_BACKOFF);
}

#[test]
fn every_replica_out_each_keeps_its_own_error_and_clock() {
    let t0 = Instant::now();
    let mut h = Health::with_seed(3, 4);
    for (i, e) in ["refused", "reset", "timed out"].iter().enumerate() {
        h.failed(i, e, t0 + secs(i as u64));
    }
    assert!((0..3).all(|i| !h.is_up(i)));
    assert_eq!(
        [h.error(0), h.error(1), h.error(2)],
        ["refused", "reset", "timed out"]
    );
    assert_eq!(h.due(t0 + secs(2), false), vec![0, 1]);
    assert_eq!(h.due(t0 + secs(3), false), vec![2]);
}

/// The reported failure: the last replica standing died a moment after another one came
/// back. With every replica down a reader waits, so they are tried within 50 ms of their
/// failure, doubling to a second, whatever their long back-off says.
#[test]
fn with_every_replica_down_they_are_tried_again_at_once() {
    let t0 = Instant::now();
    let mut h = Health::with_seed(2, 5);
    // Replica 0 has failed often: its back-off is 16 s.
    for k in 0..5 {
        h.failed(0, "refused", t0 + ms(k));
    }
    h.failed(1, "reset", t0 + ms(5));
    assert!(at(&h, 0, false) - (t0 + ms(4)) >= secs(8));
    jittered_from(at(&h, 0, true) - (t0 + ms(4)), URGENT_FIRST * 16);
    jittered_from(at(&h, 1, true) - (t0 + ms(5)), URGENT_FIRST);
    assert_eq!(h.next_due(true), Some(at(&h, 1, true)));
    assert_eq!(h.due(t0 + ms(55), true), vec![1]);
    // Its reopen fails: the next urgent wait doubles.
    h.reopened(1, Some("refused"), t0 + ms(60));
    jittered_from(at(&h, 1, true) - (t0 + ms(60)), URGENT_FIRST * 2);
    // Failures in a row double the urgent wait up to its cap.
    let mut now = t0 + ms(60);
    for _ in 0..10 {
        now = at(&h, 1, true);
        // (Replica 0 comes due on the way, once, and is being reopened from then on.)
        assert!(h.due(now, true).contains(&1));
        h.reopened(1, Some("refused"), now);
    }
    jittered_from(at(&h, 1, true) - now, URGENT_MAX);
}

#[test]
fn jitter_is_fixed_by_the_seed_and_differs_between_readers() {
    let t0 = Instant::now();
    let waits = |seed: u64| {
        let mut h = Health::with_seed(4, seed);
        (0..4).for_each(|i| h.failed(i, "x", t0));
        (0..4).map(|i| at(&h, i, false) - t0).collect::<Vec<_>>()
    };
    assert_eq!(waits(7), waits(7));
    assert_ne!(waits(7), waits(8));
    let one = waits(7);
    assert!(
        one.iter().any(|w| *w != one[0]),
        "the replicas of one reader are spread too: {one:?}"
    );
}

/// A small xorshift generator: the simulation's schedules, reproducible from a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Milliseconds a simulated reader's clock moves per step; it reads (and so notices a
/// replica that died) at every step.
const TICK_MS: u64 = 10;
/// The longest a simulated reopen takes.
const REOPEN_MAX_MS: u64 = 200;

/// One random fault schedule over `ms` milliseconds, checked step by step: replicas die and
/// come back at random; a reader notices a dead replica at its next read, reopens what
/// [`Health`] says is due (each reopen taking a random time, and working when the replica is
/// up as it ends); and whenever it has no replica while one has been up for longer than the
/// bound (the longest urgent wait, plus a reopen, plus a step), the schedule fails. It runs
/// `span_ms` simulated milliseconds.
fn simulate(seed: u64, span_ms: u64) -> Result<(), String> {
    let mut rng = Rng(seed | 1);
    let n = 2 + rng.below(3) as usize;
    let t0 = Instant::now();
    let mut h = Health::with_seed(n, seed);
    // Truth: each replica's state and when it next flips; when it last came up.
    let mut up = vec![true; n];
    let mut flip_at: Vec<u64> = (0..n).map(|_| 50 + rng.below(3000)).collect();
    let mut up_since = vec![0u64; n];
    // The reader: its connections, and its reopens in flight (replica, when they end).
    let mut conn = vec![true; n];
    let mut reopening: Vec<(usize, u64)> = Vec::new();
    let mut without: Option<u64> = None;
    let bound = URGENT_MAX.as_millis() as u64 + REOPEN_MAX_MS + TICK_MS;
    let mut now = 0;
    while now < span_ms {
        now += TICK_MS;
        let at = t0 + ms(now);
        for i in 0..n {
            if flip_at[i] <= now {
                up[i] = !up[i];
                if up[i] {
                    up_since[i] = now;
                }
                flip_at[i] = now + 50 + rng.below(3000);
            }
            if conn[i] && !up[i] {
                conn[i] = false;
                h.failed(i, "reset", at);
            }
        }
        reopening.retain(|&(i, end)| {
            if end > now {
                return true;
            }
            conn[i] = up[i];
            h.reopened(i, (!up[i]).then_some("refused"), at);
            false
        });
        let urgent = !conn.iter().any(|&c| c);
        for i in h.due(at, urgent) {
            reopening.push((i, now + rng.below(REOPEN_MAX_MS + 1)));
        }
        // Since when the reader has had no replica, and so has been waiting.
        let since = *without.get_or_insert(now);
        if !urgent {
            without = None;
        }
        let starved = urgent && (0..n).any(|i| up[i] && now - up_since[i].max(since) > bound);
        if starved {
            return Err(format!(
                "seed {seed}: at {now} ms the reader has waited since {since} ms, though a \
                 replica has been up for over {bound} ms of it (up since {up_since:?}, up {up:?})"
            ));
        }
    }
    Ok(())
}

/// The failover's promise, over a thousand random fault schedules of a minute each: a reader
/// is never without a replica for longer than the bound while one is up. A failure prints
/// its seed; `simulate(seed, ..)` replays it.
#[test]
fn no_reader_waits_past_the_bound_while_a_replica_is_up() {
    for seed in 0..1000u64 {
        if let Err(e) = simulate(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), 60_000) {
            panic!("{e}");
        }
    }
}
