//! `dquant convert`: re-encode a dataset losslessly, streaming, verified, atomic.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use dquant_codec::{kernels, Codec, Compression, RankTable, Width, MAX_RANKED_IDS};
use dquant_format::block::block_tokens_for;
#[cfg(test)]
use dquant_format::block::DEFAULT_BLOCK_BYTES;
use dquant_format::DType;
use dquant_objstore::{locate, ObjectRoot, Place, S3Settings};
use dquant_storage::{
    Dataset, DatasetWriter, Destination, LocalFiles, OutputFormat, Root, RootError, WriteReport,
};
use serde_json::json;

use crate::util::{self, InputOpts, OutputOpts};

const EXAMPLES: &str = "\
Examples:
  # Megatron int32 -> Megatron uint16 (readable by unmodified Megatron-Core)
  dquant convert data/web_int32 data/web_uint16 --codec u16
  # -> dquant block file, narrowest width found in the data, zstd level 3
  dquant convert data/web_int32 data/web.dqb --codec auto --zstd 3
  # -> bit-packed to 17 bits (a 100k vocabulary), declared vocabulary checked
  dquant convert data/cl100k_int32 data/cl100k.dqb --codec bits:17 --vocab 100277
  # raw little-endian int32 tokens, documents split at token 50256
  dquant convert tokens.i32 out.dqb --dtype i32 --eod 50256
  # archive: ids renumbered by frequency, zstd -19, 2 Mi-token blocks: at most the size of
  # whole-file `zstd -19 --long` on prose and code, with random access by block
  dquant convert data/web_int32 data/web.dqb --preset archive
  # dpu: LZ4 blocks of at most 32 KiB, which a BlueField-3's decompression engine takes
  # (LZ4 window up to 32 KB); software decodes them at LZ4 speed on a host or an ARM core
  dquant convert data/web_int32 data/web.dqb --preset dpu
  # in place in an S3-compatible bucket (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ... say where):
  # read by ranged GETs, written by a multipart upload completed only when all is written
  dquant convert s3://corpus/web_int32 s3://corpus/web.dqb --codec auto --zstd 3";

/// Output format, when the destination's name does not say.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutKind {
    /// Megatron-Core IndexedDataset (PREFIX.bin + PREFIX.idx).
    Megatron,
    /// dquant block file.
    Dqb,
    /// Bare little-endian tokens (document boundaries are dropped).
    Raw,
}

/// A named set of codec and block settings.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// Cold storage and transfer: `auto+rank+zstd:19` in blocks of 2 Mi tokens. Smallest,
    /// slow to write (zstd -19), and a random read decodes a whole block; serve shuffled
    /// training from a faster codec.
    Archive,
    /// Storage a DPU decompresses in hardware: `auto+lz4hc:9` in independent blocks of at
    /// most 32 KiB. NVIDIA's BlueField-3 engines decompress LZ4 blocks (and DEFLATE) with a
    /// window of up to 32 KB, and compress nothing; so the file is written once by liblz4's
    /// high-compression parser on any CPU, and a block never refers further back than the
    /// engine can see. Without the engine, one LZ4 decoder reads it at LZ4 speed.
    Dpu,
}

impl Preset {
    /// Its compression (the width is `auto`: the narrowest byte-aligned one for the data).
    pub fn compression(self) -> Compression {
        match self {
            Preset::Archive => Compression::Ranked(19),
            Preset::Dpu => Compression::Lz4Hc(dquant_codec::LZ4HC_DEFAULT),
        }
    }

    /// Its blocks.
    pub fn block(self) -> BlockSize {
        match self {
            Preset::Archive => BlockSize::Tokens(ARCHIVE_BLOCK_TOKENS),
            Preset::Dpu => BlockSize::Bytes(DPU_BLOCK_BYTES),
        }
    }

    /// Its codec and tokens per block for data whose largest id is `max`, or `None` when
    /// the preset cannot hold such ids (`rank+zstd` takes ids below 2^24).
    pub fn layout(self, max: u32) -> Option<(Codec, u32)> {
        if self.compression().needs_rank_table() && max as usize >= MAX_RANKED_IDS {
            return None;
        }
        // As convert resolves it: one derivation of the width and the block.
        let spec = WidthSpec::Auto;
        match resolve_output(
            OutKind::Dqb,
            spec,
            self.compression(),
            max,
            self.block(),
            None,
        ) {
            Ok(OutputFormat::Block {
                codec,
                block_tokens,
                ..
            }) => Some((codec, block_tokens)),
            _ => None,
        }
    }

