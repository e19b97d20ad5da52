//! Source sessions: token ranges of one dataset, answered on request, for an agent that
//! chains to this one (`dquant_remote::RemoteSource` is the other end).
//!
//! Requests arrive as frames on the session's connection; each range is read, encoded in the
//! session's wire codec and answered as a range record, in order. A bad request gets an error
//! frame naming the range, and the session ends; the agent serves on.
//!
//! The connection is the TCP data plane, or, for a client on this host, the agent's Unix
//! socket that the client handed a shared-memory ring over on: then each answer goes into one
//! slot of the ring ([`Out::Ring`]) and the requests still come as frames on the socket. The
//! session is the same code over both ([`Requests`], [`RecordOut`]).
//!
//! With a compressing wire codec and a worker pool of two threads or more, a session works on
//! the requests its client keeps in flight at once, their compression on the pool ([`ahead`]),
//! as a plan session's batches are (`dquant_engine::EncodeAhead`). The records are the same
//! bytes either way.

use std::io::Read;
use std::ops::Range;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use dquant_codec::CodecError;
use dquant_engine::record::Encoders;
use dquant_engine::{codec_for, SourceError, TokenSource, WorkerPool};
use dquant_plan::WireCodec;
use dquant_transport::frame::MAX_PAYLOAD;
use dquant_transport::record::{parse_request, RECORD_HEADER_LEN};
use dquant_transport::shm::RingSink;
use dquant_transport::RecordError;
use dquant_transport::{
    BufferPool, DataStream, FrameReader, FrameWriter, PooledBuf, RangeHeader, WireError,
};

use crate::faults::Faults;
use crate::metrics::Meter;
use crate::produce::Stats;
use crate::sessions::Work;
use crate::stream_error::StreamError;
use crate::stream_level::{StreamLevel, RANGE_WINDOW};
use crate::Shared;

mod ahead;
mod out;
#[cfg(test)]
mod tests;

use ahead::{Ahead, REQUESTS_AHEAD};
use out::{Out, RecordOut};

/// A range read and being encoded on the pool: its tokens and payload buffers come back with
/// its record header (or the message for the client).
struct Encoding {
    len: u64,
    result: mpsc::Receiver<Encoded>,
}

struct Encoded {
    /// The header, or the token that did not fit (its offset in the dataset); the dataset's
    /// name is added where it is delivered, not copied into every job.
    head: Result<[u8; RECORD_HEADER_LEN], CodecError>,
    tokens: Vec<u32>,
    payload: Vec<u8>,
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
    /// Buffers of answers written, for the next ranges encoded on the pool.
    spare: Vec<(Vec<u32>, Vec<u8>)>,
    /// The zstd level of ranges asked for in a stream codec (`transport`), fitted to the
    /// link ([`crate::stream_level`]); `None`: the codec's own level.
    level: Option<StreamLevel>,
}

impl Ranges {
    /// Tells the level what share of the last answer's time went to waiting for the link
    /// (`None`: the transport cannot tell, a ring).
    fn fit_level(&mut self, waited: Option<f64>) {
        let (Some(level), Some(waited)) = (self.level.as_mut(), waited) else {
            return;
        };
        if let Some(l) = level.observe(waited) {
            self.wire = self.wire.with_zstd_level(l);
        }
    }

    /// The checked range `start + len`, or the message the client gets.
    fn check(&self, start: u64, len: u64) -> Result<Range<u64>, RangeError> {
        // The dataset's name is copied only into an error: this runs for every range.
        if len > self.max_len {
            return Err(RangeError::TooLong {
                name: self.name.clone(),
                start,
                len,
                max: self.max_len,
            });
        }
        let end = start.checked_add(len).filter(|&e| e <= self.total);
        end.map(|end| start..end)
            .ok_or_else(|| RangeError::Outside {
                name: self.name.clone(),
                start,
                len,
                total: self.total,
            })
    }

