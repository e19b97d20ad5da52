//! Streaming, atomic dataset writers.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::destination::{Destination, LocalFiles, StagedObject};
use crate::error::StorageError;
use dquant_codec::{Codec, RankTable, TokenHasher};
use dquant_format::block::{BlockFileWriter, FileHeader};
use dquant_format::{megatron, ContentChecksum, DType, DocIndex, FormatError};

/// The format a [`DatasetWriter`] produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    /// `PREFIX.bin` + `PREFIX.idx`, readable by unmodified Megatron-Core.
    Megatron { dtype: DType },
    /// A dquant block file.
    Block {
        codec: Codec,
        block_tokens: u32,
        vocab_size: u32,
    },
    /// Bare little-endian tokens: boundaries are not kept.
    Raw { dtype: DType },
}

/// What a finished write produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteReport {
    /// Files written, in commit order.
    pub files: Vec<PathBuf>,
    pub tokens: u64,
    /// Bytes of all files together.
    pub bytes: u64,
    pub content: ContentChecksum,
}

/// One output file being written to a [`Destination`], counted.
struct Staged {
    dst: PathBuf,
    out: Box<dyn StagedObject>,
    bytes: u64,
}

impl Staged {
    fn create(to: &dyn Destination, dst: &Path) -> Result<Self, StorageError> {
        let out = to.stage(dst)?;
        Ok(Staged {
            dst: dst.to_path_buf(),
            out,
            bytes: 0,
        })
    }

    fn write(&mut self, b: &[u8]) -> Result<(), StorageError> {
        self.bytes += b.len() as u64;
        self.out
            .write_all(b)
            .map_err(|e| StorageError::io(&self.dst, e))
    }

    /// Makes the file appear under its name; returns its length.
    fn commit(self) -> Result<u64, StorageError> {
        let dst = self.dst;
        self.out.commit().map_err(|e| StorageError::io(&dst, e))?;
        Ok(self.bytes)
    }
}

enum Sink {
    Megatron {
        bin: Staged,
        idx_path: PathBuf,
        dtype: DType,
    },
    Block {
        file: Staged,
        writer: Box<BlockFileWriter>,
    },
    Raw {
        file: Staged,
        dtype: DType,
    },
}

/// Streams tokens into a dataset file with bounded memory, validating every token against the
/// output's width, and commits atomically on [`DatasetWriter::finish`].
pub struct DatasetWriter {
    to: Arc<dyn Destination>,
    sink: Sink,
    tokens: u64,
    /// Hash of the tokens of plain (Megatron, raw) outputs.
    hasher: TokenHasher,
    buf: Vec<u8>,
    check: Vec<u32>,
}

/// `x` for `x`, `x.bin` or `x.idx`.
pub fn megatron_prefix_of(path: &Path) -> PathBuf {
    let s = path.as_os_str().to_string_lossy();
    PathBuf::from(
        s.strip_suffix(".bin")
            .or_else(|| s.strip_suffix(".idx"))
            .unwrap_or(&s)
            .to_string(),
    )
}

impl DatasetWriter {
    /// Starts writing `path` (a prefix for Megatron output). Nothing appears under the final
    /// name until [`DatasetWriter::finish`] succeeds.
    pub fn create(path: &Path, format: OutputFormat) -> Result<Self, StorageError> {
        Self::create_in(Arc::new(LocalFiles), path, format)
    }

    /// Starts writing `path` (a name in `to`) the same way.
    pub fn create_in(
        to: Arc<dyn Destination>,
        path: &Path,
        format: OutputFormat,
    ) -> Result<Self, StorageError> {
        Self::create_ranked_in(to, path, format, None)
    }

    /// [`DatasetWriter::create_in`], with the rank table a `rank+zstd` block file needs (it
    /// must rank every token pushed; see [`RankTable::from_counts`]).
    pub fn create_ranked_in(
        to: Arc<dyn Destination>,
        path: &Path,
        format: OutputFormat,
        ranks: Option<Arc<RankTable>>,
    ) -> Result<Self, StorageError> {
        let stage = |p: &Path| Staged::create(&*to, p);
        let sink = match format {
            OutputFormat::Megatron { dtype } => {
                let prefix = megatron_prefix_of(path);
                Sink::Megatron {
                    bin: stage(Path::new(&format!("{}.bin", prefix.display())))?,
                    idx_path: PathBuf::from(format!("{}.idx", prefix.display())),
                    dtype,
                }
            }
            OutputFormat::Block {
                codec,
                block_tokens,
                vocab_size,
            } => {
                let header = FileHeader {
                    codec,
                    block_tokens,
                    vocab_size,
                };
                let writer = match ranks {
                    Some(t) => BlockFileWriter::new_ranked(header, t, true),
                    None => BlockFileWriter::new(header, true),
                };
                let (writer, head) = writer.map_err(|e| StorageError::format(path, e))?;
                let mut file = stage(path)?;
                file.write(&head)?;
                Sink::Block {
                    file,
                    writer: Box::new(writer),
                }
            }
            OutputFormat::Raw { dtype } => Sink::Raw {
                file: stage(path)?,
                dtype,
            },
        };
        Ok(DatasetWriter {
            to,
            sink,
            tokens: 0,
            hasher: TokenHasher::new(),
            buf: Vec::new(),
            check: Vec::new(),
        })
    }

