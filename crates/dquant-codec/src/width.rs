//! Storage widths: how many bits each token id occupies before any compression.

use std::fmt;
use std::str::FromStr;

use crate::error::CodecError;

/// Tokens per bit-packed group. `bits:N` packs whole groups with the SIMD `BitPacker8x`
/// layout and the tail bit by bit; see `bitpack.rs`.
pub(crate) const PACK_GROUP: usize = 256;

/// How each token id is stored, before any compression wrapper.
///
/// Plain widths are little-endian integers. `u8` and `u24` are the byte-aligned narrow forms
/// that compress best under zstd (repeated token runs stay byte-aligned); `bits:N` is the
/// densest uncompressed form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Width {
    U8,
    U16,
    /// Three little-endian bytes per token.
    U24,
    U32,
    /// Signed 32-bit, as Megatron-Core's default `.bin` dtype; ids above `i32::MAX` do not fit.
    I32,
    /// Signed 64-bit; any `u32` id fits.
    I64,
    /// Bit-packed to N bits per token, 1 <= N <= 32.
    Bits(u8),
}

/// The number of bits needed to store `max_token` (at least 1: a stream of zeros is `bits:1`).
pub fn bits_needed(max_token: u32) -> u8 {
    (32 - max_token.leading_zeros()).max(1) as u8
}

impl Width {
    /// All plain byte-aligned widths, narrowest first.
    pub const PLAIN: [Width; 6] = [
        Width::U8,
        Width::U16,
        Width::U24,
        Width::U32,
        Width::I32,
        Width::I64,
    ];

    /// `bits:n`, checked.
    pub fn bits(n: u8) -> Result<Width, CodecError> {
        if (1..=32).contains(&n) {
            Ok(Width::Bits(n))
        } else {
            Err(CodecError::Parse {
                input: format!("bits:{n}"),
                reason: "N must be in 1..=32".into(),
            })
        }
    }

    /// The largest token id this width can hold.
    pub fn max_token(self) -> u32 {
        match self {
            Width::U8 => u8::MAX as u32,
            Width::U16 => u16::MAX as u32,
            Width::U24 => (1 << 24) - 1,
            Width::U32 | Width::I64 => u32::MAX,
            Width::I32 => i32::MAX as u32,
            Width::Bits(n) => ((1u64 << n) - 1) as u32,
        }
    }

    /// Bits of payload per token.
    pub fn bits_per_token(self) -> u32 {
        match self {
            Width::U8 => 8,
            Width::U16 => 16,
            Width::U24 => 24,
            Width::U32 | Width::I32 => 32,
            Width::I64 => 64,
            Width::Bits(n) => n as u32,
        }
    }

    /// Bytes per token for byte-aligned widths, `None` for `bits:N`.
    pub fn byte_width(self) -> Option<usize> {
        match self {
            Width::Bits(_) => None,
            w => Some(w.bits_per_token() as usize / 8),
        }
    }

    /// Exact size in bytes of `n` tokens at this width, uncompressed.
    pub fn encoded_len(self, n: usize) -> usize {
        match self {
            Width::Bits(b) => {
                let b = b as usize;
                let groups = n / PACK_GROUP;
                let tail = n % PACK_GROUP;
                groups * PACK_GROUP * b / 8 + (tail * b).div_ceil(8)
            }
            w => n * w.bits_per_token() as usize / 8,
        }
    }

    /// The narrowest width that holds ids up to `max_token`.
    ///
    /// With `byte_aligned`, the answer is `u8`/`u16`/`u24`/`u32`: the best input for a
    /// general-purpose compressor, because a repeated run of tokens is a repeated run of bytes.
    /// Without it, widths that are a whole number of bytes still prefer the plain form (same
    /// size, cheaper kernels); anything else is `bits:N`.
    pub fn narrowest(max_token: u32, byte_aligned: bool) -> Width {
        let bits = bits_needed(max_token);
        match bits {
            0..=8 if byte_aligned || bits == 8 => Width::U8,
            9..=16 if byte_aligned || bits == 16 => Width::U16,
            17..=24 if byte_aligned || bits == 24 => Width::U24,
            25..=32 if byte_aligned || bits == 32 => Width::U32,
            n => Width::Bits(n),
        }
    }

