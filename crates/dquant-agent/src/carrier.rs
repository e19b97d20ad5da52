//! One session on a data connection, whatever transport carries it.
//!
//! Every transport's listener does its own handshake (a TLS accept and a hello frame on the
//! TCP data port, a ring offer on the Unix socket, an in-memory offer on the loopback plane)
//! and then hands the connection here as a [`Carrier`]. What follows is the same for all of
//! them, so it is written once: the hello's tenant, the claim of the pending session, the
//! transport made ready for it, the `Watch` events, the session run with its panics contained,
//! and its end in the table, the metrics and the log. A new transport's agent side is one
//! module with its accept loop and its `Carrier`, and one line in `start` that starts it.

use std::os::fd::BorrowedFd;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use dquant_transport::Hello;

use crate::accept::Handshake;
use crate::produce::Stats;
use crate::sessions::{claim_error, Work};
use crate::stream_error::StreamError;
use crate::Shared;

/// A data connection that has said which session it is (its hello), in the terms of the
/// transport that accepted it.
pub(crate) trait Carrier: Sized {
    /// The transport's name, as the session's end event and log lines give it (`tcp`).
    const TRANSPORT: &'static str;
    /// Where refusals are counted and logged (`data`, `unix socket`).
    const PLANE: &'static str;
    /// What a refusal's message to the consumer starts with (`data stream`).
    const WHAT: &'static str;
    /// What [`Carrier::ready`] makes for [`Carrier::carry`]: the session's sink, its pacer.
    type Ready;

    /// The hello the connection presented.
    fn hello(&self) -> &Hello;

    /// The peer, as refusals and log lines name it.
    fn peer(&self) -> &str;

    /// The descriptor the session table shuts down to cancel the session, waking whatever
    /// its thread is blocked on; `None` for a transport whose waits watch the cancel flag.
    fn hangup(&self) -> Option<BorrowedFd<'_>>;

    /// Tells the consumer `message` and closes the connection (the caller has counted and
    /// logged the refusal).
    fn refuse(&self, message: &str);

    /// Makes the transport ready for the session just claimed (a ring attached, timeouts
    /// lifted); the refusal's reason and message when it cannot be.
    fn ready(&mut self, session: &Claimed<'_>) -> Result<Self::Ready, Refusal>;

    /// Where a panic of the session is told to its consumer, if the transport can still say
    /// it after the stream that panicked was lost (a second handle on the connection).
    fn panic_notice(&self) -> Option<Notice> {
        None
    }

    /// Carries the session's work until its end, an error, its cancel or the agent's drain.
    fn carry(
        self,
        ready: Self::Ready,
        work: Work,
        session: Claimed<'_>,
    ) -> Result<Stats, StreamError>;
}

/// Tells a consumer its session's panic.
pub(crate) type Notice = Box<dyn FnOnce(&str)>;

/// Why a transport cannot carry a claimed session: the refusal's reason (metrics) and its
/// message.
pub(crate) type Refusal = (&'static str, String);

/// A session just claimed: for whom, with what, and the flag that cancels it.
pub(crate) struct Claimed<'a> {
    pub shared: &'a Shared,
    /// The tenant (`""` when the agent serves anyone).
    pub owner: &'a str,
    pub cancel: Arc<AtomicBool>,
}

/// Serves the session `conn` said hello for, from its claim to its end; a hello that is no
/// pending session of its tenant is refused with the reason.
pub(crate) fn serve<C: Carrier>(mut conn: C, shared: &Shared, handshake: Handshake) {
    let refuse = |conn: &C, reason: &'static str, message: String| {
        shared.refuse(C::PLANE, conn.peer(), reason, &message);
        conn.refuse(&message);
    };
    let id = conn.hello().session;
    let owner = match shared.auth.hello_owner(conn.hello().token.as_deref()) {
        Ok(o) => o,
        Err(r) => return refuse(&conn, r.reason(), format!("{}: {}", C::WHAT, r.message())),
    };
    let ticket = conn.hello().ticket;
    let Some((work, cancel)) = shared.sessions.claim(id, &ticket, &owner, conn.hangup()) else {
        return refuse(&conn, "bad hello", claim_error(id));
    };
    let session = Claimed {
        shared,
        owner: &owner,
        cancel,
    };
    let ready = match conn.ready(&session) {
        Ok(r) => r,
        Err((reason, m)) => {
            shared.sessions.finish(id);
            return refuse(&conn, reason, format!("{}: {m}", C::WHAT));
        }
    };
    drop(handshake);
    let started = Instant::now();
    let kind = work.kind();
    let transport = C::TRANSPORT;
    tracing::info!(
        session = id,
        peer = conn.peer(),
        kind,
        transport,
        "session streaming"
    );
    shared.events.streaming(&owner);
    let notice = conn.panic_notice();
    let result = crate::faults::contain(|| conn.carry(ready, work, session));
    if let (Err(StreamError::Panicked(m)), Some(tell)) = (&result, notice) {
        tell(m);
    }
    shared.sessions.finish(id);
    log_end(shared, (id, &owner), kind, transport, started, result);
}

/// The log line at a session's end.
pub(crate) fn log_end(
    shared: &Shared,
    (id, tenant): (u64, &str),
    kind: &str,
    transport: &str,
    started: Instant,
    result: Result<Stats, StreamError>,
) {
    let how = match &result {
        Ok(_) => "finished",
        Err(StreamError::Drained(_)) => "drained",
        Err(StreamError::Stopped(_)) => "stopped",
        Err(_) => "failed",
    };
    shared.metrics.session_end(how);
    let stats = result.as_ref().copied().unwrap_or_default();
    shared.events.closed(dquant_proto::v1::SessionClosed {
        session: id,
        tenant: tenant.to_string(),
        kind: kind.to_string(),
        transport: transport.to_string(),
        how: how.to_string(),
        message: result
            .as_ref()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default(),
        records: stats.records,
        tokens: stats.tokens,
        wire_bytes: stats.wire_bytes,
    });
    let secs = started.elapsed().as_secs_f64();
    match result {
        Ok(s) => tracing::info!(
            session = id,
            kind,
            transport,
            records = s.records,
            tokens = s.tokens,
            wire_bytes = s.wire_bytes,
            secs,
            "session ended"
        ),
        Err(StreamError::Drained(m)) => {
            tracing::info!(session = id, kind, transport, secs, message = %m, "session drained")
        }
        Err(e) => {
            tracing::warn!(session = id, kind, transport, error = %e, secs, "session ended early")
        }
    }
}
