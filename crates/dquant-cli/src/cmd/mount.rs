//! `dquant mount`: an agent's datasets as read-only Megatron files (FUSE).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dquant_mount::{Mount, MountOptions};

use crate::cmd::read::load_plan;
use crate::util;

const EXAMPLES: &str = "\
Examples:
  dquant mount dquant://127.0.0.1:7878 /mnt/dq &   # every dataset as ROOT/PATH.{bin,idx}
  ls -l /mnt/dq/corpus                             # web_int32.bin: uint16, half the bytes
  # Megatron reads it unchanged: --data-path /mnt/dq/corpus/web_int32
  dquant mount dquant://10.0.0.5:7878 /mnt/dq --dtype i32 --wire-codec auto+lz4 --daemon
  dquant mount dquant://127.0.0.1:7878 /mnt/dq --plan train=plan.toml  # plans/train.bin
  fusermount3 -u /mnt/dq                           # unmount (or Ctrl-C, SIGTERM)";

/// Mount an agent's datasets as read-only files: every dataset under every root appears as a
/// Megatron prefix, MOUNTPOINT/ROOT/PATH.bin + .idx, its tokens narrowed on the agent and
/// shown in --dtype. Unmodified trainers (Megatron-Core's IndexedDataset, np.memmap) read it
/// as local files. Plans given with --plan appear as MOUNTPOINT/plans/NAME.bin, their batches
/// back to back (the bytes `dquant read` writes), seekable by batch. The agent's token
/// (DQUANT_TOKEN) and TLS (DQUANT_TLS_CA) come from the environment, as for every client.
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// The agent: dquant://HOST:PORT, or its Unix socket path.
    pub agent: String,
    /// An existing, empty directory.
    pub mountpoint: PathBuf,
    /// The dtype of every .bin: auto (uint16 when the dataset's largest token fits, else
    /// int32; asks the agent for that token, a scan of the dataset the first time for
    /// formats that do not store it), u8, u16, i32 or i64.
    #[arg(long, default_value = "auto")]
    pub dtype: String,
    /// Bytes read ahead of a sequential reader, in whole 1 MiB blocks.
    #[arg(long, default_value = "8MiB", value_name = "BYTES", value_parser = util::parse_size)]
    pub readahead: usize,
    /// How token ranges travel from the agent: auto (narrowed), auto+lz4, auto+zstd:1, ...
    #[arg(long, default_value = "auto", value_name = "CODEC")]
    pub wire_codec: String,
    /// A plan as a file: NAME=PLAN.toml (or .json) adds MOUNTPOINT/plans/NAME.bin. Repeatable.
    #[arg(long = "plan", value_name = "NAME=PLAN")]
    pub plans: Vec<String>,
    /// Seconds a read waits on an agent that stopped answering before it fails with EIO.
    #[arg(long, default_value_t = 10, value_name = "SECS")]
    pub timeout: u64,
    /// Seconds listings and sizes are kept before the agent is asked again.
    #[arg(long, default_value_t = 1, value_name = "SECS")]
    pub ttl: u64,
    /// Threads answering the kernel's requests (more than one, so that a read waiting on the
    /// agent does not hold up lookups).
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub threads: usize,
    /// Let other users read the mount (FUSE allow_other).
    #[arg(long)]
    pub allow_other: bool,
    /// Return once mounted and serve from a background process (its log: --log).
    #[arg(long)]
    pub daemon: bool,
    /// With --daemon: where the background process logs (default: /tmp/dquant-mount-PID.log).
    #[arg(long, requires = "daemon", value_name = "FILE")]
    pub log: Option<PathBuf>,
}

fn plans(a: &Args) -> Result<Vec<(String, dquant_plan::Plan)>> {
    let mut out = Vec::new();
    for p in &a.plans {
        let Some((name, path)) = p.split_once('=') else {
            bail!("--plan {p}: expected NAME=PLAN.toml");
        };
        if name.is_empty() || name.contains('/') || out.iter().any(|(n, _)| n == name) {
            bail!("--plan {p}: NAME must be non-empty, without '/', and used once");
        }
        out.push((name.to_string(), load_plan(Path::new(path))?));
    }
    Ok(out)
}

fn options(a: &Args) -> Result<MountOptions> {
    Ok(MountOptions {
        dtype: dquant_mount::parse_dtype(&a.dtype)?,
        readahead: a.readahead as u64,
        wire_codec: a.wire_codec.clone(),
        ttl: Duration::from_secs(a.ttl),
        timeout: Duration::from_secs(a.timeout.max(1)),
        allow_other: a.allow_other,
        threads: a.threads.max(1),
    })
}

pub fn run(a: &Args) -> Result<()> {
    let opts = options(a)?;
    let plans = plans(a)?;
    if a.daemon {
        return daemon(a);
    }
    let mut m = Mount::new(&a.agent, &a.mountpoint, opts, plans)?;
    let mut unmounter = m.unmounter();
    let mountpoint = a.mountpoint.clone();
    ctrlc::set_handler(move || {
        if let Err(e) = unmounter.unmount() {
            tracing::warn!(error = %e, mountpoint = %mountpoint.display(), "unmount failed");
        }
    })
    .context("installing the SIGTERM/SIGINT handler")?;
    eprintln!(
        "mounted {} on {} (read-only); unmount with `fusermount3 -u {}` or Ctrl-C",
        a.agent,
        a.mountpoint.display(),
        a.mountpoint.display()
    );
    m.run().context("serving the mount")?;
    Ok(())
}

/// Starts this command again without --daemon, in its own session with its log in a file,
/// and returns once the mount is there (or says why the child ended before).
fn daemon(a: &Args) -> Result<()> {
    let log = a
        .log
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("/tmp/dquant-mount-{}.log", std::process::id())));
    let out = std::fs::File::create(&log).with_context(|| format!("{}", log.display()))?;
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|s| s != "--daemon")
        .collect();
    let args = strip_log(args);
    let mut cmd = Command::new(std::env::current_exe().context("finding this program")?);
    cmd.args(&args)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting the mount process")?;
    let target = a
        .mountpoint
        .canonicalize()
        .with_context(|| format!("{}", a.mountpoint.display()))?;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(120) {
        if dquant_mount::is_mounted(&target) {
            eprintln!(
                "mounted {} on {} (pid {}, log {}); unmount with `fusermount3 -u {}`",
                a.agent,
                target.display(),
                child.id(),
                log.display(),
                target.display()
            );
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            bail!(
                "the mount process ended ({status}) before mounting:\n{}",
                text.trim()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!(
        "{} was not mounted within 120 s; see {}",
        target.display(),
        log.display()
    )
}

/// The arguments without `--log FILE` / `--log=FILE` (the child is not a daemon).
fn strip_log(args: Vec<String>) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len());
    let mut skip = false;
    for s in args {
        if std::mem::take(&mut skip) {
            continue;
        }
        if s == "--log" {
            skip = true;
        } else if !s.starts_with("--log=") {
            out.push(s);
        }
    }
    out
}
