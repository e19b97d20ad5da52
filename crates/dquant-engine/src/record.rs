//! Batch records: a batch's header and its tokens in the codec it travels in.
//!
//! Every batch that leaves the engine (over TCP frames, into a shared-memory ring, into a
//! benchmark's counters) is a [`BatchHeader`] followed by its payload. The codec choice, the
//! fit check for a fixed wire codec and the header are made here once, so the agent's
//! transports and the benchmarks that measure them encode batches the same way.

use std::collections::HashMap;

use dquant_codec::kernels::max_token;
use dquant_codec::{Codec, CodecError, Compression, Encoder, Width};
use dquant_plan::{OutputDType, WireCodec};
use dquant_wire::record::RECORD_HEADER_LEN;
use dquant_wire::BatchHeader;

use crate::batch::Trailer;
use crate::batch::{BatchInfo, TokenBatch};
use crate::fit::check_fits;
use crate::EngineError;
use crate::Pipeline;
use crate::{doc_section, origin_section};

/// The codec `wire` gives `tokens`: a fixed codec as it is (the tokens are not scanned),
/// `auto` from their largest token.
pub fn codec_for(wire: WireCodec, tokens: &[u32]) -> Codec {
    match wire {
        WireCodec::Fixed(c) => c,
        WireCodec::Auto(_) => wire.codec_for_max(max_token(tokens)),
    }
}

/// The codec `wire` gives batch `b`, every token checked to fit it (a fixed codec may not
/// hold a token; the error names the codec, the source and the token). `bound`: no token of
/// the plan's sources exceeds it, so checks against a codec that holds it are skipped.
pub fn checked_codec(
    wire: WireCodec,
    bound: u32,
    b: &TokenBatch<'_>,
    sample_len: usize,
) -> Result<Codec, EngineError> {
    let codec = codec_for(wire, b.tokens);
    // An `auto` codec's width was chosen from this batch's largest token: it fits.
    if matches!(wire, WireCodec::Fixed(_)) && bound > codec.width.max_token() {
        check_fits(b, sample_len, codec.width, &format!("wire codec {codec}: "))?;
    }
    Ok(codec)
}

/// The plain codec of an output dtype: how a batch travels when it is delivered as it is.
pub fn plain_codec(output: OutputDType) -> Codec {
    Codec {
        width: output.width(),
        compression: Compression::None,
    }
}

/// The record header of batch `b`: `b.samples` samples of `sample_len` tokens, in
/// `payload_len` bytes of `codec`. A payload over 4 GiB (the header's field) is an error.
pub fn batch_header(
    codec: Codec,
    b: &BatchInfo,
    sample_len: usize,
    payload_len: usize,
) -> Result<BatchHeader, EngineError> {
    let too_big = || {
        EngineError::Usage(format!(
            "batch {} encodes to {payload_len} bytes, over 4 GiB",
            b.index
        ))
    };
    Ok(BatchHeader {
        codec,
        index: b.index,
        samples: u32::try_from(b.samples).map_err(|_| too_big())?,
        sample_len: u32::try_from(sample_len).map_err(|_| too_big())?,
        payload_len: u32::try_from(payload_len).map_err(|_| too_big())?,
        trailer_len: 0,
        cursor_epoch: b.cursor.epoch,
        cursor_consumed: b.cursor.consumed_samples,
    })
}

/// Writes the trailer of the batch of `h` into `body` after the `h.payload_len` bytes of its
/// tokens, and counts it in `h`: the batch's document starts when the plan has boundaries
/// ([`crate::doc_section`]), its origins when the plan has provenance
/// ([`crate::origin_section`]), then the cursor trailer (the blend's counts at the cursor
/// after the batch, empty for a single source). The record's room includes it
/// ([`dquant_plan::Plan::trailer_bound`]).
pub fn put_trailer(
    h: &mut BatchHeader,
    t: Trailer<'_>,
    body: &mut [u8],
) -> Result<(), EngineError> {
    let Trailer {
        docs,
        origins,
        blend,
    } = t;
    let no_room =
        |what: &str| EngineError::Usage(format!("batch {}: no room for its {what}", h.index));
    let mut at = h.payload_len as usize;
    if let Some(d) = docs {
        let room = body
            .get_mut(at..)
            .ok_or_else(|| no_room("document starts"))?;
        at += doc_section::encode(d, room).ok_or_else(|| no_room("document starts"))?;
    }
    if let Some(o) = origins {
        let room = body.get_mut(at..).ok_or_else(|| no_room("provenance"))?;
        at += origin_section::encode(o, room).ok_or_else(|| no_room("provenance"))?;
    }
    let len = 8 * blend.len();
    let room = body
        .get_mut(at..at + len)
        .ok_or_else(|| no_room("cursor trailer"))?;
    for (out, c) in room.chunks_exact_mut(8).zip(blend) {
        out.copy_from_slice(&c.to_le_bytes());
    }
    let trailer = (at + len - h.payload_len as usize) as u32;
    h.trailer_len = trailer;
    h.payload_len = h.payload_len.checked_add(trailer).ok_or_else(|| {
        EngineError::Usage(format!("batch {} encodes to more than 4 GiB", h.index))
    })?;
    Ok(())
}

