//! Source sessions: token ranges of one dataset, answered on request, for an agent that
//! chains to this one (`dquant_remote::RemoteSource` is the other end).
//!
//! Requests arrive as frames on the session's connection; each range is read, encoded in the
//! session's wire codec and answered as a range record, in order. A bad request gets an error
//! frame naming the range, and the session ends; the agent serves on.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dquant_engine::record::Encoders;
use dquant_engine::{codec_for, TokenSource};
use dquant_plan::WireCodec;
use dquant_transport::frame::MAX_PAYLOAD;
use dquant_transport::record::{parse_request, RECORD_HEADER_LEN};
use dquant_transport::tcp::FrameSink;
use dquant_transport::{BufferPool, DataStream, FrameReader, FrameWriter, RangeHeader, WireError};

use crate::produce::Stats;
use crate::sessions::{StreamError, Work};

/// Sends the error frame, then half-closes and reads what the client still sends until it
/// hangs up (at most 2 s). A client that reads ahead has requests in flight when an error
/// stops us; closing with them unread would make the kernel reset the connection, and a
/// reset can overtake the error frame, so the client would see a truncated stream instead of
/// the message.
fn fail_and_linger(w: &mut FrameWriter<DataStream>, message: &str) {
    use std::io::{ErrorKind, Read};
    if w.fail(message).is_err() {
        return;
    }
    let s = w.get_ref().socket();
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

/// One dataset and what answering its ranges needs.
struct Ranges {
    source: Box<dyn TokenSource>,
    name: String,
    wire: WireCodec,
    total: u64,
    /// The agent's `limits.max_range_tokens`.
    max_len: u64,
    enc: Encoders,
    tokens: Vec<u32>,
    payload: Vec<u8>,
}

impl Ranges {
    /// The checked range `start + len`, or the message the client gets.
    fn check(&self, start: u64, len: u64) -> Result<Range<u64>, String> {
        let name = &self.name;
        if len > self.max_len {
            return Err(format!(
                "{name}: token range {start}+{len} is longer than this agent's limit of {} \
                 tokens per request (limits.max_range_tokens)",
                self.max_len
            ));
        }
        let end = start.checked_add(len).filter(|&e| e <= self.total);
        end.map(|end| start..end).ok_or_else(|| {
            format!(
                "{name}: token range {start}+{len} is outside the dataset's {} tokens",
                self.total
            )
        })
    }

    /// Reads and encodes `r`: its record header and payload (in `self.payload`).
    fn encode(&mut self, r: Range<u64>) -> Result<[u8; RECORD_HEADER_LEN], String> {
        let name = &self.name;
        self.tokens.resize((r.end - r.start) as usize, 0);
        self.source
            .read_ranges(std::slice::from_ref(&r), &mut self.tokens)
            .map_err(|e| format!("{name}: {e}"))?;
        let codec = codec_for(self.wire, &self.tokens);
        self.enc
            .encode(codec, &self.tokens, &mut self.payload)
            .map_err(|e| format!("{name}: {}", e.at_base(r.start)))?;
        let h = RangeHeader {
            codec,
            start: r.start,
            len: r.end - r.start,
            payload_len: self.payload.len() as u32,
        };
        Ok(h.encode())
    }

    /// Answers one request's ranges into `sink`, in order: Ok(false) when the client went
    /// away, Err with the message for the first range that cannot be served.
    fn answer(
        &mut self,
        ranges: &[(u64, u64)],
        sink: &mut FrameSink<'_>,
        stats: &mut Stats,
    ) -> Result<bool, String> {
        for &(start, len) in ranges {
            let r = self.check(start, len)?;
            let head = self.encode(r)?;
            if sink.write(&head).is_err() || sink.write(&self.payload).is_err() {
                return Ok(false);
            }
            stats.records += 1;
            stats.tokens += len;
        }
        Ok(true)
    }
}

/// Serves range requests for one dataset until the client hangs up.
pub(crate) fn serve_ranges(
    work: Work,
    conn: DataStream,
    frames: &mut FrameReader<DataStream>,
    max_len: u64,
    cancel: Arc<AtomicBool>,
) -> Result<Stats, StreamError> {
    let mut w = FrameWriter::new(conn);
    let Work::Source { source, name, wire } = work else {
        let m = "a plan session streams batches; open it with Open, not OpenSource";
        fail_and_linger(&mut w, m);
        return Err(StreamError::Failed(m.into()));
    };
    let total = source.tokens();
    let mut ds = Ranges {
        source,
        name,
        wire,
        total,
        max_len,
        enc: Encoders::default(),
        tokens: Vec::new(),
        payload: Vec::new(),
    };
    let pool = BufferPool::new(2, MAX_PAYLOAD);
    let mut req = pool.get();
    let mut ranges = Vec::new();
    let mut stats = Stats::default();
    let fail = |w: &mut FrameWriter<DataStream>, m: String| {
        fail_and_linger(w, &m);
        Err(StreamError::Failed(m))
    };
    loop {
        if cancel.load(Ordering::Relaxed) {
            return Ok(stats);
        }
        match frames.next_into(&mut req) {
            Ok(true) => {}
            Ok(false) | Err(WireError::Truncated { .. }) => return Ok(stats),
            Err(e) => return fail(&mut w, e.to_string()),
        }
        if let Err(e) = parse_request(&req, &mut ranges) {
            return fail(&mut w, e.to_string());
        }
        let mut sink = FrameSink::direct(pool.clone(), &mut w);
        let answered = ds.answer(&ranges, &mut sink, &mut stats);
        if sink.flush().is_err() {
            return Ok(stats);
        }
        stats.wire_bytes += sink.bytes();
        match answered {
            Ok(true) => {}
            Ok(false) => return Ok(stats),
            Err(m) => return fail(&mut w, m),
        }
        if w.flush().is_err() {
            return Ok(stats);
        }
    }
}
