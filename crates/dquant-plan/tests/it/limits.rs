//! Per-source limits: `"stop"` ends the run before any source passes its limit, `"renormalize"`
//! draws every limited source exactly to its limit and shares the rest by weight, both resume
//! exactly from cursors across the exhaustion, and reports say how many epochs each source
//! gave.

use crate::common;

use common::{invalid, plan, schedule, schedule_err, with_rank};
use dquant_plan::{source_use, Cursor, Plan, SampleRef, Stage, WhenExhausted};

/// Samples per epoch: 4000, 2000, 3000 at seq_len 10.
const TOKENS: [u64; 3] = [40_001, 20_001, 30_001];

fn limited(when: WhenExhausted) -> Plan {
    let mut p = plan(&[0.5, 0.3, 0.2], 10, 4);
    p.samples = Some(6_000);
    p.sources[1].max_samples = Some(500);
    p.sources[2].max_epochs = Some(1); // 3000 samples
    p.when_exhausted = when;
    p
}

fn counts_of(samples: &[SampleRef]) -> [u64; 3] {
    let mut c = [0u64; 3];
    for s in samples {
        c[s.source] += 1;
    }
    c
}

fn whole(p: &Plan) -> Vec<SampleRef> {
    schedule(p, &TOKENS)
        .iter_rank(Cursor::START)
        .unwrap()
        .collect()
}

#[test]
fn stop_ends_the_run_before_any_source_passes_its_limit() {
    let p = limited(WhenExhausted::Stop);
    let s = schedule(&p, &TOKENS);
    let all = whole(&p);
    assert_eq!(all.len() as u64, s.total_samples());
    let c = counts_of(&all);
    // Source 1 binds: 0.3 × N ≤ 499 gives N = 1663; it delivered within #sources of 500.
    assert_eq!(s.total_samples(), 1_663);
    assert!((497..=500).contains(&c[1]), "{c:?}");
    assert!(c[2] <= 3_000);
    // Without the limit the same plan draws the same first 1663 samples.
    let mut free = p.clone();
    free.sources[1].max_samples = None;
    free.sources[2].max_epochs = None;
    assert_eq!(whole(&free)[..1_663], all[..]);
    // A single source stops at exactly its limit.
    let mut one = plan(&[1.0], 10, 4);
    one.samples = Some(6_000);
    one.sources[0].max_samples = Some(777);
    assert_eq!(schedule(&one, &[40_001]).total_samples(), 777);
}

#[test]
fn renormalize_draws_every_limited_source_exactly_and_shares_the_rest() {
    let p = limited(WhenExhausted::Renormalize);
    let all = whole(&p);
    // Source 0 is unlimited: the run keeps its 6000 samples.
    assert_eq!(all.len(), 6_000);
    let c = counts_of(&all);
    assert_eq!(c.iter().sum::<u64>(), 6_000);
    assert_eq!(c[1], 500, "{c:?}");
    // 0.2 × 1667 before source 1 runs out, then 2/7 of the remaining 4333.
    assert!(
        (c[2] as f64 - (333.4 + 4_333.0 * 2.0 / 7.0)).abs() <= 3.0,
        "{c:?}"
    );
    // Source 1 runs out first (near sample 1667); from there 0 and 2 share 5:2.
    let mut seen = [0u64; 3];
    let mut exhausted_at = None;
    for (i, x) in all.iter().enumerate() {
        seen[x.source] += 1;
        if seen[1] == 500 && exhausted_at.is_none() {
            exhausted_at = Some(i + 1);
        }
    }
    let e = exhausted_at.unwrap();
    let after = counts_of(&all[e..e + 1_400]);
    assert_eq!(after[1], 0);
    assert!((after[0] as f64 - 1_000.0).abs() <= 3.0, "{after:?}");
    // Every source limited: the run is exactly the sum of the limits.
    let mut q = p.clone();
    q.sources[0].max_samples = Some(100);
    let s = schedule(&q, &TOKENS);
    assert_eq!(s.total_samples(), 3_600);
    assert_eq!(counts_of(&whole(&q)), [100, 500, 3_000]);
}

