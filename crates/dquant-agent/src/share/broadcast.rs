//! A shared stream's ring for its subscribers on this host: the stream's producer writes
//! each record into it once, however many subscribers read it.
//!
//! Without it, each shared-memory subscriber's connection thread copies every record into
//! that subscriber's own ring ([`super::RingOutlet`]): a tensor-parallel group of 8 on one
//! host costs the agent 8 copies (and 8 checksums) of every batch. With it, the first
//! shared-memory subscriber of a stream starts a [`Broadcast`]: a ring the agent creates
//! ([`RingProducer::create`]) with a reader block per subscriber, and its [`Writer`], which
//! the stream's producer thread takes at its next record. From then on the producer writes
//! the ring itself: a record in the ring's form (the output dtype, which the plan's wire
//! codec is when no codec was asked for) is made straight into the ring's next slot, and the
//! stream's window keeps a copy of it only for subscribers that do not read the ring (TCP,
//! or a ring of their own); records in a wire codec are made for the window and put into the
//! ring in the output dtype, once. The writer holds records like a subscriber of the window
//! but is not counted as one. Each subscriber gets a reader block starting at its own window
//! position, as the agent's answer to the ring it offered ([`Answer`]), and every member's
//! window position moves along as the ring is written, so the window's pacing, the group
//! wait and the subscriber events stay those of any subscriber.
//!
//! Why the producer and not a thread of the ring's own: that thread copied each record from
//! the window into the ring and took a hand-off from the producer and one back for each, about
//! a third of what a stream of 8 ring readers cost the agent beyond a lone stream's
//! (`bench/RESULTS.md`, fanout and profile). Made in the ring, a record is written once.
//!
//! Who waits for whom: the producer waits for the ring's slowest reader (the ring's rule),
//! and the ring keeps the slots that the stream's other subscribers still need
//! ([`RingProducer::set_floor`]), so that members of a group who connect a little later still
//! find their first batch in the ring. A subscriber that cannot join (its position is no
//! longer in the ring, every reader block was handed out, or it asks for checksums this ring
//! does not carry) is answered [`Answer::Own`] and relayed into its own ring from the window;
//! a batch that went only into the shared ring (nobody outside it when it was made) is not in
//! the window for it, and it is told so ([`super::relay`]).
//!
//! Joins and leaves reach the writer through a mailbox the producer empties before each
//! record and while it waits (for room in the ring or the window, or for its group), so no
//! lock is held while it waits. A subscriber whose position the ring has not reached yet
//! waits in the mailbox until the ring gets there. A reader that stops reading holds up its
//! group, as the slowest subscriber always does: ending it to free the others would overwrite
//! batches it may still be reading in place.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use dquant_transport::ring::layout::MAX_READERS;
use dquant_transport::ring::{Answer, RingError, RingFds, RingProducer};
use dquant_transport::shm::RingSink;
use dquant_transport::{FrameWriter, SinkError};
use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};

use super::relay::{relay, RingOutlet};
use super::{End, Next, Pos, SharedStream, StreamInfo, Subscription};
use crate::metrics::Meter;
use crate::produce::{Stats, TooLarge};
use crate::stream_end::ended;
use crate::stream_error::StreamError;

/// How long the producer waits for the ring's readers (or for room in the window, while a
/// ring is written) before it looks at the mailbox again.
pub(super) const STEP: Duration = Duration::from_millis(5);
/// How long a subscriber waits for the producer to take it in.
const JOIN_WAIT: Duration = Duration::from_secs(10);
/// How often a member's connection thread looks at its session's flags.
const WATCH: Duration = Duration::from_millis(250);

/// A stream's shared ring, while it has one, and whether it may have another.
#[derive(Default)]
pub(crate) struct SharedRing {
    current: Weak<Broadcast>,
    /// The stream's producer is done: no ring starts any more.
    closed: bool,
}

