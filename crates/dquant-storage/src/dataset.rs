//! Opening token datasets of any supported format and reading token ranges from them.
//!
//! A dataset opens the same way wherever its bytes are: from a local path (the command line)
//! or from a name under a [`Root`] (an agent's catalog). Both go through one private
//! `Objects` seam, so format recognition and reading exist once, and the dataset holds its
//! data object as a [`ReadAt`] trait object whatever store it came from.

use std::fmt;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use dquant_codec::{Codec, RankTable};
use dquant_format::block::{BlockLayout, FooterHead};
use dquant_format::chunk_sums::ChunkSums;
use dquant_format::{ContentChecksum, DType, DocIndex, FormatError};

use crate::backend::ReadAt;
use crate::error::StorageError;
use crate::root::{ObjectVersion, Root};

mod index;
mod kept_map;
mod objects;
mod open;
mod read;
mod sums;

use index::Index;
pub use open::SUMS_EXT;
pub use read::{ReadBuffers, SignCheck, TokenReader};

/// How to interpret files that do not describe themselves.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenOptions {
    /// Element type of a raw token file (required for raw files).
    pub raw_dtype: Option<DType>,
    /// End-of-document token of a raw file: each occurrence ends a document. Without it a raw
    /// file is one document.
    pub eod: Option<u32>,
}

/// The on-disk format of an opened dataset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Megatron { dtype: DType },
    Raw { dtype: DType },
    Block { codec: Codec, block_tokens: u32 },
}

impl Format {
    pub fn name(&self) -> &'static str {
        match self {
            Format::Megatron { .. } => "megatron",
            Format::Raw { .. } => "raw",
            Format::Block { .. } => "dqb",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Format::Megatron { dtype } => {
                write!(f, "Megatron IndexedDataset ({})", dtype.numpy_name())
            }
            Format::Raw { dtype } => write!(f, "raw token file ({})", dtype.numpy_name()),
            Format::Block {
                codec,
                block_tokens,
            } => {
                write!(
                    f,
                    "dquant block file ({codec}, {block_tokens} tokens per block)"
                )
            }
        }
    }
}

impl fmt::Debug for Dataset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dataset")
            .field("path", &self.path)
            .field("format", &self.format)
            .field("tokens", &self.tokens())
            .finish_non_exhaustive()
    }
}

enum Source {
    Plain {
        file: Box<dyn ReadAt>,
        dtype: DType,
        /// The file's chunk sums, when a sidecar came with it (Megatron `PREFIX.dqsum`):
        /// every read is checked against them.
        sums: Option<Box<sums::CheckedChunks>>,
    },
    Block {
        file: Box<dyn ReadAt>,
        meta: Box<BlockLayout>,
    },
}

/// An opened token dataset: its boundaries in memory, its tokens on storage.
pub struct Dataset {
    /// Process-unique identity, so read buffers never serve one dataset's cached block for
    /// another's.
    id: u64,
    path: PathBuf,
    data_path: PathBuf,
    format: Format,
    index: Index,
    source: Source,
    size: u64,
    /// The objects it was opened from and their versions then (as their readers said).
    versions: Vec<(PathBuf, Option<ObjectVersion>)>,
    /// The largest token, found by [`Dataset::max_token`]'s scan (formats that do not store it).
    scanned_max: OnceLock<u32>,
    /// The plain int32 or uint16 file mapped for as long as the dataset is open, made on first use
    /// within a [`crate::MapBudget`] ([`Dataset::narrow_kept`]); `None` inside where it
    /// cannot be or the budget had no room then.
    kept: OnceLock<Option<(crate::GuardedMap, crate::MapLease)>>,
}

/// Fills `buf` from `off` of `file` (named `name` in errors); a short file is a truncation.
pub(super) fn read_at(
    file: &dyn ReadAt,
    name: &Path,
    buf: &mut [u8],
    off: u64,
) -> Result<(), StorageError> {
    file.read_exact_at(buf, off)
        .map_err(|e| read_error(file, name, off + buf.len() as u64, e))
}

/// A file of `len` bytes when opened that a read ending at `needed` found shorter.
pub(crate) fn shrunk_while_read(name: &Path, len: u64, needed: u64) -> StorageError {
    let reason = format!(
        "the file is shorter than when it was opened ({len} bytes; a read needed {needed}): \
         it was truncated or rewritten while being read"
    );
    StorageError::io(name, std::io::Error::new(ErrorKind::UnexpectedEof, reason))
}

/// A file of `len` bytes that a read ending at `needed` runs past: shorter than its format
/// (or index) says it is.
pub(crate) fn shorter_than_needed(name: &Path, len: u64, needed: u64) -> StorageError {
    StorageError::format(name, FormatError::truncated("file", needed, len))
}

