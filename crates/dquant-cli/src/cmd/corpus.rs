//! `dquant corpus`: deterministic test corpora as Megatron int32 datasets.

use std::path::{Path, PathBuf};

use anyhow::Result;
use dquant_corpus::{CorpusError, CorpusStats, Encoding, RealCorpus, Zipf};
use dquant_format::{DType, DocIndexBuilder};
use dquant_storage::{DatasetWriter, OutputFormat, StorageError};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::util::{self, OutputOpts};

/// Generate token corpora (Megatron int32 datasets, one document per source, each ending in
/// the end-of-document token).
#[derive(clap::Subcommand, Debug)]
pub enum Cmd {
    Real(RealArgs),
    Zipf(ZipfArgs),
}

const REAL_EXAMPLES: &str = "\
Examples:
  dquant corpus real data/r50k_int32                       # 16-bit ids
  dquant corpus real --encoding cl100k data/cl100k_int32   # 17-bit ids
  dquant corpus real --encoding o200k --max-mb 256 data/o200k_int32";

/// Tokenize real text already on this machine (the Rust crate sources under
/// $CARGO_HOME/registry/src) with a bundled tiktoken encoding. Same input files, same bytes out.
#[derive(clap::Args, Debug)]
#[command(after_help = REAL_EXAMPLES)]
pub struct RealArgs {
    /// Output Megatron prefix (PREFIX.bin + PREFIX.idx).
    pub out: PathBuf,
    /// r50k (ids fit 16 bits), cl100k (17 bits) or o200k (18 bits).
    #[arg(long, default_value = "r50k")]
    pub encoding: Encoding,
    /// Directory of source files (default: $CARGO_HOME/registry/src).
    #[arg(long)]
    pub root: Option<PathBuf>,
    /// Stop after about this many MB of source text.
    #[arg(long, default_value_t = 64)]
    pub max_mb: u64,
    /// File extensions to tokenize.
    #[arg(long, value_delimiter = ',', default_value = "rs")]
    pub ext: Vec<String>,
    #[command(flatten)]
    pub output: OutputOpts,
}

const ZIPF_EXAMPLES: &str = "\
Examples:
  dquant corpus zipf data/zipf_int32 --tokens 100000000 --vocab 50257 --eod 50256";

/// Synthetic Zipf-distributed tokens for volume and scale tests (compression figures come
/// from real corpora, not from this).
#[derive(clap::Args, Debug)]
#[command(after_help = ZIPF_EXAMPLES)]
pub struct ZipfArgs {
    pub out: PathBuf,
    #[arg(long)]
    pub tokens: u64,
    #[arg(long, default_value_t = 50257)]
    pub vocab: u32,
    #[arg(long, default_value_t = 1.1)]
    pub exponent: f64,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long, default_value_t = 2048)]
    pub mean_doc_len: u32,
    /// End-of-document token appended to each document.
    #[arg(long)]
    pub eod: Option<u32>,
    #[command(flatten)]
    pub output: OutputOpts,
}

#[derive(Debug)]
enum GenError {
    Corpus(CorpusError),
    Storage(StorageError),
}

impl From<CorpusError> for GenError {
    fn from(e: CorpusError) -> Self {
        GenError::Corpus(e)
    }
}

impl From<GenError> for anyhow::Error {
    fn from(e: GenError) -> Self {
        match e {
            GenError::Corpus(e) => e.into(),
            GenError::Storage(e) => e.into(),
        }
    }
}

/// Writes documents from `generate` into a Megatron int32 dataset at `out`.
fn write_corpus(
    out: &Path,
    generate: impl FnOnce(
        &mut dyn FnMut(&[u32]) -> Result<(), GenError>,
    ) -> Result<CorpusStats, GenError>,
) -> Result<CorpusStats> {
    let mut w = DatasetWriter::create(out, OutputFormat::Megatron { dtype: DType::I32 })?;
    let mut ix = DocIndexBuilder::new();
    let stats = generate(&mut |doc: &[u32]| {
        w.push(doc).map_err(GenError::Storage)?;
        ix.push_document(doc.len() as u64);
        Ok(())
    })?;
    w.finish(&ix.finish())?;
    Ok(stats)
}

fn report(out: &Path, s: &CorpusStats, json: bool, what: &str) -> Result<()> {
    if json {
        return util::write_json(&json!({
            "out": out, "generator": what, "files": s.files, "skipped_non_utf8": s.skipped_non_utf8,
            "source_bytes": s.source_bytes, "documents": s.documents, "tokens": s.tokens, "max_token": s.max_token,
        }));
    }
    println!(
        "wrote       {}.bin / {}.idx (Megatron int32)",
        out.display(),
        out.display()
    );
    println!("generator   {what}");
    println!(
        "documents   {} ({} source files, {} skipped as non-UTF-8, {} source bytes)",
        util::thousands(s.documents),
        util::thousands(s.files),
        s.skipped_non_utf8,
        util::thousands(s.source_bytes)
    );
    println!(
        "tokens      {} (max id {})",
        util::thousands(s.tokens),
        s.max_token
    );
    Ok(())
}

pub fn real(a: &RealArgs) -> Result<CorpusStats> {
    let mut c = RealCorpus::new(a.encoding);
    if let Some(r) = &a.root {
        c.root = r.clone();
    }
    c.max_bytes = Some(a.max_mb * 1_000_000);
    c.extensions = a.ext.clone();
    let pb = if a.output.quiet() {
        ProgressBar::hidden()
    } else {
        let pb = ProgressBar::new(0);
        pb.set_style(
            ProgressStyle::with_template("tokenizing [{bar:30}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}")
                .map(|s| s.progress_chars("=> "))
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        pb
    };
    let stats = write_corpus(&a.out, |on_doc| {
        c.generate(on_doc, |done, total| {
            pb.set_length(total);
            pb.set_position(done);
        })
    })?;
    pb.finish_and_clear();
    Ok(stats)
}

pub fn run(c: &Cmd) -> Result<()> {
    match c {
        Cmd::Real(a) => {
            let s = real(a)?;
            report(
                &a.out,
                &s,
                a.output.json,
                &format!(
                    "{} over {}",
                    a.encoding.name(),
                    a.root
                        .clone()
                        .unwrap_or_else(dquant_corpus::default_source_root)
                        .display()
                ),
            )
        }
        Cmd::Zipf(a) => {
            let z = Zipf {
                vocab: a.vocab,
                exponent: a.exponent,
                seed: a.seed,
                tokens: a.tokens,
                mean_doc_len: a.mean_doc_len,
                eod_token: a.eod,
            };
            let s = write_corpus(&a.out, |on_doc| z.generate(on_doc))?;
            report(
                &a.out,
                &s,
                a.output.json,
                &format!("zipf(vocab {}, s={}, seed {})", a.vocab, a.exponent, a.seed),
            )
        }
    }
}
