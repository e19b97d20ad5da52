//! The baseline reader: raw tokens from an S3-compatible store by ranged GETs.
//!
//! # Why this exists
//! The lab compares dquant against what users do today: the training host pulls the raw
//! int32 (or uint16) token ids of a Megatron `.bin` over the network from an S3-compatible
//! server and narrows/packs them in its own process. [`ObjectSource`] is that read path: a
//! [`TokenSource`] over one object, plugged into dquant's in-process pipeline
//! (`dquant_client::Reader::local_with`), so the baseline and dquant run the same plan and
//! produce the same batches; only where the bytes are read and narrowed differs.
//!
//! # Why readahead
//! A baseline that waits for one small GET per sample would measure round trips, not the
//! link, and flatter dquant. Like mountpoint-s3's or fsspec's sequential prefetchers, this one
//! keeps [`Readahead::inflight`] chunk GETs of [`Readahead::chunk_bytes`] running ahead of the
//! reader while reads are sequential, so an unshuffled plan is limited by the link. Reads that
//! are not sequential (a shuffled plan, the wrap at the end of an epoch) abandon the
//! readahead and fetch exactly the ranges asked for, concurrently; readahead resumes as soon
//! as reads are sequential again.
//!
//! # What it is not
//! Not a product feature: dquant's agent does not read S3 yet. This lives in the benchmark
//! crate only, as the thing to beat.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use dquant_codec::kernels::load_plain;
use dquant_engine::{SourceError, TokenSource};
use dquant_format::DType;
use dquant_storage::StorageError;
use futures::{StreamExt as _, TryStreamExt as _};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, ObjectStore, ObjectStoreExt as _, RetryConfig,
};
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

/// How to reach an S3-compatible endpoint (path-style, plain HTTP inside the lab's namespaces).
#[derive(Debug, Clone)]
pub struct S3Config {
    /// e.g. `http://10.77.0.1:9000`
    pub endpoint: String,
    pub bucket: String,
    pub access_key: String,
    pub secret_key: String,
    pub region: String,
}

/// An S3 client for `cfg`: path-style requests, plain HTTP allowed, two retries at most (a
/// benchmark should see failures, not hide them behind minutes of backoff), a 5 s connect
/// timeout, a 15 s stall (read) timeout and a 120 s limit per request.
pub fn s3_store(cfg: &S3Config) -> anyhow::Result<Arc<dyn ObjectStore>> {
    dquant_objstore::install_tls_provider();
    let client = ClientOptions::new()
        .with_allow_http(true)
        .with_connect_timeout(Duration::from_secs(5))
        .with_read_timeout(Duration::from_secs(15))
        .with_timeout(Duration::from_secs(120));
    let retry = RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(1),
            base: 2.0,
        },
        max_retries: 2,
        retry_timeout: Duration::from_secs(30),
    };
    let store = AmazonS3Builder::new()
        .with_client_options(client)
        .with_endpoint(&cfg.endpoint)
        .with_bucket_name(&cfg.bucket)
        .with_access_key_id(&cfg.access_key)
        .with_secret_access_key(&cfg.secret_key)
        .with_region(&cfg.region)
        .with_allow_http(true)
        .with_virtual_hosted_style_request(false)
        .with_retry(retry)
        .build()
        .with_context(|| format!("S3 client for s3://{} at {}", cfg.bucket, cfg.endpoint))?;
    Ok(Arc::new(store))
}

/// The runtime every [`ObjectSource`] runs its GETs on (two worker threads, started on first
/// use, never shut down). Run other requests on the same store here too: connections pooled
/// by a runtime that is later dropped are dead.
pub fn runtime() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("dquant-s3")
            .enable_all()
            .build()
            .expect("cannot start the S3 reader's tokio runtime")
    })
}

/// Makes sure object `key` holds the bytes of `file`, uploading it with one PUT when the
/// store has no object of that size under `key`. Returns whether it uploaded.
///
/// The lab stages its corpora this way, as any S3 deployment gets its data, rather than by
/// copying files into s3s-fs's directory: s3s-fs keeps each object's ETag in a sidecar it
/// writes on PUT, and without one it hashes the whole file on every GET.
///
/// Runs on a current-thread runtime of the calling thread, so that its connections open in
/// the caller's network namespace.
pub fn ensure_object(
    store: &Arc<dyn ObjectStore>,
    key: &str,
    file: &std::path::Path,
) -> anyhow::Result<bool> {
    let len = std::fs::metadata(file)
        .with_context(|| format!("cannot stat {}", file.display()))?
        .len();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start a tokio runtime")?;
    let path = Path::from(key);
    rt.block_on(async {
        match store.head(&path).await {
            Ok(meta) if meta.size == len => return Ok(false),
            Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(anyhow::Error::new(e).context(format!("HEAD {key}"))),
        }
        let body = Bytes::from(
            std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?,
        );
        store
            .put(&path, body.into())
            .await
            .with_context(|| format!("PUT {key} ({len} bytes)"))?;
        Ok(true)
    })
}

