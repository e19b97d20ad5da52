//! Chunk sums: a crc32c for every fixed-size chunk of a file that carries no checksums of its
//! own (a Megatron `.bin`), kept beside it in a small sidecar (`PREFIX.dqsum`).
//!
//! Why: a block file checks every block it decodes, but a Megatron `.bin` is bare token
//! bytes, so a bit flipped on one replica's disk would be served as a wrong token. With the
//! sidecar, the storage layer checks the chunks a read touches and fails the read instead, and
//! a replicated source moves that read to another replica. The sidecar's [`digest`] stands
//! for the file's content when replicas are compared at open.
//!
//! Layout (little-endian), [`HEADER_LEN`] bytes, the table, then a trailer:
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `DQSUMS\0\x01` (the last byte is the version) |
//! | 4 | chunk size in bytes, a power of two in [`MIN_CHUNK`]..=[`MAX_CHUNK`] |
//! | 4 | zero |
//! | 8 | length of the file it covers |
//! | 4 × n | crc32c of each chunk, n = ⌈length / chunk⌉ (the last chunk may be short) |
//! | 4 | crc32c of everything before it |
//!
//! [`digest`]: ChunkSums::digest

use std::ops::Range;

use crate::FormatError;

/// The sidecar's magic; its last byte is the version.
pub const MAGIC: [u8; 8] = *b"DQSUMS\0\x01";
/// Bytes before the table.
pub const HEADER_LEN: usize = 24;
/// The default chunk: 64 KiB, a 16,384th of the file in the sidecar (64 MiB per TiB).
pub const DEFAULT_CHUNK: u32 = 64 << 10;
/// The smallest chunk a sidecar may use.
pub const MIN_CHUNK: u32 = 4 << 10;
/// The largest chunk a sidecar may use.
pub const MAX_CHUNK: u32 = 64 << 20;

const WHAT: &str = "chunk sums file";

/// The crc32c of every chunk of one file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkSums {
    chunk: u32,
    data_len: u64,
    crcs: Vec<u32>,
    /// The sidecar's trailer: the crc32c of its header and table, found once (parsed, or
    /// summed when built), since it is also the [`digest`](ChunkSums::digest) a `Stat` sends.
    trailer: u32,
}

impl ChunkSums {
    /// The sums of `data` in chunks of `chunk` bytes (a power of two in
    /// [`MIN_CHUNK`]..=[`MAX_CHUNK`]).
    pub fn of(data: &[u8], chunk: u32) -> Result<Self, FormatError> {
        let mut b = ChunkSumsBuilder::new(chunk)?;
        b.update(data);
        Ok(b.finish())
    }

    /// Parses a whole sidecar. Every size is checked against the bytes given before anything
    /// is allocated, and the trailer's crc against the rest.
    pub fn parse(bytes: &[u8]) -> Result<Self, FormatError> {
        let min = HEADER_LEN + 4;
        if bytes.len() < min {
            return Err(FormatError::truncated(WHAT, min as u64, bytes.len() as u64));
        }
        if bytes[..8] != MAGIC {
            return Err(bad_magic(&bytes[..8]));
        }
        let u32_at =
            |o: usize| u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
        let chunk = u32_at(8);
        check_chunk(chunk)?;
        // Refused, not ignored: a sidecar that parses re-encodes to its own bytes (found by
        // the `chunk_sums` fuzz target).
        if u32_at(12) != 0 {
            return Err(corrupt(format!(
                "bytes 12..16 are {:#010x}, not zero",
                u32_at(12)
            )));
        }
        let data_len = u64::from(u32_at(16)) | (u64::from(u32_at(20)) << 32);
        let count = data_len.div_ceil(u64::from(chunk));
        let want = count
            .checked_mul(4)
            .and_then(|t| t.checked_add(min as u64))
            .ok_or_else(|| corrupt(format!("{data_len} bytes in chunks of {chunk} overflow")))?;
        if want != bytes.len() as u64 {
            return Err(corrupt(format!(
                "it covers {data_len} bytes in chunks of {chunk}, which takes {want} bytes, but \
                 it has {}",
                bytes.len()
            )));
        }
        let body = bytes.len() - 4;
        let stored = u32_at(body);
        let computed = crc32c::crc32c(&bytes[..body]);
        if stored != computed {
            return Err(FormatError::Checksum {
                what: WHAT.into(),
                stored,
                computed,
            });
        }
        let crcs = bytes[HEADER_LEN..body]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(ChunkSums {
            chunk,
            data_len,
            crcs,
            trailer: stored,
        })
    }

