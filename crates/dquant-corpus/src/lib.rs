//! Deterministic token corpora for dquant's tests and benchmarks.
//!
//! dquant moves token data (narrowing, bit-packing, compressing, blending, packing); to test and
//! benchmark that honestly it needs token streams that look like the real thing, and that anyone
//! can regenerate byte for byte without downloading a dataset. This crate provides two sources:
//!
//! * [`RealCorpus`]: real text that is already on every Rust developer's machine -- the crate
//!   sources Cargo unpacked under `$CARGO_HOME/registry/src` -- tokenized with one of the
//!   tokenizers bundled (offline) in `tiktoken-rs` ([`Encoding`]). Real token streams have the
//!   skewed, bursty id distribution that decides how well codecs compress; random data does not.
//! * [`Zipf`]: a seeded synthetic generator whose ids follow a Zipf rank-frequency law, for volume
//!   (gigabytes of tokens in seconds) with a known distribution and no dependency on the machine.
//!
//! Both hand **documents** (token slices, ending with the end-of-document token when one is
//! configured) to a caller-supplied callback, in a deterministic order. This crate deliberately
//! writes no dataset files: the caller (e.g. the Megatron writer in `dquant-format`) decides the
//! on-disk format, and this crate stays free of any format dependency.
//!
//! Determinism: for the same input files (or the same [`Zipf`] parameters) the emitted token
//! stream is identical, byte for byte, regardless of thread count or scheduling.
//!
//! ```no_run
//! use dquant_corpus::{CorpusError, Encoding, RealCorpus, Zipf};
//!
//! // Real text: the first ~20 MB of local crate sources, GPT-2 tokenizer.
//! let mut corpus = RealCorpus::new(Encoding::R50k);
//! corpus.max_bytes = Some(20 << 20);
//! let mut tokens = Vec::new();
//! let stats = corpus.generate(
//!     |doc: &[u32]| -> Result<(), CorpusError> {
//!         tokens.extend_from_slice(doc);
//!         Ok(())
//!     },
//!     |done, total| eprintln!("{done}/{total} bytes"),
//! )?;
//! assert_eq!(stats.tokens, tokens.len() as u64);
//!
//! // Synthetic volume: 10M tokens over a 50k vocabulary, documents ending in id 50256.
//! let mut zipf = Zipf::new(50_257, 42, 10_000_000);
//! zipf.eod_token = Some(50_256);
//! let stats = zipf.generate(|doc: &[u32]| -> Result<(), CorpusError> { Ok(()) })?;
//! assert_eq!(stats.tokens, 10_000_000);
//! # Ok::<(), CorpusError>(())
//! ```

#![warn(missing_docs)]

mod encoding;
mod error;
mod ordered;
mod real;
mod zipf;

pub use encoding::Encoding;
pub use error::CorpusError;
pub use real::{default_source_root, RealCorpus};
pub use zipf::Zipf;

/// What a generator produced. Returned by [`RealCorpus::generate`] and [`Zipf::generate`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct CorpusStats {
    /// Source files read, including the ones skipped as non-UTF-8 (always 0 for [`Zipf`]).
    pub files: u64,
    /// Source files skipped because their contents are not valid UTF-8 (always 0 for [`Zipf`]).
    pub skipped_non_utf8: u64,
    /// Bytes of source files read, including skipped files (always 0 for [`Zipf`]).
    pub source_bytes: u64,
    /// Documents handed to the callback.
    pub documents: u64,
    /// Tokens handed to the callback, end-of-document tokens included.
    pub tokens: u64,
    /// Largest token id handed to the callback (end-of-document tokens included); 0 if none.
    pub max_token: u32,
}