/// A stream's shared ring: the writer's mailbox and how it ended.
pub(crate) struct Broadcast {
    mail: Mutex<Mail>,
    /// Written once the writer is done: wakes every member's connection thread.
    ended: OwnedFd,
    /// Set just before the ring ends (closed or aborted), before the end is known here.
    ending: AtomicBool,
    /// Whether the ring's batches carry their crc32c.
    checksums: bool,
    /// The ring's writer, from the ring's start until the stream's producer takes it.
    pending: Mutex<Option<Writer>>,
}

#[derive(Default)]
struct Mail {
    joins: Vec<Join>,
    /// Reader blocks whose subscriber went away.
    leaves: Vec<u32>,
    members: Vec<Member>,
    end: Option<End>,
    /// The message of a stream that failed (or drained), for members told their block after
    /// the writer wrote it to the others' sockets ([`Broadcast::answered`]).
    message: Option<String>,
}

/// A subscriber asking for a reader block, with where to send it.
struct Join {
    session: u64,
    sock: UnixStream,
    reply: SyncSender<(u32, RingFds)>,
}

/// A subscriber reading the ring.
struct Member {
    session: u64,
    reader: u32,
    /// Its Unix socket, where a stream's error goes before the ring is marked aborted.
    sock: UnixStream,
    /// Its connection thread has sent it its block ([`Answer::Reader`]): only then may the
    /// writer put a message on its socket, after the answer, never before it.
    answered: bool,
    stats: Stats,
}

impl Broadcast {
    fn mail(&self) -> MutexGuard<'_, Mail> {
        self.mail.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn end(&self) -> Option<End> {
        self.mail().end.clone()
    }

    /// Queues `join` for the writer; `false` when the writer is done.
    fn ask(&self, join: Join) -> bool {
        let mut m = self.mail();
        if m.end.is_some() {
            return false;
        }
        m.joins.push(join);
        true
    }

    /// What member `reader` has been delivered so far.
    fn stats(&self, reader: u32) -> Stats {
        let m = self.mail();
        m.members
            .iter()
            .find(|x| x.reader == reader)
            .map_or_else(Stats::default, |x| x.stats)
    }

    /// Member `reader` leaves (or its stream ended): what it was delivered. The writer ends
    /// its block.
    fn leave(&self, reader: u32) -> Stats {
        let mut m = self.mail();
        m.leaves.push(reader);
        match m.members.iter().position(|x| x.reader == reader) {
            Some(i) => m.members.swap_remove(i).stats,
            None => Stats::default(),
        }
    }

    /// Waits for the writer's answer to the join of `session` on `rx`: a reader block, or
    /// `None` when it was refused, the writer ended, or it did not come within
    /// [`JOIN_WAIT`] (the join is then withdrawn, under the lock the writer answers under,
    /// so it is answered or withdrawn, never both).
    fn answer(&self, session: u64, rx: Receiver<(u32, RingFds)>) -> Option<(u32, RingFds)> {
        match rx.recv_timeout(JOIN_WAIT) {
            Ok(block) => Some(block),
            Err(RecvTimeoutError::Disconnected) => None,
            Err(RecvTimeoutError::Timeout) => {
                let mut m = self.mail();
                match m.joins.iter().position(|j| j.session == session) {
                    Some(i) => {
                        m.joins.swap_remove(i);
                        None
                    }
                    None => rx.try_recv().ok(),
                }
            }
        }
    }

    /// Member `reader` has been sent its block: the writer may write to its socket from now
    /// on. A message the writer already wrote to the other members' sockets is returned, for
    /// the caller to write to this one's (after the answer, as the others got it).
    fn answered(&self, reader: u32) -> Option<String> {
        let mut m = self.mail();
        if let Some(x) = m.members.iter_mut().find(|x| x.reader == reader) {
            x.answered = true;
        }
        m.message.clone()
    }

    /// The writer is done: pending joins are refused (their senders dropped) and members
    /// are woken.
    fn finish(&self, end: End) {
        let mut m = self.mail();
        m.end.get_or_insert(end);
        m.joins.clear();
        drop(m);
        let _ = rustix::io::write(&self.ended, &1u64.to_ne_bytes());
    }
}

