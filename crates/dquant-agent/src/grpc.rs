//! The control plane: the gRPC `Agent` service.
//!
//! Handlers validate everything a client sends (plan, cursor, dataset names) and open the
//! sources before answering, so every mistake is reported on the control plane with a
//! message naming the field or dataset, and nothing is streamed for a bad request. The order
//! is cheap first: the plan's sizes against the agent's [`crate::limits::Limits`], then a
//! place in the session table, and only then the datasets. Opening files and dialing
//! upstream agents is blocking work; it runs on the bounded [`crate::open_pool`], never on
//! the runtime's threads, and stops at the request's deadline.

use std::sync::Arc;
use std::time::Duration;

use crate::catalog::Resolved;
use dquant_engine::plain_codec;
use dquant_engine::{open_options, EngineError, LocalSource, Pipeline, SourceError, TokenSource};
use dquant_plan::{Cursor, Plan, Source, WireCodec};
use dquant_proto::v1::agent_server::Agent;
use dquant_proto::v1::{
    CloseReply, CloseRequest, DatasetStat, Event, IndexPart, IndexReply, IndexRequest, ListReply,
    ListRequest, OpenMegatronReply, OpenMegatronRequest, OpenReply, OpenRequest, OpenSourceRequest,
    StatRequest, SubscribeRequest, WatchRequest,
};
use dquant_remote::{dataset_uri, open_on_agent, AgentUri};
use dquant_storage::{Dataset, StorageError};
use tonic::{Request, Response, Status};

use crate::auth::Caller;
use crate::limits::LimitError;
use crate::open_pool::Stop;
use crate::produce::record_room;
use crate::sessions::{Reservation, Work};
use crate::share::{
    check_name, different_plan, join_refused, NewStream, Pos, SharedStream, StreamInfo,
};
use crate::Shared;

pub(crate) struct Service {
    pub shared: Arc<Shared>,
}

/// Opens a plan source on this agent: a dataset under a root, or (chaining) a dataset on
/// other agents (named by the source, `dquant://HOST:PORT[,HOST:PORT...]/ROOT/PATH`, or
/// routed there by the config's placement map), whose token ranges then travel in the plan's
/// wire codec.
fn open_plan_source(
    shared: &Shared,
    s: &Source,
    wire_codec: &str,
) -> Result<Box<dyn TokenSource>, SourceError> {
    let config = &shared.config;
    let timeout = Duration::from_secs(config.upstream_timeout_secs);
    if s.uri.starts_with(AgentUri::SCHEME) {
        let u = dataset_uri(&s.uri)?;
        // Checked before anything is dialed: the answer must not tell the client whether
        // a port it named is open.
        if let Some(a) = u
            .replicas()
            .into_iter()
            .find(|a| !config.upstreams.iter().any(|u| u == a))
        {
            return Err(SourceError::Usage(format!(
                "upstream agent {a} is not in this agent's upstreams list; its operator allows \
                 chaining with `upstreams = [\"{a}\"]` in the config (or `dquant serve \
                 --upstream {a}`)"
            )));
        }
        return open_on_agent(&u, s, wire_codec, timeout, &shared.upstream);
    }
    if let Some(agents) = config.placement_of(&s.uri) {
        let u = dataset_uri(&format!(
            "{}{}/{}",
            AgentUri::SCHEME,
            agents.join(","),
            s.uri
        ))?;
        return open_on_agent(&u, s, wire_codec, timeout, &shared.upstream);
    }
    let found = shared
        .catalog
        .resolve(&s.uri)
        .map_err(|e| SourceError::NotFound(e.0))?;
    Ok(Box::new(open_shared(shared, &found, s)?))
}

/// A source over the dataset `found`, opened once for every session that reads it (the
/// agent's dataset cache).
fn open_shared(shared: &Shared, found: &Resolved, s: &Source) -> Result<LocalSource, SourceError> {
    let opts = open_options(s)?;
    let ds = shared
        .datasets
        .open_in(&found.root_name, &*found.root, &found.name, &opts)?;
    Ok(LocalSource::shared(ds))
}

