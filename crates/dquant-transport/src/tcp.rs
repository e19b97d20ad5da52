//! Batch records over a byte stream (TCP), both ends: records packed into 1 MiB checksummed
//! frames from a fixed pool and a sender thread that writes them, so the producer runs ahead
//! of the socket by the pool's size and no more ([`TcpBatchSink`]); and frames checked and
//! unpacked on the consumer's side ([`TcpBatchSource`]).
//!
//! Each piece of a frame is checksummed as it lands, on the producing thread, while it is
//! still in that core's cache; the sender thread only writes. (Summed by the sender, the
//! crc read each megabyte back from memory: 0.15 ns of the agent's 0.86 a u16 token in the
//! profile of 2026-11-28.)
//!
//! A frame goes out when it is full or when the sender is idle ([`FrameSink::flush_if_idle`]):
//! a consumer that keeps up gets each record as soon as it is made, one that lags gets full
//! frames. Buffers come back to the pool once written, so a consumer that stops reading
//! stalls the producer (back-pressure) instead of growing memory.

use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dquant_codec::{encode_width, CodecError, Width};

use crate::conn::DataStream;
use crate::error::ConnectError;
use crate::frame::payload_crc_append;
use crate::frame::MAX_PAYLOAD;
use crate::receive::{BatchSource, ReceiveError};
use crate::sink::{BatchSink, SinkError};
use crate::tls::ClientTls;
use crate::{
    BatchHeader, BufferPool, FrameKind, FrameWriter, Hello, PooledBuf, RecordReader, WireError,
};

/// An idle sender gets a partly filled frame once it holds this much.
pub const MIN_IDLE_FLUSH: usize = 256 << 10;
/// ... or once its first record has waited this long.
pub const MAX_FRAME_AGE: Duration = Duration::from_millis(2);

/// When an idle transport hands on what it holds.
///
/// Small writes cost a sender far more CPU per byte than 1 MiB ones, so an idle flush hands
/// on at least [`MIN_IDLE_FLUSH`] bytes, except for the stream's first bytes (time to first
/// batch) and bytes whose first record has waited [`MAX_FRAME_AGE`]. Time is the caller's
/// (simulated in tests).
#[derive(Debug, Default)]
pub struct IdleFlush {
    /// When the first record still held arrived.
    started: Option<Instant>,
}

impl IdleFlush {
    /// Whether an idle transport holding `held` bytes, having handed on `sent` bytes so far,
    /// hands them on at `now`.
    pub fn due(&mut self, held: usize, sent: u64, now: Instant) -> bool {
        let started = *self.started.get_or_insert(now);
        held >= MIN_IDLE_FLUSH
            || sent == 0
            || now.saturating_duration_since(started) >= MAX_FRAME_AGE
    }

    /// What was held is handed on: the next record starts a new wait.
    pub fn reset(&mut self) {
        self.started = None;
    }
}

/// What the packer hands the sender thread.
enum Msg {
    /// A frame's payload and its crc32c.
    Frame(PooledBuf, u32),
    End,
    Error(String),
}

/// The consumer went away; stop producing.
#[derive(Debug)]
pub struct Gone;

/// Why [`FrameSink::write_encoded`] stopped.
#[derive(Debug)]
pub enum EncodeError {
    Gone(Gone),
    Codec(CodecError),
}

/// Where full frames go.
enum FrameOut<'a> {
    /// To the sender thread. The counter holds the frames queued and not yet written.
    Channel(SyncSender<Msg>, Arc<AtomicUsize>),
    /// Straight to the socket (range sessions answer one request at a time).
    Direct(&'a mut FrameWriter<DataStream>),
}

/// Packs record bytes into full frames from a fixed pool.
pub struct FrameSink<'a> {
    pool: BufferPool,
    out: FrameOut<'a>,
    cur: Option<PooledBuf>,
    /// The crc32c of `cur`'s first `summed` bytes.
    crc: u32,
    summed: usize,
    idle: IdleFlush,
    bytes: u64,
}

impl<'a> FrameSink<'a> {
    /// A packer that writes each frame straight to `w` (frames of the pool's buffer size).
    pub fn direct(pool: BufferPool, w: &'a mut FrameWriter<DataStream>) -> Self {
        Self::new(pool, FrameOut::Direct(w))
    }

    fn new(pool: BufferPool, out: FrameOut<'a>) -> Self {
        FrameSink {
            pool,
            out,
            cur: None,
            crc: 0,
            summed: 0,
            idle: IdleFlush::default(),
            bytes: 0,
        }
    }

