//! Opening a dataset: recognising its format from its objects, and checking what it needs
//! of each format before the first read (headers, array ends, the block table).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use dquant_format::block::{self, BlockLayout, FooterHead, Trailer};
use dquant_format::chunk_sums::{self, ChunkSums};
use dquant_format::megatron::{self};
use dquant_format::{DType, DocIndex, FormatError};

use super::index::{alloc_for, lazy_idx, FooterIndex, LazyIndex};
use super::objects::{megatron_prefix, InRoot, Objects, Paths};
use super::sums::CheckedChunks;
use super::{next_id, read_at, Dataset, Format, Index, OpenOptions, Source};
use crate::backend::ReadAt;
use crate::eod_index::EodIndex;
use crate::error::StorageError;
use crate::root::{normalize_name, Root};

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
        let mut versions = vec![
            (idx_path.clone(), idx.version()),
            (bin_path.clone(), file.version()),
        ];
        let mut size = file.len() + idx.len();
        let sums_path = sibling(SUMS_EXT);
        // Opened, not looked up first: a sidecar that appears or goes between the two would
        // fail the open for nothing.
        let sums = match objects.open(&sums_path) {
            Ok(sidecar) => {
                versions.push((sums_path.clone(), sidecar.version()));
                size += sidecar.len();
                let sums = read_sums(&*sidecar, sums_path, &bin_path, file.len())?;
                Some(Box::new(sums))
            }
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(e),
        };
        Ok(Dataset {
            id: next_id(),
            path: prefix.to_path_buf(),
            data_path: bin_path,
            format: Format::Megatron { dtype },
            size,
            index: Index::Lazy(Box::new(LazyIndex {
                header,
                tokens,
                idx,
                idx_path,
                loaded: OnceLock::new(),
            })),
            source: Source::Plain { file, dtype, sums },
            versions,
            scanned_max: OnceLock::new(),
            kept: OnceLock::new(),
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
            kept: OnceLock::new(),
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
            source: Source::Plain {
                file,
                dtype,
                sums: None,
            },
            size,
            versions: vec![(path.to_path_buf(), version)],
            scanned_max: OnceLock::new(),
            kept: OnceLock::new(),
        })
    }
}

/// The ending of a Megatron dataset's chunk sums sidecar: `PREFIX.dqsum` beside `PREFIX.bin`.
pub const SUMS_EXT: &str = ".dqsum";

/// Reads and checks the chunk sums sidecar `path` of the data file `data` (`data_len` bytes).
/// Its length is bounded by the data file's before it is read: a sidecar at the smallest
/// chunk size is the largest that can cover it.
fn read_sums(
    sidecar: &dyn ReadAt,
    path: PathBuf,
    data: &Path,
    data_len: u64,
) -> Result<CheckedChunks, StorageError> {
    let most =
        data_len.div_ceil(u64::from(chunk_sums::MIN_CHUNK)) * 4 + chunk_sums::HEADER_LEN as u64 + 4;
    if sidecar.len() > most {
        return Err(StorageError::format(
            &path,
            FormatError::corrupt(
                "chunk sums file",
                format!(
                    "{} bytes, more than any sidecar of {}'s {data_len} bytes ({most})",
                    sidecar.len(),
                    data.display()
                ),
            ),
        ));
    }
    let mut bytes = vec![0u8; sidecar.len() as usize];
    read_at(sidecar, &path, &mut bytes, 0)?;
    let sums = ChunkSums::parse(&bytes).map_err(|e| StorageError::format(&path, e))?;
    CheckedChunks::new(sums, path, data, data_len)
}
