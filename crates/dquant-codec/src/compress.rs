//! Compression wrappers around a width's bytes.

use std::fmt;
use std::str::FromStr;

use crate::error::CodecError;

/// liblz4's high-compression levels (`LZ4HC_CLEVEL_MIN..=LZ4HC_CLEVEL_MAX`).
pub const LZ4HC_LEVELS: std::ops::RangeInclusive<i32> = 1..=12;
/// `lz4hc` without a level: liblz4's default high-compression level. Levels 10-12 (the
/// optimal parser) are 3-4x slower to write for under 1% fewer bytes on token ids.
pub const LZ4HC_DEFAULT: i32 = 9;

/// `stream` without a level: the transport preset's level. zstd 5 over the byte code stores
/// a 200k vocabulary's prose at 0.83× whole-file `zstd -3` of the int32 file, where level 3
/// stays near 0.89× (`bench/RESULTS.md`, codecs).
pub const STREAM_DEFAULT: i32 = 5;

/// A general-purpose compressor applied to the output of a [`crate::Width`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Compression {
    #[default]
    None,
    /// zstd at the given level (negative levels are zstd's fast modes).
    Zstd(i32),
    /// LZ4 block format (lz4_flex): cheapest to decode.
    Lz4,
    /// LZ4 block format written by liblz4's high-compression parser at the given level
    /// (1..=12): 14-16% smaller than [`Compression::Lz4`] on token ids, slow to write, and
    /// decoded by the same LZ4 block decoder (or a DPU's LZ4 engine) at the same speed. The
    /// `dpu` storage preset.
    Lz4Hc(i32),
    /// Frequency ranks in variable-length bytes ([`crate::RankTable`]), then zstd at the
    /// given level: the archive codec. Needs the dataset's rank table to encode and decode,
    /// so it is a storage codec only, never a wire codec.
    Ranked(i32),
    /// Ids in the byte code of the rank codec (each id its own rank), in a zstd stream at the
    /// given level that a session's batches share ([`crate::stream`]): the transport codec.
    /// Its payloads decode only in order, so it is a wire codec of plan streams only, never
    /// a storage codec.
    Stream(i32),
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

    /// `lz4hc:level`, the level checked against liblz4's high-compression range (1..=12).
    pub fn lz4hc(level: i32) -> Result<Self, CodecError> {
        if LZ4HC_LEVELS.contains(&level) {
            Ok(Compression::Lz4Hc(level))
        } else {
            Err(CodecError::Parse {
                input: format!("lz4hc:{level}"),
                reason: format!(
                    "lz4hc level must be in {}..={}",
                    LZ4HC_LEVELS.start(),
                    LZ4HC_LEVELS.end()
                ),
            })
        }
    }

    /// `rank+zstd:level`, the level checked as [`Compression::zstd`] checks it.
    pub fn ranked(level: i32) -> Result<Self, CodecError> {
        Self::zstd_underneath("rank+zstd", level, Compression::Ranked(level))
    }

    /// `stream:level`, the level checked as [`Compression::zstd`] checks it.
    pub fn stream(level: i32) -> Result<Self, CodecError> {
        Self::zstd_underneath("stream", level, Compression::Stream(level))
    }

    /// `c`, written `name:level`, if `level` is one zstd takes.
    fn zstd_underneath(name: &str, level: i32, c: Self) -> Result<Self, CodecError> {
        match Self::zstd(level) {
            Ok(_) => Ok(c),
            Err(CodecError::Parse { reason, .. }) => Err(CodecError::Parse {
                input: format!("{name}:{level}"),
                reason,
            }),
            Err(e) => Err(e),
        }
    }

    /// Whether payloads depend on the ones before them ([`Compression::Stream`]): they
    /// decode only in order, by one reader that saw every one.
    pub fn is_stream(self) -> bool {
        matches!(self, Compression::Stream(_))
    }

    /// The zstd level, for the compressions that are zstd underneath.
    pub fn zstd_level(self) -> Option<i32> {
        match self {
            Compression::Zstd(l) | Compression::Ranked(l) | Compression::Stream(l) => Some(l),
            _ => None,
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
            Compression::Lz4Hc(l) => (2, level(l)),
            Compression::Ranked(l) => (3, level(l)),
            Compression::Stream(l) => (4, level(l)),
        }
    }

    /// Inverse of [`code`](Compression::code). A level byte with `none`, or an LZ4 level
    /// outside `lz4hc`'s range, is an unknown code, not one to ignore, so that every code read
    /// back is the one written (found by the `batch_records` fuzz target).
    pub(crate) fn from_code(kind: u8, level: i8) -> Option<Self> {
        match (kind, level) {
            (0, 0) => Some(Compression::None),
            (1, _) => Some(Compression::Zstd(level as i32)),
            (2, 0) => Some(Compression::Lz4),
            (2, l) if LZ4HC_LEVELS.contains(&(l as i32)) => Some(Compression::Lz4Hc(l as i32)),
            (3, _) => Some(Compression::Ranked(level as i32)),
            (4, _) => Some(Compression::Stream(level as i32)),
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
            Compression::Lz4Hc(l) => write!(f, "lz4hc:{l}"),
            Compression::Ranked(l) => write!(f, "rank+zstd:{l}"),
            Compression::Stream(l) => write!(f, "stream:{l}"),
        }
    }
}

/// The compressions written `PREFIX:LEVEL`: the prefix, what the level is called in an
/// error, and the constructor that checks it.
type Make = fn(i32) -> Result<Compression, CodecError>;
const LEVELLED: [(&str, &str, Make); 4] = [
    ("lz4hc:", "lz4hc", Compression::lz4hc),
    ("rank+zstd:", "zstd", Compression::ranked),
    ("stream:", "zstd", Compression::stream),
    ("zstd:", "zstd", Compression::zstd),
];

/// `s` as `PREFIX:LEVEL` made by `make`, or `None` when `s` has another prefix.
fn levelled(
    s: &str,
    prefix: &str,
    what: &str,
    make: Make,
) -> Option<Result<Compression, CodecError>> {
    let level = s.strip_prefix(prefix)?;
    Some(match level.parse::<i32>() {
        Ok(l) => make(l),
        Err(_) => Err(CodecError::Parse {
            input: s.into(),
            reason: format!("{what} level must be an integer"),
        }),
    })
}

impl FromStr for Compression {
    type Err = CodecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(Compression::None),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd(3)),
            "rank+zstd" => Ok(Compression::Ranked(19)),
            "stream" => Ok(Compression::Stream(STREAM_DEFAULT)),
            "lz4hc" => Ok(Compression::Lz4Hc(LZ4HC_DEFAULT)),
            _ => LEVELLED
                .iter()
                .find_map(|&(prefix, what, make)| levelled(s, prefix, what, make))
                .unwrap_or_else(|| {
                    Err(CodecError::Parse {
                        input: s.into(),
                        reason: "expected none, lz4, lz4hc:LEVEL, zstd or zstd:LEVEL (or rank+zstd:LEVEL in storage, stream:LEVEL on the wire)"
                            .into(),
                    })
                }),
        }
    }
}
