//! `Dataset::read_ranges_into`, which reads a plain int32 file's runs of continuing ranges
//! (packed samples) with one vectored read each: it fills the buffer exactly as `read_into`
//! of each range one by one would, and fails as that would, whatever the ranges (packed,
//! adjacent, apart, backwards, repeated, nested, one token long, empty, past the end), for
//! every plain dtype and a block file; a negative value inside a run is named as the load
//! names it, a flipped bit under chunk sums as the sums name it, and a file truncated under
//! the reader as a shrunk file.

use std::ops::Range;

use dquant_format::chunk_sums::{ChunkSums, MIN_CHUNK};
use dquant_storage::{Dataset, OpenOptions, ReadBuffers, SUMS_EXT};
use dquant_testkit::copy_fixture;

/// The ranges read one by one with `read_into`, or the first error.
fn one_by_one(ds: &Dataset, ranges: &[Range<u64>]) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    let mut bufs = ReadBuffers::new();
    for r in ranges {
        let mut part = vec![0u32; r.end.saturating_sub(r.start) as usize];
        ds.read_into(r.clone(), &mut part, &mut bufs)
            .map_err(|e| e.to_string())?;
        out.extend(part);
    }
    Ok(out)
}

fn together(ds: &Dataset, ranges: &[Range<u64>]) -> Result<Vec<u32>, String> {
    let total = dquant_storage::source::ranges_tokens(ranges);
    let mut out = vec![0u32; total as usize];
    ds.read_ranges_into(ranges, &mut out, &mut ReadBuffers::new())
        .map_err(|e| e.to_string())?;
    Ok(out)
}

/// Packed samples of `len` tokens from `start`: each starts on the last token of the one
/// before.
fn packed(start: u64, len: u64, n: u64) -> Vec<Range<u64>> {
    (0..n)
        .map(|i| start + i * (len - 1)..start + i * (len - 1) + len)
        .collect()
}

/// Range lists of every shape, inside a dataset of `n` tokens.
fn shapes(n: u64) -> Vec<Vec<Range<u64>>> {
    let mut out = vec![
        packed(0, 128, 16),
        packed(5, 2, 40),
        (0..16).map(|i| i * 64..(i + 1) * 64).collect(),
        vec![0..10, 20..30, 29..40, 40..41, 40..60],
        vec![100..200, 0..50, 49..51, 50..50, 50..90],
        vec![10..20, 10..20, 19..30],
        vec![0..n],
        vec![n - 5..n, 0..3],
        packed(n - 1000, 250, 4),
    ];
    // Drawn at random (splitmix64): runs broken by jumps, empty ranges among them.
    let mut x = 0x1234_5678_u64;
    let mut next = |m: u64| {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % m
    };
    for _ in 0..40 {
        let mut v = Vec::new();
        let mut at = next(n / 2);
        for _ in 0..next(30) + 1 {
            let len = next(300);
            if at + len > n {
                break;
            }
            v.push(at..at + len);
            at = match next(4) {
                0 => next(n / 2),
                1 => at + len,
                _ => (at + len).saturating_sub(1),
            };
        }
        out.push(v);
    }
    out
}

#[test]
fn runs_read_what_reading_each_range_reads_for_every_format() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["r50k_int32", "r50k_uint16", "r50k_int32_multiseq"] {
        let x = dir.path().join(name);
        copy_fixture(name, &x);
        let ds = Dataset::open(&x, &OpenOptions::default()).unwrap();
        let n = ds.tokens();
        for ranges in shapes(n) {
            let want = one_by_one(&ds, &ranges);
            assert!(want.is_ok(), "{name} {ranges:?}: {want:?}");
            assert_eq!(together(&ds, &ranges), want, "{name} {ranges:?}");
        }
        // Past the end, or backwards: the same error as one by one.
        #[allow(clippy::reversed_empty_ranges)]
        let backwards = vec![0..10, 20..10];
        for ranges in [
            vec![0..10, 9..n + 1],
            vec![n - 10..n, n - 1..n + 5],
            backwards,
        ] {
            let want = one_by_one(&ds, &ranges);
            assert!(want.is_err(), "{name} {ranges:?}");
            assert_eq!(together(&ds, &ranges), want, "{name} {ranges:?}");
        }
    }
}

#[test]
fn a_negative_value_a_flipped_bit_and_a_truncation_fail_a_run_as_they_fail_each_range() {
    let dir = tempfile::tempdir().unwrap();
    let x = dir.path().join("x");
    copy_fixture("r50k_int32", &x);
    let bin = dir.path().join("x.bin");
    let mut b = std::fs::read(&bin).unwrap();
    b[4000..4004].copy_from_slice(&(-7i32).to_le_bytes());
    std::fs::write(&bin, &b).unwrap();
    let ds = Dataset::open(&x, &OpenOptions::default()).unwrap();
    let run = packed(900, 64, 8);
    let want = one_by_one(&ds, &run);
    assert!(
        want.as_ref()
            .unwrap_err()
            .contains("stored value -7 at offset 1000"),
        "{want:?}"
    );
    assert_eq!(together(&ds, &run), want);

    // Chunk sums over the good file, then a bit flipped in chunk 52.
    b[4000..4004].copy_from_slice(&7i32.to_le_bytes());
    std::fs::write(&bin, &b).unwrap();
    let sums = ChunkSums::of(&b, MIN_CHUNK).unwrap();
    std::fs::write(dir.path().join(format!("x{SUMS_EXT}")), sums.encode()).unwrap();
    b[213_200] ^= 0x10;
    std::fs::write(&bin, &b).unwrap();
    let summed = Dataset::open(&x, &OpenOptions::default()).unwrap();
    let run = packed(53_000, 100, 6);
    let want = one_by_one(&summed, &run);
    assert!(
        want.as_ref()
            .unwrap_err()
            .contains("checksum mismatch in chunk 52"),
        "{want:?}"
    );
    assert_eq!(together(&summed, &run), want);
    assert_eq!(
        together(&summed, &packed(0, 100, 6)),
        one_by_one(&summed, &packed(0, 100, 6))
    );

    // Truncated under the reader (the sidecar gone, so nothing checks the sums first).
    std::fs::remove_file(dir.path().join(format!("x{SUMS_EXT}"))).unwrap();
    let open = Dataset::open(&x, &OpenOptions::default()).unwrap();
    let n = open.tokens();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&bin)
        .unwrap()
        .set_len(4 * (n - 100))
        .unwrap();
    let run = packed(n - 500, 100, 5);
    let want = one_by_one(&open, &run);
    assert!(
        want.as_ref()
            .unwrap_err()
            .ends_with("it was truncated or rewritten while being read"),
        "{want:?}"
    );
    let got = together(&open, &run).unwrap_err();
    assert!(
        got.starts_with(&format!(
            "{}: the file is shorter than when it was opened ({} bytes; a read needed ",
            bin.display(),
            4 * n
        )),
        "{got}"
    );
}
