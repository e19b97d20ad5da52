//! Choosing a transport and connecting a session's data plane: the one place that knows
//! which [`BatchSource`] each [`Transport`] is.
//!
//! An agent's control plane says where its data plane is ([`Endpoint`]); a consumer names
//! the transport it wants (from the agent's address) and gets a `dyn BatchSource`. Adding a
//! transport (RDMA) means one module with its `BatchSource`, and its [`Kind`] with one line in
//! [`TRANSPORTS`] here; the address option (`?transport=NAME`) and every list of transports
//! follow from the registry. (The kinds stand here, not in their modules, so that a
//! transport's module never imports the registry that imports it.)

use std::fmt;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::str::FromStr;

pub use crate::error::ConnectError;
use crate::loopback;
use crate::receive::BatchSource;
use crate::ring::{Answer, RingConsumer, HANDSHAKE, HANDSHAKE_SHARED};
use crate::shm::{RingRecords, RingSource};
use crate::tcp::{self, TcpBatchSource};
use crate::tls::ClientTls;
use crate::Hello;

/// How batches of an offloaded plan reach this process: one entry of [`TRANSPORTS`], named
/// in agent addresses (`?transport=NAME`) and in reports.
///
/// A transport is a name and a way to connect a session's data plane ([`Kind`]); adding one
/// (RDMA, a DOCA DMA ring) is a module with its `BatchSource`, its `Kind` and one line in
/// [`TRANSPORTS`], and every list of transports (address parsing, messages, Python's)
/// follows.
#[derive(Clone, Copy)]
pub struct Transport(&'static Kind);

/// What a transport is: its name, and how it connects.
pub struct Kind {
    /// The name in agent addresses and reports.
    pub name: &'static str,
    /// Connects the data plane of the session `endpoint` describes.
    pub connect: fn(&Endpoint) -> Result<Box<dyn BatchSource>, ConnectError>,
}

/// Every transport, the default for a network address first.
pub const TRANSPORTS: &[&Kind] = &[&TCP, &SHM, &LOOPBACK];

/// Frames over the agent's TCP data port (any host; TLS when the agent serves it).
const TCP: Kind = Kind {
    name: "tcp",
    connect: |endpoint| {
        let (_writer, records) =
            tcp::connect(&endpoint.data_addr, &endpoint.hello, endpoint.tls.as_ref())?;
        Ok(Box::new(TcpBatchSource::new(records)))
    },
};

/// A shared-memory ring this process creates and hands to the agent over its Unix socket
/// (same host only): batches land in the ring in the output dtype and are read in place.
const SHM: Kind = Kind {
    name: "shm",
    connect: |endpoint| Ok(Box::new(connect_ring(endpoint)?)),
};

/// Records handed over in memory to an agent in this process (`dquant_agent::start`).
const LOOPBACK: Kind = Kind {
    name: "loopback",
    connect: |e| {
        Ok(Box::new(loopback::connect(
            &e.data_addr,
            &e.hello,
            e.ring.slots,
        )?))
    },
};

impl Transport {
    pub const TCP: Transport = Transport(&TCP);
    pub const SHM: Transport = Transport(&SHM);

    /// The name in agent addresses (`?transport=…`) and in reports.
    pub fn as_str(self) -> &'static str {
        self.0.name
    }

    /// Every transport, in [`TRANSPORTS`]' order.
    pub fn all() -> impl Iterator<Item = Transport> {
        TRANSPORTS.iter().map(|k| Transport(k))
    }

    /// The names of every transport, as a message lists them: `tcp, shm or loopback`.
    pub fn names() -> String {
        let names: Vec<&str> = Self::all().map(Transport::as_str).collect();
        match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => names.join(""),
        }
    }
}

impl PartialEq for Transport {
    fn eq(&self, other: &Self) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for Transport {}

impl std::hash::Hash for Transport {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.0.name.hash(h)
    }
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Transport({})", self.0.name)
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Transport {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::all()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| format!("unknown transport {s:?}; use {}", Self::names()))
    }
}

