//! Graceful shutdown of a real `dquant serve` process: SIGTERM mid-stream gives every
//! consumer (TCP, shared memory, a shared stream's ring) the cursor to resume from after its
//! last batch, the
//! agent removes its socket file and exits 0, and resuming at that cursor on a new agent
//! gives exactly the uninterrupted stream.

use std::time::{Duration, Instant};

use dquant_client::{open, open_at, open_shared, ClientError, Offload, Reader, Share};
use dquant_plan::{Cursor, OutputDType, Plan, Source};
use dquant_testkit::process::AgentProcess;
use dquant_testkit::stream::drain;
use dquant_testkit::{copy_fixture, xxh3};

const BIN: &str = env!("CARGO_BIN_EXE_dquant");

/// A long plan over the fixture (100 epochs of 32 KiB batches: far more than the agent and
/// the sockets buffer), on the agent (`fx/...`) or on the local copy.
fn plan(uri: &str) -> Plan {
    let mut p = Plan::new(vec![Source::new(uri)], 2047, 8);
    p.output = OutputDType::U16;
    p.epochs = Some(100);
    p.seed = 7;
    p
}

/// Reads `n` batches, appending their bytes to `out`.
fn take(r: &mut Reader, n: usize, out: &mut Vec<u8>) {
    for _ in 0..n {
        let b = r.next_batch().unwrap().expect("the stream is longer");
        out.extend_from_slice(b.tokens.as_bytes());
    }
}

/// Reads to the agent's shutdown notice; returns its cursor, checked against the reader's.
fn until_shutdown(r: &mut Reader, out: &mut Vec<u8>) -> u64 {
    loop {
        match r.next_batch() {
            Ok(Some(b)) => out.extend_from_slice(b.tokens.as_bytes()),
            Ok(None) => panic!("the stream ended before the shutdown"),
            Err(e) => {
                let ClientError::AgentShutdown { consumed_samples } = e else {
                    panic!("expected the shutdown notice, got {e:?}");
                };
                assert_eq!(
                    e.to_string(),
                    format!("agent shutting down; resume from consumed_samples {consumed_samples}")
                );
                assert_eq!(r.cursor().consumed_samples, consumed_samples);
                return consumed_samples;
            }
        }
    }
}

fn rest(uri: &str, p: &Plan, consumed_samples: u64, out: &mut Vec<u8>) {
    let at = Cursor::new(0, consumed_samples);
    out.extend(drain(&mut open_at(uri, p, at, Offload::Yes).unwrap()).0);
}

