//! Measures RealCorpus tokenization throughput (MB/s of source text), and Zipf generation
//! throughput (100M tokens over the same vocabulary) for comparison.
//!
//! ```text
//! cargo run --release -p dquant-corpus --example tokenize_throughput -- [ENCODING] [MAX_MB] [ROOT]
//! cargo run --release -p dquant-corpus --example tokenize_throughput -- r50k 20
//! ```
//! Defaults: r50k, 20 MB, `$CARGO_HOME/registry/src`. The tokenizer is loaded before timing.

use std::error::Error;
use std::time::Instant;

use dquant_corpus::{CorpusError, Encoding, RealCorpus, Zipf};

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let encoding: Encoding = args.next().as_deref().unwrap_or("r50k").parse()?;
    let max_mb: f64 = args.next().as_deref().unwrap_or("20").parse()?;
    let mut corpus = RealCorpus::new(encoding);
    if let Some(root) = args.next() {
        corpus.root = root.into();
    }
    corpus.max_bytes = Some((max_mb * 1e6) as u64);

    let load = Instant::now();
    encoding.tokenizer()?;
    let load_s = load.elapsed().as_secs_f64();

    let start = Instant::now();
    let mut checksum = 0u64;
    let stats = corpus.generate(
        |doc: &[u32]| -> Result<(), CorpusError> {
            for &t in doc {
                checksum = checksum.rotate_left(5) ^ u64::from(t);
            }
            Ok(())
        },
        |_, _| {},
    )?;
    let secs = start.elapsed().as_secs_f64();
    let mb = stats.source_bytes as f64 / 1e6;
    println!(
        "{encoding}: {} files ({} skipped non-UTF-8), {mb:.1} MB -> {} tokens ({:.2} bytes/token), max id {}",
        stats.files,
        stats.skipped_non_utf8,
        stats.tokens,
        stats.source_bytes as f64 / stats.tokens.max(1) as f64,
        stats.max_token,
    );
    println!(
        "tokenize: {secs:.2} s = {:.1} MB/s ({:.2} Mtokens/s); tokenizer load {load_s:.2} s; checksum {checksum:016x}; threads available {}",
        mb / secs,
        stats.tokens as f64 / secs / 1e6,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
    );

    let mut zipf = Zipf::new(encoding.vocab_size() - 1, 1, 100_000_000);
    zipf.eod_token = Some(encoding.eod_token());
    let start = Instant::now();
    let mut checksum = 0u64;
    let stats = zipf.generate(|doc: &[u32]| -> Result<(), CorpusError> {
        checksum = checksum.rotate_left(5) ^ u64::from(doc[doc.len() / 2]);
        Ok(())
    })?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "zipf: {} tokens in {} documents, {secs:.2} s = {:.1} Mtokens/s (one thread); checksum {checksum:016x}",
        stats.tokens,
        stats.documents,
        stats.tokens as f64 / secs / 1e6,
    );
    Ok(())
}