    pub(crate) fn code(self) -> (u8, u8) {
        match self {
            Width::U8 => (1, 8),
            Width::U16 => (2, 16),
            Width::U24 => (3, 24),
            Width::U32 => (4, 32),
            Width::I32 => (5, 32),
            Width::I64 => (6, 64),
            Width::Bits(n) => (7, n),
        }
    }

    pub(crate) fn from_code(kind: u8, bits: u8) -> Option<Width> {
        let w = match kind {
            1 => Width::U8,
            2 => Width::U16,
            3 => Width::U24,
            4 => Width::U32,
            5 => Width::I32,
            6 => Width::I64,
            7 if (1..=32).contains(&bits) => Width::Bits(bits),
            _ => return None,
        };
        (w.code() == (kind, bits)).then_some(w)
    }
}

impl fmt::Display for Width {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Width::U8 => f.write_str("u8"),
            Width::U16 => f.write_str("u16"),
            Width::U24 => f.write_str("u24"),
            Width::U32 => f.write_str("u32"),
            Width::I32 => f.write_str("i32"),
            Width::I64 => f.write_str("i64"),
            Width::Bits(n) => write!(f, "bits:{n}"),
        }
    }
}

impl FromStr for Width {
    type Err = CodecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason: &str| CodecError::Parse {
            input: s.to_string(),
            reason: reason.to_string(),
        };
        match s {
            "u8" => Ok(Width::U8),
            "u16" => Ok(Width::U16),
            "u24" => Ok(Width::U24),
            "u32" => Ok(Width::U32),
            "i32" => Ok(Width::I32),
            "i64" => Ok(Width::I64),
            _ => match s.strip_prefix("bits:") {
                Some(n) => match n.parse::<u8>() {
                    Ok(n @ 1..=32) => Ok(Width::Bits(n)),
                    _ => Err(err("N in bits:N must be an integer in 1..=32")),
                },
                None => Err(err(
                    "expected u8, u16, u24, u32, i32, i64 or bits:N (N in 1..=32)",
                )),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_display_round_trip() {
        let mut all: Vec<Width> = Width::PLAIN.to_vec();
        all.extend((1..=32).map(Width::Bits));
        for w in all {
            assert_eq!(w.to_string().parse::<Width>().unwrap(), w);
            let (k, b) = w.code();
            assert_eq!(Width::from_code(k, b), Some(w));
        }
        assert_eq!(
            "bits:33".parse::<Width>().unwrap_err().to_string(),
            "invalid codec 'bits:33': N in bits:N must be an integer in 1..=32"
        );
        assert_eq!(
            "u17".parse::<Width>().unwrap_err().to_string(),
            "invalid codec 'u17': expected u8, u16, u24, u32, i32, i64 or bits:N (N in 1..=32)"
        );
    }

    #[test]
    fn narrowest_and_bits_needed() {
        assert_eq!(bits_needed(0), 1);
        assert_eq!(bits_needed(1), 1);
        assert_eq!(bits_needed(50256), 16);
        assert_eq!(bits_needed(100257), 17);
        assert_eq!(bits_needed(199999), 18);
        assert_eq!(bits_needed(u32::MAX), 32);
        assert_eq!(Width::narrowest(50256, false), Width::U16);
        assert_eq!(Width::narrowest(100257, false), Width::Bits(17));
        assert_eq!(Width::narrowest(100257, true), Width::U24);
        assert_eq!(Width::narrowest(5, false), Width::Bits(3));
        assert_eq!(Width::narrowest(5, true), Width::U8);
        assert_eq!(Width::narrowest(u32::MAX, false), Width::U32);
    }

    #[test]
    fn encoded_len_is_exact() {
        assert_eq!(Width::Bits(17).encoded_len(0), 0);
        assert_eq!(Width::Bits(17).encoded_len(1), 3);
        assert_eq!(Width::Bits(17).encoded_len(256), 256 * 17 / 8);
        assert_eq!(Width::Bits(17).encoded_len(257), 256 * 17 / 8 + 3);
        assert_eq!(Width::U24.encoded_len(10), 30);
        assert_eq!(Width::I64.encoded_len(3), 24);
    }
}