/// Sequential readahead of an [`ObjectSource`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Readahead {
    /// Bytes per readahead GET (rounded down to whole tokens).
    pub chunk_bytes: usize,
    /// Chunk GETs kept running ahead of the reader; 0 disables readahead (every range is
    /// fetched on its own).
    pub inflight: usize,
}

impl Default for Readahead {
    /// 8 MiB chunks, 4 in flight. 8 MiB is within the 8-16 MiB AWS recommends for ranged
    /// GETs and is mountpoint-s3's part size (fsspec/s3fs use 5 MiB blocks): large enough
    /// that per-request latency is amortized, small enough that the first bytes arrive soon.
    /// Four concurrent GETs (four TCP streams, as S3 clients use to fill a link) keep up to
    /// 32 MiB requested ahead of the reader, above the bandwidth-delay product of a
    /// 10-25 Gbit/s link with ~10 ms of server latency, for about (4 + 1) x 8 = 40 MiB of
    /// memory per source.
    fn default() -> Self {
        Readahead {
            chunk_bytes: 8 << 20,
            inflight: 4,
        }
    }
}

/// What an [`ObjectSource`] asked of the store so far.
#[allow(dead_code)] // for the lab's reports and the tests; the pipeline sees a `dyn TokenSource`
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ObjectStats {
    /// HEAD requests (one, at open).
    pub heads: u64,
    /// GET requests issued (readahead chunks and direct ranges).
    pub gets: u64,
    /// Body bytes of the GETs that completed.
    pub bytes: u64,
    /// Readahead GETs abandoned before they were read (non-sequential access).
    pub cancelled: u64,
    /// Most bytes held or requested by the readahead window at once.
    pub peak_window_bytes: u64,
}

#[derive(Default)]
struct Counters {
    heads: AtomicU64,
    gets: AtomicU64,
    bytes: AtomicU64,
}

/// Concurrent GETs for ranges fetched outside the readahead (a shuffled batch).
const DIRECT_CONCURRENCY: usize = 16;

/// A raw little-endian token file in an object store (e.g. a Megatron .bin of int32), read by
/// ranged GETs with sequential readahead.
pub struct ObjectSource {
    store: Arc<dyn ObjectStore>,
    path: Path,
    /// `s3://BUCKET/KEY`, or the store and path for other stores: names the object in errors.
    name: String,
    dtype: DType,
    /// Object size in bytes.
    size: u64,
    chunk: u64,
    inflight: usize,
    counters: Arc<Counters>,
    cancelled: u64,
    peak_window: u64,
    /// Byte offset where the previous non-empty read ended.
    prev_end: u64,
    stream: Option<Window>,
}

/// The readahead window: contiguous chunks from the first one not yet consumed to `next`.
struct Window {
    chunks: VecDeque<Chunk>,
    /// Where the next chunk starts (the end of the last one requested).
    next: u64,
}

struct Chunk {
    range: Range<u64>,
    state: ChunkState,
}

enum ChunkState {
    Pending(JoinHandle<Result<Bytes, String>>),
    Ready(Bytes),
}

impl Window {
    fn start(&self) -> u64 {
        self.chunks.front().map_or(self.next, |c| c.range.start)
    }

    fn bytes(&self) -> u64 {
        self.next - self.start()
    }
}

/// One ranged GET, counted when it is issued (created).
fn fetch(
    store: Arc<dyn ObjectStore>,
    path: Path,
    range: Range<u64>,
    counters: Arc<Counters>,
) -> impl Future<Output = Result<Bytes, String>> + Send + 'static {
    counters.gets.fetch_add(1, Ordering::Relaxed);
    async move {
        let opts = GetOptions::new().with_range(Some(range.clone()));
        let body = match store.get_opts(&path, opts).await {
            Ok(r) => r.bytes().await,
            Err(e) => Err(e),
        }
        .map_err(|e| format!("GET bytes {}..{}: {e}", range.start, range.end))?;
        counters
            .bytes
            .fetch_add(body.len() as u64, Ordering::Relaxed);
        if body.len() as u64 != range.end - range.start {
            return Err(format!(
                "GET bytes {}..{} returned {} bytes",
                range.start,
                range.end,
                body.len()
            ));
        }
        Ok(body)
    }
}

