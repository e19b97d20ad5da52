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
//! header  = "DQBLOCKS" version:u16 header_len:u16=64 codec:[u8;4] block_tokens:u32
//!           vocab_size:u32 reserved:[u8;36]=0 crc32c(bytes 0..60):u32
//! block   = "DQBK" codec:[u8;4] tokens:u32 payload_len:u32 first_token:u64
//!           payload_crc32c:u32 crc32c(bytes 0..28):u32 payload[payload_len]
//! footer  = token_count:u64 max_token:u32 rank_table_len:u32 tokens_xxh3:u64 block_count:u64
//!           sequence_count:u64 document_count:u64 block_offset:u64 * (block_count + 1)
//!           rank_table[rank_table_len] sequence_length:varint * sequence_count
//!           sequences_per_document:varint * document_count
//! trailer = footer_offset:u64 footer_len:u64 footer_crc32c:u32 crc32c(bytes 0..20):u32
//!           "DQBLOCKS"
//! codec   = width_kind:u8 width_bits:u8 compression_kind:u8 compression_level:i8
//! rank_table = id_count:u32 zigzag_delta_id:leb128 * id_count crc32c:u32
//! ```
//!
//! Version 1 is every codec but `rank+zstd`, with `rank_table_len = 0`. Version 2 is a
//! `rank+zstd` file ([`dquant_codec::RankTable`]): its blocks hold frequency ranks, and the
//! footer's head holds the table that turns them back into ids, read with the block table at
//! open.
//!
//! Each block names its own codec: a block that compression would grow is stored at its plain
//! width, and the header's codec is the one the writer asked for.

use dquant_codec::{Codec, Width};

use crate::error::FormatError;

mod footer;
mod layout;
mod writer;

pub use footer::{Footer, FooterHead};
pub use layout::{BlockFile, BlockLayout};
pub use writer::{BlockFileWriter, WriteSummary};

pub const FILE_MAGIC: [u8; 8] = *b"DQBLOCKS";
pub const BLOCK_MAGIC: [u8; 4] = *b"DQBK";
/// The version of a file in any codec but `rank+zstd`.
pub const VERSION: u16 = 1;
/// The version of a `rank+zstd` file, whose footer holds its rank table: a build that reads
/// only version 1 says so, instead of failing on the first block.
pub const VERSION_RANKED: u16 = 2;

/// The version a file in `codec` is written as.
fn version_for(codec: Codec) -> u16 {
    if codec.compression.needs_rank_table() {
        VERSION_RANKED
    } else {
        VERSION
    }
}
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

/// Checks a block size in tokens (a positive multiple of 256 whose payload at `codec`'s width
/// is at most [`MAX_BLOCK_BYTES`]) and that `codec` can be stored; `error` makes the error: a
/// corrupt header when a file is read, invalid settings when one is written.
fn check_block_tokens(
    codec: Codec,
    block_tokens: u32,
    what: &str,
    error: fn(&str, String) -> FormatError,
) -> Result<(), FormatError> {
    // A stream's payloads decode only in order; a block file's are read one by one.
    if codec.compression.is_stream() {
        return Err(error(
            what,
            format!("{codec} is a wire codec (its batches share one zstd stream); store zstd:LEVEL or rank+zstd:LEVEL"),
        ));
    }
    if block_tokens == 0 || !block_tokens.is_multiple_of(256) {
        return Err(error(
            what,
            format!("block size {block_tokens} tokens is not a positive multiple of 256"),
        ));
    }
    // What a reader allocates to decode one block.
    let bytes = codec.max_raw_len(block_tokens as usize);
    if bytes > MAX_BLOCK_BYTES {
        return Err(error(
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
        b[8..10].copy_from_slice(&version_for(self.codec).to_le_bytes());
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
        if version != VERSION && version != VERSION_RANKED {
            return Err(FormatError::UnsupportedVersion {
                what: "dquant block file",
                version: version as u64,
                supported: "versions 1 and 2",
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
        if version != version_for(codec) {
            return Err(FormatError::corrupt(
                "block file header",
                format!("version {version} with codec {codec} (version 2 is for rank+zstd files, 1 for the rest)"),
            ));
        }
        let block_tokens = u32_at(b, 16);
        check_block_tokens(codec, block_tokens, "block file header", |w, d| {
            FormatError::corrupt(w, d)
        })?;
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
