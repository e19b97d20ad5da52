//! A root: a named place that holds datasets (a directory today, a bucket prefix later).
//!
//! Everything above the storage layer (the agent's catalog, [`Dataset::open_in`]) reaches
//! bytes only through this trait, so a new kind of store is one new implementation, not
//! changes in every file that used to take a `PathBuf`. The shape follows arrow-rs
//! `object_store`: objects are named by relative `a/b/c` strings, listed, stat'ed and opened
//! for positional reads ([`ReadAt`]); nothing else is asked of a store.
//!
//! Names are checked the same way by every root ([`normalize_name`]): no `..`, no absolute
//! names, `.` and empty segments dropped, so no implementation can be talked out of itself by
//! a name alone. A root that can also be escaped by other means (a directory's symlinks)
//! checks that itself.
//!
//! [`Dataset::open_in`]: crate::Dataset::open_in

use std::collections::BTreeMap;
use std::fmt;
use std::io;

pub use crate::backend::ObjectVersion;
use crate::backend::ReadAt;

/// One object of a root: its name, length and version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectMeta {
    /// Relative name, `/`-separated, normalized.
    pub name: String,
    /// Length in bytes.
    pub len: u64,
    /// What changes when the object is replaced or rewritten, when the root can tell.
    pub version: Option<ObjectVersion>,
}

impl ObjectMeta {
    pub fn new(name: impl Into<String>, len: u64, version: Option<ObjectVersion>) -> Self {
        ObjectMeta {
            name: name.into(),
            len,
            version,
        }
    }
}

/// What kind of dataset a listed [`Entry`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EntryKind {
    /// A Megatron prefix: `NAME.bin` with its `NAME.idx`.
    Megatron,
    /// A dquant block file (`.dqb`).
    Blocks,
    /// Any other object: a raw token file, which needs a dtype to open.
    Raw,
}

impl EntryKind {
    /// The kind as the control plane names it.
    pub fn as_str(&self) -> &'static str {
        match self {
            EntryKind::Megatron => "megatron",
            EntryKind::Blocks => "dquant-blocks",
            EntryKind::Raw => "raw",
        }
    }
}

impl fmt::Display for EntryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One dataset under a root, as [`Root::list`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The name to open it by (the prefix, for a Megatron dataset).
    pub name: String,
    pub kind: EntryKind,
    /// Bytes of all its objects together (`.bin` and `.idx` for a Megatron dataset).
    pub bytes: u64,
}

/// Why a name is refused before any store is asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NameProblem {
    /// A `..` segment.
    ParentDir,
    /// A leading `/`.
    Absolute,
    /// Nothing left once `.` and empty segments are dropped.
    Empty,
}

impl fmt::Display for NameProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NameProblem::ParentDir => "'..' is not allowed; names are relative to the root",
            NameProblem::Absolute => {
                "absolute names are not allowed; names are relative to the root"
            }
            NameProblem::Empty => "empty name; name an object under the root",
        })
    }
}

/// Errors of a [`Root`]; each names the object it concerns.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RootError {
    #[error("{name}: no such object")]
    NotFound { name: String },
    #[error("{name}: {problem}")]
    InvalidName { name: String, problem: NameProblem },
    /// The name leads outside the root (a symlink pointing out of a directory root).
    #[error("{name}: leads outside the root (symlink escape)")]
    Escape { name: String },
    /// A directory, FIFO, socket or device: nothing to read positionally.
    #[error("{name}: not a regular file")]
    NotAFile { name: String },
    #[error("{name}: {source}")]
    Io {
        name: String,
        #[source]
        source: io::Error,
    },
}

impl RootError {
    /// The object the error concerns.
    pub fn name(&self) -> &str {
        match self {
            RootError::NotFound { name }
            | RootError::InvalidName { name, .. }
            | RootError::Escape { name }
            | RootError::NotAFile { name }
            | RootError::Io { name, .. } => name,
        }
    }
}

/// A store of named, immutable objects that datasets are opened from.
///
/// Object safe: the catalog holds roots as `Arc<dyn Root>`. Every name is relative and
/// `/`-separated; implementations check it with [`normalize_name`].
pub trait Root: Send + Sync + fmt::Debug {
    /// Every regular object under the root, recursively, sorted by name. Objects a root
    /// refuses to serve (a symlink out of a directory) are left out.
    fn objects(&self) -> Result<Vec<ObjectMeta>, RootError>;

