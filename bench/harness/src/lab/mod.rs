//! The benchmark lab (`dquant-offload-bench lab`, run by `bench/lab/run.sh`): a NIC-bound
//! link between a storage node and a training host, emulated with two network namespaces, a
//! veth pair and `tc tbf` ([`netns`]), and the same real tokenized corpora read across it four
//! ways:
//!
//! - **(a) baseline**, what users do today: an S3-compatible server (s3s-fs) in `storage`,
//!   and the host pulling raw int32 with ranged GETs and narrowing and packing in-process
//!   ([`s3`]);
//! - **(b) near-storage agent**: `dquant serve` in `storage` ships `u16` / `bits:N` / zstd
//!   batches, and the client in `host` decodes them;
//! - **(c) DPU-style chain**: the storage agent → link → an agent in `host` (the DPU's role)
//!   → shared-memory ring → the consumer process;
//! - **(d) in-process** on local files: a ceiling, not link-bound;
//! - **(e) the DPU reads S3**: the host agent (the DPU's role) reads int32 straight from the
//!   S3 server in `storage` through an `s3://` root, narrows and packs, and delivers through
//!   shared memory: the baseline's data path with dquant on the host side only;
//! - **(g) scale-out**: N storage agents, each in its own namespace behind its own shaped
//!   link, hold the dataset as replicas and serve one host agent (the chain's way); the
//!   aggregate is compared with N × the one-link figure;
//! - **(f) failover**: (c) with two storage agents holding the dataset as replicas; one is
//!   SIGKILLed a fifth to a third of the way through, and the lab reports the longest wait
//!   it caused.
//!
//! Why it is built this way: the product's claim is that data loading is NIC-bound, and that
//! narrowing and compressing in the network path multiplies what the link delivers and frees
//! the host's CPU. Every figure is therefore a ratio against the baseline measured in the
//! same run on the same link and data, and every scenario must deliver the same stream
//! (its xxh3 is compared) or the lab fails.
//!
//! This module runs and measures the scenarios; [`report`] summarizes the runs, checks the
//! goals and makes the table, and [`chart`] draws the PNG.

pub mod chart;
pub mod consume;
pub mod netns;
pub mod report;
pub mod s3;
mod tenants;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use dquant_corpus::Encoding;
use dquant_plan::{OutputDType, Plan, Source};
use serde::{Deserialize, Serialize};

use netns::{Link, LinkSpec, HOST_NS, STORAGE_IP, STORAGE_NS};

const EXAMPLES: &str = "\
Examples (as root; bench/lab/run.sh builds everything first and passes these through):
  dquant-offload-bench lab                          # 1 Gbit/s, ~200 MB per corpus, 3 runs
  dquant-offload-bench lab --rate 10gbit --size 500
  dquant-offload-bench lab --smoke                  # tiny data, one run, about 30 s (CI)
  dquant-offload-bench lab --cleanup                # remove namespaces a killed lab left";

/// The benchmark lab: storage → NIC-bound link → host, four ways, side by side.
///
/// Creates the network namespaces `storage` and `host` joined by a veth pair shaped with
/// `tc tbf`, runs every scenario on the same real tokenized corpora, checks that all
/// deliver the same stream, and writes a table, a JSON file and a PNG chart. Removes
/// everything it created on exit, including on Ctrl-C. Needs root, iproute2 and s3s-fs.
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// Link rate, in tc syntax.
    #[arg(long, default_value = "1gbit")]
    pub rate: String,
    /// MTU of the veth pair.
    #[arg(long, default_value_t = 1500)]
    pub mtu: u32,
    /// MB of source text tokenized per corpus (bounded by the text on this machine); its
    /// int32 file is 1.2–1.9× that. Default 200 (4 with --smoke).
    #[arg(long)]
    pub size: Option<u64>,
    /// Corpora: tiktoken encodings of real text (16-, 17- and 18-bit ids).
    #[arg(long, value_delimiter = ',', default_value = "r50k,cl100k,o200k")]
    pub corpora: Vec<Encoding>,
    /// Compressed wire codecs tried in (b) and (c); `transport` is the plan's default wire
    /// codec (one zstd stream a session, on the session's thread; a chain's ranges each
    /// compressed alone at its level).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "auto+zstd:1,auto+lz4,transport"
    )]
    pub compressed: Vec<String>,
    /// Rounds over all scenarios (each round has its own baseline).
    #[arg(long)]
    pub runs: Option<u32>,
    /// Tiny data (4 MB per corpus), one run, one compressed codec: checks that the lab works.
    #[arg(long)]
    pub smoke: bool,
    /// Where the corpora are generated once (DATA/sizeN/lab/) and reused.
    #[arg(long, default_value = "/var/tmp/dquant-lab")]
    pub data: PathBuf,
    /// Where results go (results.json, table.md, lab.png; with --tenants table.md and
    /// figures.json alone); default DATA/out/<UTC time>, and none for --tenants.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also append the table to this history file (bench/history/lab.md); the figures to
    /// record are in OUT/figures.json either way (bench/lab/run.sh records them).
    #[arg(long)]
    pub append: Option<PathBuf>,
    /// The s3s-fs binary (default: from PATH, then ~/.cargo/bin).
    #[arg(long)]
    pub s3s_fs: Option<PathBuf>,
    /// The dquant binary (default: next to this one).
    #[arg(long)]
    pub dquant: Option<PathBuf>,
    /// Tokens per sample (the plan's seq_len).
    #[arg(long, default_value_t = 4095)]
    pub seq_len: u32,
    /// Samples per batch.
    #[arg(long, default_value_t = 16)]
    pub batch_size: u32,
    /// The agents' worker pool (`dquant serve --worker-threads`: reads and compression
    /// shared by sessions; 0: none) [default: the agent's, the cores but two, at most 8].
    #[arg(long, value_name = "N")]
    pub worker_threads: Option<usize>,
    /// Scale-out runs (g) with 1, 2, ... up to N storage nodes, each behind its own link
    /// (at most 4) [default: 3; 0 with --smoke].
    #[arg(long, value_name = "N")]
    pub scale_out: Option<usize>,
    /// Remove the namespaces a killed lab left behind, and exit.
    #[arg(long)]
    pub cleanup: bool,
    /// Instead of the scenarios: tenants with bandwidth guarantees sharing one storage agent
    /// over the link (50/30/20% guarantees, one going idle; two equal tenants), classified
    /// by DSCP in an HTB tree on the storage side. Uses the first corpus.
    #[arg(long)]
    pub tenants: bool,
}

