//! Memory: the agent process's resident set while it streams a dataset many times larger
//! than its memory limit (64 MiB plus the session's prefetch budget).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use dquant_client::{open, Offload};
use serde_json::json;

use crate::procs::{self, AgentProc};
use crate::report::{f, mib, Table};
use crate::PlanOpts;

const EXAMPLES: &str = "\
Examples:
  dquant-offload-bench rss /data/zipf1g_u16
  dquant-offload-bench rss /data/zipf10g --passes 1 --json > rss.json";

/// Agent memory (VmRSS) while streaming, against its limit.
///
/// Samples the agent process's VmRSS (/proc/PID/status) every --interval-ms while one
/// consumer streams the whole dataset through it --passes times, and compares the peak with
/// the limit: --base-mib plus the prefetch budget (prefetch frames × 1 MiB).
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    #[command(flatten)]
    pub plan: PlanOpts,
    /// The agent's prefetch frames (1 MiB each) per session.
    #[arg(long, default_value_t = dquant_agent::DEFAULT_PREFETCH)]
    pub prefetch_frames: usize,
    /// Streams of the whole plan, one after another (a new session each).
    #[arg(long, default_value_t = 1)]
    pub passes: usize,
    /// Read the dataset in stored order (default: shuffled).
    #[arg(long)]
    pub no_shuffle: bool,
    /// Sampling interval.
    #[arg(long, default_value_t = 100)]
    pub interval_ms: u64,
    /// The limit's fixed part, MiB; the prefetch budget is added to it.
    #[arg(long, default_value_t = 64)]
    pub base_mib: u64,
    #[command(flatten)]
    pub out: crate::report::JsonOpts,
}

