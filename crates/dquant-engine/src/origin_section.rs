//! How a batch's origins travel ([`dquant_plan::Origins`], a plan's `provenance = true`): the
//! batch record's trailer section after the document starts, before the cursor trailer.
//!
//! Layout (integers little-endian):
//!
//! | bytes | what |
//! |---|---|
//! | 4 | format: [`PIECES`] |
//! | 4 | pieces in the batch, all samples together (`n`) |
//! | 4 × samples | each sample's piece count |
//! | 4 × samples | each sample's source |
//! | 8 × samples | each sample's offset into its first piece's document |
//! | 8 × n | each piece's document |
//! | 4 × n | each piece's length |
//! | 0–7 | zeros, to a multiple of 8 bytes |
//!
//! Documents are usually longer than a sample, so a sample is one to a few pieces: about
//! 30–60 bytes, under 1% of a 4,096-token u16 sample. The bound
//! ([`dquant_plan::origins::origin_section_bound`]) covers a document on every token.

use dquant_plan::{Origins, OriginsError};

/// The only format: fixed-width columns.
pub const PIECES: u32 = 1;

fn pad8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// The section's length in bytes (padded) for `samples` samples of `pieces` pieces in all.
fn section_len(samples: usize, pieces: usize) -> usize {
    pad8(8 + 16 * samples + 12 * pieces)
}

/// Writes the section of `o` at the start of `out`; returns its length, or `None` when `out`
/// is shorter.
pub fn encode(o: &Origins, out: &mut [u8]) -> Option<usize> {
    let p = o.parts();
    let len = section_len(o.samples(), o.pieces());
    let out = out.get_mut(..len)?;
    out.fill(0);
    let mut at = 0;
    let mut put = |bytes: &[u8]| {
        out[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    };
    put(&PIECES.to_le_bytes());
    put(&(o.pieces() as u32).to_le_bytes());
    p.counts.iter().for_each(|v| put(&v.to_le_bytes()));
    p.sources.iter().for_each(|v| put(&v.to_le_bytes()));
    p.first_offsets.iter().for_each(|v| put(&v.to_le_bytes()));
    p.documents.iter().for_each(|v| put(&v.to_le_bytes()));
    p.lengths.iter().for_each(|v| put(&v.to_le_bytes()));
    Some(len)
}

fn u32s(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes")))
        .collect()
}

fn u64s(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
        .collect()
}

/// Reads the section at the start of `b` for a batch of `samples` samples of `sample_len`
/// tokens; returns the origins and the section's length. Every length is checked against `b`
/// before anything is allocated, and the pieces against the samples.
pub fn decode(b: &[u8], samples: usize, sample_len: u32) -> Result<(Origins, usize), OriginsError> {
    let bad = |m: String| Err(OriginsError(m));
    if b.len() < 8 {
        return bad(format!(
            "a {}-byte trailer has no room for the section's 8-byte head",
            b.len()
        ));
    }
    let head = u32s(&b[..8]);
    let (format, n) = (head[0], head[1] as usize);
    if format != PIECES {
        return bad(format!("unknown section format {format}"));
    }
    let len = pad8(
        16usize
            .saturating_mul(samples)
            .saturating_add(12usize.saturating_mul(n))
            .saturating_add(8),
    );
    if len > b.len() {
        return bad(format!(
            "{samples} samples of {n} pieces need {len} bytes, the trailer has {}",
            b.len()
        ));
    }
    let mut at = 8;
    let mut take = |bytes: usize| {
        let s = &b[at..at + bytes];
        at += bytes;
        s
    };
    let counts = u32s(take(4 * samples));
    let sources = u32s(take(4 * samples));
    let firsts = u64s(take(8 * samples));
    let docs = u64s(take(8 * n));
    let lengths = u32s(take(4 * n));
    let o = Origins::from_parts(sample_len, &counts, sources, firsts, docs, lengths)?;
    Ok((o, len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dquant_plan::origins::origin_section_bound;

    #[test]
    fn round_trip_within_the_bound_and_short_or_odd_sections_are_refused() {
        let mut o = Origins::new();
        o.push_sample(1, 9, [(3, 2), (4, 1), (7, 2)]);
        o.push_sample(0, 0, [(0, 5)]);
        let mut buf = vec![0xAA; 256];
        let len = encode(&o, &mut buf).unwrap();
        assert_eq!(len, section_len(2, 4));
        assert!(len as u64 <= origin_section_bound(2, 4));
        let (back, used) = decode(&buf[..len], 2, 5).unwrap();
        assert_eq!((back, used), (o.clone(), len));
        assert!(encode(&o, &mut buf[..len - 1]).is_none());
        let err = |b: &[u8], samples| decode(b, samples, 5).unwrap_err().to_string();
        assert_eq!(
            err(&buf[..len - 8], 2),
            format!(
                "provenance: 2 samples of 4 pieces need {len} bytes, the trailer has {}",
                len - 8
            )
        );
        assert_eq!(
            err(&buf[..4], 2),
            "provenance: a 4-byte trailer has no room for the section's 8-byte head"
        );
        let mut odd = buf.clone();
        odd[0] = 9;
        assert_eq!(err(&odd, 2), "provenance: unknown section format 9");
        // A sample length the pieces do not add up to.
        assert!(decode(&buf[..len], 2, 6).is_err());
    }
}
