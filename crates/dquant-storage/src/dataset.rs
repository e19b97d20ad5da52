//! Opening token datasets of any supported format and reading token ranges from them.
//!
//! A dataset opens the same way wherever its bytes are: from a local path (the command line)
//! or from a name under a [`Root`] (an agent's catalog). Both go through one private
//! `Objects` seam, so format recognition and reading exist once, and the dataset holds its
//! data object as a [`ReadAt`] trait object whatever store it came from.

use std::fmt;
use std::io::{ErrorKind, IoSliceMut};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use dquant_codec::{Codec, Decoder};
use dquant_format::block::{self, BlockLayout, FooterHead, Trailer};
use dquant_format::megatron::{self, IdxEnds, IdxHeader};
use dquant_format::{ContentChecksum, DType, DocIndex, FormatError};

use crate::backend::{LocalFile, ReadAt};
use crate::eod_index::EodIndex;
use crate::error::StorageError;
use crate::root::{normalize_name, ObjectVersion, Root, RootError};

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

/// A dataset's document index: in memory, or (Megatron, block files) described by its header
/// and read when first asked for. Serving tokens needs only the token count, so an agent's
/// sessions never hold a per-document copy, however many documents there are.
enum Index {
    Loaded(DocIndex),
    Lazy(Box<LazyIndex>),
    /// A block file's: the footer's bytes after its head, checked (the footer's checksum, the
    /// counts) and parsed when first asked for.
    Footer(Box<FooterIndex>),
    /// A raw file's documents, found by a scan for its `eod` token the first time they are
    /// asked for (and kept in a cache entry: see `eod_index`).
    Eod(Box<EodIndex>),
}

struct LazyIndex {
    header: IdxHeader,
    /// What the header and the arrays' ends describe (checked against the `.bin`).
    tokens: u64,
    idx: Box<dyn ReadAt>,
    idx_path: PathBuf,
    loaded: OnceLock<DocIndex>,
}

impl LazyIndex {
    /// The whole index, read and checked once; an error is returned, not kept, so a later
    /// call reads again.
    fn get(&self) -> Result<&DocIndex, StorageError> {
        if let Some(ix) = self.loaded.get() {
            return Ok(ix);
        }
        let fe = |e| StorageError::format(&self.idx_path, e);
        let mut bytes = alloc_for(self.idx.len(), &self.idx_path, "the index")?;
        read_at(&*self.idx, &self.idx_path, &mut bytes, 0)?;
        let mi = megatron::parse_idx(&bytes).map_err(fe)?;
        if mi.index.tokens() != self.tokens {
            return Err(fe(FormatError::corrupt(
                "Megatron .idx",
                format!(
                    "its sequences hold {} tokens, but its ends (and the .bin) say {}: it \
                     changed while open",
                    mi.index.tokens(),
                    self.tokens
                ),
            )));
        }
        Ok(self.loaded.get_or_init(|| mi.index))
    }
}

/// A block file's document index, read on first use. Its counts and totals are the footer
/// head's, which the dataset's blocks hold ([`Dataset::footer_parts`]), so this keeps only
/// where the index is and what was found from it.
struct FooterIndex {
    /// Where the index's bytes are (the rest of the footer) and the footer's stored checksum,
    /// with the checksum of its head, read at open, to carry on from.
    at: u64,
    len: u64,
    footer_crc: u32,
    head_crc: u32,
    loaded: OnceLock<DocIndex>,
    /// The index half of the content checksum, when found without keeping the index.
    checksum: OnceLock<u64>,
}

impl FooterIndex {
    /// The whole index, read and checked once from `file`; an error is returned, not kept,
    /// so a later call reads again.
    fn get(
        &self,
        head: &FooterHead,
        file: &dyn ReadAt,
        path: &Path,
    ) -> Result<&DocIndex, StorageError> {
        if let Some(ix) = self.loaded.get() {
            return Ok(ix);
        }
        let bytes = self.read_checked(file, path)?;
        let index = head
            .parse_index(&bytes)
            .map_err(|e| StorageError::format(path, e))?;
        Ok(self.loaded.get_or_init(|| index))
    }

