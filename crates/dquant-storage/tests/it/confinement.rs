//! `LocalRoot` confinement: every file of a dataset is resolved beneath the root's directory
//! descriptor, links out of the root are refused however they are reached, special files are
//! refused by name without blocking, and swapping a directory for a link while names are
//! being opened never serves a byte from outside.
//!
//! Each check runs twice: on a root that uses `openat2` (this kernel's), and on one that
//! only walks component by component, the fallback for kernels without it.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use dquant_format::{DType, DocIndex};
use dquant_storage::{
    Dataset, DatasetWriter, LocalRoot, OpenOptions, OutputFormat, ReadAt, Root, RootError,
    StorageError,
};
use tempfile::TempDir;

use crate::common;
use common::mkfifo;

/// Both resolutions of one directory, named for failure messages.
fn roots(dir: &Path) -> [(&'static str, LocalRoot); 2] {
    [
        ("openat2", LocalRoot::new(dir).unwrap()),
        ("walk", LocalRoot::new_without_openat2(dir).unwrap()),
    ]
}

/// `T/root` (the root) and `T/outside`, both empty.
fn setup() -> (TempDir, PathBuf, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let (root, outside) = (t.path().join("root"), t.path().join("outside"));
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(&outside).unwrap();
    (t, root, outside)
}

/// A Megatron dataset `prefix.{idx,bin}` of one document: `tokens` as int32.
fn megatron(prefix: &Path, tokens: &[u32]) {
    std::fs::create_dir_all(prefix.parent().unwrap()).unwrap();
    let mut w =
        DatasetWriter::create(prefix, OutputFormat::Megatron { dtype: DType::I32 }).unwrap();
    w.push(tokens).unwrap();
    w.finish(&DocIndex::single(tokens.len() as u64)).unwrap();
}

fn open_err(root: &LocalRoot, name: &str) -> String {
    match Dataset::open_in(root, name, &OpenOptions::default()) {
        Ok(_) => panic!("{name}: opened"),
        Err(e) => e.to_string(),
    }
}

fn tokens(root: &LocalRoot, name: &str) -> Vec<u32> {
    let ds = Dataset::open_in(root, name, &OpenOptions::default()).unwrap();
    let mut out = Vec::new();
    ds.reader().read(0..ds.tokens(), &mut out).unwrap();
    out
}

fn listed(root: &LocalRoot) -> Vec<String> {
    root.objects()
        .unwrap()
        .into_iter()
        .map(|o| o.name)
        .collect()
}

fn all_bytes(f: &dyn ReadAt) -> Vec<u8> {
    let mut buf = vec![0u8; f.len() as usize];
    f.read_exact_at(&mut buf, 0).unwrap();
    buf
}

/// Runs `f` on a thread and fails if it takes more than five seconds (a blocking open).
fn quickly<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(f()));
    rx.recv_timeout(Duration::from_secs(5))
        .expect("blocked (a FIFO opened for reading?)")
}

#[test]
fn a_bin_linked_outside_beside_an_inside_idx_is_refused() {
    let (_t, root, outside) = setup();
    megatron(&root.join("m"), &[1, 2, 3, 4]);
    megatron(&outside.join("m"), &[9, 9, 9, 9]);
    std::fs::remove_file(root.join("m.bin")).unwrap();
    // Relative (openat2 refuses the `..`) and absolute (refused by the walk, after EXDEV).
    for target in [PathBuf::from("../outside/m.bin"), outside.join("m.bin")] {
        let _ = std::fs::remove_file(root.join("m.bin"));
        symlink(&target, root.join("m.bin")).unwrap();
        for (how, r) in roots(&root) {
            let err = Dataset::open_in(&r, "m", &OpenOptions::default()).err();
            assert!(
                matches!(&err, Some(StorageError::Root(RootError::Escape { name })) if name == "m.bin"),
                "{how} {target:?}: {err:?}"
            );
            assert_eq!(
                err.unwrap().to_string(),
                "m.bin: leads outside the root (symlink escape)",
                "{how}"
            );
            // By its own name, by stat, and in the listing: refused the same way.
            assert!(
                matches!(r.open("m.bin"), Err(RootError::Escape { .. })),
                "{how}"
            );
            assert!(
                matches!(r.stat("m.bin"), Err(RootError::Escape { .. })),
                "{how}"
            );
            assert_eq!(listed(&r), ["m.idx"], "{how}");
        }
    }
}

