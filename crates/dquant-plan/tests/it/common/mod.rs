//! Reference implementations the tests compare the crate against: written the obvious,
//! materializing way, as Megatron-Core does it.
#![allow(dead_code)]

use dquant_plan::{Permutation, Plan, PlanError, SampleRef, Schedule, Source, SourceInfo};
use proptest::prelude::*;

/// Megatron-Core's `build_blending_indices` (helpers.cpp), transcribed: weights normalized with
/// numpy's `w / w.sum()`, then for every sample the argmax of `w_d * max(i, 1) - count_d`,
/// first index on ties. Returns `(dataset_index, dataset_sample_index)`.
pub fn megatron_blend(weights: &[f64], size: usize) -> (Vec<usize>, Vec<u64>) {
    let sum: f64 = weights.iter().sum();
    let w: Vec<f64> = weights.iter().map(|x| x / sum).collect();
    let mut current = vec![0u64; w.len()];
    let mut dataset_index = Vec::with_capacity(size);
    let mut dataset_sample_index = Vec::with_capacity(size);
    for sample_idx in 0..size {
        let sample_idx_double = (sample_idx as f64).max(1.0);
        let mut max_error_index = 0;
        let mut max_error = w[0] * sample_idx_double - current[0] as f64;
        for dataset_idx in 1..w.len() {
            let error = w[dataset_idx] * sample_idx_double - current[dataset_idx] as f64;
            if error > max_error {
                max_error = error;
                max_error_index = dataset_idx;
            }
        }
        dataset_index.push(max_error_index);
        dataset_sample_index.push(current[max_error_index]);
        current[max_error_index] += 1;
    }
    (dataset_index, dataset_sample_index)
}

/// The whole global stream of a plan, built the materializing way: the blend arrays, then
/// every epoch's full shuffle order per source, then the token range of each sample.
pub fn reference_global(plan: &Plan, tokens: &[u64]) -> Vec<SampleRef> {
    let seq = plan.seq_len as u64;
    let per_epoch: Vec<u64> = tokens.iter().map(|t| (t - 1) / seq).collect();
    let total = match plan.samples {
        Some(n) => n,
        None => per_epoch.iter().sum::<u64>() * plan.epochs.unwrap_or(1) as u64,
    } as usize;
    let weights: Vec<f64> = plan.sources.iter().map(|s| s.weight).collect();
    let (di, dsi) = megatron_blend(&weights, total);
    // orders[d][e] = the full order of epoch e of source d.
    let mut orders: Vec<Vec<Vec<u64>>> = vec![Vec::new(); tokens.len()];
    (0..total)
        .map(|i| {
            let (d, j) = (di[i], dsi[i]);
            let n = per_epoch[d];
            let (e, p) = ((j / n) as usize, j % n);
            while orders[d].len() <= e {
                let ep = orders[d].len() as u64;
                let order: Vec<u64> = if plan.shuffle {
                    let key = key_of(plan.seed, d as u64, ep);
                    let perm = Permutation::new(n, key);
                    (0..n).map(|x| perm.apply(x)).collect()
                } else {
                    (0..n).collect()
                };
                orders[d].push(order);
            }
            let k = orders[d][e][p as usize];
            SampleRef {
                global: i as u64,
                source: d,
                epoch: e as u64,
                index: k,
                tokens: k * seq..k * seq + seq + 1,
            }
        })
        .collect()
}

/// The permutation key of epoch `e` of source `d`, read back from the crate (one sample of a
/// one-source, one-epoch schedule would not expose it), so the reference reuses only the
/// bijection itself, which is tested on its own.
fn key_of(seed: u64, d: u64, e: u64) -> u64 {
    dquant_plan::permute::epoch_key(seed, d, e)
}

/// The local stream of `rank`, filtered out of the reference global stream, with the plan's
/// `drop_last` applied.
pub fn reference_rank(plan: &Plan, tokens: &[u64], rank: u32) -> Vec<SampleRef> {
    let global = reference_global(plan, tokens);
    let world = plan.world as usize;
    let mut local: Vec<SampleRef> = global
        .into_iter()
        .filter(|s| s.global % world as u64 == rank as u64)
        .collect();
    if plan.drop_last {
        // Every rank stops at the smallest rank's last full batch.
        let min = (reference_total(plan, tokens) / world) / plan.batch_size as usize
            * plan.batch_size as usize;
        local.truncate(min);
    }
    local
}

pub fn reference_total(plan: &Plan, tokens: &[u64]) -> usize {
    let seq = plan.seq_len as u64;
    match plan.samples {
        Some(n) => n as usize,
        None => {
            tokens.iter().map(|t| (t - 1) / seq).sum::<u64>() as usize
                * plan.epochs.unwrap_or(1) as usize
        }
    }
}

/// A plan over `weights.len()` sources named `s0`, `s1`, ...
pub fn plan(weights: &[f64], seq_len: u32, batch_size: u32) -> Plan {
    Plan::new(
        weights
            .iter()
            .enumerate()
            .map(|(d, &w)| Source::new(format!("s{d}")).weight(w))
            .collect(),
        seq_len,
        batch_size,
    )
}

pub fn infos(tokens: &[u64]) -> Vec<SourceInfo> {
    tokens.iter().map(|&tokens| SourceInfo { tokens }).collect()
}

pub fn schedule(plan: &Plan, tokens: &[u64]) -> Schedule {
    Schedule::new(plan, &infos(tokens)).unwrap()
}

/// The message `validate` refuses `p` with once `f` changed it: a field error
/// (`PlanError::Invalid`), never a parse error.
pub fn invalid(mut p: Plan, f: impl FnOnce(&mut Plan)) -> String {
    f(&mut p);
    match p.validate() {
        Err(e @ PlanError::Invalid { .. }) => e.to_string(),
        other => panic!("{other:?}"),
    }
}

/// The message a schedule over sources of `tokens` refuses `p` with.
pub fn schedule_err(p: &Plan, tokens: &[u64]) -> String {
    Schedule::new(p, &infos(tokens)).unwrap_err().to_string()
}

/// `p` for rank `rank` of `world`.
pub fn with_rank(p: &Plan, rank: u32, world: u32) -> Plan {
    Plan {
        rank,
        world,
        ..p.clone()
    }
}

/// Random plans (1–3 sources, small seq_len and batch, any seed, world up to 5) with token
/// counts large enough for one sample each.
pub fn arb_plan() -> impl Strategy<Value = (Plan, Vec<u64>)> {
    (
        prop::collection::vec((0.05f64..5.0, 2u64..3000), 1..4),
        1u32..40,
        1u32..5,
        any::<u64>(),
        any::<bool>(),
        any::<bool>(),
        1u32..6,
        prop::option::of(1u64..1500),
    )
        .prop_filter_map(
            "sources too small for seq_len",
            |(srcs, seq_len, bs, seed, shuffle, drop_last, world, samples)| {
                if srcs.iter().any(|&(_, t)| t <= seq_len as u64) {
                    return None;
                }
                let w: Vec<f64> = srcs.iter().map(|s| s.0).collect();
                let mut p = plan(&w, seq_len, bs);
                (p.seed, p.shuffle, p.drop_last, p.world, p.samples) =
                    (seed, shuffle, drop_last, world, samples);
                Some((p, srcs.iter().map(|s| s.1).collect()))
            },
        )
}