/// Blocks on a task of [`runtime`] without entering it (works from any thread, even one
/// inside another runtime).
fn wait<T>(handle: JoinHandle<T>) -> Result<T, String> {
    futures::executor::block_on(handle).map_err(|e| format!("GET task failed: {e}"))
}

/// How errors name an object: `s3://BUCKET/KEY` for S3, `memory:///KEY` for the in-memory
/// store, the store's own description otherwise.
fn object_name(store: &dyn ObjectStore, path: &Path) -> String {
    let s = store.to_string();
    if let Some(bucket) = s
        .strip_prefix("AmazonS3(")
        .and_then(|r| r.strip_suffix(')'))
    {
        format!("s3://{bucket}/{path}")
    } else if s == "InMemory" {
        format!("memory:///{path}")
    } else {
        format!("{s}/{path}")
    }
}

impl ObjectSource {
    /// Opens `path` in `store` as raw little-endian tokens of `dtype` (int32 or uint16): one
    /// HEAD for the size, which must be a whole number of tokens.
    pub fn open(
        store: Arc<dyn ObjectStore>,
        path: Path,
        dtype: DType,
        readahead: Readahead,
    ) -> Result<Self, SourceError> {
        let name = object_name(store.as_ref(), &path);
        if !matches!(dtype, DType::I32 | DType::U16) {
            return Err(SourceError::Usage(format!(
                "{name}: the S3 baseline reader reads int32 and uint16 tokens, not {}",
                dtype.numpy_name()
            )));
        }
        let counters = Arc::new(Counters::default());
        counters.heads.fetch_add(1, Ordering::Relaxed);
        let head = {
            let (store, path) = (store.clone(), path.clone());
            runtime().spawn(async move {
                let opts = GetOptions::new().with_head(true);
                store.get_opts(&path, opts).await.map(|r| r.meta.size)
            })
        };
        let size = wait(head)
            .and_then(|r| r.map_err(|e| format!("HEAD: {e}")))
            .map_err(|e| storage_error(&name, io::ErrorKind::Other, e))?;
        let item = dtype.itemsize() as u64;
        if size % item != 0 {
            return Err(storage_error(
                &name,
                io::ErrorKind::InvalidData,
                format!(
                    "{size} bytes is not a whole number of {item}-byte {} tokens",
                    dtype.numpy_name()
                ),
            ));
        }
        let chunk = (readahead.chunk_bytes as u64 / item).max(1) * item;
        Ok(ObjectSource {
            store,
            path,
            name,
            dtype,
            size,
            chunk,
            inflight: readahead.inflight,
            counters,
            cancelled: 0,
            peak_window: 0,
            prev_end: 0,
            stream: None,
        })
    }

    /// Requests made so far.
    #[allow(dead_code)]
    pub fn stats(&self) -> ObjectStats {
        ObjectStats {
            heads: self.counters.heads.load(Ordering::Relaxed),
            gets: self.counters.gets.load(Ordering::Relaxed),
            bytes: self.counters.bytes.load(Ordering::Relaxed),
            cancelled: self.cancelled,
            peak_window_bytes: self.peak_window,
        }
    }

    /// The object's name in errors (`s3://BUCKET/KEY`).
    #[allow(dead_code)]
    pub fn name(&self) -> &str {
        &self.name
    }

    fn item(&self) -> u64 {
        self.dtype.itemsize() as u64
    }

    fn err(&self, e: String) -> SourceError {
        storage_error(&self.name, io::ErrorKind::Other, e)
    }

    /// Whether a read of bytes from `start` continues the previous one: it starts at most one
    /// token before where that ended (consecutive samples share a token) and at most one
    /// chunk after it (a data-parallel rank skips the other ranks' samples).
    fn sequential(&self, start: u64) -> bool {
        self.inflight > 0
            && start + self.item() >= self.prev_end
            && start <= self.prev_end + self.chunk
    }

