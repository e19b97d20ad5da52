//! The FUSE file system: kernel requests answered from the tree, the datasets' counts and
//! the readers. Every failure becomes an errno here, and is logged with its reason.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use dquant_engine::SourceError;
use dquant_format::idx_layout::IdxLayout;
use dquant_format::DType;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, KernelConfig,
    LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    Request,
};

use crate::agent::Agent;
use crate::bin_reader::{BinReader, BLOCK_BYTES};
use crate::error::MountError;
use crate::names::Part;
use crate::plan_file::PlanFile;
use crate::tree::{join, Node, Tree};
use crate::MountOptions;

/// What the mount knows of one dataset: enough for its two files' sizes.
#[derive(Clone, Copy, Debug)]
struct Meta {
    dtype: DType,
    tokens: u64,
    sequences: u64,
    documents: u64,
}

/// A dataset's open `.bin` reader, shared by its open file handles.
struct OpenBin {
    handles: usize,
    reader: Arc<Mutex<BinReader>>,
}

pub struct MountFs {
    agent: Agent,
    opts: MountOptions,
    tree: Tree,
    plans: Vec<PlanFile>,
    metas: Mutex<HashMap<String, (Instant, Meta)>>,
    bins: Mutex<HashMap<String, OpenBin>>,
    /// What each open file handle reads.
    handles: Mutex<HashMap<u64, Node>>,
    next_handle: AtomicU64,
    uid: u32,
    gid: u32,
    started: SystemTime,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn errno(e: &MountError) -> Errno {
    Errno::from_i32(e.errno())
}

impl MountFs {
    pub fn new(agent: Agent, opts: MountOptions, plans: Vec<PlanFile>) -> Self {
        let names = plans.iter().map(|p| p.name.clone()).collect();
        MountFs {
            tree: Tree::new(opts.ttl, names),
            agent,
            opts,
            plans,
            metas: Mutex::default(),
            bins: Mutex::default(),
            handles: Mutex::default(),
            next_handle: AtomicU64::new(1),
            // SAFETY: getuid/getgid cannot fail and touch no memory.
            uid: unsafe { libc::getuid() },
            gid: unsafe { libc::getgid() },
            started: SystemTime::now(),
        }
    }

    /// The dataset's counts and the dtype its files show, asked of the agent at most once
    /// per TTL. `--dtype auto` asks for its largest token too (a scan on the agent, once,
    /// for formats that do not store it).
    fn meta(&self, dataset: &str) -> Result<Meta, MountError> {
        if let Some((at, m)) = lock(&self.metas).get(dataset) {
            if at.elapsed() < self.opts.ttl {
                return Ok(*m);
            }
        }
        let auto = self.opts.dtype.is_none();
        let s = self.agent.stat(dataset, auto).map_err(|e| match e {
            MountError::Agent(e) if auto && e.to_string().contains("no answer") => {
                MountError::Agent(SourceError::Agent(format!(
                    "{e} (--dtype auto asks for the dataset's largest token: the first time, a \
                     scan of every token of a format that does not store it; the agent keeps \
                     scanning, so a later lookup may succeed. For large Megatron files mount \
                     with --dtype u16 or --dtype i32, or convert them to .dqb, which stores it)"
                )))
            }
            e => e,
        })?;
        let dtype = match (self.opts.dtype, s.max_token) {
            (Some(d), _) => d,
            (None, Some(max)) if max <= u32::from(u16::MAX) => DType::U16,
            (None, _) => DType::I32,
        };
        let m = Meta {
            dtype,
            tokens: s.tokens,
            sequences: s.sequences,
            documents: s.documents,
        };
        lock(&self.metas).insert(dataset.to_string(), (Instant::now(), m));
        Ok(m)
    }

