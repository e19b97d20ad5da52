//! Sessions: a plan (or one dataset) opened on the control plane, then streamed over one data
//! connection.
//!
//! A session is *pending* from `Open` until its data connection presents the ticket, then
//! *active* until the stream ends, the client disconnects or `Close` cancels it. Everything a
//! session holds (its sources, its frame pool, its threads) belongs to it alone and is freed
//! when it ends, however it ends; a failing session never touches another.

use std::collections::HashMap;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use dquant_engine::{Pipeline, TokenSource};
use dquant_plan::{OutputDType, WireCodec};

use crate::metrics::{Meter, Metrics};

/// Why a session could not be added.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum SessionError {
    #[error(
        "agent is at its limit of {max} sessions; close finished readers or raise max_sessions"
    )]
    Full { max: usize },
    #[error("agent is draining: it takes no new sessions; open on another agent or retry after its restart")]
    Draining,
}

/// What a session will stream once its data connection arrives.
pub(crate) enum Work {
    /// A plan's batches, in the plan's wire codec.
    Plan {
        pipeline: Box<Pipeline>,
        output: OutputDType,
        wire: WireCodec,
    },
    /// A shared stream's batches, relayed from its window ([`crate::share`]).
    Subscriber { sub: crate::share::Subscription },
    /// Token ranges of one dataset, on request.
    Source {
        source: Box<dyn TokenSource>,
        name: String,
        wire: WireCodec,
    },
}

impl Work {
    /// The counters of this session for `tenant`: a plan's, with one per source of its plan
    /// (so a dashboard shows how many epochs of each dataset went out); a range session's,
    /// its tenant's alone.
    pub(crate) fn meter(&self, metrics: &Metrics, tenant: &str) -> Meter {
        match self {
            Work::Plan { pipeline, .. } => metrics.pipeline_meter(tenant, pipeline),
            // A subscriber's batches are counted once, by its stream's producer.
            Work::Subscriber { .. } => Meter::off(),
            Work::Source { .. } => metrics.meter(tenant),
        }
    }
}

impl Work {
    /// What the `Watch` feed and the log call this kind of session.
    pub fn kind(&self) -> &'static str {
        match self {
            Work::Plan { .. } => "plan",
            Work::Subscriber { .. } => "subscriber",
            Work::Source { .. } => "source",
        }
    }
}

struct Pending {
    ticket: [u8; 16],
    /// The tenant that opened it (`""` when the agent serves anyone).
    owner: String,
    work: Work,
    created: Instant,
}

struct Active {
    /// Its owner's proof, asked again by `Close`.
    ticket: [u8; 16],
    owner: String,
    /// A plan's batches (drained at shutdown), not a chained agent's ranges (cancelled).
    plan: bool,
    cancel: Arc<AtomicBool>,
    /// The session's socket (TCP data connection or Unix ring socket), shut down to cancel;
    /// `None` for a transport whose waits watch the cancel flag (loopback).
    conn: Option<OwnedFd>,
}

