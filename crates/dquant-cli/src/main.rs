//! `dquant`: the command-line front door.
//!
//! Each subcommand lives in `cmd/`; this file only parses arguments, sets up logging and maps
//! errors to exit codes (1 for failures and for `verify` finding a difference, 2 for usage
//! errors, as clap does).

mod agentlog;
mod cmd;
mod util;

use clap::{Parser, Subcommand};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

const EXAMPLES: &str = "\
Examples:
  dquant demo                                    # real corpus -> agent -> blended stream, measured
  dquant corpus real --encoding cl100k data/cl100k_int32
  dquant inspect data/cl100k_int32
  dquant convert data/cl100k_int32 data/cl100k.dqb --codec auto --zstd 3
  dquant verify data/cl100k_int32 data/cl100k.dqb
  dquant sums data/cl100k_int32                  # a crc32c per 64 KiB of the .bin, checked on every read
  dquant bench codecs data/cl100k_int32
  dquant read plan.toml --out batches.u16          # run a blend/pack/shuffle plan in-process
  dquant locate plan.toml --sample 123456          # which documents a sample holds; --document K:D: the reverse
  dquant audit plan.toml --until 5000000           # per source: samples, tokens, epochs, documents touched
  dquant serve --root corpus=/data/tokens          # the offload agent, on 127.0.0.1:7878
  dquant ls dquant://127.0.0.1:7878/corpus         # what it serves
  dquant stat dquant://127.0.0.1:7878/corpus/web_int32
  dquant health dquant://127.0.0.1:7878            # exit 0 while it serves (readiness)
  dquant read plan.toml --agent dquant://127.0.0.1:7878 --out batches.u16   # the agent runs it
  dquant mount dquant://127.0.0.1:7878 /mnt/dq     # its datasets as Megatron files (FUSE)
  dquant top dquant://127.0.0.1:7878               # tenants' rates and sessions, live

Logs go to stderr; DQUANT_LOG sets the filter (e.g. DQUANT_LOG=debug; default warn, info for serve).";

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
    Sums(cmd::sums::Args),
    #[command(subcommand, after_help = CORPUS_EXAMPLES)]
    Corpus(cmd::corpus::Cmd),
    #[command(subcommand, after_help = BENCH_EXAMPLES)]
    Bench(cmd::bench::Cmd),
    Read(cmd::read::Args),
    Locate(cmd::locate::Args),
    Audit(cmd::audit::Args),
    Subscribe(cmd::subscribe::Args),
    Serve(cmd::serve::Args),
    Ls(cmd::remote::LsArgs),
    Stat(cmd::remote::StatArgs),
    Health(cmd::remote::HealthArgs),
    Demo(cmd::demo::Args),
    Mount(cmd::mount::Args),
    Top(cmd::top::Args),
}

fn main() {
    let cli = Cli::parse();
    logging(&cli.cmd);
    let r = match cli.cmd {
        Cmd::Convert(a) => cmd::convert::run(&a).map(|_| 0),
        Cmd::Inspect(a) => cmd::inspect::run(&a).map(|_| 0),
        Cmd::Verify(a) => cmd::verify::run(&a),
        Cmd::Sums(a) => cmd::sums::run(&a),
        Cmd::Corpus(c) => cmd::corpus::run(&c).map(|_| 0),
        Cmd::Bench(c) => cmd::bench::run(&c).map(|_| 0),
        Cmd::Read(a) => cmd::read::run(&a).map(|_| 0),
        Cmd::Locate(a) => cmd::locate::run(&a).map(|_| 0),
        Cmd::Audit(a) => cmd::audit::run(&a).map(|_| 0),
        Cmd::Subscribe(a) => cmd::subscribe::run(&a).map(|_| 0),
        Cmd::Serve(a) => cmd::serve::run(&a).map(|_| 0),
        Cmd::Ls(a) => cmd::remote::ls(&a).map(|_| 0),
        Cmd::Stat(a) => cmd::remote::stat(&a).map(|_| 0),
        Cmd::Health(a) => cmd::remote::health(&a),
        Cmd::Demo(a) => cmd::demo::run(&a).map(|_| 0),
        Cmd::Mount(a) => cmd::mount::run(&a).map(|_| 0),
        Cmd::Top(a) => cmd::top::run(&a).map(|_| 0),
    };
    match r {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {}", message(&e));
            std::process::exit(1);
        }
    }
}

/// Logs to stderr, filtered by `DQUANT_LOG` (default `warn`; `info` for `serve`, whose log is
/// its output). `demo` also reads its in-process agent's session reports ([`agentlog`]).
fn logging(cmd: &Cmd) {
    let default = match cmd {
        Cmd::Serve(_) => "info",
        // A mount's log says why a read failed with EIO.
        Cmd::Mount(_) => "warn,dquant_mount=info",
        _ => "warn",
    };
    let filter = EnvFilter::try_from_env("DQUANT_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(filter);
    let sessions = matches!(cmd, Cmd::Demo(_)).then(|| {
        agentlog::SessionLog.with_filter(tracing_subscriber::filter::filter_fn(|m| {
            m.target().starts_with("dquant_agent") && *m.level() <= tracing::Level::INFO
        }))
    });
    tracing_subscriber::registry()
        .with(fmt)
        .with(sessions)
        .init();
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
