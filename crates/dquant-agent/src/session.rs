//! Sessions: a plan (or one dataset) opened on the control plane, then streamed over one data
//! connection.
//!
//! A session is *pending* from `Open` until its data connection presents the ticket, then
//! *active* until the stream ends, the client disconnects or `Close` cancels it. Everything a
//! session holds (its sources, its frame pool, its threads) belongs to it alone and is freed
//! when it ends, however it ends; a failing session never touches another.

use std::collections::HashMap;
use std::net::TcpStream;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use dquant_codec::{encode_width, Width};
use dquant_engine::record::{Encoders, Payload, Record};
use dquant_engine::{
    batch_header, codec_for, plain_codec, EngineError, Pipeline, RecordEncoder, TokenSource,
};
use dquant_plan::{OutputDType, WireCodec};
use dquant_transport::frame::MAX_PAYLOAD;
use dquant_transport::record::{parse_request, RECORD_HEADER_LEN};
use dquant_transport::ring::{RingError, RingProducer};
use dquant_transport::{BufferPool, FrameKind, FrameReader, FrameWriter, PooledBuf, RangeHeader};

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
    pub fn add(&self, work: Work) -> Result<(u64, [u8; 16]), String> {
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
            return Err(format!(
                "agent is at its limit of {} sessions; close finished readers or raise max_sessions",
                self.max
            ));
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

/// What one session moved, for the log line at its end.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub records: u64,
    pub tokens: u64,
    pub wire_bytes: u64,
}

enum Msg {
    Frame(PooledBuf),
    End,
    Error(String),
}

/// Packs record bytes into full 1 MiB frames from a fixed pool. A frame goes out when it is
/// full or on `flush`; buffers come back to the pool once sent, so a consumer that stops
/// reading stalls `write` (back-pressure) instead of growing memory.
struct FrameSink<'a> {
    pool: &'a BufferPool,
    out: SinkOut<'a>,
    cur: Option<PooledBuf>,
    /// When the first record went into `cur` (for the idle flush's age limit).
    frame_started: Option<Instant>,
    bytes: u64,
}

/// An idle sender gets a partly filled frame once it holds this much.
const MIN_IDLE_FLUSH: usize = 256 << 10;
/// ... or once its first record has waited this long.
const MAX_FRAME_AGE: Duration = Duration::from_millis(2);

enum SinkError {
    Gone(Gone),
    Codec(dquant_codec::CodecError),
}

enum SinkOut<'a> {
    /// To the sender thread (plan sessions: the producer runs ahead by the pool's size). The
    /// counter holds the frames queued and not yet written to the socket.
    Channel(SyncSender<Msg>, Arc<AtomicUsize>),
    /// Straight to the socket (source sessions answer one request at a time).
    Direct(&'a mut FrameWriter<TcpStream>),
}

/// The consumer went away; stop producing.
struct Gone;