/// A ring's shape, chosen by the consumer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingShape {
    pub slots: u32,
    /// Bytes per slot: a whole batch record, page aligned.
    pub slot_size: u64,
    /// Whether the agent computes, and the consumer checks, each record's crc32c.
    pub verify: bool,
}

/// Where a session's data plane is, and how the session proves it is the one opened.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// The agent's address as the consumer named it (for messages).
    pub agent: String,
    /// The agent's TCP data plane, `HOST:PORT`.
    pub data_addr: String,
    /// The agent's Unix socket on this host, where rings are handed over (if it has one).
    pub socket: Option<PathBuf>,
    /// The session's hello (id and ticket from `Open`).
    pub hello: Hello,
    /// The ring to create, for [`Transport::SHM`].
    pub ring: RingShape,
    /// TLS for the TCP data plane, when the agent serves it.
    pub tls: Option<ClientTls>,
    /// The session subscribes to a shared stream: over shared memory it offers its ring with
    /// [`HANDSHAKE_SHARED`] and reads the stream's shared ring if the agent answers so.
    pub shared: bool,
}

/// Connects the data plane of the session `endpoint` describes over `transport`.
pub fn connect(
    transport: Transport,
    endpoint: &Endpoint,
) -> Result<Box<dyn BatchSource>, ConnectError> {
    (transport.0.connect)(endpoint)
}

/// Creates a ring of `endpoint.ring`'s shape and hands it to the agent with the session's
/// hello: the agent writes batch records into it, and the returned source reads them in
/// place. A shared stream's subscriber reads the reader block of the stream's shared ring
/// instead when the agent answers with one.
fn connect_ring(endpoint: &Endpoint) -> Result<RingSource, ConnectError> {
    let (ring, sock) = hand_over(endpoint)?;
    if !endpoint.shared {
        return Ok(RingSource::new(ring, sock));
    }
    match Answer::recv(&sock)? {
        Some(Answer::Reader { fds, reader }) => {
            drop(ring);
            let mut shared = RingConsumer::attach(fds, reader, endpoint.ring.verify)?;
            let peer = sock.try_clone().map_err(|source| ConnectError::Connect {
                addr: endpoint.agent.clone(),
                source,
            })?;
            shared.set_peer(OwnedFd::from(peer));
            Ok(RingSource::new(shared, sock))
        }
        // Our own ring; or the agent refused the session and its message waits on the socket.
        Some(Answer::Own) | None => Ok(RingSource::new(ring, sock)),
    }
}

/// Creates a ring of `endpoint.ring`'s shape for a range session and hands it to the agent
/// with the session's hello: the agent answers each range requested on the returned
/// records' socket in one slot.
pub fn connect_range_ring(endpoint: &Endpoint) -> Result<RingRecords, ConnectError> {
    let (ring, sock) = hand_over(endpoint)?;
    Ok(RingRecords::new(ring, sock))
}

/// Creates the ring, hands it over on a new connection to the agent's Unix socket, and
/// returns our end of both.
fn hand_over(endpoint: &Endpoint) -> Result<(RingConsumer, UnixStream), ConnectError> {
    let path = endpoint
        .socket
        .as_ref()
        .ok_or_else(|| ConnectError::NoSocket {
            agent: endpoint.agent.clone(),
        })?;
    let err = |source| ConnectError::Connect {
        addr: path.display().to_string(),
        source,
    };
    let RingShape {
        slots,
        slot_size,
        verify,
    } = endpoint.ring;
    let (mut ring, fds) = RingConsumer::create_with(slots, slot_size, verify)?;
    let sock = UnixStream::connect(path).map_err(err)?;
    let tag = if endpoint.shared {
        HANDSHAKE_SHARED
    } else {
        HANDSHAKE
    };
    fds.send_tagged(&sock, tag, &endpoint.hello.encode())?;
    // Our copies of the descriptors go now: the agent holds its own.
    drop(fds);
    let peer = sock.try_clone().map_err(err)?;
    ring.set_peer(OwnedFd::from(peer));
    Ok((ring, sock))
}
