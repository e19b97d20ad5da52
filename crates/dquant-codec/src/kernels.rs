//! Slice kernels: plain-width stores and loads with range checks, and max-token scans.
//!
//! Every kernel is a plain scalar loop written so LLVM vectorises it, compiled twice: once for
//! the baseline target (SSE2 on x86_64, NEON on aarch64: the BlueField's ARM cores) and once
//! with AVX2 enabled, chosen at run time (`dispatch!`). This beats hand-written intrinsics on
//! maintenance cost and matches them on speed for these memory-bound loops; the criterion
//! benchmark `kernels` holds them to the `memcpy` bandwidth of the same bytes. The `u24`
//! kernels are the exception: 3-byte lanes defeat the vectoriser, so they are written as
//! explicit shuffles (see `store_u24`, `load_u24`), each checked against its scalar loop.
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

/// `u24` store. LLVM does not vectorise the 4-to-3-byte compaction (it emits one scalar
/// 2-byte and one 1-byte store per token, ~0.3x memcpy), so on x86_64 with AVX2 it is explicit
/// intrinsics: `vpshufb` + `vpermd`, ~3.5x faster. The scalar loop is the fallback elsewhere
/// and the tests' oracle.
fn store_u24(src: &[u32], dst: &mut [u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe { store_u24_avx2(src, dst) };
    }
    store_u24_scalar(src, dst)
}

#[inline(always)]
fn store_u24_scalar(src: &[u32], dst: &mut [u8]) -> u32 {
    let mut acc = 0;
    for (d, &s) in dst.chunks_exact_mut(3).zip(src) {
        d.copy_from_slice(&s.to_le_bytes()[..3]);
        acc |= s;
    }
    acc
}

/// [`store_u24_scalar`] with AVX2: 8 tokens per step.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn store_u24_avx2(src: &[u32], dst: &mut [u8]) -> u32 {
    use std::arch::x86_64::*;
    let n = src.len().min(dst.len() / 3);
    // Each step loads 8 tokens (32 bytes) and stores 32 bytes at `24 * k`: the 24 packed bytes
    // and 8 zeros that the next step (or the scalar tail, which covers tokens `8 * steps..n`)
    // overwrites. So every step must satisfy `24 * k + 32 <= 3 * n`, i.e.
    // `steps = (3n - 8) / 24`, which also gives `8 * steps <= n`.
    let steps = (3 * n).saturating_sub(8) / 24;
    // Within each 128-bit lane: bytes 0..=2 of each of the 4 tokens, packed to 12 bytes.
    let shuf = _mm256_setr_epi8(
        0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1, //
        0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,
    );
    // Join the two lanes' 12 bytes into the low 24 bytes; the high 8 are the zero dwords.
    let join = _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 3, 7);
    let mut acc = _mm256_setzero_si256();
    let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
    for k in 0..steps {
        // SAFETY: `8 * k + 8 <= 8 * steps <= n <= src.len()` and
        // `24 * k + 32 <= 3 * n <= dst.len()` (see `steps`); unaligned loads/stores.
        let v = _mm256_loadu_si256(s.add(8 * k).cast());
        acc = _mm256_or_si256(acc, v);
        let packed = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v, shuf), join);
        _mm256_storeu_si256(d.add(24 * k).cast(), packed);
    }
    let mut lanes = [0u32; 8];
    // SAFETY: `lanes` is 32 bytes; unaligned store.
    _mm256_storeu_si256(lanes.as_mut_ptr().cast(), acc);
    let done = 8 * steps;
    lanes.iter().fold(0, |a, &l| a | l) | store_u24_scalar(&src[done..n], &mut dst[3 * done..3 * n])
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

/// `u24` load. The byte-at-a-time loop does not vectorise (~0.4x memcpy), and the formulation
/// that does depends on the instruction set: with AVX2, 8 tokens spelled out as a 24-to-32
/// byte shuffle compile to `vpshufb`/`vpermd` (~2x); without it (SSE2 has no byte shuffle) that
/// same code is slower than bytes, and 4 tokens decoded from three little-endian words (shifts
/// and masks) are ~2x instead.
fn load_u24(src: &[u8], dst: &mut [u32]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2")]
        fn avx2(src: &[u8], dst: &mut [u32]) {
            load_u24_shuffle(src, dst)
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above; `avx2` only changes code
            // generation of the same safe body.
            unsafe { avx2(src, dst) };
            return 0;
        }
    }
    load_u24_words(src, dst);
    0
}

/// The reference `u24` load: the tail of the others and the tests' oracle.
#[inline(always)]
fn load_u24_scalar(src: &[u8], dst: &mut [u32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(3)) {
        *d = u32::from_le_bytes([s[0], s[1], s[2], 0]);
    }
}

#[inline(always)]
fn load_u24_shuffle(src: &[u8], dst: &mut [u32]) {
    let n = dst.len().min(src.len() / 3);
    let (src, dst) = (&src[..3 * n], &mut dst[..n]);
    let mut dc = dst.chunks_exact_mut(8);
    let mut sc = src.chunks_exact(24);
    for (d, s) in dc.by_ref().zip(sc.by_ref()) {
        #[rustfmt::skip]
        let b: [u8; 32] = [
            s[0], s[1], s[2], 0, s[3], s[4], s[5], 0, s[6], s[7], s[8], 0,
            s[9], s[10], s[11], 0, s[12], s[13], s[14], 0, s[15], s[16], s[17], 0,
            s[18], s[19], s[20], 0, s[21], s[22], s[23], 0,
        ];
        for (o, w) in d.iter_mut().zip(b.chunks_exact(4)) {
            *o = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        }
    }
    load_u24_scalar(sc.remainder(), dc.into_remainder());
}

