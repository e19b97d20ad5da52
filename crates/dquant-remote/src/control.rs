//! The control plane client: gRPC calls to an agent on the process's one runtime, and the
//! data connection a session's `Open` reply leads to.
//!
//! The host API is blocking (`read(fd, buf)`), and trainers call it from threads that may or
//! may not run an async runtime of their own. Control calls therefore run on the process's
//! runtime (`dquant-runtime`) and the caller waits with [`run`], which works from any thread;
//! the data plane is plain blocking sockets, where the bytes are.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use dquant_proto::v1::agent_client::AgentClient;
use dquant_proto::v1::{
    CloseRequest, DatasetStat, IndexRequest, ListEntry, ListRequest, OpenMegatronReply,
    OpenMegatronRequest, OpenReply, OpenRequest, OpenSourceRequest, StatRequest, SubscribeRequest,
    WatchRequest,
};
use dquant_runtime::run;
use dquant_storage::SourceError;
use dquant_transport::record::MAX_TOKEN_LEN;
use dquant_transport::{
    tcp, ClientTls, ConnectError, DataStream, FrameWriter, Hello, RecordReader,
};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::uri::{host_of, is_unix_authority};

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

/// A status made here from a connection failure, as its message and the errors under it
/// (tonic's own `Display` of a status prints `code:`, `source:` and a `Debug` of the cause).
fn status_chain(s: &tonic::Status) -> String {
    match std::error::Error::source(s) {
        Some(cause) => {
            let under = chain(cause);
            if under.contains(s.message()) {
                under
            } else {
                format!("{}: {under}", s.message())
            }
        }
        None => s.message().to_string(),
    }
}

/// An agent's refusal: [`SourceError::NotFound`] for a dataset it does not have, else
/// [`SourceError::Agent`].
fn status_error(s: tonic::Status, tls: bool) -> SourceError {
    if s.code() == tonic::Code::NotFound {
        SourceError::NotFound(s.message().to_string())
    } else {
        SourceError::Agent(status_message(s, tls))
    }
}

/// The agent's message, or for a failure of the connection itself (the agent never
/// answered) the whole error chain, with a TLS hint where it points that way.
fn status_message(s: tonic::Status, tls: bool) -> String {
    match connection_failed(&s) {
        true => tls_hint(status_chain(&s), tls),
        false => s.message().to_string(),
    }
}

/// Whether `s` says the connection failed, not the agent: the agent never answered.
fn connection_failed(s: &tonic::Status) -> bool {
    use tonic::Code::{Cancelled, Internal, Unavailable, Unknown};
    match s.code() {
        Unavailable | Unknown => true,
        // The connection closed under a call in flight, and hyper cancelled the call. A
        // status with a source was made here from a local error; the agent's own Cancelled
        // (a stopped request) has none.
        Cancelled => std::error::Error::source(s).is_some(),
        // h2's own protocol errors: the peer spoke something else than HTTP/2 (TLS).
        Internal => s.message().starts_with("h2 protocol error"),
        _ => false,
    }
}

/// How long a control call may wait for its answer, by default. Generous: an `Open` may
/// replay a blend to a far cursor, and the agent stops that at its own limit (60 s by
/// default) and answers.
pub const DEFAULT_RPC_TIMEOUT: Duration = Duration::from_secs(120);

/// A control-plane connection to one agent.
#[derive(Clone)]
pub struct Control {
    authority: String,
    client: AgentClient<Channel>,
    /// The same channel, for the standard gRPC health service.
    channel: Channel,
    /// Every call's deadline, and the data connections' read/write timeout: an agent that
    /// accepts and then stalls costs its caller this long, never a thread forever.
    timeout: Duration,
    /// `Bearer TOKEN`, sent with every call to an agent that serves tenants.
    token: Option<MetadataValue<Ascii>>,
    /// The token itself, for the data plane's hello.
    secret: Option<String>,
    /// TLS on both planes, when the agent is reached over TCP with a CA to trust.
    tls: Option<ClientTls>,
}

/// The agent's event feed, from [`Control::watch`].
pub struct Watch {
    rx: tokio::sync::mpsc::Receiver<Result<dquant_proto::v1::Event, SourceError>>,
}

impl Iterator for Watch {
    type Item = Result<dquant_proto::v1::Event, SourceError>;

    /// Blocks for the next event (never call it from inside an async runtime).
    fn next(&mut self) -> Option<Self::Item> {
        self.rx.blocking_recv()
    }
}

