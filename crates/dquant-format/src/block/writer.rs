//! Writing a block file: tokens streamed into blocks with bounded memory, the footer and
//! trailer written after them (the writer never seeks back).
//!
//! Blocks are independent, so the blocks one push completes may be encoded on several threads
//! ([`BlockFileWriter::set_threads`]): each thread has its own encoder (a `zstd -19` or
//! `lz4hc` parser writes 2-50 M tokens/s a core, the whole of a convert's time), and the
//! blocks are appended in order, so the file is byte for byte the one a single thread writes.

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
    /// One a thread that encodes blocks (at least one).
    lanes: Vec<Lane>,
    pending: Vec<u32>,
    offsets: Vec<u64>,
    pos: u64,
    tokens: u64,
    hasher: TokenHasher,
    max_token: u32,
    /// The rank table of a `rank+zstd` file.
    ranks: Option<Arc<RankTable>>,
}

/// What one thread needs to encode blocks: an encoder, the payload it encodes into, and
/// when verifying, a decoder and its output.
struct Lane {
    encoder: Encoder,
    payload: Vec<u8>,
    verify: Option<(Decoder, Vec<u32>)>,
}

impl Lane {
    fn new(codec: Codec, ranks: Option<&RankTable>, verify: bool) -> Result<Self, FormatError> {
        let encoder = match ranks {
            Some(t) if codec.compression.needs_rank_table() => Encoder::with_ranks(codec, t)?,
            _ => Encoder::new(codec)?,
        };
        Ok(Lane {
            encoder,
            payload: Vec::new(),
            verify: verify.then(|| (Decoder::new(), Vec::new())),
        })
    }

    /// Encodes block `tokens` (its first token is the file's `first`) into `payload`: in
    /// `codec`, or at its plain width when compression would not shrink it, then decoded
    /// again and compared when verifying. Returns the codec the block is in.
    fn encode(
        &mut self,
        codec: Codec,
        ranks: Option<&RankTable>,
        tokens: &[u32],
        first: u64,
    ) -> Result<Codec, FormatError> {
        self.payload.clear();
        self.encoder
            .encode(tokens, &mut self.payload)
            .map_err(|e| e.at_base(first))?;
        let mut codec = codec;
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
            dec.decode_with(codec, &self.payload, ranks, buf)?;
            if buf != tokens {
                return Err(FormatError::corrupt(
                    format!("block at token {first}"),
                    format!("{codec} did not decode to its input (verification after encoding)"),
                ));
            }
        }
        Ok(codec)
    }
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
        let what = "block file settings";
        check_block_tokens(header.codec, header.block_tokens, what, |w, d| {
            FormatError::invalid(w, d)
        })?;
        if ranks.is_some() && !header.codec.compression.needs_rank_table() {
            return Err(FormatError::invalid(
                what,
                format!("a rank table for a {} file", header.codec),
            ));
        }
        let lane = Lane::new(header.codec, ranks.as_deref(), verify)?;
        let w = BlockFileWriter {
            header,
            lanes: vec![lane],
            pending: Vec::new(),
            offsets: Vec::new(),
            pos: HEADER_LEN as u64,
            tokens: 0,
            hasher: TokenHasher::new(),
            max_token: 0,
            ranks,
        };
        Ok((w, header.encode()))
    }

    /// Encodes the blocks one push completes on up to `threads` threads (at least one). Each
    /// holds one encoder, and a push holds its blocks' payloads until they are appended: a
    /// caller that pushes `threads` blocks' worth at a time keeps every thread busy.
    pub fn set_threads(&mut self, threads: usize) -> Result<(), FormatError> {
        let verify = self.lanes[0].verify.is_some();
        let (codec, ranks) = (self.header.codec, self.ranks.as_deref());
        self.lanes.truncate(threads.max(1));
        while self.lanes.len() < threads {
            self.lanes.push(Lane::new(codec, ranks, verify)?);
        }
        Ok(())
    }

    /// Threads that encode blocks.
    pub fn threads(&self) -> usize {
        self.lanes.len()
    }

    /// Tokens a block holds (the last may hold fewer).
    pub fn block_tokens(&self) -> u64 {
        self.header.block_tokens as u64
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
        let whole = tokens.len() / bt * bt;
        self.emit_all(&tokens[..whole], out)?;
        self.pending.extend_from_slice(&tokens[whole..]);
        Ok(())
    }

    /// Emits `run`, whole blocks, encoded on every lane at once (a contiguous share each),
    /// appended in order. Blocks before a failing one are emitted, as one thread would.
    fn emit_all(&mut self, run: &[u32], out: &mut Vec<u8>) -> Result<(), FormatError> {
        let bt = self.header.block_tokens as usize;
        let blocks: Vec<&[u32]> = run.chunks(bt).collect();
        if self.lanes.len() == 1 || blocks.len() < 2 {
            return blocks.into_iter().try_for_each(|b| self.emit(b, out));
        }
        let per = blocks.len().div_ceil(self.lanes.len());
        let (codec, ranks, base) = (self.header.codec, self.ranks.as_deref(), self.tokens);
        let encoded: Vec<Result<(Codec, Vec<u8>), FormatError>> = std::thread::scope(|s| {
            let work = self.lanes.iter_mut().zip(blocks.chunks(per)).enumerate();
            let handles: Vec<_> = work
                .map(|(j, (lane, group))| {
                    s.spawn(move || {
                        let mut first = base + (j * per * bt) as u64;
                        let mut done = Vec::with_capacity(group.len());
                        for b in group {
                            let r = lane.encode(codec, ranks, b, first);
                            done.push(r.map(|c| (c, std::mem::take(&mut lane.payload))));
                            first += b.len() as u64;
                        }
                        done
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect()
        });
        for (b, r) in blocks.iter().zip(encoded) {
            let (c, payload) = r?;
            self.append(c, &payload, b, out)?;
        }
        Ok(())
    }

    /// Encodes block `tokens` on the first lane and appends it.
    fn emit(&mut self, tokens: &[u32], out: &mut Vec<u8>) -> Result<(), FormatError> {
        let (codec, ranks, first) = (self.header.codec, self.ranks.as_deref(), self.tokens);
        let c = self.lanes[0].encode(codec, ranks, tokens, first)?;
        let payload = std::mem::take(&mut self.lanes[0].payload);
        let r = self.append(c, &payload, tokens, out);
        self.lanes[0].payload = payload;
        r
    }

    /// Appends the next block, `tokens` encoded as `payload` in `codec`: its header and
    /// payload to `out`, and it to the file's offsets, checksum and largest token.
    fn append(
        &mut self,
        codec: Codec,
        payload: &[u8],
        tokens: &[u32],
        out: &mut Vec<u8>,
    ) -> Result<(), FormatError> {
        let payload_len = u32::try_from(payload.len()).map_err(|_| {
            FormatError::corrupt(
                "block",
                format!("payload of {} bytes exceeds 4 GiB", payload.len()),
            )
        })?;
        let h = BlockHeader {
            codec,
            tokens: tokens.len() as u32,
            payload_len,
            first_token: self.tokens,
            payload_crc: crc(payload),
        };
        out.extend_from_slice(&h.encode());
        out.extend_from_slice(payload);
        self.offsets.push(self.pos);
        self.pos += (BLOCK_HEADER_LEN + payload.len()) as u64;
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
