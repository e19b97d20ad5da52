//! Read-only maps of local files that a truncation turns into an error, not a crash.
//!
//! Why: touching a page of a file mapping that lies past the file's end raises SIGBUS, and
//! SIGBUS ends the process. In the agent that would be every tenant's session ended by one
//! file truncated or rewritten under one reader. `pread` turns the same event into a short
//! read; a map is for readers whose many small reads would cost more in syscalls than in
//! bytes (a Megatron sample of short documents is a hundred pieces or more). This module
//! keeps the map and the guarantee:
//! - each live map registers its address range in a fixed table ([`SLOTS`]);
//! - one process-wide SIGBUS handler, installed with the first map, looks the faulting
//!   address up. A fault inside a registered map replaces the rest of that map with zero
//!   pages (an anonymous `MAP_FIXED` mapping, so the faulting load reads zeros and goes on)
//!   and marks the map damaged. Any other SIGBUS goes to the handler that was installed
//!   before, or to the default action (the process ends, as it would without this module);
//! - [`GuardedMap::read`] hands the bytes to a closure, then checks the mark: bytes a fault
//!   replaced are never returned as data, the read is an error saying the file shrank.
//!
//! A damaged map stays damaged: every later read of it is the same error, as the file is
//! being rewritten. When the table is full, or the handler cannot be installed, mapping is
//! refused and callers read with `pread` instead.
//!
//! Written by hand on `libc::sigaction`, as no crate does this job: `memmap2` maps but does
//! not guard, and `signal-hook-registry` calls the previous handler after its own (a
//! fault it handled would then still end the process under a chained default) and never
//! restores the default action (a fault it did not handle would run again forever).

use std::fs::File;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{compiler_fence, fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

use crate::StorageError;

/// How many maps may be live at once in a process. Each open Megatron source of each build
/// holds one; past this, sources are read with `pread`.
pub const MAX_MAPS: usize = 4096;

/// A read-only map of a whole local file whose truncation under a reader is an error.
pub struct GuardedMap {
    map: memmap2::Mmap,
    slot: usize,
    path: PathBuf,
}

impl std::fmt::Debug for GuardedMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedMap")
            .field("path", &self.path)
            .field("len", &self.map.len())
            .field("damaged", &self.is_damaged())
            .finish()
    }
}

impl GuardedMap {
    /// Maps `file` (reported as `path`). `Ok(None)` where it cannot be guarded (the table of
    /// live maps is full, or SIGBUS's handler could not be installed) or is empty: the
    /// caller reads with `pread` then.
    pub fn map(file: &File, path: &Path) -> Result<Option<GuardedMap>, StorageError> {
        if install_handler().is_err() {
            return Ok(None);
        }
        // SAFETY: the map is read-only. A file rewritten in place under it changes the bytes
        // a reader sees (as under `pread`); one truncated under it faults, and the fault is
        // this module's to turn into an error (see the module doc).
        let map = unsafe { memmap2::Mmap::map(file) }.map_err(|e| StorageError::io(path, e))?;
        if map.is_empty() {
            return Ok(None);
        }
        let start = map.as_ptr() as usize;
        let end = start + round_to_page(map.len());
        let Some(slot) = register(start..end) else {
            return Ok(None);
        };
        Ok(Some(GuardedMap {
            map,
            slot,
            path: path.to_path_buf(),
        }))
    }

    /// The file's length when it was mapped.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True for an empty map (never made: [`GuardedMap::map`] refuses empty files).
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Whether a fault showed the file shorter than its map.
    pub fn is_damaged(&self) -> bool {
        SLOTS[self.slot].damaged.load(Ordering::SeqCst)
    }

