//! One object read by ranged GETs: [`ReadAt`] over an object store.
//!
//! # Why a readahead, and why several streams
//! A dataset's reader asks for one range at a time and waits; one GET per ask would measure
//! round trips, not the link. Like mountpoint-s3's and fsspec's sequential prefetchers, a
//! reader that continues where it stopped (give or take a part: consecutive samples share a
//! token, a data-parallel rank skips the other ranks' samples) gets the object in parts of
//! `part_bytes`, `readahead_bytes` of them requested ahead, several GETs in flight. A gap
//! smaller than a part is read through, so ranges that close are merged into the same GETs.
//! Reads that continue nothing (a shuffled plan, an index) fetch exactly their bytes, split
//! into parts fetched concurrently.
//!
//! An opened dataset is shared by every session that reads it, so one object may be read by
//! several sequential readers at once, each somewhere else. Each gets its own window (up to
//! [`MAX_STREAMS`], the least recently used dropped first), so two readers never take each
//! other's readahead for a random read.
//!
//! # Announced reads
//! A shuffled batch's samples are scattered; read one by one, each is a round trip. The
//! engine announces a batch's ranges before reading them (`ReadAt::will_read`), and the
//! object starts every GET at once (ranges closer than 64 KiB merged into one), so the
//! batch costs about one round trip. Announced parts are held, bounded, until read or
//! pushed out by later announcements; sequential announcements are left to the readahead.
//!
//! # Waiting without holding the object
//! A part is a [`Part`]: its bytes arrive on the runtime and are waited for with a condvar.
//! The window is locked only to decide which parts a read needs; the waiting and copying
//! happen after, so a reader waiting for the network never blocks another reader of the same
//! object. A part that no window and no reader holds any more is dropped, which aborts its
//! GET.
//!
//! # What a GET checks
//! Every body must be exactly the bytes asked for, and carry the ETag the object had when it
//! was opened: an object replaced or truncated under a reader fails the read (with the
//! reason) instead of mixing two versions in one stream.

use std::collections::VecDeque;
use std::io::{self, IoSliceMut};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};

use bytes::Bytes;
use dquant_storage::{ObjectVersion, ReadAt};
use object_store::path::Path;
use object_store::{GetOptions, ObjectStore};
use tokio::task::AbortHandle;

use crate::settings::ReadSettings;

/// Sequential readers of one object that keep their own readahead.
const MAX_STREAMS: usize = 8;
/// Announced reads (`will_read`) held at once per object, in parts and in bytes: a few
/// shuffled batches of several sessions.
const MAX_PREFETCH_PARTS: usize = 512;
const MAX_PREFETCH_BYTES: u64 = 64 << 20;
/// Announced ranges closer than this are fetched by one GET.
const MERGE_GAP: u64 = 64 << 10;

/// Requests an object-store root made, for tests and reports.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub heads: AtomicU64,
    pub lists: AtomicU64,
    pub gets: AtomicU64,
    pub bytes: AtomicU64,
}

/// What an [`ObjectRoot`](crate::ObjectRoot) asked of its store so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ObjectStats {
    pub heads: u64,
    pub lists: u64,
    /// Ranged GETs issued.
    pub gets: u64,
    /// Body bytes of the GETs that completed.
    pub bytes: u64,
}

impl Counters {
    pub fn snapshot(&self) -> ObjectStats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ObjectStats {
            heads: l(&self.heads),
            lists: l(&self.lists),
            gets: l(&self.gets),
            bytes: l(&self.bytes),
        }
    }
}

/// Why a GET failed: kept to hand to every reader waiting for the part.
#[derive(Clone, Debug)]
struct Failure {
    kind: io::ErrorKind,
    message: Arc<str>,
}

impl From<Failure> for io::Error {
    fn from(f: Failure) -> Self {
        io::Error::new(f.kind, f.message.to_string())
    }
}

/// One ranged GET and, once it completes, its body.
struct Part {
    range: Range<u64>,
    result: Mutex<Option<Result<Bytes, Failure>>>,
    done: Condvar,
    task: OnceLock<AbortHandle>,
}

