//! `dquant bench codecs`: bits per token and decode speed of every codec and preset on real
//! data, against `zstd -3` and `zstd -19 --long` over the whole raw int32 stream and the
//! corpus's order-0 entropy, measured in the same run.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use dquant_codec::{kernels, Codec, Compression, Decoder, RankTable, Width};
use dquant_codec::{Encoder, MAX_LANES};
use dquant_format::block::{block_tokens_for, BlockFile, BlockFileWriter, FileHeader};
use dquant_plan::WireCodec;
use dquant_storage::Dataset;
use dquant_wire::record::RECORD_HEADER_LEN;
use serde_json::json;

use crate::cmd::convert::Preset;
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
  dquant bench codecs data/r50k_int32 data/o200k_int32 --codecs u16+zstd:3,bits:18 --json
  dquant bench codecs data/prose_o200k --codecs u24+zstd:3 --no-presets
  dquant bench codecs data/code_cl100k --codecs u24+stream:3 --wire-batch 65536 --lanes 4";

/// For each dataset, codec and preset: exact block-file bits per token, the ratios to
/// `zstd -3` and `zstd -19 --long` over the whole raw int32 file (one frame each, what users
/// get today), and single-thread encode and decode speed (best of --repeat runs, whole dataset
/// in memory). The header line gives the corpus's order-0 entropy, the bound for a coder that
/// sees one token at a time.
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
    /// Leave out the presets' rows (`dquant convert --preset`: archive writes at zstd -19,
    /// dpu with LZ4's high-compression parser).
    #[arg(long)]
    pub no_presets: bool,
    /// Tokens per wire batch for stream codecs (`stream:L`, the transport preset), which are
    /// measured as a session's batches, not as a block file: 8 samples of 4,096 by default.
    #[arg(long, default_value_t = 32_768, value_parser = clap::value_parser!(u32).range(1..))]
    pub wire_batch: u32,
    /// Streams a session's batches are spread over, batch `i` in lane `i % lanes`, for
    /// `--codecs` stream codecs (the agent and the transport preset's row use one: lanes
    /// lose each other's history, which costs code about a fifth of its bytes).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=MAX_LANES as i64))]
    pub lanes: u32,
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

/// One dataset's codec table: each codec's size and speeds against zstd -3 and zstd -19
/// --long over the raw int32 file.
struct CodecReport {
    path: PathBuf,
    tokens: usize,
    max: u32,
    /// Order-0 entropy of the ids, bits per token.
    entropy: f64,
    /// zstd -3's bytes, encode and decode seconds.
    base: (usize, f64, f64),
    /// zstd -19 --long's bytes.
    long: usize,
    rows: Vec<Row>,
}

/// One codec or preset, written as a block file and read back.
struct Row {
    /// The codec, or the preset and its codec (`archive: u24+rank+zstd:19`).
    name: String,
    bytes: u64,
    /// Encode and decode seconds.
    enc: f64,
    dec: f64,
    /// A session's decode seconds in its first stage alone (zstd inflating each batch's
    /// chunk, [`Decoder::inflate`]); the rest of `dec` is the second stage (the byte code, or
    /// the width).
    inflate: Option<f64>,
}

/// What a row writes: a codec in blocks of `block_tokens`, or a wire codec's session.
struct Case {
    name: String,
    codec: Codec,
    block_tokens: u32,
    /// A stream codec: `block_tokens` is the wire batch, sent over these lanes.
    session: Option<(WireCodec, usize)>,
}

/// Order-0 entropy of `tokens` in bits per token.
///
/// Counted over a sorted copy, not a table indexed by id: the ids come from the file, and a
/// table as long as the largest (up to 2^32) would be allocated from a stored value.
fn entropy(tokens: &[u32]) -> f64 {
    let mut sorted = tokens.to_vec();
    sorted.sort_unstable();
    let n = tokens.len().max(1) as f64;
    sorted
        .chunk_by(|a, b| a == b)
        .map(|run| {
            let p = run.len() as f64 / n;
            -p * p.log2()
        })
        .sum()
}

/// Whole-file `zstd -19 --long` (long-distance matching, a 128 MiB window, as the CLI's
/// `--long` sets it): the best general-purpose baseline.
fn zstd_long(raw: &[u8]) -> Result<usize> {
    use zstd::zstd_safe::CParameter;
    let mut c = zstd::bulk::Compressor::new(19)?;
    c.set_parameter(CParameter::EnableLongDistanceMatching(true))?;
    c.set_parameter(CParameter::WindowLog(27))?;
    Ok(c.compress(raw)?.len())
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
    if !a.output.quiet() {
        eprintln!(
            "  {}: zstd -19 --long over the whole file ...",
            path.display()
        );
    }
    let long = zstd_long(&raw)?;
    let mut rows = Vec::new();
    for case in cases(a, max) {
        if !a.output.quiet() {
            eprintln!("  {}: {} ...", path.display(), case.name);
        }
        rows.push(measure_codec(&ds, &tokens, case, a.repeat)?);
    }
    Ok(CodecReport {
        path: ds.path().to_path_buf(),
        tokens: tokens.len(),
        max,
        entropy: entropy(&tokens),
        base: (base.len(), base_enc, base_dec),
        long,
        rows,
    })
}

