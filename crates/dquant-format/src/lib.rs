//! Token dataset formats, as pure parsers and encoders over byte slices.
//!
//! This crate never opens a file. Parsers take the bytes a caller read (from a local file, an
//! S3 ranged GET, or a peer agent) and say what they mean; encoders produce the bytes to write.
//! Keeping the format layer free of I/O, as `quinn-proto` keeps QUIC's state machine free of
//! sockets, lets the same code serve `dquant convert`, the agent's block server and the fuzz
//! targets, and lets `dquant-storage` decide how bytes are fetched (pread, mmap, ranged GET).
//!
//! Three formats:
//! - [`megatron`]: Megatron-Core's `IndexedDataset` (`.idx` + `.bin`). We read what Megatron
//!   writes and write what it reads, byte for byte.
//! - raw little-endian token files: a [`DType`] and nothing else (see [`DType::decode`]).
//! - [`block`]: dquant's block file, self-describing, checksummed, 1 MiB blocks with random
//!   access by token offset.
//!
//! Every format carries the same logical content: a token stream plus a [`DocIndex`] of
//! sequence and document boundaries. [`ContentChecksum`] hashes that content independently of
//! the format and codec. A Megatron `.bin` carries no checksums of its own; [`chunk_sums`] is
//! the sidecar that gives it some.

pub mod block;
pub mod chunk_sums;
mod content;
mod dtype;
mod error;
pub mod idx_layout;
mod index;
pub mod megatron;
mod varint;

pub use content::ContentChecksum;
pub use dtype::DType;
pub use error::FormatError;
pub use index::{DocIndex, DocIndexBuilder};
