//! Shared streams: one plan run once, its batches delivered to every subscriber.
//!
//! Every tensor-parallel and pipeline rank of one data-parallel replica reads the same
//! batches; without sharing, each would open its own session and the agent would read, pack
//! and encode the same data once per rank. A consumer that opens a plan with `share =
//! "job42/dp3"` creates a [`SharedStream`] (or joins the tenant's stream of that name when it
//! runs the same plan); others join it by name (`Subscribe`). One producer thread runs the
//! plan into the stream's [`Window`] through [`WindowSink`], the same produce loop a session
//! runs ([`crate::produce::run`]); each subscriber is a session of its own whose connection
//! thread relays the window's records into its transport ([`relay`]). The slowest subscriber
//! sets the pace: the producer waits while the window is full of records someone has not
//! read. A subscriber that goes away leaves the window, and the others go on.
//!
//! Records are made once in the plan's wire codec (what TCP subscribers get). A
//! shared-memory subscriber needs them in the output dtype; that form is made from the wire
//! record once, by whichever ring subscriber first needs it. Shared-memory subscribers on
//! the agent's host read them from one ring the producer writes once ([`broadcast`]); a
//! record already in the output dtype is made straight in that ring.

mod broadcast;
mod produce;
mod relay;
mod window;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::Duration;

use dquant_codec::kernels::store_plain;
use dquant_codec::Decoder;
use dquant_engine::{plain_codec, Pipeline};
use dquant_plan::{OutputDType, WireCodec};
use dquant_proto::v1::SubscriberEvent;
use dquant_transport::frame::{payload_crc, MAX_PAYLOAD};
use dquant_transport::record::RECORD_HEADER_LEN;
use dquant_transport::BatchHeader;

use crate::events::Events;
use crate::metrics::Meter;
use crate::produce::Outcome;

pub(crate) use broadcast::serve_subscriber;
pub(crate) use relay::{relay, FrameOutlet, RingOutlet};
pub(crate) use window::{End, JoinError, Next, Pos, Window};

/// The longest share name.
pub(crate) const MAX_SHARE_NAME: usize = 256;

/// Why a shared stream cannot be opened, joined or carried where it was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum ShareError {
    #[error(
        "share: {0:?} is not a share name (1 to {MAX_SHARE_NAME} printable ASCII characters \
         without spaces, e.g. \"job42/dp3\")"
    )]
    BadName(String),
    /// A subscriber's cursor is not in the stream's window.
    #[error("share {name:?}: {source}")]
    JoinRefused {
        name: String,
        #[source]
        source: JoinError,
    },
    #[error("share {0:?} runs a different plan; subscribe to it, or choose another name")]
    DifferentPlan(String),
    /// `open_or_join` called again with the stream it was already given.
    #[error("a shared stream opened twice")]
    OpenedTwice,
    /// The stream's producer thread cannot be started (the system's message).
    #[error("cannot start a thread: {0}")]
    Thread(String),
    /// A record of the stream cannot be made plain for a ring (a bug, or memory gone bad).
    #[error("a shared record: {0}")]
    BadRecord(String),
    /// A subscriber outside the stream's shared ring met a batch only the ring has (made
    /// while every subscriber read the ring): it joined behind the stream's head.
    #[error(
        "share {0:?}: the batches at this subscriber's cursor went only into the stream's \
         shared ring, which this subscriber does not read; subscribe at the stream's current \
         cursor"
    )]
    OnlyInRing(String),
}

/// Checks a share name: 1 to [`MAX_SHARE_NAME`] bytes of printable ASCII, no spaces.
pub(crate) fn check_name(name: &str) -> Result<(), ShareError> {
    let printable = name.bytes().all(|b| b.is_ascii_graphic());
    if name.is_empty() || name.len() > MAX_SHARE_NAME || !printable {
        return Err(ShareError::BadName(name.to_string()));
    }
    Ok(())
}

/// One record of a shared stream: the wire form, and what subscribers need of it made once
/// for all of them, on demand.
pub(crate) struct Slot {
    wire: Vec<u8>,
    tokens: u64,
    /// The crc32c of each frame-sized chunk of `wire` (TCP subscribers).
    crcs: OnceLock<Vec<u32>>,
    /// The record in the output dtype (shared-memory subscribers); `None`: `wire` is.
    plain: OnceLock<Result<Option<Vec<u8>>, ShareError>>,
    /// Where `wire`'s buffer goes back to when the slot is dropped.
    spares: Arc<Spares>,
    /// The record went only into the stream's shared ring (every subscriber read it there
    /// when it was made): `wire` is empty ([`broadcast`]).
    ring_only: bool,
}