/// What the agent says of a dataset. `count` asks for its documents and its stored checksum
/// even when that means a scan (a raw file with `eod` seen for the first time) or reading an
/// index (a block file's checksum covers its document index): `Stat` asks, opening a source
/// to read tokens does not (its stat then says 0 documents until someone has counted them,
/// and no checksum until someone has read the index).
fn stat_of(name: &str, ds: &Dataset, count: bool) -> Result<DatasetStat, StorageError> {
    let (documents, sequences) = match count {
        true => (ds.documents()?, ds.sequences()?),
        false => (
            ds.documents_if_known().unwrap_or(0),
            ds.sequences_if_known().unwrap_or(0),
        ),
    };
    Ok(DatasetStat {
        dataset: name.to_string(),
        format: ds.format().name().to_string(),
        tokens: ds.tokens(),
        documents,
        sequences,
        bytes_on_disk: ds.size_on_disk(),
        stored_max_token: ds.stored_max_token(),
        checksum: match count {
            true => ds.stored_checksum()?,
            false => ds.stored_checksum_if_known(),
        }
        .map(|c| c.to_string())
        .unwrap_or_default(),
        max_token: None,
    })
}

fn source_of(req: &StatRequest) -> Source {
    Source {
        dtype: (!req.dtype.is_empty()).then(|| req.dtype.clone()),
        eod: req.eod,
        ..Source::new(req.dataset.clone())
    }
}

fn open_local(
    shared: &Shared,
    req: &StatRequest,
    count: bool,
) -> Result<(LocalSource, DatasetStat), Status> {
    let found = shared
        .catalog
        .resolve(&req.dataset)
        .map_err(|e| Status::not_found(e.0))?;
    let src = open_shared(shared, &found, &source_of(req))
        .map_err(|e| Status::invalid_argument(format!("dataset {:?}: {e}", req.dataset)))?;
    let precondition =
        |e: StorageError| Status::failed_precondition(format!("dataset {:?}: {e}", req.dataset));
    let mut stat = stat_of(&req.dataset, src.dataset(), count).map_err(precondition)?;
    if count && req.max_token {
        stat.max_token = Some(src.dataset().max_token().map_err(precondition)?);
    }
    Ok((src, stat))
}

/// Feeds one watcher: the agent's events it may see, in order, and a rate snapshot every
/// `interval`, until it goes away or the agent stops.
async fn watch(
    shared: Arc<Shared>,
    only: Option<String>,
    interval: Duration,
    tx: tokio::sync::mpsc::Sender<Result<Event, Status>>,
) {
    use tokio::sync::broadcast::error::RecvError;
    let mut rx = shared.events.subscribe();
    let mut w = crate::events::Watcher::new(only);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let ev = tokio::select! {
            r = rx.recv() => match r {
                Ok(e) if w.sees(&e) => e,
                Ok(_) => continue,
                Err(RecvError::Lagged(n)) => Event {
                    seq: shared.events.next_seq(),
                    unix_ms: crate::events::unix_ms(),
                    kind: Some(dquant_proto::v1::event::Kind::Error(dquant_proto::v1::ErrorEvent {
                        plane: "watch".into(),
                        reason: "fell behind".into(),
                        detail: format!("{n} events were dropped: this watcher read too slowly"),
                    })),
                },
                Err(RecvError::Closed) => return,
            },
            _ = tick.tick() => w.snapshot(&shared.events),
        };
        if tx.send(Ok(ev)).await.is_err()
            || shared.stopping.load(std::sync::atomic::Ordering::Relaxed)
        {
            return;
        }
    }
}

