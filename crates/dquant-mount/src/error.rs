//! The mount's one error type, and the errno each case reaches a reader as.

use dquant_engine::SourceError;
use dquant_format::FormatError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MountError {
    /// The agent could not be reached, refused, or sent something unusable: the read fails
    /// with `EIO`, and the next one dials again.
    #[error("{0}")]
    Agent(#[from] SourceError),
    /// The agent no longer has the dataset (or root): `ENOENT`.
    #[error("{0}")]
    Gone(String),
    /// A token does not fit the mount's dtype, or index values that cannot be written as a
    /// Megatron `.idx`: `EIO`, with the reason in the log.
    #[error("{0}")]
    Format(#[from] FormatError),
    /// The dataset is no longer what the mount showed (another size, another index): `EIO`
    /// now, and its files are looked up afresh.
    #[error("{0}")]
    Changed(String),
    /// A plan stream failed (its agent went away, or refused the plan): `EIO`.
    #[error("{0}")]
    Plan(String),
    /// Bad options: the mount does not start.
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl MountError {
    /// The errno a file-system call answers with.
    pub fn errno(&self) -> libc::c_int {
        match self {
            MountError::Gone(_) => libc::ENOENT,
            MountError::Agent(e) if e.is_not_found() => libc::ENOENT,
            MountError::Usage(_) => libc::EINVAL,
            _ => libc::EIO,
        }
    }
}