    /// Abandons the readahead window, aborting its GETs still running.
    fn cancel_stream(&mut self) {
        if let Some(w) = self.stream.take() {
            for c in w.chunks {
                self.abandon(c);
            }
        }
    }

    /// Drops a chunk no read will need, aborting its GET if still running (counted).
    fn abandon(&mut self, c: Chunk) {
        if let ChunkState::Pending(h) = c.state {
            if !h.is_finished() {
                self.cancelled += 1;
            }
            h.abort();
        }
    }

    fn spawn_get(&self, range: Range<u64>) -> JoinHandle<Result<Bytes, String>> {
        runtime().spawn(fetch(
            self.store.clone(),
            self.path.clone(),
            range,
            self.counters.clone(),
        ))
    }

    /// Serves bytes `b` from the readahead window (starting one at `b.start` if `b` is not in
    /// the current one), keeping `inflight` chunks requested that end beyond `b.end`: the
    /// window is then at most `inflight + 1` chunks for reads shorter than a chunk.
    fn read_streamed(&mut self, b: Range<u64>, out: &mut [u32]) -> Result<(), SourceError> {
        let reuse = self
            .stream
            .as_ref()
            .is_some_and(|w| w.start() <= b.start && b.start <= w.next);
        if !reuse {
            self.cancel_stream();
            self.stream = Some(Window {
                chunks: VecDeque::new(),
                next: b.start,
            });
        }
        let mut w = self.stream.take().expect("window set above");
        // Chunks wholly before the read are consumed (or skipped).
        while w.chunks.front().is_some_and(|c| c.range.end <= b.start) {
            let c = w.chunks.pop_front().expect("front exists");
            self.abandon(c);
        }
        // Request what the read needs, and `inflight` chunks that end beyond it.
        loop {
            let ahead = w.chunks.iter().filter(|c| c.range.end > b.end).count();
            if w.next >= self.size || (w.next >= b.end && ahead >= self.inflight) {
                break;
            }
            let range = w.next..(w.next + self.chunk).min(self.size);
            w.next = range.end;
            let handle = self.spawn_get(range.clone());
            w.chunks.push_back(Chunk {
                range,
                state: ChunkState::Pending(handle),
            });
        }
        self.peak_window = self.peak_window.max(w.bytes());
        let result = self.copy_from(&mut w, b.clone(), out);
        if result.is_ok() {
            // Keep the chunk holding the read's last token: the next sample starts there.
            let keep_from = b.end - self.item();
            while w.chunks.front().is_some_and(|c| c.range.end <= keep_from) {
                w.chunks.pop_front();
            }
            self.stream = Some(w);
        } else {
            self.stream = Some(w);
            self.cancel_stream();
        }
        result
    }

    fn copy_from(&self, w: &mut Window, b: Range<u64>, out: &mut [u32]) -> Result<(), SourceError> {
        let item = self.item();
        for c in w.chunks.iter_mut() {
            if c.range.end <= b.start {
                continue;
            }
            if c.range.start >= b.end {
                break;
            }
            if let ChunkState::Pending(_) = c.state {
                let ChunkState::Pending(h) =
                    std::mem::replace(&mut c.state, ChunkState::Ready(Bytes::new()))
                else {
                    unreachable!()
                };
                let bytes = wait(h).and_then(|r| r).map_err(|e| self.err(e))?;
                c.state = ChunkState::Ready(bytes);
            }
            let ChunkState::Ready(bytes) = &c.state else {
                unreachable!()
            };
            let lo = c.range.start.max(b.start);
            let hi = c.range.end.min(b.end);
            let src = &bytes[(lo - c.range.start) as usize..(hi - c.range.start) as usize];
            let dst = &mut out[((lo - b.start) / item) as usize..((hi - b.start) / item) as usize];
            self.decode(src, dst, lo / item)?;
        }
        Ok(())
    }

    /// Fetches `reads` (byte ranges with their offsets in `out`, in tokens) with one GET each,
    /// [`DIRECT_CONCURRENCY`] at a time.
    fn read_direct(
        &mut self,
        reads: &[(Range<u64>, usize)],
        out: &mut [u32],
    ) -> Result<(), SourceError> {
        let gets: Vec<_> = reads
            .iter()
            .map(|(b, _)| {
                fetch(
                    self.store.clone(),
                    self.path.clone(),
                    b.clone(),
                    self.counters.clone(),
                )
            })
            .collect();
        let task = runtime().spawn(
            futures::stream::iter(gets)
                .buffered(DIRECT_CONCURRENCY)
                .try_collect::<Vec<Bytes>>(),
        );
        let bodies = wait(task).and_then(|r| r).map_err(|e| self.err(e))?;
        let item = self.item();
        for ((b, at), body) in reads.iter().zip(bodies) {
            let n = ((b.end - b.start) / item) as usize;
            self.decode(&body, &mut out[*at..*at + n], b.start / item)?;
        }
        Ok(())
    }

