//! Cost of answering "which tokens next": per sample of a rank's stream, per sample replayed by
//! a seek, per permutation lookup (throughput in samples); the climb to the blend's counts at
//! 10^10 samples by number of sources (`climb/`); and at scale (issue 15): resuming at 10^9 and
//! 10^10 samples from a cursor with the blend's counts against a replay, and the schedule's
//! cost per batch of 8 at world 1, 512 and 4096 with 1, 100 and 1,000 sources, and at world 64
//! with 10 sources.
//!
//! `cargo bench -p dquant-plan` (all), `cargo bench -p dquant-plan -- scale/` (the scale
//! figures only), `cargo bench -p dquant-plan -- climb` (the climb only)

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use dquant_plan::permute::epoch_key;
use dquant_plan::{Blender, Cursor, Permutation, Plan, Schedule, Source, SourceInfo};

/// A plan over 10^12 tokens in `weights.len()` sources, seq_len 4096.
fn schedule(weights: &[f64], world: u32, shuffle: bool) -> Schedule {
    let mut plan = Plan::new(
        weights
            .iter()
            .enumerate()
            .map(|(d, &w)| Source::new(format!("s{d}")).weight(w))
            .collect(),
        4096,
        8,
    );
    (plan.world, plan.shuffle, plan.seed) = (world, shuffle, 1);
    let per = 1_000_000_000_000 / weights.len() as u64;
    let infos = vec![SourceInfo { tokens: per }; weights.len()];
    Schedule::new(&plan, &infos).unwrap()
}

const N: u64 = 100_000;

fn iterate(c: &mut Criterion) {
    let mut g = c.benchmark_group("iter_rank");
    g.throughput(Throughput::Elements(N));
    for (name, weights, world, shuffle) in [
        ("1 source, world 1, shuffled", &[1.0][..], 1, true),
        ("1 source, world 1, in order", &[1.0][..], 1, false),
        (
            "4 sources, world 1, shuffled",
            &[0.4, 0.3, 0.2, 0.1][..],
            1,
            true,
        ),
        (
            "4 sources, world 1, in order",
            &[0.4, 0.3, 0.2, 0.1][..],
            1,
            false,
        ),
        (
            "4 sources, world 8, shuffled",
            &[0.4, 0.3, 0.2, 0.1][..],
            8,
            true,
        ),
    ] {
        let s = schedule(weights, world, shuffle);
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut acc = 0u64;
                for r in s.iter_rank(Cursor::START).unwrap().take(N as usize) {
                    acc = acc.wrapping_add(r.tokens.start);
                }
                black_box(acc)
            })
        });
    }
    g.finish();
}

fn seek(c: &mut Criterion) {
    let mut g = c.benchmark_group("blender");
    g.throughput(Throughput::Elements(N));
    for weights in [&[0.5, 0.5][..], &[0.4, 0.3, 0.2, 0.1][..], &[1.0; 16][..]] {
        let b0 = Blender::new(weights).unwrap();
        // Renormalizing limits that never bind keep the climb out: this is the replay.
        let replay = b0.clone().renormalizing(vec![u64::MAX; weights.len()]);
        g.bench_function(format!("seek by replay, {} sources", weights.len()), |b| {
            b.iter(|| {
                let mut bl = replay.clone();
                bl.seek(black_box(N));
                black_box(bl.counts()[0])
            })
        });
        g.bench_function(format!("next_pick, {} sources", weights.len()), |b| {
            b.iter(|| {
                let mut bl = b0.clone();
                let mut acc = 0u64;
                for _ in 0..N {
                    acc = acc.wrapping_add(bl.next_pick().1);
                }
                black_box(acc)
            })
        });
    }
    g.finish();
}

fn permutation(c: &mut Criterion) {
    let mut g = c.benchmark_group("permutation");
    g.throughput(Throughput::Elements(N));
    // 2^28 is a whole Feistel domain; 2^28 + 1 needs the most cycle walking (domain 2^29).
    for n in [244_140_624u64, 1 << 28, (1 << 28) + 1] {
        let p = Permutation::new(n, epoch_key(1, 2, 3));
        g.bench_function(format!("apply, n = {n}"), |b| {
            b.iter(|| {
                let mut acc = 0u64;
                for x in 0..N {
                    acc = acc.wrapping_add(p.apply(x));
                }
                black_box(acc)
            })
        });
    }
    g.finish();
}