    /// The index half of the content checksum: from the index if it was read, else from its
    /// bytes, read and checked as [`FooterIndex::get`] does but not kept (an agent's `Stat`
    /// asks for the checksum; 100 M documents would hold 1.6 GB of index for it).
    fn checksum(
        &self,
        head: &FooterHead,
        file: &dyn ReadAt,
        path: &Path,
    ) -> Result<u64, StorageError> {
        if let Some(c) = self.known_checksum(head) {
            return Ok(c);
        }
        let bytes = self.read_checked(file, path)?;
        let c = head
            .index_checksum(&bytes)
            .map_err(|e| StorageError::format(path, e))?;
        Ok(*self.checksum.get_or_init(|| c))
    }

    fn known_checksum(&self, head: &FooterHead) -> Option<u64> {
        let from_index = || {
            let ix = self.loaded.get()?;
            Some(ContentChecksum::from_parts(head.tokens_checksum, ix).index)
        };
        self.checksum.get().copied().or_else(from_index)
    }

    /// The index's bytes, the footer's crc32c checked over the head and them.
    fn read_checked(&self, file: &dyn ReadAt, path: &Path) -> Result<Vec<u8>, StorageError> {
        let mut bytes = alloc_for(self.len, path, "the block file's document index")?;
        read_at(file, path, &mut bytes, self.at)?;
        let computed = crc32c::crc32c_append(self.head_crc, &bytes);
        if computed != self.footer_crc {
            return Err(StorageError::format(
                path,
                FormatError::Checksum {
                    what: "block file footer".into(),
                    stored: self.footer_crc,
                    computed,
                },
            ));
        }
        Ok(bytes)
    }
}

/// A zeroed buffer of `len` bytes for `what`, or an error naming it when memory is short.
fn alloc_for(len: u64, path: &Path, what: &str) -> Result<Vec<u8>, StorageError> {
    let mut bytes = Vec::new();
    usize::try_from(len)
        .ok()
        .and_then(|n| bytes.try_reserve_exact(n).ok())
        .ok_or_else(|| {
            StorageError::Usage(format!(
                "{}: cannot allocate {len} bytes to read {what}",
                path.display()
            ))
        })?;
    bytes.resize(len as usize, 0);
    Ok(bytes)
}

/// Reads an `.idx`'s header and the ends of its arrays (a few dozen bytes, whatever the
/// document count) and checks them: the header and the token count they describe.
fn lazy_idx(idx: &dyn ReadAt, path: &Path) -> Result<(IdxHeader, u64), StorageError> {
    let fe = |e| StorageError::format(path, e);
    let mut head = [0u8; megatron::HEADER_LEN];
    let n = (idx.len() as usize).min(head.len());
    read_at(idx, path, &mut head[..n], 0)?;
    let h = IdxHeader::parse(&head[..n], idx.len()).map_err(fe)?;
    let u64_at = |off: u64| -> Result<u64, StorageError> {
        let mut b = [0u8; 8];
        read_at(idx, path, &mut b, off)?;
        Ok(u64::from_le_bytes(b))
    };
    let last = h.sequences.saturating_sub(1);
    let mut len = [0u8; 4];
    let ends = if h.sequences == 0 {
        IdxEnds {
            first_pointer: 0,
            last_pointer: 0,
            last_length: 0,
            first_doc_index: u64_at(h.doc_index_at(0))?,
            last_doc_index: u64_at(h.doc_index_at(h.doc_indices - 1))?,
        }
    } else {
        read_at(idx, path, &mut len, h.length_at(last))?;
        IdxEnds {
            first_pointer: u64_at(h.pointer_at(0))?,
            last_pointer: u64_at(h.pointer_at(last))?,
            last_length: i32::from_le_bytes(len),
            first_doc_index: u64_at(h.doc_index_at(0))?,
            last_doc_index: u64_at(h.doc_index_at(h.doc_indices - 1))?,
        }
    };
    let tokens = megatron::check_ends(&h, &ends).map_err(fe)?;
    Ok((h, tokens))
}

enum Source {
    Plain {
        file: Box<dyn ReadAt>,
        dtype: DType,
    },
    Block {
        file: Box<dyn ReadAt>,
        meta: Box<BlockLayout>,
    },
}

/// Where a dataset's objects come from while it is opened: local paths, or names under a
/// [`Root`]. Names are paths so that any local path, UTF-8 or not, opens as it always did;
/// names under a root are built from `&str`s, so are always UTF-8. Errors name the object
/// as it was asked for.
trait Objects {
    /// Whether `name` is there, to recognise a Megatron prefix. A name the store refuses
    /// counts as there, so that opening it reports the refusal.
    fn exists(&self, name: &Path) -> bool;

