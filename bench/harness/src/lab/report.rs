//! The lab's reporting: the runs summarized per corpus and scenario (ratios against the same
//! run's baseline), the goals checked, where and how the run was made, the Markdown
//! table added to the results file and the chart's panels. The scenarios themselves are run
//! and measured in [`super`].

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use dquant_corpus::Encoding;
use serde::Serialize;

use super::netns::{LinkSpec, HOST_NS, STORAGE_NS};
use super::{chart, utc_human, Args, Corpus, Measure, Way};
use crate::report::{median, spread};

/// Appends `section` to the history file `f` (bench/history/lab.md: append-only, oldest
/// first); the headline figures go to bench/results/ through bench/results.py instead.
pub(super) fn append_to_history(f: &Path, section: &str) -> Result<()> {
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(f)
        .with_context(|| format!("cannot open {}", f.display()))?;
    writeln!(file, "{}\n", section.trim_end())
        .with_context(|| format!("cannot write {}", f.display()))
}

/// One (corpus, scenario) over all runs.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub corpus: String,
    pub bits: u8,
    pub way: Way,
    pub label: String,
    pub mtok_s: Vec<f64>,
    /// tokens/s ÷ the same run's baseline.
    pub ratio: Vec<f64>,
    pub wire_bytes_per_token: f64,
    pub link_use: Vec<f64>,
    pub cpu_per_gtok: Vec<f64>,
    /// Consumer CPU per token ÷ the same run's baseline's.
    pub cpu_ratio: Vec<f64>,
    pub stall: Vec<f64>,
    /// The longest wait for one batch, per run.
    pub max_wait_s: Vec<f64>,
    /// (f): whether the replica was killed before the stream ended, per run.
    pub killed: Vec<bool>,
    pub consumer_rss: u64,
    /// Per server: name, peak RSS (max over runs), CPU-s per 10⁹ tokens and the busiest
    /// thread's share of the wall time (medians).
    pub servers: Vec<ServerRow>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ServerRow {
    pub name: String,
    pub peak_rss: u64,
    pub cpu_per_gtok: Vec<f64>,
    pub busiest_thread: String,
    pub busiest_share: Vec<f64>,
}

/// `v`'s min–max range through `f`, or one figure when they print alike.
fn span(v: &[f64], f: impl Fn(f64) -> String) -> String {
    let (lo, _, hi) = spread(v);
    if f(lo) == f(hi) {
        f(lo)
    } else {
        format!("{}–{}", f(lo), f(hi))
    }
}

pub(super) fn summarize(all: &[Measure], spec: &LinkSpec) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    for m in all {
        let base = all
            .iter()
            .find(|b| b.run == m.run && b.corpus == m.corpus && b.way == Way::Baseline)
            .expect("every run starts with its baseline");
        let i = match rows
            .iter()
            .position(|r| r.corpus == m.corpus && r.way == m.way)
        {
            Some(i) => i,
            None => {
                let bits = m.corpus.parse::<Encoding>().map_or(0, |e| e.bits());
                rows.push(Row {
                    corpus: m.corpus.clone(),
                    bits,
                    way: m.way.clone(),
                    label: m.way.label(),
                    mtok_s: vec![],
                    ratio: vec![],
                    wire_bytes_per_token: 0.0,
                    link_use: vec![],
                    cpu_per_gtok: vec![],
                    cpu_ratio: vec![],
                    stall: vec![],
                    max_wait_s: vec![],
                    killed: vec![],
                    consumer_rss: 0,
                    servers: vec![],
                });
                rows.len() - 1
            }
        };
        let r = &mut rows[i];
        r.mtok_s.push(m.tokens_per_s() / 1e6);
        r.ratio.push(m.tokens_per_s() / base.tokens_per_s());
        r.wire_bytes_per_token = m.wire_bytes_per_token();
        r.link_use.push(m.link_use(spec));
        r.cpu_per_gtok.push(m.cpu_per_gtok());
        r.cpu_ratio.push(m.cpu_per_gtok() / base.cpu_per_gtok());
        r.stall.push(m.consumer.stall_s / m.consumer.wall_s);
        r.max_wait_s.push(m.consumer.max_wait_s);
        r.killed.push(m.killed_after_s.is_some());
        r.consumer_rss = r.consumer_rss.max(m.consumer.peak_rss);
        for p in &m.servers {
            let i = match r.servers.iter().position(|x| x.name == p.name) {
                Some(i) => i,
                None => {
                    r.servers.push(ServerRow {
                        name: p.name.clone(),
                        peak_rss: 0,
                        cpu_per_gtok: vec![],
                        busiest_thread: p.busiest_thread.clone(),
                        busiest_share: vec![],
                    });
                    r.servers.len() - 1
                }
            };
            let x = &mut r.servers[i];
            x.peak_rss = x.peak_rss.max(p.peak_rss);
            x.cpu_per_gtok
                .push(p.cpu_s / m.consumer.tokens as f64 * 1e9);
            x.busiest_share.push(p.busiest_cpu_s / m.consumer.wall_s);
        }
    }
    rows
}

