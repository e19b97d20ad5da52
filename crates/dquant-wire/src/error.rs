//! The data plane's errors: a frame that fails its checks (`WireError`) and a record that
//! does not parse (`RecordError`, which a `WireError` carries).
//!
//! Apart from the formats so that frames and records both depend on it and never on each
//! other's errors.

use crate::sizes::{HELLO_LEN, MAX_PAYLOAD, MAX_TOKEN_LEN};

/// Errors of the data plane.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("data stream: bad frame magic {0:02x?} (not a dquant data stream, or out of sync)")]
    BadMagic([u8; 4]),
    #[error("data stream: frame header checksum mismatch at frame {expected_seq}")]
    HeaderChecksum { expected_seq: u64 },
    #[error("data stream: unknown frame kind {kind} at frame {seq}")]
    UnknownKind { kind: u8, seq: u64 },
    /// A frame longer than the reader takes: [`MAX_PAYLOAD`] for a stream, less where the
    /// reader expects a small frame (an agent reads a hello into a hello-sized buffer).
    #[error("data stream: frame {seq} claims {len} payload bytes, over the {max}-byte limit")]
    TooLarge { seq: u64, len: u32, max: usize },
    #[error("data stream: expected frame {expected}, got frame {got} (frames lost or repeated)")]
    Sequence { expected: u64, got: u64 },
    #[error("data stream: payload checksum mismatch in frame {seq}: stored {stored:#010x}, computed {computed:#010x}")]
    PayloadChecksum {
        seq: u64,
        stored: u32,
        computed: u32,
    },
    #[error("data stream: connection closed after {frames} complete frames, without an end frame")]
    Truncated { frames: u64 },
    #[error("data stream: payload of {0} bytes exceeds the {MAX_PAYLOAD}-byte frame limit")]
    PayloadTooLarge(usize),
    /// The sender reported an error in an error frame; this is its message, verbatim.
    #[error("{0}")]
    Remote(String),
    #[error("data stream: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Record(#[from] RecordError),
    #[error("data stream: the stream ended inside a record ({0})")]
    EndInRecord(&'static str),
}

/// Errors in record-level data (the frames around them were intact).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("data stream: bad record magic {0:02x?}")]
    BadMagic([u8; 4]),
    #[error("data stream: unknown wire codec bytes {0:02x?}")]
    BadCodec([u8; 4]),
    #[error("data stream: bad hello (expected {HELLO_LEN} bytes starting with DQHELLO1, or DQHELLO2 with a token of at most {MAX_TOKEN_LEN} bytes of UTF-8; got {got} bytes)")]
    BadHello { got: usize },
    #[error("data stream: a batch's trailer of {trailer_len} bytes does not fit its {payload_len}-byte payload in whole u64s")]
    BadTrailer { trailer_len: u32, payload_len: u32 },
    #[error("data stream: bad range request ({0})")]
    BadRequest(String),
}
