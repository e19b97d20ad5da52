//! A batch read on a [`WorkerPool`] is the batch read one sample after another: the same bytes,
//! batch by batch, the same cursors, for shuffled and unshuffled plans, on the stored path
//! (uint16 bytes copied into a `u16` batch) and the token path (int32 and block files), with
//! the reads really spread over several threads. A file truncated under pooled reads gives
//! the session the error sequential reads give (naming the source), never a crash. A pool
//! takes only reads slow enough to pay for their hand-off: page-cache reads stay on the
//! session's thread, slow ones are spread.

use std::collections::HashSet;
use std::io::IoSliceMut;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::Duration;

use dquant_codec::Width;
use dquant_engine::{
    BatchInfo, BatchReads, EngineError, LocalSource, Pipeline, SharedReads, SourceError,
    TokenSource, WorkerPool,
};
use dquant_format::block::{block_tokens_for, DEFAULT_BLOCK_BYTES};
use dquant_plan::{Cursor, OutputDType, Plan, Source};
use dquant_storage::{Dataset, DatasetWriter, OpenOptions, OutputFormat, ReadBuffers};

/// A local source that records which threads made its shared reads, each read taking at
/// least `delay` (slow storage).
struct Spy {
    inner: LocalSource,
    threads: Arc<Mutex<HashSet<ThreadId>>>,
    delay: Duration,
}

impl Spy {
    fn saw(&self) {
        let mut t = self.threads.lock().unwrap();
        t.insert(std::thread::current().id());
        drop(t);
        self.wait();
    }

    fn wait(&self) {
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
    }
}

