//! Readahead for sequential range reads: chunk requests kept in flight ahead of a reader
//! whose reads go on where the last one ended, so a NIC-bound link never waits on the
//! upstream agent or on this process's consumer.

use std::collections::VecDeque;
use std::ops::Range;

use dquant_storage::SourceError;

use crate::range_stream::RangeStream;

/// The data streams a [`Window`] asks chunks on: one agent's (a [`RangeStream`]), or one per
/// replica of a dataset (`ReplicatedSource`), where chunks go round-robin so every
/// replica's link carries part of a sequential read.
pub(crate) trait Streams {
    /// The stream the next chunk is asked on, or why none can take it.
    fn pick(&mut self) -> Result<usize, SourceError>;
    fn stream(&mut self, i: usize) -> &mut RangeStream;
    /// Whether stream `i` is still connected (a replica taken out is not: what it owed is
    /// not read off it).
    fn alive(&self, _i: usize) -> bool {
        true
    }
}

impl Streams for RangeStream {
    fn pick(&mut self) -> Result<usize, SourceError> {
        Ok(0)
    }

    fn stream(&mut self, _: usize) -> &mut RangeStream {
        self
    }
}

/// How a [`RemoteSource`] reads ahead of sequential reads (see `Window` for the mechanism).
///
/// Why these sizes ([`ReadaheadConfig::DEFAULT`]: 512 Ki-token chunks, 4 in flight):
/// - Link: 4 × 512 Ki = 2 Mi tokens are asked for ahead of the reader, 4 MiB of a `u16`
///   wire codec, about 34 ms of a 1 Gbit/s link. That covers the upstream agent producing a
///   chunk (a few ms), the round trip, and the consumer's pauses, so the link never waits;
///   and at 1+ MiB per answer the per-request cost (one 48-byte header, one flush) is noise.
/// - Memory: this process holds the window, at most one chunk plus the range being served
///   (512 Ki × 4 B = 2 MiB of decoded u32), and one chunk's payload (at most 2 MiB, often a
///   quarter of that). Answers in flight wait in socket buffers (kernel, bounded by TCP's
///   window whatever the count in flight) and on the upstream agent, which materialises one
///   range at a time (tokens and payload of one chunk: at most 4 MiB), or, compressing on its
///   worker pool, the chunks in flight (at most 2 Mi tokens: 8 MiB and their payloads). So
///   about 4 MiB per
///   remote source here and per session there: a blend of several remote sources stays far
///   under an agent's ~72 MiB RSS target. 1 Mi-token chunks would double that, and 16 Mi
///   (the agent's `MAX_RANGE_TOKENS`) would cost 128 MiB, for no more throughput.
///
/// The cost of being wrong is bounded too: at an epoch's end or any other jump, at most
/// `chunk_tokens × in_flight` tokens were asked for and are drained unused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadaheadConfig {
    /// Tokens per chunk request (at most [`MAX_RANGE_TOKENS`], what an agent serves in one
    /// range).
    pub chunk_tokens: u64,
    /// Chunk requests kept in flight ahead of the reader; 0 turns readahead off.
    pub in_flight: usize,
}

impl ReadaheadConfig {
    /// 512 Ki-token chunks, 4 in flight (see the type's docs for why).
    pub const DEFAULT: Self = ReadaheadConfig {
        chunk_tokens: 512 << 10,
        in_flight: 4,
    };
    /// Every read stop-and-wait.
    pub const OFF: Self = ReadaheadConfig {
        in_flight: 0,
        ..Self::DEFAULT
    };
}

impl Default for ReadaheadConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Where the reads of a source stand, to tell sequential access from the rest.
#[derive(Default)]
pub(crate) struct Sequence {
    /// End of the last range read.
    pub(crate) last_end: Option<u64>,
    /// How many ranges in a row, up to the last one, went on from the one before.
    pub(crate) streak: u64,
}

