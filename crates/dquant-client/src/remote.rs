//! Talking to an agent: the control plane (gRPC, through a small shared runtime) and the data
//! plane (a blocking TCP stream of frames).
//!
//! The host API is blocking (`read(fd, buf)`), and trainers call it from threads that may or
//! may not run an async runtime of their own. Control calls therefore run on one private
//! tokio runtime and the caller waits on a plain channel, which works from any thread; the
//! data plane is plain blocking sockets, where the bytes are.

use std::collections::VecDeque;
use std::future::Future;
use std::net::{TcpStream, ToSocketAddrs};
use std::ops::Range;
use std::sync::Mutex;
use std::time::Duration;

use dquant_codec::{Codec, Decoder};
use dquant_proto::v1::agent_client::AgentClient;
use dquant_proto::v1::{
    CloseRequest, DatasetStat, ListEntry, ListRequest, OpenReply, OpenRequest, OpenSourceRequest,
    StatRequest,
};
use dquant_transport::record::{encode_request, MAX_RANGE_TOKENS};
use dquant_transport::{FrameKind, FrameWriter, Hello, RangeHeader, RecordReader, WireError};
use tonic::transport::{Channel, Endpoint};

use crate::source::{SourceError, TokenSource};

/// How batches of an offloaded plan reach this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Frames over the agent's TCP data port (any host).
    Tcp,
    /// A shared-memory ring this process creates and hands to the agent over its Unix socket
    /// (same host only): batches land in the ring in the output dtype and are read in place.
    Shm,
}

/// An agent's address, from one of:
/// - `dquant://HOST:PORT[/DATASET]`, over TCP;
/// - `unix:PATH`, `unix://PATH` or a plain path (`/run/dquant.sock`, `./agent.sock`): the
///   agent's Unix socket, on this host; offloaded plans then use a shared-memory ring.
///
/// Either may end in options, `?transport=shm|tcp&verify=true|false&slots=N`:
/// `transport` overrides the default above (`shm` with a TCP address needs the agent to
/// have a Unix socket on this host; `tcp` with a path uses the agent's data port on
/// loopback); `verify` has the agent compute, and this process check, each ring batch's
/// crc32c (default false: see [`dquant_transport::ring::RingConsumer::create_with`]);
/// `slots` sizes the ring (default:
/// [`crate::shm::default_slots`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentUri {
    /// `HOST:PORT`, or the socket path for a Unix-socket agent.
    pub authority: String,
    /// The dataset name after the authority (`root/path`), empty if none.
    pub dataset: String,
    /// The `transport` option, when given.
    pub transport: Option<Transport>,
    /// The `verify` option.
    pub verify: bool,
    /// The `slots` option, when given.
    pub slots: Option<u32>,
}

impl AgentUri {
    pub const SCHEME: &'static str = "dquant://";
    pub const UNIX_SCHEME: &'static str = "unix:";

    /// Parses an agent address (see the type's docs for the forms).
    pub fn parse(uri: &str) -> Result<Self, String> {
        let (addr, query) = uri.split_once('?').unwrap_or((uri, ""));
        let mut me = if let Some(rest) = addr.strip_prefix(Self::SCHEME) {
            let (authority, dataset) = rest.split_once('/').unwrap_or((rest, ""));
            let port_ok = authority
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !port_ok {
                return Err(format!(
                    "{uri:?}: the agent address must be HOST:PORT (e.g. dquant://127.0.0.1:7878)"
                ));
            }
            Self::new(authority, dataset.trim_end_matches('/'))
        } else if let Some(rest) = addr.strip_prefix(Self::UNIX_SCHEME) {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if path.is_empty() {
                return Err(format!(
                    "{uri:?}: the Unix socket path is empty (e.g. unix:/run/dquant.sock)"
                ));
            }
            Self::new(path, "")
        } else if addr.starts_with('/') || addr.starts_with("./") || addr.starts_with("../") {
            Self::new(addr, "")
        } else {
            return Err(format!(
                "{uri:?} is not an agent address (expected dquant://HOST:PORT[/DATASET], or a Unix socket path such as unix:/run/dquant.sock)"
            ));
        };
        for kv in query.split('&').filter(|kv| !kv.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            let bad = || format!("{uri:?}: option {k}={v:?} is not valid");
            match k {
                "transport" => {
                    me.transport = Some(match v {
                        "shm" => Transport::Shm,
                        "tcp" => Transport::Tcp,
                        _ => return Err(format!("{}; use shm or tcp", bad())),
                    })
                }
                "verify" => {
                    me.verify = match v {
                        "true" | "1" => true,
                        "false" | "0" => false,
                        _ => return Err(format!("{}; use true or false", bad())),
                    }
                }
                "slots" => {
                    me.slots = Some(
                        v.parse()
                            .ok()
                            .filter(|&n| (2..=4096).contains(&n))
                            .ok_or_else(|| format!("{}; use 2 to 4096", bad()))?,
                    )
                }
                _ => {
                    return Err(format!(
                        "{uri:?}: unknown option {k:?} (known: transport, verify, slots)"
                    ))
                }
            }
        }
        Ok(me)
    }

