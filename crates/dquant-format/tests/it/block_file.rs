//! Block file round trips over every codec at block boundaries, split pushes, write summaries,
//! out-of-range tokens, random access, compression fallback and the document index.

use crate::common;

use common::*;
use dquant_codec::{Codec, Compression, Decoder, Width};
use dquant_format::block::{
    block_tokens_for, BlockFile, BlockFileWriter, BlockHeader, FileHeader, BLOCK_HEADER_LEN,
    HEADER_LEN,
};
use dquant_format::{DocIndex, DocIndexBuilder, FormatError};

/// Stream lengths at the block boundary cases for block size `bt`.
fn boundary_lengths(bt: usize) -> [usize; 5] {
    [0, 1, bt, bt + 1, 3 * bt + 77]
}

/// Everything a well-formed file must satisfy, given what was written into it.
fn check_file(codec: Codec, bt: u32, tokens: &[u32], index: &DocIndex, file: &[u8]) {
    let ctx = format!("{codec}, {bt} tokens per block, {} tokens", tokens.len());
    let bf = BlockFile::from_bytes(file).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    assert_eq!(
        bf.header,
        FileHeader {
            codec,
            block_tokens: bt,
            vocab_size: 50257
        },
        "{ctx}"
    );
    let n = tokens.len() as u64;
    assert_eq!(bf.tokens(), n, "{ctx}");
    assert_eq!(bf.blocks() as u64, n.div_ceil(bt as u64), "{ctx}");
    assert_eq!(bf.index, *index, "{ctx}");
    assert_eq!(
        bf.footer.max_token,
        tokens.iter().copied().max().unwrap_or(0),
        "{ctx}"
    );
    assert_eq!(bf.content_checksum(), content_of(tokens, index), "{ctx}");
    assert_eq!(bf.decode_all(file).unwrap(), tokens, "{ctx}");

    // Block by block, each from exactly its own bytes, with a fresh and a reused decoder.
    let mut dec = Decoder::new();
    let mut next_byte = HEADER_LEN as u64;
    for i in 0..bf.blocks() {
        let t = bf.block_tokens(i);
        assert_eq!(t.start, i as u64 * bt as u64, "{ctx}");
        let b = bf.byte_range(i..i + 1);
        assert_eq!(b.start, next_byte, "{ctx}: blocks are contiguous");
        next_byte = b.end;
        let bytes = &file[b.start as usize..b.end as usize];
        let h = BlockHeader::parse(bytes, "block").unwrap();
        assert_eq!(h.first_token, t.start, "{ctx}");
        assert_eq!(h.tokens as u64, t.end - t.start, "{ctx}");
        assert_eq!(
            h.payload_len as usize,
            bytes.len() - BLOCK_HEADER_LEN,
            "{ctx}"
        );
        assert!(
            h.codec == codec || h.codec == Codec::plain(codec.width),
            "{ctx}: block {i} stored as {}",
            h.codec
        );
        if h.codec.compression == Compression::None {
            assert_eq!(
                h.payload_len as usize,
                codec.raw_len(h.tokens as usize),
                "{ctx}"
            );
        } else {
            assert!(
                (h.payload_len as usize) < codec.raw_len(h.tokens as usize),
                "{ctx}: a compressed block must be smaller than its plain form"
            );
        }
        let mut out = vec![u32::MAX; (t.end - t.start) as usize];
        bf.decode_block(i, bytes, &mut dec, &mut out).unwrap();
        assert_eq!(out, tokens[t.start as usize..t.end as usize], "{ctx}");
        let mut out2 = vec![0; out.len()];
        bf.decode_block(i, bytes, &mut Decoder::new(), &mut out2)
            .unwrap();
        assert_eq!(out2, out, "{ctx}");
    }
    assert_eq!(next_byte, common::footer_span(file).0 as u64, "{ctx}");
}

