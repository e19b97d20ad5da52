//! End-to-end tests of the `dquant` binary: the Megatron-Core fixtures (written by Megatron-Core
//! itself, see `testkit/fixtures/megatron/README.md`), round trips through every codec, `inspect`
//! and `verify` facts, raw files, corpus determinism, and exact errors on bad input.
//!
//! Every test asserts on data: file bytes, checksums, `verify` verdicts, exact messages.
//! Megatron files are also written and parsed here by hand (a few lines, following
//! `megatron/core/datasets/indexed_dataset.py`), so the tests do not trust dquant's own
//! Megatron code to check itself.

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

// ---------------------------------------------------------------------------------------------
// 0. The hand-written Megatron code above agrees with Megatron-Core.

#[test]
fn hand_written_megatron_files_match_megatron_core() {
    let dir = tmp();
    for name in ["r50k_int32", "r50k_int32_multiseq"] {
        let m = Megatron::read(&fixture(name));
        let out = dir.path().join(name);
        m.write_i32(&out);
        assert_same_megatron(&out, &fixture(name));
    }
    let one = Megatron::read(&fixture("r50k_int32"));
    let multi = Megatron::read(&fixture("r50k_int32_multiseq"));
    assert_eq!(one.tokens, Megatron::read(&fixture("r50k_uint16")).tokens);
    assert_eq!(one.tokens, multi.tokens);
    assert_eq!((one.seq_lens.len(), one.doc_indices.len()), (28, 29));
    assert_eq!((multi.seq_lens.len(), multi.doc_indices.len()), (175, 29));
    assert_eq!(one.split_sequences(1000).seq_lens, multi.seq_lens);
    assert_eq!(one.split_sequences(1000).doc_indices, multi.doc_indices);
}

// ---------------------------------------------------------------------------------------------
// 1. Megatron byte identity