#[test]
fn an_intermediate_directory_linked_outside_is_refused() {
    let (_t, root, outside) = setup();
    megatron(&outside.join("m"), &[9, 9, 9, 9]);
    std::fs::create_dir(root.join("sub")).unwrap();
    symlink("../outside", root.join("d")).unwrap();
    symlink(&outside, root.join("abs")).unwrap();
    // Deeper: a link in a subdirectory that climbs out.
    symlink("../../outside", root.join("sub/up")).unwrap();
    for (how, r) in roots(&root) {
        for dir in ["d", "abs", "sub/up"] {
            assert_eq!(
                open_err(&r, &format!("{dir}/m")),
                format!("{dir}/m.idx: leads outside the root (symlink escape)"),
                "{how}"
            );
            let bin = format!("{dir}/m.bin");
            assert!(
                matches!(r.open(&bin), Err(RootError::Escape { .. })),
                "{how} {bin}"
            );
            assert!(
                matches!(r.stat(&bin), Err(RootError::Escape { .. })),
                "{how} {bin}"
            );
        }
        assert_eq!(listed(&r), Vec::<String>::new(), "{how}");
    }
}

#[test]
fn relative_links_that_stay_inside_are_followed() {
    let (_t, root, _outside) = setup();
    megatron(&root.join("data/m"), &[1, 2, 3, 4]);
    std::fs::create_dir(root.join("sub")).unwrap();
    // A directory link, file links, and links that climb and come back down.
    symlink("data", root.join("alias")).unwrap();
    symlink("data/m.idx", root.join("l.idx")).unwrap();
    symlink("./data/../data/m.bin", root.join("l.bin")).unwrap();
    symlink("../data/m.idx", root.join("sub/u.idx")).unwrap();
    symlink("../alias/m.bin", root.join("sub/u.bin")).unwrap();
    // A chain of links.
    symlink("l.bin", root.join("chain1")).unwrap();
    symlink("chain1", root.join("chain2")).unwrap();
    for (how, r) in roots(&root) {
        for name in ["data/m", "alias/m", "l", "sub/u"] {
            assert_eq!(tokens(&r, name), [1, 2, 3, 4], "{how} {name}");
        }
        let bin_len = r.stat("data/m.bin").unwrap().len;
        assert_eq!(r.stat("chain2").unwrap().len, bin_len, "{how}");
        assert_eq!(r.open("chain2").unwrap().len(), bin_len, "{how}");
        // Listed by the link's name; the directory link is not descended into.
        assert_eq!(
            listed(&r),
            [
                "chain1",
                "chain2",
                "data/m.bin",
                "data/m.idx",
                "l.bin",
                "l.idx",
                "sub/u.bin",
                "sub/u.idx"
            ],
            "{how}"
        );
    }
}

#[test]
fn absolute_links_into_the_root_are_followed() {
    let (_t, root, _outside) = setup();
    megatron(&root.join("data/m"), &[1, 2, 3, 4]);
    let real = root.canonicalize().unwrap();
    symlink(real.join("data/m.idx"), root.join("a.idx")).unwrap();
    symlink(real.join("data/m.bin"), root.join("a.bin")).unwrap();
    symlink(real.join("data"), root.join("adir")).unwrap();
    // Into the root, then out of it with `..`.
    symlink(real.join("data/../../outside"), root.join("sneaky")).unwrap();
    for (how, r) in roots(&root) {
        assert_eq!(tokens(&r, "a"), [1, 2, 3, 4], "{how}");
        assert_eq!(tokens(&r, "adir/m"), [1, 2, 3, 4], "{how}");
        assert!(
            matches!(r.stat("sneaky"), Err(RootError::Escape { .. })),
            "{how}"
        );
    }
}

