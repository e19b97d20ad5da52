//! Batches narrowed straight from maps kept with their datasets (`LocalSource::keeping_map`,
//! an agent's `map_budget`) are the batches read and narrowed the usual way: the same bytes and
//! cursors for every output, shuffled or not, with the map really used for every batch; a
//! token that does not fit fails at the same batch with the same error; a uint16 file is
//! copied (or widened) from its map as a read would; a source without a map (a block file)
//! sends the whole pipeline back to the usual reads.

use std::io::IoSliceMut;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use dquant_codec::Width;
use dquant_engine::{BatchInfo, LocalSource, Pipeline, SourceError, TokenSource};
use dquant_format::{DType, DocIndexBuilder};
use dquant_plan::{Cursor, OutputDType, Plan, Source};
use dquant_storage::{DatasetWriter, MapBudget, OutputFormat};

use crate::common::narrow_all;

/// A local source that counts the batches' samples it narrowed from its kept map, and the
/// calls that narrowed them.
struct Counted {
    inner: LocalSource,
    narrowed: Arc<[AtomicUsize; 2]>,
}

impl TokenSource for Counted {
    fn tokens(&self) -> u64 {
        self.inner.tokens()
    }
    fn max_token_bound(&self) -> u32 {
        self.inner.max_token_bound()
    }
    fn read_ranges(&mut self, ranges: &[Range<u64>], out: &mut [u32]) -> Result<(), SourceError> {
        self.inner.read_ranges(ranges, out)
    }
    fn stored_width(&self) -> Option<Width> {
        self.inner.stored_width()
    }
    fn read_stored(&mut self, start: u64, bufs: &mut [IoSliceMut<'_>]) -> Result<(), SourceError> {
        self.inner.read_stored(start, bufs)
    }
    fn narrow_kept(&self, ranges: &[Range<u64>], width: Width, out: &mut [u8]) -> bool {
        let done = self.inner.narrow_kept(ranges, width, out);
        if done {
            self.narrowed[0].fetch_add(ranges.len(), Ordering::Relaxed);
            self.narrowed[1].fetch_add(1, Ordering::Relaxed);
        }
        done
    }
}

/// A Megatron int32 dataset of 200 documents whose ids stay under `max` (one `big` id in the
/// middle of the file, when given).
fn int32(dir: &Path, name: &str, max: u32, big: Option<u32>) -> String {
    megatron(dir, name, DType::I32, max, big)
}

/// A Megatron dataset of `dtype` as [`int32`] describes.
fn megatron(dir: &Path, name: &str, dtype: DType, max: u32, big: Option<u32>) -> String {
    let path = dir.join(name);
    let mut w = DatasetWriter::create(&path, OutputFormat::Megatron { dtype }).unwrap();
    let mut ix = DocIndexBuilder::new();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for d in 0..200 {
        let n = 100 + (d * 37) % 900;
        let doc: Vec<u32> = (0..n)
            .map(|i| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                match big {
                    Some(b) if d == 100 && i == 7 => b,
                    _ => (x >> 33) as u32 % max,
                }
            })
            .collect();
        w.push(&doc).unwrap();
        ix.push_document(n as u64);
    }
    w.finish(&ix.finish()).unwrap();
    path.display().to_string()
}

fn plan(paths: &[&str], shuffle: bool, output: OutputDType) -> Plan {
    let sources = paths
        .iter()
        .enumerate()
        .map(|(i, p)| Source::new(p.to_string()).weight(1.0 + i as f64))
        .collect();
    let mut p = Plan::new(sources, 255, 8);
    p.seed = 11;
    p.shuffle = shuffle;
    p.output = output;
    p
}

/// Every batch `next_batch_into` writes (its bytes and where it sits), until the end or the
/// first error (its message); and how many samples came from kept maps, in how many calls.
type Run = (Vec<(Vec<u8>, BatchInfo)>, Option<String>, [usize; 2]);

fn batches(p: &Plan, keep: bool) -> Run {
    let narrowed = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let n = narrowed.clone();
    let mut pipe = Pipeline::open(p, Cursor::START, |_, s| {
        let inner =
            LocalSource::open(Path::new(&s.uri), s)?.keeping_map(keep.then(MapBudget::unlimited));
        Ok(Box::new(Counted {
            inner,
            narrowed: n.clone(),
        }) as Box<dyn TokenSource>)
    })
    .unwrap();
    let (all, err) = narrow_all(&mut pipe, p.output.width());
    let [samples, calls] = &*narrowed;
    let counts = [samples, calls].map(|c| c.load(Ordering::Relaxed));
    (all, err, counts)
}

