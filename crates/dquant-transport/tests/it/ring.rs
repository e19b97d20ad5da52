//! The shared-memory ring end to end: threads, back-pressure, dying producers, fd passing,
//! hostile headers.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::{Duration, Instant};

use dquant_transport::ring::layout::{Layout, DEFAULT_SLOT_SIZE};
use dquant_transport::ring::{RingConsumer, RingError, RingFds, RingProducer};

const WAIT: Duration = Duration::from_secs(10);

/// Deterministic payload for batch `i`: varied length (0..=slot size), content from `i`.
fn batch(i: u64, slot_size: usize) -> Vec<u8> {
    let len = match i % 7 {
        0 => 0,
        1 => slot_size,
        _ => (i as usize * 7919) % slot_size,
    };
    crate::common::payload(i, len)
}

fn produce(producer: &mut RingProducer, i: u64) {
    let slot_size = producer.layout().slot_size as usize;
    let data = batch(i, slot_size);
    let mut slot = producer.reserve().unwrap();
    slot[..data.len()].copy_from_slice(&data);
    slot.commit(data.len()).unwrap();
}

#[test]
fn ten_thousand_batches_in_order() {
    const BATCHES: u64 = 10_000;
    let (mut consumer, fds) = RingConsumer::create(4, 64 * 1024).unwrap();
    let producer = thread::spawn(move || {
        let mut p = RingProducer::attach(fds).unwrap();
        for i in 0..BATCHES {
            produce(&mut p, i);
        }
        p.close();
    });
    let mut n = 0u64;
    while let Some(b) = consumer.next(WAIT).unwrap() {
        assert_eq!(b.seq(), n);
        assert!(*b == *batch(n, 64 * 1024), "batch {n} differs");
        n += 1;
    }
    assert_eq!(n, BATCHES);
    assert_eq!(consumer.next(WAIT).unwrap().map(|b| b.len()), None);
    producer.join().unwrap();
}

#[test]
fn slow_consumer_blocks_producer_and_loses_nothing() {
    let (mut consumer, fds) = RingConsumer::create(4, 4096).unwrap();
    let producer = thread::spawn(move || {
        let mut p = RingProducer::attach(fds).unwrap();
        let mut blocked = Duration::ZERO;
        for i in 0..12 {
            let t = Instant::now();
            produce(&mut p, i);
            blocked = blocked.max(t.elapsed());
        }
        p.close();
        blocked
    });
    thread::sleep(Duration::from_millis(200));
    let mut n = 0;
    while let Some(b) = consumer.next(WAIT).unwrap() {
        assert!(*b == *batch(n, 4096));
        n += 1;
    }
    assert_eq!(n, 12);
    let blocked = producer.join().unwrap();
    assert!(
        blocked >= Duration::from_millis(150),
        "producer never waited ({blocked:?}): the ring did not push back"
    );
}

#[test]
fn dropped_producer_is_an_error_after_the_last_complete_batch() {
    let (mut consumer, fds) = RingConsumer::create(4, 4096).unwrap();
    let mut p = RingProducer::attach(fds).unwrap();
    for i in 0..3 {
        produce(&mut p, i);
    }
    // Half a batch, never committed.
    {
        let mut slot = p.reserve().unwrap();
        slot[..100].fill(0xee);
    } // dropped uncommitted
    drop(p);
    for i in 0..3 {
        let b = consumer.next(WAIT).unwrap().unwrap();
        assert!(*b == *batch(i, 4096));
    }
    let e = consumer.next(WAIT).err().unwrap();
    assert!(
        matches!(e, RingError::ProducerGone { complete: 3 }),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "ring: producer went away without closing the ring; all 3 complete batches were delivered"
    );
}

#[test]
fn dead_producer_process_is_seen_through_the_socket() {
    // A process that dies cannot set the abort flag: only its socket closes.
    let (mut consumer, fds) = RingConsumer::create(2, 4096).unwrap();
    let (host, agent) = UnixStream::pair().unwrap();
    consumer.set_peer(OwnedFd::from(host));
    let mut p = RingProducer::attach(fds).unwrap();
    produce(&mut p, 0);
    std::mem::forget(p); // no Drop: as if killed
    let t = thread::spawn(move || {
        thread::sleep(Duration::from_millis(50));
        drop(agent);
    });
    assert!(*consumer.next(WAIT).unwrap().unwrap() == *batch(0, 4096));
    let start = Instant::now();
    let e = consumer.next(WAIT).err().unwrap();
    assert!(
        matches!(e, RingError::ProducerGone { complete: 1 }),
        "{e:?}"
    );
    assert!(start.elapsed() < WAIT / 2, "woke by timeout, not hang-up");
    t.join().unwrap();
}

