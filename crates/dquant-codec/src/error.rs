//! The codec layer's one error enum.
//!
//! It and `width` import each other, on purpose (one of the tree's import circles, the only
//! one left): an error names the width a token did not fit and the bits it needs, which only
//! `width` computes, and parsing a width fails with this error. Splitting either would leave a
//! second error type or a second copy of the bit arithmetic.

use crate::width::{bits_needed, Width};

/// Errors of the codec layer. Offsets are token offsets within the slice handed to the codec;
/// callers that know the file and the slice's position add that context.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    /// A token id does not fit the requested width. Nothing was encoded.
    #[error(
        "token {value} at offset {offset} does not fit in {width} (max {max}); it needs {needed} bits: use bits:{needed} or wider",
        max = width.max_token(),
        needed = bits_needed(*value)
    )]
    OutOfRange {
        offset: u64,
        value: u32,
        width: Width,
    },

    /// Stored data holds a value that is not a token id (negative, or above `u32::MAX`).
    #[error("stored value {value} at offset {offset} is not a token id ({width} data must hold 0..=4294967295)")]
    InvalidStoredValue {
        offset: u64,
        value: i64,
        width: Width,
    },

    /// A token has no rank in the dataset's rank table (`rank+zstd` encodes only the ids it
    /// was built from). Nothing was encoded.
    #[error("token {value} at offset {offset} is not in the dataset's rank table")]
    Unranked { offset: u64, value: u32 },

    /// An encoded payload does not have the size its codec implies.
    #[error("{codec} payload is {actual} bytes, but {tokens} tokens need {expected} bytes")]
    LengthMismatch {
        codec: String,
        tokens: usize,
        expected: usize,
        actual: usize,
    },

    /// A compressed payload could not be decompressed.
    #[error("{codec} payload is corrupt: {reason}")]
    Corrupt { codec: String, reason: String },

    /// A codec or width string could not be parsed.
    #[error("invalid codec '{input}': {reason}")]
    Parse { input: String, reason: String },

    /// The compression library failed for a reason other than bad input (e.g. out of memory).
    #[error("{codec} failed: {reason}")]
    Backend { codec: String, reason: String },
}

impl CodecError {
    /// `codec` failed for a reason other than its input ([`CodecError::Backend`]).
    pub(crate) fn backend(codec: impl std::fmt::Display, reason: impl Into<String>) -> Self {
        CodecError::Backend {
            codec: codec.to_string(),
            reason: reason.into(),
        }
    }

    /// A payload of `codec` that cannot be decoded, and why ([`CodecError::Corrupt`]).
    pub(crate) fn corrupt(codec: impl std::fmt::Display, reason: impl Into<String>) -> Self {
        CodecError::Corrupt {
            codec: codec.to_string(),
            reason: reason.into(),
        }
    }

    /// A corrupt-payload error from a step inside `codec` (the byte code names itself
    /// `rank`), named for `codec`; other errors as they are.
    pub(crate) fn named(self, codec: impl std::fmt::Display) -> Self {
        match self {
            CodecError::Corrupt { reason, .. } => CodecError::corrupt(codec, reason),
            e => e,
        }
    }

    /// Shifts the token offset of a data error by `base`: codecs see one block or chunk, and
    /// the caller knows where it starts in the whole stream.
    pub fn at_base(self, base: u64) -> Self {
        match self {
            CodecError::OutOfRange {
                offset,
                value,
                width,
            } => CodecError::OutOfRange {
                offset: offset + base,
                value,
                width,
            },
            CodecError::InvalidStoredValue {
                offset,
                value,
                width,
            } => CodecError::InvalidStoredValue {
                offset: offset + base,
                value,
                width,
            },
            CodecError::Unranked { offset, value } => CodecError::Unranked {
                offset: offset + base,
                value,
            },
            e => e,
        }
    }
}