/// One of the goals, checked, with the figures it rests on.
#[derive(Clone, Debug, Serialize)]
pub struct Goal {
    pub what: String,
    pub target: String,
    pub got: String,
    pub met: bool,
    /// What bench/results.py records for this goal (figures.json).
    pub figures: Vec<Figure>,
}

/// One figure in bench/results.py's schema: `goal` is `">= X"`/`"<= X"` in `unit`, and the
/// generator decides from it whether the figure is met.
#[derive(Clone, Debug, Serialize)]
pub struct Figure {
    pub name: String,
    pub value: f64,
    pub unit: &'static str,
    pub baseline: String,
    pub goal: Option<String>,
}

/// The same run's baseline, as the figures name it.
const BASELINE: &str = "(a) S3 int32 + host-side narrowing, same run";

pub(super) fn figure(
    name: String,
    value: f64,
    unit: &'static str,
    baseline: &str,
    goal: Option<String>,
) -> Figure {
    // Three significant decimals are what the tables show; more is noise.
    let value = (value * 1000.0).round() / 1000.0;
    Figure {
        name,
        value,
        unit,
        baseline: baseline.to_string(),
        goal,
    }
}

/// Every goal's figures, in order: what `figures.json` holds.
pub(super) fn figures(goals: &[Goal]) -> Vec<Figure> {
    goals
        .iter()
        .flat_map(|g| g.figures.iter().cloned())
        .collect()
}

