//! An S3 root against a real server that misbehaves: connections dropped mid-body (retried,
//! a bounded number of times), a server that stalls (timed out), objects replaced or
//! truncated under a reader (refused, never mixed); and what the readahead asks of it.

use std::time::{Duration, Instant};

use dquant_objstore::{ObjectRoot, S3Location, S3Settings};
use dquant_storage::{ReadAt, Root, RootError};
use dquant_testkit::s3::{Fault, FaultProxy, S3Server, ACCESS_KEY, SECRET_KEY};

const MIB: usize = 1 << 20;

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 131 % 251) as u8).collect()
}

/// `s3://lab/data` at `endpoint`, 256 KiB parts, 1 MiB ahead, 1 s timeouts.
fn root(endpoint: String, max_retries: usize) -> ObjectRoot {
    let s = S3Settings {
        endpoint: Some(endpoint),
        access_key_id: Some(ACCESS_KEY.into()),
        secret_access_key: Some(SECRET_KEY.into()),
        part_bytes: 256 << 10,
        readahead_bytes: MIB as u64,
        connect_timeout_secs: 1,
        read_timeout_secs: 1,
        request_timeout_secs: 5,
        max_retries,
        ..S3Settings::default()
    };
    ObjectRoot::s3(&S3Location::parse("s3://lab/data").unwrap(), &s).unwrap()
}

fn read(f: &dyn ReadAt, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, offset)?;
    Ok(buf)
}

/// The error of a read that must fail (without printing the bytes if it does not).
fn read_err(f: &dyn ReadAt, offset: u64, len: usize) -> std::io::Error {
    match read(f, offset, len) {
        Ok(_) => panic!("{len} bytes at {offset} read, but the read must fail"),
        Err(e) => e,
    }
}

#[test]
fn sequential_reads_are_read_ahead_once_and_random_reads_fetch_only_their_bytes() {
    let server = S3Server::start();
    let data = pattern(8 * MIB);
    server.put("lab", "data/big", &data);
    let root = root(server.endpoint(), 0);
    let f = root.open("big").unwrap();
    assert_eq!(root.stats().heads, 1);
    // 100 KiB at a time, sample-like: each read starts one byte before the last ended.
    let mut at = 0usize;
    while at < data.len() {
        let n = (100 << 10).min(data.len() - at);
        assert_eq!(
            read(&*f, at as u64, n).unwrap(),
            data[at..at + n],
            "at {at}"
        );
        at += n - 1;
        if n < 100 << 10 {
            break;
        }
    }
    let s = root.stats();
    // The first read is fetched on its own; from the second on, 256 KiB parts, each once.
    assert_eq!(
        s.bytes,
        (100 << 10) + data.len() as u64 - ((100 << 10) - 1),
        "{s:?}"
    );
    assert_eq!(s.gets, 1 + 32, "{s:?}");
    // Far-apart reads of a second reader: exactly their bytes, one GET each.
    let g = root.open("big").unwrap();
    for off in [5 * MIB, MIB, 7 * MIB, 3 * MIB] {
        assert_eq!(read(&*g, off as u64, 1000).unwrap(), data[off..off + 1000]);
    }
    let t = root.stats();
    assert_eq!((t.gets - s.gets, t.bytes - s.bytes), (4, 4000), "{t:?}");
    // A read longer than a part is split into parts fetched together.
    assert_eq!(read(&*g, 10, 3 * MIB).unwrap(), data[10..10 + 3 * MIB]);
    assert_eq!(root.stats().gets - t.gets, 12);
}

#[test]
fn connections_dropped_mid_body_are_retried() {
    let server = S3Server::start();
    let data = pattern(3 * MIB);
    server.put("lab", "data/obj", &data);
    // Every connection cut after 100 KiB of response, twice; then they pass.
    let proxy = FaultProxy::start(
        server.addr(),
        Fault::Cut {
            after: 100 << 10,
            times: 2,
        },
    );
    let root = root(proxy.endpoint(), 3);
    let f = root.open("obj").unwrap();
    assert_eq!(read(&*f, 0, data.len()).unwrap(), data);
    assert_eq!(proxy.cuts(), 2);
}

#[test]
fn a_connection_always_dropped_fails_after_the_retries() {
    let server = S3Server::start();
    server.put("lab", "data/obj", &pattern(MIB));
    // Every connection is cut after 10 KiB of responses (the HEAD's fits).
    let proxy = FaultProxy::start(
        server.addr(),
        Fault::Cut {
            after: 10 << 10,
            times: usize::MAX,
        },
    );
    let root = root(proxy.endpoint(), 2);
    let f = root.open("obj").unwrap();
    let t = Instant::now();
    let e = read_err(&*f, 0, 200 << 10);
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    assert!(e.to_string().starts_with("GET bytes 0..204800: "), "{e}");
    // The first try and at most two retries (the connection pool may reuse none of them).
    assert!((1..=3).contains(&proxy.cuts()), "{}", proxy.cuts());
    // Once the server behaves, the same reader reads.
    proxy.set(Fault::Pass);
    assert_eq!(read(&*f, 0, 1000).unwrap(), pattern(1000));
}

