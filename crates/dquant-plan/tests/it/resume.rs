//! Exact resume at scale: cursors that carry the blend's counts resume like replay does, and
//! a run's sub-rank cursors, merged, resume on another topology with every sample delivered
//! exactly once (multisets), the blend's counts exact at every cursor on the way.

use crate::common;

use std::collections::BTreeMap;

use common::{arb_plan, plan, schedule, with_rank};
use dquant_plan::{merge_cursors, Cursor, Plan, SampleRef, Schedule};
use proptest::prelude::*;

/// The blend's counts after `n` global samples, by replay (single sources carry none).
fn replayed_counts(s: &Schedule, n: u64) -> Vec<u64> {
    if s.sources() == 1 {
        return Vec::new();
    }
    let mut b = s.blender();
    b.seek(n);
    b.counts().to_vec()
}

/// Asserts that `c` carries the blend's exact counts at its watermark. A cursor still at
/// sample 0 may carry none: there is nothing to replay.
fn assert_counts_exact(s: &Schedule, c: &Cursor) {
    let watermark = c.watermark().expect("a cursor the schedule made");
    if watermark == 0 && c.blend.is_empty() {
        return;
    }
    assert_eq!(c.blend, replayed_counts(s, watermark), "blend of {c:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Resuming from a cursor with the blend's counts gives the same samples as resuming from
    /// the same cursor without them (which replays the blend from 0), and both are the tail of
    /// the uninterrupted stream.
    #[test]
    fn resume_with_counts_equals_replay((p, tokens) in arb_plan(), cut in 0.0f64..1.0, rank in 0u32..6) {
        let p = with_rank(&p, rank % p.world, p.world);
        let s = schedule(&p, &tokens);
        let full: Vec<SampleRef> = s.iter_rank(Cursor::START).unwrap().collect();
        let k = (full.len() as f64 * cut) as usize;
        let mut it = s.iter_rank(Cursor::START).unwrap();
        it.by_ref().take(k).for_each(drop);
        let with = it.cursor();
        if s.sources() > 1 && k > 0 {
            prop_assert!(!with.blend.is_empty());
        }
        assert_counts_exact(&s, &with);
        let without = Cursor { blend: Vec::new(), ..with.clone() };
        let a: Vec<SampleRef> = s.iter_rank(with).unwrap().collect();
        let b: Vec<SampleRef> = s.iter_rank(without).unwrap().collect();
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(&a[..], &full[k..]);
    }

    /// Sub-ranks that stop at random positions, merged and resumed on another number of ranks:
    /// every global sample exactly once, each the same sample as in the uninterrupted stream.
    #[test]
    fn merged_cursors_resume_on_any_world((p, tokens) in arb_plan(), new_world in 1u32..6,
                                          cuts in prop::collection::vec(0.0f64..1.0, 6)) {
        let p = Plan { drop_last: false, ..p };
        let world = p.world;
        let mut seen = BTreeMap::new();
        let mut cursors = Vec::new();
        for r in 0..world {
            let s = schedule(&with_rank(&p, r, world), &tokens);
            let mut it = s.iter_rank(Cursor::START).unwrap();
            let k = (s.rank_samples() as f64 * cuts[r as usize]) as usize;
            for x in it.by_ref().take(k) {
                *seen.entry(x.global).or_insert(0) += 1;
            }
            let c = it.cursor();
            assert_counts_exact(&s, &c);
            cursors.push(c);
        }
        let merged = merge_cursors(&cursors).unwrap();
        let any = schedule(&p, &tokens);
        assert_counts_exact(&any, &merged);
        prop_assert_eq!(merged.consumed_samples, seen.len() as u64);
        let global = global_stream(&p, &tokens);
        for r in 0..new_world {
            let s = schedule(&with_rank(&p, r, new_world), &tokens);
            let mut it = s.iter_rank(merged.clone()).unwrap();
            while let Some(x) = it.next() {
                prop_assert_eq!(&x, &global[x.global as usize]);
                *seen.entry(x.global).or_insert(0) += 1;
                // A reader that receives only `consumed_samples` rebuilds the same cursor.
                let c = it.cursor();
                let rebuilt = merged.moved_to(c.epoch, c.consumed_samples);
                prop_assert_eq!(&rebuilt.delivered, &c.delivered);
            }
        }
        prop_assert_eq!(seen.len() as u64, any.total_samples());
        prop_assert!(seen.values().all(|&n| n == 1), "a sample delivered twice");
    }
}

/// The whole global stream, one sample per global index.
fn global_stream(p: &Plan, tokens: &[u64]) -> Vec<SampleRef> {
    let s = schedule(&with_rank(p, 0, 1), tokens);
    s.iter_rank(Cursor::START).unwrap().collect()
}

/// One run of `ranks × workers` sub-ranks from `start`: sub-rank `i` consumes `take[i]`
/// batches (workers prefetch unevenly). Returns the samples it delivered and the sub-ranks'
/// cursors, each checked for exact blend counts.
fn run(
    p: &Plan,
    tokens: &[u64],
    subranks: u32,
    start: &Cursor,
    take: &[usize],
) -> (Vec<SampleRef>, Vec<Cursor>) {
    let mut delivered = Vec::new();
    let mut cursors = Vec::new();
    for r in 0..subranks {
        let s = schedule(&with_rank(p, r, subranks), tokens);
        let mut it = s.iter_rank(start.clone()).unwrap();
        for _ in 0..take[r as usize] {
            let Some(b) = it.next_batch() else { break };
            delivered.extend(b.samples);
        }
        let c = it.cursor();
        assert_counts_exact(&s, &c);
        // A reader that receives only `consumed_samples` rebuilds the same cursor.
        let rebuilt = start.moved_to(c.epoch, c.consumed_samples);
        assert_eq!(rebuilt.delivered, c.delivered, "sub-rank {r}");
        cursors.push(c);
    }
    (delivered, cursors)
}

/// The cases: 2 ranks × 3 workers, two sources, resumed on 3 × 1 and on 1 × 4, then
/// checkpointed unevenly again and resumed once more; every sample exactly once, and every
/// cursor's counts exact.
#[test]
fn elastic_resume_2x3_to_3x1_and_1x4() {
    let mut p = plan(&[0.7, 0.3], 16, 4);
    p.seed = 11;
    p.epochs = Some(2);
    let tokens = [16 * 150 + 1, 16 * 70 + 1];
    let total = schedule(&p, &tokens).total_samples();
    let global = global_stream(&p, &tokens);
    // Workers of a rank are sub-ranks rank * 3 + worker; each prefetched differently.
    let (first, cursors) = run(&p, &tokens, 6, &Cursor::START, &[9, 11, 10, 12, 9, 13]);
    let merged = merge_cursors(&cursors).unwrap();
    assert_eq!(merged.consumed_samples, first.len() as u64);
    assert!(
        !merged.delivered.is_empty(),
        "uneven workers leave samples past the watermark"
    );
    for (next, takes) in [(3u32, vec![7usize, 3, 5]), (4, vec![2, 6, 4, 5])] {
        let (second, again) = run(&p, &tokens, next, &merged, &takes);
        let merged2 = merge_cursors(&again).unwrap();
        assert_counts_exact(&schedule(&p, &tokens), &merged2);
        assert_eq!(
            merged2.consumed_samples,
            (first.len() + second.len()) as u64
        );
        // The rest, on yet another topology, to the end.
        let (third, _) = run(&p, &tokens, 5, &merged2, &[usize::MAX / 2; 5]);
        let mut count = BTreeMap::new();
        for x in first.iter().chain(&second).chain(&third) {
            assert_eq!(x, &global[x.global as usize], "sample {} changed", x.global);
            *count.entry(x.global).or_insert(0u32) += 1;
        }
        assert_eq!(
            count.len() as u64,
            total,
            "resumed on {next}: a sample is missing"
        );
        assert!(
            count.values().all(|&n| n == 1),
            "resumed on {next}: a sample twice"
        );
    }
}

/// Merging refuses what no run produces, by name.
#[test]
fn merge_refuses_foreign_cursors() {
    assert_eq!(
        merge_cursors(&[]).unwrap_err().to_string(),
        "cursor: no cursors to merge"
    );
    let a = Cursor {
        delivered: vec![10],
        ..Cursor::new(0, 8)
    };
    let b = Cursor {
        delivered: vec![11],
        ..Cursor::new(0, 9)
    };
    assert_eq!(
        merge_cursors(&[a, b]).unwrap_err().to_string(),
        "cursor: cursor 1 is not from the same run as the others: its delivered samples are \
         not the slowest cursor's"
    );
    assert_eq!(
        merge_cursors(&[Cursor::new(0, 0), Cursor::new(0, 1 << 40)])
            .unwrap_err()
            .to_string(),
        "cursor: the sub-ranks are 1099511627776 samples apart, more than a run's prefetch \
         leaves (4194304 at most delivered past the slowest)"
    );
}

/// A cursor saved between steps on one world resumes on the same world exactly as before:
/// Megatron's `consumed_samples` semantics are unchanged by the new parts.
#[test]
fn a_plain_cursor_resumes_as_before() {
    let p = with_rank(&plan(&[0.5, 0.25, 0.25], 8, 2), 1, 3);
    let tokens = [801, 401, 401];
    let s = schedule(&p, &tokens);
    let full: Vec<SampleRef> = s.iter_rank(Cursor::START).unwrap().collect();
    let tail: Vec<SampleRef> = s.iter_rank(s.cursor_at(30)).unwrap().collect();
    assert_eq!(tail, full[10..]);
    assert!(tail.iter().all(|x| x.global % 3 == 1));
}