#[test]
fn batches_from_kept_maps_equal_read_and_narrowed_ones() {
    let dir = tempfile::tempdir().unwrap();
    let a = int32(dir.path(), "a", 60_000, None);
    let b = int32(dir.path(), "b", 50_000, None);
    for shuffle in [true, false] {
        for output in [OutputDType::U16, OutputDType::I32, OutputDType::I64] {
            let p = plan(&[&a, &b], shuffle, output);
            let (want, err, none) = batches(&p, false);
            assert_eq!((err, none), (None, [0, 0]));
            let (got, err, [narrowed, calls]) = batches(&p, true);
            assert_eq!(err, None);
            assert!(want.len() > 10, "{} batches", want.len());
            assert!(got == want, "shuffle={shuffle} {output:?}: batches differ");
            let samples: usize = want.iter().map(|(_, i)| i.samples).sum();
            assert_eq!(narrowed, samples, "every sample from the kept maps");
            // Weights 1 and 2: runs of two samples of `b` come in one call.
            assert!(calls < samples, "{calls} calls for {samples} samples");
        }
    }
}

#[test]
fn a_batch_of_one_source_is_narrowed_in_one_call() {
    // One call a batch: the source prefetches each next sample's first lines while it
    // narrows the one before (shuffled samples lie far apart).
    let dir = tempfile::tempdir().unwrap();
    let a = int32(dir.path(), "a", 60_000, None);
    for shuffle in [true, false] {
        let p = plan(&[&a], shuffle, OutputDType::U16);
        let (want, _, _) = batches(&p, false);
        let (got, err, [narrowed, calls]) = batches(&p, true);
        assert_eq!(err, None);
        assert!(got == want, "shuffle={shuffle}: batches differ");
        let samples: usize = want.iter().map(|(_, i)| i.samples).sum();
        assert_eq!(
            (narrowed, calls),
            (samples, want.len()),
            "shuffle={shuffle}"
        );
    }
}

#[test]
fn a_token_that_does_not_fit_fails_where_and_as_the_usual_read_fails() {
    let dir = tempfile::tempdir().unwrap();
    let a = int32(dir.path(), "a", 60_000, Some(70_000));
    let p = plan(&[&a], false, OutputDType::U16);
    let (want, err, _) = batches(&p, false);
    let err = err.expect("the usual read fails");
    assert!(err.contains("70000"), "{err}");
    let (got, got_err, [narrowed, _]) = batches(&p, true);
    assert!(got == want, "the batches before the error differ");
    assert_eq!(got_err.as_deref(), Some(err.as_str()));
    assert!(narrowed > 0, "the batches before it came from the map");
}

#[test]
fn a_uint16_file_is_copied_from_its_map_as_it_is_read() {
    // Into u16 each sample is a copy out of the map (the pipeline's stored-width path), into
    // wider outputs a widening: the bytes a read gives, from the map every time.
    let dir = tempfile::tempdir().unwrap();
    let a = megatron(dir.path(), "a", DType::U16, 65_535, None);
    let b = megatron(dir.path(), "b", DType::U16, 50_000, None);
    for shuffle in [true, false] {
        for output in [OutputDType::U16, OutputDType::I32, OutputDType::I64] {
            let p = plan(&[&a, &b], shuffle, output);
            let (want, err, none) = batches(&p, false);
            assert_eq!((err, none), (None, [0, 0]));
            let (got, err, [narrowed, _]) = batches(&p, true);
            assert_eq!(err, None);
            assert!(want.len() > 10, "{} batches", want.len());
            assert!(got == want, "shuffle={shuffle} {output:?}: batches differ");
            let samples: usize = want.iter().map(|(_, i)| i.samples).sum();
            assert_eq!(narrowed, samples, "every sample from the kept maps");
        }
    }
}

/// The dataset at `src` written again as a block file (which keeps no map).
fn block_copy(src: &str, dst: &Path) -> String {
    let opts = dquant_storage::OpenOptions::default();
    let ds = dquant_storage::Dataset::open(Path::new(src), &opts).unwrap();
    let format = OutputFormat::Block {
        codec: "u16+zstd:3".parse().unwrap(),
        block_tokens: 4096,
        vocab_size: 0,
    };
    let mut w = DatasetWriter::create(dst, format).unwrap();
    ds.scan(1 << 16, |_, t| w.push(t)).unwrap();
    w.finish(ds.index().unwrap()).unwrap();
    dst.display().to_string()
}

#[test]
fn a_source_without_a_map_sends_the_pipeline_back_to_the_usual_reads() {
    let dir = tempfile::tempdir().unwrap();
    let a = int32(dir.path(), "a", 60_000, None);
    let blocks = block_copy(
        &int32(dir.path(), "b", 50_000, None),
        &dir.path().join("b.dqb"),
    );
    let p = plan(&[&a, &blocks], true, OutputDType::I32);
    let (want, _, _) = batches(&p, false);
    let (got, err, [narrowed, _]) = batches(&p, true);
    assert_eq!(err, None);
    assert!(got == want, "batches differ");
    // At most the first batch's int32 samples before the uint16 source declined.
    assert!(
        narrowed < 8,
        "{narrowed} samples narrowed after a source declined"
    );
}
