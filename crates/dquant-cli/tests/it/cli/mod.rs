//! End-to-end tests of the `dquant` binary: the Megatron-Core fixtures (written by Megatron-Core
//! itself, see `testkit/fixtures/megatron/README.md`), round trips through every codec, `inspect`
//! and `verify` facts, raw files, corpus determinism, and exact errors on bad input.
//!
//! Every test asserts on data: file bytes, checksums, `verify` verdicts, exact messages.
//! Megatron files are also written and parsed here by hand (a few lines, following
//! `megatron/core/datasets/indexed_dataset.py`), so the tests do not trust dquant's own
//! Megatron code to check itself.
//!
//! This module holds what every test here shares (running the binary, files, Megatron files
//! by hand); each submodule one concern.

mod bad_input;
mod corpus;
mod facts;
mod full_disk;
mod help;
mod megatron;
mod raw;
mod round_trips;

use std::path::{Path, PathBuf};
use std::process::Command;

use dquant_testkit::fixture;
use serde_json::Value;
use tempfile::TempDir;

// ---------------------------------------------------------------------------------------------
// Running the binary

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn dquant(args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_dquant"))
        .args(args)
        .env_remove("DQUANT_LOG")
        .output()
        .expect("running the dquant binary");
    let r = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(
        !r.stderr.contains("panicked"),
        "dquant {args:?} panicked:\n{}",
        r.stderr
    );
    r
}

/// Runs dquant, expects exit 0, returns stdout.
fn ok(args: &[&str]) -> String {
    let r = dquant(args);
    assert_eq!(
        r.code, 0,
        "dquant {args:?} failed\nstdout:\n{}\nstderr:\n{}",
        r.stdout, r.stderr
    );
    r.stdout
}

/// Runs dquant, expects exit 1 and a one-line error, returns that line without `error: `.
fn fails(args: &[&str]) -> String {
    let r = dquant(args);
    assert_eq!(
        r.code, 1,
        "dquant {args:?} should fail with exit code 1\nstdout:\n{}\nstderr:\n{}",
        r.stdout, r.stderr
    );
    let line = r
        .stderr
        .strip_prefix("error: ")
        .and_then(|s| s.strip_suffix('\n'))
        .unwrap_or_else(|| {
            panic!(
                "dquant {args:?}: stderr is not one error line: {:?}",
                r.stderr
            )
        });
    assert!(!line.contains('\n'), "more than one line: {:?}", r.stderr);
    line.to_string()
}

fn json(args: &[&str]) -> Value {
    let out = ok(args);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("dquant {args:?}: bad JSON ({e}):\n{out}"))
}

fn inspect(path: &Path, extra: &[&str]) -> Value {
    let p = s(path);
    let mut args = vec!["inspect", &p, "--json"];
    args.extend_from_slice(extra);
    json(&args)
}

fn convert(src: &Path, dst: &Path, opts: &[&str]) -> Value {
    let (a, b) = (s(src), s(dst));
    let mut args = vec!["convert", &a, &b, "--json"];
    args.extend_from_slice(opts);
    json(&args)
}

/// `dquant verify A B` must say identical; returns its line.
fn assert_identical(a: &Path, b: &Path, extra: &[&str]) -> String {
    let (pa, pb) = (s(a), s(b));
    let mut args = vec!["verify", &pa, &pb];
    args.extend_from_slice(extra);
    let out = ok(&args);
    assert!(out.starts_with("identical: "), "verify {pa} {pb}: {out}");
    out
}

/// `dquant verify A B` must exit 1 and report a difference; returns it.
fn difference(a: &Path, b: &Path) -> String {
    let r = dquant(&["verify", &s(a), &s(b)]);
    assert_eq!(r.code, 1, "stdout: {}\nstderr: {}", r.stdout, r.stderr);
    assert_eq!(r.stderr, "");
    r.stdout
        .strip_prefix("different: ")
        .and_then(|l| l.strip_suffix('\n'))
        .unwrap_or_else(|| panic!("unexpected verify output: {:?}", r.stdout))
        .to_string()
}

// ---------------------------------------------------------------------------------------------
// Files

fn s(p: &Path) -> String {
    p.to_str().expect("test paths are UTF-8").to_string()
}

fn with_ext(prefix: &Path, ext: &str) -> PathBuf {
    PathBuf::from(format!("{}.{ext}", prefix.display()))
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

fn size(p: &Path) -> u64 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .len()
}

/// `PREFIX.bin` and `PREFIX.idx` of `a` and `b` are byte-identical.
fn assert_same_megatron(a: &Path, b: &Path) {
    for ext in ["bin", "idx"] {
        let (x, y) = (read(&with_ext(a, ext)), read(&with_ext(b, ext)));
        assert!(
            x == y,
            "{}.{ext} ({} bytes) differs from {}.{ext} ({} bytes)",
            a.display(),
            x.len(),
            b.display(),
            y.len()
        );
    }
}

/// Every name in `dir`, hidden ones (temporary files) included, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn tmp() -> TempDir {
    tempfile::tempdir().unwrap()
}

// ---------------------------------------------------------------------------------------------
// Megatron IndexedDataset, by hand: "MMIDIDX\0\0", version u64 = 1, dtype code u8,
// sequence count u64, document_indices length u64, sizes i32[seq], pointers i64[seq] (byte
// offsets into .bin), document_indices i64[doc + 1] (first sequence of each document, then the
// sequence count).

const MEGATRON_MAGIC: &[u8; 9] = b"MMIDIDX\0\0";
const INT32: u8 = 4;
const UINT16: u8 = 8;

#[derive(Clone, Debug)]
struct Megatron {
    tokens: Vec<u32>,
    seq_lens: Vec<u64>,
    doc_indices: Vec<u64>,
}

