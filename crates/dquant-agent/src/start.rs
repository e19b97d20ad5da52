//! Starting an agent, step by step: the configuration checked, what it serves opened, both
//! planes (and the Unix socket) bound, the metrics endpoint and the worker pools started, the
//! shared state assembled, and the background threads spawned. Each step is a function named
//! for it, so `start` reads as the list.

use std::net::{SocketAddr, TcpListener};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dquant_remote::Credentials;
use dquant_storage::BlockCache;
use dquant_transport::ServerTls;
use tokio::runtime::Handle;
use tokio::task::AbortHandle;
use tonic_health::ServingStatus;

use crate::{
    auth, control, data, events, faults, local, loopback, megatron, metrics, open_pool, pacing,
    sessions, share, AgentConfig, AgentError, AgentHandle, Catalog, ConfigError, Shared,
};

/// Starts an agent: binds both planes, then serves on background threads.
pub fn start(config: AgentConfig) -> Result<AgentHandle, AgentError> {
    config.validate()?;
    let access = Access::open(&config)?;
    let planes = Listeners::bind(&config)?;
    let runtime = dquant_runtime::handle();
    let (metrics, exporter) = serve_metrics(&config, &runtime)?;
    let (health, health_service) = tonic_health::server::health_reporter();
    runtime.block_on(health.set_service_status(control::SERVICE, ServingStatus::Serving));
    let shared = Arc::new(assemble(config, access, metrics, planes.data_addr)?);
    spawn_named("dquant-reaper", {
        let shared = shared.clone();
        move || reap(&shared)
    })?;
    spawn_named("dquant-accept", {
        let (data, shared) = (planes.data, shared.clone());
        move || data::accept_loop(data, shared)
    })?;
    loopback::listen(planes.data_addr.port(), &shared)
        .map_err(|e| AgentError::Start(e.to_string()))?;
    let grpc_local = planes.local.map(|l| accept_local(l, &shared)).transpose()?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let server = control::spawn(control::Plane {
        runtime: runtime.clone(),
        exporter,
        listener: planes.control,
        local: grpc_local,
        shared: shared.clone(),
        health: health_service,
        stop: stop_rx,
    })
    .map_err(|e| AgentError::Start(e.to_string()))?;
    log_listening(&shared, planes.control_addr, planes.data_addr);
    Ok(AgentHandle {
        control_addr: planes.control_addr,
        data_addr: planes.data_addr,
        shared,
        stop: Some(stop_tx),
        server: Some(server),
        health,
        runtime,
    })
}

/// What the agent serves and to whom: its block cache, the catalog of roots over it, the
/// tenants, its own TLS and the credentials it shows upstream agents.
struct Access {
    cache: Option<Arc<BlockCache>>,
    catalog: Catalog,
    auth: auth::Auth,
    tls: Option<ServerTls>,
    upstream: Credentials,
}

impl Access {
    fn open(config: &AgentConfig) -> Result<Self, ConfigError> {
        let cache = match &config.block_cache {
            Some(c) => Some(
                BlockCache::open(&c.dir, c.max_bytes, c.block_bytes).map_err(|e| {
                    ConfigError::invalid(
                        format!("block_cache ({})", c.dir.display()),
                        e.to_string(),
                    )
                })?,
            ),
            None => None,
        };
        let catalog = Catalog::new(&config.roots, &config.s3, cache.as_ref())?;
        let roots: Vec<&str> = config.roots.keys().map(String::as_str).collect();
        let auth = auth::Auth::new(&config.tenants, &roots)?;
        let tls = load_tls(config)?;
        let upstream = upstream_credentials(config)?;
        let plaintext_ok = tls.is_some() || config.allow_plaintext;
        auth::check_binds(&auth, plaintext_ok, &[config.listen, config.data_addr()])?;
        Ok(Access {
            cache,
            catalog,
            auth,
            tls,
            upstream,
        })
    }
}

/// The agent's bound listeners: control, data, and the Unix socket with its allowed peers.
struct Listeners {
    control: TcpListener,
    control_addr: SocketAddr,
    data: TcpListener,
    data_addr: SocketAddr,
    local: Option<(UnixListener, local::Peers)>,
}

impl Listeners {
    fn bind(config: &AgentConfig) -> Result<Self, AgentError> {
        let (control, control_addr) = bind_tcp(config.listen)?;
        let (data, data_addr) = bind_tcp(config.data_addr())?;
        let local = match config.socket.as_deref() {
            Some(path) => {
                let l = bind_unix(path)?;
                let peers = local::Peers::new(path, &config.socket_uids, &config.socket_gids)
                    .map_err(|e| AgentError::BindUnix {
                        path: path.to_path_buf(),
                        reason: e.to_string(),
                    })?;
                Some((l, peers))
            }
            None => None,
        };
        Ok(Listeners {
            control,
            control_addr,
            data,
            data_addr,
            local,
        })
    }
}

fn bind_tcp(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), AgentError> {
    let l = TcpListener::bind(addr).map_err(|source| AgentError::Bind { addr, source })?;
    let bound = l
        .local_addr()
        .map_err(|e| AgentError::Start(e.to_string()))?;
    Ok((l, bound))
}

/// The agent's metrics: served on `metrics_listen` from `runtime`, or off; with the
/// exporter's task, which stops with the control plane.
fn serve_metrics(
    config: &AgentConfig,
    runtime: &Handle,
) -> Result<(metrics::Metrics, Option<AbortHandle>), AgentError> {
    let Some(addr) = config.metrics_listen else {
        return Ok((metrics::Metrics::off(), None));
    };
    // The exporter binds its listener in the runtime that serves it.
    let _in_runtime = runtime.enter();
    let (m, exporter) =
        metrics::Metrics::serve(addr).map_err(|e| AgentError::Start(e.to_string()))?;
    let task = runtime.spawn(async move {
        if let Err(e) = exporter.await {
            tracing::error!(error = ?e, "metrics endpoint stopped");
        }
    });
    Ok((m, Some(task.abort_handle())))
}