    /// Decodes little-endian tokens of the source's dtype with the codec crate's plain
    /// loader, which also refuses stored values that are not token ids (a negative int32);
    /// `first` is the token offset of `src[0]` in the object.
    fn decode(&self, src: &[u8], out: &mut [u32], first: u64) -> Result<(), SourceError> {
        let width = self
            .dtype
            .width()
            .expect("open accepts only int32 and uint16, both plain widths");
        load_plain(width, src, out).map_err(|e| {
            storage_error(
                &self.name,
                io::ErrorKind::InvalidData,
                e.at_base(first).to_string(),
            )
        })
    }
}

/// `NAME: message`, as a storage error.
fn storage_error(name: &str, kind: io::ErrorKind, message: String) -> SourceError {
    SourceError::Storage(StorageError::Io {
        path: PathBuf::from(name),
        source: io::Error::new(kind, message),
    })
}

impl Drop for ObjectSource {
    fn drop(&mut self) {
        self.cancel_stream();
    }
}

impl TokenSource for ObjectSource {
    fn tokens(&self) -> u64 {
        self.size / self.item()
    }

    fn max_token_bound(&self) -> u32 {
        self.dtype.max_token()
    }

    fn read_ranges(&mut self, ranges: &[Range<u64>], out: &mut [u32]) -> Result<(), SourceError> {
        let tokens = self.tokens();
        let mut total = 0u64;
        for r in ranges {
            if r.start > r.end || r.end > tokens {
                return Err(SourceError::Usage(format!(
                    "{}: token range {}..{} is outside the object's {tokens} tokens",
                    self.name, r.start, r.end
                )));
            }
            total += r.end - r.start;
        }
        if (out.len() as u64) < total {
            return Err(SourceError::Usage(
                "read_ranges: the buffer is shorter than the ranges".into(),
            ));
        }
        let item = self.item();
        let mut at = 0usize;
        let mut i = 0;
        while i < ranges.len() {
            let r = &ranges[i];
            let n = (r.end - r.start) as usize;
            let b = r.start * item..r.end * item;
            if n == 0 {
                i += 1;
                continue;
            }
            if self.sequential(b.start) {
                self.read_streamed(b.clone(), &mut out[at..at + n])?;
                self.prev_end = b.end;
                at += n;
                i += 1;
                continue;
            }
            // A run of ranges that do not continue one another: fetch them together.
            self.cancel_stream();
            let mut reads = Vec::new();
            while i < ranges.len() {
                let r = &ranges[i];
                let b = r.start * item..r.end * item;
                if r.is_empty() {
                    i += 1;
                    continue;
                }
                if !reads.is_empty() && self.sequential(b.start) {
                    break;
                }
                reads.push((b.clone(), at));
                at += (r.end - r.start) as usize;
                self.prev_end = b.end;
                i += 1;
            }
            self.read_direct(&reads, out)?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init)] // one-range reads are the point
mod tests {
    use super::*;
    use object_store::memory::InMemory;
    use object_store::PutPayload;

    const MIB: usize = 1 << 20;

    fn tokens(n: usize) -> Vec<u32> {
        // Deterministic, non-trivial, below 2^31.
        (0..n as u32)
            .map(|i| i.wrapping_mul(2_654_435_761) >> 1)
            .collect()
    }

    fn store_with(key: &str, bytes: Vec<u8>) -> Arc<dyn ObjectStore> {
        let store = InMemory::new();
        futures::executor::block_on(store.put(&Path::from(key), PutPayload::from(bytes))).unwrap();
        Arc::new(store)
    }

