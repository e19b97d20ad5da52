//! Records: what the frames of a data stream carry.
//!
//! A frame is a transport unit (at most 1 MiB, checksummed); a record is a unit of meaning (a
//! batch, or a token range). Records are laid end to end in the frames' payloads and may
//! span frames, so a 4 MiB batch and a 2 KiB batch both travel in full 1 MiB frames and the
//! frame size stays the DMA/RDMA buffer size whatever the plan's batch size is.
//!
//! Every record starts with a fixed 48-byte header (integers little-endian):
//!
//! | offset | size | batch record (`DQBT`) | range record (`DQRG`) |
//! |---|---|---|---|
//! | 0 | 4 | magic `DQBT` | magic `DQRG` |
//! | 4 | 4 | wire codec (`Codec::to_bytes`) | wire codec |
//! | 8 | 8 | batch index in the rank's stream | first token of the range |
//! | 16 | 4 | samples in the batch | tokens in the range (low 32 bits) |
//! | 20 | 4 | tokens per sample (`seq_len + 1`) | tokens in the range (high 32 bits) |
//! | 24 | 4 | payload bytes that follow | payload bytes that follow |
//! | 28 | 4 | of those, the trailer's bytes | reserved, zero |
//! | 32 | 8 | cursor after this batch: epoch | reserved, zero |
//! | 40 | 8 | cursor after this batch: consumed samples | reserved, zero |
//!
//! A batch record's payload is its tokens in the wire codec, then its *trailer* (a multiple of
//! 8 bytes): first, when the plan asks for document boundaries, the batch's document starts
//! (`dquant_engine::doc_section`, which describes its own length); then the *cursor
//! trailer*, the blend's per-source counts at the cursor after the batch, one u64 each (none
//! for a single source), so a reader that receives the batch can checkpoint a cursor that
//! resumes without replaying the blend.
//!
//! The data connection opens with a *hello*: one data frame from the client whose payload is
//! `DQHELLO1`, the session id (u64) and the 16-byte ticket from the control plane's `Open`
//! reply; or, from a client with a tenant token, `DQHELLO2`, the same two fields, the token's
//! length (u16) and the token (at most [`MAX_TOKEN_LEN`] bytes of UTF-8), which an agent that
//! serves tenants requires. A source session's client then sends *range requests*: one data frame each,
//! `DQRQ`, a u32 count, then `count` pairs of (first token u64, token count u64); the agent
//! answers with `count` range records, in order.

use dquant_codec::Codec;

pub use crate::error::RecordError;

pub const RECORD_HEADER_LEN: usize = 48;
pub const BATCH_MAGIC: [u8; 4] = *b"DQBT";
pub const RANGE_MAGIC: [u8; 4] = *b"DQRG";
pub const HELLO_MAGIC: [u8; 8] = *b"DQHELLO1";
pub use crate::sizes::{HELLO_LEN, MAX_TOKEN_LEN};
/// The hello that carries a tenant token after the session and ticket.
pub const HELLO_TOKEN_MAGIC: [u8; 8] = *b"DQHELLO2";
/// The longest hello: a `DQHELLO2` with a token of [`MAX_TOKEN_LEN`].
pub const MAX_HELLO_LEN: usize = HELLO_LEN + 2 + MAX_TOKEN_LEN;
pub const REQUEST_MAGIC: [u8; 4] = *b"DQRQ";
/// Most ranges one request frame can carry.
pub const MAX_REQUEST_RANGES: usize = (crate::frame::MAX_PAYLOAD - 8) / 16;
/// Longest token range one request may ask for (64 MiB of u32): an agent refuses longer ones,
/// so a peer cannot make it allocate without bound, and readers split what they ask for.
pub const MAX_RANGE_TOKENS: u64 = 1 << 24;

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

/// Header of a batch record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchHeader {
    pub codec: Codec,
    pub index: u64,
    pub samples: u32,
    pub sample_len: u32,
    /// Payload bytes, the cursor trailer included.
    pub payload_len: u32,
    /// Bytes at the end of the payload after the tokens: the document starts, when the plan
    /// has boundaries, then the cursor's blend counts (u64 each).
    pub trailer_len: u32,
    pub cursor_epoch: u64,
    pub cursor_consumed: u64,
}

impl BatchHeader {
    pub fn encode(&self) -> [u8; RECORD_HEADER_LEN] {
        let mut b = [0u8; RECORD_HEADER_LEN];
        b[0..4].copy_from_slice(&BATCH_MAGIC);
        b[4..8].copy_from_slice(&self.codec.to_bytes());
        b[8..16].copy_from_slice(&self.index.to_le_bytes());
        b[16..20].copy_from_slice(&self.samples.to_le_bytes());
        b[20..24].copy_from_slice(&self.sample_len.to_le_bytes());
        b[24..28].copy_from_slice(&self.payload_len.to_le_bytes());
        b[28..32].copy_from_slice(&self.trailer_len.to_le_bytes());
        b[32..40].copy_from_slice(&self.cursor_epoch.to_le_bytes());
        b[40..48].copy_from_slice(&self.cursor_consumed.to_le_bytes());
        b
    }

