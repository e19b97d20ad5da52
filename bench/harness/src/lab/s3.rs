//! The lab's S3 side: the client settings for its s3s-fs server, and staging a corpus into
//! it.
//!
//! The baseline reader itself (the training host pulling raw int32 tokens of a Megatron
//! `.bin` by ranged GETs and narrowing them in its own process) is the product's object-store
//! path: `dquant_objstore`'s root over the bucket, read by `Dataset` and `LocalSource` in the
//! consumer's in-process pipeline (`lab::consume`). It reads ahead while reads are sequential
//! (8 MiB parts, 32 MiB ahead: four GETs in flight, like mountpoint-s3's or fsspec's
//! prefetchers) and fetches a shuffled batch's ranges concurrently, so the baseline is
//! limited by the link, not by round trips, and flatters nothing.

use std::sync::Arc;

use anyhow::Context as _;
use bytes::Bytes;
use dquant_objstore::{S3Location, S3Settings};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _};

/// The lab's S3 client settings for `endpoint` (plain HTTP inside its namespaces; two retries
/// at most: a benchmark should see failures, not hide them behind back-off).
pub fn settings(endpoint: &str, access_key: &str, secret_key: &str) -> S3Settings {
    S3Settings {
        endpoint: Some(endpoint.to_string()),
        region: Some("us-east-1".into()),
        access_key_id: Some(access_key.into()),
        secret_access_key: Some(secret_key.into()),
        allow_http: true,
        max_retries: 2,
        ..S3Settings::default()
    }
}

/// An S3 client for `bucket` with `settings`.
pub fn s3_store(settings: &S3Settings, bucket: &str) -> anyhow::Result<Arc<dyn ObjectStore>> {
    let at = S3Location {
        bucket: bucket.to_string(),
        prefix: String::new(),
    };
    settings
        .store(&at)
        .with_context(|| format!("S3 client for s3://{bucket}"))
}

/// Makes sure object `key` holds the bytes of `file`, uploading it with one PUT when the
/// store has no object of that size under `key`. Returns whether it uploaded.
///
/// The lab stages its corpora this way, as any S3 deployment gets its data, rather than by
/// copying files into s3s-fs's directory: s3s-fs keeps each object's ETag in a sidecar it
/// writes on PUT, and without one it hashes the whole file on every GET.
///
/// Runs on a current-thread runtime of the calling thread, so that its connections open in
/// the caller's network namespace.
pub fn ensure_object(
    store: &Arc<dyn ObjectStore>,
    key: &str,
    file: &std::path::Path,
) -> anyhow::Result<bool> {
    let len = std::fs::metadata(file)
        .with_context(|| format!("cannot stat {}", file.display()))?
        .len();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start a tokio runtime")?;
    let path = Path::from(key);
    rt.block_on(async {
        match store.head(&path).await {
            Ok(meta) if meta.size == len => return Ok(false),
            Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(anyhow::Error::new(e).context(format!("HEAD {key}"))),
        }
        let body = Bytes::from(
            std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?,
        );
        store
            .put(&path, body.into())
            .await
            .with_context(|| format!("PUT {key} ({len} bytes)"))?;
        Ok(true)
    })
}
