//! Accepting connections on any plane, before they say hello: each gets a thread of its own
//! and counts against `limits.max_handshakes` until its hello is checked ([`Handshake`]);
//! one over the limit is refused from the accept loop itself. The TCP data port, the Unix
//! socket and the loopback plane all accept through [`serve_each`].

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::Shared;

/// How long a new connection has to send its hello.
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection that has not said hello yet: counted against `limits.max_handshakes` from
/// its accept until its hello is checked (or it fails), across both planes.
pub(crate) struct Handshake {
    shared: Arc<Shared>,
}

impl Handshake {
    /// Counts one more connection in its handshake, or `None` when the agent is at its limit.
    fn enter(shared: &Arc<Shared>) -> Option<Self> {
        let max = shared.config.limits.max_handshakes;
        let n = shared.handshakes.fetch_add(1, Ordering::Relaxed);
        let h = Handshake {
            shared: shared.clone(),
        };
        // Over the limit: dropping `h` takes the count back.
        (n < max).then_some(h)
    }
}

impl Drop for Handshake {
    fn drop(&mut self) {
        self.shared.handshakes.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a connection over `limits.max_handshakes` is told.
pub(crate) fn busy_message(max: usize) -> String {
    format!(
        "agent is at its limit of {max} connections waiting for their hello \
         (limits.max_handshakes); retry later"
    )
}

/// Accepts connections until the agent is stopping, each handled on its own thread (shared
/// by the TCP data plane and the Unix socket), with its [`Handshake`] place; one over the
/// limit is refused with `refuse` and never gets a thread. A failed accept is logged and
/// retried.
pub(crate) fn serve_each<S: Send + 'static>(
    incoming: impl Iterator<Item = std::io::Result<S>>,
    shared: &Arc<Shared>,
    plane: &'static str,
    thread: &'static str,
    refuse: fn(S, &str),
    handle: impl Fn(S, Handshake) + Clone + Send + 'static,
) {
    for conn in incoming {
        if shared.stopping.load(Ordering::Relaxed) {
            break;
        }
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "{plane}: accept failed");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let Some(hs) = Handshake::enter(shared) else {
            let msg = busy_message(shared.config.limits.max_handshakes);
            shared.refuse(plane, "any", "handshakes full", &msg);
            refuse(conn, &msg);
            continue;
        };
        let handle = handle.clone();
        let spawned = std::thread::Builder::new()
            .name(thread.into())
            .spawn(move || handle(conn, hs));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "{plane}: cannot start a connection thread");
        }
    }
}
