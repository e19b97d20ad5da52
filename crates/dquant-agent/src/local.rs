//! The agent's Unix socket: clients on the same host reach the control plane through it, and
//! hand over their shared-memory rings (the emulated DMA path, see
//! [`dquant_transport::ring`]).
//!
//! One socket serves both so that a client needs one address, a path. The two protocols are
//! told apart by the first byte a connection sends, without consuming it: a ring handshake
//! starts with [`HANDSHAKE`] (`d…`), gRPC with the HTTP/2 preface (`PRI …`). gRPC
//! connections are handed to the tonic server; rings get a thread each, as data connections
//! do on the TCP plane.

use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::Duration;

use dquant_transport::ring::{RingError, HANDSHAKE};
use dquant_transport::shm::{RingOffer, RingSink};
use dquant_transport::{FrameWriter, Hello};
use rustix::net::RecvFlags;

use crate::accept::{serve_each, Handshake, HELLO_TIMEOUT};
use crate::carrier::{self, Carrier, Claimed, Refusal};
use crate::metrics::Meter;
use crate::produce::Stats;
use crate::serve_plan::stream_in_memory;
use crate::serve_ranges::serve_ranges_ring;
use crate::sessions::Work;
use crate::share::serve_subscriber;
use crate::stream_error::StreamError;
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
/// `accept::serve_each`): one small non-blocking write, no thread.
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

/// Receives a ring with its session's hello and serves the session in it.
fn ring_session(conn: UnixStream, shared: &Shared, handshake: Handshake) {
    match RingOffer::receive(&conn) {
        Ok(offer) => {
            let ring = RingConn {
                conn,
                hello: offer.hello.clone(),
                shared: offer.shared,
                offer: Some(offer),
            };
            carrier::serve(ring, shared, handshake)
        }
        Err(e) => refuse(&conn, &e.to_string()),
    }
}

/// A ring handed over on the Unix socket with its session's hello: the session's plan
/// batches go into its slots in the output dtype, read in place by the consumer; a source
/// session's requests come as frames on the socket and each answer takes one slot.
struct RingConn {
    conn: UnixStream,
    hello: Hello,
    /// The consumer may read a shared stream's shared ring instead of its own.
    shared: bool,
    /// The offer, until the ring is attached ([`Carrier::ready`]).
    offer: Option<RingOffer>,
}

impl Carrier for RingConn {
    const TRANSPORT: &'static str = "shm";
    const PLANE: &'static str = "unix socket";
    const WHAT: &'static str = "shared-memory ring";
    /// The ring, attached.
    type Ready = RingSink;

    fn hello(&self) -> &Hello {
        &self.hello
    }

    fn peer(&self) -> &str {
        "?"
    }

    fn hangup(&self) -> Option<BorrowedFd<'_>> {
        Some(self.conn.as_fd())
    }

    fn refuse(&self, message: &str) {
        refuse(&self.conn, message)
    }

    /// Attaches to the ring (it is checked and mapped here), with the consumer's idle limit.
    fn ready(&mut self, session: &Claimed<'_>) -> Result<Self::Ready, Refusal> {
        let Claimed { shared, cancel, .. } = session;
        let offer = self
            .offer
            .take()
            .ok_or(("bad ring", "no ring".to_string()))?;
        let id = self.hello.session;
        let idle = Duration::from_secs(shared.config.consumer_idle_secs);
        let sink = self
            .conn
            .try_clone()
            .map_err(|source| RingError::Io { op: "dup", source })
            .and_then(|sock| offer.accept(sock, cancel.clone()))
            .map_err(|e| ("bad ring", e.to_string()))?
            .with_idle_limit(idle);
        let _ = self.conn.set_read_timeout(None);
        if let Some(l) = sink.layout() {
            let (slots, slot_size) = (l.slot_count, l.slot_size);
            tracing::info!(session = id, slots, slot_size, "ring attached");
        }
        Ok(sink)
    }

    fn carry(
        self,
        mut sink: Self::Ready,
        work: Work,
        session: Claimed<'_>,
    ) -> Result<Stats, StreamError> {
        let Claimed {
            shared,
            owner,
            cancel,
        } = session;
        match work {
            w @ Work::Source { .. } => {
                serve_ranges_ring(w, sink, self.conn, (shared, owner), cancel)
            }
            Work::Subscriber { sub } if self.shared => {
                let meter = Meter::off().with_tally(shared.events.tally(owner));
                serve_subscriber(sub, sink, &self.conn, &cancel, &meter)
            }
            w => {
                let meter = w
                    .meter(&shared.metrics, owner)
                    .with_tally(shared.events.tally(owner));
                let not_ranges =
                    "shared-memory rings carry plan batches; open a source over the data port";
                stream_in_memory(w, &mut sink, &cancel, shared, meter, not_ranges)
            }
        }
    }
}
