//! Talking to an agent: the control plane (gRPC, through a small shared runtime) and the data
//! plane (a blocking TCP stream of frames).
//!
//! The host API is blocking (`read(fd, buf)`), and trainers call it from threads that may or
//! may not run an async runtime of their own. Control calls therefore run on one private
//! tokio runtime and the caller waits on a plain channel, which works from any thread; the
//! data plane is plain blocking sockets, where the bytes are.

use std::future::Future;
use std::net::{TcpStream, ToSocketAddrs};
use std::ops::Range;
use std::sync::OnceLock;
use std::time::Duration;

use dquant_codec::{Codec, Decoder};
use dquant_proto::v1::agent_client::AgentClient;
use dquant_proto::v1::{
    CloseRequest, DatasetStat, ListEntry, ListRequest, OpenReply, OpenRequest, OpenSourceRequest,
    StatRequest,
};
use dquant_transport::record::{encode_request, RECORD_HEADER_LEN};
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

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("dquant-control")
            .enable_all()
            .build()
            .expect("the control-plane runtime starts (threads and timers are available)")
    })
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
            .map_err(|s| SourceError::Agent(status_message(s)))
    }

    pub fn stat(&self, req: StatRequest) -> Result<DatasetStat, SourceError> {
        let mut c = self.client.clone();
        call(async move { c.stat(req).await })
            .map(|r| r.into_inner())
            .map_err(|s| SourceError::Agent(status_message(s)))
    }

    pub fn open(&self, req: OpenRequest) -> Result<OpenReply, SourceError> {
        let mut c = self.client.clone();
        call(async move { c.open(req).await })
            .map(|r| r.into_inner())
            .map_err(|s| SourceError::Agent(status_message(s)))
    }

    pub fn open_source(&self, req: OpenSourceRequest) -> Result<OpenReply, SourceError> {
        let mut c = self.client.clone();
        call(async move { c.open_source(req).await })
            .map(|r| r.into_inner())
            .map_err(|s| SourceError::Agent(status_message(s)))
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
            Ok(r) => r
                .map(|r| r.into_inner().existed)
                .map_err(|s| SourceError::Agent(status_message(s))),
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

/// A dataset served by another agent, read by token ranges over its data plane. Requests
/// carry every range of a batch at once, so a batch costs one round trip per source.
pub struct RemoteSource {
    control: Control,
    session: u64,
    tokens: u64,
    max_token: u32,
    writer: FrameWriter<TcpStream>,
    reader: RecordReader<TcpStream>,
    decoder: Decoder,
    request: Vec<u8>,
    pairs: Vec<(u64, u64)>,
    payload: Vec<u8>,
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
            writer,
            reader,
            decoder: Decoder::new(),
            request: Vec::new(),
            pairs: Vec::new(),
            payload: Vec::new(),
        })
    }

    pub fn session(&self) -> u64 {
        self.session
    }

    pub fn control(&self) -> &Control {
        &self.control
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
        if total != out.len() as u64 {
            return Err(SourceError::Usage(
                "read_ranges: the buffer does not match the ranges".into(),
            ));
        }
        let mut at = 0;
        for chunk in ranges.chunks(dquant_transport::record::MAX_REQUEST_RANGES) {
            self.pairs.clear();
            self.pairs
                .extend(chunk.iter().map(|r| (r.start, r.end - r.start)));
            self.request.clear();
            encode_request(&self.pairs, &mut self.request);
            self.writer.send(FrameKind::Data, &self.request)?;
            self.writer.flush()?;
            for r in chunk {
                let mut hb = [0u8; RECORD_HEADER_LEN];
                match self.reader.next_header()? {
                    Some(h) => hb.copy_from_slice(&h),
                    None => return Err(WireError::EndInRecord("range response").into()),
                }
                let h = RangeHeader::parse(&hb).map_err(WireError::from)?;
                if h.start != r.start || h.len != r.end - r.start {
                    return Err(SourceError::Agent(format!(
                        "agent answered range {}+{} for request {}..{}",
                        h.start, h.len, r.start, r.end
                    )));
                }
                check_payload_len(h.codec, h.len as usize, h.payload_len)?;
                self.payload.resize(h.payload_len as usize, 0);
                self.reader.read_exact(&mut self.payload, "range payload")?;
                let n = h.len as usize;
                self.decoder
                    .decode(h.codec, &self.payload, &mut out[at..at + n])
                    .map_err(|e| e.at_base(r.start))?;
                at += n;
            }
        }
        Ok(())
    }
}

impl Drop for RemoteSource {
    fn drop(&mut self) {
        // Closing the socket ends the session on the agent; say so explicitly too, but do not
        // wait on an agent that may be gone.
        let _ = self.writer.get_ref().shutdown(std::net::Shutdown::Both);
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