#[inline(always)]
fn load_u24_words(src: &[u8], dst: &mut [u32]) {
    let n = dst.len().min(src.len() / 3);
    let (src, dst) = (&src[..3 * n], &mut dst[..n]);
    let mut dc = dst.chunks_exact_mut(4);
    let mut sc = src.chunks_exact(12);
    for (d, s) in dc.by_ref().zip(sc.by_ref()) {
        let w0 = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        let w1 = u32::from_le_bytes([s[4], s[5], s[6], s[7]]);
        let w2 = u32::from_le_bytes([s[8], s[9], s[10], s[11]]);
        d[0] = w0 & 0xFF_FFFF;
        d[1] = (w0 >> 24 | w1 << 8) & 0xFF_FFFF;
        d[2] = (w1 >> 16 | w2 << 16) & 0xFF_FFFF;
        d[3] = w2 >> 8;
    }
    load_u24_scalar(sc.remainder(), dc.into_remainder());
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
    type Load = fn(&[u8], &mut [u32]) -> u64;
    let (load, bad): (Load, u64) = match width {
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

    /// Pseudo-random values over the whole u32 range (so the dropped high byte and the OR
    /// accumulator are exercised), some at the u24 boundary.
    fn values(n: usize, seed: u64) -> Vec<u32> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                match i % 7 {
                    0 => 0xFF_FFFF,
                    1 => (x >> 32) as u32,
                    _ => (x as u32) & 0xFF_FFFF,
                }
            })
            .collect()
    }

    /// Every u24 kernel against the scalar loop, at lengths around the 8-token step and the
    /// store's 8-byte overrun, on byte slices at every offset mod 4 (unaligned for u32 words).
    #[test]
    fn u24_kernels_match_scalar_at_every_length_and_alignment() {
        let lens = (0..=40).chain([63, 64, 65, 255, 257, 1001, CHUNK - 1, CHUNK, CHUNK + 3]);
        for n in lens {
            let src = values(n, n as u64 + 7);
            for off in 0..4 {
                let mut want = vec![0xAAu8; off + 3 * n + 5];
                let mut got = want.clone();
                let acc_want = store_u24_scalar(&src, &mut want[off..off + 3 * n]);
                let acc_got = store_u24(&src, &mut got[off..off + 3 * n]);
                assert_eq!(acc_got, acc_want, "store_u24 acc n={n} off={off}");
                assert_eq!(got, want, "store_u24 bytes n={n} off={off}");
                #[cfg(target_arch = "x86_64")]
                if std::arch::is_x86_feature_detected!("avx2") {
                    got.fill(0xAA);
                    // SAFETY: AVX2 checked just above.
                    let acc = unsafe { store_u24_avx2(&src, &mut got[off..off + 3 * n]) };
                    assert_eq!(acc, acc_want, "store_u24_avx2 acc n={n} off={off}");
                    assert_eq!(got, want, "store_u24_avx2 bytes n={n} off={off}");
                }

                let bytes = &want[off..off + 3 * n];
                let mut oracle = vec![0u32; n];
                load_u24_scalar(bytes, &mut oracle);
                assert!(oracle.iter().zip(&src).all(|(&o, &s)| o == s & 0xFF_FFFF));
                type Load = fn(&[u8], &mut [u32]);
                let loads: [(&str, Load); 3] = [
                    ("load_u24", |s, d| {
                        load_u24(s, d);
                    }),
                    ("load_u24_shuffle", load_u24_shuffle),
                    ("load_u24_words", load_u24_words),
                ];
                for (name, load) in loads {
                    let mut out = vec![0xDEAD_BEEF; n + 1];
                    load(bytes, &mut out[..n]);
                    assert_eq!(out[..n], oracle[..], "{name} n={n} off={off}");
                    assert_eq!(out[n], 0xDEAD_BEEF, "{name} wrote past the end");
                }
            }
        }
    }

    #[test]
    fn store_plain_u24_reports_first_out_of_range_token() {
        let mut v = values(3 * CHUNK + 11, 3);
        v.iter_mut().for_each(|t| *t &= 0xFF_FFFF);
        let mut dst = vec![0u8; 3 * v.len()];
        store_plain(Width::U24, &v, &mut dst).unwrap();
        let mut back = vec![0u32; v.len()];
        load_plain(Width::U24, &dst, &mut back).unwrap();
        assert_eq!(back, v);
        v[2 * CHUNK + 9] = 1 << 24;
        v[2 * CHUNK + 10] = u32::MAX;
        let e = store_plain(Width::U24, &v, &mut dst).unwrap_err();
        assert_eq!(
            e,
            CodecError::OutOfRange {
                offset: (2 * CHUNK + 9) as u64,
                value: 1 << 24,
                width: Width::U24,
            }
        );
    }

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
