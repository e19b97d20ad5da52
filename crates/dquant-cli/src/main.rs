//! `dquant`: the command-line front door.
//!
//! Each subcommand lives in `cmd/`; this file only parses arguments, sets up logging and maps
//! errors to exit codes (1 for failures and for `verify` finding a difference, 2 for usage
//! errors, as clap does).

mod cmd;
mod util;

use clap::{Parser, Subcommand};

const EXAMPLES: &str = "\
Examples:
  dquant demo                                    # build a real corpus, convert, verify, report
  dquant corpus real --encoding cl100k data/cl100k_int32
  dquant inspect data/cl100k_int32
  dquant convert data/cl100k_int32 data/cl100k.dqb --codec auto --zstd 3
  dquant verify data/cl100k_int32 data/cl100k.dqb
  dquant bench codecs data/cl100k_int32
  dquant read plan.toml --out batches.u16          # run a blend/pack/shuffle plan in-process";

const CORPUS_EXAMPLES: &str = "\
Examples:
  dquant corpus real --encoding cl100k data/cl100k_int32
  dquant corpus zipf data/zipf_int32 --tokens 100000000 --vocab 50257 --eod 50256";

const BENCH_EXAMPLES: &str = "\
Examples:
  dquant bench codecs data/cl100k_int32";

/// dquant: narrow, pack and compress LLM token datasets losslessly, next to the data.
#[derive(Parser)]
#[command(name = "dquant", version, after_help = EXAMPLES)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    Convert(cmd::convert::Args),
    Inspect(cmd::inspect::Args),
    Verify(cmd::verify::Args),
    #[command(subcommand, after_help = CORPUS_EXAMPLES)]
    Corpus(cmd::corpus::Cmd),
    #[command(subcommand, after_help = BENCH_EXAMPLES)]
    Bench(cmd::bench::Cmd),
    Read(cmd::read::Args),
    Demo(cmd::demo::Args),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DQUANT_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Convert(a) => cmd::convert::run(&a).map(|_| 0),
        Cmd::Inspect(a) => cmd::inspect::run(&a).map(|_| 0),
        Cmd::Verify(a) => cmd::verify::run(&a),
        Cmd::Corpus(c) => cmd::corpus::run(&c).map(|_| 0),
        Cmd::Bench(c) => cmd::bench::run(&c).map(|_| 0),
        Cmd::Read(a) => cmd::read::run(&a).map(|_| 0),
        Cmd::Demo(a) => cmd::demo::run(&a).map(|_| 0),
    };
    match r {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {}", message(&e));
            std::process::exit(1);
        }
    }
}

/// The error and its causes, like `{e:#}` but without repeats: library errors such as
/// `"{path}: {source}"` print their source and also return it from `source()`, so the plain
/// chain would say the same thing two or three times.
fn message(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !msg.contains(&c) {
            msg.push_str(": ");
            msg.push_str(&c);
        }
    }
    msg
}