/// Serves shared-stream subscriber `sub` over shared memory: from a reader block of the
/// stream's shared ring when it can join one, else into `own`, the ring it offered. Either
/// way the subscriber is told which first, on `conn`.
pub(crate) fn serve_subscriber(
    sub: Subscription,
    mut own: RingSink,
    conn: &UnixStream,
    cancel: &AtomicBool,
    meter: &Meter,
) -> Result<Stats, StreamError> {
    let Some((b, reader, fds)) = join(&sub, &own, conn) else {
        Answer::Own
            .send(conn)
            .map_err(|e| StreamError::Stopped(e.to_string()))?;
        let mut out = RingOutlet { sink: &mut own };
        let (outcome, stats) = relay(&sub, &mut out, cancel, meter);
        return ended(outcome, stats);
    };
    drop(own);
    if let Err(e) = (Answer::Reader { fds, reader }).send(conn) {
        b.leave(reader);
        return Err(StreamError::Stopped(e.to_string()));
    }
    if let Some(m) = b.answered(reader) {
        // The stream failed before this subscriber was told its block: its message comes
        // now, after the answer, as it came to the others before their ring was aborted.
        let _ = FrameWriter::new(conn).fail(&m);
    }
    tracing::info!(
        session = sub.session,
        reader,
        "reads the stream's shared ring"
    );
    let mut counted = Stats::default();
    let outcome = watch(&b, conn, cancel, || {
        count(meter, &mut counted, b.stats(reader));
    });
    let stats = b.leave(reader);
    count(meter, &mut counted, stats);
    outcome.map(|()| stats)
}

/// Adds to `meter` what `now` has over `counted`.
fn count(meter: &Meter, counted: &mut Stats, now: Stats) {
    meter.add(
        now.records.saturating_sub(counted.records),
        now.tokens.saturating_sub(counted.tokens),
        now.wire_bytes.saturating_sub(counted.wire_bytes),
    );
    *counted = now;
}

/// Waits for the member on `conn` to go away, its session to be closed, or the ring's
/// writer to be done; calls `tick` every [`WATCH`].
fn watch(
    b: &Broadcast,
    conn: &UnixStream,
    cancel: &AtomicBool,
    mut tick: impl FnMut(),
) -> Result<(), StreamError> {
    let step = Timespec {
        tv_sec: 0,
        tv_nsec: WATCH.as_nanos() as _,
    };
    loop {
        if let Some(end) = b.end() {
            return ended(end.into(), ());
        }
        if cancel.load(Ordering::Relaxed) {
            return Err(StreamError::Stopped("closed by the client".into()));
        }
        tick();
        let mut fds = [
            PollFd::new(conn, PollFlags::RDHUP),
            PollFd::new(&b.ended, PollFlags::IN),
        ];
        match poll(&mut fds, Some(&step)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(StreamError::Stopped(format!("poll: {e}"))),
        }
        let hup = PollFlags::HUP | PollFlags::RDHUP | PollFlags::ERR;
        if fds[0].revents().intersects(hup) && b.end().is_none() {
            if !b.ending.load(Ordering::Acquire) {
                return Err(StreamError::Stopped("client went away".into()));
            }
            // A reader that had the whole stream goes as soon as the ring is closed, a
            // moment before the writer says how it ended.
            let mut ended = [PollFd::new(&b.ended, PollFlags::IN)];
            let grace = Timespec {
                tv_sec: 1,
                tv_nsec: 0,
            };
            let _ = poll(&mut ended, Some(&grace));
            if b.end().is_none() {
                return Err(StreamError::Stopped("client went away".into()));
            }
        }
    }
}

