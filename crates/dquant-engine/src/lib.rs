//! The plan engine: a plan's schedule driven over its token sources, one batch at a time,
//! and the batch records it encodes.
//!
//! This is the work an agent offloads, and the very same code runs it in a consumer's
//! process: the host API's in-process reader and the agent's sessions both pull batches from
//! a [`Pipeline`], and both encode them with [`RecordEncoder`] or
//! [`Pipeline::next_batch_into`]. That is why offloaded and local runs are byte-identical.
//!
//! The engine knows nothing of sockets, rings or async runtimes. A [`TokenSource`] is where
//! tokens come from: [`LocalSource`] reads a dataset through `dquant-storage`; a dataset on
//! another agent (`dquant_remote::RemoteSource`) implements the same trait.

mod batch;
mod batch_reads;
pub mod doc_section;
mod doc_starts;
mod encode_ahead;
mod error;
mod fit;
pub mod origin_section;
mod origins;
mod pipeline;
mod read_pace;
pub mod record;
mod worker_pool;

pub use batch::{BatchInfo, TokenBatch, Trailer};
pub use encode_ahead::{EncodeAhead, Encoded};
pub use error::EngineError;
pub use fit::check_fits;
pub use pipeline::Pipeline;
pub use read_pace::BatchReads;
pub use record::{
    batch_header, checked_codec, codec_for, plain_codec, plain_record, plain_record_len,
    put_trailer, RecordEncoder,
};
// The sources a pipeline reads, defined with the datasets below it.
pub use dquant_storage::source::{
    check_ranges, open_options, LocalSource, SharedReads, SourceError, TokenSource,
};
pub use worker_pool::{WorkerPool, DEFAULT_MIN_SHARE};
