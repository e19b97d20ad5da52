//! Helpers the fuzz targets share: getting fuzzed bytes past the data plane's checksums, and
//! an independent reading of the frame format to compare the real reader with.
//!
//! Random bytes almost never carry a right crc32c, so a target that fed them to the frame
//! reader as they are would spend its time on the first checksum. Each stream target therefore
//! also tries the input with every checksum recomputed where the bytes themselves put it
//! ([`fix_frame_checksums`]), or with its bytes wrapped into valid frames by the real writer
//! ([`framed`]), so mutations reach the record, hello and request parsers behind the frames.

pub mod plan;
pub mod ring;

use dquant_transport::frame::{FrameHeader, FrameKind, HEADER_LEN, MAGIC, MAX_PAYLOAD};
use dquant_transport::{BufferPool, FrameWriter};

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}

/// Recomputes, in place, the header and payload crc32c of every frame of a byte stream, the
/// frames delimited by their own length fields. Lengths over [`MAX_PAYLOAD`] and a last frame
/// cut short are left as they are (the reader must refuse them whatever their checksums).
pub fn fix_frame_checksums(s: &mut [u8]) {
    let mut at = 0;
    while s.len().saturating_sub(at) >= HEADER_LEN {
        let len = u32_at(s, at + 16) as usize;
        let body = at + HEADER_LEN;
        if len <= MAX_PAYLOAD && body + len <= s.len() {
            let c = crc32c::crc32c(&s[body..body + len]);
            s[at + 20..at + 24].copy_from_slice(&c.to_le_bytes());
        }
        let c = crc32c::crc32c(&s[at..at + 28]);
        s[at + 28..at + 32].copy_from_slice(&c.to_le_bytes());
        if len > MAX_PAYLOAD {
            return;
        }
        at = body + len;
    }
}

/// `payloads` as the real writer frames them: one data frame each, then an end frame when
/// `end` is set (else the stream stops without one, as a connection that drops does).
pub fn framed<'a>(payloads: impl IntoIterator<Item = &'a [u8]>, end: bool) -> Vec<u8> {
    let mut w = FrameWriter::new(Vec::new());
    for p in payloads {
        w.send(FrameKind::Data, &p[..p.len().min(MAX_PAYLOAD)])
            .expect("a payload within MAX_PAYLOAD frames");
    }
    if end {
        w.finish(b"").expect("writing to a Vec cannot fail");
    }
    w.get_ref().clone()
}

/// Splits `data` into at most `max` chunks at the separator byte sequence `sep`: how the
/// targets that frame their input choose frame boundaries the fuzzer can move.
pub fn split_chunks<'a>(data: &'a [u8], sep: &[u8], max: usize) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut rest = data;
    while out.len() + 1 < max {
        match rest.windows(sep.len()).position(|w| w == sep) {
            Some(i) => {
                out.push(&rest[..i]);
                rest = &rest[i + sep.len()..];
            }
            None => break,
        }
    }
    out.push(rest);
    out
}

/// What a frame reader must make of a byte stream, read from the format table in
/// `dquant_transport::frame` independently of `FrameHeader::parse`.
#[derive(Debug, PartialEq, Eq)]
pub enum Expected {
    /// Data frames, in order, then the end frame's summary.
    End(Vec<Vec<u8>>, Vec<u8>),
    /// Data frames, then an error frame with this (lossy UTF-8) message.
    Remote(Vec<Vec<u8>>, String),
    /// Data frames, then a stream the reader must refuse, with the `WireError` variant name.
    Refused(Vec<Vec<u8>>, &'static str),
}

/// The spec reading of `s` by a reader whose buffer holds `cap` bytes.
pub fn expected_frames(s: &[u8], cap: usize) -> Expected {
    let mut data = Vec::new();
    let mut at = 0;
    let mut seq = 0u64;
    loop {
        if s.len() - at < HEADER_LEN {
            return Expected::Refused(data, "Truncated");
        }
        let h = &s[at..at + HEADER_LEN];
        if h[..4] != MAGIC {
            return Expected::Refused(data, "BadMagic");
        }
        if crc32c::crc32c(&h[..28]) != u32_at(h, 28) {
            return Expected::Refused(data, "HeaderChecksum");
        }
        if !(1..=3).contains(&h[4]) {
            return Expected::Refused(data, "UnknownKind");
        }
        if u64_at(h, 8) != seq {
            return Expected::Refused(data, "Sequence");
        }
        let len = u32_at(h, 16) as usize;
        if len > MAX_PAYLOAD || len > cap {
            return Expected::Refused(data, "TooLarge");
        }
        let body = at + HEADER_LEN;
        if s.len() - body < len {
            return Expected::Refused(data, "Truncated");
        }
        let p = &s[body..body + len];
        if crc32c::crc32c(p) != u32_at(h, 20) {
            return Expected::Refused(data, "PayloadChecksum");
        }
        match h[4] {
            1 => data.push(p.to_vec()),
            2 => return Expected::End(data, p.to_vec()),
            _ => return Expected::Remote(data, String::from_utf8_lossy(p).into_owned()),
        }
        at = body + len;
        seq += 1;
    }
}

/// The name of a `WireError` variant, to compare with [`Expected::Refused`].
pub fn variant(e: &dquant_transport::WireError) -> &'static str {
    use dquant_transport::WireError as W;
    match e {
        W::BadMagic(_) => "BadMagic",
        W::HeaderChecksum { .. } => "HeaderChecksum",
        W::UnknownKind { .. } => "UnknownKind",
        W::TooLarge { .. } => "TooLarge",
        W::Sequence { .. } => "Sequence",
        W::PayloadChecksum { .. } => "PayloadChecksum",
        W::Truncated { .. } => "Truncated",
        W::PayloadTooLarge(_) => "PayloadTooLarge",
        W::Remote(_) => "Remote",
        W::Io(_) => "Io",
        W::Record(_) => "Record",
        W::EndInRecord(_) => "EndInRecord",
    }
}

/// One frame header re-encoded from its parsed form: parse → encode → parse must give the
/// same header, and the same bytes whenever the reserved bytes were zero.
pub fn check_header_round_trip(h: &[u8; HEADER_LEN], seq: u64) {
    let Ok(p) = FrameHeader::parse(h, seq) else {
        return;
    };
    let again = p.encode();
    assert_eq!(FrameHeader::parse(&again, seq).ok(), Some(p));
    if h[5..8] == [0; 3] && h[24..28] == [0; 4] {
        assert_eq!(
            &again, h,
            "a header with zero reserved bytes re-encodes to itself"
        );
    }
}

/// One pool per buffer size for the life of the process: a pool allocates (and zeroes) its
/// buffers up front, which per run would cost more than the parsing under test.
pub fn pool(size: usize) -> BufferPool {
    use std::sync::{Mutex, OnceLock};
    static POOLS: OnceLock<Mutex<Vec<BufferPool>>> = OnceLock::new();
    let mut pools = POOLS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(p) = pools.iter().find(|p| p.buffer_size() == size) {
        return p.clone();
    }
    let p = BufferPool::new(1, size);
    pools.push(p.clone());
    p
}
