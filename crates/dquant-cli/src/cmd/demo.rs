//! `dquant demo`: the main job end to end, in one command and in under a minute.
//!
//! 1. Tokenize two small real datasets from the crate sources on this machine: prose
//!    (`*.md`, r50k, 16-bit ids) and code (`*.rs`, o200k, 18-bit ids), as Megatron int32;
//!    store the prose again as a compressed block file.
//! 2. Start an agent in this process on loopback (and a Unix socket), serving the work dir as
//!    root `demo`.
//! 3. Stream a blended, packed, shuffled plan through it (the agent runs the plan) and
//!    measure: tokens/s, the bytes the agent put on the wire against int32, and the CPU the
//!    consuming thread spent.
//! 4. Run the same plan in-process (over the agent's token ranges, and over the local files)
//!    and through shared memory (the agent's Unix socket), and check the four streams are
//!    identical.
//! 5. Decode a sample of each source back to text with its tokenizer.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use dquant_agent::AgentConfig;
use dquant_client::{Offload, Reader, Tokens};
use dquant_corpus::{CorpusStats, Encoding};
use dquant_plan::{Cursor, OutputDType, Plan, Source};
use xxhash_rust::xxh3::Xxh3;

use crate::agentlog;
use crate::cmd::{convert, corpus, serve, verify};
use crate::util::{self, InputOpts, OutputOpts};

const EXAMPLES: &str = "\
Examples:
  cargo run --release -- demo                  # about 4 MB of prose + 4 MB of code
  dquant demo --mb 16 --dir /tmp/dquant-demo   # bigger, and keep the datasets
  dquant serve --root demo=/tmp/dquant-demo    # then serve them from an agent of your own";

/// Build a small real corpus (prose and code from this machine's crate sources), serve it from
/// an agent started in this process, and stream a blended, packed, shuffled plan through it:
/// report throughput, bytes on the wire against int32, and the consumer's CPU time; check the
/// offloaded stream against the same plan run in-process; decode a sample back to text.
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// Keep the datasets in this directory (default: a temporary directory, removed at the end).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// MB of source text to tokenize per dataset (prose and code).
    #[arg(long, default_value_t = 4, value_name = "MB")]
    pub mb: u64,
    /// Directory of source files (default: $CARGO_HOME/registry/src).
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// No progress bars.
    #[arg(long, short)]
    pub quiet: bool,
}

/// The plan's knobs.
const SEQ_LEN: u32 = 2048;
const BATCH: u32 = 8;
const SEED: u64 = 1;
/// The plan's default wire codec, named: narrowed ids in one zstd stream a session shares.
const WIRE: &str = "transport";
const TEXT_WEIGHT: f64 = 0.7;
const CODE_WEIGHT: f64 = 0.3;
/// Blocks of the prose's block file. Shuffled samples land in random blocks, and a reader
/// decodes a sample's whole block (it keeps only the last one): 64 KiB blocks keep that cheap
/// (measured on this corpus: 28 M tokens/s in-process, against 4 M with the 1 MiB default).
const TEXT_BLOCK_BYTES: usize = 64 << 10;

/// One demo dataset.
struct Part {
    label: &'static str,
    encoding: Encoding,
    ext: &'static str,
    /// Megatron int32 prefix.
    int32: PathBuf,
    /// What the plan reads (relative to the work dir).
    served: String,
}

