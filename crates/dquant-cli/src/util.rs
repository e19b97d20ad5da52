//! Helpers shared by the subcommands: opening inputs, progress bars, number formatting.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use dquant_format::DType;
use dquant_objstore::{locate, Place, S3Settings};
use dquant_storage::{Dataset, OpenOptions, StorageError};
use indicatif::{ProgressBar, ProgressStyle};

/// Options for inputs that do not describe themselves (raw token files).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct InputOpts {
    /// Element type of raw token inputs (u8, u16, i32, i64, ...; numpy names work too).
    #[arg(long, value_name = "DTYPE")]
    pub dtype: Option<DType>,
    /// End-of-document token of raw inputs: each occurrence ends a document.
    #[arg(long, value_name = "ID")]
    pub eod: Option<u32>,
}

/// How a command reports: text or JSON on stdout, with or without a progress bar on stderr.
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub struct OutputOpts {
    /// Print a JSON report instead of text (on stdout; `read` prints it on stderr, since its
    /// stdout carries the batches).
    #[arg(long)]
    pub json: bool,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

impl OutputOpts {
    /// True when progress bars must stay off (asked for, or JSON on stdout).
    pub fn quiet(&self) -> bool {
        self.quiet || self.json
    }
}

/// Opens an input: a local path, or `s3://BUCKET/KEY` (reached as the `AWS_*` variables
/// say: `AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, ...), read by ranged GETs.
pub fn open(path: &Path, o: &InputOpts) -> Result<Dataset> {
    let opts = OpenOptions {
        raw_dtype: o.dtype,
        eod: o.eod,
    };
    match locate(path, &S3Settings::default())? {
        Place::Local(path) => Ok(Dataset::open(&path, &opts)?),
        Place::Store(place) => {
            let (root, key) = place.object()?;
            Ok(Dataset::open_in(&root, &key, &opts)?)
        }
    }
}

/// Attaches the input's path to data errors (a token that does not fit the output, say), so
/// the message names the file the bad token came from.
pub fn in_input(path: &Path) -> impl Fn(StorageError) -> anyhow::Error + '_ {
    move |e| match e {
        StorageError::Data(e) => anyhow::anyhow!("{}: {e}", path.display()),
        e => e.into(),
    }
}

/// A token-count progress bar on stderr; hidden when `quiet` or when stderr is not a terminal.
pub fn bar(len: u64, msg: &str, quiet: bool) -> ProgressBar {
    styled_bar(
        len,
        msg,
        quiet,
        "{msg:>12} [{bar:30}] {human_pos}/{human_len} tokens {per_sec} eta {eta}",
    )
}

/// A byte-count progress bar, as [`bar`].
pub fn bytes_bar(len: u64, msg: &str, quiet: bool) -> ProgressBar {
    styled_bar(
        len,
        msg,
        quiet,
        "{msg:>12} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    )
}

fn styled_bar(len: u64, msg: &str, quiet: bool, template: &str) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template(template)
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb.set_message(msg.to_string());
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}

pub fn write_json(v: &serde_json::Value) -> Result<()> {
    println!(
        "{}",
        serde_json::to_string_pretty(v).context("serialising JSON")?
    );
    Ok(())
}

/// 1234567 -> "1,234,567".
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Parses a duration in seconds (`30`, `0.5`): finite and not negative (`--wait`).
pub fn parse_seconds(s: &str) -> Result<std::time::Duration, String> {
    s.trim()
        .parse::<f64>()
        .ok()
        .and_then(|v| std::time::Duration::try_from_secs_f64(v).ok())
        .ok_or_else(|| format!("{s:?}: a number of seconds, 0 or more"))
}

/// Parses sizes like `1MiB`, `512KiB`, `65536`.
pub fn parse_size(s: &str) -> Result<usize, String> {
    size_of(s).filter(|&n| n > 0).ok_or_else(|| {
        format!(
            "invalid size '{}' (examples: 1MiB, 256KiB, 1048576)",
            s.trim()
        )
    })
}

/// Parses sizes as [`parse_size`] does, 0 included (a budget that turns something off).
pub fn parse_size_or_zero(s: &str) -> Result<usize, String> {
    size_of(s).ok_or_else(|| format!("invalid size '{}' (examples: 8GiB, 512MiB, 0)", s.trim()))
}

/// `s`'s bytes, as every size dquant reads is parsed ([`dquant_storage::bytes_of`]).
fn size_of(s: &str) -> Option<usize> {
    dquant_storage::bytes_of(s).and_then(|n| usize::try_from(n).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_finite_and_not_negative() {
        assert_eq!(
            parse_seconds("0.5"),
            Ok(std::time::Duration::from_millis(500))
        );
        assert_eq!(parse_seconds("30"), Ok(std::time::Duration::from_secs(30)));
        for bad in ["-1", "inf", "NaN", "soon", ""] {
            assert_eq!(
                parse_seconds(bad),
                Err(format!("{bad:?}: a number of seconds, 0 or more"))
            );
        }
    }

    #[test]
    fn sizes_take_units_and_zero_only_where_it_means_off() {
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size(" 512 KiB "), Ok(512 << 10));
        assert_eq!(parse_size("65536"), Ok(65536));
        assert_eq!(
            parse_size("0"),
            Err("invalid size '0' (examples: 1MiB, 256KiB, 1048576)".into())
        );
        assert_eq!(parse_size_or_zero("0"), Ok(0));
        assert_eq!(parse_size_or_zero("8GiB"), Ok(8 << 30));
        assert_eq!(
            parse_size_or_zero("8 GB"),
            Err("invalid size '8 GB' (examples: 8GiB, 512MiB, 0)".into())
        );
        assert!(parse_size_or_zero(&format!("{}GiB", usize::MAX)).is_err());
    }
}
