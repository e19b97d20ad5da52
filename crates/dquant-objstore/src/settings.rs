//! How to reach an S3-compatible store, and how to read from it.
//!
//! The endpoint, region and credentials come from the usual `AWS_*` environment variables
//! (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_SESSION_TOKEN`, ... as `object_store` reads them), and the agent config's `[s3]`
//! table overrides them. Plain HTTP is allowed only to a loopback endpoint, or when the
//! operator says so (`allow_http = true` or `AWS_ALLOW_HTTP=true`): credentials and tokens
//! would otherwise cross a network in the clear because of a typo in a URL.
//!
//! Failures are bounded: a connection that cannot open in `connect_timeout_secs`, a body that
//! stalls for `read_timeout_secs`, or a request longer than `request_timeout_secs` fails and
//! is retried (`object_store` retries safe requests, and re-requests the rest of a body that
//! broke off mid-way after checking its ETag) at most `max_retries` times with exponential
//! back-off; then the read fails with the store's message.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};
use serde::Deserialize;

use crate::error::{InvalidSetting, ObjectRootError};
use crate::location::S3Location;

const MIB: u64 = 1 << 20;

/// The `[s3]` table of an agent config; every field is optional.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct S3Settings {
    /// e.g. `https://s3.eu-west-1.amazonaws.com`, `http://127.0.0.1:9000` [default:
    /// `AWS_ENDPOINT_URL`, else AWS itself].
    pub endpoint: Option<String>,
    /// [default: `AWS_REGION`, else `us-east-1`]
    pub region: Option<String>,
    /// [default: `AWS_ACCESS_KEY_ID`; with neither, the instance's or pod's credentials]
    pub access_key_id: Option<String>,
    /// [default: `AWS_SECRET_ACCESS_KEY`]
    pub secret_access_key: Option<String>,
    /// [default: `AWS_SESSION_TOKEN`]
    pub session_token: Option<String>,
    /// Allow plain `http://` to an endpoint that is not loopback (a trusted link only).
    pub allow_http: bool,
    pub connect_timeout_secs: u64,
    /// Longest pause in a response body before the request fails (and is retried).
    pub read_timeout_secs: u64,
    /// Longest single request.
    pub request_timeout_secs: u64,
    /// Retries of one request after the first try.
    pub max_retries: usize,
    /// Bytes per ranged GET: reads longer than this are split into GETs of this size, run
    /// concurrently; sequential reads are read ahead in parts of this size. Also the part
    /// size of multipart uploads (`dquant convert` to `s3://`), at least S3's 5 MiB there.
    pub part_bytes: u64,
    /// Bytes each sequential reader of an object keeps requested ahead of what it has read
    /// (several GETs in flight); 0: no readahead.
    pub readahead_bytes: u64,
}

impl Default for S3Settings {
    /// 8 MiB parts (AWS's advice for ranged GETs, and mountpoint-s3's part size) with 32 MiB
    /// ahead (4 GETs in flight, above a 10-25 Gbit/s link's bandwidth-delay product at
    /// ~10 ms of server latency); 3 retries, 5 s to connect, 15 s of silence, 120 s a request.
    fn default() -> Self {
        S3Settings {
            endpoint: None,
            region: None,
            access_key_id: None,
            secret_access_key: None,
            session_token: None,
            allow_http: false,
            connect_timeout_secs: 5,
            read_timeout_secs: 15,
            request_timeout_secs: 120,
            max_retries: 3,
            part_bytes: 8 * MIB,
            readahead_bytes: 32 * MIB,
        }
    }
}

/// What reads of an object need from the settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadSettings {
    pub part_bytes: u64,
    pub readahead_bytes: u64,
}

impl ReadSettings {
    /// Parts kept requested ahead of a sequential reader.
    pub fn inflight(&self) -> usize {
        (self.readahead_bytes / self.part_bytes) as usize
    }
}

