//! The data plane listener: accepts connections, checks their hello, runs their session.
//!
//! Each connection gets its own thread (a session streams at most one connection, and the
//! work per connection is bulk copying, not waiting), so one stuck or hostile peer holds one
//! thread and nothing else. Connections that have not said hello are bounded
//! (`limits.max_handshakes`) and get a hello-sized buffer only; a session's buffers come
//! after its hello is accepted. Anything that is not a valid hello for a pending session gets an
//! error frame saying why, and the connection is closed. With `[tls]`, the TLS handshake
//! comes first, within the same hello timeout and handshake count.

use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::Duration;

use dquant_transport::record::MAX_HELLO_LEN;
use dquant_transport::{BufferPool, DataStream, FrameReader, FrameWriter, Hello, Pacer};

use crate::accept::{serve_each, Handshake, HELLO_TIMEOUT};
use crate::carrier::{self, Carrier, Claimed, Notice, Refusal};
use crate::produce::Stats;
use crate::serve_plan::stream_plan;
use crate::serve_ranges::serve_ranges;
use crate::sessions::Work;
use crate::stream_error::StreamError;
use crate::Shared;

/// The largest hello frame read: a hello is at most [`MAX_HELLO_LEN`] bytes, so a
/// connection that has not said who it is never gets a frame-sized buffer.
const HELLO_BUF: usize = 4096;
const _: () = assert!(MAX_HELLO_LEN <= HELLO_BUF);

pub(crate) fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let stopping = shared.clone();
    let refuse = match shared.tls {
        Some(_) => refuse_busy_tls,
        None => refuse_busy_tcp,
    };
    serve_each(
        listener.incoming(),
        &stopping,
        "data plane",
        "dquant-conn",
        refuse,
        move |conn, hs| handle(conn, shared.clone(), hs),
    );
}

/// Refuses a TCP connection from the accept loop itself: no thread, one small write that a
/// fresh socket's empty send buffer takes without blocking.
fn refuse_busy_tcp(conn: TcpStream, msg: &str) {
    let _ = conn.set_nonblocking(true);
    let _ = FrameWriter::new(&conn).fail(msg);
    let _ = conn.shutdown(std::net::Shutdown::Both);
}

/// Refuses a connection to a TLS data port from the accept loop: the reason cannot be said
/// without a handshake, which the loop does not wait for, so the connection is closed (the
/// refusal is logged and counted).
fn refuse_busy_tls(conn: TcpStream, _msg: &str) {
    let _ = conn.shutdown(std::net::Shutdown::Both);
}

/// The first frame of a data connection, which must be a hello; the message says what else
/// came.
fn read_hello<R: std::io::Read>(frames: &mut FrameReader<R>) -> Result<Hello, HelloError> {
    let pool = BufferPool::new(1, HELLO_BUF);
    let mut buf = pool.get();
    match frames.next_into(&mut buf) {
        Ok(true) => Ok(Hello::parse(&buf)?),
        Ok(false) => Err(HelloError::Ended),
        Err(e) => Err(e.into()),
    }
}