/// The environment variable clients take their tenant token from.
pub const TOKEN_ENV: &str = "DQUANT_TOKEN";
/// The environment variable naming the PEM file of CA certificates an agent's TLS
/// certificate must chain to. Set: every `dquant://` agent is reached over TLS.
pub const TLS_CA_ENV: &str = "DQUANT_TLS_CA";
/// The environment variable naming what agents' certificates must carry, when that is not
/// the host in the address (an agent dialed by IP with a certificate for its DNS name).
pub const TLS_NAME_ENV: &str = "DQUANT_TLS_NAME";

/// How a client proves itself to agents and checks them: a tenant token, and the TLS it
/// expects on TCP connections.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    pub token: Option<String>,
    pub tls: Option<ClientTls>,
}

impl Credentials {
    /// From `DQUANT_TOKEN`, `DQUANT_TLS_CA` and `DQUANT_TLS_NAME` (each unset or empty:
    /// none).
    pub fn from_env() -> Result<Self, SourceError> {
        let var = |k| std::env::var(k).ok().filter(|v: &String| !v.is_empty());
        let tls = match var(TLS_CA_ENV) {
            None => None,
            Some(ca) => Some(Self::tls(Path::new(&ca), var(TLS_NAME_ENV).as_deref())?),
        };
        Ok(Credentials {
            token: var(TOKEN_ENV),
            tls,
        })
    }

    /// TLS trusting the CA certificates in the PEM file `ca`, expecting `name` in agents'
    /// certificates when given (else the host dialed).
    pub fn tls(ca: &Path, name: Option<&str>) -> Result<ClientTls, SourceError> {
        let usage = |e: dquant_transport::TlsError| SourceError::Usage(e.to_string());
        let tls = ClientTls::from_ca_file(ca).map_err(usage)?;
        match name {
            Some(n) => tls.with_name(n).map_err(usage),
            None => Ok(tls),
        }
    }
}

/// Runs a control call under `timeout`; a call with no answer in time is an error naming
/// the agent and the call.
fn call_within<T: Send + 'static>(
    authority: &str,
    rpc: &str,
    timeout: Duration,
    tls: bool,
    f: impl Future<Output = Result<tonic::Response<T>, tonic::Status>> + Send + 'static,
) -> Result<T, SourceError> {
    match run(async move { tokio::time::timeout(timeout, f).await }) {
        Ok(r) => r.map(|r| r.into_inner()).map_err(|e| status_error(e, tls)),
        Err(_) => Err(SourceError::Agent(format!(
            "agent {authority}: no answer to {rpc} within {} s",
            timeout.as_secs_f64()
        ))),
    }
}

impl Control {
    /// Connects to the agent at `HOST:PORT`, or at its Unix socket path (any authority
    /// with a `/`), with the [`Credentials`] of the environment.
    pub fn connect(authority: &str) -> Result<Self, SourceError> {
        Self::connect_with(authority, DEFAULT_RPC_TIMEOUT, &Credentials::from_env()?)
    }

    /// Connects with `creds`, every call (and the connection itself) bounded by `timeout`
    /// (an agent dialing an upstream uses its own, shorter, limit).
    pub fn connect_with(
        authority: &str,
        timeout: Duration,
        creds: &Credentials,
    ) -> Result<Self, SourceError> {
        if authority.contains(',') && !is_unix_authority(authority) {
            return Err(SourceError::Usage(format!(
                "{authority}: one agent address is needed here; several (replicas of a \
                 dataset) are for plan sources, dquant://HOST1:PORT,HOST2:PORT/ROOT/PATH"
            )));
        }
        let tls = creds.tls.clone().filter(|_| !is_unix_authority(authority));
        let c = Self::dial(authority, timeout, tls)?;
        match &creds.token {
            Some(t) => c.with_token(t),
            None => Ok(c),
        }
    }

