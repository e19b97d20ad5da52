//! Inputs the fuzz targets (`fuzz/`) found to break the transport, as tests: each one
//! failed before its fix.

use std::time::Duration;

use dquant_transport::ring::{RingConsumer, RingError, RingProducer};

fn pwrite_u64(fd: &std::os::fd::OwnedFd, at: u64, v: u64) {
    rustix::io::pwrite(fd, &v.to_le_bytes(), at).unwrap();
}

fn pread_u64(fd: &std::os::fd::OwnedFd, at: u64) -> u64 {
    let mut b = [0u8; 8];
    rustix::io::pread(fd, &mut b, at).unwrap();
    u64::from_le_bytes(b)
}

/// `ring_header`: the consumer writes the ring's indices, so a hostile one can start the
/// producer at index `u64::MAX`; publishing then overflowed (a panic in a debug build of
/// the agent). The indices are free-running and wrap.
#[test]
fn a_producer_index_of_u64_max_wraps_on_publish() {
    let (_consumer, fds) = RingConsumer::create(2, 4096).unwrap();
    let memfd = fds.memfd.try_clone().unwrap();
    // Producer index (offset 64) and consumer index (offset 192): one slot in use.
    pwrite_u64(&memfd, 64, u64::MAX);
    pwrite_u64(&memfd, 192, u64::MAX - 1);
    let mut p = RingProducer::attach(fds).unwrap();
    let mut slot = p.reserve_timeout(Duration::ZERO).unwrap();
    slot[..3].copy_from_slice(b"abc");
    slot.commit(3).unwrap();
    assert_eq!(p.published(), 0);
    assert_eq!(pread_u64(&memfd, 64), 0);
    // The completion record of slot u64::MAX % 2 = 1 (offset 448 + 16) carries its sequence.
    assert_eq!(pread_u64(&memfd, 448 + 16), u64::MAX);
}

/// `ring_consumer`: a view kept past the hold limit is detached, which copies its batch out
/// of the slot. The copy's length was read again from the completion record, which the
/// producer can rewrite after the batch was taken: 2^32 - 1 copied gigabytes past a
/// 4096-byte mapping. The view must keep reading its bytes, whatever the record says now.
#[test]
fn a_completion_record_rewritten_under_a_kept_view_does_not_overrun_its_detach() {
    let (mut consumer, fds) = RingConsumer::create(1, 4096).unwrap();
    let memfd = fds.memfd.try_clone().unwrap();
    let mut p = RingProducer::attach(fds).unwrap();
    let mut slot = p.reserve_timeout(Duration::ZERO).unwrap();
    slot[..64].fill(7);
    slot.commit(64).unwrap();
    let view = consumer.take(Duration::ZERO).unwrap().unwrap();
    // The length word of slot 0's completion record (offset 448 + 8).
    rustix::io::pwrite(&memfd, &u32::MAX.to_le_bytes(), 448 + 8).unwrap();
    // One slot, held by the view: the next take detaches it first.
    match consumer.take(Duration::ZERO) {
        Err(RingError::Timeout(_)) => {}
        other => panic!(
            "expected a timeout, got {:?}",
            other.map(|v| v.map(|v| v.len()))
        ),
    }
    assert_eq!(consumer.detached(), 1);
    assert_eq!(&view[..], &[7u8; 64][..]);
}

/// `ring_consumer`: a flag bit in the shared header that is not the producer's (here the
/// consumer's own `CONSUMER_CLOSED`, 4) made every wait return at once, so `take` spun on a
/// core forever instead of timing out.
#[test]
fn a_stray_flag_bit_does_not_make_the_consumer_spin_past_its_timeout() {
    let (mut consumer, fds) = RingConsumer::create(2, 4096).unwrap();
    let memfd = fds.memfd.try_clone().unwrap();
    let _p = RingProducer::attach(fds).unwrap();
    // The closed flags (offset 320): bit 2 and an undefined bit.
    rustix::io::pwrite(&memfd, &(4u32 | 64).to_le_bytes(), 320).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = consumer
            .take(Duration::from_millis(30))
            .map(|v| v.is_some());
        let _ = tx.send(r.map_err(|e| e.to_string()));
    });
    // Before the fix the thread never answered.
    let r = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("take returned");
    assert_eq!(r, Err("ring: no batch within 30ms".to_string()));
}
