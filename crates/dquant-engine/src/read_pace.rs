//! Whether a batch's reads are worth more than one thread: decided by how long they take,
//! not by how many bytes they are.
//!
//! Handing a share of a batch to a pool thread costs CPU on both sides: the wake-up of a
//! parked worker, its spin before it parks again, the latch the session waits on. Measured on
//! the agent (`dquant-offload-bench throughput --worker-threads 8`, 2 vCPU), splitting every
//! batch of page-cache reads into 16 KiB shares tripled the agent's CPU per GB and delivered
//! less; on a 16-core GPU host the agent's CPU a token was 50 times this VM's. A page-cache
//! read of 16 KiB takes about 2 µs, far less than its hand-off; the same 16 KiB from a cold
//! disk, a network file system or an object store takes a millisecond or more, where threads
//! reading at once are what hides the wait. Bytes cannot tell the two apart; time can.
//!
//! So each pipeline keeps a [`ReadPace`]: the time its reads took a byte, measured on the
//! session's own thread (a batch read alone, or the session's share of a split one), as a
//! moving average. A batch is split only into shares each expected to take at least the
//! pool's [`min_share`](crate::WorkerPool::min_share) (200 µs by default), and the first
//! batch, with nothing measured yet, is read alone. Which threads read never changes the
//! bytes (every read lands in its own part of the batch), only the cost.
//!
//! The estimate is a plain function of the durations it is given, so tests drive it with
//! made-up times.

use std::time::Duration;

use crate::worker_pool::WorkerPool;

/// Each new measurement moves the estimate by this fraction of the difference: a change of
/// storage (a cold epoch, the page cache filled) is followed within a few batches.
const WEIGHT: f64 = 0.25;

/// A measurement counts as at most this many times the estimate: a batch the scheduler held
/// up (a preemption of a millisecond on a busy host is 40 times a page-cache batch) moves
/// the estimate by 1.75× at most, not into splitting, while storage that really turned slow
/// raises it 1.75× a batch until it is reached.
const MAX_STEP: f64 = 4.0;

/// The time a pipeline's reads take a byte, from what it measured so far, and how its
/// batches were read.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReadPace {
    /// Nanoseconds a byte; `None` until a read was measured.
    ns_per_byte: Option<f64>,
    counts: BatchReads,
}

/// How a pipeline with a worker pool read its batches so far: on its own thread alone, or
/// spread over the pool ([`crate::Pipeline::batch_reads`]; both 0 without a pool).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchReads {
    pub alone: u64,
    pub spread: u64,
}

impl ReadPace {
    /// A batch read alone on the session's thread: `bytes` bytes in `took`.
    pub(crate) fn read_alone(&mut self, bytes: usize, took: Duration) {
        self.counts.alone += 1;
        self.record(bytes, took);
    }

    /// A batch spread over the pool, of which the session's own share was `bytes` bytes,
    /// read in `took`.
    pub(crate) fn read_spread(&mut self, bytes: usize, took: Duration) {
        self.counts.spread += 1;
        self.record(bytes, took);
    }

    /// The batches counted so far.
    pub(crate) fn counts(&self) -> BatchReads {
        self.counts
    }

    /// Records that reading `bytes` bytes on the session's thread took `took`. Reads of no
    /// bytes say nothing and are ignored.
    fn record(&mut self, bytes: usize, took: Duration) {
        if bytes == 0 {
            return;
        }
        let sample = took.as_nanos() as f64 / bytes as f64;
        self.ns_per_byte = Some(match self.ns_per_byte {
            None => sample,
            Some(old) => old + WEIGHT * (sample.min(old * MAX_STEP) - old),
        });
    }

    /// How many shares a batch of `jobs` reads, `bytes` bytes in all, is split into on
    /// `pool`: as many as keep each share at the pool's minimum expected time, at most one
    /// a reading thread and one a job, at least 1 (read alone). With nothing measured yet,
    /// 1; with a minimum of zero, as many as there are threads and jobs.
    pub(crate) fn shares(&self, pool: &WorkerPool, jobs: usize, bytes: usize) -> usize {
        let most = pool.readers().min(jobs).max(1);
        let min_ns = pool.min_share().as_nanos() as f64;
        if min_ns == 0.0 {
            return most;
        }
        let Some(rate) = self.ns_per_byte else {
            return 1;
        };
        let fit = (rate * bytes as f64 / min_ns).floor();
        if fit >= most as f64 {
            most
        } else {
            (fit as usize).max(1)
        }
    }