    /// Sends `token` (a tenant's) with every call. A token that cannot travel as a gRPC
    /// header (not printable ASCII) is an error here rather than a refusal there.
    pub fn with_token(mut self, token: &str) -> Result<Self, SourceError> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(SourceError::Usage(format!(
                "{TOKEN_ENV}: a token is at most {MAX_TOKEN_LEN} bytes (this one has {})",
                token.len()
            )));
        }
        let v = format!("Bearer {token}").parse().map_err(|_| {
            SourceError::Usage(format!(
                "{TOKEN_ENV}: a token must be printable ASCII without spaces at its ends"
            ))
        })?;
        self.token = Some(v);
        self.secret = Some(token.to_string());
        Ok(self)
    }

    /// `req` with the token, when there is one.
    fn request<T>(&self, req: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(req);
        if let Some(t) = &self.token {
            r.metadata_mut().insert("authorization", t.clone());
        }
        r
    }

    /// Opens the gRPC channel, over TLS when `tls` is given.
    fn dial(
        authority: &str,
        timeout: Duration,
        tls: Option<ClientTls>,
    ) -> Result<Self, SourceError> {
        let err = |reason: String| SourceError::Connect {
            addr: authority.to_string(),
            source: std::io::Error::other(reason),
        };
        let ch = if is_unix_authority(authority) {
            // tonic dials TCP itself; for a Unix socket it takes a connector, and the URI
            // below is only the HTTP/2 :authority, never resolved.
            let path = std::path::PathBuf::from(authority);
            let ep = Endpoint::from_static("http://localhost").connect_timeout(timeout);
            run(async move {
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
            let scheme = if tls.is_some() { "https" } else { "http" };
            let mut ep = Endpoint::from_shared(format!("{scheme}://{authority}"))
                .map_err(|e| err(chain(&e)))?
                .connect_timeout(timeout);
            if let Some(t) = &tls {
                let name = t.name_for(authority);
                let config = ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(t.ca_pem()))
                    .domain_name(name);
                ep = ep.tls_config(config).map_err(|e| err(chain(&e)))?;
            }
            run(async move { tokio::time::timeout(timeout, ep.connect()).await })
                .map_err(|_| err(format!("no connection within {} s", timeout.as_secs_f64())))?
                .map_err(|e| err(tls_hint(chain(&e), tls.is_some())))?
        };
        Ok(Control {
            authority: authority.to_string(),
            client: AgentClient::new(ch.clone()),
            channel: ch,
            timeout,
            token: None,
            secret: None,
            tls,
        })
    }

    /// The TLS this control connection uses (and its data connections will).
    pub fn tls(&self) -> Option<&ClientTls> {
        self.tls.as_ref()
    }

    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// Every call's deadline, and how long a data connection waits for its peer.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether the agent serves (`true`) or drains or is starting (`false`), from the
    /// standard gRPC health service (no token needed): what a readiness probe asks.
    pub fn serving(&self) -> Result<bool, SourceError> {
        use tonic_health::pb::health_check_response::ServingStatus;
        use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
        let mut c = HealthClient::new(self.channel.clone());
        let req = HealthCheckRequest {
            service: dquant_proto::v1::agent_server::SERVICE_NAME.into(),
        };
        let r = self.within("Health.Check", async move { c.check(req).await })?;
        Ok(r.status == ServingStatus::Serving as i32)
    }

    pub fn list(&self, root: &str) -> Result<Vec<ListEntry>, SourceError> {
        let mut c = self.client.clone();
        let req = self.request(ListRequest { root: root.into() });
        self.within("List", async move { c.list(req).await })
            .map(|r| r.entries)
    }

    pub fn stat(&self, req: StatRequest) -> Result<DatasetStat, SourceError> {
        let mut c = self.client.clone();
        let req = self.request(req);
        self.within("Stat", async move { c.stat(req).await })
    }

    pub fn open(&self, req: OpenRequest) -> Result<OpenReply, SourceError> {
        let mut c = self.client.clone();
        let req = self.request(req);
        self.within("Open", async move { c.open(req).await })
    }

    /// Joins a shared plan stream by name ([`SubscribeRequest`]).
    pub fn subscribe(&self, req: SubscribeRequest) -> Result<OpenReply, SourceError> {
        let mut c = self.client.clone();
        let req = self.request(req);
        self.within("Subscribe", async move { c.subscribe(req).await })
    }

    pub fn open_source(&self, req: OpenSourceRequest) -> Result<OpenReply, SourceError> {
        let mut c = self.client.clone();
        let req = self.request(req);
        self.within("OpenSource", async move { c.open_source(req).await })
    }

    /// Builds (or finds built) a Megatron-order config on the agent and opens its samples as a
    /// range session ([`OpenMegatronRequest`]). A build of a large corpus takes seconds; this
    /// call waits for it within the control timeout.
    pub fn open_megatron(
        &self,
        req: OpenMegatronRequest,
    ) -> Result<OpenMegatronReply, SourceError> {
        let mut c = self.client.clone();
        let req = self.request(req);
        self.within("OpenMegatron", async move { c.open_megatron(req).await })
    }

    /// One slice of a dataset's document index ([`IndexRequest`]), its checksum checked: the
    /// values, or an error that says which slice came back damaged.
    pub fn index(&self, req: IndexRequest) -> Result<Vec<u64>, SourceError> {
        let (start, count) = (req.start, req.count);
        let mut c = self.client.clone();
        let req = self.request(req);
        let reply = self.within("Index", async move { c.index(req).await })?;
        let crc = dquant_proto::index_crc(&reply.values);
        if crc != reply.crc32c || reply.values.len() > count as usize {
            return Err(SourceError::Agent(format!(
                "agent {}: index values {start}..{} arrived damaged ({} values, crc32c {crc:08x}, \
                 sent as {:08x})",
                self.authority,
                start + u64::from(count),
                reply.values.len(),
                reply.crc32c
            )));
        }
        Ok(reply.values)
    }

    /// The agent's event feed (`Watch`): its events in order, and a rate snapshot every
    /// `interval_ms` (0: the agent's default), as a blocking iterator. It ends when the agent
    /// goes away (with the error, if any, as its last item); dropping it ends the watch.
    pub fn watch(&self, interval_ms: u32) -> Result<Watch, SourceError> {
        let mut c = self.client.clone();
        let req = self.request(WatchRequest { interval_ms });
        let stream = self.within("Watch", async move { c.watch(req).await })?;
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        let tls = self.tls.is_some();
        dquant_runtime::handle().spawn(async move {
            let mut stream = stream;
            loop {
                let item = match stream.message().await {
                    Ok(Some(e)) => Ok(e),
                    Ok(None) => return,
                    Err(e) => Err(status_error(e, tls)),
                };
                let last = item.is_err();
                // Fails once the watch is dropped: the stream ends with it.
                if tx.send(item).await.is_err() || last {
                    return;
                }
            }
        });
        Ok(Watch { rx })
    }

    fn within<T: Send + 'static>(
        &self,
        rpc: &str,
        f: impl Future<Output = Result<tonic::Response<T>, tonic::Status>> + Send + 'static,
    ) -> Result<T, SourceError> {
        call_within(&self.authority, rpc, self.timeout, self.tls.is_some(), f)
    }

    /// Ends `session` on the agent, proving ownership with its ticket (the `OpenReply`'s).
    /// Bounded by a short timeout: readers call this while
    /// being dropped, and an unreachable agent must not hang them (it frees the session
    /// anyway when the data connection closes).
    pub fn close(&self, session: u64, ticket: &[u8]) -> Result<bool, SourceError> {
        let mut c = self.client.clone();
        let req = self.request(CloseRequest {
            session,
            ticket: ticket.to_vec(),
        });
        let close_timeout = self.timeout.min(Duration::from_secs(2));
        let tls = self.tls.is_some();
        call_within(&self.authority, "Close", close_timeout, tls, async move {
            c.close(req).await
        })
        .map(|r| r.existed)
    }

    /// Opens the data connection for a session `Open`/`OpenSource` created and says hello.
    /// Reads and writes on it time out after the control timeout: this is the connection of
    /// a range source, whose answers come promptly or not at all.
    pub fn connect_data(
        &self,
        reply: &OpenReply,
    ) -> Result<(FrameWriter<DataStream>, RecordReader<DataStream>), SourceError> {
        let (w, r) = tcp::connect(&self.data_addr(reply), &self.hello(reply)?, self.tls())
            .map_err(connect_error)?;
        let sock = w.get_ref().socket();
        let timeouts = sock
            .set_read_timeout(Some(self.timeout))
            .and_then(|()| sock.set_write_timeout(Some(self.timeout)));
        timeouts.map_err(|source| SourceError::Connect {
            addr: self.data_addr(reply),
            source,
        })?;
        Ok((w, r))
    }

    /// The TCP data plane of the agent that sent `reply`, `HOST:PORT`.
    pub fn data_addr(&self, reply: &OpenReply) -> String {
        format!("{}:{}", host_of(&self.authority), reply.data_port)
    }
}

/// `message` (a failed connect's) with what to check when TLS is the likely cause.
fn tls_hint(message: String, tls: bool) -> String {
    let hint = dquant_transport::tls::hint(&message, tls);
    message + hint
}

/// A data-plane connection error as a source error: unreachable, a broken stream, or what
/// the agent said.
pub fn connect_error(e: ConnectError) -> SourceError {
    match e {
        ConnectError::Connect { addr, source } => SourceError::Connect { addr, source },
        ConnectError::Wire(e) => SourceError::Wire(e),
        e => SourceError::Agent(e.to_string()),
    }
}

impl Control {
    /// The hello a session's data connection (or ring hand-over) presents: the session and
    /// ticket `reply` gave, and this connection's tenant token.
    pub fn hello(&self, reply: &OpenReply) -> Result<Hello, SourceError> {
        let ticket: [u8; 16] = reply.ticket.as_slice().try_into().map_err(|_| {
            SourceError::Agent(format!(
                "agent sent a {}-byte ticket, expected 16",
                reply.ticket.len()
            ))
        })?;
        Ok(Hello {
            session: reply.session,
            ticket,
            token: self.secret.clone(),
        })
    }
}
