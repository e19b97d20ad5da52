//! [`Codec`] = width + compression, and the stateful [`Encoder`]/[`Decoder`] that reuse their
//! scratch buffers and compressor contexts across blocks (allocating a zstd context per 1 MiB
//! block would cost more than compressing it).

use std::fmt;
use std::str::FromStr;

use crate::bitpack;
use crate::bytecode::{decode_codes, encode_codes, max_codes_len, CODE_LIMIT};
use crate::compress::Compression;
use crate::error::CodecError;
use crate::kernels::{self, first_over};
use crate::ranks::{RankEncoder, RankTable};
use crate::stream::{StreamDecoders, StreamEncoder};
use crate::width::Width;

/// How a run of token ids is represented: a storage width, optionally compressed.
///
/// Text form: `WIDTH[+zstd:L|+lz4|+rank+zstd:L]`, e.g. `u16`, `bits:17`, `u16+zstd:3`,
/// `u24+lz4`, `u24+rank+zstd:19`. The width is the plain form a block falls back to when
/// compression would grow it, and bounds the ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Codec {
    pub width: Width,
    pub compression: Compression,
}

impl Codec {
    pub const fn plain(width: Width) -> Self {
        Codec {
            width,
            compression: Compression::None,
        }
    }

    pub const fn new(width: Width, compression: Compression) -> Self {
        Codec { width, compression }
    }

    /// Serialises the codec into 4 bytes: width kind, width bits, compression kind, level.
    pub fn to_bytes(self) -> [u8; 4] {
        let (wk, wb) = self.width.code();
        let (ck, cl) = self.compression.code();
        [wk, wb, ck, cl as u8]
    }

    /// Inverse of [`Codec::to_bytes`]; `None` for unknown codes.
    pub fn from_bytes(b: [u8; 4]) -> Option<Self> {
        Some(Codec {
            width: Width::from_code(b[0], b[1])?,
            compression: Compression::from_code(b[2], b[3] as i8)?,
        })
    }

    /// Size of `n` tokens before compression.
    pub fn raw_len(self, n: usize) -> usize {
        self.width.encoded_len(n)
    }

    /// The most bytes `n` tokens may take before compression, what a decoder holds: the
    /// width's size, or for [`Compression::Ranked`] the rank codes' (up to 4 bytes a token,
    /// whatever the width).
    pub fn max_raw_len(self, n: usize) -> usize {
        match self.compression {
            Compression::Ranked(_) | Compression::Stream(_) => max_codes_len(n),
            _ => self.raw_len(n),
        }
    }

    /// The most bytes `n` tokens may take in this codec: the plain length plus what
    /// compression adds to data it cannot compress (zstd and lz4 add far less). A producer
    /// reserves this much; a receiver refuses more (a corrupt or hostile peer must not make it
    /// allocate gigabytes).
    pub fn max_encoded_len(self, n: usize) -> usize {
        let raw = self.max_raw_len(n);
        raw + raw / 16 + 4096
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.compression {
            Compression::None => write!(f, "{}", self.width),
            c => write!(f, "{}+{}", self.width, c),
        }
    }
}

impl FromStr for Codec {
    type Err = CodecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (w, c) = match s.split_once('+') {
            Some((w, c)) => (w, c.parse()?),
            None => (s, Compression::None),
        };
        Ok(Codec::new(w.parse()?, c))
    }
}

/// Stores tokens at `width` into `dst` (exactly `width.encoded_len(src.len())` bytes),
/// validating every token.
pub fn encode_width(width: Width, src: &[u32], dst: &mut [u8]) -> Result<(), CodecError> {
    match width {
        Width::Bits(b) => {
            if let Some(i) = first_over(src, width.max_token()) {
                return Err(kernels::out_of_range(width, &src[i..i + 1], i));
            }
            bitpack::pack(b, src, dst);
            Ok(())
        }
        w => kernels::store_plain(w, src, dst),
    }
}

/// Loads `dst.len()` tokens stored at `width` from `src` (exactly the encoded length).
pub fn decode_width(width: Width, src: &[u8], dst: &mut [u32]) -> Result<(), CodecError> {
    let expected = width.encoded_len(dst.len());
    if src.len() != expected {
        return Err(CodecError::LengthMismatch {
            codec: width.to_string(),
            tokens: dst.len(),
            expected,
            actual: src.len(),
        });
    }
    match width {
        Width::Bits(b) => {
            bitpack::unpack(b, src, dst);
            Ok(())
        }
        w => kernels::load_plain(w, src, dst),
    }
}

