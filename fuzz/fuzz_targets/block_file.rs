//! dquant block file: metadata parse of arbitrary bytes, then a full decode, never panic.
//! Both ways a file is opened: whole (`BlockFile::from_bytes`, tests and small files) and lazily
//! as `Dataset::open` does for an agent (the header, the trailer, the footer's head from the
//! length its fixed part declares, `BlockLayout::parse`; the index and its checksum only when
//! asked, `parse_index` / `index_checksum`; blocks one at a time). Where both parse, they
//! agree: the same layout, the same index, the same tokens block by block.
//!
//! Random bytes rarely get past the file's crc32c checks, so every input is tried twice: as
//! it is, and with every checksum recomputed over the layout the bytes themselves declare
//! (header, block headers and payloads per the block table, a `rank+zstd` file's rank table,
//! footer, trailer). The second
//! pass drives the fuzzer into the semantic checks behind the checksums.
#![no_main]

use dquant_codec::Decoder;
use dquant_format::block::{
    BlockFile, BlockLayout, FooterHead, Trailer, BLOCK_HEADER_LEN, FOOTER_FIXED_LEN, HEADER_LEN,
    TRAILER_LEN,
};
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
    if let Some(r) = footer.clone().filter(|r| r.len() >= 48) {
        let n = u64_at(f, r.start + 24).saturating_add(1);
        let fit = ((r.len() - 48) / 8) as u64;
        for i in 0..n.min(fit) as usize {
            bounds.push(u64_at(f, r.start + 48 + 8 * i));
        }
        // A rank+zstd file's rank table, after the block table, ends in its own crc.
        let ranks = u32::from_le_bytes(f[r.start + 12..r.start + 16].try_into().unwrap()) as u64;
        let at = (r.start as u64).saturating_add(48).saturating_add(n.saturating_mul(8));
        if ranks >= 4 && n <= fit && at.saturating_add(ranks) <= r.end as u64 {
            let (at, end) = (at as usize, (at + ranks) as usize);
            put_crc(f, end - 4, at..end - 4);
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
    let whole = BlockFile::from_bytes(data).ok();
    let lazy = lazily(data, whole.as_ref());
    let Some(bf) = whole else {
        return;
    };
    assert!(lazy.is_some(), "the whole file parses, the lazy open does not");
    assert_eq!(bf.footer.block_offsets.len(), bf.blocks() + 1);
    if bf.tokens() > DECODE_LIMIT {
        return;
    }
    if let Ok(tokens) = bf.decode_all(data) {
        assert_eq!(tokens.len() as u64, bf.tokens());
        // Block by block, as ranged reads decode them, the same tokens.
        let mut dec = Decoder::new();
        for i in 0..bf.blocks() {
            let (b, t) = (bf.byte_range(i..i + 1), bf.block_tokens(i));
            let mut out = vec![0u32; (t.end - t.start) as usize];
            bf.decode_block(i, &data[b.start as usize..b.end as usize], &mut dec, &mut out)
                .expect("a block of a file that decodes whole decodes alone");
            assert_eq!(out, tokens[t.start as usize..t.end as usize], "block {i}");
        }
    }
}

/// The lazy open of an agent's `Dataset` (see the module docs); its layout, and its index
/// when the footer's checksum holds. Agrees with `whole` where that parsed.
fn lazily(data: &[u8], whole: Option<&BlockFile>) -> Option<BlockLayout> {
    let len = data.len();
    if len < TRAILER_LEN {
        return None;
    }
    let head = &data[..HEADER_LEN.min(len)];
    let trailer = Trailer::parse(&data[len - TRAILER_LEN..], len as u64).ok()?;
    // The trailer's checks keep the footer inside the file.
    let (at, flen) = (trailer.footer_offset as usize, trailer.footer_len as usize);
    let footer = &data[at..at + flen];
    let fixed = &footer[..FOOTER_FIXED_LEN.min(flen)];
    let head_len = FooterHead::len_from_fixed(fixed)
        .unwrap_or(0)
        .clamp(fixed.len() as u64, flen as u64) as usize;
    let layout = BlockLayout::parse(head, &trailer, &footer[..head_len]).ok()?;
    let rest = &footer[head_len..];
    let footer_ok = crc32c::crc32c(footer) == trailer.footer_crc;
    let index = layout.footer.parse_index(rest);
    let checksum = layout.footer.index_checksum(rest);
    if let Some(bf) = whole {
        assert_eq!(bf.layout, layout);
        assert_eq!(index.as_ref().ok(), Some(&bf.index));
        assert!(checksum.is_ok());
    }
    if footer_ok && index.is_ok() {
        assert!(checksum.is_ok(), "the index parses, its checksum does not");
    }
    Some(layout)
}

fuzz_target!(|data: &[u8]| {
    check(data);
    let mut fixed = data.to_vec();
    fix_checksums(&mut fixed);
    check(&fixed);
});