    /// The sidecar's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + 4 * self.crcs.len() + 4);
        out.extend_from_slice(&header(self.chunk, self.data_len));
        for c in &self.crcs {
            out.extend_from_slice(&c.to_le_bytes());
        }
        out.extend_from_slice(&self.trailer.to_le_bytes());
        out
    }

    /// Bytes per chunk.
    pub fn chunk(&self) -> u32 {
        self.chunk
    }

    /// The length of the file the sums cover.
    pub fn data_len(&self) -> u64 {
        self.data_len
    }

    /// How many chunks the file has.
    pub fn chunks(&self) -> u64 {
        self.crcs.len() as u64
    }

    /// The byte range of chunk `i` in the file.
    pub fn chunk_bytes(&self, i: u64) -> Range<u64> {
        let c = u64::from(self.chunk);
        i * c..((i + 1) * c).min(self.data_len)
    }

    /// The chunks that hold any of `bytes`.
    pub fn chunks_covering(&self, bytes: Range<u64>) -> Range<u64> {
        let c = u64::from(self.chunk);
        if bytes.start >= bytes.end {
            return 0..0;
        }
        bytes.start / c..bytes.end.div_ceil(c).min(self.chunks())
    }

    /// Chunk `i`'s recorded crc32c.
    ///
    /// # Panics
    /// If `i` is not below [`chunks`](ChunkSums::chunks).
    pub fn crc(&self, i: u64) -> u32 {
        self.crcs[i as usize]
    }

    /// Checks chunk `i` against `computed`, its bytes' crc32c (panics as [`crc`](Self::crc)).
    pub fn check(&self, i: u64, computed: u32) -> Result<(), FormatError> {
        let stored = self.crc(i);
        if stored == computed {
            return Ok(());
        }
        let r = self.chunk_bytes(i);
        Err(FormatError::Checksum {
            what: format!("chunk {i} (bytes {}..{})", r.start, r.end),
            stored,
            computed,
        })
    }

    /// Stands for the whole file's content: the sidecar's own trailer crc (over the chunk
    /// size, the length and every chunk's crc), as `crc32c/64KiB:0123abcd`.
    pub fn digest(&self) -> String {
        format!("crc32c/{}KiB:{:08x}", self.chunk >> 10, self.trailer)
    }
}

/// Sums a file's bytes as they stream past, in pieces of any size.
pub struct ChunkSumsBuilder {
    chunk: u32,
    data_len: u64,
    /// The crc of the chunk in progress and how many of its bytes it has seen.
    open: (u32, u32),
    crcs: Vec<u32>,
}

impl ChunkSumsBuilder {
    /// A builder for chunks of `chunk` bytes.
    pub fn new(chunk: u32) -> Result<Self, FormatError> {
        check_chunk(chunk)?;
        Ok(ChunkSumsBuilder {
            chunk,
            data_len: 0,
            open: (0, 0),
            crcs: Vec::new(),
        })
    }

    /// The next bytes of the file.
    pub fn update(&mut self, mut bytes: &[u8]) {
        self.data_len += bytes.len() as u64;
        while !bytes.is_empty() {
            let (crc, seen) = self.open;
            let take = bytes.len().min((self.chunk - seen) as usize);
            let crc = crc32c::crc32c_append(crc, &bytes[..take]);
            let seen = seen + take as u32;
            bytes = &bytes[take..];
            if seen == self.chunk {
                self.crcs.push(crc);
                self.open = (0, 0);
            } else {
                self.open = (crc, seen);
            }
        }
    }

    /// The sums of every byte given.
    pub fn finish(mut self) -> ChunkSums {
        if self.open.1 > 0 {
            self.crcs.push(self.open.0);
        }
        let head = crc32c::crc32c(&header(self.chunk, self.data_len));
        let trailer = self
            .crcs
            .iter()
            .fold(head, |crc, c| crc32c::crc32c_append(crc, &c.to_le_bytes()));
        ChunkSums {
            chunk: self.chunk,
            data_len: self.data_len,
            crcs: self.crcs,
            trailer,
        }
    }
}

/// The sidecar's first [`HEADER_LEN`] bytes.
fn header(chunk: u32, data_len: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&chunk.to_le_bytes());
    h[16..24].copy_from_slice(&data_len.to_le_bytes());
    h
}

fn check_chunk(chunk: u32) -> Result<(), FormatError> {
    if chunk.is_power_of_two() && (MIN_CHUNK..=MAX_CHUNK).contains(&chunk) {
        return Ok(());
    }
    Err(corrupt(format!(
        "chunk size {chunk} is not a power of two from {MIN_CHUNK} to {MAX_CHUNK}"
    )))
}

