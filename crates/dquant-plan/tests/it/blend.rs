//! The blend: Megatron-Core's rule, replayed without arrays.

use crate::common;

use common::{megatron_blend, plan, schedule};
use dquant_plan::Blender;
use proptest::prelude::*;

const WEIGHTS: &[&[f64]] = &[
    &[1.0],
    &[1.0, 1.0],
    &[0.7, 0.3],
    &[0.999, 0.001],
    &[1e-6, 1.0],
    &[1.0, 1e-6],
    &[3.0, 1.0],
    &[0.5, 0.3, 0.2],
    &[0.7, 0.2, 0.1],
    &[1.0, 2.0, 3.0, 4.0, 5.0],
    &[0.98, 0.01, 0.01],
    &[1.0, 1e-4, 1e-4, 1e-4, 1e-4, 1e-4, 1e-4, 1e-4, 1e-4, 1e-4],
    &[
        0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1,
    ],
];

/// `max_d (count_d(i) - w_d * i)` and `max_d (w_d * i - count_d(i))` over every prefix `i` of
/// `n` samples: how far a source gets ahead of, and behind, its share.
fn deviation(weights: &[f64], n: u64) -> (f64, f64) {
    let mut b = Blender::new(weights).unwrap();
    let w = b.weights().to_vec();
    let (mut ahead, mut behind) = (0f64, 0f64);
    for _ in 0..=n {
        let i = b.position() as f64;
        for (d, &c) in b.counts().iter().enumerate() {
            ahead = ahead.max(c as f64 - w[d] * i);
            behind = behind.max(w[d] * i - c as f64);
        }
        b.next_pick();
    }
    (ahead, behind)
}

#[test]
fn same_picks_as_megatron_build_blending_indices() {
    for &w in WEIGHTS {
        let (di, dsi) = megatron_blend(w, 50_000);
        let ours: Vec<(usize, u64)> = Blender::new(w).unwrap().take(50_000).collect();
        let theirs: Vec<(usize, u64)> = di.into_iter().zip(dsi).collect();
        assert_eq!(ours, theirs, "weights {w:?}");
    }
}

#[test]
fn two_sources_stay_within_one_sample_of_their_share() {
    // |count_d(i) - w_d * i| <= 1 at every prefix, however skewed the weights.
    for &w in WEIGHTS.iter().filter(|w| w.len() <= 2) {
        let (ahead, behind) = deviation(w, 200_000);
        assert!(ahead <= 1.0 && behind <= 1.0, "{w:?}: {ahead} {behind}");
    }
    for w in [[0.5, 0.3, 0.2], [0.7, 0.2, 0.1]] {
        let (ahead, behind) = deviation(&w, 200_000);
        assert!(ahead <= 1.0 && behind <= 1.0, "{w:?}: {ahead} {behind}");
    }
}

#[test]
fn many_sources_lag_more_than_one_sample_as_in_megatron() {
    // Megatron's greedy rule never lets a source get more than one sample ahead of its share,
    // but with many sources one can fall further behind (up to the harmonic number H_{n-1}
    // in every case we tried). We replicate the rule, so we replicate this too.
    for &w in WEIGHTS {
        let (ahead, behind) = deviation(w, 100_000);
        let harmonic: f64 = (1..w.len()).map(|k| 1.0 / k as f64).sum();
        assert!(ahead <= 1.0, "{w:?}: {ahead}");
        assert!(
            behind <= harmonic.max(1.0) + 1e-9,
            "{w:?}: {behind} > H = {harmonic}"
        );
    }
    let (_, behind) = deviation(WEIGHTS[11], 100_000);
    assert!(behind > 1.5, "{behind}");
}

#[test]
fn schedule_maps_the_jth_pick_of_a_source_to_its_epochs() {
    // Source 0 has 10 samples per epoch, source 1 has 3: with weights 1:1 over 13 samples,
    // source 1 is drawn ~6 times and wraps into its third epoch (0-based 2: j = 6).
    let mut p = plan(&[1.0, 1.0], 4, 1);
    p.shuffle = false;
    let s = schedule(&p, &[41, 13]);
    assert_eq!((s.samples_per_epoch(0), s.samples_per_epoch(1)), (10, 3));
    let got: Vec<(usize, u64, u64)> = (0..13)
        .map(|i| s.sample(i).unwrap())
        .map(|r| (r.source, r.epoch, r.index))
        .collect();
    assert_eq!(
        got,
        [
            (0, 0, 0),
            (1, 0, 0),
            (0, 0, 1),
            (1, 0, 1),
            (0, 0, 2),
            (1, 0, 2),
            (0, 0, 3),
            (1, 1, 0),
            (0, 0, 4),
            (1, 1, 1),
            (0, 0, 5),
            (1, 1, 2),
            (0, 0, 6),
        ]
    );
    assert_eq!(s.sample(13), None);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_weights_match_megatron_and_stay_in_bounds(
        w in prop::collection::vec(1e-3f64..1e3, 1..9),
        seek in 0u64..3000,
    ) {
        let (di, dsi) = megatron_blend(&w, 3000);
        let mut b = Blender::new(&w).unwrap();
        let ws = b.weights().to_vec();
        for i in 0..3000 {
            // Provable bounds: no source more than 1 ahead; so none more than n - 1 behind.
            for (d, &c) in b.counts().iter().enumerate() {
                let e = ws[d] * i as f64 - c as f64;
                prop_assert!(e >= -1.0 - 1e-9 && e <= (w.len() - 1).max(1) as f64);
            }
            prop_assert_eq!(b.next_pick(), (di[i], dsi[i]));
        }
        b.seek(seek);
        prop_assert_eq!(b.next_pick(), (di[seek as usize], dsi[seek as usize]));
    }
}
