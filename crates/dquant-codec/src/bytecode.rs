//! The byte code: token ranks (or ids, each its own rank) as variable-length codes, in four
//! lanes that a reader decodes side by side. The archive codec ([`crate::ranks`]) writes
//! frequency ranks in it; the transport preset ([`crate::stream`]) writes 17- to 32-bit ids.
//!
//! The byte code, most significant bits first:
//!
//! ```text
//! 0xxxxxxx                       rank 0 ..= 127
//! 10xxxxxx yyyyyyyy              rank 128 + 14 bits
//! 110xxxxx yyyyyyyy zzzzzzzz     rank 16_512 + 21 bits
//! 111xxxxx + 3 bytes             rank 2_113_664 + 29 bits (a table holds at most 2^24 ids)
//! ```
//!
//! A payload is the codes of its tokens in order, cut into [`LANES`] lanes of (about) equal
//! token counts, with the byte offsets where lanes 1 to 3 start in front (u32 LE each):
//!
//! ```text
//! payload = lane1_offset:u32 lane2_offset:u32 lane3_offset:u32 code*
//! ```
//!
//! The codes are the same bytes in the same order as one stream, so zstd sees no difference;
//! but a code's length is known only once its first byte is read, which makes one stream a
//! chain of dependent loads (about 10 cycles a token). Four lanes are four independent chains
//! the CPU runs side by side.
//!
//! Written here, not taken from a crate: no crate has this code (a prefix varint with the
//! length in the first byte, most significant bits first, in lanes), and its decode loop is
//! the hot path of reading an archive and a 17/18-bit session (`cargo bench -p dquant-codec
//! --bench kernels -- ranks`).

use crate::error::CodecError;

/// Lanes of a payload (see the module doc).
pub(crate) const LANES: usize = 4;

/// Bytes of lane offsets in front of a payload's codes.
const LANE_HEADER: usize = 4 * (LANES - 1);

/// The most bytes the codes of `n` tokens take: the lane offsets and 4 bytes a token.
pub(crate) fn max_codes_len(n: usize) -> usize {
    n.saturating_mul(4).saturating_add(LANE_HEADER)
}

/// The token range of lane `k` of `n` tokens: `n / LANES` each, the rest in the last.
fn lane(n: usize, k: usize) -> std::ops::Range<usize> {
    let q = n / LANES;
    k * q..if k + 1 == LANES { n } else { (k + 1) * q }
}

/// First rank of the two-, three- and four-byte codes.
pub(crate) const TWO: u32 = 128;
pub(crate) const THREE: u32 = TWO + (1 << 14);
pub(crate) const FOUR: u32 = THREE + (1 << 21);
/// One past the largest value the byte code holds.
pub(crate) const CODE_LIMIT: u32 = FOUR + (1 << 29);

/// Appends the lane offsets and the byte code of `rank(token)` for every token to `out`. A
/// token `rank` has no code for fails with its offset and value, and `out` is left as it
/// was. Ranks must be below [`CODE_LIMIT`].
pub(crate) fn encode_codes(
    tokens: &[u32],
    out: &mut Vec<u8>,
    rank: impl Fn(u32) -> Option<u32>,
) -> Result<(), (u64, u32)> {
    let start = out.len();
    out.reserve(LANE_HEADER + tokens.len() * 2);
    out.resize(start + LANE_HEADER, 0);
    for k in 0..LANES {
        let at = out.len() - start - LANE_HEADER;
        if k > 0 {
            let o = start + 4 * (k - 1);
            out[o..o + 4].copy_from_slice(&(at as u32).to_le_bytes());
        }
        let r = lane(tokens.len(), k);
        for (i, &t) in tokens[r.clone()].iter().enumerate() {
            match rank(t) {
                Some(r) => push_code(r, out),
                None => {
                    out.truncate(start);
                    return Err(((r.start + i) as u64, t));
                }
            }
        }
    }
    Ok(())
}

#[inline(always)]
fn push_code(r: u32, out: &mut Vec<u8>) {
    if r < TWO {
        out.push(r as u8);
    } else if r < THREE {
        let v = r - TWO;
        out.extend_from_slice(&[0x80 | (v >> 8) as u8, v as u8]);
    } else if r < FOUR {
        let v = r - THREE;
        out.extend_from_slice(&[0xC0 | (v >> 16) as u8, (v >> 8) as u8, v as u8]);
    } else {
        let v = r - FOUR;
        let b = [
            0xE0 | (v >> 24) as u8,
            (v >> 16) as u8,
            (v >> 8) as u8,
            v as u8,
        ];
        out.extend_from_slice(&b);
    }
}

