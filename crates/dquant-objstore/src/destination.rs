//! Outputs written into an object store: each file a multipart upload, completed only when
//! the writer finishes, so a failed `dquant convert … s3://…` leaves nothing under the name
//! (the upload is aborted), as a failed local write leaves no file.

use std::io;
use std::path::Path as FsPath;
use std::sync::Arc;

use dquant_storage::{Destination, StagedObject, StorageError};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _, WriteMultipart};

use crate::error::ObjectRootError;
use crate::location::S3Location;
use crate::settings::S3Settings;
use dquant_runtime::{block_in, run};

/// S3's least size of a multipart upload's parts, but the last.
const MIN_PART_BYTES: usize = 5 << 20;

/// Part uploads in flight per output before a write waits.
const UPLOADS_IN_FLIGHT: usize = 4;

/// A bucket written by multipart uploads; names are keys in the bucket.
pub struct ObjectDestination {
    store: Arc<dyn ObjectStore>,
    part_bytes: usize,
}

impl ObjectDestination {
    /// Writes into `at`'s bucket (the prefix is ignored: names are whole keys).
    pub fn s3(at: &S3Location, settings: &S3Settings) -> Result<Self, ObjectRootError> {
        Ok(Self::new(settings.store(at)?, settings.part_bytes as usize))
    }

    /// Writes into `store` in parts of `part_bytes`, raised to S3's least part size (5 MiB:
    /// every part but the last must be that long) when smaller, as a read-tuned setting may be.
    pub fn new(store: Arc<dyn ObjectStore>, part_bytes: usize) -> Self {
        ObjectDestination {
            store,
            part_bytes: part_bytes.max(MIN_PART_BYTES),
        }
    }
}

fn other(e: object_store::Error) -> io::Error {
    io::Error::other(e.to_string())
}

impl Destination for ObjectDestination {
    fn stage(&self, name: &FsPath) -> Result<Box<dyn StagedObject>, StorageError> {
        let fail = |e| StorageError::Io {
            path: name.to_path_buf(),
            source: e,
        };
        let key = name
            .to_str()
            .and_then(|k| Path::parse(k).ok())
            .ok_or_else(|| {
                fail(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "not a valid object key",
                ))
            })?;
        let store = self.store.clone();
        let upload =
            run(async move { store.put_multipart(&key).await }).map_err(|e| fail(other(e)))?;
        Ok(Box::new(Upload {
            w: Some(WriteMultipart::new_with_chunk_size(upload, self.part_bytes)),
        }))
    }
}

/// One multipart upload; aborted when dropped before [`StagedObject::commit`].
struct Upload {
    w: Option<WriteMultipart>,
}

impl StagedObject for Upload {
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        let w = self
            .w
            .as_mut()
            .ok_or_else(|| io::Error::other("upload already ended"))?;
        // Part uploads are spawned on the runtime; this thread only waits for room.
        block_in(w.wait_for_capacity(UPLOADS_IN_FLIGHT)).map_err(other)?;
        w.write(bytes);
        Ok(())
    }

    fn commit(mut self: Box<Self>) -> io::Result<()> {
        let w = self
            .w
            .take()
            .ok_or_else(|| io::Error::other("upload already ended"))?;
        block_in(w.finish()).map_err(other)?;
        Ok(())
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        if let Some(w) = self.w.take() {
            let _ = block_in(w.abort());
        }
    }
}
