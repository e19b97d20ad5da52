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
    /// Frequency ranks in variable-length bytes ([`crate::RankTable`]), then zstd at the
    /// given level: the archive codec. Needs the dataset's rank table to encode and decode,
    /// so it is a storage codec only, never a wire codec.
    Ranked(i32),
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

    /// `rank+zstd:level`, the level checked as [`Compression::zstd`] checks it.
    pub fn ranked(level: i32) -> Result<Self, CodecError> {
        match Self::zstd(level) {
            Ok(_) => Ok(Compression::Ranked(level)),
            Err(CodecError::Parse { reason, .. }) => Err(CodecError::Parse {
                input: format!("rank+zstd:{level}"),
                reason,
            }),
            Err(e) => Err(e),
        }
    }

    /// Whether this compression needs a dataset's rank table ([`Compression::Ranked`]).
    pub fn needs_rank_table(self) -> bool {
        matches!(self, Compression::Ranked(_))
    }

    pub(crate) fn code(self) -> (u8, i8) {
        let level = |l: i32| l.clamp(i8::MIN as i32, i8::MAX as i32) as i8;
        match self {
            Compression::None => (0, 0),
            Compression::Zstd(l) => (1, level(l)),
            Compression::Lz4 => (2, 0),
            Compression::Ranked(l) => (3, level(l)),
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
            (3, _) => Some(Compression::Ranked(level as i32)),
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
            Compression::Ranked(l) => write!(f, "rank+zstd:{l}"),
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
            "rank+zstd" => Ok(Compression::Ranked(19)),
            _ if s.starts_with("rank+zstd:") => match s["rank+zstd:".len()..].parse::<i32>() {
                Ok(l) => Compression::ranked(l),
                Err(_) => Err(CodecError::Parse {
                    input: s.into(),
                    reason: "zstd level must be an integer".into(),
                }),
            },
            _ => match s.strip_prefix("zstd:").map(str::parse::<i32>) {
                Some(Ok(l)) => Compression::zstd(l),
                Some(Err(_)) => Err(CodecError::Parse {
                    input: s.into(),
                    reason: "zstd level must be an integer".into(),
                }),
                None => Err(CodecError::Parse {
                    input: s.into(),
                    reason:
                        "expected none, lz4, zstd or zstd:LEVEL (or rank+zstd:LEVEL in storage)"
                            .into(),
                }),
            },
        }
    }
}
