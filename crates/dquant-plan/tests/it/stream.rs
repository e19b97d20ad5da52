//! The stream a schedule yields: packing, shuffling, sharding, batching, resuming. Compared
//! against a materializing reference (tests/common) and checked for coverage.

use crate::common;

use std::collections::HashSet;

use common::{arb_plan, plan, reference_global, reference_rank, schedule, with_rank};
use dquant_plan::{Cursor, Plan, SampleRef, Schedule, WhenExhausted};
use proptest::prelude::*;

fn rank_stream(p: &Plan, tokens: &[u64], cursor: Cursor) -> Vec<SampleRef> {
    schedule(p, tokens).iter_rank(cursor).unwrap().collect()
}

#[test]
fn packing_covers_every_label_of_an_epoch_once() {
    for shuffle in [false, true] {
        for (tokens, seq_len) in [(1001u64, 10u32), (1000, 10), (11, 10), (5000, 7), (2, 1)] {
            let mut p = plan(&[1.0], seq_len, 3);
            p.shuffle = shuffle;
            p.epochs = Some(2);
            let s = schedule(&p, &[tokens]);
            let per_epoch = (tokens - 1) / seq_len as u64;
            assert_eq!(s.samples_per_epoch(0), per_epoch);
            assert_eq!(s.total_samples(), 2 * per_epoch);
            let all: Vec<SampleRef> = s.iter_rank(Cursor::START).unwrap().collect();
            for epoch in 0..2 {
                let mut labelled = vec![0u32; tokens as usize];
                for r in all.iter().filter(|r| r.epoch == epoch) {
                    let seq = seq_len as u64;
                    assert_eq!(r.tokens.start, r.index * seq);
                    assert_eq!(r.tokens.end - r.tokens.start, seq + 1);
                    assert!(r.tokens.end <= tokens, "{r:?} past {tokens}");
                    // Labels are the sample's last seq_len tokens.
                    for t in r.tokens.start + 1..r.tokens.end {
                        labelled[t as usize] += 1;
                    }
                }
                // Every token but the first is a label exactly once, up to the last full
                // sample (a partial last sample is dropped, as in Megatron).
                let covered = per_epoch * seq_len as u64 + 1;
                assert_eq!(labelled[0], 0);
                assert!(labelled[1..covered as usize].iter().all(|&n| n == 1));
                assert!(labelled[covered as usize..].iter().all(|&n| n == 0));
            }
        }
    }
}

#[test]
fn shuffle_false_is_stored_order_and_shuffle_true_is_not() {
    let mut p = plan(&[1.0], 8, 4);
    p.shuffle = false;
    let plain: Vec<u64> = rank_stream(&p, &[8001], Cursor::START)
        .iter()
        .map(|r| r.index)
        .collect();
    assert_eq!(plain, (0..1000).collect::<Vec<_>>());
    p.shuffle = true;
    let shuffled: Vec<u64> = rank_stream(&p, &[8001], Cursor::START)
        .iter()
        .map(|r| r.index)
        .collect();
    assert_ne!(shuffled, plain);
    let mut sorted = shuffled.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, plain);
    // A pinned prefix: the shuffle is part of the contract, a change to it must be deliberate.
    // Agents of different versions must agree on it.
    assert_eq!(shuffled[..8], [732, 106, 275, 22, 165, 455, 448, 989]);
}