impl Sequence {
    /// Whether `r` goes on from the last range read: it starts on that range's last token
    /// (packed samples share one: sample `i` is `[i * seq_len, (i + 1) * seq_len + 1)`) or
    /// right after it.
    pub(crate) fn continues(&self, r: &Range<u64>) -> bool {
        r.start < r.end
            && self
                .last_end
                .is_some_and(|e| r.start == e || r.start + 1 == e)
    }

    pub(crate) fn note(&mut self, r: &Range<u64>) {
        self.streak = if self.continues(r) {
            self.streak + 1
        } else {
            0
        };
        self.last_end = Some(r.end);
    }
}

/// How far [`read_ahead`] got: the leading ranges (and their tokens) it served.
pub(crate) struct Served {
    pub ranges: usize,
    pub tokens: usize,
}

/// Serves the leading ranges of `ranges` that go on from `seq` through the readahead
/// `window`, starting one when this read goes on from a range that itself went on from the
/// one before (a shuffled plan's reads line up like that by chance about once in (samples
/// per epoch)², and would pay for a whole window each time). When every range was served
/// the window is topped up, so the link stays busy while the consumer works; when the read
/// left the sequence the window is left in place, its answers still owed: the caller drains
/// or abandons it before asking anything else. The one readahead path of a single agent's
/// source and of a replicated one.
pub(crate) fn read_ahead(
    window: &mut Option<Window>,
    seq: &mut Sequence,
    s: &mut dyn Streams,
    cfg: ReadaheadConfig,
    total: u64,
    ranges: &[Range<u64>],
    out: &mut [u32],
) -> Result<Served, SourceError> {
    let serves =
        |seq: &Sequence, r: &Range<u64>| cfg.in_flight > 0 && r.end <= total && seq.continues(r);
    if window.is_none() && seq.streak > 0 && ranges.first().is_some_and(|r| serves(seq, r)) {
        *window = Some(Window::new(ranges[0].start));
    }
    let mut served = Served {
        ranges: 0,
        tokens: 0,
    };
    let Some(w) = window else {
        return Ok(served);
    };
    while served.ranges < ranges.len() && serves(seq, &ranges[served.ranges]) {
        let r = &ranges[served.ranges];
        let n = (r.end - r.start) as usize;
        w.read(r, &mut out[served.tokens..served.tokens + n], s, cfg, total)?;
        seq.note(r);
        served.tokens += n;
        served.ranges += 1;
    }
    if served.ranges == ranges.len() {
        w.top_up(s, cfg, total);
    }
    Ok(served)
}

/// Sequential readahead: decoded tokens ahead of the reader, and the chunk requests in
/// flight beyond them.
///
/// Why: stop-and-wait (one request per read, then wait for its answer) leaves the link idle
/// while the agent produces each answer and while our consumer works on the last batch, so
/// over a NIC-bound link a chained agent falls well short of link rate. While reads go on
/// where the last one ended, this keeps up to `in_flight` requests of `chunk_tokens` queued
/// on the agent ahead of the reader: the agent produces and sends the next chunks while this
/// process decodes and its consumer packs, and the link never waits on either.
///
/// Bounded memory: `tokens` holds at most the range being served plus one chunk, since the
/// tokens before the range being served are dropped before a chunk is appended (reads only
/// go forward here). Answers not yet received wait in socket buffers, not in this process.
///
/// Why answers are drained: the agent answers requests strictly in order on one stream. A
/// read that leaves the sequence cannot just forget the requests in flight: their answers
/// come before the answer to anything asked next, so they are read and dropped first, or
/// every later read would get the wrong tokens. An error frame met while draining is that
/// read's error, as it would have been the read's own.
pub(crate) struct Window {
    /// The first token in `tokens`.
    start: u64,
    /// Decoded tokens from `start` on.
    tokens: Vec<u32>,
    /// Chunks asked for and not received yet, in request order: (first token, tokens, the
    /// stream asked).
    in_flight: VecDeque<(u64, u64, usize)>,
    /// The first token not asked for yet.
    next: u64,
    /// A chunk request that could not be sent. Reported only when the reader needs that
    /// chunk: the answers before it (often the agent's error frame, which says why the
    /// connection broke) are read first.
    send_error: Option<(usize, SourceError)>,
    /// The stream whose send or receive failed last.
    failed: Option<usize>,
}

