//! Helpers the storage tests share (each test binary uses some of them).
#![allow(dead_code)]

use std::path::Path;

use dquant_storage::{Dataset, ObjectMeta, ReadAt, Root, RootError};

/// A root together with what must outlive it (its temporary directories).
#[derive(Debug)]
pub struct Owned<R, K> {
    pub root: R,
    pub _keep: K,
}

impl<R: Root, K: std::fmt::Debug + Send + Sync> Root for Owned<R, K> {
    fn objects(&self) -> Result<Vec<ObjectMeta>, RootError> {
        self.root.objects()
    }

    fn stat(&self, name: &str) -> Result<ObjectMeta, RootError> {
        self.root.stat(name)
    }

    fn open(&self, name: &str) -> Result<Box<dyn ReadAt>, RootError> {
        self.root.open(name)
    }
}

/// Makes a FIFO at `p`: a name that blocks whoever opens it for reading, which confinement
/// must refuse by its type before opening.
pub fn mkfifo(p: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        p,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
}

/// The tokens of `r` read through a dataset's reader, or its error as text.
pub fn tokens(ds: &Dataset, r: std::ops::Range<u64>) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    ds.reader().read(r, &mut out).map_err(|e| e.to_string())?;
    Ok(out)
}
