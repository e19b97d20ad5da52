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
use std::time::{Duration, Instant};

use dquant_transport::ring::{RingError, HANDSHAKE};
use dquant_transport::shm::RingOffer;
use dquant_transport::FrameWriter;
use rustix::net::RecvFlags;

use crate::data::{log_end, serve_each, Handshake, HELLO_TIMEOUT};
use crate::serve_plan::stream_ring;
use crate::serve_ranges::serve_ranges_ring;
use crate::sessions::{claim_error, Work};
use crate::Shared;

/// Accepts connections on the agent's Unix socket until the agent stops. gRPC connections
/// go to `grpc`; ring handshakes are served here.
pub(crate) fn accept_loop(
    listener: UnixListener,
    shared: Arc<Shared>,
    peers: Peers,
    grpc: tokio::sync::mpsc::UnboundedSender<UnixStream>,
) {
    let stopping = shared.clone();
    let peers = Arc::new(peers);
    serve_each(
        listener.incoming(),
        &stopping,
        "unix socket",
        "dquant-local",
        refuse_busy,
        move |conn, hs| {
            if peers.admit(&conn, &shared) {
                route(conn, shared.clone(), grpc.clone(), hs)
            }
        },
    );
}

/// Who may connect to the Unix socket: root, the agent's own user and group (those of the
/// socket file it created), and the config's `socket_uids` / `socket_gids`. The file's mode
/// (0660) keeps others from connecting at all; the peer check holds when the mode is widened
/// or the directory is shared.
pub(crate) struct Peers {
    uids: Vec<u32>,
    gids: Vec<u32>,
}

impl Peers {
    /// The peers of the socket at `path` (just bound by this process).
    pub fn new(path: &std::path::Path, uids: &[u32], gids: &[u32]) -> std::io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path)?;
        let mut p = Peers {
            uids: [0, m.uid()]
                .into_iter()
                .chain(uids.iter().copied())
                .collect(),
            gids: [m.gid()].into_iter().chain(gids.iter().copied()).collect(),
        };
        p.uids.dedup();
        Ok(p)
    }

    fn allows(&self, uid: u32, gid: u32) -> bool {
        self.uids.contains(&uid) || self.gids.contains(&gid)
    }

    /// Checks the connecting process's credentials (`SO_PEERCRED`); a stranger's connection
    /// is logged (once per uid) and closed.
    fn admit(&self, conn: &UnixStream, shared: &Shared) -> bool {
        let (uid, gid) = match rustix::net::sockopt::socket_peercred(conn) {
            Ok(c) => (c.uid.as_raw(), c.gid.as_raw()),
            Err(e) => {
                let m = format!("cannot read the peer's credentials: {e}");
                shared.refuse("unix socket", "?", "no credentials", &m);
                return false;
            }
        };
        if self.allows(uid, gid) {
            return true;
        }
        let m = format!(
            "uid {uid} gid {gid} may not connect (allow it with socket_uids or socket_gids)"
        );
        let peer = format!("uid {uid}");
        shared.refuse("unix socket", &peer, "peer not allowed", &m);
        let _ = conn.shutdown(std::net::Shutdown::Both);
        false
    }
}

/// Refuses a connection over `limits.max_handshakes` from the accept loop (see
/// `data::serve_each`): one small non-blocking write, no thread.
fn refuse_busy(conn: UnixStream, msg: &str) {
    let _ = conn.set_nonblocking(true);
    let _ = FrameWriter::new(&conn).fail(msg);
    let _ = conn.shutdown(std::net::Shutdown::Both);
}

/// Peeks at the first byte and routes the connection.
fn route(
    conn: UnixStream,
    shared: Arc<Shared>,
    grpc: tokio::sync::mpsc::UnboundedSender<UnixStream>,
    handshake: Handshake,
) {
    let _ = conn.set_read_timeout(Some(HELLO_TIMEOUT));
    let mut first = [0u8; 1];
    match rustix::net::recv(&conn, &mut first, RecvFlags::PEEK) {
        Ok((1, _)) if first[0] == HANDSHAKE[0] => ring_session(conn, &shared, handshake),
        Ok((1, _)) => {
            drop(handshake);
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

/// Receives a ring with its session's hello, attaches to it, and streams the session's plan
/// into it, or answers its range requests (they come on the same socket) into it.
fn ring_session(conn: UnixStream, shared: &Shared, handshake: Handshake) {
    let offer = match RingOffer::receive(&conn) {
        Ok(o) => o,
        Err(e) => return refuse(&conn, &e.to_string()),
    };
    let id = offer.hello.session;
    let owner = match shared.auth.hello_owner(offer.hello.token.as_deref()) {
        Ok(o) => o,
        Err(r) => {
            shared.refuse("unix socket", "?", r.reason(), r.message());
            return refuse(&conn, &format!("shared-memory ring: {}", r.message()));
        }
    };
    let claimed = shared
        .sessions
        .claim(id, &offer.hello.ticket, &owner, conn.as_fd());
    let Some((work, cancel)) = claimed else {
        return refuse(&conn, &claim_error(id));
    };
    let sink = conn
        .try_clone()
        .map_err(|source| RingError::Io { op: "dup", source })
        .and_then(|sock| offer.accept(sock, cancel.clone()))
        .map(|sink| sink.with_idle_limit(Duration::from_secs(shared.config.consumer_idle_secs)));
    let sink = match sink {
        Ok(s) => s,
        Err(e) => {
            shared.sessions.finish(id);
            return refuse(&conn, &format!("shared-memory ring: {e}"));
        }
    };
    drop(handshake);
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
    shared.events.streaming(&owner);
    let kind = work.kind();
    let result = match work {
        w @ Work::Source { .. } => crate::faults::contain(|| {
            serve_ranges_ring(w, sink, conn, (shared, &owner), cancel.clone())
        }),
        w => {
            let meter = w
                .meter(&shared.metrics, &owner)
                .with_tally(shared.events.tally(&owner));
            crate::faults::contain(|| stream_ring(w, sink, &cancel, shared, meter))
        }
    };
    shared.sessions.finish(id);
    log_end(shared, (id, &owner), kind, "shm", started, result);
}
