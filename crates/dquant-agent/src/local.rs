//! The agent's Unix socket: clients on the same host reach the control plane through it, and
//! hand over their shared-memory rings (the emulated DMA path, see
//! [`dquant_transport::ring`]).
//!
//! One socket serves both so that a client needs one address, a path. The two protocols are
//! told apart by the first byte a connection sends, without consuming it: a ring handshake
//! starts with [`HANDSHAKE`] (`d…`), gRPC with the HTTP/2 preface (`PRI …`). gRPC
//! connections are handed to the tonic server; rings get a thread each, as data connections
//! do on the TCP plane.

use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::Instant;

use dquant_transport::ring::{RingError, HANDSHAKE};
use dquant_transport::shm::RingOffer;
use dquant_transport::FrameWriter;
use rustix::net::RecvFlags;

use crate::data::{log_end, serve_each, HELLO_TIMEOUT};
use crate::serve_plan::stream_ring;
use crate::sessions::claim_error;
use crate::Shared;

/// Accepts connections on the agent's Unix socket until the agent stops. gRPC connections
/// go to `grpc`; ring handshakes are served here.
pub(crate) fn accept_loop(
    listener: UnixListener,
    shared: Arc<Shared>,
    grpc: tokio::sync::mpsc::UnboundedSender<UnixStream>,
) {
    let stopping = shared.clone();
    serve_each(
        listener.incoming(),
        &stopping.stopping,
        "unix socket",
        "dquant-local",
        move |conn| route(conn, shared.clone(), grpc.clone()),
    );
}

/// Peeks at the first byte and routes the connection.
fn route(
    conn: UnixStream,
    shared: Arc<Shared>,
    grpc: tokio::sync::mpsc::UnboundedSender<UnixStream>,
) {
    let _ = conn.set_read_timeout(Some(HELLO_TIMEOUT));
    let mut first = [0u8; 1];
    match rustix::net::recv(&conn, &mut first, RecvFlags::PEEK) {
        Ok((1, _)) if first[0] == HANDSHAKE[0] => ring_session(conn, &shared),
        Ok((1, _)) => {
            let _ = conn.set_read_timeout(None);
            // The tonic server owns it from here; a send fails only while shutting down.
            let _ = grpc.send(conn);
        }
        // Closed or silent for HELLO_TIMEOUT: nothing to answer.
        _ => {}
    }
}

fn refuse(conn: &UnixStream, msg: &str) {
    tracing::warn!(reason = %msg, "unix socket: ring refused");
    if let Ok(c) = conn.try_clone() {
        let _ = FrameWriter::new(c).fail(msg);
    }
    let _ = conn.shutdown(std::net::Shutdown::Both);
}

/// Receives a ring with its session's hello, attaches to it and streams the session's plan
/// into it.
fn ring_session(conn: UnixStream, shared: &Shared) {
    let offer = match RingOffer::receive(&conn) {
        Ok(o) => o,
        Err(e) => return refuse(&conn, &e.to_string()),
    };
    let id = offer.hello.session;
    let Some((work, cancel)) = shared.sessions.claim(id, &offer.hello.ticket, conn.as_fd()) else {
        return refuse(&conn, &claim_error(id));
    };
    let sink = conn
        .try_clone()
        .map_err(|source| RingError::Io { op: "dup", source })
        .and_then(|sock| offer.accept(sock, cancel.clone()));
    let sink = match sink {
        Ok(s) => s,
        Err(e) => {
            shared.sessions.finish(id);
            return refuse(&conn, &format!("shared-memory ring: {e}"));
        }
    };
    let _ = conn.set_read_timeout(None);
    let started = Instant::now();
    if let Some(l) = sink.layout() {
        tracing::info!(
            session = id,
            transport = "shm",
            slots = l.slot_count,
            slot_size = l.slot_size,
            "session streaming"
        );
    }
    let result = stream_ring(work, sink, &cancel);
    shared.sessions.finish(id);
    log_end(id, "plan", "shm", started, result);
}
