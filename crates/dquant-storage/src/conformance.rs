//! The behaviour every [`Root`] must have, as tests that check data (after arrow-rs
//! `object_store`'s `integration` module).
//!
//! A root is only interchangeable with the others if it lists, stats, refuses and reads
//! exactly as they do; this suite is that contract, so a new root (an S3 root in another
//! crate) passes the same checks as [`LocalRoot`](crate::LocalRoot) and
//! [`InMemoryRoot`](crate::InMemoryRoot) by calling [`run`] with a factory that creates a
//! root holding given objects. The checks panic on failure: this is test code.

use std::io::{ErrorKind, IoSliceMut};
use std::path::{Path, PathBuf};

use dquant_codec::Codec;
use dquant_format::{DType, DocIndex, DocIndexBuilder};

use crate::dataset::{Dataset, OpenOptions};
use crate::root::{Entry, EntryKind, ObjectMeta, Root, RootError};
use crate::writer::{DatasetWriter, OutputFormat};
use crate::ReadAt;

/// Creates a root holding exactly `objects` (name, bytes).
pub type Factory<'a> = &'a dyn Fn(&[(&str, &[u8])]) -> Box<dyn Root>;

/// Runs every check.
pub fn run(make: Factory<'_>) {
    lists_datasets(make);
    stats_lengths(make);
    missing_objects_are_not_found(make);
    refuses_bad_names(make);
    reads_at_offsets(make);
    reads_vectored(make);
    opens_datasets_as_by_path(make);
    truncated_datasets_fail_as_by_path(make);
}

/// Bytes `0, 7, 14, ...` modulo 251: every offset has a distinct neighbourhood.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

/// Megatron pairs are listed once under their prefix, `.dqb` as blocks, anything else raw,
/// sorted by name, recursively; `objects` lists every object with its length.
pub fn lists_datasets(make: Factory<'_>) {
    let root = make(&[
        ("z", b"1"),
        ("sub/a.bin", &[0; 8]),
        ("sub/a.idx", &[0; 5]),
        ("sub/lone.idx", &[0; 3]),
        ("sub/deeper/x.dqb", &[0; 9]),
        ("b.dqb", &[0; 4]),
        ("c.raw", &[]),
    ]);
    let e = |name: &str, kind, bytes| Entry {
        name: name.into(),
        kind,
        bytes,
    };
    let want = vec![
        e("b.dqb", EntryKind::Blocks, 4),
        e("c.raw", EntryKind::Raw, 0),
        e("sub/a", EntryKind::Megatron, 13),
        e("sub/deeper/x.dqb", EntryKind::Blocks, 9),
        e("sub/lone.idx", EntryKind::Raw, 3),
        e("z", EntryKind::Raw, 1),
    ];
    assert_eq!(root.list().expect("list"), want, "{root:?}");
    let names: Vec<(String, u64)> = root
        .objects()
        .expect("objects")
        .into_iter()
        .map(|o| (o.name, o.len))
        .collect();
    let want = [
        ("b.dqb", 4),
        ("c.raw", 0),
        ("sub/a.bin", 8),
        ("sub/a.idx", 5),
        ("sub/deeper/x.dqb", 9),
        ("sub/lone.idx", 3),
        ("z", 1),
    ];
    let want: Vec<(String, u64)> = want.iter().map(|(n, l)| (n.to_string(), *l)).collect();
    assert_eq!(names, want, "{root:?}");
    assert_eq!(make(&[]).list().expect("empty list"), vec![]);
}

/// `stat` gives the length and the normalized name.
pub fn stats_lengths(make: Factory<'_>) {
    let data = pattern(1000);
    let root = make(&[("d/one", &data), ("empty", &[])]);
    let meta = |name: &str| {
        let m: ObjectMeta = root.stat(name).expect("stat");
        (m.name, m.len)
    };
    assert_eq!(meta("d/one"), ("d/one".to_string(), 1000));
    assert_eq!(meta("./d//one"), ("d/one".to_string(), 1000));
    assert_eq!(meta("empty"), ("empty".to_string(), 0));
    // A root that versions its objects says the same version by stat and by open.
    let v = root.stat("d/one").expect("stat").version;
    if v.is_some() {
        assert_eq!(root.open("d/one").expect("open").version(), v);
    }
    let f = root.open("empty").expect("open empty");
    assert!(f.is_empty());
}

fn assert_not_found<T: std::fmt::Debug>(r: Result<T, RootError>, what: &str) {
    match r {
        Err(RootError::NotFound { name }) => assert!(!name.is_empty(), "{what}"),
        other => panic!("{what}: expected NotFound, got {other:?}"),
    }
}

/// Missing objects are `NotFound` for `stat`, `open` and opening a dataset.
pub fn missing_objects_are_not_found(make: Factory<'_>) {
    let root = make(&[("a/b", b"xy")]);
    assert_not_found(root.stat("missing"), "stat missing");
    assert_not_found(root.open("missing").map(|_| ()), "open missing");
    assert_not_found(root.stat("a/b/c"), "stat below an object");
    assert_not_found(root.stat("a/missing"), "stat in a prefix");
    let opts = OpenOptions {
        raw_dtype: Some(DType::U8),
        eod: None,
    };
    match Dataset::open_in(&*root, "missing", &opts) {
        Err(e) => assert!(e.is_not_found(), "{e}"),
        Ok(_) => panic!("a missing dataset opened"),
    }
}