impl S3Settings {
    /// Checks values that parse but cannot work.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        let bad = |setting: &str, problem: &str| InvalidSetting {
            setting: format!("s3.{setting}"),
            problem: problem.to_string(),
        };
        if !(64 << 10..=256 * MIB).contains(&self.part_bytes) {
            return Err(bad("part_bytes", "must be between 64 KiB and 256 MiB"));
        }
        if self.readahead_bytes > 4096 * MIB {
            return Err(bad("readahead_bytes", "at most 4 GiB"));
        }
        for (name, v) in [
            ("connect_timeout_secs", self.connect_timeout_secs),
            ("read_timeout_secs", self.read_timeout_secs),
            ("request_timeout_secs", self.request_timeout_secs),
        ] {
            if v == 0 {
                return Err(bad(name, "must be at least 1"));
            }
        }
        Ok(())
    }

    pub fn read(&self) -> ReadSettings {
        ReadSettings {
            part_bytes: self.part_bytes,
            readahead_bytes: self.readahead_bytes,
        }
    }

    /// The endpoint these settings reach: the config's, else `AWS_ENDPOINT_URL` (or
    /// `AWS_ENDPOINT`); `None` means AWS itself (HTTPS).
    pub fn endpoint(&self) -> Option<String> {
        self.endpoint.clone().or_else(|| {
            ["AWS_ENDPOINT_URL", "AWS_ENDPOINT"]
                .iter()
                .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
        })
    }

    /// Whether plain HTTP was allowed explicitly (here or by `AWS_ALLOW_HTTP=true`).
    fn http_opt_in(&self) -> bool {
        self.allow_http
            || std::env::var("AWS_ALLOW_HTTP").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
    }

    /// Refuses plain HTTP to an endpoint beyond loopback without the opt-in; returns whether
    /// the client must allow HTTP.
    fn check_http(&self, at: &S3Location) -> Result<bool, ObjectRootError> {
        let Some(endpoint) = self.endpoint() else {
            return Ok(false);
        };
        let Some(rest) = endpoint.strip_prefix("http://") else {
            return Ok(false);
        };
        if is_loopback_authority(rest) || self.http_opt_in() {
            return Ok(true);
        }
        Err(ObjectRootError::Settings {
            location: at.to_string(),
            problem: format!(
                "endpoint {endpoint} is plain HTTP beyond loopback: credentials and data \
                 would cross the network in the clear; use https://, or set allow_http = \
                 true in [s3] (or AWS_ALLOW_HTTP=true) for a link nobody else can read"
            ),
        })
    }

    /// An `object_store` client for `at`'s bucket with these settings.
    pub fn store(&self, at: &S3Location) -> Result<Arc<dyn ObjectStore>, ObjectRootError> {
        self.validate().map_err(|e| ObjectRootError::Settings {
            location: at.to_string(),
            problem: e.to_string(),
        })?;
        let http = self.check_http(at)?;
        install_tls_provider();
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(&at.bucket)
            .with_client_options(self.client_options(http))
            .with_retry(self.retry())
            .with_allow_http(http);
        if let Some(e) = self.endpoint() {
            b = b.with_endpoint(e);
        }
        let env_region = ["AWS_REGION", "AWS_DEFAULT_REGION"]
            .iter()
            .any(|k| std::env::var_os(k).is_some());
        match &self.region {
            Some(r) => b = b.with_region(r),
            None if !env_region => b = b.with_region("us-east-1"),
            None => {}
        }
        if let Some(k) = &self.access_key_id {
            b = b.with_access_key_id(k);
        }
        if let Some(k) = &self.secret_access_key {
            b = b.with_secret_access_key(k);
        }
        if let Some(t) = &self.session_token {
            b = b.with_token(t);
        }
        let store = b.build().map_err(|source| ObjectRootError::Client {
            location: at.to_string(),
            source,
        })?;
        Ok(Arc::new(store))
    }

    fn client_options(&self, http: bool) -> ClientOptions {
        ClientOptions::new()
            .with_allow_http(http)
            .with_connect_timeout(Duration::from_secs(self.connect_timeout_secs))
            .with_read_timeout(Duration::from_secs(self.read_timeout_secs))
            .with_timeout(Duration::from_secs(self.request_timeout_secs))
    }

    fn retry(&self) -> RetryConfig {
        RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(5),
                base: 2.0,
            },
            max_retries: self.max_retries,
            retry_timeout: Duration::from_secs(self.request_timeout_secs * 2),
        }
    }
}

/// Makes ring the process's rustls provider unless one is installed: object_store's HTTP
/// client (reqwest, built without a provider of its own, so that no second crypto library
/// is compiled in) takes the process's. Idempotent; an application's own choice stands.
pub fn install_tls_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err only when another thread installed one first: theirs stands.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Whether `HOST[:PORT][/...]` names a loopback host.
fn is_loopback_authority(rest: &str) -> bool {
    let authority = rest.split('/').next().unwrap_or("");
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for ok in [
            "127.0.0.1:9000",
            "localhost:80/x",
            "[::1]:9000",
            "127.1.2.3",
        ] {
            assert!(is_loopback_authority(ok), "{ok}");
        }
        for no in [
            "10.0.0.1:9000",
            "s3.example.com",
            "[fe80::1]:1",
            "127.0.0.1.evil.com",
        ] {
            assert!(!is_loopback_authority(no), "{no}");
        }
    }

    #[test]
    fn plain_http_beyond_loopback_needs_an_opt_in() {
        let at = S3Location::parse("s3://lab/x").unwrap();
        let mut s = S3Settings {
            endpoint: Some("http://10.0.0.5:9000".into()),
            ..S3Settings::default()
        };
        // AWS_ALLOW_HTTP is not set in the test environment.
        let e = s.store(&at).err().unwrap().to_string();
        assert_eq!(
            e,
            "s3://lab/x: endpoint http://10.0.0.5:9000 is plain HTTP beyond loopback: \
             credentials and data would cross the network in the clear; use https://, or set \
             allow_http = true in [s3] (or AWS_ALLOW_HTTP=true) for a link nobody else can read"
        );
        s.allow_http = true;
        assert!(s.store(&at).is_ok());
        s.allow_http = false;
        s.endpoint = Some("http://127.0.0.1:9000".into());
        assert!(s.store(&at).is_ok());
    }

    #[test]
    fn bad_sizes_are_refused() {
        let at = S3Location::parse("s3://lab").unwrap();
        let s = S3Settings {
            part_bytes: 1,
            ..S3Settings::default()
        };
        assert_eq!(
            s.store(&at).err().unwrap().to_string(),
            "s3://lab: s3.part_bytes: must be between 64 KiB and 256 MiB"
        );
        assert_eq!(S3Settings::default().read().inflight(), 4);
    }
}