    pub fn parse(b: &[u8; RECORD_HEADER_LEN]) -> Result<Self, RecordError> {
        let magic: [u8; 4] = b[0..4].try_into().expect("4 bytes");
        if magic != BATCH_MAGIC {
            return Err(RecordError::BadMagic(magic));
        }
        let cb: [u8; 4] = b[4..8].try_into().expect("4 bytes");
        let (payload_len, trailer_len) = (u32_at(b, 24), u32_at(b, 28));
        if trailer_len > payload_len || trailer_len % 8 != 0 {
            return Err(RecordError::BadTrailer {
                trailer_len,
                payload_len,
            });
        }
        Ok(BatchHeader {
            codec: Codec::from_bytes(cb).ok_or(RecordError::BadCodec(cb))?,
            index: u64_at(b, 8),
            samples: u32_at(b, 16),
            sample_len: u32_at(b, 20),
            payload_len,
            trailer_len,
            cursor_epoch: u64_at(b, 32),
            cursor_consumed: u64_at(b, 40),
        })
    }

    /// Payload bytes that hold tokens: the payload less the trailer.
    pub fn data_len(&self) -> u32 {
        self.payload_len - self.trailer_len
    }

    /// Tokens the payload decodes to.
    pub fn tokens(&self) -> usize {
        self.samples as usize * self.sample_len as usize
    }
}

/// Header of a range record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RangeHeader {
    pub codec: Codec,
    pub start: u64,
    pub len: u64,
    pub payload_len: u32,
}

impl RangeHeader {
    pub fn encode(&self) -> [u8; RECORD_HEADER_LEN] {
        let mut b = [0u8; RECORD_HEADER_LEN];
        b[0..4].copy_from_slice(&RANGE_MAGIC);
        b[4..8].copy_from_slice(&self.codec.to_bytes());
        b[8..16].copy_from_slice(&self.start.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b[24..28].copy_from_slice(&self.payload_len.to_le_bytes());
        b
    }

    pub fn parse(b: &[u8; RECORD_HEADER_LEN]) -> Result<Self, RecordError> {
        let magic: [u8; 4] = b[0..4].try_into().expect("4 bytes");
        if magic != RANGE_MAGIC {
            return Err(RecordError::BadMagic(magic));
        }
        let cb: [u8; 4] = b[4..8].try_into().expect("4 bytes");
        Ok(RangeHeader {
            codec: Codec::from_bytes(cb).ok_or(RecordError::BadCodec(cb))?,
            start: u64_at(b, 8),
            len: u64_at(b, 16),
            payload_len: u32_at(b, 24),
        })
    }
}

/// The hello a data connection opens with: the session, its ticket and, for an agent that
/// serves tenants, the tenant's token.
#[derive(Clone, PartialEq, Eq)]
pub struct Hello {
    pub session: u64,
    pub ticket: [u8; 16],
    /// The tenant's token (`DQUANT_TOKEN`), at most [`MAX_TOKEN_LEN`] bytes.
    pub token: Option<String>,
}

impl std::fmt::Debug for Hello {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hello")
            .field("session", &self.session)
            .field("token", &self.token.as_ref().map(|_| "<secret>"))
            .finish_non_exhaustive()
    }
}

impl Hello {
    /// `DQHELLO1` without a token, `DQHELLO2` with one. Panics on a token over
    /// [`MAX_TOKEN_LEN`]: clients check it where the user gives it.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(MAX_HELLO_LEN);
        let magic = match self.token {
            None => HELLO_MAGIC,
            Some(_) => HELLO_TOKEN_MAGIC,
        };
        b.extend_from_slice(&magic);
        b.extend_from_slice(&self.session.to_le_bytes());
        b.extend_from_slice(&self.ticket);
        if let Some(t) = &self.token {
            assert!(t.len() <= MAX_TOKEN_LEN, "token over {MAX_TOKEN_LEN} bytes");
            b.extend_from_slice(&(t.len() as u16).to_le_bytes());
            b.extend_from_slice(t.as_bytes());
        }
        b
    }

    pub fn parse(b: &[u8]) -> Result<Self, RecordError> {
        let bad = || RecordError::BadHello { got: b.len() };
        let token = match (b.get(0..8), b.len()) {
            (Some(m), HELLO_LEN) if m == HELLO_MAGIC => None,
            (Some(m), n) if m == HELLO_TOKEN_MAGIC && n >= HELLO_LEN + 2 => {
                let len = u16::from_le_bytes([b[HELLO_LEN], b[HELLO_LEN + 1]]) as usize;
                if len > MAX_TOKEN_LEN || n != HELLO_LEN + 2 + len {
                    return Err(bad());
                }
                let t = std::str::from_utf8(&b[HELLO_LEN + 2..]).map_err(|_| bad())?;
                Some(t.to_string())
            }
            _ => return Err(bad()),
        };
        Ok(Hello {
            session: u64_at(b, 8),
            ticket: b[16..32].try_into().expect("16 bytes"),
            token,
        })
    }
}

