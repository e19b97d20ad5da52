//! A subscriber's delivery: the stream's records, from its position on, into its own
//! transport.
//!
//! The relay is the produce loop's counterpart for a subscriber: records are copied out of
//! the window instead of made. Two outlets:
//! - [`FrameOutlet`] (TCP): the records ready for the subscriber go out as frames (one per
//!   record, or per 1 MiB of a larger one) in the wire codec, straight from the window's
//!   memory, in one vectored write; their checksums are computed once for every subscriber
//!   ([`super::Slot`]). The only per-subscriber cost is the socket write itself.
//! - [`RingOutlet`] (shared memory, for a subscriber that does not read the stream's shared
//!   ring): each record, in the output dtype, is copied into the subscriber's ring through
//!   its [`BatchSink`].
//!
//! The relay ends as the stream ends (every record, then the end or the stream's error), or
//! when its consumer goes away or is closed; either way its [`Subscription`] drops and the
//! producer no longer waits for it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use dquant_plan::OutputDType;
use dquant_transport::frame::MAX_PAYLOAD;
use dquant_transport::tcp::{send_error, MAX_FRAME_AGE};
use dquant_transport::{
    BatchSink, DataStream, FrameKind, FrameWriter, SinkError, WireError, MAX_FRAMES_AT_ONCE,
};

use super::{End, Next, ShareError, Slot, Subscription, RECHECK};
use crate::metrics::Meter;
use crate::produce::{Outcome, Stats, TooLarge};

/// Where a subscriber's records go.
pub(crate) trait Outlet {
    /// Whether the transport carries the stream's largest record in this outlet's form (a
    /// ring's slots have a size; a socket has none).
    fn fits(&self, info: &super::StreamInfo, output: OutputDType) -> Result<(), TooLarge> {
        let _ = (info, output);
        Ok(())
    }
    /// Bytes of records one [`Outlet::deliver`] takes at most (at least one record).
    fn run_bytes(&self) -> usize;
    /// Delivers `slots`, in order; returns their tokens and their bytes in this outlet's
    /// form.
    fn deliver(
        &mut self,
        slots: &[Arc<Slot>],
        output: OutputDType,
    ) -> Result<(u64, usize), SinkError>;
    /// Hands on what is held while no record is at hand.
    fn idle(&mut self, now: Instant) -> Result<(), SinkError>;
    fn finish(&mut self) -> Result<(), SinkError>;
    fn fail(&mut self, message: &str);
}

/// A TCP subscriber: frames straight from the window.
pub(crate) struct FrameOutlet {
    frames: FrameWriter<DataStream>,
}

impl FrameOutlet {
    pub fn new(frames: FrameWriter<DataStream>) -> Self {
        FrameOutlet { frames }
    }

    fn gone(&self, e: WireError) -> SinkError {
        SinkError::Gone(send_error(e, self.frames.get_ref().socket()).to_string())
    }
}

impl Outlet for FrameOutlet {
    /// What is ready, up to a frame's worth: fewer, larger writes.
    fn run_bytes(&self) -> usize {
        MAX_PAYLOAD
    }

    /// Every chunk of every record a frame, in as few writes as the kernel takes.
    fn deliver(&mut self, slots: &[Arc<Slot>], _: OutputDType) -> Result<(u64, usize), SinkError> {
        let tokens = slots.iter().map(|s| s.tokens).sum();
        let bytes = slots.iter().map(|s| s.wire.len()).sum();
        let frames: Vec<(&[u8], u32)> = slots
            .iter()
            .flat_map(|s| s.chunks().zip(s.crcs().iter().copied()))
            .collect();
        for some in frames.chunks(MAX_FRAMES_AT_ONCE) {
            self.frames
                .send_all_checked(FrameKind::Data, some)
                .map_err(|e| self.gone(e))?;
        }
        Ok((tokens, bytes))
    }

    fn idle(&mut self, _: Instant) -> Result<(), SinkError> {
        // Every frame is written as it is made.
        Ok(())
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        self.frames.finish(&[]).map_err(|e| self.gone(e))
    }

    fn fail(&mut self, message: &str) {
        let _ = self.frames.fail(message);
    }
}

/// A shared-memory subscriber: records in the output dtype, copied into its ring.
pub(crate) struct RingOutlet<'a> {
    pub sink: &'a mut dyn BatchSink,
}