    /// Frame payload bytes handed on so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Frames handed to the sender thread and not yet written (`None` when frames go
    /// straight to the socket).
    pub fn queued(&self) -> Option<usize> {
        match &self.out {
            FrameOut::Channel(_, queued) => Some(queued.load(Ordering::Acquire)),
            FrameOut::Direct(_) => None,
        }
    }

    /// Sums the bytes the current frame gained since the last call: call it as each piece
    /// lands.
    fn sum_new_bytes(&mut self) {
        if let Some(cur) = &self.cur {
            self.crc = payload_crc_append(self.crc, &cur[self.summed..]);
            self.summed = cur.len();
        }
    }

    fn emit(&mut self, buf: PooledBuf) -> Result<(), Gone> {
        debug_assert_eq!(
            self.summed,
            buf.len(),
            "a frame went out with bytes not summed"
        );
        let crc = std::mem::take(&mut self.crc);
        self.summed = 0;
        self.bytes += buf.len() as u64;
        self.idle.reset();
        match &mut self.out {
            FrameOut::Channel(tx, queued) => {
                queued.fetch_add(1, Ordering::AcqRel);
                tx.send(Msg::Frame(buf, crc)).map_err(|_| Gone)
            }
            FrameOut::Direct(w) => w.send_checked(FrameKind::Data, &buf, crc).map_err(|_| Gone),
        }
    }

    /// Sums what the current frame gained, and emits the frame if it is full.
    fn emit_if_full(&mut self) -> Result<(), Gone> {
        self.sum_new_bytes();
        if self.cur.as_ref().is_some_and(|c| c.len() == c.capacity()) {
            if let Some(full) = self.cur.take() {
                self.emit(full)?;
            }
        }
        Ok(())
    }

    /// Encodes `tokens` at the byte-aligned `width` directly into frames: no intermediate
    /// buffer, one pass over the tokens.
    pub fn write_encoded(&mut self, width: Width, mut tokens: &[u32]) -> Result<(), EncodeError> {
        let Some(bw) = width.byte_width() else {
            return Err(EncodeError::Codec(CodecError::Corrupt {
                codec: width.to_string(),
                reason: "not byte-aligned: it cannot be encoded straight into frames".into(),
            }));
        };
        while !tokens.is_empty() {
            let cur = self.cur.get_or_insert_with(|| self.pool.get());
            let len = cur.len();
            let k = ((cur.capacity() - len) / bw).min(tokens.len());
            if k == 0 {
                // A token straddles two frames: encode it aside and split its bytes.
                let mut one = [0u8; 8];
                encode_width(width, &tokens[..1], &mut one[..bw]).map_err(EncodeError::Codec)?;
                self.write(&one[..bw]).map_err(EncodeError::Gone)?;
                tokens = &tokens[1..];
                continue;
            }
            encode_width(width, &tokens[..k], &mut cur.spare()[len..len + k * bw])
                .map_err(EncodeError::Codec)?;
            cur.set_len(len + k * bw);
            tokens = &tokens[k..];
            self.emit_if_full().map_err(EncodeError::Gone)?;
        }
        Ok(())
    }

    /// Appends `b` to the stream, emitting frames as they fill.
    pub fn write(&mut self, mut b: &[u8]) -> Result<(), Gone> {
        while !b.is_empty() {
            let cur = self.cur.get_or_insert_with(|| self.pool.get());
            let len = cur.len();
            let k = (cur.capacity() - len).min(b.len());
            cur.spare()[len..len + k].copy_from_slice(&b[..k]);
            cur.set_len(len + k);
            b = &b[k..];
            self.emit_if_full()?;
        }
        Ok(())
    }

    /// The next `len` bytes of the current frame, when they fit in it (a fresh frame from
    /// the pool if there is none: that wait is the back-pressure); `None` when they do not.
    fn room_in_frame(&mut self, len: usize) -> Option<&mut [u8]> {
        let cur = self.cur.get_or_insert_with(|| self.pool.get());
        let at = cur.len();
        (cur.capacity() - at >= len).then(move || &mut cur.spare()[at..at + len])
    }

    /// Counts `len` bytes written into [`room_in_frame`](FrameSink::room_in_frame) as
    /// part of the stream.
    fn advance(&mut self, len: usize) -> Result<(), Gone> {
        if let Some(cur) = self.cur.as_mut() {
            let at = cur.len();
            cur.set_len(at + len);
        }
        self.emit_if_full()
    }