fn backend(codec: Codec, e: std::io::Error) -> CodecError {
    CodecError::backend(codec, e.to_string())
}

/// Encodes token slices with one codec, reusing buffers and compressor state.
pub struct Encoder {
    codec: Codec,
    zstd: Option<zstd::bulk::Compressor<'static>>,
    scratch: Vec<u8>,
    /// For [`Compression::Ranked`].
    ranks: RankEncoder,
    /// For [`Compression::Stream`]: the lane's stream.
    stream: Option<StreamEncoder>,
}

impl Encoder {
    /// An encoder for any codec but [`Compression::Ranked`], which needs
    /// [`Encoder::with_ranks`].
    pub fn new(codec: Codec) -> Result<Self, CodecError> {
        Self::for_lane(codec, 0)
    }

    /// An encoder for `codec` that ranks ids by `table` (used when the codec is
    /// [`Compression::Ranked`]).
    pub fn with_ranks(codec: Codec, table: &RankTable) -> Result<Self, CodecError> {
        Self::build(codec, table.encoder(), 0)
    }

    /// [`Encoder::new`] for lane `lane` of a [`Compression::Stream`] session (other codecs
    /// have one lane, 0).
    pub fn for_lane(codec: Codec, lane: usize) -> Result<Self, CodecError> {
        if codec.compression.needs_rank_table() {
            return Err(CodecError::backend(codec, "needs the dataset's rank table"));
        }
        Self::build(codec, RankEncoder::default(), lane)
    }

    /// Encodes the next batches with `codec`, which differs from this encoder's only in
    /// width: a stream's byte code does not depend on the width (which only bounds the ids),
    /// so an `auto` wire codec that narrows batch by batch keeps one stream.
    pub fn set_width(&mut self, codec: Codec) -> Result<(), CodecError> {
        if codec.compression != self.codec.compression || !codec.compression.is_stream() {
            return Err(CodecError::backend(
                codec,
                format!("an encoder of {} cannot switch to it", self.codec),
            ));
        }
        self.codec = codec;
        Ok(())
    }

    /// A stream codec's encoder compresses its next batches at zstd level `level` (a fresh
    /// frame from the next batch when the level changes; see [`crate::stream`]); its codec
    /// becomes `stream:LEVEL`, which the batches' records name. Other codecs cannot.
    pub fn set_stream_level(&mut self, level: i32) -> Result<(), CodecError> {
        let codec = self.codec;
        let Some(stream) = self.stream.as_mut() else {
            return Err(CodecError::backend(
                codec,
                "only a stream codec changes its level",
            ));
        };
        stream.set_level(level);
        self.codec = Codec::new(codec.width, Compression::Stream(stream.level()));
        Ok(())
    }

    fn build(codec: Codec, ranks: RankEncoder, lane: usize) -> Result<Self, CodecError> {
        let stream = match codec.compression {
            Compression::Stream(_) => Some(StreamEncoder::new(codec, lane)?),
            _ => None,
        };
        let zstd = match codec.compression {
            Compression::Zstd(level) | Compression::Ranked(level) => {
                let mut c = zstd::bulk::Compressor::new(level).map_err(|e| backend(codec, e))?;
                // The block layer knows every payload's size and checksums it; zstd's own
                // frame fields would only repeat that.
                c.include_contentsize(false)
                    .map_err(|e| backend(codec, e))?;
                c.include_checksum(false).map_err(|e| backend(codec, e))?;
                c.include_dictid(false).map_err(|e| backend(codec, e))?;
                Some(c)
            }
            _ => None,
        };
        Ok(Encoder {
            codec,
            zstd,
            scratch: Vec::new(),
            ranks,
            stream,
        })
    }

    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// Appends the encoding of `tokens` to `out` and returns the number of bytes appended.
    /// On error `out` is left as it was.
    pub fn encode(&mut self, tokens: &[u32], out: &mut Vec<u8>) -> Result<usize, CodecError> {
        let start = out.len();
        let raw_len = self.codec.raw_len(tokens.len());
        if self.codec.compression == Compression::None {
            out.resize(start + raw_len, 0);
            if let Err(e) = encode_width(self.codec.width, tokens, &mut out[start..]) {
                out.truncate(start);
                return Err(e);
            }
            return Ok(raw_len);
        }
        if let Some(stream) = &mut self.stream {
            return encode_stream(self.codec, stream, tokens, &mut self.scratch, out);
        }
        if self.codec.compression.needs_rank_table() {
            self.scratch.clear();
            self.ranks.encode(tokens, &mut self.scratch)?;
        } else {
            self.scratch.resize(raw_len, 0);
            encode_width(self.codec.width, tokens, &mut self.scratch)?;
        }
        match self.compress(out) {
            Ok(n) => {
                out.truncate(start + n);
                Ok(n)
            }
            Err(e) => {
                out.truncate(start);
                Err(e)
            }
        }
    }