#[test]
fn int32_to_u16_is_byte_identical_to_megatron_core() {
    let dir = tmp();
    let src = fixture("r50k_int32");
    let u16 = dir.path().join("u16");
    let rep = convert(&src, &u16, &["--codec", "u16"]);
    assert_eq!(rep["dst_format"], "Megatron IndexedDataset (uint16)");
    assert_eq!(rep["tokens"], 161032);
    assert_eq!(rep["documents"], 28);
    assert_same_megatron(&u16, &fixture("r50k_uint16"));
    assert_eq!(
        rep["dst_bytes"],
        size(&fixture("r50k_uint16.bin")) + size(&fixture("r50k_uint16.idx"))
    );
    assert_eq!(
        rep["files"],
        serde_json::json!([s(&with_ext(&u16, "bin")), s(&with_ext(&u16, "idx"))])
    );

    // `auto` to a Megatron prefix makes Megatron-Core's own choice: uint16 for these ids.
    let auto = dir.path().join("auto");
    let rep = convert(&src, &auto, &[]);
    assert_eq!(rep["dst_format"], "Megatron IndexedDataset (uint16)");
    assert_same_megatron(&auto, &fixture("r50k_uint16"));

    // The destination may be named by its .idx or .bin too.
    let by_idx = dir.path().join("by_idx");
    convert(&src, &with_ext(&by_idx, "idx"), &["--codec", "u16"]);
    assert_same_megatron(&by_idx, &fixture("r50k_uint16"));

    // And back: uint16 -> int32 gives Megatron-Core's int32 files.
    let i32 = dir.path().join("i32");
    convert(&fixture("r50k_uint16"), &i32, &["--codec", "i32"]);
    assert_same_megatron(&i32, &src);

    // Output files get the mode of any file the user creates (0o666 less the umask), not the
    // owner-only 0o600 of a temporary file.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let other = tmp();
    let plain = other.path().join("plain");
    std::fs::write(&plain, b"x").unwrap();
    for f in [with_ext(&u16, "bin"), with_ext(&u16, "idx")] {
        assert_eq!(mode(&f), mode(&plain), "{}", f.display());
    }
    assert_eq!(
        entries(dir.path()),
        [
            "auto.bin",
            "auto.idx",
            "by_idx.bin",
            "by_idx.idx",
            "i32.bin",
            "i32.idx",
            "u16.bin",
            "u16.idx"
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Round trips: int32 Megatron -> u16 Megatron / .dqb (every codec) -> int32 Megatron.

fn round_trip(src: &Path, dir: &Path, targets: &[(&str, &[&str], &str)], counts: &str) {
    let checksum = inspect(src, &["--no-sizes"])["checksum"].clone();
    for (name, opts, dst_format) in targets {
        let dst = dir.join(name);
        let rep = convert(src, &dst, opts);
        assert!(
            rep["dst_format"].as_str().unwrap().starts_with(dst_format),
            "{name}: {}",
            rep["dst_format"]
        );
        assert_eq!(rep["checksum"], checksum, "{name}");
        assert_eq!(rep["verified"], true);
        // The report's size is the size on disk.
        let on_disk: u64 = rep["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| size(Path::new(f.as_str().unwrap())))
            .sum();
        assert_eq!(rep["dst_bytes"], on_disk, "{name}");
        assert_eq!(
            inspect(&dst, &["--no-sizes"])["checksum"],
            checksum,
            "{name}"
        );

        let line = assert_identical(src, &dst, &[]);
        assert_eq!(line, format!("identical: {counts}\n"), "{name}");
        assert_identical(&dst, src, &[]);

        let back = dir.join(format!("{name}_back"));
        let rep = convert(&dst, &back, &["--codec", "i32"]);
        assert_eq!(rep["dst_format"], "Megatron IndexedDataset (int32)");
        assert_identical(&dst, &back, &[]);
        assert_identical(src, &back, &[]);
        assert_same_megatron(&back, src);
    }
}

#[test]
fn r50k_multiseq_round_trips_through_every_codec() {
    let dir = tmp();
    let src = fixture("r50k_int32_multiseq");
    let targets: &[(&str, &[&str], &str)] = &[
        (
            "u16",
            &["--codec", "u16"],
            "Megatron IndexedDataset (uint16)",
        ),
        (
            "b17.dqb",
            &["--codec", "bits:17"],
            "dquant block file (bits:17,",
        ),
        (
            "b17_zstd3.dqb",
            &["--codec", "bits:17", "--zstd", "3"],
            "dquant block file (bits:17+zstd:3,",
        ),
        (
            "b17+zstd3.dqb",
            &["--codec", "bits:17+zstd:3"],
            "dquant block file (bits:17+zstd:3,",
        ),
        (
            "auto_lz4.dqb",
            &["--codec", "auto", "--lz4"],
            "dquant block file (u16+lz4,",
        ),
        (
            // Many blocks, the last one partial.
            "small_blocks.dqb",
            &["--codec", "bits:17+zstd:3", "--block-size", "64KiB"],
            "dquant block file (bits:17+zstd:3, 30720 tokens per block)",
        ),
        (
            "archive.dqb",
            &["--preset", "archive"],
            "dquant block file (u16+rank+zstd:19, 2097152 tokens per block)",
        ),
        (
            "dpu.dqb",
            &["--preset", "dpu"],
            "dquant block file (u16+lz4hc:9, 16384 tokens per block)",
        ),
        (
            "rank_small_blocks.dqb",
            &["--codec", "auto+rank+zstd:3", "--block-size", "64KiB"],
            "dquant block file (u16+rank+zstd:3, 32768 tokens per block)",
        ),
    ];
    round_trip(
        &src,
        dir.path(),
        targets,
        "161,032 tokens in 28 documents (175 sequences)",
    );
    // A .dqb re-encoded as another .dqb is still the same data.
    let again = dir.path().join("again.dqb");
    convert(&dir.path().join("b17.dqb"), &again, &["--codec", "u16+lz4"]);
    assert_identical(&src, &again, &[]);
    // Blocks compressed on several threads: the same file, byte for byte.
    let small = [
        "--codec",
        "bits:17+zstd:3",
        "--block-size",
        "64KiB",
        "--threads",
    ];
    for threads in ["1", "3"] {
        let out = dir.path().join(format!("threads{threads}.dqb"));
        convert(&src, &out, &[&small[..], &[threads]].concat());
    }
    let (one, three) = (
        dir.path().join("threads1.dqb"),
        dir.path().join("threads3.dqb"),
    );
    assert!(read(&one) == read(&three), "3 threads wrote another file");
    let r = dquant(&["convert", &s(&src), &s(&three), "--force", "--threads", "0"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    let e = "error: invalid value '0' for '--threads <N>': 0 is not in 1..=256";
    assert!(r.stderr.starts_with(e), "{}", r.stderr);
}

#[test]
fn cl100k_like_round_trips_through_every_codec() {
    let dir = tmp();
    let src = cl100k_like(dir.path());
    let facts = inspect(&src, &["--no-sizes"]);
    assert_eq!(facts["bits_needed"], 17);
    let docs = facts["documents"].as_u64().unwrap();
    let seqs = facts["sequences"].as_u64().unwrap();
    assert!(seqs > docs, "{facts}");
    let targets: &[(&str, &[&str], &str)] = &[
        (
            "b17.dqb",
            &["--codec", "bits:17"],
            "dquant block file (bits:17,",
        ),
        (
            "b17_zstd3.dqb",
            &["--codec", "bits:17", "--zstd", "3"],
            "dquant block file (bits:17+zstd:3,",
        ),
        (
            "b17+zstd3.dqb",
            &["--codec", "bits:17+zstd:3", "--block-size", "64KiB"],
            "dquant block file (bits:17+zstd:3, 30720 tokens per block)",
        ),
        (
            "auto_lz4.dqb",
            &["--codec", "auto", "--lz4"],
            "dquant block file (u24+lz4,",
        ),
        ("auto.dqb", &[], "dquant block file (bits:17,"),
        (
            "archive.dqb",
            &["--preset", "archive"],
            "dquant block file (u24+rank+zstd:19, 2097152 tokens per block)",
        ),
        (
            "dpu.dqb",
            &["--preset", "dpu"],
            "dquant block file (u24+lz4hc:9, 10752 tokens per block)",
        ),
        // `auto` to a Megatron prefix: int32, as Megatron-Core picks for ids above 65535.
        ("auto_megatron", &[], "Megatron IndexedDataset (int32)"),
    ];
    round_trip(
        &src,
        dir.path(),
        targets,
        &format!("120,000 tokens in {docs} documents ({seqs} sequences)"),
    );
    // u16 does not fit: an error naming the first token above 65535, and no output.
    let m = Megatron::read(&src);
    let first = m.tokens.iter().position(|&t| t > 65535).unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let err = fails(&["convert", &s(&src), &s(&out.join("u16")), "--codec", "u16"]);
    assert_eq!(
        err,
        format!(
            "{}: token {} at offset {first} does not fit in u16 (max 65535); it needs 17 bits: \
             use bits:17 or wider",
            with_ext(&src, "bin").display(),
            m.tokens[first]
        )
    );
    assert!(entries(&out).is_empty(), "{:?}", entries(&out));
}

// ---------------------------------------------------------------------------------------------
// 3. inspect

#[test]
fn inspect_reports_facts_exact_sizes_and_a_codec_independent_checksum() {
    let dir = tmp();
    let v = inspect(&fixture("r50k_int32"), &[]);
    assert_eq!(v["format"], "megatron");
    assert_eq!(v["format_detail"], "Megatron IndexedDataset (int32)");
    assert_eq!(v["tokens"], 161032);
    assert_eq!(v["documents"], 28);
    assert_eq!(v["sequences"], 28);
    assert_eq!(v["max_token"], 50256);
    assert_eq!(v["bits_needed"], 16);
    assert_eq!(
        v["bytes"],
        size(&fixture("r50k_int32.bin")) + size(&fixture("r50k_int32.idx"))
    );
    let checksum = v["checksum"].as_str().unwrap().to_string();
    assert!(checksum.starts_with("xxh3:"), "{checksum}");

    // Every size inspect announces is the size the file really has.
    let sizes: Vec<(String, u64)> = v["sizes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["codec"].as_str().unwrap().to_string(),
                r["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    let names: Vec<&str> = sizes.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "megatron int32",
            "megatron uint16",
            "dqb u16",
            "dqb u16+lz4",
            "dqb u16+zstd:1",
            "dqb u16+zstd:3",
            "dqb u16+zstd:9",
            "dqb i32+zstd:3"
        ]
    );
    assert_eq!(sizes[0].1, v["bytes"].as_u64().unwrap());
    assert_eq!(
        sizes[1].1,
        size(&fixture("r50k_uint16.bin")) + size(&fixture("r50k_uint16.idx"))
    );
    for (name, bytes) in &sizes[2..] {
        let codec = name.strip_prefix("dqb ").unwrap();
        let dst = dir.path().join(format!("{}.dqb", codec.replace(':', "_")));
        let rep = convert(&fixture("r50k_int32"), &dst, &["--codec", codec]);
        assert_eq!(size(&dst), *bytes, "{name}");
        assert_eq!(rep["dst_bytes"], *bytes, "{name}");
        assert_eq!(rep["checksum"], checksum.as_str(), "{name}");
    }

    // The checksum does not depend on the dtype or codec...
    let dqb = dir.path().join("u16+zstd_3.dqb");
    for p in [fixture("r50k_uint16"), dqb.clone()] {
        assert_eq!(inspect(&p, &["--no-sizes"])["checksum"], checksum.as_str());
    }
    let d = inspect(&dqb, &["--no-sizes"]);
    assert_eq!(d["format"], "dqb");
    assert_eq!(
        d["format_detail"],
        "dquant block file (u16+zstd:3, 524288 tokens per block)"
    );
    assert_eq!(
        (&d["tokens"], &d["documents"]),
        (&v["tokens"], &v["documents"])
    );
    // ...but it does depend on the boundaries: same tokens, other sequences.
    let multi = inspect(&fixture("r50k_int32_multiseq"), &["--no-sizes"]);
    let multi = multi["checksum"].as_str().unwrap();
    assert_eq!(multi.split('-').next(), checksum.split('-').next());
    assert_ne!(multi, checksum);

    // The text form says the same.
    let text = ok(&["inspect", &s(&fixture("r50k_uint16")), "--no-sizes"]);
    assert!(
        text.contains("format      Megatron IndexedDataset (uint16)\n"),
        "{text}"
    );
    assert!(text.contains("documents   28 (28 sequences)\n"), "{text}");
    assert!(text.contains("tokens      161,032\n"), "{text}");
    assert!(
        text.contains("max token   50256 (needs 16 bits)\n"),
        "{text}"
    );
    assert!(
        text.contains(&format!("checksum    {checksum}\n")),
        "{text}"
    );
}

// ---------------------------------------------------------------------------------------------
// 4. verify finds differences

#[test]
fn verify_reports_the_first_different_token() {
    let dir = tmp();
    let orig = Megatron::read(&fixture("r50k_int32"));
    let offset = 100_000u64;
    let (a, b) = (
        orig.tokens[offset as usize],
        (orig.tokens[offset as usize] + 1) % 50257,
    );
    let mut changed = orig.clone();
    changed.tokens[offset as usize] = b;
    let prefix = dir.path().join("changed");
    changed.write_i32(&prefix);
    // Only the one token differs.
    let (x, y) = (
        read(&fixture("r50k_int32.bin")),
        read(&with_ext(&prefix, "bin")),
    );
    let diff: Vec<usize> = (0..x.len()).filter(|&i| x[i] != y[i]).collect();
    assert!(
        !diff.is_empty() && diff.iter().all(|&i| i / 4 == offset as usize),
        "{diff:?}"
    );

    let (doc, in_doc) = orig.locate(offset);
    assert_eq!((doc, in_doc), (12, 135));
    let want =
        format!("token {offset} (document {doc}, token {in_doc} of it): A has {a}, B has {b}");
    assert_eq!(difference(&fixture("r50k_int32"), &prefix), want);

    // Same answer when B is compressed (found through the block reader) and from --json.
    let dqb = dir.path().join("changed.dqb");
    convert(
        &prefix,
        &dqb,
        &["--codec", "bits:17+zstd:3", "--block-size", "64KiB"],
    );
    assert_eq!(difference(&fixture("r50k_uint16"), &dqb), want);
    let r = dquant(&["verify", &s(&fixture("r50k_int32")), &s(&dqb), "--json"]);
    assert_eq!(r.code, 1);
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["identical"], false);
    assert_eq!(v["difference"], want.as_str());
    // A against B and B against A name the same place.
    assert_eq!(
        difference(&dqb, &fixture("r50k_int32")),
        format!("token {offset} (document {doc}, token {in_doc} of it): A has {b}, B has {a}")
    );
}

#[test]
fn verify_reports_boundary_differences() {
    let dir = tmp();
    let orig = Megatron::read(&fixture("r50k_int32"));
    let starts = orig.doc_starts();

    // Document 5 starts one token later: same tokens, same number of documents.
    let mut moved = orig.clone();
    moved.seq_lens[4] += 1;
    moved.seq_lens[5] -= 1;
    let p = dir.path().join("moved");
    moved.write_i32(&p);
    assert_eq!(
        difference(&fixture("r50k_int32"), &p),
        format!(
            "document 5 starts at token {} in A but at token {} in B",
            starts[5],
            starts[5] + 1
        )
    );
    // Also through a .dqb, whose boundaries live in its footer.
    let dqb = dir.path().join("moved.dqb");
    convert(&p, &dqb, &["--codec", "u16+lz4"]);
    assert_eq!(
        difference(&fixture("r50k_uint16"), &dqb),
        format!(
            "document 5 starts at token {} in A but at token {} in B",
            starts[5],
            starts[5] + 1
        )
    );

    // Documents 3 and 4 merged.
    let mut merged = orig.clone();
    merged.seq_lens[3] += merged.seq_lens.remove(4);
    merged.doc_indices = (0..=27).collect();
    let p = dir.path().join("merged");
    merged.write_i32(&p);
    assert_eq!(
        difference(&fixture("r50k_int32"), &p),
        "A has 28 documents, B has 27"
    );

    // Same documents, other sequences: Megatron-Core's multi-sequence file.
    let multi = Megatron::read(&fixture("r50k_int32_multiseq"));
    assert_eq!(multi.doc_starts(), starts);
    // The first document longer than 1000 tokens is where the sequences part.
    let d = orig.seq_lens.iter().position(|&l| l > 1000).unwrap();
    assert_eq!(multi.doc_indices[d], d as u64);
    assert_eq!(
        difference(&fixture("r50k_int32"), &fixture("r50k_int32_multiseq")),
        format!(
            "sequence {} starts at token {} in A but at token {} in B",
            d + 1,
            starts[d + 1],
            starts[d] + 1000
        )
    );

    // One token fewer.
    let mut short = orig.clone();
    short.tokens.pop();
    *short.seq_lens.last_mut().unwrap() -= 1;
    let p = dir.path().join("short");
    short.write_i32(&p);
    assert_eq!(
        difference(&fixture("r50k_int32"), &p),
        "A has 161032 tokens, B has 161031"
    );
}

// ---------------------------------------------------------------------------------------------
// 5. Bad input: exact errors, exit code 1, no panic, nothing left behind.

#[test]
fn token_too_wide_for_u16_fails_naming_source_offset_and_width() {
    let dir = tmp();
    // 3 documents; token 70000 at offset 1234 (document 1), nothing else above 50256.
    let mut docs = vec![vec![17u32; 1000], vec![42; 800], vec![7; 300]];
    for d in &mut docs {
        *d.last_mut().unwrap() = 50256;
    }
    docs[1][234] = 70000;
    let src = dir.path().join("wide_int32");
    Megatron::from_docs(&docs).write_i32(&src);
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let want = format!(
        "{}: token 70000 at offset 1234 does not fit in u16 (max 65535); it needs 17 bits: use \
         bits:17 or wider",
        with_ext(&src, "bin").display()
    );
    for (dst, opts) in [
        ("u16", &["--codec", "u16"][..]),
        ("u16.dqb", &["--codec", "u16"]),
        ("u16z.dqb", &["--codec", "u16+zstd:3"]),
        // The bad token in the second of several blocks.
        ("small.dqb", &["--codec", "u16", "--block-size", "1KiB"]),
        ("u16.raw", &["--codec", "u16", "--format", "raw"]),
    ] {
        let (src_s, dst_s) = (s(&src), s(&out.join(dst)));
        let mut args = vec!["convert", &src_s, &dst_s];
        args.extend_from_slice(opts);
        assert_eq!(fails(&args), want, "{dst}");
        assert!(entries(&out).is_empty(), "{dst}: left {:?}", entries(&out));
    }
    // 17 bits do fit, and lose nothing.
    let ok17 = out.join("b17.dqb");
    convert(&src, &ok17, &["--codec", "bits:17"]);
    assert_identical(&src, &ok17, &[]);
    assert_eq!(entries(&out), ["b17.dqb"]);
}

#[test]
fn token_outside_declared_vocabulary_fails() {
    let dir = tmp();
    let src = fixture("r50k_int32");
    let tokens = Megatron::read(&src).tokens;
    let first = tokens.iter().position(|&t| t >= 50000).unwrap();
    let want = format!(
        "{}: token {} at offset {first} is outside the declared vocabulary (--vocab 50000)",
        with_ext(&src, "bin").display(),
        tokens[first]
    );
    assert_eq!(
        want,
        format!(
            "{}: token 50256 at offset 603 is outside the declared vocabulary (--vocab 50000)",
            with_ext(&src, "bin").display()
        )
    );
    for (dst, codec) in [
        ("m", "auto"),
        ("a.dqb", "auto"),
        ("b.dqb", "bits:17+zstd:3"),
    ] {
        let dst = dir.path().join(dst);
        assert_eq!(
            fails(&[
                "convert",
                &s(&src),
                &s(&dst),
                "--vocab",
                "50000",
                "--codec",
                codec
            ]),
            want
        );
        assert!(entries(dir.path()).is_empty(), "{:?}", entries(dir.path()));
    }
    assert_eq!(
        fails(&[
            "convert",
            &s(&src),
            &s(&dir.path().join("z.dqb")),
            "--vocab",
            "0"
        ]),
        "--vocab must be at least 1"
    );
    // The right vocabulary passes and is stored.
    let dqb = dir.path().join("v.dqb");
    let rep = convert(&src, &dqb, &["--vocab", "50257"]);
    assert_eq!(
        rep["dst_format"],
        "dquant block file (u16, 524288 tokens per block)"
    );
    assert_identical(&src, &dqb, &[]);
}

#[test]
fn damaged_megatron_files_give_clear_errors() {
    let dir = tmp();
    let d = dir.path();
    let good = fixture("r50k_int32");

    // .bin cut by one byte.
    let t = d.join("truncated");
    std::fs::copy(with_ext(&good, "idx"), with_ext(&t, "idx")).unwrap();
    let bin = read(&with_ext(&good, "bin"));
    std::fs::write(with_ext(&t, "bin"), &bin[..bin.len() - 1]).unwrap();
    let want = format!(
        "{}: truncated Megatron .bin (161032 tokens of int32 in the .idx): needs 644128 bytes \
         but has 644127",
        with_ext(&t, "bin").display()
    );
    assert_eq!(fails(&["inspect", &s(&t)]), want);
    assert_eq!(fails(&["verify", &s(&good), &s(&t)]), want);
    assert_eq!(fails(&["convert", &s(&t), &s(&d.join("x.dqb"))]), want);

    // .idx with a wrong magic.
    let w = d.join("magic");
    std::fs::copy(with_ext(&good, "bin"), with_ext(&w, "bin")).unwrap();
    let mut idx = read(&with_ext(&good, "idx"));
    idx[0] = b'X';
    idx[1] = b'X';
    std::fs::write(with_ext(&w, "idx"), idx).unwrap();
    let want = format!(
        r#"{}: not a Megatron .idx file: bad magic "XXIDIDX\0\0" (expected "MMIDIDX\0\0")"#,
        with_ext(&w, "idx").display()
    );
    assert_eq!(fails(&["inspect", &s(&w)]), want);
    assert_eq!(fails(&["verify", &s(&w), &s(&good)]), want);
    assert_eq!(fails(&["convert", &s(&w), &s(&d.join("y.dqb"))]), want);

    // Missing .bin beside an .idx.
    let m = d.join("nobin");
    std::fs::copy(with_ext(&good, "idx"), with_ext(&m, "idx")).unwrap();
    assert_eq!(
        fails(&["inspect", &s(&m)]),
        format!(
            "{}: No such file or directory (os error 2)",
            with_ext(&m, "bin").display()
        )
    );

    // Nothing was written by the failed converts.
    assert_eq!(
        entries(d),
        [
            "magic.bin",
            "magic.idx",
            "nobin.idx",
            "truncated.bin",
            "truncated.idx"
        ]
    );
}

/// crc32c (Castagnoli), bit by bit: the sidecar's sums checked without dquant's code.
fn crc32c(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 == 1 {
                (c >> 1) ^ 0x82F6_3B78
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// Copies the Megatron dataset `src` (its .idx and .bin) to the prefix `dst`.
fn copy_megatron(src: &Path, dst: &Path) {
    for ext in ["idx", "bin"] {
        std::fs::copy(with_ext(src, ext), with_ext(dst, ext)).unwrap();
    }
}

#[test]
fn megatron_chunk_sums_catch_a_flipped_bit_in_the_bin() {
    let dir = tmp();
    let d = dir.path();
    let good = fixture("r50k_int32");
    let x = d.join("x");
    copy_megatron(&good, &x);
    let (bin, sidecar) = (with_ext(&x, "bin"), with_ext(&x, "dqsum"));
    let r = json(&["sums", &s(&x), "--chunk-kib", "4", "--json"]);
    assert_eq!(
        (&r["chunks"], &r["bytes"], &r["chunk_bytes"]),
        (&Value::from(158), &Value::from(644_128), &Value::from(4096))
    );
    // The sidecar, read by hand: magic, chunk size, length, one crc per 4 KiB, a trailer crc.
    let data = read(&bin);
    let sums = read(&sidecar);
    assert_eq!(sums.len(), 24 + 158 * 4 + 4);
    assert_eq!(&sums[..8], b"DQSUMS\0\x01");
    assert_eq!(sums[8..12], 4096u32.to_le_bytes());
    assert_eq!(sums[16..24], 644_128u64.to_le_bytes());
    let crc_at = |o: usize| u32::from_le_bytes(sums[o..o + 4].try_into().unwrap());
    for (i, chunk) in data.chunks(4096).enumerate() {
        assert_eq!(crc_at(24 + 4 * i), crc32c(chunk), "chunk {i}");
    }
    assert_eq!(crc_at(sums.len() - 4), crc32c(&sums[..sums.len() - 4]));
    let ok_check = format!("{}: 0 of 158 chunks differ\n", bin.display());
    assert_eq!(ok(&["sums", &s(&x), "--check"]), ok_check);
    assert!(ok(&["inspect", &s(&x), "--no-sizes"]).contains(&format!(
        "chunk sums  {} (4 KiB chunks, crc32c/4KiB:{:08x})",
        sidecar.display(),
        crc_at(sums.len() - 4)
    )));

    // One flipped bit in chunk 52: the scrub names it, and every reader refuses the chunk.
    let mut flipped = data.clone();
    flipped[213_200] ^= 0x10;
    std::fs::write(&bin, &flipped).unwrap();
    let r = dquant(&["sums", &s(&x), "--check"]);
    assert_eq!(
        (r.code, r.stdout),
        (
            1,
            format!(
                "{b}: chunk 52 (bytes 212992..217088) differs from {}\n{b}: 1 of 158 chunks \
                 differ\n",
                sidecar.display(),
                b = bin.display()
            )
        )
    );
    let want = format!(
        "{}: checksum mismatch in chunk 52 (bytes 212992..217088), against {}: stored \
         {:#010x}, computed {:#010x}",
        bin.display(),
        sidecar.display(),
        crc32c(&data[212_992..217_088]),
        crc32c(&flipped[212_992..217_088])
    );
    assert_eq!(fails(&["inspect", &s(&x)]), want);
    assert_eq!(fails(&["verify", &s(&good), &s(&x)]), want);
    assert_eq!(fails(&["convert", &s(&x), &s(&d.join("y.dqb"))]), want);
    assert_eq!(entries(d), ["x.bin", "x.dqsum", "x.idx"]);
    assert_eq!(
        fails(&["sums", &s(&d.join("none"))]),
        format!(
            "{}: No such file or directory (os error 2)",
            d.join("none.bin").display()
        )
    );
    // --check with no sidecar, and with one of another file (the r50k uint16 fixture's .bin
    // is half as long): it is read as every open reads it.
    let y = d.join("y");
    copy_megatron(&good, &y);
    assert_eq!(
        fails(&["sums", &s(&y), "--check"]),
        format!(
            "{}: no chunk sums sidecar; write one with `dquant sums {}`",
            with_ext(&y, "dqsum").display(),
            y.display()
        )
    );
    let half = fixture("r50k_uint16");
    let z = d.join("z");
    copy_megatron(&half, &z);
    ok(&["sums", &s(&z)]);
    std::fs::rename(with_ext(&z, "dqsum"), with_ext(&y, "dqsum")).unwrap();
    assert_eq!(
        fails(&["sums", &s(&y), "--check"]),
        format!(
            "{}: covers 322064 bytes of {}, which has 644128: the sidecar is stale; write it again with `dquant sums`",
            with_ext(&y, "dqsum").display(),
            with_ext(&y, "bin").display()
        )
    );
}

/// (offset, payload length) of each block of a .dqb, walked by hand: a 64-byte file header,
/// then blocks of a 32-byte header ("DQBK", codec, tokens u32, payload_len u32, ...) and payload.
fn blocks(file: &[u8]) -> Vec<(usize, usize)> {
    let mut o = 64;
    let mut v = Vec::new();
    while &file[o..o + 4] == b"DQBK" {
        let len = u32::from_le_bytes(file[o + 12..o + 16].try_into().unwrap()) as usize;
        v.push((o, len));
        o += 32 + len;
    }
    v
}

#[test]
fn damaged_block_files_give_clear_errors() {
    let dir = tmp();
    let d = dir.path();
    let src = fixture("r50k_int32");
    let good = d.join("good.dqb");
    convert(
        &src,
        &good,
        &["--codec", "u16+zstd:3", "--block-size", "64KiB"],
    );
    let bytes = read(&good);
    let bl = blocks(&bytes);
    assert_eq!(bl.len(), 5, "161032 tokens in blocks of 32768");

    // "PATH: checksum mismatch in block B (file bytes X..Y) PART: stored S, computed C", S
    // being the CRC stored at `crc_at` in the block header and C another 8 hex digits.
    let check = |err: String, path: &Path, block: usize, part: &str, crc_at: usize| {
        let (o, len) = bl[block];
        let stored = u32::from_le_bytes(bytes[o + crc_at..o + crc_at + 4].try_into().unwrap());
        let prefix = format!(
            "{}: checksum mismatch in block {block} (file bytes {o}..{}) {part}: stored \
             {stored:#010x}, computed 0x",
            path.display(),
            o + 32 + len
        );
        let computed = err
            .strip_prefix(&prefix)
            .unwrap_or_else(|| panic!("{err:?} does not start with {prefix:?}"));
        assert_eq!(computed.len(), 8, "{err}");
        assert_ne!(u32::from_str_radix(computed, 16).unwrap(), stored, "{err}");
    };

    // One flipped bit in block 2's payload: inspect, verify and convert all refuse it.
    let (o, len) = bl[2];
    let mut flipped = bytes.clone();
    flipped[o + 32 + len / 2] ^= 0x10;
    let f = d.join("flipped.dqb");
    std::fs::write(&f, &flipped).unwrap();
    check(fails(&["inspect", &s(&f)]), &f, 2, "payload", 24);
    check(fails(&["verify", &s(&src), &s(&f)]), &f, 2, "payload", 24);
    check(
        fails(&["convert", &s(&f), &s(&d.join("out.dqb"))]),
        &f,
        2,
        "payload",
        24,
    );

    // One flipped bit in block 3's header (its token count).
    let mut hdr = bytes.clone();
    hdr[bl[3].0 + 8] ^= 0x01;
    let h = d.join("header.dqb");
    std::fs::write(&h, &hdr).unwrap();
    check(fails(&["inspect", &s(&h)]), &h, 3, "header", 28);
    check(fails(&["verify", &s(&h), &s(&src)]), &h, 3, "header", 28);

    // Cut by 10 bytes: the trailer is gone.
    let t = d.join("truncated.dqb");
    std::fs::write(&t, &bytes[..bytes.len() - 10]).unwrap();
    let want = format!(
        "{}: corrupt block file trailer: no end marker; the file is truncated or was not finished",
        t.display()
    );
    assert_eq!(fails(&["inspect", &s(&t)]), want);
    assert_eq!(fails(&["verify", &s(&t), &s(&src)]), want);
    assert_eq!(fails(&["convert", &s(&t), &s(&d.join("out2"))]), want);

    // Nothing was written by the failed converts, and the good file still verifies.
    assert_eq!(
        entries(d),
        ["flipped.dqb", "good.dqb", "header.dqb", "truncated.dqb"]
    );
    assert_identical(&src, &good, &[]);
}

#[test]
fn existing_destination_needs_force() {
    let dir = tmp();
    let d = dir.path();
    let src = fixture("r50k_int32");

    // Megatron destination: the .idx decides.
    let m = d.join("m");
    std::fs::write(with_ext(&m, "idx"), b"keep me").unwrap();
    assert_eq!(
        fails(&["convert", &s(&src), &s(&m), "--codec", "u16"]),
        format!(
            "{} exists; pass --force to replace it",
            with_ext(&m, "idx").display()
        )
    );
    assert_eq!(read(&with_ext(&m, "idx")), b"keep me");
    assert_eq!(entries(d), ["m.idx"]);
    convert(&src, &m, &["--codec", "u16", "--force"]);
    assert_same_megatron(&m, &fixture("r50k_uint16"));

    // Block file destination.
    let b = d.join("b.dqb");
    std::fs::write(&b, b"keep me too").unwrap();
    assert_eq!(
        fails(&["convert", &s(&src), &s(&b)]),
        format!("{} exists; pass --force to replace it", b.display())
    );
    assert_eq!(read(&b), b"keep me too");
    convert(&src, &b, &["--force"]);
    assert_identical(&src, &b, &[]);
    assert_eq!(entries(d), ["b.dqb", "m.bin", "m.idx"]);
}

#[test]
fn usage_errors_are_clear() {
    let dir = tmp();
    let src = s(&fixture("r50k_int32"));
    let dst = s(&dir.path().join("x"));
    assert_eq!(
        fails(&["convert", &src, &dst, "--codec", "bits:17"]),
        "Megatron .bin files store u8, u16, i32 or i64 (not bits:17); write a .dqb block file \
         for bits:17"
    );
    assert_eq!(
        fails(&["convert", &src, &dst, "--zstd", "3"]),
        "Megatron .bin files cannot be compressed; write a .dqb block file for zstd:3"
    );
    let dqb = s(&dir.path().join("x.dqb"));
    assert_eq!(
        fails(&[
            "convert",
            &src,
            &dqb,
            "--codec",
            "u16+zstd:3",
            "--zstd",
            "5"
        ]),
        "--codec says zstd:3 but the flags say zstd:5; give one"
    );
    let missing = dir.path().join("missing");
    assert_eq!(
        fails(&["inspect", &s(&missing)]),
        format!(
            "{}: No such file or directory (os error 2)",
            missing.display()
        )
    );
    // An output directory that does not exist is named (the message also shows the temporary
    // file that could not be created there), once.
    let nodir = dir.path().join("nodir");
    let err = fails(&["convert", &src, &s(&nodir.join("x.dqb"))]);
    let want = format!(
        "{}: No such file or directory (os error 2)",
        nodir.display()
    );
    assert!(err.starts_with(&want), "{err}");
    assert_eq!(err.matches("No such file").count(), 1, "{err}");
    assert!(entries(dir.path()).is_empty());
    // clap's own usage errors exit 2.
    let r = dquant(&["convert", &src]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("<DST>"), "{}", r.stderr);
    let r = dquant(&["convert", &src, &dqb, "--preset", "archive", "--zstd", "3"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("the argument '--preset <PRESET>' cannot be used with '--zstd <LEVEL>'"),
        "{}",
        r.stderr
    );
}

#[test]
fn archive_refusals_name_the_cause() {
    let dir = tmp();
    let src = s(&fixture("r50k_int32"));
    let dst = s(&dir.path().join("x"));
    assert_eq!(
        fails(&["convert", &src, &dst, "--preset", "archive", "--format", "megatron"]),
        "Megatron .bin files cannot be compressed; write a .dqb block file for rank+zstd:19"
    );
    // Ids at or over 2^24 have no rank: the first is named, nothing is written.
    let big = dir.path().join("big");
    Megatron::from_docs(&[vec![5, 1 << 24, 7]]).write_i32(&big);
    let out = s(&dir.path().join("big.dqb"));
    assert_eq!(
        fails(&["convert", &s(&big), &out, "--codec", "auto+rank+zstd:3"]),
        format!(
            "{}: token 16777216 at offset 1 is over 2^24 - 1, the largest id rank+zstd takes; use zstd:LEVEL",
            with_ext(&big, "bin").display()
        )
    );
    assert!(!Path::new(&out).exists());
    // `bench codecs` over ids near 2^31: the entropy is counted without a table indexed by
    // id (it would be 16 GB), and a rank+zstd row is refused before its counts are.
    let huge = dir.path().join("huge");
    Megatron::from_docs(&[vec![5, 2_000_000_000, 7, 5, 5, 9]]).write_i32(&huge);
    let v = json(&[
        "bench",
        "codecs",
        &s(&huge),
        "--codecs",
        "u32",
        "--no-presets",
        "--json",
    ]);
    let e = v[0]["order0_entropy_bits_per_token"].as_f64().unwrap();
    assert!((e - (0.5 + 0.5 * 6f64.log2())).abs() < 1e-12, "{e}");
    assert_eq!(
        fails(&[
            "bench",
            "codecs",
            &s(&huge),
            "--codecs",
            "u32+rank+zstd:3",
            "--no-presets",
            "-q"
        ]),
        "token 2000000000 is over 2^24 - 1, the largest id rank+zstd takes"
    );
}

// ---------------------------------------------------------------------------------------------
// 6. Raw token files

#[test]
fn raw_files_split_at_eod_and_round_trip() {
    let dir = tmp();
    let d = dir.path();
    // Three documents, the last without its end-of-document token.
    let tokens: [u16; 9] = [1, 2, 50256, 3, 4, 5, 50256, 65535, 7];
    let raw = d.join("tokens.u16");
    std::fs::write(
        &raw,
        tokens
            .iter()
            .flat_map(|t| t.to_le_bytes())
            .collect::<Vec<u8>>(),
    )
    .unwrap();
    let opts = ["--dtype", "u16", "--eod", "50256"];
    let v = inspect(&raw, &opts);
    assert_eq!(v["format"], "raw");
    assert_eq!(v["format_detail"], "raw token file (uint16)");
    assert_eq!(v["tokens"], 9);
    assert_eq!(v["documents"], 3);
    assert_eq!(v["max_token"], 65535);
    assert_eq!(v["bits_needed"], 16);
    // Without --eod, one document.
    assert_eq!(inspect(&raw, &["--dtype", "u16"])["documents"], 1);

    let dqb = d.join("tokens.dqb");
    let (r, q) = (s(&raw), s(&dqb));
    let mut args = vec!["convert", &r, &q, "--json"];
    args.extend_from_slice(&opts);
    let rep = json(&args);
    assert_eq!(rep["documents"], 3);
    assert_eq!(
        assert_identical(&raw, &dqb, &opts),
        "identical: 9 tokens in 3 documents (3 sequences)\n"
    );
    assert_eq!(inspect(&dqb, &["--no-sizes"])["checksum"], v["checksum"]);
    // Back to raw: the same bytes.
    let back = d.join("back.u16");
    convert(&dqb, &back, &["--format", "raw", "--codec", "u16"]);
    assert_eq!(read(&back), read(&raw));

    // Megatron-Core's uint16 .bin is a raw u16 file: split at 50256 it has the same documents
    // and content checksum as the Megatron dataset.
    let bin = d.join("r50k.u16");
    std::fs::copy(fixture("r50k_uint16.bin"), &bin).unwrap();
    let v = inspect(&bin, &["--dtype", "u16", "--eod", "50256", "--no-sizes"]);
    assert_eq!(v["documents"], 28);
    assert_eq!(
        v["checksum"],
        inspect(&fixture("r50k_int32"), &["--no-sizes"])["checksum"]
    );
    assert_identical(
        &bin,
        &fixture("r50k_int32"),
        &["--dtype", "u16", "--eod", "50256"],
    );

    // A raw file needs its dtype.
    assert_eq!(
        fails(&["inspect", &s(&raw)]),
        format!(
            "{}: unknown format: not a dquant block file, no Megatron .idx beside it; for a raw \
             token file give its dtype (--dtype u16|i32|...)",
            raw.display()
        )
    );
    // And whole tokens.
    let odd = d.join("odd.u16");
    std::fs::write(&odd, [1u8, 0, 2]).unwrap();
    let err = fails(&["inspect", &s(&odd), "--dtype", "u16"]);
    assert_eq!(
        err,
        format!(
            "{}: corrupt raw uint16 file: 3 bytes is not a whole number of 2-byte tokens",
            odd.display()
        )
    );
}

// ---------------------------------------------------------------------------------------------
// 7. Corpus determinism

#[test]
fn corpus_real_is_deterministic_one_document_per_file() {
    let dir = tmp();
    let root = dir.path().join("src");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(
        root.join("a.rs"),
        "fn main() {\n    println!(\"hello\");\n}\n",
    )
    .unwrap();
    std::fs::write(root.join("sub/b.rs"), "// b\npub struct B { x: u32 }\n").unwrap();
    std::fs::write(root.join("sub/c.rs"), "hello hello hello\n").unwrap();
    std::fs::write(root.join("notes.txt"), "not Rust: not tokenized").unwrap();
    std::fs::write(root.join("bad.rs"), [0xffu8, 0xfe, b'x']).unwrap();

    let mut outputs = Vec::new();
    for run in ["one", "two"] {
        let out = dir.path().join(run);
        let v = json(&["corpus", "real", "--root", &s(&root), &s(&out), "--json"]);
        assert_eq!(v["files"], 4, "{v}"); // bad.rs is counted, then skipped
        assert_eq!(v["documents"], 3, "{v}");
        assert_eq!(v["skipped_non_utf8"], 1, "{v}");
        outputs.push((out, v));
    }
    assert_same_megatron(&outputs[0].0, &outputs[1].0);
    assert_eq!(outputs[0].1, {
        let mut v = outputs[1].1.clone();
        v["out"] = outputs[0].1["out"].clone();
        v
    });

    let m = Megatron::read(&outputs[0].0);
    assert_eq!(m.doc_indices, [0, 1, 2, 3]);
    let starts = m.doc_starts();
    let ends: Vec<u64> = starts[1..]
        .iter()
        .copied()
        .chain([m.tokens.len() as u64])
        .collect();
    for &e in &ends {
        assert_eq!(
            m.tokens[e as usize - 1],
            50256,
            "every document ends with 50256"
        );
    }
    assert_eq!(m.tokens.iter().filter(|&&t| t == 50256).count(), 3);
    // Files in path order; a.rs in r50k (GPT-2) ids: "fn" " main" "()" " {" "\n" " " " " " "
    // " println" "!" "(\"" "hello" "\");" "\n" "}" "\n", then end of text.
    assert_eq!(
        m.tokens[..starts[1] as usize],
        [
            22184, 1388, 3419, 1391, 198, 220, 220, 220, 44872, 0, 7203, 31373, 15341, 198, 92,
            198, 50256
        ]
    );
    // sub/c.rs: "hello" " hello" " hello" "\n" EOT.
    assert_eq!(
        m.tokens[starts[2] as usize..],
        [31373, 23748, 23748, 198, 50256]
    );
    let v = inspect(&outputs[0].0, &["--no-sizes"]);
    assert_eq!(v["max_token"], 50256);
}

// ---------------------------------------------------------------------------------------------
// 8. Help

#[test]
fn every_command_has_help_with_an_example() {
    let commands: &[&[&str]] = &[
        &[],
        &["convert"],
        &["inspect"],
        &["verify"],
        &["corpus"],
        &["corpus", "real"],
        &["corpus", "zipf"],
        &["bench"],
        &["bench", "codecs"],
        &["read"],
        &["serve"],
        &["ls"],
        &["stat"],
        &["demo"],
    ];
    for cmd in commands {
        let mut args = cmd.to_vec();
        args.push("--help");
        let out = ok(&args);
        assert!(
            out.contains("Example"),
            "dquant {args:?} has no example:\n{out}"
        );
        assert!(out.contains("Usage: dquant"), "{out}");
    }
}

// ---------------------------------------------------------------------------------------------
// A full disk

/// A tmpfs of `size` mounted at a new directory under `dir` (tests run as root), unmounted
/// when dropped.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(dir: &Path, size: &str) -> Self {
        let at = dir.join("small-disk");
        std::fs::create_dir(&at).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&at)
            .status()
            .expect("running mount");
        assert!(
            st.success(),
            "mounting a tmpfs needs root (tests run as root)"
        );
        SmallDisk(at)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A real ENOSPC: `convert` onto a 1 MiB tmpfs fails with the disk's error naming the
/// output, and leaves the disk empty (no partial output, no temporary file).
#[test]
fn convert_onto_a_full_disk_fails_naming_the_output_and_leaves_nothing() {
    let dir = TempDir::new().unwrap();
    let src = dir.path().join("z").display().to_string();
    ok(&[
        "corpus", "zipf", &src, "--tokens", "1000000", "--vocab", "50257",
    ]);
    let disk = SmallDisk::mount(dir.path(), "1m");
    let out = disk.0.join("out").display().to_string();
    let e = fails(&["convert", &src, &out, "--codec", "u16"]);
    assert_eq!(
        e,
        format!("{out}.bin: No space left on device (os error 28)")
    );
    let left: Vec<_> = std::fs::read_dir(&disk.0).unwrap().collect();
    assert!(left.is_empty(), "left on the disk: {left:?}");
}