/// A reader block of `sub`'s stream's shared ring for `sub` (starting the ring when the
/// stream has none), or `None` when it cannot have one.
fn join(
    sub: &Subscription,
    own: &RingSink,
    conn: &UnixStream,
) -> Option<(Arc<Broadcast>, u32, RingFds)> {
    let stream = sub.stream();
    let (tx, rx) = sync_channel(1);
    let join = Join {
        session: sub.session,
        sock: conn.try_clone().ok()?,
        reply: tx,
    };
    let mut ring = stream
        .broadcast
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let b = match ring.current.upgrade().filter(|b| b.end().is_none()) {
        Some(b) if own.checksums() && !b.checksums => return None,
        Some(b) => {
            drop(ring);
            if !b.ask(join) {
                return None;
            }
            b
        }
        None if ring.closed => return None,
        None => {
            let b = start(stream, own, join)?;
            ring.current = Arc::downgrade(&b);
            drop(ring);
            b
        }
    };
    // The producer may wait (for room, or for its group): wake it to take the join (or the
    // new ring) in. Taking the window's lock first means it is either before its wait (and
    // looks at the mailbox after it, within a STEP) or already waiting (and is woken).
    drop(stream.lock());
    stream.room.notify_all();
    let (reader, fds) = b.answer(sub.session, rx)?;
    Some((b, reader, fds))
}

/// Starts the shared ring of `stream`, shaped as `own`, with `first` its first join; its
/// writer waits in it for the stream's producer.
fn start(stream: &Arc<SharedStream>, own: &RingSink, first: Join) -> Option<Arc<Broadcast>> {
    let layout = own.layout()?;
    let checksums = own.checksums();
    let producer =
        RingProducer::create(MAX_READERS, layout.slot_count, layout.slot_size, checksums)
            .map_err(|e| tracing::warn!(error = %e, "cannot create a shared ring"))
            .ok()?;
    let (sub, base) = (0..8).find_map(|_| {
        let id: u64 = rand::random();
        stream.join_silent_beside(id, first.session)
    })?;
    let ended = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).ok()?;
    let b = Arc::new(Broadcast {
        mail: Mutex::new(Mail {
            joins: vec![first],
            ..Mail::default()
        }),
        ended,
        ending: AtomicBool::new(false),
        checksums,
        pending: Mutex::new(None),
    });
    let writer = Writer {
        b: b.clone(),
        producer: Some(producer),
        sub,
        base,
        recent: std::collections::VecDeque::new(),
        written: 0,
    };
    *b.pending.lock().unwrap_or_else(PoisonError::into_inner) = Some(writer);
    Some(b)
}

/// The stream's producer is done (its stream ended as `end`): no ring starts any more, and
/// one whose writer it never took ends as the stream did.
pub(super) fn close(stream: Arc<SharedStream>, end: &End) {
    let pending = {
        let mut ring = stream
            .broadcast
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        ring.closed = true;
        ring.current.upgrade().and_then(|b| {
            b.pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
        })
    };
    drop(stream);
    if let Some(w) = pending {
        w.end(end.clone());
    }
}

/// A shared ring's writing side, on the stream's producer thread: the ring's producer, and
/// where ring batch 0 is in the window.
pub(super) struct Writer {
    b: Arc<Broadcast>,
    /// `None` once closed or failed.
    producer: Option<RingProducer>,
    /// The writer's own (silent) window subscription.
    sub: Subscription,
    /// The window index of ring batch 0.
    base: u64,
    /// Tokens and bytes of the batches the ring may still hold, oldest first.
    recent: std::collections::VecDeque<(u64, u64)>,
    /// Batches written, for the log.
    written: u64,
}

impl Writer {
    /// The writer of `stream`'s shared ring, when it has one its producer has not taken yet.
    pub(super) fn take(stream: &SharedStream) -> Option<Writer> {
        let ring = stream
            .broadcast
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let b = ring.current.upgrade()?;
        drop(ring);
        let w = b
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        w
    }

    fn producer(&mut self) -> Result<&mut RingProducer, SinkError> {
        self.producer
            .as_mut()
            .ok_or_else(|| SinkError::Gone("the shared ring has ended".into()))
    }

    /// Whether the ring's slots hold the stream's largest record in the output dtype.
    pub(super) fn fits(&self, info: &StreamInfo) -> Result<(), TooLarge> {
        let max = self
            .producer
            .as_ref()
            .map_or(0, |p| p.layout().slot_size as usize);
        if info.plain_room > max {
            return Err(TooLarge {
                max,
                room: info.plain_room,
                output: self.sub.stream().output,
            });
        }
        Ok(())
    }

