//! Load: many equal consumers streaming from one real `dquant serve` process at once, with
//! hostile clients mixed in (issue 14 item 9). Measures what the well-behaved consumers see
//! (errors, their share of the throughput: Jain's fairness index) and what the agent costs
//! (resident memory against its bound, threads), against the same consumers without the
//! hostile clients in the same run.

mod agent;
mod clients;
pub mod stats;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dquant_engine::plain_codec;
use dquant_plan::{OutputDType, Plan, WireCodec};
use serde_json::json;

use self::agent::{Sample, ServeConfig, ServeProc};
use self::clients::{Consumers, Hostile, HostileOpts, HostileTally};
use self::stats::{jain, prom_series, rss_bound_bytes, summary, thread_bound, SessionMemory};
use crate::procs;
use crate::report::{f, mib, Table};
use crate::{DataSpec, PlanOpts};

pub use clients::run_child;

const EXAMPLES: &str = "\
Examples:
  # The issue's run: 64 consumers for 60 s, without then with the hostile clients:
  dquant-offload-bench load /work/bench-data/zipf1g_u16 --json-out load.json
  # A quick check (8 consumers, 5 s per phase):
  dquant-offload-bench load /work/bench-data/zipf1g_u16 --smoke --consumers 8

A dataset on a fresh machine (any Megatron dataset with ids below 65536 will do for the u16
plan; 256 Mi tokens are plenty):
  dquant corpus zipf /data/zipf256m --tokens 268435456 --vocab 50257 --eod 50256
  dquant-offload-bench load /data/zipf256m

Needs the release `dquant` binary next to this one (cargo build --release -p dquant-cli
-p dquant-bench), or --dquant PATH.";

/// Many consumers at once, with killed, stalled and garbage-sending clients mixed in.
///
/// Starts a real `dquant serve` (loopback, a config file with the flags' values) serving the
/// dataset's directory as root `bench`, and runs two phases, each on a fresh agent: the
/// baseline (--consumers well-behaved consumers, each a thread streaming its own rank of a
/// world of --consumers ranks: equal work) and the same consumers with hostile clients mixed
/// in: a client killed mid-stream over and over (a child process, SIGKILLed a random
/// 0.2–1.5 s after its first batch, then another), --stalled clients that read
/// --stall-after batches and then stop reading with the connection open, and a thread
/// sending garbage to the data and
/// control ports every second (random bytes, a frame magic then random bytes, a hello for a
/// random session, random bytes and the HTTP/2 preface then random bytes to gRPC).
///
/// Each phase measures, over --duration seconds after every consumer has its first batch and
/// --warmup seconds more: the errors well-behaved consumers see (an error, a stream that
/// ends, or one of a session's first --verify-batches batches differing from the plan run
/// in this process), each consumer's throughput and Jain's fairness index over them, the
/// longest wait for a batch, the agent's VmRSS/VmHWM and Threads (/proc/PID/status, every
/// --interval-ms) with its sessions (its own metrics), and the bounds those should keep.
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    #[command(flatten)]
    pub plan: PlanOpts,
    /// Well-behaved consumers (threads of this process), each one rank of a world this big.
    #[arg(long, default_value_t = 64)]
    pub consumers: u32,
    /// Seconds measured in each phase.
    #[arg(long, default_value_t = 60.0)]
    pub duration: f64,
    /// Seconds after every consumer has its first batch before the measured window opens.
    #[arg(long, default_value_t = 3.0)]
    pub warmup: f64,
    /// A quick check: 5 s per phase and 1 s of warm-up.
    #[arg(long)]
    pub smoke: bool,
    /// Run only the phase with hostile clients (no baseline).
    #[arg(long, conflicts_with = "no_hostile")]
    pub no_baseline: bool,
    /// Run only the baseline phase (no hostile clients): memory by session count alone, as
    /// bench/scale/run.sh measures it.
    #[arg(long)]
    pub no_hostile: bool,
    /// Stalled clients in the hostile phase.
    #[arg(long, default_value_t = 1)]
    pub stalled: usize,
    /// Batches a stalled client reads before it stops reading.
    #[arg(long, default_value_t = 3)]
    pub stall_after: u64,
    /// Milliseconds between two rounds of garbage (five connections a round).
    #[arg(long, default_value_t = 1000)]
    pub garbage_every_ms: u64,
    /// Bytes of garbage per connection.
    #[arg(long, default_value_t = 65536)]
    pub garbage_bytes: usize,
    /// Each session's first batches checked against the plan run in this process.
    #[arg(long, default_value_t = 2)]
    pub verify_batches: usize,
    /// The agent's prefetch frames (1 MiB each) per session.
    #[arg(long, default_value_t = dquant_agent::DEFAULT_PREFETCH)]
    pub prefetch_frames: usize,
    /// The agent's max_sessions.
    #[arg(long, default_value_t = 256)]
    pub max_sessions: usize,
    /// The memory bound's fixed part, MiB (as the rss benchmark's limit).
    #[arg(long, default_value_t = 64)]
    pub base_mib: u64,
    /// Sampling interval of the agent's memory, threads and sessions.
    #[arg(long, default_value_t = 200)]
    pub interval_ms: u64,
    /// The `dquant` binary to run as the agent [default: `dquant` next to this executable].
    #[arg(long)]
    pub dquant: Option<PathBuf>,
    /// Copy each phase's agent log here (PREFIX.baseline.log, PREFIX.hostile.log).
    #[arg(long, value_name = "PREFIX")]
    pub agent_log: Option<PathBuf>,
    /// Do not read the dataset once beforehand to bring it into the page cache.
    #[arg(long)]
    pub no_warm: bool,
    #[command(flatten)]
    pub out: crate::report::JsonOpts,
}