    /// Sends the partly filled frame if the sender has nothing queued: a consumer that
    /// keeps up gets each record as soon as it is made, instead of waiting for a full frame
    /// (with small compressed batches that could be dozens of batches), as [`IdleFlush`]
    /// says. A consumer that lags gets full frames.
    pub fn flush_if_idle(&mut self, now: Instant) -> Result<(), Gone> {
        let FrameOut::Channel(_, queued) = &self.out else {
            return Ok(());
        };
        if queued.load(Ordering::Acquire) != 0 {
            return Ok(());
        }
        let len = self.cur.as_ref().map_or(0, |c| c.len());
        if self.idle.due(len, self.bytes, now) {
            self.flush()?;
        }
        Ok(())
    }

    /// Sends the partly filled frame, if any.
    pub fn flush(&mut self) -> Result<(), Gone> {
        self.sum_new_bytes();
        self.idle.reset();
        match self.cur.take() {
            Some(b) if !b.is_empty() => self.emit(b),
            _ => Ok(()),
        }
    }
}

/// Batch records over a TCP connection: a [`FrameSink`] on the producing thread and a
/// sender thread that writes its frames to the socket.
pub struct TcpBatchSink {
    /// `None` once the sink is joined (its channel to the sender closed).
    frames: Option<FrameSink<'static>>,
    sender: Option<JoinHandle<Result<(), SendError>>>,
    /// Room for a record that does not fit the current frame; split into frames on commit.
    stage: Vec<u8>,
    staged: bool,
    /// Frames the producer may run ahead by (the pool's buffers).
    prefetch: usize,
}

fn gone<T>(_: T) -> SinkError {
    SinkError::Gone("client went away".into())
}

impl TcpBatchSink {
    /// Starts the sender thread on `conn`, with `prefetch` 1 MiB frames the producer may run
    /// ahead by, each frame sent when `pacer` (if any) lets it. A set `cancel` ends the
    /// stream ("closed by the client").
    pub fn start(
        conn: DataStream,
        prefetch: usize,
        cancel: Arc<AtomicBool>,
        pacer: Option<Box<dyn crate::Pacer>>,
    ) -> std::io::Result<Self> {
        let pool = BufferPool::new(prefetch, MAX_PAYLOAD);
        let (tx, rx) = sync_channel::<Msg>(prefetch + 2);
        let queued = Arc::new(AtomicUsize::new(0));
        let sender_queued = queued.clone();
        let sender = std::thread::Builder::new()
            .name("dquant-send".into())
            .spawn(move || send_frames(conn, pacer, rx, &sender_queued, &cancel))?;
        Ok(TcpBatchSink {
            frames: Some(FrameSink::new(pool, FrameOut::Channel(tx, queued))),
            sender: Some(sender),
            stage: Vec::new(),
            staged: false,
            prefetch: prefetch.max(1),
        })
    }

    /// Frame payload bytes handed to the sender so far.
    pub fn bytes(&self) -> u64 {
        self.frames.as_ref().map_or(0, |f| f.bytes())
    }

    /// Closes the channel and waits for the sender thread: Ok once the end (or the error
    /// message) was written, else why the stream ended early ("closed by the client",
    /// "client went away: …", "producer stopped" when neither `finish` nor `fail` came).
    pub fn join(mut self) -> Result<(), SendError> {
        drop(self.frames.take());
        match self.sender.take() {
            Some(h) => h.join().map_err(|_| SendError::Panicked)?,
            None => Ok(()),
        }
    }

    fn frames(&mut self) -> Result<&mut FrameSink<'static>, SinkError> {
        self.frames
            .as_mut()
            .ok_or_else(|| SinkError::Gone("the sink was joined".into()))
    }

    /// Hands `msg` to the sender after the frames before it.
    fn send(&mut self, msg: Msg) -> Result<(), SinkError> {
        match &self.frames()?.out {
            FrameOut::Channel(tx, _) => tx.send(msg).map_err(gone),
            FrameOut::Direct(_) => Ok(()),
        }
    }
}

impl BatchSink for TcpBatchSink {
    fn reserve(&mut self, len: usize) -> Result<&mut [u8], SinkError> {
        let fits = self.frames()?.room_in_frame(len).is_some();
        self.staged = !fits;
        if !fits {
            return crate::sink::record_room(&mut self.stage, len);
        }
        self.frames()?
            .room_in_frame(len)
            .ok_or_else(|| SinkError::Failed("the frame's room was taken".into()))
    }

    fn commit(&mut self, len: usize) -> Result<(), SinkError> {
        if std::mem::take(&mut self.staged) {
            let Some(frames) = self.frames.as_mut() else {
                return Err(gone(()));
            };
            frames.write(&self.stage[..len]).map_err(gone)
        } else {
            self.frames()?.advance(len).map_err(gone)
        }
    }

