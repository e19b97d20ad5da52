//! The process's one tokio runtime.
//!
//! Three parts of dquant are async because the crates they stand on are: the agent's control
//! plane (tonic), object-store reads (`object_store`) and the control calls a client or a
//! chained agent makes upstream (tonic). Everything else runs on plain threads. Each of those
//! parts used to build a runtime of its own, so an agent chained to another and reading
//! `s3://` ran three, with their worker threads and timers. They now share this one.
//!
//! - **Created on first use, never shut down.** A library loaded into Python or linked into
//!   a C program has no `main` to build it in; and the HTTP clients pool their connections
//!   on it, where a connection pooled by a dropped runtime is dead.
//! - **Per process, not per program.** A forked child (a PyTorch DataLoader worker) inherits
//!   the parent's runtime without its threads and would wait forever on it, so a child builds
//!   its own; the parent's is leaked there (dropping it would wait for threads that do not
//!   exist).
//! - **Waited for from any thread.** Sync code calls [`run`]: the future is spawned here
//!   and waited for with a plain blocking wait, which never enters a runtime and so never
//!   panics with "cannot start a runtime from within a runtime". On a worker thread of a
//!   multi-threaded runtime (a gRPC handler listing an `s3://` root) the wait goes through
//!   [`tokio::task::block_in_place`], which hands the worker's other tasks to another thread
//!   first: a handler waiting on a read that needs a worker never deadlocks the runtime.

use std::future::Future;
use std::sync::Mutex;

use tokio::runtime::{Handle, Runtime, RuntimeFlavor};

/// Worker threads: the async work is network waits and small control messages, never the
/// data path (batches, token reads and codecs run on plain threads), so two keep up with
/// many concurrent GETs and RPCs without competing with the agent's own threads.
pub const WORKER_THREADS: usize = 2;

/// The runtime of this process, built on first use (and again in a forked child).
pub fn handle() -> Handle {
    static RT: Mutex<Option<(u32, &'static Runtime)>> = Mutex::new(None);
    let pid = std::process::id();
    let mut rt = RT.lock().unwrap_or_else(|e| e.into_inner());
    match *rt {
        Some((owner, r)) if owner == pid => r.handle().clone(),
        _ => {
            let r: &'static Runtime = Box::leak(Box::new(build()));
            *rt = Some((pid, r));
            r.handle().clone()
        }
    }
}

fn build() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKER_THREADS)
        .thread_name("dquant-rt")
        .enable_all()
        .build()
        // Only fails when the process cannot create threads or an epoll instance at all:
        // nothing async could run, and every caller would fail the same way.
        .expect("cannot start dquant's tokio runtime (threads or epoll unavailable)")
}

/// Runs `fut` on the runtime and waits for it on this thread, whatever the thread is.
pub fn run<F>(fut: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let task = handle().spawn(fut);
    let wait = move || match futures::executor::block_on(task) {
        Ok(v) => v,
        // The task is never aborted; a panic in it is a bug, raised again here.
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    };
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(wait),
        _ => wait(),
    }
}

/// Waits on this thread for `fut`, which may spawn tasks of its own on the runtime (a
/// multipart upload's parts): it is polled here, inside the runtime's context. Not for a
/// worker thread of a runtime (use [`run`] there).
pub fn block_in<F: Future>(fut: F) -> F::Output {
    let _in_runtime = handle().enter();
    futures::executor::block_on(fut)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_runtime_serves_every_caller() {
        let a = handle();
        let b = std::thread::spawn(handle).join().unwrap();
        assert_eq!(a.id(), b.id());
        assert_eq!(run(async { 6 * 7 }), 42);
    }

    /// A task on a worker thread that waits, synchronously, for work that itself needs a
    /// worker: more of them than there are workers, so without `block_in_place` every worker
    /// would be blocked and none left to run what they wait for.
    #[test]
    fn sync_waits_on_every_worker_at_once_do_not_deadlock() {
        let tasks: Vec<_> = (0..WORKER_THREADS * 3)
            .map(|i| {
                handle().spawn(async move {
                    run(async move {
                        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                        i
                    })
                })
            })
            .collect();
        let got: Vec<usize> = tasks
            .into_iter()
            .map(|t| futures::executor::block_on(t).unwrap())
            .collect();
        assert_eq!(got, (0..WORKER_THREADS * 3).collect::<Vec<_>>());
    }

    #[test]
    fn a_panic_in_the_future_reaches_the_caller() {
        let r = std::panic::catch_unwind(|| run(async { panic!("inside") }));
        let e = r.unwrap_err();
        assert_eq!(e.downcast_ref::<&str>(), Some(&"inside"));
    }

    #[test]
    fn block_in_lets_the_future_spawn() {
        let v = block_in(async { tokio::spawn(async { 5 }).await.unwrap() });
        assert_eq!(v, 5);
    }
}
