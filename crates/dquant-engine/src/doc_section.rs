//! How a batch's document starts travel: the first part of a batch record's trailer, when the
//! plan asks for boundaries.
//!
//! Layout (integers little-endian):
//!
//! | bytes | what |
//! |---|---|
//! | 4 | format: [`LIST`] or [`BITMASK`] |
//! | 4 | starts in the batch, all samples together (`n`) |
//! | list | `samples` u32 counts, then the `n` starts back to back (u32 each) |
//! | bitmask | `samples` rows of `⌈seq_len / 8⌉` bytes: bit `b − 1` (least significant first) of row `k` is set when sample `k` has a document start at `b` |
//! | 0–7 | zeros, to a multiple of 8 bytes |
//!
//! The producer writes whichever is smaller. Documents are usually hundreds of tokens long, so
//! the list costs a few bytes per sample; a bitmask bounds the worst case (a document on every
//! token) at 1/16 of a u16 batch, so a ring slot or a frame reservation sized by
//! [`dquant_plan::boundaries::doc_section_bound`] always holds it.

use dquant_plan::{DocStarts, DocStartsError};

/// The section holds per-sample counts and the starts.
pub const LIST: u32 = 1;
/// The section holds one bit per input position of every sample.
pub const BITMASK: u32 = 2;

fn pad8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

fn row_bytes(seq_len: u32) -> usize {
    (seq_len as usize).div_ceil(8)
}

/// The format the section of `d` takes, and its length in bytes (padded).
pub fn section_len(d: &DocStarts) -> (u32, usize) {
    let list = pad8(8 + 4 * (d.samples() + d.starts().len()));
    let bitmask = pad8(8 + d.samples() * row_bytes(d.seq_len()));
    if list <= bitmask {
        (LIST, list)
    } else {
        (BITMASK, bitmask)
    }
}

/// Writes the section of `d` at the start of `out`; returns its length, or `None` when `out`
/// is shorter.
pub fn encode(d: &DocStarts, out: &mut [u8]) -> Option<usize> {
    let (format, len) = section_len(d);
    let out = out.get_mut(..len)?;
    out.fill(0);
    out[0..4].copy_from_slice(&format.to_le_bytes());
    out[4..8].copy_from_slice(&(d.starts().len() as u32).to_le_bytes());
    let body = &mut out[8..];
    if format == LIST {
        let counts = (0..d.samples()).map(|k| d.sample(k).len() as u32);
        let words = counts.chain(d.starts().iter().copied());
        for (w, v) in body.chunks_exact_mut(4).zip(words) {
            w.copy_from_slice(&v.to_le_bytes());
        }
    } else {
        let row = row_bytes(d.seq_len());
        for k in 0..d.samples() {
            let bits = &mut body[k * row..(k + 1) * row];
            for &b in d.sample(k) {
                let i = b as usize - 1;
                bits[i / 8] |= 1 << (i % 8);
            }
        }
    }
    Some(len)
}

fn bad(m: String) -> DocStartsError {
    DocStartsError(m)
}

fn u32s(b: &[u8]) -> impl Iterator<Item = u32> + '_ {
    b.chunks_exact(4)
        .map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes")))
}

