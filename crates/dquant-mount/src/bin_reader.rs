//! Reads of a mounted `.bin`: byte ranges of the narrowed token stream, as token ranges
//! asked of the agent.
//!
//! The original design reads remote storage through a 1 MiB DPU buffer; here that buffer
//! is the aligned block. A read that starts a file or goes on from the last block fetches
//! whole 1 MiB blocks, and the range source behind them (its readahead window, sized by
//! `--readahead`) keeps the next blocks in flight, so a sequential reader never waits a
//! round trip per block. Any other read (np.memmap sampling at random) fetches only the
//! pages it covers: a 4 KiB read does not cost a 1 MiB transfer. The last two blocks are
//! held for the kernel's smaller reads inside them; past that, the kernel's page cache
//! keeps what was read.

use std::collections::VecDeque;
use std::ops::Range;

use dquant_engine::TokenSource;
use dquant_format::DType;
use dquant_remote::{ReadaheadConfig, RemoteSource};

use crate::error::MountError;

/// The aligned block: what a sequential read fetches at a time.
pub const BLOCK_BYTES: u64 = 1 << 20;
/// The unit of a random read.
const PAGE_BYTES: u64 = 4096;
/// Blocks held for reads inside them.
const HELD_BLOCKS: usize = 2;

/// One dataset's `.bin` as `dtype` bytes, read through `source`.
pub struct BinReader {
    dtype: DType,
    tokens: u64,
    source: Option<RemoteSource>,
    held: VecDeque<(u64, Vec<u8>)>,
    last_block: Option<u64>,
    /// Decoded tokens of the last fetch.
    buf: Vec<u32>,
    /// A block buffer to fetch into, the last random read's pages, and a read that spans
    /// blocks, gathered.
    spare: Vec<u8>,
    pages: Vec<u8>,
    gather: Vec<u8>,
}

impl BinReader {
    pub fn new(dtype: DType, tokens: u64) -> Self {
        BinReader {
            dtype,
            tokens,
            source: None,
            held: VecDeque::new(),
            last_block: None,
            buf: Vec::new(),
            spare: Vec::new(),
            pages: Vec::new(),
            gather: Vec::new(),
        }
    }

    /// The file's length.
    fn len(&self) -> u64 {
        self.tokens * self.dtype.itemsize() as u64
    }

    pub fn has_source(&self) -> bool {
        self.source.is_some()
    }

    /// Gives the reader its source, reading ahead `readahead` bytes in whole blocks. A
    /// source of another length than the file's is refused: the dataset changed.
    pub fn set_source(
        &mut self,
        mut source: RemoteSource,
        readahead: u64,
    ) -> Result<(), MountError> {
        if source.tokens() != self.tokens {
            return Err(MountError::Changed(format!(
                "the dataset now holds {} tokens; the mount showed {}",
                source.tokens(),
                self.tokens
            )));
        }
        source.set_readahead(ReadaheadConfig {
            chunk_tokens: BLOCK_BYTES / self.dtype.itemsize() as u64,
            in_flight: readahead.div_ceil(BLOCK_BYTES) as usize,
        });
        self.source = Some(source);
        Ok(())
    }

    /// The bytes `offset..offset + size` (clamped to the file): a slice of one block when
    /// the range lies in one (the kernel's reads do), else gathered. A failed fetch drops
    /// the source: whatever it had in flight is unknown, and the next read opens a new one.
    pub fn read(&mut self, offset: u64, size: u64) -> Result<&[u8], MountError> {
        let end = offset.saturating_add(size).min(self.len());
        if offset >= end {
            return Ok(&[]);
        }
        if offset / BLOCK_BYTES == (end - 1) / BLOCK_BYTES {
            return self.bytes(offset..end);
        }
        let mut out = std::mem::take(&mut self.gather);
        out.clear();
        let mut pos = offset;
        while pos < end {
            let take = pos..end.min((pos / BLOCK_BYTES + 1) * BLOCK_BYTES);
            match self.bytes(take.clone()) {
                Ok(b) => out.extend_from_slice(b),
                Err(e) => {
                    self.gather = out;
                    return Err(e);
                }
            }
            pos = take.end;
        }
        self.gather = out;
        Ok(&self.gather)
    }

    /// The bytes `take`, which lie in one block: from a held block, from the block fetched
    /// whole (and then held), or from just the pages they cover.
    fn bytes(&mut self, take: Range<u64>) -> Result<&[u8], MountError> {
        let b = take.start / BLOCK_BYTES;
        let block = b * BLOCK_BYTES..((b + 1) * BLOCK_BYTES).min(self.len());
        let at = |r: &Range<u64>| (take.start - r.start) as usize..(take.end - r.start) as usize;
        if let Some(i) = self.held.iter().position(|(h, _)| *h == b) {
            return Ok(&self.held[i].1[at(&block)]);
        }
        if self.sequential(b) {
            let mut bytes = std::mem::take(&mut self.spare);
            self.fetch(block.clone(), &mut bytes)?;
            self.hold(b, bytes);
            let Some((_, bytes)) = self.held.back() else {
                unreachable!("a block was just held")
            };
            return Ok(&bytes[at(&block)]);
        }
        let pages = take.start / PAGE_BYTES * PAGE_BYTES
            ..(take.end.div_ceil(PAGE_BYTES) * PAGE_BYTES).min(block.end);
        let mut bytes = std::mem::take(&mut self.pages);
        self.fetch(pages.clone(), &mut bytes)?;
        self.pages = bytes;
        Ok(&self.pages[at(&pages)])
    }

    /// Whether block `b` is read whole: the file's first, or the one after the last.
    fn sequential(&self, b: u64) -> bool {
        b == 0 || self.last_block.is_some_and(|l| b == l + 1)
    }

    /// Holds block `b`; the block it pushes out becomes the next fetch's buffer (1 MiB not
    /// allocated and zeroed again for every block).
    fn hold(&mut self, b: u64, bytes: Vec<u8>) {
        if self.held.len() == HELD_BLOCKS {
            if let Some((_, old)) = self.held.pop_front() {
                self.spare = old;
            }
        }
        self.held.push_back((b, bytes));
        self.last_block = Some(b);
    }

    /// Fills `bytes` with the bytes `range` (token-aligned: blocks and pages are whole tokens
    /// of any dtype).
    fn fetch(&mut self, range: Range<u64>, bytes: &mut Vec<u8>) -> Result<(), MountError> {
        let item = self.dtype.itemsize() as u64;
        let tokens = range.start / item..range.end / item;
        let Some(source) = self.source.as_mut() else {
            return Err(MountError::Changed("the dataset's reader is closed".into()));
        };
        self.buf.resize((tokens.end - tokens.start) as usize, 0);
        if let Err(e) = source.read_ranges(std::slice::from_ref(&tokens), &mut self.buf) {
            self.drop_source();
            return Err(e.into());
        }
        bytes.resize((range.end - range.start) as usize, 0);
        self.dtype.encode(&self.buf, bytes, tokens.start)?;
        Ok(())
    }

    /// Forgets the source and what was read ahead through it.
    pub fn drop_source(&mut self) {
        self.source = None;
        self.last_block = None;
    }
}