    fn open(&self, name: &Path) -> Result<Box<dyn ReadAt>, StorageError>;
}

/// Any local path, unconfined: whoever names a path on the command line may read it.
struct Paths;

impl Objects for Paths {
    fn exists(&self, name: &Path) -> bool {
        name.exists()
    }

    fn open(&self, name: &Path) -> Result<Box<dyn ReadAt>, StorageError> {
        match LocalFile::open(name) {
            Ok(f) => Ok(Box::new(f)),
            Err(e) => Err(StorageError::io(name, e)),
        }
    }
}

/// Names under a root, which confines them.
struct InRoot<'a>(&'a dyn Root);

impl InRoot<'_> {
    fn name<'n>(&self, name: &'n Path) -> Result<&'n str, StorageError> {
        name.to_str().ok_or_else(|| {
            StorageError::Usage(format!("{}: names under a root are UTF-8", name.display()))
        })
    }
}

impl Objects for InRoot<'_> {
    fn exists(&self, name: &Path) -> bool {
        self.name(name)
            .is_ok_and(|n| !matches!(self.0.stat(n), Err(RootError::NotFound { .. })))
    }

    fn open(&self, name: &Path) -> Result<Box<dyn ReadAt>, StorageError> {
        Ok(self.0.open(self.name(name)?)?)
    }
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
}

/// If `path` names a Megatron dataset, its prefix (`x` for `x`, `x.idx` or `x.bin`).
fn megatron_prefix(objects: &dyn Objects, path: &Path) -> Option<PathBuf> {
    let s = path.as_os_str().to_string_lossy();
    if let Some(p) = s.strip_suffix(".idx").or_else(|| s.strip_suffix(".bin")) {
        if objects.exists(Path::new(&format!("{p}.idx"))) {
            return Some(PathBuf::from(p));
        }
    }
    objects
        .exists(Path::new(&format!("{s}.idx")))
        .then(|| path.to_path_buf())
}

/// Fills `buf` from `off` of `file` (named `name` in errors); a short file is a truncation.
fn read_at(file: &dyn ReadAt, name: &Path, buf: &mut [u8], off: u64) -> Result<(), StorageError> {
    file.read_exact_at(buf, off)
        .map_err(|e| read_error(file, name, off + buf.len() as u64, e))
}

/// A failed read as the storage error that says why: a file shorter than its format needs,
/// or one that became shorter than it was when opened (truncated or rewritten while served:
/// the reader gets this error, never a signal).
fn read_error(file: &dyn ReadAt, name: &Path, needed: u64, e: std::io::Error) -> StorageError {
    if e.kind() == ErrorKind::UnexpectedEof && needed <= file.len() {
        let reason = format!(
            "the file is shorter than when it was opened ({} bytes; a read needed {needed}): \
             it was truncated or rewritten while being read",
            file.len()
        );
        StorageError::io(name, std::io::Error::new(ErrorKind::UnexpectedEof, reason))
    } else if e.kind() == ErrorKind::UnexpectedEof {
        StorageError::format(
            name,
            FormatError::Truncated {
                what: "file".into(),
                needed,
                have: file.len(),
            },
        )
    } else {
        StorageError::io(name, e)
    }
}

fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl Dataset {
    /// Opens a dataset, recognising its format: a Megatron prefix (or its `.idx`/`.bin`), a
    /// dquant block file (by its magic), or a raw token file when `opts.raw_dtype` is given.
    /// Errors name the files by `path`.
    pub fn open(path: &Path, opts: &OpenOptions) -> Result<Self, StorageError> {
        Self::open_with(&Paths, path, opts)
    }

    /// Opens the dataset `name` under `root`, recognising its format as
    /// [`open`](Dataset::open) does. [`path`](Dataset::path) and errors name its objects by
    /// their (normalized) names under the root.
    pub fn open_in(root: &dyn Root, name: &str, opts: &OpenOptions) -> Result<Self, StorageError> {
        let name = normalize_name(name)?;
        Self::open_with(&InRoot(root), Path::new(&name), opts)
    }

    fn open_with(
        objects: &dyn Objects,
        path: &Path,
        opts: &OpenOptions,
    ) -> Result<Self, StorageError> {
        if let Some(prefix) = megatron_prefix(objects, path) {
            return Self::open_megatron(objects, &prefix);
        }
        let file = objects.open(path)?;
        let mut magic = [0u8; 8];
        if file.len() >= 8 {
            read_at(&*file, path, &mut magic, 0)?;
        }
        if magic == block::FILE_MAGIC {
            return Self::open_block(path, file);
        }
        match opts.raw_dtype {
            Some(dtype) => Self::open_raw(path, file, dtype, opts.eod),
            None => Err(StorageError::Usage(format!(
                "{}: unknown format: not a dquant block file, no Megatron .idx beside it; \
                 for a raw token file give its dtype (--dtype u16|i32|...)",
                path.display()
            ))),
        }
    }

    fn open_megatron(objects: &dyn Objects, prefix: &Path) -> Result<Self, StorageError> {
        let sibling = |ext: &str| {
            let mut p = prefix.as_os_str().to_os_string();
            p.push(ext);
            PathBuf::from(p)
        };
        let (idx_path, bin_path) = (sibling(".idx"), sibling(".bin"));
        let idx = objects.open(&idx_path)?;
        let (header, tokens) = lazy_idx(&*idx, &idx_path)?;
        let dtype = header.dtype;
        let file = objects.open(&bin_path)?;
        megatron::check_bin_tokens(dtype, tokens, file.len())
            .map_err(|e| StorageError::format(&bin_path, e))?;
        let versions = vec![
            (idx_path.clone(), idx.version()),
            (bin_path.clone(), file.version()),
        ];
        Ok(Dataset {
            id: next_id(),
            path: prefix.to_path_buf(),
            data_path: bin_path,
            format: Format::Megatron { dtype },
            size: file.len() + idx.len(),
            index: Index::Lazy(Box::new(LazyIndex {
                header,
                tokens,
                idx,
                idx_path,
                loaded: OnceLock::new(),
            })),
            source: Source::Plain { file, dtype },
            versions,
            scanned_max: OnceLock::new(),
        })
    }

    fn open_block(path: &Path, file: Box<dyn ReadAt>) -> Result<Self, StorageError> {
        let len = file.len();
        let fe = |e: FormatError| StorageError::format(path, e);
        let mut head = vec![0u8; block::HEADER_LEN.min(len as usize)];
        read_at(&*file, path, &mut head, 0)?;
        block::FileHeader::parse(&head).map_err(fe)?;
        let mut tail = [0u8; block::TRAILER_LEN];
        if len < block::TRAILER_LEN as u64 {
            return Err(fe(FormatError::truncated(
                "block file",
                block::TRAILER_LEN as u64,
                len,
            )));
        }
        read_at(&*file, path, &mut tail, len - block::TRAILER_LEN as u64)?;
        let trailer = Trailer::parse(&tail, len).map_err(fe)?;
        // The footer's head (totals and block table): its fixed part says how long it is.
        // The trailer's checks keep both reads inside the file.
        let mut fixed = vec![0u8; block::FOOTER_FIXED_LEN.min(trailer.footer_len as usize)];
        read_at(&*file, path, &mut fixed, trailer.footer_offset)?;
        let head_len = FooterHead::len_from_fixed(&fixed)
            .unwrap_or(0)
            .clamp(fixed.len() as u64, trailer.footer_len);
        let mut head_bytes = alloc_for(head_len, path, "the block table")?;
        read_at(&*file, path, &mut head_bytes, trailer.footer_offset)?;
        let meta = BlockLayout::parse(&head, &trailer, &head_bytes).map_err(fe)?;
        let index = FooterIndex {
            at: trailer.footer_offset + head_len,
            len: trailer.footer_len - head_len,
            footer_crc: trailer.footer_crc,
            head_crc: crc32c::crc32c(&head_bytes),
            loaded: OnceLock::new(),
            checksum: OnceLock::new(),
        };
        let versions = vec![(path.to_path_buf(), file.version())];
        Ok(Dataset {
            id: next_id(),
            path: path.to_path_buf(),
            data_path: path.to_path_buf(),
            format: Format::Block {
                codec: meta.header.codec,
                block_tokens: meta.header.block_tokens,
            },
            index: Index::Footer(Box::new(index)),
            source: Source::Block {
                file,
                meta: Box::new(meta),
            },
            size: len,
            versions,
            scanned_max: OnceLock::new(),
        })
    }

    fn open_raw(
        path: &Path,
        file: Box<dyn ReadAt>,
        dtype: DType,
        eod: Option<u32>,
    ) -> Result<Self, StorageError> {
        let item = dtype.itemsize() as u64;
        if !file.len().is_multiple_of(item) {
            return Err(StorageError::format(
                path,
                FormatError::corrupt(
                    format!("raw {} file", dtype.numpy_name()),
                    format!(
                        "{} bytes is not a whole number of {item}-byte tokens",
                        file.len()
                    ),
                ),
            ));
        }
        let tokens = file.len() / item;
        let size = file.len();
        let version = file.version();
        // Documents end after each end-of-document token: found when first asked for, never
        // at open (streaming does not need them); cached on disk only under a version that
        // outlives this process.
        let durable = version
            .as_ref()
            .filter(|_| file.version_is_durable())
            .map(|v| v.to_string());
        let index = match eod {
            Some(eod) => Index::Eod(Box::new(EodIndex::new(eod, tokens, dtype, durable))),
            None => Index::Loaded(DocIndex::single(tokens)),
        };
        Ok(Dataset {
            id: next_id(),
            path: path.to_path_buf(),
            data_path: path.to_path_buf(),
            format: Format::Raw { dtype },
            index,
            source: Source::Plain { file, dtype },
            size,
            versions: vec![(path.to_path_buf(), version)],
            scanned_max: OnceLock::new(),
        })
    }

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
    /// from a path or a directory root), already open; `None` for block files and objects
    /// in other stores.
    pub fn plain_local_file(&self) -> Option<&std::fs::File> {
        match &self.source {
            Source::Plain { file, .. } => file.local_file(),
            Source::Block { .. } => None,
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

/// Reusable read state: I/O and decode buffers, and the last decoded block of a block file (a
/// run of small reads, one sample after another, decodes each block once). Owned by the
/// caller, so long-lived readers need not borrow the [`Dataset`].
#[derive(Default)]
pub struct ReadBuffers {
    bytes: Vec<u8>,
    dec: Decoder,
    block: Vec<u32>,
    /// (dataset id, block index) of the block held in `block`.
    cached: Option<(u64, usize)>,
}

impl ReadBuffers {
    pub fn new() -> Self {
        Self::default()
    }
}

/// Reads token ranges of a [`Dataset`], reusing its buffers across calls.
pub struct TokenReader<'a> {
    ds: &'a Dataset,
    bufs: ReadBuffers,
}

impl TokenReader<'_> {
    /// Replaces `out` with the tokens of `range`; see [`Dataset::read`].
    pub fn read(&mut self, range: Range<u64>, out: &mut Vec<u32>) -> Result<(), StorageError> {
        self.ds.read(range, out, &mut self.bufs)
    }
}

impl Dataset {
    /// Replaces `out` with the tokens of `range`. Only the bytes covering the range are read:
    /// for block files, the covering blocks in one contiguous read, except that a range inside
    /// the block decoded last is served from `bufs` without any I/O.
    pub fn read(
        &self,
        range: Range<u64>,
        out: &mut Vec<u32>,
        bufs: &mut ReadBuffers,
    ) -> Result<(), StorageError> {
        out.clear();
        out.resize(range.end.saturating_sub(range.start) as usize, 0);
        self.read_into(range, out, bufs)
    }

    /// Copies the stored bytes of the tokens from `start` into `bufs`, in order, with one
    /// read and no conversion: the fast path for a consumer that wants tokens in the very
    /// dtype the file stores (each buffer a whole number of tokens). Only plain (Megatron and
    /// raw) files have stored bytes to copy; block files are an error (their blocks must be
    /// decoded).
    pub fn read_stored_vectored(
        &self,
        start: u64,
        bufs: &mut [IoSliceMut<'_>],
    ) -> Result<(), StorageError> {
        let Source::Plain { file, dtype } = &self.source else {
            return Err(StorageError::Usage(format!(
                "{}: a block file has no stored token bytes to copy; read tokens instead",
                self.path.display()
            )));
        };
        let item = dtype.itemsize() as u64;
        let bytes: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        let end = start.saturating_add(bytes / item);
        if bufs.iter().any(|b| !(b.len() as u64).is_multiple_of(item)) || end > self.tokens() {
            return Err(StorageError::Usage(format!(
                "{}: stored read of {bytes} bytes at token {start}: not whole {item}-byte tokens inside the dataset's {}",
                self.path.display(),
                self.tokens()
            )));
        }
        file.read_exact_vectored_at(bufs, start * item)
            .map_err(|e| read_error(&**file, &self.data_path, end * item, e))
    }

    /// Tells the dataset's object that the tokens of `ranges` are about to be read (see
    /// [`ReadAt::will_read`]): the bytes of plain files' tokens, a block file's covering
    /// blocks. Ranges outside the dataset are left out (their reads will say why).
    pub fn will_read(&self, ranges: &[Range<u64>]) {
        let tokens = self.tokens();
        let inside = ranges.iter().filter(|r| r.start < r.end && r.end <= tokens);
        let (file, bytes): (&dyn ReadAt, Vec<Range<u64>>) = match &self.source {
            Source::Plain { file, dtype } => {
                let item = dtype.itemsize() as u64;
                (
                    &**file,
                    inside.map(|r| r.start * item..r.end * item).collect(),
                )
            }
            Source::Block { file, meta } => (
                &**file,
                inside
                    .map(|r| meta.byte_range(meta.blocks_covering(r.clone())))
                    .collect(),
            ),
        };
        file.will_read(&bytes);
    }

    /// Fills `out` (exactly `range.end - range.start` long) with the tokens of `range`, as
    /// [`Dataset::read`] does; for callers that assemble many ranges in one buffer.
    ///
    /// # Panics
    /// If `out` has the wrong length.
    pub fn read_into(
        &self,
        range: Range<u64>,
        out: &mut [u32],
        bufs: &mut ReadBuffers,
    ) -> Result<(), StorageError> {
        if range.start > range.end || range.end > self.tokens() {
            return Err(StorageError::Usage(format!(
                "{}: token range {}..{} is outside the dataset's {} tokens",
                self.path.display(),
                range.start,
                range.end,
                self.tokens()
            )));
        }
        assert_eq!(
            out.len() as u64,
            range.end - range.start,
            "read_into: the buffer must hold the range"
        );
        match &self.source {
            Source::Plain { file, dtype } => {
                let item = dtype.itemsize() as u64;
                bufs.bytes.resize(out.len() * item as usize, 0);
                read_at(
                    &**file,
                    &self.data_path,
                    &mut bufs.bytes,
                    range.start * item,
                )?;
                dtype
                    .decode(&bufs.bytes, out, range.start)
                    .map_err(|e| StorageError::format(&self.data_path, e))
            }
            Source::Block { file, meta } => {
                let blocks = meta.blocks_covering(range.clone());
                let fe = |e| StorageError::format(&self.data_path, e);
                if blocks.len() == 1 && bufs.cached == Some((self.id, blocks.start)) {
                    let bt = meta.block_tokens(blocks.start);
                    out.copy_from_slice(
                        &bufs.block
                            [(range.start - bt.start) as usize..(range.end - bt.start) as usize],
                    );
                    return Ok(());
                }
                let bytes = meta.byte_range(blocks.clone());
                bufs.bytes.resize((bytes.end - bytes.start) as usize, 0);
                read_at(&**file, &self.data_path, &mut bufs.bytes, bytes.start)?;
                for i in blocks {
                    let br = meta.byte_range(i..i + 1);
                    let raw = &bufs.bytes
                        [(br.start - bytes.start) as usize..(br.end - bytes.start) as usize];
                    let bt = meta.block_tokens(i);
                    if bt.start >= range.start && bt.end <= range.end {
                        let dst = &mut out
                            [(bt.start - range.start) as usize..(bt.end - range.start) as usize];
                        meta.decode_block(i, raw, &mut bufs.dec, dst).map_err(fe)?;
                    } else {
                        bufs.cached = None;
                        bufs.block.resize((bt.end - bt.start) as usize, 0);
                        meta.decode_block(i, raw, &mut bufs.dec, &mut bufs.block)
                            .map_err(fe)?;
                        bufs.cached = Some((self.id, i));
                        let s = range.start.max(bt.start);
                        let e = range.end.min(bt.end);
                        out[(s - range.start) as usize..(e - range.start) as usize]
                            .copy_from_slice(
                                &bufs.block[(s - bt.start) as usize..(e - bt.start) as usize],
                            );
                    }
                }
                Ok(())
            }
        }
    }
}
