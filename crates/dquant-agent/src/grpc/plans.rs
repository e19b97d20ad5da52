//! Plan sessions opened: the plan checked against the caller and the limits, its pipeline
//! built over its sources, and the session added alone or as a shared stream's producer or
//! subscriber.

use std::sync::Arc;
use std::time::Duration;

use dquant_engine::plain_codec;
use dquant_engine::{EngineError, Pipeline};
use dquant_plan::{Cursor, Plan, Source, WireCodec};
use dquant_proto::v1::{OpenReply, OpenRequest};
use dquant_remote::AgentUri;
use tonic::Status;

use super::*;
use crate::auth::Caller;
use crate::open_pool::Stop;
use crate::produce::record_room;
use crate::sessions::{Reservation, Work};
use crate::share::{check_name, NewStream, Pos, ShareError, SharedStream, StreamInfo};
use crate::Shared;

/// A plan opened as a shared stream.
pub(super) struct SharedPlan<'a> {
    pub(super) name: String,
    /// Consumers the first batch waits for.
    pub(super) group: usize,
    pub(super) plan: &'a Plan,
    pub(super) wire: WireCodec,
}

/// Starts `pipeline` as the shared stream `s.name` and makes the caller its first
/// subscriber, or (another request made it meanwhile) joins that stream.
pub(super) fn open_stream(
    shared: &Arc<Shared>,
    place: Reservation,
    caller: &Caller,
    pipeline: Pipeline,
    s: SharedPlan<'_>,
) -> Result<OpenReply, Status> {
    let (plan, output) = (s.plan, s.plan.output);
    let info = StreamInfo {
        reply: OpenReply {
            plan_json: plan.to_json(),
            ..plan_reply(shared, &pipeline)
        },
        plain_room: record_room(&pipeline, output, WireCodec::Fixed(plain_codec(output))),
    };
    let config = &shared.config;
    let new = NewStream {
        name: s.name.clone(),
        tenant: caller.name().to_string(),
        info: info.clone(),
        capacity: config.share_window(record_room(&pipeline, output, s.wire)),
        meter: shared.metrics.pipeline_meter(caller.name(), &pipeline),
        pipeline: Box::new(pipeline),
        output,
        wire: s.wire,
        group: s.group,
        group_wait: Duration::from_secs(config.ticket_ttl_secs),
        encode_budget: config
            .prefetch_frames
            .saturating_mul(dquant_transport::frame::MAX_PAYLOAD),
        faults: shared.faults.clone(),
    };
    let at = Pos {
        epoch: info.reply.start_epoch,
        consumed: info.reply.start_consumed_samples,
    };
    let mut joined = (false, at);
    let mut new = Some(new);
    let added = place.add_with(caller.name(), |id| {
        let drain = shared.draining.clone();
        let (sub, j) = shared
            .shares
            .open_or_join(&mut new, id, at, &shared.events, drain)
            .map_err(|e| Status::failed_precondition(e.to_string()))?;
        joined = (j, sub.from());
        Ok::<_, Status>(Work::Subscriber { sub })
    });
    // A stream another request made meanwhile is joined: this pipeline goes unused.
    drop(new);
    let (id, ticket) = added?;
    let sources: Vec<&str> = plan.sources.iter().map(|s| s.uri.as_str()).collect();
    let detail = format!("share {}: {}", s.name, sources.join(","));
    shared
        .events
        .opened(id, caller.name(), "subscriber", detail);
    tracing::info!(
        session = id,
        tenant = caller.name(),
        share = %s.name,
        joined = joined.0,
        group = s.group,
        "shared plan opened"
    );
    Ok(share_reply(&info, (id, ticket), joined))
}

/// Adds the caller to `stream` at `at` (`None`: its current cursor); `plan`, when given,
/// must be the stream's.
pub(super) fn join_stream(
    shared: &Arc<Shared>,
    place: Reservation,
    caller: &Caller,
    stream: &Arc<SharedStream>,
    at: Option<Pos>,
    plan: Option<&str>,
) -> Result<OpenReply, Status> {
    let name = &stream.name;
    if plan.is_some_and(|p| p != stream.info.reply.plan_json) {
        let e = ShareError::DifferentPlan(name.to_string());
        return Err(Status::failed_precondition(e.to_string()));
    }
    let mut from = None;
    let (id, ticket) = place.add_with(caller.name(), |id| {
        let sub = stream.join(id, at).map_err(|source| {
            let e = ShareError::JoinRefused {
                name: name.to_string(),
                source,
            };
            Status::failed_precondition(e.to_string())
        })?;
        from = Some(sub.from());
        Ok::<_, Status>(Work::Subscriber { sub })
    })?;
    let from = from.ok_or_else(|| Status::internal("a join without a position"))?;
    shared
        .events
        .opened(id, caller.name(), "subscriber", format!("share {name}"));
    tracing::info!(session = id, tenant = caller.name(), share = %name, at = %from, "subscriber joined");
    Ok(share_reply(&stream.info, (id, ticket), (true, from)))
}

