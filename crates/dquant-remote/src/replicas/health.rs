//! Which replicas are in, and when one that failed is tried again: the failover's state
//! machine, kept apart from the connections and sans I/O. Time comes in as an argument, so
//! the unit tests below drive it with simulated instants instead of sleeping.
//!
//! A replica is *up* until it fails; then it is *down* with the error and a back-off
//! ([`FIRST_BACKOFF`], doubling on every failure while it is out, up to [`MAX_BACKOFF`]).
//! Once the back-off passes it is *due*: the caller reopens it (on a thread of its own) and
//! reports the outcome. A reopen that works brings it up and forgets the back-off.
//!
//! While no replica is up a reader is waiting, so the wait is short: a down replica is due
//! [`URGENT_FIRST`] after its last failure, doubling to [`URGENT_MAX`] (a replica restarted
//! a moment after the others died is found within a second, not after its 30 s back-off).
//! Every wait is jittered (between half of it and all of it, from a seed of this reader's),
//! so that the readers of a replica that comes back do not all knock at once.

use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};

pub(crate) const FIRST_BACKOFF: Duration = Duration::from_secs(1);
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(30);
pub(crate) const URGENT_FIRST: Duration = Duration::from_millis(50);
pub(crate) const URGENT_MAX: Duration = Duration::from_secs(1);

/// Why a replica is out, and when it is tried again.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Down {
    error: String,
    /// When it last failed (or its last reopen did).
    at: Instant,
    backoff: Duration,
    /// Failures in a row, this one included.
    tries: u32,
    /// A reopen is running.
    trying: bool,
}

/// The state of each replica of one dataset (see the module docs).
#[derive(Clone, Debug)]
pub(crate) struct Health {
    down: Vec<Option<Down>>,
    seed: u64,
}

impl Health {
    /// `n` replicas, all up, with a jitter seed of their own.
    pub fn new(n: usize) -> Self {
        let seed = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        Self::with_seed(n, seed)
    }

    /// `n` replicas, all up, jittered from `seed`.
    pub fn with_seed(n: usize, seed: u64) -> Self {
        Health {
            down: vec![None; n],
            seed,
        }
    }

    #[cfg(test)]
    fn is_up(&self, i: usize) -> bool {
        self.down[i].is_none()
    }

    /// Replica `i` failed with `error` at `now`: out until its back-off passes.
    pub fn failed(&mut self, i: usize, error: &str, now: Instant) {
        let prev = self.down[i].as_ref();
        self.down[i] = Some(Down {
            error: error.to_string(),
            at: now,
            backoff: prev.map_or(FIRST_BACKOFF, |d| (d.backoff * 2).min(MAX_BACKOFF)),
            tries: prev.map_or(1, |d| d.tries.saturating_add(1)),
            trying: false,
        });
    }

    /// When down replica `i` is due: after its back-off, or its short wait while no
    /// replica is up (`urgent`), jittered.
    fn retry_at(&self, i: usize, d: &Down, urgent: bool) -> Instant {
        let wait = if urgent {
            let doublings = d.tries.saturating_sub(1).min(16);
            (URGENT_FIRST * (1u32 << doublings)).min(URGENT_MAX)
        } else {
            d.backoff
        };
        d.at + self.jittered(wait, i, d.tries)
    }

    /// `wait` scaled into [wait/2, wait], the same for the same seed, replica and try.
    fn jittered(&self, wait: Duration, i: usize, tries: u32) -> Duration {
        let mut h = self.seed ^ ((i as u64) << 32) ^ u64::from(tries);
        // splitmix64's finaliser: a well-mixed u64 from a counter.
        h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^= h >> 31;
        let fraction = (h >> 11) as f64 / (1u64 << 53) as f64;
        wait / 2 + wait.mul_f64(fraction / 2.0)
    }

    /// The replicas to reopen now: down, due (see [`Health::next_due`]), and not being
    /// reopened already. Each is marked as being reopened.
    pub fn due(&mut self, now: Instant, urgent: bool) -> Vec<usize> {
        let due: Vec<usize> = (0..self.down.len())
            .filter(|&i| {
                self.down[i]
                    .as_ref()
                    .is_some_and(|d| !d.trying && self.retry_at(i, d, urgent) <= now)
            })
            .collect();
        for &i in &due {
            if let Some(d) = self.down[i].as_mut() {
                d.trying = true;
            }
        }
        due
    }

    /// The soonest a replica that is down and not being reopened becomes due.
    pub fn next_due(&self, urgent: bool) -> Option<Instant> {
        (0..self.down.len())
            .filter_map(|i| {
                let d = self.down[i].as_ref().filter(|d| !d.trying)?;
                Some(self.retry_at(i, d, urgent))
            })
            .min()
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
}

#[cfg(test)]
mod tests;