/// One phase's measurements.
struct Phase {
    name: &'static str,
    window_s: f64,
    /// Per consumer, in the window.
    bytes: Vec<u64>,
    batches: Vec<u64>,
    max_gap_ms: Vec<f64>,
    /// Over the whole phase.
    errors: Vec<(usize, String)>,
    sessions_opened: u64,
    checked: u64,
    mismatched: u64,
    not_started: usize,
    idle_rss_kib: u64,
    idle_threads: u64,
    samples: Vec<Sample>,
    census: BTreeMap<String, u64>,
    hwm_kib: u64,
    end_rss_kib: u64,
    end_threads: u64,
    end_sessions: Option<(u64, u64)>,
    agent_cpu_s: f64,
    bench_cpu_s: f64,
    load_before: String,
    load_after: String,
    refusals: BTreeMap<String, f64>,
    session_ends: BTreeMap<String, f64>,
    exit: Option<(i32, Duration)>,
    died: bool,
    log_warn: usize,
    log_error: Vec<String>,
    tally: Option<HostileTally>,
}

impl Phase {
    fn gbps(&self) -> f64 {
        self.bytes.iter().sum::<u64>() as f64 / self.window_s / 1e9
    }

    fn per_consumer_mbps(&self) -> Vec<f64> {
        self.bytes
            .iter()
            .map(|&b| b as f64 / self.window_s / 1e6)
            .collect()
    }

    fn jain(&self) -> f64 {
        jain(&self.bytes.iter().map(|&b| b as f64).collect::<Vec<_>>())
    }

    fn rss_max_kib(&self) -> u64 {
        self.samples.iter().map(|s| s.rss_kib).max().unwrap_or(0)
    }

    fn threads_max(&self) -> u64 {
        self.samples.iter().map(|s| s.threads).max().unwrap_or(0)
    }

    /// Most sessions (pending + streaming) the agent's metrics showed at once.
    fn sessions_peak(&self) -> Option<u64> {
        self.samples
            .iter()
            .filter_map(|s| Some(s.pending? + s.streaming?))
            .max()
    }

    fn streaming_peak(&self) -> Option<u64> {
        self.samples.iter().filter_map(|s| s.streaming).max()
    }

    fn pending_peak(&self) -> Option<u64> {
        self.samples.iter().filter_map(|s| s.pending).max()
    }

    fn max_gap(&self) -> f64 {
        self.max_gap_ms.iter().copied().fold(0.0, f64::max)
    }
}