    fn flush_if_idle(&mut self, now: Instant) -> Result<(), SinkError> {
        self.frames()?.flush_if_idle(now).map_err(gone)
    }

    /// The frames queued for the sender thread, of the `prefetch` the producer may run
    /// ahead by.
    fn backlog(&self) -> Option<f64> {
        let queued = self.frames.as_ref()?.queued()?;
        Some((queued as f64 / self.prefetch as f64).min(1.0))
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        self.frames()?.flush().map_err(gone)?;
        self.send(Msg::End)
    }

    fn fail(&mut self, message: &str) {
        // Records before the failure are delivered; then the error, verbatim.
        if let Ok(f) = self.frames() {
            let _ = f.flush();
        }
        let _ = self.send(Msg::Error(message.to_string()));
    }
}

/// The sender half: frames from the producer to the socket.
fn send_frames(
    conn: DataStream,
    pacer: Option<Box<dyn crate::Pacer>>,
    rx: Receiver<Msg>,
    queued: &AtomicUsize,
    cancel: &AtomicBool,
) -> Result<(), SendError> {
    let mut w = FrameWriter::new(conn).with_pacer(pacer);
    for msg in rx.iter() {
        if cancel.load(Ordering::Relaxed) {
            return Err(SendError::Cancelled);
        }
        let r = match msg {
            Msg::Frame(buf, crc) => {
                let r = w.send_checked(FrameKind::Data, &buf, crc);
                queued.fetch_sub(1, Ordering::AcqRel);
                r
            }
            Msg::End => return w.finish(&[]).map_err(SendError::End),
            Msg::Error(m) => {
                let _ = w.fail(&m);
                return Err(SendError::Failed(m));
            }
        };
        if let Err(e) = r {
            // Dropping `rx` hands the queued buffers back and stops the producer.
            return Err(send_error(e, w.get_ref().socket()));
        }
    }
    Err(SendError::ProducerStopped)
}

