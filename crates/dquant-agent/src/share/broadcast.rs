//! A shared stream's ring for its subscribers on this host: one writer puts each record into
//! it once, however many subscribers read it.
//!
//! Without it, each shared-memory subscriber's connection thread copies every record into
//! that subscriber's own ring ([`super::RingOutlet`]): a tensor-parallel group of 8 on one
//! host costs the agent 8 copies (and 8 checksums) of every batch. With it, the first
//! shared-memory subscriber of a stream starts a [`Broadcast`]: a ring the agent creates
//! ([`RingProducer::create`]) with a reader block per subscriber, and a writer thread that
//! relays the stream's window into it as any subscriber's relay does ([`super::relay`]). The
//! writer is a silent subscriber of the window: it holds records like one but is not counted
//! as one. Each subscriber gets a reader block starting at its own window position, as the
//! agent's answer to the ring it offered ([`Answer`]), and the writer moves every member's
//! window position along as it writes, so the window's pacing, the group wait and the
//! subscriber events stay those of any subscriber.
//!
//! Who waits for whom: the writer waits for the slowest reader (the ring's rule), and keeps
//! the slots that the stream's other subscribers still need ([`RingProducer::set_floor`]),
//! so that members of a group who connect a little later still find their first batch in the
//! ring. A subscriber that cannot join (its position is no longer in the ring, every reader
//! block was handed out, or it asks for checksums this ring does not carry) is answered
//! [`Answer::Own`] and relayed into its own ring as before.
//!
//! The writer owns the ring's producer; joins and leaves reach it through a mailbox it
//! empties before each record and while it waits, so no lock is held while it waits. A
//! subscriber whose position the writer has not reached yet (it joined at the stream's head
//! while the ring's readers lag) waits in the mailbox until the writer gets there. A reader
//! that stops reading holds up its group, as the slowest subscriber always does: ending it to
//! free the others would overwrite batches it may still be reading in place.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use dquant_plan::OutputDType;
use dquant_transport::ring::layout::MAX_READERS;
use dquant_transport::ring::{Answer, RingError, RingFds, RingProducer};
use dquant_transport::shm::RingSink;
use dquant_transport::{FrameWriter, SinkError};
use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};

use super::relay::{each_plain, relay, Outlet, RingOutlet};
use super::{End, SharedStream, Slot, StreamInfo, Subscription};
use crate::metrics::Meter;
use crate::produce::{Stats, TooLarge};
use crate::serve_plan::ended;
use crate::stream_error::StreamError;

/// How long the writer waits for readers before it looks at its mailbox again.
const STEP: Duration = Duration::from_millis(5);
/// How long a subscriber waits for the writer to take it in.
const JOIN_WAIT: Duration = Duration::from_secs(10);
/// How often a member's connection thread looks at its session's flags.
const WATCH: Duration = Duration::from_millis(250);