pub fn run(a: &Args) -> Result<()> {
    let ds = a.plan.dataset()?;
    if a.passes == 0 {
        bail!("--passes must be at least 1");
    }
    // The limit is on the agent's own memory. Pages of maps it keeps for narrowing are the
    // page cache's, yet VmRSS and VmHWM count them, so this agent reads by pread (a map
    // budget of 0): what it allocates per session is the same either way, or more.
    let no_maps = ["--map-budget".to_string(), "0".to_string()];
    let agent = AgentProc::spawn_flags(&ds.dir, a.prefetch_frames, false, &no_maps)?;
    let pid = agent.pid();
    std::thread::sleep(Duration::from_millis(500));
    let start_kib = procs::status_kib(pid, "VmRSS")?;

    let t0 = Instant::now();
    let samples: Arc<Mutex<Vec<(f64, u64)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (samples, stop) = (samples.clone(), stop.clone());
        let every = Duration::from_millis(a.interval_ms.max(1));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(k) = procs::status_kib(pid, "VmRSS") {
                    samples
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((t0.elapsed().as_secs_f64(), k));
                }
                std::thread::sleep(every);
            }
        })
    };

    let plan = a.plan.plan(&ds.remote(), !a.no_shuffle);
    let mut bytes = 0u64;
    let mut pass_ends = Vec::new();
    // Per pass: (VmHWM right after open(), VmRSS right after the stream ended).
    let mut per_pass: Vec<(u64, u64)> = Vec::new();
    for pass in 1..=a.passes {
        let mut r = open(&agent.uri, &plan, Offload::Yes)?;
        let hwm_open = procs::status_kib(pid, "VmHWM")?;
        while let Some(b) = r.next_batch()? {
            bytes += b.tokens.as_bytes().len() as u64;
        }
        drop(r);
        pass_ends.push(t0.elapsed().as_secs_f64());
        let rss_end = procs::status_kib(pid, "VmRSS")?;
        per_pass.push((hwm_open, rss_end));
        eprintln!(
            "pass {pass}/{}: {:.2} GB streamed so far, agent VmRSS {} MiB",
            a.passes,
            bytes as f64 / 1e9,
            mib(rss_end)
        );
    }
    let stream_secs = t0.elapsed().as_secs_f64();
    // Let the finished session's threads exit and free their pool.
    std::thread::sleep(Duration::from_millis(500));
    let end_kib = procs::status_kib(pid, "VmRSS")?;
    let hwm_kib = procs::status_kib(pid, "VmHWM")?;
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    drop(agent);

    let samples = std::mem::take(&mut *samples.lock().unwrap_or_else(PoisonError::into_inner));
    let (max_t, max_kib) = samples
        .iter()
        .copied()
        .max_by_key(|&(_, k)| k)
        .unwrap_or((0.0, start_kib));
    let limit_kib = (a.base_mib + a.prefetch_frames as u64) * 1024;
    // Bytes the agent read from storage: the streamed tokens at the stored width.
    let stored_item = std::fs::metadata(ds.bin())?.len() as f64 / ds.tokens()? as f64;
    let source_bytes = (bytes / a.plan.output_itemsize()) as f64 * stored_item;
    let ok = max_kib <= limit_kib && hwm_kib <= limit_kib;
    {
        let out = json!({
            "bench": "rss", "dataset": ds.local(), "dataset_bytes_on_disk": ds.bytes_on_disk(),
            "plan": a.plan.describe(), "shuffle": !a.no_shuffle, "passes": a.passes,
            "prefetch_frames": a.prefetch_frames, "interval_ms": a.interval_ms,
            "payload_bytes": bytes, "storage_bytes_read": source_bytes, "stream_seconds": stream_secs, "pass_end_seconds": pass_ends,
            "rss_start_kib": start_kib, "rss_max_kib": max_kib, "rss_max_at_s": max_t,
            "rss_end_kib": end_kib, "vm_hwm_kib": hwm_kib, "limit_kib": limit_kib,
            "per_pass": per_pass.iter().map(|&(h, e)| json!({"vm_hwm_after_open_kib": h, "rss_after_stream_kib": e})).collect::<Vec<_>>(),
            "within_limit": ok, "samples": samples,
        });
        if a.out.emit(&out)? {
            return Ok(());
        }
    }
    println!(
        "{} × {} pass(es), shuffle={}; plan: {}",
        ds.describe(),
        a.passes,
        !a.no_shuffle,
        a.plan.describe()
    );
    println!(
        "streamed {:.2} GB of batch payload ({:.2} GB read from storage) in {:.1} s; {} samples of VmRSS every {} ms\n",
        bytes as f64 / 1e9,
        source_bytes / 1e9,
        stream_secs,
        samples.len(),
        a.interval_ms
    );
    let mut t = Table::new(&["agent process", "MiB"]);
    t.row(vec!["VmRSS at start (agent idle)".into(), mib(start_kib)]);
    t.row(vec![
        format!("VmRSS max of samples (at {max_t:.1} s)"),
        mib(max_kib),
    ]);
    for (i, &(h, e)) in per_pass.iter().enumerate() {
        t.row(vec![
            format!("pass {}: VmHWM right after open()", i + 1),
            mib(h),
        ]);
        t.row(vec![
            format!("pass {}: VmRSS right after the stream", i + 1),
            mib(e),
        ]);
    }
    t.row(vec!["VmRSS at end (session closed)".into(), mib(end_kib)]);
    t.row(vec!["VmHWM (peak, whole life)".into(), mib(hwm_kib)]);
    t.row(vec![
        format!(
            "limit: {} MiB + {} prefetch frames × 1 MiB",
            a.base_mib, a.prefetch_frames
        ),
        mib(limit_kib),
    ]);
    t.print();
    println!(
        "\npeak / limit = {}; growth max − start = {} MiB; storage bytes streamed / limit = {:.0}×; {}",
        f(max_kib.max(hwm_kib) as f64 / limit_kib as f64, 2),
        mib(max_kib.saturating_sub(start_kib)),
        source_bytes / (limit_kib as f64 * 1024.0),
        if ok { "WITHIN the limit" } else { "OVER the limit" }
    );
    Ok(())
}
