//! Frequency ranks: token ids renumbered by how often a dataset uses them, stored as
//! variable-length bytes, so that a general-purpose compressor sees short, repetitive codes.
//!
//! Why: a tokenizer numbers its ids by merge order, not by frequency in a given corpus, and a
//! fixed width spends 2–3 bytes on every token. Renumbered by frequency, the 128 most used ids
//! take one byte and the next 16,384 two, and the bytes zstd sees repeat with the text: on
//! English prose and on code this stores about 5% smaller than whole-file `zstd -19 --long`
//! over the int32 file, with random access kept by block (`bench/RESULTS.md`, codecs). The
//! table is per dataset (a block file keeps it once, in its footer), so it is measured, not
//! assumed. The ranks are stored in [`crate::bytecode`]'s variable-length code.
//!
//! No crate does this (a rank table stored with its own varint): the pieces are short, so
//! it is written here.

use crate::bytecode::{decode_codes, encode_codes};
use crate::error::CodecError;

/// The most ids a table may hold, and the bound on every id in it: ids below 2^24 (a dense
/// inverse of 64 MiB at most), far above any tokenizer's vocabulary.
pub const MAX_RANKED_IDS: usize = 1 << 24;

/// A dataset's ids in rank order (most used first), and the inverse for encoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankTable {
    /// `ids[rank]`.
    ids: Vec<u32>,
}

impl RankTable {
    /// The table of a dataset whose id `i` occurs `counts[i]` times (so `counts` is at most
    /// [`MAX_RANKED_IDS`] long to be accepted); ids that never occur
    /// get no rank. Ids are ordered by count in quarter-octave steps (the 2 bits after a
    /// count's leading one), and by id within a step: the code length depends only on the
    /// order of magnitude, and ids in ascending runs make the stored table small.
    pub fn from_counts(counts: &[u64]) -> Result<Self, CodecError> {
        let mut used: Vec<(u32, u32)> = counts
            .iter()
            .enumerate()
            .filter(|&(_, &c)| c > 0)
            .map(|(id, &c)| (quarter_octave(c), id as u32))
            .collect();
        used.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        Self::from_ids(used.into_iter().map(|(_, id)| id).collect())
    }

    /// The table whose rank `r` is `ids[r]`; every id must be distinct and below
    /// [`MAX_RANKED_IDS`].
    pub fn from_ids(ids: Vec<u32>) -> Result<Self, CodecError> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= MAX_RANKED_IDS) {
            return Err(table_error(format!(
                "id {id} is over the limit of {} (rank+zstd takes ids below 2^24)",
                MAX_RANKED_IDS - 1
            )));
        }
        let mut seen = ids.clone();
        seen.sort_unstable();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            return Err(table_error(format!("id {} has two ranks", w[0])));
        }
        Ok(RankTable { ids })
    }

    /// Ids in the table.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// `ids[rank]`: the ids, most used first.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// The table's stored form: the id count (u32 LE), then each id's zigzag difference from
    /// the one before (from 0) as a LEB128 varint.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.ids.len() as u32).to_le_bytes());
        let mut prev = 0i64;
        for &id in &self.ids {
            let d = id as i64 - prev;
            prev = id as i64;
            let mut z = ((d << 1) ^ (d >> 63)) as u64;
            while z >= 0x80 {
                out.push(z as u8 | 0x80);
                z >>= 7;
            }
            out.push(z as u8);
        }
    }

    /// Parses [`RankTable::encode`]'s bytes, exactly (no trailing bytes). Every id must be at
    /// most `max_token`, and the count is checked against the bytes before anything is
    /// allocated.
    pub fn parse(b: &[u8], max_token: u32) -> Result<Self, CodecError> {
        let count = b
            .get(..4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize)
            .ok_or_else(|| table_error("shorter than its 4-byte count".into()))?;
        if count > b.len() - 4 {
            return Err(table_error(format!(
                "{count} ids cannot be stored in {} bytes",
                b.len() - 4
            )));
        }
        let mut ids = Vec::with_capacity(count);
        let (mut pos, mut prev) = (4, 0i64);
        for r in 0..count {
            let z = leb128(b, &mut pos).map_err(|e| table_error(format!("id {r} {e}")))?;
            let d = (z >> 1) as i64 ^ -((z & 1) as i64);
            prev = prev.wrapping_add(d);
            if !(0..=max_token as i64).contains(&prev) {
                return Err(table_error(format!(
                    "rank {r} is id {prev}, outside 0..={max_token}"
                )));
            }
            ids.push(prev as u32);
        }
        if pos != b.len() {
            return Err(table_error(format!(
                "{} bytes after its {count} ids",
                b.len() - pos
            )));
        }
        Self::from_ids(ids)
    }

    /// What encodes ids into this table's rank codes.
    pub fn encoder(&self) -> RankEncoder {
        let len = self.ids.iter().max().map_or(0, |&m| m as usize + 1);
        let mut ranks = vec![u32::MAX; len];
        for (r, &id) in self.ids.iter().enumerate() {
            ranks[id as usize] = r as u32;
        }
        RankEncoder { ranks }
    }

    /// Decodes exactly `out.len()` rank codes from all of `src` into ids.
    pub fn decode(&self, src: &[u8], out: &mut [u32]) -> Result<(), CodecError> {
        decode_ranks(&self.ids, src, out)
    }
}