/// The values `[start, start + count)` of one part of `ds`'s document index (fewer past its
/// end), with their checksum.
fn index_slice(
    ds: &Dataset,
    part: IndexPart,
    start: u64,
    count: u32,
) -> Result<IndexReply, Status> {
    if count > dquant_proto::MAX_INDEX_VALUES {
        return Err(Status::invalid_argument(format!(
            "count {count} is over the most one Index reply carries ({})",
            dquant_proto::MAX_INDEX_VALUES
        )));
    }
    let index = ds
        .index()
        .map_err(|e| Status::failed_precondition(e.to_string()))?;
    let all = match part {
        IndexPart::SequenceOffsets => index.seq_offsets(),
        IndexPart::DocumentSequences => index.doc_seq(),
    };
    let from = usize::try_from(start).unwrap_or(usize::MAX).min(all.len());
    let to = from.saturating_add(count as usize).min(all.len());
    let values = all[from..to].to_vec();
    Ok(IndexReply {
        crc32c: dquant_proto::index_crc(&values),
        values,
    })
}

/// The control plane's interceptor: resolves the request's token to its [`Caller`] (kept in
/// the request's extensions for the handlers), or refuses it before any handler runs.
pub(crate) fn authenticate(
    shared: Arc<Shared>,
) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |mut req: Request<()>| match shared.auth.caller(req.metadata()) {
        Ok(caller) => {
            req.extensions_mut().insert(caller);
            Ok(req)
        }
        Err(refusal) => {
            let peer = req
                .remote_addr()
                .map_or_else(|| "unix socket".to_string(), |a| a.ip().to_string());
            shared.refuse("control", &peer, refusal.reason(), "");
            Err(refusal.status())
        }
    }
}

/// The caller the interceptor found. Never defaults: a request that did not pass through it
/// is refused.
fn caller_of<T>(req: &Request<T>) -> Result<Caller, Status> {
    req.extensions()
        .get::<Caller>()
        .cloned()
        .ok_or_else(|| Status::internal("request not authenticated"))
}

pub(crate) fn over_limit(e: LimitError) -> Status {
    Status::invalid_argument(e.to_string())
}

/// The wire codec a range session asked for (`auto+lz4` when it asked for none), parsed and
/// checked against the agent's limits.
pub(crate) fn range_wire_codec(shared: &Shared, requested: &str) -> Result<WireCodec, Status> {
    let codec = match requested {
        "" => "auto+lz4",
        c => c,
    };
    let wire: WireCodec = codec
        .parse()
        .map_err(|e| Status::invalid_argument(format!("wire_codec: {e}")))?;
    shared
        .config
        .limits
        .check_wire("wire_codec", wire)
        .map_err(over_limit)?;
    Ok(wire)
}

fn full(e: crate::sessions::SessionError) -> Status {
    match e {
        crate::sessions::SessionError::Draining => Status::unavailable(e.to_string()),
        _ => Status::resource_exhausted(e.to_string()),
    }
}

/// A plan opened as a shared stream.
struct SharedPlan<'a> {
    name: String,
    /// Consumers the first batch waits for.
    group: usize,
    plan: &'a Plan,
    wire: WireCodec,
}