/// Why a TCP stream ended before its end frame went out.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    #[error("closed by the client")]
    Cancelled,
    /// The consumer's socket refused frames past its send timeout: a consumer that stopped
    /// reading, released by the agent's idle limit (the timeout, in seconds).
    #[error(
        "the consumer read nothing for {0} s (the agent's consumer_idle_secs); session released"
    )]
    IdleConsumer(u64),
    #[error("client went away: {0}")]
    Gone(#[source] WireError),
    /// The end frame could not be written.
    #[error("{0}")]
    End(#[source] WireError),
    /// The producer failed; its message went out as the stream's error frame.
    #[error("{0}")]
    Failed(String),
    /// The producer stopped without an end or an error.
    #[error("producer stopped")]
    ProducerStopped,
    #[error("the sender thread panicked")]
    Panicked,
}

/// Why a frame could not be sent: the consumer's socket refused it past its send timeout
/// (a consumer that stopped reading, released by the agent's idle limit), or went away.
pub fn send_error(e: WireError, conn: &TcpStream) -> SendError {
    use std::io::ErrorKind::{TimedOut, WouldBlock};
    let timed_out = matches!(&e, WireError::Io(io) if matches!(io.kind(), WouldBlock | TimedOut));
    match (timed_out, conn.write_timeout()) {
        (true, Ok(Some(t))) => SendError::IdleConsumer(t.as_secs()),
        _ => SendError::Gone(e),
    }
}

/// Batch records from a TCP connection: frames checked and unpacked by a [`RecordReader`],
/// payloads copied out to where the consumer wants them.
pub struct TcpBatchSource {
    records: RecordReader<DataStream>,
    ended: bool,
}

impl TcpBatchSource {
    pub fn new(records: RecordReader<DataStream>) -> Self {
        TcpBatchSource {
            records,
            ended: false,
        }
    }

    fn conn(&self) -> &DataStream {
        self.records.get_ref().get_ref()
    }
}

impl BatchSource for TcpBatchSource {
    fn next_header(&mut self) -> Result<Option<BatchHeader>, ReceiveError> {
        if self.ended {
            return Ok(None);
        }
        let Some(hb) = self.records.next_header()? else {
            self.ended = true;
            return Ok(None);
        };
        Ok(Some(BatchHeader::parse(&hb).map_err(WireError::from)?))
    }

    fn read_payload(&mut self, out: &mut [u8]) -> Result<(), ReceiveError> {
        Ok(self.records.read_exact(out, "batch payload")?)
    }

    /// A batch whose first bytes have arrived counts as ready, though its last bytes may
    /// still be on the way.
    fn wait_ready(&mut self, timeout: Duration) -> Result<bool, ReceiveError> {
        if self.ended || self.records.has_buffered() {
            return Ok(true);
        }
        Ok(self.conn().readable(timeout).map_err(WireError::Io)?)
    }

    fn shutdown(&mut self) {
        let _ = self.conn().socket().shutdown(std::net::Shutdown::Both);
    }
}

/// Connects to a session's data plane at `addr` (`HOST:PORT`), over TLS when `tls` is
/// given, and says `hello`: the connection's frame writer (range sessions send requests on
/// it) and its record reader.
pub fn connect(
    addr: &str,
    hello: &Hello,
    tls: Option<&ClientTls>,
) -> Result<(FrameWriter<DataStream>, RecordReader<DataStream>), ConnectError> {
    let err = |source| ConnectError::Connect {
        addr: addr.to_string(),
        source,
    };
    let sa = addr
        .to_socket_addrs()
        .map_err(err)?
        .next()
        .ok_or_else(|| err(std::io::ErrorKind::NotFound.into()))?;
    let s = TcpStream::connect_timeout(&sa, CONNECT_TIMEOUT).map_err(err)?;
    s.set_nodelay(true).map_err(err)?;
    let conn = match tls {
        None => DataStream::plain(s),
        Some(tls) => {
            // The handshake gets the connect's time; the caller sets the stream's own.
            s.set_read_timeout(Some(CONNECT_TIMEOUT)).map_err(err)?;
            s.set_write_timeout(Some(CONNECT_TIMEOUT)).map_err(err)?;
            let c = tls.connect(s, addr)?;
            c.socket().set_read_timeout(None).map_err(err)?;
            c.socket().set_write_timeout(None).map_err(err)?;
            c
        }
    };
    let mut w = FrameWriter::new(conn.try_clone().map_err(err)?);
    w.send(FrameKind::Data, &hello.encode())?;
    w.flush()?;
    Ok((w, RecordReader::new(conn)))
}

/// How long connecting a data plane may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    /// A record that fits the current frame is written in place; one that does not is
    /// staged and split across frames; either way the byte stream is the records back to
    /// back, and a frame goes out when full.
    #[test]
    fn reserved_records_land_in_frames_whole_or_split() {
        let (tx, rx) = sync_channel(10_000);
        let queued = Arc::new(AtomicUsize::new(0));
        let mut sink = TcpBatchSink {
            frames: Some(FrameSink::new(
                BufferPool::new(4, 100),
                FrameOut::Channel(tx, queued.clone()),
            )),
            sender: None,
            stage: Vec::new(),
            staged: false,
            prefetch: 8,
        };
        // The backlog is the frames queued for the sender (none here writes them), of 8.
        assert_eq!(sink.backlog(), Some(0.0));
        let mut want = Vec::new();
        for (i, len) in [30usize, 60, 50, 250, 10].into_iter().enumerate() {
            // Reserve more than is committed, as the produce loop does.
            let room = sink.reserve(len + 7).unwrap();
            room[..len].fill(i as u8 + 1);
            // Reserving again without a commit gives the same room.
            assert!(sink.reserve(len + 7).unwrap()[..len]
                .iter()
                .all(|&b| b == i as u8 + 1));
            sink.commit(len).unwrap();
            want.extend(std::iter::repeat_n(i as u8 + 1, len));
        }
        let full = queued.load(Ordering::Acquire);
        assert!(full >= 3, "{full} frames queued");
        assert_eq!(sink.backlog(), Some(full as f64 / 8.0));
        sink.finish().unwrap();
        drop(sink);
        let mut got = Vec::new();
        let mut frames = Vec::new();
        for m in rx {
            match m {
                Msg::Frame(b, crc) => {
                    // Each frame's crc, summed piece by piece, is its whole bytes' crc32c.
                    assert_eq!(crc, crate::frame::payload_crc(&b), "frame {}", frames.len());
                    frames.push(b.len());
                    got.extend_from_slice(&b);
                }
                Msg::End => break,
                Msg::Error(m) => panic!("{m}"),
            }
        }
        assert_eq!(got, want);
        assert_eq!(frames, vec![100, 100, 100, 100]);
    }

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
                let mut sink = FrameSink::new(pool, FrameOut::Channel(tx, queued));
                let collect = std::thread::spawn(move || {
                    let mut got = Vec::new();
                    for m in rx {
                        if let Msg::Frame(b, crc) = m {
                            assert_eq!(crc, crate::frame::payload_crc(&b));
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
