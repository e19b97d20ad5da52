//! Token sources: where a plan's tokens come from.
//!
//! A plan's pipeline only needs two things of a source: how many tokens it has, and the tokens
//! of a list of ranges. [`TokenSource`] is that, and nothing more, so a local file and a
//! dataset on another agent ([`crate::remote::RemoteSource`]) are interchangeable: that is
//! what lets an agent near the host chain to an agent near the storage.

use std::ops::Range;
use std::path::Path;

use dquant_codec::CodecError;
use dquant_format::{DType, FormatError};
use dquant_plan::Source;
use dquant_storage::{Dataset, Format, OpenOptions, ReadBuffers, StorageError};
use dquant_transport::WireError;

/// Why a source could not be opened or read.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{0}")]
    Storage(#[from] StorageError),
    /// The agent that serves the source refused or failed; its message, verbatim.
    #[error("{0}")]
    Agent(String),
    #[error("{0}")]
    Wire(#[from] WireError),
    #[error("{0}")]
    Codec(#[from] CodecError),
    #[error("cannot reach agent {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Usage(String),
}

/// A dataset a plan reads tokens from.
pub trait TokenSource: Send {
    /// Tokens in the dataset.
    fn tokens(&self) -> u64;

    /// No token of the source is larger than this (from its stored dtype or recorded
    /// maximum). Lets consumers skip range checks that cannot fail.
    fn max_token_bound(&self) -> u32 {
        u32::MAX
    }

    /// Fills `out` with the tokens of `ranges`, back to back; `out` holds exactly their
    /// total length.
    fn read_ranges(&mut self, ranges: &[Range<u64>], out: &mut [u32]) -> Result<(), SourceError>;
}

/// A dataset on this machine.
pub struct LocalSource {
    ds: Dataset,
    bufs: ReadBuffers,
}

impl LocalSource {
    pub fn new(ds: Dataset) -> Self {
        LocalSource {
            ds,
            bufs: ReadBuffers::new(),
        }
    }

    /// Opens `path` as a plan source says (its `dtype` and `eod` apply to raw files).
    pub fn open(path: &Path, source: &Source) -> Result<Self, SourceError> {
        Ok(LocalSource::new(Dataset::open(
            path,
            &open_options(source)?,
        )?))
    }

    pub fn dataset(&self) -> &Dataset {
        &self.ds
    }
}

/// The storage options a plan source asks for.
pub fn open_options(source: &Source) -> Result<OpenOptions, SourceError> {
    let raw_dtype = match &source.dtype {
        Some(d) => Some(
            d.parse::<DType>()
                .map_err(|e: FormatError| SourceError::Usage(e.to_string()))?,
        ),
        None => None,
    };
    Ok(OpenOptions {
        raw_dtype,
        eod: source.eod,
    })
}

impl TokenSource for LocalSource {
    fn tokens(&self) -> u64 {
        self.ds.tokens()
    }

    fn max_token_bound(&self) -> u32 {
        let by_format = match self.ds.format() {
            Format::Megatron { dtype } | Format::Raw { dtype } => dtype.max_token(),
            Format::Block { codec, .. } => codec.width.max_token(),
        };
        self.ds
            .stored_max_token()
            .unwrap_or(by_format)
            .min(by_format)
    }

    fn read_ranges(&mut self, ranges: &[Range<u64>], out: &mut [u32]) -> Result<(), SourceError> {
        let mut at = 0;
        for r in ranges {
            let n = r.end.saturating_sub(r.start) as usize;
            let dst = out.get_mut(at..at + n).ok_or_else(|| {
                SourceError::Usage("read_ranges: the buffer is shorter than the ranges".into())
            })?;
            self.ds.read_into(r.clone(), dst, &mut self.bufs)?;
            at += n;
        }
        Ok(())
    }
}
