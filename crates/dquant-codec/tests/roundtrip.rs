//! Property tests: every codec round-trips at every width and length class, and out-of-range
//! input fails with the exact error.

use dquant_codec::{Codec, CodecError, Compression, Decoder, Encoder, RankTable, Width};
use proptest::prelude::*;

fn all_widths() -> Vec<Width> {
    let mut w = Width::PLAIN.to_vec();
    w.extend((1..=32).map(Width::Bits));
    w
}

const COMPRESSIONS: [Compression; 7] = [
    Compression::None,
    Compression::Zstd(1),
    Compression::Zstd(3),
    Compression::Lz4,
    // The default high-compression parser and the optimal one (levels 10-12) write different
    // streams; one decoder reads both.
    Compression::Lz4Hc(9),
    Compression::Lz4Hc(12),
    // The wire's stream codec (one payload a fresh stream here): ids in its byte code, which
    // holds ids below 2^29 + 2^21 + 2^14 + 128.
    Compression::Stream(3),
];

/// Whether `width`'s largest id fits `c` (the stream codec's byte code stops short of 2^32).
fn fits(width: Width, c: Compression) -> bool {
    !c.is_stream() || width.max_token() < (1 << 29)
}

/// Lengths around the bit-packing group (256) and the range-check chunk (4096).
const LENGTHS: [usize; 10] = [0, 1, 2, 255, 256, 257, 4095, 4096, 4097, 10_000];

fn round_trip(codec: Codec, tokens: &[u32]) {
    let mut enc = Encoder::new(codec).unwrap();
    let mut buf = Vec::new();
    let n = enc.encode(tokens, &mut buf).unwrap();
    assert_eq!(n, buf.len());
    if codec.compression == Compression::None {
        assert_eq!(n, codec.width.encoded_len(tokens.len()), "{codec}");
    }
    let mut out = vec![0xDEAD_BEEF; tokens.len()];
    Decoder::new().decode(codec, &buf, &mut out).unwrap();
    assert_eq!(out, tokens, "{codec} n={}", tokens.len());
}

/// Deterministic pseudo-random tokens that use the full width (including the maximum).
fn tokens_for(width: Width, n: usize, seed: u64) -> Vec<u32> {
    let max = width.max_token() as u64;
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if i % 97 == 3 {
                max as u32
            } else {
                (x % (max + 1)) as u32
            }
        })
        .collect()
}

#[test]
fn every_width_and_compression_round_trips_at_boundary_lengths() {
    for w in all_widths() {
        for c in COMPRESSIONS.into_iter().filter(|&c| fits(w, c)) {
            for n in LENGTHS {
                round_trip(Codec::new(w, c), &tokens_for(w, n, n as u64 + 1));
            }
        }
    }
    let e = Encoder::new(Codec::new(Width::U32, Compression::Stream(3)))
        .unwrap()
        .encode(&[7, u32::MAX], &mut Vec::new())
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "u32+stream:3 failed: token 4294967295 at offset 1 is over the byte code's largest id 538984575"
    );
}

#[test]
fn out_of_range_fails_with_exact_error_for_every_narrow_width() {
    for w in all_widths() {
        if w.max_token() == u32::MAX {
            continue;
        }
        for c in COMPRESSIONS {
            let mut tokens = tokens_for(w, 5000, 9);
            let bad = w.max_token() + 1;
            tokens[4321] = bad;
            let mut enc = Encoder::new(Codec::new(w, c)).unwrap();
            let mut out = Vec::new();
            let e = enc.encode(&tokens, &mut out).unwrap_err();
            let needed = 32 - bad.leading_zeros();
            assert_eq!(
                e,
                CodecError::OutOfRange {
                    offset: 4321,
                    value: bad,
                    width: w
                }
            );
            assert_eq!(
                e.to_string(),
                format!(
                    "token {bad} at offset 4321 does not fit in {w} (max {}); it needs {needed} bits: use bits:{needed} or wider",
                    w.max_token()
                )
            );
            assert!(out.is_empty(), "nothing is written on failure");
        }
    }
}