/// Reads the section at the start of `b` for a batch of `samples` samples of `seq_len`
/// inputs; returns the starts and the section's length. Every length is checked against `b`
/// before anything is allocated, and every start against the sample.
pub fn decode(
    b: &[u8],
    samples: usize,
    seq_len: u32,
) -> Result<(DocStarts, usize), DocStartsError> {
    if b.len() < 8 {
        return Err(bad(format!(
            "a {}-byte trailer has no room for the section's 8-byte head",
            b.len()
        )));
    }
    let mut head = u32s(&b[..8]);
    let (format, n) = (head.next().unwrap_or(0), head.next().unwrap_or(0) as usize);
    let body = &b[8..];
    match format {
        LIST => {
            let words = samples.saturating_add(n);
            let len = pad8(8 + words.saturating_mul(4));
            if len > b.len() {
                return Err(bad(format!(
                    "a list of {samples} counts and {n} starts needs {len} bytes, the trailer has {}",
                    b.len()
                )));
            }
            let counts: Vec<u32> = u32s(&body[..4 * samples]).collect();
            let starts: Vec<u32> = u32s(&body[4 * samples..4 * words]).collect();
            Ok((DocStarts::from_parts(seq_len, &counts, starts)?, len))
        }
        BITMASK => {
            let row = row_bytes(seq_len);
            let len = pad8(8 + samples.saturating_mul(row));
            if len > b.len() {
                return Err(bad(format!(
                    "a bitmask of {samples} rows of {row} bytes needs {len} bytes, the trailer has {}",
                    b.len()
                )));
            }
            let mut d = DocStarts::new(seq_len);
            for k in 0..samples {
                let bits = &body[k * row..(k + 1) * row];
                if bits
                    .last()
                    .is_some_and(|&x| !seq_len.is_multiple_of(8) && x >> (seq_len % 8) != 0)
                {
                    return Err(bad(format!("sample {k} marks a start past {seq_len}")));
                }
                d.push_sample(
                    (0..seq_len)
                        .filter(|&i| bits[i as usize / 8] >> (i % 8) & 1 == 1)
                        .map(|i| i + 1),
                );
            }
            if d.starts().len() != n {
                return Err(bad(format!(
                    "the bitmask marks {} starts, its head says {n}",
                    d.starts().len()
                )));
            }
            Ok((d, len))
        }
        f => Err(bad(format!("unknown section format {f}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dquant_plan::boundaries::doc_section_bound;

    fn docs(seq_len: u32, samples: &[Vec<u32>]) -> DocStarts {
        let mut d = DocStarts::new(seq_len);
        for s in samples {
            d.push_sample(s.iter().copied());
        }
        d
    }

    fn round_trip(d: &DocStarts, want_format: u32) {
        let bound = doc_section_bound(d.samples() as u32, d.seq_len()) as usize;
        let mut buf = vec![0xAA; bound + 8];
        let len = encode(d, &mut buf).unwrap();
        assert!(len <= bound, "{len} over the bound {bound}");
        assert_eq!(len % 8, 0);
        assert_eq!(section_len(d), (want_format, len));
        let (back, used) = decode(&buf, d.samples(), d.seq_len()).unwrap();
        assert_eq!((&back, used), (d, len));
        assert!(encode(d, &mut buf[..len - 1]).is_none());
    }

    #[test]
    fn both_formats_round_trip_within_the_bound() {
        round_trip(&docs(4096, &[vec![100, 2000], vec![], vec![4096]]), LIST);
        round_trip(&docs(9, &[vec![]]), LIST);
        // A document on every token: the bitmask is smaller.
        let every: Vec<u32> = (1..=4096).collect();
        round_trip(&docs(4096, &[every.clone(), every, vec![1]]), BITMASK);
        round_trip(&docs(3, &[vec![1, 2, 3], vec![3], vec![2, 3]]), BITMASK);
        round_trip(&docs(16, &[(1..=16).collect()]), BITMASK);
    }

    #[test]
    fn garbage_is_refused_by_name() {
        let d = docs(256, &[vec![3, 9], vec![256]]);
        let mut buf = vec![0; 64];
        let len = encode(&d, &mut buf).unwrap();
        assert_eq!(section_len(&d), (LIST, 32));
        let err = |b: &[u8]| decode(b, 2, 256).unwrap_err().to_string();
        assert_eq!(
            err(&buf[..4]),
            "document starts: a 4-byte trailer has no room for the section's 8-byte head"
        );
        assert_eq!(
            err(&buf[..len - 8]),
            "document starts: a list of 2 counts and 3 starts needs 32 bytes, the trailer has 24"
        );
        let mut huge = buf.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            err(&huge),
            "document starts: a list of 2 counts and 4294967295 starts needs 17179869200 bytes, \
             the trailer has 64"
        );
        let mut past = buf.clone();
        past[20..24].copy_from_slice(&257u32.to_le_bytes());
        assert_eq!(
            err(&past),
            "document starts: sample 0's starts [3, 257] are not ascending within 1..=256"
        );
        let mut fmt = buf.clone();
        fmt[0] = 7;
        assert_eq!(err(&fmt), "document starts: unknown section format 7");
        // A bitmask with a bit past seq_len, or a count that disagrees.
        let mut bm = vec![0u8; 16];
        bm[0] = BITMASK as u8;
        bm[4] = 1;
        bm[8] = 0b0000_1000;
        assert_eq!(
            decode(&bm, 1, 3).unwrap_err().to_string(),
            "document starts: sample 0 marks a start past 3"
        );
        bm[8] = 0b0000_0110;
        assert_eq!(
            decode(&bm, 1, 3).unwrap_err().to_string(),
            "document starts: the bitmask marks 2 starts, its head says 1"
        );
    }
}
