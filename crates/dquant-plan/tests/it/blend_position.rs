//! The blend's counts at any sample by the certified climb (`Blender::seek` far ahead) equal
//! the replay's, for many weight vectors (balanced, tied, decimal, skewed over six orders of
//! magnitude, 2 to 60 sources), many positions, and stage schedules; and a stream resumed
//! from them continues exactly.

use crate::common;

use common::{megatron_blend, plan, schedule};
use dquant_plan::{Blender, Interpolate, Stage, JUMP_FROM};

/// A xorshift stream for weights and positions (the test's own, so failures reproduce).
fn rng(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

fn weights(case: usize, next: &mut impl FnMut() -> u64) -> Vec<f64> {
    let k = [2, 3, 4, 7, 12, 25, 60][case % 7];
    (0..k)
        .map(|d| match case % 5 {
            0 => 1.0,                                          // ties everywhere
            1 => [0.1, 0.2, 0.7, 0.3][d % 4],                  // decimals not exact in binary
            2 => 0.5 + (next() % 1000) as f64 / 1000.0,        // balanced
            3 => 10f64.powf((next() % 6_000) as f64 / 1000.0), // skewed over 10^6
            _ => (next() % 4 + 1) as f64,                      // small integers
        })
        .collect()
}

/// Counts after `n` draws, one pick at a time (never a jump).
fn stepped(b: &Blender, n: u64) -> Vec<u64> {
    let mut b = b.clone();
    for _ in b.position()..n {
        b.next_pick();
    }
    b.counts().to_vec()
}

/// At each of `positions` (ascending): a jump from `start` has the counts of one replay that
/// walks through them all, and the next `picks` draws from both are the same.
fn compare_at(start: &Blender, positions: &[u64], picks: usize, what: &str) {
    let mut walk = start.clone();
    for &n in positions {
        let want = stepped(&walk, n);
        walk.restore(&want).unwrap();
        let mut jumped = start.clone();
        jumped.seek(n);
        assert_eq!(jumped.counts(), &want[..], "{what} n {n}");
        let (mut a, mut b) = (jumped, walk.clone());
        for s in 0..picks {
            assert_eq!(a.next_pick(), b.next_pick(), "{what} n {n} + {s}");
        }
    }
}

#[test]
fn jumps_equal_the_replay_for_many_weights_and_positions() {
    let mut next = rng(0x5eed_b1e4d);
    for case in 0..70 {
        let w = weights(case, &mut next);
        let start = Blender::new(&w).unwrap();
        let far = JUMP_FROM + 64 * w.len() as u64;
        let mut positions: Vec<u64> = (0..6).map(|_| far + 1 + next() % 200_000).collect();
        positions.sort_unstable();
        compare_at(
            &start,
            &positions,
            200,
            &format!("case {case} weights {w:?}"),
        );
    }
}

#[test]
fn jumps_equal_megatrons_arrays() {
    // The materialized reference (Megatron's build_blending_indices, transcribed) at n.
    for w in [
        vec![0.7, 0.2, 0.1],
        vec![1.0; 5],
        vec![0.999, 0.001],
        vec![1.0, 1e-4, 1e-4, 3.0],
    ] {
        let n = 300_000;
        let (di, _) = megatron_blend(&w, n);
        let mut want = vec![0u64; w.len()];
        di.iter().for_each(|&d| want[d] += 1);
        let mut b = Blender::new(&w).unwrap();
        b.seek(n as u64);
        assert_eq!(b.counts(), &want[..], "{w:?}");
    }
}

#[test]
fn jumps_equal_the_replay_across_stages() {
    let mut next = rng(77);
    for (case, interpolate) in [Interpolate::Step, Interpolate::Linear]
        .into_iter()
        .cycle()
        .take(12)
        .enumerate()
    {
        let w = weights(case + 1, &mut next);
        let k = w.len();
        let mut p = plan(&w, 10, 4);
        p.samples = Some(400_000);
        p.interpolate = interpolate;
        p.stages = (1..=3)
            .map(|s| Stage {
                start_sample: Some(s * 90_000 + next() % 10_000),
                start_fraction: None,
                // Zeros included (a source paused for a stage), never all of them.
                weights: (0..k)
                    .map(|d| (next() % 5) as f64 + if d == 0 { 1.0 } else { 0.0 })
                    .collect(),
            })
            .collect();
        let s = schedule(&p, &vec![1_000_001; k]);
        let start = s.blender();
        let starts: Vec<u64> = p.stages.iter().filter_map(|st| st.start_sample).collect();
        let mut positions: Vec<u64> = starts.iter().flat_map(|&x| [x - 1, x, x + 1]).collect();
        positions.extend((0..4).map(|_| 20_000 + next() % 380_000));
        positions.sort_unstable();
        positions.dedup();
        compare_at(
            &start,
            &positions,
            1,
            &format!("case {case} {interpolate:?}"),
        );
    }
}

#[test]
fn restore_refuses_counts_in_the_band_that_are_not_the_blends() {
    let w = [0.5, 0.3, 0.2];
    let mut b = Blender::new(&w).unwrap();
    b.seek(100_000);
    let mut counts = b.counts().to_vec();
    assert_eq!(counts, [50_000, 30_000, 20_000]);
    counts[0] -= 1;
    counts[1] += 1;
    // One sample moved from source 0 to 1: within a sample of both shares, so the band passes,
    // but it is not the state Megatron's rule is in after 100,000 samples.
    assert_eq!(
        Blender::new(&w)
            .unwrap()
            .restore(&counts)
            .unwrap_err()
            .to_string(),
        "cursor: blend[0] = 49999 is not this plan's blend after 100000 samples (it gives 50000)"
    );
    let mut ok = Blender::new(&w).unwrap();
    ok.restore(b.counts()).unwrap();
    assert_eq!(ok, b);
}
