//! Throughput: batches from an agent over loopback TCP, against a plain socket copy of the
//! same number of bytes, in the same run and the same process layout (a sender process, a
//! receiving process). Also the plan in-process, for the consumer's CPU cost without offload.

use std::io::Read;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use dquant_client::{open, AgentUri, Credentials, Offload, Reader};
use dquant_plan::Cursor;
use serde_json::json;

use crate::procs::{self, AgentProc, SendMode};
use crate::report::{f, spread, Table};
use crate::{DataSpec, PlanOpts};

const EXAMPLES: &str = "\
Examples:
  dquant-offload-bench throughput /data/zipf1g_u16
  dquant-offload-bench throughput /data/zipf1g_u16 --runs 5 --json > throughput.json
  # What TLS costs on the data plane: the plaintext agent against the TLS one, same run:
  dquant-offload-bench throughput /data/zipf1g_u16 --cases plain,agent,agent-tls
  # Only the agent, unshuffled (e.g. to profile it with perf meanwhile):
  dquant-offload-bench throughput /data/zipf1g_u16 --runs 1 --cases agent
  # Shuffled reads with no worker pool (the session's thread alone), then with one worker:
  dquant-offload-bench throughput /data/zipf1g_u16 --cases memcpy,agent-shm-shuffled --worker-threads 0
  dquant-offload-bench throughput /data/zipf1g_u16 --cases memcpy,agent-shm-shuffled --worker-threads 1
  # Shuffled reads from the disk, not the page cache (each case starts cold):
  dquant-offload-bench throughput /data/zipf1g_u16 --cases agent-shm-shuffled --cold --samples 40000
  # Eight workers that take every batch (0), against the default (only reads slow enough):
  dquant-offload-bench throughput /data/zipf1g_u16 --cases agent-shm --worker-threads 8 --worker-min-share-us 0";

/// Throughput of batches from an agent against a plain TCP copy, in the same run.
///
/// Batches from an agent in another process over loopback TCP against a plain TCP copy
/// (a sender process writing 1 MiB buffers from memory, this process reading into a buffer)
/// of the same number of bytes, in each run. Reports payload GB/s, tokens/s, the ratio to the
/// plain copy, and CPU seconds per GB of payload on each side (getrusage; the peer's
/// CPU-time clock).
/// The `framed` and `threaded` cases send the same bytes through the agent's transport
/// without any plan work, to tell the transport's cost from the pipeline's.
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    #[command(flatten)]
    pub plan: PlanOpts,
    /// Rounds of all cases; each round has its own plain-copy baseline.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Which cases to run in each round, in this order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "plain,memcpy,framed,threaded,agent,agent-shuffled,agent-tls,agent-tls-shuffled,agent-shm,agent-shm-shuffled,inproc,inproc-shuffled"
    )]
    pub cases: Vec<Case>,
    /// The agent's prefetch frames (1 MiB each) per session.
    #[arg(long, default_value_t = dquant_agent::DEFAULT_PREFETCH)]
    pub prefetch_frames: usize,
    /// The agent's worker pool (its `worker_threads`: reads and compression shared by the
    /// sessions; 0: none) [default: the agent's default].
    #[arg(long, value_name = "N")]
    pub worker_threads: Option<usize>,
    /// The least expected time, in microseconds, of a share of a batch's reads the agent's
    /// pool takes (its `worker_min_share_us`; 0: every batch spread) [default: the agent's].
    #[arg(long, value_name = "US")]
    pub worker_min_share_us: Option<u64>,
    /// The agent narrows every int32 dataset from a map kept with it (`dquant serve
    /// --keep-maps`), whatever its map budget.
    #[arg(long)]
    pub keep_maps: bool,
    /// The agent's map budget in bytes (`dquant serve --map-budget`; 0: every token read by
    /// pread, the agent's way before maps were its default) [default: the agent's, half
    /// this host's memory].
    #[arg(long, value_name = "BYTES")]
    pub map_budget: Option<u64>,
    /// Buffer size of the plain copy's writes and reads.
    #[arg(long, default_value_t = 1 << 20)]
    pub copy_buf: usize,
    /// Do not read the dataset once beforehand to bring it into the page cache.
    #[arg(long)]
    pub no_warm: bool,
    /// Drop the dataset's tokens file from the page cache before each case of each run, so
    /// every case reads from the disk (what storage that is not the page cache costs: cold
    /// epochs, network file systems), through agents started for it; implies --no-warm.
    #[arg(long)]
    pub cold: bool,
    #[command(flatten)]
    pub out: crate::report::JsonOpts,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Case {
    /// The baseline: a plain TCP copy from a sender process.
    Plain,
    /// Diagnostic: the same bytes in dquant frames (header + crc32c, TCP_NODELAY) from one
    /// sender thread, received with FrameReader and copied out.
    Framed,
    /// Diagnostic: as `framed`, with the agent's producer-thread → sender-thread handoff
    /// (pooled 1 MiB buffers over a bounded channel) and no plan work.
    Threaded,
    /// The plan on the agent (another process), unshuffled.
    Agent,
    /// The plan on the agent, shuffled.
    AgentShuffled,
    /// The shared-memory baseline: one thread copying the same bytes, batch by batch, into a
    /// ring-sized buffer (what delivering a batch into host memory costs at best).
    Memcpy,
    /// The plan on the agent, batches through a shared-memory ring, unshuffled.
    AgentShm,
    /// The plan on the agent, through a shared-memory ring, shuffled.
    AgentShmShuffled,
    /// The plan on an agent serving TLS (rustls, both planes), unshuffled: what encryption
    /// costs against `agent`.
    AgentTls,
    /// The plan on the TLS agent, shuffled.
    AgentTlsShuffled,
    /// The plan on a host agent that reads its source from a storage agent (`dquant://`
    /// chaining: token ranges in the wire codec over TCP), unshuffled; the agent CPU is both
    /// agents'.
    AgentChain,
    /// The chained plan, shuffled (one round trip per batch and source).
    AgentChainShuffled,
    /// The plan in this process, unshuffled.
    Inproc,
    /// The plan in this process, shuffled.
    InprocShuffled,
}

