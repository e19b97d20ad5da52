//! Slice kernels: plain-width stores and loads with range checks, and max-token scans.
//!
//! Every kernel is a plain scalar loop written so LLVM vectorises it, compiled twice: once for
//! the baseline target (SSE2 on x86_64, NEON on aarch64: the BlueField's ARM cores) and once
//! with AVX2 enabled, chosen at run time (`dispatch!`). This beats hand-written intrinsics on
//! maintenance cost and matches them on speed for these memory-bound loops; the criterion
//! benchmark `kernels` holds them to the `memcpy` bandwidth of the same bytes.
//!
//! Range checks are OR-accumulators over chunks: branch-free inside the vector loop, and only
//! when a chunk fails is it rescanned to report the exact offset of the first bad token.

use crate::error::CodecError;
use crate::width::Width;

/// Tokens per range-checked chunk: small enough to stay in L1, large enough to amortise the
/// dispatch and the check.
const CHUNK: usize = 4096;

/// Defines a function whose body is compiled for the baseline target and for AVX2, picking the
/// best at run time.
macro_rules! dispatch {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($a:ident : $t:ty),* $(,)?) -> $r:ty $body:block) => {
        $(#[$m])*
        $vis fn $name($($a: $t),*) -> $r {
            #[inline(always)]
            fn imp($($a: $t),*) -> $r $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                fn avx2($($a: $t),*) -> $r {
                    imp($($a),*)
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU supports AVX2, checked just above; `avx2` only changes
                    // code generation of the same safe body.
                    return unsafe { avx2($($a),*) };
                }
            }
            imp($($a),*)
        }
    };
}

dispatch! {
    /// OR of all tokens: a cheap upper bound on the bits needed.
    fn or_all(src: &[u32]) -> u32 {
        src.iter().fold(0, |a, &t| a | t)
    }
}

dispatch! {
    /// The largest token id in `src` (0 for an empty slice).
    pub fn max_token(src: &[u32]) -> u32 {
        src.iter().copied().fold(0, u32::max)
    }
}

/// Index of the first token greater than `max`, if any. `max` must be `2^k - 1`.
pub fn first_over(src: &[u32], max: u32) -> Option<usize> {
    debug_assert!(max.checked_add(1).is_none_or(u32::is_power_of_two));
    for (c, chunk) in src.chunks(CHUNK).enumerate() {
        if or_all(chunk) & !max != 0 {
            let i = chunk.iter().position(|&t| t > max)?;
            return Some(c * CHUNK + i);
        }
    }
    None
}

dispatch! {
    fn store_u8(src: &[u32], dst: &mut [u8]) -> u32 {
        let mut acc = 0;
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = s as u8;
            acc |= s;
        }
        acc
    }
}

dispatch! {
    fn store_u16(src: &[u32], dst: &mut [u8]) -> u32 {
        let mut acc = 0;
        for (d, &s) in dst.chunks_exact_mut(2).zip(src) {
            d.copy_from_slice(&(s as u16).to_le_bytes());
            acc |= s;
        }
        acc
    }
}

dispatch! {
    fn store_u24(src: &[u32], dst: &mut [u8]) -> u32 {
        let mut acc = 0;
        for (d, &s) in dst.chunks_exact_mut(3).zip(src) {
            d.copy_from_slice(&s.to_le_bytes()[..3]);
            acc |= s;
        }
        acc
    }
}

dispatch! {
    fn store_u32(src: &[u32], dst: &mut [u8]) -> u32 {
        let mut acc = 0;
        for (d, &s) in dst.chunks_exact_mut(4).zip(src) {
            d.copy_from_slice(&s.to_le_bytes());
            acc |= s;
        }
        acc
    }
}

dispatch! {
    fn store_i64(src: &[u32], dst: &mut [u8]) -> u32 {
        for (d, &s) in dst.chunks_exact_mut(8).zip(src) {
            d.copy_from_slice(&(s as u64).to_le_bytes());
        }
        0
    }
}

dispatch! {
    fn load_u8(src: &[u8], dst: &mut [u32]) -> u64 {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = s as u32;
        }
        0
    }
}

dispatch! {
    fn load_u16(src: &[u8], dst: &mut [u32]) -> u64 {
        for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
            *d = u16::from_le_bytes([s[0], s[1]]) as u32;
        }
        0
    }
}

dispatch! {
    fn load_u24(src: &[u8], dst: &mut [u32]) -> u64 {
        for (d, s) in dst.iter_mut().zip(src.chunks_exact(3)) {
            *d = u32::from_le_bytes([s[0], s[1], s[2], 0]);
        }
        0
    }
}

dispatch! {
    /// Loads u32/i32 and returns the OR of all values (the sign bit flags bad i32 data).
    fn load_u32(src: &[u8], dst: &mut [u32]) -> u64 {
        let mut acc = 0;
        for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
            let v = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            *d = v;
            acc |= v;
        }
        acc as u64
    }
}

dispatch! {
    /// Loads i64 and returns the OR of all values (any high bit flags a non-token value).
    fn load_i64(src: &[u8], dst: &mut [u32]) -> u64 {
        let mut acc = 0;
        for (d, s) in dst.iter_mut().zip(src.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(s);
            let v = u64::from_le_bytes(b);
            *d = v as u32;
            acc |= v;
        }
        acc
    }
}