impl FrameSink<'_> {
    fn emit(&mut self, buf: PooledBuf) -> Result<(), Gone> {
        self.bytes += buf.len() as u64;
        self.frame_started = None;
        match &mut self.out {
            SinkOut::Channel(tx, queued) => {
                queued.fetch_add(1, Ordering::AcqRel);
                tx.send(Msg::Frame(buf)).map_err(|_| Gone)
            }
            SinkOut::Direct(w) => w.send(FrameKind::Data, &buf).map_err(|_| Gone),
        }
    }

    /// Encodes `tokens` at the byte-aligned `width` directly into frames: no intermediate
    /// buffer, one pass over the tokens.
    fn write_encoded(&mut self, width: Width, mut tokens: &[u32]) -> Result<(), SinkError> {
        let bw = width
            .byte_width()
            .expect("write_encoded takes byte-aligned widths");
        while !tokens.is_empty() {
            let cur = self.cur.get_or_insert_with(|| self.pool.get());
            let len = cur.len();
            let k = ((cur.capacity() - len) / bw).min(tokens.len());
            if k == 0 {
                // A token straddles two frames: encode it aside and split its bytes.
                let mut one = [0u8; 8];
                encode_width(width, &tokens[..1], &mut one[..bw]).map_err(SinkError::Codec)?;
                self.write(&one[..bw]).map_err(SinkError::Gone)?;
                tokens = &tokens[1..];
                continue;
            }
            encode_width(width, &tokens[..k], &mut cur.spare()[len..len + k * bw])
                .map_err(SinkError::Codec)?;
            cur.set_len(len + k * bw);
            tokens = &tokens[k..];
            if cur.len() == cur.capacity() {
                let full = self.cur.take().expect("just filled");
                self.emit(full).map_err(SinkError::Gone)?;
            }
        }
        Ok(())
    }

    fn write(&mut self, mut b: &[u8]) -> Result<(), Gone> {
        while !b.is_empty() {
            let cur = self.cur.get_or_insert_with(|| self.pool.get());
            let len = cur.len();
            let k = (cur.capacity() - len).min(b.len());
            cur.spare()[len..len + k].copy_from_slice(&b[..k]);
            cur.set_len(len + k);
            b = &b[k..];
            if cur.len() == cur.capacity() {
                let full = self.cur.take().expect("just filled");
                self.emit(full)?;
            }
        }
        Ok(())
    }

    /// Sends the partly filled frame if the sender has nothing queued: a consumer that
    /// keeps up gets each record as soon as it is made, instead of waiting for a full frame
    /// (with small compressed batches that could be dozens of batches). A consumer that lags
    /// gets full frames.
    ///
    /// Small writes cost the sender far more CPU per byte than 1 MiB ones, so an idle flush
    /// sends at least [`MIN_IDLE_FLUSH`] bytes, except for the stream's first frame (time to
    /// first batch) and a frame that has waited [`MAX_FRAME_AGE`].
    fn flush_if_idle(&mut self) -> Result<(), Gone> {
        let SinkOut::Channel(_, queued) = &self.out else {
            return Ok(());
        };
        if queued.load(Ordering::Acquire) != 0 {
            return Ok(());
        }
        let len = self.cur.as_ref().map_or(0, |c| c.len());
        let now = Instant::now();
        let started = *self.frame_started.get_or_insert(now);
        if len >= MIN_IDLE_FLUSH || self.bytes == 0 || now.duration_since(started) >= MAX_FRAME_AGE
        {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), Gone> {
        self.frame_started = None;
        match self.cur.take() {
            Some(b) if !b.is_empty() => self.emit(b),
            _ => Ok(()),
        }
    }
}

/// Streams a plan's batches over `conn` until the end, an error, a disconnect or `cancel`.
pub(crate) fn stream_plan(
    work: Work,
    conn: TcpStream,
    prefetch: usize,
    cancel: Arc<AtomicBool>,
) -> Result<Stats, String> {
    let Work::Plan {
        mut pipeline,
        output,
        wire,
    } = work
    else {
        unreachable!("stream_plan gets plan work");
    };
    let pool = BufferPool::new(prefetch, MAX_PAYLOAD);
    let (tx, rx) = sync_channel::<Msg>(prefetch + 2);
    let queued = Arc::new(AtomicUsize::new(0));
    let sender_queued = queued.clone();
    let producer_cancel = cancel.clone();
    let producer = std::thread::Builder::new()
        .name("dquant-produce".into())
        .spawn(move || {
            let mut sink = FrameSink {
                pool: &pool,
                out: SinkOut::Channel(tx.clone(), queued),
                cur: None,
                frame_started: None,
                bytes: 0,
            };
            let mut stats = Stats::default();
            let r = produce(
                &mut pipeline,
                output,
                wire,
                &mut sink,
                &mut stats,
                &producer_cancel,
            );
            match r {
                Ok(true) => {
                    if sink.flush().is_ok() {
                        let _ = tx.send(Msg::End);
                    }
                }
                Ok(false) => {}
                Err(m) => {
                    // Batches before the failure are delivered; then the error, verbatim.
                    let _ = sink.flush();
                    let _ = tx.send(Msg::Error(m));
                }
            }
            stats.wire_bytes = sink.bytes;
            stats
        })
        .map_err(|e| format!("cannot start a producer thread: {e}"))?;
    let sent = send_frames(conn, rx, &sender_queued, &cancel);
    let stats = producer
        .join()
        .map_err(|_| "the producer thread panicked".to_string())?;
    sent.map(|_| stats)
}

