//! A raw file with an end-of-document token: opening it reads nothing, its documents are
//! found by one scan the first time they are asked for, and the result is kept in a cache
//! entry that any later open of the same file (same device, inode, size and modification
//! time) uses instead of scanning; a changed file is scanned again, and a damaged entry is
//! ignored and written again.
//!
//! Every test of this binary shares one cache directory (`DQUANT_CACHE_DIR`, set once before
//! any dataset is opened); their files differ, so their entries do too. Setting the variable
//! is why these tests are a binary of their own, outside `tests/it`: the environment is the
//! process's, and no other test may be reading it while it changes.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use dquant_format::{DType, DocIndex, DocIndexBuilder};
use dquant_storage::{Dataset, InMemoryRoot, OpenOptions};

const EOD: u32 = 9;

/// The cache directory of this test binary.
fn cache() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = tempfile::tempdir().unwrap();
        // Set once, before any test opens a dataset (they all come here first).
        std::env::set_var("DQUANT_CACHE_DIR", d.path());
        d
    })
    .path()
}

fn write_u16(path: &Path, tokens: &[u32]) {
    let bytes: Vec<u8> = tokens
        .iter()
        .flat_map(|&t| (t as u16).to_le_bytes())
        .collect();
    std::fs::write(path, bytes).unwrap();
}

fn open(path: &Path) -> Dataset {
    let opts = OpenOptions {
        raw_dtype: Some(DType::U16),
        eod: Some(EOD),
    };
    Dataset::open(path, &opts).unwrap()
}

/// The index a scan must find: documents end after each EOD, a tail is one more.
fn expected(tokens: &[u32]) -> DocIndex {
    let mut b = DocIndexBuilder::new();
    let mut last = 0;
    for (i, &t) in tokens.iter().enumerate() {
        if t == EOD {
            b.push_document((i + 1 - last) as u64);
            last = i + 1;
        }
    }
    if last < tokens.len() {
        b.push_document((tokens.len() - last) as u64);
    }
    b.finish()
}

fn ends(ix: &DocIndex) -> Vec<u64> {
    (0..ix.documents()).map(|d| ix.document(d).end).collect()
}

fn tmpfile(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join(name);
    (dir, p)
}

#[test]
fn opening_reads_nothing_and_the_first_count_scans_once_into_the_cache() {
    cache();
    let (_d, path) = tmpfile("a.u16");
    let tokens = [1, 2, EOD, 3, EOD, 4, 5];
    write_u16(&path, &tokens);
    let ds = open(&path);
    let entry = ds
        .index_cache_path()
        .expect("a local file has a cache entry");
    assert!(entry.starts_with(cache()), "{}", entry.display());
    assert!(!entry.exists(), "open must not scan");
    assert_eq!(ds.tokens(), 7);
    assert_eq!(ds.documents_if_known(), None);
    assert_eq!(ds.documents().unwrap(), 3);
    assert!(entry.exists(), "the count wrote the entry");
    assert_eq!(ds.sequences().unwrap(), 3);
    assert_eq!(ends(ds.index().unwrap()), [3, 5, 7]);
    // Another open of the same file knows the count without a scan.
    assert_eq!(open(&path).documents_if_known(), Some(3));
}

#[test]
fn the_index_is_the_scans_over_many_chunks() {
    cache();
    let (_d, path) = tmpfile("big.u16");
    // 3.5 Mi tokens: the scan reads 1 Mi-token chunks, so documents cross chunk ends.
    let mut x: u64 = 7;
    let tokens: Vec<u32> = (0..(7u32 << 19))
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            ((x >> 33) % 4000) as u32
        })
        .collect();
    write_u16(&path, &tokens);
    let want = expected(&tokens);
    assert!(want.documents() > 100);
    let ds = open(&path);
    assert_eq!(ds.documents().unwrap(), want.documents() as u64);
    assert_eq!(ends(ds.index().unwrap()), ends(&want));
    // Read back from the entry by a fresh open.
    assert_eq!(ends(open(&path).index().unwrap()), ends(&want));
}

