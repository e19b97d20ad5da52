//! Records on a data stream, read as their consumers read them: batch records as the client's
//! reader does over TCP (`RecordReader`, `BatchHeader::parse`, the plan's shape check,
//! `check_payload_len`, then a decode of the wire codec), and range records as a chained
//! agent's `RemoteSource` does (`RangeHeader::parse`, the requested range, the same bound and
//! decode). Beyond not panicking and never allocating more than the plan or request allows:
//!
//! * every header parsed re-encodes to an equal header, and to its own bytes when the
//!   reserved ones were zero;
//! * a payload's codec bytes round-trip (`Codec::to_bytes`);
//! * decoded tokens re-encode with the record's codec to a payload that decodes to the same
//!   tokens, byte-identical for the plain byte-aligned widths.
//!
//! Input: 4 bytes choose the consumer (record kind, the plan's `seq_len`/`batch_size` or the
//! requested range length), the rest is the byte stream. It runs as it is, with its frame
//! checksums recomputed, and split at `\n--\n` into payloads of valid frames (so the fuzzer
//! spends its time on records, not on checksums).
#![no_main]

use dquant_codec::{Codec, Compression, Decoder, Encoder, Width};
use dquant_fuzz::{fix_frame_checksums, framed, split_chunks};
use dquant_transport::record::{MAX_RANGE_TOKENS, RECORD_HEADER_LEN};
use dquant_transport::{BatchHeader, RangeHeader, RecordReader};
use libfuzzer_sys::fuzz_target;

/// Who reads the stream.
#[derive(Clone, Copy)]
enum Consumer {
    /// A client whose plan has batches of up to `batch_size` samples of `sample_len` tokens.
    Client { sample_len: u32, batch_size: u32 },
    /// A chained agent that asked for ranges of `len` tokens.
    Remote { len: u64 },
}

/// Decodes `payload` into `n` tokens of `codec`, and checks that they re-encode.
fn decode(codec: Codec, payload: &[u8], n: usize) {
    assert_eq!(Codec::from_bytes(codec.to_bytes()), Some(codec));
    let mut tokens = vec![0u32; n];
    if Decoder::new().decode(codec, payload, &mut tokens).is_err() {
        return;
    }
    // A record's zstd level byte may be one no encoder takes (0, or over 22): only decoding
    // must work for those. A stream codec's payload decoded here started its lane (a fresh
    // decoder refuses any other), and re-encodes as a lane's start.
    let Ok(mut enc) = Encoder::new(codec) else {
        assert!(matches!(
            codec.compression,
            Compression::Zstd(_) | Compression::Stream(_)
        ));
        return;
    };
    let mut again = Vec::new();
    enc.encode(&tokens, &mut again)
        .expect("decoded tokens fit the codec they came in");
    let mut back = vec![0u32; n];
    Decoder::new()
        .decode(codec, &again, &mut back)
        .expect("an encoded payload decodes");
    assert_eq!(back, tokens);
    if codec.compression == Compression::None && !matches!(codec.width, Width::Bits(_)) {
        assert_eq!(again, payload);
    }
}

fn header_round_trip(hb: &[u8; RECORD_HEADER_LEN]) {
    if let Ok(h) = BatchHeader::parse(hb) {
        assert_eq!(BatchHeader::parse(&h.encode()).ok(), Some(h));
        if hb[28..32].iter().all(|&b| b == 0) {
            assert_eq!(&h.encode(), hb);
        }
    }
    if let Ok(h) = RangeHeader::parse(hb) {
        assert_eq!(RangeHeader::parse(&h.encode()).ok(), Some(h));
        if hb[28..].iter().all(|&b| b == 0) {
            assert_eq!(&h.encode(), hb);
        }
    }
}

fn read(stream: &[u8], consumer: Consumer) {
    let mut r = RecordReader::new(stream);
    // A stream of a few KiB holds a few dozen records at most; the bound keeps a run short.
    for _ in 0..64 {
        let Ok(Some(hb)) = r.next_header() else {
            return;
        };
        header_round_trip(&hb);
        let (codec, tokens, payload_len) = match consumer {
            Consumer::Client {
                sample_len,
                batch_size,
            } => {
                let Ok(h) = BatchHeader::parse(&hb) else {
                    return;
                };
                // The reader's check_shape: what the plan cannot produce is refused first.
                if h.sample_len != sample_len || h.samples == 0 || h.samples > batch_size {
                    return;
                }
                (h.codec, h.tokens(), h.payload_len)
            }
            Consumer::Remote { len } => {
                let Ok(h) = RangeHeader::parse(&hb) else {
                    return;
                };
                if h.len != len {
                    return;
                }
                (h.codec, len as usize, h.payload_len)
            }
        };
        if dquant_remote::check_payload_len(codec, tokens, payload_len).is_err() {
            return;
        }
        let mut payload = vec![0u8; payload_len as usize];
        if r.read_exact(&mut payload, "payload").is_err() {
            return;
        }
        decode(codec, &payload, tokens);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((shape, stream)) = data.split_first_chunk::<4>() else {
        return;
    };
    let consumer = if shape[3] & 1 == 0 {
        // Up to 64 samples of 4097 tokens: the size of a real batch, small enough to decode
        // thousands of times a second.
        Consumer::Client {
            sample_len: 1 + u32::from(u16::from_le_bytes([shape[0], shape[1]])) % 4097,
            batch_size: 1 + u32::from(shape[2] % 64),
        }
    } else {
        let len = 1 + u64::from(u16::from_le_bytes([shape[0], shape[1]]));
        assert!(len <= MAX_RANGE_TOKENS);
        Consumer::Remote { len }
    };
    read(stream, consumer);
    let mut fixed = stream.to_vec();
    fix_frame_checksums(&mut fixed);
    read(&fixed, consumer);
    let chunks = split_chunks(stream, b"\n--\n", 64);
    read(&framed(chunks.iter().copied(), true), consumer);
});
