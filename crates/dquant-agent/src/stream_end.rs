//! How a stream's end becomes its session's result: the one mapping from the produce loop's
//! [`Outcome`] to [`StreamError`] that every serving path ends through (plan sessions, a
//! shared stream's subscribers, its ring's writer).
//!
//! A file of its own because both the sessions' paths (`serve_plan`) and the shared streams'
//! (`share::broadcast`) end through it, and the shared streams are what plan sessions relay:
//! kept in `serve_plan`, it made `share` import back from the module that imports it.

use crate::produce::Outcome;
use crate::stream_error::StreamError;

/// A stream's outcome as its session's result (`value` when it finished).
pub(crate) fn ended<T>(outcome: Outcome, value: T) -> Result<T, StreamError> {
    match outcome {
        Outcome::Finished => Ok(value),
        Outcome::Stopped(m) => Err(StreamError::Stopped(m)),
        Outcome::Failed(m) => Err(StreamError::Failed(m)),
        Outcome::Drained(m) => Err(StreamError::Drained(m)),
    }
}