impl Slot {
    /// The wire record in frame-sized chunks.
    fn chunks(&self) -> std::slice::Chunks<'_, u8> {
        self.wire.chunks(MAX_PAYLOAD)
    }

    /// The crc32c of each of [`Slot::chunks`].
    fn crcs(&self) -> &[u32] {
        self.crcs
            .get_or_init(|| self.chunks().map(payload_crc).collect())
    }

    /// The record in `output`'s plain dtype.
    fn plain(&self, output: OutputDType) -> Result<&[u8], ShareError> {
        match self.plain.get_or_init(|| plain_record(&self.wire, output)) {
            Ok(Some(plain)) => Ok(plain),
            Ok(None) => Ok(&self.wire),
            Err(e) => Err(e.clone()),
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.spares.put(std::mem::take(&mut self.wire));
    }
}

/// Record buffers of slots the window has dropped, for the producer's next records: a
/// stream allocates (and the kernel zeroes) a few buffers, not one per batch.
#[derive(Default)]
struct Spares(Mutex<Vec<Vec<u8>>>);

/// Buffers kept for reuse; more are freed.
const SPARES: usize = 4;

impl Spares {
    fn put(&self, buf: Vec<u8>) {
        let mut s = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if s.len() < SPARES && buf.capacity() > 0 {
            s.push(buf);
        }
    }

    fn take(&self) -> Vec<u8> {
        let mut s = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        s.pop().unwrap_or_default()
    }
}

/// `wire` (a batch record in any codec) with its tokens in `output`'s plain dtype, as a
/// shared-memory ring carries them; `None` when it already is.
fn plain_record(wire: &[u8], output: OutputDType) -> Result<Option<Vec<u8>>, ShareError> {
    let head: &[u8; RECORD_HEADER_LEN] = wire
        .get(..RECORD_HEADER_LEN)
        .and_then(|h| h.try_into().ok())
        .ok_or_else(|| ShareError::BadRecord("shorter than its header".into()))?;
    let mut h = BatchHeader::parse(head).map_err(|e| ShareError::BadRecord(e.to_string()))?;
    let want = plain_codec(output);
    if h.codec == want {
        return Ok(None);
    }
    let (data, trailer) = (h.data_len() as usize, h.trailer_len as usize);
    let body = &wire[RECORD_HEADER_LEN..];
    let bad = |e: String| ShareError::BadRecord(format!("batch {}: {e}", h.index));
    if body.len() < data + trailer {
        return Err(bad(format!(
            "{} bytes of a {}-byte payload",
            body.len(),
            data + trailer
        )));
    }
    let mut tokens = vec![0u32; h.tokens()];
    Decoder::new()
        .decode(h.codec, &body[..data], &mut tokens)
        .map_err(|e| bad(e.to_string()))?;
    let bytes = tokens.len() * output.itemsize();
    let mut out = vec![0u8; RECORD_HEADER_LEN + bytes + trailer];
    let (tok, rest) = out[RECORD_HEADER_LEN..].split_at_mut(bytes);
    store_plain(output.width(), &tokens, tok).map_err(|e| bad(e.to_string()))?;
    rest.copy_from_slice(&body[data..data + trailer]);
    h.codec = want;
    h.payload_len = (bytes + trailer) as u32;
    out[..RECORD_HEADER_LEN].copy_from_slice(&h.encode());
    Ok(Some(out))
}

/// What a consumer opening or joining a stream is told of it, and what its ring must hold.
#[derive(Clone, Debug, Default)]
pub(crate) struct StreamInfo {
    /// The reply every opener and subscriber gets, but for its session, ticket, start and
    /// `joined`: the plan's schedule, the agent's data port and socket, and the plan
    /// (normalized JSON, which a joiner's must equal).
    pub reply: dquant_proto::v1::OpenReply,
    /// Bytes of room a record in the output dtype may need (a ring slot must hold it).
    pub plain_room: usize,
}

