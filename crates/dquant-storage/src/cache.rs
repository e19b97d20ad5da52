//! Datasets opened once and shared: every session that reads the same dataset, with the
//! same options, reads through one [`Dataset`] (one document index in memory, one set of
//! open files), however many sessions there are.
//!
//! An entry is keyed by where the dataset is (a root's name and the name under it) and how
//! it was opened ([`OpenOptions`]), and is shared only while every object it was opened
//! from still has the version it read ([`Dataset::is_current_in`], a `stat` per object):
//! a file replaced or rewritten is opened afresh for the next session, while sessions
//! already reading keep the dataset they opened (its descriptors still read the bytes it
//! indexed). Entries no session holds are kept, most recently used first, up to a bound,
//! so a trainer that restarts finds its datasets open.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use dquant_format::DType;

use crate::dataset::{Dataset, OpenOptions};
use crate::error::StorageError;
use crate::root::{normalize_name, Root};

/// Where a dataset is and how it was opened.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    root: String,
    name: String,
    raw_dtype: Option<DType>,
    eod: Option<u32>,
}

struct Entry {
    ds: Arc<Dataset>,
    /// When it was last handed out, in the cache's own ticks.
    used: u64,
}

/// What the cache has done so far (for tests and metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Datasets opened (parsed) because none current was cached.
    pub opened: u64,
    /// Requests answered with a dataset already open.
    pub shared: u64,
    /// Entries dropped: replaced by a newer version, or unused past the bound.
    pub evicted: u64,
    /// Entries held now.
    pub entries: usize,
}

/// Datasets opened once and shared (see the module docs).
pub struct DatasetCache {
    inner: Mutex<Inner>,
    keep_unused: usize,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<Key, Entry>,
    tick: u64,
    stats: CacheStats,
}

impl DatasetCache {
    /// A cache that keeps at most `keep_unused` datasets no session holds.
    pub fn new(keep_unused: usize) -> Self {
        DatasetCache {
            inner: Mutex::new(Inner::default()),
            keep_unused,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The dataset `name` under `root` (which the caller calls `root_name`), opened with
    /// `opts`: the cached one while its objects are unchanged, else opened now (and cached).
    /// Opening runs outside the cache's lock; two sessions that miss at once both open, and
    /// the later keeps the entry the earlier made.
    pub fn open_in(
        &self,
        root_name: &str,
        root: &dyn Root,
        name: &str,
        opts: &OpenOptions,
    ) -> Result<Arc<Dataset>, StorageError> {
        let key = Key {
            root: root_name.to_string(),
            name: normalize_name(name)?,
            raw_dtype: opts.raw_dtype,
            eod: opts.eod,
        };
        let cached = self.lock().entries.get(&key).map(|e| e.ds.clone());
        if let Some(ds) = cached {
            // Checked unlocked: a `stat` per object, not to be serialised across sessions.
            if ds.is_current_in(root) {
                let mut inner = self.lock();
                inner.tick += 1;
                let tick = inner.tick;
                if let Some(e) = inner.entries.get_mut(&key) {
                    e.used = tick;
                }
                inner.stats.shared += 1;
                return Ok(ds);
            }
        }
        let ds = Arc::new(Dataset::open_in(root, &key.name, opts)?);
        let mut inner = self.lock();
        inner.stats.opened += 1;
        if !ds.is_versioned() {
            // Its store cannot say when it changes: never shared.
            return Ok(ds);
        }
        if let Some(e) = inner.entries.get(&key) {
            if e.ds.same_versions(&ds) {
                // Another session opened the same version meanwhile: share theirs.
                return Ok(e.ds.clone());
            }
        }
        inner.tick += 1;
        let used = inner.tick;
        let entry = Entry {
            ds: ds.clone(),
            used,
        };
        if inner.entries.insert(key, entry).is_some() {
            inner.stats.evicted += 1;
        }
        self.evict_unused(&mut inner);
        Ok(ds)
    }

    /// Drops the least recently used entries no session holds, past `keep_unused`.
    fn evict_unused(&self, inner: &mut Inner) {
        let mut unused: Vec<(u64, Key)> = inner
            .entries
            .iter()
            .filter(|(_, e)| Arc::strong_count(&e.ds) == 1)
            .map(|(k, e)| (e.used, k.clone()))
            .collect();
        if unused.len() <= self.keep_unused {
            return;
        }
        unused.sort_unstable_by_key(|(used, _)| *used);
        let excess = unused.len() - self.keep_unused;
        for (_, k) in unused.into_iter().take(excess) {
            inner.entries.remove(&k);
            inner.stats.evicted += 1;
        }
    }

    /// What the cache has done so far.
    pub fn stats(&self) -> CacheStats {
        let inner = self.lock();
        CacheStats {
            entries: inner.entries.len(),
            ..inner.stats
        }
    }
}

impl std::fmt::Debug for DatasetCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatasetCache")
            .field("keep_unused", &self.keep_unused)
            .field("stats", &self.stats())
            .finish()
    }
}
