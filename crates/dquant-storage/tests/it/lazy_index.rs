//! A Megatron dataset opens from its `.idx` header and the ends of its arrays: the token,
//! document and sequence counts are right without the index in memory; the whole index,
//! when asked for, equals Megatron-Core's file parsed whole; damage at the ends fails the
//! open, damage inside fails the first use of the index, each with the error that names it.
//!
//! A block file (`.dqb`) opens the same way: from its header, trailer and the footer's totals
//! and block table; its document index (the rest of the footer) and the footer's checksum are
//! read and checked when first asked for.

use std::path::{Path, PathBuf};

use dquant_codec::Codec;
use dquant_format::block::{BlockFile, Trailer, FOOTER_FIXED_LEN, TRAILER_LEN};
use dquant_format::megatron::{self, HEADER_LEN};
use dquant_storage::{Dataset, DatasetWriter, LocalRoot, OpenOptions, OutputFormat};
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

/// The r50k fixture as `DIR/x.dqb` (u16+zstd:3, blocks of 256 tokens), its metadata parsed whole, and
/// where its footer is.
fn block_copy() -> (tempfile::TempDir, PathBuf, BlockFile, Trailer) {
    let (dir, x, _) = fixture_copy();
    let dqb = dir.path().join("x.dqb");
    let codec: Codec = "u16+zstd:3".parse().unwrap();
    let ds = Dataset::open(&x, &OpenOptions::default()).unwrap();
    // The smallest blocks a header allows, so that the fixture spans many.
    let block_tokens = 256;
    let format = OutputFormat::Block {
        codec,
        block_tokens,
        vocab_size: 0,
    };
    let mut w = DatasetWriter::create(&dqb, format).unwrap();
    ds.scan(1 << 16, |_, t| w.push(t)).unwrap();
    w.finish(ds.index().unwrap()).unwrap();
    let bytes = std::fs::read(&dqb).unwrap();
    let whole = BlockFile::from_bytes(&bytes).unwrap();
    let trailer = Trailer::parse(&bytes[bytes.len() - TRAILER_LEN..], bytes.len() as u64).unwrap();
    (dir, dqb, whole, trailer)
}

fn all_tokens(ds: &Dataset) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    ds.reader()
        .read(0..ds.tokens(), &mut out)
        .map_err(|e| e.to_string())?;
    Ok(out)
}

/// Flips one bit of `path` at `off`.
fn flip(path: &Path, off: u64) {
    let mut b = std::fs::read(path).unwrap();
    b[off as usize] ^= 0x10;
    std::fs::write(path, b).unwrap();
}

#[test]
fn a_block_file_opens_from_its_block_table_and_reads_its_index_when_asked() {
    let (dir, _, whole, _) = block_copy();
    assert!(whole.blocks() > 8, "the fixture spans many blocks");
    let ds = open(dir.path(), "x.dqb").unwrap();
    assert_eq!(ds.tokens(), whole.tokens());
    assert_eq!(ds.documents().unwrap(), whole.index.documents() as u64);
    assert_eq!(ds.sequences().unwrap(), whole.index.sequences() as u64);
    // Not read yet: the checksum that covers the index is not known without a read.
    assert_eq!(ds.stored_checksum_if_known(), None);
    assert_eq!(ds.block_layout().unwrap(), &whole.layout);
    // The checksum reads the index's bytes but keeps only the checksum.
    let want = Some(whole.content_checksum());
    assert_eq!(ds.stored_checksum().unwrap(), want);
    assert_eq!(ds.stored_checksum_if_known(), want);
    assert_eq!(ds.index().unwrap(), &whole.index);
    assert!(std::ptr::eq(ds.index().unwrap(), ds.index().unwrap()));
    // Once the index is read, the checksum comes from it, on a fresh open too.
    let ds = open(dir.path(), "x.dqb").unwrap();
    ds.index().unwrap();
    assert_eq!(ds.stored_checksum_if_known(), want);
    assert_eq!(ds.stored_checksum().unwrap(), want);
}

#[test]
fn damage_in_a_block_files_index_fails_the_index_not_the_tokens() {
    let (dir, dqb, whole, trailer) = block_copy();
    let tokens = all_tokens(&open(dir.path(), "x.dqb").unwrap()).unwrap();
    // A bit flipped in the document index (the footer's last bytes): the file opens and
    // streams every token; the index, and the checksum that covers it, fail by name, and
    // fail again when asked again.
    flip(&dqb, trailer.footer_offset + trailer.footer_len - 1);
    let ds = open(dir.path(), "x.dqb").unwrap();
    assert_eq!(all_tokens(&ds).unwrap(), tokens);
    assert_eq!(ds.documents().unwrap(), whole.index.documents() as u64);
    let err = ds.index().unwrap_err().to_string();
    assert!(
        err.starts_with("x.dqb: checksum mismatch in block file footer"),
        "{err}"
    );
    assert_eq!(ds.index().unwrap_err().to_string(), err);
    assert_eq!(ds.stored_checksum().unwrap_err().to_string(), err);
    flip(&dqb, trailer.footer_offset + trailer.footer_len - 1);
    assert_eq!(
        ds.index().unwrap(),
        &whole.index,
        "read again once repaired"
    );
}

#[test]
fn damage_in_a_block_files_table_fails_the_open() {
    let (dir, dqb, whole, trailer) = block_copy();
    let entry = |i: u64| trailer.footer_offset + FOOTER_FIXED_LEN as u64 + 8 * i;
    let pristine = std::fs::read(&dqb).unwrap();
    let poke_u64 = |off: u64, v: u64| {
        let mut b = pristine.clone();
        b[off as usize..off as usize + 8].copy_from_slice(&v.to_le_bytes());
        std::fs::write(&dqb, b).unwrap();
    };
    let err = |what: &str| format!("x.dqb: {what}");
    // Block 2 moved before block 1 ends.
    let b1 = whole.footer.block_offsets[1];
    poke_u64(entry(2), b1 + 4);
    assert_eq!(
        open(dir.path(), "x.dqb").unwrap_err(),
        err(&format!(
            "corrupt block file footer: block 2 at byte {} overlaps block 1 at byte {b1}",
            b1 + 4
        ))
    );
    // A block count that does not match the tokens.
    poke_u64(trailer.footer_offset + 24, whole.blocks() as u64 + 1);
    assert!(open(dir.path(), "x.dqb")
        .unwrap_err()
        .starts_with(&err(&format!(
            "corrupt block file footer: {} blocks for",
            whole.blocks() + 1
        ))),);
    // The last entry is not where the footer starts.
    poke_u64(entry(whole.blocks() as u64), trailer.footer_offset - 1);
    assert_eq!(
        open(dir.path(), "x.dqb").unwrap_err(),
        err(&format!(
            "corrupt block file footer: blocks end at byte {} but the footer starts at {}",
            trailer.footer_offset - 1,
            trailer.footer_offset
        ))
    );
}
