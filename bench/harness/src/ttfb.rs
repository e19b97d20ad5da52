//! Time to first batch: wall time from `open()` to the first batch returned, through an
//! already-running agent and in-process, on a large (10 GB) dataset with a shuffled plan.

use std::time::Instant;

use anyhow::{bail, Result};
use dquant_client::{open, Control, Offload};
use dquant_proto::v1::OpenRequest;
use serde_json::json;

use crate::procs::{self, AgentProc};
use crate::report::{f, ms, spread, Table};
use crate::{DataSpec, PlanOpts};

const EXAMPLES: &str = "\
Examples:
  dquant-offload-bench ttfb /data/zipf10g
  dquant-offload-bench ttfb /data/zipf10g --repeats 7 --cold --json > ttfb.json";

/// Time from open() to the first batch: through a running agent and in-process.
///
/// Wall time from `open()` to the first batch returned, through an agent that is already
/// running (another process) and in-process (Offload::No), alternating, --repeats times each.
/// With --cold, also with the dataset's .bin and .idx dropped from the page cache before each
/// open (posix_fadvise DONTNEED on those two files only), through a freshly started agent
/// (an agent keeps a dataset it served open, and its maps keep the pages cached).
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    #[command(flatten)]
    pub plan: PlanOpts,
    /// Measurements of each case.
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
    /// Also measure with the dataset's files evicted from the page cache.
    #[arg(long)]
    pub cold: bool,
    /// Read the dataset in stored order (default: shuffled).
    #[arg(long)]
    pub no_shuffle: bool,
    /// The agent's prefetch frames (1 MiB each) per session.
    #[arg(long, default_value_t = dquant_agent::DEFAULT_PREFETCH)]
    pub prefetch_frames: usize,
    #[command(flatten)]
    pub out: crate::report::JsonOpts,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Case {
    Agent,
    Inproc,
}

/// The agent's `open()` taken apart with the client's public pieces (what `Reader::remote`
/// does): gRPC connect, the `Open` call (the agent opens the sources and builds the
/// schedule), the data connection with its hello.
struct Phases {
    connect_s: f64,
    /// A `List` call: a control-plane round trip with next to no work behind it.
    list_s: f64,
    open_rpc_s: f64,
    data_s: f64,
}

fn phases(a: &Args, ds: &DataSpec, agent: &AgentProc) -> Result<Phases> {
    let plan = a.plan.plan(&ds.remote(), !a.no_shuffle);
    let authority = agent.uri.trim_start_matches("dquant://").to_string();
    let t0 = Instant::now();
    let control = Control::connect(&authority)?;
    let tl = Instant::now();
    control.list("bench")?;
    let list_s = tl.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let reply = control.open(OpenRequest {
        plan_json: plan.to_json(),
        epoch: 0,
        consumed_samples: 0,
        ..Default::default()
    })?;
    let t2 = Instant::now();
    let (_w, records) = control.connect_data(&reply)?;
    let t3 = Instant::now();
    drop(records);
    let _ = control.close(reply.session, &reply.ticket);
    Ok(Phases {
        connect_s: (tl - t0).as_secs_f64(),
        list_s,
        open_rpc_s: (t2 - t1).as_secs_f64(),
        data_s: (t3 - t2).as_secs_f64(),
    })
}

struct M {
    case: Case,
    cold: bool,
    open_s: f64,
    first_s: f64,
    /// Minor page faults in the process running the plan, open() to first batch.
    faults: u64,
}

fn once(a: &Args, ds: &DataSpec, agent: &AgentProc, case: Case, cold: bool) -> Result<M> {
    if cold {
        procs::drop_file_cache(&ds.bin())?;
        procs::drop_file_cache(&ds.idx())?;
    }
    let shuffle = !a.no_shuffle;
    // Page faults of the process that runs the plan: the agent, or this one.
    let faults = || match case {
        Case::Agent => procs::proc_minflt(agent.pid()),
        Case::Inproc => Ok(procs::self_minflt()),
    };
    let f0 = faults()?;
    let t0 = Instant::now();
    let mut r = match case {
        Case::Agent => open(
            &agent.uri,
            &a.plan.plan(&ds.remote(), shuffle),
            Offload::Yes,
        )?,
        Case::Inproc => open("", &a.plan.plan(&ds.local(), shuffle), Offload::No)?,
    };
    let t1 = Instant::now();
    let samples = match r.next_batch()? {
        Some(b) => b.samples,
        None => bail!("the plan yields no batch"),
    };
    let t2 = Instant::now();
    let faults = faults()? - f0;
    drop(r);
    if samples != a.plan.batch_size as usize {
        bail!(
            "the first batch has {samples} samples, expected {}",
            a.plan.batch_size
        );
    }
    Ok(M {
        case,
        cold,
        open_s: (t1 - t0).as_secs_f64(),
        first_s: (t2 - t1).as_secs_f64(),
        faults,
    })
}