/// One plan run once for many subscribers.
pub(crate) struct SharedStream {
    pub name: String,
    pub tenant: String,
    pub info: StreamInfo,
    output: OutputDType,
    window: Mutex<Window<Arc<Slot>>>,
    /// Subscribers wait here for the next record or the end (woken by a push).
    fresh: Condvar,
    /// Buffers of records the window dropped.
    spares: Arc<Spares>,
    /// The producer waits here for room or for its group (woken by a subscriber that
    /// advances, joins or leaves): one waiter, so readers do not wake each other.
    room: Condvar,
    events: Arc<Events>,
    /// The stream's shared ring, while it has one.
    broadcast: Mutex<broadcast::SharedRing>,
}

/// How long a blocked producer or subscriber sleeps before it looks at its flags again.
const RECHECK: Duration = Duration::from_millis(100);

impl SharedStream {
    fn lock(&self) -> MutexGuard<'_, Window<Arc<Slot>>> {
        self.window.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds subscriber `session` at `at` (`None`: the stream's current cursor).
    pub fn join(
        self: &Arc<Self>,
        session: u64,
        at: Option<Pos>,
    ) -> Result<Subscription, JoinError> {
        let mut w = self.lock();
        let from = w.join(session, at)?;
        self.publish(session, true, from, w.subscribers());
        self.room.notify_one();
        Ok(Subscription {
            stream: self.clone(),
            session,
            from,
            silent: false,
        })
    }

    /// Adds `session` as a silent subscriber where subscriber `beside` is (see
    /// [`Window::join_silent_beside`]), and its window index; `None` when `beside` is not
    /// subscribed or `session` is.
    fn join_silent_beside(
        self: &Arc<Self>,
        session: u64,
        beside: u64,
    ) -> Option<(Subscription, u64)> {
        let mut w = self.lock();
        let index = w.join_silent_beside(session, beside)?;
        let from = w.head();
        drop(w);
        let sub = Subscription {
            stream: self.clone(),
            session,
            from,
            silent: true,
        };
        Some((sub, index))
    }

    /// Subscriber `session`'s next record index.
    fn index_of(&self, session: u64) -> Option<u64> {
        self.lock().index_of(session)
    }

    /// Where subscriber `session` stands: the position before its next record (the head
    /// when it is not subscribed).
    fn position_of(&self, session: u64) -> Pos {
        let w = self.lock();
        match w.index_of(session) {
            Some(i) => w.position_of(i),
            None => w.head(),
        }
    }

    /// The lowest next record index of the subscribers `skip` does not pick.
    fn slowest_except(&self, skip: impl Fn(u64) -> bool) -> Option<u64> {
        self.lock().slowest_except(skip)
    }

    /// Each of `sessions` has its next `n` records.
    fn advance_each(&self, sessions: impl Iterator<Item = u64>, n: usize) {
        let mut w = self.lock();
        for s in sessions {
            w.advance_by(s, n);
        }
        drop(w);
        self.room.notify_one();
    }

    fn publish(&self, session: u64, joined: bool, at: Pos, subscribers: usize) {
        self.events.subscriber(SubscriberEvent {
            share: self.name.clone(),
            session,
            tenant: self.tenant.clone(),
            joined,
            epoch: at.epoch,
            consumed_samples: at.consumed,
            subscribers: subscribers as u32,
        });
    }

    /// What subscriber `session` gets next, waiting up to `wait` for the producer: the
    /// records ready for it, as many as `max_bytes` holds (at least one), and the position
    /// after the first; or the end; or nothing yet.
    fn next(&self, session: u64, wait: Duration, max_bytes: usize) -> Option<Next<Vec<Arc<Slot>>>> {
        let w = self.lock();
        let (w, _) = self
            .fresh
            .wait_timeout_while(w, wait, |w| matches!(w.next(session), Some(Next::Wait)))
            .unwrap_or_else(PoisonError::into_inner);
        Some(match w.next(session)? {
            Next::Record(first, to) => {
                let mut total = 0;
                let mut run: Vec<Arc<Slot>> = w
                    .ready(session)
                    .take_while(|s| {
                        total += s.wire.len();
                        total <= max_bytes
                    })
                    .cloned()
                    .collect();
                if run.is_empty() {
                    run.push(first);
                }
                Next::Record(run, to)
            }
            Next::Wait => Next::Wait,
            Next::End(end) => Next::End(end),
        })
    }

    /// Pushes the record the producer made in the shared ring (`record`: its bytes there, a
    /// batch of `tokens` ending at `to`) as the window's next, `sessions` (the ring's members
    /// and writer, who have it) moved past it. The window keeps a copy only when a
    /// subscriber outside `sessions` needs it; else the record is only the ring's. `false`:
    /// not pushed (as [`Window::push`]).
    fn push_from_ring(&self, record: &[u8], tokens: u64, to: Pos, sessions: &[u64]) -> bool {
        let mut w = self.lock();
        // Under the window's lock: a subscriber that joins after this sees the next record.
        let outside = w.slowest_except(|id| sessions.contains(&id)).is_some();
        let wire = if outside {
            let mut copy = self.spares.take();
            copy.clear();
            copy.extend_from_slice(record);
            copy
        } else {
            Vec::new()
        };
        let slot = Arc::new(Slot {
            wire,
            tokens,
            crcs: OnceLock::new(),
            plain: OnceLock::new(),
            spares: self.spares.clone(),
            ring_only: !outside,
        });
        let pushed = w.push(slot, to);
        if pushed {
            for &id in sessions {
                w.advance_by(id, 1);
            }
        }
        drop(w);
        if outside {
            self.fresh.notify_all();
        }
        pushed
    }

    /// Whether a subscriber outside `sessions` (a shared ring's members and writer) reads
    /// the stream.
    fn read_outside(&self, sessions: &[u64]) -> bool {
        self.lock()
            .slowest_except(|id| sessions.contains(&id))
            .is_some()
    }

    fn advance(&self, session: u64, records: usize) {
        self.lock().advance_by(session, records);
        self.room.notify_one();
    }

    fn end(&self, end: End) {
        self.lock().end(end);
        self.fresh.notify_all();
    }
}

/// A subscriber's place in a stream: it holds the window's records from its position on,
/// and leaves the stream when dropped (however its session ends, or if it never connects).
pub(crate) struct Subscription {
    stream: Arc<SharedStream>,
    session: u64,
    from: Pos,
    /// A shared ring's writer: not a consumer, so its leaving is not an event.
    silent: bool,
}

impl Subscription {
    pub fn stream(&self) -> &Arc<SharedStream> {
        &self.stream
    }