#[test]
fn a_fifo_named_idx_is_refused_at_once() {
    let (_t, root, _outside) = setup();
    mkfifo(&root.join("x.idx"));
    std::fs::write(root.join("x.bin"), [0u8; 8]).unwrap();
    // Reached through a link, too.
    symlink("x.idx", root.join("y.idx")).unwrap();
    std::fs::write(root.join("y.bin"), [0u8; 8]).unwrap();
    for (how, r) in roots(&root) {
        for prefix in ["x", "y"] {
            let r2 = r.clone();
            let name = prefix.to_string();
            let err = quickly(move || open_err(&r2, &name));
            assert_eq!(err, format!("{prefix}.idx: not a regular file"), "{how}");
            let r2 = r.clone();
            let name = format!("{prefix}.idx");
            let err = quickly(move || r2.open(&name).err());
            assert!(
                matches!(err, Some(RootError::NotAFile { .. })),
                "{how} {err:?}"
            );
            assert!(
                matches!(
                    r.stat(&format!("{prefix}.idx")),
                    Err(RootError::NotAFile { .. })
                ),
                "{how}"
            );
        }
        assert_eq!(listed(&r), ["x.bin", "y.bin"], "{how}");
    }
}

#[test]
fn devices_and_sockets_are_refused_by_name() {
    let (_t, root, _outside) = setup();
    // A character device: /dev/null's numbers (a link to /dev/null would be an escape).
    rustix::fs::mknodat(
        rustix::fs::CWD,
        root.join("dev.idx"),
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::from_raw_mode(0o666),
        rustix::fs::makedev(1, 3),
    )
    .expect("mknod a character device (these tests run as root)");
    std::fs::write(root.join("dev.bin"), [0u8; 8]).unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(root.join("sock.idx")).unwrap();
    std::fs::write(root.join("sock.bin"), [0u8; 8]).unwrap();
    std::fs::create_dir(root.join("dir.idx")).unwrap();
    std::fs::write(root.join("dir.bin"), [0u8; 8]).unwrap();
    for (how, r) in roots(&root) {
        for prefix in ["dev", "sock", "dir"] {
            let r2 = r.clone();
            let name = prefix.to_string();
            let err = quickly(move || open_err(&r2, &name));
            assert_eq!(err, format!("{prefix}.idx: not a regular file"), "{how}");
            let name = format!("{prefix}.idx");
            let err = r.open(&name).err();
            assert_eq!(
                err.map(|e| e.to_string()),
                Some(format!("{prefix}.idx: not a regular file")),
                "{how}"
            );
            assert!(
                matches!(r.stat(&name), Err(RootError::NotAFile { .. })),
                "{how}"
            );
        }
        // The lone `.bin`s are raw objects; nothing special is listed.
        assert_eq!(listed(&r), ["dev.bin", "dir.bin", "sock.bin"], "{how}");
    }
}

#[test]
fn missing_names_loops_and_files_as_directories() {
    let (_t, root, _outside) = setup();
    std::fs::write(root.join("f"), b"x").unwrap();
    symlink("loop2", root.join("loop1")).unwrap();
    symlink("loop1", root.join("loop2")).unwrap();
    symlink(".", root.join("here")).unwrap();
    symlink("missing", root.join("dangling")).unwrap();
    for (how, r) in roots(&root) {
        for name in ["missing", "f/x", "dangling", "here/missing"] {
            let err = r.stat(name).err();
            assert!(
                matches!(err, Some(RootError::NotFound { .. })),
                "{how} {name}: {err:?}"
            );
        }
        // A link to a directory is a directory.
        for name in ["here", "here/here"] {
            let err = r.open(name).err();
            assert!(
                matches!(err, Some(RootError::NotAFile { .. })),
                "{how} {name}: {err:?}"
            );
        }
        assert_eq!(r.open("here/f").unwrap().len(), 1, "{how}");
        assert_eq!(
            r.open("loop1").err().map(|e| e.to_string()),
            Some("loop1: Too many levels of symbolic links (os error 40)".to_string()),
            "{how}"
        );
        // Neither the loop, the dangling link nor the directory link is listed.
        assert_eq!(listed(&r), ["f"], "{how}");
    }
}

