//! TLS settings for both planes, from PEM files: the agent's certificate and key
//! ([`ServerTls`]) and the CA a client trusts ([`ClientTls`]).
//!
//! One place reads the files, so the control plane (tonic, which takes the same PEM bytes)
//! and the data plane (rustls on the blocking sockets, [`crate::DataStream`]) always serve
//! the same certificate. The crypto provider is named here (ring) rather than taken from a
//! process default, so what else the process links cannot change it.

use std::fmt;
use std::io::{self, ErrorKind};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::conn::DataStream;

/// Why TLS settings could not be loaded, or a TLS connection not set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    #[error("{what} {path}: {source}")]
    Read {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} {origin}: no PEM certificate in it (expected -----BEGIN CERTIFICATE-----)")]
    NoCertificate { what: &'static str, origin: String },
    #[error("{what} {origin}: {reason}")]
    BadPem {
        what: &'static str,
        origin: String,
        reason: String,
    },
    #[error("TLS key {origin}: no PEM private key in it (PKCS#8, PKCS#1 or SEC1)")]
    NoKey { origin: String },
    #[error("TLS certificate and key do not make a server identity: {0}")]
    Identity(String),
    #[error("{name:?} cannot be checked against a certificate: it is neither a DNS name nor an IP address")]
    Name { name: String },
    #[error("TLS handshake with {peer} failed: {reason}")]
    Handshake { peer: String, reason: String },
}

/// The crypto every config here uses. It is also installed as the process default (once,
/// unless the process chose one): tonic builds the control plane's server config from the
/// process default, and with more than one provider compiled in (a workspace build links
/// aws-lc-rs for object_store too) rustls would have none to pick and panic.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    static DEFAULT: std::sync::Once = std::sync::Once::new();
    DEFAULT.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.display().to_string(),
        source,
    })
}

/// Every certificate in `pem`, at least one.
fn certificates(
    what: &'static str,
    pem: &[u8],
    origin: &str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::BadPem {
            what,
            origin: origin.to_string(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            what,
            origin: origin.to_string(),
        });
    }
    Ok(certs)
}

/// The agent's side: its certificate chain and key, for both planes.
#[derive(Clone)]
pub struct ServerTls {
    config: Arc<ServerConfig>,
    cert_pem: Arc<Vec<u8>>,
    key_pem: Arc<Vec<u8>>,
}

impl fmt::Debug for ServerTls {
    // The key never shows in a debug print.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls").finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Reads a PEM certificate chain (the agent's first) and its PEM private key.
    pub fn from_files(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let (c, k) = (read("TLS certificate", cert)?, read("TLS key", key)?);
        Self::from_pem(
            c,
            k,
            &cert.display().to_string(),
            &key.display().to_string(),
        )
    }

    /// [`ServerTls::from_files`] from the files' bytes; `cert_origin` and `key_origin` name
    /// them in errors.
    pub fn from_pem(
        cert_pem: Vec<u8>,
        key_pem: Vec<u8>,
        cert_origin: &str,
        key_origin: &str,
    ) -> Result<Self, TlsError> {
        let certs = certificates("TLS certificate", &cert_pem, cert_origin)?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| TlsError::NoKey {
            origin: key_origin.to_string(),
        })?;
        let config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Identity(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| TlsError::Identity(e.to_string()))?;
        Ok(ServerTls {
            config: Arc::new(config),
            cert_pem: Arc::new(cert_pem),
            key_pem: Arc::new(key_pem),
        })
    }

    /// The certificate chain as read (for the control plane's server).
    pub fn cert_pem(&self) -> &[u8] {
        &self.cert_pem
    }

    /// The private key as read (for the control plane's server).
    pub fn key_pem(&self) -> &[u8] {
        &self.key_pem
    }

    /// Runs the server side of a handshake on `sock` (within the socket's timeouts).
    pub fn accept(&self, sock: TcpStream) -> Result<DataStream, TlsError> {
        let conn = rustls::ServerConnection::new(self.config.clone())
            .map_err(|e| TlsError::Identity(e.to_string()))?;
        handshake(sock, conn.into())
    }
}

