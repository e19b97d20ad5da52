//! Every storage backend a URI can name, in one registry keyed by scheme, and the one place
//! a location (a local path or such a URI) becomes a root, a dataset's object or an output.
//!
//! Why here: the agent's catalog, the CLI's inputs and `dquant convert`'s outputs all take
//! the same locations, and each used to match `s3://` itself. Now they ask [`locate`], and a
//! new backend is a module with its [`Backend`] plus one line in [`BACKENDS`]: nothing above
//! changes. Every backend is an `object_store` store (so [`ObjectRoot`](crate::ObjectRoot) serves it, and it
//! passes the root conformance suite through that); local paths, the default, stay on the
//! storage layer's own `LocalRoot` and files.

use std::path::{Path, PathBuf};

use crate::backend::{Backend, StorePlace};
use crate::error::ObjectRootError;
use crate::S3Settings;

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

/// Where a location points.
pub enum Place {
    /// A path on this machine.
    Local(PathBuf),
    /// A path in a backend's store.
    Store(StorePlace),
}

/// Resolves `at`: a URI of a registered scheme opens its backend's store (with `settings`:
/// the config's `[s3]` and the `AWS_*` variables); anything else is a local path.
pub fn locate(at: &Path, settings: &S3Settings) -> Result<Place, ObjectRootError> {
    match at.to_str().and_then(|s| Some((s, backend_of(s)?))) {
        Some((uri, backend)) => Ok(Place::Store((backend.open)(uri, settings)?)),
        None => Ok(Place::Local(at.to_path_buf())),
    }
}
