//! `dquant bench codecs`: wire bytes per token and decode speed of every codec on real data,
//! against `zstd -3` over the whole raw int32 stream, measured in the same run.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Result;
use dquant_codec::{kernels, Codec, Compression, Decoder, Width};
use dquant_format::block::{block_tokens_for, BlockFile, BlockFileWriter, FileHeader};
use dquant_storage::Dataset;
use serde_json::json;

use crate::cmd::inspect::default_codecs;
use crate::util::{self, InputOpts, OutputOpts};

/// Benchmarks (end-to-end kernels live in `cargo bench -p dquant-codec`).
#[derive(clap::Subcommand, Debug)]
pub enum Cmd {
    Codecs(CodecsArgs),
}

const EXAMPLES: &str = "\
Examples:
  dquant corpus real --encoding cl100k data/cl100k_int32
  dquant bench codecs data/cl100k_int32
  dquant bench codecs data/r50k_int32 data/o200k_int32 --codecs u16+zstd:3,bits:18 --json";

/// For each dataset and codec: exact block-file bytes per token, the ratio to `zstd -3` over
/// the whole raw int32 file (one frame, the baseline users get today), and single-thread encode
/// and decode speed (best of --repeat runs, whole dataset in memory).
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct CodecsArgs {
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Codecs to measure (comma-separated); default: plain, byte-aligned and compressed forms.
    #[arg(long, value_delimiter = ',')]
    pub codecs: Option<Vec<Codec>>,
    /// Uncompressed payload per block.
    #[arg(long, default_value = "1MiB", value_parser = util::parse_size)]
    pub block_size: usize,
    /// Timed decode repetitions (best is reported).
    #[arg(long, default_value_t = 3)]
    pub repeat: u32,
    #[command(flatten)]
    pub input: InputOpts,
    #[command(flatten)]
    pub output: OutputOpts,
}

fn best_of<T>(n: u32, mut f: impl FnMut() -> Result<T>) -> Result<(T, f64)> {
    let mut best = f64::INFINITY;
    let mut out = None;
    for _ in 0..n.max(1) {
        let t = Instant::now();
        let v = f()?;
        best = best.min(t.elapsed().as_secs_f64());
        out = Some(v);
    }
    Ok((out.ok_or_else(|| anyhow::anyhow!("no run"))?, best))
}

pub fn run(c: &Cmd) -> Result<()> {
    let Cmd::Codecs(a) = c;
    let mut reports = Vec::new();
    for path in &a.paths {
        let r = bench_dataset(a, path)?;
        if a.output.json {
            reports.push(r.json());
        } else {
            r.print();
        }
    }
    if a.output.json {
        util::write_json(&serde_json::Value::Array(reports))?;
    }
    Ok(())
}

/// One dataset's codec table: each codec's size and speeds against zstd -3 over the raw
/// int32 file.
struct CodecReport {
    path: PathBuf,
    tokens: usize,
    max: u32,
    /// The baseline's bytes, encode and decode seconds.
    base: (usize, f64, f64),
    /// (codec, bytes, encode seconds, decode seconds).
    rows: Vec<(Codec, u64, f64, f64)>,
}

fn bench_dataset(a: &CodecsArgs, path: &Path) -> Result<CodecReport> {
    let ds = util::open(path, &a.input)?;
    let mut tokens = Vec::with_capacity(ds.tokens() as usize);
    ds.scan(1 << 22, |_, t| {
        tokens.extend_from_slice(t);
        Ok::<_, anyhow::Error>(())
    })?;
    let max = kernels::max_token(&tokens);
    // Baseline: the raw int32 file compressed whole by zstd at level 3.
    let raw: Vec<u8> = tokens
        .iter()
        .flat_map(|t| (*t as i32).to_le_bytes())
        .collect();
    let (base, base_enc) = best_of(1, || Ok(zstd::bulk::compress(&raw, 3)?))?;
    let (_, base_dec) = best_of(a.repeat, || Ok(zstd::bulk::decompress(&base, raw.len())?))?;
    let mut codecs = a.codecs.clone().unwrap_or_else(|| {
        let mut v = default_codecs(max);
        v.insert(0, Codec::plain(Width::I32));
        v.push(Codec::new(
            Width::narrowest(max, true),
            Compression::Zstd(19),
        ));
        v
    });
    codecs.retain(|c| c.width.max_token() >= max);
    let mut rows = Vec::new();
    for codec in codecs {
        if !a.output.quiet() {
            eprintln!("  {}: {codec} ...", path.display());
        }
        let (bytes, enc, dec) = measure_codec(a, &ds, &tokens, codec)?;
        rows.push((codec, bytes, enc, dec));
    }
    Ok(CodecReport {
        path: ds.path().to_path_buf(),
        tokens: tokens.len(),
        max,
        base: (base.len(), base_enc, base_dec),
        rows,
    })
}