    /// Where this subscriber starts.
    pub fn from(&self) -> Pos {
        self.from
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let s = &self.stream;
        let mut w = s.lock();
        match w.leave(self.session) {
            Some(at) if !self.silent => s.publish(self.session, false, at, w.subscribers()),
            _ => {}
        }
        drop(w);
        s.room.notify_one();
    }
}

/// The agent's shared streams, by tenant and name. A stream lives while its producer runs or
/// anyone subscribes; then its name is free again.
#[derive(Default)]
pub(crate) struct Shares {
    streams: Mutex<HashMap<(String, String), Weak<SharedStream>>>,
}

/// What the producer thread of a new stream needs.
pub(crate) struct NewStream {
    pub name: String,
    pub tenant: String,
    pub info: StreamInfo,
    pub pipeline: Box<Pipeline>,
    pub output: OutputDType,
    pub wire: WireCodec,
    /// Records the window keeps.
    pub capacity: usize,
    /// Subscribers the first batch waits for, at most `group_wait`.
    pub group: usize,
    pub group_wait: Duration,
    /// Bytes the producer may encode ahead (the session prefetch budget).
    pub encode_budget: usize,
    pub meter: Meter,
    /// Faults tests inject (debug builds only).
    pub faults: crate::faults::Faults,
}

impl Shares {
    fn streams(&self) -> MutexGuard<'_, HashMap<(String, String), Weak<SharedStream>>> {
        self.streams.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The live stream `name` of `tenant`.
    pub fn find(&self, tenant: &str, name: &str) -> Option<Arc<SharedStream>> {
        let mut streams = self.streams();
        streams.retain(|_, s| s.strong_count() > 0);
        streams
            .get(&(tenant.to_string(), name.to_string()))
            .and_then(Weak::upgrade)
    }