/// Produces batch records; Ok(true) at the end of the stream, Ok(false) when the consumer
/// went away or the session was cancelled.
fn produce(
    pipeline: &mut Pipeline,
    output: OutputDType,
    wire: WireCodec,
    sink: &mut FrameSink<'_>,
    stats: &mut Stats,
    cancel: &AtomicBool,
) -> Result<bool, String> {
    let sample_len = pipeline.sample_len();
    let out_width = output.width();
    if wire == WireCodec::Fixed(plain_codec(output)) {
        return produce_plain(pipeline, output, sink, stats, cancel);
    }
    // Checks that cannot fail are skipped: a u16 dataset always fits a u16 wire and output.
    let mut enc = RecordEncoder::new(wire, pipeline.max_token_bound());
    loop {
        if cancel.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let Some(b) = pipeline
            .next_batch_checked(out_width)
            .map_err(|e| e.to_string())?
        else {
            return Ok(true);
        };
        let Record { header, payload } = enc.encode(&b, sample_len).map_err(|e| e.to_string())?;
        stats.records += 1;
        stats.tokens += b.tokens.len() as u64;
        if sink.write(&header.encode()).is_err() {
            return Ok(false);
        }
        let sent = match payload {
            Payload::Plain { width, tokens } => sink.write_encoded(width, tokens),
            Payload::Bytes(p) => sink.write(p).map_err(SinkError::Gone),
        };
        match sent {
            Ok(()) => {}
            Err(SinkError::Gone(Gone)) => return Ok(false),
            Err(SinkError::Codec(source)) => {
                let e = EngineError::Encode {
                    index: b.index,
                    source,
                };
                return Err(e.to_string());
            }
        }
        if sink.flush_if_idle().is_err() {
            return Ok(false);
        }
    }
}

/// [`produce`] for a wire codec that is the output dtype itself: each batch comes from
/// [`Pipeline::next_batch_into`] in its final form (from a dataset that stores that dtype,
/// read straight from the page cache with no conversion), and its bytes go into frames as
/// they are.
fn produce_plain(
    pipeline: &mut Pipeline,
    output: OutputDType,
    sink: &mut FrameSink<'_>,
    stats: &mut Stats,
    cancel: &AtomicBool,
) -> Result<bool, String> {
    let sample_len = pipeline.sample_len();
    let width = output.width();
    let codec = plain_codec(output);
    let full = pipeline.schedule().batch_tokens() as usize * output.itemsize();
    let mut batch = vec![0u8; full];
    loop {
        if cancel.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let Some(b) = pipeline
            .next_batch_into(width, &mut batch)
            .map_err(|e| e.to_string())?
        else {
            return Ok(true);
        };
        let payload_len = b.samples * sample_len * output.itemsize();
        let h = batch_header(codec, &b, sample_len, payload_len).map_err(|e| e.to_string())?;
        stats.records += 1;
        stats.tokens += (b.samples * sample_len) as u64;
        if sink.write(&h.encode()).is_err()
            || sink.write(&batch[..payload_len]).is_err()
            || sink.flush_if_idle().is_err()
        {
            return Ok(false);
        }
    }
}

/// The sender half of a plan session: frames from the producer to the socket.
fn send_frames(
    conn: TcpStream,
    rx: Receiver<Msg>,
    queued: &AtomicUsize,
    cancel: &AtomicBool,
) -> Result<(), String> {
    let mut w = FrameWriter::new(conn);
    for msg in rx.iter() {
        if cancel.load(Ordering::Relaxed) {
            return Err("closed by the client".into());
        }
        let r = match msg {
            Msg::Frame(buf) => {
                let r = w.send(FrameKind::Data, &buf);
                queued.fetch_sub(1, Ordering::AcqRel);
                r
            }
            Msg::End => return w.finish(&[]).map_err(|e| e.to_string()),
            Msg::Error(m) => {
                let _ = w.fail(&m);
                return Err(m);
            }
        };
        if let Err(e) = r {
            // Dropping `rx` hands the queued buffers back and stops the producer.
            return Err(format!("client went away: {e}"));
        }
    }
    Err("producer stopped".into())
}

/// How often a producer waiting for a free slot checks whether its session was cancelled.
const RING_POLL: Duration = Duration::from_millis(250);

