//! How a plan's batches are delivered: the dtype a consumer receives (`OutputDType`) and the
//! codec token blocks travel in (`WireCodec`), with the sizes derived from them.

use std::fmt;
use std::str::FromStr;

use dquant_codec::{Codec, Compression, Width};
use serde::{Deserialize, Serialize};

/// The dtype of token ids in delivered batches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputDType {
    /// Unsigned 16-bit: vocabularies up to 65536 ids (an id that does not fit is an error,
    /// never truncated).
    U16,
    /// Signed 32-bit (the default): what Megatron's GPTDataset hands to the model before
    /// PyTorch widens it.
    #[default]
    I32,
    /// Signed 64-bit: PyTorch's `torch.long`, ready for an embedding lookup.
    I64,
}

impl OutputDType {
    /// Bytes per token id.
    pub fn itemsize(self) -> usize {
        match self {
            OutputDType::U16 => 2,
            OutputDType::I32 => 4,
            OutputDType::I64 => 8,
        }
    }

    /// The codec width that stores this dtype (the plain wire codec of a batch that travels
    /// as it is delivered).
    pub fn width(self) -> Width {
        match self {
            OutputDType::U16 => Width::U16,
            OutputDType::I32 => Width::I32,
            OutputDType::I64 => Width::I64,
        }
    }

    /// The name used in plans (`u16`, `i32`, `i64`).
    pub fn as_str(self) -> &'static str {
        match self {
            OutputDType::U16 => "u16",
            OutputDType::I32 => "i32",
            OutputDType::I64 => "i64",
        }
    }
}

impl fmt::Display for OutputDType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The plan's `wire_codec`, parsed: what an agent encodes token blocks with on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WireCodec {
    /// `auto[+COMPRESSION]`: the agent picks the narrowest lossless width for the data, then
    /// applies this compression (`Compression::None` for plain `auto`).
    Auto(Compression),
    /// A fixed codec, e.g. `u16+zstd:3`.
    Fixed(Codec),
}

impl WireCodec {
    /// The codec it gives tokens no larger than `max_token`: a fixed codec as it is; `auto`
    /// the narrowest width, byte-aligned when compressing (bit-packed input compresses far
    /// worse).
    pub fn codec_for_max(self, max_token: u32) -> Codec {
        match self {
            WireCodec::Fixed(c) => c,
            WireCodec::Auto(compression) => Codec {
                width: Width::narrowest(max_token, compression != Compression::None),
                compression,
            },
        }
    }

    /// The most bytes `tokens` tokens may take in it (an `auto` codec's widest choice holds
    /// any u32 token).
    pub fn max_encoded_len(self, tokens: usize) -> usize {
        self.codec_for_max(u32::MAX).max_encoded_len(tokens)
    }

    /// The same codec with each record compressed alone: `stream:L` becomes `zstd:L`, for
    /// deliveries whose readers may not see every record from the first (shared streams).
    pub fn without_stream(self) -> Self {
        let alone = |c: Compression| match c {
            Compression::Stream(l) => Compression::Zstd(l),
            c => c,
        };
        match self {
            WireCodec::Fixed(c) => WireCodec::Fixed(Codec::new(c.width, alone(c.compression))),
            WireCodec::Auto(c) => WireCodec::Auto(alone(c)),
        }
    }

    /// The zstd level of its stream, when it is a stream codec (`transport`, `stream:L`).
    pub fn stream_level(self) -> Option<i32> {
        let c = self.compression();
        c.is_stream().then(|| c.zstd_level()).flatten()
    }

    /// The same codec compressed at zstd level `level` when it is zstd (`zstd:L`, or a
    /// stream, whose level may change within a session: see `dquant_codec::stream`); other
    /// codecs are returned as they are.
    pub fn with_zstd_level(self, level: i32) -> Self {
        let at = |c: Compression| match c {
            Compression::Stream(_) => Compression::Stream(level),
            Compression::Zstd(_) => Compression::Zstd(level),
            c => c,
        };
        match self {
            WireCodec::Fixed(c) => WireCodec::Fixed(Codec::new(c.width, at(c.compression))),
            WireCodec::Auto(c) => WireCodec::Auto(at(c)),
        }
    }

    /// Its compression, whatever the width.
    pub fn compression(self) -> Compression {
        match self {
            WireCodec::Fixed(c) => c.compression,
            WireCodec::Auto(c) => c,
        }
    }

    /// Whether it compresses (zstd or lz4): plain and bit-packed codecs cost about a copy, so
    /// only compression is worth spreading over worker threads.
    pub fn compresses(self) -> bool {
        self.compression() != Compression::None
    }
}

impl FromStr for WireCodec {
    type Err = dquant_codec::CodecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        // The transport preset: narrowed ids in a zstd stream a session's batches share.
        if s == "transport" {
            return Ok(WireCodec::Auto(Compression::Stream(
                dquant_codec::STREAM_DEFAULT,
            )));
        }
        let wire = match s.strip_prefix("auto") {
            Some("") => WireCodec::Auto(Compression::None),
            Some(rest) if rest.starts_with('+') => WireCodec::Auto(rest[1..].parse()?),
            _ => WireCodec::Fixed(s.parse()?),
        };
        // A rank table belongs to one stored dataset; a consumer has none to decode with.
        let reason = match wire.codec_for_max(0).compression {
            Compression::Ranked(_) => "rank+zstd is a storage codec (it needs the dataset's rank table); use zstd:LEVEL on the wire",
            // LZ4's high-compression parser writes 10-50 MB/s a core: a plan must not hold an
            // agent's core per stream (as limits.max_zstd_level keeps zstd's high levels off).
            Compression::Lz4Hc(_) => "lz4hc is a storage codec (its parser writes 10-50 MB/s a core); use lz4 on the wire, which the same decoder reads",
            _ => return Ok(wire),
        };
        Err(dquant_codec::CodecError::Parse {
            input: s.into(),
            reason: reason.into(),
        })
    }
}

impl fmt::Display for WireCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireCodec::Auto(Compression::None) => f.write_str("auto"),
            WireCodec::Auto(c) => write!(f, "auto+{c}"),
            WireCodec::Fixed(c) => write!(f, "{c}"),
        }
    }
}
