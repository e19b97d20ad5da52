//! Why a data connection could not be made, whatever the transport: in a module of its own so
//! that each transport's connect and the dispatch over them (`connect`) depend on it, not on
//! each other.

use crate::ring::RingError;
use crate::tls::TlsError;
use crate::WireError;

/// Why a data plane could not be connected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    #[error("cannot reach agent {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("shared-memory ring: {0}")]
    Ring(#[from] RingError),
    #[error("{0}")]
    Wire(#[from] WireError),
    #[error("{0}")]
    Tls(#[from] TlsError),
    #[error("transport=shm: the agent at {agent} has no Unix socket; start it on this host with `dquant serve --socket PATH` and use that path as its address")]
    NoSocket { agent: String },
}
