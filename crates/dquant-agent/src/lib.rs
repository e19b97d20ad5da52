//! The offload agent (`dquant serve`): serves named dataset roots, runs plans near the data
//! and streams finished batches to consumers.
//!
//! Two planes, as on a DPU:
//! - **control** (gRPC, [`grpc`]): `List`, `Stat`, `Open` (a plan, alone or as a shared
//!   stream), `Subscribe` (a shared stream by name), `OpenSource` (one dataset, for
//!   chaining), `Index`, `Watch` and `Close`. Requests are validated and their sources opened
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
//! A plan opened as a shared stream ([`share`]) runs once for every subscriber.

mod accept;
mod auth;
pub mod bandwidth;
mod carrier;
mod catalog;
mod config;
mod config_error;
mod control;
mod data;
mod events;
pub mod faults;
mod grpc;
mod limits;
mod local;
mod loopback;
mod megatron;
mod metrics;
mod open_pool;
mod pacing;
mod produce;
mod requests;
mod serve_plan;
mod serve_ranges;
mod sessions;
mod share;
mod start;
mod stream_end;
mod stream_error;
mod stream_level;

use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dquant_remote::Credentials;
use dquant_transport::ServerTls;
use tonic_health::ServingStatus;

pub use auth::{TenantConfig, MIN_TOKEN_LEN};
pub use catalog::{Catalog, NameError};
pub use config::{
    AgentConfig, BandwidthConfig, BlockCacheConfig, TlsFiles, TrafficClass, DEFAULT_LISTEN,
    DEFAULT_PREFETCH,
};
pub use config_error::ConfigError;
pub use control::ControlError;
pub use limits::{LimitError, Limits, MAX_RANGE_TOKENS};
pub use start::start;

/// State every handler and connection shares.
pub(crate) struct Shared {
    pub config: AgentConfig,
    pub auth: auth::Auth,
    pub refusals: auth::RefusalLog,
    pub metrics: metrics::Metrics,
    pub catalog: Catalog,
    /// Datasets opened once and shared by the sessions that read them.
    pub datasets: dquant_storage::DatasetCache,
    /// The bytes of int32 and uint16 datasets kept mapped for narrowing (`map_budget`); `None`:
    /// none.
    pub maps: Option<Arc<dquant_storage::MapBudget>>,
    /// Megatron-order builds, by config (`OpenMegatron`).
    pub megatron: megatron::MegatronIndexes,
    pub sessions: Arc<sessions::Sessions>,
    pub opens: open_pool::OpenPool,
    /// The threads sessions share for reads and compression (`worker_threads`); `None`
    /// for none (each session works alone).
    pub workers: Option<Arc<dquant_engine::WorkerPool>>,
    /// Connections (data port and Unix socket) that have not said hello yet.
    pub handshakes: AtomicUsize,
    pub data_port: u16,
    /// TLS on both TCP planes, when configured.
    pub tls: Option<ServerTls>,
    /// What this agent presents to, and expects of, its upstreams.
    pub upstream: Credentials,
    /// No new connections or requests: the agent is stopping.
    pub stopping: AtomicBool,
    /// Plan sessions end after the batch in hand, telling their consumers where to resume
    /// (graceful shutdown, [`AgentHandle::drain`]).
    pub draining: Arc<AtomicBool>,
    /// Tenants' shares of the data link and their traffic classes (`[bandwidth]`).
    pub shaping: Option<Arc<pacing::Shaping>>,
    /// What the `Watch` RPC streams.
    pub events: Arc<events::Events>,
    /// Shared streams (`share`), by tenant and name.
    pub shares: share::Shares,
    /// The disk cache of `s3://` roots' blocks (`[block_cache]`), for its metrics.
    pub block_cache: Option<Arc<dquant_storage::BlockCache>>,
    /// Faults tests inject (debug builds only; empty otherwise).
    pub faults: faults::Faults,
}

