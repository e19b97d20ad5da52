//! Agent configuration: from a TOML file, from flags, or both (flags win).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use dquant_objstore::S3Settings;
use serde::Deserialize;

use crate::auth::TenantConfig;
use crate::config_error::ConfigError;
use crate::limits::Limits;

/// Default control-plane address: loopback only. Serving other hosts is a choice the
/// operator makes explicitly (`--listen 0.0.0.0:7878`).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7878";
/// Default frames of prefetch per session (1 MiB each).
pub const DEFAULT_PREFETCH: usize = 8;

/// What an agent serves and how.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// gRPC control plane address.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Data plane address. Port 0 picks a free port (clients learn it from `Open`). When
    /// absent: the control port + 1 (or a free port when the control port is 0).
    #[serde(default)]
    pub data_listen: Option<SocketAddr>,
    /// A Unix socket for clients on this host: it serves the control plane too, and is where
    /// they hand over shared-memory rings (`transport=shm`, the emulated DMA path). A stale
    /// socket file left by a dead agent is replaced; a live one is an error.
    #[serde(default)]
    pub socket: Option<PathBuf>,
    /// Frames (1 MiB each) each session may fill ahead of its consumer. This is the
    /// prefetch budget: a session's memory is bounded by it, whatever the dataset size.
    #[serde(default = "default_prefetch")]
    pub prefetch_frames: usize,
    /// Threads of the pool every session shares: it reads a batch's samples at once (with
    /// the session's own thread), and compresses a session's next batches while the
    /// session reads more. However many sessions run, the pool takes no more cores than
    /// this. 0: no pool, each session works on its own thread alone. Default: the cores the
    /// agent may use but two, at most 8 (on a DPU, its ARM cores).
    #[serde(default = "default_worker_threads")]
    pub worker_threads: usize,
    /// Microseconds a share of a batch's reads must be expected to take before the pool
    /// takes it: reads are timed as they go, and only those slow enough to pay for the
    /// hand-off are spread (cold disk, network storage, object stores; not page-cache
    /// reads, which a session's own thread reads for less CPU). 0: every batch is spread
    /// over the pool, for the most a session can read at the most CPU. Default: 200.
    #[serde(default = "default_worker_min_share_us")]
    pub worker_min_share_us: u64,
    /// Sessions open at once, streaming or waiting for their data connection.
    #[serde(default = "default_max_sessions")]
    pub max_sessions: usize,
    /// Datasets kept open while no session reads them (each holds its open files, and a
    /// block file or a raw file with `eod` its document index), so a trainer that restarts
    /// finds its datasets open. Datasets sessions read are open once however many sessions
    /// read them.
    #[serde(default = "default_dataset_cache")]
    pub keep_datasets: usize,
    /// Bytes of plain int32 and uint16 datasets whose tokens are narrowed straight from a map
    /// kept as long as the dataset stays open (the dataset cache keeps it over sessions), not
    /// from a `pread`'s copy: the page-cache copy is then paid only on a page's first touch. The
    /// price is the page tables of every page touched (2 MiB a GiB) for as long as the dataset
    /// is open, and its touched pages counted in the agent's `VmRSS` (the page cache's pages,
    /// shared and evictable as under `pread`). Datasets take the budget as they are first read;
    /// one whose file does not fit in what is left is read by `pread` while it stays open. 0: no
    /// maps. Default (`None`): half of this host's memory ([`AgentConfig::map_budget_bytes`]).
    #[serde(default)]
    pub map_budget: Option<u64>,
    /// Keep maps of every plain int32 and uint16 dataset, whatever `map_budget` says.
    #[serde(default)]
    pub keep_maps: bool,
    /// Megatron-order builds (`OpenMegatron`) kept in memory after their sessions end,
    /// most recently opened first, so a trainer that restarts or a rank that opens late finds
    /// its config built.
    #[serde(default = "default_megatron_builds")]
    pub keep_megatron_builds: usize,
    /// A directory where Megatron-order builds keep their GPT indices (as Megatron's
    /// `path_to_cache`), so an agent that restarts reads them instead of shuffling again.
    /// None: builds are kept in memory only.
    #[serde(default)]
    pub megatron_cache: Option<PathBuf>,
    /// Seconds an opened session waits for its data connection before it is dropped.
    #[serde(default = "default_ticket_ttl")]
    pub ticket_ttl_secs: u64,
    /// Batches a shared stream (`share`) keeps: the fastest subscriber may be this many
    /// batches ahead of the slowest, and a late joiner may start this far back. Also bounded
    /// by `share_window_bytes`; at least 2.
    #[serde(default = "default_share_window_batches")]
    pub share_window_batches: usize,
    /// Bytes of wire records a shared stream keeps (its window's memory; shared-memory
    /// subscribers may add the records in the output dtype).
    #[serde(default = "default_share_window_bytes")]
    pub share_window_bytes: u64,
    /// Named dataset roots: `name = "/path/to/dir"` or `name = "s3://BUCKET/PREFIX"`.
    /// Clients name datasets `name/relative`.
    #[serde(default)]
    pub roots: BTreeMap<String, PathBuf>,
    /// How `s3://` roots are reached (`[s3]`: endpoint, region, credentials, timeouts,
    /// retries, readahead); unset fields come from the `AWS_*` variables.
    #[serde(default)]
    pub s3: S3Settings,
    /// A local disk cache of blocks read from `s3://` roots (`[block_cache]`): off unless
    /// set.
    #[serde(default)]
    pub block_cache: Option<BlockCacheConfig>,
    /// Where to serve Prometheus metrics (`GET` any path on this address). Off by default.
    /// The endpoint has no authentication: bind it where only the monitoring system reaches.
    #[serde(default)]
    pub metrics_listen: Option<SocketAddr>,
    /// Who may use the agent (`[[tenants]]`: name, token, roots). Empty: anyone who reaches
    /// it, and then only on loopback addresses.
    #[serde(default)]
    pub tenants: Vec<TenantConfig>,
    /// Tenants' shares of the data link and their traffic classes (`[bandwidth]`): off
    /// unless set, and then every data-plane frame waits for its tenant's turn.
    #[serde(default)]
    pub bandwidth: Option<BandwidthConfig>,
    /// Users and groups (numeric ids) besides the agent's own user and root that may connect
    /// to the Unix socket; it is created with mode 0660, and each peer's credentials
    /// (`SO_PEERCRED`) are checked.
    #[serde(default)]
    pub socket_uids: Vec<u32>,
    #[serde(default)]
    pub socket_gids: Vec<u32>,
    /// The token this agent sends to its upstreams (when they serve tenants).
    #[serde(default)]
    pub upstream_token: Option<String>,
    /// Agents a plan may chain to (`dquant://HOST:PORT/...` sources), as `HOST:PORT` exactly
    /// as plans spell them. Empty by default: an agent dials no host a client names unless
    /// its operator listed it (a plan is not a license to reach the agent's network).
    #[serde(default)]
    pub upstreams: Vec<String>,
    /// Where datasets live when they are not under this agent's roots (`[placement]`): a
    /// dataset name prefix (`"web/"`, `"code/python/"`) and the storage agents that hold
    /// replicas of everything under it (`HOST:PORT`, as in `upstreams`). A plan source whose
    /// name starts with a prefix (the longest that matches) is read from those agents, spread
    /// across them, failing over between them: the host agent routes, plans name only
    /// datasets.
    #[serde(default)]
    pub placement: BTreeMap<String, Vec<String>>,
    /// Seconds any call to an upstream agent, and any read or write on its data connection,
    /// may take before the session fails.
    #[serde(default = "default_upstream_timeout")]
    pub upstream_timeout_secs: u64,
    /// Seconds a consumer may read nothing (its socket or ring full) before its session is
    /// released. Generous by default: a trainer writing a checkpoint may stop reading for
    /// minutes. Also the data sockets' TCP_USER_TIMEOUT, so a vanished peer is dropped too.
    #[serde(default = "default_consumer_idle")]
    pub consumer_idle_secs: u64,
    /// Seconds a graceful shutdown (SIGTERM, SIGINT) waits for sessions to reach a batch
    /// boundary and tell their consumers where to resume, before cancelling the rest.
    #[serde(default = "default_shutdown_grace")]
    pub shutdown_grace_secs: u64,
    /// What one request may ask of the agent (`[limits]`; see [`Limits`] for each default).
    #[serde(default)]
    pub limits: Limits,
    /// TLS on both TCP planes (`[tls]`: the certificate chain and key, PEM): gRPC and the
    /// data port serve the same certificate. Required to listen beyond loopback, unless
    /// `allow_plaintext` says otherwise. The Unix socket never uses it.
    #[serde(default)]
    pub tls: Option<TlsFiles>,
    /// Listen beyond loopback without TLS: tokens and data then cross the network in the
    /// clear. Only for a link nobody else can read (a DPU's internal port, a lab namespace).
    #[serde(default)]
    pub allow_plaintext: bool,
    /// The PEM file of CA certificates upstream agents' certificates must chain to: set, this
    /// agent reaches its upstreams over TLS.
    #[serde(default)]
    pub upstream_tls_ca: Option<PathBuf>,
    /// The name upstreams' certificates must carry, when it is not the host in `upstreams`.
    #[serde(default)]
    pub upstream_tls_name: Option<String>,
}