    /// Its name on the command line (`--preset NAME`), as clap spells it.
    pub fn name(self) -> String {
        use clap::ValueEnum;
        self.to_possible_value()
            .map_or_else(|| format!("{self:?}"), |v| v.get_name().to_string())
    }
}

/// Tokens per block of the archive preset: 8 MiB of int32, where zstd finds the repeats of
/// code as whole-file `zstd --long` does (1 Mi-token blocks store code about 6% larger).
pub const ARCHIVE_BLOCK_TOKENS: u32 = 1 << 21;

/// Largest payload of a `dpu` preset block: the largest LZ4 window of BlueField-3's
/// decompression engine (DPDK's mlx5 compress driver lists 1 KB to 32 KB). A block's matches
/// then never reach past the engine's window, whatever the encoder.
pub const DPU_BLOCK_BYTES: usize = 32 << 10;

/// Re-encode a token dataset losslessly (Megatron, raw or dquant block file) into another
/// format or codec. Streams with bounded memory, verifies every block as it is written, and
/// replaces DST atomically: a failed convert leaves no partial DST.
#[derive(clap::Args, Debug, Clone)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// Input dataset: a Megatron prefix (or its .bin/.idx), a .dqb file, or a raw file with
    /// --dtype; a local path or s3://BUCKET/KEY.
    pub src: PathBuf,
    /// Output: a .dqb file, a Megatron prefix, or a raw file with --format raw; a local path
    /// or s3://BUCKET/KEY.
    pub dst: PathBuf,
    /// Width and compression: auto, u8, u16, u24, u32, i32, i64 or bits:N, optionally with
    /// +zstd:L, +lz4, +lz4hc:L or +rank+zstd:L (e.g. u16+zstd:3). `auto` picks the narrowest lossless
    /// width from --vocab or the data (byte-aligned when compressing, where zstd does best).
    /// `rank+zstd` renumbers ids by frequency first (a .dqb keeps the table): smallest, for
    /// ids below 2^24.
    #[arg(long, default_value = "auto")]
    pub codec: String,
    /// Codec and block size for a purpose (dqb output): `archive` is
    /// `--codec auto+rank+zstd:19` in blocks of 2 Mi tokens; `dpu` is `--codec auto+lz4hc:9`
    /// in blocks of at most 32 KiB.
    #[arg(long, value_enum, conflicts_with_all = ["codec", "zstd", "lz4", "block_size"])]
    pub preset: Option<Preset>,
    /// Compress blocks with zstd at this level (dqb output only).
    #[arg(long, value_name = "LEVEL", conflicts_with = "lz4")]
    pub zstd: Option<i32>,
    /// Compress blocks with LZ4 (dqb output only).
    #[arg(long)]
    pub lz4: bool,
    /// Output format; by default .dqb means a block file and anything else a Megatron prefix.
    #[arg(long, value_enum)]
    pub format: Option<OutKind>,
    /// Declared vocabulary size: every token must be below it; `auto` sizes the width from it.
    #[arg(long, value_name = "SIZE")]
    pub vocab: Option<u32>,
    /// Uncompressed payload per block of a .dqb output.
    #[arg(long, default_value = "1MiB", value_parser = util::parse_size)]
    pub block_size: usize,
    /// Replace DST if it exists.
    #[arg(long)]
    pub force: bool,
    /// Threads that compress a .dqb's blocks (the file is the same whatever the count; each
    /// holds one block and one compressor, about 90 MB for the archive preset) [default: one
    /// a core, at most 8, and at most what 192 MiB holds: 2 for the archive preset].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: Option<u16>,
    #[command(flatten)]
    pub input: InputOpts,
    #[command(flatten)]
    pub output: OutputOpts,
}

/// The width requested on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WidthSpec {
    Auto,
    Fixed(Width),
}

