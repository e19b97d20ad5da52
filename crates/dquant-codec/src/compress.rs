//! Compression wrappers around a width's bytes.

use std::fmt;
use std::str::FromStr;

use crate::error::CodecError;

/// A general-purpose compressor applied to the output of a [`crate::Width`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Compression {
    #[default]
    None,
    /// zstd at the given level (negative levels are zstd's fast modes).
    Zstd(i32),
    /// LZ4 block format (lz4_flex): cheapest to decode.
    Lz4,
}

impl Compression {
    /// zstd level, checked against the linked library's range.
    pub fn zstd(level: i32) -> Result<Self, CodecError> {
        let range = zstd::compression_level_range();
        if level != 0 && range.contains(&level) {
            Ok(Compression::Zstd(level))
        } else {
            Err(CodecError::Parse {
                input: format!("zstd:{level}"),
                reason: format!(
                    "zstd level must be in {}..={} and not 0",
                    range.start(),
                    range.end()
                ),
            })
        }
    }

    pub(crate) fn code(self) -> (u8, i8) {
        match self {
            Compression::None => (0, 0),
            Compression::Zstd(l) => (1, l.clamp(i8::MIN as i32, i8::MAX as i32) as i8),
            Compression::Lz4 => (2, 0),
        }
    }

    /// Inverse of [`code`](Compression::code). Only zstd has a level: a level byte with
    /// `none` or `lz4` is an unknown code, not one to ignore, so that every code read back
    /// is the one written (found by the `batch_records` fuzz target).
    pub(crate) fn from_code(kind: u8, level: i8) -> Option<Self> {
        match (kind, level) {
            (0, 0) => Some(Compression::None),
            (1, _) => Some(Compression::Zstd(level as i32)),
            (2, 0) => Some(Compression::Lz4),
            _ => None,
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Compression::None => f.write_str("none"),
            Compression::Zstd(l) => write!(f, "zstd:{l}"),
            Compression::Lz4 => f.write_str("lz4"),
        }
    }
}

impl FromStr for Compression {
    type Err = CodecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(Compression::None),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd(3)),
            _ => match s.strip_prefix("zstd:").map(str::parse::<i32>) {
                Some(Ok(l)) => Compression::zstd(l),
                Some(Err(_)) => Err(CodecError::Parse {
                    input: s.into(),
                    reason: "zstd level must be an integer".into(),
                }),
                None => Err(CodecError::Parse {
                    input: s.into(),
                    reason: "expected none, lz4, zstd or zstd:LEVEL".into(),
                }),
            },
        }
    }
}