/// A failed read as the storage error that says why: a file shorter than its format needs,
/// or one that became shorter than it was when opened (truncated or rewritten while served:
/// the reader gets this error, never a signal).
pub(super) fn read_error(
    file: &dyn ReadAt,
    name: &Path,
    needed: u64,
    e: std::io::Error,
) -> StorageError {
    if e.kind() == ErrorKind::UnexpectedEof && needed <= file.len() {
        shrunk_while_read(name, file.len(), needed)
    } else if e.kind() == ErrorKind::UnexpectedEof {
        shorter_than_needed(name, file.len(), needed)
    } else {
        StorageError::io(name, e)
    }
}

pub(super) fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl Dataset {
    /// Whether every object this dataset was opened from is still the version it read
    /// (its root's `stat` says so): `false` for one replaced, rewritten, removed, or whose
    /// store cannot tell.
    pub fn is_current_in(&self, root: &dyn Root) -> bool {
        self.versions.iter().all(|(name, v)| {
            let now = name.to_str().and_then(|n| root.stat(n).ok());
            matches!((v, now), (Some(v), Some(m)) if m.version.as_ref() == Some(v))
        })
    }

    /// Whether its store gave every object it was opened from a version.
    pub fn is_versioned(&self) -> bool {
        self.versions.iter().all(|(_, v)| v.is_some())
    }

    /// Whether `other` was opened from the same objects, in the same versions.
    pub fn same_versions(&self, other: &Dataset) -> bool {
        self.is_versioned() && self.versions == other.versions
    }

    /// The path the dataset was opened by (the prefix, for Megatron datasets); for a dataset
    /// opened under a root, its name there.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file holding the token data (`.bin`, `.dqb` or the raw file); its name, for a
    /// dataset opened under a root.
    pub fn data_path(&self) -> &Path {
        &self.data_path
    }

    pub fn format(&self) -> Format {
        self.format
    }

    /// The local file holding a plain dataset's tokens (a Megatron `.bin` or a raw file,
    /// from a path or a directory root), already open, for a caller that maps it; `None` for
    /// block files, objects in other stores, and files with chunk sums (their reads must go
    /// through the dataset, which checks them).
    pub fn plain_local_file(&self) -> Option<&std::fs::File> {
        match &self.source {
            Source::Plain {
                file, sums: None, ..
            } => file.local_file(),
            _ => None,
        }
    }

    /// The chunk sums every read of a plain file is checked against, and the sidecar they
    /// came from, when it has one.
    pub fn chunk_sums(&self) -> Option<(&ChunkSums, &Path)> {
        match &self.source {
            Source::Plain { sums: Some(s), .. } => Some((s.sums(), s.sidecar())),
            _ => None,
        }
    }

    /// A block file's footer head and data object, which its `Index::Footer` reads through.
    fn footer_parts(&self) -> (&FooterHead, &dyn ReadAt) {
        match &self.source {
            Source::Block { file, meta } => (&meta.footer, &**file),
            Source::Plain { .. } => unreachable!("a block file's index without its blocks"),
        }
    }

    /// The document index, read whole (and checked entry by entry) on first use for a
    /// Megatron dataset, and found by a scan (or read from its cache entry) for a raw file
    /// with `eod`: serving tokens never needs it.
    pub fn index(&self) -> Result<&DocIndex, StorageError> {
        match &self.index {
            Index::Loaded(ix) => Ok(ix),
            Index::Lazy(lazy) => lazy.get(),
            Index::Footer(f) => {
                let (head, file) = self.footer_parts();
                f.get(head, file, &self.path)
            }
            Index::Eod(e) => e.index(&|f| self.scan_all(f)),
        }
    }

    pub fn tokens(&self) -> u64 {
        match &self.index {
            Index::Loaded(ix) => ix.tokens(),
            Index::Lazy(lazy) => lazy.tokens,
            Index::Footer(_) => self.footer_parts().0.token_count,
            Index::Eod(e) => e.tokens,
        }
    }

    /// Documents: from the index's header (Megatron) or footer (block files); for a raw file
    /// with `eod`, from its cache entry or, the first time, a scan of the whole file.
    pub fn documents(&self) -> Result<u64, StorageError> {
        match &self.index {
            Index::Loaded(ix) => Ok(ix.documents() as u64),
            Index::Lazy(lazy) => Ok(lazy.header.documents()),
            Index::Footer(_) => Ok(self.footer_parts().0.documents),
            Index::Eod(e) => e.documents(&|f| self.scan_all(f)),
        }
    }

    /// Sequences, found as [`documents`](Dataset::documents) are (a raw file's documents are
    /// one sequence each).
    pub fn sequences(&self) -> Result<u64, StorageError> {
        match &self.index {
            Index::Loaded(ix) => Ok(ix.sequences() as u64),
            Index::Lazy(lazy) => Ok(lazy.header.sequences),
            Index::Footer(_) => Ok(self.footer_parts().0.sequences),
            Index::Eod(e) => e.documents(&|f| self.scan_all(f)),
        }
    }

    /// [`documents`](Dataset::documents) when they are known without a scan (always, but for
    /// a raw file with `eod` that was never scanned).
    pub fn documents_if_known(&self) -> Option<u64> {
        match &self.index {
            Index::Eod(e) => e.known(),
            _ => self.documents().ok(),
        }
    }

    /// [`sequences`](Dataset::sequences) when they are known without a scan, as
    /// [`documents_if_known`](Dataset::documents_if_known).
    pub fn sequences_if_known(&self) -> Option<u64> {
        match &self.index {
            Index::Eod(e) => e.known(),
            _ => self.sequences().ok(),
        }
    }

    /// Where a raw file's document index is cached, when it is (`None` for other formats,
    /// a store without versions, or the cache turned off).
    pub fn index_cache_path(&self) -> Option<PathBuf> {
        match &self.index {
            Index::Eod(e) => e.cache_path(),
            _ => None,
        }
    }

    /// [`scan`](Dataset::scan) in the natural chunk, for a callback that cannot fail.
    fn scan_all(&self, f: &mut dyn FnMut(u64, &[u32])) -> Result<(), StorageError> {
        self.scan(1 << 20, |start, chunk| {
            f(start, chunk);
            Ok::<_, StorageError>(())
        })
    }

    /// Bytes on storage, all files of the dataset together.
    pub fn size_on_disk(&self) -> u64 {
        self.size
    }

    /// A `rank+zstd` block file's rank table (ids by falling frequency), with the bytes its
    /// footer section takes; `None` for any other dataset.
    pub fn rank_table(&self) -> Option<(&RankTable, u32)> {
        match &self.source {
            Source::Block { meta, .. } => {
                let f = &meta.footer;
                f.ranks.as_deref().map(|r| (r, f.rank_bytes))
            }
            Source::Plain { .. } => None,
        }
    }

    /// The largest token id, when the format stores it (block files).
    pub fn stored_max_token(&self) -> Option<u32> {
        match &self.source {
            Source::Block { meta, .. } => Some(meta.footer.max_token),
            Source::Plain { .. } => None,
        }
    }

    /// The largest token id: stored (block files), or found by a scan of every token the first
    /// time it is asked for and kept while this dataset stays open (the agent keeps one open
    /// dataset per version of its files, shared by every session). A scan reads the whole
    /// dataset, so callers ask only when the answer decides something (`dquant mount`'s
    /// `--dtype auto`).
    pub fn max_token(&self) -> Result<u32, StorageError> {
        if let Some(m) = self
            .stored_max_token()
            .or_else(|| self.scanned_max.get().copied())
        {
            return Ok(m);
        }
        let mut max = 0u32;
        self.scan::<StorageError>(1 << 20, |_, tokens| {
            max = max.max(dquant_codec::kernels::max_token(tokens));
            Ok(())
        })?;
        Ok(*self.scanned_max.get_or_init(|| max))
    }

    /// The content checksum, when the format stores it (block files). Its index half covers
    /// the document index, so the first call reads the index's bytes (without keeping the
    /// index, unless [`Dataset::index`] read it).
    pub fn stored_checksum(&self) -> Result<Option<ContentChecksum>, StorageError> {
        match (&self.source, &self.index) {
            (Source::Block { file, meta }, Index::Footer(f)) => Ok(Some(ContentChecksum {
                tokens: meta.footer.tokens_checksum,
                index: f.checksum(&meta.footer, &**file, &self.path)?,
            })),
            _ => Ok(None),
        }
    }

    /// [`stored_checksum`](Dataset::stored_checksum) when it needs no read.
    pub fn stored_checksum_if_known(&self) -> Option<ContentChecksum> {
        match (&self.source, &self.index) {
            (Source::Block { meta, .. }, Index::Footer(f)) => Some(ContentChecksum {
                tokens: meta.footer.tokens_checksum,
                index: f.known_checksum(&meta.footer)?,
            }),
            _ => None,
        }
    }

    /// The block file's layout (header, totals, block table), for block files.
    pub fn block_layout(&self) -> Option<&BlockLayout> {
        match &self.source {
            Source::Block { meta, .. } => Some(meta),
            Source::Plain { .. } => None,
        }
    }

    /// A good read size in tokens: whole blocks for block files, 1 Mi tokens otherwise.
    pub fn natural_chunk(&self) -> u64 {
        match self.format {
            Format::Block { block_tokens, .. } => block_tokens as u64,
            _ => 1 << 20,
        }
    }

    /// A reader with its own buffers.
    pub fn reader(&self) -> TokenReader<'_> {
        TokenReader {
            ds: self,
            bufs: ReadBuffers::new(),
        }
    }

    /// Calls `f(start, tokens)` over the whole stream in chunks of about `chunk` tokens
    /// (rounded to the natural chunk), in order, with bounded memory.
    pub fn scan<E: From<StorageError>>(
        &self,
        chunk: u64,
        mut f: impl FnMut(u64, &[u32]) -> Result<(), E>,
    ) -> Result<(), E> {
        let nat = self.natural_chunk();
        let step = chunk.div_ceil(nat).max(1) * nat;
        let mut r = self.reader();
        let mut buf = Vec::new();
        let mut start = 0;
        while start < self.tokens() {
            let end = (start + step).min(self.tokens());
            r.read(start..end, &mut buf)?;
            f(start, &buf)?;
            start = end;
        }
        Ok(())
    }
}
