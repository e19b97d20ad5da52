//! Byte sources.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// A read-only object of known length that serves positional reads.
///
/// This is the whole contract a storage backend must meet: local files implement it with
/// `pread`; an S3-compatible store implements it with ranged GETs. Readers batch their
/// requests into few large contiguous ranges (a block file's covering blocks), so the trait
/// needs no vectored or async variant to be efficient.
pub trait ReadAt: Send + Sync {
    /// Object length in bytes.
    fn len(&self) -> u64;

    /// True for an empty object.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fills `buf` from `offset`; a short object is an `UnexpectedEof` error.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
}

/// A local file read with `pread`.
#[derive(Debug)]
pub struct LocalFile {
    file: File,
    len: u64,
    path: PathBuf,
}

impl LocalFile {
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = File::open(path)?;
        let meta = file.metadata()?;
        if meta.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                "is a directory",
            ));
        }
        Ok(LocalFile {
            file,
            len: meta.len(),
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl ReadAt for LocalFile {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(&self.file, buf, offset)
    }
}
