//! An in-memory transport with the caller's clock, for tests that drive an agent's produce
//! loop without sockets, threads or sleeps (as quinn tests `quinn-proto`).
//!
//! Records wait in the sink until it flushes them as an idle TCP sink would ([`IdleFlush`]:
//! at once for the stream's first, then once enough bytes or enough simulated time has
//! gathered), and never while the consumer has not taken what was delivered before. The
//! queue holds at most `capacity` records: a full pair answers [`SinkError::Full`] instead of
//! blocking, so a test steps the consumer and retries.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::receive::{
    copy_payload, record_header, take_in_place, wait_until, BatchSource, ReceiveError, RecordView,
};
use crate::sink::{BatchSink, SinkError};
use crate::tcp::IdleFlush;
use crate::{BatchHeader, WireError};

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

/// The pair's state and the consumer's wake-up (for a consumer on another thread).
#[derive(Default)]
struct Pipe {
    state: Mutex<Shared>,
    arrived: Condvar,
}

/// A connected in-memory pair holding at most `capacity` records (delivered or held).
pub fn pair(capacity: usize) -> (MemorySink, MemorySource) {
    let shared = Arc::new(Pipe::default());
    let sink = MemorySink {
        shared: shared.clone(),
        held: Vec::new(),
        held_bytes: 0,
        room: Vec::new(),
        capacity,
        idle: IdleFlush::default(),
        sent: 0,
    };
    let source = MemorySource { shared, held: None };
    (sink, source)
}

fn lock(p: &Pipe) -> std::sync::MutexGuard<'_, Shared> {
    p.state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The producer end of an in-memory pair.
pub struct MemorySink {
    shared: Arc<Pipe>,
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
        self.shared.arrived.notify_all();
    }

    fn end(&mut self, end: End) {
        self.flush();
        lock(&self.shared).end.get_or_insert(end);
        self.shared.arrived.notify_all();
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
    shared: Arc<Pipe>,
    /// The record [`next_header`](BatchSource::next_header) took, until it is taken.
    held: Option<Vec<u8>>,
}

impl MemorySource {
    /// The next delivered record, if any (without waiting).
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

    /// Waits until a record or the end is at hand, at most until `deadline`; false if it
    /// passed first.
    fn wait(&self, deadline: Option<Instant>) -> bool {
        let (state, arrived) = (&self.shared.state, &self.shared.arrived);
        wait_until(state, arrived, deadline, |s| {
            s.delivered.is_empty() && s.end.is_none()
        })
    }
}

impl BatchSource for MemorySource {
    fn next_header(&mut self) -> Result<Option<BatchHeader>, ReceiveError> {
        self.held = None;
        self.wait(None);
        let Some(record) = self.next_record() else {
            return match self.end() {
                Some(End::Failed(m)) => Err(WireError::Remote(m).into()),
                _ => Ok(None),
            };
        };
        let h = record_header(&record, "in-memory")?;
        self.held = Some(record);
        Ok(Some(h))
    }

    fn take_record(&mut self) -> Option<RecordView> {
        take_in_place(&mut self.held)
    }

    fn read_payload(&mut self, out: &mut [u8]) -> Result<(), ReceiveError> {
        copy_payload(self.held.as_deref(), out, "in-memory")
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<bool, ReceiveError> {
        Ok(self.wait(Instant::now().checked_add(timeout)))
    }

    fn shutdown(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use dquant_codec::Codec;

    use crate::record::RECORD_HEADER_LEN;

    use super::*;

    fn record(index: u64, payload: &[u8]) -> Vec<u8> {
        let h = BatchHeader {
            codec: "u16".parse::<Codec>().unwrap(),
            index,
            samples: 1,
            sample_len: (payload.len() / 2) as u32,
            payload_len: payload.len() as u32,
            trailer_len: 0,
            cursor_epoch: 0,
            cursor_consumed: index + 1,
        };
        let mut r = h.encode().to_vec();
        r.extend_from_slice(payload);
        r
    }

    fn put(sink: &mut MemorySink, rec: &[u8]) {
        sink.reserve(rec.len() + 9).unwrap()[..rec.len()].copy_from_slice(rec);
        sink.commit(rec.len()).unwrap();
    }

    /// What the sink commits, the source hands over as batch records, in order, then the
    /// end; a failed stream ends with the producer's message after its records.
    #[test]
    fn records_cross_the_pair_whole_then_the_end_or_the_error() {
        for fail in [false, true] {
            let (mut sink, mut source) = pair(8);
            let recs: Vec<Vec<u8>> = (0..5u64).map(|i| record(i, &[i as u8; 6])).collect();
            for r in &recs {
                put(&mut sink, r);
            }
            assert!(
                !source.wait_ready(Duration::ZERO).unwrap(),
                "nothing delivered yet"
            );
            if fail {
                sink.fail("boom");
            } else {
                sink.finish().unwrap();
            }
            assert!(source.wait_ready(Duration::ZERO).unwrap());
            for r in &recs {
                let h = source.next_header().unwrap().unwrap();
                assert_eq!(h.cursor_consumed, h.index + 1);
                let mut payload = vec![0u8; h.payload_len as usize];
                source.read_payload(&mut payload).unwrap();
                assert_eq!(payload, r[RECORD_HEADER_LEN..]);
                if let Some(view) = source.take_record() {
                    assert_eq!(view[..], r[..]);
                }
            }
            match source.next_header() {
                Ok(None) => assert!(!fail),
                Err(ReceiveError::Wire(WireError::Remote(m))) => assert!(fail && m == "boom"),
                other => panic!("{other:?}"),
            }
        }
    }

    /// A full pair says so instead of blocking, and a consumer that hung up is gone.
    #[test]
    fn a_full_pair_and_a_closed_one_answer_at_once() {
        let (mut sink, mut source) = pair(2);
        put(&mut sink, &record(0, &[0; 4]));
        put(&mut sink, &record(1, &[0; 4]));
        assert_eq!(sink.reserve(10).unwrap_err(), SinkError::Full);
        sink.flush();
        assert!(source.next_header().unwrap().is_some());
        assert!(sink.reserve(10).is_ok());
        source.shutdown();
        assert_eq!(
            sink.reserve(10).unwrap_err(),
            SinkError::Gone("client went away".into())
        );
    }
}