#[test]
fn seeds_and_epochs_give_different_orders() {
    let order = |seed: u64, epoch: u64| -> Vec<u64> {
        let mut p = plan(&[1.0], 4, 1);
        p.seed = seed;
        p.epochs = Some(3);
        rank_stream(&p, &[401], Cursor::START)
            .into_iter()
            .filter(|r| r.epoch == epoch)
            .map(|r| r.index)
            .collect()
    };
    let base = order(0, 0);
    assert_eq!(base.len(), 100);
    assert_eq!(order(0, 0), base, "deterministic");
    assert_ne!(order(1, 0), base, "seed");
    assert_ne!(order(0, 1), base, "epoch 1");
    assert_ne!(order(0, 2), order(0, 1), "epoch 2");
    // Two sources with the same size and seed are shuffled differently too.
    let mut p = plan(&[1.0, 1.0], 4, 1);
    p.seed = 5;
    let s = rank_stream(&p, &[401, 401], Cursor::START);
    let a: Vec<u64> = s
        .iter()
        .filter(|r| r.source == 0)
        .map(|r| r.index)
        .collect();
    let b: Vec<u64> = s
        .iter()
        .filter(|r| r.source == 1)
        .map(|r| r.index)
        .collect();
    assert_eq!(a.len(), 100);
    assert_ne!(a, b);
}

#[test]
fn matches_the_materializing_reference() {
    let tokens = [3001u64, 517, 20_000];
    for (weights, epochs, samples) in [
        (vec![1.0, 1.0, 1.0], Some(2), None),
        (vec![0.1, 0.6, 0.3], None, Some(2345)),
        (vec![5.0, 1.0, 1e-3], None, None),
    ] {
        let mut p = plan(&weights, 16, 4);
        (p.epochs, p.samples, p.seed) = (epochs, samples, 99);
        let global = reference_global(&p, &tokens);
        let s = schedule(&p, &tokens);
        assert_eq!(s.total_samples(), global.len() as u64);
        assert_eq!(rank_stream(&p, &tokens, Cursor::START), global);
        for i in [0, 1, 2, 100, global.len() as u64 - 1] {
            assert_eq!(s.sample(i).as_ref(), Some(&global[i as usize]));
        }
    }
}

#[test]
fn every_sample_goes_to_exactly_one_rank() {
    let tokens = [10_001u64, 3_333, 777];
    for drop_last in [false, true] {
        for shuffle in [false, true] {
            for world in [1u32, 2, 3, 4, 8] {
                let mut base = plan(&[0.5, 0.3, 0.2], 10, 3);
                (base.drop_last, base.shuffle, base.samples) = (drop_last, shuffle, Some(1001));
                let total = schedule(&base, &tokens).total_samples();
                let mut seen = HashSet::new();
                let mut counts = Vec::new();
                for rank in 0..world {
                    let p = with_rank(&base, rank, world);
                    let s = schedule(&p, &tokens);
                    let stream = rank_stream(&p, &tokens, Cursor::START);
                    assert_eq!(stream.len() as u64, s.rank_samples());
                    assert_eq!(stream, reference_rank(&p, &tokens, rank));
                    for r in &stream {
                        assert_eq!(r.global % world as u64, rank as u64);
                        assert!(seen.insert(r.global), "duplicate {}", r.global);
                    }
                    // Batches: consecutive runs of batch_size local samples.
                    let batches: Vec<_> = {
                        let mut it = s.iter_rank(Cursor::START).unwrap();
                        std::iter::from_fn(|| it.next_batch()).collect()
                    };
                    assert_eq!(batches.len() as u64, s.rank_batches());
                    let flat: Vec<SampleRef> =
                        batches.iter().flat_map(|b| b.samples.clone()).collect();
                    assert_eq!(flat, stream);
                    for (b, batch) in batches.iter().enumerate() {
                        assert_eq!(batch.index, b as u64);
                        let last = b + 1 == batches.len();
                        assert!(batch.samples.len() == 3 || (last && !drop_last));
                    }
                    counts.push(stream.len() as u64);
                }
                if drop_last {
                    // Lockstep: equal, whole batches, and no more than one global batch lost.
                    assert!(counts.iter().all(|&c| c == counts[0] && c % 3 == 0));
                    assert!(total - (seen.len() as u64) < 3 * world as u64);
                    assert!(seen.iter().all(|&g| g < counts[0] * world as u64));
                } else {
                    assert_eq!(seen.len() as u64, total);
                    assert_eq!(seen, (0..total).collect::<HashSet<_>>());
                    let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
                    assert!(hi - lo <= 1, "{counts:?}");
                }
            }
        }
    }
}

