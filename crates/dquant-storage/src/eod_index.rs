//! The document index of a raw token file with an end-of-document token, found once and
//! kept on disk.
//!
//! A raw file has no index: its documents end after each `eod` token, and finding them reads
//! every token (minutes for a 500 GB corpus). Streaming never needs them (packing reads each
//! source as one token stream), so opening a raw file reads nothing; the scan runs the first
//! time something asks for documents (`stat`, `inspect`, `verify`). Its result goes to a
//! cache file named after the data file's identity (its version: device, inode, size and
//! modification time), its dtype and its `eod`, so it is used again, by any process, until
//! the file changes; a changed file has another identity and is scanned again.
//!
//! Cache file, little-endian: magic `DQEODIX\x01`; the key's length (u32) and bytes; tokens
//! (u64); each document's end offset (u64, ascending, the last one the token count); the
//! document count (u64); the xxh3-64 of everything before it. The count comes last so that
//! the scan streams the ends to the file (no per-document memory); the file is written to a
//! temporary name and renamed, so readers see a whole entry or none, and an entry that does
//! not check out is ignored (and written again).
//!
//! The cache directory and its size bound are [`crate::cache_dir`]'s. A directory that cannot
//! be written is no error: the index is then kept in memory only.

use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use dquant_format::{DType, DocIndex, DocIndexBuilder};
use xxhash_rust::xxh3::Xxh3;

use crate::cache_dir::{entry_path, max_bytes, prune, touch};
use crate::StorageError;

const MAGIC: &[u8; 8] = b"DQEODIX\x01";
/// Longest key a cache entry may carry (a version string, a dtype and a token).
const MAX_KEY: usize = 4096;

/// Calls its argument with each chunk of a file's tokens, in order, from the first.
pub(crate) type Scan<'a> = &'a dyn Fn(&mut dyn FnMut(u64, &[u32])) -> Result<(), StorageError>;

/// A raw file's documents: counted or loaded on first use, from the cache or by a scan.
pub(crate) struct EodIndex {
    pub tokens: u64,
    eod: u32,
    /// What names this file's cache entry; `None` when its store gives no version (then
    /// nothing is cached: another file could have the same name tomorrow).
    key: Option<String>,
    count: OnceLock<u64>,
    loaded: OnceLock<DocIndex>,
    /// Held while scanning: sessions asking at once wait for one scan, not one each.
    scanning: Mutex<()>,
}

impl EodIndex {
    pub fn new(eod: u32, tokens: u64, dtype: DType, version: Option<String>) -> Self {
        let key = version.map(|v| format!("{v} dtype={} eod={eod}", dtype.numpy_name()));
        EodIndex {
            eod,
            tokens,
            key,
            count: OnceLock::new(),
            loaded: OnceLock::new(),
            scanning: Mutex::new(()),
        }
    }

    /// This file's cache entry, when there is a cache and the file has a durable version
    /// (of a sane length).
    pub fn cache_path(&self) -> Option<PathBuf> {
        let key = self.key.as_ref().filter(|k| k.len() <= MAX_KEY)?;
        entry_path(xxhash_rust::xxh3::xxh3_64(key.as_bytes()))
    }

    /// Documents: from memory, the cache entry (its last bytes), or a scan.
    pub fn documents(&self, scan: Scan<'_>) -> Result<u64, StorageError> {
        if let Some(n) = self.known() {
            return Ok(n);
        }
        let _one = self.scanning.lock().unwrap_or_else(|p| p.into_inner());
        // Another caller may have counted while this one waited.
        match self.known() {
            Some(n) => Ok(n),
            None => self.build(scan).map(|n| *self.count.get_or_init(|| n)),
        }
    }

    /// Documents when they are known without a scan: counted before, or in the cache.
    pub fn known(&self) -> Option<u64> {
        if let Some(ix) = self.loaded.get() {
            return Some(ix.documents() as u64);
        }
        if let Some(&n) = self.count.get() {
            return Some(n);
        }
        let n = self.cache_path().and_then(|p| self.read_count(&p))?;
        Some(*self.count.get_or_init(|| n))
    }