impl Part {
    fn wait(&self) -> io::Result<Bytes> {
        let mut r = lock(&self.result);
        loop {
            if let Some(r) = r.as_ref() {
                return r.clone().map_err(io::Error::from);
            }
            r = self.done.wait(r).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn finish(&self, r: Result<Bytes, Failure>) {
        *lock(&self.result) = Some(r);
        self.done.notify_all();
    }
}

impl Drop for Part {
    fn drop(&mut self) {
        if let Some(t) = self.task.get() {
            t.abort();
        }
    }
}

/// The parts requested for one sequential reader: contiguous, from the first one not yet
/// consumed to `next`.
struct Window {
    parts: VecDeque<Arc<Part>>,
    next: u64,
}

impl Window {
    fn start(&self) -> u64 {
        self.parts.front().map_or(self.next, |p| p.range.start)
    }
}

/// One reader's position, and its window once it has read sequentially.
struct Stream {
    prev_end: u64,
    window: Option<Window>,
    used: u64,
}

#[derive(Default)]
struct Streams {
    list: Vec<Stream>,
    clock: u64,
}

/// An object opened for positional reads.
pub(crate) struct ObjectFile {
    store: Arc<dyn ObjectStore>,
    path: Path,
    len: u64,
    etag: Option<String>,
    read: ReadSettings,
    counters: Arc<Counters>,
    streams: Mutex<Streams>,
    /// GETs started for announced reads (`will_read`), oldest first.
    prefetched: Mutex<VecDeque<Arc<Part>>>,
}

impl ObjectFile {
    pub fn new(
        store: Arc<dyn ObjectStore>,
        path: Path,
        len: u64,
        etag: Option<String>,
        read: ReadSettings,
        counters: Arc<Counters>,
    ) -> Self {
        ObjectFile {
            store,
            path,
            len,
            etag,
            read,
            counters,
            streams: Mutex::default(),
            prefetched: Mutex::default(),
        }
    }

    /// Starts the GET of `range`; its bytes are waited for with [`Part::wait`].
    fn spawn(&self, range: Range<u64>) -> Arc<Part> {
        let part = Arc::new(Part {
            range: range.clone(),
            result: Mutex::new(None),
            done: Condvar::new(),
            task: OnceLock::new(),
        });
        self.counters.gets.fetch_add(1, Ordering::Relaxed);
        let get = get(
            self.store.clone(),
            self.path.clone(),
            range,
            self.etag.clone(),
            self.counters.clone(),
        );
        let weak: Weak<Part> = Arc::downgrade(&part);
        let task = dquant_runtime::handle().spawn(async move {
            let r = get.await;
            if let Some(p) = weak.upgrade() {
                p.finish(r);
            }
        });
        let _ = part.task.set(task.abort_handle());
        part
    }

    /// `b` split into parts, all requested at once.
    fn direct(&self, b: Range<u64>) -> Vec<Arc<Part>> {
        let step = self.read.part_bytes;
        (b.start..b.end)
            .step_by(step as usize)
            .map(|s| self.spawn(s..(s + step).min(b.end)))
            .collect()
    }

    /// Whether a read from `start` goes on from one that ended at `prev_end`, give or take a
    /// part (consecutive samples share a token; a rank skips the other ranks' samples).
    fn continues(&self, prev_end: u64, start: u64) -> bool {
        let part = self.read.part_bytes;
        start.saturating_add(part) >= prev_end && start <= prev_end + part
    }

    /// Whether `ranges` go on from one another, as an unshuffled batch's samples do: the
    /// readahead serves those.
    fn sequential(&self, ranges: &[Range<u64>]) -> bool {
        ranges
            .windows(2)
            .all(|w| self.continues(w[0].end, w[1].start))
    }

    /// Starts GETs for announced `ranges` (merged when closer than [`MERGE_GAP`]), unless
    /// they are sequential or already held; the oldest announced parts go when more than
    /// [`MAX_PREFETCH_PARTS`] or [`MAX_PREFETCH_BYTES`] are held.
    fn prefetch(&self, ranges: &[Range<u64>]) {
        if ranges.len() < 2 || self.sequential(ranges) {
            return;
        }
        let mut v: Vec<Range<u64>> = ranges
            .iter()
            .filter(|r| r.start < r.end && r.end <= self.len)
            .cloned()
            .collect();
        v.sort_by_key(|r| r.start);
        let mut merged: Vec<Range<u64>> = Vec::new();
        for r in v {
            match merged.last_mut() {
                Some(m) if r.start <= m.end + MERGE_GAP => m.end = m.end.max(r.end),
                _ => merged.push(r),
            }
        }
        let len = |p: &Part| p.range.end - p.range.start;
        let mut pre = lock(&self.prefetched);
        let mut bytes: u64 = pre.iter().map(|p| len(p)).sum();
        for r in merged {
            let held = pre
                .iter()
                .any(|p| p.range.start <= r.start && r.end <= p.range.end);
            if held || r.end - r.start > MAX_PREFETCH_BYTES / 4 {
                continue;
            }
            let p = self.spawn(r);
            bytes += len(&p);
            pre.push_back(p);
            while pre.len() > MAX_PREFETCH_PARTS || bytes > MAX_PREFETCH_BYTES {
                if let Some(old) = pre.pop_front() {
                    bytes -= len(&old);
                }
            }
        }
    }

    /// The announced part holding `b`, if one does.
    fn prefetched(&self, b: &Range<u64>) -> Option<Arc<Part>> {
        lock(&self.prefetched)
            .iter()
            .find(|p| p.range.start <= b.start && b.end <= p.range.end)
            .cloned()
    }

    /// The parts that hold `b`, requested as needed: an announced part, the window of the
    /// stream `b` continues, or directly (and `b` becomes a stream that a next read may
    /// continue).
    fn plan(&self, b: Range<u64>) -> Vec<Arc<Part>> {
        if let Some(p) = self.prefetched(&b) {
            return vec![p];
        }
        let mut s = lock(&self.streams);
        s.clock += 1;
        let now = s.clock;
        let inflight = self.read.inflight();
        let found = (inflight > 0)
            .then(|| {
                s.list
                    .iter()
                    .position(|st| self.continues(st.prev_end, b.start))
            })
            .flatten();
        let Some(i) = found else {
            if inflight > 0 {
                if s.list.len() == MAX_STREAMS {
                    let lru = (0..s.list.len()).min_by_key(|&i| s.list[i].used);
                    if let Some(lru) = lru {
                        s.list.swap_remove(lru);
                    }
                }
                s.list.push(Stream {
                    prev_end: b.end,
                    window: None,
                    used: now,
                });
            }
            drop(s);
            return self.direct(b);
        };
        let st = &mut s.list[i];
        st.used = now;
        // A straggler (another thread's read of a sample the window has moved past, as when
        // the worker pool reads a batch's samples at once) is fetched on its own: restarting
        // the window there would fetch everything after it twice.
        if st.window.as_ref().is_some_and(|w| b.start < w.start()) {
            drop(s);
            return self.direct(b);
        }
        st.prev_end = st.prev_end.max(b.end);
        let mut w = match st.window.take() {
            Some(w) if b.start <= w.next => w,
            _ => Window {
                parts: VecDeque::new(),
                next: b.start,
            },
        };
        let parts = self.advance(&mut w, &b, inflight);
        st.window = Some(w);
        parts
    }

    /// Moves window `w` to read `b`: drops the parts done with, requests what `b` needs and
    /// `inflight` parts beyond it, and returns the parts holding `b`.
    fn advance(&self, w: &mut Window, b: &Range<u64>, inflight: usize) -> Vec<Arc<Part>> {
        // Parts wholly before the read, but one, are done with (the one kept serves reads
        // that arrive slightly out of order).
        while w.parts.len() > 1 && w.parts.get(1).is_some_and(|p| p.range.end <= b.start) {
            w.parts.pop_front();
        }
        loop {
            let ahead = w.parts.iter().filter(|p| p.range.end > b.end).count();
            if w.next >= self.len || (w.next >= b.end && ahead >= inflight) {
                break;
            }
            let range = w.next..(w.next + self.read.part_bytes).min(self.len);
            w.next = range.end;
            w.parts.push_back(self.spawn(range));
        }
        w.parts
            .iter()
            .filter(|p| p.range.end > b.start && p.range.start < b.end)
            .cloned()
            .collect()
    }

    /// Fills `bufs` in order from the bytes at `offset`.
    fn read_into(&self, bufs: &mut [&mut [u8]], offset: u64) -> io::Result<()> {
        let total: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        let end = offset.checked_add(total).filter(|&e| e <= self.len);
        let Some(end) = end else {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "bytes {offset}..{} are past the end of the object ({} bytes)",
                    offset.saturating_add(total),
                    self.len
                ),
            ));
        };
        if total == 0 {
            return Ok(());
        }
        let mut out = Scatter::new(bufs);
        for p in self.plan(offset..end) {
            let bytes = match p.wait() {
                Ok(b) => b,
                Err(e) => {
                    // Nothing failed stays in a window or among announced parts: the next
                    // read asks again.
                    lock(&self.streams).list.clear();
                    lock(&self.prefetched).clear();
                    return Err(e);
                }
            };
            let lo = p.range.start.max(offset);
            let hi = p.range.end.min(end);
            out.put(&bytes[(lo - p.range.start) as usize..(hi - p.range.start) as usize]);
        }
        Ok(())
    }
}

