//! `dquant ls`, `dquant stat` and `dquant health`: what an agent serves, and whether it
//! serves now, over its control plane.

use anyhow::{bail, Result};
use dquant_client::{AgentUri, Control};
use dquant_proto::v1::StatRequest;
use serde_json::json;

use crate::util;

const LS_EXAMPLES: &str = "\
Examples:
  dquant ls dquant://127.0.0.1:7878            # the roots the agent serves
  dquant ls dquant://127.0.0.1:7878/corpus     # the datasets under root corpus
  dquant ls dquant://127.0.0.1:7878/corpus --json";

/// List an agent's dataset roots, or the datasets under one root (Megatron prefixes, block
/// files, raw token files).
#[derive(clap::Args, Debug)]
#[command(after_help = LS_EXAMPLES)]
pub struct LsArgs {
    /// dquant://HOST:PORT (roots) or dquant://HOST:PORT/ROOT (its datasets).
    pub uri: String,
    /// Print JSON on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
}

const STAT_EXAMPLES: &str = "\
Examples:
  dquant stat dquant://127.0.0.1:7878/corpus/web_int32
  dquant stat dquant://127.0.0.1:7878/corpus/code.dqb --json
  dquant stat dquant://127.0.0.1:7878/corpus/tokens.raw --dtype u16 --eod 50256";

/// Show one dataset on an agent: format, tokens, documents, sequences, size on disk, the
/// largest token id and the content checksum when the format stores them.
#[derive(clap::Args, Debug)]
#[command(after_help = STAT_EXAMPLES)]
pub struct StatArgs {
    /// dquant://HOST:PORT/ROOT/PATH.
    pub uri: String,
    /// Element type of a raw token file (raw files do not describe themselves).
    #[arg(long, value_name = "DTYPE")]
    pub dtype: Option<String>,
    /// End-of-document token of a raw token file.
    #[arg(long, value_name = "ID")]
    pub eod: Option<u32>,
    /// Print JSON on stdout instead of text.
    #[arg(long)]
    pub json: bool,
}

const HEALTH_EXAMPLES: &str = "\
Examples:
  dquant health dquant://127.0.0.1:7878          # exit 0: serving; 1: draining, starting or unreachable
  dquant health unix:/run/dquant.sock --wait 30  # a script's wait for an agent it just started
  DQUANT_TLS_CA=/etc/dquant/tls/ca.crt dquant health dquant://dquant-storage-0:7878
  # A Kubernetes readiness probe (the image has no shell): 
  #   exec: { command: [\"/usr/local/bin/dquant\", \"health\", \"dquant://127.0.0.1:7878\"] }";

/// Ask an agent whether it serves (the standard gRPC health service, as a readiness probe
/// would). Exits 0 while it serves, 1 while it drains or starts, or when it cannot be reached.
/// TLS and tokens come from DQUANT_TLS_CA / DQUANT_TOKEN, as for ls.
#[derive(clap::Args, Debug)]
#[command(after_help = HEALTH_EXAMPLES)]
pub struct HealthArgs {
    /// dquant://HOST:PORT, or the agent's Unix socket path.
    pub uri: String,
    /// Print JSON on stdout instead of text.
    #[arg(long)]
    pub json: bool,
    /// Ask again, every 100 ms, until the agent serves or SECS have passed (the answer is
    /// then the last one: an error, or not serving).
    #[arg(long, value_name = "SECS", default_value = "0", value_parser = util::parse_seconds)]
    pub wait: std::time::Duration,
}

pub fn health(a: &HealthArgs) -> Result<i32> {
    let deadline = std::time::Instant::now() + a.wait;
    let (c, serving) = loop {
        let answer = connect(&a.uri).and_then(|(c, _)| Ok((c.serving()?, c)));
        match answer {
            Ok((true, c)) => break (c, true),
            Ok((false, c)) if std::time::Instant::now() >= deadline => break (c, false),
            Err(e) if std::time::Instant::now() >= deadline => return Err(e),
            _ => std::thread::sleep(std::time::Duration::from_millis(100)),
        }
    };
    let status = if serving {
        "serving"
    } else {
        "not serving (draining or starting)"
    };
    if a.json {
        util::write_json(&json!({"agent": c.authority(), "serving": serving}))?;
    } else {
        println!("{}: {status}", c.authority());
    }
    Ok(if serving { 0 } else { 1 })
}

fn connect(uri: &str) -> Result<(Control, AgentUri)> {
    let u = AgentUri::parse(uri).map_err(anyhow::Error::msg)?;
    let c = Control::connect(&u.authority)?;
    Ok((c, u))
}

pub fn ls(a: &LsArgs) -> Result<()> {
    let (c, u) = connect(&a.uri)?;
    if u.dataset.contains('/') {
        bail!(
            "{}: ls takes an agent or a root (dquant://HOST:PORT[/ROOT]); for a dataset use dquant stat",
            a.uri
        );
    }
    let mut entries = c.list(&u.dataset)?;
    entries.sort_by(|x, y| x.name.cmp(&y.name));
    if a.json {
        let v: Vec<_> = entries
            .iter()
            .map(|e| json!({"name": e.name, "kind": e.kind, "bytes": e.bytes}))
            .collect();
        return util::write_json(&json!(v));
    }
    if u.dataset.is_empty() {
        for e in &entries {
            println!("{}", e.name);
        }
        return Ok(());
    }
    let width = entries.iter().map(|e| e.name.len()).max().unwrap_or(0);
    for e in &entries {
        println!(
            "{:<width$}  {:<13}  {:>15}",
            e.name,
            e.kind,
            util::thousands(e.bytes)
        );
    }
    Ok(())
}

pub fn stat(a: &StatArgs) -> Result<()> {
    let (c, u) = connect(&a.uri)?;
    if !u.dataset.contains('/') {
        bail!(
            "{}: stat takes a dataset, dquant://HOST:PORT/ROOT/PATH (list them with dquant ls)",
            a.uri
        );
    }
    let s = c.stat(StatRequest {
        dataset: u.dataset.clone(),
        dtype: a.dtype.clone().unwrap_or_default(),
        eod: a.eod,
        max_token: false,
    })?;
    if a.json {
        return util::write_json(&json!({
            "dataset": s.dataset, "format": s.format, "tokens": s.tokens,
            "documents": s.documents, "sequences": s.sequences,
            "bytes_on_disk": s.bytes_on_disk, "stored_max_token": s.stored_max_token,
            "checksum": (!s.checksum.is_empty()).then_some(&s.checksum),
        }));
    }
    println!("dataset     {}", s.dataset);
    println!("format      {}", s.format);
    println!("tokens      {}", util::thousands(s.tokens));
    println!("documents   {}", util::thousands(s.documents));
    println!("sequences   {}", util::thousands(s.sequences));
    println!(
        "on disk     {} bytes ({:.3} bytes/token)",
        util::thousands(s.bytes_on_disk),
        s.bytes_on_disk as f64 / s.tokens.max(1) as f64
    );
    if let Some(m) = s.stored_max_token {
        println!("max id      {m}");
    }
    if !s.checksum.is_empty() {
        println!("checksum    {}", s.checksum);
    }
    Ok(())
}
