//! The directory where derived files are kept between runs, and its size bound.
//!
//! Why a bound: an entry is written for every raw file version whose documents were asked for
//! (8 bytes a document: about 800 MB for a 100 M-document corpus), and a file that changes
//! gets a new entry while its old one is never asked for again. Without a bound the directory
//! only grows. So after each new entry the directory is pruned, least recently used first
//! (an entry's modification time is refreshed each time it is used), down to
//! `$DQUANT_CACHE_MAX_BYTES` (default [`DEFAULT_MAX_BYTES`]). The entry just written is never
//! pruned, even when it alone passes the bound. Pruning is best effort: an entry another
//! process reads while it is removed stays readable to it, and one removed before it is read
//! is found missing and rebuilt.
//!
//! The directory is `$DQUANT_CACHE_DIR`, else `$XDG_CACHE_HOME/dquant`, else
//! `$HOME/.cache/dquant`; `DQUANT_CACHE_DIR=` (empty) turns the cache off.

use std::ffi::OsStr;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::SystemTime;

/// The directory's bound when `$DQUANT_CACHE_MAX_BYTES` is not set: 8 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 8 << 30;

/// Names of the entries the bound covers: `PREFIX*SUFFIX` (nothing else in the directory is
/// touched), as [`entry_path`] makes them.
const PREFIX: &str = "eod-";
const SUFFIX: &str = ".idx";

/// Where cache entries go, from the environment; `None` when the cache is off.
pub fn cache_dir() -> Option<PathBuf> {
    match std::env::var_os("DQUANT_CACHE_DIR") {
        Some(d) if d.is_empty() => None,
        Some(d) => Some(PathBuf::from(d)),
        None => std::env::var_os("XDG_CACHE_HOME")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
            .map(|d| d.join("dquant")),
    }
}

/// The path of the entry whose key hashes to `hash`; `None` when the cache is off.
pub(crate) fn entry_path(hash: u64) -> Option<PathBuf> {
    Some(cache_dir()?.join(format!("{PREFIX}{hash:016x}{SUFFIX}")))
}

/// The bound on the entries' total size, from `$DQUANT_CACHE_MAX_BYTES` (a whole number of
/// bytes). A value that is not one is warned about once and the default used.
pub fn max_bytes() -> u64 {
    let v = std::env::var_os("DQUANT_CACHE_MAX_BYTES");
    max_bytes_from(v.as_deref()).unwrap_or_else(|| {
        static WARNED: OnceLock<()> = OnceLock::new();
        WARNED.get_or_init(|| {
            tracing::warn!(
                "DQUANT_CACHE_MAX_BYTES={v:?} is not a whole number of bytes; the cache is \
                 bounded at {DEFAULT_MAX_BYTES} bytes"
            )
        });
        DEFAULT_MAX_BYTES
    })
}

/// The bound a value of `$DQUANT_CACHE_MAX_BYTES` gives: the default when unset, `None` when
/// it is not a whole number of bytes.
fn max_bytes_from(v: Option<&OsStr>) -> Option<u64> {
    match v {
        None => Some(DEFAULT_MAX_BYTES),
        Some(v) => v.to_str()?.trim().parse().ok(),
    }
}

/// Marks the entry `f` as used now, so pruning keeps it over entries used less recently.
pub(crate) fn touch(f: &File) {
    // Best effort: a read-only cache directory keeps its order.
    let _ = f.set_modified(SystemTime::now());
}

/// Removes the least recently used entries of `kept`'s directory until their total is at
/// most `max` bytes, never `kept` itself. Returns how many were removed.
pub(crate) fn prune(kept: &Path, max: u64) -> usize {
    let Some(dir) = kept.parent() else {
        return 0;
    };
    let mut entries = entries(dir, kept);
    let kept_len = std::fs::metadata(kept).map(|m| m.len()).unwrap_or(0);
    let mut total = kept_len + entries.iter().map(|e| e.len).sum::<u64>();
    // Oldest first; ties by name, so two processes pruning at once agree.
    entries.sort_by(|a, b| (a.used, &a.path).cmp(&(b.used, &b.path)));
    let mut removed = 0;
    for e in entries {
        if total <= max {
            break;
        }
        if std::fs::remove_file(&e.path).is_ok() {
            removed += 1;
        }
        // Gone either way (another process may have removed it first).
        total -= e.len;
    }
    removed
}

/// One entry of the directory.
struct Entry {
    path: PathBuf,
    len: u64,
    used: SystemTime,
}

/// The entries of `dir` the bound covers, but `kept`.
fn entries(dir: &Path, kept: &Path) -> Vec<Entry> {
    let Ok(read) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    read.flatten()
        .filter(|d| {
            let name = d.file_name();
            let name = name.to_string_lossy();
            name.starts_with(PREFIX) && name.ends_with(SUFFIX)
        })
        .filter(|d| d.path() != kept)
        .filter_map(|d| {
            let m = d.metadata().ok().filter(|m| m.is_file())?;
            Some(Entry {
                path: d.path(),
                len: m.len(),
                used: m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Writes an entry of `len` bytes last used `age` seconds ago.
    fn entry(dir: &Path, name: &str, len: usize, age: u64) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, vec![0u8; len]).unwrap();
        let f = File::options().write(true).open(&p).unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(age))
            .unwrap();
        p
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn pruning_removes_the_least_recently_used_entries_down_to_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        entry(d, "eod-a.idx", 100, 400);
        let b = entry(d, "eod-b.idx", 100, 300);
        entry(d, "eod-c.idx", 100, 200);
        entry(d, "other.bin", 1000, 1000); // not an entry: never counted or removed
        let kept = entry(d, "eod-new.idx", 100, 0);
        // b is used again: it is now the most recently used of the old ones.
        touch(&File::open(&b).unwrap());
        // 400 bytes of entries against 250: a and c go, b and the new one stay.
        assert_eq!(prune(&kept, 250), 2);
        assert_eq!(names(d), ["eod-b.idx", "eod-new.idx", "other.bin"]);
        // Within the bound: nothing goes.
        assert_eq!(prune(&kept, 250), 0);
        // The entry just written stays even when it alone passes the bound.
        assert_eq!(prune(&kept, 10), 1);
        assert_eq!(names(d), ["eod-new.idx", "other.bin"]);
    }

    #[test]
    fn the_bound_is_a_whole_number_of_bytes_or_the_default() {
        assert_eq!(max_bytes_from(None), Some(DEFAULT_MAX_BYTES));
        assert_eq!(max_bytes_from(Some(OsStr::new("1048576"))), Some(1 << 20));
        assert_eq!(max_bytes_from(Some(OsStr::new(" 0 "))), Some(0));
        for bad in ["8GiB", "-1", "", "lots"] {
            assert_eq!(max_bytes_from(Some(OsStr::new(bad))), None, "{bad:?}");
        }
    }
}
