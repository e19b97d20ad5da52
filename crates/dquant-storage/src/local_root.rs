//! A local directory as a [`Root`], confined to itself.
//!
//! An agent serves a directory to clients it does not trust, so a name must never reach a
//! file outside it, whatever the links in the directory, and even while someone who can
//! write inside it swaps directories for symlinks under a running agent.
//!
//! Names are checked first ([`normalize_name`]: no `..`, nothing absolute). Then no path is
//! ever resolved from `/`: the root's directory is opened once, in [`LocalRoot::new`] (an
//! `O_PATH` descriptor), and every object is resolved *beneath that descriptor* by the kernel
//! in the same call that opens it: `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`.
//! Checking a canonical path and then opening it (what this module did before) is a race: a
//! directory on the way can be replaced by a symlink to `/` between the check and the open,
//! and `O_NOFOLLOW` only guards the last component. Resolving beneath a descriptor leaves no
//! window: whatever the tree looks like at the moment of the call, the kernel will not step
//! outside it (`..` above the root and links out of it fail with `EXDEV`).
//!
//! Each object is confined on its own: the `.bin` opened beside an in-root `.idx` (and the
//! reverse, and a `.dqb`) goes through the same resolution, so a link from one file of a
//! dataset to outside is refused ([`RootError::Escape`]) even when its sibling is fine.
//!
//! Only regular files are served. The object is first resolved with `O_PATH` (which opens
//! nothing: no FIFO, device or socket is ever opened for reading) and checked with `fstat`;
//! only a regular file is then opened `O_RDONLY | O_NONBLOCK | O_NOCTTY` and checked with
//! `fstat` once more (it may have been swapped in between; `O_NONBLOCK` keeps a FIFO swapped
//! in from blocking the open). Anything else is [`RootError::NotAFile`], at once.
//!
//! Links that stay inside the root are followed. `RESOLVE_BENEATH` refuses every absolute
//! link, even one pointing into the root, and any escape, with the same `EXDEV`; so on `EXDEV`
//! the name is resolved again by [`walk`], which tells the two apart.
//!
//! # The walk
//!
//! [`walk`] resolves a name one component at a time, each one `openat(dir, component,
//! O_PATH | O_NOFOLLOW)` relative to the descriptor of the directory it has reached, starting
//! at the root's. The kernel never follows a link during it: a link is read (`readlinkat` on
//! the link's own descriptor, so it is the link that was checked) and its target is walked
//! the same way, a relative target from the link's directory, an absolute one only if it
//! names a path under the root's real directory (then from the root's descriptor). `..` steps
//! back along the directories walked, and `..` at the root is an escape. So the walk follows
//! exactly the links `openat2` would, plus absolute links into the root, and cannot leave the
//! root either.
//!
//! The walk is also the fallback where `openat2` is missing (`ENOSYS`: a kernel before 5.6;
//! `EPERM` or `ENOSYS` from a seccomp filter): the same names open, and are refused, either
//! way. [`LocalRoot::new_without_openat2`] makes a root that only walks, so both paths are
//! tested on any kernel.
//!
//! The fallback follows links (itself, never the kernel) rather than refusing every one,
//! because the walk is needed on every kernel anyway for absolute links into the root, and a
//! root should serve the same names whichever kernel it runs on.
//!
//! What neither guards against: someone with write access both inside the root and outside
//! it (on the same filesystem) moving a directory *out* of the root while a name is being
//! resolved through it. Neither resolution can tell that a directory it has already stepped
//! into has since been moved out (only `..` and links are checked), and serving a tree whose
//! writers may rearrange it across the root's boundary is outside this root's promise.
//!
//! Listing ([`Root::objects`]) walks the tree with directory descriptors too (never
//! descending through a link, so a link back up the tree cannot make it loop), lists regular
//! files as they are, and lists a link only if [`Root::stat`] of its name succeeds: an object
//! is listed exactly when it can be stat'ed and opened.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::io::{self, ErrorKind};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

