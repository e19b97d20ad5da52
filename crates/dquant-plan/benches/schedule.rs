//! Cost of answering "which tokens next": per sample of a rank's stream, per sample replayed by
//! a seek, per permutation lookup. Throughput is in samples.
//!
//! `cargo bench -p dquant-plan`

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
        g.bench_function(format!("seek, {} sources", weights.len()), |b| {
            b.iter(|| {
                let mut bl = b0.clone();
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

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    targets = iterate, seek, permutation
}
criterion_main!(benches);