/// Decodes exactly `out.len()` byte codes from all of `src`, token `i` with code value `r`
/// becoming `id(r, i)` (a table's id, or the value itself).
#[inline(always)]
pub(crate) fn decode_codes(
    src: &[u8],
    out: &mut [u32],
    id: impl Fn(u32, usize) -> Result<u32, CodecError>,
) -> Result<(), CodecError> {
    let header = src.get(..LANE_HEADER).ok_or_else(|| {
        corrupt(format!(
            "{} bytes, shorter than its lane offsets",
            src.len()
        ))
    })?;
    let codes = &src[LANE_HEADER..];
    let mut ends = [codes.len(); LANES];
    for k in 1..LANES {
        let o = u32::from_le_bytes(header[4 * (k - 1)..4 * k].try_into().unwrap_or_default());
        ends[k - 1] = o as usize;
    }
    if ends.windows(2).any(|w| w[0] > w[1]) {
        return Err(corrupt(format!(
            "lane offsets {:?} out of order or past the {} bytes of codes",
            &ends[..LANES - 1],
            codes.len()
        )));
    }
    let mut pos = [0, ends[0], ends[1], ends[2]];
    let n = out.len();
    let q = n / LANES;
    let mut t = decode_blocks(codes, &mut pos, out, q, &id)?;
    // Side by side, one token at a time: 4 bytes are there to read in every lane (a lane may
    // read into the next lane's bytes; its end is checked below).
    while t < q && pos[LANES - 1] + 4 <= codes.len() {
        for (k, p) in pos.iter_mut().enumerate() {
            let i = k * q + t;
            // Only a corrupt lane runs past the end: it is refused, never read out of bounds.
            let b = codes.get(*p..*p + 4).ok_or_else(|| cut_off(i))?;
            let (r, len) = code_at(b);
            *p += len;
            out[i] = id(r, i)?;
        }
        t += 1;
    }
    for (k, (p, end)) in pos.iter_mut().zip(ends).enumerate() {
        let rest = lane(n, k);
        let first = rest.start + t;
        for (j, o) in out[first..rest.end].iter_mut().enumerate() {
            let i = first + j;
            let (r, len) =
                code_near_end(codes.get(*p..end).unwrap_or_default()).ok_or_else(|| cut_off(i))?;
            *p += len;
            *o = id(r, i)?;
        }
        if *p != end {
            return Err(corrupt(format!(
                "lane {k} ends at byte {p} of the codes, not {end}"
            )));
        }
    }
    Ok(())
}

/// Tokens a lane decodes between two checks of the lanes' bytes in [`decode_blocks`].
const BLOCK: usize = 16;

/// The lanes side by side, [`BLOCK`] tokens each at a time, from `pos` on, while every lane
/// has a whole block of tokens left and [`BLOCK`] × 4 bytes to read; returns the tokens a
/// lane decoded. Lane `k`'s token `t` goes to `out[k * q + t]`.
///
/// Why unchecked: the block's one check stands for every read in it, as a code takes at most
/// 4 bytes. A check on each read and store cost the decode a third of its rate: with them
/// `ranks/1Mi/decode` ran at 544-569 M tokens/s, without 801-835 (`cargo bench -p
/// dquant-codec --bench kernels -- ranks`, the two builds alternated), and a 17-bit session's
/// stream (`dquant bench codecs --codecs u24+stream:5`) decodes 1.17-1.24x faster.
#[inline(always)]
fn decode_blocks(
    codes: &[u8],
    pos: &mut [usize; LANES],
    out: &mut [u32],
    q: usize,
    id: &impl Fn(u32, usize) -> Result<u32, CodecError>,
) -> Result<usize, CodecError> {
    debug_assert!(q * LANES <= out.len());
    let mut t = 0;
    while t + BLOCK <= q && pos.iter().all(|&p| p + 4 * BLOCK <= codes.len()) {
        for j in t..t + BLOCK {
            for (k, p) in pos.iter_mut().enumerate() {
                // SAFETY: at the block's start `p + 4 * BLOCK <= codes.len()`, and each of its
                // BLOCK steps moves `p` by a code's length, at most 4: this read's 4 bytes end
                // within `codes`.
                let b = unsafe { codes.as_ptr().add(*p).cast::<[u8; 4]>().read() };
                let (r, len) = code_of(b);
                *p += len;
                let i = k * q + j;
                let v = id(r, i)?;
                // SAFETY: `j < q`, so `i < (k + 1) * q <= LANES * q <= out.len()`.
                unsafe { *out.get_unchecked_mut(i) = v };
            }
        }
        t += BLOCK;
    }
    Ok(t)
}

