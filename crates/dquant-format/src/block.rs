//! The dquant block file (`.dqb`): a token stream in independently decodable, checksummed
//! blocks, with a block table for random access by token offset.
//!
//! Why this shape: the agent and the S3 backend fetch token range `[a, b)` by reading only the
//! blocks that cover it, in one contiguous byte range, so the table must map tokens to bytes
//! without reading data. Every block but the last holds exactly `block_tokens` tokens, which
//! makes the token → block step a division; the table maps blocks to byte offsets. The index
//! (block table, boundaries, totals) sits in a footer written after the blocks, Parquet-style,
//! so a converter streams with bounded memory and never seeks back.
//!
//! Layout, all integers little-endian:
//!
//! ```text
//! file    = header(64) block* footer trailer(32)
//! header  = "DQBLOCKS" version:u16=1 header_len:u16=64 codec:[u8;4] block_tokens:u32
//!           vocab_size:u32 reserved:[u8;36]=0 crc32c(bytes 0..60):u32
//! block   = "DQBK" codec:[u8;4] tokens:u32 payload_len:u32 first_token:u64
//!           payload_crc32c:u32 crc32c(bytes 0..28):u32 payload[payload_len]
//! footer  = token_count:u64 max_token:u32 reserved:u32=0 tokens_xxh3:u64 block_count:u64
//!           sequence_count:u64 document_count:u64 block_offset:u64 * (block_count + 1)
//!           sequence_length:varint * sequence_count
//!           sequences_per_document:varint * document_count
//! trailer = footer_offset:u64 footer_len:u64 footer_crc32c:u32 crc32c(bytes 0..20):u32
//!           "DQBLOCKS"
//! codec   = width_kind:u8 width_bits:u8 compression_kind:u8 compression_level:i8
//! ```
//!
//! Each block names its own codec: a block that compression would grow is stored at its plain
//! width, and the header's codec is the one the writer asked for.

use std::ops::Range;

use dquant_codec::{encode_width, Codec, Compression, Decoder, Encoder, TokenHasher, Width};

use crate::content::ContentChecksum;
use crate::error::FormatError;
use crate::index::DocIndex;
use crate::varint;

pub const FILE_MAGIC: [u8; 8] = *b"DQBLOCKS";
pub const BLOCK_MAGIC: [u8; 4] = *b"DQBK";
pub const VERSION: u16 = 1;
pub const HEADER_LEN: usize = 64;
pub const BLOCK_HEADER_LEN: usize = 32;
pub const TRAILER_LEN: usize = 32;
/// Fixed part of the footer, before the block table.
pub const FOOTER_FIXED_LEN: usize = 48;
/// Uncompressed payload per block by default: the DPU buffer size of the original design.
pub const DEFAULT_BLOCK_BYTES: usize = 1 << 20;
/// Largest uncompressed payload of one block. Readers allocate a block's decoded size before
/// decompressing it, so a header may not ask for more than this.
pub const MAX_BLOCK_BYTES: usize = 1 << 30;

/// Checks a block size in tokens: a positive multiple of 256 whose payload at `codec`'s width
/// is at most [`MAX_BLOCK_BYTES`].
fn check_block_tokens(codec: Codec, block_tokens: u32, what: &str) -> Result<(), FormatError> {
    if block_tokens == 0 || !block_tokens.is_multiple_of(256) {
        return Err(FormatError::corrupt(
            what,
            format!("block size {block_tokens} tokens is not a positive multiple of 256"),
        ));
    }
    let bytes = codec.raw_len(block_tokens as usize);
    if bytes > MAX_BLOCK_BYTES {
        return Err(FormatError::corrupt(
            what,
            format!("blocks of {block_tokens} tokens at {codec} hold {bytes} bytes, over the {MAX_BLOCK_BYTES}-byte limit"),
        ));
    }
    Ok(())
}

/// Tokens per block so that a block's uncompressed payload is at most `block_bytes`, rounded
/// down to whole bit-packing groups of 256 tokens.
pub fn block_tokens_for(width: Width, block_bytes: usize) -> u32 {
    let t = block_bytes as u64 * 8 / width.bits_per_token() as u64;
    (t / 256 * 256).clamp(256, u32::MAX as u64 / 256 * 256) as u32
}

fn crc(b: &[u8]) -> u32 {
    crc32c::crc32c(b)
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}

fn check_crc(what: impl FnOnce() -> String, stored: u32, data: &[u8]) -> Result<(), FormatError> {
    let computed = crc(data);
    if computed == stored {
        Ok(())
    } else {
        Err(FormatError::Checksum {
            what: what(),
            stored,
            computed,
        })
    }
}

