//! Reading records that span frames.

use std::io::Read;

use crate::frame::WireError;
use crate::io::FrameReader;
use crate::pool::{BufferPool, PooledBuf};
use crate::record::RECORD_HEADER_LEN;

/// Reads the record byte stream carried by a sequence of data frames. Frames land in one
/// pooled 1 MiB buffer; record bytes are copied out of it straight to where the caller wants
/// them (for a plain codec, the batch buffer itself), so there is no reassembly copy.
pub struct RecordReader<R: Read> {
    frames: FrameReader<R>,
    buf: PooledBuf,
    pos: usize,
    ended: bool,
}

impl<R: Read> RecordReader<R> {
    pub fn new(r: R) -> Self {
        let pool = BufferPool::new(1, crate::frame::MAX_PAYLOAD);
        RecordReader {
            frames: FrameReader::new(r),
            buf: pool.get(),
            pos: 0,
            ended: false,
        }
    }

    /// Frames received so far.
    pub fn frames(&self) -> u64 {
        self.frames.frames()
    }

    /// Whether the next read needs nothing from the underlying reader: record bytes are
    /// buffered, or the stream has ended.
    pub fn has_buffered(&self) -> bool {
        self.pos < self.buf.len() || self.ended
    }

    /// Makes sure unread bytes are buffered; false at the end of the stream.
    fn more(&mut self) -> Result<bool, WireError> {
        while self.pos == self.buf.len() {
            if self.ended {
                return Ok(false);
            }
            self.pos = 0;
            if !self.frames.next_into(&mut self.buf)? {
                // The end frame's payload is a summary, not record bytes.
                self.buf.set_len(0);
                self.ended = true;
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The next record header, or `None` when the stream ended cleanly between records.
    pub fn next_header(&mut self) -> Result<Option<[u8; RECORD_HEADER_LEN]>, WireError> {
        if !self.more()? {
            return Ok(None);
        }
        let mut h = [0u8; RECORD_HEADER_LEN];
        self.read_exact(&mut h, "header")?;
        Ok(Some(h))
    }

    /// Fills `out` with the next bytes of the stream.
    pub fn read_exact(&mut self, out: &mut [u8], what: &'static str) -> Result<(), WireError> {
        let mut n = 0;
        while n < out.len() {
            if !self.more()? {
                return Err(WireError::EndInRecord(what));
            }
            let k = (self.buf.len() - self.pos).min(out.len() - n);
            out[n..n + k].copy_from_slice(&self.buf[self.pos..self.pos + k]);
            self.pos += k;
            n += k;
        }
        Ok(())
    }

    pub fn get_ref(&self) -> &FrameReader<R> {
        &self.frames
    }
}
