//! Session streams: the transport codec `stream:L`, whose batches share zstd's history.
//!
//! Why: a wire batch is small (8 × 4,097 u16 tokens is 64 KiB), and zstd compresses each one
//! alone far worse than a whole file: code repeats across files, prose across documents, and
//! every batch starts with an empty window. Kept as one zstd stream per session, flushed at
//! the end of each batch, the window carries over and a batch of 64 KiB compresses about as
//! well as the whole file (`bench/RESULTS.md`, codecs). Ids of a wider vocabulary than 16
//! bits go in the byte code of [`crate::bytecode`] with each id as its own rank: tokenizers
//! number their merges roughly by frequency, so the common ids take one or two bytes, and
//! zstd reads about 2 bytes a token instead of 3 for a 200k vocabulary. No table is needed,
//! so nothing is sent ahead. A batch whose width is `u8` or `u16` goes at that width: the
//! code would take as many bytes, and the plain form decodes without its pass (a 16-bit
//! vocabulary decodes at 1.6-2× the byte code's rate).
//!
//! A stream cannot be compressed on several threads at once, so a payload names its *lane*:
//! a producer may keep up to [`MAX_LANES`] streams and put batch `i` in lane `i % lanes`. The
//! agent keeps one a session: lanes lose each other's history, and on code two lanes already
//! store about a fifth more (`dquant bench codecs --lanes 2`). A payload is one lane's
//! flushed chunk:
//!
//! ```text
//! payload = tag:u8 chunk
//! tag     = 0x80 if the chunk starts the lane's stream (a fresh zstd frame), | lane (0..16)
//! ```
//!
//! A reader decodes records in order and keeps a context per lane; a chunk that starts its
//! lane resets it, so a resumed or failed-over session (which starts every lane afresh) needs
//! nothing from the one before. Windows are capped at [`WINDOW_LOG`] (2 MiB) on both ends, so
//! a peer can make a reader hold at most [`MAX_LANES`] such windows.
//!
//! A lane's level may change between chunks ([`StreamEncoder::set_level`]): zstd fixes a
//! frame's level when it starts (unless compressing on its own threads), so the next chunk
//! then starts a fresh frame at the new level. The decoder needs no level; each payload's
//! record names the level its chunk was compressed at.
//!
//! Written here because it is zstd's own streaming API (`zstd_safe`) plus a one-byte tag: no
//! crate frames a stream per lane.

use crate::{Codec, CodecError};
use zstd::zstd_safe::{
    self, zstd_sys::ZSTD_EndDirective, CCtx, CParameter, DCtx, DParameter, InBuffer, OutBuffer,
    ResetDirective,
};

/// The most lanes a session's stream may have (the lane is the tag's low 4 bits).
pub const MAX_LANES: usize = 16;
/// Tag bit: the chunk starts its lane's stream.
const FRESH: u8 = 0x80;
/// zstd's window, both ends: 2 MiB (what levels 3 to 8 pick for a stream of unknown size).
const WINDOW_LOG: u32 = 21;

fn zstd_error(code: usize) -> &'static str {
    zstd_safe::get_error_name(code)
}

/// One lane's compressor.
pub(crate) struct StreamEncoder {
    codec: Codec,
    cctx: CCtx<'static>,
    lane: u8,
    /// The next chunk starts the stream.
    fresh: bool,
    /// The level of the frame under way.
    level: i32,
}

impl StreamEncoder {
    /// Lane `lane` of a session in `codec`, a [`crate::Compression::Stream`] codec.
    pub fn new(codec: Codec, lane: usize) -> Result<Self, CodecError> {
        let level = codec.compression.zstd_level().unwrap_or_default();
        let lane = u8::try_from(lane)
            .ok()
            .filter(|&l| (l as usize) < MAX_LANES)
            .ok_or_else(|| {
                CodecError::backend(
                    codec,
                    format!("lane {lane} is over the limit of {}", MAX_LANES - 1),
                )
            })?;
        let mut cctx = CCtx::try_create()
            .ok_or_else(|| CodecError::backend(codec, "cannot allocate a zstd context"))?;
        for p in [
            CParameter::CompressionLevel(level),
            CParameter::WindowLog(WINDOW_LOG),
            CParameter::ContentSizeFlag(false),
            CParameter::ChecksumFlag(false),
            CParameter::DictIdFlag(false),
        ] {
            cctx.set_parameter(p)
                .map_err(|e| CodecError::backend(codec, zstd_error(e)))?;
        }
        Ok(StreamEncoder {
            codec,
            cctx,
            lane,
            fresh: true,
            level,
        })
    }

