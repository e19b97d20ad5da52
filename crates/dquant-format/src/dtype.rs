//! Element types of token files, with Megatron-Core's dtype codes.

use std::fmt;
use std::str::FromStr;

use dquant_codec::{decode_width, encode_width, CodecError, Width};

use crate::error::FormatError;

/// An element type of a `.bin` or raw token file. Codes are Megatron-Core's `DType` codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    U8,
    I8,
    I16,
    I32,
    I64,
    F64,
    F32,
    U16,
}

impl DType {
    pub const ALL: [DType; 8] = [
        DType::U8,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F64,
        DType::F32,
        DType::U16,
    ];

    /// Megatron-Core's code for this dtype.
    pub fn code(self) -> u8 {
        match self {
            DType::U8 => 1,
            DType::I8 => 2,
            DType::I16 => 3,
            DType::I32 => 4,
            DType::I64 => 5,
            DType::F64 => 6,
            DType::F32 => 7,
            DType::U16 => 8,
        }
    }

    pub fn from_code(code: u8) -> Result<Self, FormatError> {
        DType::ALL
            .into_iter()
            .find(|d| d.code() == code)
            .ok_or(FormatError::UnknownDType(code))
    }

    pub fn itemsize(self) -> usize {
        match self {
            DType::U8 | DType::I8 => 1,
            DType::I16 | DType::U16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// numpy's name, as Megatron-Core and its users say it.
    pub fn numpy_name(self) -> &'static str {
        match self {
            DType::U8 => "uint8",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::F64 => "float64",
            DType::F32 => "float32",
            DType::U16 => "uint16",
        }
    }

    /// Largest token id the dtype holds exactly (floats: the largest of the form 2^k - 1 below
    /// their integer precision).
    pub fn max_token(self) -> u32 {
        match self {
            DType::U8 => u8::MAX as u32,
            DType::I8 => i8::MAX as u32,
            DType::I16 => i16::MAX as u32,
            DType::U16 => u16::MAX as u32,
            DType::I32 => i32::MAX as u32,
            DType::F32 => (1 << 24) - 1,
            DType::I64 | DType::F64 => u32::MAX,
        }
    }

    /// The codec width with the same bytes, for the dtypes that have one.
    pub fn width(self) -> Option<Width> {
        match self {
            DType::U8 => Some(Width::U8),
            DType::U16 => Some(Width::U16),
            DType::I32 => Some(Width::I32),
            DType::I64 => Some(Width::I64),
            _ => None,
        }
    }

    /// The dtype storing the same bytes as a plain codec width, if Megatron has one.
    pub fn from_width(w: Width) -> Option<DType> {
        match w {
            Width::U8 => Some(DType::U8),
            Width::U16 => Some(DType::U16),
            Width::I32 => Some(DType::I32),
            Width::I64 => Some(DType::I64),
            _ => None,
        }
    }

    /// Megatron-Core's `DType.optimal_dtype(vocab_size)`: uint16 below 65500, else int32.
    pub fn megatron_optimal(vocab_size: u32) -> DType {
        if vocab_size < 65500 {
            DType::U16
        } else {
            DType::I32
        }
    }

    /// Decodes `out.len()` tokens from `src` (exactly `out.len() * itemsize` bytes), rejecting
    /// values that are not token ids (negative, fractional, or above `u32::MAX`). Error offsets
    /// are token offsets counted from `base` (the position of `src` in the whole stream).
    pub fn decode(self, src: &[u8], out: &mut [u32], base: u64) -> Result<(), FormatError> {
        if src.len() != out.len() * self.itemsize() {
            return Err(FormatError::corrupt(
                format!("{} data", self.numpy_name()),
                format!(
                    "{} bytes is not {} tokens of {} bytes",
                    src.len(),
                    out.len(),
                    self.itemsize()
                ),
            ));
        }
        if let Some(w) = self.width() {
            return decode_width(w, src, out).map_err(|e| e.at_base(base).into());
        }
        let n = self.itemsize();
        for (i, (d, s)) in out.iter_mut().zip(src.chunks_exact(n)).enumerate() {
            let v: f64 = match self {
                DType::I8 => s[0] as i8 as f64,
                DType::I16 => i16::from_le_bytes([s[0], s[1]]) as f64,
                DType::F32 => f32::from_le_bytes([s[0], s[1], s[2], s[3]]) as f64,
                DType::F64 => {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(s);
                    f64::from_le_bytes(b)
                }
                _ => unreachable!("plain widths handled above"),
            };
            if !(v >= 0.0 && v <= u32::MAX as f64 && v.fract() == 0.0) {
                return Err(FormatError::corrupt(
                    format!("{} data", self.numpy_name()),
                    format!(
                        "value {v} at offset {} is not a token id (an integer in 0..=4294967295)",
                        base + i as u64
                    ),
                ));
            }
            *d = v as u32;
        }
        Ok(())
    }

    /// Encodes tokens into `dst` (exactly `tokens.len() * itemsize` bytes), failing on the
    /// first token the dtype cannot hold exactly; offsets count from `base`.
    pub fn encode(self, tokens: &[u32], dst: &mut [u8], base: u64) -> Result<(), FormatError> {
        assert_eq!(dst.len(), tokens.len() * self.itemsize());
        if let Some(w) = self.width() {
            return encode_width(w, tokens, dst).map_err(|e| e.at_base(base).into());
        }
        let max = self.max_token();
        let n = self.itemsize();
        for (i, (&t, d)) in tokens.iter().zip(dst.chunks_exact_mut(n)).enumerate() {
            if t > max {
                return Err(FormatError::Codec(CodecError::OutOfRange {
                    offset: base + i as u64,
                    value: t,
                    width: Width::Bits(max.count_ones() as u8),
                }));
            }
            match self {
                DType::I8 => d[0] = t as u8,
                DType::I16 => d.copy_from_slice(&(t as i16).to_le_bytes()),
                DType::F32 => d.copy_from_slice(&(t as f32).to_le_bytes()),
                DType::F64 => d.copy_from_slice(&(t as f64).to_le_bytes()),
                _ => unreachable!("plain widths handled above"),
            }
        }
        Ok(())
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F64 => "f64",
            DType::F32 => "f32",
            DType::U16 => "u16",
        })
    }
}