/// Parses `--codec` together with `--zstd`/`--lz4`.
pub fn parse_codec(codec: &str, zstd: Option<i32>, lz4: bool) -> Result<(WidthSpec, Compression)> {
    let (w, c) = match codec.split_once('+') {
        Some((w, c)) => (w, c.parse::<Compression>()?),
        None => (codec, Compression::None),
    };
    let flag = match (zstd, lz4) {
        (Some(l), _) => Some(Compression::zstd(l)?),
        (None, true) => Some(Compression::Lz4),
        (None, false) => None,
    };
    let comp = match (c, flag) {
        (c, None) => c,
        (Compression::None, Some(f)) => f,
        (c, Some(f)) if c == f => c,
        (c, Some(f)) => bail!("--codec says {c} but the flags say {f}; give one"),
    };
    let spec = if w == "auto" {
        WidthSpec::Auto
    } else {
        WidthSpec::Fixed(w.parse()?)
    };
    Ok((spec, comp))
}

/// The output kind, width, compression and block size `a` asks for (by its preset, or by
/// its flags).
pub fn settings(a: &Args) -> Result<(OutKind, WidthSpec, Compression, BlockSize)> {
    match a.preset {
        Some(p) => Ok((
            a.format.unwrap_or(OutKind::Dqb),
            WidthSpec::Auto,
            p.compression(),
            p.block(),
        )),
        None => {
            let (spec, comp) = parse_codec(&a.codec, a.zstd, a.lz4)?;
            let block = BlockSize::Bytes(a.block_size);
            Ok((out_kind(&a.dst, a.format), spec, comp, block))
        }
    }
}

/// The output format for `dst`.
pub fn out_kind(dst: &Path, explicit: Option<OutKind>) -> OutKind {
    explicit.unwrap_or_else(|| match dst.extension().and_then(|e| e.to_str()) {
        Some("dqb") => OutKind::Dqb,
        _ => OutKind::Megatron,
    })
}

/// How large a .dqb output's blocks are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockSize {
    /// Uncompressed payload bytes (`--block-size`).
    Bytes(usize),
    /// Tokens (a preset's).
    Tokens(u32),
}

/// Resolves the output format from the kind, the requested width and compression and the
/// largest token id (`max_token`, from --vocab or the data).
pub fn resolve_output(
    kind: OutKind,
    spec: WidthSpec,
    comp: Compression,
    max_token: u32,
    block: BlockSize,
    vocab: Option<u32>,
) -> Result<OutputFormat> {
    match kind {
        OutKind::Megatron | OutKind::Raw => {
            let what = if kind == OutKind::Megatron {
                "Megatron .bin files"
            } else {
                "raw token files"
            };
            if comp != Compression::None {
                bail!("{what} cannot be compressed; write a .dqb block file for {comp}");
            }
            let width = match spec {
                // Megatron-Core's own choice: uint16 when it fits, else int32.
                WidthSpec::Auto if max_token <= u16::MAX as u32 => Width::U16,
                WidthSpec::Auto => Width::I32,
                WidthSpec::Fixed(w) => w,
            };
            let dtype = DType::from_width(width).with_context(|| {
                format!("{what} store u8, u16, i32 or i64 (not {width}); write a .dqb block file for {width}")
            })?;
            Ok(if kind == OutKind::Megatron {
                OutputFormat::Megatron { dtype }
            } else {
                OutputFormat::Raw { dtype }
            })
        }
        OutKind::Dqb => {
            let width = match spec {
                WidthSpec::Auto => Width::narrowest(max_token, comp != Compression::None),
                WidthSpec::Fixed(w) => w,
            };
            let block_tokens = match block {
                BlockSize::Bytes(b) => block_tokens_for(width, b),
                BlockSize::Tokens(t) => t,
            };
            Ok(OutputFormat::Block {
                codec: Codec::new(width, comp),
                block_tokens,
                vocab_size: vocab.unwrap_or(0),
            })
        }
    }
}

/// Finds the largest token id by scanning (or from the file's own footer).
pub fn max_token(ds: &Dataset, quiet: bool) -> Result<u32> {
    if let Some(m) = ds.stored_max_token() {
        return Ok(m);
    }
    let pb = util::bar(ds.tokens(), "scanning", quiet);
    let mut max = 0;
    ds.scan(1 << 22, |_, t| {
        max = max.max(kernels::max_token(t));
        pb.inc(t.len() as u64);
        Ok::<_, anyhow::Error>(())
    })?;
    pb.finish_and_clear();
    Ok(max)
}