    fn new(authority: &str, dataset: &str) -> Self {
        AgentUri {
            authority: authority.to_string(),
            dataset: dataset.to_string(),
            transport: None,
            verify: false,
            slots: None,
        }
    }

    /// Whether the agent is addressed by its Unix socket.
    pub fn is_unix(&self) -> bool {
        is_unix_authority(&self.authority)
    }

    /// The transport offloaded plans use: the `transport` option, else `shm` for a Unix
    /// socket and `tcp` otherwise.
    pub fn transport(&self) -> Transport {
        self.transport.unwrap_or(if self.is_unix() {
            Transport::Shm
        } else {
            Transport::Tcp
        })
    }

    /// The host part, without the port (brackets kept for IPv6); loopback for a Unix-socket
    /// agent (its TCP data port is on this host).
    pub fn host(&self) -> &str {
        host_of(&self.authority)
    }
}

/// Unix socket authorities are paths; TCP ones are `HOST:PORT`.
fn is_unix_authority(authority: &str) -> bool {
    authority.contains('/')
}

fn host_of(authority: &str) -> &str {
    if is_unix_authority(authority) {
        return "127.0.0.1";
    }
    authority.rsplit_once(':').map_or(authority, |(h, _)| h)
}

/// The control plane's runtime, one per process. Per process, not per program: a forked
/// child (a PyTorch DataLoader worker) inherits the parent's runtime without its threads, and
/// would wait forever on it, so a child builds its own. The parent's is leaked in the child:
/// dropping it there would wait for threads that do not exist.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: Mutex<Option<(u32, &'static tokio::runtime::Runtime)>> = Mutex::new(None);
    let pid = std::process::id();
    let mut rt = RT.lock().unwrap_or_else(|e| e.into_inner());
    match *rt {
        Some((owner, r)) if owner == pid => r,
        _ => {
            let r: &'static _ = Box::leak(Box::new(
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("dquant-control")
                    .enable_all()
                    .build()
                    .expect("the control-plane runtime starts (threads and timers are available)"),
            ));
            *rt = Some((pid, r));
            r
        }
    }
}

/// Runs `f` on the control runtime and waits for it, from any thread.
fn call<F>(f: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime().spawn(async move {
        let _ = tx.send(f.await);
    });
    rx.recv()
        .expect("control calls complete: the runtime outlives them")
}

/// An error and every cause under it, joined: tonic's top-level transport errors alone say
/// only "transport error".
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

/// An agent's refusal: [`SourceError::NotFound`] for a dataset it does not have, else
/// [`SourceError::Agent`].
fn status_error(s: tonic::Status) -> SourceError {
    if s.code() == tonic::Code::NotFound {
        SourceError::NotFound(s.message().to_string())
    } else {
        SourceError::Agent(status_message(s))
    }
}

fn status_message(s: tonic::Status) -> String {
    if s.code() == tonic::Code::Unavailable || s.code() == tonic::Code::Unknown {
        chain(&s)
    } else {
        s.message().to_string()
    }
}