/// Unequal weights `1, 2, ..., n` (a blend with ties of every kind would flatter the rule).
fn weights(n: usize) -> Vec<f64> {
    (1..=n).map(|d| d as f64).collect()
}

/// A plan of 2^62 samples over `n` sources of 2^40 tokens each, rank 0 of `world`.
fn scale_schedule(n: usize, world: u32) -> Schedule {
    let mut plan = Plan::new(
        weights(n)
            .iter()
            .enumerate()
            .map(|(d, &w)| Source::new(format!("s{d}")).weight(w))
            .collect(),
        4096,
        8,
    );
    (plan.world, plan.samples, plan.seed) = (world, Some(1 << 62), 1);
    Schedule::new(&plan, &vec![SourceInfo { tokens: 1 << 40 }; n]).unwrap()
}

/// The blend's counts at `at` samples, as a cursor carries them (a climb; `restore` checks
/// them with another).
fn counts_at(s: &Schedule, at: u64) -> Vec<u64> {
    let mut b = s.blender();
    b.seek(at);
    b.counts().to_vec()
}

/// The climb to the blend's counts at 10^10 samples, from sample 0, by number of sources
/// (weights `1..=n`, and all equal): what a bare cursor, `locate` and `audit` pay instead of
/// a replay (about 12 ns a sample: two minutes).
fn climb(c: &mut Criterion) {
    let mut g = c.benchmark_group("climb");
    for n in [2usize, 3, 16, 50, 200, 1000] {
        for (kind, w) in [("unequal", weights(n)), ("equal", vec![1.0; n])] {
            let b0 = Blender::new(&w).unwrap();
            g.bench_function(format!("seek to 10^10, {n} sources, {kind}"), |b| {
                b.iter(|| {
                    let mut bl = b0.clone();
                    bl.seek(black_box(10_000_000_000));
                    black_box(bl.counts()[0])
                })
            });
        }
    }
    g.finish();
}

/// Time to the first batch after a resume at 10^9 and 10^10 samples, from a cursor with the
/// blend's counts; and a replay's cost per sample (the resume without counts), measured over
/// 10^6 samples, to set against it.
fn resume(c: &mut Criterion) {
    let mut g = c.benchmark_group("scale/resume");
    for n in [1usize, 8, 100] {
        let s = scale_schedule(n, 1);
        for at in [1_000_000_000u64, 10_000_000_000] {
            let cursor = Cursor {
                blend: if n > 1 { counts_at(&s, at) } else { Vec::new() },
                ..s.cursor_at(at)
            };
            g.bench_function(format!("with counts, {n} sources, at {at}"), |b| {
                b.iter(|| {
                    let mut it = s.iter_rank(black_box(cursor.clone())).unwrap();
                    black_box(it.next_batch().unwrap().samples.len())
                })
            });
        }
        g.throughput(Throughput::Elements(1_000_000));
        let replay = s.blender().renormalizing(vec![u64::MAX; n]);
        g.bench_function(format!("replay per sample, {n} sources"), |b| {
            b.iter(|| {
                let mut bl = replay.clone();
                bl.seek(black_box(1_000_000));
                black_box(bl.counts()[0])
            })
        });
    }
    g.finish();
}

/// The schedule's cost per batch of 8 of one rank, by world size and number of sources.
fn per_batch(c: &mut Criterion) {
    let mut g = c.benchmark_group("scale/batch");
    // The two targets: world 64 x 10 sources and world 4096 x 1,000 sources.
    let cases = [1usize, 100, 1000]
        .into_iter()
        .flat_map(|n| [1u32, 512, 4096].map(|world| (n, world)))
        .chain([(10, 64)]);
    for (n, world) in cases {
        {
            let s = scale_schedule(n, world);
            let mut it = s.iter_rank(Cursor::START).unwrap();
            g.bench_function(format!("world {world}, {n} sources"), |b| {
                b.iter(|| black_box(it.next_batch().unwrap().samples.len()))
            });
        }
    }
    g.finish();
}

criterion_group! {
    name = scale;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .sample_size(10);
    targets = resume, per_batch, climb
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    targets = iterate, seek, permutation
}
criterion_main!(benches, scale);