/// The state every plane and session shares, with its pools started.
fn assemble(
    config: AgentConfig,
    access: Access,
    metrics: metrics::Metrics,
    data_addr: SocketAddr,
) -> Result<Shared, AgentError> {
    let l = &config.limits;
    let opens = open_pool::OpenPool::new(
        l.open_workers,
        l.max_queued_opens,
        Duration::from_secs(l.open_timeout_secs),
    )
    .map_err(|e| AgentError::Start(format!("cannot start the open workers: {e}")))?;
    let workers = match config.worker_threads {
        0 => None,
        n => Some(Arc::new(
            dquant_engine::WorkerPool::new(n)
                .map_err(|e| AgentError::Start(format!("cannot start the worker threads: {e}")))?
                .min_share_of(Duration::from_micros(config.worker_min_share_us)),
        )),
    };
    let shaping = pacing::Shaping::new(&config, &metrics)?;
    let events = Arc::new(events::Events::new());
    let faults = faults::Faults::default();
    Ok(Shared {
        shaping,
        shares: share::Shares::default(),
        workers,
        sessions: Arc::new(sessions::Sessions::new(
            config.max_sessions,
            Duration::from_secs(config.ticket_ttl_secs),
            events.clone(),
        )),
        events,
        opens,
        handshakes: AtomicUsize::new(0),
        auth: access.auth,
        refusals: auth::RefusalLog::default(),
        metrics,
        catalog: faults.wrap(access.catalog),
        datasets: dquant_storage::DatasetCache::new(config.keep_datasets),
        maps: dquant_storage::MapBudget::of(config.map_budget_bytes()),
        megatron: megatron::MegatronIndexes::new(config.keep_megatron_builds),
        config,
        data_port: data_addr.port(),
        tls: access.tls,
        upstream: access.upstream,
        stopping: AtomicBool::new(false),
        draining: Arc::new(AtomicBool::new(false)),
        block_cache: access.cache,
        faults,
    })
}

fn spawn_named(name: &str, f: impl FnOnce() + Send + 'static) -> Result<(), AgentError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map(drop)
        .map_err(|e| AgentError::Start(e.to_string()))
}

/// Accepts on the Unix socket on a thread of its own; the connections that are gRPC go to the
/// control plane through the returned channel.
fn accept_local(
    (listener, peers): (UnixListener, local::Peers),
    shared: &Arc<Shared>,
) -> Result<tokio::sync::mpsc::UnboundedReceiver<UnixStream>, AgentError> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<UnixStream>();
    let shared = shared.clone();
    spawn_named("dquant-accept-local", move || {
        local::accept_loop(listener, shared, peers, tx)
    })?;
    Ok(rx)
}

fn log_listening(shared: &Shared, control: SocketAddr, data: SocketAddr) {
    tracing::info!(
        control = %control,
        data = %data,
        socket = %shared.socket_path(),
        roots = ?shared.catalog.roots().keys().collect::<Vec<_>>(),
        prefetch_frames = shared.config.prefetch_frames,
        worker_threads = shared.config.worker_threads,
        worker_min_share_us = shared.config.worker_min_share_us,
        map_budget_bytes = shared.maps.as_ref().map_or(0, |m| m.limit()),
        tls = shared.tls.is_some(),
        "agent listening"
    );
}

/// The agent's certificate and key, when `[tls]` names them.
fn load_tls(config: &AgentConfig) -> Result<Option<ServerTls>, ConfigError> {
    let Some(f) = &config.tls else {
        return Ok(None);
    };
    ServerTls::from_files(&f.cert, &f.key)
        .map(Some)
        .map_err(|e| ConfigError::invalid("tls", e.to_string()))
}

/// The token and TLS this agent uses with its upstreams.
fn upstream_credentials(config: &AgentConfig) -> Result<Credentials, ConfigError> {
    let tls = match &config.upstream_tls_ca {
        None => None,
        Some(ca) => Some(
            Credentials::tls(ca, config.upstream_tls_name.as_deref())
                .map_err(|e| ConfigError::invalid("upstream_tls_ca", e.to_string()))?,
        ),
    };
    Ok(Credentials {
        token: config.upstream_token.clone(),
        tls,
    })
}

/// Frees the places of sessions whose data connection never came, once a second, until
/// the agent stops. (Without it they expired only when the next `Open` looked, so a burst
/// of abandoned opens locked every later client out.)
fn reap(shared: &Shared) {
    while !shared.stopping.load(Ordering::Relaxed) {
        std::thread::sleep(REAP_EVERY);
        shared.sessions.expire();
        let (pending, streaming) = shared.sessions.counts();
        shared
            .metrics
            .set_gauges(pending, streaming, shared.opens.depth());
        if let Some(c) = &shared.block_cache {
            shared.metrics.set_block_cache(c.stats());
        }
    }
}

/// How often [`reap`] looks.
const REAP_EVERY: Duration = Duration::from_secs(1);

/// Binds the agent's Unix socket. A socket file nobody answers on is what a killed agent
/// leaves behind: it is replaced. One that answers belongs to a running agent: an error.
fn bind_unix(path: &Path) -> Result<UnixListener, AgentError> {
    let err = |reason: String| AgentError::BindUnix {
        path: path.to_path_buf(),
        reason,
    };
    let listener = match UnixListener::bind(path) {
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
    }?;
    // Owner and group only, whatever the umask; each peer is checked too (`local`).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .map_err(|e| err(format!("setting its mode to 0660: {e}")))?;
    Ok(listener)
}