    fn attr(&self, ino: u64, node: &Node) -> Result<FileAttr, MountError> {
        let (kind, size) = match node {
            Node::Dir => (FileType::Directory, 0),
            Node::Plan(i) => (FileType::RegularFile, self.plans[*i].size),
            Node::File(f) => {
                let m = self.meta(&f.dataset)?;
                let size = match f.part {
                    Part::Bin => m.tokens * m.dtype.itemsize() as u64,
                    Part::Idx => IdxLayout::new(m.dtype, m.sequences, m.documents).len(),
                };
                (FileType::RegularFile, size)
            }
        };
        let dir = kind == FileType::Directory;
        Ok(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: self.started,
            mtime: self.started,
            ctime: self.started,
            crtime: self.started,
            kind,
            perm: if dir { 0o555 } else { 0o444 },
            nlink: if dir { 2 } else { 1 },
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: BLOCK_BYTES as u32,
            flags: 0,
        })
    }

    fn node_of(&self, ino: INodeNo) -> Result<(String, Node), MountError> {
        let path = self
            .tree
            .path_of(ino.0)
            .ok_or_else(|| MountError::Gone(format!("inode {} is unknown", ino.0)))?;
        let node = self.tree.resolve(&self.agent, &path)?;
        Ok((path, node))
    }

    /// Logs a failure (not a plain "no such file") and turns it into its errno.
    fn fail(&self, op: &str, path: &str, e: MountError) -> Errno {
        match e {
            MountError::Gone(_) => {}
            MountError::Changed(_) => {
                tracing::warn!(op, path, error = %e, "dataset changed; looking it up afresh");
                self.tree.forget_listings();
                lock(&self.metas).clear();
            }
            _ => tracing::warn!(op, path, error = %e, "failed"),
        }
        errno(&e)
    }

    /// Replies to a read of a `.bin` from the dataset's reader (under its lock, so the bytes
    /// go to the kernel straight from the block that holds them).
    fn read_bin(
        &self,
        dataset: &str,
        offset: u64,
        size: u64,
        reply: ReplyData,
    ) -> Result<(), (MountError, ReplyData)> {
        let Some(reader) = lock(&self.bins).get(dataset).map(|o| o.reader.clone()) else {
            let e = MountError::Changed(format!("{dataset}: read without an open"));
            return Err((e, reply));
        };
        let mut r = lock(&reader);
        if !r.has_source() {
            let opened = self
                .agent
                .open_source(dataset, &self.opts.wire_codec)
                .and_then(|src| r.set_source(src, self.opts.readahead));
            if let Err(e) = opened {
                return Err((e, reply));
            }
        }
        match r.read(offset, size) {
            Ok(bytes) => {
                reply.data(bytes);
                Ok(())
            }
            Err(e) => Err((e, reply)),
        }
    }

    fn read_idx(&self, dataset: &str, offset: u64, size: u64) -> Result<Vec<u8>, MountError> {
        let m = self.meta(dataset)?;
        let layout = IdxLayout::new(m.dtype, m.sequences, m.documents);
        let mut out = Vec::with_capacity(size as usize);
        let values = |part, r| self.agent.index(dataset, part, r);
        layout.render(offset..offset.saturating_add(size), &mut out, values)?;
        Ok(out)
    }

    fn open_bin(&self, dataset: &str) -> Result<(), MountError> {
        let m = self.meta(dataset)?;
        let mut bins = lock(&self.bins);
        let o = bins.entry(dataset.to_string()).or_insert_with(|| OpenBin {
            handles: 0,
            reader: Arc::new(Mutex::new(BinReader::new(m.dtype, m.tokens))),
        });
        o.handles += 1;
        Ok(())
    }
}