#[test]
fn consumer_times_out_without_data() {
    let (mut consumer, fds) = RingConsumer::create(2, 4096).unwrap();
    let _p = RingProducer::attach(fds).unwrap();
    let e = consumer.next(Duration::from_millis(30)).err().unwrap();
    assert_eq!(e.to_string(), "ring: no batch within 30ms");
}

#[test]
fn fds_passed_over_a_unix_socket_work() {
    let (mut consumer, fds) = RingConsumer::create(2, DEFAULT_SLOT_SIZE).unwrap();
    let (host, agent) = UnixStream::pair().unwrap();
    fds.send(&host).unwrap();
    drop(fds); // the host's duplicates are not needed once sent
    let producer = thread::spawn(move || {
        let fds = RingFds::recv(&agent).unwrap();
        let mut p = RingProducer::attach(fds).unwrap();
        p.set_peer(OwnedFd::from(agent));
        assert_eq!(p.layout().slot_size, DEFAULT_SLOT_SIZE);
        for i in 0..5 {
            produce(&mut p, i);
        }
        p.close();
    });
    consumer.set_peer(OwnedFd::from(host));
    for i in 0..5 {
        let b = consumer.next(WAIT).unwrap().unwrap();
        assert!(*b == *batch(i, DEFAULT_SLOT_SIZE as usize));
    }
    assert!(consumer.next(WAIT).unwrap().is_none());
    producer.join().unwrap();
}

#[test]
fn send_and_recv_fds_carry_payload_and_descriptors() {
    use std::io::{Read, Seek, Write};
    let (a, b) = UnixStream::pair().unwrap();
    let mut file = std::fs::File::from(
        rustix::fs::memfd_create("t", rustix::fs::MemfdFlags::CLOEXEC).unwrap(),
    );
    file.write_all(b"hello").unwrap();
    dquant_transport::ring::send_fds(&a, &[std::os::fd::AsFd::as_fd(&file)], b"x").unwrap();
    let mut buf = [0u8; 8];
    let (n, mut fds) = dquant_transport::ring::recv_fds(&b, &mut buf, 2).unwrap();
    assert_eq!((&buf[..n], fds.len()), (&b"x"[..], 1));
    let mut got = std::fs::File::from(fds.pop().unwrap());
    got.rewind().unwrap();
    let mut s = String::new();
    got.read_to_string(&mut s).unwrap();
    assert_eq!(s, "hello");
}

#[test]
fn recv_rejects_a_wrong_descriptor_count() {
    let (a, b) = UnixStream::pair().unwrap();
    let fd = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
    dquant_transport::ring::send_fds(&a, &[std::os::fd::AsFd::as_fd(&fd)], b"dquant-ring/1")
        .unwrap();
    assert_eq!(
        RingFds::recv(&b).unwrap_err().to_string(),
        "ring: fd handshake: expected 3 descriptors, got 1"
    );
}

fn eventfd() -> OwnedFd {
    rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap()
}

/// A memfd of `len` bytes starting with `header`, sealed (or not).
fn memfd_with(header: &[u8], len: u64, seal: bool) -> RingFds {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd =
        rustix::fs::memfd_create("t", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
    rustix::fs::ftruncate(&fd, len).unwrap();
    rustix::io::pwrite(&fd, header, 0).unwrap();
    if seal {
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW).unwrap();
    }
    RingFds {
        memfd: fd,
        consumer_wake: eventfd(),
        producer_wake: eventfd(),
    }
}

fn meta_bytes(
    layout: &Layout,
    tweak: impl FnOnce(&mut dquant_transport::ring::layout::Meta),
) -> Vec<u8> {
    let mut m = layout.meta(0);
    tweak(&mut m);
    let mut v = Vec::new();
    v.extend(m.magic.to_ne_bytes());
    v.extend(m.version.to_ne_bytes());
    v.extend(m.slot_count.to_ne_bytes());
    v.extend(m.slot_size.to_ne_bytes());
    v.extend(m.records_offset.to_ne_bytes());
    v.extend(m.slots_offset.to_ne_bytes());
    v.extend(m.total_len.to_ne_bytes());
    v.extend(m.flags.to_ne_bytes());
    v.extend(m.readers.to_ne_bytes());
    v
}