#[test]
fn every_codec_round_trips_at_block_boundaries() {
    let mut files = 0;
    let mut rng = Rng::new(1);
    for width in all_widths() {
        for compression in all_compressions() {
            let codec = Codec::new(width, compression);
            if !holds_its_width(codec) {
                continue;
            }
            for bt in [256u32, 512] {
                for n in boundary_lengths(bt as usize) {
                    let tokens = tokens_for(width, n, bt as u64);
                    let index = random_index(&mut rng, n as u64);
                    let (file, summary) = write_chunked(codec, bt, &tokens, &index, &[], false);
                    let ctx = format!("{codec}, bt {bt}, {n} tokens");
                    assert_eq!(summary.tokens, n as u64, "{ctx}");
                    assert_eq!(summary.blocks, (n as u64).div_ceil(bt as u64), "{ctx}");
                    assert_eq!(summary.bytes, file.len() as u64, "{ctx}");
                    assert_eq!(
                        summary.max_token,
                        tokens.iter().copied().max().unwrap_or(0),
                        "{ctx}"
                    );
                    assert_eq!(summary.content, content_of(&tokens, &index), "{ctx}");
                    check_file(codec, bt, &tokens, &index, &file);
                    assert_eq!(
                        BlockFile::from_bytes(&file).unwrap().content_checksum(),
                        summary.content,
                        "{ctx}"
                    );

                    // The same bytes however the tokens are pushed, and with verification.
                    for chunks in [&[1usize][..], &[3, 255, 1, 256, 257, 100, 511, 2]] {
                        let (again, s2) = write_chunked(codec, bt, &tokens, &index, chunks, true);
                        assert!(
                            again == file,
                            "{ctx}: pushes of {chunks:?} changed the bytes"
                        );
                        assert_eq!(s2, summary, "{ctx}");
                    }
                    files += 1;
                }
            }
        }
    }
    // rank+zstd with the 27 widths whose ids are below 2^24 (not u32, i32, i64, bits:25..=32).
    assert_eq!(files, (38 * 5 + 27) * 2 * 5);
}

#[test]
fn the_empty_file_is_152_bytes_and_decodes_to_nothing() {
    let ix = DocIndex::single(0);
    let (file, s) = write_chunked("u16".parse().unwrap(), 256, &[], &ix, &[], false);
    assert_eq!(file.len(), 152);
    assert_eq!((s.tokens, s.blocks, s.bytes, s.max_token), (0, 0, 152, 0));
    let bf = BlockFile::from_bytes(&file).unwrap();
    assert_eq!(bf.blocks(), 0);
    assert_eq!(bf.decode_all(&file).unwrap(), Vec::<u32>::new());
    assert_eq!(bf.blocks_covering(0..10), 0..0);
}

#[test]
fn known_sizes_of_a_small_file() {
    // 600 u16 tokens in blocks of 256: blocks of 256, 256 and 88 tokens.
    let tokens: Vec<u32> = (0..600).map(|i| i * 101 % 65536).collect();
    let ix = DocIndex::single(600);
    let (file, s) = write_chunked("u16".parse().unwrap(), 256, &tokens, &ix, &[], false);
    let bf = BlockFile::from_bytes(&file).unwrap();
    assert_eq!(bf.footer.block_offsets, vec![64, 608, 1152, 1360]);
    // Footer: 48 fixed + 4 offsets + 1 sequence length (varint 600 = 2 bytes) + 1 document.
    assert_eq!(common::footer_span(&file), (1360, 48 + 32 + 2 + 1));
    assert_eq!(s.bytes, 1360 + 83 + 32);
    assert_eq!(bf.block_tokens(2), 512..600);
    assert_eq!(bf.blocks_covering(255..257), 0..2);
    assert_eq!(bf.blocks_covering(256..512), 1..2);
    assert_eq!(bf.blocks_covering(599..10_000), 2..3);
    assert_eq!(bf.blocks_covering(600..700), 0..0);
    assert_eq!(bf.byte_range(0..3), 64..1360);
}

#[test]
fn block_tokens_for_rounds_to_whole_pack_groups() {
    assert_eq!(block_tokens_for(Width::U16, 1 << 20), 524_288);
    assert_eq!(block_tokens_for(Width::Bits(17), 1 << 20), 493_312);
    assert_eq!(block_tokens_for(Width::I64, 1 << 20), 131_072);
    assert_eq!(block_tokens_for(Width::I64, 100), 256);
    assert_eq!(
        block_tokens_for(Width::Bits(1), usize::MAX / 16),
        4_294_967_040
    );
}

#[test]
fn writer_rejects_bad_block_sizes() {
    for bt in [0, 100, 257] {
        let h = FileHeader {
            codec: "u16".parse().unwrap(),
            block_tokens: bt,
            vocab_size: 0,
        };
        let e = BlockFileWriter::new(h, false).err().unwrap();
        assert_eq!(
            e.to_string(),
            format!(
                "invalid block file settings: block size {bt} tokens is not a positive multiple of 256"
            )
        );
    }
}