/// Why a data connection's first frame is not a hello.
#[derive(Debug, thiserror::Error)]
enum HelloError {
    #[error("{0}")]
    Frame(#[from] dquant_transport::WireError),
    #[error("{0}")]
    Hello(#[from] dquant_transport::RecordError),
    #[error("data stream: expected a hello frame, got an end frame")]
    Ended,
}

fn handle(sock: TcpStream, shared: Arc<Shared>, handshake: Handshake) {
    let peer = sock
        .peer_addr()
        .map(|a| a.ip().to_string())
        .unwrap_or_else(|_| "?".into());
    let _ = sock.set_nodelay(true);
    let _ = sock.set_read_timeout(Some(HELLO_TIMEOUT));
    let _ = sock.set_write_timeout(Some(HELLO_TIMEOUT));
    let conn = match &shared.tls {
        None => DataStream::plain(sock),
        Some(tls) => match tls.accept(sock) {
            Ok(c) => c,
            Err(e) => return shared.refuse("data", &peer, "tls handshake", &e.to_string()),
        },
    };
    let Ok(read_half) = conn.try_clone() else {
        return;
    };
    let mut frames = FrameReader::new(read_half);
    match read_hello(&mut frames) {
        Ok(hello) => {
            let tcp = TcpConn {
                conn,
                frames,
                hello,
                peer,
            };
            carrier::serve(tcp, &shared, handshake)
        }
        Err(e) => {
            shared.refuse("data", &peer, "bad hello", &e.to_string());
            refuse_on(&conn, &e.to_string());
        }
    }
}

/// Tells the consumer `message` in an error frame, and closes the connection.
fn refuse_on(conn: &DataStream, message: &str) {
    let _ = FrameWriter::new(conn).fail(message);
    let _ = conn.socket().shutdown(std::net::Shutdown::Both);
}

/// A TCP (or TLS) data connection that said hello: plan batches go out as frames in the
/// session's wire codec, paced by its tenant's share of the link; a source session's
/// requests come in on `frames`.
struct TcpConn {
    conn: DataStream,
    frames: FrameReader<DataStream>,
    hello: Hello,
    /// The peer's IP address.
    peer: String,
}

impl Carrier for TcpConn {
    const TRANSPORT: &'static str = "tcp";
    const PLANE: &'static str = "data";
    const WHAT: &'static str = "data stream";
    /// The tenant's share of the link, if the agent shapes it.
    type Ready = Option<Box<dyn Pacer>>;

    fn hello(&self) -> &Hello {
        &self.hello
    }

    fn peer(&self) -> &str {
        &self.peer
    }

    fn hangup(&self) -> Option<BorrowedFd<'_>> {
        Some(self.conn.socket().as_fd())
    }

    fn refuse(&self, message: &str) {
        refuse_on(&self.conn, message)
    }

    /// Marks the socket's traffic class and takes the tenant's pacer; lifts the hello's
    /// timeouts for the liveness checks of a stream.
    fn ready(&mut self, session: &Claimed<'_>) -> Result<Self::Ready, Refusal> {
        let Claimed { shared, owner, .. } = *session;
        let socket = self.conn.socket();
        let pacer = shared.shaping.as_ref().and_then(|s| {
            if let Err(e) = s.mark(owner, socket) {
                tracing::warn!(session = self.hello.session, error = %e, "cannot mark the data socket's traffic class");
            }
            s.pacer(owner)
        });
        let _ = socket.set_read_timeout(None);
        keep_alive(
            socket,
            Duration::from_secs(shared.config.consumer_idle_secs),
        );
        Ok(pacer)
    }

    /// A panic is told on a second handle of the connection: the first went into the
    /// stream that panicked.
    fn panic_notice(&self) -> Option<Notice> {
        let n = self.conn.try_clone().ok()?;
        Some(Box::new(move |m: &str| {
            let _ = FrameWriter::new(n).fail(m);
        }))
    }

    fn carry(
        mut self,
        pacer: Self::Ready,
        work: Work,
        session: Claimed<'_>,
    ) -> Result<Stats, StreamError> {
        let Claimed {
            shared,
            owner,
            cancel,
        } = session;
        match work {
            w @ (Work::Plan { .. } | Work::Subscriber { .. }) => {
                let meter = w
                    .meter(&shared.metrics, owner)
                    .with_tally(shared.events.tally(owner));
                stream_plan(w, self.conn, cancel, shared, meter, pacer)
            }
            w @ Work::Source { .. } => serve_ranges(
                w,
                self.conn,
                &mut self.frames,
                (shared, owner),
                cancel,
                pacer,
            ),
        }
    }
}

/// Liveness of a streaming connection: TCP keepalive finds a peer that vanished (a host
/// that died without a FIN) while nothing is in flight; `TCP_USER_TIMEOUT` and the send
/// timeout release a session whose consumer read nothing for `idle` (a stalled or vanished
/// reader with data in flight). Best effort: a socket that refuses an option keeps the
/// kernel's default.
fn keep_alive(conn: &TcpStream, idle: Duration) {
    use rustix::net::sockopt;
    let _ = sockopt::set_socket_keepalive(conn, true);
    let _ = sockopt::set_tcp_keepidle(conn, KEEPALIVE_IDLE);
    let _ = sockopt::set_tcp_keepintvl(conn, KEEPALIVE_INTERVAL);
    let _ = sockopt::set_tcp_keepcnt(conn, KEEPALIVE_PROBES);
    let ms = u32::try_from(idle.as_millis()).unwrap_or(u32::MAX);
    let _ = sockopt::set_tcp_user_timeout(conn, ms);
    let _ = conn.set_write_timeout(Some(idle));
}

/// Keepalive: the first probe after a minute of silence, then every 10 s, 6 unanswered
/// probes drop the connection (two minutes for a dead peer).
const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_PROBES: u32 = 6;
