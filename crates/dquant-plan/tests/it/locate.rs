//! `locate` both ways against brute force: every rank's stream, walked batch by batch, says
//! which step and rank receive each global sample and which tokens it holds; a document's
//! samples are found by checking every delivered sample's token window.

use std::collections::BTreeMap;

use crate::common;

use common::{plan, schedule, with_rank};
use dquant_plan::{Cursor, Plan, SampleRef, Stage, WhenExhausted};

/// Every delivered global sample, from the ranks' own streams: (step, rank, sample).
fn brute(p: &Plan, tokens: &[u64]) -> BTreeMap<u64, (u64, u64, SampleRef)> {
    let mut all = BTreeMap::new();
    for r in 0..p.world {
        let s = schedule(&with_rank(p, r, p.world), tokens);
        let mut it = s.iter_rank(Cursor::START).unwrap();
        while let Some(b) = it.next_batch() {
            for smp in b.samples {
                let prev = all.insert(smp.global, (b.index, u64::from(r), smp));
                assert!(prev.is_none());
            }
        }
    }
    all
}

/// The plans of the tests: blended, shuffled and not, several epochs, stages, limits,
/// sharded with and without drop_last.
fn plans() -> Vec<(&'static str, Plan, Vec<u64>)> {
    let tokens = vec![4_001, 1_201, 2_503];
    let mut out = Vec::new();
    let mut p = plan(&[0.5, 0.3, 0.2], 10, 4);
    p.epochs = Some(3);
    out.push(("blended, shuffled, 3 epochs", p.clone(), tokens.clone()));
    let mut q = p.clone();
    q.shuffle = false;
    out.push(("unshuffled", q, tokens.clone()));
    let mut q = with_rank(&p, 0, 3);
    q.drop_last = true;
    out.push(("world 3, drop_last", q, tokens.clone()));
    let mut q = with_rank(&p, 0, 5);
    q.drop_last = false;
    q.batch_size = 3;
    out.push(("world 5, kept last batch", q, tokens.clone()));
    let mut q = p.clone();
    q.samples = Some(5_000);
    q.epochs = None;
    q.stages = vec![Stage {
        start_sample: Some(1_500),
        start_fraction: None,
        weights: vec![0.1, 0.1, 0.8],
    }];
    out.push(("staged", q, tokens.clone()));
    let mut q = p.clone();
    q.samples = Some(2_000);
    q.epochs = None;
    q.sources[1].max_samples = Some(150);
    q.when_exhausted = WhenExhausted::Renormalize;
    out.push(("a limited source, renormalized", q, tokens.clone()));
    let mut q = plan(&[1.0], 7, 2);
    q.epochs = Some(2);
    out.push(("one source", q, vec![3_000]));
    out
}

#[test]
fn locate_gives_each_samples_step_rank_and_tokens() {
    for (name, p, tokens) in plans() {
        let want = brute(&p, &tokens);
        let s = schedule(&p, &tokens);
        assert_eq!(s.delivered_samples(), want.len() as u64, "{name}");
        let mut index = s.blend_index();
        // Out of order on purpose: the index answers any sample, not only a forward walk.
        let mut order: Vec<u64> = want.keys().copied().collect();
        order.reverse();
        let third = order.len() / 3;
        order.rotate_left(third);
        for i in order {
            let got = s.locate(&mut index, i).unwrap();
            let (step, rank, smp) = &want[&i];
            assert_eq!(
                (got.step, got.rank, &got.sample),
                (*step, *rank, smp),
                "{name}: {i}"
            );
        }
    }
}

#[test]
fn locate_refuses_samples_nobody_receives() {
    let (_, p, tokens) = plans().swap_remove(2);
    let s = schedule(&p, &tokens);
    let mut index = s.blend_index();
    let (delivered, total) = (s.delivered_samples(), s.total_samples());
    assert!(delivered < total);
    assert_eq!(
        s.locate(&mut index, delivered).unwrap_err().to_string(),
        format!("sample: {delivered} is past the last full batch of every rank (drop_last): {delivered} samples are delivered")
    );
    assert_eq!(
        s.locate(&mut index, total).unwrap_err().to_string(),
        format!("sample: {total} is past the end of the plan: {delivered} samples are delivered")
    );
}

#[test]
fn samples_holding_a_token_range_are_every_sample_that_reads_it() {
    for (name, p, tokens) in plans() {
        let all = brute(&p, &tokens);
        let s = schedule(&p, &tokens);
        let mut index = s.blend_index();
        let ranges = |d: usize| {
            let t = tokens[d];
            [
                0..1,
                0..25,
                9..11,
                10..11,
                11..12,
                333..1_000,
                t - 1..t,
                t - 40..t,
                0..t,
            ]
        };
        let windows = [0..u64::MAX, 0..0, 100..900, 1_234..1_235, 3_000..u64::MAX];
        for d in 0..tokens.len() {
            for tr in ranges(d) {
                for w in windows.clone() {
                    let want: Vec<u64> = all
                        .values()
                        .filter(|(_, _, x)| x.source == d && w.contains(&x.global))
                        .filter(|(_, _, x)| x.tokens.start < tr.end && tr.start < x.tokens.end)
                        .map(|(_, _, x)| x.global)
                        .collect();
                    let got = s.samples_holding(&mut index, d, tr.clone(), w.clone());
                    assert_eq!(got, want, "{name}: source {d} tokens {tr:?} samples {w:?}");
                }
            }
        }
    }
}
