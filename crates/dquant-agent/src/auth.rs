//! Who may use the agent, and what they may read.
//!
//! An agent on a storage node or a DPU is reachable over the data-center network, so beyond
//! loopback it serves only **tenants**: each named in the config with a secret token and the
//! roots it may read. A control call carries the token as gRPC metadata
//! (`authorization: Bearer TOKEN`); the interceptor resolves it to a [`Caller`] before any
//! handler runs, and handlers check each dataset's root against the caller's. A session is
//! then bound to its tenant and its ticket. The data plane checks both: a connection's
//! hello (or a ring hand-over's) carries the tenant's token as well as the ticket only an
//! authenticated `Open` hands out, and the token must be the session's owner's
//! ([`Auth::hello_owner`]). With no tenants configured the agent serves anyone, and
//! [`check_binds`] refuses to start on anything but loopback.
//!
//! Refusals are logged once per peer and reason ([`RefusalLog`]), never with the secret.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use crate::config_error::ConfigError;
use dquant_transport::record::MAX_TOKEN_LEN;
use serde::Deserialize;
use tonic::metadata::MetadataMap;
use tonic::Status;

/// A tenant, as the config names it (`[[tenants]]`).
#[derive(Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// Shown in logs and errors (never the token).
    pub name: String,
    /// The secret its clients send (`DQUANT_TOKEN`); at least 16 characters.
    pub token: String,
    /// The roots it may read (`["*"]` for all).
    pub roots: Vec<String>,
    /// Bytes per second of the data link this tenant gets whenever it wants them (needs
    /// `[bandwidth]`); or, as `guarantee_share`, that part of `link_bytes_per_s`.
    #[serde(default)]
    pub guarantee_bytes_per_s: Option<u64>,
    #[serde(default)]
    pub guarantee_share: Option<f64>,
    /// Its part of the link nobody's guarantee claims (default 1).
    #[serde(default)]
    pub weight: Option<u32>,
    /// The traffic class (`[[bandwidth.classes]]`) its data sockets are marked with.
    #[serde(default)]
    pub class: Option<String>,
    /// Its `Watch` shows every tenant's sessions, subscribers, rates and the agent's
    /// refusals, not only its own (an operator's token). It reads data as any tenant does.
    #[serde(default)]
    pub operator: bool,
}

impl std::fmt::Debug for TenantConfig {
    fn fmt(&self, out: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        out.debug_struct("TenantConfig")
            .field("name", &self.name)
            .field("token", &"<secret>")
            .field("roots", &self.roots)
            .field("guarantee_bytes_per_s", &self.guarantee_bytes_per_s)
            .field("guarantee_share", &self.guarantee_share)
            .field("weight", &self.weight)
            .field("class", &self.class)
            .field("operator", &self.operator)
            .finish()
    }
}

/// The shortest token accepted: a guessable secret is no secret.
pub const MIN_TOKEN_LEN: usize = 16;

/// Who made a request.
#[derive(Clone, Debug)]
pub(crate) enum Caller {
    /// No tenants are configured: the agent serves anyone who reaches it (loopback only).
    Anyone,
    Tenant(Arc<Tenant>),
}

#[derive(Debug)]
pub(crate) struct Tenant {
    pub name: String,
    token: Vec<u8>,
    /// `None`: every root.
    roots: Option<HashSet<String>>,
    /// Watches everyone ([`TenantConfig::operator`]).
    operator: bool,
}

impl Caller {
    /// The owner recorded on a session (`""` for anyone).
    pub fn name(&self) -> &str {
        match self {
            Caller::Anyone => "",
            Caller::Tenant(t) => &t.name,
        }
    }

    /// The tenant whose events alone the caller's `Watch` shows; `None`: everything (an
    /// agent without tenants, or an operator's token).
    pub fn watches_only(&self) -> Option<&str> {
        match self {
            Caller::Tenant(t) if !t.operator => Some(&t.name),
            _ => None,
        }
    }

    /// Whether the caller may read datasets under `root`.
    pub fn may_read(&self, root: &str) -> bool {
        match self {
            Caller::Anyone => true,
            Caller::Tenant(t) => t.roots.as_ref().is_none_or(|r| r.contains(root)),
        }
    }

    /// Refuses a dataset name (`ROOT/PATH`) under a root the caller may not read. The same
    /// answer whether or not the root exists: a tenant learns nothing of others' roots.
    pub fn check_dataset(&self, dataset: &str) -> Result<(), Status> {
        let root = dataset.split_once('/').map_or(dataset, |(r, _)| r);
        if self.may_read(root) {
            return Ok(());
        }
        Err(Status::permission_denied(format!(
            "dataset {dataset:?}: tenant {:?} may not read root {root:?}",
            self.name()
        )))
    }
}

/// The configured tenants.
#[derive(Debug, Default)]
pub(crate) struct Auth {
    tenants: Vec<Arc<Tenant>>,
}

