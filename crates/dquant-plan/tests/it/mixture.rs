//! Mixture schedules: stage weights hold at every prefix (each source within `[-1, n - 1]`
//! samples of its integrated weight), the stream before the first stage is Megatron's, a
//! cursor resumes exactly across a stage boundary (with counts and by replay, on any rank), a
//! schedule changed after the cursor continues with nothing lost or repeated, and a change
//! before it is refused with the sample where it would bite.

use crate::common;

use common::{infos, invalid, megatron_blend, plan, schedule, schedule_err, with_rank};
use dquant_plan::{check_plan_change, Cursor, Interpolate, Plan, SampleRef, Stage};

const TOKENS: [u64; 3] = [40_001, 20_001, 30_001];

fn staged(interpolate: Interpolate) -> Plan {
    let mut p = plan(&[0.6, 0.3, 0.1], 10, 4);
    p.samples = Some(3_000);
    p.stages = vec![
        Stage {
            start_sample: Some(1_000),
            start_fraction: None,
            weights: vec![0.2, 0.2, 0.6],
        },
        Stage {
            start_sample: None,
            start_fraction: Some(0.8),
            weights: vec![0.0, 1.0, 1.0],
        },
    ];
    p.interpolate = interpolate;
    p
}

/// The sources of the whole global stream, in order.
fn picks(p: &Plan) -> Vec<usize> {
    let s = schedule(p, &TOKENS);
    s.iter_rank(Cursor::START)
        .unwrap()
        .map(|x| x.source)
        .collect()
}

/// The weight source `d` is owed over samples `0..i`: the integral of its normalized weight.
fn owed(i: u64, d: usize, interpolate: Interpolate) -> f64 {
    let w = |k: usize| -> [f64; 3] {
        match k {
            0 => [0.6, 0.3, 0.1],
            1 => [0.2, 0.2, 0.6],
            _ => [0.0, 0.5, 0.5],
        }
    };
    let points = [0u64, 1_000, 2_400];
    let mut total = 0.0;
    for k in 0..3 {
        let (a, b) = (points[k], points.get(k + 1).copied().unwrap_or(u64::MAX));
        if i <= a {
            break;
        }
        let x = (i.min(b) - a) as f64;
        total += match (interpolate, k) {
            (Interpolate::Linear, 0 | 1) => {
                let len = (b - a) as f64;
                w(k)[d] * x + (w(k + 1)[d] - w(k)[d]) * x * x / (2.0 * len)
            }
            _ => w(k)[d] * x,
        };
    }
    total
}

#[test]
fn every_prefix_stays_within_the_rules_bound_of_its_integrated_weights() {
    for interpolate in [Interpolate::Step, Interpolate::Linear] {
        let p = staged(interpolate);
        let picks = picks(&p);
        assert_eq!(picks.len(), 3_000);
        let mut counts = [0u64; 3];
        for (i, &d) in picks.iter().enumerate() {
            counts[d] += 1;
            let n = i as u64 + 1;
            for (d, &c) in counts.iter().enumerate() {
                let err = owed(n, d, interpolate) - c as f64;
                assert!(
                    (-1.0 - 1e-9..=2.0 + 1e-9).contains(&err),
                    "{interpolate:?} prefix {n}: source {d} has {c}, owed {:.2}",
                    owed(n, d, interpolate)
                );
            }
        }
        // The last stage leaves source 0 out: it is drawn only while it is still owed
        // samples from before, or by a rounding of its target at an exact tie (at most
        // #sources - 1 times in all: its error never goes below -1).
        if interpolate == Interpolate::Step {
            let late: Vec<usize> = (2_400..3_000).filter(|&i| picks[i] == 0).collect();
            assert!(late.len() <= 2, "{late:?}");
            let stage1 = &picks[1_000..2_400];
            let share = stage1.iter().filter(|&&d| d == 2).count();
            assert!((share as f64 - 0.6 * 1_400.0).abs() <= 2.0, "{share}");
        }
    }
}

