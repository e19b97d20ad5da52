//! `dquant mount` end to end: a real agent process, a real FUSE mount (the `dquant mount`
//! process), and the files read back as a trainer would, compared byte for byte with what
//! `dquant convert` and `dquant read` write locally.
//!
//! Needs `/dev/fuse` and root. Without them each test fails under `CI=true` (CI has both, so
//! a pass there means the mount was checked) and elsewhere says SKIPPED loudly.

use std::fs::File;
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dquant_format::{DType, DocIndexBuilder};
use dquant_mount::is_mounted;
use dquant_plan::{Plan, Source};
use dquant_storage::{DatasetWriter, OutputFormat};
use dquant_testkit::fixture;
use dquant_testkit::process::AgentProcess;

const BIN: &str = env!("CARGO_BIN_EXE_dquant");

fn fuse_available() -> bool {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let fuse = Path::new("/dev/fuse").exists();
    dquant_testkit::require(
        "FUSE",
        fuse && root,
        &format!("dquant mount needs /dev/fuse and root; have /dev/fuse: {fuse}, root: {root}"),
    )
}

/// A `dquant mount` process; unmounted (SIGTERM) and reaped when dropped.
struct Mounted {
    child: Child,
    dir: PathBuf,
    log: PathBuf,
}

impl Mounted {
    fn start(agent: &str, dir: &Path, extra: &[&str]) -> Mounted {
        std::fs::create_dir_all(dir).unwrap();
        let log = dir.with_extension("log");
        let out = File::create(&log).unwrap();
        let child = Command::new(BIN)
            .args(["mount", agent, dir.to_str().unwrap(), "--timeout", "3"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        let mut m = Mounted {
            child,
            dir: dir.to_path_buf(),
            log,
        };
        let t0 = Instant::now();
        while !is_mounted(dir) {
            if let Some(s) = m.child.try_wait().unwrap() {
                panic!("dquant mount ended ({s}):\n{}", m.log());
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "not mounted:\n{}",
                m.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        m
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    /// Ends the mount process with `sig` and checks it unmounted and exited cleanly.
    fn stop(mut self, sig: libc::c_int) {
        dquant_testkit::process::kill(self.child.id(), sig).unwrap();
        let status = wait(&mut self.child, Duration::from_secs(10));
        assert!(
            status.success(),
            "dquant mount exited {status}:\n{}",
            self.log()
        );
        assert!(
            !is_mounted(&self.dir),
            "still mounted after the process ended"
        );
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = dquant_testkit::process::kill(self.child.id(), libc::SIGTERM);
            let _ = wait(&mut self.child, Duration::from_secs(10));
        }
        if is_mounted(&self.dir) {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

fn wait(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            panic!("the process did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn dquant(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "dquant {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The names in directory `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut n: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    n.sort();
    n
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A root with the three Megatron fixtures and a zstd block file of the int32 one.
fn fixtures_root(dir: &Path) -> PathBuf {
    let root = dir.join("corpus");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    for name in ["r50k_int32", "r50k_uint16", "r50k_int32_multiseq"] {
        for ext in ["bin", "idx"] {
            let to = if name == "r50k_int32_multiseq" {
                root.join("sub").join(format!("{name}.{ext}"))
            } else {
                root.join(format!("{name}.{ext}"))
            };
            std::fs::copy(fixture(&format!("{name}.{ext}")), to).unwrap();
        }
    }
    let src = fixture("r50k_int32");
    let dqb = root.join("blocks.dqb");
    dquant(&[
        "convert",
        src.to_str().unwrap(),
        dqb.to_str().unwrap(),
        "--codec",
        "auto+zstd:3",
        "-q",
    ]);
    root
}

/// A temporary directory with [`fixtures_root`] in it, and an agent serving that root as
/// `corpus`.
fn fixtures_agent() -> (tempfile::TempDir, PathBuf, AgentProcess) {
    let tmp = tempfile::tempdir().unwrap();
    let root = fixtures_root(tmp.path());
    let agent = AgentProcess::start(BIN, &["--root", &format!("corpus={}", root.display())]);
    (tmp, root, agent)
}

/// `dquant convert SRC DIR/NAME --codec CODEC` (a local Megatron pair), returning its prefix.
fn convert(src: &Path, dir: &Path, name: &str, codec: &str) -> PathBuf {
    let dst = dir.join(name);
    dquant(&[
        "convert",
        src.to_str().unwrap(),
        dst.to_str().unwrap(),
        "--codec",
        codec,
        "-q",
    ]);
    dst
}

fn with_ext(p: &Path, ext: &str) -> PathBuf {
    PathBuf::from(format!("{}.{ext}", p.display()))
}

#[test]
fn datasets_appear_as_megatron_files_equal_to_local_conversions() {
    if !fuse_available() {
        return;
    }
    let (tmp, root, agent) = fixtures_agent();
    let local = tmp.path().join("local");
    std::fs::create_dir_all(&local).unwrap();
    let m = Mounted::start(&agent.uri, &tmp.path().join("mnt"), &[]);

    assert_eq!(
        names(&m.path("corpus")),
        [
            "blocks.bin",
            "blocks.idx",
            "r50k_int32.bin",
            "r50k_int32.idx",
            "r50k_uint16.bin",
            "r50k_uint16.idx",
            "sub"
        ]
    );
    assert_eq!(names(&m.path("")), ["corpus"]);

    // --dtype auto: every r50k dataset is uint16, equal to `dquant convert --codec u16`.
    let cases = [
        ("corpus/r50k_int32", fixture("r50k_int32")),
        ("corpus/r50k_uint16", fixture("r50k_uint16")),
        ("corpus/blocks", fixture("r50k_int32")),
        (
            "corpus/sub/r50k_int32_multiseq",
            fixture("r50k_int32_multiseq"),
        ),
    ];
    for (i, (mounted, src)) in cases.iter().enumerate() {
        let want = convert(src, &local, &format!("u16_{i}"), "u16");
        for ext in ["bin", "idx"] {
            let got = m.path(&format!("{mounted}.{ext}"));
            let want = read(&with_ext(&want, ext));
            assert_eq!(
                std::fs::metadata(&got).unwrap().len(),
                want.len() as u64,
                "{mounted}.{ext}"
            );
            assert!(
                read(&got) == want,
                "{mounted}.{ext} differs from dquant convert's"
            );
        }
    }
    // Megatron's own uint16 fixture, byte for byte (its .idx included).
    assert!(read(&m.path("corpus/r50k_int32.bin")) == read(&fixture("r50k_uint16.bin")));
    assert!(read(&m.path("corpus/r50k_int32.idx")) == read(&fixture("r50k_uint16.idx")));

    // Random preads at odd offsets and lengths, in a new open (not the page cache's order).
    let want = read(&fixture("r50k_uint16.bin"));
    let f = File::open(m.path("corpus/r50k_int32.bin")).unwrap();
    let mut x = 12345u64;
    for _ in 0..200 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let off = (x >> 33) % want.len() as u64;
        let len = ((x >> 13) % 9000 + 1).min(want.len() as u64 - off) as usize;
        let mut buf = vec![0u8; len];
        f.read_exact_at(&mut buf, off).unwrap();
        assert!(
            buf == want[off as usize..off as usize + len],
            "pread {off}+{len}"
        );
    }
    drop(f);

    // Read-only: writes, creations and removals all say so.
    let err = std::fs::OpenOptions::new()
        .write(true)
        .open(m.path("corpus/r50k_int32.bin"))
        .unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    let err = File::create(m.path("corpus/new.bin")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    let err = std::fs::remove_file(m.path("corpus/r50k_int32.idx")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    let err = std::fs::create_dir(m.path("corpus/d")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");

    // A dataset removed on the agent is gone on the next lookup (after the 1 s TTL).
    std::fs::remove_file(root.join("r50k_uint16.bin")).unwrap();
    std::fs::remove_file(root.join("r50k_uint16.idx")).unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    let err = std::fs::metadata(m.path("corpus/r50k_uint16.bin")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");

    // fusermount3 -u (umount where fuse3's tools are missing) ends the process cleanly.
    let tool = if Command::new("fusermount3").arg("-V").output().is_ok() {
        vec!["fusermount3", "-u"]
    } else {
        eprintln!("*** fusermount3 is missing (apt install fuse3): unmounting with umount ***");
        vec!["umount"]
    };
    let st = Command::new(tool[0])
        .args(&tool[1..])
        .arg(&m.dir)
        .status()
        .unwrap();
    assert!(st.success());
    let mut m = m;
    let status = wait(&mut m.child, Duration::from_secs(10));
    assert!(status.success(), "{status}:\n{}", m.log());
    assert!(!is_mounted(&m.dir));
}

#[test]
fn a_fixed_dtype_shows_the_tokens_in_it() {
    if !fuse_available() {
        return;
    }
    let (tmp, _root, agent) = fixtures_agent();
    let m = Mounted::start(
        &agent.uri,
        &tmp.path().join("mnt"),
        &["--dtype", "int32", "--wire-codec", "auto+lz4"],
    );
    // int32 as stored: Megatron's own files, byte for byte.
    for ext in ["bin", "idx"] {
        assert!(
            read(&m.path(&format!("corpus/r50k_int32.{ext}")))
                == read(&fixture(&format!("r50k_int32.{ext}")))
        );
        assert!(
            read(&m.path(&format!("corpus/sub/r50k_int32_multiseq.{ext}")))
                == read(&fixture(&format!("r50k_int32_multiseq.{ext}")))
        );
    }
    m.stop(libc::SIGINT);

    // A token too large for the dtype: EIO, and the log says which and what to do.
    let m = Mounted::start(&agent.uri, &tmp.path().join("mnt8"), &["--dtype", "u8"]);
    let err = std::fs::read(m.path("corpus/r50k_int32.bin")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let log = m.log();
    assert!(log.contains("does not fit"), "{log}");
}

fn plan(seed: u64) -> Plan {
    let mut p = Plan::new(
        vec![
            Source::new("corpus/r50k_int32").weight(0.7),
            Source::new("corpus/blocks.dqb").weight(0.3),
        ],
        127,
        6,
    );
    p.seed = seed;
    p.shuffle = true;
    p.epochs = Some(1);
    p.world = 2;
    p.rank = 1;
    p
}

#[test]
fn a_plan_is_a_seekable_file_of_its_batches() {
    if !fuse_available() {
        return;
    }
    let (tmp, _root, agent) = fixtures_agent();
    let p = plan(7);
    let plan_path = tmp.path().join("plan.toml");
    std::fs::write(&plan_path, p.to_toml().unwrap()).unwrap();
    let want_path = tmp.path().join("want.u16");
    dquant(&[
        "read",
        plan_path.to_str().unwrap(),
        "--agent",
        &agent.uri,
        "--out",
        want_path.to_str().unwrap(),
        "-q",
    ]);
    let want = read(&want_path);
    assert!(want.len() > 100_000);
    let spec = format!("train={}", plan_path.display());
    let m = Mounted::start(&agent.uri, &tmp.path().join("mnt"), &["--plan", &spec]);
    let file = m.path("plans/train.bin");
    assert_eq!(std::fs::metadata(&file).unwrap().len(), want.len() as u64);
    assert!(
        read(&file) == want,
        "the plan file differs from dquant read"
    );

    // A seek to batch k (a new open, past the page cache) gives dquant read's tail.
    let batch_bytes = p.batch_bytes();
    let batches = want.len() as u64 / batch_bytes;
    for k in [batches / 2, 1, batches - 1] {
        let mut f = File::open(&file).unwrap();
        // Drop what the first read left in the page cache, so the read reaches the mount.
        // SAFETY: posix_fadvise on an open descriptor; no memory is passed.
        unsafe {
            libc::posix_fadvise(
                std::os::fd::AsRawFd::as_raw_fd(&f),
                0,
                0,
                libc::POSIX_FADV_DONTNEED,
            )
        };
        f.seek(SeekFrom::Start(k * batch_bytes)).unwrap();
        let mut tail = Vec::new();
        f.read_to_end(&mut tail).unwrap();
        assert!(
            tail == want[(k * batch_bytes) as usize..],
            "tail from batch {k}"
        );
    }
    assert_eq!(names(&m.path("plans")), ["train.bin"]);
    m.stop(libc::SIGTERM);
}

/// Writes `root/big` (Megatron int32): `tokens` ids below 50 000 in documents of 100..4000.
fn big_corpus(root: &Path, tokens: u64) -> Vec<u8> {
    std::fs::create_dir_all(root).unwrap();
    let mut w = DatasetWriter::create(
        &root.join("big"),
        OutputFormat::Megatron { dtype: DType::I32 },
    )
    .unwrap();
    let mut ix = DocIndexBuilder::new();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) as u32
    };
    let mut u16s = Vec::with_capacity(tokens as usize * 2);
    let mut left = tokens;
    while left > 0 {
        let n = (100 + next() as u64 % 3900).min(left);
        let doc: Vec<u32> = (0..n).map(|_| next() % 50_000).collect();
        u16s.extend(doc.iter().flat_map(|&t| (t as u16).to_le_bytes()));
        w.push(&doc).unwrap();
        ix.push_document(n);
        left -= n;
    }
    w.finish(&ix.finish()).unwrap();
    u16s
}

#[test]
fn an_agent_killed_mid_read_gives_eio_and_a_restarted_one_serves_again() {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("corpus");
    let want = big_corpus(&root, 8 << 20);
    let arg = format!("corpus={}", root.display());
    let agent = AgentProcess::start(BIN, &["--root", &arg]);
    let listen = agent.uri.strip_prefix("dquant://").unwrap().to_string();
    let data = agent.data.clone();
    let m = Mounted::start(
        &agent.uri,
        &tmp.path().join("mnt"),
        &["--readahead", "2MiB"],
    );

    let mut f = File::open(m.path("corpus/big.bin")).unwrap();
    let mut got = vec![0u8; 2 << 20];
    f.read_exact(&mut got).unwrap();
    agent.signal(libc::SIGKILL);
    drop(agent);
    let t0 = Instant::now();
    let mut buf = vec![0u8; 64 << 10];
    let err = loop {
        match f.read(&mut buf) {
            Ok(0) => panic!("the whole file was read without its agent"),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => break e,
        }
    };
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "EIO took {:?}",
        t0.elapsed()
    );
    assert!(got.len() < want.len());
    assert!(got == want[..got.len()], "bytes before the EIO differ");
    drop(f);
    let log = m.log();
    assert!(log.contains("failed") && log.contains("read"), "{log}");

    // The agent back on the same ports: the mount dials it again, and every byte is right.
    let _agent = AgentProcess::start_on(BIN, &listen, &data, &["--root", &arg]);
    let mut f = File::open(m.path("corpus/big.bin")).unwrap();
    let mut all = Vec::new();
    f.read_to_end(&mut all).unwrap();
    assert!(all == want, "the file read after the restart differs");
    drop(f);
    // The .idx, a page at a time from the agent's index.
    let mut idx = Vec::new();
    File::open(m.path("corpus/big.idx"))
        .unwrap()
        .read_to_end(&mut idx)
        .unwrap();
    let local = convert(&root.join("big"), tmp.path(), "big_u16", "u16");
    assert!(idx == read(&with_ext(&local, "idx")));
    let _ = std::io::stderr().flush();
    m.stop(libc::SIGTERM);
}

#[test]
fn daemon_mode_returns_once_mounted_and_fusermount_ends_it() {
    if !fuse_available() {
        return;
    }
    let (tmp, _root, agent) = fixtures_agent();
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let log = tmp.path().join("mount.log");
    let said = dquant(&[
        "mount",
        &agent.uri,
        mnt.to_str().unwrap(),
        "--daemon",
        "--log",
        log.to_str().unwrap(),
    ]);
    assert!(is_mounted(&mnt), "{said}");
    let pid: u32 = said
        .split("(pid ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {said:?}"));
    assert!(read(&mnt.join("corpus/r50k_int32.bin")) == read(&fixture("r50k_uint16.bin")));
    let st = Command::new("fusermount3").arg("-u").arg(&mnt).status();
    if st.is_err() {
        eprintln!("*** fusermount3 is missing (apt install fuse3): unmounting with umount ***");
        assert!(Command::new("umount").arg(&mnt).status().unwrap().success());
    }
    let t0 = Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the daemon did not end after the unmount"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!is_mounted(&mnt));

    // A mount that cannot start says why, and no daemon is left behind.
    let out = Command::new(BIN)
        .args([
            "mount",
            "dquant://127.0.0.1:1",
            mnt.to_str().unwrap(),
            "--daemon",
            "--timeout",
            "1",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("before mounting") && err.contains("cannot reach agent 127.0.0.1:1"),
        "{err}"
    );
}