    fn le_bytes(t: &[u32]) -> Vec<u8> {
        t.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    fn small_readahead() -> Readahead {
        Readahead {
            chunk_bytes: 256 << 10,
            inflight: 4,
        }
    }

    /// A 4 MiB int32 object and its tokens.
    fn source(readahead: Readahead) -> (ObjectSource, Vec<u32>) {
        let t = tokens(MIB);
        let store = store_with("tokens.bin", le_bytes(&t));
        let src =
            ObjectSource::open(store, Path::from("tokens.bin"), DType::I32, readahead).unwrap();
        (src, t)
    }

    fn read(src: &mut ObjectSource, ranges: &[Range<u64>]) -> Result<Vec<u32>, SourceError> {
        let n: u64 = ranges.iter().map(|r| r.end - r.start).sum();
        let mut out = vec![0; n as usize];
        src.read_ranges(ranges, &mut out)?;
        Ok(out)
    }

    fn expected(t: &[u32], ranges: &[Range<u64>]) -> Vec<u32> {
        ranges
            .iter()
            .flat_map(|r| t[r.start as usize..r.end as usize].iter().copied())
            .collect()
    }

    /// Unshuffled samples of `seq_len + 1` tokens from `first`, `batch` to a call.
    fn batches(first: u64, seq_len: u64, batch: usize, total: u64) -> Vec<Vec<Range<u64>>> {
        let mut out = Vec::new();
        let mut cur = Vec::new();
        let mut s = first;
        while s + seq_len < total {
            cur.push(s..s + seq_len + 1);
            s += seq_len;
            if cur.len() == batch {
                out.push(std::mem::take(&mut cur));
            }
        }
        if !cur.is_empty() {
            out.push(cur);
        }
        out
    }

    #[test]
    fn sequential_overlapping_reads_return_the_file() {
        let (mut src, t) = source(small_readahead());
        assert_eq!(src.tokens(), t.len() as u64);
        for ranges in batches(0, 1000, 8, t.len() as u64) {
            assert_eq!(read(&mut src, &ranges).unwrap(), expected(&t, &ranges));
        }
        // The tail that no whole sample covers.
        let last = (t.len() as u64 / 1000) * 1000 - 1000..t.len() as u64;
        assert_eq!(
            read(&mut src, std::slice::from_ref(&last)).unwrap(),
            expected(&t, &[last])
        );
    }

    #[test]
    fn sequential_reads_issue_about_size_over_chunk_gets_and_stop_at_the_end() {
        let ra = small_readahead();
        let (mut src, t) = source(ra);
        let size = (t.len() * 4) as u64;
        for ranges in batches(0, 4095, 4, t.len() as u64) {
            read(&mut src, &ranges).unwrap();
        }
        let s = src.stats();
        assert_eq!(s.heads, 1);
        assert_eq!(s.gets, size.div_ceil(ra.chunk_bytes as u64), "{s:?}");
        assert_eq!(
            s.bytes, size,
            "every byte fetched once, none past the end: {s:?}"
        );
        assert_eq!(s.cancelled, 0);
        assert!(
            s.peak_window_bytes <= ((ra.inflight + 1) * ra.chunk_bytes) as u64,
            "{s:?}"
        );
    }

    #[test]
    fn readahead_requests_inflight_chunks_ahead_of_the_first_read() {
        let ra = small_readahead();
        let (mut src, t) = source(ra);
        assert_eq!(read(&mut src, &[0..10]).unwrap(), t[..10].to_vec());
        assert_eq!(src.stats().gets, ra.inflight as u64);
        // Reads inside the window issue nothing new until a chunk is consumed.
        assert_eq!(read(&mut src, &[9..100]).unwrap(), t[9..100].to_vec());
        assert_eq!(src.stats().gets, ra.inflight as u64);
        let chunk_tokens = (ra.chunk_bytes / 4) as u64;
        let r = 99..chunk_tokens + 1;
        assert_eq!(
            read(&mut src, std::slice::from_ref(&r)).unwrap(),
            expected(&t, &[r])
        );
        assert_eq!(src.stats().gets, ra.inflight as u64 + 1);
    }

    #[test]
    fn shuffled_reads_fetch_only_what_they_need() {
        let (mut src, t) = source(small_readahead());
        // Samples far apart (more than a chunk): one GET each, no readahead.
        let ranges: Vec<Range<u64>> = [700_000u64, 100_000, 900_000, 300_000, 500_000]
            .iter()
            .map(|&s| s..s + 4097)
            .collect();
        assert_eq!(read(&mut src, &ranges).unwrap(), expected(&t, &ranges));
        let s = src.stats();
        assert_eq!((s.gets, s.bytes), (5, 5 * 4097 * 4), "{s:?}");
        // Without readahead, sequential reads are one GET per range too.
        let (mut src, t) = source(Readahead {
            chunk_bytes: 1 << 20,
            inflight: 0,
        });
        let ranges = [0..10, 9..20, 19..30];
        assert_eq!(read(&mut src, &ranges).unwrap(), expected(&t, &ranges));
        assert_eq!(src.stats().gets, 3);
    }

    #[test]
    fn random_ranges() {
        let (mut src, t) = source(small_readahead());
        let n = t.len() as u64;
        let mut x = 12345u64;
        for _ in 0..20 {
            let ranges: Vec<Range<u64>> = (0..8)
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let start = (x >> 33) % (n - 2049);
                    start..start + 2049
                })
                .collect();
            assert_eq!(read(&mut src, &ranges).unwrap(), expected(&t, &ranges));
        }
        // Empty ranges and a range ending at the last token.
        let ranges = [5..5, n - 10..n, 0..0, 3..7];
        assert_eq!(read(&mut src, &ranges).unwrap(), expected(&t, &ranges));
    }

