//! The datasets an agent serves: named roots, and the confinement of every name to its root.
//!
//! A client names a dataset `ROOT/RELATIVE/PATH`. Only configured roots are served, each a
//! [`LocalRoot`] for a directory or an [`ObjectRoot`] for `s3://BUCKET/PREFIX`, held as an
//! `Arc<dyn Root>`. The roots do the confining: a name with `..` or an absolute path is
//! refused before any file is opened, and every file a root stats or opens must lie, after
//! every symlink is resolved, inside the root's real directory, so a link planted inside a
//! root cannot reach `/etc` (`LocalRoot` opens beneath a held directory handle with
//! `openat2(RESOLVE_BENEATH)`; see `dquant-storage`). This module only splits names, finds
//! the root and words the refusals for clients.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::config_error::ConfigError;
use dquant_objstore::{locate, Place, S3Settings};
use dquant_proto::v1::ListEntry;
use dquant_storage::{BlockCache, CachedRoot, LocalRoot, NameProblem, Root, RootError};

/// Named dataset roots, canonicalized at start-up.
#[derive(Clone, Debug)]
pub struct Catalog {
    roots: BTreeMap<String, Arc<dyn Root>>,
}

/// A refused or unknown dataset name; the message is what the client sees.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct NameError(pub String);

/// A dataset name resolved to its root and its name under that root.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// The root's name (`corpus` of `corpus/sub/x`).
    pub root_name: String,
    pub root: Arc<dyn Root>,
    /// The name under the root (`sub/x` of `corpus/sub/x`).
    pub name: String,
}

impl Catalog {
    /// Checks that every directory root exists and is a directory, and that every
    /// `s3://BUCKET/PREFIX` root parses and has a client (reached with `s3`; nothing is
    /// requested until a client asks); root names must be single path segments.
    pub fn new(
        roots: &BTreeMap<String, PathBuf>,
        s3: &S3Settings,
        cache: Option<&Arc<BlockCache>>,
    ) -> Result<Self, ConfigError> {
        let mut out = BTreeMap::new();
        for (name, dir) in roots {
            if name.is_empty() || name.contains('/') || name == "." || name == ".." {
                return Err(ConfigError::invalid(
                    format!("root name {name:?}"),
                    "must be one path segment, without '/'",
                ));
            }
            out.insert(name.clone(), open_root(name, dir, s3, cache)?);
        }
        Ok(Catalog { roots: out })
    }

    /// The same catalog with each root replaced by `f` of it (a wrapper).
    #[cfg(debug_assertions)]
    pub(crate) fn map_roots(self, f: impl Fn(Arc<dyn Root>) -> Arc<dyn Root>) -> Self {
        let roots = self.roots.into_iter().map(|(n, r)| (n, f(r))).collect();
        Catalog { roots }
    }

    pub fn roots(&self) -> &BTreeMap<String, Arc<dyn Root>> {
        &self.roots
    }

    fn served(&self) -> String {
        if self.roots.is_empty() {
            "none".into()
        } else {
            self.roots.keys().cloned().collect::<Vec<_>>().join(", ")
        }
    }

    /// Resolves `ROOT/PATH` to its root and the name under it, after checking that the
    /// dataset is there: the name itself (a `.dqb` or raw file), or a Megatron prefix's
    /// `PATH.bin` and `PATH.idx`; each must lie inside the root.
    pub fn resolve(&self, name: &str) -> Result<Resolved, NameError> {
        let refuse = |why: &str| Err(NameError(format!("dataset {name:?}: {why}")));
        if name.starts_with('/') {
            return refuse("absolute paths are not allowed; name a dataset as ROOT/PATH");
        }
        let (root_name, rel) = name.split_once('/').unwrap_or((name, ""));
        let Some(root) = self.roots.get(root_name) else {
            return Err(NameError(format!(
                "dataset {name:?}: unknown root {root_name:?} (this agent serves: {})",
                self.served()
            )));
        };
        if rel.is_empty() {
            return refuse("names a root, not a dataset; name a dataset as ROOT/PATH");
        }
        match find(&**root, rel) {
            Ok(true) => {}
            Ok(false) => return refuse(&format!("no such dataset under root {root_name:?}")),
            Err(e) => return Err(refusal(name, root_name, &e)),
        }
        Ok(Resolved {
            root_name: root_name.to_string(),
            root: root.clone(),
            name: rel.to_string(),
        })
    }

