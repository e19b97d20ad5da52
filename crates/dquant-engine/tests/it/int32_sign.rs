//! A negative value in an int32 file fails the batch that meets it with the read's own
//! message (its file, value and offset), whether the batch is narrowed by
//! `next_batch_into` (whose reads leave the sign check to the narrowing, `SignCheck`) or read
//! and checked by `next_batch_checked` (whose reads check it); the batches before it are the
//! same bytes either way.

use std::path::Path;

use dquant_codec::Width;
use dquant_engine::{LocalSource, Pipeline, TokenSource};
use dquant_format::{DType, DocIndexBuilder};
use dquant_plan::{Cursor, OutputDType, Plan, Source};
use dquant_storage::{DatasetWriter, OutputFormat};

use crate::common::narrow_all;

/// A Megatron int32 dataset of 64 documents of 300 ids under 50,000, with `bad` stored at
/// token `at` (as the file's bytes, so it may be negative).
fn int32_with(dir: &Path, at: usize, bad: i32) -> String {
    let path = dir.join("a");
    let mut w = DatasetWriter::create(&path, OutputFormat::Megatron { dtype: DType::I32 }).unwrap();
    let mut ix = DocIndexBuilder::new();
    for d in 0..64u32 {
        let doc: Vec<u32> = (0..300)
            .map(|i| (d * 7919 + i * 104_729) % 50_000)
            .collect();
        w.push(&doc).unwrap();
        ix.push_document(300);
    }
    w.finish(&ix.finish()).unwrap();
    let bin = dir.join("a.bin");
    let mut b = std::fs::read(&bin).unwrap();
    b[4 * at..4 * at + 4].copy_from_slice(&bad.to_le_bytes());
    std::fs::write(&bin, b).unwrap();
    path.display().to_string()
}

fn pipeline(path: &str, output: OutputDType) -> Pipeline {
    let mut p = Plan::new(vec![Source::new(path.to_string())], 127, 4);
    p.output = output;
    Pipeline::open(&p, Cursor::START, |_, s| {
        Ok(Box::new(LocalSource::open(Path::new(&s.uri), s)?) as Box<dyn TokenSource>)
    })
    .unwrap()
}

/// The batches `next_batch_into` narrows into `output`, until the end or the first error.
fn narrowed(path: &str, output: OutputDType) -> (Vec<Vec<u8>>, Option<String>) {
    let (all, err) = narrow_all(&mut pipeline(path, output), output.width());
    (all.into_iter().map(|(bytes, _)| bytes).collect(), err)
}

/// The same batches read by `next_batch_checked` and stored at `output`'s width.
fn checked(path: &str, output: OutputDType) -> (Vec<Vec<u8>>, Option<String>) {
    let mut pipe = pipeline(path, output);
    let width: Width = output.width();
    let mut all = Vec::new();
    loop {
        match pipe.next_batch_checked(width) {
            Ok(Some(b)) => {
                let mut out = vec![0u8; width.encoded_len(b.tokens.len())];
                dquant_codec::encode_width(width, b.tokens, &mut out).unwrap();
                all.push(out);
            }
            Ok(None) => return (all, None),
            Err(e) => return (all, Some(e.to_string())),
        }
    }
}

#[test]
fn a_negative_int32_fails_its_batch_as_the_read_names_it_on_every_path() {
    let dir = tempfile::tempdir().unwrap();
    // In the plan's 10th sample or so (127-token samples, packed), past the first batches.
    let path = int32_with(dir.path(), 5_000, -7);
    let file = dir.path().join("a.bin");
    let want = format!(
        "{}: stored value -7 at offset 5000 is not a token id (i32 data must hold 0..=4294967295)",
        file.display()
    );
    for output in [OutputDType::U16, OutputDType::I32, OutputDType::I64] {
        let (got, err) = narrowed(&path, output);
        let (want_batches, want_err) = checked(&path, output);
        let err = err.unwrap_or_else(|| panic!("{output:?}: no error"));
        assert!(err.contains(&want), "{output:?}: {err}");
        assert_eq!(Some(&err), want_err.as_ref(), "{output:?}");
        assert!(
            !got.is_empty(),
            "{output:?}: the error came at the first batch"
        );
        assert!(
            got == want_batches,
            "{output:?}: the batches before it differ"
        );
    }
}

#[test]
fn without_a_negative_value_the_narrowed_batches_are_the_checked_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = int32_with(dir.path(), 5_000, 49_999);
    for output in [OutputDType::U16, OutputDType::I32, OutputDType::I64] {
        let (got, err) = narrowed(&path, output);
        let (want, want_err) = checked(&path, output);
        assert_eq!((err, want_err), (None, None), "{output:?}");
        assert!(got.len() > 20, "{output:?}: {} batches", got.len());
        assert!(got == want, "{output:?}: batches differ");
    }
}