    /// Calls `f` with the bytes of `range` and returns what it returns; an error where the
    /// range is past the map's end, or where the file was found shorter than its map, before
    /// or during `f` (what `f` computed from zero pages is dropped).
    pub fn read<R>(
        &self,
        range: Range<usize>,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, StorageError> {
        let needed = range.end as u64;
        let Some(bytes) = self.map.get(range) else {
            let len = self.map.len() as u64;
            return Err(crate::dataset::shorter_than_needed(&self.path, len, needed));
        };
        if self.is_damaged() {
            return Err(self.truncated(needed));
        }
        let out = f(bytes);
        // The handler runs on this thread, inside `f`'s loads: keep them before the check.
        compiler_fence(Ordering::SeqCst);
        if self.is_damaged() {
            return Err(self.truncated(needed));
        }
        Ok(out)
    }

    /// Asks the kernel to bring the file's pages in through this map as whole 2 MiB folios
    /// (`MADV_HUGEPAGE`), for a map its owner keeps resident: a page fault on an uncached
    /// page then reads its whole aligned 2 MiB, not 4 KiB pieces. An error where the kernel
    /// has no transparent huge pages (nothing changes then).
    ///
    /// Why: pages a shuffled pass faults in one by one stay cached in 4 KiB folios, and every
    /// later read of them, by this map, by `pread` or by `cat`, runs 2-3x slower than over a
    /// file cached in 2 MiB folios (docs/benchmarks.md, the cost area). With the advice a
    /// shuffled first pass leaves the file as a read in order would, and reads the disk in
    /// 2 MiB pieces. Only for maps kept whole in memory: over a file larger than memory, a
    /// 16 KiB sample would read 2 MiB that may be evicted before the rest is used.
    pub fn advise_large_folios(&self) -> io::Result<()> {
        self.map.advise(memmap2::Advice::HugePage)
    }

    /// Hints that the bytes of `range` (what of it lies in the map) will be read soon: a
    /// prefetch, which never faults, so no guard is needed ([`crate::prefetch`]).
    pub fn prefetch(&self, range: Range<usize>) {
        let end = range.end.min(self.map.len());
        if range.start < end {
            crate::prefetch::prefetch(self.map[range.start..].as_ptr(), end - range.start);
        }
    }

    fn truncated(&self, needed: u64) -> StorageError {
        crate::dataset::shrunk_while_read(&self.path, self.map.len() as u64, needed)
    }
}

impl Drop for GuardedMap {
    fn drop(&mut self) {
        // Before `map` unmaps: no fault can come from a map no one reads any more, and the
        // range is free for the next map to take.
        unregister(self.slot);
    }
}

/// The page size, read once before the handler is installed (the handler reads it too, and
/// `sysconf` is not among the functions a handler may call).
static PAGE_SIZE: AtomicUsize = AtomicUsize::new(0);

fn page_size() -> usize {
    let p = PAGE_SIZE.load(Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    // SAFETY: sysconf has no preconditions.
    let p = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    PAGE_SIZE.store(p, Ordering::Relaxed);
    p
}

fn round_to_page(n: usize) -> usize {
    let p = page_size();
    n.div_ceil(p) * p
}

/// One live map's address range and its damage mark. `seq` is odd while the slot is being
/// written, and changes with each write, so the handler reads a range whole or skips it.
struct Slot {
    used: AtomicBool,
    seq: AtomicUsize,
    start: AtomicUsize,
    end: AtomicUsize,
    damaged: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    used: AtomicBool::new(false),
    seq: AtomicUsize::new(0),
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    damaged: AtomicBool::new(false),
};

/// The live maps. Fixed and static: the handler may read only memory that cannot move or
/// be freed under it.
static SLOTS: [Slot; MAX_MAPS] = [FREE; MAX_MAPS];

fn register(range: Range<usize>) -> Option<usize> {
    let i = SLOTS.iter().position(|s| {
        s.used
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    })?;
    write_slot(&SLOTS[i], range);
    Some(i)
}

fn unregister(i: usize) {
    write_slot(&SLOTS[i], 0..0);
    SLOTS[i].used.store(false, Ordering::Release);
}

fn write_slot(s: &Slot, range: Range<usize>) {
    s.seq.fetch_add(1, Ordering::AcqRel);
    fence(Ordering::Release);
    s.start.store(range.start, Ordering::Relaxed);
    s.end.store(range.end, Ordering::Relaxed);
    s.damaged.store(false, Ordering::Relaxed);
    s.seq.fetch_add(1, Ordering::Release);
}

/// The slot whose range holds `addr`, read as the handler may: atomics only, no lock, no
/// allocation. A slot being written is skipped: it is not the faulting thread's map, which
/// is live (the thread is reading it) and so unchanging.
fn lookup(addr: usize) -> Option<&'static Slot> {
    SLOTS.iter().find(|s| {
        let before = s.seq.load(Ordering::Acquire);
        if before % 2 == 1 {
            return false;
        }
        let (start, end) = (
            s.start.load(Ordering::Relaxed),
            s.end.load(Ordering::Relaxed),
        );
        fence(Ordering::Acquire);
        s.seq.load(Ordering::Relaxed) == before && (start..end).contains(&addr)
    })
}

/// The SIGBUS action that was installed before this module's, called for faults outside
/// every map.
static PREVIOUS: OnceLock<Result<libc::sigaction, i32>> = OnceLock::new();

fn install_handler() -> Result<(), i32> {
    let installed = PREVIOUS.get_or_init(|| {
        page_size();
        // SAFETY: a zeroed sigaction is a valid value (empty mask, no flags); the handler
        // below is async-signal-safe (atomics, mmap, sigaction and raise only).
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            let mut previous: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, &action, &mut previous) != 0 {
                return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
            }
            Ok(previous)
        }
    });
    installed.as_ref().map(|_| ()).map_err(|&e| e)
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    // A positive code is a fault the kernel raised; zero and below were sent (kill, raise).
    if code > 0 {
        if let Some(slot) = lookup(addr) {
            if zero_fill(slot, addr) {
                return;
            }
        }
    }
    forward(sig, info, ctx);
}

