//! Object-store roots: datasets in S3-compatible buckets (AWS S3, MinIO, Ceph RGW), served
//! like a local directory.
//!
//! An agent given `--root corpus=s3://BUCKET/PREFIX` holds an [`ObjectRoot`]: the storage
//! layer's [`Root`](dquant_storage::Root) over the `object_store` crate. Everything above the
//! storage layer (the catalog, `Dataset::open_in`, sessions) is unchanged: a Megatron pair,
//! a `.dqb` or a raw object opens and reads as from a directory, each read a ranged GET (or
//! several, in flight together; sequential reads are read ahead, see `file.rs`). The root
//! passes the same conformance suite as the local and in-memory roots.
//!
//! [`ObjectDestination`] is the other direction: `dquant convert` writes its outputs into a
//! bucket as multipart uploads, completed only when the whole output is written.
//!
//! Crate layout: `backends.rs` is the registry of URI schemes ([`locate`] turns any location
//! into a local path or a [`StorePlace`]), `backend.rs` what a backend is; the backends are
//! [`location`](S3Location) (`s3://`) and `local_store.rs` (`file://`). [`settings`](S3Settings)
//! turns the config and the `AWS_*` variables into a client, `root.rs` lists, stats and
//! opens, `file.rs` reads; the async client's requests run on the process's one runtime
//! (`dquant-runtime`), which the storage layer's blocking reads wait on.

mod backend;
mod backends;
mod destination;
mod error;
mod file;
mod local_store;
mod location;
mod root;
mod settings;

pub use backend::{Backend, StorePlace};
pub use backends::{backend_of, is_object_uri, locate, schemes, Place, BACKENDS};
pub use destination::ObjectDestination;
pub use error::{InvalidSetting, ObjectRootError};
pub use file::ObjectStats;
pub use location::{S3Location, S3_SCHEME};
pub use root::ObjectRoot;
pub use settings::{install_tls_provider, ReadSettings, S3Settings};
