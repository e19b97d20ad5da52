use dquant_codec::CodecError;
use dquant_plan::PlanError;

use dquant_storage::source::SourceError;

/// Errors of the plan engine: the plan, one of its sources, or a token that does not fit
/// where the plan puts it. Each names the source (index and URI, as the plan spelled it).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    #[error("{0}")]
    Plan(#[from] PlanError),
    #[error("sources[{index}] ({uri}): {source}")]
    Source {
        index: usize,
        uri: String,
        #[source]
        source: SourceError,
    },
    /// A token does not fit the plan's output dtype (e.g. `u16` for a 100k vocabulary), or
    /// its wire codec (`context` then says which).
    #[error("sources[{index}] ({uri}): {context}{source}")]
    Output {
        index: usize,
        uri: String,
        context: String,
        #[source]
        source: CodecError,
    },
    /// Encoding batch `index` in its wire codec failed.
    #[error("batch {index}: {source}")]
    Encode {
        index: u64,
        #[source]
        source: CodecError,
    },
    /// The call cannot be served as made (a buffer too small, a batch over 4 GiB).
    #[error("{0}")]
    Usage(String),
    /// [`crate::Pipeline::open_until`]'s stop condition fired between two sources.
    #[error("stopped while opening the plan's sources")]
    Stopped,
}

impl EngineError {
    /// Whether a dataset the plan names does not exist: a local file, or a dataset an agent
    /// does not have.
    pub fn is_not_found(&self) -> bool {
        match self {
            EngineError::Source { source, .. } => source.is_not_found(),
            _ => false,
        }
    }

    /// Whether the caller's stop condition ended the work (an open past its deadline, or
    /// cancelled), as opposed to anything wrong with the plan or its data.
    pub fn is_stopped(&self) -> bool {
        matches!(
            self,
            EngineError::Stopped | EngineError::Plan(PlanError::Stopped { .. })
        )
    }
}
