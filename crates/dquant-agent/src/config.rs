//! Agent configuration: from a TOML file, from flags, or both (flags win).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

/// Default control-plane address: loopback only. Serving other hosts is a choice the
/// operator makes explicitly (`--listen 0.0.0.0:7878`).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7878";
/// Default frames of prefetch per session (1 MiB each).
pub const DEFAULT_PREFETCH: usize = 8;

/// What an agent serves and how.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// gRPC control plane address.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Data plane address. Port 0 picks a free port (clients learn it from `Open`). When
    /// absent: the control port + 1 (or a free port when the control port is 0).
    #[serde(default)]
    pub data_listen: Option<SocketAddr>,
    /// A Unix socket for clients on this host: it serves the control plane too, and is where
    /// they hand over shared-memory rings (`transport=shm`, the emulated DMA path). A stale
    /// socket file left by a dead agent is replaced; a live one is an error.
    #[serde(default)]
    pub socket: Option<PathBuf>,
    /// Frames (1 MiB each) each session may fill ahead of its consumer. This is the
    /// prefetch budget: a session's memory is bounded by it, whatever the dataset size.
    #[serde(default = "default_prefetch")]
    pub prefetch_frames: usize,
    /// Sessions open at once, streaming or waiting for their data connection.
    #[serde(default = "default_max_sessions")]
    pub max_sessions: usize,
    /// Seconds an opened session waits for its data connection before it is dropped.
    #[serde(default = "default_ticket_ttl")]
    pub ticket_ttl_secs: u64,
    /// Named dataset roots: `name = "/path/to/dir"`. Clients name datasets `name/relative`.
    #[serde(default)]
    pub roots: BTreeMap<String, PathBuf>,
}

fn default_listen() -> SocketAddr {
    DEFAULT_LISTEN.parse().expect("constant address parses")
}
fn default_prefetch() -> usize {
    DEFAULT_PREFETCH
}
fn default_max_sessions() -> usize {
    256
}
fn default_ticket_ttl() -> u64 {
    60
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            listen: default_listen(),
            data_listen: None,
            socket: None,
            prefetch_frames: default_prefetch(),
            max_sessions: default_max_sessions(),
            ticket_ttl_secs: default_ticket_ttl(),
            roots: BTreeMap::new(),
        }
    }
}

impl AgentConfig {
    /// Parses a TOML config; errors carry toml's line and column.
    pub fn from_toml(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| format!("agent config: {e}"))
    }

    /// Checks values that parse but cannot work.
    pub fn validate(&self) -> Result<(), String> {
        if self.prefetch_frames == 0 {
            return Err("prefetch_frames: must be at least 1".into());
        }
        if self.max_sessions == 0 {
            return Err("max_sessions: must be at least 1".into());
        }
        if self.roots.is_empty() {
            return Err(
                "roots: no dataset roots configured (give --root NAME=DIR or a [roots] table)"
                    .into(),
            );
        }
        Ok(())
    }

    /// The data plane address this config resolves to.
    pub fn data_addr(&self) -> SocketAddr {
        self.data_listen.unwrap_or_else(|| {
            let mut a = self.listen;
            if a.port() != 0 {
                a.set_port(a.port().wrapping_add(1));
            }
            a
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_toml_with_defaults_and_rejects_unknown_fields() {
        let c = AgentConfig::from_toml("[roots]\ncorpus = \"/data\"\n").unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:7878");
        assert_eq!(c.data_addr().to_string(), "127.0.0.1:7879");
        assert_eq!(c.roots["corpus"], PathBuf::from("/data"));
        let e = AgentConfig::from_toml("prefetch = 3\n").unwrap_err();
        assert!(e.starts_with("agent config: "), "{e}");
        assert!(e.contains("unknown field `prefetch`"), "{e}");
        assert_eq!(
            AgentConfig::default().validate().unwrap_err(),
            "roots: no dataset roots configured (give --root NAME=DIR or a [roots] table)"
        );
    }
}