#[test]
fn a_stalled_server_times_out() {
    let server = S3Server::start();
    server.put("lab", "data/obj", &pattern(MIB));
    let proxy = FaultProxy::start(server.addr(), Fault::Stall);
    let root = root(proxy.endpoint(), 1);
    let t = Instant::now();
    let e = root.stat("obj").unwrap_err();
    let waited = t.elapsed();
    assert!(matches!(e, RootError::Io { .. }), "{e:?}");
    assert!(e.to_string().starts_with("obj: "), "{e}");
    // Two tries of about a second each (plus back-off), not the 120 s default.
    assert!(waited < Duration::from_secs(15), "{waited:?}");
    assert!(waited >= Duration::from_secs(1), "{waited:?}");
}

#[test]
fn an_object_replaced_under_a_reader_fails_its_reads() {
    let server = S3Server::start();
    let data = pattern(MIB);
    let path = server.put("lab", "data/obj", &data);
    let root = root(server.endpoint(), 0);
    let f = root.open("obj").unwrap();
    assert_eq!(read(&*f, 0, 10).unwrap(), data[..10]);
    // Same length, other bytes: another ETag.
    let mut other = data.clone();
    other[5] ^= 1;
    std::fs::write(&path, &other).unwrap();
    let e = read_err(&*f, 100_000, 10);
    assert!(
        e.to_string()
            .contains("the object changed since it was opened (ETag "),
        "{e}"
    );
    // Truncated: a read of what is no longer there fails, whatever the server says.
    std::fs::write(&path, &data[..1000]).unwrap();
    assert!(read(&*f, 500_000, 10).is_err());
    // Reopened, the object is what it is now.
    let g = root.open("obj").unwrap();
    assert_eq!(g.len(), 1000);
    assert_eq!(read(&*g, 0, 1000).unwrap(), data[..1000]);
}

#[test]
fn missing_objects_and_buckets_are_not_found() {
    let server = S3Server::start();
    server.bucket("lab");
    let root = root(server.endpoint(), 0);
    assert!(matches!(root.stat("nope"), Err(RootError::NotFound { .. })));
    assert_eq!(root.objects().unwrap(), vec![]);
}

#[test]
fn reads_slightly_out_of_order_are_fetched_once() {
    let server = S3Server::start();
    let data = pattern(8 * MIB);
    server.put("lab", "data/big", &data);
    let root = root(server.endpoint(), 0);
    let f = root.open("big").unwrap();
    // Samples of 100 KiB read as a two-thread pool reads a batch: 0, 2, 1, 4, 3, 6, 5, ...
    let piece = 100 << 10;
    let n = data.len() / piece;
    let mut order: Vec<usize> = vec![0];
    for k in (1..n).step_by(2) {
        order.extend([k + 1, k].iter().filter(|&&i| i < n));
    }
    for &i in &order {
        assert_eq!(
            read(&*f, (i * piece) as u64, piece).unwrap(),
            data[i * piece..(i + 1) * piece]
        );
    }
    let s = root.stats();
    // Every part once, plus the stragglers fetched on their own (at most one per sample).
    assert!(
        s.bytes <= (n * piece) as u64 + (n as u64 / 2 + 2) * piece as u64 / 2 + (256 << 10),
        "{s:?}"
    );
    assert!(
        s.bytes < (n * piece) as u64 * 13 / 10,
        "fetched {} for {}",
        s.bytes,
        n * piece
    );
}

#[test]
fn announced_reads_are_fetched_at_once_and_sequential_ones_left_to_the_readahead() {
    let server = S3Server::start();
    let data = pattern(8 * MIB);
    server.put("lab", "data/big", &data);
    let root = root(server.endpoint(), 0);
    let f = root.open("big").unwrap();
    // A shuffled batch: far-apart samples of 4000 bytes, and two within 64 KiB of each other.
    let starts = [
        6 * MIB,
        100_000,
        3 * MIB,
        5 * MIB,
        5 * MIB + 30_000,
        7 * MIB,
    ];
    let ranges: Vec<std::ops::Range<u64>> =
        starts.iter().map(|&s| s as u64..s as u64 + 4000).collect();
    f.will_read(&ranges);
    let s = root.stats();
    assert_eq!(s.gets, 5, "one GET per range, the close two merged: {s:?}");
    for r in &ranges {
        let (a, b) = (r.start as usize, r.end as usize);
        assert_eq!(read(&*f, r.start, 4000).unwrap(), data[a..b]);
    }
    let s = root.stats();
    assert_eq!(
        s.gets, 5,
        "the reads were served by the announced GETs: {s:?}"
    );
    assert_eq!(s.bytes, 4 * 4000 + 34_000);
    // An unshuffled batch's ranges go on from one another: nothing is fetched ahead of them.
    let seq: Vec<std::ops::Range<u64>> = (0..8u64).map(|i| i * 4000..(i + 1) * 4000 + 1).collect();
    f.will_read(&seq);
    assert_eq!(root.stats().gets, 5);
}
