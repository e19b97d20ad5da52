//! What a storage backend is ([`Backend`]: its scheme, and how a URI of it opens a store)
//! and what it opens ([`StorePlace`]: a path in that store, as a root, an object or an
//! output). Apart from the registry (`backends`) so that each backend's module depends on
//! these types and the registry on the backends, never around a circle.

use std::sync::Arc;

use object_store::ObjectStore;

use crate::error::ObjectRootError;
use crate::{ObjectDestination, ObjectRoot, ReadSettings, S3Settings};

/// A storage backend reached by URI.
pub struct Backend {
    /// What a URI starts with to name it, e.g. `s3://`.
    pub scheme: &'static str,
    /// The store a URI of this scheme names, and the path inside it.
    pub open: fn(uri: &str, settings: &S3Settings) -> Result<StorePlace, ObjectRootError>,
}

/// Whether a path inside a store (no leading or trailing `/`) is plain: empty, or segments
/// none of which is empty, `.` or `..`, so that names under it cannot reach outside it.
pub(crate) fn is_plain_path(path: &str) -> bool {
    path.is_empty()
        || !path
            .split('/')
            .any(|p| p.is_empty() || p == "." || p == "..")
}

/// A path in a backend's store, its client made.
pub struct StorePlace {
    pub store: Arc<dyn ObjectStore>,
    /// What the store is called in messages and listings, e.g. `s3://BUCKET`.
    pub location: String,
    /// The path the location names inside the store (no leading or trailing `/`; may be
    /// empty for the whole store).
    pub path: String,
    pub read: ReadSettings,
    /// The part size outputs are uploaded in.
    pub part_bytes: usize,
}

impl StorePlace {
    /// `path` in `store`, read and written as `settings` say.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        location: String,
        path: String,
        settings: &S3Settings,
    ) -> Self {
        StorePlace {
            store,
            location,
            path,
            read: settings.read(),
            part_bytes: usize::try_from(settings.part_bytes).unwrap_or(usize::MAX),
        }
    }

    /// The whole location as a root (an agent's `--root NAME=s3://BUCKET/PREFIX`).
    pub fn root(&self) -> ObjectRoot {
        ObjectRoot::new(self.store.clone(), self.shown(), &self.path, self.read)
    }

    /// The location as one object: the store's root and the object's name in it (a CLI input
    /// or output, `s3://BUCKET/KEY`). A location without a path names no object: an error.
    pub fn object(&self) -> Result<(ObjectRoot, String), ObjectRootError> {
        if self.path.is_empty() {
            return Err(ObjectRootError::Location {
                location: self.location.clone(),
                problem: "it names no object: give a path after the bucket".into(),
            });
        }
        let root = ObjectRoot::new(self.store.clone(), self.location.clone(), "", self.read);
        Ok((root, self.path.clone()))
    }

    /// Outputs written into the store as multipart uploads.
    pub fn destination(&self) -> ObjectDestination {
        ObjectDestination::new(self.store.clone(), self.part_bytes)
    }

    /// The location and its path, as a user writes them.
    fn shown(&self) -> String {
        match self.path.as_str() {
            "" => self.location.clone(),
            p => format!("{}/{p}", self.location),
        }
    }
}