/// `tokens` written as a block file in `codec` and decoded back (checked): its bytes, and the
/// best encode and decode seconds.
fn measure_codec(
    a: &CodecsArgs,
    ds: &Dataset,
    tokens: &[u32],
    codec: Codec,
) -> Result<(u64, f64, f64)> {
    let header = FileHeader {
        codec,
        block_tokens: block_tokens_for(codec.width, a.block_size),
        vocab_size: 0,
    };
    let (file, enc) = best_of(1, || {
        let (mut w, head) = BlockFileWriter::new(header, false)?;
        let mut file = head.to_vec();
        w.push(tokens, &mut file)?;
        w.finish(ds.index()?, &mut file)?;
        Ok(file)
    })?;
    let meta = BlockFile::from_bytes(&file)?;
    let mut out = vec![0u32; tokens.len()];
    let mut dec = Decoder::new();
    let (_, dec_s) = best_of(a.repeat, || {
        for i in 0..meta.blocks() {
            let b = meta.byte_range(i..i + 1);
            let t = meta.block_tokens(i);
            meta.decode_block(
                i,
                &file[b.start as usize..b.end as usize],
                &mut dec,
                &mut out[t.start as usize..t.end as usize],
            )?;
        }
        Ok(())
    })?;
    anyhow::ensure!(out == tokens, "{codec} did not round-trip");
    Ok((file.len() as u64, enc, dec_s))
}

impl CodecReport {
    fn json(&self) -> serde_json::Value {
        let n = self.tokens.max(1) as f64;
        let (base, base_enc, base_dec) = self.base;
        let base_bpt = base as f64 / n;
        json!({
            "path": self.path, "tokens": self.tokens, "max_token": self.max,
            "baseline": {"name": "zstd -3 over raw int32 (whole file)", "bytes": base, "bytes_per_token": base_bpt,
                         "encode_mtok_s": n / base_enc / 1e6, "decode_mtok_s": n / base_dec / 1e6},
            "codecs": self.rows.iter().map(|(c, b, e, d)| json!({
                "codec": c.to_string(), "bytes": b, "bytes_per_token": *b as f64 / n,
                "vs_zstd3_whole": *b as f64 / n / base_bpt, "encode_mtok_s": n / e / 1e6, "decode_mtok_s": n / d / 1e6,
            })).collect::<Vec<_>>(),
        })
    }

    fn print(&self) {
        let n = self.tokens.max(1) as f64;
        let (base, _, base_dec) = self.base;
        let base_bpt = base as f64 / n;
        println!(
            "{}: {} tokens, max id {}; baseline zstd -3 over raw int32 (whole file): {:.3} bytes/token, decode {:.0} M tokens/s",
            self.path.display(),
            util::thousands(self.tokens as u64),
            self.max,
            base_bpt,
            n / base_dec / 1e6
        );
        println!(
            "  {:<16} {:>14} {:>12} {:>14} {:>12} {:>12}",
            "codec", "bytes", "bytes/token", "vs zstd -3", "enc Mtok/s", "dec Mtok/s"
        );
        for (c, b, e, d) in &self.rows {
            println!(
                "  {:<16} {:>14} {:>12.3} {:>13.3}x {:>12.1} {:>12.1}",
                c.to_string(),
                util::thousands(*b),
                *b as f64 / n,
                *b as f64 / n / base_bpt,
                n / e / 1e6,
                n / d / 1e6
            );
        }
    }
}