    /// Compresses the scratch buffer onto the end of `out` (grown to the bound first).
    fn compress(&mut self, out: &mut Vec<u8>) -> Result<usize, CodecError> {
        let (codec, start, len) = (self.codec, out.len(), self.scratch.len());
        match (&mut self.zstd, codec.compression) {
            (Some(z), Compression::Zstd(_) | Compression::Ranked(_)) => {
                out.resize(start + zstd::zstd_safe::compress_bound(len), 0);
                z.compress_to_buffer(&self.scratch, &mut out[start..])
                    .map_err(|e| backend(codec, e))
            }
            // liblz4 1.10's optimal parser (levels 10-12) faults on empty input; lz4_flex
            // writes the same one-byte empty block.
            (_, Compression::Lz4Hc(level)) if len > 0 => {
                let bound = lz4::block::compress_bound(len).map_err(|e| backend(codec, e))?;
                out.resize(start + bound, 0);
                let mode = Some(lz4::block::CompressionMode::HIGHCOMPRESSION(level));
                lz4::block::compress_to_buffer(&self.scratch, mode, false, &mut out[start..])
                    .map_err(|e| backend(codec, e))
            }
            (_, Compression::Lz4 | Compression::Lz4Hc(_)) => {
                out.resize(start + lz4_flex::block::get_maximum_output_size(len), 0);
                lz4_flex::block::compress_into(&self.scratch, &mut out[start..]).map_err(|e| {
                    CodecError::Backend {
                        codec: codec.to_string(),
                        reason: e.to_string(),
                    }
                })
            }
            _ => unreachable!("encoder state matches its codec"),
        }
    }
}

/// Whether a stream codec of `width` carries its ids at that width rather than in the byte
/// code: a 16-bit vocabulary's ids take 2 bytes either way, and the plain form decodes
/// without the byte code's pass (wider vocabularies save a byte a common token in the code).
fn stream_plain(width: Width) -> bool {
    matches!(width, Width::U8 | Width::U16)
}

