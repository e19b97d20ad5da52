//! Fan-out: N readers of one plan as one shared stream, against N separate sessions of it and
//! against one lone reader, all in the same run.
//!
//! For each, the agent process's CPU time (its CPU-time clock) and the bytes it read from
//! storage by syscalls (`rchar` in `/proc/PID/io`), and each reader's throughput. An agent
//! that narrows an int32 dataset from the map it keeps with it (its default within its map
//! budget) reads it by no syscall, so `rchar` counts nothing there and the bytes ratio is
//! left out (`null`). The targets: the shared stream's agent CPU and bytes
//! read at most 1.2× the lone reader's, each subscriber at least 0.8× the lone reader's
//! throughput.
//!
//! Over TCP each subscriber needs one socket send of the stream, and on loopback that send
//! (the kernel's copy and TCP path) can cost more than making the batch did: the shared
//! stream's CPU then cannot come near the lone reader's. `--bare-sends` measures what such
//! sends cost alone, with nothing made, so the stream's CPU is also set against its floor:
//! the lone reader's plus N - 1 more sends.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dquant_client::{AgentUri, Credentials, Reader, Share};
use dquant_plan::{Cursor, Plan};
use serde_json::json;

use crate::procs::{self, AgentProc, SendMode};
use crate::report::{f, median, Table};
use crate::PlanOpts;

const EXAMPLES: &str = "\
Examples:
  dquant-offload-bench share /data/zipf256m_int32 --readers 8 --samples 16384 --runs 3
  dquant-offload-bench share /data/zipf256m_int32 --transport shm --json > share.json";

/// N readers of one plan: one shared stream (`share`) against N sessions and one lone reader.
///
/// Readers run as threads of this process, the agent in a child process. Each scenario
/// streams the same plan (--samples samples) to every reader; the dataset is read once
/// first so the page cache serves every scenario alike.
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    #[command(flatten)]
    pub plan: PlanOpts,
    /// Readers of the shared stream, and separate sessions to compare with.
    #[arg(long, default_value_t = 8)]
    pub readers: usize,
    /// How readers reach the agent.
    #[arg(long, value_parser = ["tcp", "shm"], default_value = "tcp")]
    pub transport: String,
    /// Batches the shared stream keeps (the agent's `share_window_batches`; default: the
    /// agent's).
    #[arg(long)]
    pub window: Option<usize>,
    /// Rounds of the three scenarios.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Also measure, each round, what the kernel's TCP sends of the lone reader's bytes cost
    /// alone: one sender, and one per reader ([`bare_sends`]). For a wire codec that sends
    /// the tokens as they are delivered (u16 to u16): then each subscriber's share of the
    /// agent's CPU is compared with one such send.
    #[arg(long)]
    pub bare_sends: bool,
    /// An argument for the agent process (this binary's `agent`), after the bench's own
    /// (repeatable): e.g. `--agent-arg=--map-budget --agent-arg=0` has it read every token by
    /// pread, as agents did before they kept maps.
    #[arg(long, allow_hyphen_values = true)]
    pub agent_arg: Vec<String>,
    #[command(flatten)]
    pub out: crate::report::JsonOpts,
}

/// What one scenario cost the agent, and what each reader got.
struct Measured {
    agent_cpu: f64,
    /// When the scenario ran, in seconds on CLOCK_MONOTONIC ([`procs::monotonic_s`]).
    window: (f64, f64),
    /// Bytes every reader together received.
    delivered: u64,
    read_bytes: u64,
    /// Each reader's bytes per second.
    rates: Vec<f64>,
    /// Each reader's stream checksum.
    sums: Vec<u64>,
    /// Readers that read the stream's shared ring (shared-memory subscribers that joined it).
    ring_readers: usize,
}

#[derive(Clone, Copy, PartialEq)]
enum How {
    Lone,
    Sessions,
    Shared,
}

impl How {
    /// Its name in the JSON report (a summary's key, a window's `scenario`).
    fn key(self) -> &'static str {
        match self {
            How::Lone => "lone",
            How::Sessions => "sessions",
            How::Shared => "shared",
        }
    }
}