/// A [`RankTable`]'s dense inverse (`ranks[id]`, `u32::MAX` for ids without a rank): what
/// encoding needs, 4 bytes an id up to the largest.
#[derive(Clone, Debug, Default)]
pub struct RankEncoder {
    ranks: Vec<u32>,
}

impl RankEncoder {
    /// Appends the rank code of every token to `out`. A token without a rank fails with its
    /// offset, and `out` is left as it was.
    pub fn encode(&self, tokens: &[u32], out: &mut Vec<u8>) -> Result<(), CodecError> {
        encode_ranks(&self.ranks, tokens, out)
    }
}

fn table_error(reason: String) -> CodecError {
    CodecError::Corrupt {
        codec: "rank table".into(),
        reason,
    }
}

/// `4 * floor(log2(c))` plus the two bits after `c`'s leading one.
fn quarter_octave(c: u64) -> u32 {
    let k = 63 - c.leading_zeros();
    let frac = if k >= 2 {
        (c >> (k - 2)) & 3
    } else {
        (c << (2 - k)) & 3
    };
    k * 4 + frac as u32
}

/// A LEB128 varint in its shortest form: a longer one, or one over 64 bits, is refused (so
/// that every table parsed re-encodes to its own bytes), as is one cut off.
fn leb128(b: &[u8], pos: &mut usize) -> Result<u64, &'static str> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*pos).ok_or("is cut off")?;
        *pos += 1;
        if shift == 63 && byte > 1 {
            return Err("is over 64 bits");
        }
        v |= ((byte & 0x7F) as u64) << shift;
        if byte < 0x80 {
            return match byte != 0 || shift == 0 {
                true => Ok(v),
                false => Err("is not in its shortest form"),
            };
        }
    }
    Err("is over 64 bits")
}

fn encode_ranks(ranks: &[u32], tokens: &[u32], out: &mut Vec<u8>) -> Result<(), CodecError> {
    encode_codes(tokens, out, |t| {
        ranks.get(t as usize).copied().filter(|&r| r != u32::MAX)
    })
    .map_err(|(offset, value)| CodecError::Unranked { offset, value })
}

/// [`RankTable::decode`]: the lanes side by side while every lane has a whole token left
/// and four bytes to read, then each lane's rest one code at a time. Every lane must end
/// exactly where the next begins.
fn decode_ranks(ids: &[u32], src: &[u8], out: &mut [u32]) -> Result<(), CodecError> {
    decode_codes(src, out, |r, i| {
        ids.get(r as usize)
            .copied()
            .ok_or_else(|| no_id(r, i, ids.len()))
    })
}

