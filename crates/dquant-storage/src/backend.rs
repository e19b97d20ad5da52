//! Byte sources.

use std::fmt;
use std::fs::File;
use std::io::{self, IoSliceMut};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rustix::fd::OwnedFd;
use rustix::fs::{FileType, Mode, OFlags, Stat};

/// A read-only object of known length that serves positional reads.
///
/// This is the whole contract a storage backend must meet: local files implement it with
/// `pread`; an S3-compatible store implements it with ranged GETs. Readers batch their
/// requests into few large contiguous ranges (a block file's covering blocks), so the trait
/// needs no async variant to be efficient. The one vectored call exists for copying stored
/// tokens straight into a batch: consecutive samples of a stream are one contiguous range of
/// the file, but land in separate rows of the batch, and one `preadv` fills them all.
pub trait ReadAt: Send + Sync {
    /// Object length in bytes.
    fn len(&self) -> u64;

    /// True for an empty object.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fills `buf` from `offset`; a short object is an `UnexpectedEof` error.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;

    /// A hint: these byte ranges are about to be read (in any order, perhaps from several
    /// threads), as a shuffled batch's samples are. A store where each read is a round trip
    /// (an object store) starts fetching them all at once; a local file ignores it (the
    /// default), the page cache and the worker pool do that job.
    fn will_read(&self, ranges: &[std::ops::Range<u64>]) {
        let _ = ranges;
    }

    /// The version of the object this reads (as its root's `stat` reports it), when the
    /// store can tell: what a cache of opened datasets checks before sharing one.
    fn version(&self) -> Option<ObjectVersion> {
        None
    }

    /// Whether [`version`](ReadAt::version) names these bytes beyond this process's life (a
    /// local file's device, inode, size and modification time; a store's ETag), so that what
    /// is derived from them may be kept on disk under it. `false` by default (an in-memory
    /// object's version is only unique while it lives).
    fn version_is_durable(&self) -> bool {
        false
    }

    /// The open local file behind these bytes, when they are one: a reader that makes many
    /// small reads (a Megatron sample of short documents is a hundred or more) maps it
    /// instead of paying a `pread` each. `None` (the default) for every other store.
    fn local_file(&self) -> Option<&File> {
        None
    }

    /// Fills `bufs` in order from the contiguous bytes at `offset`, as
    /// [`read_exact_at`](ReadAt::read_exact_at) would one after the other (which is what
    /// the default does).
    fn read_exact_vectored_at(&self, bufs: &mut [IoSliceMut<'_>], offset: u64) -> io::Result<()> {
        let mut at = offset;
        for b in bufs.iter_mut() {
            self.read_exact_at(b, at)?;
            at += b.len() as u64;
        }
        Ok(())
    }
}

/// A local file read with `pread`.
#[derive(Debug)]
pub struct LocalFile {
    file: File,
    len: u64,
    version: ObjectVersion,
    path: PathBuf,
}

impl LocalFile {
    /// Opens a regular file; a directory, FIFO, socket or device is an error, found before
    /// anything is read (`fstat` on the opened descriptor; `O_NONBLOCK`, so a FIFO does not
    /// block the open).
    pub fn open(path: &Path) -> io::Result<Self> {
        match open_regular(path)? {
            Ok(f) => Ok(f),
            Err(FileType::Directory) => Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                "is a directory",
            )),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file",
            )),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A file already opened (and checked to be regular) by a caller, with its `fstat`;
    /// `path` is what it is reported as.
    pub(crate) fn from_fd(fd: OwnedFd, st: &Stat, path: PathBuf) -> Self {
        LocalFile {
            file: File::from(fd),
            len: st.st_size as u64,
            version: local_version(st),
            path,
        }
    }
}

/// Opens `path` read-only and checks with `fstat` that it is a regular file; otherwise
/// returns its type. `O_NONBLOCK` keeps `open` itself from waiting for a FIFO's writer (it
/// changes nothing for reads of a regular file).
fn open_regular(path: &Path) -> io::Result<Result<LocalFile, FileType>> {
    let fd = rustix::fs::open(path, READ_FLAGS, Mode::empty())?;
    let st = rustix::fs::fstat(&fd)?;
    let kind = FileType::from_raw_mode(st.st_mode);
    if kind != FileType::RegularFile {
        return Ok(Err(kind));
    }
    Ok(Ok(LocalFile::from_fd(fd, &st, path.to_path_buf())))
}

/// A local file's version, from its status: device, inode, size and modification time
/// (what `object_store`'s local store builds its e-tag from).
pub(crate) fn local_version(st: &Stat) -> ObjectVersion {
    ObjectVersion::tag(format!(
        "{:x}-{:x}-{:x}-{:x}.{:x}",
        st.st_dev, st.st_ino, st.st_size, st.st_mtime, st.st_mtime_nsec
    ))
}

/// How every local object is opened for reading: `O_NONBLOCK` so that opening a FIFO does
/// not wait for a writer, `O_NOCTTY` so that a terminal never becomes the agent's.
pub(crate) const READ_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::CLOEXEC)
    .union(OFlags::NONBLOCK)
    .union(OFlags::NOCTTY);

impl ReadAt for LocalFile {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(&self.file, buf, offset)
    }

    fn version(&self) -> Option<ObjectVersion> {
        Some(self.version.clone())
    }

    fn version_is_durable(&self) -> bool {
        true
    }

    /// One `preadv` per call (more only when the kernel returns short).
    fn read_exact_vectored_at(
        &self,
        mut bufs: &mut [IoSliceMut<'_>],
        mut offset: u64,
    ) -> io::Result<()> {
        // preadv takes at most IOV_MAX (1024) buffers.
        const IOV_MAX: usize = 1024;
        IoSliceMut::advance_slices(&mut bufs, 0);
        while !bufs.is_empty() {
            let n = bufs.len().min(IOV_MAX);
            match rustix::io::preadv(&self.file, &mut bufs[..n], offset) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "failed to fill whole buffer",
                    ))
                }
                Ok(k) => {
                    offset += k as u64;
                    IoSliceMut::advance_slices(&mut bufs, k);
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    fn local_file(&self) -> Option<&File> {
        Some(&self.file)
    }
}

/// One version of an object: equal versions mean the same bytes. Like `object_store`'s
/// `e_tag`, opaque; a local file's is built from its device, inode, size and modification
/// time, so a file replaced by a rename or rewritten in place gets another.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ObjectVersion(Box<str>);

impl ObjectVersion {
    /// A store's own tag (an S3 ETag, a generation number).
    pub fn tag(tag: impl Into<String>) -> Self {
        ObjectVersion(tag.into().into_boxed_str())
    }
}

impl fmt::Display for ObjectVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