/// The agent's bytes read from storage so far (`rchar`).
fn rchar(pid: u32) -> Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/io"))?;
    s.lines()
        .find_map(|l| l.strip_prefix("rchar:"))
        .context("/proc/PID/io has no rchar")?
        .trim()
        .parse()
        .context("rchar")
}

/// Reads `r` to the end: (bytes, seconds, checksum, whether it read a shared ring).
fn drain(mut r: Reader, t0: Instant) -> Result<(u64, f64, u64, bool)> {
    let shared_ring = r.reads_shared_ring();
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut n = 0u64;
    while let Some(b) = r.next_batch()? {
        let bytes = b.tokens.as_bytes();
        h.update(bytes);
        n += bytes.len() as u64;
    }
    Ok((n, t0.elapsed().as_secs_f64(), h.digest(), shared_ring))
}

/// Opens reader `i` of scenario `how`.
fn open(agent: &AgentUri, plan: &Plan, how: How, i: usize, n: usize, run: usize) -> Result<Reader> {
    let creds = Credentials::default();
    let name = format!("bench/run{run}");
    Ok(match (how, i) {
        (How::Shared, 0) => {
            let share = Share {
                name,
                group: n as u32,
            };
            Reader::remote_shared(agent, plan, Cursor::START, &share, &creds)?
        }
        (How::Shared, _) => {
            // The stream exists once reader 0 has opened it; it waits for all n.
            let t = Instant::now();
            loop {
                match Reader::subscribe_with(agent, &name, Some(&Cursor::START), &creds) {
                    Ok(r) => break r,
                    Err(e) if e.is_not_found() && t.elapsed() < Duration::from_secs(10) => {
                        std::thread::sleep(Duration::from_millis(2))
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        _ => Reader::remote_with(agent, plan, Cursor::START, &creds)?,
    })
}

fn measure(
    agent: &AgentProc,
    uri: &AgentUri,
    plan: &Plan,
    how: How,
    n: usize,
    run: usize,
) -> Result<Measured> {
    let pid = agent.pid();
    let (cpu0, rc0) = (procs::proc_cpu(pid)?, rchar(pid)?);
    let t0 = procs::monotonic_s();
    let start = Barrier::new(n);
    let results: Vec<Result<(u64, f64, u64, bool)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    let t0 = Instant::now();
                    let r = open(uri, plan, how, i, n, run)?;
                    drain(r, t0)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("reader thread"))
            .collect()
    });
    // The agent's threads finish their sessions' ends after the readers have every byte.
    std::thread::sleep(Duration::from_millis(200));
    let (cpu1, rc1) = (procs::proc_cpu(pid)?, rchar(pid)?);
    let mut m = Measured {
        agent_cpu: (cpu1 - cpu0).as_secs_f64(),
        window: (t0, procs::monotonic_s()),
        delivered: 0,
        read_bytes: rc1 - rc0,
        rates: Vec::new(),
        sums: Vec::new(),
        ring_readers: 0,
    };
    for r in results {
        let (bytes, secs, sum, shared_ring) = r?;
        m.ring_readers += usize::from(shared_ring);
        m.rates.push(bytes as f64 / secs.max(1e-9));
        m.delivered += bytes;
        m.sums.push(sum);
    }
    Ok(m)
}

/// CPU seconds that `n` senders writing `bytes` each over loopback TCP take, each a process
/// of its own (this binary's `send --mode raw`: 1 MiB writes, no framing, no checksum) read
/// by a thread here: the kernel's part of delivering a stream to `n` TCP readers, with
/// nothing made. A TCP subscriber of a shared stream costs the agent one such send.
fn bare_sends(n: usize, bytes: u64) -> Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let children = (0..n)
        .map(|_| procs::spawn_sender(addr, bytes, 1 << 20, SendMode::Raw))
        .collect::<Result<Vec<_>>>()?;
    let socks = (0..n)
        .map(|_| listener.accept().map(|(s, _)| s))
        .collect::<std::io::Result<Vec<TcpStream>>>()?;
    let got = std::thread::scope(|s| {
        let readers: Vec<_> = socks
            .into_iter()
            .map(|sock| s.spawn(move || read_all(sock)))
            .collect();
        readers
            .into_iter()
            .map(|h| h.join().expect("bare reader thread"))
            .collect::<Result<Vec<u64>>>()
    })?;
    let mut cpu = 0.0;
    for c in children {
        let (ok, t) = procs::wait_with_cpu(c)?;
        if !ok {
            bail!("a bare sender failed");
        }
        cpu += t.as_secs_f64();
    }
    if let Some(short) = got.iter().find(|&&g| g != bytes) {
        bail!("a bare reader got {short} bytes of {bytes}");
    }
    Ok(cpu)
}

