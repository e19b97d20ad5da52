//! A local disk cache of blocks read from a remote root, bounded, checksummed, shared.
//!
//! # Why
//! An agent in front of an object store reads the same objects again: every epoch, every
//! trainer that restarts, every session of a blend. A block cache on the agent's local disk
//! (the DPU's or the storage node's NVMe) turns those repeats into local reads. It sits
//! between a root and its readers as a wrapper ([`CachedRoot`], like `object_store`'s
//! wrapper stores): a store that already is local gains nothing and is not wrapped.
//!
//! # What it promises
//! - **Bounded.** Entries together never exceed the byte budget; the least recently used
//!   are removed first (the `lru` crate keeps the order; the files are the entries).
//! - **Never serves what it did not store.** Each entry ends with its length and crc32c. An
//!   entry that is short, altered or unreadable is removed and the block is read from the
//!   root again; the reader gets the root's bytes either way.
//! - **Keyed by version.** Entries are named by the root, the object's name and its version
//!   (an ETag, a local file's identity), so a replaced object never meets its old blocks.
//!   Objects whose versions are not durable are read through uncached.
//! - **Safe for concurrent sessions.** The index is behind one lock held only to look up,
//!   insert and evict; files are written under a temporary name and renamed into place, so a
//!   reader sees a whole entry or none. Two sessions missing the same block may both read it
//!   from the root; the second rename replaces the first with the same bytes.
//! - **Survives restarts.** The directory is scanned at start (oldest first, by modification
//!   time) and trimmed to the budget; temporary files left by a crash are removed.

use std::fmt;
use std::fs;
use std::io::{self, Read, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lru::LruCache;

use crate::backend::ReadAt;
use crate::root::{ObjectMeta, ObjectVersion, Root, RootError};

/// Bytes after each entry's payload: its length (u32 LE) and crc32c (u32 LE).
const TRAILER: usize = 8;
/// Missing blocks fetched from the root in one read, at most.
const MAX_RUN_BLOCKS: u64 = 64;

/// What a [`BlockCache`] did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockCacheStats {
    pub hits: u64,
    pub misses: u64,
    /// Entries found damaged (removed, and the block read from the root again).
    pub corrupt: u64,
    pub evictions: u64,
    /// Bytes of the entries held now.
    pub bytes: u64,
    pub entries: u64,
}

struct Index {
    lru: LruCache<String, u64>,
    bytes: u64,
}

/// Blocks of remote objects in a local directory (see the module docs).
pub struct BlockCache {
    dir: PathBuf,
    max_bytes: u64,
    block_bytes: u64,
    index: Mutex<Index>,
    hits: AtomicU64,
    misses: AtomicU64,
    corrupt: AtomicU64,
    evictions: AtomicU64,
    tmp: AtomicU64,
}

impl fmt::Debug for BlockCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockCache")
            .field("dir", &self.dir)
            .field("max_bytes", &self.max_bytes)
            .field("block_bytes", &self.block_bytes)
            .finish_non_exhaustive()
    }
}

fn is_tmp(name: &str) -> bool {
    name.starts_with(".tmp-")
}

