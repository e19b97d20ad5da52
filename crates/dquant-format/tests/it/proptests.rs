//! Property tests: the parsers never panic on arbitrary or damaged bytes, and random token
//! streams with random document splits round-trip through the block writer.

use crate::common;

use common::Rng;
use common::*;
use dquant_codec::{Codec, Width};
use dquant_format::block::{BlockFile, BLOCK_HEADER_LEN, HEADER_LEN, TRAILER_LEN};
use dquant_format::megatron::{
    check_ends, encode_idx, parse_idx, IdxEnds, IdxHeader, HEADER_LEN as HEADER_LEN_IDX, MAGIC,
};
use proptest::prelude::*;

/// Decoding a parsed file allocates its token count up front; damaged headers can claim
/// billions of tokens, so only decode what a test can afford (the parse itself is bounded).
const DECODE_LIMIT: u64 = 1 << 22;

/// The tokens an `.idx` describes as a lazy open sees them: its header and the ends of its
/// arrays only.
fn lazy_tokens(b: &[u8]) -> Result<u64, dquant_format::FormatError> {
    let h = IdxHeader::parse(&b[..b.len().min(HEADER_LEN_IDX)], b.len() as u64)?;
    let u64_at =
        |off: u64| u64::from_le_bytes(b[off as usize..off as usize + 8].try_into().unwrap());
    let last = h.sequences.saturating_sub(1);
    let ends = IdxEnds {
        first_pointer: if h.sequences == 0 {
            0
        } else {
            u64_at(h.pointer_at(0))
        },
        last_pointer: if h.sequences == 0 {
            0
        } else {
            u64_at(h.pointer_at(last))
        },
        last_length: if h.sequences == 0 {
            0
        } else {
            let at = h.length_at(last) as usize;
            i32::from_le_bytes(b[at..at + 4].try_into().unwrap())
        },
        first_doc_index: u64_at(h.doc_index_at(0)),
        last_doc_index: u64_at(h.doc_index_at(h.doc_indices - 1)),
    };
    check_ends(&h, &ends)
}

fn check_idx(bytes: &[u8]) {
    let lazy = lazy_tokens(bytes);
    if let Ok(p) = parse_idx(bytes) {
        let again = encode_idx(p.dtype, &p.index).expect("a parsed index encodes");
        let q = parse_idx(&again).expect("an encoded index parses");
        assert_eq!(q.index, p.index);
        assert_eq!(q.dtype, p.dtype);
        // What the whole parse accepts, the lazy open accepts, with the same tokens.
        assert_eq!(lazy.expect("a lazy open of a valid .idx"), p.index.tokens());
    }
}

fn check_block_file(bytes: &[u8]) {
    if let Ok(bf) = BlockFile::from_bytes(bytes) {
        if bf.tokens() <= DECODE_LIMIT {
            let _ = bf.decode_all(bytes);
        }
    }
}

/// A valid block file to damage, chosen by `seed`.
fn valid_file(seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let codecs = [
        "u16",
        "bits:13+zstd:1",
        "u24+lz4",
        "i32",
        "bits:5",
        "i64+zstd:3",
    ];
    let codec: Codec = codecs[rng.below(codecs.len() as u64) as usize]
        .parse()
        .unwrap();
    let n = rng.below(1500) as usize;
    let tokens = tokens_for(
        Width::Bits(codec.width.bits_per_token().min(13) as u8),
        n,
        seed,
    );
    let ix = random_index(&mut rng, n as u64);
    write(codec, 256, &tokens, &ix)
}

