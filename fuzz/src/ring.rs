//! What the shared-memory ring targets (`ring_header`, `ring_answer`) share: reading the
//! little-endian fields of a header the way the layout table in `ring::layout` lays them out,
//! and making the files and descriptors a peer would hand over.

use std::os::fd::OwnedFd;

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
