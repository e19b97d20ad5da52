//! The plan layer's one error type.

/// Why a plan, a set of token counts or a cursor was rejected.
///
/// Every message names what is wrong in the user's terms: the plan field (`sources[1].weight`,
/// `seq_len`), the cursor field, or the parser's line and column. The messages are part of the
/// contract (tests assert them verbatim): a user reading one knows which line of their plan to
/// change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// The plan text is not valid JSON or TOML, or does not have the plan's shape (an unknown
    /// field, a wrong type, a missing required field). The message is serde_json's or toml's,
    /// with its line and column.
    #[error("plan: {0}")]
    Syntax(String),

    /// A field holds a value the plan does not allow.
    #[error("{field}: {reason}")]
    Invalid {
        /// The field's path in the plan, e.g. `sources[1].weight` or `rank`.
        field: String,
        /// What is wrong with it, with the offending value.
        reason: String,
    },

    /// A cursor does not fit the schedule it is used with.
    #[error("cursor: {0}")]
    Cursor(String),

    /// The caller's stop condition ended a long computation (the blend replayed up to a far
    /// cursor) before it finished: see [`crate::Schedule::iter_rank_until`].
    #[error("cursor: stopped after replaying the blend to sample {reached} of {target}")]
    Stopped {
        /// How far the replay got.
        reached: u64,
        /// Where it was going.
        target: u64,
    },
}

impl PlanError {
    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        PlanError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }
}