    /// One object's metadata; a missing object is [`RootError::NotFound`].
    fn stat(&self, name: &str) -> Result<ObjectMeta, RootError>;

    /// Opens one object for positional reads.
    fn open(&self, name: &str) -> Result<Box<dyn ReadAt>, RootError>;

    /// The datasets under the root, sorted by name: see [`datasets`].
    fn list(&self) -> Result<Vec<Entry>, RootError> {
        Ok(datasets(&self.objects()?))
    }
}

/// Groups objects into datasets: a `.bin` with its `.idx` is one Megatron dataset under the
/// prefix (bytes of both), `.dqb` objects are block files, everything else is raw. Sorted by
/// name.
pub fn datasets(objects: &[ObjectMeta]) -> Vec<Entry> {
    let lens: BTreeMap<&str, u64> = objects.iter().map(|o| (o.name.as_str(), o.len)).collect();
    let mut out: Vec<Entry> = objects.iter().filter_map(|o| entry_of(o, &lens)).collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

fn entry_of(o: &ObjectMeta, lens: &BTreeMap<&str, u64>) -> Option<Entry> {
    let sibling = |stem: &str, ext: &str| lens.get(format!("{stem}.{ext}").as_str()).copied();
    let (name, kind, bytes) = if let Some(stem) = o.name.strip_suffix(".bin") {
        match sibling(stem, "idx") {
            Some(idx) => (stem.to_string(), EntryKind::Megatron, o.len + idx),
            None => (o.name.clone(), EntryKind::Raw, o.len),
        }
    } else if let Some(stem) = o.name.strip_suffix(".idx") {
        // Listed once, under the prefix, by its `.bin`.
        if sibling(stem, "bin").is_some() {
            return None;
        }
        (o.name.clone(), EntryKind::Raw, o.len)
    } else if o.name.ends_with(".dqb") {
        (o.name.clone(), EntryKind::Blocks, o.len)
    } else {
        (o.name.clone(), EntryKind::Raw, o.len)
    };
    Some(Entry { name, kind, bytes })
}

/// Checks a name and returns its normal form: segments joined by `/`, with `.` and empty
/// segments dropped. `..` anywhere, a leading `/`, or nothing left are refused.
pub fn normalize_name(name: &str) -> Result<String, RootError> {
    let refuse = |problem| {
        Err(RootError::InvalidName {
            name: name.to_string(),
            problem,
        })
    };
    if name.starts_with('/') {
        return refuse(NameProblem::Absolute);
    }
    let mut parts = Vec::new();
    for seg in name.split('/') {
        match seg {
            "" | "." => {}
            ".." => return refuse(NameProblem::ParentDir),
            s => parts.push(s),
        }
    }
    if parts.is_empty() {
        return refuse(NameProblem::Empty);
    }
    Ok(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_normalized_or_refused() {
        assert_eq!(normalize_name("./a//b/./c").unwrap(), "a/b/c");
        let problem = |n: &str| match normalize_name(n) {
            Err(RootError::InvalidName { problem, .. }) => problem,
            other => panic!("{n}: {other:?}"),
        };
        assert_eq!(problem("a/../b"), NameProblem::ParentDir);
        assert_eq!(problem(".."), NameProblem::ParentDir);
        assert_eq!(problem("/etc/passwd"), NameProblem::Absolute);
        assert_eq!(problem("./"), NameProblem::Empty);
        assert_eq!(problem(""), NameProblem::Empty);
    }

    #[test]
    fn objects_group_into_datasets() {
        let o = |name: &str, len| ObjectMeta::new(name, len, None);
        let got = datasets(&[
            o("a.bin", 8),
            o("a.idx", 3),
            o("lone.idx", 5),
            o("lone2.bin", 6),
            o("z/b.dqb", 7),
            o("c", 1),
        ]);
        let e = |name: &str, kind, bytes| Entry {
            name: name.into(),
            kind,
            bytes,
        };
        assert_eq!(
            got,
            vec![
                e("a", EntryKind::Megatron, 11),
                e("c", EntryKind::Raw, 1),
                e("lone.idx", EntryKind::Raw, 5),
                e("lone2.bin", EntryKind::Raw, 6),
                e("z/b.dqb", EntryKind::Blocks, 7),
            ]
        );
    }
}
