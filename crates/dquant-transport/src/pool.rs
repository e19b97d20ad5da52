//! A fixed pool of frame buffers, allocated once.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

struct Inner {
    free: Mutex<Vec<Vec<u8>>>,
    returned: Condvar,
    size: usize,
    count: usize,
}

/// `count` buffers of `size` bytes, allocated and touched up front so the resident set is
/// fixed from the start. [`BufferPool::get`] blocks while every buffer is out: that is the
/// back-pressure a slow consumer exerts on a producer.
#[derive(Clone)]
pub struct BufferPool {
    inner: Arc<Inner>,
}

impl BufferPool {
    pub fn new(count: usize, size: usize) -> Self {
        let free = (0..count).map(|_| vec![0u8; size]).collect();
        BufferPool {
            inner: Arc::new(Inner {
                free: Mutex::new(free),
                returned: Condvar::new(),
                size,
                count,
            }),
        }
    }

    /// Bytes per buffer.
    pub fn buffer_size(&self) -> usize {
        self.inner.size
    }

    /// Buffers in the pool, out or not.
    pub fn count(&self) -> usize {
        self.inner.count
    }

    /// Buffers not currently handed out.
    pub fn available(&self) -> usize {
        self.inner
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    fn wrap(&self, buf: Vec<u8>) -> PooledBuf {
        PooledBuf {
            buf: Some(buf),
            len: 0,
            pool: self.inner.clone(),
        }
    }

    /// Takes a buffer, waiting for one to come back if all are out.
    pub fn get(&self) -> PooledBuf {
        let mut free = self
            .inner
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(b) = free.pop() {
                return self.wrap(b);
            }
            free = self
                .inner
                .returned
                .wait(free)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Takes a buffer, waiting at most `timeout`.
    pub fn get_timeout(&self, timeout: Duration) -> Option<PooledBuf> {
        let free = self
            .inner
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (mut free, _) = self
            .inner
            .returned
            .wait_timeout_while(free, timeout, |f| f.is_empty())
            .unwrap_or_else(PoisonError::into_inner);
        free.pop().map(|b| self.wrap(b))
    }
}

/// A buffer on loan from a [`BufferPool`]; it goes back when dropped. Derefs to its filled
/// part (`len` bytes); [`PooledBuf::spare`] gives the whole buffer for filling.
pub struct PooledBuf {
    buf: Option<Vec<u8>>,
    len: usize,
    pool: Arc<Inner>,
}

impl PooledBuf {
    /// The whole buffer, to fill before [`PooledBuf::set_len`].
    pub fn spare(&mut self) -> &mut [u8] {
        self.buf.as_deref_mut().unwrap_or_default()
    }

    /// Marks the first `len` bytes as filled.
    ///
    /// # Panics
    /// If `len` exceeds the buffer size.
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.pool.size,
            "PooledBuf::set_len beyond the buffer"
        );
        self.len = len;
    }

    pub fn capacity(&self) -> usize {
        self.pool.size
    }
}

impl Deref for PooledBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf.as_deref().unwrap_or_default()[..self.len]
    }
}

impl DerefMut for PooledBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.buf.as_deref_mut().unwrap_or_default()[..len]
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            self.pool
                .free
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(b);
            self.pool.returned.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn buffers_are_reused_and_exhaustion_blocks() {
        let pool = BufferPool::new(2, 16);
        let mut a = pool.get();
        a.spare()[..3].copy_from_slice(b"abc");
        a.set_len(3);
        assert_eq!(&*a, b"abc");
        let ptr = a.spare().as_ptr();
        let _b = pool.get();
        assert_eq!(pool.available(), 0);
        let t = Instant::now();
        assert!(pool.get_timeout(Duration::from_millis(50)).is_none());
        assert!(t.elapsed() >= Duration::from_millis(50));
        drop(a);
        let mut c = pool.get();
        assert_eq!(c.spare().as_ptr(), ptr, "the same allocation comes back");
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn a_blocked_get_wakes_when_a_buffer_returns() {
        let pool = BufferPool::new(1, 8);
        let held = pool.get();
        let p2 = pool.clone();
        let h = std::thread::spawn(move || p2.get().capacity());
        std::thread::sleep(Duration::from_millis(20));
        drop(held);
        assert_eq!(h.join().unwrap(), 8);
    }
}
