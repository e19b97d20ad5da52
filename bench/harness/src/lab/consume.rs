//! The lab's consumer process (`dquant-offload-bench lab-consume`, hidden): the training
//! host's data loader, run inside the `host` namespace so that its CPU and memory are its own.
//!
//! It opens one plan one of three ways (the baseline's in-process pipeline over S3 ranged
//! GETs, an agent over TCP or shared memory, or in-process on local files), reads every batch,
//! hashes it (a consumer must touch what it gets) and prints one JSON line: tokens, wall time,
//! time spent waiting inside `next_batch`, its own CPU time and peak RSS, and the stream's
//! xxh3, which the lab compares across scenarios.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dquant_client::{Offload, Reader};
use dquant_engine::{LocalSource, SourceError, TokenSource};
use dquant_format::DType;
use dquant_objstore::{ObjectRoot, S3Location};
use dquant_plan::{Cursor, Plan};
use dquant_storage::{Dataset, OpenOptions};
use serde_json::json;
use xxhash_rust::xxh3::Xxh3;

/// Scheme of plan sources the consumer reads from the lab's S3 server (`s3://BUCKET/KEY`).
pub const S3_SCHEME: &str = "s3://";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The plan, as JSON.
    #[arg(long)]
    pub plan: String,
    /// Offload to this agent (`dquant://HOST:PORT`, or a Unix socket path for shared memory).
    #[arg(long)]
    pub agent: Option<String>,
    /// S3 endpoint for `s3://` plan sources (e.g. http://10.77.0.1:9000).
    #[arg(long)]
    pub s3_endpoint: Option<String>,
}

/// What one consumer run measured.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Consumed {
    pub tokens: u64,
    pub batches: u64,
    /// From before `open` to after the last batch.
    pub wall_s: f64,
    /// Time inside `open` and `next_batch`: waiting for (or, in-process, making) data.
    pub stall_s: f64,
    pub first_batch_s: f64,
    /// The longest single wait inside `next_batch` (a failover's stall shows here).
    #[serde(default)]
    pub max_wait_s: f64,
    /// User + system CPU of the whole consumer process, all threads.
    pub cpu_s: f64,
    pub peak_rss: u64,
    pub xxh3: String,
}

/// `(bucket, key)` of an `s3://BUCKET/KEY` source.
fn s3_parts(uri: &str) -> Result<(&str, &str), SourceError> {
    uri.strip_prefix(S3_SCHEME)
        .and_then(|r| r.split_once('/'))
        .ok_or_else(|| SourceError::Usage(format!("{uri}: expected s3://BUCKET/KEY")))
}

/// Opens an `s3://BUCKET/KEY` source through `root`, the bucket's object-store root: a raw
/// token object of the source's dtype (default `i32`), read by ranged GETs in this process.
fn s3_source(
    root: &ObjectRoot,
    bucket: &str,
    uri: &str,
    dtype: Option<&str>,
) -> Result<Box<dyn TokenSource>, SourceError> {
    let (b, key) = s3_parts(uri)?;
    if b != bucket {
        return Err(SourceError::Usage(format!(
            "{uri}: every s3:// source must be in bucket {bucket}, the first source's"
        )));
    }
    let dtype: DType = dtype
        .unwrap_or("i32")
        .parse()
        .map_err(|e| SourceError::Usage(format!("{uri}: {e}")))?;
    let opts = OpenOptions {
        raw_dtype: Some(dtype),
        eod: None,
    };
    Ok(Box::new(LocalSource::new(Dataset::open_in(
        root, key, &opts,
    )?)))
}

/// Opens the plan the way `args` says.
fn open(args: &Args, plan: &Plan) -> Result<Reader> {
    if let Some(agent) = &args.agent {
        return Ok(dquant_client::open(agent, plan, Offload::Yes)?);
    }
    let uses_s3 = plan.sources.iter().any(|s| s.uri.starts_with(S3_SCHEME));
    if !uses_s3 {
        return Ok(dquant_client::open("", plan, Offload::No)?);
    }
    let endpoint = args
        .s3_endpoint
        .as_deref()
        .context("s3:// sources need --s3-endpoint")?;
    let (bucket, _) = s3_parts(&plan.sources[0].uri)?;
    let at = S3Location {
        bucket: bucket.to_string(),
        prefix: String::new(),
    };
    let root = ObjectRoot::s3(&at, &super::s3_settings(endpoint))?;
    Ok(Reader::local_with(plan, Cursor::START, |_, s| {
        s3_source(&root, bucket, &s.uri, s.dtype.as_deref())
    })?)
}

/// Reads the whole plan and measures it.
pub fn consume(args: &Args) -> Result<Consumed> {
    let plan: Plan = serde_json::from_str(&args.plan).context("--plan is not a plan (JSON)")?;
    let t0 = Instant::now();
    let mut reader = open(args, &plan)?;
    let mut stall = t0.elapsed();
    let mut first = None;
    let mut h = Xxh3::new();
    let (mut tokens, mut batches) = (0u64, 0u64);
    let mut max_wait = Duration::ZERO;
    loop {
        let t = Instant::now();
        let batch = reader.next_batch()?;
        stall += t.elapsed();
        if batches > 0 {
            max_wait = max_wait.max(t.elapsed());
        }
        let Some(b) = batch else { break };
        first.get_or_insert_with(|| t0.elapsed());
        h.update(b.tokens.as_bytes());
        tokens += b.tokens.len() as u64;
        batches += 1;
    }
    let wall = t0.elapsed();
    drop(reader);
    // SAFETY: getrusage writes into the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    if tokens == 0 {
        bail!("the plan delivered no tokens");
    }
    Ok(Consumed {
        tokens,
        batches,
        wall_s: wall.as_secs_f64(),
        stall_s: stall.as_secs_f64(),
        first_batch_s: first.unwrap_or(Duration::ZERO).as_secs_f64(),
        max_wait_s: max_wait.as_secs_f64(),
        cpu_s: secs(ru.ru_utime) + secs(ru.ru_stime),
        peak_rss: ru.ru_maxrss as u64 * 1024,
        xxh3: format!("{:016x}", h.digest()),
    })
}

/// The hidden subcommand: consume, print one JSON line.
pub fn run(args: &Args) -> Result<()> {
    let c = consume(args)?;
    println!("{}", json!(c));
    Ok(())
}