    /// The roots (`root == ""`), or the datasets under one root: Megatron prefixes (a `.bin`
    /// with its `.idx`), block files (`.dqb`) and other regular files (raw token files,
    /// which need a dtype to open). Symlinks that leave the root are not listed.
    pub fn list(&self, root: &str) -> Result<Vec<ListEntry>, NameError> {
        if root.is_empty() {
            return Ok(self
                .roots
                .keys()
                .map(|name| ListEntry {
                    name: name.clone(),
                    kind: "root".into(),
                    bytes: 0,
                })
                .collect());
        }
        let Some(r) = self.roots.get(root) else {
            return Err(NameError(format!(
                "unknown root {root:?} (this agent serves: {})",
                self.served()
            )));
        };
        let entries = r
            .list()
            .map_err(|e| NameError(format!("root {root:?}: {e}")))?;
        Ok(entries
            .into_iter()
            .map(|e| ListEntry {
                name: format!("{root}/{}", e.name),
                kind: e.kind.as_str().into(),
                bytes: e.bytes,
            })
            .collect())
    }
}

/// The root at `at`: a bucket prefix for `s3://…` (read through the block cache, when there
/// is one), else a local directory.
fn open_root(
    name: &str,
    at: &std::path::Path,
    s3: &S3Settings,
    cache: Option<&Arc<BlockCache>>,
) -> Result<Arc<dyn Root>, ConfigError> {
    let fail = |e: &dyn std::fmt::Display| ConfigError::Root {
        name: name.to_string(),
        at: at.to_path_buf(),
        problem: e.to_string(),
    };
    match locate(at, s3).map_err(|e| fail(&e))? {
        Place::Store(place) => {
            let root: Arc<dyn Root> = Arc::new(place.root());
            // The cache names a root's blocks by its location as configured.
            let label = at.to_string_lossy();
            Ok(match cache {
                Some(c) => Arc::new(CachedRoot::new(root, label, c.clone())),
                None => root,
            })
        }
        Place::Local(dir) => Ok(Arc::new(LocalRoot::new(&dir).map_err(|e| fail(&e))?)),
    }
}

/// Whether the dataset `rel` is under `root`: the name itself (a `.dqb` or raw file), or else
/// a Megatron prefix's `.bin` or `.idx`. A refusal of any of them is an error.
fn find(root: &dyn Root, rel: &str) -> Result<bool, RootError> {
    let present = |object: &str| match root.stat(object) {
        Ok(_) => Ok(true),
        Err(RootError::NotFound { .. } | RootError::NotAFile { .. }) => Ok(false),
        Err(e) => Err(e),
    };
    if present(rel)? {
        return Ok(true);
    }
    Ok(present(&format!("{rel}.bin"))? | present(&format!("{rel}.idx"))?)
}

