//! One data-plane connection, plain TCP or TLS over TCP, as halves two threads can use at
//! once: a sender thread writes frames while the session's thread reads requests, or a
//! range client writes requests while it reads answers.
//!
//! A TCP stream splits with `try_clone`; a TLS connection does not (its record state is
//! shared by both directions), and rustls's `StreamOwned` is one blocking object. So the
//! rustls connection sits behind a mutex that no one holds across a blocking socket call:
//! a reader reads raw bytes from the socket unlocked, then takes the lock to hand them to
//! rustls and take plaintext out; a writer seals its bytes under the lock and writes the
//! records to the socket under a second lock of its own, which keeps records on the wire in
//! the order they were sealed. Lock order is always writer lock, then connection lock; the
//! reader takes the connection lock alone. What the reader makes rustls want to send (an
//! alert) leaves with the next write.
//!
//! Written here rather than taken from a crate: tokio-rustls splits only async streams, and
//! the data plane is blocking sockets on purpose (see `dquant_remote::control`).

use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Raw bytes read from the socket at once (a TLS record is at most about 16.6 KiB).
const RAW_CHUNK: usize = 64 << 10;
/// Plaintext rustls takes in one write: a frame and its header.
const WRITE_LIMIT: usize = 2 << 20;

/// One data-plane connection (see the module docs). Cloning with
/// [`try_clone`](DataStream::try_clone) gives another handle on the same connection.
#[derive(Debug)]
pub struct DataStream {
    sock: TcpStream,
    tls: Option<Tls>,
}

/// A handle's view of the shared TLS state, with its own raw read buffer.
struct Tls {
    shared: Arc<TlsShared>,
    raw: Vec<u8>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls")
    }
}

struct TlsShared {
    conn: Mutex<Incoming>,
    /// Held while sealing and writing: the sealed records, reused between writes.
    out: Mutex<Vec<u8>>,
}

/// The rustls connection and the raw bytes read from the socket it has not taken yet
/// (`pending[pos..]`: rustls takes at most 4 KiB a call, so the buffer is walked, not
/// drained, and emptied once taken whole).
struct Incoming {
    conn: rustls::Connection,
    pending: Vec<u8>,
    pos: usize,
    /// The socket reached its end; rustls is told once `pending` is empty.
    eof: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere leaves the connection state as consistent as an I/O error would.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn tls_io(e: rustls::Error) -> io::Error {
    io::Error::new(ErrorKind::InvalidData, e)
}

impl DataStream {
    /// A plain TCP connection.
    pub fn plain(sock: TcpStream) -> Self {
        DataStream { sock, tls: None }
    }

    /// A TLS connection whose handshake `conn` completed over `sock` ([`crate::tls`] does the
    /// handshake and names its failures).
    pub(crate) fn established(sock: TcpStream, mut conn: rustls::Connection) -> Self {
        // A whole frame (1 MiB) is sealed in one go and leaves in one write.
        conn.set_buffer_limit(Some(WRITE_LIMIT));
        let shared = TlsShared {
            conn: Mutex::new(Incoming {
                conn,
                pending: Vec::new(),
                pos: 0,
                eof: false,
            }),
            out: Mutex::new(Vec::new()),
        };
        DataStream {
            sock,
            tls: Some(Tls {
                shared: Arc::new(shared),
                raw: Vec::new(),
            }),
        }
    }

    /// Another handle on this connection (the other half).
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(DataStream {
            sock: self.sock.try_clone()?,
            tls: self.tls.as_ref().map(|t| Tls {
                shared: t.shared.clone(),
                raw: Vec::new(),
            }),
        })
    }

    /// The TCP socket underneath: for its options, polling and shutdown, never for bytes.
    pub fn socket(&self) -> &TcpStream {
        &self.sock
    }

    /// Whether the connection is TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Whether bytes already received wait inside the connection (TLS buffers some), so a
    /// read returns without the socket becoming readable.
    pub fn has_buffered(&self) -> bool {
        let Some(t) = &self.tls else {
            return false;
        };
        let mut inc = lock(&t.shared.conn);
        if inc.pos < inc.pending.len() {
            return true;
        }
        inc.conn
            .process_new_packets()
            .map_or(true, |s| s.plaintext_bytes_to_read() > 0)
    }