/// A control-plane connection to one agent.
#[derive(Clone)]
pub struct Control {
    authority: String,
    client: AgentClient<Channel>,
}

impl Control {
    /// Connects to the agent at `HOST:PORT`, or at its Unix socket path (any authority
    /// with a `/`).
    pub fn connect(authority: &str) -> Result<Self, SourceError> {
        let err = |reason: String| SourceError::Connect {
            addr: authority.to_string(),
            source: std::io::Error::other(reason),
        };
        let ch = if is_unix_authority(authority) {
            // tonic dials TCP itself; for a Unix socket it takes a connector, and the URI
            // below is only the HTTP/2 :authority, never resolved.
            let path = std::path::PathBuf::from(authority);
            let ep =
                Endpoint::from_static("http://localhost").connect_timeout(Duration::from_secs(10));
            call(async move {
                ep.connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                    let path = path.clone();
                    async move {
                        let s = tokio::net::UnixStream::connect(path).await?;
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
                    }
                }))
                .await
            })
            .map_err(|e| err(chain(&e)))?
        } else {
            let ep = Endpoint::from_shared(format!("http://{authority}"))
                .map_err(|e| err(chain(&e)))?
                .connect_timeout(Duration::from_secs(10));
            call(async move { ep.connect().await }).map_err(|e| err(chain(&e)))?
        };
        Ok(Control {
            authority: authority.to_string(),
            client: AgentClient::new(ch),
        })
    }

    pub fn authority(&self) -> &str {
        &self.authority
    }

    pub fn list(&self, root: &str) -> Result<Vec<ListEntry>, SourceError> {
        let mut c = self.client.clone();
        let req = ListRequest { root: root.into() };
        call(async move { c.list(req).await })
            .map(|r| r.into_inner().entries)
            .map_err(status_error)
    }

    pub fn stat(&self, req: StatRequest) -> Result<DatasetStat, SourceError> {
        let mut c = self.client.clone();
        call(async move { c.stat(req).await })
            .map(|r| r.into_inner())
            .map_err(status_error)
    }

    pub fn open(&self, req: OpenRequest) -> Result<OpenReply, SourceError> {
        let mut c = self.client.clone();
        call(async move { c.open(req).await })
            .map(|r| r.into_inner())
            .map_err(status_error)
    }

    pub fn open_source(&self, req: OpenSourceRequest) -> Result<OpenReply, SourceError> {
        let mut c = self.client.clone();
        call(async move { c.open_source(req).await })
            .map(|r| r.into_inner())
            .map_err(status_error)
    }

    /// Ends `session` on the agent. Bounded by a short timeout: readers call this while
    /// being dropped, and an unreachable agent must not hang them (it frees the session
    /// anyway when the data connection closes).
    pub fn close(&self, session: u64) -> Result<bool, SourceError> {
        let mut c = self.client.clone();
        let r = call(async move {
            tokio::time::timeout(Duration::from_secs(2), c.close(CloseRequest { session })).await
        });
        match r {
            Ok(r) => r.map(|r| r.into_inner().existed).map_err(status_error),
            Err(_) => Err(SourceError::Agent(format!(
                "agent {}: no answer to Close within 2 s",
                self.authority
            ))),
        }
    }

    /// Opens the data connection for a session `Open`/`OpenSource` created and says hello.
    pub fn connect_data(
        &self,
        reply: &OpenReply,
    ) -> Result<(FrameWriter<TcpStream>, RecordReader<TcpStream>), SourceError> {
        let addr = format!("{}:{}", host_of(&self.authority), reply.data_port);
        let err = |source| SourceError::Connect {
            addr: addr.clone(),
            source,
        };
        let sa = addr
            .to_socket_addrs()
            .map_err(err)?
            .next()
            .ok_or_else(|| err(std::io::ErrorKind::NotFound.into()))?;
        let s = TcpStream::connect_timeout(&sa, Duration::from_secs(10)).map_err(err)?;
        s.set_nodelay(true).map_err(err)?;
        let hello = hello_of(reply)?;
        let mut w = FrameWriter::new(s.try_clone().map_err(err)?);
        w.send(FrameKind::Data, &hello.encode())?;
        w.flush()?;
        Ok((w, RecordReader::new(s)))
    }
}

