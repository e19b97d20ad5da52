//! Lossless codecs for token ids.
//!
//! Token ids live in memory as `u32`: every tokenizer in use has fewer than 2^32 ids, and a
//! single in-memory type keeps every kernel monomorphic and easy to vectorise. A [`Codec`] is a
//! storage [`Width`] (`u16`, `bits:17`, `i32`, ...) optionally wrapped in a [`Compression`]
//! (`zstd:L`, `lz4`, `lz4hc:L`), or renumbered by frequency first ([`RankTable`], `rank+zstd:L`, the
//! archive codec). It is the unit of representation for a block of tokens: on disk in the
//! dquant block file, and on the wire between agents (every codec but `rank+zstd`, whose table
//! belongs to a stored dataset).
//!
//! Why this crate is pure: the same kernels run in `dquant convert`, in the agent near storage,
//! on a DPU's ARM cores and in the host client. Keeping them free of I/O and async makes them
//! trivially testable (property tests over every width) and benchmarkable against `memcpy`.
//!
//! Encoding *validates*: a token that does not fit the width fails the whole encode with
//! [`CodecError::OutOfRange`], naming the offset, the value and the narrowest width that would
//! fit. Nothing is ever truncated silently. Decoding validates too: a stored `i32`/`i64` value
//! that is not a token id is an error, never a wrapped number.

#[cfg(target_endian = "big")]
compile_error!("dquant's codecs assume a little-endian target (x86_64, aarch64)");

mod bitpack;
mod bytecode;
mod codec;
mod compress;
mod error;
mod hash;
pub mod kernels;
mod ranks;
mod stream;
mod width;

pub use codec::{decode_width, encode_width, Codec, Decoder, Encoder};
pub use compress::{Compression, LZ4HC_DEFAULT, LZ4HC_LEVELS, STREAM_DEFAULT};
pub use error::CodecError;
pub use hash::TokenHasher;
pub use ranks::{RankEncoder, RankTable, MAX_RANKED_IDS};
pub use stream::MAX_LANES;
pub use width::{bits_needed, Width};
