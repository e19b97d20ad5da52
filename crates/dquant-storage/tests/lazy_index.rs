//! A Megatron dataset opens from its `.idx` header and the ends of its arrays: the token,
//! document and sequence counts are right without the index in memory; the whole index,
//! when asked for, equals Megatron-Core's file parsed whole; damage at the ends fails the
//! open, damage inside fails the first use of the index, each with the error that names it.

use std::path::{Path, PathBuf};

use dquant_format::megatron::{self, HEADER_LEN};
use dquant_storage::{Dataset, LocalRoot, OpenOptions};
use dquant_testkit::copy_fixture;

fn idx_path(prefix: &Path) -> PathBuf {
    prefix.with_extension("idx")
}

fn open(dir: &Path, name: &str) -> Result<Dataset, String> {
    let root = LocalRoot::new(dir).unwrap();
    Dataset::open_in(&root, name, &OpenOptions::default()).map_err(|e| e.to_string())
}

/// Overwrites 8 bytes of `x.idx` at `off` with `v`.
fn poke(prefix: &Path, off: u64, v: i64) {
    let p = idx_path(prefix);
    let mut b = std::fs::read(&p).unwrap();
    b[off as usize..off as usize + 8].copy_from_slice(&v.to_le_bytes());
    std::fs::write(p, b).unwrap();
}

/// A copy of the r50k fixture as `DIR/x`, and its index parsed whole.
fn fixture_copy() -> (tempfile::TempDir, PathBuf, megatron::MegatronIndex) {
    let dir = tempfile::tempdir().unwrap();
    let x = dir.path().join("x");
    copy_fixture("r50k_int32", &x);
    let whole = megatron::parse_idx(&std::fs::read(idx_path(&x)).unwrap()).unwrap();
    (dir, x, whole)
}

#[test]
fn counts_come_from_the_header_and_the_index_equals_the_whole_parse() {
    let (dir, _, whole) = fixture_copy();
    let ds = open(dir.path(), "x").unwrap();
    assert_eq!(ds.tokens(), whole.index.tokens());
    assert_eq!(ds.documents().unwrap(), whole.index.documents() as u64);
    assert_eq!(ds.sequences().unwrap(), whole.index.sequences() as u64);
    assert_eq!(ds.index().unwrap(), &whole.index);
    // Asked again: the same index, read once.
    assert!(std::ptr::eq(ds.index().unwrap(), ds.index().unwrap()));
}

#[test]
fn damage_at_the_ends_fails_the_open_and_inside_fails_the_index() {
    let (dir, x, whole) = fixture_copy();
    let (s, d) = (
        whole.index.sequences() as u64,
        whole.index.doc_seq().len() as u64,
    );
    let h = HEADER_LEN as u64;
    let pointer = |i: u64| h + 4 * s + 8 * i;
    let doc_index = |i: u64| h + 12 * s + 8 * i;

    // A pointer inside the array: the open cannot see it; the index names it.
    poke(&x, pointer(1), 4);
    let ds = open(dir.path(), "x").unwrap();
    assert_eq!(ds.tokens(), whole.index.tokens());
    let second = whole.index.sequence_len(0) * 4;
    assert_eq!(
        ds.index().unwrap_err().to_string(),
        format!(
            "x.idx: corrupt Megatron .idx: sequence 1 starts at byte 4, expected {second} \
             (right after sequence 0)"
        )
    );
    poke(&x, pointer(1), second as i64);

    // The last document index, the first pointer, the last pointer: the open refuses.
    poke(&x, doc_index(d - 1), s as i64 - 1);
    assert_eq!(
        open(dir.path(), "x").unwrap_err(),
        format!(
            "x.idx: corrupt Megatron .idx: document_indices run from 0 to {}, expected 0 to {s} \
             (the sequence count)",
            s - 1
        )
    );
    poke(&x, doc_index(d - 1), s as i64);
    poke(&x, pointer(0), 8);
    assert_eq!(
        open(dir.path(), "x").unwrap_err(),
        "x.idx: corrupt Megatron .idx: sequence 0 starts at byte 8, expected 0"
    );
    poke(&x, pointer(0), 0);
    let last = std::fs::read(idx_path(&x)).unwrap()
        [pointer(s - 1) as usize..pointer(s - 1) as usize + 8]
        .to_vec();
    let last = i64::from_le_bytes(last.try_into().unwrap());
    poke(&x, pointer(s - 1), last + 4);
    let tokens = whole.index.tokens();
    assert_eq!(
        open(dir.path(), "x").unwrap_err(),
        format!(
            "x.bin: truncated Megatron .bin ({} tokens of int32 in the .idx): needs {} bytes \
             but has {}",
            tokens + 1,
            tokens * 4 + 4,
            tokens * 4
        )
    );
    poke(&x, pointer(s - 1), last);
    assert_eq!(
        open(dir.path(), "x").unwrap().index().unwrap(),
        &whole.index
    );
}
