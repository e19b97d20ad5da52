//! The document section of a batch record's trailer, as the client reads it
//! (`dquant_engine::doc_section::decode`, from `Reader::parse_trailer`): a hostile or corrupt
//! agent chooses every byte, the batch header the sample count, the plan the sequence length.
//!
//! Checks: `decode` never panics nor allocates past what the bytes hold; a section it accepts
//! lies inside the bytes, is a multiple of 8 long, holds `samples` samples whose starts lie in
//! `1..=seq_len` in increasing order; and re-encoding those starts gives a section that decodes
//! to the same starts (the producer picks the shorter of list and bitmask, so the bytes may
//! differ from the input, the starts may not).
#![no_main]

use dquant_engine::doc_section::{decode, encode, section_len};
use libfuzzer_sys::fuzz_target;

/// The input: `samples` (u16), `seq_len` (u16, at least 1), then the trailer's bytes.
fn check(data: &[u8]) {
    if data.len() < 4 {
        return;
    }
    let samples = usize::from(u16::from_le_bytes([data[0], data[1]]) % 1025);
    let seq_len = u32::from(u16::from_le_bytes([data[2], data[3]])).max(1);
    let b = &data[4..];
    let Ok((d, len)) = decode(b, samples, seq_len) else {
        return;
    };
    assert!(len <= b.len() && len % 8 == 0, "section of {len} bytes in {}", b.len());
    assert_eq!(d.samples(), samples);
    assert_eq!(d.seq_len(), seq_len);
    for k in 0..samples {
        let s = d.sample(k);
        assert!(s.windows(2).all(|w| w[0] < w[1]), "sample {k}: {s:?}");
        assert!(s.iter().all(|&x| (1..=seq_len).contains(&x)), "sample {k}: {s:?}");
    }
    let (_, want) = section_len(&d);
    let mut out = vec![0u8; want];
    assert_eq!(encode(&d, &mut out), Some(want));
    let (again, used) = decode(&out, samples, seq_len).expect("an encoded section decodes");
    assert_eq!(used, want);
    assert_eq!(again, d);
}

fuzz_target!(|data: &[u8]| check(data));
