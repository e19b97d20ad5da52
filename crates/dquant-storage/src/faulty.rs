//! Storage faults for tests: a [`Root`] and a [`Destination`] that wrap real ones and fail
//! where a test says, as a failing disk would (debug builds only).
//!
//! # Why
//! A disk returns EIO, a file on it ends early, a read stalls for a second, a volume fills up
//! under a conversion. None of that happens on a test machine when asked, and each must
//! reach the reader as a clear error naming the object (never as wrong tokens), cost only the
//! session that met it, and leave nothing half-written behind. These wrappers make each fault
//! happen on a given read or write of a given object, so tests can check exactly that,
//! through any layer above (a dataset, an agent's session, a replica set).
//!
//! Faults are armed on a shared [`StorageFaults`] and fire once. A wrapped object with no
//! fault armed for it when it is opened is the inner object itself, with its fast paths (a
//! local file's mapping): wrapping changes nothing until a test arms something. The module
//! exists only with `debug_assertions`; a release build carries no way to inject a fault.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, IoSliceMut};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::backend::{ObjectVersion, ReadAt};
use crate::destination::{Destination, StagedObject};
use crate::error::StorageError;
use crate::root::{ObjectMeta, Root, RootError};

/// One fault, on the object named `object` (a root's relative name, or a destination's
/// path as given). Read numbers count every read of the object, whoever made it, from 0 at
/// the first fault armed for it (a second fault on the same object counts on from there).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StorageFault {
    /// Read number `nth` fails with EIO.
    ReadError { object: String, nth: u64 },
    /// Read number `nth` finds the object ending early (`UnexpectedEof`), as a file truncated
    /// under its reader does.
    ShortRead { object: String, nth: u64 },
    /// Reads `nth` to `nth + reads - 1` each take `delay` longer: a latency spike.
    Slow {
        object: String,
        nth: u64,
        reads: u64,
        delay: Duration,
    },
    /// Writes fail with ENOSPC once `after` bytes of the object are written.
    NoSpace { object: String, after: u64 },
}

impl StorageFault {
    fn object(&self) -> &str {
        match self {
            StorageFault::ReadError { object, .. }
            | StorageFault::ShortRead { object, .. }
            | StorageFault::Slow { object, .. }
            | StorageFault::NoSpace { object, .. } => object,
        }
    }
}

/// What a read meets: nothing, a delay before it, or an error instead of it.
enum Hit {
    None,
    Delay(Duration),
    Fail(io::Error),
}

#[derive(Default)]
struct Armed {
    faults: Vec<StorageFault>,
    /// Reads of each object since a fault was first armed for it.
    reads: HashMap<String, u64>,
}

/// The faults armed for a set of wrapped roots and destinations; clones share them.
#[derive(Clone, Default)]
pub struct StorageFaults {
    armed: Arc<Mutex<Armed>>,
}

impl fmt::Debug for StorageFaults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StorageFaults")
            .field("armed", &self.armed())
            .finish()
    }
}

impl StorageFaults {
    pub fn arm(&self, fault: StorageFault) {
        let mut a = self.lock();
        a.reads.entry(fault.object().to_string()).or_insert(0);
        a.faults.push(fault);
    }