fn codec_from(b: &[u8], what: &str) -> Result<Codec, FormatError> {
    Codec::from_bytes([b[0], b[1], b[2], b[3]])
        .ok_or_else(|| FormatError::corrupt(what, format!("unknown codec bytes {:02x?}", &b[..4])))
}

/// The fixed header at the start of a block file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileHeader {
    /// The codec the writer was asked for (blocks may fall back to the plain width).
    pub codec: Codec,
    /// Tokens in every block but the last.
    pub block_tokens: u32,
    /// Vocabulary size the user declared, 0 if none.
    pub vocab_size: u32,
}

impl FileHeader {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&FILE_MAGIC);
        b[8..10].copy_from_slice(&VERSION.to_le_bytes());
        b[10..12].copy_from_slice(&(HEADER_LEN as u16).to_le_bytes());
        b[12..16].copy_from_slice(&self.codec.to_bytes());
        b[16..20].copy_from_slice(&self.block_tokens.to_le_bytes());
        b[20..24].copy_from_slice(&self.vocab_size.to_le_bytes());
        let c = crc(&b[..60]);
        b[60..64].copy_from_slice(&c.to_le_bytes());
        b
    }

    /// Parses the first [`HEADER_LEN`] bytes of a file.
    pub fn parse(b: &[u8]) -> Result<Self, FormatError> {
        if b.len() < 8 || b[..8] != FILE_MAGIC {
            return Err(FormatError::BadMagic {
                what: "dquant block file",
                found: String::from_utf8_lossy(&b[..b.len().min(8)]).into_owned(),
                expected: "DQBLOCKS".into(),
            });
        }
        if b.len() < HEADER_LEN {
            return Err(FormatError::truncated(
                "block file header",
                HEADER_LEN as u64,
                b.len() as u64,
            ));
        }
        let version = u16::from_le_bytes([b[8], b[9]]);
        if version != VERSION {
            return Err(FormatError::UnsupportedVersion {
                what: "dquant block file",
                version: version as u64,
                supported: VERSION as u64,
            });
        }
        check_crc(|| "block file header".into(), u32_at(b, 60), &b[..60])?;
        let header_len = u16::from_le_bytes([b[10], b[11]]);
        if header_len as usize != HEADER_LEN {
            return Err(FormatError::corrupt(
                "block file header",
                format!("header length {header_len}, expected {HEADER_LEN}"),
            ));
        }
        let codec = codec_from(&b[12..16], "block file header")?;
        let block_tokens = u32_at(b, 16);
        check_block_tokens(codec, block_tokens, "block file header")?;
        Ok(FileHeader {
            codec,
            block_tokens,
            vocab_size: u32_at(b, 20),
        })
    }
}

/// The header in front of every block's payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockHeader {
    pub codec: Codec,
    pub tokens: u32,
    pub payload_len: u32,
    pub first_token: u64,
    pub payload_crc: u32,
}

impl BlockHeader {
    pub fn encode(&self) -> [u8; BLOCK_HEADER_LEN] {
        let mut b = [0u8; BLOCK_HEADER_LEN];
        b[0..4].copy_from_slice(&BLOCK_MAGIC);
        b[4..8].copy_from_slice(&self.codec.to_bytes());
        b[8..12].copy_from_slice(&self.tokens.to_le_bytes());
        b[12..16].copy_from_slice(&self.payload_len.to_le_bytes());
        b[16..24].copy_from_slice(&self.first_token.to_le_bytes());
        b[24..28].copy_from_slice(&self.payload_crc.to_le_bytes());
        let c = crc(&b[..28]);
        b[28..32].copy_from_slice(&c.to_le_bytes());
        b
    }

    /// Parses a block header; `what` names the block in errors.
    pub fn parse(b: &[u8], what: &str) -> Result<Self, FormatError> {
        if b.len() < BLOCK_HEADER_LEN {
            return Err(FormatError::truncated(
                what,
                BLOCK_HEADER_LEN as u64,
                b.len() as u64,
            ));
        }
        if b[..4] != BLOCK_MAGIC {
            return Err(FormatError::corrupt(
                what,
                format!("bad block magic {:02x?}, expected \"DQBK\"", &b[..4]),
            ));
        }
        check_crc(|| format!("{what} header"), u32_at(b, 28), &b[..28])?;
        Ok(BlockHeader {
            codec: codec_from(&b[4..8], what)?,
            tokens: u32_at(b, 8),
            payload_len: u32_at(b, 12),
            first_token: u64_at(b, 16),
            payload_crc: u32_at(b, 24),
        })
    }
}

