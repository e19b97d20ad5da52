//! `dquant sums`: write or check the chunk sums sidecar of a Megatron dataset
//! (`PREFIX.dqsum`, see [`dquant_format::chunk_sums`]).
//!
//! A Megatron `.bin` has no checksums, so a bit flipped on one replica's disk would be
//! served. With the sidecar beside it (copied with the dataset), every read checks the chunks
//! it touches, an agent fails that read instead of serving it, and a replicated source reads
//! it from another replica. `--check` reads the whole file and lists every chunk that differs,
//! for an operator scrubbing a replica.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use dquant_format::chunk_sums::{ChunkSums, ChunkSumsBuilder, DEFAULT_CHUNK};
use dquant_storage::{megatron_prefix_of, Dataset, Destination, LocalFiles, OpenOptions, SUMS_EXT};
use serde_json::json;

use crate::util::{self, OutputOpts};

const EXAMPLES: &str = "\
Examples:
  dquant sums data/web_int32                 # writes data/web_int32.dqsum
  dquant sums data/web_int32 --check         # exit 1 if any chunk of the .bin differs
  dquant sums data/web_int32 --chunk-kib 16  # smaller chunks: less read per check, 4x the sidecar
Copy PREFIX.dqsum with PREFIX.bin and PREFIX.idx: readers and agents check every read of the
.bin against it, and replicas whose sidecars differ are refused at open.";

/// Write a Megatron dataset's chunk sums sidecar (PREFIX.dqsum: a crc32c per chunk of the
/// .bin), or check the .bin against the one it has.
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// The dataset: PREFIX, PREFIX.bin or PREFIX.idx.
    pub prefix: PathBuf,
    /// Check the .bin against its sidecar instead of writing one; every chunk that differs
    /// is listed.
    #[arg(long)]
    pub check: bool,
    /// Chunk size in KiB, a power of two from 4 to 65536 (ignored with --check, which uses
    /// the sidecar's).
    #[arg(long, default_value_t = DEFAULT_CHUNK >> 10)]
    pub chunk_kib: u32,
    #[command(flatten)]
    pub output: OutputOpts,
}

pub fn run(a: &Args) -> Result<i32> {
    let prefix = megatron_prefix_of(&a.prefix);
    let bin = with_ext(&prefix, ".bin");
    let sidecar = with_ext(&prefix, SUMS_EXT);
    if a.check {
        return check(&bin, &sidecar, &a.output);
    }
    let chunk = a
        .chunk_kib
        .checked_mul(1024)
        .with_context(|| format!("--chunk-kib {} is too large", a.chunk_kib))?;
    let sums = sum(&bin, chunk, a.output.quiet())?;
    let bytes = sums.encode();
    let mut out = LocalFiles.stage(&sidecar)?;
    out.write_all(&bytes)
        .and_then(|()| out.commit())
        .with_context(|| sidecar.display().to_string())?;
    let report = json!({
        "sidecar": sidecar,
        "data": bin,
        "bytes": sums.data_len(),
        "chunk_bytes": sums.chunk(),
        "chunks": sums.chunks(),
        "digest": sums.digest(),
    });
    if a.output.json {
        util::write_json(&report)?;
    } else {
        println!(
            "{}: {} chunks of {} KiB over {} bytes of {} ({})",
            sidecar.display(),
            util::thousands(sums.chunks()),
            sums.chunk() >> 10,
            util::thousands(sums.data_len()),
            bin.display(),
            sums.digest()
        );
    }
    Ok(0)
}

/// Checks `bin` against `sidecar`: 0 when every chunk matches, 1 (with each chunk that
/// differs listed) otherwise. The sidecar is read as every open reads it (bounded by what its
/// `.bin` can need, refused when stale), by opening the dataset.
fn check(bin: &Path, sidecar: &Path, output: &OutputOpts) -> Result<i32> {
    let ds = Dataset::open(&megatron_prefix_of(bin), &OpenOptions::default())?;
    let Some((want, _)) = ds.chunk_sums() else {
        bail!(
            "{}: no chunk sums sidecar; write one with `dquant sums {}`",
            sidecar.display(),
            megatron_prefix_of(bin).display()
        );
    };
    let got = sum(bin, want.chunk(), output.quiet())?;
    if got.data_len() != want.data_len() {
        bail!(
            "{}: covers {} bytes of {}, which has {}: the sidecar is stale; write it again",
            sidecar.display(),
            want.data_len(),
            bin.display(),
            got.data_len()
        );
    }
    let bad: Vec<u64> = (0..want.chunks())
        .filter(|&i| got.crc(i) != want.crc(i))
        .collect();
    if output.json {
        util::write_json(&json!({
            "sidecar": sidecar,
            "data": bin,
            "chunks": want.chunks(),
            "bad_chunks": bad.iter().map(|&i| {
                let r = want.chunk_bytes(i);
                json!({"chunk": i, "start": r.start, "end": r.end})
            }).collect::<Vec<_>>(),
        }))?;
    } else {
        for &i in &bad {
            let r = want.chunk_bytes(i);
            println!(
                "{}: chunk {i} (bytes {}..{}) differs from {}",
                bin.display(),
                r.start,
                r.end,
                sidecar.display()
            );
        }
        println!(
            "{}: {} of {} chunks differ",
            bin.display(),
            bad.len(),
            util::thousands(want.chunks())
        );
    }
    Ok(i32::from(!bad.is_empty()))
}

/// The chunk sums of the whole file `bin`, read front to back with a progress bar.
fn sum(bin: &Path, chunk: u32, quiet: bool) -> Result<ChunkSums> {
    let name = || bin.display().to_string();
    let mut b =
        ChunkSumsBuilder::new(chunk).with_context(|| format!("--chunk-kib {}", chunk >> 10))?;
    let mut f = File::open(bin).with_context(name)?;
    let len = f.metadata().with_context(name)?.len();
    let pb = util::bytes_bar(len, "summing", quiet);
    let mut buf = vec![0u8; 8 << 20];
    loop {
        let n = f.read(&mut buf).with_context(name)?;
        if n == 0 {
            break;
        }
        b.update(&buf[..n]);
        pb.inc(n as u64);
    }
    pb.finish_and_clear();
    Ok(b.finish())
}

fn with_ext(prefix: &Path, ext: &str) -> PathBuf {
    let mut p = prefix.as_os_str().to_os_string();
    p.push(ext);
    PathBuf::from(p)
}
