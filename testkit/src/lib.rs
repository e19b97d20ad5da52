//! Test support for the workspace's tests, a dev-dependency only (never a product
//! `[dependencies]` entry). It holds what the agent, client, CLI, FFI and format tests
//! would otherwise each copy:
//!
//! - the Megatron-Core fixtures ([`fixtures_dir`], [`fixture`], …) and [`xxh3`];
//! - [`process`]: `dquant serve` as a child process, and the signals tests send it;
//! - with the `agent` feature, `agent` (agents in this process over a `Corpus` of real data)
//!   and `stream` (what a reader yields, whole);
//! - with the `s3` feature, [`s3`]: an S3 server on loopback and a proxy that breaks it;
//! - with the `tls` feature, [`tls`]: a CA and agent certificates made per test;
//! - [`metrics`]: an agent's Prometheus page, scraped;
//! - [`netns`]: a network namespace on a veth pair, partitioned and healed;
//! - [`tap`]: the packets on `lo` as the kernel sent them (IP header marks);
//! - [`require`]: a component a test needs, which must be there under `CI=true`.

use std::path::{Path, PathBuf};

#[cfg(feature = "agent")]
pub mod agent;
pub mod metrics;
pub mod netns;
pub mod process;
#[cfg(feature = "s3")]
pub mod s3;
#[cfg(feature = "agent")]
pub mod stream;
pub mod tap;
#[cfg(feature = "tls")]
pub mod tls;

/// The Megatron-Core fixtures (`r50k_*.{idx,bin}`, written by Megatron-Core itself, see
/// `testkit/fixtures/megatron/README.md`), vendored in this repository so that a clone with
/// nothing beside it runs every test. Panics, saying where it looked, when they are not there.
pub fn fixtures_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/megatron");
    assert!(
        dir.join("r50k_int32.idx").is_file(),
        "Megatron fixtures not found at {}: they are part of the repository \
         (testkit/fixtures/megatron/r50k_*.{{idx,bin}}); is the checkout complete?",
        dir.display()
    );
    dir
}

/// The path of fixture `name`: a file (`r50k_int32.idx`) or a dataset prefix (`r50k_int32`).
pub fn fixture(name: &str) -> PathBuf {
    fixtures_dir().join(name)
}

/// [`fixture`] as a string: what plans and command lines take as a source URI.
pub fn fixture_str(name: &str) -> String {
    fixture(name).display().to_string()
}

/// The bytes of fixture file `name` (`r50k_int32.idx`), for tests of the pure formats.
pub fn read_fixture(name: &str) -> Vec<u8> {
    let p = fixture(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("reading fixture {}: {e}", p.display()))
}

/// Copies fixture dataset `name` (its `.bin` and `.idx`) to the dataset prefix `to`, so that an
/// agent root (a directory of its own) can serve it, under `to`'s name.
pub fn copy_fixture(name: &str, to: &Path) {
    for ext in ["bin", "idx"] {
        let (from, dst) = (
            fixture(&format!("{name}.{ext}")),
            PathBuf::from(format!("{}.{ext}", to.display())),
        );
        std::fs::copy(&from, &dst)
            .unwrap_or_else(|e| panic!("copying {} to {}: {e}", from.display(), dst.display()));
    }
}

/// XXH3-64 of `bytes`: the whole-stream checksum tests compare streams by (the CLI's
/// `stream_xxh3` is the same function).
pub fn xxh3(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// Whether a test may use `component` (FUSE, a network namespace, an S3 server, …), which
/// `present` says is here. Missing under `CI=true`, the test fails with `how`, because CI
/// installs every component and a test that checked nothing must not count as passed.
/// Missing elsewhere (a developer's laptop), it returns `false` after a loud note, and the
/// caller returns without asserting anything.
///
/// The note goes straight to the process's stderr, not through `eprintln!`, which the test
/// harness captures and hides for a passing test; and when `DQUANT_SKIP_LOG` names a file,
/// one line is appended to it, so that a runner (`.ci/run`) can count the tests that
/// checked nothing.
pub fn require(component: &str, present: bool, how: &str) -> bool {
    if present {
        return true;
    }
    assert!(
        !in_ci(),
        "{component} is missing and CI=true: this test cannot check anything without it ({how})"
    );
    record_skip(component, how);
    false
}

/// Says loudly that the running test checked nothing for want of `component`, and appends
/// the same line to `$DQUANT_SKIP_LOG` when it is set (see [`require`]).
fn record_skip(component: &str, how: &str) {
    use std::io::Write;
    let thread = std::thread::current();
    let line = skip_line(thread.name().unwrap_or("a test"), component, how);
    // Written to the stream itself: libtest captures only the print macros.
    let _ = writeln!(
        std::io::stderr(),
        "\n*** {line}; under CI=true this fails ***\n"
    );
    if let Some(log) = std::env::var_os("DQUANT_SKIP_LOG") {
        let log = PathBuf::from(log);
        if let Err(e) = append_line(&log, &line) {
            panic!(
                "recording the skip in DQUANT_SKIP_LOG={}: {e}",
                log.display()
            );
        }
    }
}

/// The one line a skip is told and counted by (`.ci/run` counts lines that start `SKIPPED `).
fn skip_line(test: &str, component: &str, how: &str) -> String {
    format!("SKIPPED {test}: {component} is missing ({how})")
}

fn append_line(path: &Path, line: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    // One write of the whole line, so that lines of tests running at once never interleave.
    f.write_all(format!("{line}\n").as_bytes())
}

/// True when the `CI` environment variable says so (`true` or `1`), as in `.ci/run`.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_are_appended_one_line_each() {
        let dir = std::env::temp_dir().join(format!("dquant-skip-log-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        append_line(&dir, &skip_line("a::b", "FUSE", "no /dev/fuse")).unwrap();
        append_line(&dir, &skip_line("c", "ip", "not installed")).unwrap();
        let text = std::fs::read_to_string(&dir).unwrap();
        std::fs::remove_file(&dir).unwrap();
        assert_eq!(
            text,
            "SKIPPED a::b: FUSE is missing (no /dev/fuse)\nSKIPPED c: ip is missing (not installed)\n"
        );
    }
}