/// Stores `src` at a plain (byte-aligned) width into `dst`, which must be exactly
/// `width.encoded_len(src.len())` bytes. Fails on the first token that does not fit; `dst` is
/// then partly written and must be discarded.
///
/// # Panics
/// If `width` is `bits:N` or `dst` has the wrong length (programming errors, not data errors).
pub fn store_plain(width: Width, src: &[u32], dst: &mut [u8]) -> Result<(), CodecError> {
    let bw = width
        .byte_width()
        .expect("store_plain takes byte-aligned widths");
    assert_eq!(
        dst.len(),
        src.len() * bw,
        "store_plain: wrong output length"
    );
    let store: fn(&[u32], &mut [u8]) -> u32 = match width {
        Width::U8 => store_u8,
        Width::U16 => store_u16,
        Width::U24 => store_u24,
        Width::U32 | Width::I32 => store_u32,
        Width::I64 => store_i64,
        Width::Bits(_) => unreachable!("checked above"),
    };
    let max = width.max_token();
    for (c, (s, d)) in src
        .chunks(CHUNK)
        .zip(dst.chunks_mut(CHUNK * bw))
        .enumerate()
    {
        if store(s, d) & !max != 0 {
            return Err(out_of_range(width, s, c * CHUNK));
        }
    }
    Ok(())
}

/// The error for the first token of `chunk` (which starts at `base`) that exceeds `width`.
pub(crate) fn out_of_range(width: Width, chunk: &[u32], base: usize) -> CodecError {
    let max = width.max_token();
    match chunk.iter().position(|&t| t > max) {
        Some(i) => CodecError::OutOfRange {
            offset: (base + i) as u64,
            value: chunk[i],
            width,
        },
        None => unreachable!("out_of_range called on a chunk that fits"),
    }
}

/// Loads tokens stored at a plain width. `src` must be exactly `width.encoded_len(dst.len())`
/// bytes. Stored `i32`/`i64` values that are not token ids (negative, or above `u32::MAX`) are
/// an error naming the offset.
///
/// # Panics
/// If `width` is `bits:N` or the lengths disagree.
pub fn load_plain(width: Width, src: &[u8], dst: &mut [u32]) -> Result<(), CodecError> {
    let bw = width
        .byte_width()
        .expect("load_plain takes byte-aligned widths");
    assert_eq!(src.len(), dst.len() * bw, "load_plain: wrong input length");
    let (load, bad): (fn(&[u8], &mut [u32]) -> u64, u64) = match width {
        Width::U8 => (load_u8, 0),
        Width::U16 => (load_u16, 0),
        Width::U24 => (load_u24, 0),
        Width::U32 => (load_u32, 0),
        Width::I32 => (load_u32, 0x8000_0000),
        Width::I64 => (load_i64, !(u32::MAX as u64)),
        Width::Bits(_) => unreachable!("checked above"),
    };
    for (c, (s, d)) in src
        .chunks(CHUNK * bw)
        .zip(dst.chunks_mut(CHUNK))
        .enumerate()
    {
        if load(s, d) & bad != 0 {
            let i = s
                .chunks_exact(bw)
                .position(|v| {
                    stored_value(width, v) > u32::MAX as i128 || stored_value(width, v) < 0
                })
                .unwrap_or(0);
            let v = stored_value(width, &s[i * bw..(i + 1) * bw]);
            return Err(CodecError::InvalidStoredValue {
                offset: (c * CHUNK + i) as u64,
                value: v as i64,
                width,
            });
        }
    }
    Ok(())
}

fn stored_value(width: Width, b: &[u8]) -> i128 {
    match width {
        Width::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i128,
        Width::I64 => {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            i64::from_le_bytes(a) as i128
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_over_finds_exact_offset_across_chunks() {
        let mut v = vec![7u32; CHUNK * 3 + 5];
        assert_eq!(first_over(&v, 7), None);
        v[CHUNK * 2 + 17] = 8;
        v[CHUNK * 3 + 1] = 9;
        assert_eq!(first_over(&v, 7), Some(CHUNK * 2 + 17));
        assert_eq!(first_over(&v, 15), None);
    }

    #[test]
    fn max_token_scans_everything() {
        assert_eq!(max_token(&[]), 0);
        let mut v: Vec<u32> = (0..10_000).collect();
        v[4321] = 1 << 30;
        assert_eq!(max_token(&v), 1 << 30);
    }

    #[test]
    fn invalid_stored_values_are_reported_with_offset() {
        let mut bytes = Vec::new();
        for v in [1i32, 2, -5, 3] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        let mut out = vec![0; 4];
        let e = load_plain(Width::I32, &bytes, &mut out).unwrap_err();
        assert_eq!(
            e.to_string(),
            "stored value -5 at offset 2 is not a token id (i32 data must hold 0..=4294967295)"
        );
        let mut bytes = Vec::new();
        for v in [1i64, 1 << 40] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        let mut out = vec![0; 2];
        let e = load_plain(Width::I64, &bytes, &mut out).unwrap_err();
        assert_eq!(
            e.to_string(),
            "stored value 1099511627776 at offset 1 is not a token id (i64 data must hold 0..=4294967295)"
        );
    }
}
