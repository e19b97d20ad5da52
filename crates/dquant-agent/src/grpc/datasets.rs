//! The datasets a request names, opened: a plan's sources (local under a root, or on another
//! agent), a range session's dataset, its stat and slices of its document index.
//!
//! Blocking work: every function here runs on the open pool, never on the runtime's threads.

use std::sync::Arc;
use std::time::Duration;

use crate::catalog::Resolved;
use dquant_engine::{open_options, LocalSource, SourceError, TokenSource};
use dquant_plan::Source;
use dquant_proto::v1::{DatasetStat, IndexPart, IndexReply, StatRequest};
use dquant_remote::{dataset_uri, open_on_agent, AgentUri, OnFailover};
use dquant_storage::{Dataset, StorageError};
use tonic::Status;

use crate::Shared;

/// Counts a replicated source's failovers in the agent's metrics, by replica
/// (`dquant_replica_failovers_total`).
fn failovers_counted(shared: &Shared, u: &AgentUri) -> OnFailover {
    let counters: Vec<(String, metrics::Counter)> = u
        .replicas()
        .into_iter()
        .map(|a| (a.to_string(), shared.metrics.failovers(a, &u.dataset)))
        .collect();
    Arc::new(move |replica: &str, _dataset: &str| {
        if let Some((_, c)) = counters.iter().find(|(a, _)| a == replica) {
            c.increment(1);
        }
    })
}

/// Opens a plan source on this agent: a dataset under a root, or (chaining) a dataset on
/// other agents (named by the source, `dquant://HOST:PORT[,HOST:PORT...]/ROOT/PATH`, or
/// routed there by the config's placement map), whose token ranges then travel in the plan's
/// wire codec.
pub(super) fn open_plan_source(
    shared: &Shared,
    s: &Source,
    wire_codec: &str,
) -> Result<Box<dyn TokenSource>, SourceError> {
    let config = &shared.config;
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
        return open_upstream(shared, &u, s, wire_codec);
    }
    if let Some(agents) = config.placement_of(&s.uri) {
        let u = dataset_uri(&format!(
            "{}{}/{}",
            AgentUri::SCHEME,
            agents.join(","),
            s.uri
        ))?;
        return open_upstream(shared, &u, s, wire_codec);
    }
    let found = shared
        .catalog
        .resolve(&s.uri)
        .map_err(|e| SourceError::NotFound(e.0))?;
    Ok(Box::new(open_shared(shared, &found, s)?))
}

/// Opens a dataset on upstream agents (chaining): one agent or a replica set, whose
/// failovers the agent counts in its metrics.
fn open_upstream(
    shared: &Shared,
    u: &AgentUri,
    s: &Source,
    wire_codec: &str,
) -> Result<Box<dyn TokenSource>, SourceError> {
    let timeout = Duration::from_secs(shared.config.upstream_timeout_secs);
    let counted = (u.replicas().len() > 1).then(|| failovers_counted(shared, u));
    open_on_agent(
        u,
        s,
        wire_codec,
        timeout,
        &shared.upstream,
        counted.as_ref(),
    )
}

/// A source over the dataset `found`, opened once for every session that reads it (the
/// agent's dataset cache).
pub(super) fn open_shared(
    shared: &Shared,
    found: &Resolved,
    s: &Source,
) -> Result<LocalSource, SourceError> {
    let opts = open_options(s)?;
    let ds = shared
        .datasets
        .open_in(&found.root_name, &*found.root, &found.name, &opts)?;
    Ok(LocalSource::shared(ds).keeping_map(shared.maps.clone()))
}

/// What the agent says of a dataset. `count` asks for its documents and its stored checksum
/// even when that means a scan (a raw file with `eod` seen for the first time) or reading an
/// index (a block file's checksum covers its document index): `Stat` asks, opening a source
/// to read tokens does not (its stat then says 0 documents until someone has counted them,
/// and no checksum until someone has read the index). A Megatron dataset's checksum is its
/// chunk sums sidecar's digest, when it has one: replicas whose sidecars differ hold
/// different bytes.
pub(super) fn stat_of(name: &str, ds: &Dataset, count: bool) -> Result<DatasetStat, StorageError> {
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
        .or_else(|| ds.chunk_sums().map(|(s, _)| s.digest()))
        .unwrap_or_default(),
        max_token: None,
    })
}

pub(super) fn source_of(req: &StatRequest) -> Source {
    Source {
        dtype: (!req.dtype.is_empty()).then(|| req.dtype.clone()),
        eod: req.eod,
        ..Source::new(req.dataset.clone())
    }
}

pub(super) fn open_local(
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

/// The values `[start, start + count)` of one part of `ds`'s document index (fewer past its
/// end), with their checksum.
pub(super) fn index_slice(
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
