//! What the shared-memory ring targets (`ring_header`, `ring_answer`) share: reading the
//! little-endian fields of a header the way the layout table in `ring::layout` lays them out,
//! and making the files and descriptors a peer would hand over.

use std::os::fd::OwnedFd;

use dquant_transport::ring::layout::{FLAG_CRC, MAGIC, VERSION};
use rustix::fs::{MemfdFlags, SealFlags};

/// The little-endian u32 at byte `o` of `b`.
pub fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("four bytes"))
}

/// The little-endian u64 at byte `o` of `b`.
pub fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("eight bytes"))
}

/// A non-blocking eventfd, as a ring's wake-ups are.
pub fn eventfd() -> OwnedFd {
    use rustix::event::EventfdFlags;
    rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).expect("eventfd")
}

/// A memfd of `len` bytes starting with `contents` (cut to `len`), sealed against growing,
/// and against shrinking when `sealed`. Returns it and the bytes written.
pub fn ring_memfd(len: u64, contents: &[u8], sealed: bool) -> (OwnedFd, &[u8]) {
    let fd = rustix::fs::memfd_create("fuzz-ring", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .expect("memfd_create");
    rustix::fs::ftruncate(&fd, len).expect("ftruncate");
    let contents = &contents[..contents
        .len()
        .min(usize::try_from(len).unwrap_or(usize::MAX))];
    rustix::io::pwrite(&fd, contents, 0).expect("pwrite");
    let seals = if sealed {
        SealFlags::GROW | SealFlags::SHRINK
    } else {
        SealFlags::GROW
    };
    rustix::fs::fcntl_add_seals(&fd, seals).expect("seals");
    (fd, contents)
}

/// The first `n` bytes of `contents`, zero-padded to `n`.
pub fn head(contents: &[u8], n: usize) -> Vec<u8> {
    let mut h = contents[..contents.len().min(n)].to_vec();
    h.resize(n, 0);
    h
}

/// A ring's shape as the layout table gives it: slot count, slot size, where the slots start,
/// reader blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub slots: u32,
    pub slot_size: u64,
    pub slots_offset: u64,
    pub readers: u32,
}

/// What the first 56 bytes of a file of `file_len` bytes (its `Meta`, zero-padded) say, if
/// they describe a ring, with any reader count, that is exactly that file. An independent
/// reading of the table in `ring::layout`: a 192-byte header, 256 bytes a reader block, 16 a
/// completion record, slots from the next 4 KiB boundary.
pub fn expected_layout(h: &[u8], file_len: u64) -> Option<Shape> {
    let (n, size, readers) = (u32_at(h, 12), u64_at(h, 16), u32_at(h, 52));
    if u64_at(h, 0) != MAGIC
        || u32_at(h, 8) != VERSION
        || u32_at(h, 48) & !FLAG_CRC != 0
        || !(1..=64).contains(&readers)
        || !(1..=65536).contains(&n)
        || !(1..=u64::from(u32::MAX)).contains(&size)
    {
        return None;
    }
    let records = 192 + 256 * u64::from(readers);
    let slots_offset = (records + 16 * u64::from(n)).div_ceil(4096) * 4096;
    let total = slots_offset + u64::from(n) * size;
    let fits = u64_at(h, 24) == records && u64_at(h, 32) == slots_offset;
    (fits && u64_at(h, 40) == total && file_len == total).then_some(Shape {
        slots: n,
        slot_size: size,
        slots_offset,
        readers,
    })
}