use crate::backend::{local_version, LocalFile, ReadAt, READ_FLAGS};
use crate::root::{normalize_name, ObjectMeta, Root, RootError};

/// At most this many links are followed resolving one name (Linux's own limit).
const MAX_LINKS: usize = 40;

/// Resolving without opening: a descriptor to `fstat`, whatever the object is.
const PROBE_FLAGS: OFlags = OFlags::PATH.union(OFlags::CLOEXEC);

/// A directory to list.
const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// A directory served as a root.
#[derive(Clone, Debug)]
pub struct LocalRoot {
    /// Canonical: what [`LocalRoot::dir`] reports, and how absolute links into the root are
    /// recognized. Never opened again after `new`.
    dir: PathBuf,
    /// The root's directory, `O_PATH | O_DIRECTORY`: everything is resolved beneath it.
    fd: Arc<OwnedFd>,
    /// False once `openat2` is known to be missing; then every name is walked.
    openat2: Arc<AtomicBool>,
    /// How many names `openat2` resolved, and how many the walk did ([`Resolutions`]).
    counts: Arc<[AtomicU64; 2]>,
}

/// How a root's names were resolved so far: by `openat2` beneath the root, or by the
/// component-by-component walk. Confinement is observable: on a kernel with `openat2`, plain
/// names go `beneath`; the walk takes only what `openat2` hands back (links, `..` races).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resolutions {
    pub beneath: u64,
    pub walked: u64,
}

impl LocalRoot {
    /// Serves `dir`, which must exist and be a directory.
    pub fn new(dir: &Path) -> io::Result<Self> {
        Self::with_openat2(dir, true)
    }

    /// A root that never calls `openat2` and resolves every name by the component-by-component
    /// walk (see the module docs), as on a kernel without `openat2`. For tests of that path on
    /// kernels that have it.
    #[doc(hidden)]
    pub fn new_without_openat2(dir: &Path) -> io::Result<Self> {
        Self::with_openat2(dir, false)
    }