    /// Takes in the joins and leaves the mailbox holds. The joins are answered under the
    /// mailbox's lock (see [`Broadcast::answer`]); one whose batch the ring has not reached
    /// yet stays there.
    pub(super) fn read_mail(&mut self) {
        let b = self.b.clone();
        let mut m = b.mail();
        let Some(p) = self.producer.as_mut() else {
            return;
        };
        for r in std::mem::take(&mut m.leaves) {
            p.end_reader(r);
        }
        for j in std::mem::take(&mut m.joins) {
            if let Some(j) = self.admit(j, &mut m.members) {
                m.joins.push(j);
            }
        }
    }

    /// Gives `j` a reader block from its window position and makes it a member, if the ring
    /// still holds that batch; returns it when the ring has not reached it yet. A refused
    /// join is dropped: its subscriber reads its own ring.
    fn admit(&mut self, j: Join, members: &mut Vec<Member>) -> Option<Join> {
        let index = self.sub.stream().index_of(j.session)?;
        let start = index.checked_sub(self.base)?;
        let p = self.producer.as_mut()?;
        let head = p.published();
        if start > head {
            return Some(j);
        }
        let (reader, fds) = match p.add_reader(start) {
            Ok(r) => r,
            Err(e) => {
                tracing::info!(session = j.session, error = %e, "not a shared ring reader");
                return None;
            }
        };
        // What the ring holds from `start` on counts as delivered to it.
        let behind = (head - start) as usize;
        let skip = self.recent.len().saturating_sub(behind);
        let (tokens, bytes) = self
            .recent
            .iter()
            .skip(skip)
            .fold((0, 0), |(t, b), &(tk, bt)| (t + tk, b + bt));
        // The subscriber waits for this answer until it withdraws its join under the lock
        // held here: it is there to receive it.
        if j.reply.send((reader, fds)).is_err() {
            p.end_reader(reader);
            return None;
        }
        self.sub
            .stream()
            .advance_each(std::iter::once(j.session), behind);
        members.push(Member {
            session: j.session,
            reader,
            sock: j.sock,
            answered: false,
            stats: Stats {
                records: behind as u64,
                tokens,
                wire_bytes: bytes,
            },
        });
        None
    }

    /// The oldest ring batch a subscriber that does not read the ring still needs.
    fn floor(&self) -> Option<u64> {
        // Lock order: the mailbox, then the window (as in `admit`).
        let m = self.b.mail();
        let writer = self.sub.session;
        let slowest = self
            .sub
            .stream()
            .slowest_except(|id| id == writer || m.members.iter().any(|x| x.session == id))?;
        slowest.checked_sub(self.base)
    }

    /// Waits for the ring's next slot to be free: the mailbox read, and the ring's floor
    /// set, every [`STEP`]. `Err` when every reader left (and nobody is joining), the ring
    /// failed, or `drain` was set (the ring is not ended for it: the stream ends so).
    pub(super) fn wait_room(&mut self, drain: &AtomicBool) -> Result<(), SinkError> {
        loop {
            self.read_mail();
            let floor = self.floor();
            let p = self.producer()?;
            p.set_floor(floor);
            match p.reserve_timeout(STEP).map(|_| ()) {
                Ok(()) => return Ok(()),
                Err(RingError::Timeout(_)) => {}
                Err(RingError::ConsumerGone) => {
                    if self.b.mail().joins.is_empty() {
                        return Err(SinkError::Gone("every reader left".into()));
                    }
                }
                Err(e) => return Err(SinkError::Failed(e.to_string())),
            }
            if drain.load(Ordering::Relaxed) {
                return Err(SinkError::Gone("the agent is shutting down".into()));
            }
        }
    }

    /// The ring's next slot, free ([`Writer::wait_room`] returned).
    pub(super) fn room(&mut self) -> Result<&mut [u8], SinkError> {
        let slot = self
            .producer()?
            .reserve_timeout(Duration::ZERO)
            .map_err(sink_error)?;
        Ok(slot.into_mut())
    }