fn corrupt(reason: String) -> CodecError {
    CodecError::Corrupt {
        codec: "rank".into(),
        reason,
    }
}

/// How to read the code that starts with a given byte, from four bytes read big-endian: its
/// rank is `(v >> shift) + delta` (wrapping: `delta` takes away the length prefix and adds the
/// length's first rank, so one shift and one add, exact for every code), and it takes `len`
/// bytes. Eight bytes, one load.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct Step {
    delta: u32,
    shift: u8,
    len: u8,
}

/// [`Step`] by first byte.
static STEPS: [Step; 256] = {
    let mut t = [Step {
        delta: 0,
        shift: 24,
        len: 1,
    }; 256];
    let mut b = 0x80;
    while b < 256 {
        t[b] = match b {
            0x80..=0xBF => Step {
                delta: TWO.wrapping_sub(0x8000),
                shift: 16,
                len: 2,
            },
            0xC0..=0xDF => Step {
                delta: THREE.wrapping_sub(0xC0_0000),
                shift: 8,
                len: 3,
            },
            _ => Step {
                delta: FOUR.wrapping_sub(0xE000_0000),
                shift: 0,
                len: 4,
            },
        };
        b += 1;
    }
    t
};

/// The rank and length of the code whose first four bytes (or the code and what follows it)
/// are `b`.
#[inline(always)]
fn code_of(b: [u8; 4]) -> (u32, usize) {
    let s = STEPS[b[0] as usize];
    (
        (u32::from_be_bytes(b) >> s.shift).wrapping_add(s.delta),
        s.len as usize,
    )
}

/// The rank and length of the code at the start of `b` (at least 4 bytes).
fn code_at(b: &[u8]) -> (u32, usize) {
    code_of([b[0], b[1], b[2], b[3]])
}

/// [`code_at`] for the last bytes of a payload, `None` if the code is cut off.
fn code_near_end(b: &[u8]) -> Option<(u32, usize)> {
    let len = STEPS[*b.first()? as usize].len as usize;
    let mut four = [0u8; 4];
    four[..len].copy_from_slice(b.get(..len)?);
    Some(code_at(&four))
}

fn cut_off(i: usize) -> CodecError {
    CodecError::Corrupt {
        codec: "rank".into(),
        reason: format!("the code of token {i} is cut off"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_decode_every_length_into_its_token() {
        // Lanes of 1,000 tokens and more: most go through the unchecked blocks.
        let edges = [
            0,
            1,
            127,
            TWO,
            TWO + 1,
            THREE - 1,
            THREE,
            FOUR - 1,
            FOUR,
            CODE_LIMIT - 1,
        ];
        for n in [4 * BLOCK, 4 * BLOCK + 3, 4003] {
            let tokens: Vec<u32> = (0..n)
                .map(|i| edges[(i * 7 + i / 3) % edges.len()])
                .collect();
            let mut src = Vec::new();
            encode_codes(&tokens, &mut src, Some).unwrap();
            let mut out = vec![0; n];
            // Every token reaches `id` with its own index.
            decode_codes(&src, &mut out, |r, i| {
                assert_eq!(r, tokens[i], "token {i}");
                Ok(r)
            })
            .unwrap();
            assert_eq!(out, tokens);
            // A payload cut short, or with a byte more, fails; never reads past its end.
            for cut in [&src[..src.len() - 1], &[&src[..], &[0]].concat()[..]] {
                let e = decode_codes(cut, &mut out, |r, _| Ok(r)).unwrap_err();
                assert!(
                    e.to_string().starts_with("rank payload is corrupt: "),
                    "{e}"
                );
            }
        }
        // An error inside a block names its token: lane 2's token 37.
        let tokens = vec![5u32; 4000];
        let mut src = Vec::new();
        encode_codes(&tokens, &mut src, Some).unwrap();
        let mut out = vec![0; 4000];
        let e = decode_codes(&src, &mut out, |r, i| {
            if i == 2037 {
                Err(corrupt(format!("token {i} has rank {r}")))
            } else {
                Ok(r)
            }
        })
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "rank payload is corrupt: token 2037 has rank 5"
        );
    }
}
