//! Frame format (all integers little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `DQFR` |
//! | 4 | 1 | kind: 1 = data, 2 = end of stream, 3 = error (payload: UTF-8 message) |
//! | 5 | 3 | reserved, zero |
//! | 8 | 8 | sequence number: 0 for the first frame of a stream, then +1 |
//! | 16 | 4 | payload length, at most [`MAX_PAYLOAD`] |
//! | 20 | 4 | crc32c of the payload |
//! | 24 | 4 | reserved, zero |
//! | 28 | 4 | crc32c of bytes 0..28 |

use std::fmt;

pub use crate::error::WireError;

pub const MAGIC: [u8; 4] = *b"DQFR";
pub const HEADER_LEN: usize = 32;
pub use crate::sizes::MAX_PAYLOAD;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// Stream data (its meaning belongs to the layer above).
    Data,
    /// The stream ended normally; the payload may carry a summary.
    End,
    /// The sender failed; the payload is its UTF-8 error message, which the receiver surfaces
    /// verbatim.
    Error,
}

impl FrameKind {
    fn code(self) -> u8 {
        match self {
            FrameKind::Data => 1,
            FrameKind::End => 2,
            FrameKind::Error => 3,
        }
    }

    fn from_code(c: u8) -> Option<Self> {
        match c {
            1 => Some(FrameKind::Data),
            2 => Some(FrameKind::End),
            3 => Some(FrameKind::Error),
            _ => None,
        }
    }
}

impl fmt::Display for FrameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FrameKind::Data => "data",
            FrameKind::End => "end",
            FrameKind::Error => "error",
        })
    }
}

/// The checksum a frame header carries for `payload` (`dquant_transport::FrameWriter::
/// send_checked` takes it precomputed): crc32c, by `crc-fast`, which folds a megabyte about
/// twice as fast as the `crc32c` crate (the workspace's Cargo.toml has the figures).
pub fn payload_crc(payload: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(payload)
}

/// The crc32c of a payload whose first part summed to `crc` and which goes on with `more`:
/// a producer sums each piece as it lands, while it is still in its cache.
pub fn payload_crc_append(crc: u32, more: &[u8]) -> u32 {
    use crc_fast::{CrcAlgorithm, Digest};
    // The digest's state is the register before the final inversion.
    let mut d = Digest::new_with_init_state(CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    d.update(more);
    d.finalize() as u32
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: FrameKind,
    pub seq: u64,
    pub len: u32,
    pub crc: u32,
}

impl FrameHeader {
    /// The header for `payload`.
    pub fn for_payload(kind: FrameKind, seq: u64, payload: &[u8]) -> Result<Self, WireError> {
        if payload.len() > MAX_PAYLOAD {
            return Err(WireError::PayloadTooLarge(payload.len()));
        }
        Ok(FrameHeader {
            kind,
            seq,
            len: payload.len() as u32,
            crc: payload_crc(payload),
        })
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = self.kind.code();
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..20].copy_from_slice(&self.len.to_le_bytes());
        b[20..24].copy_from_slice(&self.crc.to_le_bytes());
        let c = crc32c::crc32c(&b[..28]);
        b[28..32].copy_from_slice(&c.to_le_bytes());
        b
    }

    /// Parses and checks a header; `expected_seq` is the sequence number the receiver is due.
    pub fn parse(b: &[u8; HEADER_LEN], expected_seq: u64) -> Result<Self, WireError> {
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        if b[..4] != MAGIC {
            return Err(WireError::BadMagic([b[0], b[1], b[2], b[3]]));
        }
        if crc32c::crc32c(&b[..28]) != u32_at(28) {
            return Err(WireError::HeaderChecksum { expected_seq });
        }
        let mut s = [0u8; 8];
        s.copy_from_slice(&b[8..16]);
        let seq = u64::from_le_bytes(s);
        let kind = FrameKind::from_code(b[4]).ok_or(WireError::UnknownKind { kind: b[4], seq })?;
        if seq != expected_seq {
            return Err(WireError::Sequence {
                expected: expected_seq,
                got: seq,
            });
        }
        let len = u32_at(16);
        if len as usize > MAX_PAYLOAD {
            return Err(WireError::TooLarge {
                seq,
                len,
                max: MAX_PAYLOAD,
            });
        }
        Ok(FrameHeader {
            kind,
            seq,
            len,
            crc: u32_at(20),
        })
    }

    /// Checks `payload` against the header's crc.
    pub fn check_payload(&self, payload: &[u8]) -> Result<(), WireError> {
        let computed = payload_crc(payload);
        if computed == self.crc {
            Ok(())
        } else {
            Err(WireError::PayloadChecksum {
                seq: self.seq,
                stored: self.crc,
                computed,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_sums_agree_with_crc32c_whole_and_in_pieces() {
        let data: Vec<u8> = (0..300_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        assert_eq!(payload_crc(b""), 0);
        assert_eq!(payload_crc(b"123456789"), 0xe306_9283);
        for len in [0, 1, 7, 64, 255, 4096, 299_999, 300_000] {
            let whole = crc32c::crc32c(&data[..len]);
            assert_eq!(payload_crc(&data[..len]), whole, "{len} bytes");
            for cut in [0, 1, len / 3, len.saturating_sub(1), len].map(|c| c.min(len)) {
                let first = payload_crc(&data[..cut]);
                assert_eq!(
                    payload_crc_append(first, &data[cut..len]),
                    whole,
                    "{len} at {cut}"
                );
            }
        }
    }

    #[test]
    fn header_round_trip_and_errors() {
        let h = FrameHeader::for_payload(FrameKind::Data, 7, b"hello").unwrap();
        let b = h.encode();
        assert_eq!(FrameHeader::parse(&b, 7).unwrap(), h);
        assert_eq!(
            FrameHeader::parse(&b, 8).unwrap_err().to_string(),
            "data stream: expected frame 8, got frame 7 (frames lost or repeated)"
        );
        let mut bad = b;
        bad[9] ^= 1;
        assert_eq!(
            FrameHeader::parse(&bad, 7).unwrap_err().to_string(),
            "data stream: frame header checksum mismatch at frame 7"
        );
        let mut bad = b;
        bad[0] = b'X';
        assert_eq!(
            FrameHeader::parse(&bad, 7).unwrap_err().to_string(),
            "data stream: bad frame magic [58, 51, 46, 52] (not a dquant data stream, or out of sync)"
        );
        assert_eq!(
            h.check_payload(b"hellp").unwrap_err().to_string(),
            format!(
                "data stream: payload checksum mismatch in frame 7: stored {:#010x}, computed {:#010x}",
                crc32c::crc32c(b"hello"),
                crc32c::crc32c(b"hellp")
            )
        );
        assert!(FrameHeader::for_payload(FrameKind::Data, 0, &vec![0; MAX_PAYLOAD + 1]).is_err());
    }
}