/// Appends a range request for `ranges` (at most [`MAX_REQUEST_RANGES`]) to `out`.
pub fn encode_request(ranges: &[(u64, u64)], out: &mut Vec<u8>) {
    assert!(
        ranges.len() <= MAX_REQUEST_RANGES,
        "too many ranges for one frame"
    );
    out.extend_from_slice(&REQUEST_MAGIC);
    out.extend_from_slice(&(ranges.len() as u32).to_le_bytes());
    for &(s, n) in ranges {
        out.extend_from_slice(&s.to_le_bytes());
        out.extend_from_slice(&n.to_le_bytes());
    }
}

/// Parses a range request into `out` (cleared first).
pub fn parse_request(b: &[u8], out: &mut Vec<(u64, u64)>) -> Result<(), RecordError> {
    out.clear();
    if b.len() < 8 || b[0..4] != REQUEST_MAGIC {
        return Err(RecordError::BadRequest(format!(
            "expected DQRQ and a count, got {} bytes",
            b.len()
        )));
    }
    let n = u32_at(b, 4) as usize;
    if b.len() != 8 + 16 * n {
        return Err(RecordError::BadRequest(format!(
            "{n} ranges need {} bytes, the frame has {}",
            8 + 16 * n,
            b.len()
        )));
    }
    out.extend((0..n).map(|i| (u64_at(b, 8 + 16 * i), u64_at(b, 16 + 16 * i))));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use dquant_codec::{Compression, Width};

    #[test]
    fn headers_round_trip() {
        let codec = Codec {
            width: Width::U16,
            compression: Compression::Zstd(3),
        };
        let h = BatchHeader {
            codec,
            index: 7,
            samples: 8,
            sample_len: 4097,
            payload_len: 1234,
            trailer_len: 16,
            cursor_epoch: 1,
            cursor_consumed: 64,
        };
        assert_eq!(BatchHeader::parse(&h.encode()).unwrap(), h);
        assert_eq!(h.data_len(), 1218);
        for (trailer_len, payload_len) in [(1240, 1234), (12, 1234)] {
            let bad = BatchHeader {
                trailer_len,
                payload_len,
                ..h
            };
            assert_eq!(
                BatchHeader::parse(&bad.encode()).unwrap_err().to_string(),
                format!(
                    "data stream: a batch's trailer of {trailer_len} bytes does not fit \
                     its {payload_len}-byte payload in whole u64s"
                )
            );
        }
        let r = RangeHeader {
            codec,
            start: 1 << 40,
            len: 5 << 33,
            payload_len: 99,
        };
        assert_eq!(RangeHeader::parse(&r.encode()).unwrap(), r);
        assert_eq!(
            BatchHeader::parse(&r.encode()).unwrap_err(),
            RecordError::BadMagic(RANGE_MAGIC)
        );
        let mut hello = Hello {
            session: 3,
            ticket: [9; 16],
            token: None,
        };
        assert_eq!(hello.encode().len(), HELLO_LEN);
        assert_eq!(Hello::parse(&hello.encode()).unwrap(), hello);
        hello.token = Some("tenant-a-token-0123456789".into());
        let b = hello.encode();
        assert_eq!(&b[..8], b"DQHELLO2");
        assert_eq!(b.len(), HELLO_LEN + 2 + 25);
        assert_eq!(Hello::parse(&b).unwrap(), hello);
        assert!(!format!("{hello:?}").contains("0123456789"));
        let bad = "data stream: bad hello (expected 32 bytes starting with DQHELLO1, or DQHELLO2 \
                   with a token of at most 200 bytes of UTF-8; got";
        assert_eq!(
            Hello::parse(b"GET / HTTP/1.1\r\n").unwrap_err().to_string(),
            format!("{bad} 16 bytes)")
        );
        // A token length that disagrees with the bytes, or bytes that are not UTF-8.
        assert_eq!(
            Hello::parse(&b[..b.len() - 1]).unwrap_err().to_string(),
            format!("{bad} 58 bytes)")
        );
        let mut not_utf8 = b.clone();
        not_utf8[HELLO_LEN + 2] = 0xff;
        assert!(Hello::parse(&not_utf8).is_err());
        let mut long = b[..HELLO_LEN].to_vec();
        long[..8].copy_from_slice(b"DQHELLO2");
        long.extend_from_slice(&201u16.to_le_bytes());
        long.extend_from_slice(&[b'a'; 201]);
        assert_eq!(
            Hello::parse(&long).unwrap_err().to_string(),
            format!("{bad} 235 bytes)")
        );
    }

    #[test]
    fn requests_round_trip_and_reject_bad_lengths() {
        let mut b = Vec::new();
        encode_request(&[(0, 10), (1 << 35, 4097)], &mut b);
        let mut out = Vec::new();
        parse_request(&b, &mut out).unwrap();
        assert_eq!(out, vec![(0, 10), (1 << 35, 4097)]);
        assert_eq!(
            parse_request(&b[..b.len() - 1], &mut out)
                .unwrap_err()
                .to_string(),
            "data stream: bad range request (2 ranges need 40 bytes, the frame has 39)"
        );
    }
}
