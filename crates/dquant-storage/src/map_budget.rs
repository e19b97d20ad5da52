//! How many bytes of files a process may keep mapped for narrowing ([`crate::Dataset::narrow_kept`]).
//!
//! Why: narrowing int32 ids (or copying uint16 ones) straight out of a map kept with the
//! dataset skips the page-cache copy a `pread` makes, and on the agent's shared-memory path
//! that copy is most of its CPU (`bench/RESULTS.md`, the cost and profile areas). A kept map's
//! price is the page tables of every page it touched, 2 MiB a GiB, for as long as the dataset
//! stays open, and the file's touched pages counted in the process's `VmRSS` (they are the page
//! cache's, shared, and evictable as before). It pays while the corpus is read from the page
//! cache again and again; a corpus larger than memory is read from storage anyway, where the
//! copy is not what limits. So an agent keeps maps of datasets up to a budget of bytes (by
//! default half this host's memory) and reads the rest by `pread`: the first datasets opened
//! take the budget, and one whose file would pass it is read the usual way for as long as it
//! stays open. Plans read in a process of their own (a trainer, a DataLoader worker) share one
//! budget of that process, set by `DQUANT_MAP_BUDGET`, by default the same half:
//! Megatron-Core's own datasets map their files whole.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::StorageError;

/// The environment variable that sets the map budget of plans read in this process (not on
/// an agent, whose config has its own `map_budget`): a size such as `8GiB` or `4294967296`
/// ([`crate::bytes_of`]), 0 for no maps.
pub const MAP_BUDGET_ENV: &str = "DQUANT_MAP_BUDGET";

/// The bytes of files that may be kept mapped at once, and how many are.
#[derive(Debug)]
pub struct MapBudget {
    limit: u64,
    used: AtomicU64,
}

impl MapBudget {
    /// A budget of `limit` bytes (0: no maps, `u64::MAX`: every file).
    pub fn new(limit: u64) -> Arc<MapBudget> {
        Arc::new(MapBudget {
            limit,
            used: AtomicU64::new(0),
        })
    }

    /// No bound: every file that can be mapped is.
    pub fn unlimited() -> Arc<MapBudget> {
        MapBudget::new(u64::MAX)
    }

    /// Half of this host's physical memory (`sysconf`'s pages), the default for an agent:
    /// corpora that fit in the page cache beside everything else the host runs. 0 where the
    /// host does not say.
    pub fn half_of_memory() -> u64 {
        // SAFETY: sysconf has no preconditions; -1 (unknown) becomes 0 below.
        let (pages, size) = unsafe {
            (
                libc::sysconf(libc::_SC_PHYS_PAGES),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let pages = u64::try_from(pages).unwrap_or(0);
        let size = u64::try_from(size).unwrap_or(0);
        pages.saturating_mul(size) / 2
    }

    /// A budget of `bytes`, or none (no maps) for 0: how a budget set to 0 reads, wherever it
    /// is set.
    pub fn of(bytes: u64) -> Option<Arc<MapBudget>> {
        (bytes > 0).then(|| MapBudget::new(bytes))
    }

    /// The budget of plans read in this process, shared by all of them: [`MAP_BUDGET_ENV`]'s
    /// size, or half this host's memory; `None` for 0. Read once; a value that is not a size
    /// is an error, the same at every call.
    pub fn of_this_process() -> Result<Option<Arc<MapBudget>>, StorageError> {
        static BUDGET: OnceLock<Result<Option<Arc<MapBudget>>, StorageError>> = OnceLock::new();
        match BUDGET
            .get_or_init(|| MapBudget::from_setting(std::env::var(MAP_BUDGET_ENV).ok().as_deref()))
        {
            Ok(b) => Ok(b.clone()),
            Err(e) => Err(StorageError::Usage(e.to_string())),
        }
    }

    /// The budget a [`MAP_BUDGET_ENV`] value sets (`None`: unset, half this host's memory).
    fn from_setting(value: Option<&str>) -> Result<Option<Arc<MapBudget>>, StorageError> {
        let bytes = match value.map(str::trim) {
            None | Some("") => MapBudget::half_of_memory(),
            Some(v) => crate::bytes_of(v).ok_or_else(|| {
                StorageError::Usage(format!(
                    "{MAP_BUDGET_ENV}={v:?}: not a size (examples: 8GiB, 512MiB, 0 for no maps)"
                ))
            })?,
        };
        Ok(MapBudget::of(bytes))
    }

    /// The budget's bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The bytes leased now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Leases `bytes` for a map, or `None` when they would pass the budget. The lease gives
    /// them back when dropped.
    pub fn lease(self: &Arc<Self>, bytes: u64) -> Option<MapLease> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&n| n <= self.limit)
            })
            .ok()?;
        Some(MapLease {
            budget: Arc::clone(self),
            bytes,
        })
    }
}

/// Bytes of a [`MapBudget`] held by one kept map, given back on drop.
#[derive(Debug)]
pub struct MapLease {
    budget: Arc<MapBudget>,
    bytes: u64,
}

impl Drop for MapLease {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_stay_within_the_budget_and_give_their_bytes_back() {
        let b = MapBudget::new(100);
        let a = b.lease(60).unwrap();
        assert!(b.lease(41).is_none());
        let c = b.lease(40).unwrap();
        assert_eq!(b.used(), 100);
        assert!(b.lease(1).is_none());
        drop(a);
        assert_eq!(b.used(), 40);
        assert!(b.lease(61).is_none());
        let d = b.lease(60).unwrap();
        drop((c, d));
        assert_eq!(b.used(), 0);
        assert!(MapBudget::new(0).lease(1).is_none());
        assert!(MapBudget::new(0).lease(0).is_some());
        let u = MapBudget::unlimited();
        let _big = u.lease(u64::MAX - 1).unwrap();
        assert!(
            u.lease(2).is_none(),
            "a sum past u64 is refused, not wrapped"
        );
    }

    #[test]
    fn the_process_budget_is_bytes_from_the_environment_or_half_of_memory() {
        let limit = |v| {
            MapBudget::from_setting(v)
                .map(|b| b.map(|b| b.limit()))
                .map_err(|e| e.to_string())
        };
        assert_eq!(limit(None), Ok(Some(MapBudget::half_of_memory())));
        assert_eq!(limit(Some(" ")), Ok(Some(MapBudget::half_of_memory())));
        assert_eq!(limit(Some("0")), Ok(None));
        assert_eq!(limit(Some("4096")), Ok(Some(4096)));
        assert_eq!(limit(Some("8GiB")), Ok(Some(8 << 30)));
        assert_eq!(limit(Some("0 MiB")), Ok(None));
        assert_eq!(
            limit(Some("8GB")),
            Err(
                "DQUANT_MAP_BUDGET=\"8GB\": not a size (examples: 8GiB, 512MiB, 0 for no maps)"
                    .into()
            )
        );
        assert!(limit(Some("-1")).is_err());
    }

    #[test]
    fn half_of_memory_is_half_of_what_the_host_has() {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
        let kib: u64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        let half = MapBudget::half_of_memory();
        // MemTotal leaves out the kernel's reserved pages; sysconf's count is close to it.
        let want = kib * 1024 / 2;
        assert!(
            half >= want * 9 / 10 && half <= want * 11 / 10,
            "{half} vs {want}"
        );
    }
}