/// Compares two tickets in constant time: a ticket is the only secret of a session.
fn same_ticket(a: &[u8; 16], b: &[u8]) -> bool {
    b.len() == a.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Wakes whatever the session's threads are blocked on in that socket.
fn shutdown(conn: &Option<OwnedFd>) {
    if let Some(conn) = conn {
        let _ = rustix::net::shutdown(conn, rustix::net::Shutdown::Both);
    }
}

/// The agent's session table.
pub(crate) struct Sessions {
    pending: Mutex<HashMap<u64, Pending>>,
    active: Mutex<HashMap<u64, Active>>,
    /// Places promised to requests still opening their sources ([`Reservation`]).
    reserved: AtomicUsize,
    max: usize,
    ttl: Duration,
    /// Set by [`Sessions::drain`]: no new reservations from then on.
    draining: AtomicBool,
    /// Where an expired session's end is published.
    events: Arc<crate::events::Events>,
}

/// A place in the session table, held while a request opens its sources: admission is
/// decided before any dataset is opened, so a full agent refuses at once instead of doing
/// the work and then refusing. Dropping it gives the place back.
pub(crate) struct Reservation {
    sessions: Arc<Sessions>,
}

impl Reservation {
    /// Registers `work` in the reserved place; returns its id and ticket.
    pub fn add(self, work: Work, owner: &str) -> (u64, [u8; 16]) {
        match self.add_with(owner, |_| Ok::<_, std::convert::Infallible>(work)) {
            Ok(added) => added,
            Err(never) => match never {},
        }
    }

    /// Registers the work `make` makes for the session's id (a subscriber joins its stream
    /// under that id), or gives the place back with `make`'s error.
    pub fn add_with<E>(
        self,
        owner: &str,
        make: impl FnOnce(u64) -> Result<Work, E>,
    ) -> Result<(u64, [u8; 16]), E> {
        let s = &self.sessions;
        let mut pending = s.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let id = s.new_id(&pending);
        let work = make(id)?;
        let ticket: [u8; 16] = rand::random();
        pending.insert(
            id,
            Pending {
                ticket,
                owner: owner.to_string(),
                work,
                created: Instant::now(),
            },
        );
        Ok((id, ticket))
        // `self` drops here, giving back the reservation the pending entry now replaces.
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.sessions.reserved.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How a claim failed; the message goes to the connecting client.
pub(crate) fn claim_error(session: u64) -> String {
    format!("data stream: unknown session {session} or wrong ticket (sessions are claimed once, within the ticket's lifetime)")
}

impl Sessions {
    pub fn new(max: usize, ttl: Duration, events: Arc<crate::events::Events>) -> Self {
        Sessions {
            pending: Mutex::new(HashMap::new()),
            active: Mutex::new(HashMap::new()),
            reserved: AtomicUsize::new(0),
            max,
            ttl,
            draining: AtomicBool::new(false),
            events,
        }
    }

    /// A random id no session has (ids are not secrets, the ticket is; random ids just do
    /// not tell one client how many sessions others opened).
    fn new_id(&self, pending: &HashMap<u64, Pending>) -> u64 {
        let active = self.active.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let id: u64 = rand::random();
            if id != 0 && !pending.contains_key(&id) && !active.contains_key(&id) {
                return id;
            }
        }
    }

    /// Reserves a place for a session about to be opened, or says the agent is full.
    pub fn reserve(self: &Arc<Self>) -> Result<Reservation, SessionError> {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        self.expire_locked(&mut pending);
        let active = self
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        // Reservations are taken under the pending lock, so two requests cannot both take
        // the last place.
        if self.draining.load(Ordering::Relaxed) {
            return Err(SessionError::Draining);
        }
        let reserved = self.reserved.load(Ordering::Relaxed);
        if pending.len() + active + reserved >= self.max {
            return Err(SessionError::Full { max: self.max });
        }
        self.reserved.fetch_add(1, Ordering::Relaxed);
        Ok(Reservation {
            sessions: self.clone(),
        })
    }

    /// Drops pending sessions whose data connection did not come within the ticket's
    /// lifetime (the agent's reaper calls this every second, so their places are freed
    /// without waiting for the next `Open`). Returns how many were dropped.
    pub fn expire(&self) -> usize {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        self.expire_locked(&mut pending)
    }

    fn expire_locked(&self, pending: &mut HashMap<u64, Pending>) -> usize {
        let before = pending.len();
        let now = Instant::now();
        let expired: Vec<u64> = pending
            .iter()
            .filter(|(_, p)| now.duration_since(p.created) >= self.ttl)
            .map(|(&id, _)| id)
            .collect();
        for id in expired {
            let Some(p) = pending.remove(&id) else {
                continue;
            };
            tracing::info!(session = id, "session expired before its data connection");
            let why = format!(
                "its data connection did not come within the ticket's lifetime ({} s)",
                self.ttl.as_secs()
            );
            self.ended_pending(id, &p, "expired", why);
        }
        before - pending.len()
    }

    /// A session ended before its data connection came: the `Watch` feed's closed event.
    fn ended_pending(&self, id: u64, p: &Pending, how: &str, message: String) {
        self.events
            .closed_unclaimed(dquant_proto::v1::SessionClosed {
                session: id,
                tenant: p.owner.clone(),
                kind: p.work.kind().to_string(),
                how: how.into(),
                message,
                ..Default::default()
            });
    }

    /// Takes a pending session of `owner` (the tenant the hello's token named, `""` when
    /// the agent serves anyone) for the connection that presented `ticket`: its work and
    /// its cancel flag. Another tenant's session looks like an unknown one.
    pub fn claim(
        &self,
        id: u64,
        ticket: &[u8; 16],
        owner: &str,
        conn: Option<BorrowedFd<'_>>,
    ) -> Option<(Work, Arc<AtomicBool>)> {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let p = pending.get(&id)?;
        if !same_ticket(&p.ticket, ticket) || p.owner != owner || p.created.elapsed() >= self.ttl {
            return None;
        }
        let p = pending.remove(&id)?;
        let cancel = Arc::new(AtomicBool::new(false));
        let conn = conn.map(|c| c.try_clone_to_owned()).transpose().ok()?;
        self.active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                id,
                Active {
                    ticket: p.ticket,
                    owner: p.owner.clone(),
                    plan: !matches!(p.work, Work::Source { .. }),
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

    /// Cancels a session, pending or active, for the tenant that opened it showing its
    /// ticket. Returns
    /// whether such a session existed: a wrong ticket looks like an unknown id, so `Close`
    /// tells a stranger nothing.
    pub fn close(&self, id: u64, ticket: &[u8], owner: &str) -> bool {
        {
            let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(p) = pending.get(&id) {
                let owner = same_ticket(&p.ticket, ticket) && p.owner == owner;
                if let Some(p) = owner.then(|| pending.remove(&id)).flatten() {
                    self.ended_pending(id, &p, "stopped", "closed by the client".into());
                }
                return owner;
            }
        }
        match self
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
            .filter(|a| same_ticket(&a.ticket, ticket) && a.owner == owner)
        {
            Some(a) => {
                a.cancel.store(true, Ordering::Relaxed);
                shutdown(&a.conn);
                true
            }
            None => false,
        }
    }

    /// Starts a graceful shutdown: pending sessions are dropped (their clients had no batch
    /// yet), range sessions cancelled (a chained agent's reads fail and its own consumer is
    /// told), and plan sessions left to end themselves with their resume cursor; new
    /// reservations are refused from now on. Returns the number of plan sessions streaming.
    pub fn drain(&self) -> usize {
        self.draining.store(true, Ordering::Relaxed);
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        let active = self.active.lock().unwrap_or_else(PoisonError::into_inner);
        for a in active.values().filter(|a| !a.plan) {
            a.cancel.store(true, Ordering::Relaxed);
            shutdown(&a.conn);
        }
        active.values().filter(|a| a.plan).count()
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
