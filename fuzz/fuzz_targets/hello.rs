//! The hello a data connection opens with, read as the agent reads it: one frame into a
//! 4096-byte buffer (a connection that has not said who it is never gets a 1 MiB one), then
//! `Hello::parse`. The first frame must be read as the format table says (a payload over the
//! small buffer is refused as too large, not read), a hello is accepted exactly when it is 32
//! bytes starting with `DQHELLO1`, or `DQHELLO2` and those 24 bytes with a u16 length and a
//! UTF-8 token of that many bytes (at most `MAX_TOKEN_LEN`), and an accepted hello re-encodes
//! to the bytes it came from.
//!
//! Each input runs three ways: as the raw byte stream, with its frame checksums recomputed,
//! and as the payload of a valid frame (how the fuzzer reaches `Hello::parse` directly). The
//! same parse also takes the bytes a ring offer carries after its tag (`RingOffer::receive`),
//! which come without a frame.
#![no_main]

use dquant_fuzz::{expected_frames, fix_frame_checksums, framed, pool, variant, Expected};
use dquant_transport::record::{HELLO_LEN, HELLO_MAGIC, HELLO_TOKEN_MAGIC, MAX_TOKEN_LEN};
use dquant_transport::{FrameReader, Hello, WireError};
use libfuzzer_sys::fuzz_target;

/// The agent's hello buffer (`dquant-agent`'s `data::HELLO_BUF`).
const HELLO_BUF: usize = 4096;

/// The format table's rule, written independently of `Hello::parse`.
fn well_formed(p: &[u8]) -> bool {
    if p.len() == HELLO_LEN && p[..8] == HELLO_MAGIC {
        return true;
    }
    if p.len() < HELLO_LEN + 2 || p[..8] != HELLO_TOKEN_MAGIC {
        return false;
    }
    let n = u16::from_le_bytes([p[HELLO_LEN], p[HELLO_LEN + 1]]) as usize;
    n <= MAX_TOKEN_LEN
        && p.len() == HELLO_LEN + 2 + n
        && std::str::from_utf8(&p[HELLO_LEN + 2..]).is_ok()
}

fn parse_hello(p: &[u8]) {
    let valid = well_formed(p);
    match Hello::parse(p) {
        Ok(h) => {
            assert!(valid);
            assert_eq!(&h.encode()[..], p);
            assert_eq!(Hello::parse(&h.encode()).ok(), Some(h.clone()));
            assert_eq!(h.token.is_some(), p[..8] == HELLO_TOKEN_MAGIC);
        }
        Err(e) => {
            assert!(!valid, "a well-formed hello was refused: {e}");
            assert!(e.to_string().contains(&format!("got {} bytes", p.len())));
        }
    }
}

fn read_hello(s: &[u8]) {
    let pool = pool(HELLO_BUF);
    let mut buf = pool.get();
    let mut r = FrameReader::new(s);
    let got = r.next_into(&mut buf);
    let want = expected_frames(s, HELLO_BUF);
    match (got, want) {
        (Ok(true), Expected::End(d, _) | Expected::Remote(d, _) | Expected::Refused(d, _)) => {
            assert_eq!(d.first().map(Vec::as_slice), Some(&buf[..]));
            parse_hello(&buf);
        }
        (Ok(false), Expected::End(d, summary)) => {
            assert!(d.is_empty());
            assert_eq!(summary, &buf[..]);
        }
        (Err(WireError::Remote(m)), Expected::Remote(d, want)) => {
            assert!(d.is_empty());
            assert_eq!(m, want);
        }
        (Err(e), Expected::Refused(d, want)) if d.is_empty() => assert_eq!(variant(&e), want),
        (got, want) => panic!("reader gave {got:?}, the format says {want:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    parse_hello(data);
    read_hello(data);
    let mut fixed = data.to_vec();
    fix_frame_checksums(&mut fixed);
    read_hello(&fixed);
    read_hello(&framed([data], true));
});