    /// Starts `new` as a stream (taking it) and joins `session` to it at its start, unless
    /// its tenant already has a live stream of that name: then `session` joins that one at
    /// `at`, and `new` is left for the caller to drop outside its locks (dropping a pipeline
    /// may close upstream sessions). `Err` when the existing stream runs another plan or
    /// `at` is not in its window. The bool says whether it joined an existing one.
    pub fn open_or_join(
        &self,
        new: &mut Option<NewStream>,
        session: u64,
        at: Pos,
        events: &Arc<Events>,
        drain: Arc<AtomicBool>,
    ) -> Result<(Subscription, bool), ShareError> {
        let Some(n) = new.as_ref() else {
            return Err(ShareError::OpenedTwice);
        };
        let key = (n.tenant.clone(), n.name.clone());
        let mut streams = self.streams();
        if let Some(s) = streams.get(&key).and_then(Weak::upgrade) {
            let name = &n.name;
            if s.info.reply.plan_json != n.info.reply.plan_json {
                return Err(ShareError::DifferentPlan(name.clone()));
            }
            let sub = s
                .join(session, Some(at))
                .map_err(|source| ShareError::JoinRefused {
                    name: name.clone(),
                    source,
                })?;
            return Ok((sub, true));
        }
        let Some(new) = new.take() else {
            return Err(ShareError::OpenedTwice);
        };
        let stream = Arc::new(SharedStream {
            name: new.name.clone(),
            tenant: new.tenant.clone(),
            info: new.info.clone(),
            output: new.output,
            window: Mutex::new(Window::new(new.capacity, at)),
            fresh: Condvar::new(),
            spares: Arc::default(),
            room: Condvar::new(),
            events: events.clone(),
            broadcast: Mutex::default(),
        });
        let sub = stream
            .join(session, None)
            .map_err(|source| ShareError::JoinRefused {
                name: new.name.clone(),
                source,
            })?;
        let producer = stream.clone();
        std::thread::Builder::new()
            .name("dquant-share".into())
            .spawn(move || produce::produce(producer, new, &drain))
            .map_err(|e| ShareError::Thread(e.to_string()))?;
        streams.insert(key, Arc::downgrade(&stream));
        Ok((sub, false))
    }
}

/// How a stream's producer (or a shared ring's writer) ended, as its subscribers see it.
impl From<Outcome> for End {
    fn from(outcome: Outcome) -> Self {
        match outcome {
            Outcome::Finished => End::Finished,
            Outcome::Failed(m) => End::Failed(m),
            Outcome::Drained(m) => End::Drained(m),
            Outcome::Stopped(m) => End::Stopped(m),
        }
    }
}

/// A stream's end as a subscriber's own outcome.
impl From<End> for Outcome {
    fn from(end: End) -> Self {
        match end {
            End::Finished => Outcome::Finished,
            End::Failed(m) => Outcome::Failed(m),
            End::Drained(m) => Outcome::Drained(m),
            End::Stopped(m) => Outcome::Stopped(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dquant_codec::{Codec, Compression, Width};

    fn record(codec: Codec, tokens: &[u32], trailer: &[u8]) -> Vec<u8> {
        let mut data = vec![0u8; codec.raw_len(tokens.len())];
        dquant_codec::encode_width(codec.width, tokens, &mut data).unwrap();
        let h = BatchHeader {
            codec,
            index: 3,
            samples: 2,
            sample_len: (tokens.len() / 2) as u32,
            payload_len: (data.len() + trailer.len()) as u32,
            trailer_len: trailer.len() as u32,
            cursor_epoch: 0,
            cursor_consumed: 8,
        };
        [&h.encode()[..], &data, trailer].concat()
    }

    #[test]
    fn a_narrowed_record_becomes_the_output_dtype_with_its_trailer() {
        let tokens = [1u32, 70000, 3, 4, 5, 6];
        let trailer = 42u64.to_le_bytes();
        let bits = Codec {
            width: Width::Bits(17),
            compression: Compression::None,
        };
        let plain = plain_record(&record(bits, &tokens, &trailer), OutputDType::I32).unwrap();
        let want = record(plain_codec(OutputDType::I32), &tokens, &trailer);
        assert_eq!(plain, Some(want.clone()));
        // Already plain: the wire record itself.
        assert_eq!(plain_record(&want, OutputDType::I32), Ok(None));
    }

    #[test]
    fn share_names_are_checked() {
        assert!(check_name("job42/dp3").is_ok());
        assert_eq!(
            check_name("job 42").unwrap_err().to_string(),
            "share: \"job 42\" is not a share name (1 to 256 printable ASCII characters \
             without spaces, e.g. \"job42/dp3\")"
        );
        assert!(check_name("").is_err());
        assert!(check_name(&"x".repeat(257)).is_err());
    }
}
