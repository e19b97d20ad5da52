//! The lab's tenants run (`bench/lab/run.sh --tenants`, issue 19): one storage agent shared
//! by greedy tenants with bandwidth guarantees over the shaped link.
//!
//! The storage veth's egress is an HTB tree that classifies by DSCP, standing in for a
//! switch's queues ([`Link::classify_by_dscp`]); its per-class byte counters, sampled every
//! 100 ms, give each tenant's rate on the wire and show that the agent marked each tenant's
//! packets with its class. Two parts:
//! 1. tenants gold/silver/bronze with guarantees of 50/30/20% run greedy consumers; each must
//!    get at least 0.95 × its guarantee. Gold then stops: the time until silver and bronze
//!    run at 0.95 × their new shares is the redistribution time (target: within a second).
//!    Run twice: with the HTB classes holding the guarantees too (switch queues that know the
//!    classes), and with the classes only counting (no guarantee in the network: the shares
//!    are the agent's scheduler's alone);
//! 2. two equal tenants (50/50): Jain's fairness index of their rates (target ≥ 0.95).
//!
//! The run gives its section for bench/history/lab.md and, with the same numbers, the
//! figures bench/results.py records as the `lab_tenants` area.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use dquant_plan::{OutputDType, Plan, Source};

use super::netns::{self, Link, NsChild, HOST_NS, STORAGE_IP, STORAGE_NS};
use super::report::{figure, Figure};
use super::{Corpus, Tools, AGENT_PORT, BUCKET};

/// (name, token, DSCP, guarantee share).
type Tenant = (&'static str, &'static str, u8, f64);

const THREE: [Tenant; 3] = [
    ("gold", "gold-tenant-token-0123456789", 46, 0.5),
    ("silver", "silver-tenant-token-0123456789", 26, 0.3),
    ("bronze", "bronze-tenant-token-0123456789", 10, 0.2),
];
const TWO: [Tenant; 2] = [
    ("left", "left-tenant-token-0123456789", 18, 0.5),
    ("right", "right-tenant-token-0123456789", 34, 0.5),
];
const SAMPLE: Duration = Duration::from_millis(100);
/// Each tenant's least rate while all run greedy, as a share of its guarantee.
const HELD: f64 = 0.95;
/// The longest time until the others take up a stopped tenant's share, in seconds.
const SETTLE_S: f64 = 1.0;
/// The least Jain's index for equal tenants.
const FAIR: f64 = 0.95;

/// The agent's config for `tenants`: the link declared at 94% of the tc rate (TCP payload
/// gets 96% of it at MTU 1500; the margin keeps the shaper's queue short, so that the
/// tenants' flows do not compete in it), each tenant's share and class.
fn config(tenants: &[Tenant], root: &Path, link_bytes: f64) -> String {
    let mut c = format!(
        "allow_plaintext = true\n[roots]\n{BUCKET} = \"{}\"\n[bandwidth]\nlink_bytes_per_s = {}\n",
        root.display(),
        (link_bytes * 0.94) as u64
    );
    for (name, _, dscp, _) in tenants {
        let _ = write!(
            c,
            "[[bandwidth.classes]]\nname = \"{name}\"\ndscp = {dscp}\n"
        );
    }
    for (name, token, _, share) in tenants {
        let _ = write!(
            c,
            "[[tenants]]\nname = \"{name}\"\ntoken = \"{token}\"\nroots = [\"{BUCKET}\"]\nguarantee_share = {share}\nclass = \"{name}\"\n"
        );
    }
    c
}

fn serve(tools: &Tools, conf: &Path) -> Result<NsChild> {
    let listen = format!("{STORAGE_IP}:{AGENT_PORT}");
    let mut cmd = Command::new(&tools.dquant);
    cmd.arg("serve")
        .arg("--config")
        .arg(conf)
        .args(["--listen", &listen])
        .env("DQUANT_LOG", "warn");
    let mut child = netns::spawn_in(STORAGE_NS, cmd, "storage agent")?;
    if let Err(e) = netns::wait_listening(STORAGE_NS, &listen, Duration::from_secs(20)) {
        let (_, stderr) = child.stop();
        return Err(e.context(format!("the storage agent did not start:\n{stderr}")));
    }
    Ok(child)
}

fn consumer(tools: &Tools, plan: &Plan, token: &str) -> Result<NsChild> {
    let mut cmd = Command::new(&tools.me);
    cmd.arg("lab-consume")
        .arg("--plan")
        .arg(serde_json::to_string(plan)?)
        .arg("--agent")
        .arg(format!("dquant://{STORAGE_IP}:{AGENT_PORT}"))
        .env("DQUANT_TOKEN", token);
    netns::spawn_in(HOST_NS, cmd, "consumer")
}