/// The rank table of the data: one pass counting every id (ids must be below 2^24, so the
/// counts take at most 128 MiB).
pub fn rank_table(ds: &Dataset, quiet: bool) -> Result<RankTable> {
    let pb = util::bar(ds.tokens(), "counting ids", quiet);
    let mut counts: Vec<u64> = Vec::new();
    let src = ds.data_path().to_path_buf();
    ds.scan(1 << 22, |start, t| {
        let max = kernels::max_token(t) as usize;
        if max >= MAX_RANKED_IDS {
            let i = t.iter().position(|&x| x as usize >= MAX_RANKED_IDS);
            let i = i.unwrap_or(0);
            bail!(
                "{}: token {} at offset {} is over 2^24 - 1, the largest id rank+zstd takes; use zstd:LEVEL",
                src.display(),
                t[i],
                start + i as u64
            );
        }
        if counts.len() <= max {
            counts.resize(max + 1, 0);
        }
        t.iter().for_each(|&x| counts[x as usize] += 1);
        pb.inc(t.len() as u64);
        Ok(())
    })?;
    pb.finish_and_clear();
    Ok(RankTable::from_counts(&counts)?)
}

pub fn describe(f: &OutputFormat) -> String {
    match f {
        OutputFormat::Megatron { dtype } => {
            format!("Megatron IndexedDataset ({})", dtype.numpy_name())
        }
        OutputFormat::Raw { dtype } => format!("raw token file ({})", dtype.numpy_name()),
        OutputFormat::Block {
            codec,
            block_tokens,
            ..
        } => {
            format!("dquant block file ({codec}, {block_tokens} tokens per block)")
        }
    }
}

/// Converts without printing a report; `run` prints it.
pub fn convert(a: &Args) -> Result<(Dataset, OutputFormat, WriteReport, f64)> {
    let t0 = Instant::now();
    let ds = util::open(&a.src, &a.input)?;
    let (kind, spec, comp, block) = settings(a)?;
    let out = Output::of(&a.dst)?;
    let dst_main = match kind {
        OutKind::Megatron => PathBuf::from(format!(
            "{}.idx",
            dquant_storage::megatron_prefix_of(&out.name).display()
        )),
        _ => out.name.clone(),
    };
    if !a.force && out.exists(&dst_main)? {
        bail!("{} exists; pass --force to replace it", out.show(&dst_main));
    }
    if let Some(0) = a.vocab {
        bail!("--vocab must be at least 1");
    }
    let quiet = a.output.quiet();
    let ranks = match comp.needs_rank_table() && kind == OutKind::Dqb {
        true => Some(Arc::new(rank_table(&ds, quiet)?)),
        false => None,
    };
    let max = match (spec, a.vocab, &ranks) {
        (WidthSpec::Auto, Some(v), _) => v - 1,
        (WidthSpec::Auto, None, Some(t)) => t.ids().iter().copied().max().unwrap_or(0),
        (WidthSpec::Auto, None, None) => max_token(&ds, quiet)?,
        (WidthSpec::Fixed(w), _, _) => w.max_token(),
    };
    let fmt = resolve_output(kind, spec, comp, max, block, a.vocab)?;
    let pb = util::bar(ds.tokens(), "converting", quiet);
    let mut w = DatasetWriter::create_ranked_in(out.to.clone(), &out.name, fmt, ranks)?;
    w.set_threads(a.threads.map_or_else(|| default_threads(&fmt), usize::from))?;
    let src = ds.data_path().to_path_buf();
    ds.scan(w.push_tokens().max(1 << 22), |start, t| {
        if let Some(v) = a.vocab {
            if kernels::max_token(t) >= v {
                let i = t.iter().position(|&x| x >= v).unwrap_or(0);
                bail!(
                    "{}: token {} at offset {} is outside the declared vocabulary (--vocab {v})",
                    src.display(),
                    t[i],
                    start + i as u64
                );
            }
        }
        w.push(t).map_err(util::in_input(&src))?;
        pb.inc(t.len() as u64);
        Ok(())
    })?;
    let mut rep = w.finish(ds.index()?).map_err(util::in_input(&src))?;
    pb.finish_and_clear();
    for f in &mut rep.files {
        *f = PathBuf::from(out.show(f));
    }
    Ok((ds, fmt, rep, t0.elapsed().as_secs_f64()))
}