pub fn run(a: &Args) -> Result<()> {
    let started = Instant::now();
    let (dir, tmp) = work_dir(a)?;
    let parts = make_corpus(a, &dir)?;
    // The agent's Unix socket for the shared-memory leg, in its own short temp dir: socket
    // paths are limited to 108 bytes.
    let socket_dir = tempfile::tempdir().context("a temporary directory for the agent's socket")?;
    let socket = socket_dir.path().join("agent.sock");
    let agent = start_agent(&dir, &socket)?;
    let uri = agent.uri();
    let plan = plan_over(|p| format!("demo/{}", p.served), &parts);
    let local_plan = plan_over(|p| dir.join(&p.served).display().to_string(), &parts);
    let mut local = Reader::local(&local_plan, Cursor::START)?;
    let picks = first_pick_of_each(&local, parts.len())?;
    println!(
        "3. plan: {:.0}% demo/{} + {:.0}% demo/{}, seq_len {SEQ_LEN}, batch {BATCH}, shuffled (seed {SEED}), output i32, wire {WIRE}",
        TEXT_WEIGHT * 100.0,
        parts[0].served,
        CODE_WEIGHT * 100.0,
        parts[1].served,
    );
    let streamed = stream_offloaded(&uri, &plan, &picks)?;
    streamed.report();
    check_parity(&uri, &plan, &mut local, &socket, &streamed)?;
    show_samples(&parts, &picks, &streamed.samples)?;
    agent.shutdown();
    println!(
        "\ndone in {:.1} s. datasets: {}{}",
        started.elapsed().as_secs_f64(),
        dir.display(),
        if tmp.is_none() {
            format!("\nnext: dquant serve --root demo={}", dir.display())
        } else {
            " (removed; keep them with --dir DIR)".into()
        }
    );
    Ok(())
}

/// The directory the datasets go in: `--dir`, kept, or a temporary one removed when the
/// returned guard drops.
fn work_dir(a: &Args) -> Result<(PathBuf, Option<tempfile::TempDir>)> {
    if let Some(d) = &a.dir {
        std::fs::create_dir_all(d).with_context(|| format!("{}", d.display()))?;
        return Ok((d.clone(), None));
    }
    let tmp = tempfile::Builder::new()
        .prefix("dquant-demo-")
        .tempdir()
        .context("creating a temporary directory")?;
    Ok((tmp.path().to_path_buf(), Some(tmp)))
}

/// Step 1: the two datasets tokenized as Megatron int32, the prose stored again as a block
/// file.
fn make_corpus(a: &Args, dir: &Path) -> Result<[Part; 2]> {
    let src_root = a
        .root
        .clone()
        .unwrap_or_else(dquant_corpus::default_source_root);
    println!(
        "1. corpus: {} MB of prose and {} MB of code from {}",
        a.mb,
        a.mb,
        src_root.display()
    );
    let parts = [
        Part {
            label: "text",
            encoding: Encoding::R50k,
            ext: "md",
            int32: dir.join("text_int32"),
            served: "text.dqb".into(),
        },
        Part {
            label: "code",
            encoding: Encoding::O200k,
            ext: "rs",
            int32: dir.join("code_int32"),
            served: "code_int32".into(),
        },
    ];
    for p in &parts {
        let t = Instant::now();
        let s = tokenize(a, p)?;
        println!(
            "   {}  {:<6} *.{:<3} {:>5} files {:>6.1} MB -> {:>10} tokens, max id {:>6} ({} bits), {:.1} s  {}",
            p.label,
            p.encoding.name(),
            p.ext,
            util::thousands(s.documents),
            s.source_bytes as f64 / 1e6,
            util::thousands(s.tokens),
            s.max_token,
            32 - s.max_token.leading_zeros(),
            t.elapsed().as_secs_f64(),
            file_name(&p.int32),
        );
    }
    let text_dqb = dir.join(&parts[0].served);
    let (bytes, tokens) = to_block_file(&parts[0].int32, &text_dqb)?;
    println!(
        "   text   stored again as {} (u16+zstd:3, 64 KiB blocks): {} bytes, {:.2}x smaller than int32; verified identical",
        file_name(&text_dqb),
        util::thousands(bytes),
        (tokens * 4) as f64 / bytes.max(1) as f64
    );
    Ok(parts)
}

