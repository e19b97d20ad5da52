//! Data-plane frames: a byte stream from a peer, read by `FrameReader` as every receiver
//! reads it (1 MiB buffer), must give exactly what the format table says, frame by frame:
//! the same data payloads in order, then the same end summary, error message or refusal
//! (compared with `dquant_fuzz::expected_frames`, an independent reading of the table).
//! Every header the reader accepted re-encodes to itself (parse → encode → parse).
//!
//! Each input runs as it is and again with every checksum recomputed, so mutations reach the
//! checks behind the crc32c (kind, sequence, length, truncation).
#![no_main]

use dquant_fuzz::Expected;
use dquant_fuzz::{check_header_round_trip, expected_frames, fix_frame_checksums, pool, variant};
use dquant_transport::frame::{HEADER_LEN, MAX_PAYLOAD};
use dquant_transport::{FrameReader, WireError};
use libfuzzer_sys::fuzz_target;

fn check(s: &[u8]) {
    let want = expected_frames(s, MAX_PAYLOAD);
    let pool = pool(MAX_PAYLOAD);
    let mut buf = pool.get();
    let mut r = FrameReader::new(s);
    let mut data = Vec::new();
    let mut at = 0;
    let got = loop {
        let seq = r.frames();
        match r.next_into(&mut buf) {
            Ok(true) => {
                let h: &[u8; HEADER_LEN] = s[at..at + HEADER_LEN].try_into().unwrap();
                check_header_round_trip(h, seq);
                assert_eq!(r.frames(), seq + 1);
                at += HEADER_LEN + buf.len();
                data.push(buf.to_vec());
            }
            Ok(false) => {
                let summary = buf.to_vec();
                // An ended reader stays ended, and hands out nothing more.
                assert!(matches!(r.next_into(&mut buf), Ok(false)));
                assert!(buf.is_empty());
                break Expected::End(data, summary);
            }
            Err(WireError::Remote(m)) => break Expected::Remote(data, m),
            Err(e) => break Expected::Refused(data, variant(&e)),
        }
    };
    assert_eq!(got, want);
}

fuzz_target!(|data: &[u8]| {
    check(data);
    let mut fixed = data.to_vec();
    fix_frame_checksums(&mut fixed);
    check(&fixed);
});
