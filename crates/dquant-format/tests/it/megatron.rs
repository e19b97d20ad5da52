//! Megatron-Core `.idx`/`.bin`: round trips, the real fixtures Megatron wrote, and errors.

use crate::common;

use common::*;
use dquant_codec::{Codec, TokenHasher};
use dquant_format::block::BlockFile;
use dquant_format::megatron::{check_bin_len, encode_idx, parse_idx, HEADER_LEN};
use dquant_format::{ContentChecksum, DType, DocIndex, DocIndexBuilder};
use dquant_testkit::read_fixture;

fn multi_seq_index() -> DocIndex {
    let mut b = DocIndexBuilder::new();
    b.push_sequence(3);
    b.push_sequence(4);
    b.end_document();
    b.end_document(); // an empty document
    b.push_document(5);
    b.push_sequence(0);
    b.push_sequence(1);
    b.push_sequence(2);
    b.end_document();
    b.finish()
}

#[test]
fn multi_sequence_documents_round_trip() {
    let ix = multi_seq_index();
    assert_eq!(ix.doc_seq(), &[0, 2, 2, 3, 6]);
    for dt in DType::ALL {
        let bytes = encode_idx(dt, &ix).unwrap();
        assert_eq!(bytes.len(), HEADER_LEN + 12 * 6 + 8 * 5);
        let p = parse_idx(&bytes).unwrap();
        assert_eq!(p.dtype, dt);
        assert_eq!(p.index, ix);
        assert!(!p.multimodal);
        assert_eq!(encode_idx(p.dtype, &p.index).unwrap(), bytes);
        // Pointers are byte offsets: the running sum of lengths times the item size.
        let ptrs = &bytes[HEADER_LEN + 4 * 6..HEADER_LEN + 12 * 6];
        let want: Vec<i64> = [0, 3, 7, 12, 12, 13]
            .iter()
            .map(|&t| t * dt.itemsize() as i64)
            .collect();
        let got: Vec<i64> = ptrs
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, want, "{dt}");
    }
    // Random indices, including empty documents and sequences.
    let mut rng = Rng::new(3);
    for n in [0, 1, 10, 1000, 5000] {
        for _ in 0..20 {
            let ix = random_index(&mut rng, n);
            let bytes = encode_idx(DType::I32, &ix).unwrap();
            assert_eq!(parse_idx(&bytes).unwrap().index, ix);
        }
    }
}

#[test]
fn multimodal_modes_are_accepted_and_other_extra_bytes_are_not() {
    let ix = multi_seq_index();
    let mut bytes = encode_idx(DType::U16, &ix).unwrap();
    bytes.extend_from_slice(&[0; 6]); // one mode byte per sequence
    let p = parse_idx(&bytes).unwrap();
    assert!(p.multimodal);
    assert_eq!(p.index, ix);
    bytes.push(0);
    assert_eq!(
        parse_idx(&bytes).unwrap_err().to_string(),
        "corrupt Megatron .idx: 7 unexpected bytes after the document indices"
    );
}

