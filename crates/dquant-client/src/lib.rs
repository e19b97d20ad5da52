//! The host API: [`open`] a plan, then take its batches with [`Reader::next_batch`] (a typed,
//! zero-copy view) or [`Reader::read`] (bytes into your buffer, as the original design's
//! `read(fd, buf)`).
//!
//! The original design's `open(path, action, offload)` maps to [`open`]`(uri, plan, offload)`:
//! - [`Offload::Yes`]: the agent at `uri` runs the plan near the data and sends finished
//!   batches. From `dquant://HOST:PORT` they stream over TCP and this process decodes the
//!   wire codec into its batch buffer; from the agent's Unix socket path they land in a
//!   shared-memory ring this process created, already in the output dtype, and
//!   [`Reader::next_batch`] views them in place ([`Transport`]).
//! - [`Offload::No`]: the same pipeline (`dquant_engine::Pipeline`) runs in this process. Sources are local paths, or
//!   datasets on an agent (relative names when `uri` names one, or full `dquant://` URIs),
//!   whose tokens are pulled by range.
//!
//! Both produce byte-identical batches for the same plan and cursor; the tests check it.
//!
//! Whatever the transport, batches reach the [`Reader`] through one path: a
//! `dquant_transport::BatchSource` (TCP frames, the shared-memory ring, or the plan run in
//! this process), records checked against the plan and handed out in place.

mod audit;
mod batch;
mod error;
mod inproc;
mod loader_ring;
pub mod megatron;
mod provenance;
mod reader;
pub mod shm;

use dquant_plan::{Cursor, Plan};
use dquant_remote::open_source;

pub use audit::{SourceAudit, EXACT_BUDGET};
pub use batch::{Batch, OwnedBatch, Tokens};
pub use dquant_engine::{EngineError, SourceError, TokenSource};
pub use dquant_remote::{AgentUri, Control, Credentials, Transport, Watch};
pub use error::ClientError;
pub use loader_ring::serve_loader_ring;
pub use megatron::{AgentMegatron, Over, SampleBatch, SHM_WIRE_CODEC};
pub use provenance::{Located, Piece, Provenance};
pub use reader::{Reader, Share};

/// Where a plan runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offload {
    /// On the agent named by the URI; batches arrive over its data plane.
    Yes,
    /// In this process.
    No,
}

/// Opens `plan` from its start; see [`open_at`].
pub fn open(uri: &str, plan: &Plan, offload: Offload) -> Result<Reader, ClientError> {
    open_at(uri, plan, Cursor::START, offload)
}

/// Opens `plan` at `cursor`. `uri` is an agent's address ([`AgentUri`]: `dquant://HOST:PORT`,
/// or its Unix socket path for shared memory), or empty for none (only with
/// [`Offload::No`]; sources are then local paths or full `dquant://` URIs).
pub fn open_at(
    uri: &str,
    plan: &Plan,
    cursor: Cursor,
    offload: Offload,
) -> Result<Reader, ClientError> {
    let agent = if uri.is_empty() {
        None
    } else {
        Some(AgentUri::parse(uri).map_err(|e| ClientError::Usage(e.to_string()))?)
    };
    match (offload, agent) {
        (Offload::Yes, None) => Err(ClientError::Usage(
            "offload needs an agent: pass its URI, dquant://HOST:PORT or a Unix socket path".into(),
        )),
        (Offload::Yes, Some(a)) => Reader::remote(&a, plan, cursor),
        (Offload::No, a) => {
            let control = connect(a.as_ref())?;
            Reader::local_with(plan, cursor, |_, s| {
                open_source(s, control.as_ref(), &plan.wire_codec)
            })
        }
    }
}

/// Opens `plan` at `cursor` on the agent at `uri` as the shared stream `share`, or joins the
/// stream of that name another consumer of this tenant opened with the same plan: the agent
/// runs the plan once and every consumer gets the same batches ([`Share`]). Credentials come
/// from the environment, as for [`open`].
pub fn open_shared(
    uri: &str,
    plan: &Plan,
    cursor: Cursor,
    share: &Share,
) -> Result<Reader, ClientError> {
    let agent = AgentUri::parse(uri).map_err(|e| ClientError::Usage(e.to_string()))?;
    let creds = Credentials::from_env().map_err(ClientError::Connect)?;
    Reader::remote_shared(&agent, plan, cursor, share, &creds)
}

/// Joins the shared stream `share` on the agent at `uri` by name, at `at` (a batch boundary
/// still in the stream's window) or at its current cursor (`None`). The reader learns the
/// plan from the agent.
pub fn subscribe(uri: &str, share: &str, at: Option<&Cursor>) -> Result<Reader, ClientError> {
    let agent = AgentUri::parse(uri).map_err(|e| ClientError::Usage(e.to_string()))?;
    let creds = Credentials::from_env().map_err(ClientError::Connect)?;
    Reader::subscribe_with(&agent, share, at, &creds)
}

/// The control plane of `agent`, when there is one.
fn connect(agent: Option<&AgentUri>) -> Result<Option<Control>, ClientError> {
    match agent {
        Some(a) => Ok(Some(
            Control::connect(&a.authority).map_err(ClientError::Connect)?,
        )),
        None => Ok(None),
    }
}

/// Whether cursors saved while running `saved` may continue under `new` with nothing lost or
/// repeated, and what changes ([`dquant_plan::check_plan_change`]: only the mixture's stages
/// after the saved position, and the run's length, may). The sources' sizes decide where
/// `start_fraction` stages fall, so they are opened as [`open_at`] would (`uri`: the agent
/// that serves relative source names, or empty).
pub fn check_plan_change(
    uri: &str,
    saved: &Plan,
    new: &Plan,
    cursors: &[Cursor],
) -> Result<String, ClientError> {
    saved.validate()?;
    new.validate()?;
    let agent = match uri {
        "" => None,
        u => Some(AgentUri::parse(u).map_err(|e| ClientError::Usage(e.to_string()))?),
    };
    let control = connect(agent.as_ref())?;
    let mut infos = Vec::with_capacity(new.sources.len());
    for (index, s) in new.sources.iter().enumerate() {
        let src = open_source(s, control.as_ref(), &new.wire_codec).map_err(|source| {
            ClientError::Engine(EngineError::Source {
                index,
                uri: s.uri.clone(),
                source,
            })
        })?;
        infos.push(dquant_plan::SourceInfo {
            tokens: src.tokens(),
        });
    }
    Ok(dquant_plan::check_plan_change(saved, new, &infos, cursors)?)
}