/// Makes `pipeline`'s next batch as a whole record in `room`, in the plain codec of
/// `output`: the header's [`RECORD_HEADER_LEN`] bytes, the tokens written in place (from a
/// dataset that stores the output dtype, one read from the page cache into `room`), then
/// the trailer. Returns the header (the record is `RECORD_HEADER_LEN + payload_len` bytes)
/// and where the batch sits in the stream; `None` at the end. Every path that delivers
/// batches as they are (the agent into a ring or a frame, a reader in-process, a DataLoader
/// worker into its ring) makes them here.
pub fn plain_record(
    pipeline: &mut Pipeline,
    output: OutputDType,
    room: &mut [u8],
) -> Result<Option<(BatchHeader, BatchInfo)>, EngineError> {
    let sample_len = pipeline.sample_len();
    let width = output.width();
    let Some((head, body)) = room.split_at_mut_checked(RECORD_HEADER_LEN) else {
        let m = format!(
            "a record's room of {} bytes is shorter than its header",
            room.len()
        );
        return Err(EngineError::Usage(m));
    };
    let Some(b) = pipeline.next_batch_into(width, body)? else {
        return Ok(None);
    };
    let payload_len = width.encoded_len(b.samples * sample_len);
    let mut h = batch_header(plain_codec(output), &b, sample_len, payload_len)?;
    put_trailer(&mut h, b.trailer(), body)?;
    head.copy_from_slice(&h.encode());
    Ok(Some((h, b)))
}

/// Bytes of room [`plain_record`] may need for one of `pipeline`'s batches in `output`: the
/// header, a full batch's tokens and the largest trailer. Saturating: a plan can ask for more
/// than memory holds, and the allocation or the transport's size check then refuses it,
/// where wrapped arithmetic would hand out a small room.
pub fn plain_record_len(pipeline: &Pipeline, output: OutputDType) -> usize {
    let tokens = usize::try_from(pipeline.schedule().batch_tokens()).unwrap_or(usize::MAX);
    tokens
        .saturating_mul(output.itemsize())
        .saturating_add(RECORD_HEADER_LEN)
        .saturating_add(pipeline.trailer_bound())
}

/// Encoders by codec (an `auto` wire codec may switch width between batches).
#[derive(Default)]
pub struct Encoders(HashMap<Codec, Encoder>);

impl Encoders {
    /// Replaces `out` with `tokens` encoded in `codec`.
    pub fn encode(
        &mut self,
        codec: Codec,
        tokens: &[u32],
        out: &mut Vec<u8>,
    ) -> Result<(), CodecError> {
        // A stream is one per session whatever width each batch narrows to and whatever
        // level it is compressed at (a change of level starts a fresh frame in it).
        let stream = codec.compression.is_stream();
        let key = match stream {
            true => Codec::new(Width::U32, Compression::Stream(0)),
            false => codec,
        };
        let e = match self.0.entry(key) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert(Encoder::new(codec)?),
        };
        if stream {
            if let Some(level) = codec.compression.zstd_level() {
                if e.codec().compression != codec.compression {
                    e.set_stream_level(level)?;
                }
            }
            if e.codec() != codec {
                e.set_width(codec)?;
            }
        }
        out.clear();
        e.encode(tokens, out).map(|_| ())
    }
}

/// A batch's payload, as [`RecordEncoder::encode`] leaves it.
pub enum Payload<'a> {
    /// Encoded bytes.
    Bytes(&'a [u8]),
    /// Tokens to store in a byte-aligned `width` as they are copied out: a plain codec needs
    /// no intermediate buffer, so a transport encodes them straight into its frames
    /// ([`dquant_codec::encode_width`]). Every token is known to fit.
    Plain { width: Width, tokens: &'a [u32] },
}

/// A batch record: its header and its payload.
pub struct Record<'a> {
    pub header: BatchHeader,
    pub payload: Payload<'a>,
}

/// Encodes a plan's batches in its wire codec: the codec per batch, the fit check a fixed
/// codec needs, the payload and the header.
pub struct RecordEncoder {
    wire: WireCodec,
    /// No token of the plan's sources exceeds this ([`crate::Pipeline::max_token_bound`]):
    /// checks against a codec that holds it are skipped.
    bound: u32,
    encoders: Encoders,
    payload: Vec<u8>,
}

impl RecordEncoder {
    pub fn new(wire: WireCodec, bound: u32) -> Self {
        RecordEncoder {
            wire,
            bound,
            encoders: Encoders::default(),
            payload: Vec::new(),
        }
    }

    /// The zstd level of the wire codec's stream, when it is a stream codec.
    pub fn stream_level(&self) -> Option<i32> {
        self.wire.stream_level()
    }

    /// Compresses the next batches at zstd level `level`: a stream codec's from the next
    /// batch on, in a fresh frame (their records name the level); a `zstd:L` codec's too.
    /// Nothing changes for other codecs.
    pub fn set_stream_level(&mut self, level: i32) {
        self.wire = self.wire.with_zstd_level(level);
    }

    /// The record of batch `b` (`sample_len` tokens per sample). A token that does not fit a
    /// fixed wire codec is the error the plan's users see, naming the codec.
    pub fn encode<'a>(
        &'a mut self,
        b: &TokenBatch<'a>,
        sample_len: usize,
    ) -> Result<Record<'a>, EngineError> {
        let codec = checked_codec(self.wire, self.bound, b, sample_len)?;
        // Plain byte-aligned codecs are encoded where the payload goes; others here.
        let payload = match codec.width.byte_width() {
            Some(_) if codec.compression == Compression::None => Payload::Plain {
                width: codec.width,
                tokens: b.tokens,
            },
            _ => {
                self.encoders
                    .encode(codec, b.tokens, &mut self.payload)
                    .map_err(|source| EngineError::Encode {
                        index: b.index,
                        source,
                    })?;
                Payload::Bytes(&self.payload)
            }
        };
        let payload_len = match &payload {
            Payload::Bytes(p) => p.len(),
            Payload::Plain { width, tokens } => width.encoded_len(tokens.len()),
        };
        let header = batch_header(codec, &b.info(), sample_len, payload_len)?;
        Ok(Record { header, payload })
    }
}