/// Every [`SAMPLE`], the bytes each class sent: (seconds since start, bytes per class in
/// `tenants`' order, then the default class).
struct Series(Vec<(f64, Vec<u64>)>);

impl Series {
    fn sample(link: &Link, n: usize, t0: Instant, out: &mut Series) -> Result<()> {
        let by = link.class_bytes()?;
        let get = |id: &str| by.iter().find(|(h, _)| h == id).map_or(0, |(_, b)| *b);
        let mut v: Vec<u64> = (0..n).map(|i| get(&format!("1:{}", 10 + i))).collect();
        v.push(get("1:99"));
        out.0.push((t0.elapsed().as_secs_f64(), v));
        Ok(())
    }

    /// Class `i`'s bytes/s between seconds `a` and `b` (the samples nearest them).
    fn rate(&self, i: usize, a: f64, b: f64) -> f64 {
        let at = |t: f64| {
            self.0
                .iter()
                .min_by(|x, y| (x.0 - t).abs().total_cmp(&(y.0 - t).abs()))
        };
        match (at(a), at(b)) {
            (Some(x), Some(y)) if y.0 > x.0 => (y.1[i] - x.1[i]) as f64 / (y.0 - x.0),
            _ => 0.0,
        }
    }
}

/// What every part runs with.
struct Setup<'a> {
    tools: &'a Tools,
    link: &'a Link,
    /// The corpora's directory (the agent's root) and a scratch directory for configs.
    root: &'a Path,
    scratch: &'a Path,
    plan: Plan,
}

/// Runs `tenants` greedy for `secs`, stopping the first one's consumer at `stop_first` (if
/// given), the HTB classes holding the guarantees when `network_holds`; returns the class
/// byte series.
fn part(
    setup: &Setup<'_>,
    tenants: &[Tenant],
    (secs, stop_first): (f64, Option<f64>),
    network_holds: bool,
) -> Result<Series> {
    let Setup {
        tools,
        link,
        root,
        scratch,
        plan,
    } = setup;
    let shares: Vec<(u8, f64)> = tenants
        .iter()
        .map(|t| (t.2, if network_holds { t.3 } else { 0.0 }))
        .collect();
    link.classify_by_dscp(&shares)?;
    let conf = scratch.join(format!("tenants-{}.toml", tenants.len()));
    std::fs::write(&conf, config(tenants, root, link.spec.bytes_per_s()))?;
    let _agent = serve(tools, &conf)?;
    let mut consumers: Vec<Option<NsChild>> = tenants
        .iter()
        .map(|t| consumer(tools, plan, t.1).map(Some))
        .collect::<Result<_>>()?;
    let t0 = Instant::now();
    let mut series = Series(Vec::new());
    while t0.elapsed().as_secs_f64() < secs {
        Series::sample(link, tenants.len(), t0, &mut series)?;
        if stop_first.is_some_and(|s| t0.elapsed().as_secs_f64() >= s) {
            if let Some(mut c) = consumers[0].take() {
                c.kill();
            }
        }
        std::thread::sleep(SAMPLE);
    }
    for c in consumers.iter_mut().flatten() {
        if !c.running() {
            let (_, err) = c.stop();
            anyhow::bail!(
                "a consumer ended early (make the plan longer?): {}",
                err.trim()
            );
        }
    }
    Ok(series)
}