/// Step 2: an agent in this process serving `dir` as root `demo`, on loopback and `socket`.
fn start_agent(dir: &Path, socket: &Path) -> Result<dquant_agent::AgentHandle> {
    let config = AgentConfig {
        listen: "127.0.0.1:0".parse().expect("a constant address parses"),
        data_listen: Some("127.0.0.1:0".parse().expect("a constant address parses")),
        socket: Some(socket.to_path_buf()),
        roots: BTreeMap::from([("demo".to_string(), dir.to_path_buf())]),
        ..AgentConfig::default()
    };
    let agent = serve::start(config)?;
    println!(
        "2. agent {} (data plane {}, Unix socket {}), serving root demo = {}",
        agent.uri(),
        agent.data_addr(),
        socket.display(),
        dir.display()
    );
    Ok(agent)
}

/// The first sample each source gives, as (source, global sample): the schedule says which
/// source each sample came from, and a local reader has it.
fn first_pick_of_each(local: &Reader, sources: usize) -> Result<Vec<(usize, u64)>> {
    let schedule = local.schedule().context("a local reader has a schedule")?;
    let mut picks: Vec<(usize, u64)> = Vec::new();
    for i in 0..schedule.total_samples() {
        let Some(s) = schedule.sample(i) else { break };
        if !picks.iter().any(|(d, _)| *d == s.source) {
            picks.push((s.source, i));
        }
        if picks.len() == sources {
            break;
        }
    }
    Ok(picks)
}

/// What step 3's offloaded stream gave: its checksum, sizes and times, and the picked samples.
struct Streamed {
    hash: u64,
    samples: Vec<Vec<u32>>,
    batches: u64,
    n_samples: u64,
    n_tokens: u64,
    wall: f64,
    first_batch: Option<f64>,
    cpu: Option<f64>,
}

