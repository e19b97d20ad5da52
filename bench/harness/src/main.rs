//! `dquant-offload-bench`: the offload agent's end-to-end benchmark.
//!
//! Every figure is measured against a baseline in the same run (the machines are shared and
//! noisy): batches through an agent against a plain TCP copy, agent memory against its limit,
//! time to first batch through an agent against the same plan in-process. See
//! `bench/offload/run.sh` for the full run and `bench/RESULTS.md` (generated from `bench/results/`) for results.

mod breakdown;
mod lab;
mod load;
mod procs;
mod report;
mod ring;
mod rss;
mod share;
mod throughput;
mod ttfb;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use dquant_plan::{OutputDType, Plan, Source};

const EXAMPLES: &str = "\
Examples:
  # A u16 Megatron dataset to stream, and a 10 GiB int32 one for time to first batch:
  dquant corpus zipf /data/zipf1g_int32 --tokens 1073741824 --vocab 50257 --eod 50256
  dquant convert /data/zipf1g_int32 /data/zipf1g_u16 --codec u16
  dquant corpus zipf /data/zipf10g --tokens 2684354560 --vocab 50257 --eod 50256

  dquant-offload-bench throughput /data/zipf1g_u16 --runs 3
  dquant-offload-bench rss /data/zipf1g_u16 --passes 2
  dquant-offload-bench ttfb /data/zipf10g --repeats 5 --cold
  dquant-offload-bench breakdown /data/zipf1g_u16 --json
  dquant-offload-bench ring --gb 2 --runs 3
  dquant-offload-bench load /data/zipf1g_u16 --json-out load.json   # 64 consumers + hostile clients
  dquant-offload-bench share /data/zipf256m_int32 --readers 8   # one shared stream vs 8 sessions
  dquant-offload-bench lab --smoke          # as root: the NIC-bound lab (bench/lab/run.sh)

Build with --release: debug builds measure the compiler, not the agent.";

/// End-to-end benchmarks of the dquant offload agent (`dquant_agent::start`), each against a
/// baseline measured in the same run. The agent runs in a child process (this binary,
/// re-executed), the consumer in this one.
#[derive(Parser, Debug)]
#[command(name = "dquant-offload-bench", version, after_help = EXAMPLES)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    Throughput(throughput::Args),
    Rss(rss::Args),
    Ttfb(ttfb::Args),
    Breakdown(breakdown::Args),
    Ring(ring::Args),
    Lab(lab::Args),
    Load(load::Args),
    Share(share::Args),
    /// (internal) A load benchmark client in its own process: streams a plan from an agent
    /// (to be killed), or stalls after some batches.
    #[command(hide = true)]
    LoadClient {
        #[arg(long)]
        uri: String,
        /// The plan, as JSON.
        #[arg(long)]
        plan: String,
        #[arg(long)]
        stall_after: Option<u64>,
    },
    #[command(hide = true)]
    LabConsume(lab::consume::Args),
    /// (internal) Run an agent serving --root NAME=DIR on loopback; prints its URI, stops
    /// when stdin closes.
    #[command(hide = true)]
    Agent {
        #[arg(long, required = true)]
        root: Vec<String>,
        #[arg(long, default_value_t = dquant_agent::DEFAULT_PREFETCH)]
        prefetch_frames: usize,
        /// Also listen on this Unix socket (shared-memory clients).
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Serve TLS on both planes with this certificate (and --tls-key).
        #[arg(long, requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        #[arg(long, requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// The agent's worker pool (`worker_threads`; 0: none) [default: the agent's].
        #[arg(long)]
        worker_threads: Option<usize>,
        /// The least expected time of a share of reads the pool takes
        /// (`worker_min_share_us`) [default: the agent's].
        #[arg(long)]
        worker_min_share_us: Option<u64>,
        /// Batches a shared stream keeps (`share_window_batches`) [default: the agent's].
        #[arg(long)]
        share_window_batches: Option<usize>,
        /// Narrow every int32 dataset from a map kept with it (`keep_maps`).
        #[arg(long)]
        keep_maps: bool,
        /// Bytes of int32 datasets kept mapped (`map_budget`; 0: none) [default: the agent's].
        #[arg(long)]
        map_budget: Option<u64>,
        /// An agent plans may chain to (`upstreams`), HOST:PORT; repeatable.
        #[arg(long)]
        upstream: Vec<String>,
    },
    /// (internal) The plain-copy baseline's sender.
    #[command(hide = true)]
    Send {
        #[arg(long)]
        addr: SocketAddr,
        #[arg(long)]
        bytes: u64,
        #[arg(long, default_value_t = 1 << 20)]
        buf: usize,
        #[arg(long, value_enum, default_value = "raw")]
        mode: procs::SendMode,
        #[arg(long, default_value_t = dquant_agent::DEFAULT_PREFETCH)]
        prefetch_frames: usize,
    },
    /// (internal) The ring benchmark's producer: attaches to the ring whose descriptors
    /// arrive on --socket and writes --batches batches of --batch-bytes.
    #[command(hide = true)]
    RingProduce {
        #[arg(long)]
        socket: PathBuf,
        #[arg(long)]
        batch_bytes: usize,
        #[arg(long)]
        batches: u64,
    },
}