/// Block compression threads by default: one a core, at most [`MAX_DEFAULT_THREADS`], and no
/// more than [`THREADS_MEMORY`] holds at [`thread_memory`] each (so the archive preset keeps
/// its 256 MiB goal on any machine).
fn default_threads(fmt: &OutputFormat) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let fit = match fmt {
        OutputFormat::Block {
            codec,
            block_tokens,
            ..
        } => (THREADS_MEMORY / thread_memory(codec.compression, *block_tokens)) as usize,
        _ => 1,
    };
    cores.min(MAX_DEFAULT_THREADS).min(fit).max(1)
}

/// The most threads `convert` compresses blocks on unless asked for more.
const MAX_DEFAULT_THREADS: usize = 8;

/// Memory the default thread count may take, beside one thread's (bench/codecs measures the
/// archive preset's peak against 256 MiB).
const THREADS_MEMORY: u64 = 192 << 20;

/// About what one compressing thread holds: its compressor (measured: a zstd level 19 context
/// and its tables grow the peak by about 64 MiB, lower levels by far less, LZ4 by nothing
/// worth counting) and a block three times (the tokens, their check after decoding, the
/// payload).
fn thread_memory(c: Compression, block_tokens: u32) -> u64 {
    let compressor: u64 = match c {
        Compression::Zstd(l) | Compression::Ranked(l) if l >= 16 => 64 << 20,
        Compression::Zstd(_) | Compression::Ranked(_) => 16 << 20,
        _ => 4 << 20,
    };
    compressor + 12 * block_tokens as u64
}

/// Where a convert writes: local files (renamed into place) or an S3 bucket (multipart
/// uploads, completed at the end).
struct Output {
    to: Arc<dyn Destination>,
    /// The output's name in `to`: a path, or a key.
    name: PathBuf,
    /// The bucket, for `s3://` outputs: what tells whether an output exists there.
    bucket: Option<ObjectRoot>,
}

impl Output {
    fn of(dst: &Path) -> Result<Self> {
        match locate(dst, &S3Settings::default())? {
            Place::Local(path) => Ok(Output {
                to: Arc::new(LocalFiles),
                name: path,
                bucket: None,
            }),
            // One client for both the existence check and the upload.
            Place::Store(place) => {
                let (root, key) = place.object()?;
                Ok(Output {
                    to: Arc::new(place.destination()),
                    name: PathBuf::from(key),
                    bucket: Some(root),
                })
            }
        }
    }

