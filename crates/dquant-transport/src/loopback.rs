//! Loopback: an agent and its consumer in one process, batch records handed over in memory.
//!
//! An agent embedded in the trainer's own process (`dquant_agent::start`, as the tests and a
//! single-node job may run it) serves its sessions here without a socket or a ring: the
//! consumer names `?transport=loopback`, its hello goes to the loopback listener of the agent
//! whose data port the control plane named (a table of this process's listeners, by port),
//! and each record moves as an owned buffer through a bounded queue. Memory is not a link,
//! so the agent sends the output dtype, as into a ring, and the consumer reads each record
//! where the agent made it.
//!
//! The queue holds at most the consumer's `ring.slots` records: a producer that gets ahead
//! waits (back-pressure), a consumer that hangs up is gone at the producer's next record,
//! and a session cancelled by the agent wakes from its wait within [`CANCEL_CHECK`].
//!
//! This module is the whole transport: its listener, its sink and its source. Its `Kind` is
//! one line in [`crate::connect`]'s registry, and the agent's side is one module
//! (`dquant_agent`'s `loopback.rs`) started from one line.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::error::ConnectError;
use crate::receive::{
    copy_payload, record_header, take_in_place, wait_until, BatchSource, ReceiveError, RecordView,
};
use crate::sink::{record_room, BatchSink, SinkError};
use crate::{BatchHeader, Hello, WireError};

/// How often a producer waiting for room looks at its session's cancel flag.
pub const CANCEL_CHECK: Duration = Duration::from_millis(50);

/// What errors and reports call this transport.
const NAME: &str = "loopback";

/// The loopback listeners of this process's agents, by data port.
static LISTENERS: Mutex<BTreeMap<u16, mpsc::Sender<Offer>>> = Mutex::new(BTreeMap::new());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section below leaves its state whole; a panic elsewhere changes nothing.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An agent's loopback listener: the offers of consumers in this process that named its data
/// port. Dropping it takes it out of the table.
pub struct Listener {
    port: u16,
    offers: mpsc::Receiver<Offer>,
}

impl Listener {
    /// Listens for the agent whose data port is `port`; `None` when another agent of this
    /// process already does (a port bound twice, once per address family).
    pub fn bind(port: u16) -> Option<Listener> {
        let mut listeners = lock(&LISTENERS);
        if listeners.contains_key(&port) {
            return None;
        }
        let (tx, offers) = mpsc::channel();
        listeners.insert(port, tx);
        Some(Listener { port, offers })
    }

    /// The next offer, or `None` when `timeout` passed first.
    pub fn accept(&self, timeout: Duration) -> Option<Offer> {
        // Disconnected cannot happen while the table holds the sender; either way, no offer.
        self.offers.recv_timeout(timeout).ok()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        lock(&LISTENERS).remove(&self.port);
    }
}

/// How a stream ended.
enum End {
    Finished,
    Failed(String),
}

/// The records between one session's producer and its consumer.
struct Queue {
    state: Mutex<State>,
    /// Signalled on every change: a record in or out, the end, a hang-up.
    changed: Condvar,
    capacity: usize,
}

#[derive(Default)]
struct State {
    records: VecDeque<Vec<u8>>,
    end: Option<End>,
    hung_up: bool,
}

impl Queue {
    fn end(&self, end: End) {
        lock(&self.state).end.get_or_insert(end);
        self.changed.notify_all();
    }

    /// Waits on `changed` for at most `for_at_most` (spurious wake-ups are the caller's loop).
    fn wait<'a>(&self, s: MutexGuard<'a, State>, for_at_most: Duration) -> MutexGuard<'a, State> {
        self.changed
            .wait_timeout(s, for_at_most)
            .unwrap_or_else(PoisonError::into_inner)
            .0
    }
}

/// A consumer's hello and the queue its session's records are to go into.
#[derive(Clone)]
pub struct Offer {
    pub hello: Hello,
    queue: Arc<Queue>,
}

impl Offer {
    /// Refuses the session: the consumer's next read fails with `message`.
    pub fn refuse(&self, message: &str) {
        self.queue.end(End::Failed(message.to_string()));
    }

    /// The producer's end of the session's queue; its waits give up once `cancel` is set.
    pub fn accept(&self, cancel: Arc<AtomicBool>) -> LoopbackSink {
        LoopbackSink {
            queue: self.queue.clone(),
            room: Vec::new(),
            cancel,
        }
    }
}