/// What a case's stream is read through.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Server {
    /// Nothing: a baseline, or the plan in this process.
    None,
    /// The plain agent (TCP or its Unix socket's shared memory).
    Agent,
    /// The agent serving TLS.
    Tls,
    /// A host agent chained to a storage agent.
    Chain,
}

impl Case {
    /// What this case reads through (the one place that sorts cases by it).
    fn server(self) -> Server {
        match self {
            Case::Plain | Case::Framed | Case::Threaded | Case::Memcpy => Server::None,
            Case::Inproc | Case::InprocShuffled => Server::None,
            Case::Agent | Case::AgentShuffled | Case::AgentShm | Case::AgentShmShuffled => {
                Server::Agent
            }
            Case::AgentTls | Case::AgentTlsShuffled => Server::Tls,
            Case::AgentChain | Case::AgentChainShuffled => Server::Chain,
        }
    }

    fn shuffled(self) -> bool {
        matches!(
            self,
            Case::AgentShuffled
                | Case::AgentShmShuffled
                | Case::AgentTlsShuffled
                | Case::AgentChainShuffled
                | Case::InprocShuffled
        )
    }

    /// The plaintext TCP agent case a shared-memory, TLS or chained one compares with (the
    /// same shuffle); `None` for the rest.
    fn over_tcp(self) -> Option<Case> {
        let served = matches!(self.server(), Server::Agent | Server::Tls | Server::Chain);
        if !served || matches!(self, Case::Agent | Case::AgentShuffled) {
            return None;
        }
        Some(if self.shuffled() {
            Case::AgentShuffled
        } else {
            Case::Agent
        })
    }

