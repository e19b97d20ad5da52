//! The datasets an agent serves: named roots, and the confinement of every name to its root.
//!
//! A client names a dataset `ROOT/RELATIVE/PATH`. Only configured roots are served; a name
//! with `..`, an absolute path, or a path whose symlinks lead outside the root's real
//! directory is refused before any file is opened. Checks happen on canonical paths, after
//! every symlink is resolved, so a link planted inside a root cannot reach `/etc`.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use dquant_proto::v1::ListEntry;

/// Named dataset roots, canonicalized at start-up.
#[derive(Clone, Debug)]
pub struct Catalog {
    roots: BTreeMap<String, PathBuf>,
}

/// A refused or unknown dataset name; the message is what the client sees.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct NameError(pub String);

impl Catalog {
    /// Checks that every root exists and is a directory; root names must be single path
    /// segments.
    pub fn new(roots: &BTreeMap<String, PathBuf>) -> Result<Self, String> {
        let mut out = BTreeMap::new();
        for (name, dir) in roots {
            if name.is_empty() || name.contains('/') || name == "." || name == ".." {
                return Err(format!(
                    "root name {name:?}: must be one path segment, without '/'"
                ));
            }
            let real = dir
                .canonicalize()
                .map_err(|e| format!("root {name:?} ({}): {e}", dir.display()))?;
            if !real.is_dir() {
                return Err(format!(
                    "root {name:?} ({}): not a directory",
                    dir.display()
                ));
            }
            out.insert(name.clone(), real);
        }
        Ok(Catalog { roots: out })
    }

    pub fn roots(&self) -> &BTreeMap<String, PathBuf> {
        &self.roots
    }

    fn served(&self) -> String {
        if self.roots.is_empty() {
            "none".into()
        } else {
            self.roots.keys().cloned().collect::<Vec<_>>().join(", ")
        }
    }

    /// Resolves `ROOT/PATH` to a path inside the root. The path may be a Megatron prefix
    /// (`PATH.bin` and `PATH.idx` exist), a `.dqb` file or a raw token file.
    pub fn resolve(&self, name: &str) -> Result<PathBuf, NameError> {
        let refuse = |why: &str| Err(NameError(format!("dataset {name:?}: {why}")));
        if name.starts_with('/') {
            return refuse("absolute paths are not allowed; name a dataset as ROOT/PATH");
        }
        let (root, rel) = name.split_once('/').unwrap_or((name, ""));
        let Some(root_dir) = self.roots.get(root) else {
            return Err(NameError(format!(
                "dataset {name:?}: unknown root {root:?} (this agent serves: {})",
                self.served()
            )));
        };
        if rel.is_empty() {
            return refuse("names a root, not a dataset; name a dataset as ROOT/PATH");
        }
        for c in Path::new(rel).components() {
            match c {
                Component::Normal(_) | Component::CurDir => {}
                Component::ParentDir => {
                    return refuse("'..' is not allowed; names are relative to a root")
                }
                Component::RootDir | Component::Prefix(_) => {
                    return refuse("absolute paths are not allowed; name a dataset as ROOT/PATH")
                }
            }
        }
        let path = root_dir.join(rel);
        // The dataset's files: the path itself, or a Megatron prefix's .bin and .idx.
        let mut files: Vec<PathBuf> = Vec::new();
        if path.is_file() {
            files.push(path.clone());
        } else {
            for ext in ["bin", "idx"] {
                let p = PathBuf::from(format!("{}.{ext}", path.display()));
                if p.exists() {
                    files.push(p);
                }
            }
        }
        if files.is_empty() {
            return refuse(&format!("no such dataset under root {root:?}"));
        }
        for f in &files {
            let real = f
                .canonicalize()
                .map_err(|e| NameError(format!("dataset {name:?}: {e}")))?;
            if !real.starts_with(root_dir) {
                return refuse(&format!("resolves outside root {root:?} (symlink escape)"));
            }
        }
        Ok(path)
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
        let Some(dir) = self.roots.get(root) else {
            return Err(NameError(format!(
                "unknown root {root:?} (this agent serves: {})",
                self.served()
            )));
        };
        let mut out = Vec::new();
        let mut stack = vec![dir.clone()];
        while let Some(d) = stack.pop() {
            let Ok(rd) = std::fs::read_dir(&d) else {
                continue;
            };
            let mut names: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
            names.sort();
            for p in names {
                let Ok(real) = p.canonicalize() else { continue };
                if !real.starts_with(dir) {
                    continue;
                }
                if real.is_dir() {
                    // Descend into real directories only: a symlinked directory may lead back
                    // up the tree and loop.
                    if p.symlink_metadata().is_ok_and(|m| m.is_dir()) {
                        stack.push(p);
                    }
                    continue;
                }
                let rel = p.strip_prefix(dir).unwrap_or(&p).display().to_string();
                let mut bytes = real.metadata().map(|m| m.len()).unwrap_or(0);
                let (name, kind) = match rel.rsplit_once('.') {
                    Some((stem, "bin")) if p.with_extension("idx").exists() => {
                        bytes += std::fs::metadata(p.with_extension("idx")).map_or(0, |m| m.len());
                        (stem.to_string(), "megatron")
                    }
                    Some((_, "idx")) if p.with_extension("bin").exists() => continue,
                    Some((_, "dqb")) => (rel.clone(), "dquant-blocks"),
                    _ => (rel.clone(), "raw"),
                };
                out.push(ListEntry {
                    name: format!("{root}/{name}"),
                    kind: kind.into(),
                    bytes,
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
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
        let c = Catalog::new(&roots).unwrap();
        (t, c)
    }

    #[test]
    fn resolves_inside_and_refuses_escapes() {
        let (_t, c) = setup();
        assert!(c.resolve("corpus/sub/a").unwrap().ends_with("sub/a"));
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
    }
}
