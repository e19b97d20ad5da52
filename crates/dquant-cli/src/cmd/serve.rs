//! `dquant serve`: run the offload agent in the foreground.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use anyhow::{Context, Result};
use dquant_agent::{AgentConfig, AgentHandle, TlsFiles};

const EXAMPLES: &str = "\
Examples:
  dquant serve --root corpus=/data/tokens                 # loopback: 127.0.0.1:7878 (+ data :7879)
  dquant serve --config agent.toml --listen 0.0.0.0:7878  # beyond loopback: [[tenants]] + [tls]
  dquant serve --config agent.toml --tls-cert agent.pem --tls-key agent.key  # TLS, both planes
  DQUANT_LOG=debug dquant serve --root corpus=data        # more log detail (default: info)
  dquant serve --root corpus=/data --socket /run/dquant.sock  # + a Unix socket: shared memory
  dquant serve --root none=/empty --upstream 10.0.0.5:7878    # may chain to that agent
  dquant serve --root web=s3://corpus/web                 # a bucket prefix, by ranged GETs;
                                      # endpoint and keys: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ... or [s3]

  # agent.toml (every field but [roots] is optional):
  #   listen = \"127.0.0.1:7878\"       # gRPC control plane
  #   data_listen = \"127.0.0.1:7879\"  # data plane (default: control port + 1)
  #   socket = \"/run/dquant.sock\"     # local clients: control plane + shared-memory rings
  #   prefetch_frames = 8             # 1 MiB frames each session may fill ahead
  #   worker_threads = 8              # reads + compression, shared by sessions (default: cores - 2, at most 8)
  #   worker_min_share_us = 200       # spread a batch's reads only in shares this slow (0: always)
  #   max_sessions = 256
  #   keep_datasets = 16              # datasets kept open while no session reads them
  #   map_budget = 12884901888        # bytes of int32/uint16 datasets read from maps kept with them
  #                                   #   (default: half this host's memory; 0: pread only)
  #   keep_maps = false               # true: maps of every int32/uint16 dataset, past the budget
  #   keep_megatron_builds = 4        # Megatron-order builds (agent=) kept after their sessions end
  #   megatron_cache = \"/var/cache/dquant/megatron\" # their indices on disk (default: memory only)
  #   ticket_ttl_secs = 60            # how long an opened session waits for its data connection
  #   upstreams = [\"10.0.0.5:7878\"]   # agents plans may chain to (default: none)
  #   upstream_timeout_secs = 30      # each call to an upstream, each read on its data socket
  #   shutdown_grace_secs = 10        # SIGTERM/SIGINT: time for streams to end at a batch
  #   consumer_idle_secs = 1800       # a consumer reading nothing this long loses its session
  #   metrics_listen = \"127.0.0.1:9464\" # Prometheus metrics (default: off)
  #   [limits]                        # what one request may ask (defaults shown)
  #   max_batch_bytes = 268435456     # batch_size x (seq_len + 1) x itemsize
  #   max_batch_samples = 65536       # batch_size
  #   max_sources = 1024
  #   max_world = 65536
  #   max_range_tokens = 16777216     # one range request of a chained agent
  #   max_zstd_level = 9              # wire codecs
  #   max_handshakes = 64             # connections that have not said hello yet
  #   open_workers = 4                # threads opening datasets
  #   max_queued_opens = 64           # requests waiting for one (more: refused as busy)
  #   open_timeout_secs = 60          # one request's time in the open workers
  #   max_megatron_samples = 2147483648 # num_samples of one Megatron-order build, all splits
  #   max_megatron_index_entries = 2147483648 # one document index: documents x epochs
  #   socket_uids = [1000]            # besides root and the agent's user: who may use the socket
  #   upstream_token = \"...\"           # sent to upstreams that serve tenants
  #   upstream_tls_ca = \"ca.pem\"      # reach upstreams over TLS, trusting this CA
  #   upstream_tls_name = \"storage-1\" # the name upstreams' certificates carry (default: host)
  #   allow_plaintext = false         # true: listen beyond loopback without TLS (trusted link only)
  #   [tls]                           # required beyond loopback; clients set DQUANT_TLS_CA=ca.pem
  #   cert = \"agent.pem\"              # certificate chain, PEM (gRPC and data port alike)
  #   key = \"agent.key\"               # its private key, PEM
  #   [[tenants]]                     # required to listen beyond loopback; clients set DQUANT_TOKEN
  #   name = \"team-a\"
  #   token = \"at-least-16-characters\"
  #   roots = [\"corpus\"]              # or [\"*\"]
  #   guarantee_share = 0.5           # of [bandwidth] link_bytes_per_s (or guarantee_bytes_per_s)
  #   weight = 1                      # its part of what no guarantee claims
  #   class = \"gold\"                  # DSCP of its data sockets, from [[bandwidth.classes]]
  #   [bandwidth]                     # tenants' shares of the data link (default: off)
  #   link_bytes_per_s = 1250000000   # the link, as declared
  #   [[bandwidth.classes]]           # name = \"gold\", dscp = 46
  #   [roots]                         # relative paths (here and in [tls]) are relative to the config file
  #   corpus = \"/data/tokens\"
  #   web = \"s3://bucket/web\"        # an S3-compatible bucket prefix
  #   [s3]                            # for s3:// roots; unset: the AWS_* variables (defaults shown)
  #   endpoint = \"https://minio.internal:9000\" # AWS_ENDPOINT_URL; default AWS itself
  #   region = \"us-east-1\"           # AWS_REGION
  #   access_key_id = \"...\"          # AWS_ACCESS_KEY_ID (unset: instance/pod credentials)
  #   secret_access_key = \"...\"      # AWS_SECRET_ACCESS_KEY
  #   allow_http = false              # plain http:// beyond loopback (trusted link only)
  #   connect_timeout_secs = 5
  #   read_timeout_secs = 15          # a body that stalls this long is retried
  #   request_timeout_secs = 120
  #   max_retries = 3                 # per request, with exponential back-off
  #   part_bytes = 8388608            # bytes per ranged GET
  #   readahead_bytes = 33554432      # requested ahead of each sequential reader
  #   [block_cache]                   # blocks of s3:// roots on a local disk (default: off)
  #   dir = \"/var/cache/dquant/blocks\"
  #   max_bytes = 107374182400        # least recently used blocks go first
  #   block_bytes = 1048576

  # then, from a client:
  dquant ls dquant://127.0.0.1:7878/corpus
  dquant read plan.toml --agent dquant://127.0.0.1:7878   # plan sources: corpus/PATH
  dquant read plan.toml --agent /run/dquant.sock          # batches through shared memory";

