//! Blocking frame I/O over any byte stream.

use std::io::{ErrorKind, Read, Write};
use std::time::{Duration, Instant};

use crate::frame::{FrameHeader, FrameKind, WireError, HEADER_LEN};
use crate::pool::PooledBuf;

/// What a data-plane writer asks before each frame: here, a tenant's share of the agent's
/// link (its bandwidth scheduler). `pace` returns when `bytes` more may go.
pub trait Pacer: Send {
    fn pace(&mut self, bytes: usize);
}

/// The most frames [`FrameWriter::send_all_checked`] writes at once (two buffers each,
/// within the kernel's `IOV_MAX` of 1024).
pub const MAX_FRAMES_AT_ONCE: usize = 256;

/// Writes frames with consecutive sequence numbers, each after its [`Pacer`] (if any) let it.
pub struct FrameWriter<W: Write> {
    w: W,
    seq: u64,
    pacer: Option<Box<dyn Pacer>>,
    /// Time spent in the pacer and in writes: what the link held the writer back.
    waited: Duration,
}

impl<W: Write> FrameWriter<W> {
    pub fn new(w: W) -> Self {
        FrameWriter {
            w,
            seq: 0,
            pacer: None,
            waited: Duration::ZERO,
        }
    }

    /// Time spent so far waiting for the pacer and in writes (a full socket buffer blocks
    /// them): how much the link, not the writer, set the pace.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// Every frame from now on waits for `pacer` first.
    pub fn with_pacer(mut self, pacer: Option<Box<dyn Pacer>>) -> Self {
        self.pacer = pacer;
        self
    }

    /// Frames sent so far.
    pub fn frames(&self) -> u64 {
        self.seq
    }

    pub fn send(&mut self, kind: FrameKind, payload: &[u8]) -> Result<(), WireError> {
        self.send_checked(kind, payload, crate::frame::payload_crc(payload))
    }

    /// Sends `payload` as one frame whose crc32c the caller computed (`crc`): a payload sent
    /// to many writers is checksummed once. Header and payload go in one vectored write.
    pub fn send_checked(
        &mut self,
        kind: FrameKind,
        payload: &[u8],
        crc: u32,
    ) -> Result<(), WireError> {
        self.send_all_checked(kind, &[(payload, crc)])
    }