/// `..`, absolute and empty names are refused by `stat`, `open` and `Dataset::open_in`.
pub fn refuses_bad_names(make: Factory<'_>) {
    let root = make(&[("a", b"x"), ("d/b", b"y")]);
    for name in ["../a", "d/../a", "/a", "/d/b", "", "./"] {
        let bad = |r: Result<(), RootError>| {
            assert!(
                matches!(r, Err(RootError::InvalidName { .. })),
                "{name:?}: {r:?}"
            )
        };
        bad(root.stat(name).map(|_| ()));
        bad(root.open(name).map(|_| ()));
        let r = Dataset::open_in(&*root, name, &OpenOptions::default());
        assert!(
            matches!(
                r,
                Err(crate::StorageError::Root(RootError::InvalidName { .. }))
            ),
            "{name:?}"
        );
    }
}

fn read(f: &dyn ReadAt, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, offset)?;
    Ok(buf)
}

/// Exact bytes at any offset; a read past the end is `UnexpectedEof`.
pub fn reads_at_offsets(make: Factory<'_>) {
    let data = pattern(3000);
    let root = make(&[("p", &data)]);
    let f = root.open("p").expect("open");
    assert_eq!(f.len(), 3000);
    for (off, len) in [(0, 3000), (0, 1), (1, 10), (1499, 2), (2990, 10), (3000, 0)] {
        let got = read(&*f, off as u64, len).expect("read inside");
        assert_eq!(got, data[off..off + len], "{len} bytes at {off}");
    }
    for (off, len) in [(2995, 10), (3000, 1), (1 << 40, 1)] {
        let e = read(&*f, off, len).expect_err("read past the end");
        assert_eq!(e.kind(), ErrorKind::UnexpectedEof, "{len} bytes at {off}");
    }
}

/// Vectored reads fill their buffers in order from contiguous bytes, also more buffers than
/// one `preadv` takes.
pub fn reads_vectored(make: Factory<'_>) {
    let data = pattern(3000);
    let root = make(&[("p", &data)]);
    let f = root.open("p").expect("open");
    let mut sizes = vec![3, 0, 100, 17];
    sizes.extend(std::iter::repeat_n(1, 1500));
    let total: usize = sizes.iter().sum();
    let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
    let mut slices: Vec<IoSliceMut<'_>> = bufs.iter_mut().map(|b| IoSliceMut::new(b)).collect();
    f.read_exact_vectored_at(&mut slices, 11).expect("vectored");
    assert_eq!(bufs.concat(), data[11..11 + total]);
    let mut a = [0u8; 10];
    let mut b = [0u8; 10];
    let e = f
        .read_exact_vectored_at(
            &mut [IoSliceMut::new(&mut a), IoSliceMut::new(&mut b)],
            2985,
        )
        .expect_err("vectored past the end");
    assert_eq!(e.kind(), ErrorKind::UnexpectedEof);
}

/// Documents of 1..=700 tokens, ids below 60 000 (an LCG: deterministic).
fn documents() -> Vec<Vec<u32>> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) as u32
    };
    (0..12)
        .map(|_| {
            let n = 1 + next() as usize % 700;
            (0..n).map(|_| 1 + next() % 59_999).collect()
        })
        .collect()
}

fn write(path: &Path, format: OutputFormat, docs: &[Vec<u32>]) -> Vec<PathBuf> {
    let mut w = DatasetWriter::create(path, format).expect("create fixture");
    let mut ix = DocIndexBuilder::new();
    for d in docs {
        w.push(d).expect("write fixture");
        ix.push_document(d.len() as u64);
    }
    w.finish(&ix.finish()).expect("finish fixture").files
}

/// Writes a Megatron dataset, a block file and a raw file (documents ended by token 0) into
/// `dir`, and returns each file's name (relative to `dir`, Megatron files under `sub/`).
fn fixtures(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let docs = documents();
    let mut raw_docs = docs.clone();
    raw_docs.iter_mut().for_each(|d| d.push(0));
    let codec: Codec = "u16+zstd:3".parse().expect("codec");
    let sub = dir.join("sub");
    std::fs::create_dir_all(&sub).expect("fixture dir");
    let blocks = OutputFormat::Block {
        codec,
        block_tokens: 256,
        vocab_size: 0,
    };
    let mut files = write(
        &sub.join("m"),
        OutputFormat::Megatron { dtype: DType::I32 },
        &docs,
    );
    files.extend(write(&dir.join("b.dqb"), blocks, &docs));
    let raw = OutputFormat::Raw { dtype: DType::U16 };
    files.extend(write(&dir.join("r.u16"), raw, &raw_docs));
    files
        .iter()
        .map(|f| {
            let rel = f.strip_prefix(dir).expect("fixture under dir");
            let name = rel.to_str().expect("UTF-8 fixture name").to_string();
            (name, std::fs::read(f).expect("read fixture"))
        })
        .collect()
}