/// The fixed trailer at the end of a block file, pointing at the footer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trailer {
    pub footer_offset: u64,
    pub footer_len: u64,
    pub footer_crc: u32,
}

impl Trailer {
    pub fn encode(&self) -> [u8; TRAILER_LEN] {
        let mut b = [0u8; TRAILER_LEN];
        b[0..8].copy_from_slice(&self.footer_offset.to_le_bytes());
        b[8..16].copy_from_slice(&self.footer_len.to_le_bytes());
        b[16..20].copy_from_slice(&self.footer_crc.to_le_bytes());
        let c = crc(&b[..20]);
        b[20..24].copy_from_slice(&c.to_le_bytes());
        b[24..32].copy_from_slice(&FILE_MAGIC);
        b
    }

    /// Parses the last [`TRAILER_LEN`] bytes of a file of `file_len` bytes.
    pub fn parse(b: &[u8], file_len: u64) -> Result<Self, FormatError> {
        let min = (HEADER_LEN + FOOTER_FIXED_LEN + 8 + TRAILER_LEN) as u64;
        if file_len < min || b.len() < TRAILER_LEN {
            return Err(FormatError::truncated("block file", min, file_len));
        }
        if b[24..32] != FILE_MAGIC {
            return Err(FormatError::corrupt(
                "block file trailer",
                "no end marker; the file is truncated or was not finished",
            ));
        }
        check_crc(|| "block file trailer".into(), u32_at(b, 20), &b[..20])?;
        let t = Trailer {
            footer_offset: u64_at(b, 0),
            footer_len: u64_at(b, 8),
            footer_crc: u32_at(b, 16),
        };
        let end = t.footer_offset.checked_add(t.footer_len);
        if t.footer_offset < HEADER_LEN as u64 || end != Some(file_len - TRAILER_LEN as u64) {
            return Err(FormatError::corrupt(
                "block file trailer",
                format!(
                    "footer at {}+{} does not end where the trailer starts ({})",
                    t.footer_offset,
                    t.footer_len,
                    file_len - TRAILER_LEN as u64
                ),
            ));
        }
        Ok(t)
    }
}

/// The footer: totals, the block table and the document index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Footer {
    pub token_count: u64,
    pub max_token: u32,
    /// [`TokenHasher`] of all tokens.
    pub tokens_checksum: u64,
    /// Byte offset of every block, then the footer offset (`blocks + 1` entries).
    pub block_offsets: Vec<u64>,
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
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&self.tokens_checksum.to_le_bytes());
        b.extend_from_slice(&(self.block_offsets.len() as u64 - 1).to_le_bytes());
        b.extend_from_slice(&(ix.sequences() as u64).to_le_bytes());
        b.extend_from_slice(&(ix.documents() as u64).to_le_bytes());
        for &o in &self.block_offsets {
            b.extend_from_slice(&o.to_le_bytes());
        }
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
            index,
        }
    }
}