fn attach_err(fds: RingFds) -> String {
    RingProducer::attach(fds).err().unwrap().to_string()
}

#[test]
fn attach_rejects_bad_headers_and_sizes() {
    let l = Layout::new(2, 4096).unwrap();
    // A good header attaches.
    assert!(RingProducer::attach(memfd_with(&meta_bytes(&l, |_| {}), l.total_len, true)).is_ok());
    assert_eq!(
        attach_err(memfd_with(
            &meta_bytes(&l, |m| m.magic = 0),
            l.total_len,
            true
        )),
        "ring header: bad magic 0x0000000000000000 (expected 0x0100474e49525144)"
    );
    assert_eq!(
        attach_err(memfd_with(
            &meta_bytes(&l, |m| m.version = 9),
            l.total_len,
            true
        )),
        "ring header: version 9 not supported (expected 3)"
    );
    assert_eq!(
        attach_err(memfd_with(
            &meta_bytes(&l, |m| m.flags = 6),
            l.total_len,
            true
        )),
        "ring header: unknown flags 0x6 (known: 0x1)"
    );
    assert_eq!(
        attach_err(memfd_with(
            &meta_bytes(&l, |_| {}),
            l.total_len - 4096,
            true
        )),
        "ring header: memfd is 8192 bytes but the header describes 12288 bytes"
    );
    assert_eq!(
        attach_err(memfd_with(
            &meta_bytes(&l, |m| m.slot_count = 1000),
            l.total_len,
            true
        )),
        "ring header: field slots_offset is 4096, expected 20480 for 1000 slots of 4096 bytes"
    );
    assert_eq!(
        attach_err(memfd_with(
            &meta_bytes(&l, |m| m.slot_count = 0),
            l.total_len,
            true
        )),
        "ring: slot count 0 out of range 1..=65536"
    );
    let two = Layout::with_readers(2, 4096, 2).unwrap();
    assert_eq!(
        attach_err(memfd_with(&meta_bytes(&two, |_| {}), two.total_len, true)),
        "ring header: 2 reader blocks; a session's own ring has 1"
    );
    assert_eq!(
        attach_err(memfd_with(
            &meta_bytes(&l, |m| m.readers = 0),
            l.total_len,
            true
        )),
        "ring: 0 readers, out of range 1..=64"
    );
    assert_eq!(
        attach_err(memfd_with(&[], 100, true)),
        "ring header: memfd is 100 bytes, smaller than the 192-byte header"
    );
    let e = attach_err(memfd_with(&meta_bytes(&l, |_| {}), l.total_len, false));
    assert!(
        e.starts_with("ring: memfd is not sealed against shrinking"),
        "{e}"
    );
}

#[test]
fn commit_rejects_oversized_batches_and_consumer_drop_unblocks_producer() {
    let (consumer, fds) = RingConsumer::create(1, 16).unwrap();
    let mut p = RingProducer::attach(fds).unwrap();
    let slot = p.reserve().unwrap();
    assert_eq!(
        slot.commit(17).unwrap_err().to_string(),
        "ring: batch of 17 bytes does not fit a 16-byte slot"
    );
    p.reserve().unwrap().commit(16).unwrap();
    // Ring full; the consumer goes away: the producer's wait ends with an error.
    let t = thread::spawn(move || p.reserve().err().map(|e| e.to_string()));
    thread::sleep(Duration::from_millis(50));
    drop(consumer);
    assert_eq!(
        t.join().unwrap().as_deref(),
        Some("ring: consumer went away")
    );
}

/// A batch changed after it was published (a buggy producer, or memory corruption): with
/// checksums the consumer refuses it with an exact error; without, sequence and length are
/// still checked but the bytes are delivered as they are.
#[test]
fn checksums_catch_a_batch_changed_after_publishing() {
    for checksums in [true, false] {
        let (mut consumer, fds) = RingConsumer::create_with(2, 4096, checksums).unwrap();
        let spy = fds.memfd.try_clone().unwrap();
        let slots_offset = consumer.layout().slots_offset as usize;
        let total = consumer.layout().total_len as usize;
        let mut producer = RingProducer::attach(fds).unwrap();
        let mut slot = producer.reserve().unwrap();
        slot[..4].copy_from_slice(b"good");
        slot.commit(4).unwrap();
        // SAFETY: a fresh shared mapping of the whole memfd (its size is sealed), unmapped
        // below; the test is the only writer while the batch sits published.
        unsafe {
            let p = rustix::mm::mmap(
                std::ptr::null_mut(),
                total,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                &spy,
                0,
            )
            .unwrap();
            *p.cast::<u8>().add(slots_offset) = b'b';
            rustix::mm::munmap(p, total).unwrap();
        }
        let got = consumer.next(WAIT).map(|b| b.map(|b| b.to_vec()));
        if checksums {
            let e = got.err().unwrap().to_string();
            assert!(
                e.starts_with("ring: batch 0 is corrupt: crc32c 0x")
                    && e.contains(", record says 0x"),
                "{e}"
            );
        } else {
            assert_eq!(got.unwrap().unwrap(), b"bood");
        }
    }
}

