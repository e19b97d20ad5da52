//! The host API's errors: one enum, with the variant telling bindings which of their
//! language's errors to raise (a bad plan, a missing dataset, an unreachable agent, an agent
//! that failed).

use dquant_engine::{EngineError, SourceError};
use dquant_plan::PlanError;
use dquant_transport::{ConnectError, ReceiveError, WireError};

/// Errors of the host API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The plan, one of its sources, or a token that does not fit where the plan puts it:
    /// the engine's error as it is, whether the plan ran here or its sources were opened here.
    #[error("{0}")]
    Engine(#[from] EngineError),
    /// The agent refused or failed; its message, verbatim.
    #[error("{0}")]
    Agent(String),
    /// The agent shut down gracefully after the last batch this reader received. Open the
    /// plan again (on another agent, or this one once back) at this cursor, and the stream
    /// goes on with no batch skipped or repeated.
    #[error("{}", dquant_remote::shutdown_message(*consumed_samples))]
    AgentShutdown { consumed_samples: u64 },
    /// The agent has no such dataset; its message, verbatim.
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Connect(SourceError),
    #[error("{0}")]
    Wire(#[from] WireError),
    #[error("{0}")]
    Usage(String),
    /// A sample index past its dataset's end.
    #[error("{0}")]
    IndexOutOfRange(String),
}

impl ClientError {
    /// An error from talking to an agent: what the agent said, verbatim, or why it could not
    /// be reached.
    pub(crate) fn from_agent(e: SourceError) -> Self {
        match e {
            SourceError::Agent(m) => ClientError::Agent(m),
            SourceError::NotFound(m) => ClientError::NotFound(m),
            e => ClientError::Connect(e),
        }
    }

    /// What an agent said at the end of a stream: its shutdown notice with the resume
    /// cursor, or any other message verbatim.
    pub(crate) fn from_agent_message(m: String) -> Self {
        match dquant_remote::resume_point(&m) {
            Some(consumed_samples) => ClientError::AgentShutdown { consumed_samples },
            None => ClientError::Agent(m),
        }
    }

    /// The cursor to resume from when the agent shut down mid-stream (see
    /// [`ClientError::AgentShutdown`]).
    pub fn resume_cursor(&self) -> Option<u64> {
        match self {
            ClientError::AgentShutdown { consumed_samples } => Some(*consumed_samples),
            _ => None,
        }
    }

    /// A data plane that could not be connected: unreachable (with the address), or what
    /// went wrong with the stream or the ring.
    pub(crate) fn from_connect(e: ConnectError) -> Self {
        match e {
            ConnectError::NoSocket { .. } => ClientError::Usage(e.to_string()),
            e => ClientError::from_agent(dquant_remote::connect_error(e)),
        }
    }

    /// Whether a dataset the plan names does not exist: a local file, or a dataset an agent
    /// does not have (bindings map this to their language's file-not-found error).
    pub fn is_not_found(&self) -> bool {
        match self {
            ClientError::NotFound(_) => true,
            ClientError::Engine(e) => e.is_not_found(),
            _ => false,
        }
    }
}

/// A bad plan is the engine's error too (it is what the engine refuses first).
impl From<PlanError> for ClientError {
    fn from(e: PlanError) -> Self {
        ClientError::Engine(EngineError::Plan(e))
    }
}

/// A transport's errors: the stream's (an error frame is the agent's message), the agent's,
/// or, for plans run in this process, the engine's.
impl From<ReceiveError> for ClientError {
    fn from(e: ReceiveError) -> Self {
        match e {
            ReceiveError::Wire(WireError::Remote(m)) => match dquant_remote::resume_point(&m) {
                Some(consumed_samples) => ClientError::AgentShutdown { consumed_samples },
                None => ClientError::Wire(WireError::Remote(m)),
            },
            ReceiveError::Producer(m) => ClientError::from_agent_message(m),
            ReceiveError::Wire(e) => ClientError::Wire(e),
            ReceiveError::Transport(m) => ClientError::Agent(m),
            ReceiveError::Source(e) => match e.downcast::<EngineError>() {
                Ok(e) => (*e).into(),
                Err(e) => ClientError::Agent(e.to_string()),
            },
            e => ClientError::Agent(e.to_string()),
        }
    }
}
