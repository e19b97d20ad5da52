//! `dquant mount`: an agent's datasets as ordinary read-only files, for trainers that cannot
//! change their data code.
//!
//! Megatron-Core's `IndexedDataset`, nanotron's Nanosets and many in-house loaders memory-map
//! `PREFIX.bin` and `PREFIX.idx`. Here every dataset under every root of an agent appears as
//! such a prefix, `MOUNTPOINT/ROOT/PATH.{bin,idx}`, its tokens narrowed to the mount's dtype
//! (by default the narrowest Megatron dtype that holds the dataset's largest token). A read
//! of the `.bin` becomes a token-range request in the wire codec of the mount's choice: the
//! agent reads and narrows (or compresses) near the data, and the mount decodes into the
//! kernel's page cache. The `.idx` is written from slices of the agent's document index, a
//! page at a time ([`dquant_format::idx_layout`]). Plans appear as seekable streams of their
//! batches (`MOUNTPOINT/plans/NAME.bin`, [`plan_file`]).
//!
//! Nothing is kept but the kernel's page cache, two 1 MiB blocks per open dataset and the
//! range source's readahead window, so the mount's memory stays flat however much streams
//! through. An agent that goes away turns reads into `EIO` (within the mount's timeout,
//! never a hang); the next read dials it again.

mod agent;
mod bin_reader;
mod error;
mod fs;
mod names;
pub mod plan_file;
mod tree;

use std::path::Path;
use std::time::Duration;

use dquant_format::DType;
use dquant_plan::Plan;
use dquant_remote::{AgentUri, Credentials};
use fuser::{Config, MountOption, SessionACL};

pub use bin_reader::BLOCK_BYTES;
pub use error::MountError;
pub use names::{files_of, DatasetFile, Part};

/// What a dquant mount's source is called in the mount table: `dquant:HOST:PORT`.
const FS_NAME_PREFIX: &str = "dquant:";

/// Whether a dquant mount is at `path` in this process's mount table (its type is `fuse`
/// or `fuse.*` and its source `dquant:…`). A path that does not exist is not mounted.
pub fn is_mounted(path: &Path) -> bool {
    let (Ok(path), Ok(table)) = (
        path.canonicalize(),
        std::fs::read_to_string("/proc/self/mountinfo"),
    ) else {
        return false;
    };
    let want = path.to_string_lossy();
    table.lines().any(|line| {
        let f: Vec<&str> = line.split(' ').collect();
        let mut after = f.iter().skip_while(|x| **x != "-").skip(1);
        let (fstype, source) = (after.next(), after.next());
        f.get(4) == Some(&want.as_ref())
            && fstype.is_some_and(|t| *t == "fuse" || t.starts_with("fuse."))
            && source.is_some_and(|s| s.starts_with(FS_NAME_PREFIX))
    })
}

/// How a mount shows and reads its datasets.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// The dtype of every `.bin`; `None`: the narrowest of uint16 and int32 that holds the
    /// dataset's largest token (Megatron has no 17- or 18-bit dtype).
    pub dtype: Option<DType>,
    /// Bytes kept in flight ahead of a sequential reader (whole 1 MiB blocks).
    pub readahead: u64,
    /// How token ranges travel from the agent (`auto`: narrowed to each range's width;
    /// `auto+lz4`, `auto+zstd:1`: compressed too).
    pub wire_codec: String,
    /// How long listings, sizes and the kernel's attribute cache hold before the agent is
    /// asked again: a dataset removed on the agent is gone from the mount after this.
    pub ttl: Duration,
    /// Every call to the agent and every read on its data connection: how long a read
    /// waits on an agent that stopped answering before it fails with `EIO`.
    pub timeout: Duration,
    /// Threads answering the kernel, so one slow read does not hold up the others. Two: a
    /// sequential reader is served one request at a time anyway (its blocks are in order),
    /// and on 2 cores more threads only contend (bench/RESULTS.md, the mount's section).
    pub threads: usize,
    /// Let users other than the one mounting read the files (FUSE's `allow_other`).
    pub allow_other: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            dtype: None,
            readahead: 8 * BLOCK_BYTES,
            wire_codec: "auto".into(),
            ttl: Duration::from_secs(1),
            timeout: Duration::from_secs(10),
            threads: 2,
            allow_other: false,
        }
    }
}

