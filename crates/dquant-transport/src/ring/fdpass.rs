//! Passing file descriptors over a Unix socket (SCM_RIGHTS), with rustix.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
};

/// Sends `payload` (must not be empty: a stream socket carries ancillary data only with at
/// least one byte) with `fds` attached. The receiver gets its own duplicates of the fds.
pub fn send_fds(sock: &UnixStream, fds: &[BorrowedFd<'_>], payload: &[u8]) -> io::Result<()> {
    if payload.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "send_fds: payload must not be empty",
        ));
    }
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("send_fds: control buffer too small"));
    }
    let sent = sendmsg(
        sock,
        &[IoSlice::new(payload)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    if sent != payload.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("send_fds: sent {sent} of {} bytes", payload.len()),
        ));
    }
    Ok(())
}

/// Receives one message into `buf` and at most `max_fds` descriptors (close-on-exec). Returns
/// the byte count and the descriptors. A message whose descriptors did not fit is an error
/// (the kernel closed the excess ones), and so is end of stream.
pub fn recv_fds(
    sock: &UnixStream,
    buf: &mut [u8],
    max_fds: usize,
) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(max_fds))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = recvmsg(
        sock,
        &mut [IoSliceMut::new(buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(it) = m {
            fds.extend(it);
        }
    }
    if msg.flags.contains(ReturnFlags::CTRUNC) {
        return Err(io::Error::other(format!(
            "recv_fds: more than {max_fds} descriptors sent; excess ones were dropped"
        )));
    }
    if msg.bytes == 0 && fds.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "recv_fds: peer closed the socket",
        ));
    }
    Ok((msg.bytes, fds))
}
