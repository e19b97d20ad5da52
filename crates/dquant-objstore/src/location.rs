//! `s3://BUCKET/PREFIX`: where an object-store root is, as users write it.
//!
//! Parsed here, once, so the agent's `--root NAME=s3://…`, its config's `[roots]` and the
//! CLI's `s3://` inputs and outputs all accept and refuse the same strings with the same
//! messages.

use std::fmt;

use crate::backend::{is_plain_path, Backend, StorePlace};
use crate::error::ObjectRootError;
use crate::S3Settings;

/// The scheme of an S3 location.
pub const S3_SCHEME: &str = "s3://";

/// A bucket and a key prefix (no leading or trailing `/`; empty for the whole bucket).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct S3Location {
    pub bucket: String,
    pub prefix: String,
}

impl S3Location {
    /// Parses `s3://BUCKET` or `s3://BUCKET/PREFIX`. Bucket names follow S3's rules (3 to 63
    /// of lowercase letters, digits, `.` and `-`); the prefix may not contain `..`, `.` or
    /// empty segments, so a root's names cannot reach outside it.
    pub fn parse(s: &str) -> Result<Self, ObjectRootError> {
        let bad = |why: &str| ObjectRootError::Location {
            location: s.to_string(),
            problem: why.to_string(),
        };
        let rest = s
            .strip_prefix(S3_SCHEME)
            .ok_or_else(|| bad("expected s3://BUCKET/PREFIX"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
        if !bucket_ok {
            return Err(bad(
                "bucket names are 3 to 63 lowercase letters, digits, '.' and '-'",
            ));
        }
        let prefix = prefix.trim_end_matches('/');
        if !is_plain_path(prefix) {
            return Err(bad("the prefix may not hold empty, '.' or '..' segments"));
        }
        Ok(S3Location {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }

    /// The key of `name` under the prefix.
    pub fn key(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}/{name}", self.prefix)
        }
    }
}

/// The S3 backend: `s3://BUCKET[/PREFIX]`, a bucket on AWS S3 or any S3-compatible server.
pub(crate) const S3_BACKEND: Backend = Backend {
    scheme: S3_SCHEME,
    open: open_s3,
};

fn open_s3(uri: &str, settings: &S3Settings) -> Result<StorePlace, ObjectRootError> {
    S3Location::parse(uri)?.place(settings)
}

impl S3Location {
    /// Its bucket's store, reached with `settings` (and the `AWS_*` variables they leave
    /// unset), and its prefix in it. Nothing is requested until the place is used.
    pub fn place(&self, settings: &S3Settings) -> Result<StorePlace, ObjectRootError> {
        Ok(StorePlace::new(
            settings.store(self)?,
            format!("{S3_SCHEME}{}", self.bucket),
            self.prefix.clone(),
            settings,
        ))
    }
}

impl fmt::Display for S3Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{S3_SCHEME}{}", self.bucket)?;
        if !self.prefix.is_empty() {
            write!(f, "/{}", self.prefix)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_buckets_and_prefixes() {
        let l = S3Location::parse("s3://corpus-1/web/2024/").unwrap();
        assert_eq!(
            (l.bucket.as_str(), l.prefix.as_str()),
            ("corpus-1", "web/2024")
        );
        assert_eq!(l.to_string(), "s3://corpus-1/web/2024");
        assert_eq!(l.key("a.bin"), "web/2024/a.bin");
        let l = S3Location::parse("s3://lab").unwrap();
        assert_eq!((l.prefix.as_str(), l.key("x")), ("", "x".to_string()));
        assert_eq!(l.to_string(), "s3://lab");
    }

    #[test]
    fn refuses_what_is_not_a_location() {
        let msg = |s: &str| S3Location::parse(s).unwrap_err().to_string();
        assert_eq!(
            msg("/data"),
            "\"/data\": not an object-store location: expected s3://BUCKET/PREFIX"
        );
        assert_eq!(
            msg("s3://Bad_Bucket/x"),
            "\"s3://Bad_Bucket/x\": not an object-store location: bucket names are 3 to 63 \
             lowercase letters, digits, '.' and '-'"
        );
        assert_eq!(
            msg("s3://lab/a/../b"),
            "\"s3://lab/a/../b\": not an object-store location: the prefix may not hold \
             empty, '.' or '..' segments"
        );
        assert!(S3Location::parse("s3://").is_err());
        assert!(S3Location::parse("s3://lab//x").is_err());
    }
}