impl TokenSource for Spy {
    fn tokens(&self) -> u64 {
        self.inner.tokens()
    }
    fn max_token_bound(&self) -> u32 {
        self.inner.max_token_bound()
    }
    fn read_ranges(&mut self, ranges: &[Range<u64>], out: &mut [u32]) -> Result<(), SourceError> {
        self.wait();
        self.inner.read_ranges(ranges, out)
    }
    fn stored_width(&self) -> Option<Width> {
        self.inner.stored_width()
    }
    fn read_stored(&mut self, start: u64, bufs: &mut [IoSliceMut<'_>]) -> Result<(), SourceError> {
        self.wait();
        self.inner.read_stored(start, bufs)
    }
    fn shared_reads(&self) -> Option<&dyn SharedReads> {
        Some(self)
    }
}

impl SharedReads for Spy {
    fn read_stored_at(&self, start: u64, bufs: &mut [IoSliceMut<'_>]) -> Result<(), SourceError> {
        self.saw();
        self.inner.dataset().read_stored_at(start, bufs)
    }
    fn read_range(
        &self,
        range: Range<u64>,
        out: &mut [u32],
        bufs: &mut ReadBuffers,
    ) -> Result<(), SourceError> {
        self.saw();
        self.inner.dataset().read_range(range, out, bufs)
    }
    fn read_ranges_at(
        &self,
        ranges: &[Range<u64>],
        out: &mut [u32],
        bufs: &mut ReadBuffers,
    ) -> Result<(), SourceError> {
        self.saw();
        self.inner.dataset().read_ranges_at(ranges, out, bufs)
    }
}

fn fixture(name: &str) -> PathBuf {
    dquant_testkit::fixture(name)
}

/// The int32 fixture written again as zstd blocks small enough that samples share them.
fn block_copy(dir: &Path) -> PathBuf {
    let dst = dir.join("r50k.dqb");
    let ds = Dataset::open(&fixture("r50k_int32"), &OpenOptions::default()).unwrap();
    let codec = "u16+zstd:3".parse().unwrap();
    let mut w = DatasetWriter::create(
        &dst,
        OutputFormat::Block {
            codec,
            block_tokens: block_tokens_for(Width::U16, DEFAULT_BLOCK_BYTES / 16),
            vocab_size: 0,
        },
    )
    .unwrap();
    ds.scan(1 << 16, |_, t| w.push(t)).unwrap();
    w.finish(ds.index().unwrap()).unwrap();
    dst
}

fn plan(paths: &[&Path], shuffle: bool, output: OutputDType) -> Plan {
    let sources = paths
        .iter()
        .enumerate()
        .map(|(i, p)| Source::new(p.display().to_string()).weight(1.0 + i as f64))
        .collect();
    let mut p = Plan::new(sources, 1023, 16);
    p.seed = 7;
    p.shuffle = shuffle;
    p.output = output;
    p
}

/// A pipeline over `plan`, on `pool` when given; also the threads that made shared reads.
fn open(plan: &Plan, pool: Option<Arc<WorkerPool>>) -> (Pipeline, Arc<Mutex<HashSet<ThreadId>>>) {
    open_slow(plan, pool, Duration::ZERO)
}

/// [`open`] over sources whose every read takes at least `delay`.
fn open_slow(
    plan: &Plan,
    pool: Option<Arc<WorkerPool>>,
    delay: Duration,
) -> (Pipeline, Arc<Mutex<HashSet<ThreadId>>>) {
    let threads = Arc::new(Mutex::new(HashSet::new()));
    let t = threads.clone();
    let mut p = Pipeline::open(plan, Cursor::START, |_, s| {
        let inner = LocalSource::open(Path::new(&s.uri), s)?;
        Ok(Box::new(Spy {
            inner,
            threads: t.clone(),
            delay,
        }) as Box<dyn TokenSource>)
    })
    .unwrap();
    p.set_worker_pool(pool);
    (p, threads)
}

/// Every batch of the stored path: its bytes and where it sits.
fn stored_batches(p: &mut Pipeline) -> Vec<(Vec<u8>, BatchInfo)> {
    let mut out = vec![0u8; 16 * p.sample_len() * 2];
    let mut all = Vec::new();
    while let Some(info) = p.next_batch_into(Width::U16, &mut out).unwrap() {
        let n = info.samples * p.sample_len() * 2;
        all.push((out[..n].to_vec(), info));
    }
    all
}

/// Every batch of the token path: its tokens and cursor.
fn token_batches(p: &mut Pipeline) -> Vec<(Vec<u32>, Cursor)> {
    let mut all = Vec::new();
    while let Some(b) = p.next_batch().unwrap() {
        all.push((b.tokens.to_vec(), b.cursor));
    }
    all
}

/// Two workers that take a share of every batch, however fast its reads.
fn pool() -> Option<Arc<WorkerPool>> {
    Some(Arc::new(
        WorkerPool::new(2).unwrap().min_share_of(Duration::ZERO),
    ))
}

#[test]
fn pooled_stored_reads_equal_sequential_ones() {
    let u16 = fixture("r50k_uint16");
    for shuffle in [true, false] {
        let p = plan(&[&u16, &u16], shuffle, OutputDType::U16);
        let (mut seq, seen) = open(&p, None);
        let a = stored_batches(&mut seq);
        assert!(seen.lock().unwrap().is_empty(), "no pool, no shared reads");
        let (mut par, seen) = open(&p, pool());
        let b = stored_batches(&mut par);
        assert!(a.len() > 5, "{} batches", a.len());
        assert!(a == b, "shuffle={shuffle}: pooled batches differ");
        let threads = seen.lock().unwrap().len();
        assert!(
            threads >= 2,
            "shuffle={shuffle}: reads ran on {threads} thread(s)"
        );
        // And both are the tokens themselves (the token path, decoded one sample at a time).
        let tokens = token_batches(&mut open(&p, None).0);
        assert_eq!(tokens.len(), a.len());
        for ((t, cursor), (bytes, info)) in tokens.iter().zip(&a) {
            let want: Vec<u8> = t.iter().flat_map(|&x| (x as u16).to_le_bytes()).collect();
            assert!(
                &want == bytes,
                "shuffle={shuffle}: batch {} differs",
                info.index
            );
            assert_eq!(cursor, &info.cursor);
        }
    }
}

#[test]
fn pooled_token_reads_equal_sequential_ones_for_int32_and_block_files() {
    let dir = tempfile::tempdir().unwrap();
    let dqb = block_copy(dir.path());
    let i32 = fixture("r50k_int32");
    for shuffle in [true, false] {
        let p = plan(&[&i32, &dqb], shuffle, OutputDType::I32);
        let a = token_batches(&mut open(&p, None).0);
        let (mut par, seen) = open(&p, pool());
        let b = token_batches(&mut par);
        assert!(a.len() > 5, "{} batches", a.len());
        assert!(a == b, "shuffle={shuffle}: pooled batches differ");
        assert!(seen.lock().unwrap().len() >= 2, "shuffle={shuffle}");
    }
}

#[test]
fn a_file_truncated_under_pooled_reads_is_an_error_naming_the_source() {
    let dir = tempfile::tempdir().unwrap();
    for (ext, _) in [("bin", 0), ("idx", 1)] {
        std::fs::copy(
            fixture("r50k_int32").with_extension(ext),
            dir.path().join(format!("d.{ext}")),
        )
        .unwrap();
    }
    let path = dir.path().join("d");
    let p = plan(&[&path], true, OutputDType::I32);
    let (mut par, _) = open(&p, pool());
    let (mut seq, _) = open(&p, None);
    par.next_batch().unwrap();
    seq.next_batch().unwrap();
    let bin = std::fs::OpenOptions::new()
        .write(true)
        .open(path.with_extension("bin"))
        .unwrap();
    bin.set_len(4096).unwrap();
    let first_error = |pl: &mut Pipeline| -> EngineError {
        loop {
            match pl.next_batch() {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("the stream ended over a truncated file"),
                Err(e) => break e,
            }
        }
    };
    let msg = first_error(&mut par).to_string();
    // The same read fails first with and without the pool: the same message.
    assert_eq!(msg, first_error(&mut seq).to_string());
    assert!(
        msg.starts_with(&format!("sources[0] ({})", path.display())),
        "{msg}"
    );
    assert!(
        msg.contains("it was truncated or rewritten while being read"),
        "{msg}"
    );
}

/// The pool's default: a batch is spread only when its reads, timed as they go, are slow
/// enough for each share to take the minimum (200 µs). Reads of 2 ms each are; with a
/// minimum no read reaches, every batch stays on the session's thread. The batches are the
/// same every way.
#[test]
fn a_pool_takes_only_reads_slow_enough_to_pay_for_it() {
    let u16 = fixture("r50k_uint16");
    let i32 = fixture("r50k_int32");
    let slow = Duration::from_millis(2);
    for (paths, output) in [
        (vec![&u16, &u16], OutputDType::U16),
        (vec![&i32, &u16], OutputDType::I32),
    ] {
        let mut p = plan(
            &paths.iter().map(|p| p.as_path()).collect::<Vec<_>>(),
            true,
            output,
        );
        p.samples = Some(16 * 6);
        let batches = |pl: &mut Pipeline| match output {
            OutputDType::U16 => stored_batches(pl).into_iter().map(|(b, _)| b).collect(),
            _ => token_batches(pl)
                .into_iter()
                .map(|(t, _)| t.iter().flat_map(|x| x.to_le_bytes()).collect())
                .collect::<Vec<Vec<u8>>>(),
        };
        let (mut alone, _) = open(&p, None);
        let want = batches(&mut alone);
        assert_eq!(want.len(), 6);
        assert_eq!(
            alone.batch_reads(),
            BatchReads::default(),
            "no pool, nothing counted"
        );

        let default = Some(Arc::new(WorkerPool::new(2).unwrap()));
        let (mut pl, seen) = open_slow(&p, default, slow);
        assert!(batches(&mut pl) == want, "{output:?}: slow, default pool");
        let threads = seen.lock().unwrap().len();
        assert!(
            threads >= 2,
            "{output:?}: slow reads ran on {threads} thread(s)"
        );
        // The first batch alone (nothing measured yet), the other five spread.
        let counted = BatchReads {
            alone: 1,
            spread: 5,
        };
        assert_eq!(pl.batch_reads(), counted, "{output:?}");

        let never = WorkerPool::new(2)
            .unwrap()
            .min_share_of(Duration::from_secs(3600));
        let (mut pl, seen) = open_slow(&p, Some(Arc::new(never)), slow);
        assert!(
            batches(&mut pl) == want,
            "{output:?}: slow, an hour's minimum"
        );
        assert!(
            seen.lock().unwrap().is_empty(),
            "{output:?}: reads left the session's thread"
        );
        let counted = BatchReads {
            alone: 6,
            spread: 0,
        };
        assert_eq!(pl.batch_reads(), counted, "{output:?}");
    }
}
