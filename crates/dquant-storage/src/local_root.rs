//! A local directory as a [`Root`], confined to itself.
//!
//! An agent serves a directory to clients it does not trust, so a name must never reach a
//! file outside it. Names are checked ([`normalize_name`]: no `..`, nothing absolute), and
//! every object stat'ed or opened is canonicalized (every symlink resolved) and must lie inside
//! the root's real directory. That holds for each object separately: the `.bin` opened beside
//! an in-root `.idx` is checked on its own. Opening refuses anything but a regular file,
//! checked with `fstat` on the opened descriptor before any read (a FIFO named `x.idx` is an
//! error at once, not a read that blocks), and uses `O_NOFOLLOW`, so a symlink swapped in
//! after the check is not followed.

use std::fs;
use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};

use rustix::fs::OFlags;

use crate::backend::{open_regular, ReadAt};
use crate::root::{normalize_name, ObjectMeta, Root, RootError};

/// A directory served as a root.
#[derive(Clone, Debug)]
pub struct LocalRoot {
    /// Canonical: every check compares canonical paths against it.
    dir: PathBuf,
}

impl LocalRoot {
    /// Serves `dir`, which must exist and be a directory.
    pub fn new(dir: &Path) -> io::Result<Self> {
        let dir = dir.canonicalize()?;
        if !dir.is_dir() {
            return Err(io::Error::new(ErrorKind::NotADirectory, "not a directory"));
        }
        Ok(LocalRoot { dir })
    }

    /// The root's real (canonical) directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The real path of `name`, after checking the name and that the path stays inside.
    fn locate(&self, name: &str) -> Result<(String, PathBuf), RootError> {
        let norm = normalize_name(name)?;
        let real = self
            .dir
            .join(&norm)
            .canonicalize()
            .map_err(|e| io_error(name, e))?;
        if !real.starts_with(&self.dir) {
            return Err(RootError::Escape { name: name.into() });
        }
        Ok((norm, real))
    }

    /// Adds the regular file at `p` (a path under the root) to `out`, or queues it on
    /// `dirs` if it is a real directory; anything leading outside is skipped.
    fn visit(&self, p: PathBuf, dirs: &mut Vec<PathBuf>, out: &mut Vec<ObjectMeta>) {
        let Ok(real) = p.canonicalize() else { return };
        if !real.starts_with(&self.dir) {
            return;
        }
        let Ok(meta) = fs::metadata(&real) else {
            return;
        };
        if meta.is_dir() {
            // Descend into real directories only: a symlinked directory may lead back up the
            // tree and loop.
            if p.symlink_metadata().is_ok_and(|m| m.is_dir()) {
                dirs.push(p);
            }
            return;
        }
        // Names are strings: a file whose name is not UTF-8 cannot be asked for, so is not
        // listed.
        let rel = p.strip_prefix(&self.dir).ok().and_then(Path::to_str);
        if let (true, Some(name)) = (meta.is_file(), rel) {
            out.push(ObjectMeta {
                name: name.to_string(),
                len: meta.len(),
            });
        }
    }
}

/// A missing file (or a missing directory on the way) is `NotFound`.
fn io_error(name: &str, e: io::Error) -> RootError {
    match e.kind() {
        ErrorKind::NotFound | ErrorKind::NotADirectory => RootError::NotFound { name: name.into() },
        _ => RootError::Io {
            name: name.into(),
            source: e,
        },
    }
}

impl Root for LocalRoot {
    /// Unreadable subdirectories are skipped; an unreadable root is an error.
    fn objects(&self) -> Result<Vec<ObjectMeta>, RootError> {
        let top = fs::read_dir(&self.dir).map_err(|e| RootError::Io {
            name: ".".into(),
            source: e,
        })?;
        let mut out = Vec::new();
        let mut dirs = Vec::new();
        for e in top.flatten() {
            self.visit(e.path(), &mut dirs, &mut out);
        }
        while let Some(d) = dirs.pop() {
            let Ok(rd) = fs::read_dir(&d) else { continue };
            for e in rd.flatten() {
                self.visit(e.path(), &mut dirs, &mut out);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn stat(&self, name: &str) -> Result<ObjectMeta, RootError> {
        let (norm, real) = self.locate(name)?;
        let meta = fs::metadata(&real).map_err(|e| io_error(name, e))?;
        if !meta.is_file() {
            return Err(RootError::NotAFile { name: name.into() });
        }
        Ok(ObjectMeta {
            name: norm,
            len: meta.len(),
        })
    }

    fn open(&self, name: &str) -> Result<Box<dyn ReadAt>, RootError> {
        let (_, real) = self.locate(name)?;
        match open_regular(&real, OFlags::NOFOLLOW) {
            Ok(Ok(file)) => Ok(Box::new(file)),
            Ok(Err(_)) => Err(RootError::NotAFile { name: name.into() }),
            Err(e) => Err(io_error(name, e)),
        }
    }
}