    /// The whole index: from memory, the cache entry, or a scan.
    pub fn index(&self, scan: Scan<'_>) -> Result<&DocIndex, StorageError> {
        if let Some(ix) = self.loaded.get() {
            return Ok(ix);
        }
        let path = self.cache_path();
        if let Some(ix) = path.as_deref().and_then(|p| self.read_index(p)) {
            return Ok(self.loaded.get_or_init(|| ix));
        }
        let _one = self.scanning.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(ix) = self.loaded.get() {
            return Ok(ix);
        }
        self.build(scan)?;
        if let Some(ix) = path.as_deref().and_then(|p| self.read_index(p)) {
            return Ok(self.loaded.get_or_init(|| ix));
        }
        if let Some(ix) = self.loaded.get() {
            // No entry: `build` kept the index in memory.
            return Ok(ix);
        }
        // The entry was written but is gone again (a cache cleaner): scan into memory.
        let ix = self.scan_into_memory(scan)?.1;
        Ok(self.loaded.get_or_init(|| ix))
    }

    /// Scans the file for `eod`: the document ends stream to the cache entry when one can be
    /// written (a failed write scans again, into memory), else into memory. Returns the
    /// document count.
    fn build(&self, scan: Scan<'_>) -> Result<u64, StorageError> {
        if let Some(path) = self.cache_path() {
            if let Some(n) = self.build_into(&path, scan)? {
                return Ok(n);
            }
        }
        let (n, ix) = self.scan_into_memory(scan)?;
        let _ = self.loaded.set(ix);
        Ok(n)
    }

    /// The document count and index, by a scan, in memory.
    fn scan_into_memory(&self, scan: Scan<'_>) -> Result<(u64, DocIndex), StorageError> {
        let mut b = DocIndexBuilder::new();
        let mut at = 0;
        let n = self.ends(scan, &mut |e| {
            b.push_document(e - at);
            at = e;
        })?;
        Ok((n, b.finish()))
    }

    /// Calls `f` with each document's end, in order; the document count.
    fn ends(&self, scan: Scan<'_>, f: &mut dyn FnMut(u64)) -> Result<u64, StorageError> {
        let (eod, mut last, mut n) = (self.eod, 0u64, 0u64);
        scan(&mut |start, chunk| {
            for (i, _) in chunk.iter().enumerate().filter(|(_, &t)| t == eod) {
                last = start + i as u64 + 1;
                n += 1;
                f(last);
            }
        })?;
        // A tail without an end-of-document token is a last document of its own.
        if last < self.tokens {
            n += 1;
            f(self.tokens);
        }
        Ok(n)
    }

    /// Streams the ends into a new cache entry at `path`: the count, or `None` when the
    /// entry could not be written (the scan's own errors are errors).
    fn build_into(&self, path: &Path, scan: Scan<'_>) -> Result<Option<u64>, StorageError> {
        let key = self.key.as_deref().unwrap_or_default();
        let Ok(mut w) = EntryWriter::create(path, key, self.tokens) else {
            return Ok(None);
        };
        let n = self.ends(scan, &mut |e| w.put(&e.to_le_bytes()))?;
        if w.finish(path, n).is_err() {
            return Ok(None);
        }
        prune(path, max_bytes());
        Ok(Some(n))
    }

    /// The count of the cache entry at `path`, when it is this file's (its key and token
    /// count) and its length is the one its count gives; `None` otherwise.
    fn read_count(&self, path: &Path) -> Option<u64> {
        let mut f = File::open(path).ok()?;
        let len = f.metadata().ok()?.len();
        let mut head = vec![0u8; self.head_len()?];
        f.read_exact(&mut head).ok()?;
        let mut tail = [0u8; 16];
        f.seek(SeekFrom::End(-16)).ok()?;
        f.read_exact(&mut tail).ok()?;
        let n = self.check(&head, &tail, len)?;
        touch(&f);
        Some(n)
    }