/// Everything a reader can see of a dataset: format, boundaries, sizes, tokens.
fn summary(ds: &Dataset) -> (String, DocIndex, u64, Option<String>, Vec<u32>) {
    let mut tokens = Vec::new();
    ds.scan(1000, |_, t| {
        tokens.extend_from_slice(t);
        Ok::<_, crate::StorageError>(())
    })
    .expect("scan");
    let checksum = ds
        .stored_checksum()
        .expect("the stored checksum reads")
        .map(|c| c.to_string());
    let format = ds.format().to_string();
    (
        format,
        ds.index().expect("the index reads").clone(),
        ds.size_on_disk(),
        checksum,
        tokens,
    )
}

/// A Megatron dataset (by prefix, `.idx` or `.bin`), a block file and a raw file open through
/// the root with the same format, boundaries, sizes and tokens as the same bytes by path.
pub fn opens_datasets_as_by_path(make: Factory<'_>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let files = fixtures(dir.path());
    let objects: Vec<(&str, &[u8])> = files.iter().map(|(n, b)| (n.as_str(), &b[..])).collect();
    let root = make(&objects);
    let raw = OpenOptions {
        raw_dtype: Some(DType::U16),
        eod: Some(0),
    };
    let plain = OpenOptions::default();
    for (name, opts) in [
        ("sub/m", plain),
        ("sub/m.idx", plain),
        ("./sub/m.bin", plain),
        ("b.dqb", plain),
        ("r.u16", raw),
    ] {
        let by_path = Dataset::open(&dir.path().join(name), &opts).expect("open by path");
        let in_root = Dataset::open_in(&*root, name, &opts).expect("open in root");
        assert_eq!(summary(&in_root), summary(&by_path), "{name}");
        assert!(in_root.tokens() > 1000, "{name}: fixture too small");
    }
    assert_eq!(
        Dataset::open_in(&*root, "sub/m.idx", &plain)
            .expect("open")
            .path(),
        Path::new("sub/m")
    );
    stored_reads_match(&*root, dir.path());
    let e = Dataset::open_in(&*root, "r.u16", &plain).err();
    assert!(
        e.as_ref().is_some_and(|e| e.to_string().starts_with(
            "r.u16: unknown format: not a dquant block file, no Megatron .idx beside it"
        )),
        "{e:?}"
    );
}

/// `read_stored_vectored` through the root copies the very bytes the path does.
fn stored_reads_match(root: &dyn Root, dir: &Path) {
    let in_root = Dataset::open_in(
        root,
        "r.u16",
        &OpenOptions {
            raw_dtype: Some(DType::U16),
            eod: None,
        },
    )
    .expect("open raw");
    let mut got = [[0u8; 6]; 3];
    let mut slices: Vec<IoSliceMut<'_>> = got.iter_mut().map(|b| IoSliceMut::new(b)).collect();
    in_root
        .read_stored_vectored(5, &mut slices)
        .expect("stored read");
    let bytes = std::fs::read(dir.join("r.u16")).expect("read raw");
    assert_eq!(got.concat(), bytes[10..28]);
}

/// Opens `name` and reads every token: the first error, as text, with `dir/` (where the
/// dataset was opened by path) taken out.
fn open_and_scan(
    open: impl FnOnce() -> Result<Dataset, crate::StorageError>,
    dir: &Path,
) -> String {
    let r = open().and_then(|ds| ds.scan(1000, |_, _| Ok::<_, crate::StorageError>(())));
    match r {
        Ok(()) => "no error".into(),
        Err(e) => e.to_string().replace(&format!("{}/", dir.display()), ""),
    }
}

/// A block file, a Megatron `.bin` and a raw file cut short fail to open or read with the
/// same message through the root as by path (never a panic, never short data).
pub fn truncated_datasets_fail_as_by_path(make: Factory<'_>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut files = fixtures(dir.path());
    for (name, bytes) in files.iter_mut() {
        let keep = match name.as_str() {
            "b.dqb" => bytes.len() / 2,
            "sub/m.bin" => bytes.len() * 3 / 4,
            "r.u16" => bytes.len() - 1,
            _ => continue,
        };
        bytes.truncate(keep);
        std::fs::write(dir.path().join(&*name), &bytes).expect("truncate fixture");
    }
    let objects: Vec<(&str, &[u8])> = files.iter().map(|(n, b)| (n.as_str(), &b[..])).collect();
    let root = make(&objects);
    let raw = OpenOptions {
        raw_dtype: Some(DType::U16),
        eod: Some(0),
    };
    for (name, opts) in [
        ("b.dqb", OpenOptions::default()),
        ("sub/m", OpenOptions::default()),
        ("r.u16", raw),
    ] {
        let by_path = open_and_scan(|| Dataset::open(&dir.path().join(name), &opts), dir.path());
        let in_root = open_and_scan(|| Dataset::open_in(&*root, name, &opts), dir.path());
        assert_ne!(
            by_path, "no error",
            "{name}: a truncated dataset read whole"
        );
        assert_eq!(in_root, by_path, "{name}");
    }
}
