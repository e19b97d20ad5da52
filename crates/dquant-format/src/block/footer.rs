//! The block file's footer: its head (counts, totals, the block table) checked apart from the
//! document index after it, so a reader opens a file without reading its index.

use std::sync::Arc;

use dquant_codec::RankTable;

use super::*;
use crate::error::FormatError;
use crate::index::DocIndex;
use crate::varint;

/// The footer: totals, the block table and the document index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Footer {
    pub token_count: u64,
    pub max_token: u32,
    /// [`TokenHasher`] of all tokens.
    pub tokens_checksum: u64,
    /// Byte offset of every block, then the footer offset (`blocks + 1` entries).
    pub block_offsets: Vec<u64>,
    /// The rank table of a `rank+zstd` file (version 2), `None` in any other.
    pub ranks: Option<Arc<RankTable>>,
    pub index: DocIndex,
}

impl Footer {
    pub fn encode(&self) -> Vec<u8> {
        let ix = &self.index;
        let mut b = Vec::with_capacity(
            FOOTER_FIXED_LEN + 8 * self.block_offsets.len() + ix.sequences() + ix.documents(),
        );
        b.extend_from_slice(&self.token_count.to_le_bytes());
        b.extend_from_slice(&self.max_token.to_le_bytes());
        let ranks = rank_section(self.ranks.as_deref());
        b.extend_from_slice(&(ranks.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.tokens_checksum.to_le_bytes());
        b.extend_from_slice(&(self.block_offsets.len() as u64 - 1).to_le_bytes());
        b.extend_from_slice(&(ix.sequences() as u64).to_le_bytes());
        b.extend_from_slice(&(ix.documents() as u64).to_le_bytes());
        for &o in &self.block_offsets {
            b.extend_from_slice(&o.to_le_bytes());
        }
        b.extend_from_slice(&ranks);
        for i in 0..ix.sequences() {
            varint::put(&mut b, ix.sequence_len(i));
        }
        for w in ix.doc_seq().windows(2) {
            varint::put(&mut b, w[1] - w[0]);
        }
        b
    }

    /// A footer from its head and index.
    pub fn from_parts(head: FooterHead, index: DocIndex) -> Self {
        Footer {
            token_count: head.token_count,
            max_token: head.max_token,
            tokens_checksum: head.tokens_checksum,
            block_offsets: head.block_offsets,
            ranks: head.ranks,
            index,
        }
    }
}

/// A rank table's footer section: its stored form and a crc32c of it (the footer's own crc is
/// checked only with its index, and a wrong table would decode wrong ids that every block
/// crc passes). Empty without a table.
fn rank_section(ranks: Option<&RankTable>) -> Vec<u8> {
    let Some(t) = ranks else {
        return Vec::new();
    };
    let mut b = Vec::new();
    t.encode(&mut b);
    let c = crc(&b);
    b.extend_from_slice(&c.to_le_bytes());
    b
}

/// The rank table in a footer's section `b`: there must be one in a `rank+zstd` file, and
/// none in any other.
fn ranks_in(header: &FileHeader, b: &[u8]) -> Result<Option<Arc<RankTable>>, FormatError> {
    match (header.codec.compression.needs_rank_table(), b.len()) {
        (false, 0) => Ok(None),
        (true, n) if n > 0 => {
            let max = header.codec.width.max_token();
            Ok(Some(Arc::new(parse_rank_section(b, max)?)))
        }
        (_, n) => Err(FormatError::corrupt(
            FOOTER,
            format!("a {n}-byte rank table in a {} file", header.codec),
        )),
    }
}

/// Parses a rank table's footer section (with its crc32c); every id at most `max_token` (the
/// width's).
fn parse_rank_section(b: &[u8], max_token: u32) -> Result<RankTable, FormatError> {
    let Some(body) = b.len().checked_sub(4).map(|n| &b[..n]) else {
        return Err(FormatError::corrupt(
            FOOTER,
            "a rank table of under 4 bytes",
        ));
    };
    check_crc(
        || "block file rank table".into(),
        u32_at(b, body.len()),
        body,
    )?;
    RankTable::parse(body, max_token).map_err(|e| FormatError::corrupt(FOOTER, e.to_string()))
}

pub(super) const FOOTER: &str = "block file footer";

/// A footer's totals and block table: all that reading tokens needs. The document index that
/// follows them is parsed only when asked for ([`FooterHead::parse_index`]), so a reader of a
/// file with 100 M documents keeps 8 bytes a block, not 16 a document, and reads
/// `FOOTER_FIXED_LEN + 8 * (blocks + 1)` bytes of footer at open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FooterHead {
    pub token_count: u64,
    pub max_token: u32,
    /// [`TokenHasher`] of all tokens.
    pub tokens_checksum: u64,
    /// Byte offset of every block, then the footer offset (`blocks + 1` entries).
    pub block_offsets: Vec<u64>,
    /// The rank table of a `rank+zstd` file (version 2), `None` in any other.
    pub ranks: Option<Arc<RankTable>>,
    /// Bytes of the rank table's section, after the block table (0 without one).
    pub rank_bytes: u32,
    /// Counts of the index's entries.
    pub sequences: u64,
    pub documents: u64,
}

