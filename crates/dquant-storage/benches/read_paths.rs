//! Why the agent narrows int32 sources out of maps it keeps with them, within a budget, and
//! not out of a `pread`'s copy or a map made for one pass: the cost a token of narrowing a
//! file's int32 ids to u16, fetched each way from a warm page cache.
//!
//! - `pagecache_copy`: the limit the cost report holds paths to (`cat FILE > /dev/null`:
//!   `pread` of 128 KiB into one buffer, nothing else);
//! - `pread_narrow`: what the agent does past its map budget, a batch of 8 × 4,096 tokens
//!   read into a buffer, then narrowed into a u16 output;
//! - `fresh_map_narrow`: the file mapped for the pass, each batch narrowed straight out of
//!   the page cache, the map dropped after (a single pass over a corpus: every page's table
//!   entry is set up as it is first touched, and torn down at the end);
//! - `kept_map_narrow`: the same out of a map kept over passes (its page tables already
//!   filled: a corpus that fits in memory, read epoch after epoch, resident in the agent; the
//!   agent's default within its map budget);
//! - `shuffled_reads`: the file's 4,096-token samples read in a shuffled order, one `pread`
//!   each, nothing else: what a shuffled plan cannot avoid, against the sequential copy its
//!   goal is stated against;
//! - `kept_map_shuffled_narrow` and `kept_map_in_order_narrow`: the agent's own narrowing
//!   out of its kept map (`Dataset::narrow_kept`, which prefetches ahead of itself), a batch
//!   of 8 of those samples at a time, shuffled and in order.
//!
//! A map saves the copy, but a fresh one pays the page tables instead, page by page: on some
//! machines more than the copy, on others less (`bench/profile` records both ratios beside
//! its stage table).
//!
//! `cargo bench -p dquant-storage --bench read_paths` (a 256 MiB file in the target
//! directory, made once).

use std::fs::File;
use std::hint::black_box;
use std::io::Write;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Bencher, Criterion, Throughput};
use dquant_codec::{kernels, Width};
use dquant_format::DType;
use dquant_storage::{Dataset, MapBudget, OpenOptions};

/// Tokens in the file: 64 Mi int32 ids, 256 MiB, larger than any cache but the page cache.
const TOKENS: usize = 64 << 20;
/// A batch of the cost report's plan: 8 samples of 4,096 tokens.
const BATCH: usize = 8 * 4096;

/// Where the bench file is: written once (ids below 50,257, as a GPT-2 vocabulary's), and
/// dropped from the page cache and read back in order by each bench run so its pages are
/// cached the same way every run. Called once a run: each call reads the whole 256 MiB.
fn corpus_path() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR", "target/tmp"));
    std::fs::create_dir_all(&dir).expect("bench directory");
    let path = dir.join("read_paths_int32.bin");
    let ok = std::fs::metadata(&path).is_ok_and(|m| m.len() == (TOKENS * 4) as u64);
    if !ok {
        let mut f = File::create(&path).expect("bench file");
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let mut chunk = Vec::with_capacity(BATCH * 4);
        for _ in 0..TOKENS / BATCH {
            chunk.clear();
            for _ in 0..BATCH {
                chunk.extend_from_slice(&((xorshift(&mut x) % 50_257) as u32).to_le_bytes());
            }
            f.write_all(&chunk).expect("bench file");
        }
    }
    let f = File::open(&path).expect("bench file");
    // Dropped from the page cache and read back in order, so that it is cached in 2 MiB
    // folios, as the cost area's dataset is (`cache_in_order` in bench/common.sh), however it
    // came in before: read at random it would sit in 4 KiB ones, copied 2-3x slower.
    f.sync_all().expect("bench file");
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).expect("drop the bench file");
    let mut buf = vec![0u8; 1 << 20];
    for at in (0..TOKENS * 4).step_by(buf.len()) {
        f.read_exact_at(&mut buf, at as u64)
            .expect("warm the page cache");
    }
    path
}