impl Shared {
    /// Refuses a request or connection: counted in the metrics, logged once per peer and
    /// reason.
    pub fn refuse(&self, plane: &str, peer: &str, reason: &'static str, detail: &str) {
        self.metrics.refusal(reason);
        self.events
            .refused(plane, reason, &format!("{peer}: {detail}"));
        self.refusals.refuse(plane, peer, reason, detail);
    }

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
    Config(#[from] ConfigError),
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

/// What a graceful shutdown ([`AgentHandle::drain`]) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainReport {
    /// Plan sessions streaming when it began: each was told where to resume, unless forced.
    pub streaming: usize,
    /// Sessions still running at the end of the grace period, then cancelled.
    pub forced: usize,
}

/// A running agent. Dropping it (or [`AgentHandle::shutdown`]) stops it.
pub struct AgentHandle {
    control_addr: SocketAddr,
    data_addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::watch::Sender<bool>>,
    server: Option<std::thread::JoinHandle<Result<(), control::ControlError>>>,
    /// Reports the agent's health (`grpc.health.v1`); turned to NOT_SERVING by a drain.
    health: tonic_health::server::HealthReporter,
    runtime: tokio::runtime::Handle,
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

    /// What the shared dataset cache has done so far.
    pub fn datasets(&self) -> dquant_storage::CacheStats {
        self.shared.datasets.stats()
    }

    /// Requests queued for or running on the open workers right now.
    pub fn open_queue(&self) -> usize {
        self.shared.opens.depth()
    }

    /// Whether the control plane has stopped (a fatal error; [`AgentHandle::wait`] says which).
    pub fn is_finished(&self) -> bool {
        self.server.as_ref().is_none_or(|h| h.is_finished())
    }

    /// Blocks until the control plane stops (it runs until shutdown or a fatal error).
    pub fn wait(mut self) -> Result<(), ControlError> {
        match self.server.take() {
            Some(h) => h.join().map_err(|_| ControlError::Panicked)?,
            None => Ok(()),
        }
    }

    /// Arms `fault` (tests only: debug builds have this hook, release builds do not).
    #[cfg(debug_assertions)]
    pub fn inject(&self, fault: faults::Fault) {
        self.shared.faults.arm(fault);
    }

    /// Faults armed and not fired yet (debug builds only): a test's proof that its faults
    /// happened.
    #[cfg(debug_assertions)]
    pub fn faults_armed(&self) -> usize {
        self.shared.faults.armed()
    }

    /// Stops accepting, cancels every session and waits for the control plane to stop.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    /// Shuts down gracefully: health turns NOT_SERVING and new sessions are refused, each plan
    /// session finishes the batch it is making and then tells its consumer where to resume
    /// ("agent shutting down; resume from consumed_samples N"); once the sessions end, or
    /// `grace` passes, it stops accepting connections and requests, removes the Unix socket
    /// file and cancels the sessions still running (a consumer that stopped reading).
    pub fn drain(mut self, grace: Duration) -> DrainReport {
        let deadline = Instant::now() + grace;
        let not_serving = self
            .health
            .set_service_status(control::SERVICE, ServingStatus::NotServing);
        self.runtime.block_on(not_serving);
        self.shared.draining.store(true, Ordering::Relaxed);
        self.shared.stopping.store(true, Ordering::Relaxed);
        let streaming = self.shared.sessions.drain();
        // The control plane stays up while the sessions drain, so that health checks read
        // NOT_SERVING (and new opens are refused as draining) rather than a closed port.
        while self.shared.sessions.counts().1 > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.stop_accepting();
        let forced = self.shared.sessions.counts().1;
        self.shared.sessions.close_all();
        // The control plane finishes the requests in flight; past the grace period it is
        // left to the process's exit.
        while self.server.as_ref().is_some_and(|h| !h.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if let Some(h) = self.server.take().filter(|h| h.is_finished()) {
            let _ = h.join();
        }
        DrainReport { streaming, forced }
    }

    /// Wakes the accept loops (they see `stopping` and return), stops the control plane
    /// and removes the Unix socket file.
    fn stop_accepting(&mut self) {
        let _ = std::net::TcpStream::connect_timeout(&self.data_addr, Duration::from_secs(1));
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(true);
            if let Some(path) = &self.shared.config.socket {
                let _ = UnixStream::connect(path);
                let _ = std::fs::remove_file(path);
            }
        }
    }

    fn stop_now(&mut self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
        self.shared.sessions.close_all();
        self.stop_accepting();
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
