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