/// Step 3: the plan streamed from the agent, which runs it; the picked samples kept.
fn stream_offloaded(uri: &str, plan: &Plan, picks: &[(usize, u64)]) -> Result<Streamed> {
    let sample_len = SEQ_LEN as usize + 1;
    let mut samples: Vec<Vec<u32>> = vec![Vec::new(); picks.len()];
    let cpu0 = thread_cpu();
    let t0 = Instant::now();
    let mut r = dquant_client::open(uri, plan, Offload::Yes)?;
    ensure!(
        r.is_offloaded(),
        "the demo's stream should run on the agent"
    );
    let mut h = Xxh3::new();
    let (mut batches, mut n_samples, mut n_tokens) = (0u64, 0u64, 0u64);
    let mut first_batch = None;
    while let Some(b) = r.next_batch()? {
        first_batch.get_or_insert_with(|| t0.elapsed().as_secs_f64());
        h.update(b.tokens.as_bytes());
        let Tokens::I32(t) = b.tokens else {
            bail!("the plan asked for i32 batches");
        };
        let first = b.index * u64::from(BATCH);
        for (k, (_, g)) in picks.iter().enumerate() {
            if (first..first + b.samples as u64).contains(g) {
                let row = (g - first) as usize;
                samples[k] = t[row * sample_len..(row + 1) * sample_len]
                    .iter()
                    .map(|&x| x as u32)
                    .collect();
            }
        }
        batches += 1;
        n_samples += b.samples as u64;
        n_tokens += b.tokens.len() as u64;
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = thread_cpu().zip(cpu0).map(|(b, a)| b - a);
    Ok(Streamed {
        hash: h.digest(),
        samples,
        batches,
        n_samples,
        n_tokens,
        wall,
        first_batch,
        cpu,
    })
}

impl Streamed {
    /// Step 3's report: throughput, the agent's wire bytes against int32, the consumer's CPU.
    fn report(&self) {
        let (wall, n_tokens) = (self.wall, self.n_tokens);
        println!(
            "   streamed {} batches, {} samples, {} tokens in {wall:.3} s: {:.1} M tokens/s (first batch after {:.0} ms, open included)",
            self.batches,
            util::thousands(self.n_samples),
            util::thousands(n_tokens),
            n_tokens as f64 / wall.max(1e-9) / 1e6,
            self.first_batch.unwrap_or(wall) * 1e3
        );
        let raw = n_tokens * 4;
        match agentlog::wait_ended("plan", 0, Duration::from_secs(5)) {
            Some(s) => println!(
                "   wire: {} bytes ({:.2} bytes/token), against {} bytes as int32: {:.2}x fewer (the agent's count)",
                util::thousands(s.wire_bytes),
                s.wire_bytes as f64 / s.tokens.max(1) as f64,
                util::thousands(raw),
                raw as f64 / s.wire_bytes.max(1) as f64
            ),
            None => println!("   wire: the agent did not report the session's bytes"),
        }
        match self.cpu {
            Some(cpu) => println!(
                "   consumer thread: {cpu:.3} s CPU over {wall:.3} s wall ({:.0}%): the wire decode and a checksum; the plan ran on the agent",
                cpu / wall.max(1e-9) * 100.0
            ),
            None => println!("   consumer thread CPU time: not measurable on this platform"),
        }
    }
}

/// Step 4: the same plan in-process (over the agent's token ranges and over the local files)
/// and through shared memory gives the offloaded stream's bytes.
fn check_parity(
    uri: &str,
    plan: &Plan,
    local: &mut Reader,
    socket: &Path,
    streamed: &Streamed,
) -> Result<()> {
    let offloaded = streamed.hash;
    let mut in_process = dquant_client::open(uri, plan, Offload::No)?;
    let over_ranges = checksum(&mut in_process)?;
    drop(in_process);
    let over_files = checksum(local)?;
    let ranges_wire: u64 = {
        // The in-process run pulled token ranges (auto+lz4) from two source sessions.
        let a = agentlog::wait_ended("source", 0, Duration::from_secs(5));
        let b = agentlog::wait_ended("source", 1, Duration::from_secs(5));
        a.zip(b).map_or(0, |(a, b)| a.wire_bytes + b.wire_bytes)
    };
    ensure!(
        offloaded == over_ranges && offloaded == over_files,
        "streams differ: offloaded xxh3:{offloaded:016x}, in-process over the agent's ranges xxh3:{over_ranges:016x}, in-process over local files xxh3:{over_files:016x}"
    );
    // The same plan through shared memory: the agent writes i32 batches into a ring this
    // process created, and they are read where they land.
    let cpu0 = thread_cpu();
    let t0 = Instant::now();
    let mut shm = dquant_client::open(&socket.display().to_string(), plan, Offload::Yes)?;
    ensure!(
        shm.transport() == Some(dquant_client::Transport::SHM),
        "the socket path should select shared memory"
    );
    let over_shm = checksum(&mut shm)?;
    drop(shm);
    let shm_wall = t0.elapsed().as_secs_f64();
    let shm_cpu = thread_cpu().zip(cpu0).map(|(b, a)| b - a);
    ensure!(
        over_shm == offloaded,
        "streams differ: over TCP xxh3:{offloaded:016x}, over shared memory xxh3:{over_shm:016x}"
    );
    println!("4. parity: stream xxh3:{offloaded:016x}");
    println!("   offload == local: identical (agent ran the plan / this process ran it over the agent's token ranges / over the local files)");
    if ranges_wire > 0 {
        println!(
            "   (run here over the agent's token ranges, the same stream took {} wire bytes: one auto+lz4 range per sample)",
            util::thousands(ranges_wire)
        );
    }
    println!(
        "   shared memory == TCP: identical (agent at {}: batches written into this process's ring, {:.1} M tokens/s{})",
        socket.display(),
        streamed.n_tokens as f64 / shm_wall.max(1e-9) / 1e6,
        shm_cpu.map_or(String::new(), |c| format!(
            ", consumer thread {c:.3} s CPU with a checksum of every batch"
        ))
    );
    Ok(())
}

/// Step 5: a sample of each source, decoded with its tokenizer.
fn show_samples(parts: &[Part], picks: &[(usize, u64)], samples: &[Vec<u32>]) -> Result<()> {
    println!("5. samples, decoded with their source's tokenizer:");
    for ((d, g), tokens) in picks.iter().zip(samples) {
        let p = &parts[*d];
        let bytes = p
            .encoding
            .tokenizer()?
            .decode_bytes(tokens)
            .map_err(|e| anyhow::anyhow!("decoding sample {g} with {}: {e:?}", p.encoding))?;
        println!(
            "   sample {g} ({}, {}, {} tokens):",
            p.label,
            p.encoding.name(),
            tokens.len()
        );
        for line in excerpt(&String::from_utf8_lossy(&bytes), 300, 8) {
            println!("   | {line}");
        }
    }
    Ok(())
}

fn plan_over(uri: impl Fn(&Part) -> String, parts: &[Part]) -> Plan {
    let mut plan = Plan::new(
        vec![
            Source::new(uri(&parts[0])).weight(TEXT_WEIGHT),
            Source::new(uri(&parts[1])).weight(CODE_WEIGHT),
        ],
        SEQ_LEN,
        BATCH,
    );
    plan.seed = SEED;
    plan.shuffle = true;
    plan.output = OutputDType::I32;
    plan.wire_codec = WIRE.into();
    plan
}

fn tokenize(a: &Args, p: &Part) -> Result<CorpusStats> {
    corpus::real(&corpus::RealArgs {
        out: p.int32.clone(),
        encoding: p.encoding,
        root: a.root.clone(),
        max_mb: a.mb,
        ext: vec![p.ext.into()],
        output: OutputOpts {
            json: false,
            quiet: a.quiet,
        },
    })
    .with_context(|| format!("tokenizing *.{} for the {} dataset", p.ext, p.label))
}

/// Converts `src` to a `u16+zstd:3` block file at `dst` and verifies it; (bytes, tokens).
fn to_block_file(src: &Path, dst: &Path) -> Result<(u64, u64)> {
    let args = convert::Args {
        src: src.to_path_buf(),
        dst: dst.to_path_buf(),
        codec: "u16+zstd:3".into(),
        preset: None,
        zstd: None,
        lz4: false,
        format: None,
        vocab: None,
        block_size: TEXT_BLOCK_BYTES,
        force: true,
        threads: None,
        input: InputOpts::default(),
        output: OutputOpts {
            json: false,
            quiet: true,
        },
    };
    let (ds, _, rep, _) = convert::convert(&args)?;
    let out = util::open(dst, &InputOpts::default())?;
    if let Some(d) = verify::compare(&ds, &out, true)? {
        bail!("{} differs from {}: {d}", dst.display(), src.display());
    }
    Ok((rep.bytes, rep.tokens))
}

/// XXH3 of a reader's whole stream.
fn checksum(r: &mut Reader) -> Result<u64> {
    let mut h = Xxh3::new();
    while let Some(b) = r.next_batch()? {
        h.update(b.tokens.as_bytes());
    }
    Ok(h.digest())
}

/// CPU seconds (user + system) of the calling thread.
#[cfg(target_os = "linux")]
fn thread_cpu() -> Option<f64> {
    // SAFETY: getrusage writes one `rusage` into the zeroed struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    (rc == 0).then(|| {
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        tv(ru.ru_utime) + tv(ru.ru_stime)
    })
}

#[cfg(not(target_os = "linux"))]
fn thread_cpu() -> Option<f64> {
    None
}

/// Up to `chars` characters of `text` in at most `lines` lines, control characters shown as
/// spaces, with `…` where it was cut.
fn excerpt(text: &str, chars: usize, lines: usize) -> Vec<String> {
    let cut: String = text.chars().take(chars).collect();
    let more = text.chars().nth(chars).is_some();
    let mut out: Vec<String> = cut
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take(lines)
        .map(|l| {
            l.replace('\t', "    ")
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect::<String>()
                .trim_end()
                .to_string()
        })
        .collect();
    if more || cut.lines().filter(|l| !l.trim().is_empty()).count() > lines {
        if let Some(last) = out.last_mut() {
            last.push('…');
        }
    }
    out
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.display().to_string())
}