#[test]
fn the_entry_is_used_until_the_file_changes() {
    cache();
    let (_d, path) = tmpfile("b.u16");
    write_u16(&path, &[1, EOD, 2, EOD, 3, EOD]);
    assert_eq!(open(&path).documents().unwrap(), 3);
    // Same bytes count, other content, the modification time put back: the file's identity
    // is unchanged, so the entry answers (no scan). This is what a cache keyed by identity
    // does, as make does with modification times.
    let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
    write_u16(&path, &[1, 2, 3, 4, 5, EOD]);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    assert_eq!(open(&path).documents().unwrap(), 3, "the entry, not a scan");
    // A real change (another size, a new modification time) is scanned again.
    write_u16(&path, &[1, 2, 3, 4, 5, EOD, 6]);
    let ds = open(&path);
    assert_eq!(ds.documents_if_known(), None);
    assert_eq!(ends(ds.index().unwrap()), [6, 7]);
}

#[test]
fn a_damaged_entry_is_ignored_and_written_again() {
    cache();
    let (_d, path) = tmpfile("c.u16");
    let tokens = [EOD, 1, 2, EOD, 3, 4, 5, EOD, 6];
    write_u16(&path, &tokens);
    let entry = open(&path).index_cache_path().unwrap();
    assert_eq!(open(&path).documents().unwrap(), 4);
    let good = std::fs::read(&entry).unwrap();

    // A flipped byte among the ends: the count (from the entry's tail) still reads, the
    // index does not check out and is scanned again.
    let mut bad = good.clone();
    let at = bad.len() - 24;
    bad[at] ^= 0x40;
    std::fs::write(&entry, &bad).unwrap();
    assert_eq!(ends(open(&path).index().unwrap()), [1, 4, 8, 9]);
    assert_eq!(std::fs::read(&entry).unwrap(), good, "written again");

    // Truncated, emptied, or garbage: not this file's entry; counted by a scan.
    for damaged in [&good[..good.len() - 3], &[][..], &[0xff; 64][..]] {
        std::fs::write(&entry, damaged).unwrap();
        let ds = open(&path);
        assert_eq!(ds.documents_if_known(), None);
        assert_eq!(ds.documents().unwrap(), 4);
        assert_eq!(std::fs::read(&entry).unwrap(), good, "written again");
    }
}

#[test]
fn an_unwritable_cache_keeps_the_index_in_memory() {
    cache();
    let (_d, path) = tmpfile("d.u16");
    write_u16(&path, &[1, EOD, 2]);
    let ds = open(&path);
    let entry = ds.index_cache_path().unwrap();
    // A directory where the entry's file should go: it cannot be written (even as root).
    std::fs::create_dir_all(&entry).unwrap();
    assert_eq!(ds.documents().unwrap(), 2);
    assert_eq!(ends(ds.index().unwrap()), [2, 3]);
    std::fs::remove_dir(&entry).unwrap();
}

#[test]
fn an_in_memory_object_is_counted_but_never_cached() {
    cache();
    // Its version (an address) is unique only while it lives: nothing on disk may name it.
    let bytes: Vec<u8> = [1u32, EOD, 2, EOD]
        .iter()
        .flat_map(|&t| (t as u16).to_le_bytes())
        .collect();
    let root = InMemoryRoot::from_objects(&[("m.u16", &bytes)]).unwrap();
    let opts = OpenOptions {
        raw_dtype: Some(DType::U16),
        eod: Some(EOD),
    };
    let ds = Dataset::open_in(&root, "m.u16", &opts).unwrap();
    assert_eq!(ds.index_cache_path(), None);
    assert_eq!(ds.documents().unwrap(), 2);
    assert_eq!(ends(ds.index().unwrap()), [2, 4]);
}
