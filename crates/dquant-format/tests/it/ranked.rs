//! `rank+zstd` files: the rank table kept in the footer's head (version 2), its checks, and
//! the writer's refusals.

use std::sync::Arc;

use crate::common::*;
use dquant_codec::{Codec, RankTable};
use dquant_format::block::{BlockFile, BlockFileWriter, FileHeader, FOOTER_FIXED_LEN};
use dquant_format::DocIndex;

const CODEC: &str = "u16+rank+zstd:3";

/// Like text: `n` draws of `distinct` ids spread up to 60,000, a few used far more often
/// than the rest.
fn text_like(seed: u64, distinct: u64, n: usize) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    let ids: Vec<u32> = (0..distinct).map(|_| rng.below(60_000) as u32).collect();
    (0..n)
        .map(|_| ids[(rng.below(distinct) * rng.below(distinct) / distinct) as usize])
        .collect()
}

fn tokens() -> Vec<u32> {
    text_like(7, 2000, 20_000)
}

fn ranked_file() -> (Vec<u32>, Vec<u8>) {
    let t = tokens();
    let file = write(
        CODEC.parse().unwrap(),
        4096,
        &t,
        &DocIndex::single(t.len() as u64),
    );
    (t, file)
}

/// The footer offset of the rank table's section, and its length.
fn table_span(file: &[u8]) -> (usize, usize) {
    let (start, _) = footer_span(file);
    let blocks = u64_at(file, start + 24) as usize;
    let len = u32_at(file, start + 12) as usize;
    (FOOTER_FIXED_LEN + 8 * (blocks + 1), len)
}

#[test]
fn a_ranked_file_keeps_its_table_and_round_trips() {
    let (t, file) = ranked_file();
    assert_eq!(u16::from_le_bytes([file[8], file[9]]), 2, "version");
    let bf = BlockFile::from_bytes(&file).unwrap();
    let table = bf.footer.ranks.as_deref().expect("a table");
    assert_eq!(*table, ranks_of(&t));
    assert_eq!(bf.decode_all(&file).unwrap(), t);
    // Ranked with zstd is smaller than the plain width with zstd.
    let plain = write(
        "u16+zstd:3".parse().unwrap(),
        4096,
        &t,
        &DocIndex::single(20_000),
    );
    assert!(
        file.len() < plain.len(),
        "{} >= {}",
        file.len(),
        plain.len()
    );
    assert!(BlockFile::from_bytes(&plain)
        .unwrap()
        .footer
        .ranks
        .is_none());
}

#[test]
fn a_damaged_table_fails_the_open_by_its_own_checksum() {
    let (_, file) = ranked_file();
    let (at, len) = table_span(&file);
    let f = edit_footer(&file, |f| f[at + len / 2] ^= 1);
    let e = BlockFile::from_bytes(&f).unwrap_err().to_string();
    assert!(
        e.starts_with("checksum mismatch in block file rank table: stored 0x"),
        "{e}"
    );
}

#[test]
fn a_table_must_come_with_rank_zstd_and_only_with_it() {
    let (_, file) = ranked_file();
    let (at, len) = table_span(&file);
    // The table cut out, its length 0: a rank+zstd file without a table.
    let f = edit_footer(&file, |f| {
        f.drain(at..at + len);
        f[12..16].copy_from_slice(&0u32.to_le_bytes());
    });
    assert_eq!(
        BlockFile::from_bytes(&f).unwrap_err().to_string(),
        "corrupt block file footer: a 0-byte rank table in a u16+rank+zstd:3 file"
    );
    // A plain u16 file whose footer claims a table.
    let t = tokens();
    let plain = write("u16".parse().unwrap(), 4096, &t, &DocIndex::single(20_000));
    let (pat, _) = table_span(&plain);
    let f = edit_footer(&plain, |f| {
        f.splice(pat..pat, file_table(&file));
        f[12..16].copy_from_slice(&(len as u32).to_le_bytes());
    });
    assert_eq!(
        BlockFile::from_bytes(&f).unwrap_err().to_string(),
        format!("corrupt block file footer: a {len}-byte rank table in a u16 file")
    );
}

fn file_table(file: &[u8]) -> Vec<u8> {
    let (start, _) = footer_span(file);
    let (at, len) = table_span(file);
    file[start + at..start + at + len].to_vec()
}