/// The reply to a consumer that opened or joined a shared stream.
pub(super) fn share_reply(
    info: &StreamInfo,
    (session, ticket): (u64, [u8; 16]),
    (joined, from): (bool, Pos),
) -> OpenReply {
    OpenReply {
        session,
        ticket: ticket.to_vec(),
        start_epoch: from.epoch,
        start_consumed_samples: from.consumed,
        joined,
        ..info.reply.clone()
    }
}

/// The reply to `Open` for `pipeline`, but for the session and its ticket: where the
/// stream starts, its schedule's sizes, and where its data connection goes.
pub(super) fn plan_reply(shared: &Shared, pipeline: &Pipeline) -> OpenReply {
    let start = pipeline.cursor();
    let sched = pipeline.schedule();
    OpenReply {
        data_port: shared.data_port as u32,
        socket_path: shared.socket_path(),
        start_epoch: start.epoch,
        start_consumed_samples: start.consumed_samples,
        rank_batches: sched.rank_batches(),
        rank_samples: sched.rank_samples(),
        epoch_samples: sched.epoch_samples(),
        samples_per_epoch: (0..sched.sources())
            .map(|d| sched.samples_per_epoch(d))
            .collect(),
        ..Default::default()
    }
}

/// Opens a plan's sources and positions it at `cursor`, stopping when `stop` says so.
pub(super) fn open_pipeline(
    shared: &Shared,
    plan: &Plan,
    cursor: Cursor,
    stop: Stop<'_>,
) -> Result<Pipeline, Status> {
    let open = |_: usize, s: &Source| open_plan_source(shared, s, &plan.wire_codec);
    let mut pipeline = Pipeline::open_until(plan, cursor, open, stop).map_err(|e| match e {
        // The pool reports its own deadline; this is what a cancelled request leaves.
        e if e.is_stopped() => Status::cancelled(e.to_string()),
        EngineError::Plan(_) => Status::invalid_argument(e.to_string()),
        e if e.is_not_found() => Status::not_found(e.to_string()),
        _ => Status::failed_precondition(e.to_string()),
    })?;
    pipeline.set_worker_pool(shared.workers.clone());
    Ok(pipeline)
}

/// The plan of an `Open` request, parsed and checked before anything is reserved: the
/// caller may read its local sources, its sizes and wire codec are within the limits, its
/// shared stream's name is well formed.
pub(super) fn checked_plan(
    shared: &Shared,
    caller: &Caller,
    req: &OpenRequest,
) -> Result<(Plan, WireCodec), Status> {
    let plan =
        Plan::from_json(&req.plan_json).map_err(|e| Status::invalid_argument(e.to_string()))?;
    for s in plan
        .sources
        .iter()
        .filter(|s| !s.uri.starts_with(AgentUri::SCHEME))
    {
        caller.check_dataset(&s.uri)?;
    }
    let wire = plan
        .parsed_wire_codec()
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    let limits = &shared.config.limits;
    limits
        .check_plan(&plan)
        .and_then(|()| limits.check_wire("wire_codec", wire))
        .map_err(over_limit)?;
    if !req.share.is_empty() {
        check_name(&req.share).map_err(|e| Status::invalid_argument(e.to_string()))?;
    }
    Ok((plan, wire))
}

/// Adds a plan session of its own (not a shared stream's) in `place`, tells the watchers, and
/// answers with its id and ticket.
pub(super) fn add_plan_session(
    shared: &Shared,
    place: Reservation,
    caller: &Caller,
    pipeline: Pipeline,
    plan: &Plan,
    wire: WireCodec,
) -> OpenReply {
    let mut reply = plan_reply(shared, &pipeline);
    let work = Work::Plan {
        pipeline: Box::new(pipeline),
        output: plan.output,
        wire,
    };
    let (id, ticket) = place.add(work, caller.name());
    let sources: Vec<&str> = plan.sources.iter().map(|s| s.uri.as_str()).collect();
    shared
        .events
        .opened(id, caller.name(), "plan", sources.join(","));
    reply.session = id;
    reply.ticket = ticket.to_vec();
    reply
}