/// Run the offload agent: serve named dataset roots, run plans near the data and stream
/// batches to clients. Listens on loopback unless told otherwise. Prints one line to stderr
/// when listening, then logs (DQUANT_LOG, default info) until SIGTERM or SIGINT, which drain
/// it: each stream ends after its current batch with the cursor to resume from, the socket
/// file is removed, and it exits 0 (within shutdown_grace_secs, default 10).
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// Agent config file (TOML; see the example below). Flags override its values.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// A dataset root, a directory or an S3-compatible bucket prefix (s3://BUCKET/PREFIX,
    /// reached as the [s3] table and the AWS_* variables say): clients name its datasets
    /// NAME/RELATIVE/PATH. Repeatable; replaces a root of the same name from the config file.
    #[arg(long = "root", value_name = "NAME=DIR|s3://BUCKET/PREFIX", value_parser = parse_root)]
    pub roots: Vec<(String, PathBuf)>,
    /// Control plane (gRPC) address [default: 127.0.0.1:7878].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Data plane address; port 0 picks a free port [default: the control port + 1].
    #[arg(long, value_name = "ADDR")]
    pub data_listen: Option<SocketAddr>,
    /// Also listen on this Unix socket, for clients on this host: the control plane, and
    /// shared-memory rings the agent writes batches into (their address is the path).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// 1 MiB frames each session may prefetch ahead of its consumer [default: 8].
    #[arg(long, value_name = "N")]
    pub prefetch_frames: Option<usize>,
    /// Threads of the pool all sessions share for reads and compression (besides each
    /// session's own); 0: none, each session on its own thread [default: the cores but
    /// two, at most 8].
    #[arg(long, value_name = "N")]
    pub worker_threads: Option<usize>,
    /// Spread a batch's reads over the pool only in shares expected to take this many
    /// microseconds each (reads are timed as they go: slow storage is spread, page-cache
    /// reads stay on the session's thread, for less CPU); 0: spread every batch [default:
    /// 200].
    #[arg(long, value_name = "US")]
    pub worker_min_share_us: Option<u64>,
    /// Sessions open at once [default: 256].
    #[arg(long, value_name = "N")]
    pub max_sessions: Option<usize>,
    /// Narrow int32 (and copy uint16) datasets' tokens straight from a map of each kept while
    /// the dataset is open, instead of copying them out of the page cache first, for datasets up
    /// to SIZE bytes together (`8GiB`; 0: every token by pread). The price is page tables held
    /// as long as the dataset (2 MiB a GiB touched), and the touched pages counted in the
    /// agent's RSS [default: half this host's memory].
    #[arg(long, value_name = "SIZE", value_parser = crate::util::parse_size_or_zero)]
    pub map_budget: Option<usize>,
    /// Keep maps of every int32 and uint16 dataset, whatever the map budget.
    #[arg(long)]
    pub keep_maps: bool,
    /// An agent (HOST:PORT, as plans spell it in dquant://HOST:PORT/...) that plans may
    /// chain to. Repeatable; adds to the config's `upstreams`. Without any, chained
    /// sources are refused: the agent dials no host a client names.
    #[arg(long = "upstream", value_name = "HOST:PORT")]
    pub upstreams: Vec<String>,
    /// Serve Prometheus metrics on this address (any path; no authentication) [default: off].
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// TLS certificate chain (PEM) for both TCP planes; needs --tls-key. Clients trust its CA
    /// with DQUANT_TLS_CA.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The TLS certificate's private key (PEM); needs --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Listen beyond loopback without TLS: tokens and batches cross the network in the
    /// clear. Only for a link nobody else can read (a DPU's internal port, a lab namespace).
    #[arg(long)]
    pub allow_plaintext: bool,
}