const FOOTER: &str = "block file footer";

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
            .checked_add(FOOTER_FIXED_LEN as u64)
    }

    /// Bytes of footer the head takes.
    pub fn encoded_len(&self) -> usize {
        FOOTER_FIXED_LEN + 8 * self.block_offsets.len()
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
        if table_len.saturating_add(seqs).saturating_add(docs) > rest {
            return Err(FormatError::corrupt(
                FOOTER,
                format!(
                    "{blocks} blocks, {seqs} sequences and {docs} documents do not fit in {} bytes",
                    trailer.footer_len
                ),
            ));
        }
        let table_end = FOOTER_FIXED_LEN + table_len as usize;
        if b.len() < table_end {
            return Err(FormatError::truncated(
                FOOTER,
                table_end as u64,
                b.len() as u64,
            ));
        }
        let block_offsets: Vec<u64> = b[FOOTER_FIXED_LEN..table_end]
            .chunks_exact(8)
            .map(|c| u64_at(c, 0))
            .collect();
        check_block_table(&block_offsets, trailer.footer_offset)?;
        Ok(FooterHead {
            token_count,
            max_token,
            tokens_checksum,
            block_offsets,
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
enum IndexEntry {
    SeqOffset(u64),
    DocStart(u64),
}

/// XXH3 of a stream of little-endian u64s, fed to the hasher a chunk at a time (one call a
/// value would cost more than the hashing). Equal to `xxh3_64` of the values' bytes back to
/// back, as [`ContentChecksum`] hashes them.
#[derive(Default)]
struct ChunkedHash {
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
fn check_block_table(block_offsets: &[u64], footer_offset: u64) -> Result<(), FormatError> {
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

/// A parsed block file's metadata: its layout and its document index.
///
/// It dereferences to its [`BlockLayout`], so reads look the same with or without the index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockFile {
    pub layout: BlockLayout,
    pub index: DocIndex,
}

impl std::ops::Deref for BlockFile {
    type Target = BlockLayout;

    fn deref(&self) -> &BlockLayout {
        &self.layout
    }
}

impl BlockFile {
    /// Parses a file's metadata from its first [`HEADER_LEN`] bytes, its last [`TRAILER_LEN`]
    /// bytes, and the footer bytes the trailer points at (see [`Trailer::parse`]).
    pub fn parse(header: &[u8], trailer: &Trailer, footer: &[u8]) -> Result<Self, FormatError> {
        let header = FileHeader::parse(header)?;
        check_crc(|| FOOTER.into(), trailer.footer_crc, footer)?;
        let head = FooterHead::parse(footer, &header, trailer)?;
        let index = head.parse_index(&footer[head.encoded_len()..])?;
        Ok(BlockFile {
            layout: BlockLayout {
                header,
                footer: head,
            },
            index,
        })
    }

    /// Parses the metadata of a whole file held in memory (tests, fuzzing, small files).
    pub fn from_bytes(file: &[u8]) -> Result<Self, FormatError> {
        let head = &file[..HEADER_LEN.min(file.len())];
        FileHeader::parse(head)?;
        let trailer = Trailer::parse(
            &file[file.len().saturating_sub(TRAILER_LEN)..],
            file.len() as u64,
        )?;
        let start = trailer.footer_offset as usize;
        let footer = &file[start..start + trailer.footer_len as usize];
        BlockFile::parse(head, &trailer, footer)
    }

    /// The stored content checksum (as [`ContentChecksum`] would compute it from the data).
    pub fn content_checksum(&self) -> ContentChecksum {
        ContentChecksum::from_parts(self.footer.tokens_checksum, &self.index)
    }

    /// The whole footer, as the writer wrote it.
    pub fn to_footer(&self) -> Footer {
        Footer::from_parts(self.footer.clone(), self.index.clone())
    }
}

/// What finding and decoding any token range of a block file needs: its header and its
/// footer's totals and block table, without the document index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockLayout {
    pub header: FileHeader,
    pub footer: FooterHead,
}

impl BlockLayout {
    /// Parses the layout from the file's first [`HEADER_LEN`] bytes, the trailer, and the
    /// footer's first bytes (at least [`FooterHead::len_from_fixed`]). The footer's checksum
    /// is left to whoever reads its index.
    pub fn parse(
        header: &[u8],
        trailer: &Trailer,
        footer_head: &[u8],
    ) -> Result<Self, FormatError> {
        let header = FileHeader::parse(header)?;
        let footer = FooterHead::parse(footer_head, &header, trailer)?;
        Ok(BlockLayout { header, footer })
    }

    /// Decodes every token of a whole file held in memory.
    pub fn decode_all(&self, file: &[u8]) -> Result<Vec<u32>, FormatError> {
        let mut dec = Decoder::new();
        let mut out = vec![0; self.tokens() as usize];
        for i in 0..self.blocks() {
            // A file shorter than the block table says gives a short slice, and
            // `decode_block` a truncation error naming the block.
            let b = self.byte_range(i..i + 1);
            let len = file.len() as u64;
            let bytes = &file[b.start.min(len) as usize..b.end.min(len) as usize];
            let t = self.block_tokens(i);
            self.decode_block(
                i,
                bytes,
                &mut dec,
                &mut out[t.start as usize..t.end as usize],
            )?;
        }
        Ok(out)
    }

    pub fn blocks(&self) -> usize {
        self.footer.block_offsets.len() - 1
    }

    pub fn tokens(&self) -> u64 {
        self.footer.token_count
    }

    /// Token range held by block `i`.
    pub fn block_tokens(&self, i: usize) -> Range<u64> {
        let bt = self.header.block_tokens as u64;
        let start = i as u64 * bt;
        start..(start + bt).min(self.footer.token_count)
    }

    /// Blocks that hold any token of `tokens` (clamped to the file).
    pub fn blocks_covering(&self, tokens: Range<u64>) -> Range<usize> {
        let end = tokens.end.min(self.tokens());
        if tokens.start >= end {
            return 0..0;
        }
        let bt = self.header.block_tokens as u64;
        (tokens.start / bt) as usize..end.div_ceil(bt) as usize
    }

    /// File byte range of a run of blocks: one contiguous read.
    pub fn byte_range(&self, blocks: Range<usize>) -> Range<u64> {
        self.footer.block_offsets[blocks.start]..self.footer.block_offsets[blocks.end]
    }

    /// Decodes block `i` from exactly its bytes (header and payload) into `out`, which must
    /// hold `block_tokens(i)` tokens. Every field is checked against the block table.
    pub fn decode_block(
        &self,
        i: usize,
        bytes: &[u8],
        dec: &mut Decoder,
        out: &mut [u32],
    ) -> Result<(), FormatError> {
        let range = self.byte_range(i..i + 1);
        let what = format!("block {i} (file bytes {}..{})", range.start, range.end);
        if bytes.len() as u64 != range.end - range.start {
            return Err(FormatError::truncated(
                what,
                range.end - range.start,
                bytes.len() as u64,
            ));
        }
        let h = BlockHeader::parse(bytes, &what)?;
        let want = self.block_tokens(i);
        if h.first_token != want.start || h.tokens as u64 != want.end - want.start {
            return Err(FormatError::corrupt(
                what,
                format!(
                    "holds tokens {}..{} but the block table says {}..{}",
                    h.first_token,
                    h.first_token.saturating_add(h.tokens as u64),
                    want.start,
                    want.end
                ),
            ));
        }
        if h.payload_len as usize != bytes.len() - BLOCK_HEADER_LEN {
            return Err(FormatError::corrupt(
                what,
                format!(
                    "payload of {} bytes in a {}-byte block",
                    h.payload_len,
                    bytes.len()
                ),
            ));
        }
        let payload = &bytes[BLOCK_HEADER_LEN..];
        check_crc(|| format!("{what} payload"), h.payload_crc, payload)?;
        assert_eq!(
            out.len() as u64,
            want.end - want.start,
            "decode_block: wrong output length"
        );
        dec.decode(h.codec, payload, out)
            .map_err(|e| FormatError::corrupt(what, e.at_base(want.start).to_string()))
    }
}

/// Summary of a finished block file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteSummary {
    pub tokens: u64,
    pub blocks: u64,
    pub bytes: u64,
    pub max_token: u32,
    pub content: ContentChecksum,
}

/// Streams tokens into a block file's bytes. Sans-I/O: every call appends the bytes to write
/// next to `out`; the caller writes them wherever the file goes.
pub struct BlockFileWriter {
    header: FileHeader,
    encoder: Encoder,
    pending: Vec<u32>,
    offsets: Vec<u64>,
    pos: u64,
    tokens: u64,
    hasher: TokenHasher,
    max_token: u32,
    payload: Vec<u8>,
    verify: Option<(Decoder, Vec<u32>)>,
}

impl BlockFileWriter {
    /// Starts a file; the returned header bytes go first. With `verify`, every block is decoded
    /// again right after encoding and compared with its input.
    pub fn new(header: FileHeader, verify: bool) -> Result<(Self, [u8; HEADER_LEN]), FormatError> {
        check_block_tokens(header.codec, header.block_tokens, "block file settings")?;
        let w = BlockFileWriter {
            header,
            encoder: Encoder::new(header.codec)?,
            pending: Vec::new(),
            offsets: Vec::new(),
            pos: HEADER_LEN as u64,
            tokens: 0,
            hasher: TokenHasher::new(),
            max_token: 0,
            payload: Vec::new(),
            verify: verify.then(|| (Decoder::new(), Vec::new())),
        };
        Ok((w, header.encode()))
    }

    /// Tokens accepted so far.
    pub fn tokens(&self) -> u64 {
        self.tokens + self.pending.len() as u64
    }

    /// Bytes produced so far (header included).
    pub fn bytes(&self) -> u64 {
        self.pos
    }

    /// Appends tokens; every completed block's bytes are appended to `out`. A token that does
    /// not fit the codec fails with its absolute offset, and nothing of its block is emitted.
    pub fn push(&mut self, mut tokens: &[u32], out: &mut Vec<u8>) -> Result<(), FormatError> {
        let bt = self.header.block_tokens as usize;
        if !self.pending.is_empty() {
            let take = (bt - self.pending.len()).min(tokens.len());
            self.pending.extend_from_slice(&tokens[..take]);
            tokens = &tokens[take..];
            if self.pending.len() == bt {
                let block = std::mem::take(&mut self.pending);
                let r = self.emit(&block, out);
                self.pending = block;
                self.pending.clear();
                r?;
            }
        }
        while tokens.len() >= bt {
            self.emit(&tokens[..bt], out)?;
            tokens = &tokens[bt..];
        }
        self.pending.extend_from_slice(tokens);
        Ok(())
    }

    fn emit(&mut self, tokens: &[u32], out: &mut Vec<u8>) -> Result<(), FormatError> {
        let first = self.tokens;
        self.payload.clear();
        self.encoder
            .encode(tokens, &mut self.payload)
            .map_err(|e| e.at_base(first))?;
        let mut codec = self.header.codec;
        let plain = Codec::plain(codec.width);
        if codec.compression != Compression::None
            && self.payload.len() >= plain.raw_len(tokens.len())
        {
            // Compression would not shrink this block: store it at the plain width.
            codec = plain;
            self.payload.resize(plain.raw_len(tokens.len()), 0);
            encode_width(plain.width, tokens, &mut self.payload).map_err(|e| e.at_base(first))?;
        }
        if let Some((dec, buf)) = &mut self.verify {
            buf.resize(tokens.len(), 0);
            dec.decode(codec, &self.payload, buf)?;
            if buf != tokens {
                return Err(FormatError::corrupt(
                    format!("block at token {first}"),
                    format!("{codec} did not decode to its input (verification after encoding)"),
                ));
            }
        }
        let payload_len = u32::try_from(self.payload.len()).map_err(|_| {
            FormatError::corrupt(
                "block",
                format!("payload of {} bytes exceeds 4 GiB", self.payload.len()),
            )
        })?;
        let h = BlockHeader {
            codec,
            tokens: tokens.len() as u32,
            payload_len,
            first_token: first,
            payload_crc: crc(&self.payload),
        };
        out.extend_from_slice(&h.encode());
        out.extend_from_slice(&self.payload);
        self.offsets.push(self.pos);
        self.pos += (BLOCK_HEADER_LEN + self.payload.len()) as u64;
        self.tokens += tokens.len() as u64;
        self.hasher.update(tokens);
        self.max_token = self.max_token.max(dquant_codec::kernels::max_token(tokens));
        Ok(())
    }

    /// Emits the last partial block, the footer and the trailer. `index` must describe exactly
    /// the tokens pushed.
    pub fn finish(
        mut self,
        index: &DocIndex,
        out: &mut Vec<u8>,
    ) -> Result<WriteSummary, FormatError> {
        if !self.pending.is_empty() {
            let block = std::mem::take(&mut self.pending);
            self.emit(&block, out)?;
        }
        if index.tokens() != self.tokens {
            return Err(FormatError::Index(format!(
                "the index describes {} tokens but {} were written",
                index.tokens(),
                self.tokens
            )));
        }
        let mut block_offsets = std::mem::take(&mut self.offsets);
        block_offsets.push(self.pos);
        let footer = Footer {
            token_count: self.tokens,
            max_token: self.max_token,
            tokens_checksum: self.hasher.finish(),
            block_offsets,
            index: index.clone(),
        };
        let fb = footer.encode();
        let trailer = Trailer {
            footer_offset: self.pos,
            footer_len: fb.len() as u64,
            footer_crc: crc(&fb),
        };
        out.extend_from_slice(&fb);
        out.extend_from_slice(&trailer.encode());
        let bytes = self.pos + fb.len() as u64 + TRAILER_LEN as u64;
        Ok(WriteSummary {
            tokens: self.tokens,
            blocks: (footer.block_offsets.len() - 1) as u64,
            bytes,
            max_token: self.max_token,
            content: ContentChecksum::new(&self.hasher, index),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_may_not_ask_for_giant_blocks() {
        let h = FileHeader {
            codec: "u32+zstd:3".parse().unwrap(),
            block_tokens: u32::MAX / 256 * 256,
            vocab_size: 0,
        };
        let e = FileHeader::parse(&h.encode()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "corrupt block file header: blocks of 4294967040 tokens at u32+zstd:3 hold 17179868160 bytes, over the 1073741824-byte limit"
        );
        assert!(BlockFileWriter::new(h, false).is_err());
        let ok = FileHeader {
            block_tokens: (MAX_BLOCK_BYTES / 4) as u32,
            ..h
        };
        assert_eq!(FileHeader::parse(&ok.encode()).unwrap(), ok);
    }
}