impl FromStr for DType {
    type Err = FormatError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DType::ALL
            .into_iter()
            .find(|d| d.to_string() == s || d.numpy_name() == s)
            .ok_or_else(|| FormatError::UnknownDTypeName(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_round_trips_its_range() {
        for d in DType::ALL {
            assert_eq!(DType::from_code(d.code()).unwrap(), d);
            assert_eq!(d.to_string().parse::<DType>().unwrap(), d);
            assert_eq!(d.numpy_name().parse::<DType>().unwrap(), d);
            let tokens = [0, 1, d.max_token() / 2, d.max_token()];
            let mut b = vec![0; tokens.len() * d.itemsize()];
            d.encode(&tokens, &mut b, 0).unwrap();
            let mut out = [9; 4];
            d.decode(&b, &mut out, 0).unwrap();
            assert_eq!(out, tokens, "{d}");
            if d.max_token() < u32::MAX {
                let e = d.encode(&[0, d.max_token() + 1], &mut vec![0; 2 * d.itemsize()], 10);
                assert!(e.is_err(), "{d}");
            }
        }
        assert!(DType::from_code(9).is_err());
        assert_eq!(
            "int33".parse::<DType>().unwrap_err().to_string(),
            "unknown dtype 'int33' (expected one of u8, i8, i16, u16, i32, i64, f32, f64)"
        );
    }

    #[test]
    fn negative_and_fractional_values_are_rejected() {
        let e = DType::I16
            .decode(&(-3i16).to_le_bytes(), &mut [0], 7)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "corrupt int16 data: value -3 at offset 7 is not a token id (an integer in 0..=4294967295)"
        );
        let e = DType::F32
            .decode(&1.5f32.to_le_bytes(), &mut [0], 0)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "corrupt float32 data: value 1.5 at offset 0 is not a token id (an integer in 0..=4294967295)"
        );
        let mut b = Vec::new();
        for v in [5i32, -1] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        let e = DType::I32.decode(&b, &mut [0, 0], 100).unwrap_err();
        assert_eq!(
            e.to_string(),
            "stored value -1 at offset 101 is not a token id (i32 data must hold 0..=4294967295)"
        );
    }
}
