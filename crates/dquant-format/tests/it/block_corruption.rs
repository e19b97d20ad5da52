//! Damaged block files: every kind of damage gives its exact error, never a panic.

use crate::common;

use common::*;
use dquant_codec::{Codec, Decoder, Width};
use dquant_format::block::{BlockFile, Footer, HEADER_LEN};
use dquant_format::{DocIndex, DocIndexBuilder};

const N: usize = 4 * 256 + 100;

/// The file under attack: 1124 i32 tokens in blocks of 256 (4 full blocks of 32 + 1024 bytes
/// and a tail of 32 + 400), documents of several sequences.
fn base() -> (Vec<u32>, DocIndex, Vec<u8>) {
    let tokens = tokens_for(Width::Bits(16), N, 1);
    let mut b = DocIndexBuilder::new();
    b.push_sequence(500);
    b.push_sequence(24);
    b.end_document();
    b.push_document(0);
    b.push_document(600);
    let ix = b.finish();
    let file = write("i32".parse().unwrap(), 256, &tokens, &ix);
    (tokens, ix, file)
}

const OFFSETS: [u64; 6] = [64, 1120, 2176, 3232, 4288, 4720];

fn parse_err(file: &[u8]) -> String {
    BlockFile::from_bytes(file).unwrap_err().to_string()
}

fn decode_err(file: &[u8]) -> String {
    let bf = BlockFile::from_bytes(file).expect("the metadata is intact");
    bf.decode_all(file).unwrap_err().to_string()
}

fn crc_msg(what: &str, stored: u32, computed: u32) -> String {
    format!("checksum mismatch in {what}: stored {stored:#010x}, computed {computed:#010x}")
}

#[test]
fn base_file_layout() {
    let (tokens, ix, file) = base();
    let bf = BlockFile::from_bytes(&file).unwrap();
    assert_eq!(bf.footer.block_offsets, OFFSETS);
    // 48 fixed + 6 offsets + varints 500, 24, 0, 600 (2+1+1+2) + docs 2, 1, 1.
    assert_eq!(footer_span(&file), (4720, 48 + 48 + 6 + 3));
    assert_eq!(file.len(), 4720 + 105 + 32);
    assert_eq!(bf.decode_all(&file).unwrap(), tokens);
    assert_eq!(bf.index, ix);
}

#[test]
fn wrong_file_magic() {
    let (_, _, mut file) = base();
    file[0] = b'X';
    assert_eq!(
        parse_err(&file),
        r#"not a dquant block file: bad magic "XQBLOCKS" (expected "DQBLOCKS")"#
    );
    assert_eq!(
        parse_err(b""),
        r#"not a dquant block file: bad magic "" (expected "DQBLOCKS")"#
    );
    assert_eq!(
        parse_err(b"MMIDIDX\0\0\x01"),
        r#"not a dquant block file: bad magic "MMIDIDX\0" (expected "DQBLOCKS")"#
    );
}

#[test]
fn unsupported_version() {
    let (_, _, mut file) = base();
    file[8..10].copy_from_slice(&3u16.to_le_bytes());
    fix_file_header_crc(&mut file); // the crc is right, the version is not
    assert_eq!(
        parse_err(&file),
        "unsupported dquant block file version 3 (this build reads versions 1 and 2)"
    );
    // Version 2 is for rank+zstd files, whose footer holds the rank table.
    file[8..10].copy_from_slice(&2u16.to_le_bytes());
    fix_file_header_crc(&mut file);
    assert_eq!(
        parse_err(&file),
        "corrupt block file header: version 2 with codec i32 (version 2 is for rank+zstd files, 1 for the rest)"
    );
    file[8..10].copy_from_slice(&0xFFFFu16.to_le_bytes());
    assert_eq!(
        parse_err(&file),
        "unsupported dquant block file version 65535 (this build reads versions 1 and 2)"
    );
}

#[test]
fn header_crc_mismatch() {
    let (_, _, file) = base();
    let stored = u32_at(&file, 60);
    for byte in [12, 16, 20, 30, 59] {
        let mut f = file.clone();
        f[byte] ^= 0x10;
        assert_eq!(
            parse_err(&f),
            crc_msg("block file header", stored, crc32c(&f[..60])),
            "bit flipped in header byte {byte}"
        );
    }
    let mut f = file.clone();
    f[62] ^= 1; // the stored crc itself
    assert_eq!(
        parse_err(&f),
        crc_msg("block file header", stored ^ 0x1_0000, crc32c(&f[..60]))
    );
}

