//! An agent's address: `dquant://HOST:PORT[/DATASET]` over TCP, or its Unix socket path on
//! this host, with the transport options a client may add.

pub use dquant_transport::Transport;

/// Why a string is not an agent address; each says what the address should look like.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UriError {
    #[error("{uri:?}: the agent address must be HOST:PORT (e.g. dquant://127.0.0.1:7878)")]
    NotHostPort { uri: String },
    #[error("{uri:?}: the Unix socket path is empty (e.g. unix:/run/dquant.sock)")]
    EmptySocketPath { uri: String },
    #[error(
        "{uri:?} is not an agent address (expected dquant://HOST:PORT[/DATASET], or a Unix \
         socket path such as unix:/run/dquant.sock)"
    )]
    NotAnAgent { uri: String },
    #[error("{uri:?}: option {key}={value:?} is not valid; use {allowed}")]
    BadOption {
        uri: String,
        key: String,
        value: String,
        allowed: String,
    },
    #[error("{uri:?}: unknown option {key:?} (known: transport, verify, slots)")]
    UnknownOption { uri: String, key: String },
}

/// An agent's address, from one of:
/// - `dquant://HOST:PORT[/DATASET]`, over TCP; a plan source may name replicas of its
///   dataset, `dquant://HOST1:PORT,HOST2:PORT/ROOT/PATH` (see [`AgentUri::replicas`]);
/// - `unix:PATH`, `unix://PATH` or a plain path (`/run/dquant.sock`, `./agent.sock`): the
///   agent's Unix socket, on this host; offloaded plans then use a shared-memory ring.
///
/// Either may end in options, `?transport=tcp|shm|loopback&verify=true|false&slots=N`:
/// `transport` overrides the default above (`shm` with a TCP address needs the agent to
/// have a Unix socket on this host; `tcp` with a path uses the agent's data port on
/// loopback; `loopback` hands batches over in memory to an agent started in this process);
/// `verify` has the agent compute, and this process check, each ring batch's
/// crc32c (default false: see [`dquant_transport::ring::RingConsumer::create_with`]);
/// `slots` sizes the ring, or the loopback queue (default: `dquant_client::shm::default_slots`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentUri {
    /// `HOST:PORT` (or `HOST1:PORT,HOST2:PORT` for replicas), or the socket path for a
    /// Unix-socket agent.
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
    pub fn parse(uri: &str) -> Result<Self, UriError> {
        let (addr, query) = uri.split_once('?').unwrap_or((uri, ""));
        let mut me = if let Some(rest) = addr.strip_prefix(Self::SCHEME) {
            let (authority, dataset) = rest.split_once('/').unwrap_or((rest, ""));
            if !authority.split(',').all(is_host_port) {
                return Err(UriError::NotHostPort { uri: uri.into() });
            }
            Self::new(authority, dataset.trim_end_matches('/'))
        } else if let Some(rest) = addr.strip_prefix(Self::UNIX_SCHEME) {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if path.is_empty() {
                return Err(UriError::EmptySocketPath { uri: uri.into() });
            }
            // A socket's authority is told from a HOST:PORT by its '/' (see
            // `is_unix_authority`), so a relative `unix:agent.sock` is `./agent.sock`.
            if path.contains('/') {
                Self::new(path, "")
            } else {
                Self::new(&format!("./{path}"), "")
            }
        } else if addr.starts_with('/') || addr.starts_with("./") || addr.starts_with("../") {
            Self::new(addr, "")
        } else {
            return Err(UriError::NotAnAgent { uri: uri.into() });
        };
        for kv in query.split('&').filter(|kv| !kv.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            let bad = |allowed: String| UriError::BadOption {
                uri: uri.into(),
                key: k.into(),
                value: v.into(),
                allowed,
            };
            match k {
                "transport" => {
                    me.transport = Some(
                        v.parse::<Transport>()
                            .map_err(|_| bad(Transport::names()))?,
                    )
                }
                "verify" => {
                    me.verify = match v {
                        "true" | "1" => true,
                        "false" | "0" => false,
                        _ => return Err(bad("true or false".into())),
                    }
                }
                "slots" => {
                    me.slots = Some(
                        v.parse()
                            .ok()
                            .filter(|&n| (2..=4096).contains(&n))
                            .ok_or_else(|| bad("2 to 4096".into()))?,
                    )
                }
                _ => {
                    return Err(UriError::UnknownOption {
                        uri: uri.into(),
                        key: k.into(),
                    })
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

    /// The agents holding the dataset: the `HOST:PORT`s of a comma-separated authority, in
    /// the order given (one for a plain address).
    pub fn replicas(&self) -> Vec<&str> {
        self.authority.split(',').collect()
    }

    /// Whether the agent is addressed by its Unix socket.
    pub fn is_unix(&self) -> bool {
        is_unix_authority(&self.authority)
    }

    /// The transport offloaded plans use: the `transport` option, else `shm` for a Unix
    /// socket and `tcp` otherwise.
    pub fn transport(&self) -> Transport {
        self.transport.unwrap_or(if self.is_unix() {
            Transport::SHM
        } else {
            Transport::TCP
        })
    }

    /// The host part, without the port (brackets kept for IPv6); loopback for a Unix-socket
    /// agent (its TCP data port is on this host).
    pub fn host(&self) -> &str {
        host_of(&self.authority)
    }
}

/// Whether `a` is one agent's TCP address, `HOST:PORT` (a host without `,`, which separates
/// replicas, and a port that fits 16 bits).
pub fn is_host_port(a: &str) -> bool {
    a.rsplit_once(':')
        .is_some_and(|(h, p)| !h.is_empty() && !h.contains(',') && p.parse::<u16>().is_ok())
}

/// Unix socket authorities are paths; TCP ones are `HOST:PORT`.
pub fn is_unix_authority(authority: &str) -> bool {
    authority.contains('/')
}

pub(crate) fn host_of(authority: &str) -> &str {
    if is_unix_authority(authority) {
        return "127.0.0.1";
    }
    authority.rsplit_once(':').map_or(authority, |(h, _)| h)
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
        assert_eq!(u.transport(), Transport::TCP);
        assert!(!u.verify);
        assert_eq!(AgentUri::parse("dquant://h:1").unwrap().dataset, "");
        assert_eq!(
            AgentUri::parse("dquant://nohost/x").unwrap_err().to_string(),
            "\"dquant://nohost/x\": the agent address must be HOST:PORT (e.g. dquant://127.0.0.1:7878)"
        );
        // Unix sockets, in each spelling: shared memory by default.
        for s in ["/run/dq.sock", "unix:/run/dq.sock", "unix:///run/dq.sock"] {
            let u = AgentUri::parse(s).unwrap();
            assert_eq!(u.authority, "/run/dq.sock", "{s}");
            assert_eq!(u.transport(), Transport::SHM, "{s}");
            assert_eq!(u.host(), "127.0.0.1");
        }
        assert_eq!(AgentUri::parse("./a.sock").unwrap().authority, "./a.sock");
        // A relative socket after `unix:` stays a socket, not a host name.
        let u = AgentUri::parse("unix:a.sock").unwrap();
        assert_eq!(
            (u.authority.as_str(), u.transport()),
            ("./a.sock", Transport::SHM)
        );
        // Replicas of a source's dataset.
        let u = AgentUri::parse("dquant://10.0.0.1:7878,storage-2:7878/corpus/x").unwrap();
        assert_eq!(u.replicas(), ["10.0.0.1:7878", "storage-2:7878"]);
        assert_eq!(u.dataset, "corpus/x");
        assert_eq!(
            AgentUri::parse("dquant://h:1/x").unwrap().replicas(),
            ["h:1"]
        );
        assert!(AgentUri::parse("dquant://h:1,/x").is_err());
        assert!(AgentUri::parse("dquant://h:1,h2/x").is_err());
        let u = AgentUri::parse("dquant://h:1?transport=shm&verify=true&slots=16").unwrap();
        assert_eq!(
            (u.transport(), u.verify, u.slots, u.authority.as_str()),
            (Transport::SHM, true, Some(16), "h:1")
        );
        let u = AgentUri::parse("/s?transport=tcp&verify=0").unwrap();
        assert_eq!((u.transport(), u.verify), (Transport::TCP, false));
        assert_eq!(
            AgentUri::parse("data/x").unwrap_err().to_string(),
            "\"data/x\" is not an agent address (expected dquant://HOST:PORT[/DATASET], or a Unix socket path such as unix:/run/dquant.sock)"
        );
        assert_eq!(
            AgentUri::parse("unix:").unwrap_err().to_string(),
            "\"unix:\": the Unix socket path is empty (e.g. unix:/run/dquant.sock)"
        );
        assert_eq!(
            AgentUri::parse("/s?verify=maybe").unwrap_err().to_string(),
            "\"/s?verify=maybe\": option verify=\"maybe\" is not valid; use true or false"
        );
    }
}
