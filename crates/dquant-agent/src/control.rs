//! The control plane's server: the `dquant.v1.Agent` service behind its authenticating
//! interceptor, and the standard `grpc.health.v1.Health` service, on the TCP port and (when
//! configured) on the connections the Unix socket's router hands over. Health is not
//! authenticated: a load balancer or an orchestrator's probe has no tenant token. The TCP
//! port serves TLS when the agent has a certificate (`[tls]`); the Unix socket never does.

use std::net::TcpListener;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use tonic::transport::{Identity, ServerTlsConfig};
use tonic_health::pb::health_server::{Health, HealthServer};

use crate::{grpc, Shared};

/// The agent service's name, as health checks ask for it.
pub(crate) const SERVICE: &str = dquant_proto::v1::agent_server::SERVICE_NAME;

/// What the control plane serves, and on what.
pub(crate) struct Plane<H> {
    /// The process's runtime (`dquant-runtime`): the server runs on it, and so does the
    /// metrics exporter (if any), which stops when the server does.
    pub runtime: tokio::runtime::Handle,
    pub exporter: Option<tokio::task::AbortHandle>,
    pub listener: TcpListener,
    /// gRPC connections from the Unix socket's router.
    pub local: Option<tokio::sync::mpsc::UnboundedReceiver<UnixStream>>,
    pub shared: Arc<Shared>,
    pub health: HealthServer<H>,
    /// Flips to `true` to stop serving.
    pub stop: tokio::sync::watch::Receiver<bool>,
}

/// Why the control plane stopped serving before it was told to.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    #[error("the control listener: {0}")]
    Listen(#[source] std::io::Error),
    #[error("tls: {0}")]
    Tls(#[source] tonic::transport::Error),
    #[error("{0}")]
    Serve(#[from] tonic::transport::Error),
    #[error("the control plane thread panicked")]
    Panicked,
}

/// Serves `plane` on a thread of its own until told to stop (or a fatal error, returned).
pub(crate) fn spawn<H: Health>(
    plane: Plane<H>,
) -> std::io::Result<std::thread::JoinHandle<Result<(), ControlError>>> {
    plane.listener.set_nonblocking(true)?;
    std::thread::Builder::new()
        .name("dquant-control".into())
        .spawn(move || {
            let served = plane.runtime.block_on(serve(
                plane.listener,
                plane.local,
                plane.shared,
                plane.health,
                plane.stop,
            ));
            if let Some(exporter) = plane.exporter {
                exporter.abort();
            }
            served
        })
}

async fn serve<H: Health>(
    listener: TcpListener,
    local: Option<tokio::sync::mpsc::UnboundedReceiver<UnixStream>>,
    shared: Arc<Shared>,
    health: HealthServer<H>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(), ControlError> {
    let listener = tokio::net::TcpListener::from_std(listener).map_err(ControlError::Listen)?;
    // Nagle off on the control connections: an Open must not wait on a delayed ACK (that
    // cost 40 ms of time-to-first-batch).
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let shared_tls = shared.tls.clone();
    let svc = dquant_proto::v1::agent_server::AgentServer::with_interceptor(
        grpc::Service {
            shared: shared.clone(),
        },
        grpc::authenticate(shared),
    );
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = &shared_tls {
        let identity = Identity::from_pem(tls.cert_pem(), tls.key_pem());
        builder = builder
            .tls_config(ServerTlsConfig::new().identity(identity))
            .map_err(ControlError::Tls)?;
    }
    let tcp = builder
        .add_service(svc.clone())
        .add_service(health.clone())
        .serve_with_incoming_shutdown(incoming, stopped(stop.clone()));
    let Some(rx) = local else {
        return Ok(tcp.await?);
    };
    // Connections the Unix socket's router identified as gRPC.
    let uds = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
        |s| {
            s.set_nonblocking(true)?;
            tokio::net::UnixStream::from_std(s)
        },
    );
    let uds = tonic::transport::Server::builder()
        .add_service(svc)
        .add_service(health)
        .serve_with_incoming_shutdown(uds, stopped(stop));
    tokio::try_join!(tcp, uds)?;
    Ok(())
}