pub fn run(a: &Args) -> Result<()> {
    let ds = a.plan.dataset()?;
    let (duration, warmup) = if a.smoke {
        (5.0, 1.0)
    } else {
        (a.duration, a.warmup)
    };
    if a.consumers == 0 || duration <= 0.0 {
        bail!("--consumers and --duration must be positive");
    }
    let dquant = match &a.dquant {
        Some(p) => p.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("this executable has no directory")?
            .join("dquant"),
    };
    if !dquant.is_file() {
        bail!(
            "{}: no dquant binary (build it: cargo build --release -p dquant-cli, or pass --dquant)",
            dquant.display()
        );
    }
    if !a.no_warm {
        procs::warm_file(&ds.bin())?;
    }
    // Equal work: every consumer gets one rank of the same shuffled plan, for many epochs
    // (no stream ends within the window).
    let plan_for = |uri: &str, rank: u32| {
        let mut p = a.plan.plan(uri, true);
        p.world = a.consumers;
        p.rank = rank;
        if p.samples.is_none() {
            p.epochs = Some(1000);
        }
        p
    };
    let remote: Vec<Plan> = (0..a.consumers)
        .map(|r| plan_for(&ds.remote(), r))
        .collect();
    let t = Instant::now();
    let reference: Vec<Vec<u64>> = (0..a.consumers)
        .map(|r| clients::reference_digests(&plan_for(&ds.local(), r), a.verify_batches))
        .collect::<Result<_>>()?;
    eprintln!(
        "load: in-process reference of {} batches per rank in {:.1} s",
        a.verify_batches,
        t.elapsed().as_secs_f64()
    );
    let reference = Arc::new(reference);
    let serve = ServeConfig {
        root: ds.dir.clone(),
        prefetch_frames: a.prefetch_frames,
        max_sessions: a.max_sessions,
    };
    let hostile = HostileOpts {
        stalled: a.stalled,
        stall_after: a.stall_after,
        kill_min_ms: 200,
        kill_max_ms: 1500,
        garbage_every: Duration::from_millis(a.garbage_every_ms),
        garbage_bytes: a.garbage_bytes,
        seed: 0xD0A7,
    };
    let mut phases = Vec::new();
    let mut config_text = String::new();
    for (name, with_hostile) in [("baseline", false), ("hostile", true)] {
        if (a.no_baseline && !with_hostile) || (a.no_hostile && with_hostile) {
            continue;
        }
        eprintln!(
            "load: phase {name}: {} consumers, {duration} s{}",
            a.consumers,
            if with_hostile {
                " with the hostile clients"
            } else {
                ""
            }
        );
        let (p, cfg) = run_phase(
            a,
            name,
            &dquant,
            &serve,
            &remote,
            reference.clone(),
            with_hostile.then_some(&hostile),
            duration,
            warmup,
        )?;
        config_text = cfg;
        phases.push(p);
    }
    report(a, &ds, &dquant, &config_text, &phases, duration, warmup)
}