    fn label(self) -> &'static str {
        match self {
            Case::Plain => "plain TCP copy (baseline)",
            Case::Memcpy => "memcpy, 1 thread (shm baseline)",
            Case::AgentShm => "agent shm, shuffle=false",
            Case::AgentShmShuffled => "agent shm, shuffle=true",
            Case::Framed => "dquant frames, 1 thread",
            Case::Threaded => "dquant frames, 2 threads",
            Case::Agent => "agent, shuffle=false",
            Case::AgentShuffled => "agent, shuffle=true",
            Case::AgentTls => "agent TLS, shuffle=false",
            Case::AgentChain => "chained agents, shuffle=false",
            Case::AgentChainShuffled => "chained agents, shuffle=true",
            Case::AgentTlsShuffled => "agent TLS, shuffle=true",
            Case::Inproc => "in-process, shuffle=false",
            Case::InprocShuffled => "in-process, shuffle=true",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Case::Plain => "plain",
            Case::Memcpy => "memcpy",
            Case::AgentShm => "agent-shm",
            Case::AgentShmShuffled => "agent-shm-shuffled",
            Case::Framed => "framed",
            Case::Threaded => "threaded",
            Case::Agent => "agent",
            Case::AgentShuffled => "agent-shuffled",
            Case::AgentTls => "agent-tls",
            Case::AgentChain => "agent-chain",
            Case::AgentChainShuffled => "agent-chain-shuffled",
            Case::AgentTlsShuffled => "agent-tls-shuffled",
            Case::Inproc => "inproc",
            Case::InprocShuffled => "inproc-shuffled",
        }
    }
}

struct M {
    run: usize,
    case: Case,
    bytes: u64,
    tokens: u64,
    wall: Duration,
    /// This (receiving) process's CPU.
    consumer_cpu: Duration,
    /// The other process's CPU: the sender or the agent.
    peer_cpu: Option<Duration>,
    load: String,
}

impl M {
    fn gbps(&self) -> f64 {
        self.bytes as f64 / self.wall.as_secs_f64() / 1e9
    }
    fn mtoks(&self) -> f64 {
        self.tokens as f64 / self.wall.as_secs_f64() / 1e6
    }
    fn per_gb(&self, d: Duration) -> f64 {
        d.as_secs_f64() / (self.bytes as f64 / 1e9)
    }
}

fn plain(run: usize, case: Case, bytes: u64, buf: usize, itemsize: u64) -> Result<M> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let load = procs::loadavg();
    let mode = match case {
        Case::Framed => SendMode::Framed,
        Case::Threaded => SendMode::Threaded,
        _ => SendMode::Raw,
    };
    let child = procs::spawn_sender(listener.local_addr()?, bytes, buf, mode)?;
    let (mut s, _) = listener.accept()?;
    let cpu0 = procs::self_cpu();
    let t0 = Instant::now();
    let n = if mode == SendMode::Raw {
        let mut b = vec![0u8; buf];
        let mut n = 0u64;
        loop {
            let k = s.read(&mut b)?;
            if k == 0 {
                break;
            }
            n += k as u64;
        }
        n
    } else {
        procs::receive_frames(s)?
    };
    let wall = t0.elapsed();
    let consumer_cpu = procs::self_cpu() - cpu0;
    let (ok, sender_cpu) = procs::wait_with_cpu(child)?;
    if !ok || n != bytes {
        bail!(
            "{}: the sender failed or sent {n} of {bytes} bytes",
            case.key()
        );
    }
    Ok(M {
        run,
        case,
        bytes,
        // The plan's tokens these bytes would carry, for the Mtok/s column.
        tokens: bytes / itemsize,
        wall,
        consumer_cpu,
        peer_cpu: Some(sender_cpu),
        load,
    })
}

/// The TLS agent and what its clients trust (certificates made for this run).
struct TlsAgent {
    agent: AgentProc,
    creds: Credentials,
    _pki: tempfile::TempDir,
}

impl TlsAgent {
    fn spawn(root: &std::path::Path, prefetch_frames: usize) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let pki = dquant_testkit::tls::make_pki(dir.path(), "bench", &["127.0.0.1"]);
        let agent = AgentProc::spawn_tls(root, prefetch_frames, &pki.cert, &pki.key)?;
        let tls = Credentials::tls(&pki.ca, None)?;
        Ok(TlsAgent {
            agent,
            creds: Credentials {
                token: None,
                tls: Some(tls),
            },
            _pki: dir,
        })
    }
}