impl Outlet for RingOutlet<'_> {
    /// One record at a time: each is a copy into the ring anyway, and the window gets it
    /// back as soon as it is there.
    fn run_bytes(&self) -> usize {
        0
    }

    fn fits(&self, info: &super::StreamInfo, output: OutputDType) -> Result<(), TooLarge> {
        match self.sink.max_record_len() {
            Some(max) if info.plain_room > max => Err(TooLarge {
                max,
                room: info.plain_room,
                output,
            }),
            _ => Ok(()),
        }
    }

    fn deliver(
        &mut self,
        slots: &[Arc<Slot>],
        output: OutputDType,
    ) -> Result<(u64, usize), SinkError> {
        each_plain(slots, output, |_, record| {
            self.sink.reserve(record.len())?.copy_from_slice(record);
            self.sink.commit(record.len())
        })
    }

    fn idle(&mut self, now: Instant) -> Result<(), SinkError> {
        self.sink.flush_if_idle(now)
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        self.sink.finish()
    }

    fn fail(&mut self, message: &str) {
        self.sink.fail(message)
    }
}

/// Hands `put` each of `slots` in `output`'s plain dtype (a ring's form), in order; returns
/// their tokens and bytes.
pub(super) fn each_plain(
    slots: &[Arc<Slot>],
    output: OutputDType,
    mut put: impl FnMut(&Slot, &[u8]) -> Result<(), SinkError>,
) -> Result<(u64, usize), SinkError> {
    let (mut tokens, mut bytes) = (0, 0);
    for slot in slots {
        let record = slot
            .plain(output)
            .map_err(|e| SinkError::Failed(e.to_string()))?;
        put(slot, record)?;
        (tokens, bytes) = (tokens + slot.tokens, bytes + record.len());
    }
    Ok((tokens, bytes))
}

/// Relays `sub`'s records into `out` until the stream's end, a consumer that goes away, or
/// `cancel`; each record counted in `meter`.
pub(crate) fn relay(
    sub: &Subscription,
    out: &mut dyn Outlet,
    cancel: &AtomicBool,
    meter: &Meter,
) -> (Outcome, Stats) {
    let mut stats = Stats::default();
    let stream = sub.stream();
    if let Err(e) = out.fits(&stream.info, stream.output) {
        let m = e.to_string();
        out.fail(&m);
        return (Outcome::Failed(m), stats);
    }
    // The first wait after a record is short: a transport holding a partial frame hands it
    // on once it is MAX_FRAME_AGE old.
    let mut wait = MAX_FRAME_AGE;
    loop {
        if cancel.load(Ordering::Relaxed) {
            return (Outcome::Stopped("closed by the client".into()), stats);
        }
        let step = match stream.next(sub.session, wait, out.run_bytes()) {
            Some(Next::Record(run, _)) => match in_window(run, &stream.name) {
                Ok(run) => out
                    .deliver(&run, stream.output)
                    .map(|(tokens, bytes)| (run.len(), tokens, bytes)),
                Err(e) => {
                    let m = e.to_string();
                    out.fail(&m);
                    return (Outcome::Failed(m), stats);
                }
            },
            Some(Next::Wait) => {
                wait = RECHECK;
                match out.idle(Instant::now()) {
                    Ok(()) => continue,
                    Err(e) => Err(e),
                }
            }
            Some(Next::End(end)) => return (ended(out, end), stats),
            None => Err(SinkError::Gone("left the stream".into())),
        };
        match step {
            Ok((records, tokens, bytes)) => {
                stream.advance(sub.session, records);
                meter.add(records as u64, tokens, bytes as u64);
                stats.records += records as u64;
                stats.tokens += tokens;
                stats.wire_bytes += bytes as u64;
                wait = MAX_FRAME_AGE;
            }
            Err(SinkError::Gone(m)) => return (Outcome::Stopped(m), stats),
            Err(e) => {
                let m = e.to_string();
                out.fail(&m);
                return (Outcome::Failed(m), stats);
            }
        }
    }
}

/// The records of `run` up to the first that went only into the stream's shared ring
/// (whose bytes the window does not have); `Err` with the subscriber's message when the
/// first did. Such a record was made while every subscriber read the shared ring, so only a
/// subscriber that joined behind the stream's head, and not in the ring, meets one.
fn in_window(mut run: Vec<Arc<Slot>>, share: &str) -> Result<Vec<Arc<Slot>>, ShareError> {
    match run.iter().position(|s| s.ring_only) {
        Some(0) => Err(ShareError::OnlyInRing(share.to_string())),
        Some(i) => {
            run.truncate(i);
            Ok(run)
        }
        None => Ok(run),
    }
}