#[allow(clippy::too_many_arguments)]
fn run_phase(
    a: &Args,
    name: &'static str,
    dquant: &Path,
    serve: &ServeConfig,
    plans: &[Plan],
    reference: Arc<Vec<Vec<u64>>>,
    hostile: Option<&HostileOpts>,
    duration: f64,
    warmup: f64,
) -> Result<(Phase, String)> {
    let load_before = procs::loadavg();
    let mut agent = ServeProc::spawn(dquant, serve)?;
    let pid = agent.pid();
    std::thread::sleep(Duration::from_millis(500));
    let t0 = Instant::now();
    let idle = agent::sample(pid, agent.metrics, t0).context("sampling the idle agent")?;
    let sampler = agent::Sampler::start(
        pid,
        agent.metrics,
        t0,
        Duration::from_millis(a.interval_ms.max(10)),
    );
    let mut consumers = Consumers::start(&agent.uri, plans.to_vec(), reference);
    let hostile = match hostile {
        Some(o) => Some(Hostile::start(
            &agent.uri,
            agent.control,
            agent.data,
            &plans[0],
            o,
        )?),
        None => None,
    };
    // Every consumer streaming (or 60 s), then the warm-up.
    let t = Instant::now();
    while consumers.started() < plans.len() && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let not_started = plans.len() - consumers.started();
    std::thread::sleep(Duration::from_secs_f64(warmup));

    let b0 = consumers.bytes();
    let n0: Vec<u64> = consumers
        .slots
        .iter()
        .map(|s| s.batches.load(Ordering::Relaxed))
        .collect();
    let cpu0 = procs::proc_cpu(pid)?;
    let self0 = procs::self_cpu();
    let w0 = Instant::now();
    consumers.measuring.store(true, Ordering::Relaxed);
    let mut died = false;
    while w0.elapsed().as_secs_f64() < duration {
        std::thread::sleep(Duration::from_millis(50));
        if !agent.alive() {
            died = true;
            break;
        }
    }
    let b1 = consumers.bytes();
    let window_s = w0.elapsed().as_secs_f64();
    consumers.measuring.store(false, Ordering::Relaxed);
    let agent_cpu_s = procs::proc_cpu(pid)
        .map(|c| (c - cpu0).as_secs_f64())
        .unwrap_or(f64::NAN);
    let bench_cpu_s = (procs::self_cpu() - self0).as_secs_f64();
    let batches: Vec<u64> = consumers
        .slots
        .iter()
        .zip(&n0)
        .map(|(s, &n)| s.batches.load(Ordering::Relaxed) - n)
        .collect();

    consumers.stop();
    let tally = hostile.map(Hostile::stop);
    // Let closed sessions' threads exit.
    std::thread::sleep(Duration::from_millis(1500));
    let end = agent::sample(pid, agent.metrics, t0);
    let page = agent::scrape(agent.metrics, Duration::from_secs(2));
    let (samples, census) = sampler.finish();
    let hwm_kib = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| stats::status_field(&s, "VmHWM"))
        .unwrap_or_else(|| samples.iter().map(|s| s.hwm_kib).max().unwrap_or(0));
    let exit = agent.stop(Duration::from_secs(20));
    let log = agent.log_text();
    if let Some(prefix) = &a.agent_log {
        let p = PathBuf::from(format!("{}.{name}.log", prefix.display()));
        std::fs::write(&p, &log).with_context(|| format!("writing {}", p.display()))?;
    }
    let slots = &consumers.slots;
    let sum = |f: &dyn Fn(&clients::Slot) -> u64| slots.iter().map(|s| f(s)).sum::<u64>();
    let errors = std::mem::take(
        &mut *consumers
            .errors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    let phase = Phase {
        name,
        window_s,
        bytes: b1.iter().zip(&b0).map(|(x, y)| x - y).collect(),
        batches,
        max_gap_ms: slots
            .iter()
            .map(|s| s.max_gap_us.load(Ordering::Relaxed) as f64 / 1e3)
            .collect(),
        errors,
        sessions_opened: sum(&|s| s.sessions.load(Ordering::Relaxed)),
        checked: sum(&|s| s.checked.load(Ordering::Relaxed)),
        mismatched: sum(&|s| s.mismatched.load(Ordering::Relaxed)),
        not_started,
        idle_rss_kib: idle.rss_kib,
        idle_threads: idle.threads,
        samples,
        census,
        hwm_kib,
        end_rss_kib: end.map_or(0, |s| s.rss_kib),
        end_threads: end.map_or(0, |s| s.threads),
        end_sessions: end.and_then(|s| Some((s.pending?, s.streaming?))),
        agent_cpu_s,
        bench_cpu_s,
        load_before,
        load_after: procs::loadavg(),
        refusals: prom_series(&page, "dquant_refusals_total"),
        session_ends: prom_series(&page, "dquant_session_ends_total"),
        exit,
        died,
        log_warn: log.lines().filter(|l| l.contains(" WARN ")).count(),
        log_error: log
            .lines()
            .filter(|l| l.contains(" ERROR "))
            .map(str::to_string)
            .collect(),
        tally,
    };
    Ok((phase, agent.config_text.clone()))
}