#[test]
fn resume_at_every_cut_gives_the_tail() {
    let tokens = [2_001u64, 901];
    for (world, shuffle, drop_last) in [
        (1, true, false),
        (2, false, false),
        (3, true, true),
        (4, true, false),
    ] {
        for rank in 0..world {
            let mut p = with_rank(&plan(&[0.8, 0.2], 20, 2), rank, world);
            (p.shuffle, p.drop_last, p.epochs) = (shuffle, drop_last, Some(2));
            let s = schedule(&p, &tokens);
            let full: Vec<SampleRef> = s.iter_rank(Cursor::START).unwrap().collect();
            let total = s.total_samples();
            for c in (0..=total).filter(|c| c % world as u64 == 0 || *c == total) {
                let cursor = s.cursor_at(c);
                let tail: Vec<SampleRef> = s.iter_rank(cursor).unwrap().collect();
                let skip = full.iter().take_while(|r| r.global < c).count();
                assert_eq!(tail, full[skip..], "world {world} rank {rank} cursor {c}");
            }
        }
    }
}

#[test]
fn cursor_bookkeeping() {
    let mut p = with_rank(&plan(&[1.0, 1.0], 10, 4), 1, 4);
    p.epochs = Some(3);
    let s = schedule(&p, &[101, 51]); // 10 + 5 samples per epoch, 45 in all
    assert_eq!(s.epoch_samples(), 15);
    assert_eq!(s.total_samples(), 45);
    assert_eq!(s.rank_samples(), 11); // 1, 5, ..., 41
    assert_eq!(s.rank_batches(), 3);
    assert_eq!(s.cursor_at(32), Cursor::new(2, 32));
    assert_eq!(s.cursor_after(4, &Cursor::START).consumed_samples, 16);
    assert_eq!(s.cursor_after(4, &s.cursor_at(16)).consumed_samples, 32);
    assert_eq!(s.cursor_after(100, &s.cursor_at(16)), s.cursor_at(45)); // capped at the end
    let mut it = s.iter_rank(s.cursor_at(16)).unwrap();
    assert_eq!(it.local_position(), 4);
    assert_eq!(it.len(), 7);
    assert_eq!(it.next().unwrap().global, 17);
    assert_eq!(it.cursor().consumed_samples, 20);
    // Resuming mid-batch: the first "batch" is the rest of batch 1.
    let b = it.next_batch().unwrap();
    assert_eq!((b.index, b.samples.len()), (1, 3));
    assert_eq!(s.iter_rank(s.cursor_at(45)).unwrap().count(), 0);
    // The epoch field is reporting only.
    let odd = Cursor::new(7, 16);
    assert_eq!(
        s.iter_rank(odd).unwrap().collect::<Vec<_>>(),
        s.iter_rank(s.cursor_at(16)).unwrap().collect::<Vec<_>>()
    );
}