/// Output dtype of the plan's batches.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Output {
    U16,
    I32,
    I64,
}

impl From<Output> for OutputDType {
    fn from(o: Output) -> Self {
        match o {
            Output::U16 => OutputDType::U16,
            Output::I32 => OutputDType::I32,
            Output::I64 => OutputDType::I64,
        }
    }
}

/// The dataset and the plan every measurement uses (the issue's: seq_len 4095, batch 16, u16
/// out and on the wire).
#[derive(clap::Args, Debug, Clone)]
pub struct PlanOpts {
    /// Megatron prefix of the dataset.
    pub data: PathBuf,
    /// Tokens per sample, not counting the label token.
    #[arg(long, default_value_t = 4095)]
    pub seq_len: u32,
    /// Samples per batch.
    #[arg(long, default_value_t = 16)]
    pub batch_size: u32,
    /// Output dtype of delivered batches.
    #[arg(long, value_enum, default_value = "u16")]
    pub output: Output,
    /// The plan's wire codec.
    #[arg(long, default_value = "u16")]
    pub wire_codec: String,
    /// Stop after this many samples (default: one epoch of the dataset).
    #[arg(long)]
    pub samples: Option<u64>,
    /// Shuffle seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Ship each sample's origins in the batch records (the plan's `provenance = true`).
    #[arg(long)]
    pub provenance: bool,
}

impl PlanOpts {
    /// The dataset named by `data`, checked.
    pub fn dataset(&self) -> Result<DataSpec> {
        DataSpec::new(&self.data)
    }

    pub fn plan(&self, uri: &str, shuffle: bool) -> Plan {
        let mut p = Plan::new(vec![Source::new(uri)], self.seq_len, self.batch_size);
        p.shuffle = shuffle;
        p.output = self.output.into();
        p.wire_codec = self.wire_codec.clone();
        p.samples = self.samples;
        p.seed = self.seed;
        p.provenance = self.provenance;
        p
    }

    /// Bytes per delivered token.
    pub fn output_itemsize(&self) -> u64 {
        OutputDType::from(self.output).itemsize() as u64
    }

    pub fn describe(&self) -> String {
        format!(
            "seq_len {}, batch {}, output {}, wire {}{}",
            self.seq_len,
            self.batch_size,
            OutputDType::from(self.output),
            self.wire_codec,
            if self.provenance { ", provenance" } else { "" }
        )
    }
}

/// A Megatron dataset given by its prefix: the agent serves its directory as root `bench`.
#[derive(Debug, Clone)]
pub struct DataSpec {
    /// The directory, canonical.
    pub dir: PathBuf,
    /// The prefix's file name.
    pub name: String,
}

