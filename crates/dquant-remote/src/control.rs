//! The control plane client: gRPC calls to an agent through one small runtime per process,
//! and the data connection a session's `Open` reply leads to.
//!
//! The host API is blocking (`read(fd, buf)`), and trainers call it from threads that may or
//! may not run an async runtime of their own. Control calls therefore run on one private
//! tokio runtime and the caller waits on a plain channel, which works from any thread; the
//! data plane is plain blocking sockets, where the bytes are.

use std::future::Future;
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::Duration;

use dquant_engine::SourceError;
use dquant_proto::v1::agent_client::AgentClient;
use dquant_proto::v1::{
    CloseRequest, DatasetStat, ListEntry, ListRequest, OpenReply, OpenRequest, OpenSourceRequest,
    StatRequest,
};
use dquant_transport::{tcp, ConnectError, FrameWriter, Hello, RecordReader};
use tonic::transport::{Channel, Endpoint};

use crate::uri::{host_of, is_unix_authority};

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
        tcp::connect(&self.data_addr(reply), &hello_of(reply)?).map_err(connect_error)
    }

    /// The TCP data plane of the agent that sent `reply`, `HOST:PORT`.
    pub fn data_addr(&self, reply: &OpenReply) -> String {
        format!("{}:{}", host_of(&self.authority), reply.data_port)
    }
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

/// The hello a session's data connection (or ring hand-over) presents.
pub fn hello_of(reply: &OpenReply) -> Result<Hello, SourceError> {
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
