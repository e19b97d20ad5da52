//! The one tokio runtime every object-store read runs on.
//!
//! `object_store` is async; the storage layer's [`ReadAt`](dquant_storage::ReadAt) is called
//! from plain threads (a session's, the worker pool's, an open worker's) and sometimes from
//! a thread that is itself inside the agent's runtime (a gRPC handler listing a root).
//! Requests are therefore spawned here and waited for with a plain blocking wait, which works
//! from any thread, never enters a runtime, and so never panics with "cannot start a runtime
//! from within a runtime". One runtime for the process, never shut down: the HTTP clients
//! pool their connections on it, and a connection pooled by a runtime that was dropped is
//! dead.

use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::Runtime;

/// Worker threads of the runtime: enough to drive many GETs at once (they wait on the
/// network, not the CPU), few enough not to compete with the agent's own threads.
const THREADS: usize = 2;

pub(crate) fn runtime() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(THREADS)
            .thread_name("dquant-objstore")
            .enable_all()
            .build()
            // Only fails when the process cannot create threads at all.
            .expect("cannot start the object store's tokio runtime")
    })
}

/// Runs `fut` on the runtime and waits for it on this thread.
pub(crate) fn run<F>(fut: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let task = runtime().spawn(fut);
    match futures::executor::block_on(task) {
        Ok(v) => v,
        // The task is never aborted; a panic in it is a bug, re-raised here.
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// Waits on this thread for `fut`, which may spawn tasks of its own on the runtime (a
/// multipart upload's parts): it is polled here, inside the runtime's context.
pub(crate) fn block_in<F: Future>(fut: F) -> F::Output {
    let _in_runtime = runtime().enter();
    futures::executor::block_on(fut)
}