/// Ends the subscriber's transport as the stream ended.
fn ended(out: &mut dyn Outlet, end: End) -> Outcome {
    match end {
        End::Finished => match out.finish() {
            Ok(()) => Outcome::Finished,
            Err(e) => Outcome::Stopped(e.to_string()),
        },
        End::Failed(m) | End::Stopped(m) => {
            out.fail(&m);
            Outcome::Failed(m)
        }
        End::Drained(m) => {
            out.fail(&m);
            Outcome::Drained(m)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    use std::sync::OnceLock;

    use dquant_transport::frame::HEADER_LEN;
    use dquant_transport::{BufferPool, DataStream, FrameReader};

    use super::*;

    /// A slot holding `wire` (the outlet sends it as it is: any bytes do).
    fn slot(wire: Vec<u8>) -> Arc<Slot> {
        Arc::new(Slot {
            wire,
            tokens: 7,
            crcs: OnceLock::new(),
            plain: OnceLock::new(),
            spares: Arc::default(),
            ring_only: false,
        })
    }

    /// A TCP subscriber's outlet, and the socket its frames arrive on.
    fn subscriber(listener: &TcpListener) -> (FrameOutlet, TcpStream) {
        let ours = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (theirs, _) = listener.accept().unwrap();
        let out = FrameOutlet::new(FrameWriter::new(DataStream::plain(theirs)));
        (out, ours)
    }

    /// Reads `sock`, counting the bytes in `n`.
    struct Counted<'a>(&'a TcpStream, &'a Cell<u64>);

    impl Read for Counted<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.0.read(buf)?;
            self.1.set(self.1.get() + n as u64);
            Ok(n)
        }
    }

    /// Every data frame's payload on `sock` up to its end frame, and every byte the socket
    /// carried until it closed.
    fn frames(sock: TcpStream) -> (Vec<Vec<u8>>, u64) {
        let n = Cell::new(0);
        let mut r = FrameReader::new(Counted(&sock, &n));
        let pool = BufferPool::new(1, MAX_PAYLOAD);
        let mut buf = pool.get();
        let mut got = Vec::new();
        while r.next_into(&mut buf).unwrap() {
            got.push(buf.to_vec());
        }
        let mut rest = Vec::new();
        Counted(&sock, &n).read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "{} bytes after the end frame", rest.len());
        (got, n.get())
    }

    /// What sharing promises a TCP subscriber: the window's wire records themselves, each
    /// chunk one frame, and nothing more on its socket (no record made again for it in
    /// another form, none sent twice), whatever the number of subscribers.
    #[test]
    fn each_tcp_subscriber_gets_the_records_wire_bytes_once() {
        let pattern =
            |n: usize, k: u8| -> Vec<u8> { (0..n).map(|i| (i as u8).wrapping_mul(k)).collect() };
        let run = vec![
            slot(pattern(128 << 10, 3)),
            slot(pattern(MAX_PAYLOAD + 5, 5)),
            slot(pattern(100, 7)),
        ];
        let want: Vec<Vec<u8>> = run
            .iter()
            .flat_map(|s| s.wire.chunks(MAX_PAYLOAD).map(<[u8]>::to_vec))
            .collect();
        assert_eq!(want.len(), 4);
        // Each chunk's frame, and the end frame (no payload).
        let wire = want.iter().map(|c| HEADER_LEN + c.len()).sum::<usize>() + HEADER_LEN;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let subs: Vec<_> = (0..8).map(|_| subscriber(&listener)).collect();
        std::thread::scope(|s| {
            let mut readers = Vec::new();
            for (mut out, sock) in subs {
                readers.push(s.spawn(move || frames(sock)));
                let delivered = out.deliver(&run, OutputDType::U16).unwrap();
                assert_eq!(delivered, (21, (128 << 10) + MAX_PAYLOAD + 105));
                out.finish().unwrap();
            }
            for r in readers {
                let (got, bytes) = r.join().unwrap();
                assert_eq!(got, want);
                assert_eq!(bytes, wire as u64);
            }
        });
    }
}
