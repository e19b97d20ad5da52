//! Which files a root's datasets appear as: sans I/O, from the agent's `List` entries.
//!
//! A Megatron prefix `ROOT/PATH` appears as `ROOT/PATH.bin` and `ROOT/PATH.idx`; a block file
//! `ROOT/PATH.dqb` as `ROOT/PATH.bin` and `.idx` too, unless a Megatron prefix already takes
//! that name (it then keeps its extension: `PATH.dqb.bin`). Raw token files are not shown:
//! the agent cannot open them without a dtype, which a listing does not carry.

use std::collections::BTreeMap;

use dquant_proto::v1::ListEntry;

/// One file of the mount that shows a dataset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatasetFile {
    /// The dataset as the agent names it (`root/path`, `root/path.dqb`).
    pub dataset: String,
    pub part: Part,
}

/// Which half of a Megatron prefix a file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Part {
    Bin,
    Idx,
}

/// The files `entries` (one root's listing) appear as, by path relative to the mount
/// (`root/sub/name.bin`).
pub fn files_of(entries: &[ListEntry]) -> BTreeMap<String, DatasetFile> {
    let megatron: Vec<&str> = entries
        .iter()
        .filter(|e| e.kind == "megatron")
        .map(|e| e.name.as_str())
        .collect();
    let mut out = BTreeMap::new();
    for e in entries {
        let prefix = match e.kind.as_str() {
            "megatron" => e.name.clone(),
            "dquant-blocks" => match e.name.strip_suffix(".dqb") {
                Some(stem) if !megatron.contains(&stem) => stem.to_string(),
                _ => e.name.clone(),
            },
            _ => continue,
        };
        for (ext, part) in [("bin", Part::Bin), ("idx", Part::Idx)] {
            let file = DatasetFile {
                dataset: e.name.clone(),
                part,
            };
            out.insert(format!("{prefix}.{ext}"), file);
        }
    }
    out
}

/// The names directly inside directory `dir` (`""` for the top) among `paths`, each with
/// whether it is a directory.
pub fn children<'a>(dir: &str, paths: impl Iterator<Item = &'a str>) -> BTreeMap<String, bool> {
    let mut out = BTreeMap::new();
    for p in paths {
        let rest = match dir {
            "" => p,
            d => match p.strip_prefix(d).and_then(|r| r.strip_prefix('/')) {
                Some(r) => r,
                None => continue,
            },
        };
        match rest.split_once('/') {
            Some((name, _)) => {
                out.insert(name.to_string(), true);
            }
            None => {
                out.entry(rest.to_string()).or_insert(false);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(name: &str, kind: &str) -> ListEntry {
        ListEntry {
            name: name.into(),
            kind: kind.into(),
            bytes: 0,
        }
    }

    #[test]
    fn datasets_appear_as_megatron_prefixes() {
        let f = files_of(&[
            e("c/a", "megatron"),
            e("c/b.dqb", "dquant-blocks"),
            e("c/a.dqb", "dquant-blocks"),
            e("c/raw.u16", "raw"),
            e("c/sub/x", "megatron"),
        ]);
        let names: Vec<&str> = f.keys().map(|k| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "c/a.bin",
                "c/a.dqb.bin",
                "c/a.dqb.idx",
                "c/a.idx",
                "c/b.bin",
                "c/b.idx",
                "c/sub/x.bin",
                "c/sub/x.idx"
            ]
        );
        assert_eq!(
            f["c/b.idx"],
            DatasetFile {
                dataset: "c/b.dqb".into(),
                part: Part::Idx
            }
        );
        assert_eq!(f["c/a.dqb.bin"].dataset, "c/a.dqb");
    }

    #[test]
    fn children_are_the_next_component() {
        let paths = ["c/a.bin", "c/sub/x.bin", "c/sub/deeper/y.idx", "d/z.bin"];
        let c = children("c", paths.iter().copied());
        assert_eq!(
            c.into_iter().collect::<Vec<_>>(),
            [("a.bin".to_string(), false), ("sub".to_string(), true)]
        );
        let top = children("", paths.iter().copied());
        assert_eq!(top.keys().collect::<Vec<_>>(), ["c", "d"]);
        assert!(children("c/su", paths.iter().copied()).is_empty());
    }
}
