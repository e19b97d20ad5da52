//! The codec-independent identity of a dataset's content.

use dquant_codec::TokenHasher;
use xxhash_rust::xxh3::xxh3_64;

use crate::index::DocIndex;

/// Checksums of a dataset's logical content: its token ids and its boundaries.
///
/// Independent of format, dtype and codec: a Megatron int32 file, its uint16 twin and a
/// `bits:17+zstd` block file of the same data print the same values in `dquant inspect`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContentChecksum {
    /// XXH3-64 of the token ids as little-endian u32.
    pub tokens: u64,
    /// XXH3-64 of the sequence offsets followed by the document indices, as little-endian u64.
    pub index: u64,
}

impl ContentChecksum {
    pub fn new(tokens: &TokenHasher, index: &DocIndex) -> Self {
        Self::from_parts(tokens.finish(), index)
    }

    /// From an already computed token hash (e.g. stored in a block file's footer).
    pub fn from_parts(tokens: u64, index: &DocIndex) -> Self {
        let mut b = Vec::with_capacity((index.sequences() + index.documents() + 2) * 8);
        for v in index.seq_offsets().iter().chain(index.doc_seq()) {
            b.extend_from_slice(&v.to_le_bytes());
        }
        ContentChecksum {
            tokens,
            index: xxh3_64(&b),
        }
    }
}

impl std::fmt::Display for ContentChecksum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "xxh3:{:016x}-{:016x}", self.tokens, self.index)
    }
}
