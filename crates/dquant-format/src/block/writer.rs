//! Writing a block file: tokens streamed into blocks with bounded memory, the footer and
//! trailer written after them (the writer never seeks back).

use std::sync::Arc;

use dquant_codec::{encode_width, Codec, Compression, Decoder, Encoder, RankTable, TokenHasher};

use super::*;
use crate::content::ContentChecksum;
use crate::error::FormatError;
use crate::index::DocIndex;

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
    /// The rank table of a `rank+zstd` file.
    ranks: Option<Arc<RankTable>>,
}

impl BlockFileWriter {
    /// Starts a file; the returned header bytes go first. With `verify`, every block is decoded
    /// again right after encoding and compared with its input.
    pub fn new(header: FileHeader, verify: bool) -> Result<(Self, [u8; HEADER_LEN]), FormatError> {
        Self::start(header, None, verify)
    }

    /// [`BlockFileWriter::new`] for a `rank+zstd` file: its blocks hold ranks in `ranks`,
    /// which must rank every token pushed, and the footer keeps the table.
    pub fn new_ranked(
        header: FileHeader,
        ranks: Arc<RankTable>,
        verify: bool,
    ) -> Result<(Self, [u8; HEADER_LEN]), FormatError> {
        Self::start(header, Some(ranks), verify)
    }

    fn start(
        header: FileHeader,
        ranks: Option<Arc<RankTable>>,
        verify: bool,
    ) -> Result<(Self, [u8; HEADER_LEN]), FormatError> {
        check_block_tokens(header.codec, header.block_tokens, "block file settings")?;
        let encoder = match (&ranks, header.codec.compression.needs_rank_table()) {
            (Some(t), true) => Encoder::with_ranks(header.codec, t)?,
            (None, false) => Encoder::new(header.codec)?,
            (Some(_), false) => {
                return Err(FormatError::corrupt(
                    "block file settings",
                    format!("a rank table for a {} file", header.codec),
                ))
            }
            (None, true) => Encoder::new(header.codec)?,
        };
        let w = BlockFileWriter {
            header,
            encoder,
            pending: Vec::new(),
            offsets: Vec::new(),
            pos: HEADER_LEN as u64,
            tokens: 0,
            hasher: TokenHasher::new(),
            max_token: 0,
            payload: Vec::new(),
            verify: verify.then(|| (Decoder::new(), Vec::new())),
            ranks,
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
            dec.decode_with(codec, &self.payload, self.ranks.as_deref(), buf)?;
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
            ranks: self.ranks.clone(),
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