/// The block cache of remote roots: where, how much, in what blocks.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BlockCacheConfig {
    /// A directory on a local disk (created if missing; entries already there are kept).
    pub dir: PathBuf,
    /// Bytes all entries may take together; least recently used blocks go first.
    pub max_bytes: u64,
    /// Bytes per block [default: 1 MiB]: what a miss reads from the store at least.
    #[serde(default = "default_cache_block")]
    pub block_bytes: u64,
}

fn default_cache_block() -> u64 {
    1 << 20
}

/// The agent's TLS certificate chain and private key, PEM files.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The data link's rate and its traffic classes (`[bandwidth]`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BandwidthConfig {
    /// What the agent's data link carries, bytes/s, as the operator declares it: the
    /// capacity tenants' guarantees are taken from and the rest shared by weight.
    pub link_bytes_per_s: u64,
    /// Traffic classes (`[[bandwidth.classes]]`: name, dscp 0..=63): a tenant's `class`
    /// marks its data sockets' IP header (IPv4 TOS, IPv6 traffic class), so the switches'
    /// queues can hold the guarantees across the fabric too.
    #[serde(default)]
    pub classes: Vec<TrafficClass>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TrafficClass {
    pub name: String,
    pub dscp: u8,
}

impl BandwidthConfig {
    /// The tenants' shares of the link (with `""`, weight 1, for an agent without tenants),
    /// checked: shares in (0, 1], guarantees that fit the link, classes that exist.
    pub fn shares(
        &self,
        tenants: &[TenantConfig],
    ) -> Result<Vec<crate::bandwidth::Share>, ConfigError> {
        if self.link_bytes_per_s == 0 {
            return Err(ConfigError::invalid(
                "bandwidth.link_bytes_per_s",
                "must be at least 1",
            ));
        }
        for (i, c) in self.classes.iter().enumerate() {
            if c.dscp > 63 {
                return Err(ConfigError::invalid(
                    format!("bandwidth.classes {:?}", c.name),
                    format!("dscp {} is not in 0..=63", c.dscp),
                ));
            }
            if self.classes[..i].iter().any(|o| o.name == c.name) {
                return Err(ConfigError::invalid(
                    "bandwidth.classes",
                    format!("{:?} is named twice", c.name),
                ));
            }
        }
        if tenants.is_empty() {
            return Ok(vec![crate::bandwidth::Share {
                tenant: String::new(),
                guarantee: 0,
                weight: 1,
            }]);
        }
        let mut shares = Vec::with_capacity(tenants.len());
        for t in tenants {
            let guarantee = match (t.guarantee_bytes_per_s, t.guarantee_share) {
                (Some(_), Some(_)) => {
                    return Err(ConfigError::invalid(
                        format!("tenant {:?}", t.name),
                        "give guarantee_bytes_per_s or guarantee_share, not both",
                    ))
                }
                (Some(b), None) => b,
                (None, Some(f)) if f > 0.0 && f <= 1.0 => (f * self.link_bytes_per_s as f64) as u64,
                (None, Some(f)) => {
                    return Err(ConfigError::invalid(
                        format!("tenant {:?}", t.name),
                        format!("guarantee_share {f} is not in (0, 1]"),
                    ))
                }
                (None, None) => 0,
            };
            if let Some(c) = &t.class {
                if !self.classes.iter().any(|k| &k.name == c) {
                    return Err(ConfigError::invalid(
                        format!("tenant {:?}", t.name),
                        format!("class {c:?} is not among [[bandwidth.classes]]"),
                    ));
                }
            }
            shares.push(crate::bandwidth::Share {
                tenant: t.name.clone(),
                guarantee,
                weight: t.weight.unwrap_or(1),
            });
        }
        crate::bandwidth::Scheduler::check(self.link_bytes_per_s, &shares)?;
        Ok(shares)
    }

