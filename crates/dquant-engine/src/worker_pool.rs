//! The threads a session's work spreads over: a batch's reads at once, and the next
//! batches' compression while the session reads more ([`crate::EncodeAhead`]).
//!
//! A shuffled plan reads each sample of a batch from its own place in a dataset: one small
//! positional read after another, each paying a system call and a page-cache walk on the
//! session's one thread. That left shuffled delivery at a third of a memory copy. A
//! [`WorkerPool`] lets a session issue a batch's reads from several threads at once: the
//! session's own thread takes the first share, the pool's workers the rest, and the batch is
//! returned once all are in. Every read lands in its own disjoint part of the batch, so the
//! bytes are those a sequential reader writes, whatever the order the reads finish in.
//!
//! One pool serves every session of an agent (its size is the agent's `worker_threads`), so
//! the work never takes more cores than the operator gave, however many sessions run; a
//! session whose pool is busy still reads its own share. rayon provides the pool (work
//! stealing, scoped borrows of the batch buffer); this module runs a batch's shares on it,
//! and [`crate::read_pace`] decides how many a batch is worth: only reads slow enough to
//! pay for their hand-off are split (page-cache reads are not).

use std::cell::RefCell;
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use dquant_storage::ReadBuffers;

use crate::record::Encoders;
use crate::EngineError;

thread_local! {
    /// Each worker's encoders, kept across jobs and sessions.
    static ENCODERS: RefCell<Encoders> = RefCell::new(Encoders::default());
}

/// The least time a share of a batch is expected to take before it is handed to another
/// thread. A hand-off cost the agent about 10 µs of CPU on 2 vCPU (a wake-up, the worker's
/// spin before it parks again, the latch), more where idle cores let workers spin longer: at
/// 200 µs a share, what splitting adds stays within a few percent of the reads it spreads.
pub const DEFAULT_MIN_SHARE: Duration = Duration::from_micros(200);

/// Threads that read a batch's samples concurrently and compress batches ahead, shared by
/// every session of an agent.
pub struct WorkerPool {
    pool: rayon::ThreadPool,
    workers: usize,
    min_share: Duration,
}

/// The calling thread's share of a batch run by [`WorkerPool::run`]: its first `jobs` jobs,
/// read in `took`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OwnShare {
    pub jobs: usize,
    pub took: Duration,
}

impl std::fmt::Debug for WorkerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerPool")
            .field("workers", &self.workers)
            .field("min_share", &self.min_share)
            .finish()
    }
}

