//! The data plane listener: accepts connections, checks their hello, runs their session.
//!
//! Each connection gets its own thread (a session streams at most one connection, and the
//! work per connection is bulk copying, not waiting), so one stuck or hostile peer holds one
//! thread and nothing else. Anything that is not a valid hello for a pending session gets an
//! error frame saying why, and the connection is closed.

use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dquant_transport::frame::MAX_PAYLOAD;
use dquant_transport::{BufferPool, FrameReader, FrameWriter, Hello};

use crate::produce::Stats;
use crate::serve_plan::stream_plan;
use crate::serve_ranges::serve_ranges;
use crate::sessions::{claim_error, StreamError, Work};
use crate::Shared;

/// How long a new connection has to send its hello.
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let stopping = shared.clone();
    serve_each(
        listener.incoming(),
        &stopping.stopping,
        "data plane",
        "dquant-conn",
        move |conn| handle(conn, shared.clone()),
    );
}

/// Accepts connections until the agent is stopping, each handled on its own thread (shared
/// by the TCP data plane and the Unix socket). A failed accept is logged and retried.
pub(crate) fn serve_each<S: Send + 'static>(
    incoming: impl Iterator<Item = std::io::Result<S>>,
    stopping: &AtomicBool,
    plane: &'static str,
    thread: &'static str,
    handle: impl Fn(S) + Clone + Send + 'static,
) {
    for conn in incoming {
        if stopping.load(Ordering::Relaxed) {
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
        let handle = handle.clone();
        let spawned = std::thread::Builder::new()
            .name(thread.into())
            .spawn(move || handle(conn));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "{plane}: cannot start a connection thread");
        }
    }
}

fn handle(conn: TcpStream, shared: Arc<Shared>) {
    let peer = conn
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into());
    let refuse = |conn: &TcpStream, msg: String| {
        tracing::warn!(%peer, reason = %msg, "data plane: connection refused");
        if let Ok(c) = conn.try_clone() {
            let _ = FrameWriter::new(c).fail(&msg);
        }
        let _ = conn.shutdown(std::net::Shutdown::Both);
    };
    let _ = conn.set_nodelay(true);
    let _ = conn.set_read_timeout(Some(HELLO_TIMEOUT));
    let Ok(read_half) = conn.try_clone() else {
        return;
    };
    let mut frames = FrameReader::new(read_half);
    let pool = BufferPool::new(1, MAX_PAYLOAD);
    let mut buf = pool.get();
    let hello = match frames.next_into(&mut buf) {
        Ok(true) => Hello::parse(&buf).map_err(|e| e.to_string()),
        Ok(false) => Err("data stream: expected a hello frame, got an end frame".into()),
        Err(e) => Err(e.to_string()),
    };
    let hello = match hello {
        Ok(h) => h,
        Err(m) => return refuse(&conn, m),
    };
    let Some((work, cancel)) = shared
        .sessions
        .claim(hello.session, &hello.ticket, conn.as_fd())
    else {
        return refuse(&conn, claim_error(hello.session));
    };
    let _ = conn.set_read_timeout(None);
    let id = hello.session;
    let started = Instant::now();
    let kind = match &work {
        Work::Plan { .. } => "plan",
        Work::Source { .. } => "source",
    };
    tracing::info!(session = id, %peer, kind, "session streaming");
    let result = match work {
        w @ Work::Plan { .. } => stream_plan(w, conn, shared.config.prefetch_frames, cancel),
        w @ Work::Source { .. } => serve_ranges(w, conn, &mut frames, cancel),
    };
    shared.sessions.finish(id);
    log_end(id, kind, "tcp", started, result);
}

/// The log line at a session's end.
pub(crate) fn log_end(
    id: u64,
    kind: &str,
    transport: &str,
    started: Instant,
    result: Result<Stats, StreamError>,
) {
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
        Err(e) => {
            tracing::warn!(session = id, kind, transport, error = %e, secs, "session ended early")
        }
    }
}