fn wait_exit(agent: &mut AgentProcess, within: Duration) -> std::process::ExitStatus {
    let t = Instant::now();
    loop {
        if let Some(s) = agent.child.try_wait().unwrap() {
            return s;
        }
        assert!(
            t.elapsed() < within,
            "the agent did not exit:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An agent process serving a copy of the uint16 fixture as `fx/r50k`, over TCP and a Unix
/// socket.
struct Served {
    dir: tempfile::TempDir,
    root_arg: String,
    agent: AgentProcess,
}

impl Served {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        copy_fixture("r50k_uint16", &root.join("r50k"));
        let root_arg = format!("fx={}", root.display());
        let sock = dir.path().join("agent.sock");
        let args = ["--root", &root_arg, "--prefetch-frames", "1"];
        let agent = AgentProcess::start(
            BIN,
            &[&args[..], &["--socket", sock.to_str().unwrap()]].concat(),
        );
        Served {
            dir,
            root_arg,
            agent,
        }
    }

    /// A fresh agent (TCP only) serving the same root.
    fn again(&self) -> AgentProcess {
        AgentProcess::start(BIN, &["--root", &self.root_arg, "--prefetch-frames", "1"])
    }

    fn sock(&self) -> std::path::PathBuf {
        self.dir.path().join("agent.sock")
    }

    /// The bytes of [`plan`]'s whole stream, read in this process.
    fn whole(&self) -> Vec<u8> {
        let local = plan(self.dir.path().join("root/r50k").to_str().unwrap());
        drain(&mut Reader::local(&local, Cursor::START).unwrap()).0
    }
}

#[test]
fn sigterm_mid_stream_gives_every_consumer_its_resume_cursor() {
    let mut served = Served::start();
    let (sock, whole) = (served.sock(), served.whole());
    let agent = &mut served.agent;
    let p = plan("fx/r50k");

    let mut tcp = open(&agent.uri, &p, Offload::Yes).unwrap();
    let mut shm = open(sock.to_str().unwrap(), &p, Offload::Yes).unwrap();
    let (mut got_tcp, mut got_shm) = (Vec::new(), Vec::new());
    take(&mut tcp, 20, &mut got_tcp);
    take(&mut shm, 20, &mut got_shm);

    agent.signal(libc::SIGTERM);
    let at_tcp = until_shutdown(&mut tcp, &mut got_tcp);
    let at_shm = until_shutdown(&mut shm, &mut got_shm);
    // Mid-stream: after what was read before the signal, before the end.
    for at in [at_tcp, at_shm] {
        assert!((20 * 8..100 * 9 * 8).contains(&at), "{at}");
    }
    let status = wait_exit(agent, Duration::from_secs(15));
    assert!(status.success(), "{status:?}\n{}", agent.log());
    assert!(!sock.exists(), "the socket file is left behind");
    let log = agent.log();
    assert!(log.contains("session drained"), "{log}");

    // Resuming each on a new agent at its cursor gives the uninterrupted stream.
    let fresh = served.again();
    rest(&fresh.uri, &p, at_tcp, &mut got_tcp);
    rest(&fresh.uri, &p, at_shm, &mut got_shm);
    assert_eq!(got_tcp.len(), whole.len());
    assert_eq!(xxh3(&got_tcp), xxh3(&whole));
    assert_eq!(xxh3(&got_shm), xxh3(&whole));
}

/// The readers of a shared stream's ring (the records made in it) get where the ring ends
/// as their resume cursor, the same for all, and resuming there gives the whole stream.
#[test]
fn sigterm_mid_stream_gives_a_shared_rings_readers_their_resume_cursor() {
    let mut served = Served::start();
    let (sock, whole) = (served.sock(), served.whole());
    let agent = &mut served.agent;
    // Made in the ring: the wire codec is the output dtype.
    let mut p = plan("fx/r50k");
    p.wire_codec = "u16".into();

    let share = Share {
        name: "job7/dp0".into(),
        group: 2,
    };
    let s = sock.to_str().unwrap();
    let mut a = open_shared(s, &p, Cursor::START, &share).unwrap();
    let mut b = open_shared(s, &p, Cursor::START, &share).unwrap();
    assert!(a.reads_shared_ring() && b.reads_shared_ring());
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    // In turns: the ring waits for its slowest reader.
    for _ in 0..20 {
        take(&mut a, 1, &mut got_a);
        take(&mut b, 1, &mut got_b);
    }
    agent.signal(libc::SIGTERM);
    let at_a = until_shutdown(&mut a, &mut got_a);
    let at_b = until_shutdown(&mut b, &mut got_b);
    assert_eq!(at_a, at_b, "one ring, one end");
    assert!((20 * 8..100 * 9 * 8).contains(&at_a), "{at_a}");
    let status = wait_exit(agent, Duration::from_secs(15));
    assert!(status.success(), "{status:?}\n{}", agent.log());

    let fresh = served.again();
    rest(&fresh.uri, &p, at_a, &mut got_a);
    rest(&fresh.uri, &p, at_b, &mut got_b);
    assert_eq!(got_a.len(), whole.len());
    assert_eq!(xxh3(&got_a), xxh3(&whole));
    assert_eq!(xxh3(&got_b), xxh3(&whole));
}

#[test]
fn sigterm_with_no_session_exits_at_once_and_removes_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let root_arg = format!("fx={}", root.display());
    let mut agent = AgentProcess::start(
        BIN,
        &["--root", &root_arg, "--socket", sock.to_str().unwrap()],
    );
    assert!(sock.exists());
    let t = Instant::now();
    agent.signal(libc::SIGINT);
    let status = wait_exit(&mut agent, Duration::from_secs(10));
    assert!(status.success(), "{status:?}\n{}", agent.log());
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(!sock.exists(), "the socket file is left behind");
}

/// `dquant health` (a readiness probe): exit 0 while the agent serves; exit 1 and "not
/// serving" from SIGTERM until the sessions have drained (a consumer that never reads keeps
/// the drain open for its grace); exit 1 with the connection error once it has exited.
#[test]
fn health_reads_serving_then_not_serving_while_the_agent_drains() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    copy_fixture("r50k_uint16", &root.join("r50k"));
    let config = dir.path().join("agent.toml");
    let toml = format!(
        "shutdown_grace_secs = 3\n[roots]\nfx = {:?}\n",
        root.display().to_string()
    );
    std::fs::write(&config, toml).unwrap();
    let mut agent = AgentProcess::start(BIN, &["--config", config.to_str().unwrap()]);
    let uri = agent.uri.clone();
    let health = || {
        let out = std::process::Command::new(BIN)
            .args(["health", &uri, "--json"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        (
            out.status.code(),
            text,
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, out, _) = health();
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(r#""serving": true"#), "{out}");

    let ctl = dquant_client::Control::connect(agent.uri.trim_start_matches("dquant://")).unwrap();
    // Uncompressed, so that the stream outgrows the socket's buffers and the session stays.
    let mut p = plan("fx/r50k");
    p.wire_codec = "auto".into();
    let reply = ctl
        .open(dquant_proto::v1::OpenRequest {
            plan_json: p.to_json(),
            ..Default::default()
        })
        .unwrap();
    let (_w, _never_read) = ctl.connect_data(&reply).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    agent.signal(libc::SIGTERM);
    let t = Instant::now();
    loop {
        let (code, out, err) = health();
        if code == Some(1) && out.contains(r#""serving": false"#) {
            break;
        }
        assert_eq!(code, Some(0), "{out}{err}");
        assert!(t.elapsed() < Duration::from_secs(2), "still serving: {out}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = wait_exit(&mut agent, Duration::from_secs(15));
    assert!(status.success(), "{status:?}\n{}", agent.log());
    let (code, _, err) = health();
    assert_eq!(code, Some(1));
    assert!(err.starts_with("error: "), "{err}");
    // --wait asks again until its time is up, then gives the last answer.
    let t = Instant::now();
    let out = std::process::Command::new(BIN)
        .args(["health", &uri, "--wait", "0.5"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        t.elapsed() >= Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach agent"));
}

/// `dquant health --wait`: a script that has just started an agent waits for it to serve.
#[test]
fn health_waits_for_an_agent_that_is_starting() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    let probe = std::process::Command::new(BIN)
        .args([
            "health",
            &format!("unix:{}", sock.display()),
            "--wait",
            "20",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let sock_arg = sock.to_str().unwrap();
    let _agent = AgentProcess::start(
        BIN,
        &[
            "--root",
            &format!("fx={}", root.display()),
            "--socket",
            sock_arg,
        ],
    );
    let out = probe.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).ends_with(": serving\n"));
}