pub fn run(a: &Args) -> Result<()> {
    let ds = a.plan.dataset()?;
    if a.repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    let agent = AgentProc::spawn(&ds.dir, a.prefetch_frames, false)?;
    // One of each first, not counted: starts the client's control runtime and brings the
    // dataset's index into the page cache.
    once(a, &ds, &agent, Case::Agent, false)?;
    once(a, &ds, &agent, Case::Inproc, false)?;
    let temps: &[bool] = if a.cold { &[false, true] } else { &[false] };
    let mut all = Vec::new();
    for i in 1..=a.repeats {
        for &cold in temps {
            for case in [Case::Agent, Case::Inproc] {
                // A cold open through the agent is a fresh agent's: one that served the
                // dataset before keeps it open, its maps holding the files' pages in the page
                // cache, where dropping them cannot reach.
                let fresh = match (cold, case) {
                    (true, Case::Agent) => {
                        Some(AgentProc::spawn(&ds.dir, a.prefetch_frames, false)?)
                    }
                    _ => None,
                };
                let m = once(a, &ds, fresh.as_ref().unwrap_or(&agent), case, cold)?;
                eprintln!(
                    "repeat {i}/{}: {:<10} {:<4} open {:>8} ms, first batch {:>8} ms",
                    a.repeats,
                    if case == Case::Agent {
                        "agent"
                    } else {
                        "in-process"
                    },
                    if cold { "cold" } else { "warm" },
                    ms(m.open_s),
                    ms(m.first_s)
                );
                all.push(m);
            }
        }
    }
    let mut ph = Vec::new();
    for _ in 0..a.repeats {
        ph.push(phases(a, &ds, &agent)?);
    }
    drop(agent);

    let label = |case: Case, cold: bool| {
        format!(
            "{}, {} cache",
            match (case, cold) {
                (Case::Agent, false) => "agent (running)",
                (Case::Agent, true) => "agent (fresh)",
                (Case::Inproc, _) => "in-process",
            },
            if cold { "cold" } else { "warm" }
        )
    };
    let median_total = |case: Case, cold: bool| {
        let xs: Vec<f64> = all
            .iter()
            .filter(|m| m.case == case && m.cold == cold)
            .map(|m| m.open_s + m.first_s)
            .collect();
        spread(&xs).1
    };
    {
        let rows: Vec<_> = all
            .iter()
            .map(|m| {
                json!({
                    "case": if m.case == Case::Agent { "agent" } else { "inproc" },
                    "cold": m.cold, "open_s": m.open_s, "first_batch_s": m.first_s,
                    "total_s": m.open_s + m.first_s, "minor_page_faults": m.faults,
                })
            })
            .collect();
        let out = json!({
            "bench": "ttfb", "dataset": ds.local(), "dataset_bytes_on_disk": ds.bytes_on_disk(),
            "plan": a.plan.describe(), "shuffle": !a.no_shuffle, "repeats": a.repeats,
            "measurements": rows,
            "agent_open_phases_warm": ph.iter().map(|p| json!({
                "grpc_connect_s": p.connect_s, "list_rpc_s": p.list_s, "open_rpc_s": p.open_rpc_s, "data_connect_s": p.data_s,
            })).collect::<Vec<_>>(),
            "median_total_s": temps.iter().map(|&c| json!({
                "cold": c, "agent": median_total(Case::Agent, c), "inproc": median_total(Case::Inproc, c),
            })).collect::<Vec<_>>(),
        });
        if a.out.emit(&out)? {
            return Ok(());
        }
    }
    println!(
        "{}; plan: {}, shuffle={}; {} repeats each, medians (min–max) in ms;\npage faults: minor faults of the process running the plan (agent or this one), median\n",
        ds.describe(),
        a.plan.describe(),
        !a.no_shuffle,
        a.repeats
    );
    let mut t = Table::new(&[
        "case",
        "open()",
        "open → first batch",
        "total",
        "total min–max",
        "ratio to in-process",
        "page faults",
    ]);
    for &cold in temps {
        for case in [Case::Agent, Case::Inproc] {
            let of: Vec<&M> = all
                .iter()
                .filter(|m| m.case == case && m.cold == cold)
                .collect();
            let o = spread(&of.iter().map(|m| m.open_s).collect::<Vec<_>>()).1;
            let fb = spread(&of.iter().map(|m| m.first_s).collect::<Vec<_>>()).1;
            let (lo, med, hi) =
                spread(&of.iter().map(|m| m.open_s + m.first_s).collect::<Vec<_>>());
            t.row(vec![
                label(case, cold),
                ms(o),
                ms(fb),
                ms(med),
                format!("{}–{}", ms(lo), ms(hi)),
                f(med / median_total(Case::Inproc, cold), 2),
                f(
                    spread(&of.iter().map(|m| m.faults as f64).collect::<Vec<_>>()).1,
                    0,
                ),
            ]);
        }
    }
    t.print();
    println!(
        "\nthe agent's open() taken apart (warm cache; {} repeats; ms)\n",
        a.repeats
    );
    let mut t = Table::new(&["phase", "median", "min–max"]);
    for (what, xs) in [
        (
            "gRPC connect (Control::connect)",
            ph.iter().map(|p| p.connect_s).collect::<Vec<_>>(),
        ),
        (
            "Open call (sources + schedule on the agent)",
            ph.iter().map(|p| p.open_rpc_s).collect(),
        ),
        (
            "data connection + hello",
            ph.iter().map(|p| p.data_s).collect(),
        ),
    ] {
        let (lo, med, hi) = spread(&xs);
        t.row(vec![what.into(), ms(med), format!("{}–{}", ms(lo), ms(hi))]);
    }
    t.print();
    Ok(())
}