#[test]
fn bad_cursors_are_named() {
    let p = with_rank(&plan(&[1.0], 10, 4), 0, 4);
    let s = schedule(&p, &[101]);
    let at = |c| {
        s.iter_rank(s.cursor_at(c))
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        at(11),
        "cursor: consumed_samples 11 is past the end of the plan (10 samples)"
    );
    // The end of the plan is a valid cursor even when not a multiple of world.
    assert_eq!(s.iter_rank(s.cursor_at(10)).unwrap().count(), 0);
    let with = |blend: Vec<u64>, delivered: Vec<u64>, c| {
        let cursor = Cursor {
            blend,
            delivered,
            ..s.cursor_at(c)
        };
        s.iter_rank(cursor).map(|_| ()).unwrap_err().to_string()
    };
    assert_eq!(
        with(vec![], vec![3, 5], 1),
        "cursor: delivered lists 2 samples, more than consumed_samples 1"
    );
    assert_eq!(
        with(vec![], vec![7, 7], 9),
        "cursor: delivered is not strictly ascending: [0] = 7 then [1] = 7"
    );
    assert_eq!(
        with(vec![], vec![2, 5], 6),
        "cursor: delivered[0] = 2 is below the watermark 4"
    );
    assert_eq!(
        with(vec![], vec![7, 10], 8),
        "cursor: delivered[1] = 10 is past the end of the plan (10 samples)"
    );
    assert_eq!(
        with(vec![3, 3], vec![], 4),
        "cursor: blend has 2 counts, the plan has 1 sources"
    );
    let p2 = with_rank(&plan(&[1.0, 3.0], 10, 4), 0, 4);
    let s2 = schedule(&p2, &[1001, 1001]);
    let with2 = |blend: Vec<u64>, c| {
        let cursor = Cursor {
            blend,
            ..s2.cursor_at(c)
        };
        s2.iter_rank(cursor).map(|_| ()).unwrap_err().to_string()
    };
    assert_eq!(
        with2(vec![10, 30], 44),
        "cursor: blend adds up to 40 samples, the cursor's watermark is 44 (consumed_samples \
         44 less 0 delivered)"
    );
    assert_eq!(
        with2(vec![30, 10], 40),
        "cursor: blend[0] = 30 is not this plan's blend after 40 samples (source 0's share is \
         10.0)"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn resume_from_random_cursors((p, tokens) in arb_plan(), cut in 0.0f64..1.0, rank in 0u32..6) {
        let p = Plan { rank: rank % p.world, ..p };
        let s = Schedule::new(&p, &common::infos(&tokens)).unwrap();
        let full: Vec<SampleRef> = s.iter_rank(Cursor::START).unwrap().collect();
        prop_assert_eq!(&full, &reference_rank(&p, &tokens, p.rank));
        let world = p.world as u64;
        let c = ((s.total_samples() as f64 * cut) as u64) / world * world;
        let tail: Vec<SampleRef> = s.iter_rank(s.cursor_at(c)).unwrap().collect();
        let skip = full.iter().take_while(|r| r.global < c).count();
        prop_assert_eq!(&tail[..], &full[skip..]);
        for r in &full {
            prop_assert!(r.tokens.end <= tokens[r.source]);
            prop_assert_eq!(r.tokens.end - r.tokens.start, p.seq_len as u64 + 1);
        }
    }
}

/// A cursor near 2^62 in a two-source blend: the climb reaches it at once. With limits that
/// renormalize (which the climb does not take) it would replay for centuries: with a stop
/// condition, the replay ends when asked, with an error saying how far it got.
#[test]
fn a_far_cursor_in_a_blend_stops_when_asked() {
    let mut p = plan(&[1.0, 2.0], 4, 2);
    p.samples = Some(u64::MAX);
    let s = schedule(&p, &[1000, 1000]);
    let far = Cursor::new(0, 1 << 62);
    let mut it = s
        .iter_rank_until(far.clone(), &mut || unreachable!("a climb never asks"))
        .unwrap();
    assert!(it.next().is_some());
    p.sources[0].max_samples = Some(1 << 63);
    p.when_exhausted = WhenExhausted::Renormalize;
    let s = schedule(&p, &[1000, 1000]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(50);
    let e = s
        .iter_rank_until(far, &mut || std::time::Instant::now() >= deadline)
        .unwrap_err();
    let dquant_plan::PlanError::Stopped { reached, target } = e.clone() else {
        panic!("{e:?}");
    };
    assert_eq!(target, 1 << 62);
    assert!(reached > 0 && reached < target, "{reached}");
    assert_eq!(
        e.to_string(),
        format!(
            "cursor: stopped after replaying the blend to sample {reached} of 4611686018427387904"
        )
    );
    // The same schedule without a far cursor is unaffected by the stop condition.
    let near = Cursor::new(0, 10);
    let a: Vec<SampleRef> = s
        .iter_rank_until(near.clone(), &mut || false)
        .unwrap()
        .take(5)
        .collect();
    let b: Vec<SampleRef> = s.iter_rank(near).unwrap().take(5).collect();
    assert_eq!(a, b);
}
