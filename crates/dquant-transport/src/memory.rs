//! An in-memory transport with the caller's clock, for tests that drive an agent's produce
//! loop without sockets, threads or sleeps (as quinn tests `quinn-proto`).
//!
//! Records wait in the sink until it flushes them as an idle TCP sink would ([`IdleFlush`]:
//! at once for the stream's first, then once enough bytes or enough simulated time has
//! gathered), and never while the consumer has not taken what was delivered before. The
//! queue holds at most `capacity` records: a full pair answers [`SinkError::Full`] instead of
//! blocking, so a test steps the consumer and retries.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use crate::sink::{BatchSink, SinkError};
use crate::tcp::IdleFlush;

/// How a stream ended, as the consumer sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// The producer finished the stream.
    Finished,
    /// The producer failed it with this message.
    Failed(String),
}

#[derive(Default)]
struct Shared {
    /// Delivered records, oldest first.
    delivered: VecDeque<Vec<u8>>,
    /// Set once the producer finished or failed (after its last record was delivered).
    end: Option<End>,
    /// Set once the consumer hung up.
    closed: bool,
}

/// A connected in-memory pair holding at most `capacity` records (delivered or held).
pub fn pair(capacity: usize) -> (MemorySink, MemorySource) {
    let shared = Arc::new(Mutex::new(Shared::default()));
    let sink = MemorySink {
        shared: shared.clone(),
        held: Vec::new(),
        held_bytes: 0,
        room: Vec::new(),
        capacity,
        idle: IdleFlush::default(),
        sent: 0,
    };
    (sink, MemorySource { shared })
}

fn lock(s: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    s.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The producer end of an in-memory pair.
pub struct MemorySink {
    shared: Arc<Mutex<Shared>>,
    /// Committed records not yet delivered.
    held: Vec<Vec<u8>>,
    held_bytes: usize,
    room: Vec<u8>,
    capacity: usize,
    idle: IdleFlush,
    /// Bytes delivered so far.
    sent: u64,
}

impl MemorySink {
    /// Records committed and not yet delivered.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Delivers what is held now, whatever the policy says.
    pub fn flush(&mut self) {
        let mut s = lock(&self.shared);
        self.sent += self.held_bytes as u64;
        s.delivered.extend(self.held.drain(..));
        self.held_bytes = 0;
        self.idle.reset();
    }

    fn end(&mut self, end: End) {
        self.flush();
        lock(&self.shared).end.get_or_insert(end);
    }
}

impl BatchSink for MemorySink {
    fn reserve(&mut self, len: usize) -> Result<&mut [u8], SinkError> {
        let s = lock(&self.shared);
        if s.closed {
            return Err(SinkError::Gone("client went away".into()));
        }
        if s.delivered.len() + self.held.len() >= self.capacity {
            return Err(SinkError::Full);
        }
        drop(s);
        self.room.resize(len, 0);
        Ok(&mut self.room[..len])
    }

    fn commit(&mut self, len: usize) -> Result<(), SinkError> {
        let record = self
            .room
            .get(..len)
            .ok_or_else(|| SinkError::Failed(format!("commit of {len} bytes past the room")))?;
        self.held.push(record.to_vec());
        self.held_bytes += len;
        Ok(())
    }

    fn flush_if_idle(&mut self, now: Instant) -> Result<(), SinkError> {
        let idle = lock(&self.shared).delivered.is_empty();
        if idle && !self.held.is_empty() && self.idle.due(self.held_bytes, self.sent, now) {
            self.flush();
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        self.end(End::Finished);
        Ok(())
    }

    fn fail(&mut self, message: &str) {
        self.end(End::Failed(message.to_string()));
    }
}

/// The consumer end of an in-memory pair.
pub struct MemorySource {
    shared: Arc<Mutex<Shared>>,
}

impl MemorySource {
    /// The next delivered record, if any.
    pub fn next_record(&mut self) -> Option<Vec<u8>> {
        lock(&self.shared).delivered.pop_front()
    }

    /// How the stream ended, once every delivered record was taken.
    pub fn end(&self) -> Option<End> {
        let s = lock(&self.shared);
        if s.delivered.is_empty() {
            s.end.clone()
        } else {
            None
        }
    }

    /// Hangs up: the sink's next reserve says the consumer went away.
    pub fn close(&mut self) {
        lock(&self.shared).closed = true;
    }
}