impl Auth {
    /// Checks the tenants against the agent's roots: names unique, tokens long and unique,
    /// roots served.
    pub fn new(tenants: &[TenantConfig], roots: &[&str]) -> Result<Self, ConfigError> {
        let mut names = HashSet::new();
        let mut tokens = HashSet::new();
        let mut out = Vec::new();
        for t in tenants {
            let bad =
                |problem: String| ConfigError::invalid(format!("tenants: {:?}", t.name), problem);
            if t.name.is_empty() || !names.insert(t.name.as_str()) {
                return Err(bad("names must be unique and not empty".into()));
            }
            if t.token.len() < MIN_TOKEN_LEN {
                return Err(bad(format!(
                    "token must be at least {MIN_TOKEN_LEN} characters"
                )));
            }
            if t.token.len() > MAX_TOKEN_LEN {
                return Err(bad(format!(
                    "token must be at most {MAX_TOKEN_LEN} bytes (a data-plane hello carries it)"
                )));
            }
            if !tokens.insert(t.token.as_str()) {
                return Err(bad("token is another tenant's too".into()));
            }
            let all = t.roots.iter().any(|r| r == "*");
            if let Some(r) = t
                .roots
                .iter()
                .find(|r| *r != "*" && !roots.contains(&r.as_str()))
            {
                return Err(bad(format!("root {r:?} is not served by this agent")));
            }
            out.push(Arc::new(Tenant {
                name: t.name.clone(),
                token: t.token.as_bytes().to_vec(),
                roots: (!all).then(|| t.roots.iter().cloned().collect()),
                operator: t.operator,
            }));
        }
        Ok(Auth { tenants: out })
    }

    pub fn is_open(&self) -> bool {
        self.tenants.is_empty()
    }

    /// The caller of a control request, from its `authorization` metadata.
    pub fn caller(&self, md: &MetadataMap) -> Result<Caller, Refusal> {
        if self.is_open() {
            return Ok(Caller::Anyone);
        }
        let Some(value) = md.get("authorization") else {
            return Err(Refusal::NoToken);
        };
        let token = value
            .as_bytes()
            .strip_prefix(b"Bearer ")
            .ok_or(Refusal::BadToken)?;
        self.tenant_of(token)
            .map(Caller::Tenant)
            .ok_or(Refusal::BadToken)
    }

    /// The owner a data-plane hello's token names (`""` when the agent serves anyone): the
    /// session it claims must be that tenant's.
    pub fn hello_owner(&self, token: Option<&str>) -> Result<String, Refusal> {
        if self.is_open() {
            return Ok(String::new());
        }
        let token = token.ok_or(Refusal::NoToken)?;
        self.tenant_of(token.as_bytes())
            .map(|t| t.name.clone())
            .ok_or(Refusal::BadToken)
    }

    /// The tenant whose token is `token`. Every tenant is compared, in constant time, so the
    /// time taken says nothing of which (or whether one) matched.
    fn tenant_of(&self, token: &[u8]) -> Option<Arc<Tenant>> {
        let mut found = None;
        for t in &self.tenants {
            if same(&t.token, token) {
                found = Some(t.clone());
            }
        }
        found
    }
}

/// Why a control request was refused before any handler ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Refusal {
    NoToken,
    BadToken,
}

impl Refusal {
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::NoToken => "no token",
            Refusal::BadToken => "wrong token",
        }
    }

    pub fn status(self) -> Status {
        Status::unauthenticated(self.message())
    }

    /// What the client is told (the data plane prefixes `data stream: `).
    pub fn message(self) -> &'static str {
        match self {
            Refusal::NoToken => {
                "this agent serves tenants only: send a tenant's token (set DQUANT_TOKEN)"
            }
            Refusal::BadToken => "the token is not a tenant's of this agent",
        }
    }
}

/// Constant-time comparison of secrets.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Refuses to serve a non-loopback address to anyone (without tenants, whoever reaches the
/// port reads every root), or in the clear (`tls_or_allowed`: TLS is configured, or the
/// operator allowed plaintext): tokens would cross the network readable.
pub(crate) fn check_binds(
    auth: &Auth,
    tls_or_allowed: bool,
    addrs: &[SocketAddr],
) -> Result<(), ConfigError> {
    let Some(&a) = addrs.iter().find(|a| !a.ip().is_loopback()) else {
        return Ok(());
    };
    if auth.is_open() {
        return Err(ConfigError::OpenToAll(a));
    }
    if !tls_or_allowed {
        return Err(ConfigError::Plaintext(a));
    }
    Ok(())
}

/// Logs each refusal once per peer and reason, so a client retrying in a loop (or a scan)
/// cannot flood the log. Bounded: past [`RefusalLog::CAP`] pairs it forgets and starts over.
#[derive(Default)]
pub(crate) struct RefusalLog {
    seen: Mutex<HashSet<(String, &'static str)>>,
}

impl RefusalLog {
    const CAP: usize = 4096;