/// Streams a plan's batches into the client's shared-memory ring until the end, an error, a
/// consumer that goes away, or `cancel`.
///
/// Each slot gets one batch record: the 48-byte [`BatchHeader`] then the tokens already in
/// the plan's output dtype, so the consumer reads them in place and parses nothing else (the
/// wire codec is for links; memory is not one). Errors go to the client as an error frame on
/// `sock` *before* the ring is marked aborted, so the consumer finds the message when it sees
/// the abort, after the last complete batch.
pub(crate) fn stream_ring(
    work: Work,
    mut ring: RingProducer,
    sock: &UnixStream,
    cancel: Arc<AtomicBool>,
) -> Result<Stats, String> {
    let fail = |m: String| {
        if let Ok(s) = sock.try_clone() {
            let _ = FrameWriter::new(s).fail(&m);
        }
        Err(m)
    };
    let Work::Plan {
        mut pipeline,
        output,
        ..
    } = work
    else {
        return fail(
            "shared-memory rings carry plan batches; open a source over the data port".into(),
        );
    };
    let out_width = output.width();
    let codec = plain_codec(output);
    let sample_len = pipeline.sample_len();
    let slot_size = ring.layout().slot_size;
    let full =
        RECORD_HEADER_LEN as u64 + pipeline.schedule().batch_tokens() * output.itemsize() as u64;
    if full > slot_size {
        return fail(format!(
            "the ring's slots hold {slot_size} bytes; this plan's batches need {full} ({output})"
        ));
    }
    let mut stats = Stats::default();
    loop {
        if cancel.load(Ordering::Relaxed) {
            return Ok(stats);
        }
        // A free slot first, then the batch straight into it: from a dataset that stores the
        // output dtype, that is one read from the page cache into the consumer's memory.
        let mut slot = match ring.reserve_timeout(RING_POLL) {
            Ok(slot) => slot,
            Err(RingError::Timeout(_)) => continue,
            Err(RingError::ConsumerGone) => return Err("client went away".into()),
            Err(e) => return fail(e.to_string()),
        };
        let (head, body) = slot.split_at_mut(RECORD_HEADER_LEN);
        let b = match pipeline
            .next_batch_into(out_width, &mut body[..full as usize - RECORD_HEADER_LEN])
        {
            Ok(Some(b)) => b,
            Ok(None) => {
                // The reserved slot is simply never committed.
                ring.close();
                return Ok(stats);
            }
            // Dropping `ring` (on return) marks it aborted, after the message is on the socket.
            Err(e) => return fail(e.to_string()),
        };
        let tokens = b.samples * sample_len;
        let payload_len = out_width.encoded_len(tokens);
        let h = match batch_header(codec, &b, sample_len, payload_len) {
            Ok(h) => h,
            Err(e) => return fail(e.to_string()),
        };
        head.copy_from_slice(&h.encode());
        let len = RECORD_HEADER_LEN + payload_len;
        slot.commit(len).map_err(|e| e.to_string())?;
        stats.records += 1;
        stats.tokens += tokens as u64;
        stats.wire_bytes += len as u64;
    }
}

