//! Range requests, read as a source session on the agent reads them (`serve_ranges`): frames
//! into a 1 MiB buffer, each parsed with `parse_request` until the first that fails. A
//! request is accepted exactly when it is `DQRQ`, a u32 count and that many 16-byte pairs;
//! the pairs are the ones in the bytes, and re-encode (`encode_request`) to the payload they
//! came from. Frames must be read as the format table says.
//!
//! Each input runs as the raw byte stream, with its frame checksums recomputed, and split at
//! `\n--\n` into payloads of valid frames (how the fuzzer reaches the request parser, and
//! sends several requests on one connection).
#![no_main]

use dquant_fuzz::Expected;
use dquant_fuzz::{expected_frames, fix_frame_checksums, framed, pool, split_chunks, variant};
use dquant_transport::frame::MAX_PAYLOAD;
use dquant_transport::record::{encode_request, parse_request, MAX_REQUEST_RANGES, REQUEST_MAGIC};
use dquant_transport::{FrameReader, WireError};
use libfuzzer_sys::fuzz_target;

/// Checks one request payload; false when the agent would end the session on it.
fn request(p: &[u8], ranges: &mut Vec<(u64, u64)>) -> bool {
    let well_formed = p.len() >= 8
        && p[..4] == REQUEST_MAGIC
        && p.len() as u64 == 8 + 16 * u64::from(u32::from_le_bytes([p[4], p[5], p[6], p[7]]));
    match parse_request(p, ranges) {
        Ok(()) => {
            assert!(well_formed);
            assert!(ranges.len() <= MAX_REQUEST_RANGES);
            for (i, &(start, len)) in ranges.iter().enumerate() {
                let at = 8 + 16 * i;
                assert_eq!(start.to_le_bytes(), p[at..at + 8]);
                assert_eq!(len.to_le_bytes(), p[at + 8..at + 16]);
            }
            let mut again = Vec::new();
            encode_request(ranges, &mut again);
            assert_eq!(again, p);
            true
        }
        Err(e) => {
            assert!(!well_formed, "a well-formed request was refused: {e}");
            assert!(ranges.is_empty());
            false
        }
    }
}

fn serve(s: &[u8]) {
    let want = expected_frames(s, MAX_PAYLOAD);
    let pool = pool(MAX_PAYLOAD);
    let mut req = pool.get();
    let mut frames = FrameReader::new(s);
    let mut ranges = Vec::new();
    let mut got = Vec::new();
    let end = loop {
        match frames.next_into(&mut req) {
            Ok(true) => {}
            Ok(false) => break None,
            Err(WireError::Remote(m)) => break Some(Err(m)),
            Err(e) => break Some(Ok(variant(&e))),
        }
        got.push(req.to_vec());
        if !request(&req, &mut ranges) {
            // The agent sends an error frame and ends the session here.
            return;
        }
    };
    match (end, want) {
        (None, Expected::End(d, _)) => assert_eq!(got, d),
        (Some(Err(m)), Expected::Remote(d, want)) => assert_eq!((got, m), (d, want)),
        (Some(Ok(v)), Expected::Refused(d, want)) => assert_eq!((got, v), (d, want)),
        (end, want) => panic!("reader ended with {end:?} after {got:?}, the format says {want:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    serve(data);
    let mut fixed = data.to_vec();
    fix_frame_checksums(&mut fixed);
    serve(&fixed);
    let chunks = split_chunks(data, b"\n--\n", 64);
    serve(&framed(
        chunks.iter().copied(),
        data.first().is_some_and(|b| b & 1 == 0),
    ));
});