/// Reads `sock` to its end into one 1 MiB buffer; returns the bytes read.
fn read_all(mut sock: TcpStream) -> Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        match sock.read(&mut buf) {
            Ok(0) => return Ok(n),
            Ok(k) => n += k as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
}

pub fn run(a: &Args) -> Result<()> {
    let ds = a.plan.dataset()?;
    if a.readers < 2 || a.runs == 0 {
        bail!("--readers must be at least 2 and --runs at least 1");
    }
    procs::warm_file(&ds.bin())?;
    let mut flags: Vec<String> = match a.window {
        Some(w) => vec!["--share-window-batches".into(), w.to_string()],
        None => Vec::new(),
    };
    flags.extend(a.agent_arg.iter().cloned());
    let shm = a.transport == "shm";
    let agent = AgentProc::spawn_flags(&ds.dir, dquant_agent::DEFAULT_PREFETCH, shm, &flags)?;
    let target = match (&a.transport[..], &agent.socket) {
        ("shm", Some(s)) => s.display().to_string(),
        _ => agent.uri.clone(),
    };
    let uri = AgentUri::parse(&target).map_err(anyhow::Error::msg)?;
    let plan = a.plan.plan(&ds.remote(), true);
    let n = a.readers;
    let mut rows: Vec<(How, Measured)> = Vec::new();
    let mut bare: Vec<(f64, f64)> = Vec::new();
    for run in 0..a.runs {
        for how in [How::Lone, How::Sessions, How::Shared] {
            let k = if how == How::Lone { 1 } else { n };
            let m = measure(&agent, &uri, &plan, how, k, run)?;
            rows.push((how, m));
        }
        if a.bare_sends {
            let bytes = rows[rows.len() - 3].1.delivered;
            // A sender process's own start and end, left out of each send.
            let start = bare_sends(1, 0)?;
            let one = bare_sends(1, bytes)? - start;
            let all = bare_sends(n, bytes)? - start * n as f64;
            bare.push((one, all));
        }
    }
    let sum = rows[0].1.sums[0];
    if let Some((_, m)) = rows.iter().find(|(_, m)| m.sums.iter().any(|&s| s != sum)) {
        bail!(
            "a reader's stream differs from the lone reader's: {:x?} vs {sum:x}",
            m.sums
        );
    }
    report(a, &rows, &bare)
}

/// Each scenario's round: when it ran (CLOCK_MONOTONIC seconds, the agent's 200 ms to finish
/// included), the agent's CPU and the bytes delivered, so a profile taken across the run can
/// be cut by scenario (bench/profile).
fn windows(rows: &[(How, Measured)]) -> serde_json::Value {
    rows.iter()
        .map(|(h, m)| {
            json!({"scenario": h.key(), "t0": m.window.0, "t1": m.window.1,
                "agent_cpu_s": m.agent_cpu, "delivered_bytes": m.delivered})
        })
        .collect()
}

/// The bare sends' medians (one sender, `n` senders), and the shared stream's agent CPU
/// against its floor: the lone reader's plus what `n - 1` more sends of its bytes cost.
fn floor(bare: &[(f64, f64)], lone: f64, shared: f64) -> serde_json::Value {
    if bare.is_empty() {
        return serde_json::Value::Null;
    }
    let one = median(&bare.iter().map(|b| b.0).collect::<Vec<_>>());
    let all = median(&bare.iter().map(|b| b.1).collect::<Vec<_>>());
    let floor = lone + (all - one);
    json!({"one_cpu_s": one, "readers_cpu_s": all, "shared_floor_cpu_s": floor,
        "shared_cpu_vs_floor": shared / floor})
}

