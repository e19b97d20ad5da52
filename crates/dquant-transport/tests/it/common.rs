//! What several test modules of this binary share.

/// Deterministic bytes number `i`, `len` of them (xorshift from a seed of `i`): frames' and
/// ring batches' payloads, checked byte for byte at the other end.
pub fn payload(i: u64, len: usize) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
