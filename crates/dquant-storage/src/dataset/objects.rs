//! Where a dataset's objects come from while it opens: local paths, or names under a [`Root`].
//!
//! One seam, so that format recognition exists once whatever the store.

use std::path::{Path, PathBuf};

use crate::backend::{LocalFile, ReadAt};
use crate::error::StorageError;
use crate::root::{Root, RootError};

/// Where a dataset's objects come from while it is opened: local paths, or names under a
/// [`Root`]. Names are paths so that any local path, UTF-8 or not, opens as it always did;
/// names under a root are built from `&str`s, so are always UTF-8. Errors name the object
/// as it was asked for.
pub(super) trait Objects {
    /// Whether `name` is there, to recognise a Megatron prefix. A name the store refuses
    /// counts as there, so that opening it reports the refusal.
    fn exists(&self, name: &Path) -> bool;

    fn open(&self, name: &Path) -> Result<Box<dyn ReadAt>, StorageError>;
}

/// Any local path, unconfined: whoever names a path on the command line may read it.
pub(super) struct Paths;

impl Objects for Paths {
    fn exists(&self, name: &Path) -> bool {
        name.exists()
    }

    fn open(&self, name: &Path) -> Result<Box<dyn ReadAt>, StorageError> {
        match LocalFile::open(name) {
            Ok(f) => Ok(Box::new(f)),
            Err(e) => Err(StorageError::io(name, e)),
        }
    }
}

/// Names under a root, which confines them.
pub(super) struct InRoot<'a>(pub(super) &'a dyn Root);

impl InRoot<'_> {
    fn name<'n>(&self, name: &'n Path) -> Result<&'n str, StorageError> {
        name.to_str().ok_or_else(|| {
            StorageError::Usage(format!("{}: names under a root are UTF-8", name.display()))
        })
    }
}

impl Objects for InRoot<'_> {
    fn exists(&self, name: &Path) -> bool {
        self.name(name)
            .is_ok_and(|n| !matches!(self.0.stat(n), Err(RootError::NotFound { .. })))
    }

    fn open(&self, name: &Path) -> Result<Box<dyn ReadAt>, StorageError> {
        Ok(self.0.open(self.name(name)?)?)
    }
}

/// If `path` names a Megatron dataset, its prefix (`x` for `x`, `x.idx` or `x.bin`).
pub(super) fn megatron_prefix(objects: &dyn Objects, path: &Path) -> Option<PathBuf> {
    let s = path.as_os_str().to_string_lossy();
    if let Some(p) = s.strip_suffix(".idx").or_else(|| s.strip_suffix(".bin")) {
        if objects.exists(Path::new(&format!("{p}.idx"))) {
            return Some(PathBuf::from(p));
        }
    }
    objects
        .exists(Path::new(&format!("{s}.idx")))
        .then(|| path.to_path_buf())
}
