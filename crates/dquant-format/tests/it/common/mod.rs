//! Helpers shared by the integration tests: a deterministic PRNG, an independent CRC-32C,
//! token and index generators, and a one-call block file writer.
#![allow(dead_code)]

use std::sync::Arc;

use dquant_codec::{Codec, Compression, RankTable, TokenHasher, Width};
use dquant_format::block::{BlockFileWriter, FileHeader, WriteSummary, TRAILER_LEN};
use dquant_format::{ContentChecksum, DocIndex, DocIndexBuilder};

/// SplitMix64: small, deterministic, good enough to generate test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// CRC-32C (Castagnoli), bit by bit: an implementation independent of the one under test.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0x82F6_3B78
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// Every width: the plain ones and `bits:1..=32`.
pub fn all_widths() -> Vec<Width> {
    let mut w = Width::PLAIN.to_vec();
    w.extend((1..=32).map(Width::Bits));
    w
}

pub fn all_compressions() -> [Compression; 6] {
    [
        Compression::None,
        Compression::Zstd(1),
        Compression::Zstd(3),
        Compression::Lz4,
        Compression::Lz4Hc(9),
        Compression::Ranked(3),
    ]
}

/// Whether `codec` can hold every id of its width: `rank+zstd` takes ids below 2^24.
pub fn holds_its_width(codec: Codec) -> bool {
    !codec.compression.needs_rank_table()
        || (codec.width.max_token() as usize) < dquant_codec::MAX_RANKED_IDS
}

/// The rank table of `tokens` (as `dquant convert` builds it).
pub fn ranks_of(tokens: &[u32]) -> RankTable {
    let max = tokens.iter().copied().max().map_or(0, |m| m as usize + 1);
    let mut counts = vec![0u64; max];
    tokens.iter().for_each(|&t| counts[t as usize] += 1);
    RankTable::from_counts(&counts).expect("a table of the tokens")
}

/// `n` tokens that fit `width`: runs of a repeated token, small ids and uniform ids up to the
/// width's maximum, with 0 and the maximum itself included when `n >= 2`.
pub fn tokens_for(width: Width, n: usize, seed: u64) -> Vec<u32> {
    let max = width.max_token() as u64;
    let mut rng = Rng::new(seed ^ (max << 8) ^ n as u64);
    let mut v = Vec::with_capacity(n);
    while v.len() < n {
        let run = 1 + rng.below(40) as usize;
        let kind = rng.below(3);
        let t = rng.below(max + 1) as u32;
        for _ in 0..run.min(n - v.len()) {
            v.push(match kind {
                0 => t,
                1 => rng.below(max.min(300) + 1) as u32,
                _ => rng.below(max + 1) as u32,
            });
        }
    }
    if n >= 2 {
        v[n / 2] = max as u32;
        v[n / 3] = 0;
    }
    v
}

/// A random index over `tokens` tokens: documents of one or several sequences, with empty
/// documents and empty sequences sprinkled in.
pub fn random_index(rng: &mut Rng, tokens: u64) -> DocIndex {
    let mut b = DocIndexBuilder::new();
    let mut left = tokens;
    loop {
        match rng.below(8) {
            0 => b.end_document(), // an empty document (no sequences)
            1 => {
                b.push_sequence(0); // a document whose only sequence is empty
                b.end_document();
            }
            _ => {
                let seqs = 1 + rng.below(4);
                for _ in 0..seqs {
                    let len = if left == 0 {
                        0
                    } else {
                        rng.below(left.min(700) + 1)
                    };
                    b.push_sequence(len);
                    left -= len;
                }
                b.end_document();
            }
        }
        if left == 0 && rng.below(3) == 0 {
            break;
        }
    }
    let ix = b.finish();
    assert_eq!(ix.tokens(), tokens);
    ix
}