/// The rows to measure: --codecs (or plain, byte-aligned and compressed forms), in blocks of
/// --block-size, then each preset with its own codec and blocks.
fn cases(a: &CodecsArgs, max: u32) -> Vec<Case> {
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
    let lanes = a.lanes as usize;
    let mut cases: Vec<Case> = codecs
        .into_iter()
        .map(|codec| match codec.compression.is_stream() {
            true => Case {
                name: format!("{codec}, {lanes} lane(s)"),
                codec,
                block_tokens: a.wire_batch,
                session: Some((WireCodec::Fixed(codec), lanes)),
            },
            false => Case {
                name: codec.to_string(),
                codec,
                block_tokens: block_tokens_for(codec.width, a.block_size),
                session: None,
            },
        })
        .collect();
    if !a.no_presets {
        for &p in <Preset as clap::ValueEnum>::value_variants() {
            if let Some((codec, block_tokens)) = p.layout(max) {
                cases.push(Case {
                    name: format!("{}: {codec}", p.name()),
                    codec,
                    block_tokens,
                    session: None,
                });
            }
        }
        let wire: WireCodec = "transport".parse().expect("the transport preset parses");
        cases.push(Case {
            name: format!("transport: {wire}"),
            codec: wire.codec_for_max(max),
            block_tokens: a.wire_batch,
            session: Some((wire, 1)),
        });
    }
    cases
}

/// `tokens` sent as one session's wire batches of `case.block_tokens` (each batch's codec
/// picked as the agent picks it, batch `i` in lane `i % lanes`) and decoded back in order by
/// one reader (checked): the payloads' bytes plus a record header a batch, and the best encode
/// and decode seconds.
fn measure_session(
    tokens: &[u32],
    case: Case,
    wire: WireCodec,
    lanes: usize,
    repeat: u32,
) -> Result<Row> {
    let batch = case.block_tokens as usize;
    let (payloads, enc) = best_of(1, || {
        let first = wire.codec_for_max(u32::MAX);
        let mut encoders = (0..lanes)
            .map(|k| Encoder::for_lane(first, k))
            .collect::<Result<Vec<_>, _>>()?;
        let mut payloads = Vec::new();
        for (i, chunk) in tokens.chunks(batch).enumerate() {
            let codec = wire.codec_for_max(kernels::max_token(chunk));
            let e = &mut encoders[i % lanes];
            e.set_width(codec)?;
            let mut p = Vec::new();
            e.encode(chunk, &mut p)?;
            payloads.push((codec, p));
        }
        Ok(payloads)
    })?;
    let mut out = vec![0u32; tokens.len()];
    let (_, dec) = best_of(repeat, || {
        let mut d = Decoder::new();
        for ((codec, p), o) in payloads.iter().zip(out.chunks_mut(batch)) {
            d.decode(*codec, p, o)?;
        }
        Ok(())
    })?;
    anyhow::ensure!(out == tokens, "{} did not round-trip", case.name);
    let (_, inflate) = best_of(repeat, || {
        let mut d = Decoder::new();
        for ((codec, p), o) in payloads.iter().zip(out.chunks(batch)) {
            d.inflate(*codec, p, o.len())?;
        }
        Ok(())
    })?;
    let bytes = payloads
        .iter()
        .map(|(_, p)| (p.len() + RECORD_HEADER_LEN) as u64)
        .sum();
    Ok(Row {
        name: case.name,
        bytes,
        enc,
        dec,
        inflate: Some(inflate),
    })
}