impl WorkerPool {
    /// A pool of `workers` threads (at least 1: no workers is no pool, don't set one).
    pub fn new(workers: usize) -> Result<Self, EngineError> {
        if workers == 0 {
            return Err(EngineError::Usage(
                "a worker pool needs at least 1 thread (0: set no pool; sessions then work on their own threads)".into(),
            ));
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(workers)
            .thread_name(|i| format!("dquant-work-{i}"))
            // A job that panics (a bug) must not abort the agent: its session sees its
            // result's channel closed and fails with an error instead.
            .panic_handler(|_| ())
            .build()
            .map_err(|e| {
                EngineError::Usage(format!("cannot start {workers} worker threads: {e}"))
            })?;
        Ok(WorkerPool {
            pool,
            workers,
            min_share: DEFAULT_MIN_SHARE,
        })
    }

    /// The pool, splitting a batch only into shares expected to take at least `min_share`
    /// each ([`DEFAULT_MIN_SHARE`] unless set). Zero splits every batch over all the threads
    /// its reads allow, however fast they are (tests use it to exercise the split).
    pub fn min_share_of(mut self, min_share: Duration) -> Self {
        self.min_share = min_share;
        self
    }

    /// The least expected time of a share handed to another thread.
    pub fn min_share(&self) -> Duration {
        self.min_share
    }

    /// The pool's threads.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Threads that read one batch at most: the pool's and the caller's.
    pub fn readers(&self) -> usize {
        self.workers + 1
    }

    /// Runs `job` on one of the pool's threads, some time soon, with that thread's encoders
    /// (zstd and lz4 contexts, kept across jobs and sessions). Its result comes back on the
    /// receiver, which closes without one if the job panicked (a bug: the caller reports it
    /// as its own error, and the agent serves on).
    pub fn encode_job<T: Send + 'static>(
        &self,
        job: impl FnOnce(&mut Encoders) -> T + Send + 'static,
    ) -> mpsc::Receiver<T> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.pool.spawn(move || {
            let done = ENCODERS.with(|e| job(&mut e.borrow_mut()));
            // The caller may be gone (its consumer left): nobody wants the result.
            let _ = tx.send(done);
        });
        rx
    }

    /// Runs `read` on every job, `jobs` split into `shares` runs of consecutive jobs: the
    /// first on the calling thread, the others on the pool. Each share stops at its first
    /// error; the error returned is that of the earliest job that failed, so a failing batch
    /// reports the same error however the reads were timed. On success, the calling thread's
    /// share: how many of the first jobs it read, and how long they took it.
    pub(crate) fn run<J: Send>(
        &self,
        jobs: &mut [J],
        shares: usize,
        read: &(dyn Fn(&mut J, &mut ReadBuffers) -> Result<(), EngineError> + Sync),
    ) -> Result<OwnShare, EngineError> {
        let per = jobs.len().div_ceil(shares.max(1)).max(1);
        let first_error: Mutex<Option<(usize, EngineError)>> = Mutex::new(None);
        let run_share = |at: usize, share: &mut [J]| {
            let failed = with_buffers(|bufs| {
                for (i, j) in share.iter_mut().enumerate() {
                    if let Err(e) = read(j, bufs) {
                        return Some((at + i, e));
                    }
                }
                None
            });
            if let Some((i, e)) = failed {
                let mut slot = first_error.lock().unwrap_or_else(|p| p.into_inner());
                if slot.as_ref().is_none_or(|(k, _)| i < *k) {
                    *slot = Some((i, e));
                }
            }
        };
        let mut chunks = jobs.chunks_mut(per).enumerate();
        let first = chunks.next();
        let mut own = OwnShare {
            jobs: 0,
            took: Duration::ZERO,
        };
        self.pool.in_place_scope(|s| {
            for (c, share) in chunks {
                let run_share = &run_share;
                s.spawn(move |_| run_share(c * per, share));
            }
            if let Some((_, share)) = first {
                let started = Instant::now();
                own.jobs = share.len();
                run_share(0, share);
                own.took = started.elapsed();
            }
        });
        match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some((_, e)) => Err(e),
            None => Ok(own),
        }
    }
}

thread_local! {
    /// Each reading thread's decode buffers (and last decoded block), kept across batches.
    static BUFFERS: RefCell<ReadBuffers> = RefCell::new(ReadBuffers::new());
}

/// Runs `f` with this thread's read buffers.
fn with_buffers<R>(f: impl FnOnce(&mut ReadBuffers) -> R) -> R {
    BUFFERS.with(|b| match b.try_borrow_mut() {
        Ok(mut bufs) => f(&mut bufs),
        // Only if `f` itself reached here again: give it buffers of its own.
        Err(_) => f(&mut ReadBuffers::new()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_workers_is_no_pool() {
        let e = WorkerPool::new(0).unwrap_err().to_string();
        assert_eq!(
            e,
            "a worker pool needs at least 1 thread (0: set no pool; sessions then work on their own threads)"
        );
    }

    #[test]
    fn every_job_runs_once_and_the_earliest_error_wins() {
        let p = WorkerPool::new(2).unwrap();
        let mut jobs: Vec<(usize, u32)> = (0..10).map(|i| (i, 0)).collect();
        let own = p
            .run(&mut jobs, 3, &|j, _| {
                j.1 += 1;
                Ok(())
            })
            .unwrap();
        assert!(jobs.iter().all(|j| j.1 == 1));
        // 10 jobs in 3 shares of 4, 4 and 2: the caller's is the first.
        assert_eq!(own.jobs, 4);
        let e = p
            .run(&mut jobs, 3, &|j, _| match j.0 {
                5 | 8 => Err(EngineError::Usage(format!("job {}", j.0))),
                _ => Ok(()),
            })
            .unwrap_err();
        assert_eq!(e.to_string(), "job 5");
    }
}