/// `tokens` (each checked against the codec's width) in the byte code (or at a 8- or 16-bit
/// width, as it is), then into `stream`, appended to `out`.
fn encode_stream(
    codec: Codec,
    stream: &mut StreamEncoder,
    tokens: &[u32],
    scratch: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> Result<usize, CodecError> {
    if let Some(i) = first_over(tokens, codec.width.max_token()) {
        return Err(kernels::out_of_range(codec.width, &tokens[i..i + 1], i));
    }
    if stream_plain(codec.width) {
        scratch.resize(codec.raw_len(tokens.len()), 0);
        encode_width(codec.width, tokens, scratch)?;
        return stream.compress(scratch, out);
    }
    scratch.clear();
    encode_codes(tokens, scratch, |t| (t < CODE_LIMIT).then_some(t)).map_err(|(i, t)| {
        CodecError::backend(
            codec,
            format!(
                "token {t} at offset {i} is over the byte code's largest id {}",
                CODE_LIMIT - 1
            ),
        )
    })?;
    stream.compress(scratch, out)
}

/// Decodes payloads of any codec, reusing buffers and the zstd context. Payloads of a
/// [`Compression::Stream`] codec must come in the order they were encoded, each once.
pub struct Decoder {
    zstd: Option<zstd::bulk::Decompressor<'static>>,
    scratch: Vec<u8>,
    streams: StreamDecoders,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Decoder {
    pub fn new() -> Self {
        Decoder {
            zstd: None,
            scratch: Vec::new(),
            streams: StreamDecoders::default(),
        }
    }

    /// Decodes exactly `out.len()` tokens encoded with `codec` from `payload`. A
    /// [`Compression::Ranked`] payload needs [`Decoder::decode_with`] and its table.
    pub fn decode(
        &mut self,
        codec: Codec,
        payload: &[u8],
        out: &mut [u32],
    ) -> Result<(), CodecError> {
        self.decode_with(codec, payload, None, out)
    }

    /// [`Decoder::decode`], with the dataset's rank table for [`Compression::Ranked`]
    /// payloads (other codecs ignore it).
    pub fn decode_with(
        &mut self,
        codec: Codec,
        payload: &[u8],
        ranks: Option<&RankTable>,
        out: &mut [u32],
    ) -> Result<(), CodecError> {
        // A ranked payload's table, checked before anything is decompressed.
        let table = match codec.compression {
            Compression::Ranked(_) => Some(ranks.ok_or_else(|| CodecError::Corrupt {
                codec: codec.to_string(),
                reason: "no rank table to decode it with".into(),
            })?),
            _ => None,
        };
        let raw = self.inflate(codec, payload, out.len())?;
        match (codec.compression, table) {
            (Compression::Stream(_), _) => stream_tokens(codec, raw, out),
            (_, Some(table)) => table.decode(raw, out).map_err(|e| e.named(codec)),
            _ => decode_width(codec.width, raw, out),
        }
    }

    /// The first of [`Decoder::decode`]'s two stages alone, for a payload of `tokens` tokens:
    /// the payload inflated (zstd, LZ4, or a stream's chunk, which advances its lane as
    /// `decode` would) into the bytes the second stage reads (a width's bytes, or the byte
    /// code of [`crate::RankTable`]). `decode` runs it, then the second stage; `dquant bench
    /// codecs` runs it alone, to measure where decode time goes. Nothing in the result is
    /// checked beyond what inflating checks.
    pub fn inflate<'a>(
        &'a mut self,
        codec: Codec,
        payload: &'a [u8],
        tokens: usize,
    ) -> Result<&'a [u8], CodecError> {
        match codec.compression {
            Compression::Stream(_) => {
                self.scratch.resize(codec.max_raw_len(tokens), 0);
                let n = self.streams.decompress(codec, payload, &mut self.scratch)?;
                Ok(&self.scratch[..n])
            }
            Compression::Ranked(_) => self.decompress(codec, payload, max_codes_len(tokens), false),
            _ => self.decompress(codec, payload, codec.raw_len(tokens), true),
        }
    }

    /// `payload` decompressed (as it is, for no compression) into at most `cap` bytes, and
    /// exactly `cap` if `exact`.
    fn decompress<'a>(
        &'a mut self,
        codec: Codec,
        payload: &'a [u8],
        cap: usize,
        exact: bool,
    ) -> Result<&'a [u8], CodecError> {
        let corrupt = |reason: String| CodecError::Corrupt {
            codec: codec.to_string(),
            reason,
        };
        let n = match codec.compression {
            Compression::None => return Ok(payload),
            Compression::Zstd(_) | Compression::Ranked(_) => {
                let z = match &mut self.zstd {
                    Some(z) => z,
                    None => self
                        .zstd
                        .insert(zstd::bulk::Decompressor::new().map_err(|e| backend(codec, e))?),
                };
                self.scratch.resize(cap, 0);
                z.decompress_to_buffer(payload, &mut self.scratch[..])
                    .map_err(|e| corrupt(e.to_string()))?
            }
            Compression::Lz4 | Compression::Lz4Hc(_) => {
                self.scratch.resize(cap, 0);
                lz4_flex::block::decompress_into(payload, &mut self.scratch)
                    .map_err(|e| corrupt(e.to_string()))?
            }
            Compression::Stream(_) => {
                return Err(corrupt("a stream payload needs its lane".into()))
            }
        };
        if exact && n != cap {
            return Err(corrupt(format!(
                "decompressed to {n} bytes, expected {cap}"
            )));
        }
        Ok(&self.scratch[..n])
    }
}

