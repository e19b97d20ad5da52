//! Where a [`DatasetWriter`](crate::DatasetWriter) puts its files, all-or-nothing.
//!
//! A writer streams each output file front to back and never seeks, so a destination needs
//! only two things: a staged object to append to, and a commit that makes it appear whole
//! under its name. Locally that is a temporary file renamed over the name ([`LocalFiles`]);
//! in an object store it is a multipart upload completed at the end (`dquant-objstore`).
//! Either way, nothing appears under the name of an output that failed half-way, and a
//! staged object dropped without a commit is removed (the temporary file deleted, the
//! upload aborted).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use tempfile::NamedTempFile;

use crate::error::StorageError;

/// A place outputs are written to.
pub trait Destination: Send + Sync {
    /// Starts the object `name` (a path, or a key for a store). Nothing is visible under
    /// `name` until [`StagedObject::commit`]. The error names what could not be created.
    fn stage(&self, name: &Path) -> Result<Box<dyn StagedObject>, StorageError>;
}

/// One output being written.
pub trait StagedObject: Send {
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()>;

    /// Makes the object appear, whole, under its name (durably, where the store can).
    fn commit(self: Box<Self>) -> io::Result<()>;
}

/// Local files: written under a temporary name in the destination's directory, then fsynced
/// and renamed over it.
#[derive(Clone, Copy, Debug, Default)]
pub struct LocalFiles;

struct LocalStaged {
    dst: std::path::PathBuf,
    /// The temporary file, renamed over `dst` at commit and removed if dropped before.
    tmp: NamedTempFile,
    /// Writes go to the same file through a descriptor of its own: `NamedTempFile`'s own
    /// writes add the temporary name to every error (`... at path "/d/.out.bin.XOeAR4.tmp"`),
    /// and the error already names the output.
    out: BufWriter<File>,
}

impl Destination for LocalFiles {
    fn stage(&self, dst: &Path) -> Result<Box<dyn StagedObject>, StorageError> {
        let dir = match dst.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let name = dst
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // Like any file the user creates (0o666 less the umask), not tempfile's private 0o600:
        // the dataset is usually read by other users (the trainer, the agent).
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".tmp")
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .tempfile_in(dir)
            .map_err(|e| StorageError::io(dir, e))?;
        let file = tmp
            .as_file()
            .try_clone()
            .map_err(|e| StorageError::io(dir, e))?;
        Ok(Box::new(LocalStaged {
            dst: dst.to_path_buf(),
            tmp,
            out: BufWriter::with_capacity(1 << 20, file),
        }))
    }
}

impl StagedObject for LocalStaged {
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)
    }

    fn commit(self: Box<Self>) -> io::Result<()> {
        let LocalStaged { dst, tmp, out } = *self;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        tmp.persist(&dst).map_err(|e| e.error)?;
        if let Some(dir) = dst.parent().filter(|p| !p.as_os_str().is_empty()) {
            // Make the rename itself durable.
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(())
    }
}
