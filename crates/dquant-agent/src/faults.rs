//! Faults that tests inject into a running agent, and how a panic is contained.
//!
//! # Why
//! A bug that panics while one session makes a batch must cost that session, not the agent:
//! the session's client gets a clear error (after the batches before it, like any failure),
//! a shared stream's subscribers each get its end, and every other client streams on. Tests
//! prove it by making a producer panic on purpose. The hook that does so exists only in
//! debug builds (`cfg(debug_assertions)`): a release agent carries no way to inject a fault,
//! and [`Faults`] is an empty value there whose check compiles to nothing.

use std::any::Any;

/// Where a producer runs: a session's own plan, or a shared stream's producer thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    Session,
    SharedStream,
}

/// A fault armed on an agent ([`crate::AgentHandle::inject`], debug builds only).
#[cfg(debug_assertions)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The next producer at `site` that makes its batch number `batch` (0-based) panics
    /// there, once.
    PanicAtBatch { site: Site, batch: u64 },
    /// The next range session (`OpenSource`) that receives its request number `request`
    /// (0-based) drops its connection there without an answer, once: a storage agent dying
    /// under a reader, as its readers see it.
    CutRangeSession { request: u64 },
    /// A fault of the agent's storage, on an object of any of its roots (named relative to
    /// its root): a failing or full disk under the agent (see [`dquant_storage::faulty`]).
    Storage(dquant_storage::faulty::StorageFault),
}

/// The faults armed on one agent (shared by its sessions). Empty in release builds.
#[derive(Clone, Debug, Default)]
pub(crate) struct Faults {
    #[cfg(debug_assertions)]
    armed: std::sync::Arc<std::sync::Mutex<Vec<Fault>>>,
    /// Storage faults, fired by the roots [`Faults::wrap`] wrapped.
    #[cfg(debug_assertions)]
    storage: dquant_storage::faulty::StorageFaults,
}

impl Faults {
    #[cfg(debug_assertions)]
    pub fn arm(&self, fault: Fault) {
        if let Fault::Storage(f) = fault {
            return self.storage.arm(f);
        }
        self.armed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(fault);
    }

    /// The catalog whose roots fail where storage faults say (itself, in release builds).
    pub fn wrap(&self, catalog: crate::catalog::Catalog) -> crate::catalog::Catalog {
        #[cfg(debug_assertions)]
        {
            use dquant_storage::faulty::FaultyRoot;
            let faults = self.storage.clone();
            catalog.map_roots(|r| std::sync::Arc::new(FaultyRoot::new(r, faults.clone())))
        }
        #[cfg(not(debug_assertions))]
        catalog
    }

    /// A range session received its request number `request`: whether a fault says to cut
    /// its connection there (never, in release builds).
    #[inline]
    pub fn cut_range_session(&self, _request: u64) -> bool {
        #[cfg(debug_assertions)]
        {
            let hit = Fault::CutRangeSession { request: _request };
            self.take(&hit)
        }
        #[cfg(not(debug_assertions))]
        false
    }

    /// How many faults are armed and have not fired.
    #[cfg(debug_assertions)]
    pub fn armed(&self) -> usize {
        let armed = self
            .armed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len();
        armed + self.storage.armed()
    }

    /// Disarms `fault` if it is armed; says whether it was.
    #[cfg(debug_assertions)]
    fn take(&self, fault: &Fault) -> bool {
        let mut armed = self
            .armed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let i = armed.iter().position(|f| f == fault);
        i.map(|i| armed.remove(i)).is_some()
    }

    /// A producer at `site` is about to make batch number `batch`: panics if a fault says so.
    #[inline]
    pub fn before_batch(&self, _site: Site, _batch: u64) {
        #[cfg(debug_assertions)]
        {
            let hit = Fault::PanicAtBatch {
                site: _site,
                batch: _batch,
            };
            if self.take(&hit) {
                panic!("injected fault: {_site:?} producer panics at batch {_batch}");
            }
        }
    }
}

/// The message a panic's payload carries (`panic!` with a string or a format).
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

/// What a client is told when its session's producer panicked: the agent serves on. With
/// the cursor where the stream stands, when it is known.
pub(crate) fn internal_error(payload: &(dyn Any + Send), consumed_samples: Option<u64>) -> String {
    let resume = match consumed_samples {
        Some(n) => format!("resume from consumed_samples {n}"),
        None => "resume from the last cursor you hold".to_string(),
    };
    format!(
        "internal error on the agent ({}): this stream is ended, the agent serves on; {resume}",
        panic_message(payload)
    )
}

/// Runs `f` on `state`; a panic in it becomes the message a client is told
/// ([`internal_error`], with the cursor `consumed_samples` reads off `state` when it knows
/// it), logged once here as `what` ends. The one place the agent catches a panic.
pub(crate) fn catch<S, T>(
    what: &str,
    state: &mut S,
    f: impl FnOnce(&mut S) -> T,
    consumed_samples: impl FnOnce(&S) -> Option<u64>,
) -> Result<T, Panicked> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(state))).map_err(|payload| {
        let m = internal_error(payload.as_ref(), consumed_samples(state));
        tracing::error!(error = %m, "{what} panicked; it ends, the agent serves on");
        Panicked(m)
    })
}

/// A panic [`catch`] caught: the message its session's client is told.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Panicked(pub String);

/// Runs a session's streaming on its thread; a panic anywhere in it (a relay, a range
/// server, not only a producer) becomes that session's failure instead of unwinding out of
/// the thread, so the session table, the metrics and the `Watch` feed see it end.
pub(crate) fn contain<T>(
    stream: impl FnOnce() -> Result<T, crate::stream_error::StreamError>,
) -> Result<T, crate::stream_error::StreamError> {
    catch("a session's thread", &mut (), |()| stream(), |()| None)
        .unwrap_or_else(|p| Err(crate::stream_error::StreamError::Panicked(p.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_armed_fault_fires_once_at_its_site_and_batch() {
        let f = Faults::default();
        f.arm(Fault::PanicAtBatch {
            site: Site::SharedStream,
            batch: 2,
        });
        f.before_batch(Site::Session, 2);
        f.before_batch(Site::SharedStream, 1);
        let hit = std::panic::catch_unwind(|| f.before_batch(Site::SharedStream, 2));
        let payload = hit.expect_err("the fault fires");
        assert_eq!(
            panic_message(payload.as_ref()),
            "injected fault: SharedStream producer panics at batch 2"
        );
        f.before_batch(Site::SharedStream, 2);
    }
}