    /// Sends each `(payload, crc)` as a frame, as [`FrameWriter::send_checked`] does, all in
    /// one vectored write (at most [`MAX_FRAMES_AT_ONCE`] frames).
    pub fn send_all_checked(
        &mut self,
        kind: FrameKind,
        frames: &[(&[u8], u32)],
    ) -> Result<(), WireError> {
        if frames.len() > MAX_FRAMES_AT_ONCE {
            return Err(std::io::Error::other(format!(
                "{} frames in one write; at most {MAX_FRAMES_AT_ONCE}",
                frames.len()
            ))
            .into());
        }
        let mut heads = Vec::with_capacity(frames.len());
        for (i, &(payload, crc)) in frames.iter().enumerate() {
            if payload.len() > crate::frame::MAX_PAYLOAD {
                return Err(WireError::PayloadTooLarge(payload.len()));
            }
            let h = FrameHeader {
                kind,
                seq: self.seq + i as u64,
                len: payload.len() as u32,
                crc,
            };
            heads.push(h.encode());
        }
        let started = Instant::now();
        if let Some(p) = &mut self.pacer {
            let len: usize = frames.iter().map(|(p, _)| HEADER_LEN + p.len()).sum();
            p.pace(len);
        }
        let mut bufs: Vec<std::io::IoSlice<'_>> = heads
            .iter()
            .zip(frames)
            .flat_map(|(h, (p, _))| [std::io::IoSlice::new(h), std::io::IoSlice::new(p)])
            .collect();
        let mut bufs = &mut bufs[..];
        while !bufs.is_empty() {
            match self.w.write_vectored(bufs) {
                Ok(0) => return Err(std::io::Error::from(ErrorKind::WriteZero).into()),
                Ok(n) => std::io::IoSlice::advance_slices(&mut bufs, n),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.waited += started.elapsed();
        self.seq += frames.len() as u64;
        Ok(())
    }

    /// Sends an end frame and flushes.
    pub fn finish(&mut self, summary: &[u8]) -> Result<(), WireError> {
        self.send(FrameKind::End, summary)?;
        self.w.flush()?;
        Ok(())
    }

    /// Sends an error frame carrying `message` (truncated to the frame limit) and flushes.
    pub fn fail(&mut self, message: &str) -> Result<(), WireError> {
        let mut m = message.as_bytes();
        if m.len() > crate::frame::MAX_PAYLOAD {
            m = &m[..crate::frame::MAX_PAYLOAD];
        }
        self.send(FrameKind::Error, m)?;
        self.w.flush()?;
        Ok(())
    }

    pub fn flush(&mut self) -> Result<(), WireError> {
        Ok(self.w.flush()?)
    }

    pub fn get_ref(&self) -> &W {
        &self.w
    }
}

/// Reads and checks frames: magic, header crc, sequence, size and payload crc.
pub struct FrameReader<R: Read> {
    r: R,
    seq: u64,
    ended: bool,
}

/// Fills `buf` completely; `Ok(false)` on a clean end of stream before the first byte.
fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> std::io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

impl<R: Read> FrameReader<R> {
    pub fn new(r: R) -> Self {
        FrameReader {
            r,
            seq: 0,
            ended: false,
        }
    }

    /// Frames received so far.
    pub fn frames(&self) -> u64 {
        self.seq
    }

    pub fn get_ref(&self) -> &R {
        &self.r
    }

    /// Fills `b`; a stream that ends early is [`WireError::Truncated`].
    fn fill(&mut self, b: &mut [u8]) -> Result<(), WireError> {
        let truncated = WireError::Truncated { frames: self.seq };
        match read_full(&mut self.r, b) {
            Ok(true) => Ok(()),
            Ok(false) if b.is_empty() => Ok(()),
            Ok(false) => Err(truncated),
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => Err(truncated),
            Err(e) => Err(e.into()),
        }
    }

    /// Reads the next data frame's payload into `buf`. Returns `Ok(true)` for a data frame,
    /// `Ok(false)` once the end frame has arrived (its payload, if any, is in `buf`), and the
    /// sender's message as [`WireError::Remote`] for an error frame. A stream that stops
    /// without an end frame is [`WireError::Truncated`].
    pub fn next_into(&mut self, buf: &mut PooledBuf) -> Result<bool, WireError> {
        if self.ended {
            buf.set_len(0);
            return Ok(false);
        }
        let mut hb = [0u8; HEADER_LEN];
        self.fill(&mut hb)?;
        let h = FrameHeader::parse(&hb, self.seq)?;
        let len = h.len as usize;
        if len > buf.capacity() {
            return Err(WireError::TooLarge {
                seq: h.seq,
                len: h.len,
                max: buf.capacity(),
            });
        }
        self.fill(&mut buf.spare()[..len])?;
        buf.set_len(len);
        h.check_payload(buf)?;
        self.seq += 1;
        match h.kind {
            FrameKind::Data => Ok(true),
            FrameKind::End => {
                self.ended = true;
                Ok(false)
            }
            FrameKind::Error => {
                self.ended = true;
                Err(WireError::Remote(String::from_utf8_lossy(buf).into_owned()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::payload_crc;
    use crate::BufferPool;

    /// A writer that takes at most 7 bytes a call, vectored or not.
    struct Trickle(Vec<u8>);

    impl Write for Trickle {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let n = buf.len().min(7);
            self.0.extend_from_slice(&buf[..n]);
            Ok(n)
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn frames_with_a_precomputed_crc_read_back_through_short_writes() {
        let payloads: [&[u8]; 3] = [b"first record", &[7u8; 1000], b""];
        let mut w = FrameWriter::new(Trickle(Vec::new()));
        for p in payloads {
            w.send_checked(FrameKind::Data, p, payload_crc(p)).unwrap();
        }
        // Two frames in one write.
        let (a, b) = (&b"two frames"[..], &b"in one write"[..]);
        let frames = [(a, payload_crc(a)), (b, payload_crc(b))];
        w.send_all_checked(FrameKind::Data, &frames).unwrap();
        w.finish(&[]).unwrap();
        let bytes = w.get_ref().0.clone();
        let mut r = FrameReader::new(&bytes[..]);
        let pool = BufferPool::new(1, 4096);
        let mut buf = pool.get();
        for p in payloads {
            assert!(r.next_into(&mut buf).unwrap());
            assert_eq!(&buf[..], p);
        }
        for p in [a, b] {
            assert!(r.next_into(&mut buf).unwrap());
            assert_eq!(&buf[..], p);
        }
        assert!(!r.next_into(&mut buf).unwrap());
        // A wrong crc is what the reader refuses.
        let mut w = FrameWriter::new(Vec::new());
        w.send_checked(FrameKind::Data, b"abc", 1).unwrap();
        let sent = w.get_ref().clone();
        let e = FrameReader::new(&sent[..]).next_into(&mut buf).unwrap_err();
        assert!(e.to_string().contains("checksum mismatch"), "{e}");
    }

    /// A reader that hands out at most `n` bytes a call, as a socket may.
    struct Pieces<'a>(&'a [u8], usize);

    impl Read for Pieces<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.1).min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    /// Whatever pieces a payload arrives in, the whole frame passes and one changed byte
    /// anywhere in it is refused, with both sums named.
    #[test]
    fn payloads_arriving_in_pieces_are_checked_whole() {
        let payload: Vec<u8> = (0..70_000u32).map(|i| (i * 31 + i / 253) as u8).collect();
        let mut w = FrameWriter::new(Vec::new());
        w.send(FrameKind::Data, &payload).unwrap();
        let sent = w.get_ref().clone();
        let pool = BufferPool::new(1, 1 << 17);
        let mut buf = pool.get();
        for piece in [1, 7, 4096, 65_536, 1 << 20] {
            let mut r = FrameReader::new(Pieces(&sent, piece));
            assert!(r.next_into(&mut buf).unwrap(), "{piece}-byte reads");
            assert_eq!(buf[..], payload[..], "{piece}-byte reads");
            for at in [0, 4095, 4096, payload.len() - 1] {
                let mut bad = sent.clone();
                bad[HEADER_LEN + at] ^= 0x10;
                let e = FrameReader::new(Pieces(&bad, piece))
                    .next_into(&mut buf)
                    .unwrap_err();
                let computed = payload_crc(&bad[HEADER_LEN..]);
                let want = format!(
                    "payload checksum mismatch in frame 0: stored {:#010x}, computed {computed:#010x}",
                    payload_crc(&payload)
                );
                assert!(e.to_string().contains(&want), "{e} (want {want})");
            }
        }
    }
}
