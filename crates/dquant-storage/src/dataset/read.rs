//! Reading a dataset's tokens: ranges into buffers the caller owns, stored bytes as they are,
//! and the reads a batch is about to make started early.

use std::io::IoSliceMut;
use std::ops::Range;

use dquant_codec::kernels::max_token;
use dquant_codec::Decoder;
use dquant_format::block::BlockLayout;
use dquant_format::DType;

use super::sums::CheckedChunks;
use super::{read_at, read_error, Dataset, Source};
use crate::backend::ReadAt;
use crate::error::StorageError;

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

/// Whether a read from a plain int32 file checks every token's sign bit.
///
/// Why a choice: the check is a pass over the batch after the read, memory-bound (10% of
/// the samples of the profile's pread path). A caller that narrows the tokens into a width
/// of at most 31 bits right after the read checks every token's range there anyway, and a
/// negative value, read as `u32`, is over `i32::MAX` and fails that check. Leaving the sign
/// to it took the agent's CPU on the shared-memory path by pread from 0.241 to 0.215 s a GB
/// and its rate from 4.06 to 4.58 GB/s (medians of five alternated rounds of
/// `dquant-offload-bench throughput zipf256m_int32 --cases memcpy,agent-shm,agent,inproc
/// --map-budget 0 --runs 1`, 2 vCPU).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SignCheck {
    /// Checked here: a negative value is an error naming its file, value and offset.
    Here,
    /// Left to the caller's narrowing. When narrowing fails, the caller reads the ranges
    /// again with [`SignCheck::Here`], which names a negative value as every other read
    /// does; the tokens are otherwise the same.
    ByNarrowing,
}

