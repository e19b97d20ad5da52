//! Frames over real loopback TCP: data integrity, back-pressure, and every way a stream can be
//! bad, each with its exact error.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::thread;

use dquant_transport::frame::{FrameHeader, MAX_PAYLOAD};

use crate::common::payload;
use dquant_transport::{BufferPool, FrameKind, FrameReader, FrameWriter, WireError};

/// Runs `server` on one end of a loopback connection and returns the client end.
fn pair(server: impl FnOnce(TcpStream) + Send + 'static) -> (TcpStream, thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let h = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        server(s)
    });
    (TcpStream::connect(addr).unwrap(), h)
}

fn read_all(s: TcpStream, pool: &BufferPool) -> Result<Vec<Vec<u8>>, WireError> {
    let mut r = FrameReader::new(s);
    let mut out = Vec::new();
    let mut buf = pool.get();
    while r.next_into(&mut buf)? {
        out.push(buf.to_vec());
    }
    Ok(out)
}

#[test]
fn frames_arrive_intact_in_order() {
    let sizes: Vec<usize> = (0..60)
        .map(|i| [0, 1, 4096, MAX_PAYLOAD, 777_777][i % 5])
        .collect();
    let s2 = sizes.clone();
    let (c, h) = pair(move |s| {
        let mut w = FrameWriter::new(std::io::BufWriter::new(s));
        for (i, &n) in s2.iter().enumerate() {
            w.send(FrameKind::Data, &payload(i as u64, n)).unwrap();
        }
        w.finish(b"done").unwrap();
    });
    let pool = BufferPool::new(2, MAX_PAYLOAD);
    let got = read_all(c, &pool).unwrap();
    h.join().unwrap();
    assert_eq!(got.len(), sizes.len());
    for (i, (g, &n)) in got.iter().zip(&sizes).enumerate() {
        assert_eq!(*g, payload(i as u64, n), "frame {i}");
    }
    assert_eq!(pool.available(), 2, "every buffer went back");
}

#[test]
fn remote_errors_surface_verbatim() {
    let (c, h) = pair(|s| {
        let mut w = FrameWriter::new(s);
        w.send(FrameKind::Data, b"abc").unwrap();
        w.fail("sources[0]: token 70000 at offset 12 does not fit in u16")
            .unwrap();
    });
    let e = read_all(c, &BufferPool::new(1, 64)).unwrap_err();
    h.join().unwrap();
    assert_eq!(
        e.to_string(),
        "sources[0]: token 70000 at offset 12 does not fit in u16"
    );
}

fn raw_server(bytes: Vec<u8>) -> (TcpStream, thread::JoinHandle<()>) {
    pair(move |mut s| {
        s.write_all(&bytes).unwrap();
    })
}

fn frame_bytes(kind: FrameKind, seq: u64, p: &[u8]) -> Vec<u8> {
    let mut v = FrameHeader::for_payload(kind, seq, p)
        .unwrap()
        .encode()
        .to_vec();
    v.extend_from_slice(p);
    v
}

#[test]
fn bad_streams_give_exact_errors() {
    let pool = BufferPool::new(1, MAX_PAYLOAD);
    let cases: Vec<(Vec<u8>, String)> = vec![
        (
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n......".to_vec(),
            "data stream: bad frame magic [47, 45, 54, 20] (not a dquant data stream, or out of sync)".into(),
        ),
        (Vec::new(), "data stream: connection closed after 0 complete frames, without an end frame".into()),
        (
            frame_bytes(FrameKind::Data, 0, b"x")[..20].to_vec(),
            "data stream: connection closed after 0 complete frames, without an end frame".into(),
        ),
        (
            [frame_bytes(FrameKind::Data, 0, b"first"), frame_bytes(FrameKind::Data, 1, &[7; 100])[..80].to_vec()].concat(),
            "data stream: connection closed after 1 complete frames, without an end frame".into(),
        ),
        (
            [frame_bytes(FrameKind::Data, 0, b"a"), frame_bytes(FrameKind::Data, 2, b"b")].concat(),
            "data stream: expected frame 1, got frame 2 (frames lost or repeated)".into(),
        ),
        (
            {
                let mut f = frame_bytes(FrameKind::Data, 0, b"payload");
                let n = f.len();
                f[n - 1] ^= 0x10;
                f
            },
            format!(
                "data stream: payload checksum mismatch in frame 0: stored {:#010x}, computed {:#010x}",
                crc32c::crc32c(b"payload"),
                crc32c::crc32c(b"payloat")
            ),
        ),
    ];
    for (bytes, want) in cases {
        let (c, h) = raw_server(bytes);
        let e = read_all(c, &pool).unwrap_err();
        h.join().unwrap();
        assert_eq!(e.to_string(), want);
    }
}

#[test]
fn a_slow_consumer_stalls_the_producer_without_loss() {
    // The consumer holds every pool buffer for a while before releasing them: nothing is lost,
    // nothing is allocated beyond the pool.
    let n = 40;
    let (c, h) = pair(move |s| {
        let mut w = FrameWriter::new(s);
        for i in 0..n {
            w.send(FrameKind::Data, &payload(i as u64, 65536)).unwrap();
        }
        w.finish(&[]).unwrap();
    });
    let pool = BufferPool::new(3, MAX_PAYLOAD);
    let mut r = FrameReader::new(c);
    let mut held = Vec::new();
    let mut got = 0;
    loop {
        let mut buf = pool
            .get_timeout(std::time::Duration::from_millis(5))
            .unwrap_or_else(|| {
                thread::sleep(std::time::Duration::from_millis(20));
                held.clear();
                pool.get()
            });
        if !r.next_into(&mut buf).unwrap() {
            break;
        }
        assert_eq!(*buf, payload(got as u64, 65536)[..]);
        got += 1;
        held.push(buf);
    }
    h.join().unwrap();
    assert_eq!(got, n);
}