/// The tokens of a [`Compression::Stream`] payload's inflated chunk `raw`: the width's bytes,
/// or the byte code with every id checked against the codec's width.
fn stream_tokens(codec: Codec, raw: &[u8], out: &mut [u32]) -> Result<(), CodecError> {
    if stream_plain(codec.width) {
        return decode_width(codec.width, raw, out);
    }
    decode_codes(raw, out, |r, _| Ok(r)).map_err(|e| e.named(codec))?;
    // Checked over the whole batch once it is decoded (a vector pass), not token by token
    // in the byte code's loop: the check there cost that loop about a seventh of its rate.
    let (width, max) = (codec.width, codec.width.max_token());
    match crate::kernels::first_over(out, max) {
        None => Ok(()),
        Some(i) => {
            let why = format!("token {i} is {}, over {width}'s largest id {max}", out[i]);
            Err(CodecError::corrupt(codec, why))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codec_text_round_trip() {
        for s in [
            "u16",
            "bits:17",
            "u16+zstd:3",
            "u24+lz4",
            "u16+lz4hc:9",
            "bits:17+lz4hc:1",
            "i64+zstd:-3",
            "bits:1+zstd:19",
            "u24+rank+zstd:19",
            "u16+rank+zstd:-5",
            "u24+stream:5",
            "bits:17+stream:-1",
        ] {
            let c: Codec = s.parse().unwrap();
            assert_eq!(c.to_string(), s);
            assert_eq!(Codec::from_bytes(c.to_bytes()), Some(c));
        }
        assert_eq!(
            "u16+gzip".parse::<Codec>().unwrap_err().to_string(),
            "invalid codec 'gzip': expected none, lz4, lz4hc:LEVEL, zstd or zstd:LEVEL (or rank+zstd:LEVEL in storage, stream:LEVEL on the wire)"
        );
        assert_eq!(
            "u16+lz4hc".parse::<Codec>().unwrap().to_string(),
            "u16+lz4hc:9"
        );
        assert_eq!(
            "u24+stream".parse::<Codec>().unwrap().to_string(),
            "u24+stream:5"
        );
        assert_eq!(
            "u16+lz4hc:13".parse::<Codec>().unwrap_err().to_string(),
            "invalid codec 'lz4hc:13': lz4hc level must be in 1..=12"
        );
        for (codec, what) in [
            ("lz4hc:x", "lz4hc"),
            ("rank+zstd:x", "zstd"),
            ("zstd:x", "zstd"),
        ] {
            assert_eq!(
                format!("u16+{codec}")
                    .parse::<Codec>()
                    .unwrap_err()
                    .to_string(),
                format!("invalid codec '{codec}': {what} level must be an integer")
            );
        }
        assert_eq!(
            "u16+zstd:99".parse::<Codec>().unwrap_err().to_string(),
            "invalid codec 'zstd:99': zstd level must be in -131072..=22 and not 0"
        );
    }

    #[test]
    fn ranked_payloads_round_trip_with_their_table_only() {
        let codec: Codec = "u24+rank+zstd:3".parse().unwrap();
        let tokens: Vec<u32> = (0..50_000u32).map(|i| (i * i) % 70_001).collect();
        let mut counts = vec![0u64; 70_001];
        tokens.iter().for_each(|&t| counts[t as usize] += 1);
        let table = RankTable::from_counts(&counts).unwrap();
        assert_eq!(
            Encoder::new(codec).err().unwrap().to_string(),
            "u24+rank+zstd:3 failed: needs the dataset's rank table"
        );
        let mut enc = Encoder::with_ranks(codec, &table).unwrap();
        let mut payload = vec![7];
        enc.encode(&tokens, &mut payload).unwrap();
        let mut dec = Decoder::new();
        let mut out = vec![0; tokens.len()];
        dec.decode_with(codec, &payload[1..], Some(&table), &mut out)
            .unwrap();
        assert_eq!(out, tokens);
        assert_eq!(
            dec.decode(codec, &payload[1..], &mut out)
                .unwrap_err()
                .to_string(),
            "u24+rank+zstd:3 payload is corrupt: no rank table to decode it with"
        );
        // One token too many asked for: the codes run out.
        let mut more = vec![0; tokens.len() + 1];
        assert_eq!(
            dec.decode_with(codec, &payload[1..], Some(&table), &mut more)
                .unwrap_err()
                .to_string(),
            format!(
                "u24+rank+zstd:3 payload is corrupt: the code of token {} is cut off",
                tokens.len()
            )
        );
        let e = enc.encode(&[1, 70_002], &mut payload).unwrap_err();
        assert_eq!(
            e.to_string(),
            "token 70002 at offset 1 is not in the dataset's rank table"
        );
    }

    #[test]
    fn encode_failure_leaves_output_untouched() {
        let mut enc = Encoder::new("u16+zstd:1".parse().unwrap()).unwrap();
        let mut out = vec![1, 2, 3];
        let e = enc.encode(&[1, 2, 70000, 4], &mut out).unwrap_err();
        assert_eq!(out, vec![1, 2, 3]);
        assert_eq!(
            e.to_string(),
            "token 70000 at offset 2 does not fit in u16 (max 65535); it needs 17 bits: use bits:17 or wider"
        );
    }
}