#[test]
fn cursors_resume_exactly_across_an_exhaustion() {
    for when in [WhenExhausted::Stop, WhenExhausted::Renormalize] {
        for (rank, world) in [(0, 1), (1, 3)] {
            let mut p = with_rank(&limited(when), rank, world);
            p.batch_size = 64;
            let s = schedule(&p, &TOKENS);
            let all: Vec<SampleRef> = s.iter_rank(Cursor::START).unwrap().collect();
            let mut it = s.iter_rank(Cursor::START).unwrap();
            let mut taken = 0;
            while let Some(b) = it.next_batch() {
                taken += b.samples.len();
                let c = it.cursor();
                let rest: Vec<SampleRef> = s.iter_rank(c.clone()).unwrap().collect();
                assert_eq!(rest[..], all[taken..], "{when:?} rank {rank} at {c:?}");
                let plain = Cursor::new(c.epoch, c.consumed_samples);
                let replayed: Vec<SampleRef> = s.iter_rank(plain).unwrap().collect();
                assert_eq!(replayed, rest);
            }
        }
    }
}

#[test]
fn limits_combine_with_stages() {
    let mut p = limited(WhenExhausted::Renormalize);
    p.stages = vec![Stage {
        start_sample: Some(3_000),
        start_fraction: None,
        weights: vec![0.0, 1.0, 1.0],
    }];
    let all = whole(&p);
    let c = counts_of(&all);
    assert!(c[1] <= 500 && c[2] <= 3_000, "{c:?}");
    assert_eq!(c.iter().sum::<u64>(), 6_000);
}

#[test]
fn reports_say_how_many_epochs_each_source_gave() {
    let p = limited(WhenExhausted::Renormalize);
    let s = schedule(&p, &TOKENS);
    let per_epoch: Vec<u64> = (0..3).map(|d| s.samples_per_epoch(d)).collect();
    assert_eq!(per_epoch, [4_000, 2_000, 3_000]);
    let mut it = s.iter_rank(Cursor::START).unwrap();
    for _ in 0..6_000 {
        it.next();
    }
    let u = source_use(&per_epoch, &it.cursor()).unwrap();
    let c = counts_of(&whole(&p));
    for d in 0..3 {
        assert_eq!(u[d].samples, c[d]);
        assert_eq!(u[d].epochs, c[d] as f64 / per_epoch[d] as f64);
    }
    assert_eq!(u[1].epochs, 0.25);
    assert_eq!(
        source_use(&[4_000], &Cursor::new(0, 6_000)).unwrap()[0].epochs,
        1.5
    );
    assert!(source_use(&per_epoch, &Cursor::new(0, 10)).is_none());
}

#[test]
fn limit_fields_are_checked_by_name() {
    let invalid = |f: &dyn Fn(&mut Plan)| invalid(limited(WhenExhausted::Stop), f);
    assert_eq!(
        invalid(&|p| p.sources[1].max_epochs = Some(2)),
        "sources[1]: give at most one of max_epochs and max_samples"
    );
    assert_eq!(
        invalid(&|p| p.sources[2].max_epochs = Some(0)),
        "sources[2].max_epochs: must be at least 1"
    );
    assert_eq!(
        invalid(&|p| p.sources[1].max_samples = Some(0)),
        "sources[1].max_samples: must be at least 1"
    );
    let mut tiny = limited(WhenExhausted::Stop);
    tiny.sources[1].max_samples = Some(1);
    assert_eq!(
        schedule_err(&tiny, &TOKENS),
        "sources[1]: its limit of 1 samples is reached before the run's first sample at its \
         weight; raise it, or use when_exhausted = \"renormalize\""
    );
    let toml = r#"
        seq_len = 10
        batch_size = 4
        samples = 100
        when_exhausted = "renormalize"
        [[sources]]
        uri = "a"
        max_epochs = 2
        [[sources]]
        uri = "b"
        max_samples = 30
    "#;
    let p = Plan::from_toml(toml).unwrap();
    assert_eq!(p.when_exhausted, WhenExhausted::Renormalize);
    assert_eq!(
        (p.sources[0].max_epochs, p.sources[1].max_samples),
        (Some(2), Some(30))
    );
    assert_eq!(Plan::from_json(&p.to_json()).unwrap(), p);
}
