//! Why an agent's configuration cannot start it: the agent's one error for what it was given
//! (the TOML, the flags, the roots, the tenants, the link's shares), each variant naming the
//! setting it concerns.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::bandwidth::ShareError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The TOML does not parse (toml's message carries the line and column).
    #[error("agent config: {0}")]
    Toml(#[from] toml::de::Error),
    /// A setting that parses but cannot work: which one, and what is wrong with it.
    #[error("{setting}: {problem}")]
    Invalid { setting: String, problem: String },
    /// A root whose location cannot be opened.
    #[error("root {name:?} ({}): {problem}", at.display())]
    Root {
        name: String,
        at: PathBuf,
        problem: String,
    },
    /// Serving a non-loopback address to anyone who reaches it.
    #[error(
        "refusing to listen on {0} without tenants: anyone who can reach it could read every \
         root. Configure [[tenants]] with a token each (see README, Security and limits), or \
         listen on loopback (127.0.0.1)"
    )]
    OpenToAll(SocketAddr),
    /// Serving tokens and data over a non-loopback address in the clear.
    #[error(
        "refusing to listen on {0} without TLS: tenant tokens and data would cross the \
         network in the clear. Configure [tls] cert and key (or --tls-cert and --tls-key), \
         set allow_plaintext = true for a link nobody else can read, or listen on loopback \
         (127.0.0.1)"
    )]
    Plaintext(SocketAddr),
    /// Tenants' shares that do not fit the link.
    #[error("{0}")]
    Shares(#[from] ShareError),
}

impl ConfigError {
    pub fn invalid(setting: impl Into<String>, problem: impl Into<String>) -> Self {
        ConfigError::Invalid {
            setting: setting.into(),
            problem: problem.into(),
        }
    }
}