/// The hello a session's data connection (or ring hand-over) presents.
pub(crate) fn hello_of(reply: &OpenReply) -> Result<Hello, SourceError> {
    let ticket: [u8; 16] = reply.ticket.as_slice().try_into().map_err(|_| {
        SourceError::Agent(format!(
            "agent sent a {}-byte ticket, expected 16",
            reply.ticket.len()
        ))
    })?;
    Ok(Hello {
        session: reply.session,
        ticket,
    })
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
///   range at a time (tokens and payload of one chunk: at most 4 MiB). So about 4 MiB per
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

/// A dataset served by another agent, read by token ranges over its data plane.
///
/// Reads that jump around (shuffled plans) are stop-and-wait: one request carries every range
/// of a read, so a batch costs one round trip per source. Reads that go on where the last one
/// ended (unshuffled plans: each sample starts on the last token of the one before) are
/// served from a readahead `Window` that keeps chunk requests in flight, so the link stays
/// busy; see [`ReadaheadConfig`].
pub struct RemoteSource {
    control: Control,
    session: u64,
    tokens: u64,
    max_token: u32,
    stream: DataStream,
    readahead: ReadaheadConfig,
    seq: Sequence,
    /// Present while reading ahead.
    window: Option<Window>,
    /// Why the data stream is unusable: after any failed read, the answers still on it are
    /// unknown, so later reads refuse rather than return the wrong tokens.
    failed: Option<String>,
    pairs: Vec<(u64, u64)>,
}

impl RemoteSource {
    /// Opens `dataset` (`root/path`) on the agent `control` talks to.
    pub fn open(
        control: Control,
        dataset: StatRequest,
        wire_codec: &str,
    ) -> Result<Self, SourceError> {
        let reply = control.open_source(OpenSourceRequest {
            dataset: Some(dataset),
            wire_codec: wire_codec.into(),
        })?;
        let tokens = reply.stat.as_ref().map_or(0, |s| s.tokens);
        let max_token = reply
            .stat
            .as_ref()
            .and_then(|s| s.stored_max_token)
            .unwrap_or(u32::MAX);
        let (writer, reader) = control.connect_data(&reply)?;
        Ok(RemoteSource {
            session: reply.session,
            control,
            tokens,
            max_token,
            stream: DataStream {
                writer,
                reader,
                decoder: Decoder::new(),
                request: Vec::new(),
                payload: Vec::new(),
                requests: 0,
                requested_tokens: 0,
            },
            readahead: ReadaheadConfig::DEFAULT,
            seq: Sequence::default(),
            window: None,
            failed: None,
            pairs: Vec::new(),
        })
    }

    pub fn session(&self) -> u64 {
        self.session
    }

    pub fn control(&self) -> &Control {
        &self.control
    }

    /// Sets how this source reads ahead, from the next read on (`chunk_tokens` is clamped
    /// to 1..=[`MAX_RANGE_TOKENS`]). With `in_flight` 0, the next read drains what is in
    /// flight and every read after it is stop-and-wait.
    pub fn set_readahead(&mut self, mut config: ReadaheadConfig) {
        config.chunk_tokens = config.chunk_tokens.clamp(1, MAX_RANGE_TOKENS);
        self.readahead = config;
    }

    pub fn readahead(&self) -> ReadaheadConfig {
        self.readahead
    }

    /// Range requests sent to the agent so far (one per round trip when stop-and-wait; one
    /// per chunk when reading ahead).
    pub fn requests(&self) -> u64 {
        self.stream.requests
    }

    /// Tokens asked of the agent so far, read ahead or not (chunks drained unused included).
    pub fn requested_tokens(&self) -> u64 {
        self.stream.requested_tokens
    }

    fn read(&mut self, ranges: &[Range<u64>], out: &mut [u32]) -> Result<(), SourceError> {
        let total = self.tokens;
        let cfg = self.readahead;
        let serves = |seq: &Sequence, r: &Range<u64>| {
            cfg.in_flight > 0 && r.end <= total && seq.continues(r)
        };
        // Start reading ahead only when this read goes on from a range that itself went on
        // from the one before: a shuffled plan's reads line up like that by chance about
        // once in (samples per epoch)², and would pay for a whole window each time.
        if self.window.is_none()
            && self.seq.streak > 0
            && ranges.first().is_some_and(|r| serves(&self.seq, r))
        {
            self.window = Some(Window::new(ranges[0].start));
        }
        let mut at = 0;
        let mut done = 0;
        if let Some(w) = &mut self.window {
            while done < ranges.len() && serves(&self.seq, &ranges[done]) {
                let r = &ranges[done];
                let n = (r.end - r.start) as usize;
                w.read(r, &mut out[at..at + n], &mut self.stream, cfg, total)?;
                self.seq.note(r);
                at += n;
                done += 1;
            }
            if done == ranges.len() {
                // Keep the pipeline full while the consumer works on these tokens.
                w.top_up(&mut self.stream, cfg, total);
            } else if let Some(w) = self.window.take() {
                // The read left the sequence: what is in flight is of no use, but its
                // answers are on the stream ahead of any new one.
                w.drain(&mut self.stream)?;
            }
        }
        // Stop-and-wait for the rest.
        let mut ranges = &ranges[done..];
        while !ranges.is_empty() {
            let (chunk, rest) = ranges.split_at(
                ranges
                    .len()
                    .min(dquant_transport::record::MAX_REQUEST_RANGES),
            );
            self.pairs.clear();
            self.pairs
                .extend(chunk.iter().map(|r| (r.start, r.end - r.start)));
            self.stream.send(&self.pairs)?;
            for r in chunk {
                let n = (r.end - r.start) as usize;
                self.stream
                    .recv(r.start, r.end - r.start, Some(&mut out[at..at + n]))?;
                self.seq.note(r);
                at += n;
            }
            ranges = rest;
        }
        Ok(())
    }
}

impl TokenSource for RemoteSource {
    fn tokens(&self) -> u64 {
        self.tokens
    }

    fn max_token_bound(&self) -> u32 {
        self.max_token
    }

    fn read_ranges(&mut self, ranges: &[Range<u64>], out: &mut [u32]) -> Result<(), SourceError> {
        let total: u64 = ranges.iter().map(|r| r.end.saturating_sub(r.start)).sum();
        if total != out.len() as u64 || ranges.iter().any(|r| r.end < r.start) {
            return Err(SourceError::Usage(
                "read_ranges: the buffer does not match the ranges".into(),
            ));
        }
        if let Some(why) = &self.failed {
            return Err(SourceError::Agent(format!(
                "agent {}: the data stream of session {} failed earlier ({why}); reopen the source",
                self.control.authority(),
                self.session
            )));
        }
        let r = self.read(ranges, out);
        if let Err(e) = &r {
            self.failed = Some(e.to_string());
            self.window = None;
        }
        r
    }
}

/// The data connection of a source session: requests out, range records back, in order.
struct DataStream {
    writer: FrameWriter<TcpStream>,
    reader: RecordReader<TcpStream>,
    decoder: Decoder,
    request: Vec<u8>,
    payload: Vec<u8>,
    requests: u64,
    requested_tokens: u64,
}

impl DataStream {
    /// Sends one request for `pairs` (first token, tokens), at most `MAX_REQUEST_RANGES`.
    fn send(&mut self, pairs: &[(u64, u64)]) -> Result<(), SourceError> {
        self.request.clear();
        encode_request(pairs, &mut self.request);
        self.writer.send(FrameKind::Data, &self.request)?;
        self.writer.flush()?;
        self.requests += 1;
        self.requested_tokens += pairs.iter().map(|p| p.1).sum::<u64>();
        Ok(())
    }

    /// Receives the next range record, which must be `len` tokens from `start`, and decodes
    /// it into `out` (`len` tokens), or reads past it when `out` is `None`. An error frame
    /// from the agent comes back as `WireError::Remote`, its message verbatim.
    fn recv(&mut self, start: u64, len: u64, out: Option<&mut [u32]>) -> Result<(), SourceError> {
        let Some(hb) = self.reader.next_header()? else {
            return Err(WireError::EndInRecord("range response").into());
        };
        let h = RangeHeader::parse(&hb).map_err(WireError::from)?;
        if h.start != start || h.len != len {
            return Err(SourceError::Agent(format!(
                "agent answered range {}+{} for request {}..{}",
                h.start,
                h.len,
                start,
                start + len
            )));
        }
        check_payload_len(h.codec, h.len as usize, h.payload_len)?;
        self.payload.resize(h.payload_len as usize, 0);
        self.reader.read_exact(&mut self.payload, "range payload")?;
        if let Some(out) = out {
            self.decoder
                .decode(h.codec, &self.payload, out)
                .map_err(|e| e.at_base(start))?;
        }
        Ok(())
    }
}

/// Where the reads of a source stand, to tell sequential access from the rest.
#[derive(Default)]
struct Sequence {
    /// End of the last range read.
    last_end: Option<u64>,
    /// How many ranges in a row, up to the last one, went on from the one before.
    streak: u64,
}

impl Sequence {
    /// Whether `r` goes on from the last range read: it starts on that range's last token
    /// (packed samples share one: sample `i` is `[i * seq_len, (i + 1) * seq_len + 1)`) or
    /// right after it.
    fn continues(&self, r: &Range<u64>) -> bool {
        r.start < r.end
            && self
                .last_end
                .is_some_and(|e| r.start == e || r.start + 1 == e)
    }

    fn note(&mut self, r: &Range<u64>) {
        self.streak = if self.continues(r) {
            self.streak + 1
        } else {
            0
        };
        self.last_end = Some(r.end);
    }
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
struct Window {
    /// The first token in `tokens`.
    start: u64,
    /// Decoded tokens from `start` on.
    tokens: Vec<u32>,
    /// Chunks asked for and not received yet, in request order: (first token, tokens).
    in_flight: VecDeque<(u64, u64)>,
    /// The first token not asked for yet.
    next: u64,
    /// A chunk request that could not be sent. Reported only when the reader needs that
    /// chunk: the answers before it (often the agent's error frame, which says why the
    /// connection broke) are read first.
    send_error: Option<SourceError>,
}

impl Window {
    fn new(at: u64) -> Self {
        Window {
            start: at,
            tokens: Vec::new(),
            in_flight: VecDeque::new(),
            next: at,
            send_error: None,
        }
    }

    fn end(&self) -> u64 {
        self.start + self.tokens.len() as u64
    }

    /// Asks for chunks until `in_flight` are outstanding or the dataset's end is asked for.
    fn top_up(&mut self, s: &mut DataStream, cfg: ReadaheadConfig, total: u64) {
        while self.send_error.is_none() && self.in_flight.len() < cfg.in_flight && self.next < total
        {
            let len = cfg.chunk_tokens.min(total - self.next);
            match s.send(&[(self.next, len)]) {
                Ok(()) => {
                    self.in_flight.push_back((self.next, len));
                    self.next += len;
                }
                Err(e) => self.send_error = Some(e),
            }
        }
    }

    /// Copies the tokens of `r` into `out`, receiving chunks until the window holds them.
    /// `r` must not start before the window nor end past `total`.
    fn read(
        &mut self,
        r: &Range<u64>,
        out: &mut [u32],
        s: &mut DataStream,
        cfg: ReadaheadConfig,
        total: u64,
    ) -> Result<(), SourceError> {
        debug_assert!(self.start <= r.start && r.start <= self.end() && r.end <= total);
        while self.end() < r.end {
            self.top_up(s, cfg, total);
            let Some((start, len)) = self.in_flight.pop_front() else {
                return Err(self.send_error.take().unwrap_or_else(|| {
                    SourceError::Usage(format!(
                        "readahead: nothing in flight for tokens {}..{}",
                        r.start, r.end
                    ))
                }));
            };
            debug_assert_eq!(start, self.end());
            // No later read needs the tokens before `r` (reads here only go forward).
            let consumed = (r.start.saturating_sub(self.start) as usize).min(self.tokens.len());
            self.tokens.drain(..consumed);
            self.start += consumed as u64;
            let at = self.tokens.len();
            self.tokens.resize(at + len as usize, 0);
            s.recv(start, len, Some(&mut self.tokens[at..]))?;
        }
        let a = (r.start - self.start) as usize;
        out.copy_from_slice(&self.tokens[a..a + out.len()]);
        Ok(())
    }

    /// Reads and drops the answers still in flight, leaving the stream at a request boundary.
    fn drain(mut self, s: &mut DataStream) -> Result<(), SourceError> {
        while let Some((start, len)) = self.in_flight.pop_front() {
            s.recv(start, len, None)?;
        }
        Ok(())
    }
}

impl Drop for RemoteSource {
    fn drop(&mut self) {
        // Closing the socket ends the session on the agent; say so explicitly too, but do not
        // wait on an agent that may be gone.
        let _ = self
            .stream
            .writer
            .get_ref()
            .shutdown(std::net::Shutdown::Both);
    }
}

/// Refuses a payload length no encoding of `tokens` tokens could have (a corrupt or hostile
/// peer must not make us allocate gigabytes).
pub(crate) fn check_payload_len(
    codec: Codec,
    tokens: usize,
    payload_len: u32,
) -> Result<(), SourceError> {
    let raw = codec.raw_len(tokens);
    let bound = raw + raw / 16 + 4096;
    if payload_len as usize > bound {
        return Err(SourceError::Agent(format!(
            "agent sent a {payload_len}-byte payload for {tokens} tokens of {codec} (at most {bound} expected)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_uris_parse() {
        let u = AgentUri::parse("dquant://127.0.0.1:7878/corpus/a/b").unwrap();
        assert_eq!(u.authority, "127.0.0.1:7878");
        assert_eq!(u.dataset, "corpus/a/b");
        assert_eq!(u.host(), "127.0.0.1");
        assert_eq!(u.transport(), Transport::Tcp);
        assert!(!u.verify);
        assert_eq!(AgentUri::parse("dquant://h:1").unwrap().dataset, "");
        assert_eq!(
            AgentUri::parse("dquant://nohost/x").unwrap_err(),
            "\"dquant://nohost/x\": the agent address must be HOST:PORT (e.g. dquant://127.0.0.1:7878)"
        );
        // Unix sockets, in each spelling: shared memory by default.
        for s in ["/run/dq.sock", "unix:/run/dq.sock", "unix:///run/dq.sock"] {
            let u = AgentUri::parse(s).unwrap();
            assert_eq!(u.authority, "/run/dq.sock", "{s}");
            assert_eq!(u.transport(), Transport::Shm, "{s}");
            assert_eq!(u.host(), "127.0.0.1");
        }
        assert_eq!(AgentUri::parse("./a.sock").unwrap().authority, "./a.sock");
        let u = AgentUri::parse("dquant://h:1?transport=shm&verify=true&slots=16").unwrap();
        assert_eq!(
            (u.transport(), u.verify, u.slots, u.authority.as_str()),
            (Transport::Shm, true, Some(16), "h:1")
        );
        let u = AgentUri::parse("/s?transport=tcp&verify=0").unwrap();
        assert_eq!((u.transport(), u.verify), (Transport::Tcp, false));
        assert_eq!(
            AgentUri::parse("data/x").unwrap_err(),
            "\"data/x\" is not an agent address (expected dquant://HOST:PORT[/DATASET], or a Unix socket path such as unix:/run/dquant.sock)"
        );
        assert_eq!(
            AgentUri::parse("unix:").unwrap_err(),
            "\"unix:\": the Unix socket path is empty (e.g. unix:/run/dquant.sock)"
        );
        assert_eq!(
            AgentUri::parse("/s?verify=maybe").unwrap_err(),
            "\"/s?verify=maybe\": option verify=\"maybe\" is not valid; use true or false"
        );
    }
}
