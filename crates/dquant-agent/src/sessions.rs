//! Sessions: a plan (or one dataset) opened on the control plane, then streamed over one data
//! connection.
//!
//! A session is *pending* from `Open` until its data connection presents the ticket, then
//! *active* until the stream ends, the client disconnects or `Close` cancels it. Everything a
//! session holds (its sources, its frame pool, its threads) belongs to it alone and is freed
//! when it ends, however it ends; a failing session never touches another.

use std::collections::HashMap;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use dquant_engine::{Pipeline, TokenSource};
use dquant_plan::{OutputDType, WireCodec};
use dquant_transport::WireError;

/// Why a session could not be added.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum SessionError {
    #[error(
        "agent is at its limit of {max} sessions; close finished readers or raise max_sessions"
    )]
    Full { max: usize },
}

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
    #[error("{0}")]
    Wire(#[from] WireError),
    #[error("cannot start a thread: {0}")]
    Thread(std::io::Error),
}

/// What a session will stream once its data connection arrives.
pub(crate) enum Work {
    /// A plan's batches, in the plan's wire codec.
    Plan {
        pipeline: Box<Pipeline>,
        output: OutputDType,
        wire: WireCodec,
    },
    /// Token ranges of one dataset, on request.
    Source {
        source: Box<dyn TokenSource>,
        name: String,
        wire: WireCodec,
    },
}

struct Pending {
    ticket: [u8; 16],
    work: Work,
    created: Instant,
}

struct Active {
    cancel: Arc<AtomicBool>,
    /// The session's socket (TCP data connection or Unix ring socket), shut down to cancel.
    conn: OwnedFd,
}

/// Wakes whatever the session's threads are blocked on in that socket.
fn shutdown(conn: &OwnedFd) {
    let _ = rustix::net::shutdown(conn, rustix::net::Shutdown::Both);
}

/// The agent's session table.
pub(crate) struct Sessions {
    next: AtomicU64,
    pending: Mutex<HashMap<u64, Pending>>,
    active: Mutex<HashMap<u64, Active>>,
    max: usize,
    ttl: Duration,
}

/// How a claim failed; the message goes to the connecting client.
pub(crate) fn claim_error(session: u64) -> String {
    format!("data stream: unknown session {session} or wrong ticket (sessions are claimed once, within the ticket's lifetime)")
}

impl Sessions {
    pub fn new(max: usize, ttl: Duration) -> Self {
        Sessions {
            next: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
            active: Mutex::new(HashMap::new()),
            max,
            ttl,
        }
    }

    /// Registers `work` and returns its id and ticket.
    pub fn add(&self, work: Work) -> Result<(u64, [u8; 16]), SessionError> {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        pending.retain(|id, p| {
            let keep = now.duration_since(p.created) < self.ttl;
            if !keep {
                tracing::info!(session = id, "session expired before its data connection");
            }
            keep
        });
        let active = self
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        if pending.len() + active >= self.max {
            return Err(SessionError::Full { max: self.max });
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let ticket: [u8; 16] = rand::random();
        pending.insert(
            id,
            Pending {
                ticket,
                work,
                created: now,
            },
        );
        Ok((id, ticket))
    }

    /// Takes a pending session for the connection that presented `ticket`.
    pub fn claim(
        &self,
        id: u64,
        ticket: &[u8; 16],
        conn: BorrowedFd<'_>,
    ) -> Option<(Work, Arc<AtomicBool>)> {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let p = pending.get(&id)?;
        // Constant-time compare: the ticket is the only secret on the data port.
        let diff = p
            .ticket
            .iter()
            .zip(ticket)
            .fold(0u8, |a, (x, y)| a | (x ^ y));
        if diff != 0 || p.created.elapsed() >= self.ttl {
            return None;
        }
        let p = pending.remove(&id)?;
        let cancel = Arc::new(AtomicBool::new(false));
        let conn = conn.try_clone_to_owned().ok()?;
        self.active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                id,
                Active {
                    cancel: cancel.clone(),
                    conn,
                },
            );
        Some((p.work, cancel))
    }

    pub fn finish(&self, id: u64) {
        self.active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
    }

    /// Cancels a session, pending or active. Returns whether it existed.
    pub fn close(&self, id: u64) -> bool {
        if self
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id)
            .is_some()
        {
            return true;
        }
        match self
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
        {
            Some(a) => {
                a.cancel.store(true, Ordering::Relaxed);
                shutdown(&a.conn);
                true
            }
            None => false,
        }
    }

    /// Cancels everything (agent shutdown).
    pub fn close_all(&self) {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        for a in self
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
        {
            a.cancel.store(true, Ordering::Relaxed);
            shutdown(&a.conn);
        }
    }

    /// (pending, active) session counts.
    pub fn counts(&self) -> (usize, usize) {
        (
            self.pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len(),
            self.active
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len(),
        )
    }
}