fn parse_root(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((name, dir)) if !name.is_empty() && !dir.is_empty() => {
            Ok((name.to_string(), PathBuf::from(dir)))
        }
        _ => Err(format!(
            "expected NAME=DIR or NAME=s3://BUCKET/PREFIX (e.g. corpus=/data/tokens), got {s:?}"
        )),
    }
}

/// Whether a root is an object-store URI rather than a directory.
fn is_uri(p: &Path) -> bool {
    p.to_str().is_some_and(dquant_objstore::is_object_uri)
}

/// The config file (if any) with the flags applied on top.
pub fn config(a: &Args) -> Result<AgentConfig> {
    let mut c = match &a.config {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
            let mut c = AgentConfig::from_toml(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            // Relative roots in a file mean "next to the file", wherever the agent starts.
            let base = path.parent().unwrap_or(Path::new(""));
            let dirs = c.roots.values_mut().filter(|d| !is_uri(d));
            for dir in dirs {
                if dir.is_relative() {
                    *dir = base.join(&*dir);
                }
            }
            let files = c.tls.iter_mut().flat_map(|t| [&mut t.cert, &mut t.key]);
            for f in files.chain(c.upstream_tls_ca.as_mut()) {
                if f.is_relative() {
                    *f = base.join(&*f);
                }
            }
            c
        }
        None => AgentConfig::default(),
    };
    if let Some(l) = a.listen {
        c.listen = l;
    }
    if a.data_listen.is_some() {
        c.data_listen = a.data_listen;
    }
    if a.socket.is_some() {
        c.socket = a.socket.clone();
    }
    if let Some(n) = a.prefetch_frames {
        c.prefetch_frames = n;
    }
    if let Some(n) = a.worker_threads {
        c.worker_threads = n;
    }
    if let Some(us) = a.worker_min_share_us {
        c.worker_min_share_us = us;
    }
    if let Some(n) = a.max_sessions {
        c.max_sessions = n;
    }
    c.keep_maps |= a.keep_maps;
    if let Some(b) = a.map_budget {
        c.map_budget = Some(b as u64);
    }
    c.upstreams.extend(a.upstreams.iter().cloned());
    if a.metrics_listen.is_some() {
        c.metrics_listen = a.metrics_listen;
    }
    for (name, dir) in &a.roots {
        c.roots.insert(name.clone(), dir.clone());
    }
    if let (Some(cert), Some(key)) = (&a.tls_cert, &a.tls_key) {
        c.tls = Some(TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
        });
    }
    c.allow_plaintext |= a.allow_plaintext;
    Ok(c)
}