    /// The estimate, in nanoseconds a byte (for tests and diagnostics).
    #[cfg(test)]
    fn ns_per_byte(&self) -> Option<f64> {
        self.ns_per_byte
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn the_first_batch_is_read_alone_and_measured() {
        let pool = WorkerPool::new(7).unwrap();
        let mut p = ReadPace::default();
        assert_eq!(p.shares(&pool, 16, 1 << 20), 1);
        // 1 MiB in 1,048.576 µs: 1 ns a byte, so a 1 MiB batch is 5 shares of 200 µs.
        p.read_alone(1 << 20, Duration::from_nanos(1 << 20));
        assert_eq!(p.ns_per_byte(), Some(1.0));
        assert_eq!(p.shares(&pool, 16, 1 << 20), 5);
    }

    #[test]
    fn page_cache_reads_stay_on_one_thread() {
        // 256 KiB in 26 µs (10 GB/s, a page-cache copy): a share would be 13 µs of work.
        let pool = WorkerPool::new(8).unwrap();
        let mut p = ReadPace::default();
        for _ in 0..10 {
            p.read_alone(256 << 10, us(26));
        }
        assert_eq!(p.shares(&pool, 16, 256 << 10), 1);
        // A batch 16 times larger is worth two threads.
        assert_eq!(p.shares(&pool, 256, 4 << 20), 2);
    }

    #[test]
    fn slow_reads_spread_over_every_thread_the_jobs_allow() {
        // 16 reads of 16 KiB, 1 ms each: a cold disk or an object store.
        let pool = WorkerPool::new(8).unwrap();
        let mut p = ReadPace::default();
        p.read_alone(256 << 10, us(16_000));
        assert_eq!(p.shares(&pool, 16, 256 << 10), 9);
        assert_eq!(p.shares(&pool, 3, 48 << 10), 3);
        assert_eq!(p.shares(&pool, 0, 0), 1);
    }

    #[test]
    fn the_estimate_follows_a_change_of_storage_within_a_few_batches() {
        let pool = WorkerPool::new(8).unwrap();
        let mut p = ReadPace::default();
        let batch = 256 << 10;
        p.read_alone(batch, us(16_000));
        assert_eq!(p.shares(&pool, 16, batch), 9);
        // The page cache now holds the data: one batch is not enough to stop splitting,
        // ten are (the estimate keeps a quarter of each difference).
        p.read_alone(batch, us(26));
        assert!(p.shares(&pool, 16, batch) > 1);
        for _ in 0..20 {
            p.read_alone(batch, us(26));
        }
        assert_eq!(p.shares(&pool, 16, batch), 1);
        // And back: cold again, split within 6 batches, over every thread within 10.
        let mut split = None;
        for k in 1..=10 {
            p.read_alone(batch, us(16_000));
            if split.is_none() && p.shares(&pool, 16, batch) > 1 {
                split = Some(k);
            }
        }
        assert!(
            split.is_some_and(|k| k <= 6),
            "split after {split:?} batches"
        );
        assert_eq!(p.shares(&pool, 16, batch), 9);
        // Reads of nothing do not move it.
        let before = p.ns_per_byte();
        p.read_alone(0, us(1_000_000));
        assert_eq!(p.ns_per_byte(), before);
    }

    #[test]
    fn a_batch_held_up_by_the_scheduler_does_not_split_the_next() {
        let pool = WorkerPool::new(8).unwrap();
        let mut p = ReadPace::default();
        let batch = 256 << 10;
        for _ in 0..10 {
            p.read_alone(batch, us(26));
        }
        // Preempted for 2 ms, twice in a row: still one thread.
        p.read_alone(batch, us(2_000));
        p.read_alone(batch, us(2_000));
        assert_eq!(p.shares(&pool, 16, batch), 1);
    }

    #[test]
    fn a_minimum_of_zero_splits_every_batch() {
        let pool = WorkerPool::new(3).unwrap().min_share_of(Duration::ZERO);
        let p = ReadPace::default();
        assert_eq!(p.shares(&pool, 16, 1), 4);
        assert_eq!(p.shares(&pool, 2, 1), 2);
    }
}