    /// Logs `reason` for `peer` (with `detail`) unless already logged.
    pub fn refuse(&self, plane: &str, peer: &str, reason: &'static str, detail: &str) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.len() >= Self::CAP {
            seen.clear();
        }
        if seen.insert((peer.to_string(), reason)) {
            tracing::warn!(plane, %peer, reason, detail, "refused (logged once per peer and reason)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str, token: &str, roots: &[&str]) -> TenantConfig {
        TenantConfig {
            name: name.into(),
            token: token.into(),
            roots: roots.iter().map(|r| r.to_string()).collect(),
            ..Default::default()
        }
    }

    fn md(value: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert("authorization", value.parse().unwrap());
        m
    }

    #[test]
    fn tokens_resolve_to_their_tenant_and_roots_are_checked() {
        let a = Auth::new(
            &[
                tenant("team-a", "aaaaaaaaaaaaaaaa-secret", &["corpus"]),
                tenant("ops", "oooooooooooooooo-secret", &["*"]),
            ],
            &["corpus", "web"],
        )
        .unwrap();
        let c = a.caller(&md("Bearer aaaaaaaaaaaaaaaa-secret")).unwrap();
        assert_eq!(c.name(), "team-a");
        assert!(c.check_dataset("corpus/x").is_ok());
        let e = c.check_dataset("web/x").unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert_eq!(
            e.message(),
            "dataset \"web/x\": tenant \"team-a\" may not read root \"web\""
        );
        let ops = a.caller(&md("Bearer oooooooooooooooo-secret")).unwrap();
        assert!(ops.check_dataset("web/x").is_ok());
        assert_eq!(a.caller(&MetadataMap::new()).unwrap_err(), Refusal::NoToken);
        assert_eq!(a.caller(&md("Bearer nope")).unwrap_err(), Refusal::BadToken);
        assert_eq!(
            a.caller(&md("aaaaaaaaaaaaaaaa-secret")).unwrap_err(),
            Refusal::BadToken
        );
        assert!(matches!(
            Auth::default().caller(&MetadataMap::new()),
            Ok(Caller::Anyone)
        ));
        // The data plane's hello names the same tenants.
        assert_eq!(
            a.hello_owner(Some("oooooooooooooooo-secret")).unwrap(),
            "ops"
        );
        assert_eq!(a.hello_owner(None).unwrap_err(), Refusal::NoToken);
        assert_eq!(a.hello_owner(Some("nope")).unwrap_err(), Refusal::BadToken);
        assert_eq!(Auth::default().hello_owner(None).unwrap(), "");
    }

    #[test]
    fn bad_tenant_configs_are_refused_with_the_reason() {
        let roots = ["corpus"];
        let e = |t: &[TenantConfig]| Auth::new(t, &roots).unwrap_err().to_string();
        assert_eq!(
            e(&[tenant("a", "short", &["corpus"])]),
            "tenants: \"a\": token must be at least 16 characters"
        );
        assert_eq!(
            e(&[tenant("a", &"x".repeat(201), &["corpus"])]),
            "tenants: \"a\": token must be at most 200 bytes (a data-plane hello carries it)"
        );
        assert_eq!(
            e(&[tenant("a", "0123456789abcdef", &["web"])]),
            "tenants: \"a\": root \"web\" is not served by this agent"
        );
        assert_eq!(
            e(&[
                tenant("a", "0123456789abcdef", &["corpus"]),
                tenant("b", "0123456789abcdef", &["corpus"])
            ]),
            "tenants: \"b\": token is another tenant's too"
        );
        assert_eq!(
            e(&[
                tenant("a", "0123456789abcdef", &["corpus"]),
                tenant("a", "0123456789abcdeg", &["corpus"])
            ]),
            "tenants: \"a\": names must be unique and not empty"
        );
        // The token never shows in a debug print of the config.
        let t = format!("{:?}", tenant("a", "0123456789abcdef", &["corpus"]));
        assert!(!t.contains("0123456789abcdef"), "{t}");
    }

    #[test]
    fn non_loopback_binds_need_tenants_and_tls() {
        let open = Auth::default();
        let lo: SocketAddr = "127.0.0.1:7878".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:7878".parse().unwrap();
        check_binds(&open, false, &[lo, lo]).unwrap();
        assert_eq!(
            check_binds(&open, true, &[lo, any])
                .unwrap_err()
                .to_string(),
            "refusing to listen on 0.0.0.0:7878 without tenants: anyone who can reach it \
             could read every root. Configure [[tenants]] with a token each (see README, \
             Security and limits), or listen on loopback (127.0.0.1)"
        );
        let closed = Auth::new(&[tenant("a", "0123456789abcdef", &["*"])], &[]).unwrap();
        check_binds(&closed, true, &[any]).unwrap();
        assert_eq!(
            check_binds(&closed, false, &[lo, any])
                .unwrap_err()
                .to_string(),
            "refusing to listen on 0.0.0.0:7878 without TLS: tenant tokens and data would \
             cross the network in the clear. Configure [tls] cert and key (or --tls-cert and \
             --tls-key), set allow_plaintext = true for a link nobody else can read, or listen \
             on loopback (127.0.0.1)"
        );
    }
}