#[test]
fn idx_errors_are_exact() {
    let ix = multi_seq_index();
    let good = encode_idx(DType::I32, &ix).unwrap();
    assert_eq!(
        parse_idx(&good[..33]).unwrap_err().to_string(),
        "truncated Megatron .idx header: needs 34 bytes but has 33"
    );
    assert_eq!(
        parse_idx(b"").unwrap_err().to_string(),
        "truncated Megatron .idx header: needs 34 bytes but has 0"
    );
    assert_eq!(
        parse_idx(&good[..good.len() - 8]).unwrap_err().to_string(),
        "truncated Megatron .idx with 6 sequences and 5 document indices: needs 146 bytes but has 138"
    );
    // Negative sequence length.
    let mut b = good.clone();
    b[HEADER_LEN + 4..HEADER_LEN + 8].copy_from_slice(&(-4i32).to_le_bytes());
    assert_eq!(
        parse_idx(&b).unwrap_err().to_string(),
        "corrupt Megatron .idx: sequence 1 has negative length -4"
    );
    // A pointer that is not the running sum.
    let mut b = good.clone();
    let p0 = HEADER_LEN + 4 * 6;
    b[p0..p0 + 8].copy_from_slice(&4i64.to_le_bytes());
    assert_eq!(
        parse_idx(&b).unwrap_err().to_string(),
        "corrupt Megatron .idx: sequence 0 starts at byte 4, expected 0 (right after sequence -1)"
    );
    // document_indices not starting at 0, decreasing, or not ending at S.
    let d0 = HEADER_LEN + 12 * 6;
    let mut b = good.clone();
    b[d0..d0 + 8].copy_from_slice(&1i64.to_le_bytes());
    assert_eq!(
        parse_idx(&b).unwrap_err().to_string(),
        "invalid document index: document indices must start at 0"
    );
    let mut b = good.clone();
    b[d0 + 16..d0 + 24].copy_from_slice(&1i64.to_le_bytes());
    assert_eq!(
        parse_idx(&b).unwrap_err().to_string(),
        "invalid document index: document 2 starts at sequence 1 before document 1 (sequence 2)"
    );
    let mut b = good.clone();
    b[d0 + 32..d0 + 40].copy_from_slice(&5i64.to_le_bytes());
    assert_eq!(
        parse_idx(&b).unwrap_err().to_string(),
        "invalid document index: document indices end at sequence 5 but there are 6 sequences"
    );
    let mut b = good.clone();
    b[d0 + 32..d0 + 40].copy_from_slice(&(-1i64).to_le_bytes());
    assert_eq!(
        parse_idx(&b).unwrap_err().to_string(),
        "invalid document index: document indices end at sequence 18446744073709551615 but there are 6 sequences"
    );
    // No document indices at all.
    let mut b = good[..HEADER_LEN].to_vec();
    b[18..34].fill(0);
    assert_eq!(
        parse_idx(&b).unwrap_err().to_string(),
        "corrupt Megatron .idx: document_indices is empty (it must start with 0)"
    );
    // Counts whose array sizes overflow u64, and counts larger than the file.
    let mut b = good.clone();
    b[18..26].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_eq!(
        parse_idx(&b).unwrap_err().to_string(),
        "corrupt Megatron .idx: counts S=18446744073709551615 D=5 overflow"
    );
    let mut b = good.clone();
    b[26..34].copy_from_slice(&(u64::MAX / 8).to_le_bytes());
    assert_eq!(
        parse_idx(&b).unwrap_err().to_string(),
        "corrupt Megatron .idx: counts S=6 D=2305843009213693951 overflow"
    );
    let mut b = good.clone();
    b[18..26].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert_eq!(
        parse_idx(&b).unwrap_err().to_string(),
        "truncated Megatron .idx with 1099511627776 sequences and 5 document indices: needs 13194139533386 bytes but has 146"
    );
}

#[test]
fn sequences_too_long_for_megatron_are_refused() {
    let mut b = DocIndexBuilder::new();
    b.push_document(1 << 31);
    let e = encode_idx(DType::U16, &b.finish()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "sequence 0 (2147483648 tokens) does not fit the Megatron format: Megatron stores sequence lengths as int32"
    );
}

#[test]
fn bin_length_is_checked() {
    let ix = multi_seq_index();
    let p = parse_idx(&encode_idx(DType::U16, &ix).unwrap()).unwrap();
    check_bin_len(&p, 30).unwrap();
    assert_eq!(
        check_bin_len(&p, 29).unwrap_err().to_string(),
        "truncated Megatron .bin (15 tokens of uint16 in the .idx): needs 30 bytes but has 29"
    );
    assert_eq!(
        check_bin_len(&p, 32).unwrap_err().to_string(),
        "corrupt Megatron .bin: 32 bytes, but the .idx describes only 30 (15 tokens of uint16); the .idx may be stale or truncated"
    );
}

// --- The fixtures Megatron-Core itself wrote. ---

