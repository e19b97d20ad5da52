//! Why a session's stream ended before its end: what every serving path returns and the
//! session's log line reports.
//!
//! Apart from `sessions` so that the paths that end streams (the produce loop, the fault
//! containment, the shared streams) depend on it and not on the session table.

use dquant_transport::WireError;

/// Why a session's stream ended before its end (for the log line at its end).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum StreamError {
    /// The consumer went away or the session was cancelled.
    #[error("{0}")]
    Stopped(String),
    /// The stream failed; the consumer was sent this message.
    #[error("{0}")]
    Failed(String),
    /// The agent shut down; the consumer was sent its resume cursor (this message).
    #[error("{0}")]
    Drained(String),
    /// The session's thread panicked outside the produce loop ([`crate::faults::contain`]);
    /// the consumer has not been told yet.
    #[error("{0}")]
    Panicked(String),
    #[error("{0}")]
    Wire(#[from] WireError),
    #[error("cannot start a thread: {0}")]
    Thread(std::io::Error),
}