#[test]
fn header_fields_with_a_valid_crc() {
    let (_, _, file) = base();
    let with = |at: usize, bytes: &[u8]| {
        let mut f = file.clone();
        f[at..at + bytes.len()].copy_from_slice(bytes);
        fix_file_header_crc(&mut f);
        parse_err(&f)
    };
    assert_eq!(
        with(10, &65u16.to_le_bytes()),
        "corrupt block file header: header length 65, expected 64"
    );
    assert_eq!(
        with(12, &[9, 16, 0, 0]),
        "corrupt block file header: unknown codec bytes [09, 10, 00, 00]"
    );
    assert_eq!(
        with(12, &[7, 33, 0, 0]),
        "corrupt block file header: unknown codec bytes [07, 21, 00, 00]"
    );
    assert_eq!(
        with(12, &[2, 16, 5, 0]),
        "corrupt block file header: unknown codec bytes [02, 10, 05, 00]"
    );
    // A stream codec's payloads decode only in order: no file stores one.
    assert_eq!(
        with(12, &[2, 16, 4, 3]),
        "corrupt block file header: u16+stream:3 is a wire codec (its batches share one zstd stream); store zstd:LEVEL or rank+zstd:LEVEL"
    );
    assert_eq!(
        with(16, &100u32.to_le_bytes()),
        "corrupt block file header: block size 100 tokens is not a positive multiple of 256"
    );
    assert_eq!(
        with(16, &0u32.to_le_bytes()),
        "corrupt block file header: block size 0 tokens is not a positive multiple of 256"
    );
    // A different but valid block size: the footer's block count no longer matches.
    assert_eq!(
        with(16, &512u32.to_le_bytes()),
        "corrupt block file footer: 5 blocks for 1124 tokens of 512 per block (expected 3)"
    );
}

#[test]
fn truncated_files() {
    let (_, _, file) = base();
    let len = file.len();
    let (footer_at, _) = footer_span(&file);
    let no_end =
        "corrupt block file trailer: no end marker; the file is truncated or was not finished";
    // Inside the trailer, inside the footer, inside a block header, inside a payload.
    for cut in [
        len - 1,
        len - 8,
        len - 31,
        footer_at + 50,
        footer_at + 1,
        1130,
        3000,
        200,
    ] {
        assert_eq!(parse_err(&file[..cut]), no_end, "cut at {cut}");
    }
    // Too short to hold an empty file.
    assert_eq!(
        parse_err(&file[..151]),
        "truncated block file: needs 152 bytes but has 151"
    );
    assert_eq!(
        parse_err(&file[..64]),
        "truncated block file: needs 152 bytes but has 64"
    );
    // Too short to hold the header.
    assert_eq!(
        parse_err(&file[..63]),
        "truncated block file header: needs 64 bytes but has 63"
    );
    assert_eq!(
        parse_err(&file[..8]),
        "truncated block file header: needs 64 bytes but has 8"
    );
    assert_eq!(
        parse_err(&file[..5]),
        r#"not a dquant block file: bad magic "DQBLO" (expected "DQBLOCKS")"#
    );
}

#[test]
fn missing_bytes_before_an_intact_trailer() {
    // A block lost its last 10 bytes but the footer and trailer are whole: the trailer no
    // longer points at the footer.
    let (_, _, file) = base();
    let mut f = file[..2166].to_vec();
    f.extend_from_slice(&file[2176..]);
    assert_eq!(
        parse_err(&f),
        format!(
            "corrupt block file trailer: footer at 4720+105 does not end where the trailer starts ({})",
            f.len() - 32
        )
    );
}

#[test]
fn data_shorter_than_the_metadata_says() {
    // Metadata read from the complete file (header, trailer, footer), blocks from a copy that
    // was cut short: an error naming the block and the bytes it needs, never a panic.
    let (_, _, file) = base();
    let bf = BlockFile::from_bytes(&file).unwrap();
    assert_eq!(
        bf.decode_all(&file[..3000]).unwrap_err().to_string(),
        "truncated block 2 (file bytes 2176..3232): needs 1056 bytes but has 824"
    );
    assert_eq!(
        bf.decode_all(&file[..100]).unwrap_err().to_string(),
        "truncated block 0 (file bytes 64..1120): needs 1056 bytes but has 36"
    );
    assert_eq!(
        bf.decode_all(&file[..10]).unwrap_err().to_string(),
        "truncated block 0 (file bytes 64..1120): needs 1056 bytes but has 0"
    );
    let mut out = vec![0; 256];
    let e = bf
        .decode_block(3, &file[3232..3250], &mut Decoder::new(), &mut out)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "truncated block 3 (file bytes 3232..4288): needs 1056 bytes but has 18"
    );
}