#[test]
fn table_ids_must_fit_the_width() {
    let table = RankTable::from_ids(vec![1, 300]).unwrap();
    let mut body = Vec::new();
    table.encode(&mut body);
    let header = FileHeader {
        codec: "u8+rank+zstd:3".parse().unwrap(),
        block_tokens: 256,
        vocab_size: 0,
    };
    let (mut w, head) = BlockFileWriter::new_ranked(header, Arc::new(table), false).unwrap();
    let mut file = head.to_vec();
    w.push(&[1, 1, 1], &mut file).unwrap();
    w.finish(&DocIndex::single(3), &mut file).unwrap();
    assert_eq!(
        BlockFile::from_bytes(&file).unwrap_err().to_string(),
        "corrupt block file footer: rank table payload is corrupt: rank 1 is id 300, outside 0..=255"
    );
}

#[test]
fn the_writer_needs_a_table_for_rank_zstd_and_refuses_unranked_tokens() {
    let header = |codec: &str| FileHeader {
        codec: codec.parse::<Codec>().unwrap(),
        block_tokens: 256,
        vocab_size: 0,
    };
    assert_eq!(
        BlockFileWriter::new(header(CODEC), false)
            .err()
            .unwrap()
            .to_string(),
        "u16+rank+zstd:3 failed: needs the dataset's rank table"
    );
    let table = Arc::new(RankTable::from_ids(vec![5, 9]).unwrap());
    assert_eq!(
        BlockFileWriter::new_ranked(header("u16+zstd:3"), table.clone(), false)
            .err()
            .unwrap()
            .to_string(),
        "invalid block file settings: a rank table for a u16+zstd:3 file"
    );
    let (mut w, head) = BlockFileWriter::new_ranked(header(CODEC), table, false).unwrap();
    let mut file = head.to_vec();
    let mut toks = vec![5u32; 300];
    toks[100] = 7;
    assert_eq!(
        w.push(&toks, &mut file).unwrap_err().to_string(),
        "token 7 at offset 100 is not in the dataset's rank table"
    );
}

/// A reader holds a block's rank codes (up to 4 bytes a token, whatever the width) before it
/// decodes them: the block size is checked against that, not against the width.
#[test]
fn block_sizes_are_checked_against_the_rank_codes() {
    let header = |codec: &str| FileHeader {
        codec: codec.parse::<Codec>().unwrap(),
        block_tokens: 1 << 28,
        vocab_size: 0,
    };
    assert!(BlockFileWriter::new(header("u8+zstd:3"), false).is_ok());
    let table = Arc::new(RankTable::from_ids(vec![1]).unwrap());
    assert_eq!(
        BlockFileWriter::new_ranked(header("u8+rank+zstd:3"), table, false)
            .err()
            .unwrap()
            .to_string(),
        "invalid block file settings: blocks of 268435456 tokens at u8+rank+zstd:3 hold 1073741836 bytes, over the 1073741824-byte limit"
    );
}

/// Tokens of the kept version-2 file: three blocks of 1,024 and a partial one.
fn kept_tokens() -> Vec<u32> {
    text_like(2026, 300, 3_500)
}

/// A version-2 file written when the format was made, kept in `tests/data` (the `block_file`
/// fuzz target's seeds copy it): every later build must read it to the same tokens and
/// table. `DQUANT_WRITE_KEPT=1` writes it again, for a deliberate format change only.
#[test]
fn the_kept_version_2_file_reads_back() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/ranked-v2.dqb");
    let t = kept_tokens();
    let index = DocIndex::single(t.len() as u64);
    if std::env::var_os("DQUANT_WRITE_KEPT").is_some() {
        std::fs::write(path, write(CODEC.parse().unwrap(), 1024, &t, &index)).unwrap();
    }
    let file = std::fs::read(path).unwrap();
    let bf = BlockFile::from_bytes(&file).unwrap();
    assert_eq!(bf.header.codec.to_string(), CODEC);
    assert_eq!(bf.blocks(), 4);
    assert_eq!(bf.decode_all(&file).unwrap(), t);
    assert_eq!(*bf.footer.ranks.as_deref().unwrap(), ranks_of(&t));
    assert_eq!(bf.content_checksum(), content_of(&t, &index));
}
