use dquant_codec::CodecError;

/// Errors of the format layer. Byte offsets are within the file (or file part) being parsed;
/// the storage layer adds the path.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("truncated {what}: needs {needed} bytes but has {have}")]
    Truncated {
        what: String,
        needed: u64,
        have: u64,
    },

    #[error("not a {what}: bad magic {found:?} (expected {expected:?})")]
    BadMagic {
        what: &'static str,
        found: String,
        expected: String,
    },

    #[error("unsupported {what} version {version} (this build reads {supported})")]
    UnsupportedVersion {
        what: &'static str,
        version: u64,
        /// The versions this build reads, in words (`version 1`).
        supported: &'static str,
    },

    #[error(
        "unknown Megatron dtype code {0} (known: 1=u8 2=i8 3=i16 4=i32 5=i64 6=f64 7=f32 8=u16)"
    )]
    UnknownDType(u8),

    #[error("unknown dtype '{0}' (expected one of u8, i8, i16, u16, i32, i64, f32, f64)")]
    UnknownDTypeName(String),

    #[error("checksum mismatch in {what}: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum {
        what: String,
        stored: u32,
        computed: u32,
    },

    #[error("corrupt {what}: {detail}")]
    Corrupt { what: String, detail: String },

    /// Settings a writer was given that no file can have (the caller's, not a file's).
    #[error("invalid {what}: {detail}")]
    Invalid { what: String, detail: String },

    #[error("invalid document index: {0}")]
    Index(String),

    #[error("{0}")]
    Codec(#[from] CodecError),

    #[error("{what} does not fit the Megatron format: {detail}")]
    Unrepresentable { what: String, detail: String },
}

impl FormatError {
    pub fn corrupt(what: impl Into<String>, detail: impl Into<String>) -> Self {
        FormatError::Corrupt {
            what: what.into(),
            detail: detail.into(),
        }
    }

    pub fn invalid(what: impl Into<String>, detail: impl Into<String>) -> Self {
        FormatError::Invalid {
            what: what.into(),
            detail: detail.into(),
        }
    }

    pub fn truncated(what: impl Into<String>, needed: u64, have: u64) -> Self {
        FormatError::Truncated {
            what: what.into(),
            needed,
            have,
        }
    }
}
