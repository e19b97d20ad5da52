//! The offload agent (`dquant serve`): serves named dataset roots, runs plans near the data
//! and streams finished batches to consumers.
//!
//! Two planes, as on a DPU:
//! - **control** (gRPC, [`grpc`]): `List`, `Stat`, `Open` (a plan), `OpenSource` (one
//!   dataset, for chaining) and `Close`. Requests are validated and their sources opened
//!   before the reply, so errors arrive here, with the field or dataset they concern.
//! - **data** (TCP, [`data`]): each session streams over one connection in 1 MiB
//!   checksummed frames from a pool allocated when the session starts (its prefetch
//!   budget); nothing is allocated per frame.
//! - **local** (a Unix socket, [`local`], when configured): the control plane again, for
//!   clients on this host, and the hand-over of shared-memory rings: the session then writes
//!   finished batches straight into the client's memory (the emulated DMA path).
//!
//! The plan work itself is [`dquant_engine::Pipeline`], the same code a client runs
//! in-process, so offloaded and local batches are byte-identical by construction. A plan
//! source may name another agent's dataset (`dquant://host:port/root/path`); the session then
//! pulls token ranges from that agent — an agent near the host chained to one near storage.

mod catalog;
mod config;
mod data;
mod grpc;
mod local;
mod produce;
mod serve_plan;
mod serve_ranges;
mod sessions;

use std::net::{SocketAddr, TcpListener};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use catalog::{Catalog, NameError};
pub use config::{AgentConfig, DEFAULT_LISTEN, DEFAULT_PREFETCH};
pub use serve_ranges::MAX_RANGE_TOKENS;

/// State every handler and connection shares.
pub(crate) struct Shared {
    pub config: AgentConfig,
    pub catalog: Catalog,
    pub sessions: sessions::Sessions,
    pub data_port: u16,
    pub stopping: AtomicBool,
}

impl Shared {
    /// The Unix socket path clients may hand rings to ("" when there is none).
    pub fn socket_path(&self) -> String {
        self.config
            .socket
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    }
}

/// Errors starting an agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("{0}")]
    Config(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot listen on {}: {reason}", path.display())]
    BindUnix { path: PathBuf, reason: String },
    #[error("cannot start the agent: {0}")]
    Start(String),
}

/// A running agent. Dropping it (or [`AgentHandle::shutdown`]) stops it.
pub struct AgentHandle {
    control_addr: SocketAddr,
    data_addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::watch::Sender<bool>>,
    server: Option<std::thread::JoinHandle<Result<(), String>>>,
}

impl AgentHandle {
    /// Where the control plane listens (the address clients put in `dquant://`).
    pub fn control_addr(&self) -> SocketAddr {
        self.control_addr
    }

    /// Where the data plane listens.
    pub fn data_addr(&self) -> SocketAddr {
        self.data_addr
    }

    /// `dquant://HOST:PORT` for this agent.
    pub fn uri(&self) -> String {
        format!("dquant://{}", self.control_addr)
    }

    /// The agent's Unix socket, when it has one (clients on this host may use the path as
    /// the agent's address; batches then arrive through shared memory).
    pub fn socket(&self) -> Option<&Path> {
        self.shared.config.socket.as_deref()
    }

    /// (pending, active) sessions right now.
    pub fn sessions(&self) -> (usize, usize) {
        self.shared.sessions.counts()
    }

    /// Blocks until the control plane stops (it runs until shutdown or a fatal error).
    pub fn wait(mut self) -> Result<(), String> {
        match self.server.take() {
            Some(h) => h
                .join()
                .map_err(|_| "the control plane thread panicked".to_string())?,
            None => Ok(()),
        }
    }

    /// Stops accepting, cancels every session and waits for the control plane to stop.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
        self.shared.sessions.close_all();
        // Wake the accept loops so they see `stopping`.
        let _ = std::net::TcpStream::connect_timeout(&self.data_addr, Duration::from_secs(1));
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(true);
            if let Some(path) = &self.shared.config.socket {
                let _ = UnixStream::connect(path);
                let _ = std::fs::remove_file(path);
            }
        }
        if let Some(h) = self.server.take() {
            let _ = h.join();
        }
    }
}