/// Reads token ranges of a [`Dataset`], reusing its buffers across calls.
pub struct TokenReader<'a> {
    pub(super) ds: &'a Dataset,
    pub(super) bufs: ReadBuffers,
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
        let Source::Plain { file, dtype, sums } = &self.source else {
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
            .map_err(|e| read_error(&**file, &self.data_path, end * item, e))?;
        if let Some(sums) = sums {
            sums.check(&**file, &self.data_path, start * item, bufs)?;
        }
        Ok(())
    }

    /// Tells the dataset's object that the tokens of `ranges` are about to be read (see
    /// [`ReadAt::will_read`]): the bytes of plain files' tokens, a block file's covering
    /// blocks. Ranges outside the dataset are left out (their reads will say why).
    pub fn will_read(&self, ranges: &[Range<u64>]) {
        let tokens = self.tokens();
        let inside = ranges.iter().filter(|r| r.start < r.end && r.end <= tokens);
        let (file, bytes): (&dyn ReadAt, Vec<Range<u64>>) = match &self.source {
            Source::Plain { file, dtype, .. } => {
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

    /// Fills `out` with the tokens of `ranges`, one after another (as [`Dataset::read_into`]
    /// of each would). From a plain int32 file, ranges that continue each other (the next
    /// starts where the one before ends, or on its last token, as packed samples do) are one
    /// run read with one vectored read: a batch of consecutive samples is one syscall, not
    /// one a sample (14% of a pread-and-narrow pass of 16 samples of 4,096 tokens).
    ///
    /// # Panics
    /// If `out` is not the ranges' total length.
    pub fn read_ranges_into(
        &self,
        ranges: &[Range<u64>],
        out: &mut [u32],
        bufs: &mut ReadBuffers,
    ) -> Result<(), StorageError> {
        self.read_ranges_checking(ranges, out, bufs, SignCheck::Here)
    }

    /// [`Dataset::read_ranges_into`], with int32's sign check where `sign` says.
    ///
    /// # Panics
    /// If `out` is not the ranges' total length.
    pub fn read_ranges_checking(
        &self,
        ranges: &[Range<u64>],
        out: &mut [u32],
        bufs: &mut ReadBuffers,
        sign: SignCheck,
    ) -> Result<(), StorageError> {
        let total = crate::source::ranges_tokens(ranges);
        assert_eq!(
            out.len() as u64,
            total,
            "read_ranges_into: the buffer must hold the ranges"
        );
        let vectored = matches!(
            &self.source,
            Source::Plain { dtype: DType::I32, .. } if cfg!(target_endian = "little")
        );
        if !vectored {
            return self.read_ranges_one_by_one(ranges, out, bufs, sign);
        }
        let mut at = 0usize;
        let mut k = 0;
        while k < ranges.len() {
            let end = run_end(ranges, k);
            let n = crate::source::ranges_tokens(&ranges[k..end]) as usize;
            let dst = &mut out[at..at + n];
            if end - k == 1 {
                self.read_into_checking(ranges[k].clone(), dst, bufs, sign)?;
            } else {
                self.read_i32_run(&ranges[k..end], dst, bufs, sign)?;
            }
            at += n;
            k = end;
        }
        Ok(())
    }

    /// The ranges of one run (see [`run_end`]) of a plain int32 file, into `out`: one
    /// vectored read of the run's bytes, each range's row short of the token the next one
    /// starts on (copied after the read), then the sign bits checked where `sign` says. A
    /// negative value is reported by reading the ranges one by one, as [`Dataset::read_into`]
    /// names it.
    fn read_i32_run(
        &self,
        ranges: &[Range<u64>],
        out: &mut [u32],
        bufs: &mut ReadBuffers,
        sign: SignCheck,
    ) -> Result<(), StorageError> {
        let Source::Plain { file, sums, .. } = &self.source else {
            unreachable!("runs are made of plain int32 files only");
        };
        // A run's ranges are none of them empty or backwards (`run_end`); past the file's
        // end, each range's own read names the error.
        let (start, end) = (ranges[0].start, ranges[ranges.len() - 1].end);
        if end > self.tokens() {
            return self.read_ranges_one_by_one(ranges, out, bufs, SignCheck::Here);
        }
        let mut rows = Vec::with_capacity(ranges.len());
        let mut rest: &mut [u32] = out;
        for (i, r) in ranges.iter().enumerate() {
            let (row, tail) = rest.split_at_mut((r.end - r.start) as usize);
            let keep = row.len() - shared_with_next(ranges, i);
            rows.push(IoSliceMut::new(bytemuck::cast_slice_mut(&mut row[..keep])));
            rest = tail;
        }
        file.read_exact_vectored_at(&mut rows, start * 4)
            .map_err(|e| read_error(&**file, &self.data_path, end * 4, e))?;
        if let Some(sums) = sums {
            sums.check(&**file, &self.data_path, start * 4, &rows)?;
        }
        drop(rows);
        fill_shared_tokens(ranges, out);
        if sign == SignCheck::ByNarrowing || max_token(out) <= i32::MAX as u32 {
            return Ok(());
        }
        self.read_ranges_one_by_one(ranges, out, bufs, SignCheck::Here)
    }

    fn read_ranges_one_by_one(
        &self,
        ranges: &[Range<u64>],
        out: &mut [u32],
        bufs: &mut ReadBuffers,
        sign: SignCheck,
    ) -> Result<(), StorageError> {
        let mut at = 0usize;
        for r in ranges {
            let n = r.end.saturating_sub(r.start) as usize;
            self.read_into_checking(r.clone(), &mut out[at..at + n], bufs, sign)?;
            at += n;
        }
        Ok(())
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
        self.read_into_checking(range, out, bufs, SignCheck::Here)
    }

    fn read_into_checking(
        &self,
        range: Range<u64>,
        out: &mut [u32],
        bufs: &mut ReadBuffers,
        sign: SignCheck,
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
            Source::Plain {
                file,
                dtype: DType::I32,
                sums,
            } if cfg!(target_endian = "little") => {
                self.read_i32_into(&**file, sums.as_deref(), range.start, out, bufs, sign)
            }
            Source::Plain { file, dtype, sums } => {
                let item = dtype.itemsize() as u64;
                bufs.bytes.resize(out.len() * item as usize, 0);
                let at = range.start * item;
                read_at(&**file, &self.data_path, &mut bufs.bytes, at)?;
                if let Some(sums) = sums {
                    sums.check(&**file, &self.data_path, at, &[bufs.bytes.as_slice()])?;
                }
                dtype
                    .decode(&bufs.bytes, out, range.start)
                    .map_err(|e| StorageError::format(&self.data_path, e))
            }
            Source::Block { file, meta } => self.read_blocks_into(&**file, meta, range, out, bufs),
        }
    }

    /// The tokens of `range` from a block file: each whole block decoded straight into `out`,
    /// a block the range only meets decoded into `bufs` and kept there for the next read.
    fn read_blocks_into(
        &self,
        file: &dyn ReadAt,
        meta: &BlockLayout,
        range: Range<u64>,
        out: &mut [u32],
        bufs: &mut ReadBuffers,
    ) -> Result<(), StorageError> {
        let blocks = meta.blocks_covering(range.clone());
        let fe = |e| StorageError::format(&self.data_path, e);
        if blocks.len() == 1 && bufs.cached == Some((self.id, blocks.start)) {
            let bt = meta.block_tokens(blocks.start);
            out.copy_from_slice(
                &bufs.block[(range.start - bt.start) as usize..(range.end - bt.start) as usize],
            );
            return Ok(());
        }
        let bytes = meta.byte_range(blocks.clone());
        bufs.bytes.resize((bytes.end - bytes.start) as usize, 0);
        read_at(file, &self.data_path, &mut bufs.bytes, bytes.start)?;
        for i in blocks {
            let br = meta.byte_range(i..i + 1);
            let raw =
                &bufs.bytes[(br.start - bytes.start) as usize..(br.end - bytes.start) as usize];
            let bt = meta.block_tokens(i);
            if bt.start >= range.start && bt.end <= range.end {
                let dst =
                    &mut out[(bt.start - range.start) as usize..(bt.end - range.start) as usize];
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
                    .copy_from_slice(&bufs.block[(s - bt.start) as usize..(e - bt.start) as usize]);
            }
        }
        Ok(())
    }

    /// int32 (Megatron's dtype for vocabularies over 65,536) read straight into `out`: one
    /// copy instead of a read and then a load, its sign bits checked in place where `sign`
    /// says (5% of the agent's CPU on the shared-memory path, bench/profile). A negative value
    /// is named as the load names it.
    fn read_i32_into(
        &self,
        file: &dyn ReadAt,
        sums: Option<&CheckedChunks>,
        start: u64,
        out: &mut [u32],
        bufs: &mut ReadBuffers,
        sign: SignCheck,
    ) -> Result<(), StorageError> {
        let at = start * 4;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        read_at(file, &self.data_path, bytes, at)?;
        if let Some(sums) = sums {
            sums.check(file, &self.data_path, at, &[&*bytes])?;
        }
        if sign == SignCheck::ByNarrowing || max_token(out) <= i32::MAX as u32 {
            return Ok(());
        }
        bufs.bytes.clear();
        bufs.bytes.extend_from_slice(bytemuck::cast_slice(out));
        DType::I32
            .decode(&bufs.bytes, out, start)
            .map_err(|e| StorageError::format(&self.data_path, e))
    }
}

/// The end (exclusive) of the run of `ranges` that starts at `k`: ranges that each start
/// where the one before ends or on its last token, none empty, at most [`MAX_RUN`] of them
/// (a vectored read takes at most 1,024 buffers).
fn run_end(ranges: &[Range<u64>], k: usize) -> usize {
    let mut end = k + 1;
    while end < ranges.len() && end - k < MAX_RUN {
        let (prev, next) = (&ranges[end - 1], &ranges[end]);
        let continues = next.start < next.end
            && prev.start < prev.end
            && (next.start == prev.end || next.start + 1 == prev.end);
        if !continues {
            break;
        }
        end += 1;
    }
    end
}

/// Most ranges one vectored read fills (`IOV_MAX`).
const MAX_RUN: usize = 1024;

/// Tokens range `i` of a run shares with the next one: 1 when the next starts on its last
/// token (packed samples), else 0.
fn shared_with_next(ranges: &[Range<u64>], i: usize) -> usize {
    ranges
        .get(i + 1)
        .map_or(0, |next| (ranges[i].end - next.start) as usize)
}

/// After a run's read: each range that shares its last token with the next range's first
/// gets it from there (the read filled it once, in the next range's row).
fn fill_shared_tokens(ranges: &[Range<u64>], out: &mut [u32]) {
    let mut at = 0usize;
    for (i, r) in ranges.iter().enumerate() {
        let n = (r.end - r.start) as usize;
        if shared_with_next(ranges, i) == 1 {
            out[at + n - 1] = out[at + n];
        }
        at += n;
    }
}