/// A stream's shared ring: the writer's mailbox and how it ended.
pub(crate) struct Broadcast {
    mail: Mutex<Mail>,
    /// Written once the writer is done: wakes every member's connection thread.
    ended: OwnedFd,
    /// Set just before the ring ends (closed or aborted), before the end is known here.
    ending: AtomicBool,
    /// Set when a join or a leave is posted, cleared when the writer reads its mail: ends the
    /// writer's wait for records at once ([`Outlet::woken`]).
    posted: AtomicBool,
    /// Whether the ring's batches carry their crc32c.
    checksums: bool,
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
        self.posted.store(true, Ordering::Release);
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
        self.posted.store(true, Ordering::Release);
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
    (drain, cancel): (&Arc<AtomicBool>, &AtomicBool),
    meter: &Meter,
) -> Result<Stats, StreamError> {
    let Some((b, reader, fds)) = join(&sub, &own, conn, drain) else {
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
    drain: &Arc<AtomicBool>,
) -> Option<(Arc<Broadcast>, u32, RingFds)> {
    let stream = sub.stream();
    let (tx, rx) = sync_channel(1);
    let join = Join {
        session: sub.session,
        sock: conn.try_clone().ok()?,
        reply: tx,
    };
    let mut slot = stream
        .broadcast
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let b = match slot.upgrade().filter(|b| b.end().is_none()) {
        Some(b) if own.checksums() && !b.checksums => return None,
        Some(b) => {
            drop(slot);
            if !b.ask(join) {
                return None;
            }
            // The writer may wait for records: wake it to take the join in. Taking the
            // window's lock first means it is either before its check of `posted` (and sees
            // it) or already waiting (and is woken).
            drop(stream.lock());
            stream.fresh.notify_all();
            b
        }
        None => {
            let b = start(stream, own, join, drain)?;
            *slot = Arc::downgrade(&b);
            b
        }
    };
    let (reader, fds) = b.answer(sub.session, rx)?;
    Some((b, reader, fds))
}

/// Starts the shared ring of `stream`, shaped as `own`, with `first` its first join.
fn start(
    stream: &Arc<SharedStream>,
    own: &RingSink,
    first: Join,
    drain: &Arc<AtomicBool>,
) -> Option<Arc<Broadcast>> {
    let layout = own.layout()?;
    let checksums = own.checksums();
    let producer =
        RingProducer::create(MAX_READERS, layout.slot_count, layout.slot_size, checksums)
            .map_err(|e| tracing::warn!(error = %e, "cannot create a shared ring"))
            .ok()?;
    let (writer_sub, base) = (0..8).find_map(|_| {
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
        posted: AtomicBool::new(false),
        checksums,
    });
    let writer = Writer {
        b: b.clone(),
        producer: Some(producer),
        stream: stream.clone(),
        writer: writer_sub.session,
        base,
        drain: drain.clone(),
        recent: std::collections::VecDeque::new(),
    };
    let spawned = std::thread::Builder::new()
        .name("dquant-ring-share".into())
        .spawn(move || write(writer, writer_sub));
    spawned.ok().map(|_| b)
}

/// The writer thread: relays the window into the ring until the stream ends or no reader is
/// left.
fn write(mut w: Writer, sub: Subscription) {
    let b = w.b.clone();
    let never = AtomicBool::new(false);
    let (outcome, stats) = relay(&sub, &mut w, &never, &Meter::off());
    // The writer leaves the stream before its readers can see the end: a stream whose
    // subscribers have all left is gone, and its name free again.
    let share = sub.stream().name.clone();
    drop(sub);
    let end = End::from(outcome);
    // Then the ring ends: closed, or each member's message on its socket before the ring is
    // marked aborted.
    b.ending.store(true, Ordering::Release);
    match (&end, w.producer.take()) {
        (End::Finished, Some(p)) => p.close(),
        (End::Failed(m) | End::Drained(m), Some(p)) => {
            // Only to members already sent their block: a message first would be taken for
            // a refusal. The others write it themselves after their answer.
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
    drop(w);
    tracing::info!(%share, records = stats.records, end = ?end, "shared ring ended");
    b.finish(end);
}

/// The writer's side: the ring's producer, and where ring batch 0 is in the window.
struct Writer {
    b: Arc<Broadcast>,
    /// `None` once closed or failed.
    producer: Option<RingProducer>,
    stream: Arc<SharedStream>,
    /// The writer's own (silent) window subscription.
    writer: u64,
    /// The window index of ring batch 0.
    base: u64,
    drain: Arc<AtomicBool>,
    /// Tokens and bytes of the batches the ring may still hold, oldest first.
    recent: std::collections::VecDeque<(u64, u64)>,
}

impl Writer {
    fn producer(&mut self) -> Result<&mut RingProducer, SinkError> {
        self.producer
            .as_mut()
            .ok_or_else(|| SinkError::Gone("the shared ring has ended".into()))
    }

    /// Takes in the joins and leaves the mailbox holds. The joins are answered under the
    /// mailbox's lock (see [`Broadcast::answer`]); one whose batch the ring has not reached
    /// yet stays there.
    fn read_mail(&mut self) {
        let b = self.b.clone();
        let mut m = b.mail();
        b.posted.store(false, Ordering::Release);
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
        let index = self.stream.index_of(j.session)?;
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
        self.stream.advance_each(std::iter::once(j.session), behind);
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
        let writer = self.writer;
        let slowest = self
            .stream
            .slowest_except(|id| id == writer || m.members.iter().any(|x| x.session == id))?;
        slowest.checked_sub(self.base)
    }

    /// Writes `record` as the ring's next batch, waiting for room.
    fn put(&mut self, record: &[u8]) -> Result<(), SinkError> {
        loop {
            self.read_mail();
            let floor = self.floor();
            let p = self.producer()?;
            p.set_floor(floor);
            match p.reserve_timeout(STEP).map(|_| ()) {
                Ok(()) => break,
                Err(RingError::Timeout(_)) => {}
                Err(RingError::ConsumerGone) => {
                    if self.b.mail().joins.is_empty() {
                        return Err(SinkError::Gone("every reader left".into()));
                    }
                }
                Err(e) => return Err(SinkError::Failed(e.to_string())),
            }
            if self.drain.load(Ordering::Relaxed) {
                return Err(SinkError::Failed("the agent is shutting down".into()));
            }
        }
        let p = self.producer()?;
        let mut slot = p.reserve_timeout(Duration::ZERO).map_err(sink_error)?;
        slot[..record.len()].copy_from_slice(record);
        slot.commit(record.len()).map_err(sink_error)
    }

    /// Every member has the batch just written, of `tokens` tokens and `bytes` bytes.
    fn delivered(&mut self, tokens: u64, bytes: u64) {
        let slots = self.producer.as_ref().map_or(0, |p| p.layout().slot_count) as usize;
        if self.recent.len() >= slots {
            self.recent.pop_front();
        }
        self.recent.push_back((tokens, bytes));
        let mut m = self.b.mail();
        for x in &mut m.members {
            x.stats.records += 1;
            x.stats.tokens += tokens;
            x.stats.wire_bytes += bytes;
        }
        // Lock order: the mailbox, then the window (as in `admit`).
        self.stream
            .advance_each(m.members.iter().map(|x| x.session), 1);
    }
}

fn sink_error(e: RingError) -> SinkError {
    match e {
        RingError::ConsumerGone => SinkError::Gone("every reader left".into()),
        e => SinkError::Failed(e.to_string()),
    }
}

impl Outlet for Writer {
    fn fits(&self, info: &StreamInfo, output: OutputDType) -> Result<(), TooLarge> {
        let max = self
            .producer
            .as_ref()
            .map_or(0, |p| p.layout().slot_size as usize);
        if info.plain_room > max {
            return Err(TooLarge {
                max,
                room: info.plain_room,
                output,
            });
        }
        Ok(())
    }

    fn run_bytes(&self) -> usize {
        0
    }

    fn deliver(
        &mut self,
        slots: &[Arc<Slot>],
        output: OutputDType,
    ) -> Result<(u64, usize), SinkError> {
        each_plain(slots, output, |slot, record| {
            self.put(record)?;
            self.delivered(slot.tokens, record.len() as u64);
            Ok(())
        })
    }

    fn idle(&mut self, _: Instant) -> Result<(), SinkError> {
        self.read_mail();
        Ok(())
    }

    /// A join (or a leave) is read as soon as it is posted, not at the next recheck.
    fn woken(&self) -> Option<&AtomicBool> {
        Some(&self.b.posted)
    }

    /// The ring is closed once the writer has left the stream ([`write`]).
    fn finish(&mut self) -> Result<(), SinkError> {
        Ok(())
    }

    /// Each member finds the message on its socket, then the ring aborted after its
    /// batches, once the writer has left the stream ([`write`]).
    fn fail(&mut self, _message: &str) {}
}