/// A thread swaps `root/d` between a real directory and a link to `outside/d` (atomically,
/// `RENAME_EXCHANGE`) while names under `d` are opened for about a second: every open either
/// serves the inside bytes or is refused as an escape, and the outside bytes are never read.
/// (Checking a canonical path and then opening it fails this: the open follows a link
/// swapped in after the check.)
#[test]
fn swapping_a_directory_for_a_link_never_serves_outside_bytes() {
    let (_t, root, outside) = setup();
    megatron(&root.join("d/m"), &[1, 2, 3, 4]);
    std::fs::write(root.join("d/f"), b"inside").unwrap();
    megatron(&outside.join("d/m"), &[9, 9, 9, 9]);
    std::fs::write(outside.join("d/f"), b"SECRET").unwrap();
    symlink("../outside/d", root.join("swap")).unwrap();
    for (how, r) in roots(&root) {
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = {
            let (stop, root) = (stop.clone(), root.clone());
            std::thread::spawn(move || {
                let exchange = || {
                    rustix::fs::renameat_with(
                        rustix::fs::CWD,
                        root.join("d"),
                        rustix::fs::CWD,
                        root.join("swap"),
                        rustix::fs::RenameFlags::EXCHANGE,
                    )
                    .unwrap()
                };
                let mut swaps = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    exchange();
                    swaps += 1;
                }
                // Leave `d` a directory again.
                if swaps % 2 == 1 {
                    exchange();
                }
                swaps
            })
        };
        let (mut served, mut refused) = (0u64, 0u64);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(1) {
            match r.open("d/f") {
                Ok(f) => {
                    assert_eq!(all_bytes(&*f), b"inside", "{how}: read through the link");
                    served += 1;
                }
                Err(RootError::Escape { .. }) => refused += 1,
                Err(e) => panic!("{how}: d/f: {e}"),
            }
            match Dataset::open_in(&r, "d/m", &OpenOptions::default()) {
                Ok(ds) => {
                    let mut out = Vec::new();
                    ds.reader().read(0..4, &mut out).unwrap();
                    assert_eq!(out, [1, 2, 3, 4], "{how}: tokens from outside");
                    served += 1;
                }
                Err(StorageError::Root(RootError::Escape { .. })) => refused += 1,
                Err(e) => panic!("{how}: d/m: {e}"),
            }
        }
        stop.store(true, Ordering::Relaxed);
        let swaps = swapper.join().unwrap();
        // The race was run: the directory was swapped, and both states were seen.
        assert!(swaps > 10, "{how}: {swaps} swaps");
        assert!(
            served > 0 && refused > 0,
            "{how}: served {served}, refused {refused}"
        );
        assert_eq!(std::fs::read(root.join("d/f")).unwrap(), b"inside");
    }
}

/// Whether this kernel has `openat2` (Linux 5.6+): asked directly, as the root does.
fn kernel_has_openat2(dir: &Path) -> bool {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let fd = rustix::fs::open(dir, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
    let r = rustix::fs::openat2(&fd, ".", OFlags::PATH, Mode::empty(), ResolveFlags::BENEATH);
    !matches!(r, Err(rustix::io::Errno::NOSYS))
}

/// Confinement by `openat2` is observable: where the kernel has it, a root resolves plain
/// names with it and walks none of them (a link out of the root is handed to the walk, which
/// refuses it); the fallback root walks every name and calls `openat2` for none.
#[test]
fn plain_names_resolve_through_openat2_where_the_kernel_has_it() {
    let (_t, root, outside) = setup();
    megatron(&root.join("d/a"), &[1, 2, 3]);
    megatron(&outside.join("secret"), &[9]);
    symlink(outside.join("secret.idx"), root.join("d/out.idx")).unwrap();
    symlink(outside.join("secret.bin"), root.join("d/out.bin")).unwrap();

    let walk = LocalRoot::new_without_openat2(&root).unwrap();
    assert_eq!(tokens(&walk, "d/a"), [1, 2, 3]);
    let n = walk.resolutions();
    assert!(n.beneath == 0 && n.walked >= 2, "{n:?}");

    let has = kernel_has_openat2(&root);
    if !dquant_testkit::require("openat2 (Linux 5.6+)", has, "this kernel answers ENOSYS") {
        return;
    }
    let r = LocalRoot::new(&root).unwrap();
    assert_eq!(tokens(&r, "d/a"), [1, 2, 3]);
    let n = r.resolutions();
    assert!(n.beneath >= 2 && n.walked == 0, "{n:?}");
    // The absolute link out: openat2 answers EXDEV, the walk tells it apart and refuses.
    let e = open_err(&r, "d/out");
    assert!(e.contains("outside"), "{e}");
    let after = r.resolutions();
    assert!(after.walked >= 1, "{after:?}");
}