#[test]
fn before_the_first_stage_the_blend_is_megatrons() {
    let p = staged(Interpolate::Step);
    let (want, _) = megatron_blend(&[0.6, 0.3, 0.1], 1_000);
    assert_eq!(picks(&p)[..1_000], want[..]);
}

#[test]
fn cursors_resume_exactly_across_stage_boundaries() {
    for interpolate in [Interpolate::Step, Interpolate::Linear] {
        for (rank, world) in [(0, 1), (2, 3)] {
            let p = with_rank(&staged(interpolate), rank, world);
            let s = schedule(&p, &TOKENS);
            let mut it = s.iter_rank(Cursor::START).unwrap();
            let whole: Vec<SampleRef> = s.iter_rank(Cursor::START).unwrap().collect();
            let mut taken = 0;
            while let Some(b) = it.next_batch() {
                taken += b.samples.len();
                let c = it.cursor();
                let rest: Vec<SampleRef> = s.iter_rank(c.clone()).unwrap().collect();
                assert_eq!(
                    rest[..],
                    whole[taken..],
                    "{interpolate:?} rank {rank} at {c:?}"
                );
                if c.consumed_samples.is_multiple_of(200) {
                    // Without counts the blend is replayed across the stages: the same rest.
                    let plain = Cursor::new(c.epoch, c.consumed_samples);
                    let replayed: Vec<SampleRef> = s.iter_rank(plain).unwrap().collect();
                    assert_eq!(replayed, rest);
                }
            }
        }
    }
}

fn changed_after(p: &Plan, at: u64) -> Plan {
    let mut q = p.clone();
    q.stages[1] = Stage {
        start_sample: Some(at),
        start_fraction: None,
        weights: vec![1.0, 0.0, 3.0],
    };
    q
}

#[test]
fn a_schedule_changed_after_the_cursor_continues_without_loss_or_repeats() {
    // Unshuffled, so a sample's index is its position in the source: the j-th draw of a
    // source must be its sample j.
    let p = Plan {
        shuffle: false,
        ..staged(Interpolate::Step)
    };
    let s = schedule(&p, &TOKENS);
    let mut it = s.iter_rank(Cursor::START).unwrap();
    let head: Vec<SampleRef> = it.by_ref().take(1_700).collect();
    let cursor = it.cursor();
    assert_eq!(cursor.consumed_samples, 1_700);

    let q = changed_after(&p, 2_000);
    let said = check_plan_change(&p, &q, &infos(&TOKENS), std::slice::from_ref(&cursor)).unwrap();
    assert_eq!(
        said,
        "accepted: the mixture changes from sample 2000 on (stage starts [1000, 2000], were \
         [1000, 2400]); every sample before the saved position (sample 1700) is blended as \
         before, and the blend goes on from the cursor's exact per-source counts"
    );
    let t = schedule(&q, &TOKENS);
    let rest: Vec<SampleRef> = t.iter_rank(cursor).unwrap().collect();
    // The resumed stream is exactly the changed plan's stream: its head is the saved head,
    // so every sample of every source is drawn once, in order (the blend's own guarantee).
    let whole: Vec<SampleRef> = t.iter_rank(Cursor::START).unwrap().collect();
    assert_eq!(whole[..1_700], head[..]);
    assert_eq!(whole[1_700..], rest[..]);
    let mut next = [0u64; 3];
    for x in head.iter().chain(&rest) {
        let j = x.epoch * t.samples_per_epoch(x.source) + x.index;
        assert_eq!(j, next[x.source], "source {} drawn out of order", x.source);
        next[x.source] += 1;
    }
    assert_eq!(next.iter().sum::<u64>(), 3_000);
    let late: Vec<u64> = rest[300..]
        .iter()
        .filter(|x| x.source == 1)
        .map(|x| x.global)
        .collect();
    assert!(
        late.len() <= 2,
        "the new stage leaves source 1 out: {late:?}"
    );

    // The run extended too: said, and accepted.
    let mut longer = q.clone();
    longer.samples = Some(4_000);
    let c = Cursor::new(0, 1_700);
    assert!(check_plan_change(&p, &longer, &infos(&TOKENS), &[c])
        .unwrap()
        .contains("the run has 4000 samples (was 3000)"));
}