    fn read_error(&self, source: SourceError) -> RangeError {
        RangeError::Read {
            name: self.name.clone(),
            source,
        }
    }

    /// Reads and encodes `r`: its record header and payload (in `self.payload`).
    fn encode(&mut self, r: Range<u64>) -> Result<[u8; RECORD_HEADER_LEN], RangeError> {
        self.tokens.resize((r.end - r.start) as usize, 0);
        if let Err(e) = self
            .source
            .read_ranges(std::slice::from_ref(&r), &mut self.tokens)
        {
            return Err(self.read_error(e));
        }
        let codec = codec_for(self.wire, &self.tokens);
        let name = &self.name;
        self.enc
            .encode(codec, &self.tokens, &mut self.payload)
            .map_err(|e| RangeError::Encode {
                name: name.clone(),
                source: e.at_base(r.start),
            })?;
        let h = RangeHeader {
            codec,
            start: r.start,
            len: r.end - r.start,
            payload_len: self.payload.len() as u32,
        };
        Ok(h.encode())
    }

    /// Reads range `start + len` (checked) and hands its encoding to `pool`.
    fn start(&mut self, start: u64, len: u64, pool: &WorkerPool) -> Result<Encoding, RangeError> {
        let r = self.check(start, len)?;
        let (mut tokens, mut payload) = self.spare.pop().unwrap_or_default();
        tokens.resize(len as usize, 0);
        if let Err(e) = self
            .source
            .read_ranges(std::slice::from_ref(&r), &mut tokens)
        {
            return Err(self.read_error(e));
        }
        let codec = codec_for(self.wire, &tokens);
        let result = pool.encode_job(move |enc| {
            let head = enc
                .encode(codec, &tokens, &mut payload)
                .map_err(|e| e.at_base(start))
                .map(|()| {
                    let payload_len = payload.len() as u32;
                    RangeHeader {
                        codec,
                        start,
                        len,
                        payload_len,
                    }
                    .encode()
                });
            Encoded {
                head,
                tokens,
                payload,
            }
        });
        Ok(Encoding { len, result })
    }

    /// Writes a range encoded on the pool into `sink` once its encoding is done: Ok(false)
    /// when the client went away, Err with the message for the client.
    fn deliver(
        &mut self,
        e: Encoding,
        sink: &mut dyn RecordOut,
        stats: &mut Stats,
    ) -> Result<bool, RangeError> {
        let Ok(done) = e.result.recv() else {
            return Err(RangeError::WorkerGone {
                name: self.name.clone(),
            });
        };
        let head = done.head.map_err(|source| RangeError::Encode {
            name: self.name.clone(),
            source,
        })?;
        if !sink.put(&head, &done.payload)? {
            return Ok(false);
        }
        stats.records += 1;
        stats.tokens += e.len;
        if self.spare.len() < 2 * REQUESTS_AHEAD {
            self.spare.push((done.tokens, done.payload));
        }
        Ok(true)
    }

    /// Tells the dataset a request's ranges (those inside it) before they are read: a
    /// storage agent in front of an object store fetches a shuffled request's ranges at once.
    fn announce(&self, ranges: &[(u64, u64)]) {
        let inside: Vec<Range<u64>> = ranges
            .iter()
            .filter_map(|&(start, len)| self.check(start, len).ok())
            .collect();
        if inside.len() > 1 {
            self.source.will_read(&inside);
        }
    }

    /// Answers one request's ranges into `sink`, in order: Ok(false) when the client went
    /// away, Err with the message for the first range that cannot be served.
    fn answer(
        &mut self,
        ranges: &[(u64, u64)],
        sink: &mut dyn RecordOut,
        stats: &mut Stats,
    ) -> Result<bool, RangeError> {
        self.announce(ranges);
        for &(start, len) in ranges {
            let r = self.check(start, len)?;
            let head = self.encode(r)?;
            if !sink.put(&head, &self.payload)? {
                return Ok(false);
            }
            stats.records += 1;
            stats.tokens += len;
        }
        Ok(true)
    }
}

