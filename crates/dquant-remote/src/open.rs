//! Opening a plan's source wherever it lives: a local path, a dataset on a named agent, or a
//! full `dquant://HOST:PORT/DATASET` URI.

use std::path::Path;

use dquant_engine::{LocalSource, SourceError, TokenSource};
use dquant_plan::Source;
use dquant_proto::v1::StatRequest;

use crate::{AgentUri, Control, RemoteSource};

/// Opens one plan source: a local path, a full `dquant://HOST:PORT/DATASET` URI, or (when
/// `agent` is given) a dataset name on that agent. `wire_codec` is what remote ranges travel
/// in ("" for the agent's default).
pub fn open_source(
    s: &Source,
    agent: Option<&Control>,
    wire_codec: &str,
) -> Result<Box<dyn TokenSource>, SourceError> {
    let stat = |dataset: String| StatRequest {
        dataset,
        dtype: s.dtype.clone().unwrap_or_default(),
        eod: s.eod,
    };
    if s.uri.starts_with(AgentUri::SCHEME) {
        let u = AgentUri::parse(&s.uri).map_err(SourceError::Usage)?;
        if u.dataset.is_empty() {
            return Err(SourceError::Usage(
                "the URI names an agent but no dataset (dquant://HOST:PORT/ROOT/PATH)".into(),
            ));
        }
        let c = Control::connect(&u.authority)?;
        return Ok(Box::new(RemoteSource::open(
            c,
            stat(u.dataset),
            wire_codec,
        )?));
    }
    match agent {
        Some(c) => Ok(Box::new(RemoteSource::open(
            c.clone(),
            stat(s.uri.clone()),
            wire_codec,
        )?)),
        None => Ok(Box::new(LocalSource::open(Path::new(&s.uri), s)?)),
    }
}