impl Window {
    pub(crate) fn new(at: u64) -> Self {
        Window {
            start: at,
            tokens: Vec::new(),
            in_flight: VecDeque::new(),
            next: at,
            send_error: None,
            failed: None,
        }
    }

    fn end(&self) -> u64 {
        self.start + self.tokens.len() as u64
    }

    /// Asks for chunks until `in_flight` are outstanding or the dataset's end is asked for.
    pub(crate) fn top_up(&mut self, s: &mut dyn Streams, cfg: ReadaheadConfig, total: u64) {
        while self.send_error.is_none() && self.in_flight.len() < cfg.in_flight && self.next < total
        {
            let len = cfg.chunk_tokens.min(total - self.next);
            let i = match s.pick() {
                Ok(i) => i,
                // No stream can take it: the reader learns why when it needs the chunk.
                Err(e) => {
                    self.send_error = Some((usize::MAX, e));
                    return;
                }
            };
            match s.stream(i).send(&[(self.next, len)]) {
                Ok(()) => {
                    self.in_flight.push_back((self.next, len, i));
                    self.next += len;
                }
                Err(e) => self.send_error = Some((i, e)),
            }
        }
    }

    /// The stream whose failure the last error came from, if a stream failed.
    pub(crate) fn failed_stream(&self) -> Option<usize> {
        self.failed.filter(|&i| i != usize::MAX)
    }

    /// Copies the tokens of `r` into `out`, receiving chunks until the window holds them.
    /// `r` must not start before the window nor end past `total`.
    pub(crate) fn read(
        &mut self,
        r: &Range<u64>,
        out: &mut [u32],
        s: &mut dyn Streams,
        cfg: ReadaheadConfig,
        total: u64,
    ) -> Result<(), SourceError> {
        debug_assert!(self.start <= r.start && r.start <= self.end() && r.end <= total);
        while self.end() < r.end {
            self.top_up(s, cfg, total);
            let Some((start, len, i)) = self.in_flight.pop_front() else {
                return Err(match self.send_error.take() {
                    Some((i, e)) => {
                        self.failed = Some(i);
                        e
                    }
                    None => SourceError::Usage(format!(
                        "readahead: nothing in flight for tokens {}..{}",
                        r.start, r.end
                    )),
                });
            };
            debug_assert_eq!(start, self.end());
            // No later read needs the tokens before `r` (reads here only go forward).
            let consumed = (r.start.saturating_sub(self.start) as usize).min(self.tokens.len());
            self.tokens.drain(..consumed);
            self.start += consumed as u64;
            let at = self.tokens.len();
            self.tokens.resize(at + len as usize, 0);
            if let Err(e) = s.stream(i).recv(start, len, Some(&mut self.tokens[at..])) {
                self.failed = Some(i);
                return Err(e);
            }
        }
        let a = (r.start - self.start) as usize;
        out.copy_from_slice(&self.tokens[a..a + out.len()]);
        Ok(())
    }

    /// Reads and drops the answers still in flight, leaving the streams at a request
    /// boundary.
    pub(crate) fn drain(&mut self, s: &mut dyn Streams) -> Result<(), SourceError> {
        while let Some((start, len, i)) = self.in_flight.pop_front() {
            if !s.alive(i) {
                continue;
            }
            if let Err(e) = s.stream(i).recv(start, len, None) {
                self.failed = Some(i);
                return Err(e);
            }
        }
        Ok(())
    }
}