/// Sends the error frame, then half-closes and reads what the client still sends until it
/// hangs up (at most 2 s). A client that reads ahead has requests in flight when an error
/// stops us; closing with them unread would make the kernel reset the connection, and a
/// reset can overtake the error frame, so the client would see a truncated stream instead of
/// the message.
fn fail_and_linger(w: &mut FrameWriter<TcpStream>, message: &str) {
    use std::io::{ErrorKind, Read};
    if w.fail(message).is_err() {
        return;
    }
    let s = w.get_ref();
    if s.shutdown(std::net::Shutdown::Write).is_err() {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let mut sink = [0u8; 16 << 10];
    while Instant::now() < deadline {
        match (&*s).read(&mut sink) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::Interrupted | ErrorKind::WouldBlock | ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
}

pub use dquant_transport::record::MAX_RANGE_TOKENS;

/// Serves range requests for one dataset until the client hangs up.
pub(crate) fn serve_ranges(
    work: Work,
    conn: TcpStream,
    frames: &mut FrameReader<TcpStream>,
    cancel: Arc<AtomicBool>,
) -> Result<Stats, String> {
    let Work::Source {
        mut source,
        name,
        wire,
    } = work
    else {
        unreachable!("serve_ranges gets source work");
    };
    let pool = BufferPool::new(2, MAX_PAYLOAD);
    let mut req = pool.get();
    let mut w = FrameWriter::new(conn);
    let mut enc = Encoders::default();
    let mut ranges = Vec::new();
    let mut tokens = Vec::new();
    let mut payload = Vec::new();
    let mut stats = Stats::default();
    let total = source.tokens();
    loop {
        if cancel.load(Ordering::Relaxed) {
            return Ok(stats);
        }
        match frames.next_into(&mut req) {
            Ok(true) => {}
            Ok(false) => return Ok(stats),
            Err(dquant_transport::WireError::Truncated { .. }) => return Ok(stats),
            Err(e) => {
                fail_and_linger(&mut w, &e.to_string());
                return Err(e.to_string());
            }
        }
        let fail = |w: &mut FrameWriter<TcpStream>, m: String| {
            fail_and_linger(w, &m);
            Err(m)
        };
        if let Err(e) = parse_request(&req, &mut ranges) {
            return fail(&mut w, e.to_string());
        }
        let mut sink = FrameSink {
            pool: &pool,
            out: SinkOut::Direct(&mut w),
            cur: None,
            frame_started: None,
            bytes: 0,
        };
        let mut error = None;
        for &(start, len) in &ranges {
            if len > MAX_RANGE_TOKENS {
                error = Some(format!(
                    "{name}: token range {start}+{len} is longer than the {MAX_RANGE_TOKENS}-token limit of one request"
                ));
                break;
            }
            let end = start.checked_add(len).filter(|&e| e <= total);
            let Some(end) = end else {
                error = Some(format!(
                    "{name}: token range {start}+{len} is outside the dataset's {total} tokens"
                ));
                break;
            };
            tokens.resize(len as usize, 0);
            if let Err(e) = source.read_ranges(std::slice::from_ref(&(start..end)), &mut tokens) {
                error = Some(format!("{name}: {e}"));
                break;
            }
            let codec = codec_for(wire, &tokens);
            if let Err(e) = enc.encode(codec, &tokens, &mut payload) {
                error = Some(format!("{name}: {}", e.at_base(start)));
                break;
            }
            let h = RangeHeader {
                codec,
                start,
                len,
                payload_len: payload.len() as u32,
            };
            let mut hb = [0u8; RECORD_HEADER_LEN];
            hb.copy_from_slice(&h.encode());
            if sink.write(&hb).is_err() || sink.write(&payload).is_err() {
                return Ok(stats);
            }
            stats.records += 1;
            stats.tokens += len;
        }
        if sink.flush().is_err() {
            return Ok(stats);
        }
        stats.wire_bytes += sink.bytes;
        if let Some(m) = error {
            return fail(&mut w, m);
        }
        if w.flush().is_err() {
            return Ok(stats);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records encoded straight into frames equal the plain encoding, whatever the frame
    /// size, including tokens split across two frames.
    #[test]
    fn direct_encoding_splits_tokens_across_frames_exactly() {
        let tokens: Vec<u32> = (0..1000u32).map(|i| i * 16_411 % (1 << 24)).collect();
        for width in [Width::U8, Width::U16, Width::U24, Width::U32, Width::I64] {
            let tokens: Vec<u32> = tokens.iter().map(|&t| t.min(width.max_token())).collect();
            let mut want = vec![0u8; width.encoded_len(tokens.len())];
            encode_width(width, &tokens, &mut want).unwrap();
            for frame in [7usize, 10, 64, 4096] {
                let pool = BufferPool::new(4, frame);
                let (tx, rx) = sync_channel(10_000);
                let queued = Arc::new(AtomicUsize::new(0));
                let mut sink = FrameSink {
                    pool: &pool,
                    out: SinkOut::Channel(tx, queued),
                    cur: None,
                    frame_started: None,
                    bytes: 0,
                };
                let collect = std::thread::spawn(move || {
                    let mut got = Vec::new();
                    for m in rx {
                        if let Msg::Frame(b) = m {
                            got.extend_from_slice(&b);
                        }
                    }
                    got
                });
                sink.write(b"hdr").ok().unwrap();
                assert!(sink.write_encoded(width, &tokens).is_ok());
                sink.flush().ok().unwrap();
                drop(sink);
                let got = collect.join().unwrap();
                assert_eq!(&got[..3], b"hdr");
                assert_eq!(got[3..], want[..], "{width} in {frame}-byte frames");
            }
        }
    }
}
