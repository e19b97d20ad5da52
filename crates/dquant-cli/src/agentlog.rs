//! What an in-process agent reports about its sessions, taken from its tracing events.
//!
//! The agent counts the bytes it puts on the wire per session and logs them when the session
//! ends (`session ended`, with `wire_bytes`). `dquant demo` runs an agent in its own process
//! and installs [`SessionLog`] to read those counts: the agent's own measurement, not an
//! estimate made on the client side.

use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::Layer;

/// One finished session, as the agent logged it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionEnd {
    pub session: u64,
    /// `plan` (the agent ran a plan) or `source` (token ranges of one dataset).
    pub kind: String,
    pub records: u64,
    pub tokens: u64,
    /// Bytes of framed records the agent sent over the data plane.
    pub wire_bytes: u64,
}

static STREAMING: Mutex<Vec<(u64, String)>> = Mutex::new(Vec::new());
static ENDED: Mutex<Vec<SessionEnd>> = Mutex::new(Vec::new());

/// A tracing layer that records the agent's session events (install it with a filter that
/// lets `dquant_agent` info events through).
pub struct SessionLog;

#[derive(Default)]
struct Fields {
    message: String,
    session: Option<u64>,
    kind: String,
    records: u64,
    tokens: u64,
    wire_bytes: Option<u64>,
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        match field.name() {
            "session" => self.session = Some(value),
            "records" => self.records = value,
            "tokens" => self.tokens = value,
            "wire_bytes" => self.wire_bytes = Some(value),
            _ => {}
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if let Ok(v) = u64::try_from(value) {
            self.record_u64(field, v);
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.message = value.to_string(),
            "kind" => self.kind = value.to_string(),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "kind" => self.kind = format!("{value:?}").trim_matches('"').to_string(),
            _ => {}
        }
    }
}

impl<S: Subscriber> Layer<S> for SessionLog {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if !event.metadata().target().starts_with("dquant_agent") {
            return;
        }
        let mut f = Fields::default();
        event.record(&mut f);
        let Some(session) = f.session else { return };
        match f.message.as_str() {
            "session streaming" => STREAMING
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((session, f.kind)),
            "session ended" => {
                let Some(wire_bytes) = f.wire_bytes else {
                    return;
                };
                let kind = STREAMING
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .iter()
                    .rev()
                    .find(|(s, _)| *s == session)
                    .map(|(_, k)| k.clone())
                    .unwrap_or_default();
                ENDED
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(SessionEnd {
                        session,
                        kind,
                        records: f.records,
                        tokens: f.tokens,
                        wire_bytes,
                    });
            }
            _ => {}
        }
    }
}

/// Sessions that ended so far, in order.
pub fn ended() -> Vec<SessionEnd> {
    ENDED.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

/// Waits up to `timeout` for the `n`-th ended session of `kind` (0-based) and returns it. The
/// agent logs a session's end just after the client saw its last batch, so a caller that
/// finished reading may have to wait a moment.
pub fn wait_ended(kind: &str, n: usize, timeout: Duration) -> Option<SessionEnd> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = ended().into_iter().filter(|s| s.kind == kind).nth(n) {
            return Some(s);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
