//! Changing a running job's plan: which changes a saved cursor may continue under.
//!
//! Megatron-Core issue 457: a job resumed with another blend loses or repeats samples,
//! because its blending indices are rebuilt from sample 0 under the new weights. Here the
//! blend's state at a cursor is only its per-source counts ([`crate::mixture`]), and every
//! sample below a position depends only on the schedule's segments that start below it. So a
//! plan may change its `stages`, `interpolate` and the run's length (`samples`, `epochs`) as
//! long as every sample the cursor covers blends the same under both plans; everything else
//! (sources, packing, seed, sharding, outputs) must stay, or the samples before the cursor
//! would not be the ones consumed. [`check_plan_change`] decides, and says what it accepted.

use crate::cursor::Cursor;
use crate::error::PlanError;
use crate::plan::Plan;
use crate::schedule::{Schedule, SourceInfo};

/// Whether cursors saved under `saved` continue under `new` without a sample lost or
/// repeated, given the sources' token counts; `Ok` says what changes and from where.
/// `cursors` are every sub-rank's (or one merged cursor): the check covers every sample any of
/// them consumed or lists as delivered.
pub fn check_plan_change(
    saved: &Plan,
    new: &Plan,
    sources: &[SourceInfo],
    cursors: &[Cursor],
) -> Result<String, PlanError> {
    if let Some(field) = first_fixed_difference(saved, new) {
        return Err(PlanError::Cursor(format!(
            "the plan's {field} differs from the saved plan's: only stages, interpolate, \
             samples and epochs may change while a run resumes"
        )));
    }
    let (old, now) = (Schedule::new(saved, sources)?, Schedule::new(new, sources)?);
    let reach = cursors
        .iter()
        .map(|c| {
            let past = c.delivered.last().map_or(0, |&d| d.saturating_add(1));
            c.consumed_samples.max(past)
        })
        .max()
        .unwrap_or(0);
    if reach > now.total_samples() {
        return Err(PlanError::Cursor(format!(
            "the saved position reaches sample {reach}, past the end of the changed plan ({} \
             samples)",
            now.total_samples()
        )));
    }
    let (a, b) = (old.mixture(), now.mixture());
    if let Err(at) = a.agrees_below(&b, reach) {
        return Err(PlanError::Cursor(format!(
            "the changed plan blends differently from sample {at} on, before the saved \
             position (sample {reach}): those samples were consumed under the saved weights; \
             change only stages that start at or after sample {reach}"
        )));
    }
    let mut said = Vec::new();
    if a != b {
        let first = b
            .starts()
            .chain(a.starts())
            .filter(|&s| s >= reach)
            .min()
            .map_or_else(|| "the end".into(), |s| format!("sample {s}"));
        said.push(format!(
            "the mixture changes from {first} on (stage starts {:?}, were {:?})",
            b.starts().collect::<Vec<_>>(),
            a.starts().collect::<Vec<_>>()
        ));
    }
    if old.total_samples() != now.total_samples() {
        said.push(format!(
            "the run has {} samples (was {})",
            now.total_samples(),
            old.total_samples()
        ));
    }
    Ok(if said.is_empty() {
        format!("the plan is unchanged; resuming at sample {reach}")
    } else {
        format!(
            "accepted: {}; every sample before the saved position (sample {reach}) is blended as before, and the blend goes on from the cursor's exact per-source counts",
            said.join("; ")
        )
    })
}

/// The first field, other than the mixture and the run's length, in which the plans differ.
fn first_fixed_difference(a: &Plan, b: &Plan) -> Option<String> {
    let strip = |p: &Plan| {
        let mut v = serde_json::to_value(p).unwrap_or(serde_json::Value::Null);
        if let Some(o) = v.as_object_mut() {
            for k in ["stages", "interpolate", "samples", "epochs"] {
                o.remove(k);
            }
        }
        v
    };
    let (x, y) = (strip(a), strip(b));
    let (Some(x), Some(y)) = (x.as_object(), y.as_object()) else {
        return Some("text".into());
    };
    x.keys()
        .chain(y.keys())
        .find(|k| x.get(*k) != y.get(*k))
        .cloned()
}
