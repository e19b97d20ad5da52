//! What each path of the mount is, from the agent's listings (kept a short while) and the
//! plans; and the inode numbers the kernel knows paths by.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::agent::Agent;
use crate::error::MountError;
use crate::names::{children, files_of, DatasetFile};

/// The directory plan streams appear in.
pub const PLANS_DIR: &str = "plans";

/// The path of `name` in directory `dir` (`""` for the top).
pub fn join(dir: &str, name: &str) -> String {
    match dir {
        "" => name.to_string(),
        d => format!("{d}/{name}"),
    }
}

/// What one path is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    Dir,
    File(DatasetFile),
    /// `plans/NAME.bin`: the plan at this index of the mount's plans.
    Plan(usize),
}

/// Paths by inode and inodes by path. An inode, once given, keeps its path for the mount's
/// life (the kernel may ask about it at any time); their number is bounded by the datasets
/// and directories the agent ever listed.
#[derive(Default)]
struct Inodes {
    paths: Vec<String>,
    by_path: HashMap<String, u64>,
}

type Files = Arc<BTreeMap<String, DatasetFile>>;

pub struct Tree {
    ttl: Duration,
    plans: Vec<String>,
    inodes: Mutex<Inodes>,
    roots: Mutex<Option<(Instant, Arc<Vec<String>>)>>,
    listings: Mutex<HashMap<String, (Instant, Files)>>,
}

impl Tree {
    /// `plans`: the plan files' names, in the mount's order.
    pub fn new(ttl: Duration, plans: Vec<String>) -> Self {
        let t = Tree {
            ttl,
            plans,
            inodes: Mutex::default(),
            roots: Mutex::default(),
            listings: Mutex::default(),
        };
        t.inode_of("");
        t
    }

    /// The inode of `path`, given now if it had none (the top directory is 1).
    pub fn inode_of(&self, path: &str) -> u64 {
        let mut i = self.inodes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&ino) = i.by_path.get(path) {
            return ino;
        }
        i.paths.push(path.to_string());
        let ino = i.paths.len() as u64;
        i.by_path.insert(path.to_string(), ino);
        ino
    }

    pub fn path_of(&self, ino: u64) -> Option<String> {
        let i = self.inodes.lock().unwrap_or_else(|p| p.into_inner());
        let at = usize::try_from(ino).ok()?.checked_sub(1)?;
        i.paths.get(at).cloned()
    }

    /// What `path` is now: `Gone` when nothing is there.
    pub fn resolve(&self, agent: &Agent, path: &str) -> Result<Node, MountError> {
        let gone = || MountError::Gone(format!("{path}: no such dataset or directory"));
        if path.is_empty() {
            return Ok(Node::Dir);
        }
        let (top, rest) = path.split_once('/').unwrap_or((path, ""));
        if top == PLANS_DIR && !self.plans.is_empty() {
            return match rest {
                "" => Ok(Node::Dir),
                r => self
                    .plans
                    .iter()
                    .position(|p| format!("{p}.bin") == r)
                    .map(Node::Plan)
                    .ok_or_else(gone),
            };
        }
        if !self.roots(agent)?.iter().any(|r| r == top) {
            return Err(gone());
        }
        if rest.is_empty() {
            return Ok(Node::Dir);
        }
        let files = self.files(agent, top)?;
        if let Some(f) = files.get(path) {
            return Ok(Node::File(f.clone()));
        }
        let dir = format!("{path}/");
        match files.range(dir.clone()..).next() {
            Some((p, _)) if p.starts_with(&dir) => Ok(Node::Dir),
            _ => Err(gone()),
        }
    }

    /// The entries of directory `path`: name and whether it is a directory.
    pub fn list(&self, agent: &Agent, path: &str) -> Result<BTreeMap<String, bool>, MountError> {
        if path.is_empty() {
            let mut out: BTreeMap<String, bool> = self
                .roots(agent)?
                .iter()
                .map(|r| (r.clone(), true))
                .collect();
            if !self.plans.is_empty() {
                out.insert(PLANS_DIR.to_string(), true);
            }
            return Ok(out);
        }
        if path == PLANS_DIR && !self.plans.is_empty() {
            return Ok(self
                .plans
                .iter()
                .map(|p| (format!("{p}.bin"), false))
                .collect());
        }
        let top = path.split_once('/').map_or(path, |(t, _)| t);
        let files = self.files(agent, top)?;
        Ok(children(path, files.keys().map(|k| k.as_str())))
    }

    fn roots(&self, agent: &Agent) -> Result<Arc<Vec<String>>, MountError> {
        let mut slot = self.roots.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, r)) = &*slot {
            if at.elapsed() < self.ttl {
                return Ok(r.clone());
            }
        }
        let mut roots: Vec<String> = agent.list("")?.into_iter().map(|e| e.name).collect();
        if !self.plans.is_empty() && roots.iter().any(|r| r == PLANS_DIR) {
            tracing::warn!("the agent's root {PLANS_DIR:?} is hidden by the mount's plan streams");
            roots.retain(|r| r != PLANS_DIR);
        }
        let roots = Arc::new(roots);
        *slot = Some((Instant::now(), roots.clone()));
        Ok(roots)
    }

    fn files(&self, agent: &Agent, root: &str) -> Result<Files, MountError> {
        let mut l = self.listings.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, f)) = l.get(root) {
            if at.elapsed() < self.ttl {
                return Ok(f.clone());
            }
        }
        let files = Arc::new(files_of(&agent.list(root)?));
        l.insert(root.to_string(), (Instant::now(), files.clone()));
        Ok(files)
    }

    /// Forgets every listing, so the next look at any path asks the agent.
    pub fn forget_listings(&self) {
        self.listings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        *self.roots.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}
