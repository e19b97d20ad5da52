//! A packet tap on the loopback interface: what the kernel actually put in the IP headers of
//! the packets a process sent, seen from outside it. Tests use it to check marks (DSCP) that
//! a `getsockopt` on a socket of the test's own would only claim.
//!
//! An `AF_PACKET` socket (root only) bound to `lo`, reading IPv4 packets on a thread until it
//! is dropped. Written against libc because no crate of the workspace taps packets, and the
//! parse needs only the IPv4 and TCP header lengths.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// A TCP segment with payload seen on `lo`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub src_port: u16,
    pub dst_port: u16,
    /// The IPv4 TOS byte (DSCP in its top six bits).
    pub tos: u8,
    pub payload: usize,
}

/// Captures IPv4 TCP segments with payload on `lo` until dropped.
pub struct LoopbackTap {
    fd: i32,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Segment>>>,
    thread: Option<JoinHandle<()>>,
}

impl LoopbackTap {
    /// Starts capturing; an error (not root, no `AF_PACKET`) says why.
    pub fn start() -> std::io::Result<LoopbackTap> {
        let fd = open_on_lo()?;
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (s, v) = (stop.clone(), seen.clone());
        let thread = std::thread::spawn(move || capture(fd, &s, &v));
        Ok(LoopbackTap {
            fd,
            stop,
            seen,
            thread: Some(thread),
        })
    }

    /// The segments with payload sent from `port` so far.
    pub fn sent_from(&self, port: u16) -> Vec<Segment> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.iter()
            .filter(|s| s.src_port == port)
            .copied()
            .collect()
    }
}

impl Drop for LoopbackTap {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // SAFETY: fd is the socket this tap opened; the thread that read it has ended.
        unsafe { libc::close(self.fd) };
    }
}

fn open_on_lo() -> std::io::Result<i32> {
    let proto = (libc::ETH_P_IP as u16).to_be();
    // SAFETY: plain socket(2); the fd is checked below.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM, i32::from(proto)) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let close_with = |e: std::io::Error| {
        // SAFETY: fd was opened above and is not used after this.
        unsafe { libc::close(fd) };
        Err(e)
    };
    // SAFETY: a NUL-terminated name.
    let ifindex = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
    if ifindex == 0 {
        return close_with(std::io::Error::last_os_error());
    }
    // SAFETY: sockaddr_ll is plain data; zeroed is a valid value.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = proto;
    addr.sll_ifindex = ifindex as i32;
    let len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    // SAFETY: addr is a sockaddr_ll of `len` bytes.
    if unsafe { libc::bind(fd, (&raw const addr).cast(), len) } != 0 {
        return close_with(std::io::Error::last_os_error());
    }
    let timeout = libc::timeval {
        tv_sec: 0,
        tv_usec: 50_000,
    };
    let tlen = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
    // SAFETY: a timeval of `tlen` bytes for SO_RCVTIMEO.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const timeout).cast(),
            tlen,
        )
    };
    if r != 0 {
        return close_with(std::io::Error::last_os_error());
    }
    Ok(fd)
}

fn capture(fd: i32, stop: &AtomicBool, seen: &Mutex<Vec<Segment>>) {
    let mut buf = vec![0u8; 65_536];
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: buf is writable for its length.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n <= 0 {
            continue; // the timeout: look at `stop` again
        }
        if let Some(s) = parse(&buf[..n as usize]) {
            seen.lock().unwrap_or_else(|e| e.into_inner()).push(s);
        }
    }
}

/// An IPv4 packet's TCP segment, if it is one with payload.
fn parse(p: &[u8]) -> Option<Segment> {
    if p.len() < 20 || p[0] >> 4 != 4 || p[9] != 6 {
        return None;
    }
    let ihl = usize::from(p[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([p[2], p[3]]));
    let tcp = p.get(ihl..total.min(p.len()))?;
    if tcp.len() < 20 {
        return None;
    }
    let doff = usize::from(tcp[12] >> 4) * 4;
    let payload = tcp.len().checked_sub(doff)?;
    (payload > 0).then(|| Segment {
        src_port: u16::from_be_bytes([tcp[0], tcp[1]]),
        dst_port: u16::from_be_bytes([tcp[2], tcp[3]]),
        tos: p[1],
        payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_tcp_segment_and_ignores_the_rest() {
        let mut p = vec![0u8; 20 + 20 + 5];
        p[0] = 0x45;
        p[1] = 46 << 2;
        p[2..4].copy_from_slice(&45u16.to_be_bytes());
        p[9] = 6;
        p[20..22].copy_from_slice(&7000u16.to_be_bytes());
        p[22..24].copy_from_slice(&50000u16.to_be_bytes());
        p[32] = 5 << 4;
        let s = parse(&p).unwrap();
        assert_eq!(
            s,
            Segment {
                src_port: 7000,
                dst_port: 50000,
                tos: 184,
                payload: 5
            }
        );
        p[2..4].copy_from_slice(&40u16.to_be_bytes()); // a bare ACK
        assert_eq!(parse(&p), None);
        p[9] = 17; // UDP
        assert_eq!(parse(&p), None);
    }
}