/// Runs both parts; returns the Markdown section for bench/history/lab.md and the figures for
/// bench/results.py.
pub(super) fn run(
    tools: &Tools,
    link: &Link,
    corpus: &Corpus,
    root: &Path,
    scratch: &Path,
) -> Result<(String, Vec<Figure>)> {
    let mut plan = Plan::new(
        vec![Source::new(format!("{BUCKET}/{}", corpus.name()))],
        4095,
        16,
    );
    plan.shuffle = false;
    plan.output = OutputDType::U16;
    plan.wire_codec = "u16".into();
    plan.epochs = Some(50);
    let setup = Setup {
        tools,
        link,
        root,
        scratch,
        plan,
    };
    let r = link.spec.bytes_per_s();
    let mut md = String::new();
    let mut figures = Vec::new();

    // Part 1: 50/30/20, gold stops at 4 s; with and without the network's help.
    let stop = 4.0;
    for network_holds in [true, false] {
        let s = part(&setup, &THREE, (7.0, Some(stop)), network_holds).context("tenants part 1")?;
        let label = match network_holds {
            true => "HTB classes hold the guarantees",
            false => "HTB classes only count",
        };
        let _ = writeln!(
            md,
            "{}\n\n| tenant | DSCP | guarantee | achieved (1–{stop:.0} s) | achieved ÷ guarantee | |\n|---|---:|---:|---:|---:|---|",
            match network_holds {
                true => "**The HTB classes hold the guarantees too** (switch queues that know the classes):",
                false => "**The HTB classes only count** (no guarantee in the network): the shares are the agent's scheduler's alone:",
            }
        );
        for (i, (name, _, dscp, share)) in THREE.iter().enumerate() {
            let got = s.rate(i, 1.0, stop);
            let ratio = got / (share * r);
            let _ = writeln!(
                md,
                "| {name} | {dscp} | {:.1} MB/s ({:.0}%) | {:.1} MB/s | {ratio:.3} | {} |",
                share * r / 1e6,
                share * 100.0,
                got / 1e6,
                if ratio >= HELD { "✅" } else { "❌" }
            );
            figures.push(figure(
                format!("{label}: {name} (DSCP {dscp}) achieved ÷ guarantee, 1–{stop:.0} s"),
                ratio,
                "×",
                &format!(
                    "its guarantee: {:.1} MB/s ({:.0}%); achieved {:.1} MB/s",
                    share * r / 1e6,
                    share * 100.0,
                    got / 1e6
                ),
                Some(format!(">= {HELD}")),
            ));
        }
        // Silver and bronze after gold stops: 0.3 + 0.25 and 0.2 + 0.25 of the link.
        let want = [0.55 * r, 0.45 * r];
        let settled =
            s.0.iter()
                .map(|(t, _)| *t)
                .filter(|t| *t > stop + 0.2)
                .find(|&t| (0..2).all(|k| s.rate(k + 1, t - 0.2, t) >= HELD * want[k]));
        let settled = settled.map(|t| t - stop);
        let after = |k: usize| s.rate(k, stop + 1.5, 7.0) / 1e6;
        let unmarked = s.0.last().map_or(0, |(_, v)| v[THREE.len()]);
        let shares = format!(
            "new shares 55% and 45%: {:.1} and {:.1} MB/s; from 5.5 s they run at {:.1} and {:.1} MB/s",
            want[0] / 1e6,
            want[1] / 1e6,
            after(1),
            after(2)
        );
        // Not settled within the run counts as the run's whole length after the stop.
        let took = settled.unwrap_or(7.0 - stop);
        figures.push(figure(
            format!("{label}: gold stops at {stop:.0} s, time until silver and bronze reach {HELD} × their new shares"),
            took,
            "s",
            &shares,
            Some(format!("<= {SETTLE_S}")),
        ));
        let _ = writeln!(
            md,
            "\nGold stops at {stop:.0} s: silver and bronze reach {HELD} × their new shares (55% and 45%: {:.1} and {:.1} MB/s) {}; from 5.5 s they run at {:.1} and {:.1} MB/s. Bytes in the default (unmarked) class: {unmarked}.\n",
            want[0] / 1e6,
            want[1] / 1e6,
            match settled {
                Some(d) if d <= SETTLE_S => format!("{d:.2} s later (target ≤ {SETTLE_S} s ✅)"),
                Some(d) => format!("{d:.2} s later (target ≤ {SETTLE_S} s ❌)"),
                None => format!("not within the run (target ≤ {SETTLE_S} s ❌)"),
            },
            after(1),
            after(2),
        );
    }

    // Part 2: two equal tenants.
    let s = part(&setup, &TWO, (4.0, None), false).context("tenants part 2")?;
    let (a, b) = (s.rate(0, 1.0, 4.0), s.rate(1, 1.0, 4.0));
    let jain = (a + b).powi(2) / (2.0 * (a * a + b * b));
    let _ = writeln!(
        md,
        "Two equal tenants (50/50, the HTB classes only counting): {:.1} and {:.1} MB/s, Jain's index {jain:.4} (target ≥ {FAIR} {}). Every tenant's bytes were in its DSCP class: the agent marked each data socket with its tenant's class.",
        a / 1e6,
        b / 1e6,
        if jain >= FAIR { "✅" } else { "❌" }
    );
    figures.push(figure(
        "two equal tenants (50/50, HTB classes only counting): Jain's fairness index".into(),
        jain,
        "",
        &format!(
            "the two tenants' rates: {:.1} and {:.1} MB/s",
            a / 1e6,
            b / 1e6
        ),
        Some(format!(">= {FAIR}")),
    ));
    Ok((md, figures))
}
