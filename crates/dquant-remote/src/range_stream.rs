//! The data connection of a range session: requests out, range records back, in order, over
//! TCP frames or a shared-memory ring's slots.
//!
//! Apart from `RemoteSource` so that readahead, which sends on it, and the source, which owns
//! it, both depend on it and not on each other.

use dquant_codec::{Codec, Decoder};
use dquant_storage::SourceError;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use dquant_transport::record::{encode_request, RECORD_HEADER_LEN};
use dquant_transport::shm::RingRecords;
use dquant_transport::{
    DataStream, FrameKind, FrameWriter, RangeHeader, ReceiveError, RecordReader, WireError,
};

/// Where a source session's requests go and its answers come back.
pub(crate) enum Wire {
    /// Frames both ways over the agent's TCP data plane.
    Tcp {
        writer: FrameWriter<DataStream>,
        reader: RecordReader<DataStream>,
    },
    /// Requests as frames on the agent's Unix socket; each answer in one slot of a ring.
    Ring {
        writer: FrameWriter<UnixStream>,
        records: RingRecords,
        /// How long an answer may take: the control connection's timeout, as a TCP data
        /// connection's reads have.
        timeout: Duration,
    },
}

/// The data connection of a source session: requests out, range records back, in order.
pub(crate) struct RangeStream {
    wire: Wire,
    decoder: Decoder,
    request: Vec<u8>,
    payload: Vec<u8>,
    requests: u64,
    requested_tokens: u64,
}

impl RangeStream {
    pub(crate) fn new(wire: Wire) -> Self {
        RangeStream {
            wire,
            decoder: Decoder::new(),
            request: Vec::new(),
            payload: Vec::new(),
            requests: 0,
            requested_tokens: 0,
        }
    }

    /// Requests sent so far.
    pub(crate) fn requests(&self) -> u64 {
        self.requests
    }

    /// Tokens asked for so far.
    pub(crate) fn requested_tokens(&self) -> u64 {
        self.requested_tokens
    }

    /// Sends one request for `pairs` (first token, tokens), at most `MAX_REQUEST_RANGES`.
    pub(crate) fn send(&mut self, pairs: &[(u64, u64)]) -> Result<(), SourceError> {
        self.request.clear();
        encode_request(pairs, &mut self.request);
        match &mut self.wire {
            Wire::Tcp { writer, .. } => send_frame(writer, &self.request)?,
            Wire::Ring { writer, .. } => send_frame(writer, &self.request)?,
        }
        self.requests += 1;
        self.requested_tokens += pairs.iter().map(|p| p.1).sum::<u64>();
        Ok(())
    }

    /// Receives the next range record, which must be `len` tokens from `start`, and decodes
    /// it into `out` (`len` tokens), or reads past it when `out` is `None`. An error frame
    /// from the agent comes back as `WireError::Remote`, its message verbatim.
    pub(crate) fn recv(
        &mut self,
        start: u64,
        len: u64,
        out: Option<&mut [u32]>,
    ) -> Result<(), SourceError> {
        match &mut self.wire {
            Wire::Tcp { reader, .. } => {
                let Some(hb) = reader.next_header()? else {
                    return Err(WireError::EndInRecord("range response").into());
                };
                let h = answer_header(&hb, start, len)?;
                self.payload.resize(h.payload_len as usize, 0);
                reader.read_exact(&mut self.payload, "range payload")?;
                decode_into(&mut self.decoder, &h, &self.payload, out)
            }
            Wire::Ring {
                records, timeout, ..
            } => {
                let decoder = &mut self.decoder;
                let done = records.with_next(*timeout, |rec| {
                    let (hb, payload) = rec
                        .split_first_chunk::<RECORD_HEADER_LEN>()
                        .ok_or_else(|| {
                            SourceError::Agent(format!(
                                "shared-memory ring: a {}-byte record is shorter than a range header",
                                rec.len()
                            ))
                        })?;
                    let h = answer_header(hb, start, len)?;
                    let payload = payload.get(..h.payload_len as usize).ok_or_else(|| {
                        SourceError::Agent(format!(
                            "shared-memory ring: range {start}+{len} has {} of its {} payload bytes",
                            payload.len(),
                            h.payload_len
                        ))
                    })?;
                    decode_into(decoder, &h, payload, out)
                });
                done.map_err(|e| match e {
                    ReceiveError::Wire(w) => SourceError::Wire(w),
                    e => SourceError::Agent(e.to_string()),
                })?
            }
        }
    }

    /// Ends the session: the agent sees its connection close.
    pub(crate) fn shutdown(&self) {
        match &self.wire {
            Wire::Tcp { writer, .. } => {
                let _ = writer.get_ref().socket().shutdown(std::net::Shutdown::Both);
            }
            Wire::Ring { records, .. } => records.shutdown(),
        }
    }
}

/// Sends `request` as one data frame, at once.
fn send_frame<W: std::io::Write>(w: &mut FrameWriter<W>, request: &[u8]) -> Result<(), WireError> {
    w.send(FrameKind::Data, request)?;
    w.flush()
}

/// The header of an answer, checked to be range `start + len` with a payload its codec
/// could have.
fn answer_header(
    hb: &[u8; RECORD_HEADER_LEN],
    start: u64,
    len: u64,
) -> Result<RangeHeader, SourceError> {
    let h = RangeHeader::parse(hb).map_err(WireError::from)?;
    if h.start != start || h.len != len {
        return Err(SourceError::Agent(format!(
            "agent answered range {}+{} for request {}..{}",
            h.start,
            h.len,
            start,
            start + len
        )));
    }
    check_payload_len(h.codec, h.len as usize, h.payload_len)?;
    Ok(h)
}

/// Decodes an answer's payload into `out`, if it is wanted.
fn decode_into(
    decoder: &mut Decoder,
    h: &RangeHeader,
    payload: &[u8],
    out: Option<&mut [u32]>,
) -> Result<(), SourceError> {
    if let Some(out) = out {
        decoder
            .decode(h.codec, payload, out)
            .map_err(|e| e.at_base(h.start))?;
    }
    Ok(())
}

/// Refuses a payload length no encoding of `tokens` tokens could have (a corrupt or hostile
/// peer must not make us allocate gigabytes).
pub fn check_payload_len(codec: Codec, tokens: usize, payload_len: u32) -> Result<(), SourceError> {
    let bound = codec.max_encoded_len(tokens);
    if payload_len as usize > bound {
        return Err(SourceError::Agent(format!(
            "agent sent a {payload_len}-byte payload for {tokens} tokens of {codec} (at most {bound} expected)"
        )));
    }
    Ok(())
}