pub(super) fn goals(rows: &[Row]) -> Vec<Goal> {
    let mut g = Vec::new();
    let find = |corpus: &str, way: &Way| rows.iter().find(|r| r.corpus == corpus && &r.way == way);
    for (corpus, wire, target) in [("r50k", "u16", 1.9), ("o200k", "bits:18", 1.7)] {
        if let Some(r) = find(corpus, &Way::Agent { wire: wire.into() }) {
            let got = median(&r.ratio);
            let what = format!("(b) {wire} on {corpus}: tokens/s vs baseline");
            g.push(Goal {
                figures: vec![figure(
                    what.clone(),
                    got,
                    "×",
                    BASELINE,
                    Some(format!(">= {target}")),
                )],
                what,
                target: format!("≥ {target}×"),
                got: format!("{got:.2}× (runs {})", span(&r.ratio, |x| format!("{x:.2}"))),
                met: got >= target,
            });
        }
    }
    // (h): the mount, read as local files by the host's pipeline; its host CPU is the
    // consumer's and the mount process's together.
    for r in rows.iter().filter(|r| matches!(r.way, Way::Mount { .. })) {
        let got = median(&r.ratio);
        let mount_cpu = r
            .servers
            .iter()
            .find(|s| s.name == "host mount")
            .map_or(0.0, |s| median(&s.cpu_per_gtok));
        let consumer_cpu = median(&r.cpu_per_gtok);
        let base_cpu = consumer_cpu / median(&r.cpu_ratio).max(1e-12);
        let target = if r.bits <= 16 { 1.9 } else { 1.0 };
        let host_cpu = format!(
            "{} on {}: host CPU-s per 10⁹ tokens (consumer + mount)",
            r.label, r.corpus
        );
        let base_text = format!("{BASELINE}: {base_cpu:.1} CPU-s per 10⁹ tokens");
        g.push(Goal {
            figures: vec![
                figure(format!("{} on {}: tokens/s vs baseline", r.label, r.corpus), got, "×", BASELINE, Some(format!(">= {target}"))),
                figure(host_cpu, consumer_cpu + mount_cpu, "CPU-s", &base_text, None),
            ],
            what: format!("{} on {}: tokens/s vs baseline; host CPU", r.label, r.corpus),
            target: format!("≥ {target}×"),
            got: format!(
                "{got:.2}× (runs {}); host CPU {:.1} CPU-s / 10⁹ tok (consumer {consumer_cpu:.1} + mount {mount_cpu:.1}) vs the baseline's {base_cpu:.1}",
                span(&r.ratio, |x| format!("{x:.2}")),
                consumer_cpu + mount_cpu,
            ),
            met: got >= target,
        });
    }
    // Every compressed codec of (b) and (c), so that a codec that compresses best but is
    // CPU-bound shows beside one that fills the link.
    for r in rows.iter().filter(|r| match &r.way {
        Way::Agent { wire } => wire.contains('+'),
        Way::Chain { .. } => true,
        _ => false,
    }) {
        let (ratio, link) = (median(&r.ratio), median(&r.link_use));
        let name = |what: &str| format!("{} on {}: {what}", r.label, r.corpus);
        g.push(Goal {
            figures: vec![
                figure(
                    name("tokens/s vs baseline"),
                    ratio,
                    "×",
                    BASELINE,
                    Some(">= 3".into()),
                ),
                figure(
                    name("link use"),
                    link * 100.0,
                    "%",
                    "the link's rate",
                    Some(">= 90".into()),
                ),
            ],
            what: format!(
                "{} on {}: tokens/s vs baseline, and link use",
                r.label, r.corpus
            ),
            target: "≥ 3×, ≥ 90%".into(),
            got: format!("{ratio:.2}×, {:.1}%", link * 100.0),
            met: ratio >= 3.0 && link >= 0.9,
        });
    }
    // (g): N links against N × one link, the same way and codec.
    for r in rows.iter() {
        let Way::ScaleOut { n, wire } = &r.way else {
            continue;
        };
        if *n < 2 {
            continue;
        }
        let Some(one) = find(
            &r.corpus,
            &Way::ScaleOut {
                n: 1,
                wire: wire.clone(),
            },
        ) else {
            continue;
        };
        let (got, single) = (median(&r.mtok_s), median(&one.mtok_s));
        let ratio = got / (*n as f64 * single);
        let what = format!(
            "{} on {}: aggregate tokens/s vs {n} × one link",
            r.label, r.corpus
        );
        let one = format!("{n} × one link's {single:.1} M tokens/s, same run");
        g.push(Goal {
            figures: vec![figure(
                what.clone(),
                ratio,
                "×",
                &one,
                Some(">= 0.9".into()),
            )],
            what,
            target: "≥ 0.9×".into(),
            got: format!(
                "{ratio:.2}× ({got:.1} vs {n} × {single:.1} M tok/s; link use {:.0}%)",
                median(&r.link_use) * 100.0
            ),
            met: ratio >= 0.9,
        });
    }
    // (f): the stall a replica's death caused, beside the longest wait of the same chain
    // without a failure. The stream itself is checked against the baseline's in every run.
    for r in rows.iter() {
        let Way::Failover { wire } = &r.way else {
            continue;
        };
        let calm = find(&r.corpus, &Way::Chain { wire: wire.clone() });
        let calm_wait = calm.map_or(0.0, |c| median(&c.max_wait_s));
        let killed = r.killed.iter().filter(|&&k| k).count();
        let name = |what: &str| format!("{} on {}: {what}", r.label, r.corpus);
        let calm_text = format!("the same chain without a kill: {:.0} ms", calm_wait * 1e3);
        let runs = r.killed.len();
        g.push(Goal {
            figures: vec![
                figure(name("a replica SIGKILLed mid-stream: longest wait for a batch"), median(&r.max_wait_s) * 1e3, "ms", &calm_text, None),
                figure(name("runs whose replica was killed mid-stream, stream identical"), killed as f64, "runs", "every run's stream equals the baseline's", Some(format!(">= {runs}"))),
            ],
            what: format!(
                "{} on {}: a replica SIGKILLed mid-stream; longest wait for a batch",
                r.label, r.corpus
            ),
            target: "identical stream".into(),
            got: format!(
                "identical; {:.0} ms (runs {}; the same chain without a kill: {:.0} ms); killed in {killed}/{} runs",
                median(&r.max_wait_s) * 1e3,
                span(&r.max_wait_s, |x| format!("{:.0}", x * 1e3)),
                calm_wait * 1e3,
                r.killed.len()
            ),
            met: killed == r.killed.len(),
        });
    }
    for r in rows
        .iter()
        .filter(|r| matches!(r.way, Way::Chain { .. } | Way::S3Root))
    {
        let got = median(&r.cpu_ratio);
        let what = format!(
            "{} on {}: consumer CPU per token vs baseline",
            r.label, r.corpus
        );
        g.push(Goal {
            figures: vec![figure(
                what.clone(),
                got,
                "×",
                BASELINE,
                Some("<= 0.2".into()),
            )],
            what,
            target: "≤ 0.2×".into(),
            got: format!("{got:.3}×"),
            met: got <= 0.2,
        });
    }
    g
}

