//! A ring the agent shares among readers on the host: every reader gets every batch from
//! where it started, the slowest sets the pace, readers leave and are ended alone, and the
//! answer that hands a reader its block crosses a Unix socket.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::Duration;

use dquant_transport::ring::layout::MAX_INDEX;
use dquant_transport::ring::{Answer, RingConsumer, RingError, RingFds, RingProducer};

const WAIT: Duration = Duration::from_secs(10);

fn payload(i: u64) -> Vec<u8> {
    crate::common::payload(i, 100 + (i as usize * 37) % 3000)
}

fn publish(p: &mut RingProducer, i: u64) {
    let data = payload(i);
    let mut slot = p.reserve_timeout(WAIT).unwrap();
    slot[..data.len()].copy_from_slice(&data);
    slot.commit(data.len()).unwrap();
}

fn reader(p: &mut RingProducer, start: u64) -> RingConsumer {
    let (r, fds) = p.add_reader(start).unwrap();
    RingConsumer::attach(fds, r, true).unwrap()
}

/// Reads to the end; returns the sequence numbers read, each checked against its payload.
fn read_all(mut c: RingConsumer, pause_every: u64) -> Vec<u64> {
    let mut got = Vec::new();
    while let Some(b) = c.next(WAIT).unwrap() {
        assert!(*b == *payload(b.seq()), "batch {} differs", b.seq());
        got.push(b.seq());
        if pause_every > 0 && b.seq() % pause_every == 0 {
            thread::sleep(Duration::from_millis(2));
        }
    }
    got
}

#[test]
fn every_reader_gets_every_batch_once_and_the_slowest_sets_the_pace() {
    const BATCHES: u64 = 3000;
    let mut p = RingProducer::create(4, 4, 4096, true).unwrap();
    let readers: Vec<_> = [0, 1, 97]
        .into_iter()
        .map(|pause| {
            let c = reader(&mut p, 0);
            thread::spawn(move || read_all(c, pause))
        })
        .collect();
    for i in 0..BATCHES {
        publish(&mut p, i);
    }
    p.close();
    for r in readers {
        assert_eq!(r.join().unwrap(), (0..BATCHES).collect::<Vec<_>>());
    }
}

#[test]
fn a_reader_added_later_starts_where_the_ring_still_holds_its_batch() {
    let mut p = RingProducer::create(4, 4, 4096, false).unwrap();
    let mut first = reader(&mut p, 0);
    for i in 0..4 {
        publish(&mut p, i);
    }
    for _ in 0..2 {
        drop(first.next(WAIT).unwrap().unwrap());
    }
    publish(&mut p, 4);
    publish(&mut p, 5);
    // 0..6 published into 4 slots: 2 and later are intact (the slot of 2 is reused once
    // batch 6 is reserved, which waits for the new reader too).
    assert_eq!(
        p.add_reader(1).unwrap_err().to_string(),
        "ring: no reader block: batch 1 is not in the ring, which holds 2..6"
    );
    assert!(p.add_reader(7).is_err());
    let late = reader(&mut p, 2);
    let late = thread::spawn(move || read_all(late, 0));
    let first = thread::spawn(move || read_all(first, 0));
    for i in 6..40 {
        publish(&mut p, i);
    }
    p.close();
    assert_eq!(first.join().unwrap(), (2..40).collect::<Vec<_>>());
    assert_eq!(late.join().unwrap(), (2..40).collect::<Vec<_>>());
}

#[test]
fn a_reader_that_leaves_or_is_ended_holds_up_no_one() {
    let mut p = RingProducer::create(3, 2, 4096, true).unwrap();
    let stays = reader(&mut p, 0);
    let leaves = reader(&mut p, 0);
    let mut ended = reader(&mut p, 0);
    let kept = thread::spawn(move || read_all(stays, 0));
    publish(&mut p, 0);
    publish(&mut p, 1);
    // A view the ended reader keeps reads its batch after the producer reused the slot.
    let view = ended.take(WAIT).unwrap().unwrap();
    // Two readers have released nothing: the ring is full for them.
    assert!(matches!(
        p.reserve_timeout(Duration::from_millis(20)),
        Err(RingError::Timeout(_))
    ));
    drop(leaves);
    ended.detach_all().unwrap();
    p.end_reader(2);
    assert!(!p.reader_active(2) && p.reader_active(0) && !p.reader_active(1));
    for i in 2..50 {
        publish(&mut p, i);
    }
    p.close();
    assert_eq!(kept.join().unwrap(), (0..50).collect::<Vec<_>>());
    assert!(*view == *payload(0));
    drop(ended);
    assert!(*view == *payload(0));
}

