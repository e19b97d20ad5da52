use std::path::PathBuf;

use dquant_format::FormatError;

use crate::root::RootError;

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
    /// A [`Root`](crate::Root) refused or failed to serve an object; the error names it.
    #[error("{0}")]
    Root(#[from] RootError),
}

impl StorageError {
    /// Whether the dataset (one of its files or objects) does not exist.
    pub fn is_not_found(&self) -> bool {
        match self {
            StorageError::Io { source, .. } => source.kind() == std::io::ErrorKind::NotFound,
            StorageError::Root(e) => matches!(e, RootError::NotFound { .. }),
            _ => false,
        }
    }

    /// Whether stored bytes failed their checksum (a block's crc, a chunk's sum): the copy is
    /// damaged, and another copy may not be.
    pub fn is_corrupt(&self) -> bool {
        matches!(
            self,
            StorageError::Format {
                source: FormatError::Checksum { .. },
                ..
            }
        )
    }

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