/// Where and how the run was made.
#[derive(Clone, Debug, Serialize)]
pub struct Meta {
    pub date: String,
    pub machine: String,
    pub command: String,
    pub commit: String,
    pub link: String,
    /// The link's rate, as given (`1gbit`).
    pub rate: String,
    pub plan: String,
    pub data: String,
    pub runs: u32,
    pub elapsed_s: f64,
    pub loadavg: String,
}

impl Meta {
    pub(super) fn collect(
        args: &Args,
        spec: &LinkSpec,
        size: u64,
        runs: u32,
        corpora: &[Corpus],
        elapsed: Duration,
    ) -> Meta {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
            })
            .unwrap_or_else(|| "unknown CPU".into());
        let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mem_gib = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                let l = m.lines().find(|l| l.starts_with("MemTotal:"))?;
                l.split_whitespace().nth(1)?.parse::<f64>().ok()
            })
            .map_or(0.0, |kib| kib / (1 << 20) as f64);
        let commit = Command::new("git")
            .args(["describe", "--always", "--dirty", "--abbrev=9"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let command = std::env::var("DQUANT_LAB_COMMAND")
            .unwrap_or_else(|_| std::env::args().collect::<Vec<_>>().join(" "));
        let data = corpora
            .iter()
            .map(|c| {
                format!(
                    "{} ({}-bit ids) {:.1} M tokens = {:.0} MB int32",
                    c.enc.name(),
                    c.enc.bits(),
                    c.tokens as f64 / 1e6,
                    c.tokens as f64 * 4.0 / 1e6
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        Meta {
            date: utc_human(),
            machine: format!("{cores} vCPU {cpu}, {mem_gib:.0} GiB, Linux {}", kernel.trim()),
            command,
            commit,
            link: format!("veth + tc tbf {} (mtu {}), namespaces {STORAGE_NS} → {HOST_NS}", spec.rate, spec.mtu),
            rate: spec.rate.clone(),
            plan: format!("seq_len {}, batch {}, unshuffled, 1 epoch; output u16 (16-bit) or i32; --size {size}", args.seq_len, args.batch_size),
            data,
            runs,
            elapsed_s: elapsed.as_secs_f64(),
            loadavg: crate::procs::loadavg(),
        }
    }

    pub(super) fn chart_title(&self) -> String {
        format!("dquant lab: storage → {} link → host", self.rate)
    }

    pub(super) fn chart_subtitle(&self) -> String {
        format!(
            "{} · {} · commit {} · {} run(s)",
            self.date, self.machine, self.commit, self.runs
        )
    }
}

fn mib(b: u64) -> String {
    format!("{:.0}", b as f64 / (1 << 20) as f64)
}

pub(super) fn render_table(meta: &Meta, rows: &[Row], goals: &[Goal]) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "## Benchmark lab: storage → NIC-bound link → host ({})",
        meta.date
    );
    let _ = writeln!(t);
    let _ = writeln!(
        t,
        "- Command: `{}` (commit {}, {} run(s), {:.0} s)",
        meta.command, meta.commit, meta.runs, meta.elapsed_s
    );
    let _ = writeln!(t, "- Machine: {}; load {}", meta.machine, meta.loadavg);
    let _ = writeln!(t, "- Link: {}", meta.link);
    let _ = writeln!(t, "- Data: {}", meta.data);
    let _ = writeln!(t, "- Plan: {}", meta.plan);
    let _ = writeln!(t, "- Ratios are against the baseline (a) of the same run and corpus; ranges are min–max over runs, single figures medians. Link use = bytes the storage veth sent ÷ (rate × wall time); stall = time the consumer spent inside open/next_batch ÷ wall time.");
    let _ = writeln!(t);
    let _ = writeln!(t, "| corpus | scenario | M tokens/s | vs baseline | link B/token | link use | consumer CPU-s / 10⁹ tok | CPU vs baseline | stall | consumer peak RSS MiB | servers: peak RSS MiB (VmHWM: pages of kept maps included), CPU-s / 10⁹ tok, busiest thread's share of wall time |");
    let _ = writeln!(t, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for r in rows {
        let servers = r
            .servers
            .iter()
            .map(|x| {
                format!(
                    "{} {} MiB, {:.1}, {} {:.0}%",
                    x.name,
                    mib(x.peak_rss),
                    median(&x.cpu_per_gtok),
                    x.busiest_thread,
                    median(&x.busiest_share) * 100.0
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        let _ = writeln!(
            t,
            "| {} ({}-bit) | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.corpus,
            r.bits,
            r.label,
            span(&r.mtok_s, |x| format!("{x:.1}")),
            span(&r.ratio, |x| format!("{x:.2}×")),
            if r.way.link_bound() {
                format!("{:.2}", r.wire_bytes_per_token)
            } else {
                "—".into()
            },
            if r.way.link_bound() {
                span(&r.link_use, |x| format!("{:.0}%", x * 100.0))
            } else {
                "—".into()
            },
            span(&r.cpu_per_gtok, |x| format!("{x:.1}")),
            span(&r.cpu_ratio, |x| format!("{x:.3}×")),
            span(&r.stall, |x| format!("{:.0}%", x * 100.0)),
            mib(r.consumer_rss),
            if servers.is_empty() {
                "—".into()
            } else {
                servers
            },
        );
    }
    let _ = writeln!(t);
    let _ = writeln!(t, "| goal | target | got | |");
    let _ = writeln!(t, "|---|---|---|---|");
    for g in goals {
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} |",
            g.what,
            g.target,
            g.got,
            if g.met { "✅" } else { "❌" }
        );
    }
    t
}

pub(super) fn panels(rows: &[Row]) -> Vec<chart::Panel> {
    let group = |r: &Row| format!("{} ({}-bit)", r.corpus, r.bits);
    // One colour for the narrowed codec of every corpus (u16, bits:17, bits:18).
    let label = |r: &Row| match &r.way {
        Way::Agent { wire } if !wire.contains('+') => "(b) agent, narrowed (u16 / bits:N)".into(),
        w => w.label(),
    };
    let bar = |r: &Row, value: f64, note: String| chart::Bar {
        group: group(r),
        label: label(r),
        value,
        note,
    };
    let speed = rows
        .iter()
        .filter(|r| r.way.link_bound())
        .map(|r| bar(r, median(&r.ratio), format!("{:.2}×", median(&r.ratio))))
        .collect();
    let cpu = rows
        .iter()
        .map(|r| {
            let v = median(&r.cpu_per_gtok);
            bar(r, v, format!("{v:.1}"))
        })
        .collect();
    vec![
        chart::Panel {
            title: "Tokens/s delivered over the link, × baseline (a)   [(d) in-process is in the table]".into(),
            y_label: "× baseline".into(),
            bars: speed,
            reference: Some((1.0, "baseline".into())),
        },
        chart::Panel {
            title: "Consumer CPU-seconds per 10⁹ tokens (lower is better)".into(),
            y_label: "CPU-s / 10⁹ tokens".into(),
            bars: cpu,
            reference: None,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::consume;

    fn measure(run: u32, corpus: &str, way: Way, tokens: u64, wall_s: f64, cpu_s: f64) -> Measure {
        Measure {
            run,
            corpus: corpus.into(),
            way,
            consumer: consume::Consumed {
                tokens,
                batches: 1,
                wall_s,
                stall_s: wall_s / 2.0,
                first_batch_s: 0.0,
                max_wait_s: 0.01,
                cpu_s,
                peak_rss: 1 << 20,
                xxh3: "0".into(),
            },
            link_down: tokens * 2,
            link_up: 0,
            servers: vec![],
            killed_after_s: None,
            links: 1,
        }
    }

    #[test]
    fn history_is_appended_to() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("lab.md");
        append_to_history(&f, "## one\n\n| t |\n").unwrap();
        append_to_history(&f, "## two\n").unwrap();
        assert_eq!(
            std::fs::read_to_string(&f).unwrap(),
            "## one\n\n| t |\n\n## two\n\n"
        );
    }

    #[test]
    fn ratios_are_against_the_same_runs_baseline_and_goals_follow_them() {
        let spec = LinkSpec::new("1gbit", 1500).unwrap();
        let u16 = Way::Agent { wire: "u16".into() };
        let zstd = Way::Agent {
            wire: "auto+zstd:1".into(),
        };
        let chain = Way::Chain {
            wire: "auto+lz4".into(),
        };
        // Run 2's baseline is twice as fast as run 1's: each run is compared with its own.
        let all = vec![
            measure(1, "r50k", Way::Baseline, 1_000_000, 1.0, 0.010),
            measure(1, "r50k", u16.clone(), 1_950_000, 1.0, 0.002),
            measure(1, "r50k", zstd.clone(), 3_500_000, 1.0, 0.004),
            measure(1, "r50k", chain.clone(), 3_100_000, 1.0, 0.001),
            measure(2, "r50k", Way::Baseline, 2_000_000, 1.0, 0.020),
            measure(2, "r50k", u16.clone(), 3_800_000, 1.0, 0.004),
            measure(2, "r50k", zstd.clone(), 7_000_000, 1.0, 0.008),
            measure(2, "r50k", chain.clone(), 6_000_000, 1.0, 0.005),
        ];
        let rows = summarize(&all, &spec);
        let row = |w: &Way| rows.iter().find(|r| &r.way == w).unwrap();
        assert_eq!(row(&u16).ratio, vec![1.95, 1.9]);
        assert_eq!(row(&zstd).ratio, vec![3.5, 3.5]);
        assert_eq!(row(&chain).mtok_s, vec![3.1, 6.0]);
        // 2 link bytes per token; 1.95 M tokens/s = 3.9 MB/s of a 125 MB/s link.
        assert!((row(&u16).link_use[0] - 3.9e6 / 125e6).abs() < 1e-12);
        let g = goals(&rows);
        // The figures bench/results.py records carry the goals' own thresholds.
        let f = figures(&g);
        let goal_of = |name: &str| {
            f.iter()
                .find(|x| x.name == name)
                .and_then(|x| x.goal.clone())
        };
        assert_eq!(
            goal_of("(b) u16 on r50k: tokens/s vs baseline").as_deref(),
            Some(">= 1.9")
        );
        assert_eq!(f[0].value, 1.925);
        assert_eq!(
            goal_of("(c) chain auto+lz4 + shm on r50k: link use").as_deref(),
            Some(">= 90")
        );
        let got: Vec<(&str, bool)> = g.iter().map(|g| (g.what.as_str(), g.met)).collect();
        assert_eq!(
            got,
            vec![
                ("(b) u16 on r50k: tokens/s vs baseline", true),
                (
                    "(b) agent auto+zstd:1 on r50k: tokens/s vs baseline, and link use",
                    false
                ),
                (
                    "(c) chain auto+lz4 + shm on r50k: tokens/s vs baseline, and link use",
                    false
                ),
                (
                    "(c) chain auto+lz4 + shm on r50k: consumer CPU per token vs baseline",
                    true
                ),
            ]
        );
        // The chain's CPU per token: 0.001/3.1M against 0.01/1M, and 0.005/6M against 0.02/2M.
        let c = &row(&chain).cpu_ratio;
        assert!((c[0] - 0.1 / 3.1).abs() < 1e-9 && (c[1] - 0.25 / 3.0).abs() < 1e-9);
        assert!(g[3].got.starts_with("0.058×"), "{}", g[3].got);
    }
}
