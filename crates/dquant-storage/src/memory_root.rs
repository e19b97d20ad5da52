//! Objects held in memory as a [`Root`].
//!
//! For tests: everything that takes a root (the conformance suite, the catalog, opening a
//! dataset) can run against exact bytes without a file system, and it is the second
//! implementation that keeps the trait honest about what is store-specific.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::sync::Arc;

use crate::backend::ReadAt;
use crate::root::{normalize_name, ObjectMeta, ObjectVersion, Root, RootError};

/// A root whose objects are byte buffers in memory.
#[derive(Clone, Default)]
pub struct InMemoryRoot {
    objects: BTreeMap<String, Arc<[u8]>>,
}

impl InMemoryRoot {
    pub fn new() -> Self {
        Self::default()
    }

    /// A root holding `objects` (name, bytes).
    pub fn from_objects(objects: &[(&str, &[u8])]) -> Result<Self, RootError> {
        let mut root = Self::new();
        for (name, bytes) in objects {
            root.insert(name, *bytes)?;
        }
        Ok(root)
    }

    /// Adds or replaces an object; the name is checked and normalized as every root's is.
    pub fn insert(&mut self, name: &str, bytes: impl Into<Arc<[u8]>>) -> Result<(), RootError> {
        self.objects.insert(normalize_name(name)?, bytes.into());
        Ok(())
    }

    fn get(&self, name: &str) -> Result<(String, &Arc<[u8]>), RootError> {
        let norm = normalize_name(name)?;
        match self.objects.get(&norm) {
            Some(bytes) => Ok((norm, bytes)),
            None => Err(RootError::NotFound { name: name.into() }),
        }
    }
}

/// Names and lengths only: the bytes may be megabytes.
impl fmt::Debug for InMemoryRoot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.objects.iter().map(|(k, v)| (k, v.len())))
            .finish()
    }
}

impl Root for InMemoryRoot {
    fn objects(&self) -> Result<Vec<ObjectMeta>, RootError> {
        Ok(self
            .objects
            .iter()
            .map(|(name, bytes)| ObjectMeta::new(name.clone(), bytes.len() as u64, version(bytes)))
            .collect())
    }

    fn stat(&self, name: &str) -> Result<ObjectMeta, RootError> {
        let (name, bytes) = self.get(name)?;
        Ok(ObjectMeta::new(name, bytes.len() as u64, version(bytes)))
    }

    fn open(&self, name: &str) -> Result<Box<dyn ReadAt>, RootError> {
        let (_, bytes) = self.get(name)?;
        Ok(Box::new(MemoryObject(bytes.clone())))
    }
}

/// An object's version: its buffer's address. Buffers are immutable and a replaced
/// object gets a new one; a reader holds its buffer, so an address is not reused while a
/// dataset opened from it lives.
fn version(bytes: &Arc<[u8]>) -> Option<ObjectVersion> {
    Some(ObjectVersion::tag(format!(
        "mem-{:p}-{}",
        Arc::as_ptr(bytes),
        bytes.len()
    )))
}

/// Positional reads over a shared byte buffer.
struct MemoryObject(Arc<[u8]>);

impl ReadAt for MemoryObject {
    fn len(&self) -> u64 {
        self.0.len() as u64
    }

    fn version(&self) -> Option<ObjectVersion> {
        version(&self.0)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let src = usize::try_from(offset)
            .ok()
            .and_then(|start| self.0.get(start..start.checked_add(buf.len())?));
        match src {
            Some(src) => {
                buf.copy_from_slice(src);
                Ok(())
            }
            None => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "failed to fill whole buffer",
            )),
        }
    }
}