/// How one scenario gets the corpus to the consumer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Way {
    /// (a) s3s-fs in `storage`; the consumer reads int32 by ranged GETs and narrows.
    Baseline,
    /// (b) `dquant serve` in `storage`, batches over the link in `wire`.
    Agent { wire: String },
    /// (c) storage agent → link (ranges in `wire`) → host agent → shm ring → consumer.
    Chain { wire: String },
    /// (d) in-process on local files.
    Local,
    /// (e) s3s-fs in `storage`; the host agent reads it through an `s3://` root → shm ring.
    S3Root,
    /// (f) two storage agents (replicas) → host agent → shm; one is killed mid-stream.
    Failover { wire: String },
    /// (g) `n` storage agents, each behind its own link, as replicas → host agent → shm.
    ScaleOut { n: usize, wire: String },
    /// (h) `dquant mount` in `host` over the storage agent (ranges in `wire`), read as local
    /// Megatron files by the consumer's in-process pipeline: an unmodified trainer.
    Mount { wire: String },
}

impl Way {
    pub fn label(&self) -> String {
        match self {
            Way::Baseline => "(a) S3 int32, host narrows".into(),
            Way::Agent { wire } => format!("(b) agent {wire}"),
            Way::Chain { wire } => format!("(c) chain {wire} + shm"),
            Way::Local => "(d) in-process, local".into(),
            Way::S3Root => "(e) DPU reads S3 int32 + shm".into(),
            Way::Failover { wire } => format!("(f) failover {wire} + shm"),
            Way::ScaleOut { n, wire } => format!("(g) scale-out {n} link(s) {wire}"),
            Way::Mount { wire } => format!("(h) dquant mount, ranges {wire}"),
        }
    }

    fn link_bound(&self) -> bool {
        !matches!(self, Way::Local)
    }
}

/// One scenario run's measurements.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Measure {
    pub run: u32,
    pub corpus: String,
    pub way: Way,
    pub consumer: consume::Consumed,
    /// Bytes sent by the veth end in `storage` (towards the host) and in `host`.
    pub link_down: u64,
    pub link_up: u64,
    /// The servers' peak RSS and CPU over the run.
    pub servers: Vec<netns::ProcStats>,
    /// (f): seconds into the run the replica was killed (`None`: the stream ended first).
    #[serde(default)]
    pub killed_after_s: Option<f64>,
    /// Links the run's data crossed (several for (g)).
    #[serde(default = "one")]
    pub links: usize,
}

fn one() -> usize {
    1
}

impl Measure {
    pub fn tokens_per_s(&self) -> f64 {
        self.consumer.tokens as f64 / self.consumer.wall_s
    }

    /// Link bytes (towards the host) per delivered token.
    pub fn wire_bytes_per_token(&self) -> f64 {
        self.link_down as f64 / self.consumer.tokens as f64
    }

