//! Checking a plain file's reads against its chunk sums sidecar
//! ([`dquant_format::chunk_sums`]), so a flipped bit on disk fails the read that meets it
//! instead of reaching a batch.
//!
//! Each chunk is checked the first time a read touches it, then marked in a bitmap that lives
//! as long as the opened dataset (an agent keeps one per version of its files): a Megatron
//! sample of short documents is a hundred small reads, and checking their whole chunks every
//! time would read each chunk a hundred times over. A chunk that fails is never marked, so
//! every read that touches it fails.

use std::ops::{Deref, Range};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use dquant_format::chunk_sums::ChunkSums;
use dquant_format::FormatError;

use super::read_at;
use crate::backend::ReadAt;
use crate::error::StorageError;

/// A file's chunk sums and which chunks reads have checked so far.
pub(super) struct CheckedChunks {
    sums: ChunkSums,
    /// The sidecar's name, for messages.
    sidecar: PathBuf,
    checked: Box<[AtomicU64]>,
}

impl CheckedChunks {
    /// The sums read from `sidecar`, which must cover `data_len` bytes (the data file now).
    pub(super) fn new(
        sums: ChunkSums,
        sidecar: PathBuf,
        data: &Path,
        data_len: u64,
    ) -> Result<Self, StorageError> {
        if sums.data_len() != data_len {
            return Err(StorageError::Usage(format!(
                "{}: covers {} bytes of {}, which has {data_len}: the sidecar is stale; write \
                 it again with `dquant sums`",
                sidecar.display(),
                sums.data_len(),
                data.display()
            )));
        }
        let words = sums.chunks().div_ceil(64) as usize;
        let checked = (0..words).map(|_| AtomicU64::new(0)).collect();
        Ok(CheckedChunks {
            sums,
            sidecar,
            checked,
        })
    }

    pub(super) fn sums(&self) -> &ChunkSums {
        &self.sums
    }

    pub(super) fn sidecar(&self) -> &Path {
        &self.sidecar
    }

    fn is_checked(&self, i: u64) -> bool {
        self.checked[(i / 64) as usize].load(Ordering::Relaxed) & (1 << (i % 64)) != 0
    }

    fn mark(&self, i: u64) {
        self.checked[(i / 64) as usize].fetch_or(1 << (i % 64), Ordering::Relaxed);
    }

    /// Checks every chunk under the bytes a read returned that no read has checked yet:
    /// `pieces` are those bytes, back to back from `at` in `file` (named `name`). A chunk the
    /// read covers whole is summed from `pieces`; one it covers in part is read whole, checked,
    /// and its overlap compared with `pieces`, so what the caller returns is what was checked.
    pub(super) fn check<P: Deref<Target = [u8]>>(
        &self,
        file: &dyn ReadAt,
        name: &Path,
        at: u64,
        pieces: &[P],
    ) -> Result<(), StorageError> {
        let len: u64 = pieces.iter().map(|p| p.len() as u64).sum();
        let read = at..at + len;
        let mut whole = Vec::new();
        for i in self.sums.chunks_covering(read.clone()) {
            if self.is_checked(i) {
                continue;
            }
            let c = self.sums.chunk_bytes(i);
            let crc = if c.start >= read.start && c.end <= read.end {
                let mut crc = 0;
                each_slice(pieces, c.start - at..c.end - at, |s| {
                    crc = crc32c::crc32c_append(crc, s)
                });
                crc
            } else {
                whole.resize((c.end - c.start) as usize, 0);
                read_at(file, name, &mut whole, c.start)?;
                self.same_overlap(name, &whole, c.clone(), read.clone(), pieces)?;
                crc32c::crc32c(&whole)
            };
            self.sums
                .check(i, crc)
                .map_err(|e| StorageError::format(name, self.name_sidecar(e)))?;
            self.mark(i);
        }
        Ok(())
    }

    /// The part of chunk `c` (`whole`) that the read returned must equal what it returned:
    /// they differ only if the file changed between the two reads.
    fn same_overlap<P: Deref<Target = [u8]>>(
        &self,
        name: &Path,
        whole: &[u8],
        c: Range<u64>,
        read: Range<u64>,
        pieces: &[P],
    ) -> Result<(), StorageError> {
        let (s, e) = (c.start.max(read.start), c.end.min(read.end));
        let mut want = &whole[(s - c.start) as usize..(e - c.start) as usize];
        let mut same = true;
        each_slice(pieces, s - read.start..e - read.start, |got| {
            same &= want.starts_with(got);
            want = &want[got.len().min(want.len())..];
        });
        if same {
            return Ok(());
        }
        Err(StorageError::io(
            name,
            std::io::Error::other(format!(
                "bytes {s}..{e} changed between two reads: the file is being rewritten"
            )),
        ))
    }

    /// A chunk's mismatch, naming the sidecar it was checked against.
    fn name_sidecar(&self, e: FormatError) -> FormatError {
        match e {
            FormatError::Checksum {
                what,
                stored,
                computed,
            } => FormatError::Checksum {
                what: format!("{what}, against {}", self.sidecar.display()),
                stored,
                computed,
            },
            e => e,
        }
    }
}

/// Calls `f` on the slices of `pieces` (back to back) that hold `range`, in order.
fn each_slice<P: Deref<Target = [u8]>>(pieces: &[P], range: Range<u64>, mut f: impl FnMut(&[u8])) {
    let mut off = 0u64;
    for p in pieces {
        let (ps, pe) = (off, off + p.len() as u64);
        off = pe;
        let (s, e) = (range.start.max(ps), range.end.min(pe));
        if s < e {
            f(&p[(s - ps) as usize..(e - ps) as usize]);
        }
        if pe >= range.end {
            break;
        }
    }
}
