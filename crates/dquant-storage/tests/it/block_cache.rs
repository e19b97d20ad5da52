//! The block cache: a cached root conforms like any root; hits, misses and evictions keep
//! its budget; a damaged entry is never served; a new version of an object never meets the
//! old one's blocks; entries survive a restart; concurrent readers read the root's bytes.

use std::path::Path;
use std::sync::Arc;

use dquant_storage::conformance;
use dquant_storage::{BlockCache, CachedRoot, LocalRoot, ReadAt, Root};
use tempfile::TempDir;

use crate::common;
use common::Owned;

fn cached(objects: &[(&str, &[u8])]) -> Box<dyn Root> {
    let data = tempfile::tempdir().unwrap();
    for (name, bytes) in objects {
        let p = data.path().join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, bytes).unwrap();
    }
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = BlockCache::open(cache_dir.path(), 1 << 20, 4096).unwrap();
    let local = Arc::new(LocalRoot::new(data.path()).unwrap());
    Box::new(Owned {
        root: CachedRoot::new(local, "local", cache),
        _keep: (data, cache_dir),
    })
}

#[test]
fn a_cached_root_conforms() {
    conformance::run(&cached);
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8 ^ salt).collect()
}

fn read(f: &dyn ReadAt, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, offset).unwrap();
    buf
}

/// `(data dir, cache dir, root)` over one object `obj` of 100 KiB in 4 KiB blocks, with a
/// budget of `blocks` blocks.
fn setup(blocks: u64) -> (TempDir, TempDir, CachedRoot, Arc<BlockCache>, Vec<u8>) {
    let data = tempfile::tempdir().unwrap();
    let bytes = pattern(100 << 10, 0);
    std::fs::write(data.path().join("obj"), &bytes).unwrap();
    let cdir = tempfile::tempdir().unwrap();
    let cache = BlockCache::open(cdir.path(), blocks * (4096 + 8), 4096).unwrap();
    let local = Arc::new(LocalRoot::new(data.path()).unwrap());
    let root = CachedRoot::new(local, "local", cache.clone());
    (data, cdir, root, cache, bytes)
}

fn entries(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

#[test]
fn hits_after_misses_and_damaged_entries_are_refetched() {
    let (_d, cdir, root, cache, bytes) = setup(100);
    let f = root.open("obj").unwrap();
    assert_eq!(read(&*f, 0, bytes.len()), bytes);
    let s = cache.stats();
    assert_eq!((s.misses, s.hits, s.entries), (25, 0, 25));
    // Unaligned reads inside cached blocks.
    assert_eq!(read(&*f, 4000, 9000), bytes[4000..13000]);
    assert_eq!(cache.stats().hits, 4);
    // One entry altered, one truncated: neither is served.
    let files = entries(cdir.path());
    let mut b = std::fs::read(&files[0]).unwrap();
    b[10] ^= 0xff;
    std::fs::write(&files[0], &b).unwrap();
    std::fs::write(&files[1], &b[..100]).unwrap();
    assert_eq!(read(&*f, 0, bytes.len()), bytes);
    let s = cache.stats();
    assert_eq!(s.corrupt, 2, "{s:?}");
    assert_eq!(s.entries, 25);
    // Refetched and stored again: the next pass is all hits.
    let hits = s.hits;
    assert_eq!(read(&*f, 0, bytes.len()), bytes);
    assert_eq!(cache.stats().hits - hits, 25);
}

#[test]
fn the_budget_holds_and_least_recently_used_blocks_go_first() {
    let (_d, cdir, root, cache, bytes) = setup(5);
    let f = root.open("obj").unwrap();
    assert_eq!(read(&*f, 0, bytes.len()), bytes);
    let s = cache.stats();
    assert_eq!((s.entries, s.evictions), (5, 20), "{s:?}");
    assert!(s.bytes <= 5 * (4096 + 8));
    assert_eq!(entries(cdir.path()).len(), 5);
    // The last five blocks are held; block 0 is not.
    assert_eq!(read(&*f, 20 * 4096, 5 * 4096), bytes[20 * 4096..25 * 4096]);
    assert_eq!(cache.stats().hits, 5);
    let misses = cache.stats().misses;
    assert_eq!(read(&*f, 0, 10), bytes[..10]);
    assert_eq!(cache.stats().misses, misses + 1);
}

#[test]
fn a_new_version_never_meets_old_blocks_and_entries_survive_a_restart() {
    let (data, cdir, root, cache, bytes) = setup(100);
    assert_eq!(read(&*root.open("obj").unwrap(), 0, 8192), bytes[..8192]);
    // Rewritten in place with other bytes of the same length: another version.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let other = pattern(100 << 10, 0x5a);
    std::fs::write(data.path().join("obj"), &other).unwrap();
    assert_eq!(read(&*root.open("obj").unwrap(), 0, 8192), other[..8192]);
    assert_eq!(cache.stats().hits, 0);
    drop((root, cache));
    // A new cache over the same directory finds the entries.
    let again = BlockCache::open(cdir.path(), 100 * (4096 + 8), 4096).unwrap();
    assert_eq!(again.stats().entries, 4);
    let local = Arc::new(LocalRoot::new(data.path()).unwrap());
    let root = CachedRoot::new(local, "local", again.clone());
    assert_eq!(read(&*root.open("obj").unwrap(), 0, 8192), other[..8192]);
    assert_eq!(again.stats().hits, 2);
}

#[test]
fn concurrent_readers_read_the_roots_bytes() {
    let (_d, _c, root, _cache, bytes) = setup(8);
    let root = Arc::new(root);
    let bytes = Arc::new(bytes);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (root, bytes) = (root.clone(), bytes.clone());
            std::thread::spawn(move || {
                let f = root.open("obj").unwrap();
                let mut x = t + 1;
                for _ in 0..300 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let off = (x >> 33) % (bytes.len() as u64 - 10_000);
                    let len = 1 + (x >> 20) as usize % 9_999;
                    assert_eq!(read(&*f, off, len), bytes[off as usize..off as usize + len]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn bad_block_sizes_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let e = BlockCache::open(d.path(), 1 << 20, 100).unwrap_err();
    assert_eq!(
        e.to_string(),
        "block cache: block_bytes must be between 4 KiB and 64 MiB"
    );
}