#[test]
fn a_change_before_the_cursor_is_refused_by_sample() {
    let p = staged(Interpolate::Step);
    let c = Cursor::new(0, 2_100);
    let err = |q: &Plan, c: &Cursor| {
        check_plan_change(&p, q, &infos(&TOKENS), std::slice::from_ref(c))
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        err(&changed_after(&p, 2_000), &c),
        "cursor: the changed plan blends differently from sample 2000 on, before the saved \
         position (sample 2100): those samples were consumed under the saved weights; change \
         only stages that start at or after sample 2100"
    );
    // A sample delivered past the watermark counts as consumed.
    let mut ahead = Cursor::new(0, 1_900);
    ahead.delivered = vec![2_050];
    assert!(err(&changed_after(&p, 2_000), &ahead).contains("(sample 2051)"));
    let mut seed = p.clone();
    seed.seed += 1;
    assert_eq!(
        err(&seed, &c),
        "cursor: the plan's seed differs from the saved plan's: only stages, interpolate, \
         samples and epochs may change while a run resumes"
    );
    let mut short = p.clone();
    short.samples = Some(2_050);
    short.stages.truncate(1);
    assert_eq!(
        err(&short, &c),
        "cursor: the saved position reaches sample 2100, past the end of the changed plan \
         (2050 samples)"
    );
    assert!(matches!(
        check_plan_change(&p, &p, &infos(&TOKENS), &[c]),
        Ok(s) if s == "the plan is unchanged; resuming at sample 2100"
    ));
}

#[test]
fn stage_fields_are_checked_by_name() {
    let invalid = |f: &dyn Fn(&mut Plan)| invalid(staged(Interpolate::Step), f);
    assert_eq!(
        invalid(&|p| p.stages[0].start_fraction = Some(0.5)),
        "stages[0]: give one of start_sample and start_fraction"
    );
    assert_eq!(
        invalid(&|p| p.stages[0].start_sample = Some(0)),
        "stages[0].start_sample: must be above 0 (the sources' weights hold from 0)"
    );
    assert_eq!(
        invalid(&|p| p.stages[1].start_fraction = Some(1.0)),
        "stages[1].start_fraction: must be in (0, 1) (got 1)"
    );
    assert_eq!(
        invalid(&|p| p.stages[0].weights.pop().map(drop).unwrap_or(())),
        "stages[0].weights: has 2 weights for 3 sources"
    );
    assert_eq!(
        invalid(&|p| p.stages[1].weights[2] = -1.0),
        "stages[1].weights[2]: must be a finite number >= 0 (got -1)"
    );
    assert_eq!(
        invalid(&|p| p.stages[1].weights = vec![0.0; 3]),
        "stages[1].weights: are all 0"
    );
    // Starts of both kinds are ordered once the run's length is known.
    let mut p = staged(Interpolate::Step);
    p.stages[0].start_sample = Some(2_500);
    assert_eq!(
        schedule_err(&p, &TOKENS),
        "stages[1].start_fraction: resolves to sample 2400, not after the previous start (2500)"
    );
    p.stages[0].start_sample = Some(3_000);
    assert_eq!(
        schedule_err(&p, &TOKENS),
        "stages[0].start_sample: resolves to sample 3000, at or past the run's 3000 samples"
    );
    // As a person writes it.
    let toml = r#"
        seq_len = 10
        batch_size = 4
        samples = 3000
        interpolate = "linear"
        [[sources]]
        uri = "a"
        weight = 0.7
        [[sources]]
        uri = "b"
        weight = 0.3
        [[stages]]
        start_fraction = 0.9
        weights = [0.2, 0.8]
    "#;
    let p = Plan::from_toml(toml).unwrap();
    assert_eq!(p.interpolate, Interpolate::Linear);
    assert_eq!(p.stages[0].start_fraction, Some(0.9));
    assert_eq!(Plan::from_json(&p.to_json()).unwrap(), p);
    assert_eq!(Plan::from_toml(&p.to_toml().unwrap()).unwrap(), p);
}
