//! `dquant locate`: where a sample's tokens came from, and which samples read a document.

use std::io::Write;
use std::ops::Range;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use dquant_client::{Located, Provenance};
use serde_json::json;

use crate::cmd::read::load_plan;

const EXAMPLES: &str = "\
Examples:
  # Which documents global sample 123456 holds, and the step and rank that receive it:
  dquant locate plan.toml --sample 123456
  # One JSON object a sample, for samples 1000 to 1999:
  dquant locate plan.toml --sample 1000..2000 --json
  # Every sample that holds a token of document 42 of source 1 (a takedown request):
  dquant locate plan.toml --document 1:42 --json
  # ... among the samples a checkpoint at 5,000,000 consumed:
  dquant locate plan.toml --document 1:42 --range 0..5000000";

/// Provenance, both ways, computed from the plan (no stream is read): for a global sample, its
/// source epoch, the step and rank that receive it, and its `seq_len + 1` tokens as runs inside
/// the sources' documents; for a document, every global sample that holds any of its tokens.
/// Sources are opened as `dquant read` opens them, for their sizes and document indexes.
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// Plan file: .json or .toml.
    pub plan: PathBuf,
    /// A global sample I, or the samples A..B (B excluded).
    #[arg(long, value_name = "I|A..B", value_parser = parse_samples,
          required_unless_present = "document", conflicts_with = "document")]
    pub sample: Option<Range<u64>>,
    /// Document D of source K (the source's index in the plan, the document's in its dataset).
    #[arg(long, value_name = "K:D", value_parser = parse_document)]
    pub document: Option<(usize, u64)>,
    /// With --document: only global samples A..B (default: the whole plan).
    #[arg(long, value_name = "A..B", value_parser = parse_range, requires = "document")]
    pub range: Option<Range<u64>>,
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
}

fn number(s: &str, what: &str) -> Result<u64, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("{what} {s:?} is not a whole number"))
}

/// `A..B` with `A <= B`.
fn parse_range(s: &str) -> Result<Range<u64>, String> {
    let (a, b) = s
        .split_once("..")
        .ok_or_else(|| format!("{s:?} is not a range A..B"))?;
    let (a, b) = (number(a, "start")?, number(b, "end")?);
    if a > b {
        return Err(format!("{s:?}: the start is past the end"));
    }
    Ok(a..b)
}

/// `I` (the range `I..I+1`) or `A..B`.
fn parse_samples(s: &str) -> Result<Range<u64>, String> {
    match s.contains("..") {
        true => parse_range(s),
        false => {
            let i = number(s, "sample")?;
            Ok(i..i.saturating_add(1))
        }
    }
}

/// `K:D`.
fn parse_document(s: &str) -> Result<(usize, u64), String> {
    let (k, d) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?} is not SOURCE:DOCUMENT (e.g. 0:42)"))?;
    let k = number(k, "source")?;
    let k = usize::try_from(k).map_err(|_| format!("source {k} is too large"))?;
    Ok((k, number(d, "document")?))
}

pub fn run(a: &Args) -> Result<()> {
    let plan = load_plan(&a.plan)?;
    let mut p = Provenance::open(&plan).with_context(|| format!("{}", a.plan.display()))?;
    let mut out = std::io::stdout().lock();
    if let Some((source, document)) = a.document {
        let samples = p.samples_of(source, document, a.range.clone())?;
        match a.json {
            true => writeln!(
                out,
                "{}",
                json!({"document": format!("{source}:{document}"), "samples": samples})
            )?,
            false => print_document(&mut out, &plan.sources[source].uri, document, &samples)?,
        }
        return Ok(());
    }
    let Some(samples) = a.sample.clone() else {
        bail!("give --sample I, --sample A..B or --document K:D");
    };
    for i in samples {
        let at = p.locate(i)?;
        match a.json {
            true => writeln!(out, "{}", serde_json::to_string(&at)?)?,
            false => print_sample(&mut out, &at)?,
        }
    }
    Ok(())
}

fn print_sample(out: &mut impl Write, at: &Located) -> Result<()> {
    writeln!(
        out,
        "sample {}: step {}, rank {}, epoch {} of its source",
        at.sample, at.step, at.rank, at.epoch
    )?;
    for p in &at.pieces {
        writeln!(
            out,
            "  {} tokens of {} (source {}), document {} from offset {}",
            p.length, p.uri, p.source, p.document, p.offset
        )?;
    }
    Ok(())
}

fn print_document(out: &mut impl Write, uri: &str, document: u64, samples: &[u64]) -> Result<()> {
    let list: Vec<String> = samples.iter().map(u64::to_string).collect();
    writeln!(
        out,
        "document {document} of {uri}: in {} samples{}{}",
        samples.len(),
        if samples.is_empty() { "" } else { ": " },
        list.join(" ")
    )?;
    Ok(())
}
