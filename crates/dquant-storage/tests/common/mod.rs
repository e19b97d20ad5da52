//! Helpers the storage tests share.

use std::path::Path;

/// Makes a FIFO at `p`: a name that blocks whoever opens it for reading, which confinement
/// must refuse by its type before opening.
pub fn mkfifo(p: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        p,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
}