/// The state behind `m`, also after a reader panicked holding it (what it guards is
/// consistent between statements).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Writes consecutive byte runs across a list of buffers, in order.
struct Scatter<'a, 'b> {
    bufs: &'a mut [&'b mut [u8]],
    i: usize,
    at: usize,
}

impl<'a, 'b> Scatter<'a, 'b> {
    fn new(bufs: &'a mut [&'b mut [u8]]) -> Self {
        Scatter { bufs, i: 0, at: 0 }
    }

    fn put(&mut self, mut src: &[u8]) {
        while !src.is_empty() && self.i < self.bufs.len() {
            let dst = &mut self.bufs[self.i][self.at..];
            let n = dst.len().min(src.len());
            dst[..n].copy_from_slice(&src[..n]);
            src = &src[n..];
            self.at += n;
            if self.at == self.bufs[self.i].len() {
                self.i += 1;
                self.at = 0;
            }
        }
    }
}

/// One ranged GET of `range`, checked: exactly its bytes, of the version opened.
async fn get(
    store: Arc<dyn ObjectStore>,
    path: Path,
    range: Range<u64>,
    etag: Option<String>,
    counters: Arc<Counters>,
) -> Result<Bytes, Failure> {
    let what = format!("GET bytes {}..{}", range.start, range.end);
    let fail = |kind, message: String| Failure {
        kind,
        message: message.into(),
    };
    let failed = |e: object_store::Error| {
        let kind = match e {
            object_store::Error::NotFound { .. } => io::ErrorKind::NotFound,
            _ => io::ErrorKind::Other,
        };
        fail(kind, format!("{what}: {e}"))
    };
    let opts = GetOptions::new().with_range(Some(range.clone()));
    let r = store.get_opts(&path, opts).await.map_err(failed)?;
    if let (Some(want), Some(got)) = (&etag, &r.meta.e_tag) {
        if want != got {
            return Err(fail(
                io::ErrorKind::InvalidData,
                format!("{what}: the object changed since it was opened (ETag {want}, now {got})"),
            ));
        }
    }
    let body = r.bytes().await.map_err(failed)?;
    counters
        .bytes
        .fetch_add(body.len() as u64, Ordering::Relaxed);
    if body.len() as u64 != range.end - range.start {
        return Err(fail(
            io::ErrorKind::UnexpectedEof,
            format!(
                "{what}: got {} bytes: the object is shorter than when it was opened",
                body.len()
            ),
        ));
    }
    Ok(body)
}

impl ReadAt for ObjectFile {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_into(&mut [buf], offset)
    }

    fn version(&self) -> Option<ObjectVersion> {
        self.etag.clone().map(ObjectVersion::tag)
    }

    /// An ETag names the bytes for as long as the object exists.
    fn version_is_durable(&self) -> bool {
        self.etag.is_some()
    }

    /// Announced reads are fetched at once: a shuffled batch costs one round trip, not one
    /// per sample.
    fn will_read(&self, ranges: &[Range<u64>]) {
        self.prefetch(ranges);
    }

    /// One plan for all the buffers: consecutive rows of a batch are one range of GETs.
    fn read_exact_vectored_at(&self, bufs: &mut [IoSliceMut<'_>], offset: u64) -> io::Result<()> {
        let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut **b).collect();
        self.read_into(&mut slices, offset)
    }
}