#[test]
fn finish_rejects_an_index_of_the_wrong_size() {
    let h = FileHeader {
        codec: "u16".parse().unwrap(),
        block_tokens: 256,
        vocab_size: 0,
    };
    let (mut w, _) = BlockFileWriter::new(h, false).unwrap();
    let mut out = Vec::new();
    w.push(&[1; 300], &mut out).unwrap();
    let e = w.finish(&DocIndex::single(299), &mut out).unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid document index: the index describes 299 tokens but 300 were written"
    );
}

/// A token that does not fit, at absolute offset 3 * 256 + 17 (in block 3), fails with that
/// offset whatever the push pattern, and nothing of block 3 is emitted.
#[test]
fn out_of_range_tokens_name_their_absolute_offset() {
    let cases: [(&str, u32, &str); 6] = [
        (
            "u16",
            70_000,
            "token 70000 at offset 785 does not fit in u16 (max 65535); it needs 17 bits: use bits:17 or wider",
        ),
        (
            "u16+zstd:3",
            70_000,
            "token 70000 at offset 785 does not fit in u16 (max 65535); it needs 17 bits: use bits:17 or wider",
        ),
        (
            "u8+lz4",
            256,
            "token 256 at offset 785 does not fit in u8 (max 255); it needs 9 bits: use bits:9 or wider",
        ),
        (
            "bits:12",
            4096,
            "token 4096 at offset 785 does not fit in bits:12 (max 4095); it needs 13 bits: use bits:13 or wider",
        ),
        (
            "bits:12+zstd:1",
            1 << 20,
            "token 1048576 at offset 785 does not fit in bits:12 (max 4095); it needs 21 bits: use bits:21 or wider",
        ),
        (
            "i32",
            1 << 31,
            "token 2147483648 at offset 785 does not fit in i32 (max 2147483647); it needs 32 bits: use bits:32 or wider",
        ),
    ];
    let bad_at = 3 * 256 + 17;
    for (codec, bad, msg) in cases {
        let codec: Codec = codec.parse().unwrap();
        for n in [5 * 256 + 9, 3 * 256 + 50] {
            let mut tokens = tokens_for(Width::Bits(8), n, 7);
            tokens[bad_at] = bad;
            // The blocks before the bad one are exactly those of a file of the good prefix.
            let prefix = write(codec, 256, &tokens[..768], &DocIndex::single(768));
            let prefix_blocks = &prefix[HEADER_LEN..common::footer_span(&prefix).0];
            for chunks in [&[][..], &[1], &[100, 3, 700]] {
                let h = FileHeader {
                    codec,
                    block_tokens: 256,
                    vocab_size: 0,
                };
                let (mut w, _) = BlockFileWriter::new(h, true).unwrap();
                let mut out = Vec::new();
                let mut rest = &tokens[..];
                let mut sizes = chunks.iter().cycle();
                let mut err: Option<FormatError> = None;
                while !rest.is_empty() {
                    let k = sizes.next().map_or(rest.len(), |&k| k.min(rest.len()));
                    if let Err(e) = w.push(&rest[..k], &mut out) {
                        err = Some(e);
                        break;
                    }
                    rest = &rest[k..];
                }
                let e = match err {
                    Some(e) => e,
                    // The bad token is in the last, partial block: `finish` encodes it.
                    None => w.finish(&DocIndex::single(n as u64), &mut out).unwrap_err(),
                };
                let ctx = format!("{codec}, {n} tokens, chunks {chunks:?}");
                assert_eq!(e.to_string(), msg, "{ctx}");
                assert!(
                    out == prefix_blocks,
                    "{ctx}: bytes emitted before the error"
                );
            }
        }
    }
}

/// Tokens for the random access tests: 20 full blocks and a tail.
fn access_file(codec: Codec) -> (Vec<u32>, DocIndex, Vec<u8>) {
    let n = 20 * 256 + 123;
    let tokens = tokens_for(Width::Bits(17), n, 99);
    let ix = random_index(&mut Rng::new(5), n as u64);
    let file = write(codec, 256, &tokens, &ix);
    (tokens, ix, file)
}