    /// Bytes before the first end: magic, key length and key, tokens.
    fn head_len(&self) -> Option<usize> {
        let key = self.key.as_deref()?;
        (key.len() <= MAX_KEY).then_some(8 + 4 + key.len() + 8)
    }

    /// Checks an entry's head and its last 16 bytes against this file and the entry's
    /// length; the document count.
    fn check(&self, head: &[u8], tail: &[u8], len: u64) -> Option<u64> {
        let key = self.key.as_deref()?;
        let u64_at = |b: &[u8], at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
        };
        let key_len = u32::from_le_bytes(head.get(8..12)?.try_into().ok()?) as usize;
        if head.get(..8)? != MAGIC
            || key_len != key.len()
            || head.get(12..12 + key_len)? != key.as_bytes()
        {
            return None;
        }
        let (tokens, n) = (u64_at(head, 12 + key_len)?, u64_at(tail, 0)?);
        let want = n.checked_mul(8)?.checked_add(head.len() as u64 + 16)?;
        (tokens == self.tokens && n <= tokens && want == len).then_some(n)
    }

    /// The whole cache entry, checked (head, checksum, ends ascending to the token count),
    /// as an index; `None` for anything else.
    fn read_index(&self, path: &Path) -> Option<DocIndex> {
        // Its head, tail and length first: a file that is not this entry is not read whole.
        self.read_count(path)?;
        let bytes = std::fs::read(path).ok()?;
        let at = self.head_len()?;
        let tail = bytes.get(bytes.len().checked_sub(16)?..)?;
        self.check(bytes.get(..at)?, tail, bytes.len() as u64)?;
        let (body, sum) = bytes.split_at(bytes.len() - 8);
        if xxhash_rust::xxh3::xxh3_64(body) != u64::from_le_bytes(sum.try_into().ok()?) {
            return None;
        }
        let mut b = DocIndexBuilder::new();
        let mut prev = 0u64;
        for e in body[at..body.len() - 8].chunks_exact(8) {
            let e = u64::from_le_bytes(e.try_into().ok()?);
            if e <= prev {
                return None;
            }
            b.push_document(e - prev);
            prev = e;
        }
        (prev == self.tokens).then(|| b.finish())
    }
}

/// A cache entry being written: a temporary file beside its final name, checksummed as it
/// goes. A write error is kept and reported by [`finish`](EntryWriter::finish).
struct EntryWriter {
    tmp: tempfile::NamedTempFile,
    out: BufWriter<File>,
    hash: Xxh3,
    error: Option<std::io::Error>,
}

impl EntryWriter {
    fn create(path: &Path, key: &str, tokens: u64) -> std::io::Result<Self> {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let tmp = tempfile::NamedTempFile::new_in(dir)?;
        let out = BufWriter::new(tmp.reopen()?);
        let mut w = EntryWriter {
            tmp,
            out,
            hash: Xxh3::new(),
            error: None,
        };
        w.put(MAGIC);
        w.put(&(key.len() as u32).to_le_bytes());
        w.put(key.as_bytes());
        w.put(&tokens.to_le_bytes());
        Ok(w)
    }

    fn put(&mut self, b: &[u8]) {
        if self.error.is_none() {
            self.hash.update(b);
            if let Err(e) = self.out.write_all(b) {
                self.error = Some(e);
            }
        }
    }

    /// Writes the count and checksum, and renames the entry into place.
    fn finish(mut self, path: &Path, n: u64) -> std::io::Result<()> {
        self.put(&n.to_le_bytes());
        if let Some(e) = self.error {
            return Err(e);
        }
        self.out.write_all(&self.hash.digest().to_le_bytes())?;
        let f = self.out.into_inner().map_err(|e| e.into_error())?;
        // The write left a modification time from the kernel's coarse clock, which lags
        // `SystemTime::now()` by up to a tick: an entry written just after another was used
        // could look older than it. Its use time comes from the clock `touch` reads.
        touch(&f);
        f.sync_all()?;
        self.tmp.persist(path).map_err(|e| e.error)?;
        Ok(())
    }
}
