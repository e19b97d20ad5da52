//! A failing disk, through the debug-only fault wrappers (`dquant_storage::faulty`): the
//! wrapped root still passes the conformance suite; EIO and an object that ends early reach
//! the reader as errors naming the object, once, never as wrong tokens; a full disk fails a
//! write and leaves nothing under the output's name, nor any temporary file.
#![cfg(debug_assertions)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use dquant_format::{DType, DocIndexBuilder};
use dquant_storage::conformance;
use dquant_storage::faulty::{FaultyDestination, FaultyRoot, StorageFault, StorageFaults};
use dquant_storage::{
    Dataset, DatasetWriter, InMemoryRoot, LocalFiles, LocalRoot, OpenOptions, OutputFormat, Root,
};

/// Every object of the suite's roots goes through the wrapper (each read "slowed" by 0 s),
/// so the suite checks the wrapped reads, not the inner root's.
#[test]
fn a_faulty_root_conforms() {
    conformance::run(&|objects| {
        let faults = StorageFaults::default();
        for (name, _) in objects {
            faults.arm(StorageFault::Slow {
                object: name.to_string(),
                nth: 0,
                reads: u64::MAX,
                delay: Duration::ZERO,
            });
        }
        let inner: Arc<dyn Root> = Arc::new(InMemoryRoot::from_objects(objects).unwrap());
        Box::new(FaultyRoot::new(inner, faults))
    });
}

/// A Megatron dataset `m` of 4,000 int32 tokens (`i * 7 % 1000`) in `dir`.
fn write_m(dir: &Path) -> Vec<u32> {
    let tokens: Vec<u32> = (0..4000).map(|i| i * 7 % 1000).collect();
    let mut w = DatasetWriter::create(&dir.join("m"), OutputFormat::Megatron { dtype: DType::I32 })
        .unwrap();
    w.push(&tokens).unwrap();
    let mut ix = DocIndexBuilder::new();
    ix.push_document(tokens.len() as u64);
    w.finish(&ix.finish()).unwrap();
    tokens
}

/// Reads `m` in 1,000-token ranges, twice over, with `fault` armed: each range's tokens or
/// its error.
fn read_with(fault: StorageFault) -> (Vec<u32>, Vec<Result<Vec<u32>, String>>) {
    let dir = tempfile::tempdir().unwrap();
    let want = write_m(dir.path());
    let faults = StorageFaults::default();
    faults.arm(fault);
    let root = FaultyRoot::new(
        Arc::new(LocalRoot::new(dir.path()).unwrap()),
        faults.clone(),
    );
    let ds = Dataset::open_in(&root, "m", &OpenOptions::default()).unwrap();
    let mut reader = ds.reader();
    let got = (0..8u64)
        .map(|i| {
            let at = i % 4 * 1000;
            let mut out = Vec::new();
            reader
                .read(at..at + 1000, &mut out)
                .map(|()| out)
                .map_err(|e| e.to_string())
        })
        .collect();
    assert_eq!(faults.armed(), 0, "the fault fired");
    (want, got)
}

/// The one failed read is the `nth`; every other range has its tokens.
fn check(want: &[u32], got: &[Result<Vec<u32>, String>], nth: usize) -> String {
    let mut error = None;
    for (i, r) in got.iter().enumerate() {
        let at = i % 4 * 1000;
        match r {
            Ok(t) => assert_eq!(t, &want[at..at + 1000], "range {i}"),
            Err(e) if i == nth => error = Some(e.clone()),
            Err(e) => panic!("range {i} failed too: {e}"),
        }
    }
    error.expect("the faulty read failed")
}

#[test]
fn eio_is_an_error_naming_the_object_once() {
    let (want, got) = read_with(StorageFault::ReadError {
        object: "m.bin".into(),
        nth: 2,
    });
    assert_eq!(
        check(&want, &got, 2),
        "m.bin: Input/output error (os error 5)"
    );
}

#[test]
fn an_object_ending_early_is_an_error_naming_the_object_once() {
    let (want, got) = read_with(StorageFault::ShortRead {
        object: "m.bin".into(),
        nth: 5,
    });
    let e = check(&want, &got, 5);
    assert!(e.starts_with("m.bin: "), "{e}");
}

#[test]
fn slow_reads_give_the_same_tokens() {
    let (want, got) = read_with(StorageFault::Slow {
        object: "m.bin".into(),
        nth: 1,
        reads: 3,
        delay: Duration::from_millis(20),
    });
    let got: Vec<u32> = got.into_iter().flat_map(Result::unwrap).collect();
    assert_eq!(got, [&want[..], &want[..]].concat());
}

/// ENOSPC half-way through the `.bin`: the write fails naming the file and the disk's error,
/// and the directory is left as it was (no output, no temporary file).
#[test]
fn a_full_disk_fails_the_write_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let bin = format!("{}.bin", out.display());
    let faults = StorageFaults::default();
    faults.arm(StorageFault::NoSpace {
        object: bin.clone(),
        after: 3 << 20,
    });
    let to = Arc::new(FaultyDestination::new(LocalFiles, faults));
    let format = OutputFormat::Megatron { dtype: DType::I32 };
    let mut w = DatasetWriter::create_in(to, &out, format).unwrap();
    let chunk: Vec<u32> = (0..1u32 << 18).collect();
    let failed = (0..8).find_map(|_| w.push(&chunk).err());
    let e = match failed {
        Some(e) => {
            drop(w);
            e.to_string()
        }
        None => {
            let mut ix = DocIndexBuilder::new();
            ix.push_document(8 << 18);
            w.finish(&ix.finish()).unwrap_err().to_string()
        }
    };
    assert_eq!(e, format!("{bin}: No space left on device (os error 28)"));
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