fn report(
    a: &Args,
    ds: &DataSpec,
    dquant: &Path,
    config_text: &str,
    phases: &[Phase],
    duration: f64,
    warmup: f64,
) -> Result<()> {
    let plain = a
        .plan
        .wire_codec
        .parse::<WireCodec>()
        .map(|w| w == WireCodec::Fixed(plain_codec(OutputDType::from(a.plan.output))))
        .unwrap_or(false);
    let idx_bytes = std::fs::metadata(ds.idx())?.len();
    let per_session = SessionMemory::new(
        a.prefetch_frames as u64,
        a.plan.batch_size as u64,
        a.plan.seq_len as u64,
        plain,
        idx_bytes,
    );
    let base = a.base_mib << 20;
    let max_handshakes = dquant_agent::Limits::default().max_handshakes as u64;
    // Sessions the bound counts: the most the agent's metrics showed at once, else the
    // clients this run keeps open at once (consumers, stalled clients, one killed client).
    let sessions_of = |p: &Phase| {
        p.sessions_peak().unwrap_or(
            a.consumers as u64
                + if p.tally.is_some() {
                    a.stalled as u64 + 1
                } else {
                    0
                },
        )
    };
    let bound_kib = |p: &Phase| rss_bound_bytes(base, per_session, sessions_of(p)) / 1024;
    // The bound as the frame pool and batch buffers alone would have it (no index).
    let no_index = SessionMemory {
        index: 0,
        ..per_session
    };
    let bound_no_index_kib = |p: &Phase| rss_bound_bytes(base, no_index, sessions_of(p)) / 1024;
    // What each session cost, measured: the peak above the idle agent, per session.
    let per_session_kib =
        |p: &Phase| p.hwm_kib.saturating_sub(p.idle_rss_kib) as f64 / sessions_of(p).max(1) as f64;
    let threads_bound = |p: &Phase| thread_bound(p.idle_threads, sessions_of(p), max_handshakes);
    let baseline = phases.iter().find(|p| p.name == "baseline");

    let json_phase = |p: &Phase| {
        let mbps = p.per_consumer_mbps();
        json!({
            "phase": p.name, "window_s": p.window_s, "payload_bytes": p.bytes.iter().sum::<u64>(),
            "gb_per_s": p.gbps(), "jain": p.jain(),
            "per_consumer_bytes": p.bytes, "per_consumer_batches": p.batches,
            "per_consumer_mb_per_s": mbps, "per_consumer_max_gap_ms": p.max_gap_ms,
            "errors": p.errors.len(), "error_messages": p.errors.iter().take(50)
                .map(|(i, m)| json!({"consumer": i, "message": m})).collect::<Vec<_>>(),
            "sessions_opened_by_consumers": p.sessions_opened,
            "batches_verified": p.checked, "batches_mismatched": p.mismatched,
            "consumers_never_started": p.not_started,
            "agent": {
                "idle_rss_kib": p.idle_rss_kib, "idle_threads": p.idle_threads,
                "rss_max_kib": p.rss_max_kib(), "vm_hwm_kib": p.hwm_kib,
                "rss_bound_kib": bound_kib(p), "rss_bound_without_index_kib": bound_no_index_kib(p),
                "measured_kib_per_session": per_session_kib(p), "threads_max": p.threads_max(),
                "threads_bound": threads_bound(p), "threads_at_peak_by_name": p.census,
                "end_rss_kib": p.end_rss_kib, "end_threads": p.end_threads,
                "end_sessions_pending_streaming": p.end_sessions,
                "sessions_peak": p.sessions_peak(), "streaming_peak": p.streaming_peak(),
                "pending_peak": p.pending_peak(),
                "cpu_s_in_window": p.agent_cpu_s, "died": p.died,
                "exit_after_sigterm": p.exit.map(|(c, d)| json!({"code": c, "seconds": d.as_secs_f64()})),
                "refusals": p.refusals, "session_ends": p.session_ends,
                "log_warn_lines": p.log_warn, "log_error_lines": p.log_error,
            },
            "bench_process_cpu_s_in_window": p.bench_cpu_s,
            "load_before": p.load_before, "load_after": p.load_after,
            "hostile": p.tally,
            "samples": p.samples,
        })
    };
    {
        let out = json!({
            "bench": "load", "dataset": ds.local(), "dataset_bytes_on_disk": ds.bytes_on_disk(),
            "plan": a.plan.describe(), "consumers": a.consumers, "world": a.consumers,
            "duration_s": duration, "warmup_s": warmup, "dquant": dquant.display().to_string(),
            "agent_config": config_text, "prefetch_frames": a.prefetch_frames,
            "max_sessions": a.max_sessions, "base_mib": a.base_mib,
            "per_session_bytes": {"prefetch": per_session.prefetch, "batch": per_session.batch,
                                  "index": per_session.index, "total": per_session.total()},
            "max_handshakes": max_handshakes,
            "rss_bound_at_max_sessions_kib": rss_bound_bytes(base, per_session, a.max_sessions as u64) / 1024,
            "threads_bound_at_max_sessions": thread_bound(phases[0].idle_threads, a.max_sessions as u64, max_handshakes),
            "nproc": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            "phases": phases.iter().map(json_phase).collect::<Vec<_>>(),
        });
        if a.out.emit(&out)? {
            return Ok(());
        }
    }

    println!(
        "{}; plan: {}, shuffled, world {} (consumer i = rank i), 1000 epochs",
        ds.describe(),
        a.plan.describe(),
        a.consumers
    );
    println!(
        "agent: {} serve, prefetch_frames {}, max_sessions {}, a fresh agent per phase; \
         window {duration} s after all consumers streamed + {warmup} s",
        dquant.display(),
        a.prefetch_frames,
        a.max_sessions
    );
    println!(
        "memory bound = {} MiB + {} MiB index (shared) + sessions × ({} MiB prefetch + {} MiB batch buffers) = {} MiB + sessions × {} MiB",
        a.base_mib,
        mib(per_session.index / 1024),
        mib(per_session.prefetch / 1024),
        mib(per_session.batch / 1024),
        a.base_mib + per_session.index / (1 << 20),
        mib(per_session.total() / 1024),
    );
    println!(
        "thread bound = idle threads + 2 × sessions + {max_handshakes} (max_handshakes); \
         sessions = the most the agent's metrics showed at once\n"
    );
    let mut cols = vec!["measure"];
    cols.extend(phases.iter().map(|p| p.name));
    let ratio = baseline.is_some() && phases.len() == 2;
    if ratio {
        cols.push("hostile / baseline");
    }
    let mut t = Table::new(&cols);
    let mut row = |what: &str, vals: Vec<String>, r: Option<f64>| {
        let mut cells = vec![what.to_string()];
        cells.extend(vals);
        if ratio {
            cells.push(r.map_or("".into(), |r| f(r, 3)));
        }
        t.row(cells);
    };
    let each = |g: &dyn Fn(&Phase) -> String| phases.iter().map(g).collect::<Vec<_>>();
    let rat =
        |g: &dyn Fn(&Phase) -> f64| (phases.len() == 2).then(|| g(&phases[1]) / g(&phases[0]));
    row(
        "payload throughput, all consumers, GB/s",
        each(&|p| f(p.gbps(), 3)),
        rat(&|p| p.gbps()),
    );
    row(
        "per consumer MB/s: mean",
        each(&|p| f(summary(&p.per_consumer_mbps()).0, 2)),
        rat(&|p| summary(&p.per_consumer_mbps()).0),
    );
    row(
        "per consumer MB/s: min / max",
        each(&|p| {
            let (_, _, lo, hi) = summary(&p.per_consumer_mbps());
            format!("{} / {}", f(lo, 2), f(hi, 2))
        }),
        None,
    );
    row(
        "Jain's fairness index (target >= 0.95)",
        each(&|p| f(p.jain(), 4)),
        rat(&|p| p.jain()),
    );
    row(
        "longest wait for a batch, ms",
        each(&|p| f(p.max_gap(), 1)),
        rat(&|p| p.max_gap()),
    );
    row(
        "errors seen by well-behaved consumers (target 0)",
        each(&|p| p.errors.len().to_string()),
        None,
    );
    row(
        "batches checked vs in-process / differing",
        each(&|p| format!("{} / {}", p.checked, p.mismatched)),
        None,
    );
    row(
        "agent VmRSS idle / max sampled, MiB",
        each(&|p| format!("{} / {}", mib(p.idle_rss_kib), mib(p.rss_max_kib()))),
        rat(&|p| p.rss_max_kib() as f64),
    );
    row(
        "agent VmHWM (peak), MiB",
        each(&|p| mib(p.hwm_kib)),
        rat(&|p| p.hwm_kib as f64),
    );
    row(
        "agent sessions peak (streaming / pending)",
        each(&|p| match (p.streaming_peak(), p.pending_peak()) {
            (Some(s), Some(q)) => format!("{s} / {q}"),
            _ => "-".into(),
        }),
        None,
    );
    row(
        "memory bound for those sessions, MiB",
        each(&|p| mib(bound_kib(p))),
        None,
    );
    row(
        "VmHWM / bound",
        each(&|p| f(p.hwm_kib as f64 / bound_kib(p) as f64, 3)),
        None,
    );
    row(
        "VmHWM / bound without the index (frames + batch only)",
        each(&|p| f(p.hwm_kib as f64 / bound_no_index_kib(p) as f64, 3)),
        None,
    );
    row(
        "measured: (VmHWM - idle) / sessions, MiB",
        each(&|p| f(per_session_kib(p) / 1024.0, 1)),
        None,
    );
    row(
        "agent threads idle / max / after",
        each(&|p| {
            format!(
                "{} / {} / {}",
                p.idle_threads,
                p.threads_max(),
                p.end_threads
            )
        }),
        rat(&|p| p.threads_max() as f64),
    );
    row(
        "thread bound for those sessions",
        each(&|p| threads_bound(p).to_string()),
        None,
    );
    row(
        "agent CPU in window, cores",
        each(&|p| f(p.agent_cpu_s / p.window_s, 2)),
        rat(&|p| p.agent_cpu_s),
    );
    row(
        "consumer process CPU in window, cores",
        each(&|p| f(p.bench_cpu_s / p.window_s, 2)),
        rat(&|p| p.bench_cpu_s),
    );
    row(
        "agent exit after SIGTERM",
        each(&|p| match p.exit {
            Some((c, d)) => format!("{c} in {:.2} s", d.as_secs_f64()),
            None => "killed (no exit in 20 s)".into(),
        }),
        None,
    );
    row(
        "load average before / after",
        each(&|p| format!("{} / {}", p.load_before, p.load_after)),
        None,
    );
    t.print();

    for p in phases {
        println!();
        if let Some(tl) = &p.tally {
            println!(
                "{}: killed clients: {} mid-stream, {} before their first batch; stalled clients: {} stalled \
                 (read {} batches, then held the connection), {} never got that far; garbage: {} connections",
                p.name,
                tl.killed_mid_stream,
                tl.killed_before_first_batch,
                tl.stalled,
                a.stall_after,
                tl.stalled_not_reached,
                tl.garbage_connections
            );
            for (k, n) in &tl.garbage {
                println!("  {n:>5} × {k}");
            }
        }
        println!(
            "{}: agent refusals {:?}; session ends {:?}; sessions at the end (pending, streaming) {:?}; \
             log: {} WARN, {} ERROR lines",
            p.name,
            p.refusals,
            p.session_ends,
            p.end_sessions,
            p.log_warn,
            p.log_error.len()
        );
        println!("{}: threads at the peak by name: {:?}", p.name, p.census);
        if p.died {
            println!("{}: THE AGENT DIED during the window", p.name);
        }
        if p.not_started > 0 {
            println!(
                "{}: {} consumers had no batch 60 s after the start",
                p.name, p.not_started
            );
        }
        for (i, m) in p.errors.iter().take(10) {
            println!("{}: consumer {i}: {m}", p.name);
        }
        if p.errors.len() > 10 {
            println!("{}: ... {} errors in all", p.name, p.errors.len());
        }
        for l in p.log_error.iter().take(5) {
            println!("{}: agent log: {l}", p.name);
        }
    }
    let last = phases.last().context("no phase ran")?;
    println!(
        "\n{}: errors {} (target 0): {}; Jain {} (target >= 0.95): {}; VmHWM {} MiB <= bound {} MiB: {}; \
         threads max {} <= bound {}: {}",
        last.name,
        last.errors.len(),
        if last.errors.is_empty() { "met" } else { "MISSED" },
        f(last.jain(), 4),
        if last.jain() >= 0.95 { "met" } else { "MISSED" },
        mib(last.hwm_kib),
        mib(bound_kib(last)),
        if last.hwm_kib <= bound_kib(last) { "yes" } else { "NO" },
        last.threads_max(),
        threads_bound(last),
        if last.threads_max() <= threads_bound(last) { "yes" } else { "NO" },
    );
    Ok(())
}
