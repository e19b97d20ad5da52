//! Which replicas are in, and when one that failed is tried again: the failover's state
//! machine, kept apart from the connections and sans I/O. Time comes in as an argument, so
//! the unit tests below drive it with simulated instants instead of sleeping.
//!
//! A replica is *up* until it fails; then it is *down* with the error and a back-off
//! ([`FIRST_BACKOFF`], doubling on every failure while it is out, up to [`MAX_BACKOFF`]).
//! Once the back-off passes it is *due*: the caller reopens it (on a thread of its own) and
//! reports the outcome. A reopen that works brings it up and forgets the back-off.

use std::time::{Duration, Instant};

pub(crate) const FIRST_BACKOFF: Duration = Duration::from_secs(1);
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Why a replica is out, and when it is tried again.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Down {
    error: String,
    retry_at: Instant,
    backoff: Duration,
    /// A reopen is running.
    trying: bool,
}

/// The state of each replica of one dataset (see the module docs).
#[derive(Clone, Debug)]
pub(crate) struct Health {
    down: Vec<Option<Down>>,
}

impl Health {
    /// `n` replicas, all up.
    pub fn new(n: usize) -> Self {
        Health {
            down: vec![None; n],
        }
    }

    #[cfg(test)]
    fn is_up(&self, i: usize) -> bool {
        self.down[i].is_none()
    }

    /// Replica `i` failed with `error` at `now`: out until its back-off passes.
    pub fn failed(&mut self, i: usize, error: &str, now: Instant) {
        let backoff = self.down[i]
            .as_ref()
            .map_or(FIRST_BACKOFF, |d| (d.backoff * 2).min(MAX_BACKOFF));
        self.down[i] = Some(Down {
            error: error.to_string(),
            retry_at: now + backoff,
            backoff,
            trying: false,
        });
    }

    /// The replicas to reopen now: down, past their back-off, and not being reopened
    /// already. Each is marked as being reopened.
    pub fn due(&mut self, now: Instant) -> Vec<usize> {
        let mut due = Vec::new();
        for (i, d) in self.down.iter_mut().enumerate() {
            if let Some(d) = d.as_mut().filter(|d| !d.trying && d.retry_at <= now) {
                d.trying = true;
                due.push(i);
            }
        }
        due
    }

    /// The reopen of replica `i` ended at `now`: up again (`failure` is `None`), or out for
    /// a longer back-off with the reopen's error message.
    pub fn reopened(&mut self, i: usize, failure: Option<&str>, now: Instant) {
        match failure {
            None => self.down[i] = None,
            Some(e) => self.failed(i, e, now),
        }
    }

    /// The last error of replica `i` ("" while it is up).
    pub fn error(&self, i: usize) -> &str {
        self.down[i].as_ref().map_or("", |d| d.error.as_str())
    }

    /// When replica `i` is tried again, if it is out.
    #[cfg(test)]
    fn retry_at(&self, i: usize) -> Option<Instant> {
        self.down[i].as_ref().map(|d| d.retry_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn a_failed_replica_is_due_after_its_backoff_and_reopened_once() {
        let t0 = Instant::now();
        let mut h = Health::new(3);
        h.failed(1, "connection refused", t0);
        assert!(h.is_up(0) && !h.is_up(1) && h.is_up(2));
        assert_eq!(h.error(1), "connection refused");
        assert_eq!(
            h.due(t0 + secs(1) - Duration::from_millis(1)),
            Vec::<usize>::new()
        );
        assert_eq!(h.due(t0 + secs(1)), vec![1]);
        // Being reopened: not handed out again while that runs.
        assert_eq!(h.due(t0 + secs(5)), Vec::<usize>::new());
        h.reopened(1, None, t0 + secs(5));
        assert!(h.is_up(1));
        assert_eq!(h.error(1), "");
    }

    #[test]
    fn failed_reopens_double_the_backoff_up_to_its_cap() {
        let mut now = Instant::now();
        let mut h = Health::new(2);
        h.failed(0, "reset", now);
        let mut waits = Vec::new();
        for _ in 0..8 {
            let at = h.retry_at(0).unwrap();
            waits.push((at - now).as_secs());
            now = at;
            assert_eq!(h.due(now), vec![0]);
            h.reopened(0, Some("connection refused"), now);
        }
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(h.error(0), "connection refused");
        assert!(h.is_up(1), "the other replica is untouched");
    }

    #[test]
    fn a_replica_back_up_starts_its_backoff_afresh_when_it_fails_again() {
        let t0 = Instant::now();
        let mut h = Health::new(2);
        h.failed(0, "a", t0);
        h.due(t0 + secs(1));
        h.reopened(0, Some("b"), t0 + secs(1));
        assert_eq!(h.retry_at(0), Some(t0 + secs(3)));
        h.due(t0 + secs(3));
        h.reopened(0, None, t0 + secs(3));
        h.failed(0, "c", t0 + secs(10));
        assert_eq!(h.retry_at(0), Some(t0 + secs(11)));
    }

    #[test]
    fn every_replica_out_each_keeps_its_own_error_and_clock() {
        let t0 = Instant::now();
        let mut h = Health::new(3);
        for (i, e) in ["refused", "reset", "timed out"].iter().enumerate() {
            h.failed(i, e, t0 + secs(i as u64));
        }
        assert!((0..3).all(|i| !h.is_up(i)));
        assert_eq!(
            [h.error(0), h.error(1), h.error(2)],
            ["refused", "reset", "timed out"]
        );
        assert_eq!(h.due(t0 + secs(2)), vec![0, 1]);
        assert_eq!(h.due(t0 + secs(3)), vec![2]);
    }
}