#[test]
fn flipped_bit_in_a_block_payload() {
    let (tokens, _, file) = base();
    for (block, at) in [
        (1usize, 1120 + 32),
        (1, 2175),
        (4, 4288 + 32 + 399),
        (0, 500),
    ] {
        let mut f = file.clone();
        f[at] ^= 0x04;
        let r = OFFSETS[block] as usize..OFFSETS[block + 1] as usize;
        let stored = u32_at(&f, r.start + 24);
        let computed = crc32c(&f[r.start + 32..r.end]);
        let what = format!("block {block} (file bytes {}..{}) payload", r.start, r.end);
        assert_eq!(decode_err(&f), crc_msg(&what, stored, computed));
        // Reading the other blocks is unaffected.
        let bf = BlockFile::from_bytes(&f).unwrap();
        let other = (block + 1) % 5;
        let t = bf.block_tokens(other);
        let b = bf.byte_range(other..other + 1);
        let mut out = vec![0; (t.end - t.start) as usize];
        bf.decode_block(
            other,
            &f[b.start as usize..b.end as usize],
            &mut Decoder::new(),
            &mut out,
        )
        .unwrap();
        assert_eq!(out, tokens[t.start as usize..t.end as usize]);
    }
}

#[test]
fn flipped_bit_in_a_block_header() {
    let (_, _, file) = base();
    for byte in [4, 8, 12, 16, 24, 31] {
        let mut f = file.clone();
        f[1120 + byte] ^= 0x01;
        let stored = u32_at(&f, 1120 + 28);
        let computed = crc32c(&f[1120..1120 + 28]);
        assert_eq!(
            decode_err(&f),
            crc_msg("block 1 (file bytes 1120..2176) header", stored, computed),
            "bit flipped in block header byte {byte}"
        );
    }
    let mut f = file.clone();
    f[1120] = b'X';
    assert_eq!(
        decode_err(&f),
        "corrupt block 1 (file bytes 1120..2176): bad block magic [58, 51, 42, 4b], expected \"DQBK\""
    );
}

#[test]
fn block_header_fields_with_a_valid_crc() {
    let (_, _, file) = base();
    let with = |at: usize, bytes: &[u8]| {
        let mut f = file.clone();
        f[1120 + at..1120 + at + bytes.len()].copy_from_slice(bytes);
        fix_block_header_crc(&mut f, 1120);
        decode_err(&f)
    };
    assert_eq!(
        with(16, &0u64.to_le_bytes()),
        "corrupt block 1 (file bytes 1120..2176): holds tokens 0..256 but the block table says 256..512"
    );
    assert_eq!(
        with(8, &255u32.to_le_bytes()),
        "corrupt block 1 (file bytes 1120..2176): holds tokens 256..511 but the block table says 256..512"
    );
    assert_eq!(
        with(16, &(u64::MAX - 1).to_le_bytes()),
        "corrupt block 1 (file bytes 1120..2176): holds tokens 18446744073709551614..18446744073709551615 but the block table says 256..512"
    );
    assert_eq!(
        with(12, &1000u32.to_le_bytes()),
        "corrupt block 1 (file bytes 1120..2176): payload of 1000 bytes in a 1056-byte block"
    );
    assert_eq!(
        with(4, &[9, 9, 9, 9]),
        "corrupt block 1 (file bytes 1120..2176): unknown codec bytes [09, 09, 09, 09]"
    );
    assert_eq!(
        with(4, &Codec::plain(Width::U16).to_bytes()),
        "corrupt block 1 (file bytes 1120..2176): u16 payload is 1024 bytes, but 256 tokens need 512 bytes"
    );
    // A plain payload labelled as zstd (the reason is libzstd's own words).
    assert_eq!(
        with(4, &"i32+zstd:3".parse::<Codec>().unwrap().to_bytes()),
        "corrupt block 1 (file bytes 1120..2176): i32+zstd:3 payload is corrupt: Unknown frame descriptor"
    );
}

#[test]
fn payload_with_a_valid_crc_but_a_value_that_is_no_token() {
    // Token 300 (in block 1) stored as int32 -1, payload crc recomputed: the decoder names
    // the absolute token offset.
    let (_, _, file) = base();
    let mut f = file.clone();
    let at = 1120 + 32 + 4 * (300 - 256);
    f[at..at + 4].copy_from_slice(&(-1i32).to_le_bytes());
    let c = crc32c(&f[1152..2176]);
    f[1120 + 24..1120 + 28].copy_from_slice(&c.to_le_bytes());
    fix_block_header_crc(&mut f, 1120);
    assert_eq!(
        decode_err(&f),
        "corrupt block 1 (file bytes 1120..2176): stored value -1 at offset 300 is not a token id (i32 data must hold 0..=4294967295)"
    );
}