    /// The DSCP value of `tenant`'s class, if it has one.
    pub fn dscp_of(&self, tenants: &[TenantConfig], tenant: &str) -> Option<u8> {
        let class = tenants.iter().find(|t| t.name == tenant)?.class.as_ref()?;
        self.classes
            .iter()
            .find(|c| &c.name == class)
            .map(|c| c.dscp)
    }
}

fn default_listen() -> SocketAddr {
    DEFAULT_LISTEN.parse().expect("constant address parses")
}
fn default_prefetch() -> usize {
    DEFAULT_PREFETCH
}
/// Most read threads an agent starts unless told otherwise.
const MAX_DEFAULT_WORKER_THREADS: usize = 8;

/// One worker per core but two (the sessions' own threads and the transports need a core
/// each), at most 8: none on 2 cores. There, one worker beside a session's thread and its
/// consumer halved shared-memory delivery and doubled the agent's CPU per token (its idle
/// spin and hand-overs cost more than the reads it took), compressed TCP too
/// (`bench/cost/run.sh`, the `cost` area of bench/RESULTS.md).
fn default_worker_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores.saturating_sub(2).min(MAX_DEFAULT_WORKER_THREADS)
}
fn default_worker_min_share_us() -> u64 {
    dquant_engine::DEFAULT_MIN_SHARE.as_micros() as u64
}
fn default_max_sessions() -> usize {
    256
}
fn default_megatron_builds() -> usize {
    4
}

