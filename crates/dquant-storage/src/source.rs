//! Token sources: where a plan's tokens come from.
//!
//! A plan's pipeline only needs two things of a source: how many tokens it has, and the tokens
//! of a list of ranges. [`TokenSource`] is that, and nothing more, so a local file and a
//! dataset on another agent (`dquant_remote::RemoteSource`) are interchangeable: that is
//! what lets an agent near the host chain to an agent near the storage.
//!
//! It lives here, with the datasets, rather than in the engine that reads it, so that the
//! sources of every kind (local here, remote in `dquant-remote`) depend down on one trait and
//! never on the engine above them.

use std::io::IoSliceMut;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use crate::{Dataset, Format, MapBudget, OpenOptions, ReadBuffers, Root, SignCheck, StorageError};
use dquant_codec::{CodecError, Width};
use dquant_format::{DType, DocIndex, FormatError};
use dquant_plan::Source;
use dquant_wire::WireError;

/// Why a source could not be opened or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    #[error("{0}")]
    Storage(#[from] StorageError),
    /// The agent that serves the source refused or failed; its message, verbatim.
    #[error("{0}")]
    Agent(String),
    /// The agent has no such dataset (or root); its message, verbatim.
    #[error("{0}")]
    NotFound(String),
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

impl SourceError {
    /// Whether stored bytes failed their checksum ([`StorageError::is_corrupt`]).
    pub fn is_corrupt(&self) -> bool {
        matches!(self, SourceError::Storage(e) if e.is_corrupt())
    }

    /// Whether the dataset does not exist: a missing local file or object, or a dataset (or
    /// root) the agent does not have.
    pub fn is_not_found(&self) -> bool {
        match self {
            SourceError::NotFound(_) => true,
            SourceError::Storage(e) => e.is_not_found(),
            _ => false,
        }
    }
}

/// Tokens in `ranges` all told (a range that runs backwards counts none).
pub fn ranges_tokens(ranges: &[Range<u64>]) -> u64 {
    ranges.iter().map(|r| r.end.saturating_sub(r.start)).sum()
}

/// Refuses ranges that run backwards or do not add up to `out`'s length: what every
/// [`TokenSource::read_ranges`] that is not handed its ranges by a plan checks first.
pub fn check_ranges(ranges: &[Range<u64>], out: &[u32]) -> Result<(), SourceError> {
    let total = ranges_tokens(ranges);
    if total != out.len() as u64 || ranges.iter().any(|r| r.end < r.start) {
        return Err(SourceError::Usage(
            "read_ranges: the buffer does not match the ranges".into(),
        ));
    }
    Ok(())
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

    /// [`read_ranges`](TokenSource::read_ranges) for a caller that narrows the tokens into a
    /// width of at most 31 bits next, checking every token's range as it does: a source may
    /// leave out the checks that narrowing repeats (a plain int32 file's sign check,
    /// [`SignCheck`]). When the narrowing fails, the caller reads the ranges again with
    /// `read_ranges`, which names what was wrong. By default, `read_ranges`.
    fn read_ranges_to_narrow(
        &mut self,
        ranges: &[Range<u64>],
        out: &mut [u32],
    ) -> Result<(), SourceError> {
        self.read_ranges(ranges, out)
    }

    /// The width the source stores its tokens in, when its stored bytes are exactly that
    /// width's little-endian encoding and every stored value is a valid token of it (so
    /// copying them needs no conversion and no check): e.g. `u16` for a Megatron uint16
    /// dataset. `None` (the default) when tokens must be decoded.
    fn stored_width(&self) -> Option<Width> {
        None
    }

    /// Copies the stored bytes of the tokens from `start` into `bufs`, in order (each a whole
    /// number of tokens of [`stored_width`](TokenSource::stored_width)). Only called when
    /// that is `Some`.
    fn read_stored(&mut self, start: u64, bufs: &mut [IoSliceMut<'_>]) -> Result<(), SourceError> {
        let _ = (start, bufs);
        Err(SourceError::Usage(
            "read_stored: this source has no stored width to copy".into(),
        ))
    }

    /// A hint: a batch is about to read `ranges` (token ranges, in any order). A source whose
    /// reads are round trips (an object store behind it) starts them all now; the default
    /// does nothing.
    fn will_read(&self, ranges: &[Range<u64>]) {
        let _ = ranges;
    }

    /// The source's document index, for plans with `boundaries = "documents"`: `None` (the
    /// default) when the source does not carry one (a dataset on another agent), else the
    /// index, read and checked on first use.
    fn document_index(&self) -> Option<Result<&DocIndex, SourceError>> {
        None
    }

    /// The source's reads, when they need no exclusive state: a batch's reads of it may then
    /// run on several threads at once (a `dquant_engine::WorkerPool`). `None` (the
    /// default): they run one after another, through `&mut self`.
    fn shared_reads(&self) -> Option<&dyn SharedReads> {
        None
    }

    /// Narrows the tokens of `ranges`, back to back, into `out` (`width`'s little-endian bytes
    /// a token) straight from memory the source keeps mapped, every token checked to fit:
    /// `true` when done. `false` (the default) where the source keeps no such memory, or the
    /// tokens did not narrow cleanly; nothing is promised about `out` then, and the caller
    /// reads the ranges with [`read_ranges`](TokenSource::read_ranges), which names what was
    /// wrong.
    fn narrow_kept(&self, ranges: &[Range<u64>], width: Width, out: &mut [u8]) -> bool {
        let _ = (ranges, width, out);
        false
    }
}

/// Reads that several threads may make at once: what a local dataset offers (each is one
/// positional read), and a remote one does not (it answers a batch's ranges in one round
/// trip, on its connection).
pub trait SharedReads: Sync {
    /// As [`TokenSource::read_stored`].
    fn read_stored_at(&self, start: u64, bufs: &mut [IoSliceMut<'_>]) -> Result<(), SourceError>;

    /// The tokens of `range` into `out` (exactly its length), using the calling thread's
    /// buffers `bufs`.
    fn read_range(
        &self,
        range: Range<u64>,
        out: &mut [u32],
        bufs: &mut ReadBuffers,
    ) -> Result<(), SourceError>;

    /// The tokens of `ranges`, one after another, into `out` (exactly their total length):
    /// by default one [`read_range`](SharedReads::read_range) each.
    fn read_ranges_at(
        &self,
        ranges: &[Range<u64>],
        out: &mut [u32],
        bufs: &mut ReadBuffers,
    ) -> Result<(), SourceError> {
        let mut at = 0usize;
        for r in ranges {
            let n = r.end.saturating_sub(r.start) as usize;
            let dst = out.get_mut(at..at + n).ok_or_else(|| {
                SourceError::Usage("read_ranges_at: the buffer is shorter than the ranges".into())
            })?;
            self.read_range(r.clone(), dst, bufs)?;
            at += n;
        }
        Ok(())
    }
}

impl SharedReads for Dataset {
    fn read_stored_at(&self, start: u64, bufs: &mut [IoSliceMut<'_>]) -> Result<(), SourceError> {
        Ok(self.read_stored_vectored(start, bufs)?)
    }

    fn read_range(
        &self,
        range: Range<u64>,
        out: &mut [u32],
        bufs: &mut ReadBuffers,
    ) -> Result<(), SourceError> {
        if out.len() as u64 != range.end.saturating_sub(range.start) {
            return Err(SourceError::Usage(
                "read_range: the buffer is not the range's length".into(),
            ));
        }
        Ok(self.read_into(range, out, bufs)?)
    }

    /// Runs of continuing ranges in one vectored read each ([`Dataset::read_ranges_into`]).
    fn read_ranges_at(
        &self,
        ranges: &[Range<u64>],
        out: &mut [u32],
        bufs: &mut ReadBuffers,
    ) -> Result<(), SourceError> {
        let total = ranges_tokens(ranges);
        if out.len() as u64 != total {
            return Err(SourceError::Usage(
                "read_ranges_at: the buffer is not the ranges' length".into(),
            ));
        }
        Ok(self.read_ranges_into(ranges, out, bufs)?)
    }
}

/// A dataset on this machine.
pub struct LocalSource {
    /// Shared with every other session reading the same dataset (an agent's
    /// [`DatasetCache`](crate::DatasetCache)); the read buffers are this source's.
    ds: Arc<Dataset>,
    bufs: ReadBuffers,
    /// Narrows from a map kept with the dataset, within this budget
    /// ([`LocalSource::keeping_map`]).
    maps: Option<Arc<MapBudget>>,
}

impl LocalSource {
    pub fn new(ds: Dataset) -> Self {
        Self::shared(Arc::new(ds))
    }

    /// A source over a dataset other sources may be reading too.
    pub fn shared(ds: Arc<Dataset>) -> Self {
        LocalSource {
            ds,
            bufs: ReadBuffers::new(),
            maps: None,
        }
    }

    /// With a budget, a plain int32 dataset's tokens are narrowed straight from a map kept as
    /// long as the dataset is open, if the budget has room for its file at the first batch
    /// ([`Dataset::narrow_kept`]: no copy out of the page cache, for page tables held as long
    /// as the dataset). `None`, the default, reads by `pread`.
    pub fn keeping_map(mut self, budget: Option<Arc<MapBudget>>) -> Self {
        self.maps = budget;
        self
    }

    /// Opens `path` as a plan source says (its `dtype` and `eod` apply to raw files).
    pub fn open(path: &Path, source: &Source) -> Result<Self, SourceError> {
        Ok(LocalSource::new(Dataset::open(
            path,
            &open_options(source)?,
        )?))
    }

    /// Opens the dataset `name` under `root` as a plan source says.
    pub fn open_in(root: &dyn Root, name: &str, source: &Source) -> Result<Self, SourceError> {
        let opts = open_options(source)?;
        Ok(LocalSource::new(Dataset::open_in(root, name, &opts)?))
    }

    pub fn dataset(&self) -> &Dataset {
        &self.ds
    }

    fn read_ranges_checking(
        &mut self,
        ranges: &[Range<u64>],
        out: &mut [u32],
        sign: SignCheck,
    ) -> Result<(), SourceError> {
        let total = ranges_tokens(ranges);
        let dst = out.get_mut(..total as usize).ok_or_else(|| {
            SourceError::Usage("read_ranges: the buffer is shorter than the ranges".into())
        })?;
        Ok(self
            .ds
            .read_ranges_checking(ranges, dst, &mut self.bufs, sign)?)
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

    fn stored_width(&self) -> Option<Width> {
        match self.ds.format() {
            // Only unsigned 16-bit: every stored value is a valid token. Signed stored
            // dtypes may hold negative values, which decoding rejects.
            Format::Megatron { dtype: DType::U16 } | Format::Raw { dtype: DType::U16 } => {
                Some(Width::U16)
            }
            _ => None,
        }
    }

    fn read_stored(&mut self, start: u64, bufs: &mut [IoSliceMut<'_>]) -> Result<(), SourceError> {
        Ok(self.ds.read_stored_vectored(start, bufs)?)
    }

    fn shared_reads(&self) -> Option<&dyn SharedReads> {
        Some(&*self.ds)
    }

    fn will_read(&self, ranges: &[Range<u64>]) {
        self.ds.will_read(ranges);
    }

    fn document_index(&self) -> Option<Result<&DocIndex, SourceError>> {
        Some(self.ds.index().map_err(SourceError::from))
    }

    fn narrow_kept(&self, ranges: &[Range<u64>], width: Width, out: &mut [u8]) -> bool {
        self.maps
            .as_ref()
            .is_some_and(|b| self.ds.narrow_kept(ranges, width, out, b))
    }

    fn read_ranges(&mut self, ranges: &[Range<u64>], out: &mut [u32]) -> Result<(), SourceError> {
        self.read_ranges_checking(ranges, out, SignCheck::Here)
    }

    fn read_ranges_to_narrow(
        &mut self,
        ranges: &[Range<u64>],
        out: &mut [u32],
    ) -> Result<(), SourceError> {
        self.read_ranges_checking(ranges, out, SignCheck::ByNarrowing)
    }
}