impl FooterHead {
    /// How many footer bytes the head takes, from the footer's first [`FOOTER_FIXED_LEN`]
    /// bytes (`None` if there are fewer, or the block count is absurd).
    pub fn len_from_fixed(fixed: &[u8]) -> Option<u64> {
        if fixed.len() < FOOTER_FIXED_LEN {
            return None;
        }
        let blocks = u64_at(fixed, 24);
        blocks
            .checked_add(1)?
            .checked_mul(8)?
            .checked_add(FOOTER_FIXED_LEN as u64)?
            .checked_add(u32_at(fixed, 12) as u64)
    }

    /// Bytes of footer the head takes.
    pub fn encoded_len(&self) -> usize {
        FOOTER_FIXED_LEN + 8 * self.block_offsets.len() + self.rank_bytes as usize
    }

    /// Parses and cross-checks the head from the footer's first bytes (at least
    /// [`FooterHead::len_from_fixed`] of them; more are ignored), against the header and the
    /// trailer: the counts must fit in the footer the trailer describes, and the block table
    /// must start after the header, rise by at least a block header a block, and end where
    /// the footer starts. The footer's checksum is not checked here: it covers the index too.
    pub fn parse(b: &[u8], header: &FileHeader, trailer: &Trailer) -> Result<Self, FormatError> {
        if b.len() < FOOTER_FIXED_LEN {
            return Err(FormatError::truncated(
                FOOTER,
                FOOTER_FIXED_LEN as u64,
                b.len() as u64,
            ));
        }
        let token_count = u64_at(b, 0);
        let max_token = u32_at(b, 8);
        let rank_bytes = u32_at(b, 12);
        let tokens_checksum = u64_at(b, 16);
        let blocks = u64_at(b, 24);
        let seqs = u64_at(b, 32);
        let docs = u64_at(b, 40);
        let expected_blocks = token_count.div_ceil(header.block_tokens as u64);
        if blocks != expected_blocks {
            return Err(FormatError::corrupt(
                FOOTER,
                format!(
                    "{blocks} blocks for {token_count} tokens of {} per block (expected {expected_blocks})",
                    header.block_tokens
                ),
            ));
        }
        // Every count is bounded by the bytes that must encode it, so a corrupt count cannot
        // make us allocate more than the footer's own size.
        let table_len = (blocks + 1).saturating_mul(8);
        let rest = trailer.footer_len.saturating_sub(FOOTER_FIXED_LEN as u64);
        let needed = table_len.saturating_add(rank_bytes as u64);
        if needed.saturating_add(seqs).saturating_add(docs) > rest {
            let table = match rank_bytes {
                0 => String::new(),
                n => format!(" a {n}-byte rank table,"),
            };
            return Err(FormatError::corrupt(
                FOOTER,
                format!(
                    "{blocks} blocks,{table} {seqs} sequences and {docs} documents do not fit in {} bytes",
                    trailer.footer_len
                ),
            ));
        }
        let table_end = FOOTER_FIXED_LEN + table_len as usize;
        let head_end = table_end + rank_bytes as usize;
        if b.len() < head_end {
            return Err(FormatError::truncated(
                FOOTER,
                head_end as u64,
                b.len() as u64,
            ));
        }
        let block_offsets: Vec<u64> = b[FOOTER_FIXED_LEN..table_end]
            .chunks_exact(8)
            .map(|c| u64_at(c, 0))
            .collect();
        check_block_table(&block_offsets, trailer.footer_offset)?;
        let ranks = ranks_in(header, &b[table_end..head_end])?;
        Ok(FooterHead {
            token_count,
            max_token,
            tokens_checksum,
            block_offsets,
            ranks,
            rank_bytes,
            sequences: seqs,
            documents: docs,
        })
    }

    /// Parses the document index: the footer's bytes after the head, to its end. Each count
    /// is checked against the tokens and the bytes left.
    pub fn parse_index(&self, b: &[u8]) -> Result<DocIndex, FormatError> {
        // Every count is bounded by the footer's bytes (`FooterHead::parse`).
        let mut seq_offsets = Vec::with_capacity(self.sequences as usize + 1);
        let mut doc_seq = Vec::with_capacity(self.documents as usize + 1);
        self.walk_index(b, |e| match e {
            IndexEntry::SeqOffset(o) => seq_offsets.push(o),
            IndexEntry::DocStart(d) => doc_seq.push(d),
        })?;
        DocIndex::new(seq_offsets, doc_seq)
    }

