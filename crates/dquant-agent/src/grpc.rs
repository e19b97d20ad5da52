//! The control plane: the gRPC `Agent` service.
//!
//! Handlers validate everything a client sends (plan, cursor, dataset names) and open the
//! sources before answering, so every mistake is reported on the control plane with a
//! message naming the field or dataset, and nothing is streamed for a bad request. Opening
//! files and dialing upstream agents is blocking work; it runs on its own thread, never on
//! the runtime's.

use std::sync::Arc;

use dquant_engine::{EngineError, LocalSource, Pipeline, SourceError, TokenSource};
use dquant_plan::{Cursor, Plan, Source};
use dquant_proto::v1::agent_server::Agent;
use dquant_proto::v1::{
    CloseReply, CloseRequest, DatasetStat, ListReply, ListRequest, OpenReply, OpenRequest,
    OpenSourceRequest, StatRequest,
};
use dquant_remote::{open_source, AgentUri};
use dquant_storage::Dataset;
use tonic::{Request, Response, Status};

use crate::sessions::Work;
use crate::Shared;

pub(crate) struct Service {
    pub shared: Arc<Shared>,
}

/// Runs blocking `f` on a plain thread (not the runtime's blocking pool: sources that dial
/// other agents run their own control calls, which must not nest in this runtime).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("dquant-open".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .map_err(|e| Status::resource_exhausted(format!("cannot start a thread: {e}")))?;
    rx.await
        .map_err(|_| Status::internal("the request's worker thread panicked"))?
}

/// Opens a plan source on this agent: a dataset under a root, or (chaining) a dataset on
/// another agent, whose token ranges then travel in the plan's wire codec.
fn open_plan_source(
    shared: &Shared,
    s: &Source,
    wire_codec: &str,
) -> Result<Box<dyn TokenSource>, SourceError> {
    if s.uri.starts_with(AgentUri::SCHEME) {
        return open_source(s, None, wire_codec);
    }
    let found = shared
        .catalog
        .resolve(&s.uri)
        .map_err(|e| SourceError::NotFound(e.0))?;
    let src = LocalSource::open_in(&*found.root, &found.name, s)?;
    Ok(Box::new(src))
}

fn stat_of(name: &str, ds: &Dataset) -> DatasetStat {
    DatasetStat {
        dataset: name.to_string(),
        format: ds.format().name().to_string(),
        tokens: ds.tokens(),
        documents: ds.index().documents() as u64,
        sequences: ds.index().sequences() as u64,
        bytes_on_disk: ds.size_on_disk(),
        stored_max_token: ds.stored_max_token(),
        checksum: ds
            .stored_checksum()
            .map(|c| c.to_string())
            .unwrap_or_default(),
    }
}

fn source_of(req: &StatRequest) -> Source {
    Source {
        uri: req.dataset.clone(),
        weight: 1.0,
        dtype: (!req.dtype.is_empty()).then(|| req.dtype.clone()),
        eod: req.eod,
    }
}

fn open_local(shared: &Shared, req: &StatRequest) -> Result<(LocalSource, DatasetStat), Status> {
    let found = shared
        .catalog
        .resolve(&req.dataset)
        .map_err(|e| Status::not_found(e.0))?;
    let src = LocalSource::open_in(&*found.root, &found.name, &source_of(req))
        .map_err(|e| Status::invalid_argument(format!("dataset {:?}: {e}", req.dataset)))?;
    let stat = stat_of(&req.dataset, src.dataset());
    Ok((src, stat))
}

#[tonic::async_trait]
impl Agent for Service {
    async fn list(&self, req: Request<ListRequest>) -> Result<Response<ListReply>, Status> {
        let shared = self.shared.clone();
        let root = req.into_inner().root;
        blocking(move || {
            shared
                .catalog
                .list(&root)
                .map(|entries| Response::new(ListReply { entries }))
                .map_err(|e| Status::not_found(e.0))
        })
        .await
    }

    async fn stat(&self, req: Request<StatRequest>) -> Result<Response<DatasetStat>, Status> {
        let shared = self.shared.clone();
        let req = req.into_inner();
        blocking(move || open_local(&shared, &req).map(|(_, s)| Response::new(s))).await
    }

    async fn open(&self, req: Request<OpenRequest>) -> Result<Response<OpenReply>, Status> {
        let shared = self.shared.clone();
        let peer = req
            .remote_addr()
            .map_or_else(|| "?".to_string(), |a| a.to_string());
        let req = req.into_inner();
        blocking(move || {
            let plan = Plan::from_json(&req.plan_json)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            let wire = plan
                .parsed_wire_codec()
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            let cursor = Cursor {
                epoch: req.epoch,
                consumed_samples: req.consumed_samples,
            };
            let pipeline = Pipeline::open(&plan, cursor, |_, s| {
                open_plan_source(&shared, s, &plan.wire_codec)
            })
            .map_err(|e| match e {
                EngineError::Plan(_) => Status::invalid_argument(e.to_string()),
                e if e.is_not_found() => Status::not_found(e.to_string()),
                _ => Status::failed_precondition(e.to_string()),
            })?;
            let start = pipeline.cursor();
            let sched = pipeline.schedule();
            let mut reply = OpenReply {
                data_port: shared.data_port as u32,
                socket_path: shared.socket_path(),
                start_epoch: start.epoch,
                start_consumed_samples: start.consumed_samples,
                rank_batches: sched.rank_batches(),
                rank_samples: sched.rank_samples(),
                epoch_samples: sched.epoch_samples(),
                ..Default::default()
            };
            let work = Work::Plan {
                pipeline: Box::new(pipeline),
                output: plan.output,
                wire,
            };
            let (id, ticket) = shared
                .sessions
                .add(work)
                .map_err(|e| Status::resource_exhausted(e.to_string()))?;
            reply.session = id;
            reply.ticket = ticket.to_vec();
            tracing::info!(
                session = id,
                %peer,
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

    async fn open_source(
        &self,
        req: Request<OpenSourceRequest>,
    ) -> Result<Response<OpenReply>, Status> {
        let shared = self.shared.clone();
        let req = req.into_inner();
        blocking(move || {
            let ds = req
                .dataset
                .ok_or_else(|| Status::invalid_argument("dataset: missing"))?;
            let codec = if req.wire_codec.is_empty() {
                "auto+lz4"
            } else {
                &req.wire_codec
            };
            let wire = codec
                .parse()
                .map_err(|e| Status::invalid_argument(format!("wire_codec: {e}")))?;
            let (src, stat) = open_local(&shared, &ds)?;
            let work = Work::Source {
                source: Box::new(src),
                name: ds.dataset.clone(),
                wire,
            };
            let (id, ticket) = shared
                .sessions
                .add(work)
                .map_err(|e| Status::resource_exhausted(e.to_string()))?;
            tracing::info!(session = id, dataset = %ds.dataset, %codec, "source opened");
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

    async fn close(&self, req: Request<CloseRequest>) -> Result<Response<CloseReply>, Status> {
        let id = req.into_inner().session;
        let existed = self.shared.sessions.close(id);
        if existed {
            tracing::info!(session = id, "session closed by the client");
        }
        Ok(Response::new(CloseReply { existed }))
    }
}
