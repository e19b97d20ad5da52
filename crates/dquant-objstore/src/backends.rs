//! Every storage backend a URI can name, in one registry keyed by scheme, and the one place
//! a location (a local path or such a URI) becomes a root, a dataset's object or an output.
//!
//! Why here: the agent's catalog, the CLI's inputs and `dquant convert`'s outputs all take
//! the same locations, and each used to match `s3://` itself. Now they ask [`locate`], and a
//! new backend is a module with its [`Backend`] plus one line in [`BACKENDS`]: nothing above
//! changes. Every backend is an `object_store` store (so [`ObjectRoot`] serves it, and it
//! passes the root conformance suite through that); local paths, the default, stay on the
//! storage layer's own `LocalRoot` and files.

use std::path::{Path, PathBuf};
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

/// The backends, by scheme. A URI that starts with none of them is a local path.
pub const BACKENDS: &[&Backend] = &[
    &crate::location::S3_BACKEND,
    &crate::local_store::FILE_BACKEND,
];

/// The backend whose scheme `uri` starts with.
pub fn backend_of(uri: &str) -> Option<&'static Backend> {
    BACKENDS.iter().copied().find(|b| uri.starts_with(b.scheme))
}

/// Whether `s` names a location in a backend's store (rather than a local path).
pub fn is_object_uri(s: &str) -> bool {
    backend_of(s).is_some()
}

/// The schemes of every backend, for messages and listings (`s3://`, ...).
pub fn schemes() -> impl Iterator<Item = &'static str> {
    BACKENDS.iter().map(|b| b.scheme)
}

/// Whether a path inside a store (no leading or trailing `/`) is plain: empty, or segments
/// none of which is empty, `.` or `..`, so that names under it cannot reach outside it.
pub(crate) fn is_plain_path(path: &str) -> bool {
    path.is_empty()
        || !path
            .split('/')
            .any(|p| p.is_empty() || p == "." || p == "..")
}

/// Where a location points.
pub enum Place {
    /// A path on this machine.
    Local(PathBuf),
    /// A path in a backend's store.
    Store(StorePlace),
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

/// Resolves `at`: a URI of a registered scheme opens its backend's store (with `settings`:
/// the config's `[s3]` and the `AWS_*` variables); anything else is a local path.
pub fn locate(at: &Path, settings: &S3Settings) -> Result<Place, ObjectRootError> {
    match at.to_str().and_then(|s| Some((s, backend_of(s)?))) {
        Some((uri, backend)) => Ok(Place::Store((backend.open)(uri, settings)?)),
        None => Ok(Place::Local(at.to_path_buf())),
    }
}

impl StorePlace {
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
