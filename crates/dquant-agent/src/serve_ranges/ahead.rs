//! A range session's requests worked on ahead, their compression on the worker pool.
//!
//! Why: compression is what bounds a chained storage agent (one thread at `zstd:1` against a
//! link), and its client keeps several requests in flight (readahead: 4 chunks of 512 Ki
//! tokens), so the session can read the next ranges and have them compressed on the pool while
//! it writes the current answer. The answers leave strictly in request and range order, the
//! same bytes as one thread writes; a range that cannot be served fails after the ranges
//! before it, and nothing after it is answered, as on one thread.
//!
//! Memory: ranges are read only while fewer than [`BUDGET_TOKENS`] tokens are read and not yet
//! answered (or one range, when a single range is larger), whatever the requests ask for.

use std::collections::VecDeque;

use dquant_engine::WorkerPool;

use super::{Encoding, RangeError, Ranges, RecordOut};
use crate::produce::Stats;

/// Requests taken from the connection before the oldest is answered.
pub(super) const REQUESTS_AHEAD: usize = 4;

/// Tokens read and not yet answered, at most: what the client's readahead asks for at once
/// (`dquant_remote::ReadaheadConfig::DEFAULT`, 4 chunks of 512 Ki tokens).
const BUDGET_TOKENS: u64 = 4 * 512 * 1024;

/// A request's parts not read yet.
enum Todo {
    Range {
        start: u64,
        len: u64,
    },
    /// The end of a request: its answers are flushed there.
    End,
}

/// A request's parts read and handed to the pool, or the reason one could not be.
enum Started {
    Range(Encoding),
    Failed(RangeError),
    End,
}

#[derive(Default)]
pub(super) struct Ahead {
    todo: VecDeque<Todo>,
    started: VecDeque<Started>,
    /// Tokens of the started ranges not answered yet.
    in_flight: u64,
    /// Requests taken and not answered yet.
    requests: usize,
}

impl Ahead {
    /// Requests taken and not answered yet.
    pub(super) fn requests(&self) -> usize {
        self.requests
    }

    /// Queues a request's ranges.
    pub(super) fn take(&mut self, ranges: &[(u64, u64)]) {
        let parts = ranges
            .iter()
            .map(|&(start, len)| Todo::Range { start, len });
        self.todo.extend(parts.chain([Todo::End]));
        self.requests += 1;
    }

    /// Writes the oldest request's answers into `sink`, reading more ranges as answers leave:
    /// Ok(false) when the client went away, Err with the message of the first range that
    /// cannot be served (the session ends there).
    pub(super) fn answer_next(
        &mut self,
        ds: &mut Ranges,
        pool: &WorkerPool,
        sink: &mut dyn RecordOut,
        stats: &mut Stats,
    ) -> Result<bool, RangeError> {
        self.requests = self.requests.saturating_sub(1);
        loop {
            self.top_up(ds, pool);
            match self.started.pop_front() {
                Some(Started::Range(e)) => {
                    self.in_flight -= e.len;
                    if !ds.deliver(e, sink, stats)? {
                        return Ok(false);
                    }
                }
                Some(Started::Failed(m)) => return Err(m),
                Some(Started::End) | None => return Ok(true),
            }
        }
    }

    /// Reads queued ranges and hands them to the pool while the budget allows. A range that
    /// cannot be served is the last thing started: nothing after it is answered.
    fn top_up(&mut self, ds: &mut Ranges, pool: &WorkerPool) {
        while self.in_flight < BUDGET_TOKENS || self.started.is_empty() {
            let Some(next) = self.todo.pop_front() else {
                return;
            };
            match next {
                Todo::End => self.started.push_back(Started::End),
                Todo::Range { start, len } => match ds.start(start, len, pool) {
                    Ok(e) => {
                        self.in_flight += len;
                        self.started.push_back(Started::Range(e));
                    }
                    Err(m) => {
                        self.started.push_back(Started::Failed(m));
                        self.todo.clear();
                    }
                },
            }
        }
    }
}