    #[test]
    fn ranges_that_wrap_to_the_start() {
        let ra = small_readahead();
        let (mut src, t) = source(ra);
        let n = t.len() as u64;
        // Two epochs, unshuffled: the end of the first jumps back to 0 inside a batch.
        let seq = 2047;
        let mut all: Vec<Range<u64>> = batches(0, seq, 1, n).into_iter().flatten().collect();
        all.extend(all.clone());
        for ranges in all.chunks(6) {
            assert_eq!(read(&mut src, ranges).unwrap(), expected(&t, ranges));
        }
        let s = src.stats();
        // Readahead resumed after the wrap: about two passes of chunks, plus the one sample
        // fetched directly at the wrap.
        let per_pass = (n * 4).div_ceil(ra.chunk_bytes as u64);
        assert!(s.gets <= 2 * per_pass + 2, "{s:?}");
        assert!(s.bytes <= 2 * n * 4 + 4 * (seq + 1), "{s:?}");
    }

    #[test]
    fn a_range_past_the_end_is_an_error() {
        let (mut src, t) = source(Readahead::default());
        let n = t.len() as u64;
        let err = read(&mut src, &[0..10, n - 5..n + 1]).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "memory:///tokens.bin: token range {}..{} is outside the object's {n} tokens",
                n - 5,
                n + 1
            )
        );
        assert_eq!(src.stats().gets, 0);
    }

    #[test]
    fn a_size_not_a_multiple_of_the_token_size_is_an_error() {
        let store = store_with("odd.bin", vec![0; 4001]);
        let err = ObjectSource::open(
            store,
            Path::from("odd.bin"),
            DType::I32,
            Readahead::default(),
        )
        .err()
        .unwrap();
        assert_eq!(
            err.to_string(),
            "memory:///odd.bin: 4001 bytes is not a whole number of 4-byte int32 tokens"
        );
    }

    #[test]
    fn unsupported_dtype_and_missing_object_are_errors() {
        let store = store_with("f.bin", vec![0; 16]);
        let err = ObjectSource::open(
            store.clone(),
            Path::from("f.bin"),
            DType::F32,
            Readahead::default(),
        )
        .err()
        .unwrap();
        assert_eq!(
            err.to_string(),
            "memory:///f.bin: the S3 baseline reader reads int32 and uint16 tokens, not float32"
        );
        let err = ObjectSource::open(
            store,
            Path::from("nope.bin"),
            DType::I32,
            Readahead::default(),
        )
        .err()
        .unwrap();
        assert!(
            err.to_string().starts_with("memory:///nope.bin: HEAD: "),
            "{err}"
        );
    }

    #[test]
    fn a_negative_int32_is_an_error() {
        let mut t = tokens(1000);
        t[123] = (-5i32) as u32;
        let store = store_with("neg.bin", le_bytes(&t));
        for ra in [
            Readahead::default(),
            Readahead {
                chunk_bytes: 64,
                inflight: 0,
            },
        ] {
            let mut src =
                ObjectSource::open(store.clone(), Path::from("neg.bin"), DType::I32, ra).unwrap();
            assert_eq!(read(&mut src, &[0..100]).unwrap(), t[..100].to_vec());
            let err = read(&mut src, &[100..200]).unwrap_err();
            assert_eq!(
                err.to_string(),
                "memory:///neg.bin: stored value -5 at offset 123 is not a token id (i32 data must hold 0..=4294967295)"
            );
        }
    }

    #[test]
    fn uint16_tokens() {
        let t: Vec<u16> = (0..100_000u32).map(|i| (i * 7919) as u16).collect();
        let bytes: Vec<u8> = t.iter().flat_map(|v| v.to_le_bytes()).collect();
        let store = store_with("u16.bin", bytes);
        let mut src = ObjectSource::open(
            store,
            Path::from("u16.bin"),
            DType::U16,
            Readahead {
                chunk_bytes: 10_001,
                inflight: 2,
            },
        )
        .unwrap();
        assert_eq!(src.tokens(), 100_000);
        let want = |r: Range<u64>| {
            t[r.start as usize..r.end as usize]
                .iter()
                .map(|&v| v as u32)
        };
        for ranges in batches(0, 511, 4, 100_000) {
            let w: Vec<u32> = ranges.iter().flat_map(|r| want(r.clone())).collect();
            assert_eq!(read(&mut src, &ranges).unwrap(), w);
        }
        assert_eq!(src.stats().bytes, 200_000);
    }

    /// Reads an object from a real S3-compatible server. Needs `DQUANT_S3_ENDPOINT` (e.g.
    /// `http://127.0.0.1:9000`); `DQUANT_S3_BUCKET` (an existing bucket, default `lab`),
    /// `DQUANT_S3_ACCESS_KEY`/`DQUANT_S3_SECRET_KEY` (default `AK`/`SK`), `DQUANT_S3_MB`
    /// (default 200), `DQUANT_S3_CHUNK_KB` and `DQUANT_S3_INFLIGHT` (default readahead) are
    /// optional. Puts a generated object (by PUT: s3s-fs hashes the whole file on every GET of
    /// a file it did not store itself), reads it back sequentially and prints the throughput.
    #[test]
    #[ignore = "needs an S3-compatible server (s3s-fs)"]
    fn real_server_sequential_throughput() {
        let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_string());
        let cfg = S3Config {
            endpoint: std::env::var("DQUANT_S3_ENDPOINT").expect("DQUANT_S3_ENDPOINT"),
            bucket: env("DQUANT_S3_BUCKET", "lab"),
            access_key: env("DQUANT_S3_ACCESS_KEY", "AK"),
            secret_key: env("DQUANT_S3_SECRET_KEY", "SK"),
            region: "us-east-1".into(),
        };
        let mb: usize = env("DQUANT_S3_MB", "200").parse().unwrap();
        let store = s3_store(&cfg).unwrap();
        let t = tokens(mb * MIB / 4);
        let key = Path::from("dquant-s3-test/tokens.bin");
        let payload = PutPayload::from(le_bytes(&t));
        runtime().block_on(store.put(&key, payload)).expect("put");
        let d = Readahead::default();
        let ra = Readahead {
            chunk_bytes: env("DQUANT_S3_CHUNK_KB", &(d.chunk_bytes >> 10).to_string())
                .parse::<usize>()
                .unwrap()
                << 10,
            inflight: env("DQUANT_S3_INFLIGHT", &d.inflight.to_string())
                .parse()
                .unwrap(),
        };
        let mut src = ObjectSource::open(store.clone(), key.clone(), DType::I32, ra).unwrap();
        assert_eq!(src.name(), format!("s3://{}/{key}", cfg.bucket));
        let started = std::time::Instant::now();
        let mut out = Vec::new();
        for ranges in batches(0, 8191, 8, t.len() as u64) {
            let n = ranges.iter().map(|r| r.end - r.start).sum::<u64>() as usize;
            out.resize(n, 0);
            src.read_ranges(&ranges, &mut out).unwrap();
            assert_eq!(out, expected(&t, &ranges));
        }
        let secs = started.elapsed().as_secs_f64();
        let s = src.stats();
        eprintln!(
            "{} with {ra:?}: {} MB in {secs:.3} s = {:.0} MB/s ({s:?})",
            src.name(),
            s.bytes as f64 / 1e6,
            s.bytes as f64 / 1e6 / secs
        );
        assert_eq!(s.bytes, (t.len() * 4) as u64);
        // A random read too, past the readahead.
        let r = [1000..3000, 5..9];
        assert_eq!(read(&mut src, &r).unwrap(), expected(&t, &r));
        if std::env::var_os("DQUANT_S3_KEEP").is_none() {
            runtime().block_on(store.delete(&key)).unwrap();
        }
    }
}