    fn with_openat2(dir: &Path, openat2: bool) -> io::Result<Self> {
        let dir = dir.canonicalize()?;
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let fd = match rustix::fs::open(&dir, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOTDIR) => {
                return Err(io::Error::new(ErrorKind::NotADirectory, "not a directory"))
            }
            Err(e) => return Err(e.into()),
        };
        Ok(LocalRoot {
            dir,
            fd: Arc::new(fd),
            openat2: Arc::new(AtomicBool::new(openat2)),
            counts: Arc::new([AtomicU64::new(0), AtomicU64::new(0)]),
        })
    }

    /// How this root's names were resolved so far (clones share the counts).
    pub fn resolutions(&self) -> Resolutions {
        Resolutions {
            beneath: self.counts[0].load(Ordering::Relaxed),
            walked: self.counts[1].load(Ordering::Relaxed),
        }
    }

    /// The root's real (canonical) directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Resolves `name` beneath the root to a regular file: with `read`, opened for reading;
    /// without, an `O_PATH` descriptor (for `fstat` only). Returns the descriptor, its
    /// status and the normalized name.
    fn find(&self, name: &str, read: bool) -> Result<(OwnedFd, Stat, String), RootError> {
        let norm = normalize_name(name)?;
        let beneath = self.beneath(&norm, read);
        self.counts[usize::from(beneath.is_none())].fetch_add(1, Ordering::Relaxed);
        let (fd, st) = match beneath {
            Some(Ok(found)) => found,
            Some(Err(e)) => return Err(errno_error(name, e)),
            None => walk(self.fd.as_fd(), &self.dir, name, &norm, read)?,
        };
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(RootError::NotAFile { name: name.into() });
        }
        Ok((fd, st, norm))
    }

    /// `openat2` beneath the root (see the module docs); `None` where the name must be
    /// walked instead: `openat2` is missing or refused, or the name led out of the root or
    /// through an absolute link (`EXDEV`, which the walk tells apart), or a rename raced
    /// with a `..` (`EAGAIN`).
    fn beneath(&self, norm: &str, read: bool) -> Option<Result<(OwnedFd, Stat), Errno>> {
        if !self.openat2.load(Ordering::Relaxed) {
            return None;
        }
        let how = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
        let open = |flags| rustix::fs::openat2(self.fd.as_fd(), norm, flags, Mode::empty(), how);
        let stat = |fd: OwnedFd| rustix::fs::fstat(&fd).map(|st| (fd, st));
        let found = open(PROBE_FLAGS).and_then(stat);
        let found = match found {
            Ok((_, st)) if read && FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => {
                open(READ_FLAGS).and_then(stat)
            }
            other => other,
        };
        match found {
            Err(Errno::NOSYS) => {
                self.openat2.store(false, Ordering::Relaxed);
                None
            }
            // EPERM is also what some seccomp filters answer for a syscall they do not know;
            // the walk gets the file's own EPERM if that is what it was.
            Err(Errno::PERM | Errno::XDEV | Errno::AGAIN) => None,
            other => Some(other),
        }
    }

    /// Every object under the root, recursively, in no order; an unreadable root is an
    /// error, an unreadable subdirectory is skipped.
    fn walk_tree(&self) -> Result<Vec<ObjectMeta>, Errno> {
        let top = rustix::fs::openat(self.fd.as_fd(), c".", DIR_FLAGS, Mode::empty())?;
        let mut out = Vec::new();
        // Directories to list: name (relative to the root, "" for the root) and descriptor.
        let mut todo = vec![(String::new(), top)];
        while let Some((prefix, fd)) = todo.pop() {
            let dir = match Dir::read_from(&fd) {
                Ok(dir) => dir,
                Err(e) if prefix.is_empty() => return Err(e),
                Err(_) => continue,
            };
            for entry in dir {
                let Ok(entry) = entry else { break };
                let fname = entry.file_name();
                // Names are strings: a file whose name is not UTF-8 cannot be asked for, so
                // is not listed.
                let Ok(s) = fname.to_str() else { continue };
                if s == "." || s == ".." {
                    continue;
                }
                let rel = if prefix.is_empty() {
                    s.to_string()
                } else {
                    format!("{prefix}/{s}")
                };
                let Ok(st) = rustix::fs::statat(&fd, fname, AtFlags::SYMLINK_NOFOLLOW) else {
                    continue;
                };
                match FileType::from_raw_mode(st.st_mode) {
                    FileType::RegularFile => out.push(ObjectMeta::new(
                        rel,
                        st.st_size as u64,
                        Some(local_version(&st)),
                    )),
                    // Descend into real directories only: a symlinked directory may lead back
                    // up the tree and loop.
                    FileType::Directory => {
                        if let Ok(sub) = rustix::fs::openat(&fd, fname, DIR_FLAGS, Mode::empty()) {
                            todo.push((rel, sub));
                        }
                    }
                    FileType::Symlink => {
                        if let Ok(meta) = self.stat(&rel) {
                            out.push(ObjectMeta { name: rel, ..meta });
                        }
                    }
                    // FIFOs, sockets and devices are never served.
                    _ => {}
                }
            }
        }
        Ok(out)
    }
}

/// What an errno means for the object `name`.
fn errno_error(name: &str, e: Errno) -> RootError {
    match e {
        // A missing file, or a missing directory (or a file) on the way.
        Errno::NOENT | Errno::NOTDIR => RootError::NotFound { name: name.into() },
        // Opening a regular file never answers these: a socket (ENXIO), or a device without
        // a driver (ENXIO, ENODEV), swapped in after the `O_PATH` check.
        Errno::NXIO | Errno::NODEV => RootError::NotAFile { name: name.into() },
        _ => RootError::Io {
            name: name.into(),
            source: e.into(),
        },
    }
}