impl Filesystem for MountFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // The kernel's own readahead, up to a block; past that, ours.
        let want = BLOCK_BYTES as u32;
        if let Err(max) = config.set_max_readahead(want) {
            let _ = config.set_max_readahead(max);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let Some(dir) = self.tree.path_of(parent.0) else {
            return reply.error(Errno::ENOENT);
        };
        let Some(name) = name.to_str() else {
            return reply.error(Errno::ENOENT);
        };
        let path = join(&dir, name);
        let r = self
            .tree
            .resolve(&self.agent, &path)
            .and_then(|n| self.attr(self.tree.inode_of(&path), &n));
        match r {
            Ok(a) => reply.entry(&self.opts.ttl, &a, fuser::Generation(0)),
            Err(e) => reply.error(self.fail("lookup", &path, e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.node_of(ino).and_then(|(_, n)| self.attr(ino.0, &n)) {
            Ok(a) => reply.attr(&self.opts.ttl, &a),
            Err(e) => reply.error(self.fail("getattr", &format!("inode {}", ino.0), e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let (path, entries) = match self.node_of(ino) {
            Ok((path, Node::Dir)) => match self.tree.list(&self.agent, &path) {
                Ok(e) => (path, e),
                Err(e) => return reply.error(self.fail("readdir", &path, e)),
            },
            Ok(_) => return reply.error(Errno::ENOTDIR),
            Err(e) => return reply.error(self.fail("readdir", "?", e)),
        };
        let dots = [(".".to_string(), true), ("..".to_string(), true)];
        let all = dots.into_iter().chain(entries);
        for (i, (name, dir)) in all.enumerate().skip(offset as usize) {
            let child = match name.as_str() {
                "." | ".." => ino.0,
                _ => self.tree.inode_of(&join(&path, &name)),
            };
            let kind = if dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            if reply.add(INodeNo(child), i as u64 + 1, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.0 & libc::O_ACCMODE != libc::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        let node = match self.node_of(ino) {
            Ok((_, Node::Dir)) => return reply.error(Errno::EISDIR),
            Ok((_, n)) => n,
            Err(e) => return reply.error(self.fail("open", &format!("inode {}", ino.0), e)),
        };
        if let Node::File(f) = &node {
            if f.part == Part::Bin {
                if let Err(e) = self.open_bin(&f.dataset) {
                    return reply.error(self.fail("open", &f.dataset, e));
                }
            }
        }
        let fh = self.next_handle.fetch_add(1, Ordering::Relaxed);
        lock(&self.handles).insert(fh, node);
        // The files' bytes change only with their dataset's version: the page cache keeps
        // them across opens.
        reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let size = u64::from(size);
        let Some(node) = lock(&self.handles).get(&fh.0).cloned() else {
            return reply.error(Errno::EBADF);
        };
        let r = match &node {
            Node::Dir => Err(MountError::Usage("a directory".into())),
            Node::Plan(i) => {
                let mut out = Vec::with_capacity(size as usize);
                self.plans[*i].read(offset, size, &mut out).map(|_| out)
            }
            Node::File(f) => match f.part {
                Part::Bin => match self.read_bin(&f.dataset, offset, size, reply) {
                    Ok(()) => return,
                    Err((e, reply)) => {
                        let what = format!("{} (.bin)", f.dataset);
                        return reply.error(self.fail("read", &what, e));
                    }
                },
                Part::Idx => self.read_idx(&f.dataset, offset, size),
            },
        };
        match r {
            Ok(data) => reply.data(&data),
            Err(e) => {
                let what = match &node {
                    Node::File(f) => format!("{} (.idx)", f.dataset),
                    Node::Plan(i) => format!("plan {}", self.plans[*i].name),
                    Node::Dir => format!("inode {}", ino.0),
                };
                reply.error(self.fail("read", &what, e))
            }
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let removed = lock(&self.handles).remove(&fh.0);
        if let Some(Node::File(f)) =
            removed.filter(|n| matches!(n, Node::File(f) if f.part == Part::Bin))
        {
            let mut bins = lock(&self.bins);
            if let Some(o) = bins.get_mut(&f.dataset) {
                o.handles = o.handles.saturating_sub(1);
                if o.handles == 0 {
                    bins.remove(&f.dataset);
                }
            }
        }
        reply.ok();
    }

    fn access(&self, _req: &Request, _ino: INodeNo, mask: fuser::AccessFlags, reply: ReplyEmpty) {
        if mask.bits() & libc::W_OK != 0 {
            return reply.error(Errno::EROFS);
        }
        reply.ok();
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: fuser::ReplyXattr,
    ) {
        reply.error(Errno::NO_XATTR);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
        match size {
            0 => reply.size(0),
            _ => reply.data(&[]),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: fuser::ReplyStatfs) {
        reply.statfs(0, 0, 0, 0, 0, BLOCK_BYTES as u32, 255, BLOCK_BYTES as u32);
    }
}
