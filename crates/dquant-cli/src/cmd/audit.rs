//! `dquant audit`: what a run had consumed of each source at a checkpoint.

use std::path::PathBuf;

use anyhow::{Context, Result};
use dquant_client::Provenance;
use serde_json::json;

use crate::cmd::read::load_plan;
use crate::util;

const EXAMPLES: &str = "\
Examples:
  # What the run had read of each source when it checkpointed at 5,000,000 samples:
  dquant audit plan.toml --until 5000000
  dquant audit plan.toml --until 5000000 --json";

/// Per source, what the global samples before --until consumed: samples, tokens, epochs
/// (fractional), and the documents touched (at least one token read) and completed (every
/// token read). Computed from the plan, no stream is read. Document counts within a source's
/// first epoch are exact up to a budget of shuffle steps, past it the expectation under a
/// uniform shuffle (marked "~", `"exact": false`).
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// Plan file: .json or .toml.
    pub plan: PathBuf,
    /// The global sample to audit up to (a checkpoint's consumed_samples).
    #[arg(long, value_name = "SAMPLE")]
    pub until: u64,
    /// One JSON object: {"until": N, "sources": [...]}.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &Args) -> Result<()> {
    let plan = load_plan(&a.plan)?;
    let mut p = Provenance::open(&plan).with_context(|| format!("{}", a.plan.display()))?;
    let rows = p.audit(a.until)?;
    if a.json {
        println!("{}", json!({"until": a.until, "sources": rows}));
        return Ok(());
    }
    println!("after {} samples:", util::thousands(a.until));
    println!(
        "  {:>6} {:>14} {:>16} {:>9} {:>12} {:>12} {:>12}  uri",
        "source", "samples", "tokens", "epochs", "documents", "touched", "completed"
    );
    for r in &rows {
        let approx = if r.exact { " " } else { "~" };
        println!(
            "  {:>6} {:>14} {:>16} {:>9.4} {:>12} {approx}{:>10.1}% {approx}{:>11} {}",
            r.source,
            util::thousands(r.samples),
            util::thousands(r.tokens),
            r.epochs,
            util::thousands(r.documents),
            100.0 * r.touched_share,
            util::thousands(r.documents_completed.round() as u64),
            r.uri
        );
    }
    Ok(())
}