/// The next value of a xorshift64 generator in state `x`.
fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// `0..n` in a fixed shuffled order (Fisher-Yates driven by xorshift64).
fn shuffled(n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    for i in (1..n).rev() {
        order.swap(i, (xorshift(&mut x) % (i as u64 + 1)) as usize);
    }
    order
}

/// Narrows every batch of `bytes` (whole int32 batches) into `out`.
fn narrow_all(bytes: &[u8], out: &mut [u8]) {
    for batch in bytes.chunks_exact(BATCH * 4) {
        let ids: &[u32] = bytemuck::cast_slice(batch);
        kernels::store_plain(Width::U16, ids, out).expect("ids fit u16");
    }
}

/// Times the agent's narrowing out of its kept map (`Dataset::narrow_kept`), batch by batch.
fn narrow_kept(
    b: &mut Bencher<'_>,
    path: &std::path::Path,
    batches: &[Vec<Range<u64>>],
    out: &mut [u8],
) {
    let opts = OpenOptions {
        raw_dtype: Some(DType::I32),
        eod: None,
    };
    let ds = Dataset::open(path, &opts).expect("open the bench file");
    let budget = MapBudget::unlimited();
    // The map is made, and its pages' table entries filled, before the timing.
    for r in batches {
        assert!(ds.narrow_kept(r, Width::U16, out, &budget), "narrowed");
    }
    b.iter(|| {
        for r in batches {
            ds.narrow_kept(r, Width::U16, out, &budget);
        }
        black_box(&out);
    });
}

fn bench(c: &mut Criterion) {
    let path = corpus_path();
    let f = File::open(&path).expect("bench file");
    let mut g = c.benchmark_group("read_paths");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .throughput(Throughput::Elements(TOKENS as u64));
    let mut out = vec![0u8; BATCH * 2];
    g.bench_function("pagecache_copy", |b| {
        let mut buf = vec![0u8; 128 << 10];
        b.iter(|| {
            for at in (0..TOKENS * 4).step_by(buf.len()) {
                f.read_exact_at(&mut buf, at as u64).expect("read");
            }
            black_box(&buf);
        });
    });
    g.bench_function("pread_narrow", |b| {
        let mut buf = vec![0u32; BATCH];
        b.iter(|| {
            for at in (0..TOKENS * 4).step_by(BATCH * 4) {
                f.read_exact_at(bytemuck::cast_slice_mut(&mut buf), at as u64)
                    .expect("read");
                kernels::store_plain(Width::U16, &buf, &mut out).expect("ids fit u16");
            }
            black_box(&out);
        });
    });
    // SAFETY (both maps): read-only, of a file nothing else writes while the bench runs.
    g.bench_function("fresh_map_narrow", |b| {
        b.iter(|| {
            let map = unsafe { memmap2::Mmap::map(&f) }.expect("map");
            narrow_all(&map, &mut out);
            black_box(&out);
        });
    });
    g.bench_function("shuffled_reads", |b| {
        let sample = 4096 * 4;
        let order = shuffled(TOKENS * 4 / sample);
        let mut buf = vec![0u8; sample];
        b.iter(|| {
            for &i in &order {
                f.read_exact_at(&mut buf, (i * sample) as u64)
                    .expect("read");
            }
            black_box(&buf);
        });
    });
    let kept = unsafe { memmap2::Mmap::map(&f) }.expect("map");
    narrow_all(&kept, &mut out);
    g.bench_function("kept_map_narrow", |b| {
        b.iter(|| {
            narrow_all(&kept, &mut out);
            black_box(&out);
        });
    });
    let sample = 4096_u64;
    let samples = TOKENS as u64 / sample;
    let shuffled: Vec<u64> = shuffled(samples as usize)
        .into_iter()
        .map(|i| i as u64)
        .collect();
    for (name, order) in [
        ("kept_map_shuffled_narrow", shuffled),
        ("kept_map_in_order_narrow", (0..samples).collect()),
    ] {
        let batches: Vec<Vec<Range<u64>>> = order
            .chunks(BATCH / sample as usize)
            .map(|c| c.iter().map(|&i| i * sample..(i + 1) * sample).collect())
            .collect();
        g.bench_function(name, |b| narrow_kept(b, &path, &batches, &mut out));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
