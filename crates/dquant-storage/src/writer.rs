//! Streaming, atomic dataset writers.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use dquant_codec::{Codec, TokenHasher};
use dquant_format::block::{BlockFileWriter, FileHeader};
use dquant_format::{megatron, ContentChecksum, DType, DocIndex, FormatError};
use tempfile::NamedTempFile;

use crate::error::StorageError;

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

/// A file written under a temporary name in the destination's directory and renamed over the
/// destination only on [`Staged::commit`]. Dropping it uncommitted deletes it.
struct Staged {
    dst: PathBuf,
    out: BufWriter<NamedTempFile>,
    bytes: u64,
}

impl Staged {
    fn create(dst: &Path) -> Result<Self, StorageError> {
        let dir = match dst.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let name = dst
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // Like any file the user creates (0o666 less the umask), not tempfile's private 0o600:
        // the dataset is usually read by other users (the trainer, the agent).
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".tmp")
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .tempfile_in(dir)
            .map_err(|e| StorageError::io(dir, e))?;
        Ok(Staged {
            dst: dst.to_path_buf(),
            out: BufWriter::with_capacity(1 << 20, tmp),
            bytes: 0,
        })
    }

    fn write(&mut self, b: &[u8]) -> Result<(), StorageError> {
        self.bytes += b.len() as u64;
        self.out
            .write_all(b)
            .map_err(|e| StorageError::io(&self.dst, e))
    }

    /// Flushes, fsyncs and renames over the destination.
    fn commit(self) -> Result<u64, StorageError> {
        let dst = self.dst;
        let tmp = self
            .out
            .into_inner()
            .map_err(|e| StorageError::io(&dst, e.into_error()))?;
        tmp.as_file()
            .sync_all()
            .map_err(|e| StorageError::io(&dst, e))?;
        tmp.persist(&dst)
            .map_err(|e| StorageError::io(&dst, e.error))?;
        if let Some(dir) = dst.parent().filter(|p| !p.as_os_str().is_empty()) {
            // Make the rename itself durable.
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
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
        let sink = match format {
            OutputFormat::Megatron { dtype } => {
                let prefix = megatron_prefix_of(path);
                Sink::Megatron {
                    bin: Staged::create(Path::new(&format!("{}.bin", prefix.display())))?,
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
                let (writer, head) = BlockFileWriter::new(header, true)
                    .map_err(|e| StorageError::format(path, e))?;
                let mut file = Staged::create(path)?;
                file.write(&head)?;
                Sink::Block {
                    file,
                    writer: Box::new(writer),
                }
            }
            OutputFormat::Raw { dtype } => Sink::Raw {
                file: Staged::create(path)?,
                dtype,
            },
        };
        Ok(DatasetWriter {
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
                let mut idx_file = Staged::create(&idx_path)?;
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