/// Offset of block table entry `i` within the footer.
fn entry(i: usize) -> usize {
    48 + 8 * i
}

fn set_entry(file: &[u8], i: usize, v: u64) -> Vec<u8> {
    edit_footer(file, |f| {
        f[entry(i)..entry(i) + 8].copy_from_slice(&v.to_le_bytes())
    })
}

#[test]
fn block_table_offsets_past_the_end_or_overlapping() {
    let (_, _, file) = base();
    let len = file.len() as u64;
    assert_eq!(
        parse_err(&set_entry(&file, 2, len + 1000)),
        format!(
            "corrupt block file footer: block 3 at byte 3232 overlaps block 2 at byte {}",
            len + 1000
        )
    );
    assert_eq!(
        parse_err(&set_entry(&file, 4, u64::MAX)),
        "corrupt block file footer: block 5 at byte 4720 overlaps block 4 at byte 18446744073709551615"
    );
    assert_eq!(
        parse_err(&set_entry(&file, 5, len + 10)),
        format!(
            "corrupt block file footer: blocks end at byte {} but the footer starts at 4720",
            len + 10
        )
    );
    assert_eq!(
        parse_err(&set_entry(&file, 2, 1130)),
        "corrupt block file footer: block 2 at byte 1130 overlaps block 1 at byte 1120"
    );
    assert_eq!(
        parse_err(&set_entry(&file, 2, 1000)),
        "corrupt block file footer: block 2 at byte 1000 overlaps block 1 at byte 1120"
    );
    assert_eq!(
        parse_err(&set_entry(&file, 0, 0)),
        "corrupt block file footer: first block at byte 0, expected 64"
    );
    // Shifted but not overlapping: the table parses; decoding catches the mismatch.
    let f = set_entry(&file, 2, 2180);
    assert_eq!(
        decode_err(&f),
        "corrupt block 1 (file bytes 1120..2180): payload of 1024 bytes in a 1060-byte block"
    );
}

#[test]
fn footer_crc_mismatch() {
    let (_, _, file) = base();
    let (at, len) = footer_span(&file);
    let stored = u32_at(&file, file.len() - 32 + 16);
    for k in [0, 30, 60, len - 1] {
        let mut f = file.clone();
        f[at + k] ^= 0x80;
        assert_eq!(
            parse_err(&f),
            crc_msg("block file footer", stored, crc32c(&f[at..at + len])),
            "footer byte {k}"
        );
    }
    // The trailer's own crc.
    let mut f = file.clone();
    let t = f.len() - 32;
    f[t + 16] ^= 1;
    assert_eq!(
        parse_err(&f),
        crc_msg(
            "block file trailer",
            u32_at(&f, t + 20),
            crc32c(&f[t..t + 20])
        )
    );
}

/// A footer with the file's real totals and block table but another index.
fn footer_with(file: &[u8], index: DocIndex) -> Vec<u8> {
    let bf = BlockFile::from_bytes(file).unwrap();
    Footer {
        index,
        ..bf.to_footer()
    }
    .encode()
}

#[test]
fn sequence_lengths_that_do_not_sum_to_the_tokens() {
    let (_, _, file) = base();
    let f = replace_footer(&file, &footer_with(&file, DocIndex::single(1000)));
    assert_eq!(
        parse_err(&f),
        "corrupt block file footer: sequences hold 1000 tokens, the file has 1124"
    );
    let mut b = DocIndexBuilder::new();
    b.push_document(1000);
    b.push_document(125);
    let f = replace_footer(&file, &footer_with(&file, b.finish()));
    assert_eq!(
        parse_err(&f),
        "corrupt block file footer: sequence lengths exceed the 1124 tokens"
    );
    // A varint sequence length near u64::MAX cannot overflow the running sum.
    let f = edit_footer(&file, |f| {
        // First sequence length (500, 2 bytes) becomes u64::MAX (10 bytes).
        let s = entry(6);
        f.splice(s..s + 2, [0xFF; 9].into_iter().chain([0x01]));
    });
    assert_eq!(
        parse_err(&f),
        "corrupt block file footer: sequence lengths exceed the 1124 tokens"
    );
}