fn report(a: &Args, rows: &[(How, Measured)], bare: &[(f64, f64)]) -> Result<()> {
    let pick = |how: How, f: &dyn Fn(&Measured) -> f64| -> f64 {
        median(
            &rows
                .iter()
                .filter(|(h, _)| *h == how)
                .map(|(_, m)| f(m))
                .collect::<Vec<_>>(),
        )
    };
    let cpu = |h| pick(h, &|m| m.agent_cpu);
    let read = |h| pick(h, &|m| m.read_bytes as f64);
    let rate = |h| pick(h, &|m| median(&m.rates));
    let slowest = |h| pick(h, &|m| m.rates.iter().copied().fold(f64::MAX, f64::min));
    let (c1, r1, t1) = (cpu(How::Lone), read(How::Lone), rate(How::Lone));
    let mut t = Table::new(&[
        "scenario",
        "agent CPU-s",
        "× lone",
        "read MB",
        "× lone",
        "per-reader MB/s",
        "slowest",
        "× lone",
    ])
    .left(0);
    let n = a.readers;
    for (how, name) in [
        (How::Lone, "1 reader".to_string()),
        (How::Sessions, format!("{n} sessions")),
        (How::Shared, format!("{n} subscribers")),
    ] {
        t.row(vec![
            name,
            f(cpu(how), 2),
            f(cpu(how) / c1, 2),
            f(read(how) / 1e6, 0),
            f(read(how) / r1, 2),
            f(rate(how) / 1e6, 0),
            f(slowest(how) / 1e6, 0),
            f(slowest(how) / t1, 2),
        ]);
    }
    let v = json!({
        "plan": a.plan.describe(), "readers": n, "transport": a.transport, "runs": a.runs,
        "window": a.window,
        "load": procs::loadavg(),
        "lone": {"agent_cpu_s": c1, "read_bytes": r1, "bytes_per_s": t1},
        "sessions": {"agent_cpu_s": cpu(How::Sessions), "read_bytes": read(How::Sessions),
            "bytes_per_s": rate(How::Sessions), "slowest_bytes_per_s": slowest(How::Sessions)},
        "shared": {"agent_cpu_s": cpu(How::Shared), "read_bytes": read(How::Shared),
            "bytes_per_s": rate(How::Shared), "slowest_bytes_per_s": slowest(How::Shared),
            "shared_ring_readers": pick(How::Shared, &|m| m.ring_readers as f64)},
        "windows": windows(rows),
        "bare_sends": floor(bare, c1, cpu(How::Shared)),
        "targets": {
            "shared_cpu_vs_lone": cpu(How::Shared) / c1,
            "shared_read_vs_lone": read(How::Shared) / r1,
            "shared_slowest_rate_vs_lone": slowest(How::Shared) / t1,
        },
    });
    if a.out.emit(&v)? {
        return Ok(());
    }
    println!(
        "fan-out over {} ({}), {} readers, medians of {} runs; load {}",
        a.transport,
        a.plan.describe(),
        n,
        a.runs,
        procs::loadavg()
    );
    t.print();
    if let Some(f) = v["bare_sends"].as_object() {
        println!(
            "bare loopback sends of the lone reader's bytes: 1 sender {:.2} CPU-s, {n} senders \
             {:.2}; {n} subscribers' agent CPU {:.2}x the lone reader's plus {} more sends",
            f["one_cpu_s"].as_f64().unwrap_or(f64::NAN),
            f["readers_cpu_s"].as_f64().unwrap_or(f64::NAN),
            f["shared_cpu_vs_floor"].as_f64().unwrap_or(f64::NAN),
            n - 1
        );
    }
    if a.transport == "shm" {
        let k = pick(How::Shared, &|m| m.ring_readers as f64);
        println!("{k:.0} of the {n} subscribers read the stream's shared ring");
    }
    Ok(())
}
