//! The bounded pool that runs the control plane's blocking work: opening datasets, loading
//! their indexes, replaying a blend to a cursor, dialing upstream agents.
//!
//! That work is unbounded in what a client can ask (a cursor at 2^62 in a two-source blend
//! takes centuries to reach), so it must not get a thread per request, nor run on the gRPC
//! runtime. A fixed set of workers takes jobs from a bounded queue; a request that finds the
//! queue full is refused as busy at once. Every job carries a stop condition that the work
//! asks at its checkpoints: it fires when the request's deadline passes or when its client
//! goes away (tonic drops the request's future, and the [`CancelOnDrop`] guard in it sets
//! the job's flag), so an abandoned or endless open gives its worker back.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tonic::Status;

/// Asked by the work at its checkpoints; `true` means give up.
pub(crate) type Stop<'a> = &'a mut dyn FnMut() -> bool;

type Job = Box<dyn FnOnce() + Send>;

/// Fixed workers behind a bounded queue.
pub(crate) struct OpenPool {
    queue: SyncSender<Job>,
    /// Jobs queued or running (for the busy message and the agent's gauges).
    depth: Arc<AtomicUsize>,
    max_queued: usize,
    timeout: Duration,
}

/// Sets the job's cancel flag when the request's future is dropped before the job is done.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl OpenPool {
    /// Starts `workers` threads; at most `max_queued` jobs wait for one; each job may take
    /// `timeout` from submission to its end.
    pub fn new(workers: usize, max_queued: usize, timeout: Duration) -> std::io::Result<Self> {
        let (queue, rx) = sync_channel::<Job>(max_queued);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..workers {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("dquant-open-{i}"))
                .spawn(move || work(&rx))?;
        }
        Ok(OpenPool {
            queue,
            depth: Arc::new(AtomicUsize::new(0)),
            max_queued,
            timeout,
        })
    }

    /// Jobs queued or running now.
    pub fn depth(&self) -> usize {
        self.depth.load(Ordering::Relaxed)
    }

    /// Runs `f` on a worker and awaits its result. `f` gets the job's stop condition, to
    /// ask at its checkpoints. A full queue is `resource_exhausted`; a job stopped by its
    /// deadline is `deadline_exceeded`, whatever `f` made of the stop.
    pub async fn run<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce(Stop<'_>) -> Result<T, Status> + Send + 'static,
    ) -> Result<T, Status> {
        let cancelled = Arc::new(AtomicBool::new(false));
        let _guard = CancelOnDrop(cancelled.clone());
        let deadline = Instant::now() + self.timeout;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let depth = self.depth.clone();
        let flag = cancelled.clone();
        let job: Job = Box::new(move || {
            let mut timed_out = false;
            let mut stop = || {
                timed_out |= Instant::now() >= deadline;
                timed_out || flag.load(Ordering::Relaxed)
            };
            // A request whose client left while it was queued is not started at all.
            let result = if stop() {
                Err(Status::cancelled(""))
            } else {
                f(&mut stop)
            };
            let result = if timed_out {
                Err(deadline_error(what))
            } else {
                result
            };
            depth.fetch_sub(1, Ordering::Relaxed);
            let _ = tx.send(result);
        });
        self.depth.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.queue.try_send(job) {
            self.depth.fetch_sub(1, Ordering::Relaxed);
            return Err(match e {
                TrySendError::Full(_) => Status::resource_exhausted(format!(
                    "agent is busy: {} requests are waiting to open datasets \
                     (limits.max_queued_opens); retry later",
                    self.max_queued
                )),
                TrySendError::Disconnected(_) => Status::unavailable("agent is stopping"),
            });
        }
        rx.await
            .map_err(|_| Status::internal(format!("{what}: the worker panicked")))?
    }
}

fn deadline_error(what: &str) -> Status {
    Status::deadline_exceeded(format!(
        "{what}: stopped at the agent's time limit for one request (limits.open_timeout_secs)"
    ))
}

/// A worker: runs jobs until the pool is dropped. A panicking job loses its own request
/// (its reply channel drops) and not the worker.
fn work(rx: &Mutex<Receiver<Job>>) {
    loop {
        let job = match rx.lock().unwrap_or_else(PoisonError::into_inner).recv() {
            Ok(job) => job,
            Err(_) => return,
        };
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    }

    /// Work that runs until its stop condition fires, as a blend replay to a far cursor does.
    fn endless(stop: Stop<'_>) -> Result<u32, Status> {
        while !stop() {
            std::thread::sleep(Duration::from_millis(1));
        }
        Err(Status::aborted("stopped"))
    }

    #[test]
    fn endless_work_is_stopped_at_the_deadline_and_frees_its_worker() {
        let pool = OpenPool::new(1, 4, Duration::from_millis(100)).unwrap();
        let rt = rt();
        let t = Instant::now();
        let e = rt.block_on(pool.run("open", endless)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::DeadlineExceeded);
        assert_eq!(
            e.message(),
            "open: stopped at the agent's time limit for one request (limits.open_timeout_secs)"
        );
        assert!(t.elapsed() < Duration::from_secs(5));
        // The one worker is free again.
        assert_eq!(rt.block_on(pool.run("open", |_| Ok(7))).unwrap(), 7);
        assert_eq!(pool.depth(), 0);
    }

    #[test]
    fn a_full_queue_is_refused_at_once_and_a_dropped_request_stops_its_job() {
        let pool = Arc::new(OpenPool::new(1, 1, Duration::from_secs(600)).unwrap());
        let rt = rt();
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let stopped = Arc::new(AtomicBool::new(false));
        let seen = stopped.clone();
        // Occupies the worker until its request is dropped.
        let p1 = pool.clone();
        let first = rt.spawn(async move {
            p1.run("open", move |stop| {
                started_tx.send(()).unwrap();
                let r = endless(stop);
                seen.store(true, Ordering::Relaxed);
                r
            })
            .await
        });
        started_rx.recv_timeout(Duration::from_secs(5)).unwrap();
        // The queue holds one more; a third is refused.
        let p2 = pool.clone();
        let second = rt.spawn(async move { p2.run("open", |_| Ok(2)).await });
        while pool.depth() < 2 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let e = rt.block_on(pool.run("open", |_| Ok(3))).unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            e.message(),
            "agent is busy: 1 requests are waiting to open datasets (limits.max_queued_opens); \
             retry later"
        );
        // The client of the first request goes away: its job stops, the queued one runs.
        first.abort();
        assert_eq!(rt.block_on(second).unwrap().unwrap(), 2);
        assert!(stopped.load(Ordering::Relaxed));
    }
}
