//! Where bytes come from and go to: the I/O edge around the pure format layer.
//!
//! A [`Root`] is a store of named objects (a directory: [`LocalRoot`]; memory:
//! [`InMemoryRoot`]; a bucket later): it lists, stats and opens them. An opened object is a
//! [`ReadAt`] (positional reads of a known-length object, the shape of both `pread` and an S3
//! ranged GET, as in `object_store`). [`Dataset`] opens any supported format from a path or
//! from a root and reads token ranges, fetching only the bytes that cover them. [`DatasetWriter`] streams tokens into any format and commits
//! atomically (temporary file + rename), so a failed write never leaves a half-written file
//! under the destination name.
//!
//! Reads use `pread` into reusable buffers, not `mmap`: a streaming pass over a 10 GB file must
//! keep its resident set bounded, and mapped pages would count against it; and on one pass a
//! map is slower, not faster (each page's table entry costs about what copying the page does:
//! `benches/read_paths.rs`). Where a reader
//! maps a file all the same (many small reads), it takes a [`GuardedMap`], which turns the
//! file's truncation under it into an error instead of SIGBUS.

mod backend;
mod block_cache;
mod cache;
mod cache_dir;
#[doc(hidden)]
pub mod conformance;
mod dataset;
mod destination;
mod eod_index;
mod error;
#[cfg(debug_assertions)]
pub mod faulty;
mod guarded_map;
mod local_root;
mod map_budget;
mod memory_root;
mod prefetch;
mod root;
mod size;
pub mod source;
mod writer;

pub use backend::{LocalFile, ReadAt};
pub use block_cache::{BlockCache, BlockCacheStats, CachedRoot};
pub use cache::{CacheStats, DatasetCache};
pub use cache_dir::{cache_dir as index_cache_dir, DEFAULT_MAX_BYTES as INDEX_CACHE_MAX_BYTES};
pub use dataset::{Dataset, Format, OpenOptions, ReadBuffers, SignCheck, TokenReader, SUMS_EXT};
pub use destination::{Destination, LocalFiles, StagedObject};
pub use error::StorageError;
pub use guarded_map::{GuardedMap, MAX_MAPS};
pub use local_root::{LocalRoot, Resolutions};
pub use map_budget::{MapBudget, MapLease, MAP_BUDGET_ENV};
pub use memory_root::InMemoryRoot;
pub use root::{
    datasets, normalize_name, Entry, EntryKind, NameProblem, ObjectMeta, ObjectVersion, Root,
    RootError,
};
pub use size::bytes_of;
pub use source::{check_ranges, open_options, LocalSource, SharedReads, SourceError, TokenSource};
pub use writer::{megatron_prefix_of, DatasetWriter, OutputFormat, WriteReport};
