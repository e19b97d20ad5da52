//! Where bytes come from and go to: the I/O edge around the pure format layer.
//!
//! [`ReadAt`] is the one trait a backend implements (positional reads of known-length
//! objects, the shape of both `pread` and an S3 ranged GET, as in `object_store`).
//! [`Dataset`] opens any supported format over it and reads token ranges, fetching only the
//! bytes that cover them. [`DatasetWriter`] streams tokens into any format and commits
//! atomically (temporary file + rename), so a failed write never leaves a half-written file
//! under the destination name.
//!
//! Reads use `pread` into reusable buffers, not `mmap`: a streaming pass over a 10 GB file must
//! keep its resident set bounded, and mapped pages would count against it.

mod backend;
mod dataset;
mod error;
mod writer;

pub use backend::{LocalFile, ReadAt};
pub use dataset::{Dataset, Format, OpenOptions, ReadBuffers, TokenReader};
pub use error::StorageError;
pub use writer::{megatron_prefix_of, DatasetWriter, OutputFormat, WriteReport};
