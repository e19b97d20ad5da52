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

use dquant_plan::Cursor;
use dquant_proto::v1::agent_server::Agent;
use dquant_proto::v1::{
    CloseReply, CloseRequest, DatasetStat, Event, IndexPart, IndexReply, IndexRequest, ListReply,
    ListRequest, OpenMegatronReply, OpenMegatronRequest, OpenReply, OpenRequest, OpenSourceRequest,
    StatRequest, SubscribeRequest, WatchRequest,
};
use tonic::{Request, Response, Status};

use crate::auth::Caller;
use crate::requests::{over_limit, range_wire_codec};
use crate::sessions::Work;
use crate::share::{check_name, Pos};
use crate::Shared;

mod datasets;
mod plans;

use datasets::{index_slice, open_local, open_plan_source};
use plans::{add_plan_session, checked_plan, join_stream, open_pipeline, open_stream, SharedPlan};

pub(crate) struct Service {
    pub shared: Arc<Shared>,
}

/// Feeds one watcher: the agent's events it may see, in order, and a rate snapshot every
/// `interval`, until it goes away or the agent stops.
async fn watch(
    shared: Arc<Shared>,
    mut rx: tokio::sync::broadcast::Receiver<Event>,
    only: Option<String>,
    interval: Duration,
    tx: tokio::sync::mpsc::Sender<Result<Event, Status>>,
) {
    use tokio::sync::broadcast::error::RecvError;
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

fn full(e: crate::sessions::SessionError) -> Status {
    match e {
        crate::sessions::SessionError::Draining => Status::unavailable(e.to_string()),
        _ => Status::resource_exhausted(e.to_string()),
    }
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
        let (plan, wire) = checked_plan(&self.shared, &caller, &req)?;
        let share = req.share.clone();
        let place = self.shared.sessions.reserve().map_err(full)?;
        if let Some(stream) = (!share.is_empty())
            .then(|| self.shared.shares.find(caller.name(), &share))
            .flatten()
        {
            let at = Pos {
                epoch: req.epoch,
                consumed: req.consumed_samples,
            };
            let plan_json = plan.to_json();
            let joined = join_stream(
                &self.shared,
                place,
                &caller,
                &stream,
                Some(at),
                Some(&plan_json),
            );
            return joined.map(Response::new);
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
                        // A subscriber may join after a stream's lanes started: each
                        // record of a shared stream is compressed alone.
                        wire: wire.without_stream(),
                    };
                    return open_stream(&shared, place, &caller, pipeline, shared_plan)
                        .map(Response::new);
                }
                let reply = add_plan_session(&shared, place, &caller, pipeline, &plan, wire);
                tracing::info!(
                    session = reply.session,
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
        check_name(&req.share).map_err(|e| Status::invalid_argument(e.to_string()))?;
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
        // Subscribed before the call returns: every event after it reaches the watcher (the
        // task alone subscribing could miss those of the moments before it first ran).
        let events = self.shared.events.subscribe();
        tokio::spawn(watch(
            self.shared.clone(),
            events,
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