fn corrupt(detail: String) -> FormatError {
    FormatError::corrupt(WHAT, detail)
}

fn bad_magic(found: &[u8]) -> FormatError {
    FormatError::BadMagic {
        what: WHAT,
        found: String::from_utf8_lossy(found).escape_debug().to_string(),
        expected: String::from_utf8_lossy(&MAGIC).escape_debug().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[test]
    fn round_trips_and_pieces_do_not_matter() {
        for n in [0, 1, 4095, 4096, 4097, 3 * 4096 + 17] {
            let d = data(n);
            let whole = ChunkSums::of(&d, MIN_CHUNK).unwrap();
            let mut b = ChunkSumsBuilder::new(MIN_CHUNK).unwrap();
            for piece in d.chunks(1000) {
                b.update(piece);
            }
            assert_eq!(b.finish(), whole, "{n} bytes");
            assert_eq!(whole.chunks(), (n as u64).div_ceil(4096));
            assert_eq!(ChunkSums::parse(&whole.encode()).unwrap(), whole);
            for i in 0..whole.chunks() {
                let r = whole.chunk_bytes(i);
                let crc = crc32c::crc32c(&d[r.start as usize..r.end as usize]);
                whole.check(i, crc).unwrap();
            }
        }
    }

    #[test]
    fn a_wrong_chunk_is_named_with_its_bytes() {
        let s = ChunkSums::of(&data(10_000), MIN_CHUNK).unwrap();
        let e = s.check(2, s.crc(2) ^ 1).unwrap_err().to_string();
        let (stored, computed) = (s.crc(2), s.crc(2) ^ 1);
        assert_eq!(
            e,
            format!(
                "checksum mismatch in chunk 2 (bytes 8192..10000): stored {stored:#010x}, \
                 computed {computed:#010x}"
            )
        );
        assert_eq!(s.chunks_covering(4095..4097), 0..2);
        assert_eq!(s.chunks_covering(9000..10_000), 2..3);
        assert_eq!(s.chunks_covering(5..5), 0..0);
    }

    #[test]
    fn bad_sidecars_are_refused_before_anything_is_allocated() {
        let good = ChunkSums::of(&data(9000), MIN_CHUNK).unwrap().encode();
        let msg = |b: &[u8]| ChunkSums::parse(b).unwrap_err().to_string();
        assert_eq!(
            msg(&good[..10]),
            "truncated chunk sums file: needs 28 bytes but has 10"
        );
        let mut magic = good.clone();
        magic[0] = b'X';
        assert!(
            msg(&magic).starts_with("not a chunk sums file: bad magic"),
            "{}",
            msg(&magic)
        );
        // A length that claims 2^60 chunks: refused by arithmetic, not by an allocation.
        let mut huge = good.clone();
        huge[16..24].copy_from_slice(&(1u64 << 62).to_le_bytes());
        assert_eq!(
            msg(&huge),
            format!(
                "corrupt chunk sums file: it covers {} bytes in chunks of 4096, which takes {} \
                 bytes, but it has 40",
                1u64 << 62,
                (1u64 << 62) / 4096 * 4 + 28
            )
        );
        let mut zero = good.clone();
        zero[15] = 39;
        assert_eq!(
            msg(&zero),
            "corrupt chunk sums file: bytes 12..16 are 0x27000000, not zero"
        );
        let mut chunk = good.clone();
        chunk[8..12].copy_from_slice(&1000u32.to_le_bytes());
        assert_eq!(
            msg(&chunk),
            "corrupt chunk sums file: chunk size 1000 is not a power of two from 4096 to 67108864"
        );
        let mut flipped = good.clone();
        flipped[HEADER_LEN] ^= 1;
        assert!(
            msg(&flipped).starts_with("checksum mismatch in chunk sums file: stored"),
            "{}",
            msg(&flipped)
        );
    }

    #[test]
    fn the_digest_changes_with_any_chunk() {
        let d = data(20_000);
        let a = ChunkSums::of(&d, MIN_CHUNK).unwrap();
        let mut e = d.clone();
        e[12_345] ^= 0x40;
        let b = ChunkSums::of(&e, MIN_CHUNK).unwrap();
        assert_ne!(a.digest(), b.digest());
        assert!(a.digest().starts_with("crc32c/4KiB:"), "{}", a.digest());
        assert_eq!(a.digest(), ChunkSums::of(&d, MIN_CHUNK).unwrap().digest());
    }
}
