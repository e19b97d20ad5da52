//! A dataset's document index: in memory, or read and checked when first asked for.
//!
//! Apart from the dataset because serving tokens needs only the token count: the index is a
//! lazy thing of its own, in four forms (loaded, a Megatron `.idx`, a block file's footer, a
//! raw file's `eod` scan), each with its checks.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use dquant_format::block::FooterHead;
use dquant_format::megatron::{self, IdxEnds, IdxHeader};
use dquant_format::{ContentChecksum, DocIndex, FormatError};

use super::read_at;
use crate::backend::ReadAt;
use crate::eod_index::EodIndex;
use crate::error::StorageError;

/// A dataset's document index: in memory, or (Megatron, block files) described by its header
/// and read when first asked for. Serving tokens needs only the token count, so an agent's
/// sessions never hold a per-document copy, however many documents there are.
pub(super) enum Index {
    Loaded(DocIndex),
    Lazy(Box<LazyIndex>),
    /// A block file's: the footer's bytes after its head, checked (the footer's checksum, the
    /// counts) and parsed when first asked for.
    Footer(Box<FooterIndex>),
    /// A raw file's documents, found by a scan for its `eod` token the first time they are
    /// asked for (and kept in a cache entry: see `eod_index`).
    Eod(Box<EodIndex>),
}

pub(super) struct LazyIndex {
    pub(super) header: IdxHeader,
    /// What the header and the arrays' ends describe (checked against the `.bin`).
    pub(super) tokens: u64,
    pub(super) idx: Box<dyn ReadAt>,
    pub(super) idx_path: PathBuf,
    pub(super) loaded: OnceLock<DocIndex>,
}

impl LazyIndex {
    /// The whole index, read and checked once; an error is returned, not kept, so a later
    /// call reads again.
    pub(super) fn get(&self) -> Result<&DocIndex, StorageError> {
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
pub(super) struct FooterIndex {
    /// Where the index's bytes are (the rest of the footer) and the footer's stored checksum,
    /// with the checksum of its head, read at open, to carry on from.
    pub(super) at: u64,
    pub(super) len: u64,
    pub(super) footer_crc: u32,
    pub(super) head_crc: u32,
    pub(super) loaded: OnceLock<DocIndex>,
    /// The index half of the content checksum, when found without keeping the index.
    pub(super) checksum: OnceLock<u64>,
}

impl FooterIndex {
    /// The whole index, read and checked once from `file`; an error is returned, not kept,
    /// so a later call reads again.
    pub(super) fn get(
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
    pub(super) fn checksum(
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

    pub(super) fn known_checksum(&self, head: &FooterHead) -> Option<u64> {
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
pub(super) fn alloc_for(len: u64, path: &Path, what: &str) -> Result<Vec<u8>, StorageError> {
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
pub(super) fn lazy_idx(idx: &dyn ReadAt, path: &Path) -> Result<(IdxHeader, u64), StorageError> {
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
