//! `dquant demo`: the main job end to end on an embedded default, in one command.

use std::path::PathBuf;

use anyhow::{ensure, Result};
use dquant_corpus::Encoding;

use crate::cmd::{convert, corpus, verify};
use crate::util::{self, InputOpts, OutputOpts};

/// Build a real corpus from this machine's crate sources, convert it to every useful codec,
/// verify each result token for token against the original, and read a token range from the
/// compressed file by fetching only the blocks that cover it.
#[derive(clap::Args, Debug)]
#[command(after_help = "Example:\n  cargo run --release -- demo --encoding cl100k --max-mb 16")]
pub struct Args {
    /// Where to put the demo's datasets.
    #[arg(long, default_value = "target/dquant-demo")]
    pub out: PathBuf,
    #[arg(long, default_value = "r50k")]
    pub encoding: Encoding,
    /// MB of source text to tokenize.
    #[arg(long, default_value_t = 8)]
    pub max_mb: u64,
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(a: &Args) -> Result<()> {
    std::fs::create_dir_all(&a.out)?;
    let name = a.encoding.name();
    let src = a.out.join(format!("{name}_int32"));
    println!(
        "1. tokenizing up to {} MB of Rust sources with {name} -> {}",
        a.max_mb,
        src.display()
    );
    let stats = corpus::real(&corpus::RealArgs {
        out: src.clone(),
        encoding: a.encoding,
        root: None,
        max_mb: a.max_mb,
        ext: vec!["rs".into()],
        output: OutputOpts {
            json: false,
            quiet: a.quiet,
        },
    })?;
    println!(
        "   {} documents, {} tokens, max id {}",
        util::thousands(stats.documents),
        util::thousands(stats.tokens),
        stats.max_token
    );
    let mut targets: Vec<(String, &str)> = vec![
        (format!("{name}.dqb"), "auto"),
        (format!("{name}_lz4.dqb"), "auto+lz4"),
        (format!("{name}_zstd3.dqb"), "auto+zstd:3"),
        (format!("{name}_zstd19.dqb"), "auto+zstd:19"),
    ];
    if a.encoding.bits() <= 16 {
        targets.insert(0, (format!("{name}_uint16"), "u16"));
    }
    println!("2. converting and verifying each against the original");
    println!(
        "   {:<22} {:<34} {:>12} {:>12} {:>8}",
        "output", "format", "bytes", "bytes/token", "vs int32"
    );
    let mut last = None;
    for (file, codec) in &targets {
        let args = convert::Args {
            src: src.clone(),
            dst: a.out.join(file),
            codec: codec.to_string(),
            zstd: None,
            lz4: false,
            format: None,
            vocab: None,
            block_size: dquant_format::block::DEFAULT_BLOCK_BYTES,
            force: true,
            input: InputOpts::default(),
            output: OutputOpts {
                json: false,
                quiet: true,
            },
        };
        let (ds, fmt, rep, _) = convert::convert(&args)?;
        let src_bytes = ds.size_on_disk();
        let out = util::open(&args.dst, &InputOpts::default())?;
        let diff = verify::compare(&ds, &out, true)?;
        ensure!(
            diff.is_none(),
            "{} differs from {}: {}",
            args.dst.display(),
            src.display(),
            diff.map(|d| d.to_string()).unwrap_or_default()
        );
        println!(
            "   {:<22} {:<34} {:>12} {:>12.3} {:>7.2}x  identical",
            file,
            convert::describe(&fmt)
                .replace("dquant block file", "dqb")
                .replace(" tokens per block", " tok/block"),
            util::thousands(rep.bytes),
            rep.bytes as f64 / rep.tokens.max(1) as f64,
            src_bytes as f64 / rep.bytes.max(1) as f64
        );
        last = Some(args.dst);
    }
    if let Some(path) = last {
        let ds = util::open(&path, &InputOpts::default())?;
        if let Some(meta) = ds.block_file() {
            let mid = ds.tokens() / 2;
            let range = mid..(mid + 4096).min(ds.tokens());
            let blocks = meta.blocks_covering(range.clone());
            let bytes = meta.byte_range(blocks.clone());
            let mut out = Vec::new();
            ds.reader().read(range.clone(), &mut out)?;
            let orig = util::open(&src, &InputOpts::default())?;
            let mut want = Vec::new();
            orig.reader().read(range.clone(), &mut want)?;
            ensure!(out == want, "random access read differs");
            println!(
                "3. random access: tokens {}..{} of {} read {} of {} blocks ({} of {} bytes), identical to the original",
                range.start,
                range.end,
                path.display(),
                blocks.len(),
                meta.blocks(),
                util::thousands(bytes.end - bytes.start),
                util::thousands(ds.size_on_disk())
            );
        }
    }
    println!(
        "\nnext: dquant inspect {}   |   dquant bench codecs {}",
        src.display(),
        src.display()
    );
    Ok(())
}
