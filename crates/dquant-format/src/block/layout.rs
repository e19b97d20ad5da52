//! Reading a block file: the whole file in memory (`BlockFile`), or its layout alone
//! (`BlockLayout`: header, block table, footer head) for readers that fetch blocks by range.

use std::ops::Range;

use dquant_codec::Decoder;

use super::footer::FOOTER;
use super::*;
use crate::content::ContentChecksum;
use crate::error::FormatError;
use crate::index::DocIndex;

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
        dec.decode_with(h.codec, payload, self.footer.ranks.as_deref(), out)
            .map_err(|e| FormatError::corrupt(what, e.at_base(want.start).to_string()))
    }
}