/// Writes a block file, pushing the tokens in chunks of the given sizes (cycled; the last
/// chunk takes what is left). Returns the file bytes and the summary.
pub fn write_chunked(
    codec: Codec,
    block_tokens: u32,
    tokens: &[u32],
    index: &DocIndex,
    chunks: &[usize],
    verify: bool,
) -> (Vec<u8>, WriteSummary) {
    let (mut w, mut file) = writer(codec, block_tokens, tokens, verify);
    let mut rest = tokens;
    let mut sizes = chunks.iter().cycle();
    while !rest.is_empty() {
        let n = sizes.next().map_or(rest.len(), |&n| n.min(rest.len()));
        w.push(&rest[..n], &mut file).expect("tokens fit the codec");
        rest = &rest[n..];
        assert_eq!(w.bytes(), file.len() as u64);
    }
    assert_eq!(w.tokens(), tokens.len() as u64);
    let summary = w.finish(index, &mut file).expect("finish");
    (file, summary)
}

/// A writer for `tokens` in `codec` (its rank table made from them when the codec needs
/// one) and the file's bytes so far (its header).
pub fn writer(
    codec: Codec,
    block_tokens: u32,
    tokens: &[u32],
    verify: bool,
) -> (BlockFileWriter, Vec<u8>) {
    let header = FileHeader {
        codec,
        block_tokens,
        vocab_size: 50257,
    };
    let (w, head) = if codec.compression.needs_rank_table() {
        BlockFileWriter::new_ranked(header, Arc::new(ranks_of(tokens)), verify)
    } else {
        BlockFileWriter::new(header, verify)
    }
    .expect("writer settings are valid");
    (w, head.to_vec())
}

/// Writes a block file with one push of every token.
pub fn write(codec: Codec, block_tokens: u32, tokens: &[u32], index: &DocIndex) -> Vec<u8> {
    write_chunked(codec, block_tokens, tokens, index, &[], false).0
}

/// The content checksum of tokens and index, computed from scratch.
pub fn content_of(tokens: &[u32], index: &DocIndex) -> ContentChecksum {
    let mut h = TokenHasher::new();
    h.update(tokens);
    ContentChecksum::new(&h, index)
}

pub fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

pub fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}

/// Footer offset and length, read from the trailer of a well-formed file.
pub fn footer_span(file: &[u8]) -> (usize, usize) {
    let t = file.len() - TRAILER_LEN;
    (u64_at(file, t) as usize, u64_at(file, t + 8) as usize)
}

/// Replaces the footer of a well-formed file with `footer`, rewriting the trailer (offset,
/// length, footer crc and its own crc) so that only the footer's content is wrong.
pub fn replace_footer(file: &[u8], footer: &[u8]) -> Vec<u8> {
    let (start, _) = footer_span(file);
    let mut out = file[..start].to_vec();
    out.extend_from_slice(footer);
    let mut t = [0u8; TRAILER_LEN];
    t[0..8].copy_from_slice(&(start as u64).to_le_bytes());
    t[8..16].copy_from_slice(&(footer.len() as u64).to_le_bytes());
    t[16..20].copy_from_slice(&crc32c(footer).to_le_bytes());
    let c = crc32c(&t[..20]);
    t[20..24].copy_from_slice(&c.to_le_bytes());
    t[24..32].copy_from_slice(b"DQBLOCKS");
    out.extend_from_slice(&t);
    out
}

/// Edits the footer of a well-formed file in place (`edit` gets the footer bytes) and fixes
/// the trailer's checksums.
pub fn edit_footer(file: &[u8], edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let (start, len) = footer_span(file);
    let mut footer = file[start..start + len].to_vec();
    edit(&mut footer);
    replace_footer(file, &footer)
}

/// Recomputes the crc of the 32-byte block header at `at`.
pub fn fix_block_header_crc(file: &mut [u8], at: usize) {
    let c = crc32c(&file[at..at + 28]);
    file[at + 28..at + 32].copy_from_slice(&c.to_le_bytes());
}

/// Recomputes the crc of the 64-byte file header.
pub fn fix_file_header_crc(file: &mut [u8]) {
    let c = crc32c(&file[..60]);
    file[60..64].copy_from_slice(&c.to_le_bytes());
}