    /// Compresses the next chunks at zstd level `level`: when it is not the level of the
    /// frame under way, the next chunk starts a fresh frame (the lane's history starts
    /// again). Levels zstd does not have are clamped to its range.
    pub fn set_level(&mut self, level: i32) {
        let level = level.clamp(zstd_safe::min_c_level(), zstd_safe::max_c_level());
        if level != self.level {
            self.level = level;
            self.fresh = true;
        }
    }

    /// The level of the next chunk.
    pub fn level(&self) -> i32 {
        self.level
    }

    /// Appends the tag and `src` compressed and flushed to `out`; returns the bytes appended.
    /// On error `out` is left as it was and the lane starts afresh with its next chunk.
    pub fn compress(&mut self, src: &[u8], out: &mut Vec<u8>) -> Result<usize, CodecError> {
        let start = out.len();
        let r = self.compress_at(src, out, start);
        match &r {
            Ok(_) => self.fresh = false,
            Err(_) => {
                out.truncate(start);
                self.fresh = true;
                // A failed step leaves the context mid-frame: the next chunk starts a new one.
                let _ = self.cctx.reset(ResetDirective::SessionOnly);
            }
        }
        r
    }

    fn compress_at(
        &mut self,
        src: &[u8],
        out: &mut Vec<u8>,
        start: usize,
    ) -> Result<usize, CodecError> {
        let codec = self.codec;
        let failed = |e| CodecError::backend(codec, zstd_error(e));
        if self.fresh {
            self.cctx
                .reset(ResetDirective::SessionOnly)
                .map_err(failed)?;
            self.cctx
                .set_parameter(CParameter::CompressionLevel(self.level))
                .map_err(failed)?;
        }
        let tag = self.lane | if self.fresh { FRESH } else { 0 };
        out.resize(start + 1 + zstd_safe::compress_bound(src.len()) + 64, 0);
        out[start] = tag;
        let (mut pos, mut input) = (start + 1, InBuffer::around(src));
        loop {
            let mut output = OutBuffer::around_pos(&mut out[..], pos);
            let left = self
                .cctx
                .compress_stream2(&mut output, &mut input, ZSTD_EndDirective::ZSTD_e_flush)
                .map_err(failed)?;
            pos = output.pos();
            if left == 0 && input.pos() == src.len() {
                out.truncate(pos);
                return Ok(pos - start);
            }
            // Not all flushed (never within the bound above, but zstd decides): more room.
            out.resize(out.len() + (1 << 16), 0);
        }
    }
}

/// A reader's contexts, one per lane it has seen start.
#[derive(Default)]
pub(crate) struct StreamDecoders {
    lanes: Vec<Option<DCtx<'static>>>,
}

impl StreamDecoders {
    /// Decompresses the chunk of `payload`, a payload of `codec`, into the start of `dst`,
    /// which must hold all of it; returns its length.
    pub fn decompress(
        &mut self,
        codec: Codec,
        payload: &[u8],
        dst: &mut [u8],
    ) -> Result<usize, CodecError> {
        let (&tag, chunk) = payload
            .split_first()
            .ok_or_else(|| CodecError::corrupt(codec, "an empty payload has no lane tag"))?;
        let lane = (tag & !FRESH) as usize;
        if lane >= MAX_LANES {
            let why = format!(
                "lane tag {tag:#04x}: lane {lane} is over the limit of {}",
                MAX_LANES - 1
            );
            return Err(CodecError::corrupt(codec, why));
        }
        if self.lanes.len() <= lane {
            self.lanes.resize_with(lane + 1, || None);
        }
        let slot = &mut self.lanes[lane];
        if tag & FRESH != 0 {
            *slot = Some(fresh_dctx().map_err(|e| CodecError::corrupt(codec, e))?);
        }
        let dctx = slot.as_mut().ok_or_else(|| {
            let why = format!("lane {lane} continues a stream whose start this reader never saw");
            CodecError::corrupt(codec, why)
        })?;
        let r = decompress_chunk(dctx, chunk, dst).map_err(|e| CodecError::corrupt(codec, e));
        if r.is_err() {
            // A context that failed is in no known state: the lane must start again.
            *slot = None;
        }
        r
    }
}