    /// Consumer CPU-seconds per 10⁹ tokens.
    pub fn cpu_per_gtok(&self) -> f64 {
        self.consumer.cpu_s / self.consumer.tokens as f64 * 1e9
    }

    /// Fraction of the link's rate this run's bytes used: tokens/s ÷ (rate ÷ wire bytes per
    /// token), the "link rate ÷ wire bytes per token" bound.
    pub fn link_use(&self, link: &LinkSpec) -> f64 {
        self.link_down as f64 / self.consumer.wall_s / (link.bytes_per_s() * self.links as f64)
    }
}

/// A corpus on disk: DATA/lab/NAME_int32.{bin,idx}.
struct Corpus {
    enc: Encoding,
    prefix: PathBuf,
    tokens: u64,
}

impl Corpus {
    fn name(&self) -> String {
        format!("{}_int32", self.enc.name())
    }

    fn output(&self) -> OutputDType {
        if self.enc.bits() <= 16 {
            OutputDType::U16
        } else {
            OutputDType::I32
        }
    }

    fn narrow_codec(&self) -> String {
        match self.enc.bits() {
            16 => "u16".into(),
            b => format!("bits:{b}"),
        }
    }
}

/// Files the lab needs besides itself.
struct Tools {
    dquant: PathBuf,
    s3s_fs: PathBuf,
    me: PathBuf,
}

fn find_tools(args: &Args) -> Result<Tools> {
    let me = std::env::current_exe().context("cannot find this executable")?;
    let dquant = match &args.dquant {
        Some(p) => p.clone(),
        None => me.with_file_name("dquant"),
    };
    ensure!(
        dquant.is_file(),
        "{} not found: build it (cargo build --release) or pass --dquant",
        dquant.display()
    );
    let s3s_fs = match &args.s3s_fs {
        Some(p) => p.clone(),
        None => {
            let path = std::env::var_os("PATH").unwrap_or_default();
            let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
            if let Some(home) = std::env::var_os("CARGO_HOME") {
                dirs.push(PathBuf::from(home).join("bin"));
            }
            if let Some(home) = std::env::var_os("HOME") {
                dirs.push(PathBuf::from(home).join(".cargo/bin"));
            }
            dirs.into_iter()
                .map(|d| d.join("s3s-fs"))
                .find(|p| p.is_file())
                .context(
                    "s3s-fs not found in PATH or ~/.cargo/bin: install it with \
                     `cargo install s3s-fs --version 0.14.1 --locked --features binary` \
                     (bench/lab/run.sh does), or pass --s3s-fs",
                )?
        }
    };
    Ok(Tools { dquant, s3s_fs, me })
}

/// The kinds of source file tokenized into the corpora.
const TEXT_EXT: &str = "rs,md,txt,c,h";

/// Generates (once) the corpus of `enc` with about `size_mb` MB of int32 tokens.
fn prepare_corpus(tools: &Tools, dir: &Path, enc: Encoding, size_mb: u64) -> Result<Corpus> {
    let prefix = dir.join(format!("{}_int32", enc.name()));
    let stamp = dir.join(format!("{}_int32.stamp", enc.name()));
    let want = format!(
        "dquant corpus real --encoding {} --max-mb {size_mb} --ext {TEXT_EXT}",
        enc.name()
    );
    let have = std::fs::read_to_string(&stamp).unwrap_or_default();
    if have.trim() != want || !prefix.with_extension("bin").is_file() {
        eprintln!(
            "lab: tokenizing ~{size_mb} MB of source text with {} (once; kept in {})",
            enc.name(),
            dir.display()
        );
        let st = Command::new(&tools.dquant)
            .args(["corpus", "real", "--encoding", enc.name(), "--max-mb"])
            .arg(size_mb.to_string())
            .args(["--ext", TEXT_EXT])
            .arg(&prefix)
            .status()
            .context("cannot run dquant corpus")?;
        ensure!(st.success(), "dquant corpus real failed for {}", enc.name());
        std::fs::write(&stamp, &want)?;
    }
    let bytes = std::fs::metadata(prefix.with_extension("bin"))?.len();
    // Warm the page cache: the storage node serves from memory in every scenario alike.
    crate::procs::warm_file(&prefix.with_extension("bin"))?;
    Ok(Corpus {
        enc,
        prefix,
        tokens: bytes / 4,
    })
}

/// Settings shared by all scenario runs.
struct Ctx<'a> {
    tools: &'a Tools,
    link: &'a Link,
    bucket_root: PathBuf,
    /// s3s-fs's root: the bucket `lab` with the int32 files, uploaded by PUT.
    s3_root: PathBuf,
    scratch: tempfile::TempDir,
    worker_threads: Option<usize>,
    seq_len: u32,
    batch_size: u32,
}