#[test]
fn other_footer_damage() {
    let (_, _, file) = base();
    // Token count changed: the block count no longer matches.
    let f = edit_footer(&file, |f| f[0..8].copy_from_slice(&2000u64.to_le_bytes()));
    assert_eq!(
        parse_err(&f),
        "corrupt block file footer: 5 blocks for 2000 tokens of 256 per block (expected 8)"
    );
    // Counts larger than the bytes that must hold them.
    let f = edit_footer(&file, |f| {
        f[32..40].copy_from_slice(&1_000_000u64.to_le_bytes())
    });
    assert_eq!(
        parse_err(&f),
        "corrupt block file footer: 5 blocks, 1000000 sequences and 3 documents do not fit in 105 bytes"
    );
    let f = edit_footer(&file, |f| {
        f[40..48].copy_from_slice(&u64::MAX.to_le_bytes())
    });
    assert_eq!(
        parse_err(&f),
        "corrupt block file footer: 5 blocks, 4 sequences and 18446744073709551615 documents do not fit in 105 bytes"
    );
    // Bytes after the document index.
    let f = edit_footer(&file, |f| f.extend_from_slice(&[0, 0]));
    assert_eq!(
        parse_err(&f),
        "corrupt block file footer: 2 unexpected trailing bytes"
    );
    // One document fewer: the last varint is left over.
    let f = edit_footer(&file, |f| f[40..48].copy_from_slice(&2u64.to_le_bytes()));
    assert_eq!(
        parse_err(&f),
        "corrupt block file footer: 1 unexpected trailing bytes"
    );
    // Documents that cover more sequences than there are.
    let f = edit_footer(&file, |f| {
        let last = f.len() - 1;
        f[last] = 5;
    });
    assert_eq!(
        parse_err(&f),
        "invalid document index: document indices end at sequence 8 but there are 4 sequences"
    );
    // A varint cut off by the end of the footer.
    let f = edit_footer(&file, |f| {
        let last = f.len() - 1;
        f[last] = 0x81;
    });
    assert_eq!(
        parse_err(&f),
        "corrupt block file footer: varint runs past the end"
    );
    // A footer too short for its fixed part (and a file just long enough to hold it).
    let mut f = file[..HEADER_LEN].to_vec();
    f.extend_from_slice(&[0; 46]);
    f.extend_from_slice(&[7; 10]);
    let mut t = [0u8; 32];
    t[0..8].copy_from_slice(&110u64.to_le_bytes());
    t[8..16].copy_from_slice(&10u64.to_le_bytes());
    t[16..20].copy_from_slice(&crc32c(&[7; 10]).to_le_bytes());
    let c = crc32c(&t[..20]);
    t[20..24].copy_from_slice(&c.to_le_bytes());
    t[24..32].copy_from_slice(b"DQBLOCKS");
    f.extend_from_slice(&t);
    assert_eq!(f.len(), 152);
    assert_eq!(
        parse_err(&f),
        "truncated block file footer: needs 48 bytes but has 10"
    );
}

#[test]
fn footer_offset_before_the_first_block() {
    let (_, _, file) = base();
    let mut f = file.clone();
    let t = f.len() - 32;
    let end = (t as u64).to_le_bytes();
    // Footer claimed to start at byte 10 and run to the trailer.
    f[t..t + 8].copy_from_slice(&10u64.to_le_bytes());
    f[t + 8..t + 16].copy_from_slice(&(t as u64 - 10).to_le_bytes());
    let c = crc32c(&f[t..t + 20]);
    f[t + 20..t + 24].copy_from_slice(&c.to_le_bytes());
    assert_eq!(
        parse_err(&f),
        format!(
            "corrupt block file trailer: footer at 10+{} does not end where the trailer starts ({})",
            t - 10,
            u64::from_le_bytes(end)
        )
    );
    // Offset + length overflowing u64.
    f[t..t + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    let c = crc32c(&f[t..t + 20]);
    f[t + 20..t + 24].copy_from_slice(&c.to_le_bytes());
    assert_eq!(
        parse_err(&f),
        format!(
            "corrupt block file trailer: footer at 18446744073709551615+{} does not end where the trailer starts ({t})",
            t - 10
        )
    );
}

/// Found by `fuzz/fuzz_targets/block_file.rs` (checksums recomputed as the harness does):
/// a block header claiming a first token near `u64::MAX` overflowed while the error message
/// was formatted, a panic instead of an error.
#[test]
fn fuzz_regression_first_token_overflow() {
    let file = include_bytes!("../data/fuzz-crash-first-token-overflow.dqb");
    let bf = BlockFile::from_bytes(file).unwrap();
    assert_eq!(
        bf.decode_all(file).unwrap_err().to_string(),
        "corrupt block 0 (file bytes 64..2144): holds tokens \
         18446744073709551613..18446744073709551615 but the block table says 0..256"
    );
}
