//! `dquant inspect`: what a dataset holds and what it would cost under every codec.

use std::path::PathBuf;

use anyhow::Result;
use dquant_codec::{bits_needed, kernels, Codec, Compression, TokenHasher, Width};
use dquant_format::block::{block_tokens_for, BlockFileWriter, FileHeader, DEFAULT_BLOCK_BYTES};
use dquant_format::{megatron, ContentChecksum, DType};
use dquant_storage::Dataset;
use serde_json::json;

use crate::util::{self, InputOpts, OutputOpts};

const EXAMPLES: &str = "\
Examples:
  dquant inspect data/web_int32                 # a Megatron prefix
  dquant inspect data/web.dqb --json
  dquant inspect tokens.u16 --dtype u16 --eod 50256
  dquant inspect data/web_int32 --codecs u16,u16+zstd:3,bits:17+lz4";

/// Show a dataset's format, documents, tokens, largest id and bits needed, its size now and
/// the exact size under each codec, and a content checksum that does not depend on the codec.
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    pub path: PathBuf,
    /// Codecs to size (comma-separated); by default the useful plain and compressed ones.
    #[arg(long, value_delimiter = ',')]
    pub codecs: Option<Vec<Codec>>,
    /// Skip the per-codec sizes (one fast pass instead of two).
    #[arg(long)]
    pub no_sizes: bool,
    #[command(flatten)]
    pub input: InputOpts,
    #[command(flatten)]
    pub output: OutputOpts,
}

/// Facts from one scan.
pub struct Scan {
    pub max_token: u32,
    pub checksum: ContentChecksum,
}

pub fn scan(ds: &Dataset, quiet: bool) -> Result<Scan> {
    let pb = util::bar(ds.tokens(), "scanning", quiet);
    let mut h = TokenHasher::new();
    let mut max = 0;
    ds.scan(1 << 22, |_, t| {
        h.update(t);
        max = max.max(kernels::max_token(t));
        pb.inc(t.len() as u64);
        Ok::<_, anyhow::Error>(())
    })?;
    pb.finish_and_clear();
    Ok(Scan {
        max_token: max,
        checksum: ContentChecksum::new(&h, ds.index()?),
    })
}

/// The codecs worth sizing for data whose largest id is `max`.
pub fn default_codecs(max: u32) -> Vec<Codec> {
    let dense = Width::narrowest(max, false);
    let aligned = Width::narrowest(max, true);
    let mut v = vec![Codec::plain(dense)];
    if aligned != dense {
        v.push(Codec::plain(aligned));
    }
    for c in [
        Compression::Lz4,
        Compression::Zstd(1),
        Compression::Zstd(3),
        Compression::Zstd(9),
    ] {
        v.push(Codec::new(aligned, c));
    }
    if dense != aligned {
        v.push(Codec::new(dense, Compression::Zstd(3)));
    }
    v.push(Codec::new(Width::I32, Compression::Zstd(3)));
    v
}

/// Exact size of the block file each codec would produce, by encoding everything (2 threads).
pub fn block_sizes(ds: &Dataset, codecs: &[Codec], quiet: bool) -> Result<Vec<u64>> {
    let mut writers = Vec::new();
    for &codec in codecs {
        let header = FileHeader {
            codec,
            block_tokens: block_tokens_for(codec.width, DEFAULT_BLOCK_BYTES),
            vocab_size: 0,
        };
        let (w, head) = BlockFileWriter::new(header, false)?;
        writers.push((w, head.len() as u64, Vec::new()));
    }
    let pb = util::bar(ds.tokens(), "sizing", quiet);
    let src = ds.data_path().to_path_buf();
    ds.scan(1 << 22, |_, t| {
        let results: Vec<Result<(), anyhow::Error>> = std::thread::scope(|s| {
            let hs: Vec<_> = writers
                .iter_mut()
                .map(|(w, n, buf)| {
                    s.spawn(move || {
                        buf.clear();
                        w.push(t, buf)?;
                        *n += buf.len() as u64;
                        Ok(())
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("sizing thread panicked")))
                })
                .collect()
        });
        for r in results {
            r.map_err(|e| anyhow::anyhow!("{}: {e}", src.display()))?;
        }
        pb.inc(t.len() as u64);
        Ok::<_, anyhow::Error>(())
    })?;
    pb.finish_and_clear();
    let mut sizes = Vec::new();
    for (w, n, mut buf) in writers {
        buf.clear();
        w.finish(ds.index()?, &mut buf)?;
        sizes.push(n + buf.len() as u64);
    }
    Ok(sizes)
}

pub fn run(a: &Args) -> Result<()> {
    let ds = util::open(&a.path, &a.input)?;
    let quiet = a.output.quiet();
    let s = scan(&ds, quiet)?;
    if let Some(stored) = ds.stored_checksum()? {
        anyhow::ensure!(
            stored == s.checksum,
            "{}: content checksum {} does not match the stored {}",
            ds.path().display(),
            s.checksum,
            stored
        );
    }
    let rows = if a.no_sizes {
        Vec::new()
    } else {
        size_rows(a, &ds, s.max_token, quiet)?
    };
    let report = Report {
        documents: ds.documents()?,
        sequences: ds.sequences()?,
        tokens: ds.tokens(),
        bytes: ds.size_on_disk(),
        max_token: s.max_token,
        checksum: s.checksum,
        rows,
    };
    if a.output.json {
        return util::write_json(&report.json(&ds));
    }
    report.print(&ds);
    Ok(())
}