const S3_PORT: u16 = 9000;
const AGENT_PORT: u16 = 7878;
const S3_KEY: &str = "lab";
const S3_SECRET: &str = "lab-secret-key";
const BUCKET: &str = "lab";
/// The storage agent listens beyond loopback, so it serves a tenant (the lab's only one):
/// consumers send this token (`DQUANT_TOKEN`), the host agent sends it upstream. It serves
/// without TLS (`allow_plaintext`): its link is a veth pair between namespaces the lab made,
/// which nobody else reads, and the lab's figures are the link's, not TLS's.
const LAB_TOKEN: &str = "lab-tenant-token-0123456789";

/// The lab's S3 client settings: its s3s-fs's credentials, at `endpoint`.
fn s3_settings(endpoint: &str) -> dquant_objstore::S3Settings {
    s3::settings(endpoint, S3_KEY, S3_SECRET)
}

impl Ctx<'_> {
    /// The host agent (the DPU's role) in `host`, serving consumers on `sock`: chaining to
    /// `upstreams`, or reading the S3 server with `s3_root`.
    fn host_agent(
        &self,
        sock: &Path,
        upstreams: &[String],
        s3_root: bool,
    ) -> Result<netns::NsChild> {
        let listen = "127.0.0.1:7878";
        self.dquant_serve(
            HOST_NS,
            listen,
            Some(sock),
            upstreams,
            s3_root,
            "host agent",
        )
    }

    /// The one storage agent of (b) and (h), at `addr` in `storage`.
    fn storage_agent(&self, addr: &str) -> Result<netns::NsChild> {
        self.dquant_serve(STORAGE_NS, addr, None, &[], false, "storage agent")
    }

    /// `dquant mount` in `host` on `dir`, over the storage agent at `addr`, its ranges in
    /// `wire`; returns once mounted.
    fn dquant_mount(
        &self,
        addr: &str,
        dir: &Path,
        wire: &str,
    ) -> Result<(netns::NsChild, MountGuard)> {
        std::fs::create_dir_all(dir).with_context(|| format!("{}", dir.display()))?;
        let mut cmd = Command::new(&self.tools.dquant);
        cmd.arg("mount")
            .arg(format!("dquant://{addr}"))
            .arg(dir)
            .args(["--wire-codec", wire])
            .env("DQUANT_TOKEN", LAB_TOKEN)
            .env("DQUANT_LOG", "warn");
        let mut child = netns::spawn_in(HOST_NS, cmd, "host mount")?;
        let guard = MountGuard(dir.to_path_buf());
        let t0 = Instant::now();
        while !guard.mounted() {
            if !child.running() || t0.elapsed() > Duration::from_secs(20) {
                let (_, stderr) = child.stop();
                bail!(
                    "dquant mount did not mount {}; its stderr:\n{stderr}",
                    dir.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok((child, guard))
    }

    /// The host agent's Unix socket for one run.
    fn socket(&self, run: u32, c: &Corpus) -> PathBuf {
        self.scratch
            .path()
            .join(format!("host-{run}-{}.sock", c.name()))
    }

    fn plan(&self, c: &Corpus, uri: String, dtype: Option<&str>, wire: &str) -> Plan {
        let mut s = Source::new(uri);
        s.dtype = dtype.map(str::to_string);
        let mut p = Plan::new(vec![s], self.seq_len, self.batch_size);
        // Sequential reading: a shuffled baseline would pay one HTTP round trip per 16 KiB
        // sample and measure latency, not the link (see bench/lab/README.md).
        p.shuffle = false;
        p.output = c.output();
        p.wire_codec = wire.to_string();
        p
    }

    /// The agent config of the lab's storage agent (its tenant) or, chaining to
    /// `upstream`, of the host agent (the tenant's token to send there); written once.
    fn agent_config(&self, upstreams: &[String]) -> Result<PathBuf> {
        let (name, body) = match upstreams {
            [] => (
                "storage-agent.toml".to_string(),
                format!(
                    "allow_plaintext = true\n[[tenants]]\nname = \"lab\"\ntoken = \"{LAB_TOKEN}\"\nroots = [\"{BUCKET}\"]\n"
                ),
            ),
            u => (
                format!("host-agent-{}.toml", u.len()),
                format!(
                    "upstreams = {u:?}\nupstream_token = \"{LAB_TOKEN}\"\nupstream_timeout_secs = 5\n"
                ),
            ),
        };
        let path = self.scratch.path().join(name);
        std::fs::write(&path, body).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// `dquant serve` in namespace `ns`: the storage agent, or with `upstreams` the host
    /// agent allowed to chain to them. It serves the corpora's directory as root `lab`, or
    /// with `s3_root` s3s-fs's bucket (the s3:// root, reached as the AWS_* variables say).
    fn dquant_serve(
        &self,
        ns: &str,
        listen: &str,
        socket: Option<&Path>,
        upstreams: &[String],
        s3_root: bool,
        what: &str,
    ) -> Result<netns::NsChild> {
        let mut cmd = Command::new(&self.tools.dquant);
        let root = match s3_root {
            true => format!("{BUCKET}=s3://{BUCKET}"),
            false => format!("{BUCKET}={}", self.bucket_root.join(BUCKET).display()),
        };
        cmd.arg("serve")
            .arg("--config")
            .arg(self.agent_config(upstreams)?)
            .arg("--root")
            .arg(root)
            .args(["--listen", listen])
            .env("DQUANT_LOG", "warn");
        if s3_root {
            // Plain HTTP beyond loopback: the lab's veth pair, which nobody else reads.
            cmd.env("AWS_ENDPOINT_URL", format!("http://{STORAGE_IP}:{S3_PORT}"))
                .env("AWS_ACCESS_KEY_ID", S3_KEY)
                .env("AWS_SECRET_ACCESS_KEY", S3_SECRET)
                .env("AWS_REGION", "us-east-1")
                .env("AWS_ALLOW_HTTP", "true");
        }
        if let Some(s) = socket {
            cmd.arg("--socket").arg(s);
        }
        if let Some(n) = self.worker_threads {
            cmd.arg("--worker-threads").arg(n.to_string());
        }
        let mut child = netns::spawn_in(ns, cmd, what)?;
        if let Err(e) = netns::wait_listening(ns, listen, Duration::from_secs(20)) {
            let (_, stderr) = child.stop();
            return Err(e.context(format!("{what} did not start; its stderr:\n{stderr}")));
        }
        Ok(child)
    }

    /// Runs one scenario on one corpus: servers up, consumer to the end, counters, servers
    /// down.
    fn run(&self, run: u32, c: &Corpus, way: &Way) -> Result<Measure> {
        let storage_addr = format!("{STORAGE_IP}:{AGENT_PORT}");
        let mut servers: Vec<(String, netns::NsChild)> = Vec::new();
        let mut consumer = Command::new(&self.tools.me);
        consumer.arg("lab-consume").env("DQUANT_TOKEN", LAB_TOKEN);
        // (h): unmounted when the run ends, however it ends.
        let mut mount: Option<MountGuard> = None;
        let plan = match way {
            Way::Baseline => {
                servers.push(("s3s-fs".into(), spawn_s3s_fs(self.tools, &self.s3_root)?));
                let addr = format!("{STORAGE_IP}:{S3_PORT}");
                consumer.arg("--s3-endpoint").arg(format!("http://{addr}"));
                self.plan(
                    c,
                    format!("s3://{BUCKET}/{}.bin", c.name()),
                    Some("i32"),
                    "auto",
                )
            }
            Way::Agent { wire } => {
                servers.push(("storage agent".into(), self.storage_agent(&storage_addr)?));
                consumer
                    .arg("--agent")
                    .arg(format!("dquant://{storage_addr}"));
                self.plan(c, format!("{BUCKET}/{}", c.name()), None, wire)
            }
            Way::Chain { wire } | Way::Failover { wire } | Way::ScaleOut { wire, .. } => {
                // (namespace, address) of each storage agent.
                let mut reps = vec![(STORAGE_NS.to_string(), storage_addr.clone())];
                match way {
                    Way::Failover { .. } => reps.push((
                        STORAGE_NS.to_string(),
                        format!("{STORAGE_IP}:{}", AGENT_PORT + 2),
                    )),
                    Way::ScaleOut { n, .. } => reps.extend((1..*n).map(|i| {
                        (
                            netns::storage_ns(i),
                            format!("{}:{AGENT_PORT}", netns::storage_ip(i)),
                        )
                    })),
                    _ => {}
                }
                for (i, (ns, addr)) in reps.iter().enumerate() {
                    let what = format!("storage agent {i}");
                    servers.push((
                        what.clone(),
                        self.dquant_serve(ns, addr, None, &[], false, &what)?,
                    ));
                }
                let reps: Vec<String> = reps.into_iter().map(|r| r.1).collect();
                let sock = self.socket(run, c);
                servers.push(("host agent".into(), self.host_agent(&sock, &reps, false)?));
                consumer.arg("--agent").arg(&sock);
                self.plan(
                    c,
                    format!("dquant://{}/{BUCKET}/{}", reps.join(","), c.name()),
                    None,
                    wire,
                )
            }
            Way::S3Root => {
                servers.push(("s3s-fs".into(), spawn_s3s_fs(self.tools, &self.s3_root)?));
                let sock = self.socket(run, c);
                servers.push(("host agent".into(), self.host_agent(&sock, &[], true)?));
                consumer.arg("--agent").arg(&sock);
                self.plan(c, format!("{BUCKET}/{}.bin", c.name()), Some("i32"), "auto")
            }
            Way::Local => self.plan(c, c.prefix.display().to_string(), None, "auto"),
            Way::Mount { wire } => {
                servers.push(("storage agent".into(), self.storage_agent(&storage_addr)?));
                let dir = self.scratch.path().join(format!("mnt-{run}-{}", c.name()));
                let (child, guard) = self.dquant_mount(&storage_addr, &dir, wire)?;
                servers.push(("host mount".into(), child));
                mount = Some(guard);
                let prefix = dir.join(BUCKET).join(c.name());
                // The first lookup asks the storage agent for the dataset's largest token
                // (--dtype auto: a scan, once per version while the agent keeps it open). A
                // mount outlives training jobs, so that happens before any job reads; here,
                // before the consumer starts.
                let bin = PathBuf::from(format!("{}.bin", prefix.display()));
                std::fs::metadata(&bin).with_context(|| format!("{}", bin.display()))?;
                self.plan(c, prefix.display().to_string(), None, "auto")
            }
        };
        consumer.arg("--plan").arg(serde_json::to_string(&plan)?);
        let (down0, up0) = self.link.counters()?;
        let child = netns::spawn_in(HOST_NS, consumer, "consumer")?;
        // Generous: the baseline at 5% of the link rate, plus start-up.
        let secs = c.tokens as f64 * 4.0 / (self.link.spec.bytes_per_s() * 0.05) + 60.0;
        let mut threads: Vec<netns::ThreadCpu> = vec![Default::default(); servers.len()];
        // (f): the second storage agent is killed once an eighth of a byte per token has
        // crossed the link: a fifth to a third of the way at the 0.4-0.7 bytes per token of
        // the compressed codecs.
        let kill = matches!(way, Way::Failover { .. }).then_some(1usize);
        let mut killed_after_s = None;
        let started = Instant::now();
        let (ok, out, err) = child.finish(Duration::from_secs_f64(secs), || {
            for ((_, s), t) in servers.iter().zip(&mut threads) {
                s.sample_threads(t);
            }
            if let (Some(i), None) = (kill, killed_after_s) {
                let sent = self.link.counters().map_or(0, |(d, _)| d - down0);
                if sent >= c.tokens / 8 {
                    servers[i].1.kill();
                    killed_after_s = Some(started.elapsed().as_secs_f64());
                }
            }
        })?;
        let (down1, up1) = self.link.counters()?;
        let mut stats = Vec::new();
        for ((name, s), t) in servers.iter_mut().zip(&mut threads) {
            if killed_after_s.is_some() && name == "storage agent 1" {
                continue;
            }
            s.sample_threads(t);
            stats.push(s.stats(name, t)?);
            if !s.running() {
                let (_, e) = s.stop();
                bail!("{name} exited during {}: {e}", way.label());
            }
        }
        drop(mount);
        drop(servers);
        if !ok {
            bail!(
                "the consumer failed in {} on {}: {}",
                way.label(),
                c.name(),
                err.trim()
            );
        }
        let consumer: consume::Consumed = serde_json::from_str(out.trim())
            .with_context(|| format!("consumer printed {out:?}"))?;
        Ok(Measure {
            run,
            corpus: c.enc.name().to_string(),
            way: way.clone(),
            consumer,
            link_down: down1 - down0,
            link_up: up1 - up0,
            servers: stats,
            killed_after_s,
            links: match way {
                Way::ScaleOut { n, .. } => *n,
                _ => 1,
            },
        })
    }
}

/// Starts s3s-fs in `storage` on `root` and waits until it listens.
/// A mount of scenario (h), lazily unmounted when dropped (its process may be gone: a
/// lazy unmount of a dead FUSE connection still succeeds).
struct MountGuard(PathBuf);

impl MountGuard {
    fn mounted(&self) -> bool {
        dquant_mount::is_mounted(&self.0)
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        if self.mounted() {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

fn spawn_s3s_fs(tools: &Tools, root: &Path) -> Result<netns::NsChild> {
    let mut cmd = Command::new(&tools.s3s_fs);
    cmd.args(["--host", STORAGE_IP, "--port", &S3_PORT.to_string()])
        .args(["--access-key", S3_KEY, "--secret-key", S3_SECRET])
        .arg(root);
    let child = netns::spawn_in(STORAGE_NS, cmd, "s3s-fs")?;
    let addr = format!("{STORAGE_IP}:{S3_PORT}");
    netns::wait_listening(STORAGE_NS, &addr, Duration::from_secs(20))
        .context("s3s-fs did not start")?;
    Ok(child)
}

/// Uploads (once) each corpus's int32 file into s3s-fs's bucket by PUT, from inside the
/// `storage` namespace (no link traffic). See [`s3::ensure_object`] for why not a copy.
fn stage_s3(tools: &Tools, s3_root: &Path, corpora: &[Corpus]) -> Result<()> {
    std::fs::create_dir_all(s3_root.join(BUCKET))
        .with_context(|| format!("cannot create {}", s3_root.display()))?;
    let _server = spawn_s3s_fs(tools, s3_root)?;
    let settings = s3_settings(&format!("http://{STORAGE_IP}:{S3_PORT}"));
    let store = s3::s3_store(&settings, BUCKET)?;
    let files: Vec<(String, PathBuf)> = corpora
        .iter()
        .map(|c| (format!("{}.bin", c.name()), c.prefix.with_extension("bin")))
        .collect();
    netns::in_ns(STORAGE_NS, move || -> Result<()> {
        for (key, file) in &files {
            if s3::ensure_object(&store, key, file)? {
                eprintln!("lab: uploaded s3://{BUCKET}/{key} to s3s-fs (once)");
            }
        }
        Ok(())
    })?
}

fn scenarios(c: &Corpus, compressed: &[String], scale_out: usize) -> Vec<Way> {
    let mut v = vec![
        Way::Baseline,
        Way::Agent {
            wire: c.narrow_codec(),
        },
    ];
    v.extend(compressed.iter().map(|w| Way::Agent { wire: w.clone() }));
    v.extend(compressed.iter().map(|w| Way::Chain { wire: w.clone() }));
    v.push(Way::S3Root);
    // The mount reads ranges narrowed, as the "u16 against the S3 int32 baseline".
    v.push(Way::Mount {
        wire: c.narrow_codec(),
    });
    v.extend(
        compressed
            .iter()
            .take(1)
            .map(|w| Way::Failover { wire: w.clone() }),
    );
    // Narrowed, not compressed: one link is then link-bound, not CPU-bound, so N links can
    // show N times the tokens.
    v.extend((1..=scale_out).map(|n| Way::ScaleOut {
        n,
        wire: c.narrow_codec(),
    }));
    v.push(Way::Local);
    v
}

/// The lab, end to end.
pub fn run(args: &Args) -> Result<()> {
    if args.cleanup {
        let gone = netns::remove_leftovers()?;
        if gone.is_empty() {
            eprintln!("lab: nothing to remove");
        } else {
            eprintln!("lab: removed namespaces {}", gone.join(", "));
        }
        return Ok(());
    }
    let size = args.size.unwrap_or(if args.smoke { 4 } else { 200 });
    let runs = args.runs.unwrap_or(if args.smoke { 1 } else { 3 });
    ensure!(runs >= 1, "--runs must be at least 1");
    ensure!(!args.corpora.is_empty(), "--corpora names no corpus");
    let compressed: Vec<String> = if args.smoke {
        args.compressed.iter().take(1).cloned().collect()
    } else {
        args.compressed.clone()
    };
    for w in &compressed {
        w.parse::<dquant_plan::WireCodec>()
            .map_err(|e| anyhow::anyhow!("--compressed {w:?}: {e}"))?;
    }
    let spec = LinkSpec::new(&args.rate, args.mtu)?;
    let scale_out = args.scale_out.unwrap_or(if args.smoke { 0 } else { 3 });
    ensure!(
        scale_out <= netns::MAX_STORAGE_NODES,
        "--scale-out {scale_out}: at most {} storage nodes",
        netns::MAX_STORAGE_NODES
    );
    let tools = find_tools(args)?;
    // One directory per size, so that a smoke run does not replace the full corpora.
    let bucket_root = args.data.join(format!("size{size}"));
    let data = bucket_root.join(BUCKET);
    std::fs::create_dir_all(&data).with_context(|| format!("cannot create {}", data.display()))?;
    let corpora: Vec<Corpus> = args
        .corpora
        .iter()
        .map(|&e| prepare_corpus(&tools, &data, e, size))
        .collect::<Result<_>>()?;
    let out = match &args.out {
        Some(o) => o.clone(),
        None => args.data.join("out").join(utc_stamp()),
    };
    std::fs::create_dir_all(&out)?;

    netns::install_signal_cleanup()?;
    let link = Link::create(spec.clone(), scale_out.max(1))?;
    eprintln!(
        "lab: namespaces {STORAGE_NS} ({STORAGE_IP}) and {HOST_NS} ({}), veth shaped to {} (mtu {})",
        netns::HOST_IP, spec.rate, spec.mtu
    );
    if args.tenants {
        let started = Instant::now();
        let scratch = tempfile::tempdir()?;
        let (body, figures) = tenants::run(&tools, &link, &corpora[0], &data, scratch.path())?;
        let meta = report::Meta::collect(args, &spec, size, 1, &corpora[..1], started.elapsed());
        let section = format!(
            "## Benchmark lab: tenants sharing one agent's link ({})\n\n- Command: `{}` (commit {}, {:.0} s)\n- Machine: {}; load {}\n- Link: {}; the storage side's egress an HTB tree classifying by DSCP (one class per tenant: its guarantee as rate, the link as ceiling)\n- Data: {}; greedy consumers of an unshuffled u16 plan (seq_len 4095, batch 16) over TCP\n\n{body}",
            meta.date, meta.command, meta.commit, meta.elapsed_s, meta.machine, meta.loadavg, meta.link, meta.data
        );
        if let Some(out) = &args.out {
            std::fs::create_dir_all(out)?;
            std::fs::write(out.join("table.md"), &section)?;
            let json = serde_json::json!({ "figures": figures });
            std::fs::write(
                out.join("figures.json"),
                serde_json::to_string_pretty(&json)?,
            )?;
        }
        if let Some(f) = &args.append {
            report::append_to_history(f, &section)?;
        }
        println!("{section}");
        return Ok(());
    }
    let s3_root = bucket_root.join("s3");
    stage_s3(&tools, &s3_root, &corpora)?;
    let ctx = Ctx {
        tools: &tools,
        link: &link,
        bucket_root,
        s3_root,
        scratch: tempfile::tempdir()?,
        worker_threads: args.worker_threads,
        seq_len: args.seq_len,
        batch_size: args.batch_size,
    };
    let started = Instant::now();
    let mut all = Vec::new();
    for run in 1..=runs {
        for c in &corpora {
            let mut baseline: Option<Measure> = None;
            for way in scenarios(c, &compressed, scale_out) {
                let m = match ctx.run(run, c, &way) {
                    Ok(m) => m,
                    // The handler is removing the lab and exits; its message says why.
                    Err(_) if netns::interrupted() => loop {
                        std::thread::park();
                    },
                    Err(e) => {
                        return Err(e.context(format!("run {run}, {}, {}", c.name(), way.label())))
                    }
                };
                let base = baseline.get_or_insert_with(|| m.clone());
                ensure!(
                    m.consumer.xxh3 == base.consumer.xxh3 && m.consumer.tokens == base.consumer.tokens,
                    "{} on {} delivered a different stream than the baseline: {} tokens, xxh3 {} against {} tokens, xxh3 {}",
                    way.label(), c.name(), m.consumer.tokens, m.consumer.xxh3, base.consumer.tokens, base.consumer.xxh3
                );
                eprintln!(
                    "[run {run}/{runs}] {:<7} {:<32} {:>7.1} M tok/s  {:>5.2}× baseline  link {:>5.1}%  {:.2} B/tok  consumer {:>6.2} CPU-s/Gtok",
                    c.enc.name(),
                    way.label(),
                    m.tokens_per_s() / 1e6,
                    m.tokens_per_s() / base.tokens_per_s(),
                    m.link_use(&spec) * 100.0,
                    m.wire_bytes_per_token(),
                    m.cpu_per_gtok()
                );
                all.push(m);
            }
        }
    }
    drop(ctx);
    drop(link);
    let elapsed = started.elapsed();

    let summary = report::summarize(&all, &spec);
    let goals = report::goals(&summary);
    let meta = report::Meta::collect(args, &spec, size, runs, &corpora, elapsed);
    let table = report::render_table(&meta, &summary, &goals);
    std::fs::write(out.join("table.md"), &table)?;
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(
            &serde_json::json!({ "meta": meta, "runs": all, "summary": summary }),
        )?,
    )?;
    chart::render_png(
        &out.join("lab.png"),
        &meta.chart_title(),
        &meta.chart_subtitle(),
        &report::panels(&summary),
    )?;
    std::fs::write(
        out.join("figures.json"),
        serde_json::to_string_pretty(&serde_json::json!({ "figures": report::figures(&goals) }))?,
    )?;
    if let Some(f) = &args.append {
        report::append_to_history(f, &table)?;
    }
    println!("{table}");
    eprintln!(
        "lab: results in {} (table.md, results.json, lab.png); links and namespaces removed",
        out.display()
    );
    Ok(())
}

fn utc_now() -> (i64, u32, u32, u32, u32, u32) {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400) as u32;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d, rem / 3600, rem / 60 % 60, rem % 60)
}

fn utc_stamp() -> String {
    let (y, m, d, h, mi, s) = utc_now();
    format!("{y:04}{m:02}{d:02}T{h:02}{mi:02}{s:02}Z")
}

fn utc_human() -> String {
    let (y, m, d, h, mi, _) = utc_now();
    format!("{y:04}-{m:02}-{d:02} {h:02}:{mi:02} UTC")
}