/// Recomputes every checksum of a damaged file where the undamaged layout had them, so that
/// the damage reaches the checks behind the checksums.
fn fix_checksums(file: &mut [u8], layout: &[u8]) {
    let bf = BlockFile::from_bytes(layout).unwrap();
    if file.len() != layout.len() {
        return;
    }
    fix_file_header_crc(file);
    for i in 0..bf.blocks() {
        let r = bf.byte_range(i..i + 1);
        let (s, e) = (r.start as usize, r.end as usize);
        let c = crc32c(&file[s + BLOCK_HEADER_LEN..e]);
        file[s + 24..s + 28].copy_from_slice(&c.to_le_bytes());
        fix_block_header_crc(file, s);
    }
    let t = file.len() - TRAILER_LEN;
    let (fs, fl) = footer_span(layout);
    let c = crc32c(&file[fs..fs + fl]);
    file[t + 16..t + 20].copy_from_slice(&c.to_le_bytes());
    let c = crc32c(&file[t..t + 20]);
    file[t + 20..t + 24].copy_from_slice(&c.to_le_bytes());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn parse_idx_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        check_idx(&bytes);
    }

    /// Bytes past a valid magic and version, with small counts, so the arrays are reached.
    #[test]
    fn parse_idx_never_panics_past_the_header(
        code in 0u8..10,
        s in 0u64..6,
        d in 0u64..6,
        body in proptest::collection::vec(any::<u8>(), 0..200),
        small in proptest::collection::vec(0u8..4, 0..200),
        use_small in any::<bool>(),
    ) {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&1u64.to_le_bytes());
        b.push(code);
        b.extend_from_slice(&s.to_le_bytes());
        b.extend_from_slice(&d.to_le_bytes());
        // Mostly-zero bytes make valid-looking lengths, pointers and document indices.
        b.extend(if use_small { small } else { body });
        check_idx(&b);
    }

    #[test]
    fn index_round_trips_through_idx(seed in any::<u64>(), n in 0u64..5000, code in 1u8..=8) {
        let ix = random_index(&mut Rng::new(seed), n);
        let dt = dquant_format::DType::from_code(code).unwrap();
        let bytes = encode_idx(dt, &ix).unwrap();
        let p = parse_idx(&bytes).unwrap();
        prop_assert_eq!(lazy_tokens(&bytes).unwrap(), ix.tokens());
        prop_assert_eq!(p.index, ix);
        prop_assert_eq!(p.dtype, dt);
    }

    #[test]
    fn block_file_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        check_block_file(&bytes);
    }

    #[test]
    fn block_file_never_panics_on_damaged_files(
        seed in 0u64..64,
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        fix in any::<bool>(),
        cut in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let good = valid_file(seed);
        let mut f = good.clone();
        for (at, v) in edits {
            let i = at.index(f.len());
            f[i] = v;
        }
        if fix {
            fix_checksums(&mut f, &good);
        }
        if let Some(c) = cut {
            f.truncate(c.index(f.len()));
        }
        check_block_file(&f);
    }

    #[test]
    fn block_file_with_damaged_header_fields(seed in 0u64..64, field in 0usize..8, v in any::<u64>()) {
        // One header, block-header or footer field overwritten with any value, all
        // checksums fixed: the semantic checks, not the crcs, must catch it.
        let good = valid_file(seed);
        let mut f = good.clone();
        let (fs, _) = footer_span(&good);
        let at = match field {
            0 => 12,               // header codec
            1 => 16,               // header block_tokens
            2 => HEADER_LEN + 8,   // block 0 tokens / payload_len
            3 => HEADER_LEN + 16,  // block 0 first_token
            4 => fs,               // footer token_count
            5 => fs + 24,          // footer block count
            6 => fs + 32,          // footer sequence / document counts
            _ => fs + 48,          // block table
        };
        let end = (at + 8).min(f.len() - TRAILER_LEN);
        let bytes = v.to_le_bytes();
        f[at..end].copy_from_slice(&bytes[..end - at]);
        fix_checksums(&mut f, &good);
        check_block_file(&f);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn random_streams_and_documents_round_trip(
        seed in any::<u64>(),
        bits in 1u8..=32,
        n in 0usize..2500,
        comp in 0usize..6,
        aligned in any::<bool>(),
        bt in prop::sample::select(vec![256u32, 512, 768]),
        chunks in proptest::collection::vec(1usize..700, 0..6),
    ) {
        let compression = all_compressions()[comp];
        // rank+zstd takes ids below 2^24.
        let bits = if compression.needs_rank_table() { bits.min(24) } else { bits };
        let tokens = tokens_for(Width::Bits(bits), n, seed);
        let width = Width::narrowest(Width::Bits(bits).max_token(), aligned);
        let codec = Codec::new(width, compression);
        let ix = random_index(&mut Rng::new(seed ^ 1), n as u64);
        let (file, s) = write_chunked(codec, bt, &tokens, &ix, &chunks, true);
        prop_assert!(file == write(codec, bt, &tokens, &ix), "push pattern changed the bytes");
        prop_assert_eq!(s.bytes, file.len() as u64);
        prop_assert_eq!(s.content, content_of(&tokens, &ix));
        let bf = BlockFile::from_bytes(&file).unwrap();
        prop_assert_eq!(bf.content_checksum(), s.content);
        prop_assert_eq!(&bf.index, &ix);
        // The checksum's index half straight from the footer's index bytes, as a reader
        // that never builds the index finds it.
        let footer_end = file.len() - TRAILER_LEN;
        let index_at = bf.footer.block_offsets[bf.blocks()] as usize + bf.footer.encoded_len();
        prop_assert_eq!(
            bf.footer.index_checksum(&file[index_at..footer_end]).unwrap(),
            s.content.index
        );
        prop_assert!(bf.decode_all(&file).unwrap() == tokens);
        // A random range through the block table.
        if n > 0 {
            let mut rng = Rng::new(seed);
            let a = rng.below(n as u64);
            let b = a + 1 + rng.below(n as u64 - a);
            let blocks = bf.blocks_covering(a..b);
            let first = bf.block_tokens(blocks.start).start;
            let br = bf.byte_range(blocks.clone());
            let fetched = &file[br.start as usize..br.end as usize];
            let mut got = Vec::new();
            let mut dec = dquant_codec::Decoder::new();
            for i in blocks {
                let r = bf.byte_range(i..i + 1);
                let t = bf.block_tokens(i);
                let mut out = vec![0; (t.end - t.start) as usize];
                bf.decode_block(
                    i,
                    &fetched[(r.start - br.start) as usize..(r.end - br.start) as usize],
                    &mut dec,
                    &mut out,
                ).unwrap();
                got.extend(out);
            }
            prop_assert!(got[(a - first) as usize..(b - first) as usize] == tokens[a as usize..b as usize]);
        }
    }
}

/// A chunk sums sidecar that parses re-encodes to the very bytes it came from.
fn check_sums(bytes: &[u8]) {
    use dquant_format::chunk_sums::ChunkSums;
    if let Ok(s) = ChunkSums::parse(bytes) {
        assert_eq!(s.encode(), bytes);
        assert_eq!(s.chunks(), s.data_len().div_ceil(u64::from(s.chunk())));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn chunk_sums_parse_never_panics_on_arbitrary_bytes(
        bytes in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        check_sums(&bytes);
    }

    /// A valid sidecar with bytes changed: refused (the trailer crc covers everything), or,
    /// when a change keeps every check, the same sidecar again.
    #[test]
    fn chunk_sums_with_changed_bytes_never_panic(
        len in 0usize..40_000,
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
    ) {
        use dquant_format::chunk_sums::{ChunkSums, MIN_CHUNK};
        let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let mut bytes = ChunkSums::of(&data, MIN_CHUNK).unwrap().encode();
        for (at, v) in edits {
            let n = bytes.len();
            bytes[at % n] = v;
        }
        check_sums(&bytes);
    }
}
