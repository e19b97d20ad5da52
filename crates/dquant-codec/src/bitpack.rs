//! `bits:N` packing.
//!
//! Whole groups of 256 tokens use the `bitpacking` crate's `BitPacker8x` layout (eight
//! interleaved 32-bit lanes; AVX2 when the CPU has it, a scalar implementation of the same
//! layout otherwise, so the bytes never depend on the machine). The last `n % 256` tokens are
//! packed LSB-first, bit by bit, to exactly `ceil(tail * N / 8)` bytes: the crate's packers
//! only take whole blocks, and padding every 1 MiB block with up to 255 dummy tokens would make
//! sizes depend on block boundaries.

use bitpacking::{BitPacker, BitPacker8x};

use crate::width::PACK_GROUP;

const _: () = assert!(BitPacker8x::BLOCK_LEN == PACK_GROUP);

/// Packs `src` (all values already checked to fit in `bits`) into `dst`, which must be exactly
/// `Width::Bits(bits).encoded_len(src.len())` bytes.
pub(crate) fn pack(bits: u8, src: &[u32], dst: &mut [u8]) {
    let group_bytes = PACK_GROUP * bits as usize / 8;
    let packer = BitPacker8x::new();
    let mut groups = src.chunks_exact(PACK_GROUP);
    let mut out = dst.chunks_mut(group_bytes);
    for g in groups.by_ref() {
        if let Some(o) = out.next() {
            packer.compress(g, o, bits);
        }
    }
    let tail_dst = &mut dst[src.len() / PACK_GROUP * group_bytes..];
    pack_tail(bits, groups.remainder(), tail_dst);
}

/// Unpacks `dst.len()` tokens from `src`, which must be exactly the packed length.
pub(crate) fn unpack(bits: u8, src: &[u8], dst: &mut [u32]) {
    let group_bytes = PACK_GROUP * bits as usize / 8;
    let packer = BitPacker8x::new();
    let full = dst.len() / PACK_GROUP;
    let (head, tail) = dst.split_at_mut(full * PACK_GROUP);
    for (g, s) in head
        .chunks_exact_mut(PACK_GROUP)
        .zip(src.chunks(group_bytes))
    {
        packer.decompress(s, g, bits);
    }
    unpack_tail(bits, &src[full * group_bytes..], tail);
}

fn pack_tail(bits: u8, src: &[u32], dst: &mut [u8]) {
    let mut acc: u64 = 0;
    let mut have = 0u32;
    let mut o = 0;
    for &v in src {
        acc |= (v as u64) << have;
        have += bits as u32;
        while have >= 8 {
            dst[o] = acc as u8;
            o += 1;
            acc >>= 8;
            have -= 8;
        }
    }
    if have > 0 {
        dst[o] = acc as u8;
    }
}

fn unpack_tail(bits: u8, src: &[u8], dst: &mut [u32]) {
    let mask = ((1u64 << bits) - 1) as u32;
    let mut acc: u64 = 0;
    let mut have = 0u32;
    let mut bytes = src.iter();
    for d in dst.iter_mut() {
        while have < bits as u32 {
            acc |= (bytes.next().copied().unwrap_or(0) as u64) << have;
            have += 8;
        }
        *d = acc as u32 & mask;
        acc >>= bits;
        have -= bits as u32;
    }
}