/// Views kept past later batches and dropped in any order: every batch reads back exactly,
/// whether its slot was reused or its view was detached.
#[test]
fn views_outlive_later_batches_and_drop_in_any_order() {
    const BATCHES: u64 = 2_000;
    const SLOT: usize = 8192;
    let (mut consumer, fds) = RingConsumer::create(8, SLOT as u64).unwrap();
    let producer = thread::spawn(move || {
        let mut p = RingProducer::attach(fds).unwrap();
        for i in 0..BATCHES {
            produce(&mut p, i);
        }
        p.close();
    });
    // Keep a varying window of views, drop them in a scrambled order, and keep every 97th
    // view to the very end (they pin slots until detached).
    let mut live = Vec::new();
    let mut forever = Vec::new();
    let mut n = 0u64;
    while let Some(v) = consumer.take(WAIT).unwrap() {
        assert_eq!(v.seq(), n);
        if n.is_multiple_of(97) {
            forever.push(v);
        } else {
            live.push(v);
        }
        if live.len() > (n % 5) as usize {
            let k = (n as usize * 31) % live.len();
            let v = live.swap_remove(k);
            assert!(*v == *batch(v.seq(), SLOT), "batch {} changed", v.seq());
        }
        n += 1;
    }
    assert_eq!(n, BATCHES);
    for v in live.iter().chain(&forever) {
        assert!(**v == *batch(v.seq(), SLOT), "batch {} changed", v.seq());
    }
    assert!(consumer.detached() >= forever.len() as u64 - 1);
    producer.join().unwrap();
    // Views outlive the consumer, and can be read on other threads.
    drop(consumer);
    thread::spawn(move || {
        for v in &forever {
            assert!(**v == *batch(v.seq(), SLOT), "batch {} changed", v.seq());
        }
    })
    .join()
    .unwrap();
}

/// A consumer that keeps every view: each batch is detached once, when the producer needs its
/// slot, and no batch changes.
#[test]
fn keeping_every_view_detaches_each_batch_once() {
    const BATCHES: u64 = 300;
    const SLOT: usize = 4096;
    let (mut consumer, fds) = RingConsumer::create(4, SLOT as u64).unwrap();
    let producer = thread::spawn(move || {
        let mut p = RingProducer::attach(fds).unwrap();
        for i in 0..BATCHES {
            produce(&mut p, i);
        }
        p.close();
    });
    let mut kept = Vec::new();
    while let Some(v) = consumer.take(WAIT).unwrap() {
        kept.push(v);
    }
    assert_eq!(kept.len() as u64, BATCHES);
    // Half the ring may stay pinned at the end; everything before it was detached.
    assert_eq!(consumer.detached(), BATCHES - 1);
    for v in &kept {
        assert!(**v == *batch(v.seq(), SLOT), "batch {} changed", v.seq());
    }
    producer.join().unwrap();
}

/// Slots that are not page aligned cannot be detached: a consumer that pins them all gets an
/// error, not a hang.
#[test]
fn pinning_every_unaligned_slot_is_an_error() {
    let (mut consumer, fds) = RingConsumer::create(2, 100).unwrap();
    let producer = thread::spawn(move || {
        let mut p = RingProducer::attach(fds).unwrap();
        for i in 0..3 {
            produce(&mut p, i);
        }
        p.close();
    });
    let a = consumer.take(WAIT).unwrap().unwrap();
    let b = consumer.take(WAIT).unwrap().unwrap();
    let e = consumer.take(WAIT).err().unwrap();
    assert_eq!(
        e.to_string(),
        "ring: live views hold all 2 slots and this ring's slots are not page aligned, so none can be detached; drop a batch view first"
    );
    drop(a);
    assert_eq!(consumer.take(WAIT).unwrap().unwrap().seq(), 2);
    drop(b);
    assert!(consumer.take(WAIT).unwrap().is_none());
    producer.join().unwrap();
}
