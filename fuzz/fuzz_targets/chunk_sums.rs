//! Megatron chunk sums (`PREFIX.dqsum`): `ChunkSums::parse` of arbitrary bytes never panics,
//! and what it accepts re-encodes to its own bytes and answers every chunk's range and check
//! without panicking.
//!
//! Random bytes rarely pass the sidecar's trailing crc32c, so every input is tried twice: as
//! it is, and with the trailer recomputed over the rest, which drives the fuzzer into the
//! size checks behind it.
#![no_main]

use dquant_format::chunk_sums::ChunkSums;
use libfuzzer_sys::fuzz_target;

fn check(data: &[u8]) {
    let Ok(s) = ChunkSums::parse(data) else {
        return;
    };
    assert_eq!(s.encode(), data, "a parsed sidecar re-encodes to its bytes");
    let n = s.chunks();
    assert_eq!(n, s.data_len().div_ceil(u64::from(s.chunk())));
    // Every chunk's bytes lie in the file, and the last ends at its end.
    for i in [0, n / 2, n.saturating_sub(1)] {
        if i < n {
            let r = s.chunk_bytes(i);
            assert!(r.start < r.end && r.end <= s.data_len());
            assert!(s.check(i, s.crc(i)).is_ok());
            assert_eq!(s.chunks_covering(r.clone()), i..i + 1);
        }
    }
    if n > 0 {
        assert_eq!(s.chunk_bytes(n - 1).end, s.data_len());
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() >= 4 {
        let mut fixed = data.to_vec();
        let body = fixed.len() - 4;
        let c = crc32c::crc32c(&fixed[..body]);
        fixed[body..].copy_from_slice(&c.to_le_bytes());
        check(&fixed);
    }
});
