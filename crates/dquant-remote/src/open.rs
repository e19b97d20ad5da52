//! Opening a plan's source wherever it lives: a local path, a dataset on a named agent, or a
//! full `dquant://HOST:PORT/DATASET` URI.

use std::path::Path;
use std::time::Duration;

use dquant_plan::Source;
use dquant_proto::v1::StatRequest;
use dquant_storage::{LocalSource, MapBudget, SourceError, TokenSource};

use crate::control::{Credentials, DEFAULT_RPC_TIMEOUT};
use crate::{AgentUri, Control, OnFailover, RemoteSource, ReplicatedSource};

/// Parses a source's `dquant://HOST:PORT/DATASET` URI, which must name a dataset.
pub fn dataset_uri(uri: &str) -> Result<AgentUri, SourceError> {
    let u = AgentUri::parse(uri).map_err(|e| SourceError::Usage(e.to_string()))?;
    if u.dataset.is_empty() {
        return Err(SourceError::Usage(
            "the URI names an agent but no dataset (dquant://HOST:PORT/ROOT/PATH)".into(),
        ));
    }
    Ok(u)
}

/// Opens `u`'s dataset on its agents as a range source, every control call and data read
/// bounded by `timeout`, with `creds` (a tenant's token, the TLS to expect). The agents
/// (`dquant://HOST1:PORT[,HOST2:PORT...]/...`) are a [`ReplicatedSource`]'s replicas, one
/// agent a set of one: a read that meets a dead agent waits for it (or moves to another)
/// until `timeout` instead of failing, and `on_failover` hears of each such failure.
pub fn open_on_agent(
    u: &AgentUri,
    s: &Source,
    wire_codec: &str,
    timeout: Duration,
    creds: &Credentials,
    on_failover: Option<&OnFailover>,
) -> Result<Box<dyn TokenSource>, SourceError> {
    let dataset = stat_of(u.dataset.clone(), s);
    let mut r = ReplicatedSource::open(&u.replicas(), dataset, wire_codec, timeout, creds)?;
    if let Some(f) = on_failover {
        r.set_on_failover(f.clone());
    }
    Ok(Box::new(r))
}

/// What a range source asks the agent to open: the dataset, with the source's raw-file
/// options.
fn stat_of(dataset: String, s: &Source) -> StatRequest {
    StatRequest {
        dataset,
        dtype: s.dtype.clone().unwrap_or_default(),
        eod: s.eod,
        max_token: false,
    }
}

/// Opens one plan source: a local path, a full `dquant://HOST:PORT/DATASET` URI, or (when
/// `agent` is given) a dataset name on that agent. `wire_codec` is what remote ranges travel
/// in ("" for the agent's default).
pub fn open_source(
    s: &Source,
    agent: Option<&Control>,
    wire_codec: &str,
) -> Result<Box<dyn TokenSource>, SourceError> {
    if s.uri.starts_with(AgentUri::SCHEME) {
        let u = dataset_uri(&s.uri)?;
        let creds = Credentials::from_env()?;
        return open_on_agent(&u, s, wire_codec, DEFAULT_RPC_TIMEOUT, &creds, None);
    }
    match agent {
        Some(c) => Ok(Box::new(RemoteSource::open(
            c.clone(),
            stat_of(s.uri.clone(), s),
            wire_codec,
        )?)),
        // In this process: int32 datasets are narrowed from maps kept with them within the
        // process's budget (`DQUANT_MAP_BUDGET`), as an agent does within its own.
        None => {
            let maps = MapBudget::of_this_process()?;
            Ok(Box::new(
                LocalSource::open(Path::new(&s.uri), s)?.keeping_map(maps),
            ))
        }
    }
}