/// Why a chunk could not be decoded (the caller names the codec).
type Reason = std::borrow::Cow<'static, str>;

fn fresh_dctx() -> Result<DCtx<'static>, Reason> {
    let mut d = DCtx::try_create().ok_or("cannot allocate a zstd context")?;
    d.set_parameter(DParameter::WindowLogMax(WINDOW_LOG))
        .map_err(zstd_error)?;
    Ok(d)
}

/// All of `chunk` through `dctx` into `dst`: an error if it needs more room than `dst` has.
fn decompress_chunk(
    dctx: &mut DCtx<'static>,
    chunk: &[u8],
    dst: &mut [u8],
) -> Result<usize, Reason> {
    let cap = dst.len();
    let mut output = OutBuffer::around(dst);
    let mut input = InBuffer::around(chunk);
    loop {
        let before = (input.pos(), output.pos());
        dctx.decompress_stream(&mut output, &mut input)
            .map_err(zstd_error)?;
        if input.pos() == chunk.len() {
            break;
        }
        if (input.pos(), output.pos()) == before || output.pos() == cap {
            return Err(too_long(cap));
        }
    }
    // zstd may hold decoded bytes it has not written yet: a full buffer might hide more.
    if output.pos() == cap {
        let mut probe = [0u8; 1];
        let mut more = OutBuffer::around(&mut probe[..]);
        let mut none = InBuffer::around(&[]);
        dctx.decompress_stream(&mut more, &mut none)
            .map_err(zstd_error)?;
        if more.pos() > 0 {
            return Err(too_long(cap));
        }
    }
    Ok(output.pos())
}

fn too_long(cap: usize) -> Reason {
    format!("decompresses to more than the {cap} bytes its batch may take").into()
}

#[cfg(test)]
mod tests {
    use crate::{Codec, CodecError, Decoder, Encoder};