impl BlockCache {
    /// A cache in `dir` (created if missing) of at most `max_bytes`, in blocks of
    /// `block_bytes` (at least 4 KiB, at most 64 MiB); entries already there are kept,
    /// oldest first out.
    pub fn open(dir: &Path, max_bytes: u64, block_bytes: u64) -> io::Result<Arc<Self>> {
        if !(4096..=64 << 20).contains(&block_bytes) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "block cache: block_bytes must be between 4 KiB and 64 MiB",
            ));
        }
        fs::create_dir_all(dir)?;
        let mut found = Vec::new();
        for e in fs::read_dir(dir)? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            let meta = e.metadata()?;
            if !meta.is_file() {
                continue;
            }
            if is_tmp(&name) {
                let _ = fs::remove_file(e.path());
                continue;
            }
            found.push((meta.modified().ok(), name, meta.len()));
        }
        found.sort();
        let mut index = Index {
            lru: LruCache::unbounded(),
            bytes: 0,
        };
        for (_, name, len) in found {
            index.bytes += len;
            index.lru.put(name, len);
        }
        let cache = Arc::new(BlockCache {
            dir: dir.to_path_buf(),
            max_bytes,
            block_bytes,
            index: Mutex::new(index),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            corrupt: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            tmp: AtomicU64::new(0),
        });
        let mut index = cache.lock();
        cache.evict(&mut index);
        drop(index);
        Ok(cache)
    }

    pub fn block_bytes(&self) -> u64 {
        self.block_bytes
    }

    pub fn stats(&self) -> BlockCacheStats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let index = self.lock();
        BlockCacheStats {
            hits: l(&self.hits),
            misses: l(&self.misses),
            corrupt: l(&self.corrupt),
            evictions: l(&self.evictions),
            bytes: index.bytes,
            entries: index.lru.len() as u64,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Removes least recently used entries until the budget holds.
    fn evict(&self, index: &mut Index) {
        while index.bytes > self.max_bytes {
            let Some((name, len)) = index.lru.pop_lru() else {
                break;
            };
            index.bytes -= len;
            let _ = fs::remove_file(self.dir.join(&name));
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether entry `name` is held (without touching its recency).
    fn holds(&self, name: &str) -> bool {
        self.lock().lru.contains(name)
    }

    fn forget(&self, name: &str) {
        let mut index = self.lock();
        if let Some(len) = index.lru.pop(name) {
            index.bytes -= len;
        }
        let _ = fs::remove_file(self.dir.join(name));
    }

    /// Copies entry `name` into `out` (exactly `out.len()` bytes of payload), if it is held
    /// and intact; a damaged entry is removed.
    fn get(&self, name: &str, out: &mut [u8]) -> bool {
        if self.lock().lru.get(name).is_none() {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        if self.read_entry(name, out).unwrap_or(false) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        self.corrupt.fetch_add(1, Ordering::Relaxed);
        self.misses.fetch_add(1, Ordering::Relaxed);
        self.forget(name);
        false
    }

    /// Reads entry `name` into `out` (scratch: altered even when the entry is not intact)
    /// and says whether it is whole and unaltered. Its length is checked before anything is
    /// read, so a file grown in place costs nothing.
    fn read_entry(&self, name: &str, out: &mut [u8]) -> io::Result<bool> {
        let mut f = fs::File::open(self.dir.join(name))?;
        if f.metadata()?.len() != (out.len() + TRAILER) as u64 {
            return Ok(false);
        }
        let mut t = [0u8; TRAILER];
        f.read_exact(out)?;
        f.read_exact(&mut t)?;
        let len = u32::from_le_bytes([t[0], t[1], t[2], t[3]]) as usize;
        let crc = u32::from_le_bytes([t[4], t[5], t[6], t[7]]);
        Ok(len == out.len() && crc == crc32c::crc32c(out))
    }

    /// Stores `payload` as entry `name`. A failure to write only means the block is not
    /// cached: reads never fail because of the cache.
    fn put(&self, name: &str, payload: &[u8]) {
        let len = (payload.len() + TRAILER) as u64;
        if len > self.max_bytes {
            return;
        }
        let tmp = self.dir.join(format!(
            ".tmp-{}-{}",
            std::process::id(),
            self.tmp.fetch_add(1, Ordering::Relaxed)
        ));
        let written = (|| {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(payload)?;
            f.write_all(&(payload.len() as u32).to_le_bytes())?;
            f.write_all(&crc32c::crc32c(payload).to_le_bytes())?;
            fs::rename(&tmp, self.dir.join(name))
        })();
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
            return;
        }
        let mut index = self.lock();
        if let Some(old) = index.lru.put(name.to_string(), len) {
            index.bytes -= old;
        }
        index.bytes += len;
        self.evict(&mut index);
    }
}

/// A root whose objects are read through a [`BlockCache`].
#[derive(Debug)]
pub struct CachedRoot {
    inner: Arc<dyn Root>,
    /// Tells this root's entries from other roots' in a shared cache (e.g. its URL).
    label: String,
    cache: Arc<BlockCache>,
}

impl CachedRoot {
    pub fn new(inner: Arc<dyn Root>, label: impl Into<String>, cache: Arc<BlockCache>) -> Self {
        CachedRoot {
            inner,
            label: label.into(),
            cache,
        }
    }
}

impl Root for CachedRoot {
    fn objects(&self) -> Result<Vec<ObjectMeta>, RootError> {
        self.inner.objects()
    }

    fn stat(&self, name: &str) -> Result<ObjectMeta, RootError> {
        self.inner.stat(name)
    }

    fn open(&self, name: &str) -> Result<Box<dyn ReadAt>, RootError> {
        let f = self.inner.open(name)?;
        let Some(v) = f.version().filter(|_| f.version_is_durable()) else {
            return Ok(f);
        };
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for part in [self.label.as_str(), name, &v.to_string()] {
            h.update(part.as_bytes());
            h.update(&[0]);
        }
        Ok(Box::new(CachedObject {
            inner: f,
            key: format!("{:032x}", h.digest128()),
            cache: self.cache.clone(),
        }))
    }
}

struct CachedObject {
    inner: Box<dyn ReadAt>,
    /// Names this object's version; entry `KEY-N` is its block `N`.
    key: String,
    cache: Arc<BlockCache>,
}

impl CachedObject {
    fn entry(&self, block: u64) -> String {
        format!("{}-{block}", self.key)
    }

    /// Bytes of block `b` (the last one may be short).
    fn block_range(&self, b: u64) -> (u64, u64) {
        let bs = self.cache.block_bytes;
        let start = b * bs;
        (start, (start + bs).min(self.inner.len()))
    }

    /// Reads blocks `first..end` from the root, caches them, and copies their part of
    /// `[offset, offset + buf.len())` into `buf`.
    fn fetch(&self, first: u64, end: u64, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let (start, _) = self.block_range(first);
        let (_, stop) = self.block_range(end - 1);
        let mut run = vec![0u8; (stop - start) as usize];
        self.inner.read_exact_at(&mut run, start)?;
        for b in first..end {
            let (s, e) = self.block_range(b);
            self.cache.put(
                &self.entry(b),
                &run[(s - start) as usize..(e - start) as usize],
            );
        }
        let lo = offset.max(start);
        let hi = (offset + buf.len() as u64).min(stop);
        buf[(lo - offset) as usize..(hi - offset) as usize]
            .copy_from_slice(&run[(lo - start) as usize..(hi - start) as usize]);
        Ok(())
    }
}

impl ReadAt for CachedObject {
    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.len());
        let Some(end) = end else {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "failed to fill whole buffer",
            ));
        };
        if buf.is_empty() {
            return Ok(());
        }
        let bs = self.cache.block_bytes;
        let (first, last) = (offset / bs, (end - 1) / bs);
        let mut block = Vec::new();
        let mut missing: Option<u64> = None;
        for b in first..=last + 1 {
            let hit = b <= last && {
                let (s, e) = self.block_range(b);
                block.resize((e - s) as usize, 0);
                let hit = self.cache.get(&self.entry(b), &mut block);
                if hit {
                    let lo = offset.max(s);
                    let hi = end.min(e);
                    buf[(lo - offset) as usize..(hi - offset) as usize]
                        .copy_from_slice(&block[(lo - s) as usize..(hi - s) as usize]);
                }
                hit
            };
            match (hit || b > last, missing) {
                // A run of missing blocks ends here (or is long enough): fetch it.
                (true, Some(m)) => {
                    self.fetch(m, b.min(last + 1), buf, offset)?;
                    missing = None;
                }
                (false, Some(m)) if b - m == MAX_RUN_BLOCKS => {
                    self.fetch(m, b, buf, offset)?;
                    missing = Some(b);
                }
                (false, None) => missing = Some(b),
                _ => {}
            }
        }
        Ok(())
    }

    fn version(&self) -> Option<ObjectVersion> {
        self.inner.version()
    }

    fn version_is_durable(&self) -> bool {
        self.inner.version_is_durable()
    }

    /// Passes on the blocks the cache does not hold, as the block-aligned ranges a miss
    /// will read.
    fn will_read(&self, ranges: &[Range<u64>]) {
        let bs = self.cache.block_bytes;
        let mut missing: Vec<Range<u64>> = Vec::new();
        for r in ranges
            .iter()
            .filter(|r| r.start < r.end && r.end <= self.len())
        {
            for b in r.start / bs..=(r.end - 1) / bs {
                if !self.cache.holds(&self.entry(b)) {
                    let (s, e) = self.block_range(b);
                    match missing.last_mut() {
                        Some(m) if m.end == s => m.end = e,
                        _ => missing.push(s..e),
                    }
                }
            }
        }
        self.inner.will_read(&missing);
    }
}