/// Decodes tokens `[a, b)` from `fetched`, which holds exactly the file bytes of the blocks
/// that cover the range, starting at file offset `base`.
fn decode_range(bf: &BlockFile, fetched: &[u8], base: u64, a: u64, b: u64) -> Vec<u32> {
    let blocks = bf.blocks_covering(a..b);
    let first = bf.block_tokens(blocks.start).start;
    let mut out = Vec::new();
    let mut dec = Decoder::new();
    for i in blocks {
        let r = bf.byte_range(i..i + 1);
        let t = bf.block_tokens(i);
        let mut buf = vec![0; (t.end - t.start) as usize];
        bf.decode_block(
            i,
            &fetched[(r.start - base) as usize..(r.end - base) as usize],
            &mut dec,
            &mut buf,
        )
        .unwrap();
        out.extend_from_slice(&buf);
    }
    out[(a - first) as usize..(b - first) as usize].to_vec()
}

#[test]
fn random_ranges_read_only_their_blocks() {
    for codec in ["u24", "bits:17+zstd:3", "u32+lz4", "i64+zstd:1", "bits:18"] {
        let codec: Codec = codec.parse().unwrap();
        let (tokens, _, file) = access_file(codec);
        let bf = BlockFile::from_bytes(&file).unwrap();
        let n = tokens.len() as u64;
        let mut rng = Rng::new(11);
        let mut ranges: Vec<(u64, u64)> = vec![
            (0, 1),
            (0, n),
            (255, 257),
            (256, 512),
            (n - 1, n),
            (n - 123, n),
            (20 * 256 - 1, 20 * 256 + 1),
        ];
        for _ in 0..150 {
            let a = rng.below(n);
            let short = rng.below(2) == 0;
            let len = 1 + rng.below(if short { 300 } else { n - a });
            ranges.push((a, (a + len).min(n)));
        }
        for (a, b) in ranges {
            let blocks = bf.blocks_covering(a..b);
            assert!(!blocks.is_empty());
            assert_eq!(blocks.start as u64, a / 256);
            assert_eq!(blocks.end as u64, b.div_ceil(256));
            let br = bf.byte_range(blocks.clone());
            // One contiguous range: the blocks' own ranges tile it exactly.
            let mut at = br.start;
            for i in blocks.clone() {
                let r = bf.byte_range(i..i + 1);
                assert_eq!(r.start, at);
                at = r.end;
            }
            assert_eq!(at, br.end);

            // Only the byte range, as a ranged GET would return it.
            let fetched = &file[br.start as usize..br.end as usize];
            let got = decode_range(&bf, fetched, br.start, a, b);
            assert!(got == tokens[a as usize..b as usize], "{codec} {a}..{b}");

            // The whole file with every byte outside the range garbled: never read.
            let mut garbled = file.clone();
            for (k, byte) in garbled.iter_mut().enumerate() {
                if !(br.start..br.end).contains(&(k as u64)) {
                    *byte = (k as u8).wrapping_mul(31) ^ 0xA5;
                }
            }
            let got = decode_range(&bf, &garbled, 0, a, b);
            assert!(got == tokens[a as usize..b as usize], "{codec} {a}..{b}");
        }
        // Ranges that are empty or past the end cover nothing; ranges running past the end
        // are clamped.
        assert_eq!(bf.blocks_covering(7..7), 0..0);
        assert_eq!(
            bf.blocks_covering(std::ops::Range { start: 9, end: 3 }),
            0..0
        );
        assert_eq!(bf.blocks_covering(n..n + 100), 0..0);
        assert_eq!(bf.blocks_covering(n - 1..u64::MAX), 20..21);
    }
}

#[test]
fn incompressible_blocks_are_stored_plain() {
    // Block 0: high-entropy u32 tokens (zstd cannot shrink them); block 1: a run of one
    // token (compresses to a few bytes); block 2 (tail): random again.
    let mut rng = Rng::new(3);
    let mut tokens: Vec<u32> = (0..256).map(|_| rng.next_u32()).collect();
    tokens.extend(std::iter::repeat_n(42, 256));
    tokens.extend((0..100).map(|_| rng.next_u32()));
    for codec in ["u32+zstd:3", "u32+zstd:1", "u32+lz4"] {
        let codec: Codec = codec.parse().unwrap();
        let ix = DocIndex::single(tokens.len() as u64);
        let (file, s) = write_chunked(codec, 256, &tokens, &ix, &[], true);
        let bf = BlockFile::from_bytes(&file).unwrap();
        assert_eq!(
            bf.header.codec, codec,
            "the header keeps the requested codec"
        );
        let plain = Codec::plain(Width::U32);
        let expect = [plain, codec, plain];
        for (i, want) in expect.into_iter().enumerate() {
            let r = bf.byte_range(i..i + 1);
            let h = BlockHeader::parse(&file[r.start as usize..], "block").unwrap();
            assert_eq!(h.codec, want, "{codec} block {i}");
            // The codec field of the block header, byte for byte.
            assert_eq!(
                file[r.start as usize + 4..r.start as usize + 8],
                want.to_bytes()
            );
        }
        assert_eq!(
            bf.byte_range(0..1),
            64..64 + 32 + 1024,
            "block 0 is plain u32"
        );
        assert!(bf.byte_range(1..2).end - bf.byte_range(1..2).start < 100);
        assert_eq!(bf.decode_all(&file).unwrap(), tokens);
        assert_eq!(s.content, content_of(&tokens, &ix));
        check_file(codec, 256, &tokens, &ix, &file);
    }
}