/// Connects to the loopback listener of the agent in this process whose data plane is
/// `data_addr` (`HOST:PORT`), hands it the session's `hello`, and gets a queue of `slots`
/// records.
pub fn connect(data_addr: &str, hello: &Hello, slots: u32) -> Result<LoopbackSource, ConnectError> {
    let refused = |why: String| ConnectError::Connect {
        addr: data_addr.to_string(),
        source: std::io::Error::new(std::io::ErrorKind::ConnectionRefused, why),
    };
    let port = data_addr
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse::<u16>().ok())
        .ok_or_else(|| refused("not HOST:PORT".into()))?;
    let queue = Arc::new(Queue {
        state: Mutex::new(State::default()),
        changed: Condvar::new(),
        capacity: slots.max(1) as usize,
    });
    let offer = Offer {
        hello: hello.clone(),
        queue: queue.clone(),
    };
    let sent = lock(&LISTENERS).get(&port).map(|tx| tx.send(offer).is_ok());
    if sent != Some(true) {
        return Err(refused(format!(
            "no agent in this process serves loopback sessions on data port {port}: \
             transport=loopback reaches only an agent started in the same process"
        )));
    }
    Ok(LoopbackSource { queue, held: None })
}

/// The producer's end of a session's queue.
pub struct LoopbackSink {
    queue: Arc<Queue>,
    /// The record being made; it moves into the queue whole at its commit.
    room: Vec<u8>,
    cancel: Arc<AtomicBool>,
}

impl LoopbackSink {
    /// Waits until the queue has room for one more record.
    fn wait_for_room(&self) -> Result<(), SinkError> {
        let mut s = lock(&self.queue.state);
        loop {
            if s.hung_up {
                return Err(SinkError::Gone("client went away".into()));
            }
            if self.cancel.load(Ordering::Relaxed) {
                return Err(SinkError::Gone("session cancelled".into()));
            }
            if s.records.len() < self.queue.capacity {
                return Ok(());
            }
            s = self.queue.wait(s, CANCEL_CHECK);
        }
    }
}

impl BatchSink for LoopbackSink {
    fn reserve(&mut self, len: usize) -> Result<&mut [u8], SinkError> {
        self.wait_for_room()?;
        record_room(&mut self.room, len)
    }

    fn commit(&mut self, len: usize) -> Result<(), SinkError> {
        if len > self.room.len() {
            return Err(SinkError::Failed(format!(
                "{NAME}: commit of {len} bytes past a {}-byte room",
                self.room.len()
            )));
        }
        let mut record = std::mem::take(&mut self.room);
        record.truncate(len);
        lock(&self.queue.state).records.push_back(record);
        self.queue.changed.notify_all();
        Ok(())
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        self.queue.end(End::Finished);
        Ok(())
    }

    fn fail(&mut self, message: &str) {
        self.queue.end(End::Failed(message.to_string()));
    }
}

impl Drop for LoopbackSink {
    /// A session that ends without finishing its stream (its thread unwinding) leaves the
    /// consumer an error rather than a wait; a panic's own message, told first, stays.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.queue.end(End::Failed(format!(
                "{NAME}: the agent ended the session without ending its stream"
            )));
        }
    }
}

/// The consumer's end of a session's queue.
pub struct LoopbackSource {
    queue: Arc<Queue>,
    /// The record [`next_header`](BatchSource::next_header) took, until it is taken.
    held: Option<Vec<u8>>,
}

impl LoopbackSource {
    /// Waits until a record or the end is at hand, at most until `deadline`; false if it
    /// passed first.
    ///
    /// Every [`CANCEL_CHECK`] it also looks whether anyone else still holds the queue: an
    /// offer the agent never took (it stopped first) leaves this source alone with it, and
    /// the stream then ends with an error instead of a wait for ever.
    fn wait(&self, deadline: Option<Instant>) -> bool {
        let (state, changed) = (&self.queue.state, &self.queue.changed);
        loop {
            let step = Instant::now() + CANCEL_CHECK;
            let until = deadline.map_or(step, |d| d.min(step));
            if wait_until(state, changed, Some(until), |s| {
                s.records.is_empty() && s.end.is_none()
            }) {
                return true;
            }
            if Arc::strong_count(&self.queue) == 1 {
                self.queue.end(End::Failed(format!(
                    "{NAME}: the agent went away before it served the session"
                )));
                return true;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return false;
            }
        }
    }
}

impl BatchSource for LoopbackSource {
    fn next_header(&mut self) -> Result<Option<BatchHeader>, ReceiveError> {
        self.held = None;
        self.wait(None);
        let mut s = lock(&self.queue.state);
        let Some(record) = s.records.pop_front() else {
            return match &s.end {
                Some(End::Failed(m)) => Err(WireError::Remote(m.clone()).into()),
                _ => Ok(None),
            };
        };
        drop(s);
        self.queue.changed.notify_all();
        let h = record_header(&record, NAME)?;
        self.held = Some(record);
        Ok(Some(h))
    }

    fn take_record(&mut self) -> Option<RecordView> {
        take_in_place(&mut self.held)
    }

