//! A Megatron `.bin` with a chunk sums sidecar (`PREFIX.dqsum`): reads of good bytes are
//! unchanged, a read that meets a flipped bit fails naming the chunk and the sidecar (every
//! read path: tokens, stored bytes, under a root and by path), reads elsewhere go on, and a
//! sidecar that does not fit its `.bin` fails the open with a message that says so.

use std::io::IoSliceMut;
use std::path::{Path, PathBuf};

use dquant_format::chunk_sums::{ChunkSums, MIN_CHUNK};
use dquant_storage::{Dataset, LocalRoot, OpenOptions, SUMS_EXT};
use dquant_testkit::copy_fixture;

use crate::common::tokens;

/// A copy of the r50k int32 fixture as `DIR/x`, with a sidecar of 4 KiB chunks.
fn summed() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let x = dir.path().join("x");
    copy_fixture("r50k_int32", &x);
    let bin = std::fs::read(dir.path().join("x.bin")).unwrap();
    let sums = ChunkSums::of(&bin, MIN_CHUNK).unwrap();
    std::fs::write(dir.path().join(format!("x{SUMS_EXT}")), sums.encode()).unwrap();
    (dir, x)
}

fn flip(path: &Path, off: usize) {
    let mut b = std::fs::read(path).unwrap();
    b[off] ^= 0x10;
    std::fs::write(path, b).unwrap();
}

#[test]
fn good_bytes_read_as_without_the_sidecar() {
    let (dir, x) = summed();
    let with = Dataset::open(&x, &OpenOptions::default()).unwrap();
    let (sums, sidecar) = with.chunk_sums().expect("the sidecar is found");
    assert_eq!(sidecar, dir.path().join("x.dqsum"));
    assert_eq!(sums.chunk(), MIN_CHUNK);
    // Reads through the dataset check; a caller that would map the file is told to read.
    assert!(with.plain_local_file().is_none());
    std::fs::remove_file(sidecar).unwrap();
    let without = Dataset::open(&x, &OpenOptions::default()).unwrap();
    assert!(without.chunk_sums().is_none() && without.plain_local_file().is_some());
    let n = with.tokens();
    for r in [0..n, 1..2, 1000..1024, 1023..5000, n - 7..n] {
        assert_eq!(tokens(&with, r.clone()), tokens(&without, r));
    }
}

#[test]
fn a_flipped_bit_fails_every_read_that_meets_it_and_only_those() {
    let (dir, x) = summed();
    // Token 53,300 is byte 213,200: in chunk 52 (bytes 212,992..217,088).
    flip(&dir.path().join("x.bin"), 213_200);
    let root = LocalRoot::new(dir.path()).unwrap();
    let by_path = Dataset::open(&x, &OpenOptions::default()).unwrap();
    let in_root = Dataset::open_in(&root, "x", &OpenOptions::default()).unwrap();
    for (ds, bin, sidecar) in [
        (&by_path, x.with_extension("bin"), x.with_extension("dqsum")),
        (&in_root, "x.bin".into(), "x.dqsum".into()),
    ] {
        let sums = ds.chunk_sums().unwrap().0.clone();
        let want = format!(
            "{}: checksum mismatch in chunk 52 (bytes 212992..217088), against {}: stored \
             {:#010x}, computed",
            bin.display(),
            sidecar.display(),
            sums.crc(52)
        );
        // A read inside the chunk, one that covers it whole, one that ends in it.
        for r in [53_300..53_301, 53_000..55_000, 50_000..53_249] {
            let e = tokens(ds, r.clone()).unwrap_err();
            assert!(e.starts_with(&want), "{r:?}: {e}");
        }
        // The stored-bytes path checks too.
        let mut buf = vec![0u8; 4 * 100];
        let e = ds
            .read_stored_vectored(53_250, &mut [IoSliceMut::new(&mut buf)])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with(&want), "{e}");
        // Twice: a chunk that failed is never taken as checked.
        assert!(tokens(ds, 53_300..53_301).is_err());
        // Chunks on either side read fine.
        assert_eq!(tokens(ds, 53_000..53_248).unwrap().len(), 248);
        assert_eq!(tokens(ds, 54_272..54_300).unwrap().len(), 28);
    }
}

#[test]
fn a_sidecar_that_does_not_fit_its_bin_fails_the_open() {
    let (dir, x) = summed();
    let sidecar = dir.path().join("x.dqsum");
    let open = || {
        Dataset::open(&x, &OpenOptions::default())
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    // Stale: written for a shorter .bin.
    let bin = std::fs::read(dir.path().join("x.bin")).unwrap();
    let short = ChunkSums::of(&bin[..bin.len() - 4096], MIN_CHUNK).unwrap();
    std::fs::write(&sidecar, short.encode()).unwrap();
    assert_eq!(
        open(),
        format!(
            "{}: covers 640032 bytes of {}, which has 644128: the sidecar is stale; write it \
             again with `dquant sums`",
            sidecar.display(),
            x.with_extension("bin").display()
        )
    );
    // Larger than any sidecar of this .bin could be: refused before it is read.
    std::fs::write(&sidecar, vec![0u8; 1 << 20]).unwrap();
    assert_eq!(
        open(),
        format!(
            "{}: corrupt chunk sums file: 1048576 bytes, more than any sidecar of {}'s 644128 \
             bytes (660)",
            sidecar.display(),
            x.with_extension("bin").display()
        )
    );
    // Damaged.
    let mut bytes = ChunkSums::of(&bin, MIN_CHUNK).unwrap().encode();
    bytes[30] ^= 1;
    std::fs::write(&sidecar, bytes).unwrap();
    assert!(
        open().starts_with(&format!(
            "{}: checksum mismatch in chunk sums file: stored",
            sidecar.display()
        )),
        "{}",
        open()
    );
}