/// The dtypes a mount may show tokens in: Megatron's integer dtypes that hold token ids.
pub fn parse_dtype(s: &str) -> Result<Option<DType>, MountError> {
    if s == "auto" {
        return Ok(None);
    }
    match s.parse::<DType>() {
        Ok(d @ (DType::U8 | DType::U16 | DType::I32 | DType::I64)) => Ok(Some(d)),
        _ => Err(MountError::Usage(format!(
            "--dtype {s}: expected auto, u8, u16, i32 or i64 (or uint8, uint16, int32, int64)"
        ))),
    }
}

/// A mounted file system, not yet serving: [`run`](Mount::run) it in this thread, or
/// [`spawn`](Mount::spawn) it.
pub struct Mount {
    session: fuser::Session<fs::MountFs>,
    mountpoint: std::path::PathBuf,
}

/// Unmounts a [`Mount`] from another thread (a signal handler's): its `run` then returns.
pub struct Unmounter {
    inner: fuser::SessionUnmounter,
    mountpoint: std::path::PathBuf,
}

impl Unmounter {
    /// Unmounts; when files are still open (`EBUSY`), detaches the mount instead: nothing
    /// new can open it, the open files are served until they close, and then `run` returns.
    pub fn unmount(&mut self) -> std::io::Result<()> {
        match self.inner.unmount() {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                tracing::info!(
                    mountpoint = %self.mountpoint.display(),
                    "files are open: detaching; the mount ends when the last one closes"
                );
                let path = std::ffi::CString::new(self.mountpoint.as_os_str().as_encoded_bytes())
                    .map_err(std::io::Error::other)?;
                // SAFETY: umount2 with a valid NUL-terminated path; no memory is kept.
                match unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                }
            }
            r => r,
        }
    }
}

/// A mount served by a background thread; unmounted when dropped.
pub struct Background(fuser::BackgroundSession);

impl Background {
    /// Unmounts and waits for the serving thread.
    pub fn unmount(self) -> std::io::Result<()> {
        self.0.umount_and_join()
    }
}

impl Mount {
    /// Mounts the datasets of the agent at `agent_uri` (`dquant://HOST:PORT`, or its Unix
    /// socket path) on `mountpoint`, with `plans` (name, plan) as streams under `plans/`.
    /// The agent is asked for its roots first, and each plan is opened once, so a wrong
    /// address, token or plan fails here rather than at the first read.
    pub fn new(
        agent_uri: &str,
        mountpoint: &Path,
        opts: MountOptions,
        plans: Vec<(String, Plan)>,
    ) -> Result<Self, MountError> {
        let u = AgentUri::parse(agent_uri).map_err(|e| MountError::Usage(e.to_string()))?;
        if !u.dataset.is_empty() {
            return Err(MountError::Usage(format!(
                "{agent_uri}: the mount shows every root of the agent; give its address alone \
                 (dquant://HOST:PORT)"
            )));
        }
        let creds = Credentials::from_env()?;
        let agent = agent::Agent::new(&u.authority, opts.timeout, creds);
        agent
            .list("")
            .map_err(|e| MountError::Usage(format!("agent {}: {e}", agent.authority())))?;
        let mut files = Vec::with_capacity(plans.len());
        for (name, plan) in plans {
            files.push(plan_file::PlanFile::new(&name, plan, agent_uri)?);
        }
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::RO,
            MountOption::FSName(format!("{FS_NAME_PREFIX}{}", u.authority)),
            MountOption::Subtype("dquant".into()),
            MountOption::NoDev,
            MountOption::NoSuid,
        ];
        if opts.allow_other {
            config.acl = SessionACL::All;
            config
                .mount_options
                .push(MountOption::CUSTOM("allow_other".into()));
        }
        config.n_threads = Some(opts.threads.max(1));
        config.clone_fd = true;
        let fs = fs::MountFs::new(agent, opts, files);
        let session = fuser::Session::new(fs, mountpoint, &config)
            .map_err(|e| MountError::Usage(format!("mounting on {}: {e}", mountpoint.display())))?;
        let mountpoint = mountpoint.canonicalize()?;
        Ok(Mount {
            session,
            mountpoint,
        })
    }

    pub fn unmounter(&mut self) -> Unmounter {
        Unmounter {
            inner: self.session.unmount_callable(),
            mountpoint: self.mountpoint.clone(),
        }
    }

    /// Serves until unmounted (`fusermount3 -u`, `umount`, or an [`Unmounter`]).
    pub fn run(self) -> std::io::Result<()> {
        self.session.run()
    }

    /// Serves from a background thread.
    pub fn spawn(self) -> std::io::Result<Background> {
        self.session.spawn().map(Background)
    }
}
