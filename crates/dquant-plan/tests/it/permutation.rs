//! The keyed permutation on large ranges, where exhaustive checks are out of reach.

use std::collections::HashSet;

use dquant_plan::permute::epoch_key;
use dquant_plan::Permutation;
use proptest::prelude::*;

#[test]
fn large_ranges_have_no_collisions_on_a_window() {
    for n in [
        1u64 << 32,
        1_000_000_007,
        (1 << 40) + 12_345,
        3 * (1 << 50) + 1,
    ] {
        let p = Permutation::new(n, 0xfeed);
        let mut seen = HashSet::new();
        for x in (0..20_000).chain(n - 20_000..n) {
            let y = p.apply(x);
            assert!(y < n);
            assert!(seen.insert(y), "n={n}: {x} collides");
        }
    }
}

#[test]
fn positions_are_spread_evenly() {
    // Where element 0 lands, over many keys: each of 10 positions about equally often.
    let n = 10;
    let trials = 20_000;
    let mut hits = vec![0u32; n as usize];
    for key in 0..trials {
        hits[Permutation::new(n, epoch_key(7, 0, key)).apply(0) as usize] += 1;
    }
    let expected = trials as f64 / n as f64;
    let chi2: f64 = hits
        .iter()
        .map(|&h| (h as f64 - expected).powi(2) / expected)
        .sum();
    // 9 degrees of freedom: 27.9 is the 0.1% tail.
    assert!(chi2 < 27.9, "chi2 = {chi2}, hits {hits:?}");

    // Neighbouring inputs land far apart: no visible structure in a shuffled epoch.
    let p = Permutation::new(1_000_000, epoch_key(1, 2, 3));
    let close = (0..10_000)
        .filter(|&x| p.apply(x).abs_diff(p.apply(x + 1)) < 1000)
        .count();
    assert!(close < 60, "{close} neighbours stayed within 1000"); // ~20 expected
}

#[test]
fn keys_separate_seeds_sources_and_epochs() {
    let keys: HashSet<u64> = (0..20)
        .flat_map(|s| (0..20).flat_map(move |d| (0..20).map(move |e| epoch_key(s, d, e))))
        .collect();
    assert_eq!(keys.len(), 8000);
    let order = |k| {
        (0..50)
            .map(|x| Permutation::new(50, k).apply(x))
            .collect::<Vec<_>>()
    };
    assert_ne!(order(epoch_key(0, 0, 0)), order(epoch_key(0, 0, 1)));
    assert_ne!(order(epoch_key(0, 0, 0)), order(epoch_key(1, 0, 0)));
    assert_ne!(order(epoch_key(0, 0, 0)), order(epoch_key(0, 1, 0)));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn bijection_for_random_sizes_and_keys(n in 0u64..5000, key in any::<u64>()) {
        let p = Permutation::new(n, key);
        let mut seen = vec![false; n as usize];
        for x in 0..n {
            let y = p.apply(x) as usize;
            prop_assert!(!seen[y]);
            seen[y] = true;
        }
    }
}