    /// The index half of the content checksum ([`ContentChecksum::index`]) straight from the
    /// index's bytes, as [`FooterHead::parse_index`] takes them and with its checks, without
    /// building the index: O(1) memory, where the index takes 16 bytes a document.
    pub fn index_checksum(&self, b: &[u8]) -> Result<u64, FormatError> {
        // The checksum hashes the sequence offsets, then the document starts: the order
        // the walk gives them in.
        let mut h = ChunkedHash::default();
        self.walk_index(b, |e| match e {
            IndexEntry::SeqOffset(v) | IndexEntry::DocStart(v) => h.push(v),
        })?;
        Ok(h.finish())
    }

    /// Walks the index's bytes: every sequence offset (from 0), then every document's first
    /// sequence (from 0, and the end), checked as [`DocIndex::new`] checks them.
    fn walk_index(&self, b: &[u8], mut visit: impl FnMut(IndexEntry)) -> Result<(), FormatError> {
        let mut seq_offset = |v| visit(IndexEntry::SeqOffset(v));
        let token_count = self.token_count;
        let mut pos = 0;
        let mut at = 0u64;
        seq_offset(0);
        for _ in 0..self.sequences {
            let len = varint::get(b, &mut pos, FOOTER)?;
            at = at
                .checked_add(len)
                .filter(|&t| t <= token_count)
                .ok_or_else(|| {
                    FormatError::corrupt(
                        FOOTER,
                        format!("sequence lengths exceed the {token_count} tokens"),
                    )
                })?;
            seq_offset(at);
        }
        if at != token_count {
            return Err(FormatError::corrupt(
                FOOTER,
                format!("sequences hold {at} tokens, the file has {token_count}"),
            ));
        }
        let mut seq_pos = 0u64;
        visit(IndexEntry::DocStart(0));
        for _ in 0..self.documents {
            seq_pos = seq_pos.saturating_add(varint::get(b, &mut pos, FOOTER)?);
            visit(IndexEntry::DocStart(seq_pos));
        }
        if pos != b.len() {
            return Err(FormatError::corrupt(
                FOOTER,
                format!("{} unexpected trailing bytes", b.len() - pos),
            ));
        }
        if seq_pos != self.sequences {
            return Err(FormatError::Index(format!(
                "document indices end at sequence {seq_pos} but there are {} sequences",
                self.sequences
            )));
        }
        Ok(())
    }
}

/// One value of a block file's document index, in the order the footer holds them.
pub(super) enum IndexEntry {
    SeqOffset(u64),
    DocStart(u64),
}

/// XXH3 of a stream of little-endian u64s, fed to the hasher a chunk at a time (one call a
/// value would cost more than the hashing). Equal to `xxh3_64` of the values' bytes back to
/// back, as [`ContentChecksum`] hashes them.
#[derive(Default)]
pub(super) struct ChunkedHash {
    hasher: xxhash_rust::xxh3::Xxh3,
    buf: Vec<u8>,
}

impl ChunkedHash {
    /// Values buffered before they go to the hasher.
    const CHUNK: usize = 8192;

    fn push(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
        if self.buf.len() >= 8 * Self::CHUNK {
            self.hasher.update(&self.buf);
            self.buf.clear();
        }
    }

    fn finish(mut self) -> u64 {
        self.hasher.update(&self.buf);
        self.hasher.digest()
    }
}

/// The block table starts right after the file header, each block leaves room for a block
/// header, and the last entry is where the footer starts.
pub(super) fn check_block_table(
    block_offsets: &[u64],
    footer_offset: u64,
) -> Result<(), FormatError> {
    if block_offsets[0] != HEADER_LEN as u64 {
        return Err(FormatError::corrupt(
            FOOTER,
            format!(
                "first block at byte {}, expected {HEADER_LEN}",
                block_offsets[0]
            ),
        ));
    }
    if let Some(i) = block_offsets
        .windows(2)
        .position(|w| w[1] < w[0].saturating_add(BLOCK_HEADER_LEN as u64))
    {
        return Err(FormatError::corrupt(
            FOOTER,
            format!(
                "block {} at byte {} overlaps block {i} at byte {}",
                i + 1,
                block_offsets[i + 1],
                block_offsets[i]
            ),
        ));
    }
    let last = block_offsets[block_offsets.len() - 1];
    if last != footer_offset {
        return Err(FormatError::corrupt(
            FOOTER,
            format!("blocks end at byte {last} but the footer starts at {footer_offset}"),
        ));
    }
    Ok(())
}
