//! The dataset cache over a real directory: sessions share one open dataset while its files
//! are unchanged; a file replaced or rewritten is opened afresh while readers of the old one
//! read on; a file truncated under a reader is an error, never a crash; unused entries are
//! bounded.

use std::path::Path;
use std::sync::Arc;

use dquant_format::DType;
use dquant_storage::{CacheStats, DatasetCache, LocalRoot, OpenOptions};

fn u16_file(path: &Path, tokens: &[u16]) {
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    std::fs::write(path, bytes).unwrap();
}

fn raw() -> OpenOptions {
    OpenOptions {
        raw_dtype: Some(DType::U16),
        eod: None,
    }
}

fn all_tokens(ds: &dquant_storage::Dataset) -> Result<Vec<u32>, dquant_storage::StorageError> {
    let mut out = Vec::new();
    ds.reader().read(0..ds.tokens(), &mut out)?;
    Ok(out)
}

#[test]
fn sessions_share_one_dataset_until_its_file_changes() {
    let dir = tempfile::tempdir().unwrap();
    u16_file(&dir.path().join("a.u16"), &[1, 2, 3, 4]);
    let root = LocalRoot::new(dir.path()).unwrap();
    let cache = DatasetCache::new(4);

    let first = cache.open_in("r", &root, "a.u16", &raw()).unwrap();
    let second = cache.open_in("r", &root, "./a.u16", &raw()).unwrap();
    assert!(
        Arc::ptr_eq(&first, &second),
        "one dataset for both sessions"
    );
    let with_eod = OpenOptions {
        eod: Some(4),
        ..raw()
    };
    let other = cache.open_in("r", &root, "a.u16", &with_eod).unwrap();
    assert!(
        !Arc::ptr_eq(&first, &other),
        "other options, another dataset"
    );
    assert_eq!(
        cache.stats(),
        CacheStats {
            opened: 2,
            shared: 1,
            evicted: 0,
            entries: 2
        }
    );

    // Replaced by a rename: the next session opens the new file; the old readers keep
    // reading the bytes they indexed.
    let tmp = dir.path().join("a.tmp");
    u16_file(&tmp, &[9, 9, 9, 9, 9, 9]);
    std::fs::rename(&tmp, dir.path().join("a.u16")).unwrap();
    let replaced = cache.open_in("r", &root, "a.u16", &raw()).unwrap();
    assert!(!Arc::ptr_eq(&first, &replaced));
    assert_eq!(all_tokens(&replaced).unwrap(), vec![9; 6]);
    assert_eq!(all_tokens(&first).unwrap(), vec![1, 2, 3, 4]);
    assert!(!first.is_current_in(&root) && replaced.is_current_in(&root));

    // Rewritten in place (same inode, another size): also a new version.
    u16_file(&dir.path().join("a.u16"), &[5, 6]);
    let rewritten = cache.open_in("r", &root, "a.u16", &raw()).unwrap();
    assert_eq!(all_tokens(&rewritten).unwrap(), vec![5, 6]);
    let s = cache.stats();
    assert_eq!((s.opened, s.shared, s.evicted), (4, 1, 2));
}

#[test]
fn a_file_truncated_under_a_reader_is_an_error_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.u16");
    u16_file(&path, &(0..4096u16).collect::<Vec<_>>());
    let root = LocalRoot::new(dir.path()).unwrap();
    let cache = DatasetCache::new(4);
    let ds = cache.open_in("r", &root, "t.u16", &raw()).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(100)
        .unwrap();
    let e = all_tokens(&ds).unwrap_err().to_string();
    assert!(e.contains("t.u16"), "{e}");
    assert_eq!(
        e,
        format!(
            "{}: the file is shorter than when it was opened (8192 bytes; a read needed 8192): \
             it was truncated or rewritten while being read",
            "t.u16"
        )
    );
    // The next session sees the file as it is now.
    let now = cache.open_in("r", &root, "t.u16", &raw()).unwrap();
    assert_eq!(now.tokens(), 50);
}

#[test]
fn unused_datasets_are_kept_up_to_the_bound_most_recent_first() {
    let dir = tempfile::tempdir().unwrap();
    for n in ["a", "b", "c", "d"] {
        u16_file(&dir.path().join(n), &[1, 2]);
    }
    let root = LocalRoot::new(dir.path()).unwrap();
    let cache = DatasetCache::new(1);
    let held = cache.open_in("r", &root, "a", &raw()).unwrap();
    drop(cache.open_in("r", &root, "b", &raw()).unwrap());
    drop(cache.open_in("r", &root, "c", &raw()).unwrap());
    // Opening `d` bounds the unused ones: `a` is held by a session; of `b` and `c`, only
    // the more recent stays.
    drop(cache.open_in("r", &root, "d", &raw()).unwrap());
    let s = cache.stats();
    assert_eq!((s.entries, s.evicted), (3, 1));
    let c = cache.open_in("r", &root, "c", &raw()).unwrap();
    let b = cache.open_in("r", &root, "b", &raw()).unwrap();
    let s = cache.stats();
    assert_eq!(
        (s.opened, s.shared),
        (5, 1),
        "c was kept, b was opened again"
    );
    drop((held, c, b));
}