#[test]
fn document_index_survives_the_footer() {
    let mut shapes: Vec<DocIndex> = Vec::new();
    // One sequence per document.
    let mut b = DocIndexBuilder::new();
    for len in [100, 1, 300, 599] {
        b.push_document(len);
    }
    shapes.push(b.finish());
    // Multi-sequence documents, empty documents (no sequences) at the start, middle and end,
    // and empty sequences.
    let mut b = DocIndexBuilder::new();
    b.end_document();
    b.push_sequence(10);
    b.push_sequence(0);
    b.push_sequence(500);
    b.end_document();
    b.end_document();
    b.push_sequence(0);
    b.end_document();
    b.push_sequence(490);
    b.push_sequence(0);
    b.end_document();
    b.end_document();
    shapes.push(b.finish());
    // Sequences left open when the builder finishes form a last document (before the fix,
    // the writer stored an index its own reader rejected).
    let mut b = DocIndexBuilder::new();
    b.push_document(700);
    b.push_sequence(200);
    b.push_sequence(100);
    let open = b.finish();
    assert_eq!(open.doc_seq(), &[0, 1, 3]);
    assert_eq!(open.document(1), 700..1000);
    shapes.push(open);
    // One token per sequence, a document of all of them.
    let mut b = DocIndexBuilder::new();
    for _ in 0..1000 {
        b.push_sequence(1);
    }
    b.end_document();
    shapes.push(b.finish());
    // Many random ones.
    let mut rng = Rng::new(77);
    for _ in 0..40 {
        shapes.push(random_index(&mut rng, 1000));
    }

    let tokens = tokens_for(Width::U16, 1000, 1);
    for ix in &shapes {
        assert_eq!(ix.tokens(), 1000);
        for codec in ["u16", "bits:16+zstd:1"] {
            let codec: Codec = codec.parse().unwrap();
            let (file, s) = write_chunked(codec, 256, &tokens, ix, &[], false);
            let bf = BlockFile::from_bytes(&file).unwrap();
            assert_eq!(bf.index, *ix);
            assert_eq!(bf.index.seq_offsets(), ix.seq_offsets());
            assert_eq!(bf.index.doc_seq(), ix.doc_seq());
            for d in 0..ix.documents() {
                assert_eq!(bf.index.document(d), ix.document(d));
            }
            assert_eq!(bf.content_checksum(), s.content);
            assert_eq!(s.content, content_of(&tokens, ix));
        }
    }
    // The index is part of the content checksum; the tokens hash is not.
    let a = content_of(&tokens, &shapes[0]);
    let b = content_of(&tokens, &shapes[1]);
    assert_eq!(a.tokens, b.tokens);
    assert_ne!(a.index, b.index);
}

#[test]
fn same_content_same_checksum_across_codecs() {
    let tokens = tokens_for(Width::Bits(16), 3000, 4);
    let ix = random_index(&mut Rng::new(8), 3000);
    let want = content_of(&tokens, &ix);
    for codec in ["u16", "u24+zstd:3", "bits:16+lz4", "i64", "bits:20+zstd:1"] {
        for bt in [256, 512, 1024] {
            let file = write(codec.parse().unwrap(), bt, &tokens, &ix);
            let bf = BlockFile::from_bytes(&file).unwrap();
            assert_eq!(bf.content_checksum(), want, "{codec} bt {bt}");
            assert_eq!(
                bf.content_checksum().to_string(),
                format!("xxh3:{:016x}-{:016x}", want.tokens, want.index)
            );
        }
    }
}
