//! A bucket prefix as a [`Root`]: list, stat and open through `object_store`.
//!
//! Names are checked by [`normalize_name`] like every root's and become keys under the
//! prefix, so no name reaches an object outside it (object stores have no links to escape
//! by). Listing returns the objects under the prefix with their sizes; stat and open are one
//! HEAD (the open's [`ObjectFile`] then reads by ranged GETs and checks every body against
//! the ETag the HEAD saw).

use std::fmt;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use dquant_storage::{normalize_name, ObjectMeta, ObjectVersion, ReadAt, Root, RootError};
use futures::TryStreamExt as _;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _};

use crate::error::ObjectRootError;
use crate::file::{Counters, ObjectFile, ObjectStats};
use crate::location::S3Location;
use crate::settings::{ReadSettings, S3Settings};
use dquant_runtime::run;

/// Datasets under a prefix of an object store.
pub struct ObjectRoot {
    store: Arc<dyn ObjectStore>,
    /// How the root is named in messages: `s3://BUCKET/PREFIX`.
    location: String,
    prefix: String,
    read: ReadSettings,
    counters: Arc<Counters>,
}

impl fmt::Debug for ObjectRoot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectRoot")
            .field("location", &self.location)
            .finish_non_exhaustive()
    }
}

impl ObjectRoot {
    /// The root at `s3://BUCKET/PREFIX`, reached with `settings` (and the `AWS_*` variables
    /// they leave unset). Nothing is requested until the root is used.
    pub fn s3(at: &S3Location, settings: &S3Settings) -> Result<Self, ObjectRootError> {
        Ok(at.place(settings)?.root())
    }

    /// The root at `prefix` (`/`-separated, may be empty) of any store; `location` names it
    /// in messages.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        location: impl Into<String>,
        prefix: &str,
        read: ReadSettings,
    ) -> Self {
        ObjectRoot {
            store,
            location: location.into(),
            prefix: prefix.trim_matches('/').to_string(),
            read,
            counters: Arc::default(),
        }
    }

    /// `s3://BUCKET/PREFIX`.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// Requests made so far.
    pub fn stats(&self) -> ObjectStats {
        self.counters.snapshot()
    }

    fn key(&self, name: &str) -> Path {
        if self.prefix.is_empty() {
            Path::from(name)
        } else {
            Path::from(format!("{}/{name}", self.prefix))
        }
    }

    fn head(&self, name: &str) -> Result<(String, object_store::ObjectMeta), RootError> {
        let name = normalize_name(name)?;
        let (store, key) = (self.store.clone(), self.key(&name));
        self.counters.heads.fetch_add(1, Ordering::Relaxed);
        match run(async move { store.head(&key).await }) {
            Ok(meta) => Ok((name, meta)),
            Err(e) => Err(root_error(name, e)),
        }
    }
}

fn root_error(name: String, e: object_store::Error) -> RootError {
    match e {
        object_store::Error::NotFound { .. } => RootError::NotFound { name },
        e if below_a_file(&e) => RootError::NotFound { name },
        e => RootError::Io {
            name,
            source: io::Error::other(e.to_string()),
        },
    }
}

/// Whether `e` is a file system's "not a directory": a name below an object's name (`a/b`
/// under the object `a`), which no store holds, so it is not found, as on S3.
fn below_a_file(e: &object_store::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<io::Error>() {
            return io.kind() == io::ErrorKind::NotADirectory;
        }
        source = s.source();
    }
    false
}

/// An object's version: its ETag (what every GET is checked against).
fn version(meta: &object_store::ObjectMeta) -> Option<String> {
    meta.e_tag.clone()
}

impl Root for ObjectRoot {
    fn objects(&self) -> Result<Vec<ObjectMeta>, RootError> {
        let store = self.store.clone();
        let prefix = (!self.prefix.is_empty()).then(|| Path::from(self.prefix.as_str()));
        self.counters.lists.fetch_add(1, Ordering::Relaxed);
        let listed = run(async move {
            store
                .list(prefix.as_ref())
                .try_collect::<Vec<object_store::ObjectMeta>>()
                .await
        })
        .map_err(|e| root_error(self.location.clone(), e))?;
        let strip = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        };
        let mut out: Vec<ObjectMeta> = listed
            .iter()
            .filter_map(|m| {
                let name = m.location.as_ref().strip_prefix(strip.as_str())?;
                // Keys no name could open (`a//b`, `./x`) are not listed.
                (normalize_name(name).ok()? == name)
                    .then(|| ObjectMeta::new(name, m.size, version(m).map(ObjectVersion::tag)))
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn stat(&self, name: &str) -> Result<ObjectMeta, RootError> {
        let (name, meta) = self.head(name)?;
        Ok(ObjectMeta::new(
            name,
            meta.size,
            version(&meta).map(ObjectVersion::tag),
        ))
    }

    fn open(&self, name: &str) -> Result<Box<dyn ReadAt>, RootError> {
        let (_, meta) = self.head(name)?;
        let etag = version(&meta);
        Ok(Box::new(ObjectFile::new(
            self.store.clone(),
            meta.location,
            meta.size,
            etag,
            self.read,
            self.counters.clone(),
        )))
    }
}