    /// Text-like batches: a few hundred ids in Zipf-ish order over a 200k vocabulary, with
    /// repeats across batches.
    fn batches(n: usize, len: usize) -> Vec<Vec<u32>> {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let phrase: Vec<u32> = (0..512u32).map(|i| (i * 7919) % 199_999).collect();
        (0..n)
            .map(|_| {
                (0..len)
                    .map(|i| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        match x % 4 {
                            0 => phrase[i % phrase.len()],
                            1 => (x >> 8) as u32 % 200,
                            2 => (x >> 8) as u32 % 20_000,
                            _ => (x >> 8) as u32 % 199_999,
                        }
                    })
                    .collect()
            })
            .collect()
    }

    fn codec(s: &str) -> Codec {
        s.parse().unwrap()
    }

    #[test]
    fn lanes_round_trip_in_order_and_share_history_within_a_lane() {
        let c = codec("u24+stream:3");
        let data = batches(12, 8192);
        let mut lanes: Vec<Encoder> = (0..3).map(|l| Encoder::for_lane(c, l).unwrap()).collect();
        let mut dec = Decoder::new();
        for (i, b) in data.iter().enumerate() {
            let mut p = Vec::new();
            lanes[i % 3].encode(b, &mut p).unwrap();
            assert_eq!(p[0], (i % 3) as u8 | if i < 3 { 0x80 } else { 0 });
            let mut out = vec![0; b.len()];
            dec.decode(c, &p, &mut out).unwrap();
            assert_eq!(&out, b, "batch {i}");
        }
        // The same batch again in one lane costs a fraction of its first time.
        let mut e = Encoder::new(c).unwrap();
        let (mut first, mut again) = (Vec::new(), Vec::new());
        e.encode(&data[0], &mut first).unwrap();
        e.encode(&data[0], &mut again).unwrap();
        assert!(
            again.len() * 20 < first.len(),
            "{} vs {}",
            again.len(),
            first.len()
        );
        let mut out = vec![0; data[0].len()];
        let mut d = Decoder::new();
        d.decode(c, &first, &mut out).unwrap();
        d.decode(c, &again, &mut out).unwrap();
        assert_eq!(out, data[0]);
    }

    #[test]
    fn a_new_lane_start_resets_the_readers_context() {
        let c = codec("u24+stream:1");
        let data = batches(3, 1000);
        let mut dec = Decoder::new();
        let mut out = vec![0; 1000];
        for b in &data[..2] {
            // A fresh encoder each time: a resumed session starts its lane again.
            let mut p = Vec::new();
            Encoder::new(c).unwrap().encode(b, &mut p).unwrap();
            assert_eq!(p[0], 0x80);
            dec.decode(c, &p, &mut out).unwrap();
            assert_eq!(&out, b);
        }
        // A reader that never saw lane 0 start cannot read its second chunk.
        let mut e = Encoder::new(c).unwrap();
        let mut p = Vec::new();
        e.encode(&data[0], &mut p).unwrap();
        p.clear();
        e.encode(&data[1], &mut p).unwrap();
        assert_eq!(
            Decoder::new().decode(c, &p, &mut out).unwrap_err().to_string(),
            "u24+stream:1 payload is corrupt: lane 0 continues a stream whose start this reader never saw"
        );
    }

    #[test]
    fn bad_payloads_are_refused_with_their_reason() {
        let c = codec("u16+stream:3");
        let mut out = vec![0; 100];
        let err =
            |p: &[u8], out: &mut [u32]| Decoder::new().decode(c, p, out).unwrap_err().to_string();
        assert_eq!(
            err(&[], &mut out),
            "u16+stream:3 payload is corrupt: an empty payload has no lane tag"
        );
        assert_eq!(
            err(&[0x91, 1, 2], &mut out),
            "u16+stream:3 payload is corrupt: lane tag 0x91: lane 17 is over the limit of 15"
        );
        let tokens: Vec<u32> = (0..100).collect();
        let mut p = Vec::new();
        Encoder::new(c).unwrap().encode(&tokens, &mut p).unwrap();
        // Fewer tokens asked for than the chunk holds: the codes do not fit their room.
        let mut short = vec![0; 10];
        assert!(
            err(&p, &mut short).starts_with("u16+stream:3 payload is corrupt: "),
            "{}",
            err(&p, &mut short)
        );
        // A garbled chunk decodes to something or is an error, never a panic (the frames'
        // crc32c is what catches a changed byte; zstd's frame header has bits it ignores).
        let mut refused = 0;
        for i in 1..p.len() {
            let mut q = p.clone();
            q[i] ^= 0x5A;
            refused += Decoder::new().decode(c, &q, &mut out).is_err() as usize;
        }
        // Literal bytes change tokens; header and sequence bytes are refused.
        assert!(refused > 0, "none of {} garbled bytes refused", p.len());
        // Ids are checked against the width on both ends.
        let e = Encoder::new(c)
            .unwrap()
            .encode(&[1, 70_000], &mut Vec::new())
            .unwrap_err();
        assert!(
            matches!(
                e,
                CodecError::OutOfRange {
                    offset: 1,
                    value: 70_000,
                    ..
                }
            ),
            "{e}"
        );
        let (wide, narrow) = (codec("u24+stream:3"), codec("bits:17+stream:3"));
        let mut p = Vec::new();
        Encoder::new(wide)
            .unwrap()
            .encode(&[5, 200_000], &mut p)
            .unwrap();
        assert_eq!(
            Decoder::new()
                .decode(narrow, &p, &mut [0; 2])
                .unwrap_err()
                .to_string(),
            "bits:17+stream:3 payload is corrupt: token 1 is 200000, over bits:17's largest id 131071"
        );
    }

    #[test]
    fn inflate_gives_the_second_stages_bytes_and_advances_the_lane() {
        let c = codec("u16+stream:3");
        let data = batches(2, 1000)
            .into_iter()
            .map(|b| b.into_iter().map(|t| t % 65_536).collect::<Vec<u32>>())
            .collect::<Vec<_>>();
        let mut e = Encoder::new(c).unwrap();
        let payloads: Vec<Vec<u8>> = data
            .iter()
            .map(|b| {
                let mut p = Vec::new();
                e.encode(b, &mut p).unwrap();
                p
            })
            .collect();
        let mut d = Decoder::new();
        let le: Vec<u8> = data[0]
            .iter()
            .flat_map(|&t| (t as u16).to_le_bytes())
            .collect();
        assert_eq!(d.inflate(c, &payloads[0], 1000).unwrap(), &le[..]);
        // The lane moved on: the second batch decodes after the first was only inflated.
        let mut out = vec![0; 1000];
        d.decode(c, &payloads[1], &mut out).unwrap();
        assert_eq!(out, data[1]);
        // A block codec inflates to its width's bytes, exactly.
        let z = codec("u16+zstd:3");
        let mut p = Vec::new();
        Encoder::new(z).unwrap().encode(&data[0], &mut p).unwrap();
        assert_eq!(Decoder::new().inflate(z, &p, 1000).unwrap(), &le[..]);
        assert_eq!(
            Decoder::new().inflate(z, &p, 999).unwrap_err().to_string(),
            "u16+zstd:3 payload is corrupt: Destination buffer is too small"
        );
    }

    /// A level change starts a fresh frame at the new level, whose records name it; one
    /// reader decodes the whole stream in order, and a chunk at an unchanged level goes on
    /// with the lane's history.
    #[test]
    fn the_level_may_change_between_batches() {
        let c5 = codec("u24+stream:5");
        let mut e = Encoder::new(c5).unwrap();
        let mut d = Decoder::new();
        let text: Vec<u32> = (0..4000).map(|t| (t * 7919) % 70_000).collect();
        for (i, level) in [5, 5, 1, 1, 3, 3].into_iter().enumerate() {
            e.set_stream_level(level).unwrap();
            assert_eq!(e.codec().to_string(), format!("u24+stream:{level}"));
            let mut p = Vec::new();
            e.encode(&text, &mut p).unwrap();
            let fresh = p[0] & super::FRESH != 0;
            assert_eq!(fresh, i % 2 == 0, "batch {i}: the fresh tag");
            let mut out = vec![0; text.len()];
            d.decode(e.codec(), &p, &mut out).unwrap();
            assert_eq!(out, text, "batch {i}");
            if !fresh {
                // The repeat compresses against the batch before it: a few bytes.
                assert!(p.len() < 64, "batch {i}: {} bytes", p.len());
            }
        }
        assert_eq!(
            Encoder::new(codec("u16+zstd:3"))
                .unwrap()
                .set_stream_level(1)
                .unwrap_err()
                .to_string(),
            "u16+zstd:3 failed: only a stream codec changes its level"
        );
    }

    #[test]
    fn the_width_may_change_within_one_stream() {
        let (narrow, wide) = (codec("u16+stream:3"), codec("u24+stream:3"));
        let mut e = Encoder::new(wide).unwrap();
        let mut d = Decoder::new();
        for (i, c) in [wide, narrow, wide].into_iter().enumerate() {
            e.set_width(c).unwrap();
            let tokens: Vec<u32> = (0..500).map(|t| t * (i as u32 + 1)).collect();
            let mut p = Vec::new();
            e.encode(&tokens, &mut p).unwrap();
            let mut out = vec![0; 500];
            d.decode(c, &p, &mut out).unwrap();
            assert_eq!(out, tokens);
        }
        assert_eq!(
            e.set_width(codec("u16+zstd:3")).unwrap_err().to_string(),
            "u16+zstd:3 failed: an encoder of u24+stream:3 cannot switch to it"
        );
        assert_eq!(
            Encoder::for_lane(wide, 16).err().unwrap().to_string(),
            "u24+stream:3 failed: lane 16 is over the limit of 15"
        );
    }
}