fn default_dataset_cache() -> usize {
    16
}
fn default_ticket_ttl() -> u64 {
    60
}
fn default_share_window_batches() -> usize {
    32
}
fn default_share_window_bytes() -> u64 {
    256 << 20
}
fn default_upstream_timeout() -> u64 {
    30
}
fn default_shutdown_grace() -> u64 {
    10
}
fn default_consumer_idle() -> u64 {
    1800
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            listen: default_listen(),
            data_listen: None,
            socket: None,
            prefetch_frames: default_prefetch(),
            worker_threads: default_worker_threads(),
            worker_min_share_us: default_worker_min_share_us(),
            max_sessions: default_max_sessions(),
            keep_datasets: default_dataset_cache(),
            map_budget: None,
            keep_maps: false,
            keep_megatron_builds: default_megatron_builds(),
            megatron_cache: None,
            ticket_ttl_secs: default_ticket_ttl(),
            share_window_batches: default_share_window_batches(),
            share_window_bytes: default_share_window_bytes(),
            roots: BTreeMap::new(),
            s3: S3Settings::default(),
            block_cache: None,
            metrics_listen: None,
            tenants: Vec::new(),
            bandwidth: None,
            socket_uids: Vec::new(),
            socket_gids: Vec::new(),
            upstream_token: None,
            upstreams: Vec::new(),
            placement: BTreeMap::new(),
            upstream_timeout_secs: default_upstream_timeout(),
            shutdown_grace_secs: default_shutdown_grace(),
            consumer_idle_secs: default_consumer_idle(),
            limits: Limits::default(),
            tls: None,
            allow_plaintext: false,
            upstream_tls_ca: None,
            upstream_tls_name: None,
        }
    }
}

impl AgentConfig {
    /// Records a shared stream whose records take up to `record_bytes` keeps: as many as
    /// `share_window_bytes` holds, within 2 and `share_window_batches`.
    pub fn share_window(&self, record_bytes: usize) -> usize {
        let fit = self.share_window_bytes / record_bytes.max(1) as u64;
        (fit as usize).clamp(2, self.share_window_batches.max(2))
    }

    /// The bytes of datasets kept mapped ([`AgentConfig::map_budget`]): unbounded with
    /// `keep_maps`, else the budget set, else half of this host's memory.
    pub fn map_budget_bytes(&self) -> u64 {
        match (self.keep_maps, self.map_budget) {
            (true, _) => u64::MAX,
            (false, Some(bytes)) => bytes,
            (false, None) => dquant_storage::MapBudget::half_of_memory(),
        }
    }