    /// Whether a read would find something within `timeout`: bytes buffered here (TLS) or on
    /// the socket, or its end or an error (the read that follows reports them). A signal
    /// cuts the wait short and counts as not yet.
    pub fn readable(&self, timeout: Duration) -> io::Result<bool> {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        if self.has_buffered() {
            return Ok(true);
        }
        let t = Timespec {
            tv_sec: timeout.as_secs().min(i64::MAX as u64) as _,
            tv_nsec: timeout.subsec_nanos() as _,
        };
        let mut fds = [PollFd::new(&self.sock, PollFlags::IN)];
        match poll(&mut fds, Some(&t)) {
            Ok(n) => Ok(n > 0),
            Err(rustix::io::Errno::INTR) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

impl Tls {
    fn read(&mut self, sock: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            {
                let mut inc = lock(&self.shared.conn);
                match inc.conn.reader().read(buf) {
                    Ok(n) => return Ok(n),
                    // The peer closed without close_notify: the frame layer's own end frame
                    // says whether the stream was whole, as over plain TCP.
                    Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(0),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                if inc.feed()? {
                    continue;
                }
            }
            self.raw.resize(RAW_CHUNK, 0);
            let n = (&*sock).read(&mut self.raw)?;
            let mut inc = lock(&self.shared.conn);
            inc.take_raw(&self.raw[..n]);
        }
    }

    fn write(&self, sock: &TcpStream, buf: &[u8]) -> io::Result<usize> {
        let mut out = lock(&self.shared.out);
        let n = {
            let mut inc = lock(&self.shared.conn);
            let n = inc.conn.writer().write(buf)?;
            while inc.conn.wants_write() {
                inc.conn.write_tls(&mut *out)?;
            }
            n
        };
        let sent = (&*sock).write_all(&out);
        out.clear();
        sent.map(|()| n)
    }
}

impl Incoming {
    /// Keeps `raw`, read from the socket, for rustls (an empty read is the socket's end).
    fn take_raw(&mut self, raw: &[u8]) {
        if self.pos > 0 {
            self.pending.drain(..self.pos);
            self.pos = 0;
        }
        self.pending.extend_from_slice(raw);
        self.eof |= raw.is_empty();
    }

    /// Hands rustls the raw bytes it has not taken, until it has plaintext to give or has
    /// taken them all, or tells it of the socket's end; `false` when there was nothing to
    /// hand over (the socket must be read).
    fn feed(&mut self) -> io::Result<bool> {
        if self.pos == self.pending.len() {
            self.pending.clear();
            self.pos = 0;
            if !self.eof {
                return Ok(false);
            }
            self.eof = false;
            self.conn.read_tls(&mut io::empty())?;
            self.conn.process_new_packets().map_err(tls_io)?;
            return Ok(true);
        }
        while self.pos < self.pending.len() {
            let took = self.conn.read_tls(&mut &self.pending[self.pos..])?;
            if took == 0 {
                return Err(io::Error::other("TLS: the connection takes no more bytes"));
            }
            self.pos += took;
            let state = self.conn.process_new_packets().map_err(tls_io)?;
            if state.plaintext_bytes_to_read() > 0 {
                break;
            }
        }
        Ok(true)
    }
}

impl Read for DataStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.tls {
            Some(t) => t.read(&self.sock, buf),
            None => (&self.sock).read(buf),
        }
    }
}

impl Write for DataStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        (&*self).write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Write for &DataStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &self.tls {
            Some(t) => t.write(&self.sock, buf),
            None => (&self.sock).write(buf),
        }
    }

    /// Plain: one `writev`. TLS: the first non-empty buffer (records are encrypted one
    /// write at a time).
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match &self.tls {
            Some(t) => match bufs.iter().find(|b| !b.is_empty()) {
                Some(b) => t.write(&self.sock, b),
                None => Ok(0),
            },
            None => (&self.sock).write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