/// The client's side: the CA certificates an agent's certificate must chain to, and
/// optionally the name it must carry (else the host the client dialed).
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<ClientConfig>,
    ca_pem: Arc<Vec<u8>>,
    name: Option<String>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Trusts the CA certificates in the PEM file at `ca`.
    pub fn from_ca_file(ca: &Path) -> Result<Self, TlsError> {
        Self::from_ca_pem(read("TLS CA", ca)?, &ca.display().to_string())
    }

    /// Trusts the CA certificates in `pem`; `origin` names it in errors.
    pub fn from_ca_pem(pem: Vec<u8>, origin: &str) -> Result<Self, TlsError> {
        let mut roots = RootCertStore::empty();
        for c in certificates("TLS CA", &pem, origin)? {
            roots.add(c).map_err(|e| TlsError::BadPem {
                what: "TLS CA",
                origin: origin.to_string(),
                reason: e.to_string(),
            })?;
        }
        let config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Identity(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(ClientTls {
            config: Arc::new(config),
            ca_pem: Arc::new(pem),
            name: None,
        })
    }

    /// Expects agents' certificates to carry `name` (a DNS name or an IP address), whatever
    /// address the client dials.
    pub fn with_name(mut self, name: &str) -> Result<Self, TlsError> {
        server_name(name)?;
        self.name = Some(name.to_string());
        Ok(self)
    }

    /// The CA certificates as read (for the control plane's client).
    pub fn ca_pem(&self) -> &[u8] {
        &self.ca_pem
    }

    /// The name an agent dialed at `addr` (`HOST:PORT`, `[V6]:PORT`) must carry in its
    /// certificate: the name given, else the address's host, without IPv6 brackets. The
    /// one place both planes take it from.
    pub fn name_for<'a>(&'a self, addr: &'a str) -> &'a str {
        let name = match &self.name {
            Some(n) => n.as_str(),
            None => addr.rsplit_once(':').map_or(addr, |(host, _)| host),
        };
        name.trim_start_matches('[').trim_end_matches(']')
    }

    /// Runs the client side of a handshake on `sock`, to an agent dialed at `addr`
    /// (`HOST:PORT`).
    pub fn connect(&self, sock: TcpStream, addr: &str) -> Result<DataStream, TlsError> {
        let name = server_name(self.name_for(addr))?;
        let conn = rustls::ClientConnection::new(self.config.clone(), name)
            .map_err(|e| TlsError::Identity(e.to_string()))?;
        handshake(sock, conn.into())
    }
}

/// `name` as rustls checks it (brackets around an IPv6 address are dropped).
fn server_name(name: &str) -> Result<ServerName<'static>, TlsError> {
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(bare.to_string()).map_err(|_| TlsError::Name {
        name: name.to_string(),
    })
}

/// What to check when a connection failed with `message`, for a client that spoke TLS
/// (`tls`) or did not: "" when nothing points at TLS. One place for both planes' messages.
pub fn hint(message: &str, tls: bool) -> &'static str {
    let has = |s: &str| message.contains(s);
    let lower = message.to_lowercase();
    if tls {
        if has("UnknownIssuer") || has("BadSignature") {
            " (the agent's certificate is not signed by a CA this client trusts: check DQUANT_TLS_CA)"
        } else if has("not valid for name") {
            " (the agent's certificate does not name the host dialed: dial a name it carries, or set DQUANT_TLS_NAME)"
        } else if has("corrupt message") || has("InvalidContentType") {
            " (the peer does not speak TLS: is TLS configured at both ends?)"
        } else {
            ""
        }
    } else if [
        "connection reset",
        "broken pipe",
        "h2 protocol error",
        "frame with invalid size",
        "connection closed",
        // hyper, when the peer closed before HTTP/2 was up (a TLS agent hanging up on
        // plaintext), under load: the same failure as the ones above.
        "connection was not ready",
    ]
    .iter()
    .any(|s| lower.contains(s))
    {
        " (if the agent serves TLS, set DQUANT_TLS_CA to the CA that signed its certificate)"
    } else {
        ""
    }
}

/// Completes `conn`'s handshake over `sock` (blocking, within the socket's timeouts).
fn handshake(mut sock: TcpStream, mut conn: rustls::Connection) -> Result<DataStream, TlsError> {
    let peer = sock
        .peer_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string());
    let fail = |e: io::Error| TlsError::Handshake {
        peer: peer.clone(),
        reason: handshake_reason(&e),
    };
    while conn.is_handshaking() {
        conn.complete_io(&mut sock).map_err(fail)?;
    }
    while conn.wants_write() {
        conn.write_tls(&mut sock).map_err(fail)?;
    }
    Ok(DataStream::established(sock, conn))
}

/// The reason in a failed handshake's error, with a hint for the usual causes.
fn handshake_reason(e: &io::Error) -> String {
    let m = e.to_string();
    let eof = matches!(e.kind(), ErrorKind::UnexpectedEof);
    let hint = match hint(&m, true) {
        "" if eof => " (the peer closed the connection: does it serve TLS?)",
        h => h,
    };
    format!("{m}{hint}")
}