    /// Faults armed that have not fired (a `Slow` fault counts until its last slow read).
    pub fn armed(&self) -> usize {
        self.lock().faults.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Armed> {
        self.armed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn watches(&self, object: &str) -> bool {
        self.lock().faults.iter().any(|f| f.object() == object)
    }

    /// Counts a read of `object` and says what it meets.
    fn read(&self, object: &str) -> Hit {
        let mut a = self.lock();
        let Some(n) = a.reads.get_mut(object) else {
            return Hit::None;
        };
        let read = *n;
        *n += 1;
        let mut hit = Hit::None;
        a.faults.retain(|f| match f {
            StorageFault::ReadError { object: o, nth } if o == object && *nth == read => {
                hit = Hit::Fail(io::Error::from(rustix::io::Errno::IO));
                false
            }
            StorageFault::ShortRead { object: o, nth } if o == object && *nth == read => {
                hit = Hit::Fail(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "injected fault: the object ended before the bytes asked for",
                ));
                false
            }
            StorageFault::Slow {
                object: o,
                nth,
                reads,
                delay,
            } if o == object && (*nth..nth.saturating_add(*reads)).contains(&read) => {
                if matches!(hit, Hit::None) {
                    hit = Hit::Delay(*delay);
                }
                read + 1 < nth.saturating_add(*reads)
            }
            _ => true,
        });
        hit
    }

    /// Whether writing `len` more bytes of `object`, `written` already, runs out of space.
    fn write(&self, object: &str, written: u64, len: u64) -> bool {
        self.lock().faults.iter().any(|f| {
            matches!(f, StorageFault::NoSpace { object: o, after }
                if o == object && written + len > *after)
        })
    }

    /// Drops the `NoSpace` faults of `object` (it failed, or was committed).
    fn written(&self, object: &str) {
        self.lock()
            .faults
            .retain(|f| !matches!(f, StorageFault::NoSpace { object: o, .. } if o == object));
    }
}

/// A root whose objects fail where [`StorageFaults`] say.
#[derive(Debug)]
pub struct FaultyRoot {
    inner: Arc<dyn Root>,
    faults: StorageFaults,
}

impl FaultyRoot {
    pub fn new(inner: Arc<dyn Root>, faults: StorageFaults) -> Self {
        FaultyRoot { inner, faults }
    }
}

impl Root for FaultyRoot {
    fn objects(&self) -> Result<Vec<ObjectMeta>, RootError> {
        self.inner.objects()
    }

    fn stat(&self, name: &str) -> Result<ObjectMeta, RootError> {
        self.inner.stat(name)
    }

    fn open(&self, name: &str) -> Result<Box<dyn ReadAt>, RootError> {
        let inner = self.inner.open(name)?;
        if !self.faults.watches(name) {
            return Ok(inner);
        }
        Ok(Box::new(FaultyObject {
            inner,
            name: name.to_string(),
            faults: self.faults.clone(),
        }))
    }
}

/// An object with a fault armed for it: every read goes through [`StorageFaults::read`].
struct FaultyObject {
    inner: Box<dyn ReadAt>,
    name: String,
    faults: StorageFaults,
}

impl FaultyObject {
    fn meet(&self) -> io::Result<()> {
        match self.faults.read(&self.name) {
            Hit::None => Ok(()),
            Hit::Delay(d) => {
                std::thread::sleep(d);
                Ok(())
            }
            Hit::Fail(e) => Err(e),
        }
    }
}

impl ReadAt for FaultyObject {
    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.meet()?;
        self.inner.read_exact_at(buf, offset)
    }

    fn read_exact_vectored_at(&self, bufs: &mut [IoSliceMut<'_>], offset: u64) -> io::Result<()> {
        self.meet()?;
        self.inner.read_exact_vectored_at(bufs, offset)
    }

    fn will_read(&self, ranges: &[std::ops::Range<u64>]) {
        self.inner.will_read(ranges)
    }

    fn version(&self) -> Option<ObjectVersion> {
        self.inner.version()
    }

    fn version_is_durable(&self) -> bool {
        self.inner.version_is_durable()
    }

    // `local_file` stays `None`: a mapped file's reads would pass the faults by.
}

/// A destination whose outputs run out of space where [`StorageFaults`] say.
pub struct FaultyDestination<D> {
    inner: D,
    faults: StorageFaults,
}

impl<D: Destination> FaultyDestination<D> {
    pub fn new(inner: D, faults: StorageFaults) -> Self {
        FaultyDestination { inner, faults }
    }
}

impl<D: Destination> Destination for FaultyDestination<D> {
    fn stage(&self, name: &Path) -> Result<Box<dyn StagedObject>, StorageError> {
        Ok(Box::new(FaultyStaged {
            inner: self.inner.stage(name)?,
            name: name.to_string_lossy().into_owned(),
            written: 0,
            faults: self.faults.clone(),
        }))
    }
}

struct FaultyStaged {
    inner: Box<dyn StagedObject>,
    name: String,
    written: u64,
    faults: StorageFaults,
}

impl StagedObject for FaultyStaged {
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        if self
            .faults
            .write(&self.name, self.written, bytes.len() as u64)
        {
            self.faults.written(&self.name);
            return Err(io::Error::from(rustix::io::Errno::NOSPC));
        }
        self.written += bytes.len() as u64;
        self.inner.write_all(bytes)
    }

    fn commit(self: Box<Self>) -> io::Result<()> {
        self.faults.written(&self.name);
        self.inner.commit()
    }
}
