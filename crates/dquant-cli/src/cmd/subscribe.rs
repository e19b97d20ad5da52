//! `dquant subscribe`: read a shared stream another reader opened, by name.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use dquant_plan::Cursor;

use crate::cmd::read::write_batches;
use crate::util::{self, OutputOpts};

const EXAMPLES: &str = "\
Examples:
  # Rank 0 of a tensor-parallel group opens the plan as a shared stream, waiting for 4 readers:
  dquant read plan.toml --agent dquant://10.0.0.5:7878 --share job42/dp3 --group 4 --out tp0.u16
  # The other three join it from the start (the stream waits for them):
  dquant subscribe dquant://10.0.0.5:7878 job42/dp3 --cursor-json '{\"consumed_samples\":0}' --out tp1.u16 --wait 60
  # On the agent's host, through shared memory; from wherever the stream is now:
  dquant subscribe /run/dquant.sock job42/dp3 --out tp2.u16";

/// Read a shared stream (opened with `dquant read --share NAME` or a client's share option)
/// by name: the agent runs the plan once, and every subscriber gets the same batches, in
/// order. Batches are written back to back in the plan's output dtype, as `dquant read` does,
/// with the same summary. The subscriber sets the stream's pace when it is the slowest.
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// The agent: dquant://HOST:PORT, or its Unix socket path (shared memory).
    pub agent: String,
    /// The stream's name (e.g. job42/dp3); it belongs to the tenant of DQUANT_TOKEN.
    pub share: String,
    /// Start at this cursor, as JSON ({"epoch":E,"consumed_samples":N}): a batch boundary
    /// still in the stream's window. Default: the stream's current cursor.
    #[arg(long, value_name = "JSON")]
    pub cursor_json: Option<String>,
    /// Output file (default: stdout).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Wait up to SECS for the stream to be opened (ranks that start together: a subscriber
    /// may ask before its opener has). Default: it must exist now.
    #[arg(long, value_name = "SECS", default_value = "0", value_parser = util::parse_seconds)]
    pub wait: std::time::Duration,
    #[command(flatten)]
    pub output: OutputOpts,
}

pub fn run(a: &Args) -> Result<()> {
    let t0 = Instant::now();
    let at = match &a.cursor_json {
        Some(text) => Some(Cursor::from_json(text).context("--cursor-json")?),
        None => None,
    };
    let deadline = t0 + a.wait;
    let mut r = loop {
        match dquant_client::subscribe(&a.agent, &a.share, at.as_ref()) {
            Err(dquant_client::ClientError::NotFound(_)) if Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(100))
            }
            r => break r?,
        }
    };
    write_batches(&mut r, a.out.as_deref(), &a.output, &[], t0)
}
