//! The agent's event feed, what the `Watch` RPC streams: sessions opened and closed,
//! subscribers joining and leaving shared streams, refusals, and per-tenant rate snapshots.
//!
//! Events are published once, into a bounded broadcast channel, and each watcher reads its
//! own copy: a slow watcher falls behind and is told how many events it missed (its `seq`
//! jumps), it never slows a session down. Rates come from per-tenant byte tallies the
//! sessions' meters add to, read by each watcher at its own interval.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dquant_proto::v1::event::Kind;
use dquant_proto::v1::{
    ErrorEvent, Event, RateSnapshot, SessionClosed, SessionOpened, SubscriberEvent, TenantRate,
};
use tokio::sync::broadcast;

/// Events kept for watchers that fall behind.
const BACKLOG: usize = 4096;

/// One tenant's running totals.
#[derive(Default)]
pub(crate) struct Tally {
    pub bytes: AtomicU64,
    pub sessions: AtomicU64,
}

pub(crate) struct Events {
    tx: broadcast::Sender<Event>,
    seq: AtomicU64,
    tallies: Mutex<BTreeMap<String, Arc<Tally>>>,
}

/// Now, in milliseconds since the Unix epoch.
pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Events {
    pub fn new() -> Self {
        Events {
            tx: broadcast::channel(BACKLOG).0,
            seq: AtomicU64::new(0),
            tallies: Mutex::default(),
        }
    }

    fn publish(&self, kind: Kind) {
        let event = Event {
            seq: self.seq.fetch_add(1, Ordering::Relaxed) + 1,
            unix_ms: unix_ms(),
            kind: Some(kind),
        };
        // No watcher: nothing to do.
        let _ = self.tx.send(event);
    }

    /// `tenant`'s tally (made on first use).
    pub fn tally(&self, tenant: &str) -> Arc<Tally> {
        let mut t = self.tallies.lock().unwrap_or_else(|p| p.into_inner());
        t.entry(tenant.to_string()).or_default().clone()
    }

    pub fn opened(&self, session: u64, tenant: &str, kind: &str, detail: String) {
        self.publish(Kind::Opened(SessionOpened {
            session,
            tenant: tenant.to_string(),
            kind: kind.to_string(),
            detail,
        }));
    }

    /// A session started streaming: counted in its tenant's sessions until [`closed`].
    ///
    /// [`closed`]: Events::closed
    pub fn streaming(&self, tenant: &str) {
        self.tally(tenant).sessions.fetch_add(1, Ordering::Relaxed);
    }

    pub fn closed(&self, c: SessionClosed) {
        let t = self.tally(&c.tenant);
        let _ = t
            .sessions
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        self.publish(Kind::Closed(c));
    }

    /// A subscriber joined or left a shared stream.
    pub fn subscriber(&self, e: SubscriberEvent) {
        self.publish(Kind::Subscriber(e));
    }

    /// A session ended before it streamed (closed or expired while pending): published, its
    /// tenant's streaming count untouched.
    pub fn closed_unclaimed(&self, c: SessionClosed) {
        self.publish(Kind::Closed(c));
    }

    pub fn refused(&self, plane: &str, reason: &str, detail: &str) {
        self.publish(Kind::Error(ErrorEvent {
            plane: plane.to_string(),
            reason: reason.to_string(),
            detail: detail.to_string(),
        }));
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }

    /// The next event number (for events made by a watcher itself).
    pub fn next_seq(&self) -> u64 {
        self.seq.load(Ordering::Relaxed)
    }

    /// Each tenant's totals now (only `only`'s when given).
    fn totals(&self, only: Option<&str>) -> Vec<(String, u64, u64)> {
        let t = self.tallies.lock().unwrap_or_else(|p| p.into_inner());
        t.iter()
            .filter(|(name, _)| only.is_none_or(|o| o == name.as_str()))
            .map(|(name, t)| {
                let b = t.bytes.load(Ordering::Relaxed);
                (name.clone(), b, t.sessions.load(Ordering::Relaxed))
            })
            .collect()
    }
}

/// One watcher's view: its filter, and the totals its last snapshot saw.
pub(crate) struct Watcher {
    /// `Some(tenant)`: only that tenant's sessions and rates (a tenant's watch).
    pub only: Option<String>,
    last: BTreeMap<String, u64>,
    at: Instant,
}

impl Watcher {
    pub fn new(only: Option<String>) -> Self {
        Watcher {
            only,
            last: BTreeMap::new(),
            at: Instant::now(),
        }
    }

    /// Whether this watcher may see `e`.
    pub fn sees(&self, e: &Event) -> bool {
        let Some(only) = &self.only else {
            return true;
        };
        match &e.kind {
            Some(Kind::Opened(o)) => &o.tenant == only,
            Some(Kind::Closed(c)) => &c.tenant == only,
            Some(Kind::Subscriber(s)) => &s.tenant == only,
            // Refusals name no tenant: they are the operator's.
            _ => false,
        }
    }

    /// A snapshot of the rates since the last one.
    pub fn snapshot(&mut self, events: &Events) -> Event {
        let now = Instant::now();
        let dt = now.duration_since(self.at).max(Duration::from_millis(1));
        self.at = now;
        let tenants = events
            .totals(self.only.as_deref())
            .into_iter()
            .map(|(tenant, bytes, sessions)| {
                let before = self.last.insert(tenant.clone(), bytes).unwrap_or(bytes);
                TenantRate {
                    tenant,
                    bytes_total: bytes,
                    bytes_per_s: bytes.saturating_sub(before) as f64 / dt.as_secs_f64(),
                    sessions: sessions as u32,
                }
            })
            .collect();
        Event {
            seq: events.next_seq(),
            unix_ms: unix_ms(),
            kind: Some(Kind::Rates(RateSnapshot { tenants })),
        }
    }
}