#[test]
fn fixture_indices_parse() {
    let cases = [
        ("r50k_int32.idx", DType::I32, 28, 28),
        ("r50k_uint16.idx", DType::U16, 28, 28),
        ("r50k_int32_multiseq.idx", DType::I32, 175, 28),
    ];
    for (name, dtype, seqs, docs) in cases {
        let bytes = read_fixture(name);
        let p = parse_idx(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(p.dtype, dtype, "{name}");
        assert_eq!(p.index.sequences(), seqs, "{name}");
        assert_eq!(p.index.documents(), docs, "{name}");
        assert_eq!(p.index.tokens(), 161_032, "{name}");
        assert!(!p.multimodal, "{name}");
        // What we write is what Megatron wrote.
        assert!(
            encode_idx(p.dtype, &p.index).unwrap() == bytes,
            "{name}: encode_idx(parse_idx(x)) differs from the fixture"
        );
    }
    // Same documents, split differently into sequences.
    let one = parse_idx(&read_fixture("r50k_int32.idx")).unwrap().index;
    let multi = parse_idx(&read_fixture("r50k_int32_multiseq.idx"))
        .unwrap()
        .index;
    for d in 0..28 {
        assert_eq!(one.document(d), multi.document(d), "document {d}");
    }
    for s in 0..multi.sequences() {
        assert!(multi.sequence_len(s) <= 1000);
    }
}

#[test]
fn int32_index_written_as_uint16_is_megatrons_uint16_index() {
    let p = parse_idx(&read_fixture("r50k_int32.idx")).unwrap();
    assert!(encode_idx(DType::U16, &p.index).unwrap() == read_fixture("r50k_uint16.idx"));
}

fn decode_bin(idx: &str, bin: &str) -> (DocIndex, Vec<u32>) {
    let p = parse_idx(&read_fixture(idx)).unwrap();
    let bytes = read_fixture(bin);
    check_bin_len(&p, bytes.len() as u64).unwrap();
    let mut tokens = vec![0; p.index.tokens() as usize];
    p.dtype.decode(&bytes, &mut tokens, 0).unwrap();
    // Re-encoding at the same dtype gives the .bin back.
    let mut again = vec![0; bytes.len()];
    p.dtype.encode(&tokens, &mut again, 0).unwrap();
    assert!(again == bytes, "{bin}: decode/encode changed the bytes");
    (p.index, tokens)
}

#[test]
fn fixture_bins_decode_to_the_same_tokens() {
    let (ix32, t32) = decode_bin("r50k_int32.idx", "r50k_int32.bin");
    let (ix16, t16) = decode_bin("r50k_uint16.idx", "r50k_uint16.bin");
    let (ixm, tm) = decode_bin("r50k_int32_multiseq.idx", "r50k_int32_multiseq.bin");
    assert_eq!(t32.len(), 161_032);
    assert!(
        t32 == t16,
        "int32 and uint16 fixtures hold different tokens"
    );
    assert!(
        t32 == tm,
        "int32 and multiseq fixtures hold different tokens"
    );
    assert_eq!(t32.iter().copied().max(), Some(50256));
    assert_eq!(t32.last(), Some(&50256));
    // Every document ends with end-of-text.
    for d in 0..ix32.documents() {
        assert_eq!(
            t32[ix32.document(d).end as usize - 1],
            50256,
            "document {d}"
        );
    }
    let mut h = TokenHasher::new();
    h.update(&t32);
    assert_eq!(
        ContentChecksum::new(&h, &ix32),
        ContentChecksum::new(&h, &ix16)
    );
    assert_ne!(
        ContentChecksum::new(&h, &ix32).index,
        ContentChecksum::new(&h, &ixm).index
    );
}

#[test]
fn fixtures_through_a_block_file_and_back() {
    let (ix, tokens) = decode_bin("r50k_int32_multiseq.idx", "r50k_int32_multiseq.bin");
    for codec in ["u16+zstd:3", "bits:16+lz4", "bits:16"] {
        let codec: Codec = codec.parse().unwrap();
        let (file, s) = write_chunked(codec, 1 << 14, &tokens, &ix, &[4099], true);
        let bf = BlockFile::from_bytes(&file).unwrap();
        assert_eq!(bf.decode_all(&file).unwrap(), tokens);
        assert_eq!(bf.index, ix);
        assert_eq!(s.content, content_of(&tokens, &ix));
        assert_eq!(s.max_token, 50256);
        // And out to Megatron again: the same .idx and .bin bytes.
        let idx = encode_idx(DType::I32, &bf.index).unwrap();
        assert!(idx == read_fixture("r50k_int32_multiseq.idx"));
        let mut bin = vec![0; tokens.len() * 2];
        DType::U16.encode(&tokens, &mut bin, 0).unwrap();
        assert!(bin == read_fixture("r50k_uint16.bin"));
    }
}

#[test]
fn truncated_fixture_index() {
    let bytes = read_fixture("r50k_int32.idx");
    assert_eq!(bytes.len(), 602);
    assert_eq!(
        parse_idx(&bytes[..600]).unwrap_err().to_string(),
        "truncated Megatron .idx with 28 sequences and 29 document indices: needs 602 bytes but has 600"
    );
}