/// Resolves `norm` (the normalized form of `name`, which errors report) beneath `root`, the
/// descriptor of the directory `root_dir` (canonical), one component at a time without the
/// kernel ever following a link: see the module docs. With `read`, a regular file at the end
/// is opened for reading (`O_NOFOLLOW | O_NONBLOCK`, relative to its directory's
/// descriptor); anything else at the end, or without `read`, is returned as an `O_PATH`
/// descriptor. Returns the descriptor and its `fstat`; the caller checks the type.
///
/// [`LocalRoot::new_without_openat2`] makes a root that calls only this, for tests.
fn walk(
    root: BorrowedFd<'_>,
    root_dir: &Path,
    name: &str,
    norm: &str,
    read: bool,
) -> Result<(OwnedFd, Stat), RootError> {
    let err = |e: Errno| errno_error(name, e);
    let escape = || RootError::Escape { name: name.into() };
    let mut todo = VecDeque::new();
    push_front(&mut todo, Path::new(norm)).map_err(|()| escape())?;
    // The directories walked below the root, innermost last; empty at the root.
    let mut dirs: Vec<OwnedFd> = Vec::new();
    let mut links = 0;
    while let Some(part) = todo.pop_front() {
        if part == ".." {
            if dirs.pop().is_none() {
                return Err(escape());
            }
            continue;
        }
        let here = dirs.last().map_or(root, |d| d.as_fd());
        let fd = rustix::fs::openat(here, &part, PROBE_FLAGS | OFlags::NOFOLLOW, Mode::empty())
            .map_err(err)?;
        let st = rustix::fs::fstat(&fd).map_err(err)?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(err(Errno::LOOP));
                }
                // The empty path reads the link `fd` itself refers to: the one just checked.
                let target = rustix::fs::readlinkat(&fd, c"", Vec::new()).map_err(err)?;
                let target = Path::new(OsStr::from_bytes(target.as_bytes()));
                let rest = if target.is_absolute() {
                    let Ok(rest) = target.strip_prefix(root_dir) else {
                        return Err(escape());
                    };
                    dirs.clear();
                    rest
                } else {
                    target
                };
                push_front(&mut todo, rest).map_err(|()| escape())?;
            }
            FileType::Directory if !todo.is_empty() => dirs.push(fd),
            // A file where a directory should be.
            _ if !todo.is_empty() => return Err(err(Errno::NOTDIR)),
            FileType::RegularFile if read => {
                let file =
                    rustix::fs::openat(here, &part, READ_FLAGS | OFlags::NOFOLLOW, Mode::empty())
                        .map_err(err)?;
                let st = rustix::fs::fstat(&file).map_err(err)?;
                return Ok((file, st));
            }
            _ => return Ok((fd, st)),
        }
    }
    // The name ends in `..` (through a link), on a directory.
    Err(RootError::NotAFile { name: name.into() })
}

/// Puts the components of the relative path `p` in front of `todo`, in order, `..` as
/// `..` and `.` dropped; `Err` if `p` is not relative (no component may be opened as an
/// absolute path: `openat` would ignore the directory).
fn push_front(todo: &mut VecDeque<OsString>, p: &Path) -> Result<(), ()> {
    for c in p.components().rev() {
        match c {
            Component::Normal(s) => todo.push_front(s.to_os_string()),
            Component::ParentDir => todo.push_front("..".into()),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return Err(()),
        }
    }
    Ok(())
}

impl Root for LocalRoot {
    /// Unreadable subdirectories are skipped; an unreadable root is an error.
    fn objects(&self) -> Result<Vec<ObjectMeta>, RootError> {
        let mut out = self.walk_tree().map_err(|e| RootError::Io {
            name: ".".into(),
            source: e.into(),
        })?;
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn stat(&self, name: &str) -> Result<ObjectMeta, RootError> {
        let (_, st, norm) = self.find(name, false)?;
        Ok(ObjectMeta::new(
            norm,
            st.st_size as u64,
            Some(local_version(&st)),
        ))
    }

    fn open(&self, name: &str) -> Result<Box<dyn ReadAt>, RootError> {
        let (fd, st, norm) = self.find(name, true)?;
        let path = self.dir.join(norm);
        Ok(Box::new(LocalFile::from_fd(fd, &st, path)))
    }
}
