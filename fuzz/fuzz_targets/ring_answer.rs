//! The shared-memory ring as a subscriber reads it from an agent it cannot trust: the agent's
//! answer to its offer (`Answer::recv`: read the ring you offered, or this reader block of the
//! stream's shared ring, with its descriptors), then the shared ring's memfd
//! (`RingConsumer::attach`: its seals, its header, the reader block named), then one batch
//! taken from it with no wait.
//!
//! The answer is one `sendmsg` of any bytes with 0–4 descriptors, after which the agent's end
//! closes. Checked against an independent reading of the answer's format (`ANSWER`, then 0, or
//! 1 and a u32 reader) and of the layout table in `ring::layout`:
//!
//! * the answer is `None` exactly when the message is empty or does not start with the tag's
//!   first byte, `Own` exactly when it starts with the tag and 0 and came with no
//!   descriptors, `Reader` exactly when it starts with the tag, 1 and four bytes and came
//!   with three descriptors (the reader's number those four bytes), and an error otherwise;
//! * it reads the answer's bytes and no more: what follows stays on the socket, whole (a
//!   failure message the agent writes right behind its answer is the reader's);
//! * the ring is attached exactly when its memfd is sealed against shrinking, its header
//!   describes exactly the file it is in (for any number of reader blocks), the reader block
//!   named is one of them and its consumer index is one a ring can count to (`MAX_INDEX`);
//!   the attached layout is that description;
//! * taking a batch from it never panics, faults or waits.
//!
//! Input: flags (seals, descriptors to send, verify), the file length, the message's length,
//! the message, then the file's first bytes (the rest of the file is zeros).
#![no_main]

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use dquant_fuzz::ring::{eventfd, expected_layout, head, ring_memfd};
use dquant_transport::ring::layout::MAX_INDEX;
use dquant_transport::ring::{send_fds, Answer, RingConsumer, RingError, RingFds, ANSWER};
use libfuzzer_sys::fuzz_target;

/// Files up to 64 MiB: larger ones are only more zero pages.
const MAX_FILE: u64 = 64 << 20;

/// The ring file the test made, and what it knows of it.
struct File {
    fd: OwnedFd,
    len: u64,
    /// Its first 56 bytes (zeros past the end).
    head: Vec<u8>,
    sealed: bool,
}

/// A memfd of `len` bytes starting with `contents`, sealed against growing, and against
/// shrinking when `sealed`.
fn ring_file(len: u64, contents: &[u8], sealed: bool) -> File {
    let (fd, written) = ring_memfd(len, contents, sealed);
    File {
        fd,
        len,
        head: head(written, 56),
        sealed,
    }
}

/// What `Answer::recv` must make of `msg` sent with `nfds` descriptors: `None`, `Own`
/// (`Some(None)`), `Reader` with its number (`Some(Some(r))`), or an error (`Err`).
fn expected_answer(msg: &[u8], nfds: usize) -> Result<Option<Option<u32>>, ()> {
    if msg.first() != Some(&ANSWER[0]) {
        return Ok(None);
    }
    match msg.strip_prefix(ANSWER) {
        Some([0, ..]) if nfds == 0 => Ok(Some(None)),
        Some([1, a, b, c, d, ..]) if nfds == 3 => {
            Ok(Some(Some(u32::from_le_bytes([*a, *b, *c, *d]))))
        }
        _ => Err(()),
    }
}

/// How many bytes of `msg` an answer takes.
fn answer_len(reader: Option<u32>) -> usize {
    ANSWER.len() + 1 + if reader.is_some() { 4 } else { 0 }
}

/// The subscriber's reading of the shared ring it was answered with.
fn attach(fds: RingFds, reader: u32, verify: bool, file: &File) {
    let ino = |fd: &OwnedFd| rustix::fs::fstat(fd).expect("fstat").st_ino;
    let same = ino(&fds.memfd) == ino(&file.fd);
    assert!(
        same,
        "the answer's first descriptor is the memfd that was sent"
    );
    let (head, len, sealed) = (&file.head, file.len, file.sealed);
    // The reader block's consumer index, where the subscriber starts: past `MAX_INDEX` no
    // ring counts, and the attach refuses it.
    let start = |r: u32| {
        let mut b = [0u8; 8];
        let n = rustix::io::pread(&file.fd, &mut b, 192 + 256 * u64::from(r)).unwrap_or(0);
        (n == 8).then(|| u64::from_le_bytes(b))
    };
    let want = expected_layout(head, len).filter(|shape| {
        sealed && reader < shape.readers && start(reader).is_some_and(|i| i <= MAX_INDEX)
    });
    let mut c = match RingConsumer::attach(fds, reader, verify) {
        Ok(c) => c,
        Err(e) => {
            assert!(want.is_none(), "a valid ring was refused: {e}");
            if !sealed {
                assert!(matches!(e, RingError::NotSealed(_)), "{e}");
            }
            return;
        }
    };
    let want = want.expect("attached a ring the table refuses");
    let l = c.layout();
    assert_eq!(
        (l.slot_count, l.slot_size, l.slots_offset, l.readers),
        (want.slots, want.slot_size, want.slots_offset, want.readers)
    );
    assert_eq!(l.total_len, len);
    // Whatever the agent wrote in its indices, flags and records: an answer, not a fault or
    // a wait.
    let _ = c.take(Duration::ZERO).map(|view| view.map(|v| v.len()));
}

fuzz_target!(|data: &[u8]| {
    let Some((head, rest)) = data.split_first_chunk::<6>() else {
        return;
    };
    let flags = head[0];
    let file_len =
        u64::from(u32::from_le_bytes([head[1], head[2], head[3], head[4]])) % (MAX_FILE + 1);
    let msg_len = usize::from(head[5]).min(rest.len());
    let (msg, contents) = rest.split_at(msg_len);
    let (sealed, verify) = (flags & 1 != 0, flags & 8 != 0);
    // Descriptors ride on bytes: an empty message carries none.
    let nfds = if msg.is_empty() {
        0
    } else {
        usize::from(flags >> 1) % 4 + usize::from(flags & 16 != 0)
    };
    let file = ring_file(file_len, contents, sealed);

    let (subscriber, agent) = UnixStream::pair().expect("socketpair");
    let (w1, w2, extra) = (eventfd(), eventfd(), eventfd());
    let all = [file.fd.as_fd(), w1.as_fd(), w2.as_fd(), extra.as_fd()];
    if nfds == 0 {
        std::io::Write::write_all(&mut &agent, msg).expect("send the answer");
    } else {
        send_fds(&agent, &all[..nfds], msg).expect("send the answer");
    }
    drop(agent);

    let want = expected_answer(msg, nfds);
    let got = Answer::recv(&subscriber);
    let mut left = Vec::new();
    (&subscriber).read_to_end(&mut left).expect("read the rest");
    match (got, want) {
        (Ok(None), Ok(None)) => assert_eq!(left, msg, "a refusal's message is left whole"),
        (Ok(Some(Answer::Own)), Ok(Some(None))) => assert_eq!(left, &msg[answer_len(None)..]),
        (Ok(Some(Answer::Reader { fds, reader })), Ok(Some(Some(r)))) => {
            assert_eq!(reader, r);
            assert_eq!(left, &msg[answer_len(Some(r))..]);
            attach(fds, reader, verify, &file);
        }
        (Err(RingError::Handshake(m)), Err(())) => {
            assert!(m.starts_with("the agent's answer: "), "{m}")
        }
        (got, want) => {
            panic!("answer {got:?} where {want:?} was due, for {msg:?} with {nfds} descriptors")
        }
    }
});