    /// Publishes the first `len` bytes of [`Writer::room`] as the ring's next batch.
    pub(super) fn commit(&mut self, len: usize) -> Result<(), SinkError> {
        let slot = self
            .producer()?
            .reserve_timeout(Duration::ZERO)
            .map_err(sink_error)?;
        slot.commit(len).map_err(sink_error)
    }

    /// Writes `record` as the ring's next batch, waiting for room.
    fn put(&mut self, record: &[u8], drain: &AtomicBool) -> Result<(), SinkError> {
        self.wait_room(drain)?;
        self.room()?[..record.len()].copy_from_slice(record);
        self.commit(record.len())
    }

    /// Where the ring's batches end in the stream: the position after the last it has.
    pub(super) fn position(&self) -> Pos {
        self.sub.stream().position_of(self.sub.session)
    }

    /// The window sessions that have every batch the ring has: its members and the writer.
    pub(super) fn sessions(&self) -> Vec<u64> {
        let m = self.b.mail();
        let mut s: Vec<u64> = m.members.iter().map(|x| x.session).collect();
        s.push(self.sub.session);
        s
    }

    /// Every member has the batch just written, of `tokens` tokens and `bytes` bytes.
    pub(super) fn written(&mut self, tokens: u64, bytes: u64) {
        let slots = self.producer.as_ref().map_or(0, |p| p.layout().slot_count) as usize;
        if self.recent.len() >= slots {
            self.recent.pop_front();
        }
        self.recent.push_back((tokens, bytes));
        self.written += 1;
        let mut m = self.b.mail();
        for x in &mut m.members {
            x.stats.records += 1;
            x.stats.tokens += tokens;
            x.stats.wire_bytes += bytes;
        }
    }

    /// Puts the window's records the ring does not have yet into it, in the output dtype
    /// (the records made before the producer took the ring, or made for the window). `Err`
    /// as [`Writer::wait_room`], or when a record cannot go into the ring.
    pub(super) fn catch_up(&mut self, drain: &AtomicBool) -> Result<(), SinkError> {
        let stream = self.sub.stream().clone();
        let output = stream.output;
        loop {
            let Some(Next::Record(run, _)) =
                stream.next(self.sub.session, Duration::ZERO, usize::MAX)
            else {
                return Ok(());
            };
            for slot in &run {
                if slot.ring_only {
                    return Err(SinkError::Failed(
                        "a batch the ring needs went only into the stream's previous shared \
                         ring; subscribe at the stream's current cursor"
                            .into(),
                    ));
                }
                let record = slot
                    .plain(output)
                    .map_err(|e| SinkError::Failed(e.to_string()))?;
                self.put(record, drain)?;
                self.written(slot.tokens, record.len() as u64);
                stream.advance_each(self.sessions().into_iter(), 1);
            }
        }
    }

    /// The ring ends as `end` says: closed, or each member's message on its socket before
    /// the ring is marked aborted. The writer leaves the stream first: a stream whose
    /// subscribers have all left is gone, and its name free again.
    pub(super) fn end(self, end: End) {
        let Writer {
            b,
            producer,
            sub,
            written,
            ..
        } = self;
        let share = sub.stream().name.clone();
        drop(sub);
        b.ending.store(true, Ordering::Release);
        match (&end, producer) {
            (End::Finished, Some(p)) => p.close(),
            (End::Failed(m) | End::Drained(m), Some(p)) => {
                // Only to members already sent their block: a message first would be taken
                // for a refusal. The others write it themselves after their answer.
                let mut mail = b.mail();
                mail.message = Some(m.clone());
                for x in mail.members.iter().filter(|x| x.answered) {
                    let _ = FrameWriter::new(&x.sock).fail(m);
                }
                drop(mail);
                drop(p);
            }
            _ => {}
        }
        tracing::info!(%share, records = written, end = ?end, "shared ring ended");
        b.finish(end);
    }
}

fn sink_error(e: RingError) -> SinkError {
    match e {
        RingError::ConsumerGone => SinkError::Gone("every reader left".into()),
        e => SinkError::Failed(e.to_string()),
    }
}