#[test]
fn with_every_reader_gone_there_is_no_one_to_write_for() {
    let mut p = RingProducer::create(2, 4, 4096, true).unwrap();
    assert!(!p.has_readers());
    let a = reader(&mut p, 0);
    publish(&mut p, 0);
    let b = reader(&mut p, 1);
    assert!(p.has_readers());
    drop(a);
    p.end_reader(1);
    assert!(!p.has_readers());
    assert!(matches!(
        p.reserve_timeout(WAIT),
        Err(RingError::ConsumerGone)
    ));
    drop(b);
    // Every block was handed out.
    assert_eq!(
        p.add_reader(1).unwrap_err().to_string(),
        "ring: no reader block: all 2 reader blocks were handed out"
    );
}

#[test]
fn a_floor_keeps_slots_for_a_reader_yet_to_come() {
    let mut p = RingProducer::create(2, 2, 4096, false).unwrap();
    let fast = reader(&mut p, 0);
    let t = thread::spawn(move || read_all(fast, 0));
    p.set_floor(Some(0));
    publish(&mut p, 0);
    publish(&mut p, 1);
    assert!(matches!(
        p.reserve_timeout(Duration::from_millis(20)),
        Err(RingError::Timeout(_))
    ));
    let late = reader(&mut p, 0);
    p.set_floor(None);
    let t2 = thread::spawn(move || read_all(late, 0));
    for i in 2..20 {
        publish(&mut p, i);
    }
    p.close();
    assert_eq!(t.join().unwrap(), (0..20).collect::<Vec<_>>());
    assert_eq!(t2.join().unwrap(), (0..20).collect::<Vec<_>>());
}

#[test]
fn the_answer_hands_a_reader_its_block_over_a_socket() {
    let mut p = RingProducer::create(2, 4, 4096, true).unwrap();
    let (agent, host) = UnixStream::pair().unwrap();
    let (r, fds) = p.add_reader(0).unwrap();
    Answer::Reader { fds, reader: r }.send(&agent).unwrap();
    Answer::Own.send(&agent).unwrap();
    let Some(Answer::Reader { fds, reader: got }) = Answer::recv(&host).unwrap() else {
        panic!("expected a reader block");
    };
    assert_eq!(got, r);
    let mut c = RingConsumer::attach(fds, got, true).unwrap();
    assert!(matches!(Answer::recv(&host).unwrap(), Some(Answer::Own)));
    publish(&mut p, 0);
    assert!(*c.next(WAIT).unwrap().unwrap() == *payload(0));
    // A message right behind an answer (a stream that failed at once) is not read with it:
    // it stays on the socket for the reader.
    Answer::Own.send(&agent).unwrap();
    (&agent).write_all(b"DQFR and the rest of a frame").unwrap();
    let (r, fds) = p.add_reader(1).unwrap();
    Answer::Reader { fds, reader: r }.send(&agent).unwrap();
    (&agent).write_all(b"DQFR again").unwrap();
    assert!(matches!(Answer::recv(&host).unwrap(), Some(Answer::Own)));
    let mut rest = [0u8; 28];
    (&host).read_exact(&mut rest).unwrap();
    assert_eq!(&rest, b"DQFR and the rest of a frame");
    assert!(matches!(
        Answer::recv(&host).unwrap(),
        Some(Answer::Reader { reader, .. }) if reader == r
    ));
    let mut rest = [0u8; 10];
    (&host).read_exact(&mut rest).unwrap();
    assert_eq!(&rest, b"DQFR again");
    // Anything else first (the agent refused, with a frame): no answer, the bytes left.
    (&agent).write_all(b"DQFR").unwrap();
    assert!(Answer::recv(&host).unwrap().is_none());
}

/// A reader block whose consumer index no ring can reach (a hostile agent's) is refused when
/// the subscriber attaches, before its own arithmetic on the index could overflow (found by
/// the `ring_answer` fuzz target: `tail + slot_count` overflowed in `take`).
#[test]
fn a_reader_block_whose_index_no_ring_reaches_is_refused() {
    let mut p = RingProducer::create(2, 4, 4096, true).unwrap();
    let (r, fds) = p.add_reader(0).unwrap();
    let at = p.layout().reader_offset(r);
    for (index, ok) in [
        (MAX_INDEX, true),
        (MAX_INDEX + 1, false),
        (u64::MAX - 3, false),
    ] {
        rustix::io::pwrite(&fds.memfd, &index.to_le_bytes(), at).unwrap();
        let dup = |fd: &std::os::fd::OwnedFd| fd.try_clone().unwrap();
        let fds = RingFds {
            memfd: dup(&fds.memfd),
            consumer_wake: dup(&fds.consumer_wake),
            producer_wake: dup(&fds.producer_wake),
        };
        match RingConsumer::attach(fds, r, true) {
            Ok(_) => assert!(ok, "index {index} attached"),
            Err(e) => assert_eq!(
                (ok, e.to_string()),
                (
                    false,
                    format!(
                        "ring: fd handshake: reader {r}'s consumer index is {index}, past \
                         the 9223372036854775807 a ring can count to"
                    )
                )
            ),
        }
    }
}
