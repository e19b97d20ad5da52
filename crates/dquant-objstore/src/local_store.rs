//! `file:///DIR`: a directory on this machine as an object store (`object_store`'s
//! `LocalFileSystem`), the second backend behind [`BACKENDS`](crate::BACKENDS).
//!
//! Why a local directory through an object store, when `LocalRoot` reads directories
//! directly: it serves the object-store read path (ranged reads, readahead, versions from the
//! store's ETags, the block cache in front of it) with no S3 server, so that path can be
//! tried, measured and cached on any machine. Plain paths stay on `LocalRoot`.

use std::sync::Arc;

use object_store::local::LocalFileSystem;

use crate::backend::{is_plain_path, Backend, StorePlace};
use crate::error::ObjectRootError;
use crate::S3Settings;

/// The scheme of a local directory reached as an object store.
pub const FILE_SCHEME: &str = "file://";

pub(crate) const FILE_BACKEND: Backend = Backend {
    scheme: FILE_SCHEME,
    open: open_file,
};

/// `file:///ABSOLUTE/PATH`: the store is the file system from `/`, the path the rest. Paths
/// with empty, `.` or `..` segments are refused, as S3 prefixes are.
fn open_file(uri: &str, settings: &S3Settings) -> Result<StorePlace, ObjectRootError> {
    let bad = |problem: &str| ObjectRootError::Location {
        location: uri.to_string(),
        problem: problem.to_string(),
    };
    let path = uri
        .strip_prefix(FILE_SCHEME)
        .filter(|p| p.starts_with('/'))
        .ok_or_else(|| bad("expected file:///ABSOLUTE/PATH"))?;
    let path = path.trim_matches('/');
    if !is_plain_path(path) {
        return Err(bad("the path may not hold empty, '.' or '..' segments"));
    }
    Ok(StorePlace::new(
        Arc::new(LocalFileSystem::new()),
        FILE_SCHEME.to_string(),
        path.to_string(),
        settings,
    ))
}