    /// Tokens accepted so far.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Encodes a block file's blocks on `threads` threads
    /// ([`BlockFileWriter::set_threads`]): the same bytes, sooner. Plain outputs cost a copy
    /// and stay on the caller's thread.
    pub fn set_threads(&mut self, threads: usize) -> Result<(), StorageError> {
        if let Sink::Block { file, writer } = &mut self.sink {
            writer
                .set_threads(threads)
                .map_err(|e| StorageError::format(&file.dst, e))?;
        }
        Ok(())
    }

    /// Tokens a push should carry at least to keep every thread busy: one block a thread for
    /// a block file (1 when the output is plain).
    pub fn push_tokens(&self) -> u64 {
        match &self.sink {
            Sink::Block { writer, .. } => writer.threads() as u64 * writer.block_tokens(),
            _ => 1,
        }
    }

    /// Appends tokens. A token the output cannot hold fails with its absolute offset in the
    /// stream; the destination is then left untouched.
    pub fn push(&mut self, tokens: &[u32]) -> Result<(), StorageError> {
        self.buf.clear();
        let base = self.tokens;
        match &mut self.sink {
            Sink::Megatron {
                bin: file, dtype, ..
            }
            | Sink::Raw { file, dtype } => {
                self.buf.resize(tokens.len() * dtype.itemsize(), 0);
                dtype
                    .encode(tokens, &mut self.buf, base)
                    .map_err(StorageError::Data)?;
                // Verify as we go: the bytes we are about to write decode to the input.
                self.check.resize(tokens.len(), 0);
                dtype
                    .decode(&self.buf, &mut self.check, base)
                    .map_err(StorageError::Data)?;
                if self.check != tokens {
                    return Err(StorageError::format(
                        &file.dst,
                        FormatError::corrupt(
                            format!("{dtype} output at token {base}"),
                            "encoded bytes did not decode to the input",
                        ),
                    ));
                }
                file.write(&self.buf)?;
                // Block files hash their tokens themselves (the footer stores the checksum).
                self.hasher.update(tokens);
            }
            Sink::Block { file, writer } => {
                writer
                    .push(tokens, &mut self.buf)
                    .map_err(StorageError::Data)?;
                file.write(&self.buf)?;
            }
        }
        self.tokens += tokens.len() as u64;
        Ok(())
    }

    /// Writes the index and commits every file. `index` must describe exactly the tokens
    /// pushed. For Megatron output the `.bin` is renamed before the `.idx`, so a reader that
    /// finds the `.idx` finds a complete `.bin`.
    pub fn finish(self, index: &DocIndex) -> Result<WriteReport, StorageError> {
        let mut content = ContentChecksum::new(&self.hasher, index);
        if index.tokens() != self.tokens {
            return Err(StorageError::Usage(format!(
                "the document index describes {} tokens but {} were written",
                index.tokens(),
                self.tokens
            )));
        }
        let mut files = Vec::new();
        let mut bytes = 0;
        match self.sink {
            Sink::Megatron {
                bin,
                idx_path,
                dtype,
            } => {
                let idx = megatron::encode_idx(dtype, index)
                    .map_err(|e| StorageError::format(&idx_path, e))?;
                let mut idx_file = Staged::create(&*self.to, &idx_path)?;
                idx_file.write(&idx)?;
                files.push(bin.dst.clone());
                bytes += bin.commit()?;
                files.push(idx_path);
                bytes += idx_file.commit()?;
            }
            Sink::Block { mut file, writer } => {
                let mut tail = Vec::new();
                // The last block is encoded here: a token it cannot hold is a data error (the
                // caller names the input it came from), as it is in `push`.
                let summary = writer.finish(index, &mut tail).map_err(|e| match e {
                    e @ FormatError::Codec(_) => StorageError::Data(e),
                    e => StorageError::format(&file.dst, e),
                })?;
                content = summary.content;
                file.write(&tail)?;
                files.push(file.dst.clone());
                bytes += file.commit()?;
            }
            Sink::Raw { file, .. } => {
                files.push(file.dst.clone());
                bytes += file.commit()?;
            }
        }
        Ok(WriteReport {
            files,
            tokens: self.tokens,
            bytes,
            content,
        })
    }
}
