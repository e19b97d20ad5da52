//! `dquant read`: stream a plan's batches to a file or stdout.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use dquant_client::{Offload, Reader, Share};
use dquant_plan::{Cursor, Plan, Source};
use serde_json::json;
use xxhash_rust::xxh3::Xxh3;

use crate::util::{self, OutputOpts};

const EXAMPLES: &str = "\
Examples:
  # plan.toml:
  #   seq_len = 2048
  #   batch_size = 8
  #   output = \"u16\"
  #   [[sources]]
  #   uri = \"data/web_int32\"
  #   weight = 0.7
  #   [[sources]]
  #   uri = \"data/code.dqb\"
  #   weight = 0.3
  dquant read plan.toml --out batches.u16
  dquant read plan.json --cursor 4096 | python3 train.py     # resume after 4096 samples
  # A whole cursor (--json's \"cursor\", or dquant.merge_cursors of several ranks'): with the
  # blend's counts a blended plan resumes without replaying the blend.
  dquant read plan.json --cursor-json '{\"consumed_samples\":4096,\"blend\":[2867,1229]}'

  # On an agent (dquant serve --root corpus=/data): plan sources are then dataset names,
  # e.g. uri = \"corpus/web_int32\".
  dquant read plan.toml --agent dquant://127.0.0.1:7878 --out batches.u16   # the agent runs the plan
  dquant read plan.toml --agent dquant://127.0.0.1:7878 --no-offload        # pull token ranges, run here
  # An agent on this host with --socket: batches land in shared memory (transport=shm).
  dquant read plan.toml --agent /run/dquant.sock --out batches.u16
  dquant read plan.toml --agent 'dquant://127.0.0.1:7878?transport=shm&slots=16'
  # One stream for a tensor-parallel group of 4: made once, read by all four.
  dquant read plan.toml --agent /run/dquant.sock --share job42/dp3 --group 4 --out tp0.u16
  dquant subscribe /run/dquant.sock job42/dp3 --cursor-json '{\"consumed_samples\":0}' --out tp1.u16";

/// Run a plan (JSON or TOML), in this process or on an agent, and write its batches, back to
/// back in the plan's output dtype, to a file or stdout. A summary (batches, tokens, stream
/// checksum, the cursor to resume from) goes to stderr, or as JSON with --json. The same plan
/// gives the same bytes wherever it runs.
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// Plan file: .json or .toml.
    pub plan: PathBuf,
    /// Output file (default: stdout).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Resume after this many consumed samples (global, all ranks together).
    #[arg(long, default_value_t = 0)]
    pub cursor: u64,
    /// The epoch of the cursor to resume from (as a checkpoint stored it; for reporting,
    /// the position is --cursor).
    #[arg(long, default_value_t = 0, value_name = "E")]
    pub epoch: u64,
    /// Resume at a whole cursor, as JSON: {"epoch":E,"consumed_samples":N} with optional
    /// "blend" (the blend's per-source counts: no replay) and "delivered" (a cursor merged
    /// from the ranks of a run on another topology). --json's summary gives it.
    #[arg(long, value_name = "JSON", conflicts_with_all = ["cursor", "epoch"])]
    pub cursor_json: Option<String>,
    /// The agent whose datasets the plan names: dquant://HOST:PORT, or its Unix socket path
    /// (batches then arrive through a shared-memory ring). Options: ?transport=shm|tcp,
    /// verify=true (check each ring batch's crc32c), slots=N.
    #[arg(long, value_name = "URI")]
    pub agent: Option<String>,
    /// Run the plan on the agent, which streams finished batches (the default with --agent).
    #[arg(long, requires = "agent", conflicts_with = "no_offload")]
    pub offload: bool,
    /// Run the plan in this process, pulling token ranges from the agent.
    #[arg(long, requires = "agent")]
    pub no_offload: bool,
    /// Open the plan on the agent as the shared stream NAME (e.g. job42/dp3), or join the
    /// stream of that name running the same plan: the agent runs it once, and every reader
    /// of the stream (`dquant subscribe AGENT NAME`) gets the same batches.
    #[arg(
        long,
        value_name = "NAME",
        requires = "agent",
        conflicts_with = "no_offload"
    )]
    pub share: Option<String>,
    /// With --share: the stream makes no batch until N readers have joined (this one
    /// included), or the agent's ticket lifetime passed (a tensor-parallel group).
    #[arg(long, value_name = "N", default_value_t = 0, requires = "share")]
    pub group: u32,
    #[command(flatten)]
    pub output: OutputOpts,
}