/// Starts `pipeline` as the shared stream `s.name` and makes the caller its first
/// subscriber, or (another request made it meanwhile) joins that stream.
fn open_stream(
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
            .map_err(Status::failed_precondition)?;
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
fn join_stream(
    shared: &Arc<Shared>,
    place: Reservation,
    caller: &Caller,
    stream: &Arc<SharedStream>,
    at: Option<Pos>,
    plan: Option<&str>,
) -> Result<OpenReply, Status> {
    let name = &stream.name;
    if plan.is_some_and(|p| p != stream.info.reply.plan_json) {
        return Err(Status::failed_precondition(different_plan(name)));
    }
    let mut from = None;
    let (id, ticket) = place.add_with(caller.name(), |id| {
        let sub = stream
            .join(id, at)
            .map_err(|e| Status::failed_precondition(join_refused(name, &e)))?;
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
fn share_reply(
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
fn plan_reply(shared: &Shared, pipeline: &Pipeline) -> OpenReply {
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
fn open_pipeline(
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

#[tonic::async_trait]
impl Agent for Service {
    async fn list(&self, req: Request<ListRequest>) -> Result<Response<ListReply>, Status> {
        let shared = self.shared.clone();
        let caller = caller_of(&req)?;
        let root = req.into_inner().root;
        if !root.is_empty() {
            caller.check_dataset(&root)?;
        }
        self.shared
            .opens
            .run("List", move |_| {
                let mut entries = shared
                    .catalog
                    .list(&root)
                    .map_err(|e| Status::not_found(e.0))?;
                // The roots themselves: only those the caller may read.
                entries.retain(|e| e.kind != "root" || caller.may_read(&e.name));
                Ok(Response::new(ListReply { entries }))
            })
            .await
    }

    async fn stat(&self, req: Request<StatRequest>) -> Result<Response<DatasetStat>, Status> {
        let shared = self.shared.clone();
        caller_of(&req)?.check_dataset(&req.get_ref().dataset)?;
        let req = req.into_inner();
        self.shared
            .opens
            .run("Stat", move |_| {
                open_local(&shared, &req, true).map(|(_, s)| Response::new(s))
            })
            .await
    }

    async fn open(&self, req: Request<OpenRequest>) -> Result<Response<OpenReply>, Status> {
        let peer = req
            .remote_addr()
            .map_or_else(|| "?".to_string(), |a| a.to_string());
        let caller = caller_of(&req)?;
        let req = req.into_inner();
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
        let limits = &self.shared.config.limits;
        limits
            .check_plan(&plan)
            .and_then(|()| limits.check_wire("wire_codec", wire))
            .map_err(over_limit)?;
        let share = req.share.clone();
        if !share.is_empty() {
            check_name(&share).map_err(Status::invalid_argument)?;
        }
        let place = self.shared.sessions.reserve().map_err(full)?;
        let at = Pos {
            epoch: req.epoch,
            consumed: req.consumed_samples,
        };
        if let Some(stream) = (!share.is_empty())
            .then(|| self.shared.shares.find(caller.name(), &share))
            .flatten()
        {
            let plan_json = plan.to_json();
            return join_stream(
                &self.shared,
                place,
                &caller,
                &stream,
                Some(at),
                Some(&plan_json),
            )
            .map(Response::new);
        }
        let cursor = Cursor {
            epoch: req.epoch,
            consumed_samples: req.consumed_samples,
            blend: req.blend,
            delivered: req.delivered,
        };
        let group = req.share_group as usize;
        let shared = self.shared.clone();
        self.shared
            .opens
            .run("Open", move |stop| {
                let pipeline = open_pipeline(&shared, &plan, cursor, stop)?;
                if !share.is_empty() {
                    let shared_plan = SharedPlan {
                        name: share,
                        group,
                        plan: &plan,
                        wire,
                    };
                    return open_stream(&shared, place, &caller, pipeline, shared_plan)
                        .map(Response::new);
                }
                let mut reply = plan_reply(&shared, &pipeline);
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
                tracing::info!(
                    session = id,
                    %peer,
                    tenant = caller.name(),
                    sources = plan.sources.len(),
                    rank = plan.rank,
                    world = plan.world,
                    wire = %plan.wire_codec,
                    "plan opened"
                );
                Ok(Response::new(reply))
            })
            .await
    }

    async fn subscribe(
        &self,
        req: Request<SubscribeRequest>,
    ) -> Result<Response<OpenReply>, Status> {
        let caller = caller_of(&req)?;
        let req = req.into_inner();
        check_name(&req.share).map_err(Status::invalid_argument)?;
        let stream = self
            .shared
            .shares
            .find(caller.name(), &req.share)
            .ok_or_else(|| {
                Status::not_found(format!(
                    "no shared stream {:?}: a consumer of this tenant opens it with \
                     share = {:?} beside its plan",
                    req.share, req.share
                ))
            })?;
        let place = self.shared.sessions.reserve().map_err(full)?;
        let at = req.at.map(|p| Pos {
            epoch: p.epoch,
            consumed: p.consumed_samples,
        });
        join_stream(&self.shared, place, &caller, &stream, at, None).map(Response::new)
    }

    async fn open_source(
        &self,
        req: Request<OpenSourceRequest>,
    ) -> Result<Response<OpenReply>, Status> {
        let caller = caller_of(&req)?;
        let req = req.into_inner();
        let wire = range_wire_codec(&self.shared, &req.wire_codec)?;
        let ds = req
            .dataset
            .ok_or_else(|| Status::invalid_argument("dataset: missing"))?;
        caller.check_dataset(&ds.dataset)?;
        let place = self.shared.sessions.reserve().map_err(full)?;
        let shared = self.shared.clone();
        self.shared
            .opens
            .run("OpenSource", move |_| {
                let (src, stat) = open_local(&shared, &ds, false)?;
                let work = Work::Source {
                    source: Box::new(src),
                    name: ds.dataset.clone(),
                    wire,
                };
                let (id, ticket) = place.add(work, caller.name());
                shared
                    .events
                    .opened(id, caller.name(), "source", ds.dataset.clone());
                tracing::info!(
                    session = id,
                    tenant = caller.name(),
                    dataset = %ds.dataset,
                    codec = %wire,
                    "source opened"
                );
                Ok(Response::new(OpenReply {
                    session: id,
                    ticket: ticket.to_vec(),
                    data_port: shared.data_port as u32,
                    socket_path: shared.socket_path(),
                    stat: Some(stat),
                    ..Default::default()
                }))
            })
            .await
    }

    async fn open_megatron(
        &self,
        req: Request<OpenMegatronRequest>,
    ) -> Result<Response<OpenMegatronReply>, Status> {
        let caller = caller_of(&req)?;
        let (config, wire) = crate::megatron::check_request(&self.shared, &caller, req.get_ref())?;
        let place = self.shared.sessions.reserve().map_err(full)?;
        let shared = self.shared.clone();
        self.shared
            .opens
            .run("OpenMegatron", move |_| {
                crate::megatron::open(&shared, &caller, place, config, wire).map(Response::new)
            })
            .await
    }

    async fn close(&self, req: Request<CloseRequest>) -> Result<Response<CloseReply>, Status> {
        let caller = caller_of(&req)?;
        let req = req.into_inner();
        let id = req.session;
        let existed = self.shared.sessions.close(id, &req.ticket, caller.name());
        if existed {
            tracing::info!(session = id, "session closed by the client");
        }
        Ok(Response::new(CloseReply { existed }))
    }

    type WatchStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<Event, Status>> + Send + 'static>>;

    async fn watch(
        &self,
        req: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let caller = caller_of(&req)?;
        let interval = match req.get_ref().interval_ms {
            0 => 1000,
            ms => ms.clamp(100, 60_000),
        };
        let only = caller.watches_only().map(str::to_string);
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        tokio::spawn(watch(
            self.shared.clone(),
            only,
            Duration::from_millis(interval.into()),
            tx,
        ));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn index(&self, req: Request<IndexRequest>) -> Result<Response<IndexReply>, Status> {
        let caller = caller_of(&req)?;
        let req = req.into_inner();
        let ds = req
            .dataset
            .clone()
            .ok_or_else(|| Status::invalid_argument("dataset: missing"))?;
        caller.check_dataset(&ds.dataset)?;
        let part = IndexPart::try_from(req.part)
            .map_err(|_| Status::invalid_argument(format!("part: unknown value {}", req.part)))?;
        let shared = self.shared.clone();
        self.shared
            .opens
            .run("Index", move |_| {
                let (src, _) = open_local(&shared, &ds, false)?;
                index_slice(src.dataset(), part, req.start, req.count).map(Response::new)
            })
            .await
    }
}
