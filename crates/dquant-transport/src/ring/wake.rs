//! Wake-ups between the two processes. A side that keeps up never sleeps and makes no
//! syscall per batch; one that must wait sets its need-wakeup flag in the header, re-checks
//! the ring and sleeps on its eventfd (and on the peer's socket, to notice a peer that died),
//! and the other side writes that eventfd only when the flag is set. [`wait`] is that sleep,
//! for both sides; [`kick`] is the write.

use std::os::fd::OwnedFd;
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::Instant;

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};

use super::{io_err, RingError};

pub(super) fn new_eventfd() -> Result<OwnedFd, RingError> {
    eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).map_err(io_err("eventfd"))
}

pub(super) fn kick(fd: &OwnedFd) {
    // An eventfd write only fails when the counter would overflow, and then it is non-zero
    // and the peer will wake anyway.
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

fn drain(fd: &OwnedFd) {
    let mut buf = [0u8; 8];
    let _ = rustix::io::read(fd, &mut buf);
}

/// How a wait ended.
pub(super) enum Woke {
    /// Eventfd or a spurious/poll wakeup: re-check the ring.
    Recheck,
    /// The peer's liveness socket hung up.
    PeerHup,
    Timeout,
}

/// Sleeps on `wake` (and `peer` for hang-up) for at most `until`, with the need-wakeup protocol:
/// `flag` is set, a SeqCst fence issued and `ready()` re-checked before sleeping.
pub(super) fn wait(
    flag: &AtomicU32,
    wake: &OwnedFd,
    peer: Option<&OwnedFd>,
    until: Option<Instant>,
    ready: impl Fn() -> bool,
) -> Result<Woke, RingError> {
    flag.store(1, Ordering::Relaxed);
    fence(Ordering::SeqCst);
    if ready() {
        flag.store(0, Ordering::Relaxed);
        return Ok(Woke::Recheck);
    }
    let timeout = match until {
        None => None,
        Some(t) => {
            let left = t.saturating_duration_since(Instant::now());
            if left.is_zero() {
                flag.store(0, Ordering::Relaxed);
                return Ok(Woke::Timeout);
            }
            Some(Timespec {
                tv_sec: left.as_secs() as _,
                tv_nsec: left.subsec_nanos() as _,
            })
        }
    };
    let mut fds = vec![PollFd::new(wake, PollFlags::IN)];
    if let Some(p) = peer {
        // Only hang-up/error matter; POLLHUP and POLLERR are always reported.
        fds.push(PollFd::new(p, PollFlags::RDHUP));
    }
    let r = poll(&mut fds, timeout.as_ref());
    flag.store(0, Ordering::Relaxed);
    match r {
        Ok(_) => {}
        Err(rustix::io::Errno::INTR) => return Ok(Woke::Recheck),
        Err(e) => return Err(io_err("poll")(e)),
    }
    if fds[0].revents().contains(PollFlags::IN) {
        drain(wake);
    }
    if fds.get(1).is_some_and(|p| {
        !(p.revents() & (PollFlags::HUP | PollFlags::RDHUP | PollFlags::ERR)).is_empty()
    }) {
        return Ok(Woke::PeerHup);
    }
    Ok(Woke::Recheck)
}