pub fn load_plan(path: &std::path::Path) -> Result<Plan> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let plan = match path.extension().and_then(|e| e.to_str()) {
        Some("toml") => Plan::from_toml(&text),
        _ => Plan::from_json(&text),
    };
    plan.map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

pub fn run(a: &Args) -> Result<()> {
    let plan = load_plan(&a.plan)?;
    let t0 = Instant::now();
    let offload = if a.agent.is_some() && !a.no_offload {
        Offload::Yes
    } else {
        Offload::No
    };
    let start = match &a.cursor_json {
        Some(text) => Cursor::from_json(text).context("--cursor-json")?,
        None => Cursor::new(a.epoch, a.cursor),
    };
    let agent = a.agent.as_deref().unwrap_or("");
    let mut r = match &a.share {
        Some(name) => {
            let share = Share {
                name: name.clone(),
                group: a.group,
            };
            dquant_client::open_shared(agent, &plan, start, &share)?
        }
        None => dquant_client::open_at(agent, &plan, start, offload)?,
    };
    write_batches(&mut r, a.out.as_deref(), &a.output, &plan.sources, t0)
}

/// Writes `r`'s batches back to back to `out` (stdout when `None`), then the summary;
/// `sources` are the plan's (named in the summary when the reader reports their use).
pub(crate) fn write_batches(
    r: &mut Reader,
    out: Option<&Path>,
    opts: &OutputOpts,
    sources: &[Source],
    t0: Instant,
) -> Result<()> {
    let remaining = r
        .rank_samples()
        .saturating_sub(r.cursor().consumed_samples / u64::from(r.world().max(1)));
    let quiet = opts.quiet() || out.is_none();
    let pb = util::bar(remaining * r.sample_len() as u64, "reading", quiet);
    let mut sink: Box<dyn Write> = match out {
        Some(p) => Box::new(BufWriter::new(
            File::create(p).with_context(|| format!("{}", p.display()))?,
        )),
        None => Box::new(BufWriter::new(std::io::stdout().lock())),
    };
    let (mut batches, mut tokens, mut bytes) = (0u64, 0u64, 0u64);
    let mut h = Xxh3::new();
    while let Some(b) = r.next_batch()? {
        let data = b.tokens.as_bytes();
        h.update(data);
        sink.write_all(data).context("writing batches")?;
        batches += 1;
        tokens += b.tokens.len() as u64;
        bytes += data.len() as u64;
        pb.inc(b.tokens.len() as u64);
    }
    sink.flush().context("writing batches")?;
    pb.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    let c = r.cursor();
    let used: Option<Vec<_>> = r.source_use().map(|u| {
        sources
            .iter()
            .zip(u)
            .map(|(s, u)| json!({"uri": s.uri, "samples": u.samples, "epochs": u.epochs}))
            .collect()
    });
    let output = r.output().as_str();
    let summary = json!({
        "batches": batches, "tokens": tokens, "bytes": bytes, "output": output,
        "stream_xxh3": format!("{:016x}", h.digest()), "offloaded": r.is_offloaded(),
        "cursor": c,
        "sources": used,
        "seconds": secs,
    });
    if opts.json {
        eprintln!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        eprintln!(
            "read {} batches, {} tokens ({} B of {output}) in {secs:.2} s ({:.1} M tokens/s); stream xxh3:{:016x}; resume with --cursor {}",
            util::thousands(batches),
            util::thousands(tokens),
            util::thousands(bytes),
            tokens as f64 / secs.max(1e-9) / 1e6,
            h.digest(),
            c.consumed_samples
        );
    }
    Ok(())
}
