use std::path::PathBuf;

use dquant_format::FormatError;

/// Errors of the storage layer: a format or I/O error with the path it concerns.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("{}: {source}", path.display())]
    Format {
        path: PathBuf,
        #[source]
        source: FormatError,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The data itself is unacceptable for the operation (e.g. a token that does not fit the
    /// output width). The caller knows which input it came from and names it.
    #[error("{0}")]
    Data(#[source] FormatError),
    /// The request cannot be served as asked (unknown format, unsupported combination).
    #[error("{0}")]
    Usage(String),
}

impl StorageError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StorageError::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn format(path: impl Into<PathBuf>, source: impl Into<FormatError>) -> Self {
        StorageError::Format {
            path: path.into(),
            source: source.into(),
        }
    }
}