impl DataSpec {
    pub fn new(prefix: &Path) -> Result<Self> {
        let s = prefix.to_string_lossy();
        let s = s
            .strip_suffix(".bin")
            .or_else(|| s.strip_suffix(".idx"))
            .unwrap_or(&s);
        let p = PathBuf::from(s);
        let name = p
            .file_name()
            .context("the dataset prefix has no file name")?
            .to_string_lossy()
            .into_owned();
        let parent = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let dir = parent
            .canonicalize()
            .with_context(|| format!("dataset directory {}", parent.display()))?;
        let me = DataSpec { dir, name };
        if !me.bin().is_file() || !me.idx().is_file() {
            bail!(
                "{}: expected a Megatron dataset ({}.bin and {}.idx)",
                prefix.display(),
                me.name,
                me.name
            );
        }
        Ok(me)
    }

    /// The local path (for in-process plans).
    pub fn local(&self) -> String {
        self.dir.join(&self.name).display().to_string()
    }

    /// The dataset's name on the agent.
    pub fn remote(&self) -> String {
        format!("bench/{}", self.name)
    }

    pub fn bin(&self) -> PathBuf {
        self.dir.join(format!("{}.bin", self.name))
    }

    pub fn idx(&self) -> PathBuf {
        self.dir.join(format!("{}.idx", self.name))
    }

    /// Tokens in the dataset (from its index).
    pub fn tokens(&self) -> Result<u64> {
        let d = dquant_storage::Dataset::open(
            Path::new(&self.local()),
            &dquant_storage::OpenOptions::default(),
        )?;
        Ok(d.tokens())
    }

    /// "dataset PATH (N GB on disk)", how every benchmark's report starts.
    pub fn describe(&self) -> String {
        format!(
            "dataset {} ({:.2} GB on disk)",
            self.local(),
            self.bytes_on_disk() as f64 / 1e9
        )
    }

    pub fn bytes_on_disk(&self) -> u64 {
        [self.bin(), self.idx()]
            .iter()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum()
    }
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Throughput(a) => throughput::run(&a),
        Cmd::Rss(a) => rss::run(&a),
        Cmd::Ttfb(a) => ttfb::run(&a),
        Cmd::Breakdown(a) => breakdown::run(&a),
        Cmd::Ring(a) => ring::run(&a),
        Cmd::Lab(a) => lab::run(&a),
        Cmd::Load(a) => load::run(&a),
        Cmd::Share(a) => share::run(&a),
        Cmd::LoadClient {
            uri,
            plan,
            stall_after,
        } => load::run_child(&uri, &plan, stall_after),
        Cmd::LabConsume(a) => lab::consume::run(&a),
        Cmd::Agent {
            root,
            prefetch_frames,
            socket,
            tls_cert,
            tls_key,
            worker_threads,
            worker_min_share_us,
            share_window_batches,
            keep_maps,
            map_budget,
            upstream,
        } => {
            let tls = tls_cert
                .zip(tls_key)
                .map(|(cert, key)| dquant_agent::TlsFiles { cert, key });
            let defaults = dquant_agent::AgentConfig::default();
            let cfg = dquant_agent::AgentConfig {
                worker_threads: worker_threads.unwrap_or(defaults.worker_threads),
                worker_min_share_us: worker_min_share_us.unwrap_or(defaults.worker_min_share_us),
                share_window_batches: share_window_batches.unwrap_or(defaults.share_window_batches),
                socket,
                prefetch_frames,
                tls,
                upstreams: upstream,
                keep_maps,
                map_budget,
                ..defaults
            };
            procs::run_agent(&root, cfg)
        }
        Cmd::Send {
            addr,
            bytes,
            buf,
            mode,
            prefetch_frames,
        } => procs::run_sender(addr, bytes, buf, mode, prefetch_frames),
        Cmd::RingProduce {
            socket,
            batch_bytes,
            batches,
        } => ring::run_producer(&socket, batch_bytes, batches),
    }
}