fn no_id(r: u32, i: usize, len: usize) -> CodecError {
    CodecError::Corrupt {
        codec: "rank".into(),
        reason: format!("token {i} has rank {r}, but the table holds {len} ids"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bytecode::{FOUR, THREE};

    fn round_trip(table: &RankTable, tokens: &[u32]) -> Vec<u8> {
        let mut b = Vec::new();
        table.encoder().encode(tokens, &mut b).unwrap();
        let mut out = vec![0; tokens.len()];
        table.decode(&b, &mut out).unwrap();
        assert_eq!(out, tokens);
        b
    }

    #[test]
    fn every_code_length_round_trips_at_its_edges() {
        let n = FOUR as usize + 5;
        // Ids in reverse, so that no id equals its rank.
        let table = RankTable::from_ids((0..n as u32).rev().collect()).unwrap();
        let ranks = [0, 127, 128, THREE - 1, THREE, FOUR - 1, FOUR, FOUR + 4];
        let tokens: Vec<u32> = ranks.iter().map(|&r| n as u32 - 1 - r).collect();
        let b = round_trip(&table, &tokens);
        assert_eq!(b.len(), 12 + 1 + 1 + 2 + 2 + 3 + 3 + 4 + 4);
        // Two tokens a lane, of 1, 2, 3 and 4 bytes: lanes 1 to 3 start at 2, 6 and 12.
        assert_eq!(&b[..12], &[2, 0, 0, 0, 6, 0, 0, 0, 12, 0, 0, 0]);
    }

    #[test]
    fn ids_over_two_to_the_24_are_refused() {
        assert_eq!(
            RankTable::from_ids(vec![3, 1 << 24]).unwrap_err().to_string(),
            "rank table payload is corrupt: id 16777216 is over the limit of 16777215 (rank+zstd takes ids below 2^24)"
        );
    }

    #[test]
    fn counts_rank_by_quarter_octave_then_id() {
        let mut counts = vec![0u64; 10];
        (counts[3], counts[7], counts[2], counts[9], counts[5]) = (100, 1000, 101, 1, 1);
        let t = RankTable::from_counts(&counts).unwrap();
        // 100 and 101 share a quarter octave (96..112), so id 2 comes before id 3.
        assert_eq!(t.ids(), &[7, 2, 3, 5, 9]);
        assert_eq!(quarter_octave(1), 0);
        assert_eq!(quarter_octave(4), 8);
        assert_eq!(quarter_octave(7), 11);
        assert_eq!(quarter_octave(u64::MAX), 63 * 4 + 3);
    }

    #[test]
    fn the_stored_table_round_trips_and_bad_tables_are_refused() {
        let t = RankTable::from_ids(vec![5, 0, 70_000, 3, 4]).unwrap();
        let mut b = Vec::new();
        t.encode(&mut b);
        assert_eq!(RankTable::parse(&b, 70_000).unwrap(), t);
        let err = |b: &[u8], max| RankTable::parse(b, max).unwrap_err().to_string();
        assert_eq!(
            err(&b, 69_999),
            "rank table payload is corrupt: rank 2 is id 70000, outside 0..=69999"
        );
        assert_eq!(
            err(&b[..b.len() - 1], 70_000),
            "rank table payload is corrupt: id 4 is cut off"
        );
        let mut long = b.clone();
        long.push(0);
        assert_eq!(
            err(&long, 70_000),
            "rank table payload is corrupt: 1 bytes after its 5 ids"
        );
        assert_eq!(
            err(&[0xFF, 0xFF, 0xFF, 0x0F, 0], 10),
            "rank table payload is corrupt: 268435455 ids cannot be stored in 1 bytes"
        );
        assert_eq!(
            err(&[1, 0, 0, 0, 0x82, 0], 10),
            "rank table payload is corrupt: id 0 is not in its shortest form"
        );
        assert_eq!(
            err(&[2, 0, 0, 0, 2, 0], 10),
            "rank table payload is corrupt: id 1 has two ranks"
        );
        assert_eq!(
            RankTable::from_ids(vec![1, 2, 1]).unwrap_err().to_string(),
            "rank table payload is corrupt: id 1 has two ranks"
        );
    }

    #[test]
    fn every_length_round_trips_in_four_lanes() {
        let t = RankTable::from_ids((0..20_000).rev().collect()).unwrap();
        for n in [0, 1, 3, 4, 5, 8, 1001] {
            let tokens: Vec<u32> = (0..n as u32).map(|i| (i * 7919) % 20_000).collect();
            round_trip(&t, &tokens);
        }
    }

    #[test]
    fn bad_codes_fail_with_the_token_they_stop_at() {
        let t = RankTable::from_ids(vec![9, 8, 7]).unwrap();
        let mut out = [0u32; 2];
        // Two tokens: lanes 0 to 2 are empty, so all three start at byte 0.
        let err = |codes: &[u8], out: &mut [u32]| {
            let src: Vec<u8> = [0u8; 12].iter().chain(codes).copied().collect();
            t.decode(&src, out).unwrap_err().to_string()
        };
        assert_eq!(
            err(&[0, 3], &mut out),
            "rank payload is corrupt: token 1 has rank 3, but the table holds 3 ids"
        );
        assert_eq!(
            err(&[0, 0x80], &mut out),
            "rank payload is corrupt: the code of token 1 is cut off"
        );
        assert_eq!(
            err(&[0, 1, 2], &mut out),
            "rank payload is corrupt: lane 3 ends at byte 2 of the codes, not 3"
        );
        assert_eq!(
            t.decode(&[0; 11], &mut out).unwrap_err().to_string(),
            "rank payload is corrupt: 11 bytes, shorter than its lane offsets"
        );
        let mut lanes = vec![3, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0];
        lanes.extend_from_slice(&[0, 1, 2]);
        let mut four = [0u32; 4];
        assert_eq!(
            t.decode(&lanes, &mut four).unwrap_err().to_string(),
            "rank payload is corrupt: lane offsets [3, 1, 2] out of order or past the 3 bytes of codes"
        );
        let mut b = Vec::new();
        let e = t.encoder().encode(&[9, 10], &mut b).unwrap_err();
        assert_eq!(
            e.to_string(),
            "token 10 at offset 1 is not in the dataset's rank table"
        );
        assert!(b.is_empty());
    }
}