impl Drop for AgentHandle {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// Starts an agent: binds both planes, then serves on background threads.
pub fn start(config: AgentConfig) -> Result<AgentHandle, AgentError> {
    config.validate().map_err(AgentError::Config)?;
    let catalog = Catalog::new(&config.roots).map_err(AgentError::Config)?;
    let control = TcpListener::bind(config.listen).map_err(|source| AgentError::Bind {
        addr: config.listen,
        source,
    })?;
    let control_addr = control
        .local_addr()
        .map_err(|e| AgentError::Start(e.to_string()))?;
    let data_want = config.data_addr();
    let data = TcpListener::bind(data_want).map_err(|source| AgentError::Bind {
        addr: data_want,
        source,
    })?;
    let data_addr = data
        .local_addr()
        .map_err(|e| AgentError::Start(e.to_string()))?;
    let local = config.socket.as_deref().map(bind_unix).transpose()?;
    let shared = Arc::new(Shared {
        sessions: sessions::Sessions::new(
            config.max_sessions,
            Duration::from_secs(config.ticket_ttl_secs),
        ),
        catalog,
        config,
        data_port: data_addr.port(),
        stopping: AtomicBool::new(false),
    });
    {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("dquant-accept".into())
            .spawn(move || data::accept_loop(data, shared))
            .map_err(|e| AgentError::Start(e.to_string()))?;
    }
    let grpc_local = match local {
        Some(listener) => {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<UnixStream>();
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("dquant-accept-local".into())
                .spawn(move || local::accept_loop(listener, shared, tx))
                .map_err(|e| AgentError::Start(e.to_string()))?;
            Some(rx)
        }
        None => None,
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let svc = grpc::Service {
        shared: shared.clone(),
    };
    control
        .set_nonblocking(true)
        .map_err(|e| AgentError::Start(e.to_string()))?;
    let server = std::thread::Builder::new()
        .name("dquant-control".into())
        .spawn(move || -> Result<(), String> {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("dquant-grpc")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async move {
                let listener =
                    tokio::net::TcpListener::from_std(control).map_err(|e| e.to_string())?;
                // Nagle off on the control connections: an Open must not wait on a delayed ACK
                // (that cost 40 ms of time-to-first-batch).
                let incoming =
                    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
                let svc = dquant_proto::v1::agent_server::AgentServer::new(svc);
                let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
                    let _ = rx.wait_for(|stop| *stop).await;
                };
                let tcp = tonic::transport::Server::builder()
                    .add_service(svc.clone())
                    .serve_with_incoming_shutdown(incoming, stopped(stop_rx.clone()));
                let Some(rx) = grpc_local else {
                    return tcp.await.map_err(|e| e.to_string());
                };
                // Connections the Unix socket's router identified as gRPC.
                let uds = tokio_stream::StreamExt::map(
                    tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
                    |s| {
                        s.set_nonblocking(true)?;
                        tokio::net::UnixStream::from_std(s)
                    },
                );
                let uds = tonic::transport::Server::builder()
                    .add_service(svc)
                    .serve_with_incoming_shutdown(uds, stopped(stop_rx));
                tokio::try_join!(tcp, uds)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })
        })
        .map_err(|e| AgentError::Start(e.to_string()))?;
    tracing::info!(
        control = %control_addr,
        data = %data_addr,
        socket = %shared.socket_path(),
        roots = ?shared.catalog.roots().keys().collect::<Vec<_>>(),
        prefetch_frames = shared.config.prefetch_frames,
        "agent listening"
    );
    Ok(AgentHandle {
        control_addr,
        data_addr,
        shared,
        stop: Some(stop_tx),
        server: Some(server),
    })
}

/// Binds the agent's Unix socket. A socket file nobody answers on is what a killed agent
/// leaves behind: it is replaced. One that answers belongs to a running agent: an error.
fn bind_unix(path: &Path) -> Result<UnixListener, AgentError> {
    let err = |reason: String| AgentError::BindUnix {
        path: path.to_path_buf(),
        reason,
    };
    match UnixListener::bind(path) {
        Ok(l) => Ok(l),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            use std::os::unix::fs::FileTypeExt;
            let is_socket = std::fs::symlink_metadata(path)
                .map(|m| m.file_type().is_socket())
                .unwrap_or(false);
            if !is_socket {
                return Err(err("the path exists and is not a socket".into()));
            }
            if UnixStream::connect(path).is_ok() {
                return Err(err("another process is listening on it".into()));
            }
            std::fs::remove_file(path).map_err(|e| err(format!("removing a stale socket: {e}")))?;
            UnixListener::bind(path).map_err(|e| err(e.to_string()))
        }
        Err(e) => Err(err(e.to_string())),
    }
}