/// Starts an agent, naming the config's problem when it cannot.
pub fn start(c: AgentConfig) -> Result<AgentHandle> {
    dquant_agent::start(c).map_err(|e| match e {
        dquant_agent::AgentError::Config(m) => anyhow::anyhow!("agent config: {m}"),
        e => e.into(),
    })
}

/// The one line `serve` prints when it is listening (tests and scripts parse it).
pub fn listening_line(h: &AgentHandle, roots: &BTreeMap<String, PathBuf>) -> String {
    let roots: Vec<String> = roots
        .iter()
        .map(|(n, d)| format!("{n}={}", d.display()))
        .collect();
    let socket = h
        .socket()
        .map(|p| format!(" socket={}", p.display()))
        .unwrap_or_default();
    format!(
        "dquant agent listening: uri={} control={} data={}{socket} roots={}",
        h.uri(),
        h.control_addr(),
        h.data_addr(),
        roots.join(",")
    )
}

/// Makes glibc's malloc give every large block (a session's 1 MiB frames, its batch
/// buffers) its own mapping, returned to the system when freed. By default glibc raises its
/// mapping threshold to the size of the first such block freed, and from then on serves them
/// from per-thread heaps that fragment: an agent whose clients come and go (killed, stalled,
/// reconnecting) grew past the memory its live sessions hold (`bench/load/run.sh`: 1.10× the
/// bound after 60 s of clients killed mid-stream). Setting the threshold fixes it; a session
/// allocates its frames once, so the mappings cost nothing per batch. No crate wraps mallopt.
fn keep_large_blocks_mapped() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        /// Blocks this large or larger are mapped alone (glibc's initial threshold is 128 KiB).
        const THRESHOLD: libc::c_int = 256 << 10;
        // SAFETY: mallopt only changes the allocator's tuning (under its lock), before the
        // agent's threads start.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, THRESHOLD) };
    }
}

pub fn run(a: &Args) -> Result<()> {
    keep_large_blocks_mapped();
    let c = config(a)?;
    let roots = c.roots.clone();
    let grace = Duration::from_secs(c.shutdown_grace_secs);
    // Installed before the agent starts, so a signal never finds the default handler (which
    // would kill the agent without telling its consumers where to resume).
    let (tx, signals) = std::sync::mpsc::channel();
    ctrlc::set_handler(move || {
        let _ = tx.send(());
    })
    .context("installing the SIGTERM/SIGINT handler")?;
    let h = start(c)?;
    eprintln!("{}", listening_line(&h, &roots));
    loop {
        match signals.recv_timeout(Duration::from_millis(200)) {
            Ok(()) => break,
            Err(RecvTimeoutError::Timeout) if !h.is_finished() => {}
            // The control plane stopped on its own: a fatal error, which wait() returns.
            Err(_) => {
                return h
                    .wait()
                    .map_err(|e| anyhow::anyhow!("the agent stopped: {e}"))
            }
        }
    }
    tracing::info!(
        grace_secs = grace.as_secs(),
        "shutting down: draining sessions"
    );
    let r = h.drain(grace);
    tracing::info!(
        drained = r.streaming - r.forced.min(r.streaming),
        forced = r.forced,
        "agent stopped"
    );
    Ok(())
}