/// Why a range session cannot answer: what its client is told in an error frame, after the
/// answers before it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum RangeError {
    #[error(
        "{name}: token range {start}+{len} is longer than this agent's limit of {max} tokens \
         per request (limits.max_range_tokens)"
    )]
    TooLong {
        name: String,
        start: u64,
        len: u64,
        max: u64,
    },
    #[error("{name}: token range {start}+{len} is outside the dataset's {total} tokens")]
    Outside {
        name: String,
        start: u64,
        len: u64,
        total: u64,
    },
    /// The dataset could not be read.
    #[error("{name}: {source}")]
    Read {
        name: String,
        #[source]
        source: SourceError,
    },
    /// A token does not fit the wire codec (its offset counted from the dataset's start).
    #[error("{name}: {source}")]
    Encode {
        name: String,
        #[source]
        source: CodecError,
    },
    #[error("{name}: a range's encoding ended without a result (a worker thread failed)")]
    WorkerGone { name: String },
    /// What the client sent is not a request.
    #[error("{0}")]
    Request(#[from] WireError),
    #[error("{0}")]
    BadRequest(#[from] RecordError),
    /// The ring cannot carry an answer (its message, verbatim).
    #[error("{0}")]
    Ring(String),
}

/// Why a session stops taking requests: the client closed its side, or sent what is not a
/// request (the message for it).
enum Stop {
    Closed,
    Bad(RangeError),
}

/// The next request's ranges into `ranges`: Ok(false) when the client closed its side.
fn next_request<R: Read>(
    frames: &mut FrameReader<R>,
    req: &mut PooledBuf,
    ranges: &mut Vec<(u64, u64)>,
) -> Result<bool, RangeError> {
    match frames.next_into(req) {
        Ok(true) => {}
        Ok(false) | Err(WireError::Truncated { .. }) => return Ok(false),
        Err(e) => return Err(e.into()),
    }
    parse_request(req, ranges)?;
    Ok(true)
}

/// Where a session's requests come from: a connection that can say whether a request (or
/// the end of the stream, or an error: the read that follows reports them) is already
/// waiting on it.
pub(crate) trait Requests: Read {
    fn waiting(&self) -> bool;
}

impl Requests for DataStream {
    fn waiting(&self) -> bool {
        self.readable(Duration::ZERO).unwrap_or(true)
    }
}

impl Requests for UnixStream {
    fn waiting(&self) -> bool {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let mut fds = [PollFd::new(self, PollFlags::IN)];
        poll(&mut fds, Some(&zero)).map_or(true, |n| n > 0)
    }
}

/// Serves range requests for one dataset until the client hangs up: on the agent's worker
/// pool when the wire codec compresses and the pool has two threads or more, else on this
/// thread. Each answer is counted in `owner`'s meter as it is sent, so an operator (or a
/// test) sees a replica serving while it serves, not only once its session ends.
pub(crate) fn serve_ranges(
    work: Work,
    conn: DataStream,
    frames: &mut FrameReader<DataStream>,
    (shared, owner): (&Shared, &str),
    cancel: Arc<AtomicBool>,
    pacer: Option<Box<dyn dquant_transport::Pacer>>,
) -> Result<Stats, StreamError> {
    // One buffer for requests, one for the frames of the answers.
    let buffers = BufferPool::new(2, MAX_PAYLOAD);
    let out = Out::Tcp {
        w: FrameWriter::new(conn).with_pacer(pacer),
        buffers: buffers.clone(),
    };
    serve(work, out, frames, buffers, (shared, owner), cancel)
}

/// As [`serve_ranges`], with the requests read from `sock`, the Unix socket the client
/// handed its ring over on, and each answer written into one slot of that ring (`sink`).
pub(crate) fn serve_ranges_ring(
    work: Work,
    sink: RingSink,
    sock: UnixStream,
    (shared, owner): (&Shared, &str),
    cancel: Arc<AtomicBool>,
) -> Result<Stats, StreamError> {
    let mut frames = FrameReader::new(sock);
    let requests = BufferPool::new(1, MAX_PAYLOAD);
    let out = Out::Ring(sink);
    serve(work, out, &mut frames, requests, (shared, owner), cancel)
}

/// A range session over `out`, its requests read from `frames` into a buffer of `requests`.
fn serve<R: Requests>(
    work: Work,
    mut out: Out,
    frames: &mut FrameReader<R>,
    requests: BufferPool,
    (shared, owner): (&Shared, &str),
    cancel: Arc<AtomicBool>,
) -> Result<Stats, StreamError> {
    let Work::Source { source, name, wire } = work else {
        let m = "a plan session streams batches; open it with Open, not OpenSource";
        out.fail(m);
        return Err(StreamError::Failed(m.into()));
    };
    let total = source.tokens();
    // A stream codec's ranges are compressed alone (any order, several readers), at a zstd
    // level fitted to the link from the stream's down.
    let level = wire
        .stream_level()
        .map(|top| StreamLevel::deciding_every(top, RANGE_WINDOW));
    let wire = wire.without_stream();
    let ds = Ranges {
        source,
        name,
        wire,
        total,
        max_len: shared.config.limits.max_range_tokens,
        enc: Encoders::default(),
        tokens: Vec::new(),
        payload: Vec::new(),
        spare: Vec::new(),
        level,
    };
    let meter = shared
        .metrics
        .meter(owner)
        .with_tally(shared.events.tally(owner));
    let corrupt = shared.metrics.corrupt_reads(&ds.name);
    let session = Session {
        out,
        frames,
        req: requests,
        stats: Stats::default(),
        cancel,
        meter,
        corrupt,
        faults: shared.faults.clone(),
        requests: 0,
        waited: None,
    };
    let pool = shared.workers.clone();
    match pool.filter(|p| wire.compresses() && p.workers() >= 2) {
        Some(pool) => session.serve_ahead(ds, &pool),
        None => session.serve(ds),
    }
}

/// Why no request came: a bad one, or a fault a test armed.
enum Cut {
    Bad(RangeError),
    Injected,
}

impl Cut {
    /// How a session cut by a fault ends: its connection dropped, nothing written.
    fn ended() -> StreamError {
        StreamError::Failed("injected fault: the range session's connection was cut".into())
    }
}

/// A source session's connection and counters.
struct Session<'f, R: Read> {
    out: Out,
    frames: &'f mut FrameReader<R>,
    /// Where requests are read into.
    req: BufferPool,
    stats: Stats,
    cancel: Arc<AtomicBool>,
    meter: Meter,
    /// Reads refused because this agent's copy failed its checksum.
    corrupt: metrics::Counter,
    /// Faults tests arm (debug builds), and the requests received so far.
    faults: Faults,
    requests: u64,
    /// The share of the last answer's time spent waiting for the link (`None` on a ring).
    waited: Option<f64>,
}

