//! dquant block file: metadata parse of arbitrary bytes, then a full decode, never panic.
//!
//! Random bytes rarely get past the file's crc32c checks, so every input is tried twice: as
//! it is, and with every checksum recomputed over the layout the bytes themselves declare
//! (header, block headers and payloads per the block table, footer, trailer). The second
//! pass drives the fuzzer into the semantic checks behind the checksums.
#![no_main]

use dquant_format::block::{BlockFile, BLOCK_HEADER_LEN, HEADER_LEN, TRAILER_LEN};
use libfuzzer_sys::fuzz_target;

/// `decode_all` allocates the token count the footer declares before reading any block, and
/// a damaged header can legitimately declare billions (blocks of up to 2^32 - 256 tokens).
/// That is an allocation, not a parser bug; the harness only decodes what fits its memory.
const DECODE_LIMIT: u64 = 1 << 24;

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

fn put_crc(f: &mut [u8], at: usize, over: std::ops::Range<usize>) {
    let c = crc32c::crc32c(&f[over]);
    f[at..at + 4].copy_from_slice(&c.to_le_bytes());
}

/// Recomputes every checksum where the bytes say it is.
fn fix_checksums(f: &mut [u8]) {
    let len = f.len();
    if len >= HEADER_LEN {
        put_crc(f, 60, 0..60);
    }
    if len < HEADER_LEN + TRAILER_LEN {
        return;
    }
    let t = len - TRAILER_LEN;
    let (fo, fl) = (u64_at(f, t), u64_at(f, t + 8));
    let footer =
        (fo >= HEADER_LEN as u64 && fo.checked_add(fl) == Some(t as u64)).then_some(fo as usize..t);
    let data_end = footer.as_ref().map_or(t, |r| r.start);
    // Block boundaries: the footer's block table when there is one, else a walk over the
    // block headers' payload lengths.
    let mut bounds = Vec::new();
    if let Some(r) = footer.as_ref().filter(|r| r.len() >= 48) {
        let n = u64_at(f, r.start + 24).saturating_add(1);
        let fit = ((r.len() - 48) / 8) as u64;
        for i in 0..n.min(fit) as usize {
            bounds.push(u64_at(f, r.start + 48 + 8 * i));
        }
    } else {
        let mut at = HEADER_LEN;
        while at + BLOCK_HEADER_LEN <= data_end {
            bounds.push(at as u64);
            let plen = u32::from_le_bytes(f[at + 12..at + 16].try_into().unwrap()) as usize;
            at = at + BLOCK_HEADER_LEN + plen;
        }
        bounds.push(data_end as u64);
    }
    for w in bounds.windows(2) {
        let (s, e) = (w[0] as usize, w[1] as usize);
        if w[0] <= w[1] && e <= data_end && s + BLOCK_HEADER_LEN <= e {
            put_crc(f, s + 24, s + BLOCK_HEADER_LEN..e);
            put_crc(f, s + 28, s..s + 28);
        }
    }
    if let Some(r) = footer {
        put_crc(f, t + 16, r);
    }
    put_crc(f, t + 20, t..t + 20);
}

fn check(data: &[u8]) {
    let Ok(bf) = BlockFile::from_bytes(data) else {
        return;
    };
    assert_eq!(bf.footer.block_offsets.len(), bf.blocks() + 1);
    if bf.tokens() > DECODE_LIMIT {
        return;
    }
    if let Ok(tokens) = bf.decode_all(data) {
        assert_eq!(tokens.len() as u64, bf.tokens());
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    let mut fixed = data.to_vec();
    fix_checksums(&mut fixed);
    check(&fixed);
});