/// The client's message for a root's refusal of dataset `name` under root `root`.
fn refusal(name: &str, root: &str, e: &RootError) -> NameError {
    let why = match e {
        RootError::InvalidName {
            problem: NameProblem::ParentDir,
            ..
        } => "'..' is not allowed; names are relative to a root".into(),
        RootError::InvalidName {
            problem: NameProblem::Empty,
            ..
        } => "names a root, not a dataset; name a dataset as ROOT/PATH".into(),
        RootError::InvalidName { .. } => {
            "absolute paths are not allowed; name a dataset as ROOT/PATH".into()
        }
        RootError::Escape { .. } => format!("resolves outside root {root:?} (symlink escape)"),
        RootError::NotFound { .. } => format!("no such dataset under root {root:?}"),
        e => e.to_string(),
    };
    NameError(format!("dataset {name:?}: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, Catalog) {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("data");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/a.bin"), [0u8; 4]).unwrap();
        std::fs::write(root.join("sub/a.idx"), [0u8; 4]).unwrap();
        std::fs::write(root.join("b.dqb"), [0u8; 4]).unwrap();
        std::fs::write(t.path().join("secret"), b"x").unwrap();
        std::os::unix::fs::symlink(t.path().join("secret"), root.join("link")).unwrap();
        std::os::unix::fs::symlink(root.join("b.dqb"), root.join("inside")).unwrap();
        // A directory link back up the tree must not make `list` loop.
        std::os::unix::fs::symlink(&root, root.join("sub/loop")).unwrap();
        let roots = BTreeMap::from([("corpus".to_string(), root)]);
        let c = Catalog::new(&roots, &S3Settings::default(), None).unwrap();
        (t, c)
    }

    #[test]
    fn resolves_inside_and_refuses_escapes() {
        let (_t, c) = setup();
        assert_eq!(c.resolve("corpus/sub/a").unwrap().name, "sub/a");
        assert!(c.resolve("corpus/./b.dqb").is_ok());
        assert!(c.resolve("corpus/inside").is_ok());
        let err = |n: &str| c.resolve(n).unwrap_err().0;
        assert_eq!(
            err("corpus/../secret"),
            "dataset \"corpus/../secret\": '..' is not allowed; names are relative to a root"
        );
        assert_eq!(
            err("/etc/passwd"),
            "dataset \"/etc/passwd\": absolute paths are not allowed; name a dataset as ROOT/PATH"
        );
        assert_eq!(
            err("corpus/link"),
            "dataset \"corpus/link\": resolves outside root \"corpus\" (symlink escape)"
        );
        assert_eq!(
            err("nope/x"),
            "dataset \"nope/x\": unknown root \"nope\" (this agent serves: corpus)"
        );
        assert_eq!(
            err("corpus/missing"),
            "dataset \"corpus/missing\": no such dataset under root \"corpus\""
        );
        assert_eq!(
            err("corpus"),
            "dataset \"corpus\": names a root, not a dataset; name a dataset as ROOT/PATH"
        );
    }

    #[test]
    fn lists_datasets_without_escaping_links() {
        let (_t, c) = setup();
        let names: Vec<(String, String)> = c
            .list("corpus")
            .unwrap()
            .into_iter()
            .map(|e| (e.name, e.kind))
            .collect();
        assert_eq!(
            names,
            vec![
                ("corpus/b.dqb".into(), "dquant-blocks".into()),
                ("corpus/inside".into(), "raw".into()),
                ("corpus/sub/a".into(), "megatron".into()),
            ]
        );
        assert_eq!(c.list("").unwrap()[0].name, "corpus");
        let bytes: Vec<u64> = c.list("corpus").unwrap().iter().map(|e| e.bytes).collect();
        assert_eq!(bytes, [4, 4, 8], "a Megatron pair counts both files");
    }

    #[test]
    fn each_file_of_a_megatron_pair_is_confined() {
        let (t, c) = setup();
        let root = t.path().join("data");
        std::fs::write(root.join("c.idx"), [0u8; 4]).unwrap();
        std::os::unix::fs::symlink(t.path().join("secret"), root.join("c.bin")).unwrap();
        assert_eq!(
            c.resolve("corpus/c").unwrap_err().0,
            "dataset \"corpus/c\": resolves outside root \"corpus\" (symlink escape)"
        );
        let listed: Vec<(String, String)> = c
            .list("corpus")
            .unwrap()
            .into_iter()
            .map(|e| (e.name, e.kind))
            .filter(|(n, _)| n.starts_with("corpus/c"))
            .collect();
        assert_eq!(listed, [("corpus/c.idx".into(), "raw".into())]);
    }
}