/// A storage agent serving the dataset and a host agent that may chain to it.
struct Chain {
    far: AgentProc,
    near: AgentProc,
}

impl Chain {
    fn spawn(
        root: &std::path::Path,
        prefetch_frames: usize,
        workers: Option<usize>,
    ) -> Result<Self> {
        let far = AgentProc::spawn_working(root, prefetch_frames, false, workers, &[])?;
        let upstream = far.uri.trim_start_matches("dquant://").to_string();
        let near = AgentProc::spawn_chained(root, prefetch_frames, workers, &upstream)?;
        Ok(Chain { far, near })
    }

    /// The dataset as the host agent's plans name it: on the storage agent.
    fn source(&self, ds: &DataSpec) -> String {
        format!("{}/{}", self.far.uri, ds.remote())
    }
}

/// Where a case's plan runs.
#[derive(Clone, Copy)]
enum Via<'a> {
    Here,
    Agent(&'a AgentProc),
    Tls(&'a TlsAgent),
    Chain(&'a Chain),
}

impl Via<'_> {
    /// The agents' processes (whose CPU is the peer's).
    fn pids(self) -> Vec<u32> {
        match self {
            Via::Here => vec![],
            Via::Agent(a) => vec![a.pid()],
            Via::Tls(t) => vec![t.agent.pid()],
            Via::Chain(c) => vec![c.near.pid(), c.far.pid()],
        }
    }

    fn cpu(self) -> Result<Duration> {
        self.pids().into_iter().map(procs::proc_cpu).sum()
    }
}

fn stream(run: usize, case: Case, a: &Args, ds: &DataSpec, via: Via, expect: u64) -> Result<M> {
    let shuffle = case.shuffled();
    let load = procs::loadavg();
    let mut r = match via {
        Via::Tls(t) => {
            let uri = AgentUri::parse(&t.agent.uri).map_err(anyhow::Error::msg)?;
            let plan = a.plan.plan(&ds.remote(), shuffle);
            Reader::remote_with(&uri, &plan, Cursor::START, &t.creds)?
        }
        Via::Chain(c) => open(
            &c.near.uri,
            &a.plan.plan(&c.source(ds), shuffle),
            Offload::Yes,
        )?,
        Via::Agent(ag) => {
            let uri = match case {
                Case::AgentShm | Case::AgentShmShuffled => ag
                    .socket
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .context("the agent has no Unix socket")?,
                _ => ag.uri.clone(),
            };
            open(&uri, &a.plan.plan(&ds.remote(), shuffle), Offload::Yes)?
        }
        Via::Here => open("", &a.plan.plan(&ds.local(), shuffle), Offload::No)?,
    };
    let peer0 = via.cpu()?;
    let cpu0 = procs::self_cpu();
    let t0 = Instant::now();
    let (mut bytes, mut tokens) = (0u64, 0u64);
    while let Some(b) = r.next_batch()? {
        bytes += b.tokens.as_bytes().len() as u64;
        tokens += b.tokens.len() as u64;
    }
    let wall = t0.elapsed();
    let consumer_cpu = procs::self_cpu() - cpu0;
    let peer_cpu = match via {
        Via::Here => None,
        _ => Some(via.cpu()? - peer0),
    };
    drop(r);
    if bytes != expect {
        bail!("{}: delivered {bytes} bytes, expected {expect}", case.key());
    }
    Ok(M {
        run,
        case,
        bytes,
        tokens,
        wall,
        consumer_cpu,
        peer_cpu,
        load,
    })
}

/// Source bytes of the memcpy baseline: far beyond the last-level cache, so it measures
/// memory bandwidth (as STREAM's copy does), not cache bandwidth. The agent's own source, the
/// page cache of a 2 GiB dataset, is not cache resident either.
const MEMCPY_SOURCE: usize = 512 << 20;

/// The shared-memory baseline: `bytes` copied by one thread, batch by batch, from a large
/// source into a destination laid out as the client's ring (its default slot count and
/// size for this plan), cycling through the slots as a ring producer would.
fn memcpy(run: usize, bytes: u64, a: &Args, ds: &DataSpec) -> Result<M> {
    let plan = a.plan.plan(&ds.local(), false);
    let slot = dquant_client::shm::slot_size(&plan) as usize;
    let slots = dquant_client::shm::default_slots(slot as u64) as usize;
    let batch = plan.batch_bytes() as usize;
    let load = procs::loadavg();
    let src: Vec<u8> = (0..MEMCPY_SOURCE.max(batch))
        .map(|i| (i * 31) as u8)
        .collect();
    let mut dst = vec![0u8; slot * slots];
    let cpu0 = procs::self_cpu();
    let t0 = Instant::now();
    let (mut left, mut at, mut i) = (bytes, 0usize, 0usize);
    while left > 0 {
        let k = (batch as u64).min(left) as usize;
        if at + k > src.len() {
            at = 0;
        }
        let d = &mut dst[(i % slots) * slot..][..k];
        d.copy_from_slice(&src[at..at + k]);
        std::hint::black_box(d);
        left -= k as u64;
        at += k;
        i += 1;
    }
    let wall = t0.elapsed();
    Ok(M {
        run,
        case: Case::Memcpy,
        bytes,
        tokens: bytes / a.plan.output_itemsize(),
        wall,
        consumer_cpu: procs::self_cpu() - cpu0,
        peer_cpu: None,
        load,
    })
}

/// The agents a run's cases read through, each started only when a case needs it.
#[derive(Default)]
struct Agents {
    agent: Option<AgentProc>,
    tls: Option<TlsAgent>,
    chain: Option<Chain>,
}

impl Agents {
    /// Starts the agents `cases` read through.
    fn spawn(a: &Args, ds: &DataSpec, cases: &[Case]) -> Result<Self> {
        let any = |server: Server| cases.iter().any(|c| c.server() == server);
        let (agent, tls, chain) = (any(Server::Agent), any(Server::Tls), any(Server::Chain));
        Ok(Agents {
            agent: agent.then(|| spawn_agent(a, ds)).transpose()?,
            tls: tls
                .then(|| TlsAgent::spawn(&ds.dir, a.prefetch_frames))
                .transpose()?,
            chain: chain
                .then(|| Chain::spawn(&ds.dir, a.prefetch_frames, a.worker_threads))
                .transpose()?,
        })
    }
}

/// The plain agent, with the run's flags.
fn spawn_agent(a: &Args, ds: &DataSpec) -> Result<AgentProc> {
    let mut flags: Vec<String> = a
        .keep_maps
        .then(|| "--keep-maps".to_string())
        .into_iter()
        .collect();
    if let Some(us) = a.worker_min_share_us {
        flags.extend(["--worker-min-share-us".to_string(), us.to_string()]);
    }
    if let Some(b) = a.map_budget {
        flags.extend(["--map-budget".to_string(), b.to_string()]);
    }
    AgentProc::spawn_working(&ds.dir, a.prefetch_frames, true, a.worker_threads, &flags)
}

pub fn run(a: &Args) -> Result<()> {
    let ds = a.plan.dataset()?;
    if a.runs == 0 || a.cases.is_empty() {
        bail!("nothing to run: give --runs ≥ 1 and at least one case");
    }
    if a.copy_buf == 0 || a.copy_buf > dquant_transport::frame::MAX_PAYLOAD {
        bail!("--copy-buf must be 1..=1048576 bytes (the frame payload limit)");
    }
    // A dataset read in this process stays mapped here after its first pass (the pages kept
    // cached, beyond dropping): only one in-process case can read cold in one invocation.
    let inproc = a
        .cases
        .iter()
        .filter(|c| matches!(c, Case::Inproc | Case::InprocShuffled))
        .count();
    if a.cold && inproc * a.runs > 1 {
        bail!(
            "--cold: an in-process case reads cold once in one invocation (its dataset stays \
             mapped in this process after that, its pages cached); run one such case and \
             --runs 1 an invocation"
        );
    }
    if !a.no_warm && !a.cold {
        eprintln!("warming the page cache: {}", ds.bin().display());
        procs::warm_file(&ds.bin())?;
        procs::warm_file(&ds.idx())?;
    }
    // The stream's payload size, from the plan's schedule (nothing is read).
    let expect = {
        let plan = a.plan.plan(&ds.local(), false);
        let r = open("", &plan, Offload::No)?;
        r.rank_samples() * plan.sample_len() as u64 * plan.output.itemsize() as u64
    };
    // With --cold each agent case starts its own agents (below); else they serve every run.
    let mut agents = match a.cold {
        true => Agents::default(),
        false => Agents::spawn(a, &ds, &a.cases)?,
    };
    let mut ms: Vec<M> = Vec::new();
    for run in 1..=a.runs {
        for &case in &a.cases {
            if a.cold {
                // An agent that served the dataset keeps it open, and its maps keep the file's
                // pages cached where dropping them cannot reach: a cold case reads through
                // agents started for it (the old ones go first, with their maps).
                if case.server() != Server::None {
                    drop(std::mem::take(&mut agents));
                    agents = Agents::spawn(a, &ds, &[case])?;
                }
                procs::drop_file_cache(&ds.bin())?;
            }
            let via = match case.server() {
                Server::None => Via::Here,
                Server::Agent => Via::Agent(agents.agent.as_ref().context("no agent")?),
                Server::Tls => Via::Tls(agents.tls.as_ref().context("no TLS agent")?),
                Server::Chain => Via::Chain(agents.chain.as_ref().context("no chained agents")?),
            };
            let m = match case {
                Case::Plain | Case::Framed | Case::Threaded => {
                    plain(run, case, expect, a.copy_buf, a.plan.output_itemsize())?
                }
                Case::Memcpy => memcpy(run, expect, a, &ds)?,
                _ => stream(run, case, a, &ds, via, expect)?,
            };
            eprintln!(
                "run {run}/{}: {:<27} {:>6.3} GB/s  (load {})",
                a.runs,
                case.label(),
                m.gbps(),
                m.load
            );
            ms.push(m);
        }
    }
    drop(agents);

    let base = |run: usize| {
        ms.iter()
            .find(|m| m.run == run && m.case == Case::Plain)
            .map(M::gbps)
    };
    let base_memcpy = |run: usize| {
        ms.iter()
            .find(|m| m.run == run && m.case == Case::Memcpy)
            .map(M::gbps)
    };
    // The plaintext TCP agent measurement a shm or TLS one compares with: same run, same
    // shuffle.
    let tcp_of = |m: &M| {
        let tcp = m.case.over_tcp()?;
        ms.iter().find(|t| t.run == m.run && t.case == tcp)
    };
    // Consumer CPU per GB against over plaintext TCP.
    let cpu_vs_tcp = |m: &M| tcp_of(m).map(|t| m.per_gb(m.consumer_cpu) / t.per_gb(t.consumer_cpu));
    // Throughput and the agent's CPU per GB against over plaintext TCP.
    let gbps_vs_tcp = |m: &M| tcp_of(m).map(|t| m.gbps() / t.gbps());
    let peer_vs_tcp = |m: &M| {
        let t = tcp_of(m)?;
        Some(m.per_gb(m.peer_cpu?) / t.per_gb(t.peer_cpu?))
    };
    {
        let rows: Vec<_> = ms
            .iter()
            .map(|m| {
                json!({
                    "run": m.run, "case": m.case.key(), "bytes": m.bytes, "tokens": m.tokens,
                    "seconds": m.wall.as_secs_f64(), "gb_per_s": m.gbps(), "mtok_per_s": m.mtoks(),
                    "ratio_to_plain": base(m.run).map(|b| m.gbps() / b),
                    "ratio_to_memcpy": base_memcpy(m.run).map(|b| m.gbps() / b),
                    "consumer_cpu_ratio_to_tcp": cpu_vs_tcp(m),
                    "ratio_to_agent_tcp": gbps_vs_tcp(m),
                    "peer_cpu_ratio_to_tcp": peer_vs_tcp(m),
                    "consumer_cpu_s": m.consumer_cpu.as_secs_f64(),
                    "consumer_cpu_s_per_gb": m.per_gb(m.consumer_cpu),
                    "peer_cpu_s": m.peer_cpu.map(|d| d.as_secs_f64()),
                    "peer_cpu_s_per_gb": m.peer_cpu.map(|d| m.per_gb(d)),
                    "loadavg": m.load,
                })
            })
            .collect();
        let out = json!({
            "bench": "throughput", "dataset": ds.local(), "dataset_bytes_on_disk": ds.bytes_on_disk(),
            "plan": a.plan.describe(), "prefetch_frames": a.prefetch_frames, "copy_buf": a.copy_buf,
            "payload_bytes_per_stream": expect, "measurements": rows,
        });
        if a.out.emit(&out)? {
            return Ok(());
        }
    }
    println!(
        "{}; plan: {}; agent prefetch {} frames",
        ds.describe(),
        a.plan.describe(),
        a.prefetch_frames
    );
    println!(
        "each stream: {:.3} GB of batch payload; CPU is seconds per GB (1e9 bytes) of payload",
        expect as f64 / 1e9
    );
    println!("'peer' is the sender process (plain copy) or the agent process; ratio is to the same run's plain copy\n");
    let mut t = Table::new(&[
        "run",
        "case",
        "GB/s",
        "Mtok/s",
        "ratio",
        "vs memcpy",
        "consumer CPU s/GB",
        "vs TCP",
        "peer CPU s/GB",
        "load",
    ])
    .left(2);
    for m in &ms {
        t.row(vec![
            m.run.to_string(),
            m.case.label().into(),
            f(m.gbps(), 3),
            f(m.mtoks(), 1),
            base(m.run).map_or("-".into(), |b| f(m.gbps() / b, 2)),
            base_memcpy(m.run).map_or("-".into(), |b| f(m.gbps() / b, 2)),
            f(m.per_gb(m.consumer_cpu), 3),
            cpu_vs_tcp(m).map_or("-".into(), |r| f(r, 3)),
            m.peer_cpu.map_or("-".into(), |d| f(m.per_gb(d), 3)),
            m.load.clone(),
        ]);
    }
    t.print();
    println!();
    let mut s = Table::new(&[
        "case (over runs: min–max)",
        "GB/s",
        "ratio to plain",
        "ratio to memcpy",
        "consumer CPU s/GB",
        "consumer CPU vs TCP",
        "peer CPU s/GB",
        "GB/s vs TCP",
        "peer CPU vs TCP",
    ]);
    for &case in &a.cases {
        let of: Vec<&M> = ms.iter().filter(|m| m.case == case).collect();
        let range = |xs: Vec<f64>, d: usize| {
            if xs.is_empty() {
                return "-".to_string();
            }
            let (lo, _, hi) = spread(&xs);
            format!("{}–{}", f(lo, d), f(hi, d))
        };
        s.row(vec![
            case.label().into(),
            range(of.iter().map(|m| m.gbps()).collect(), 3),
            range(
                of.iter()
                    .filter_map(|m| base(m.run).map(|b| m.gbps() / b))
                    .collect(),
                2,
            ),
            range(
                of.iter()
                    .filter_map(|m| base_memcpy(m.run).map(|b| m.gbps() / b))
                    .collect(),
                2,
            ),
            range(of.iter().map(|m| m.per_gb(m.consumer_cpu)).collect(), 3),
            range(of.iter().filter_map(|m| cpu_vs_tcp(m)).collect(), 3),
            range(
                of.iter()
                    .filter_map(|m| m.peer_cpu.map(|d| m.per_gb(d)))
                    .collect(),
                3,
            ),
            range(of.iter().filter_map(|m| gbps_vs_tcp(m)).collect(), 3),
            range(of.iter().filter_map(|m| peer_vs_tcp(m)).collect(), 3),
        ]);
    }
    s.print();
    Ok(())
}