/// The exact size of the dataset in each format it could be stored in: Megatron in each dtype
/// that holds its largest token, and a block file in each codec asked for (or the defaults)
/// that does. `(name, bytes)`.
fn size_rows(a: &Args, ds: &Dataset, max_token: u32, quiet: bool) -> Result<Vec<(String, u64)>> {
    let mut rows = Vec::new();
    for dt in [DType::I32, DType::U16] {
        if max_token <= dt.max_token() {
            let idx = megatron::encode_idx(dt, ds.index()?)
                .map(|b| b.len() as u64)
                .unwrap_or(0);
            rows.push((
                format!("megatron {}", dt.numpy_name()),
                megatron::bin_len(dt, ds.tokens()) + idx,
            ));
        }
    }
    let codecs = a
        .codecs
        .clone()
        .unwrap_or_else(|| default_codecs(max_token));
    let fitting: Vec<Codec> = codecs
        .into_iter()
        .filter(|c| c.width.max_token() >= max_token)
        .collect();
    let sizes = block_sizes(ds, &fitting, quiet)?;
    rows.extend(fitting.iter().map(|c| format!("dqb {c}")).zip(sizes));
    Ok(rows)
}

/// The most frequent ids of a rank table that `inspect` shows.
const TOP_RANKS: usize = 8;

/// What `inspect` found, for its table or its JSON.
struct Report {
    documents: u64,
    sequences: u64,
    tokens: u64,
    /// Bytes on disk now.
    bytes: u64,
    max_token: u32,
    checksum: ContentChecksum,
    rows: Vec<(String, u64)>,
}

impl Report {
    fn per_token(&self, bytes: u64) -> f64 {
        if self.tokens == 0 {
            0.0
        } else {
            bytes as f64 / self.tokens as f64
        }
    }

    fn json(&self, ds: &Dataset) -> serde_json::Value {
        json!({
            "path": ds.path(),
            "format": ds.format().name(),
            "format_detail": ds.format().to_string(),
            "documents": self.documents,
            "sequences": self.sequences,
            "tokens": self.tokens,
            "max_token": self.max_token,
            "bits_needed": bits_needed(self.max_token),
            "bytes": self.bytes,
            "bytes_per_token": self.per_token(self.bytes),
            "checksum": self.checksum.to_string(),
            "rank_table": ds.rank_table().map(|(r, bytes)| json!({
                "ids": r.len(),
                "bytes": bytes,
                "most_frequent": &r.ids()[..r.len().min(TOP_RANKS)],
            })),
            "chunk_sums": ds.chunk_sums().map(|(s, path)| json!({
                "sidecar": path,
                "chunk_bytes": s.chunk(),
                "digest": s.digest(),
            })),
            "sizes": self.rows.iter().map(|(n, b)| json!({"codec": n, "bytes": b, "bytes_per_token": self.per_token(*b)})).collect::<Vec<_>>(),
        })
    }

    fn print(&self, ds: &Dataset) {
        let now = self.bytes;
        println!("path        {}", ds.path().display());
        println!("format      {}", ds.format());
        println!(
            "documents   {} ({} sequences)",
            util::thousands(self.documents),
            util::thousands(self.sequences)
        );
        println!("tokens      {}", util::thousands(self.tokens));
        println!(
            "max token   {} (needs {} bits)",
            self.max_token,
            bits_needed(self.max_token)
        );
        println!(
            "size        {} B ({:.3} bytes/token)",
            util::thousands(now),
            self.per_token(now)
        );
        println!("checksum    {}", self.checksum);
        if let Some((r, bytes)) = ds.rank_table() {
            let top: Vec<String> = r.ids().iter().take(TOP_RANKS).map(u32::to_string).collect();
            println!(
                "rank table  {} ids by frequency, {} B in the footer ({:.2}% of the file); most frequent: {}",
                util::thousands(r.len() as u64),
                util::thousands(u64::from(bytes)),
                100.0 * f64::from(bytes) / now.max(1) as f64,
                top.join(" ")
            );
        }
        if let Some((s, path)) = ds.chunk_sums() {
            println!(
                "chunk sums  {} ({} KiB chunks, {}): every chunk checked",
                path.display(),
                s.chunk() >> 10,
                s.digest()
            );
        }
        if self.rows.is_empty() {
            return;
        }
        println!();
        println!("exact size under each codec (dqb = dquant block file, 1 MiB blocks):");
        println!(
            "  {:<22} {:>16} {:>12} {:>9}",
            "codec", "bytes", "bytes/token", "vs now"
        );
        for (n, b) in &self.rows {
            println!(
                "  {:<22} {:>16} {:>12.3} {:>8.2}x",
                n,
                util::thousands(*b),
                self.per_token(*b),
                now as f64 / (*b).max(1) as f64
            );
        }
    }
}