/// `tokens` written as a block file in the case's codec and decoded back (checked): its bytes,
/// and the best encode and decode seconds. A `rank+zstd` file's encode time includes counting
/// the ids for its table.
fn measure_codec(ds: &Dataset, tokens: &[u32], case: Case, repeat: u32) -> Result<Row> {
    if let Some((wire, lanes)) = case.session {
        return measure_session(tokens, case, wire, lanes, repeat);
    }
    let codec = case.codec;
    let header = FileHeader {
        codec,
        block_tokens: case.block_tokens,
        vocab_size: 0,
    };
    let (file, enc) = best_of(1, || {
        let (mut w, head) = match codec.compression.needs_rank_table() {
            true => BlockFileWriter::new_ranked(header, Arc::new(ranks_of(tokens)?), false)?,
            false => BlockFileWriter::new(header, false)?,
        };
        let mut file = head.to_vec();
        w.push(tokens, &mut file)?;
        w.finish(ds.index()?, &mut file)?;
        Ok(file)
    })?;
    let meta = BlockFile::from_bytes(&file)?;
    let mut out = vec![0u32; tokens.len()];
    let mut dec = Decoder::new();
    let (_, dec_s) = best_of(repeat, || {
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
    Ok(Row {
        name: case.name,
        bytes: file.len() as u64,
        enc,
        dec: dec_s,
        inflate: None,
    })
}

/// The rank table of tokens held in memory (`dquant convert` counts them from the file).
fn ranks_of(tokens: &[u32]) -> Result<RankTable> {
    let max = kernels::max_token(tokens);
    // Checked before the counts are allocated (a table of the largest id's length).
    if max as usize >= dquant_codec::MAX_RANKED_IDS {
        anyhow::bail!("token {max} is over 2^24 - 1, the largest id rank+zstd takes");
    }
    let mut counts = vec![0u64; max as usize + 1];
    tokens.iter().for_each(|&t| counts[t as usize] += 1);
    Ok(RankTable::from_counts(&counts)?)
}

impl CodecReport {
    fn json(&self) -> serde_json::Value {
        let n = self.tokens.max(1) as f64;
        let (base, base_enc, base_dec) = self.base;
        let bits = |b: u64| 8.0 * b as f64 / n;
        json!({
            "path": self.path, "tokens": self.tokens, "max_token": self.max,
            "order0_entropy_bits_per_token": self.entropy,
            "baseline": {"name": "zstd -3 over raw int32 (whole file)", "bytes": base, "bytes_per_token": base as f64 / n,
                         "bits_per_token": bits(base as u64),
                         "encode_mtok_s": n / base_enc / 1e6, "decode_mtok_s": n / base_dec / 1e6},
            "baseline_long": {"name": "zstd -19 --long over raw int32 (whole file)", "bytes": self.long,
                              "bits_per_token": bits(self.long as u64)},
            "codecs": self.rows.iter().map(|r| json!({
                "codec": r.name, "bytes": r.bytes, "bytes_per_token": r.bytes as f64 / n,
                "bits_per_token": bits(r.bytes),
                "vs_zstd3_whole": r.bytes as f64 / base as f64,
                "vs_zstd19_long_whole": r.bytes as f64 / self.long as f64,
                "encode_mtok_s": n / r.enc / 1e6, "decode_mtok_s": n / r.dec / 1e6,
                "inflate_mtok_s": r.inflate.map(|s| n / s / 1e6),
            })).collect::<Vec<_>>(),
        })
    }

    fn print(&self) {
        let n = self.tokens.max(1) as f64;
        let (base, _, base_dec) = self.base;
        let bits = |b: u64| 8.0 * b as f64 / n;
        println!(
            "{}: {} tokens, max id {}, order-0 entropy {:.2} bits/token",
            self.path.display(),
            util::thousands(self.tokens as u64),
            self.max,
            self.entropy,
        );
        println!(
            "  baselines over raw int32 (whole file): zstd -3 {:.2} bits/token (decode {:.0} M tokens/s), zstd -19 --long {:.2} bits/token",
            bits(base as u64),
            n / base_dec / 1e6,
            bits(self.long as u64),
        );
        let w = self
            .rows
            .iter()
            .map(|r| r.name.len())
            .max()
            .unwrap_or(5)
            .max(16);
        println!(
            "  {:<w$} {:>14} {:>10} {:>11} {:>13} {:>11} {:>11}",
            "codec",
            "bytes",
            "bits/token",
            "vs zstd -3",
            "vs -19 --long",
            "enc Mtok/s",
            "dec Mtok/s"
        );
        for r in &self.rows {
            println!(
                "  {:<w$} {:>14} {:>10.2} {:>10.3}x {:>12.3}x {:>11.1} {:>11.1}",
                r.name,
                util::thousands(r.bytes),
                bits(r.bytes),
                r.bytes as f64 / base as f64,
                r.bytes as f64 / self.long as f64,
                n / r.enc / 1e6,
                n / r.dec / 1e6
            );
        }
        for r in &self.rows {
            if let Some(s) = r.inflate {
                println!(
                    "  {}: zstd alone decodes {:.1} M tokens/s; the rest of its decode is the byte code or the width",
                    r.name,
                    n / s / 1e6
                );
            }
        }
    }
}
