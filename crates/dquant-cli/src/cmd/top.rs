//! `dquant top`: a terminal view of an agent's `Watch` feed.

use std::collections::VecDeque;
use std::io::{IsTerminal, Write};

use anyhow::{bail, Result};
use dquant_client::{AgentUri, Control};
use dquant_proto::v1::event::Kind;
use dquant_proto::v1::{Event, RateSnapshot};
use serde_json::json;

use crate::util;

const EXAMPLES: &str = "\
Examples:
  dquant top dquant://127.0.0.1:7878                  # tenants' rates and sessions, live
  dquant top dquant://10.0.0.5:7878 --interval-ms 250
  dquant top dquant://127.0.0.1:7878 --json --count 20  # events as JSON lines, then exit";

/// Watch an agent: every tenant's delivery rate and streaming sessions, refreshed each
/// interval, with the latest sessions opened and closed and the latest refusals. With a
/// tenant's token (DQUANT_TOKEN) it shows that tenant only.
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// dquant://HOST:PORT, or the agent's Unix socket path.
    pub uri: String,
    /// Milliseconds between rate snapshots.
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    pub interval_ms: u32,
    /// Print every event as one JSON line instead of the view.
    #[arg(long)]
    pub json: bool,
    /// Stop after this many events.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
}

/// Session events and refusals kept for the view.
const RECENT: usize = 12;

pub fn run(a: &Args) -> Result<()> {
    let u = AgentUri::parse(&a.uri).map_err(anyhow::Error::msg)?;
    let c = Control::connect(&u.authority)?;
    let tty = std::io::stdout().is_terminal();
    let mut recent: VecDeque<String> = VecDeque::new();
    for (n, e) in c.watch(a.interval_ms)?.enumerate() {
        let e = e?;
        if a.json {
            println!("{}", serde_json::to_string(&as_json(&e))?);
        } else {
            match &e.kind {
                Some(Kind::Rates(r)) => draw(&u.authority, r, &recent, tty)?,
                _ => {
                    recent.push_back(line(&e));
                    if recent.len() > RECENT {
                        recent.pop_front();
                    }
                }
            }
        }
        if a.count.is_some_and(|c| n as u64 + 1 >= c) {
            return Ok(());
        }
    }
    bail!("the agent ended the watch")
}

/// One event as a line of the view.
fn line(e: &Event) -> String {
    match &e.kind {
        Some(Kind::Opened(o)) => format!(
            "#{} opened   session {} ({}, tenant {:?}): {}",
            e.seq, o.session, o.kind, o.tenant, o.detail
        ),
        Some(Kind::Closed(c)) => format!(
            "#{} closed   session {} ({}, {}): {} after {} records, {} wire bytes{}",
            e.seq,
            c.session,
            c.kind,
            c.transport,
            c.how,
            util::thousands(c.records),
            util::thousands(c.wire_bytes),
            if c.message.is_empty() {
                String::new()
            } else {
                format!(": {}", c.message)
            }
        ),
        Some(Kind::Error(x)) => format!(
            "#{} refused  [{}] {}: {}",
            e.seq, x.plane, x.reason, x.detail
        ),
        Some(Kind::Subscriber(s)) => format!(
            "#{} {}  share {} (tenant {:?}): session {} at epoch {} consumed_samples {}; {} subscribers",
            e.seq,
            if s.joined { "joined" } else { "left  " },
            s.share,
            s.tenant,
            s.session,
            s.epoch,
            s.consumed_samples,
            s.subscribers
        ),
        Some(Kind::Rates(_)) | None => String::new(),
    }
}

fn draw(agent: &str, r: &RateSnapshot, recent: &VecDeque<String>, tty: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    if tty {
        write!(out, "\x1b[2J\x1b[H")?;
    }
    writeln!(out, "dquant top: {agent}")?;
    writeln!(
        out,
        "{:<24} {:>9} {:>12} {:>16}",
        "tenant", "sessions", "MB/s", "bytes total"
    )?;
    for t in &r.tenants {
        let name = if t.tenant.is_empty() {
            "(anyone)"
        } else {
            &t.tenant
        };
        writeln!(
            out,
            "{:<24} {:>9} {:>12.1} {:>16}",
            name,
            t.sessions,
            t.bytes_per_s / 1e6,
            util::thousands(t.bytes_total)
        )?;
    }
    writeln!(out)?;
    for l in recent {
        writeln!(out, "{l}")?;
    }
    if !tty {
        writeln!(out, "--")?;
    }
    out.flush()?;
    Ok(())
}

fn as_json(e: &Event) -> serde_json::Value {
    let kind = match &e.kind {
        Some(Kind::Opened(o)) => {
            json!({"opened": {"session": o.session, "tenant": o.tenant, "kind": o.kind, "detail": o.detail}})
        }
        Some(Kind::Closed(c)) => json!({"closed": {
            "session": c.session, "tenant": c.tenant, "kind": c.kind, "transport": c.transport,
            "how": c.how, "message": c.message, "records": c.records, "tokens": c.tokens,
            "wire_bytes": c.wire_bytes}}),
        Some(Kind::Error(x)) => {
            json!({"error": {"plane": x.plane, "reason": x.reason, "detail": x.detail}})
        }
        Some(Kind::Subscriber(s)) => json!({"subscriber": {
            "share": s.share, "session": s.session, "tenant": s.tenant, "joined": s.joined,
            "epoch": s.epoch, "consumed_samples": s.consumed_samples,
            "subscribers": s.subscribers}}),
        Some(Kind::Rates(r)) => json!({"rates": r.tenants.iter().map(|t| json!({
            "tenant": t.tenant, "sessions": t.sessions, "bytes_per_s": t.bytes_per_s,
            "bytes_total": t.bytes_total})).collect::<Vec<_>>()}),
        None => json!(null),
    };
    json!({"seq": e.seq, "unix_ms": e.unix_ms, "event": kind})
}