/// Replaces the map's pages from `addr`'s to its end with zero pages, and marks it damaged.
fn zero_fill(slot: &Slot, addr: usize) -> bool {
    let from = addr & !(page_size() - 1);
    let end = slot.end.load(Ordering::Relaxed);
    // SAFETY: [from, end) lies inside a live map this process made (the slot says so); the
    // new mapping replaces those pages only, and is unmapped with the map.
    let replaced = unsafe {
        libc::mmap(
            from as *mut libc::c_void,
            end - from,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if replaced == libc::MAP_FAILED {
        return false;
    }
    slot.damaged.store(true, Ordering::SeqCst);
    true
}

/// Hands a SIGBUS this module does not own to the action installed before it.
fn forward(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let previous = match PREVIOUS.get() {
        Some(Ok(p)) => p,
        _ => return default_action(sig, info),
    };
    let handler = previous.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        return default_action(sig, info);
    }
    // SAFETY: `handler` is the function the previous action named, of the signature its
    // flags say.
    unsafe {
        if previous.sa_flags & libc::SA_SIGINFO != 0 {
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                std::mem::transmute(handler);
            f(sig, info, ctx);
        } else {
            let f: extern "C" fn(libc::c_int) = std::mem::transmute(handler);
            f(sig);
        }
    }
}

/// Restores the default action: a fault then runs again and ends the process with SIGBUS,
/// as it would have without this module; a sent signal is sent again.
fn default_action(sig: libc::c_int, info: *mut libc::siginfo_t) {
    // SAFETY: sigaction and raise are async-signal-safe; a zeroed action is SIG_DFL.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(sig, &action, std::ptr::null_mut());
        if (*info).si_code <= 0 {
            libc::raise(sig);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn file_of(pages: usize) -> (tempfile::NamedTempFile, Vec<u8>) {
        let bytes: Vec<u8> = (0..pages * page_size()).map(|i| (i % 251) as u8).collect();
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&bytes).unwrap();
        (f, bytes)
    }

    fn sum(b: &[u8]) -> u64 {
        b.iter().map(|&x| x as u64).sum()
    }

    #[test]
    fn reads_the_file_and_refuses_past_its_end() {
        let (f, bytes) = file_of(3);
        let m = GuardedMap::map(f.as_file(), f.path()).unwrap().unwrap();
        let p = page_size();
        assert_eq!(m.read(p..3 * p, sum).unwrap(), sum(&bytes[p..]));
        let e = m.read(p..3 * p + 1, sum).unwrap_err().to_string();
        assert!(
            e.ends_with(&format!("needs {} bytes but has {}", 3 * p + 1, 3 * p)),
            "{e}"
        );
    }

    /// The `VmFlags` of the mapping that starts at `start` in this process, from
    /// `/proc/self/smaps`.
    fn vm_flags(start: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let head = format!("{start:x}-");
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&head));
        lines
            .find_map(|l| l.strip_prefix("VmFlags:"))
            .unwrap_or_else(|| panic!("no mapping at {head} in /proc/self/smaps"))
            .to_string()
    }

    #[test]
    fn a_kept_map_asks_for_large_folios() {
        let (f, _) = file_of(4);
        let m = GuardedMap::map(f.as_file(), f.path()).unwrap().unwrap();
        let start = m.map.as_ptr() as usize;
        let huge = |flags: &str| flags.split_whitespace().any(|f| f == "hg");
        let before = vm_flags(start);
        assert!(!huge(&before), "{before}");
        if std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() {
            m.advise_large_folios().unwrap();
            let after = vm_flags(start);
            assert!(huge(&after), "{after}");
        } else {
            assert!(m.advise_large_folios().is_err());
        }
    }

    #[test]
    fn a_file_truncated_under_the_map_is_an_error_every_read_after() {
        let (f, _) = file_of(4);
        let m = GuardedMap::map(f.as_file(), f.path()).unwrap().unwrap();
        let p = page_size();
        f.as_file().set_len(p as u64).unwrap();
        // The first page is still there; the third is not, and faults.
        let e = m.read(2 * p..3 * p, sum).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "{}: the file is shorter than when it was opened ({} bytes; a read needed {}): \
                 it was truncated or rewritten while being read",
                f.path().display(),
                4 * p,
                3 * p
            )
        );
        assert!(m.is_damaged());
        assert!(m.read(0..p, sum).is_err());
        // The next map of the same file is whole again, and so is its slot.
        drop(m);
        let again = GuardedMap::map(f.as_file(), f.path()).unwrap().unwrap();
        assert!(!again.is_damaged());
        assert_eq!(again.read(0..p, |b| b.len()).unwrap(), p);
    }

    /// Runs `child` in a forked process and returns the signal that ended it (`None` if it
    /// exited), killing it after 10 s (a fault handled wrongly runs again forever).
    fn ended_by(child: impl FnOnce()) -> Option<i32> {
        // SAFETY: the child only runs `child` (a volatile load or a raise: no lock, no
        // allocation), then `_exit`.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            child();
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        for _ in 0..1000 {
            // SAFETY: `pid` is this process's child.
            if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
                return libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status));
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        unsafe { libc::kill(pid, libc::SIGKILL) };
        panic!("the child neither ended nor exited in 10 s");
    }

    /// A fault outside every guarded map still ends the process with SIGBUS, as without the
    /// handler. (Here the action before this module's is Rust's own stack-overflow handler,
    /// which restores the default and lets the fault run again.)
    #[test]
    fn a_sigbus_outside_the_guarded_maps_still_ends_the_process() {
        let (guarded, _) = file_of(2);
        let _m = GuardedMap::map(guarded.as_file(), guarded.path())
            .unwrap()
            .unwrap();
        let (f, _) = file_of(4);
        // SAFETY: read-only; the fault it meets is the point of the test.
        let plain = unsafe { memmap2::Mmap::map(f.as_file()) }.unwrap();
        f.as_file().set_len(page_size() as u64).unwrap();
        let at = plain[2 * page_size()..].as_ptr();
        let fault = ended_by(|| {
            // SAFETY: a valid address of a live map; the file behind it is shorter.
            unsafe { std::ptr::read_volatile(at) };
        });
        assert_eq!(fault, Some(libc::SIGBUS));
    }

    #[test]
    fn many_maps_fault_on_many_threads_and_each_reports_its_own() {
        let files: Vec<_> = (0..8).map(|_| file_of(16)).collect();
        let maps: Vec<_> = files
            .iter()
            .map(|(f, _)| GuardedMap::map(f.as_file(), f.path()).unwrap().unwrap())
            .collect();
        // Half the files shrink; readers of the others see their whole bytes.
        for (f, _) in files.iter().step_by(2) {
            f.as_file().set_len(page_size() as u64 * 3).unwrap();
        }
        std::thread::scope(|s| {
            for (k, (m, (_, bytes))) in maps.iter().zip(&files).enumerate() {
                s.spawn(move || {
                    for _ in 0..50 {
                        let got = m.read(0..m.len(), sum);
                        if k % 2 == 0 {
                            assert!(got.is_err(), "map {k}");
                        } else {
                            assert_eq!(got.unwrap(), sum(bytes), "map {k}");
                        }
                    }
                });
            }
        });
    }
}