impl<R: Requests> Session<'_, R> {
    /// The next request into `req` and `ranges`, as [`next_request`]; a fault armed for this
    /// request cuts the connection without an answer (the session returns, dropping it).
    fn next(&mut self, req: &mut PooledBuf, ranges: &mut Vec<(u64, u64)>) -> Result<bool, Cut> {
        let got = next_request(self.frames, req, ranges).map_err(Cut::Bad)?;
        if got && self.faults.cut_range_session(self.requests) {
            return Err(Cut::Injected);
        }
        self.requests += got as u64;
        Ok(got)
    }

    /// One request at a time, each range read and encoded on this thread.
    fn serve(mut self, mut ds: Ranges) -> Result<Stats, StreamError> {
        let mut req = self.req.get();
        let mut ranges = Vec::new();
        loop {
            if self.cancel.load(Ordering::Relaxed) {
                return self.end();
            }
            match self.next(&mut req, &mut ranges) {
                Ok(true) => {}
                Ok(false) => return self.end(),
                Err(Cut::Bad(m)) => return self.fail(m),
                Err(Cut::Injected) => return Err(Cut::ended()),
            }
            if let Some(end) = self.respond(|sink, stats| ds.answer(&ranges, sink, stats)) {
                return end;
            }
            ds.fit_level(self.waited);
        }
    }

    /// Up to [`REQUESTS_AHEAD`] requests taken at once, their ranges read here and
    /// compressed on `pool` ([`Ahead`]), the answers written in order.
    fn serve_ahead(mut self, mut ds: Ranges, pool: &WorkerPool) -> Result<Stats, StreamError> {
        let mut req = self.req.get();
        let mut ranges = Vec::new();
        let mut ahead = Ahead::default();
        let mut stop = None;
        loop {
            while stop.is_none()
                && ahead.requests() < REQUESTS_AHEAD
                && (ahead.requests() == 0 || self.frames.get_ref().waiting())
            {
                if self.cancel.load(Ordering::Relaxed) {
                    return self.end();
                }
                match self.next(&mut req, &mut ranges) {
                    Ok(true) => {
                        ds.announce(&ranges);
                        ahead.take(&ranges)
                    }
                    Ok(false) => stop = Some(Stop::Closed),
                    Err(Cut::Bad(m)) => stop = Some(Stop::Bad(m)),
                    Err(Cut::Injected) => return Err(Cut::ended()),
                }
            }
            // The requests before a bad frame or the client's end are answered first, as
            // one at a time would.
            if ahead.requests() == 0 {
                return match stop {
                    Some(Stop::Bad(m)) => self.fail(m),
                    _ => self.end(),
                };
            }
            let answered =
                self.respond(|sink, stats| ahead.answer_next(&mut ds, pool, sink, stats));
            if let Some(end) = answered {
                return end;
            }
            ds.fit_level(self.waited);
        }
    }

    /// Writes one request's answers (`answer` puts them in the sink) and hands them to the
    /// client; says whether (and how) the session ends.
    fn respond(
        &mut self,
        answer: impl FnOnce(&mut dyn RecordOut, &mut Stats) -> Result<bool, RangeError>,
    ) -> Option<Result<Stats, StreamError>> {
        let before = self.stats;
        let (started, waited) = (Instant::now(), self.out.waited());
        let stats = &mut self.stats;
        let (answered, flushed, bytes) = self.out.request(|sink| answer(sink, stats));
        self.waited = waited.zip(self.out.waited()).map(|(w0, w1)| {
            let took = started.elapsed().as_secs_f64();
            (w1.saturating_sub(w0).as_secs_f64() / took.max(1e-9)).min(1.0)
        });
        self.stats.wire_bytes += bytes;
        self.meter.add(
            self.stats.records - before.records,
            self.stats.tokens - before.tokens,
            self.stats.wire_bytes - before.wire_bytes,
        );
        match answered {
            Err(m) if flushed => Some(self.fail(m)),
            _ if !flushed => Some(self.end()),
            Ok(true) => None,
            Ok(false) | Err(_) => Some(self.end()),
        }
    }

    /// The client is done (or gone): a ring is closed after its last answer.
    fn end(&mut self) -> Result<Stats, StreamError> {
        self.out.finish();
        Ok(self.stats)
    }

    fn fail(&mut self, e: RangeError) -> Result<Stats, StreamError> {
        if matches!(&e, RangeError::Read { source, .. } if source.is_corrupt()) {
            self.corrupt.increment(1);
        }
        let m = e.to_string();
        self.out.fail(&m);
        Err(StreamError::Failed(m))
    }
}
