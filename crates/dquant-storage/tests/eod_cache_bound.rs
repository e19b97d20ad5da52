//! The EOD index cache stays within `$DQUANT_CACHE_MAX_BYTES`: a new entry prunes the least
//! recently used ones (an entry used again counts as new), and a pruned entry is simply
//! rebuilt, with the same documents, the next time they are asked for.
//!
//! A binary of its own, as `eod_index.rs` is: it sets the process's environment.

use std::path::{Path, PathBuf};

use dquant_format::DType;
use dquant_storage::{Dataset, OpenOptions};

const EOD: u32 = 9;

fn raw_file(dir: &Path, name: &str, docs: usize) -> PathBuf {
    let p = dir.join(name);
    // `docs` documents of 3 tokens, each ending with EOD.
    let bytes: Vec<u8> = (0..docs)
        .flat_map(|d| [d as u16 % 7, 1, EOD as u16])
        .flat_map(u16::to_le_bytes)
        .collect();
    std::fs::write(&p, bytes).unwrap();
    p
}

fn open(path: &Path) -> Dataset {
    let opts = OpenOptions {
        raw_dtype: Some(DType::U16),
        eod: Some(EOD),
    };
    Dataset::open(path, &opts).unwrap()
}

/// The documents of `path`, counted through a fresh open (from its entry, or by a scan that
/// writes one), and its entry.
fn count(path: &Path) -> (u64, PathBuf) {
    let ds = open(path);
    (ds.documents().unwrap(), ds.index_cache_path().unwrap())
}

#[test]
fn new_entries_prune_the_least_recently_used_and_a_pruned_one_is_rebuilt() {
    let cache = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    std::env::set_var("DQUANT_CACHE_DIR", cache.path());
    let (a, b, c) = (
        raw_file(data.path(), "a.u16", 1000),
        raw_file(data.path(), "b.u16", 1000),
        raw_file(data.path(), "c.u16", 1000),
    );
    let (n, entry_a) = count(&a);
    assert_eq!(n, 1000);
    // Room for two entries of this size, not three.
    let len = std::fs::metadata(&entry_a).unwrap().len();
    std::env::set_var("DQUANT_CACHE_MAX_BYTES", (2 * len + len / 2).to_string());
    let (_, entry_b) = count(&b);
    // Entries' use times are whole seconds on some filesystems: make the order plain.
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(
        count(&a).0,
        1000,
        "a from its entry, which is now the most recently used"
    );
    let (_, entry_c) = count(&c);
    assert!(entry_a.exists() && entry_c.exists());
    assert!(!entry_b.exists(), "b, the least recently used, was pruned");
    // b's documents are found again, the same, and its entry comes back; a goes now.
    assert_eq!(count(&b), (1000, entry_b.clone()));
    assert!(entry_b.exists());
    assert!(!entry_a.exists());
    assert_eq!(count(&a).0, 1000);
}