    /// Parses a TOML config; errors carry toml's line and column.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        Ok(toml::from_str(text)?)
    }

    /// Checks values that parse but cannot work.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.prefetch_frames == 0 {
            return Err(ConfigError::invalid(
                "prefetch_frames",
                "must be at least 1",
            ));
        }
        if self.share_window_batches < 2 {
            return Err(ConfigError::invalid(
                "share_window_batches",
                "must be at least 2",
            ));
        }
        if self.max_sessions == 0 {
            return Err(ConfigError::invalid("max_sessions", "must be at least 1"));
        }
        self.limits.validate()?;
        self.s3
            .validate()
            .map_err(|e| ConfigError::invalid(e.setting, e.problem))?;
        match &self.bandwidth {
            Some(b) => {
                b.shares(&self.tenants)?;
            }
            None => {
                if let Some(t) = self.tenants.iter().find(|t| {
                    t.guarantee_bytes_per_s.is_some()
                        || t.guarantee_share.is_some()
                        || t.class.is_some()
                }) {
                    return Err(ConfigError::invalid(
                        format!("tenant {:?}", t.name),
                        "a guarantee or class needs [bandwidth] with link_bytes_per_s (the link \
                         they are shares of)",
                    ));
                }
            }
        }
        if self.consumer_idle_secs == 0 {
            return Err(ConfigError::invalid(
                "consumer_idle_secs",
                "must be at least 1",
            ));
        }
        for (prefix, agents) in &self.placement {
            let ok = |a: &String| dquant_remote::is_host_port(a);
            if prefix.is_empty() || agents.is_empty() || !agents.iter().all(ok) {
                return Err(ConfigError::invalid(
                    format!("placement {prefix:?}"),
                    "give a non-empty dataset prefix and at least one agent as HOST:PORT",
                ));
            }
        }
        if self.upstream_timeout_secs == 0 {
            return Err(ConfigError::invalid(
                "upstream_timeout_secs",
                "must be at least 1",
            ));
        }
        if self.roots.is_empty() && self.placement.is_empty() {
            return Err(ConfigError::invalid(
                "roots",
                "no dataset roots configured (give --root NAME=DIR|s3://BUCKET/PREFIX or a \
                 [roots] table)",
            ));
        }
        Ok(())
    }

    /// The agents the placement map routes dataset `name` to: the longest prefix's.
    pub fn placement_of(&self, name: &str) -> Option<&[String]> {
        self.placement
            .iter()
            .filter(|(prefix, _)| name.starts_with(prefix.as_str()))
            .max_by_key(|(prefix, _)| prefix.len())
            .map(|(_, agents)| agents.as_slice())
    }

    /// The data plane address this config resolves to.
    pub fn data_addr(&self) -> SocketAddr {
        self.data_listen.unwrap_or_else(|| {
            let mut a = self.listen;
            if a.port() != 0 {
                a.set_port(a.port().wrapping_add(1));
            }
            a
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_toml_with_defaults_and_rejects_unknown_fields() {
        let c = AgentConfig::from_toml("[roots]\ncorpus = \"/data\"\n").unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:7878");
        assert_eq!(c.data_addr().to_string(), "127.0.0.1:7879");
        assert_eq!(c.roots["corpus"], PathBuf::from("/data"));
        let e = AgentConfig::from_toml("prefetch = 3\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("agent config: "), "{e}");
        assert!(e.contains("unknown field `prefetch`"), "{e}");
        let c = AgentConfig::from_toml(
            "[roots]\ncorpus = \"/data\"\n[limits]\nmax_world = 8\nmax_zstd_level = 3\n",
        )
        .unwrap();
        assert_eq!(c.limits.max_world, 8);
        assert_eq!(c.limits.max_zstd_level, 3);
        assert_eq!(c.limits.max_sources, Limits::default().max_sources);
        let e = AgentConfig::from_toml("[limits]\nmax_wrld = 8\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `max_wrld`"), "{e}");
        assert_eq!(
            AgentConfig::default().validate().unwrap_err().to_string(),
            "roots: no dataset roots configured (give --root NAME=DIR|s3://BUCKET/PREFIX or a [roots] table)"
        );
    }

    #[test]
    fn the_map_budget_is_half_of_memory_unless_set_or_unbounded() {
        let parse = |t: &str| AgentConfig::from_toml(&format!("{t}\n[roots]\nc = \"/d\"\n"));
        let half = dquant_storage::MapBudget::half_of_memory();
        assert!(half > 0);
        assert_eq!(parse("").unwrap().map_budget_bytes(), half);
        assert_eq!(parse("map_budget = 0").unwrap().map_budget_bytes(), 0);
        assert_eq!(parse("map_budget = 4096").unwrap().map_budget_bytes(), 4096);
        let c = parse("map_budget = 0\nkeep_maps = true").unwrap();
        assert_eq!(c.map_budget_bytes(), u64::MAX);
        let e = parse("map_budget = -1").unwrap_err().to_string();
        assert!(e.contains("map_budget"), "{e}");
    }

    const TENANTS: &str = "[roots]\ncorpus = \"/data\"\n\
        [[tenants]]\nname = \"a\"\ntoken = \"aaaaaaaaaaaaaaaaaaaa\"\nroots = [\"*\"]\n";

    fn bandwidth(extra_a: &str, extra: &str) -> Result<AgentConfig, String> {
        let text = format!(
            "{TENANTS}{extra_a}\n[[tenants]]\nname = \"b\"\ntoken = \"bbbbbbbbbbbbbbbbbbbb\"\nroots = [\"*\"]\n{extra}"
        );
        let c = AgentConfig::from_toml(&text).map_err(|e| e.to_string())?;
        c.validate().map(|()| c).map_err(|e| e.to_string())
    }

    #[test]
    fn bandwidth_shares_and_classes_parse_and_are_checked() {
        let c = bandwidth(
            "guarantee_share = 0.5\nclass = \"gold\"\nweight = 3",
            "guarantee_bytes_per_s = 30000000\n[bandwidth]\nlink_bytes_per_s = 100000000\n\
             [[bandwidth.classes]]\nname = \"gold\"\ndscp = 46\n",
        )
        .unwrap();
        let b = c.bandwidth.as_ref().unwrap();
        let shares = b.shares(&c.tenants).unwrap();
        assert_eq!(
            shares
                .iter()
                .map(|s| (s.tenant.as_str(), s.guarantee, s.weight))
                .collect::<Vec<_>>(),
            [("a", 50_000_000, 3), ("b", 30_000_000, 1)]
        );
        assert_eq!(b.dscp_of(&c.tenants, "a"), Some(46));
        assert_eq!(b.dscp_of(&c.tenants, "b"), None);

        let link = "[bandwidth]\nlink_bytes_per_s = 100000000\n";
        let err = |a: &str, rest: &str| bandwidth(a, rest).unwrap_err();
        assert_eq!(
            err(
                "guarantee_share = 0.8",
                &format!("guarantee_bytes_per_s = 30000000\n{link}")
            ),
            "tenant guarantees add up to 110000000 B/s (a 80000000 + b 30000000) but the link \
             carries 100000000 B/s (bandwidth.link_bytes_per_s); lower a guarantee or declare the \
             link's real rate"
        );
        assert_eq!(
            err("guarantee_share = 1.5", link),
            "tenant \"a\": guarantee_share 1.5 is not in (0, 1]"
        );
        assert_eq!(
            err("guarantee_share = 0.1\nguarantee_bytes_per_s = 5", link),
            "tenant \"a\": give guarantee_bytes_per_s or guarantee_share, not both"
        );
        assert_eq!(
            err("class = \"silver\"", link),
            "tenant \"a\": class \"silver\" is not among [[bandwidth.classes]]"
        );
        assert_eq!(
            err("weight = 0", link),
            "tenant \"a\": weight must be at least 1"
        );
        assert_eq!(
            err(
                "",
                &format!("{link}[[bandwidth.classes]]\nname = \"x\"\ndscp = 64\n")
            ),
            "bandwidth.classes \"x\": dscp 64 is not in 0..=63"
        );
        assert_eq!(
            err("guarantee_share = 0.5", ""),
            "tenant \"a\": a guarantee or class needs [bandwidth] with link_bytes_per_s (the \
             link they are shares of)"
        );
    }
}