    fn exists(&self, name: &Path) -> Result<bool> {
        let Some(root) = &self.bucket else {
            return Ok(name.exists());
        };
        let key = name.to_str().unwrap_or_default();
        match root.stat(key) {
            Ok(_) => Ok(true),
            Err(RootError::NotFound { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// How the user names `name`: the path, or `s3://BUCKET/KEY`.
    fn show(&self, name: &Path) -> String {
        match &self.bucket {
            Some(root) => format!("{}/{}", root.location(), name.display()),
            None => name.display().to_string(),
        }
    }
}

pub fn run(a: &Args) -> Result<()> {
    let (ds, fmt, rep, secs) = convert(a)?;
    let src_bytes = ds.size_on_disk();
    let per_token = |b: u64| {
        if rep.tokens == 0 {
            0.0
        } else {
            b as f64 / rep.tokens as f64
        }
    };
    let documents = ds.documents()?;
    if a.output.json {
        return util::write_json(&json!({
            "src": ds.path(),
            "src_format": ds.format().to_string(),
            "dst": a.dst,
            "dst_format": describe(&fmt),
            "files": rep.files,
            "tokens": rep.tokens,
            "documents": documents,
            "src_bytes": src_bytes,
            "dst_bytes": rep.bytes,
            "bytes_per_token": per_token(rep.bytes),
            "checksum": rep.content.to_string(),
            "verified": true,
            "seconds": secs,
        }));
    }
    println!("converted   {} -> {}", ds.path().display(), a.dst.display());
    println!("from        {}", ds.format());
    println!("to          {}", describe(&fmt));
    println!(
        "tokens      {} in {} documents",
        util::thousands(rep.tokens),
        util::thousands(documents)
    );
    println!(
        "size        {} B -> {} B ({:.2}x smaller; {:.3} -> {:.3} bytes/token)",
        util::thousands(src_bytes),
        util::thousands(rep.bytes),
        src_bytes as f64 / rep.bytes.max(1) as f64,
        per_token(src_bytes),
        per_token(rep.bytes)
    );
    println!("checksum    {}", rep.content);
    println!("verified    every block decoded and compared right after encoding");
    for f in &rep.files {
        println!("wrote       {}", f.display());
    }
    println!(
        "time        {secs:.2} s ({:.1} M tokens/s)",
        rep.tokens as f64 / secs.max(1e-9) / 1e6
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codec_flags() {
        assert_eq!(
            parse_codec("auto", Some(3), false).unwrap(),
            (WidthSpec::Auto, Compression::Zstd(3))
        );
        assert_eq!(
            parse_codec("bits:17+lz4", None, false).unwrap(),
            (WidthSpec::Fixed(Width::Bits(17)), Compression::Lz4)
        );
        assert_eq!(
            parse_codec("u16+zstd:3", Some(5), false)
                .unwrap_err()
                .to_string(),
            "--codec says zstd:3 but the flags say zstd:5; give one"
        );
    }

    #[test]
    fn output_resolution() {
        let r = |k, c: &str, max| {
            let (s, comp) = parse_codec(c, None, false).unwrap();
            resolve_output(k, s, comp, max, BlockSize::Bytes(DEFAULT_BLOCK_BYTES), None)
        };
        assert_eq!(
            r(OutKind::Megatron, "auto", 50256).unwrap(),
            OutputFormat::Megatron { dtype: DType::U16 }
        );
        assert_eq!(
            r(OutKind::Megatron, "auto", 100257).unwrap(),
            OutputFormat::Megatron { dtype: DType::I32 }
        );
        assert_eq!(
            r(OutKind::Megatron, "bits:17", 0).unwrap_err().to_string(),
            "Megatron .bin files store u8, u16, i32 or i64 (not bits:17); write a .dqb block file for bits:17"
        );
        assert_eq!(
            r(OutKind::Megatron, "u16+zstd:3", 0)
                .unwrap_err()
                .to_string(),
            "Megatron .bin files cannot be compressed; write a .dqb block file for zstd:3"
        );
        match r(OutKind::Dqb, "auto+zstd:3", 100257).unwrap() {
            OutputFormat::Block { codec, .. } => assert_eq!(codec.to_string(), "u24+zstd:3"),
            f => panic!("{f:?}"),
        }
        match r(OutKind::Dqb, "auto", 100257).unwrap() {
            OutputFormat::Block {
                codec,
                block_tokens,
                ..
            } => {
                assert_eq!(codec.to_string(), "bits:17");
                assert_eq!(block_tokens, 493312);
            }
            f => panic!("{f:?}"),
        }
    }

    /// The default thread count keeps the archive preset within its memory goal (two
    /// threads, about 180 MB measured), and gives a cheap codec every core up to the cap.
    #[test]
    fn default_threads_fit_the_memory_goal() {
        let archive = thread_memory(Compression::Ranked(19), 2 << 20);
        assert_eq!(THREADS_MEMORY / archive, 2);
        let dpu = thread_memory(Compression::Lz4Hc(9), 16 << 10);
        assert!(THREADS_MEMORY / dpu >= MAX_DEFAULT_THREADS as u64);
    }

    /// The dpu preset's blocks fit the engine's 32 KB window at every width it picks.
    #[test]
    fn dpu_preset_blocks_fit_the_engine_window() {
        assert_eq!(Preset::Dpu.name(), "dpu");
        for (max, want, tokens) in [
            (255, "u8+lz4hc:9", 32768),
            (50256, "u16+lz4hc:9", 16384),
            (100257, "u24+lz4hc:9", 10752),
            (1 << 24, "u32+lz4hc:9", 8192),
        ] {
            let (codec, block_tokens) = Preset::Dpu.layout(max).unwrap();
            assert_eq!(codec.to_string(), want);
            assert_eq!(block_tokens, tokens);
            assert!(
                codec.raw_len(block_tokens as usize) <= DPU_BLOCK_BYTES,
                "{codec}"
            );
        }
    }
}