    fn read_payload(&mut self, out: &mut [u8]) -> Result<(), ReceiveError> {
        copy_payload(self.held.as_deref(), out, NAME)
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<bool, ReceiveError> {
        Ok(self.wait(Instant::now().checked_add(timeout)))
    }

    fn shutdown(&mut self) {
        lock(&self.queue.state).hung_up = true;
        self.queue.changed.notify_all();
    }
}

impl Drop for LoopbackSource {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connect(port: u16, slots: u32) -> Result<LoopbackSource, ConnectError> {
        let hello = Hello {
            session: 7,
            ticket: [3; 16],
            token: None,
        };
        super::connect(&format!("127.0.0.1:{port}"), &hello, slots)
    }

    fn record(index: u64) -> Vec<u8> {
        let h = BatchHeader {
            codec: "u16".parse().unwrap(),
            index,
            samples: 1,
            sample_len: 3,
            payload_len: 6,
            trailer_len: 0,
            cursor_epoch: 0,
            cursor_consumed: index + 1,
        };
        let mut r = h.encode().to_vec();
        r.extend_from_slice(&[index as u8; 6]);
        r
    }

    fn put(sink: &mut LoopbackSink, r: &[u8]) -> Result<(), SinkError> {
        sink.reserve(r.len())?.copy_from_slice(r);
        sink.commit(r.len())
    }

    /// Records cross in order and whole, a full queue holds its producer until the consumer
    /// takes one, and the end follows the last record.
    #[test]
    fn records_cross_in_order_with_back_pressure_then_the_end() {
        let listener = Listener::bind(40001).unwrap();
        assert!(Listener::bind(40001).is_none(), "one listener a port");
        let mut source = connect(40001, 2).unwrap();
        let offer = listener.accept(Duration::from_secs(1)).unwrap();
        assert_eq!((offer.hello.session, offer.hello.ticket), (7, [3; 16]));
        let producer = std::thread::spawn(move || {
            let mut sink = offer.accept(Arc::new(AtomicBool::new(false)));
            for i in 0..20 {
                put(&mut sink, &record(i)).unwrap();
                let s = lock(&sink.queue.state);
                assert!(s.records.len() <= 2, "the queue holds at most its slots");
            }
            sink.finish().unwrap();
        });
        for i in 0..20 {
            let h = source.next_header().unwrap().unwrap();
            assert_eq!(h.index, i);
            let mut payload = [0u8; 6];
            source.read_payload(&mut payload).unwrap();
            assert_eq!(payload, [i as u8; 6]);
        }
        assert!(source.next_header().unwrap().is_none());
        producer.join().unwrap();
    }

    /// A consumer that hangs up, and a cancel, end a waiting producer; a refusal and a
    /// failure reach the consumer as the agent's message; no listener is a clear error.
    #[test]
    fn hang_ups_cancels_refusals_and_no_listener() {
        let listener = Listener::bind(40002).unwrap();
        let source = connect(40002, 1).unwrap();
        let offer = listener.accept(Duration::from_secs(1)).unwrap();
        let cancel = Arc::new(AtomicBool::new(false));
        let mut sink = offer.accept(cancel.clone());
        put(&mut sink, &record(0)).unwrap();
        cancel.store(true, Ordering::Relaxed);
        assert_eq!(
            put(&mut sink, &record(1)),
            Err(SinkError::Gone("session cancelled".into()))
        );
        drop(source);
        let mut sink = offer.accept(Arc::new(AtomicBool::new(false)));
        assert_eq!(
            put(&mut sink, &record(1)),
            Err(SinkError::Gone("client went away".into()))
        );

        let mut source = connect(40002, 1).unwrap();
        let offer = listener.accept(Duration::from_secs(1)).unwrap();
        offer.refuse("data stream: unknown session 7");
        match source.next_header() {
            Err(ReceiveError::Wire(WireError::Remote(m))) => {
                assert_eq!(m, "data stream: unknown session 7")
            }
            other => panic!("{other:?}"),
        }

        // An offer the agent never took (it stopped first) ends the stream, not a wait.
        let mut source = connect(40002, 1).unwrap();
        drop(listener.accept(Duration::from_secs(1)).unwrap());
        match source.next_header() {
            Err(ReceiveError::Wire(WireError::Remote(m))) => {
                assert_eq!(
                    m,
                    "loopback: the agent went away before it served the session"
                )
            }
            other => panic!("{other:?}"),
        }

        drop(listener);
        let e = connect(40002, 1).err().unwrap();
        assert_eq!(
            e.to_string(),
            "cannot reach agent 127.0.0.1:40002: no agent in this process serves loopback \
             sessions on data port 40002: transport=loopback reaches only an agent started \
             in the same process"
        );
    }
}