#[test]
fn corrupt_payloads_are_errors_not_panics() {
    let tokens = tokens_for(Width::U16, 3000, 4);
    for c in COMPRESSIONS {
        let codec = Codec::new(Width::U16, c);
        let mut buf = Vec::new();
        Encoder::new(codec)
            .unwrap()
            .encode(&tokens, &mut buf)
            .unwrap();
        let mut out = vec![0; tokens.len()];
        let mut dec = Decoder::new();
        // Truncated payload.
        assert!(dec.decode(codec, &buf[..buf.len() / 2], &mut out).is_err());
        // Payload claiming a different token count.
        let mut short = vec![0; tokens.len() - 1];
        assert!(dec.decode(codec, &buf, &mut short).is_err());
    }
    let e = Decoder::new()
        .decode(Codec::plain(Width::Bits(17)), &[0u8; 5], &mut [0u32; 3])
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "bits:17 payload is 5 bytes, but 3 tokens need 7 bytes"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_streams_round_trip(bits in 1u8..=32, comp in 0usize..4, n in 0usize..3000, seed in any::<u64>()) {
        let w = Width::Bits(bits);
        let tokens = tokens_for(w, n, seed);
        round_trip(Codec::new(w, COMPRESSIONS[comp]), &tokens);
        // The same tokens at the narrowest byte-aligned width.
        let aligned = Width::narrowest(w.max_token(), true);
        round_trip(Codec::new(aligned, COMPRESSIONS[comp]), &tokens);
    }

    #[test]
    fn arbitrary_payloads_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600), n in 0usize..300, wi in 0usize..38, comp in 0usize..4) {
        let w = all_widths()[wi];
        let mut out = vec![0; n];
        let _ = Decoder::new().decode(Codec::new(w, COMPRESSIONS[comp]), &bytes, &mut out);
        // A stream payload, as the start of its lane and as a lane's later chunk.
        let mut dec = Decoder::new();
        for _ in 0..2 {
            let _ = dec.decode(Codec::new(w, Compression::Stream(3)), &bytes, &mut out);
        }
    }

    #[test]
    fn ranked_streams_round_trip(n in 0usize..3000, distinct in 1u32..5000, seed in any::<u64>()) {
        let mut x = seed;
        let tokens: Vec<u32> = (0..n).map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            // Skewed: small draws far more often, spread over ids up to 2^20 - 1.
            let r = ((x >> 33) % distinct as u64) * ((x >> 13) % distinct as u64) / distinct as u64;
            (r as u32).wrapping_mul(2_654_435_761) % (1 << 20)
        }).collect();
        let mut counts = vec![0u64; 1 << 20];
        tokens.iter().for_each(|&t| counts[t as usize] += 1);
        let table = RankTable::from_counts(&counts).unwrap();
        let codec: Codec = "u24+rank+zstd:1".parse().unwrap();
        let mut payload = Vec::new();
        Encoder::with_ranks(codec, &table).unwrap().encode(&tokens, &mut payload).unwrap();
        let mut out = vec![0; n];
        Decoder::new().decode_with(codec, &payload, Some(&table), &mut out).unwrap();
        prop_assert_eq!(out, tokens);
        let mut stored = Vec::new();
        table.encode(&mut stored);
        prop_assert_eq!(RankTable::parse(&stored, (1 << 20) - 1).unwrap(), table);
    }

    #[test]
    fn arbitrary_rank_tables_and_codes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600), n in 0usize..300, max in any::<u32>()) {
        if let Ok(t) = RankTable::parse(&bytes, max) {
            // What parses re-encodes to the same bytes, and holds no id over `max`.
            let mut again = Vec::new();
            t.encode(&mut again);
            prop_assert_eq!(&again, &bytes);
            prop_assert!(t.ids().iter().all(|&id| id <= max));
        }
        let table = RankTable::from_ids((0..300).rev().collect()).unwrap();
        let mut out = vec![0; n];
        let _ = table.decode(&bytes, &mut out);
        let codec: Codec = "u16+rank+zstd:3".parse().unwrap();
        let _ = Decoder::new().decode_with(codec, &bytes, Some(&table), &mut out);
    }
}

/// Found by fuzzing (`fuzz/fuzz_targets/batch_records.rs`): a record header whose codec bytes
/// were `u16`, no compression, and a level byte of 0xf2 parsed as plain `u16`, so the header
/// did not re-encode to its own bytes. Only zstd carries a level.
#[test]
fn codec_bytes_with_a_level_for_none_or_out_of_range_lz4_are_unknown() {
    assert_eq!(Codec::from_bytes([2, 16, 0, 0xf2]), None);
    assert_eq!(Codec::from_bytes([2, 16, 2, 13]), None);
    assert_eq!(Codec::from_bytes([2, 16, 2, 0xff]), None);
    assert_eq!(
        Codec::from_bytes([2, 16, 2, 1]),
        Some(Codec::new(Width::U16, Compression::Lz4Hc(1)))
    );
    assert_eq!(
        Codec::from_bytes([2, 16, 0, 0]),
        Some(Codec::plain(Width::U16))
    );
    assert_eq!(
        Codec::from_bytes([2, 16, 1, 0xf2]),
        Some(Codec::new(Width::U16, Compression::Zstd(-14)))
    );
    for c in [
        "u16",
        "u24+lz4",
        "u24+lz4hc:12",
        "bits:9+zstd:-3",
        "i64+zstd:19",
    ] {
        let c: Codec = c.parse().unwrap();
        assert_eq!(Codec::from_bytes(c.to_bytes()), Some(c));
    }
}