impl Megatron {
    /// One sequence per document.
    fn from_docs(docs: &[Vec<u32>]) -> Self {
        let n = docs.len() as u64;
        Megatron {
            tokens: docs.concat(),
            seq_lens: docs.iter().map(|d| d.len() as u64).collect(),
            doc_indices: (0..=n).collect(),
        }
    }

    fn read(prefix: &Path) -> Self {
        let idx = read(&with_ext(prefix, "idx"));
        assert_eq!(&idx[..9], MEGATRON_MAGIC);
        assert_eq!(u64::from_le_bytes(idx[9..17].try_into().unwrap()), 1);
        let code = idx[17];
        let seqs = u64::from_le_bytes(idx[18..26].try_into().unwrap()) as usize;
        let docs = u64::from_le_bytes(idx[26..34].try_into().unwrap()) as usize;
        let mut o = 34;
        let mut seq_lens = Vec::new();
        for _ in 0..seqs {
            seq_lens.push(i32::from_le_bytes(idx[o..o + 4].try_into().unwrap()) as u64);
            o += 4;
        }
        o += 8 * seqs; // pointers: checked by `write` reproducing the bytes
        let mut doc_indices = Vec::new();
        for _ in 0..docs {
            doc_indices.push(i64::from_le_bytes(idx[o..o + 8].try_into().unwrap()) as u64);
            o += 8;
        }
        assert_eq!(o, idx.len());
        let bin = read(&with_ext(prefix, "bin"));
        let tokens: Vec<u32> = match code {
            INT32 => bin
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as u32)
                .collect(),
            UINT16 => bin
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes(c.try_into().unwrap()) as u32)
                .collect(),
            c => panic!("dtype code {c} not handled by the test"),
        };
        assert_eq!(tokens.len() as u64, seq_lens.iter().sum::<u64>());
        Megatron {
            tokens,
            seq_lens,
            doc_indices,
        }
    }

    /// Writes `PREFIX.bin` and `PREFIX.idx` as int32.
    fn write_i32(&self, prefix: &Path) {
        let bin: Vec<u8> = self
            .tokens
            .iter()
            .flat_map(|&t| (t as i32).to_le_bytes())
            .collect();
        let mut idx = MEGATRON_MAGIC.to_vec();
        idx.extend_from_slice(&1u64.to_le_bytes());
        idx.push(INT32);
        idx.extend_from_slice(&(self.seq_lens.len() as u64).to_le_bytes());
        idx.extend_from_slice(&(self.doc_indices.len() as u64).to_le_bytes());
        for &l in &self.seq_lens {
            idx.extend_from_slice(&(l as i32).to_le_bytes());
        }
        let mut ptr = 0i64;
        for &l in &self.seq_lens {
            idx.extend_from_slice(&ptr.to_le_bytes());
            ptr += l as i64 * 4;
        }
        for &d in &self.doc_indices {
            idx.extend_from_slice(&(d as i64).to_le_bytes());
        }
        std::fs::write(with_ext(prefix, "bin"), bin).unwrap();
        std::fs::write(with_ext(prefix, "idx"), idx).unwrap();
    }

    /// Token offset where each document starts.
    fn doc_starts(&self) -> Vec<u64> {
        let seq_starts: Vec<u64> = std::iter::once(0)
            .chain(self.seq_lens.iter().scan(0, |a, &l| {
                *a += l;
                Some(*a)
            }))
            .collect();
        self.doc_indices[..self.doc_indices.len() - 1]
            .iter()
            .map(|&sq| seq_starts[sq as usize])
            .collect()
    }

    /// (document, offset within it) of a token.
    fn locate(&self, offset: u64) -> (usize, u64) {
        let starts = self.doc_starts();
        let d = starts.iter().rposition(|&st| st <= offset).unwrap();
        (d, offset - starts[d])
    }

    /// Splits every sequence into sequences of at most `max` tokens, documents unchanged.
    fn split_sequences(&self, max: u64) -> Self {
        let mut seq_lens = Vec::new();
        let mut doc_indices = vec![0];
        for d in 0..self.doc_indices.len() - 1 {
            for sq in self.doc_indices[d]..self.doc_indices[d + 1] {
                let mut l = self.seq_lens[sq as usize];
                while l > 0 {
                    seq_lens.push(l.min(max));
                    l -= l.min(max);
                }
            }
            doc_indices.push(seq_lens.len() as u64);
        }
        Megatron {
            tokens: self.tokens.clone(),
            seq_lens,
            doc_indices,
        }
    }
}

/// A cl100k-like Megatron int32 dataset with ids above 65535 (a Zipf corpus over a 100277-token
/// vocabulary, end-of-document 100257), its documents split into sequences of at most 1000
/// tokens by hand, as Megatron-Core does for `r50k_int32_multiseq`.
fn cl100k_like(dir: &Path) -> PathBuf {
    let zipf = dir.join("zipf_int32");
    ok(&[
        "corpus",
        "zipf",
        &s(&zipf),
        "--tokens",
        "120000",
        "--vocab",
        "100277",
        "--eod",
        "100257",
        "--mean-doc-len",
        "3000",
        "--quiet",
    ]);
    let m = Megatron::read(&zipf);
    assert_eq!(m.tokens.len(), 120000);
    assert!(m.tokens.iter().any(|&t| t > 65535), "no id above 16 bits");
    assert!(m.tokens.iter().all(|&t| t < 100277));
    for st in &m.doc_starts()[1..] {
        assert_eq!(m.tokens[*st as usize - 1], 100257, "documents end with EOD");
    }
    let multi = m.split_sequences(1000);
    assert!(multi.seq_lens.len() > multi.doc_indices.len());
    let prefix = dir.join("cl100k_int32_multiseq");
    multi.write_i32(&prefix);
    prefix
}
