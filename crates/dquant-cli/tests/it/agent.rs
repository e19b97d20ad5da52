//! `dquant serve`, `ls`, `stat`, `read --agent` and `demo`, end to end through the built binary:
//! a real agent process on ephemeral loopback ports, real client processes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use dquant_testkit::process::{self, kill, AgentProcess};
use dquant_testkit::{copy_fixture, xxh3};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_dquant");

fn dquant(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn ok(args: &[&str]) -> Output {
    let o = dquant(args);
    assert!(
        o.status.success(),
        "dquant {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// A root directory holding copies of the r50k fixtures (int32 and uint16).
fn root_with_fixtures(dir: &Path) -> PathBuf {
    let root = dir.join("root");
    std::fs::create_dir_all(&root).unwrap();
    for name in ["r50k_int32", "r50k_uint16"] {
        copy_fixture(name, &root.join(name));
    }
    root
}

/// Writes a plan over `sources` ((uri, weight)) with `extra` TOML lines.
fn plan(path: &Path, sources: &[(&str, f64)], extra: &str) {
    let mut s = format!("seq_len = 255\nbatch_size = 2\noutput = \"u16\"\nseed = 3\n{extra}\n");
    for (uri, w) in sources {
        s.push_str(&format!("[[sources]]\nuri = \"{uri}\"\nweight = {w}\n"));
    }
    std::fs::write(path, s).unwrap();
}

fn summary(o: &Output) -> Value {
    serde_json::from_slice(&o.stderr)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr)))
}

/// A plan on the agent (`fx/...` names) and the same plan over the local copies.
fn plans(dir: &Path, root: &Path, extra: &str) -> (PathBuf, PathBuf) {
    let (on_agent, local) = (dir.join("agent.toml"), dir.join("local.toml"));
    plan(
        &on_agent,
        &[("fx/r50k_int32", 3.0), ("fx/r50k_uint16", 1.0)],
        extra,
    );
    let a = root.join("r50k_int32").display().to_string();
    let b = root.join("r50k_uint16").display().to_string();
    plan(&local, &[(&a, 3.0), (&b, 1.0)], extra);
    (on_agent, local)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn read_on_an_agent_gives_the_local_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let root = root_with_fixtures(dir.path());
    let agent = AgentProcess::start(BIN, &["--root", &format!("fx={}", root.display())]);
    let (on_agent, local) = plans(dir.path(), &root, "wire_codec = \"auto+zstd:1\"");
    let out = |name: &str| dir.path().join(name);

    let l = ok(&["read", s(&local), "--out", s(&out("local")), "--json"]);
    let o = ok(&[
        "read",
        s(&on_agent),
        "--agent",
        &agent.uri,
        "--out",
        s(&out("offload")),
        "--json",
    ]);
    let n = ok(&[
        "read",
        s(&on_agent),
        "--agent",
        &agent.uri,
        "--no-offload",
        "--out",
        s(&out("no-offload")),
        "--json",
    ]);
    let bytes = std::fs::read(out("local")).unwrap();
    // Every sample of both sources ((161032 - 1) / 255 = 631 each), 256 u16 tokens each.
    assert_eq!(bytes.len(), 2 * 631 * 256 * 2);
    assert!(
        std::fs::read(out("offload")).unwrap() == bytes,
        "offloaded bytes differ"
    );
    assert!(
        std::fs::read(out("no-offload")).unwrap() == bytes,
        "no-offload bytes differ"
    );
    let (l, o, n) = (summary(&l), summary(&o), summary(&n));
    assert_eq!(l["offloaded"], false);
    assert_eq!(o["offloaded"], true);
    assert_eq!(n["offloaded"], false);
    for v in [&o, &n] {
        assert_eq!(v["stream_xxh3"], l["stream_xxh3"]);
        assert_eq!(v["cursor"], l["cursor"]);
        assert_eq!(v["bytes"], bytes.len());
        for d in 0..2 {
            for k in ["samples", "epochs"] {
                assert_eq!(v["sources"][d][k], l["sources"][d][k]);
            }
        }
    }
    // The plan's 1262 samples at weights 3:1, in epochs of 631 samples, whoever ran it.
    let used = &l["sources"];
    assert_eq!(
        (used[0]["samples"].as_u64(), used[1]["samples"].as_u64()),
        (Some(946), Some(316))
    );
    assert_eq!(used[1]["epochs"].as_f64(), Some(316.0 / 631.0));
    assert_eq!(o["sources"][0]["uri"], "fx/r50k_int32");

    // Resuming on the agent writes exactly the rest, to stdout; the text summary names the
    // cursor to resume from.
    let r = ok(&[
        "read",
        s(&on_agent),
        "--agent",
        &agent.uri,
        "--cursor",
        "100",
        "--epoch",
        "0",
    ]);
    assert!(
        r.stdout == bytes[100 * 256 * 2..],
        "the resumed stream is the tail"
    );
    let text = String::from_utf8_lossy(&r.stderr);
    assert!(text.contains("resume with --cursor 1262"), "{text}");

    // --offload needs an agent; a bad plan name is the agent's clear error.
    let e = dquant(&["read", s(&local), "--offload"]);
    assert_eq!(e.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&e.stderr).contains("--agent"));
    plan(&out("bad.toml"), &[("fx/missing", 1.0)], "");
    let e = dquant(&["read", s(&out("bad.toml")), "--agent", &agent.uri]);
    assert_eq!(e.status.code(), Some(1));
    let msg = String::from_utf8_lossy(&e.stderr);
    assert!(
        msg.starts_with("error: ") && msg.contains("fx/missing") && msg.contains("no such dataset"),
        "{msg}"
    );
}

#[test]
fn ls_and_stat_show_what_the_agent_serves() {
    let dir = tempfile::tempdir().unwrap();
    root_with_fixtures(dir.path());
    // A config file with a root relative to the file, and a flag that adds another root.
    let conf = dir.path().join("agent.toml");
    std::fs::write(&conf, "prefetch_frames = 2\n[roots]\nfx = \"root\"\n").unwrap();
    let other = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(
        BIN,
        &[
            "--config",
            s(&conf),
            "--root",
            &format!("empty={}", other.path().display()),
        ],
    );
    let u = &agent.uri;

    let roots = String::from_utf8(ok(&["ls", u]).stdout).unwrap();
    assert_eq!(roots, "empty\nfx\n");
    let v: Value =
        serde_json::from_slice(&ok(&["ls", &format!("{u}/fx"), "--json"]).stdout).unwrap();
    let names: Vec<(&str, &str)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(
        names,
        [
            ("fx/r50k_int32", "megatron"),
            ("fx/r50k_uint16", "megatron")
        ]
    );
    let table = String::from_utf8(ok(&["ls", &format!("{u}/fx")]).stdout).unwrap();
    assert!(
        table.contains("fx/r50k_int32") && table.contains("megatron"),
        "{table}"
    );

    let st: Value =
        serde_json::from_slice(&ok(&["stat", &format!("{u}/fx/r50k_int32"), "--json"]).stdout)
            .unwrap();
    assert_eq!(st["dataset"], "fx/r50k_int32");
    assert_eq!(st["tokens"], 161032);
    let local: Value = serde_json::from_slice(
        &ok(&[
            "inspect",
            s(&dir.path().join("root/r50k_int32")),
            "--json",
            "--no-sizes",
        ])
        .stdout,
    )
    .unwrap();
    assert_eq!(st["tokens"], local["tokens"]);
    assert_eq!(st["documents"], local["documents"]);
    let text = String::from_utf8(ok(&["stat", &format!("{u}/fx/r50k_uint16")]).stdout).unwrap();
    assert!(text.contains("tokens      161,032"), "{text}");

    for (args, want) in [
        (
            vec!["stat".to_string(), format!("{u}/nope/x")],
            "unknown root \"nope\"",
        ),
        (
            vec!["stat".to_string(), format!("{u}/fx/missing")],
            "no such dataset",
        ),
        (
            vec!["stat".to_string(), format!("{u}/fx/../etc")],
            "'..' is not allowed",
        ),
        (
            vec!["ls".to_string(), format!("{u}/nope")],
            "unknown root \"nope\"",
        ),
        (
            vec!["ls".to_string(), "127.0.0.1:1".to_string()],
            "is not an agent address (expected dquant://HOST:PORT[/DATASET], or a Unix socket path such as unix:/run/dquant.sock)",
        ),
        (
            vec!["ls".to_string(), "dquant://127.0.0.1:1".to_string()],
            "cannot reach agent 127.0.0.1:1",
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = dquant(&args);
        let msg = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {msg}");
        assert!(
            msg.starts_with("error: ") && msg.contains(want),
            "{args:?}: {msg}"
        );
    }
}

/// Kills `dquant read PLAN --agent ADDR` stalled mid-stream (see
/// [`process::kill_stalled_reader`]): the agent logs `started`, then `ended`.
fn kill_stalled_reader(agent: &AgentProcess, plan: &Path, addr: &str, started: &str, ended: &str) {
    let mut read = Command::new(BIN);
    read.args(["read", s(plan), "--agent", addr]);
    process::kill_stalled_reader(agent, &mut read, started, ended);
}

#[test]
fn a_client_killed_mid_stream_leaves_the_agent_serving() {
    let dir = tempfile::tempdir().unwrap();
    let root = root_with_fixtures(dir.path());
    let agent = AgentProcess::start(BIN, &["--root", &format!("fx={}", root.display())]);
    // 50 epochs: 32 MB of u16 (uncompressed), far more than the pipe, the sockets and the
    // prefetch hold.
    let big = dir.path().join("big.toml");
    plan(
        &big,
        &[("fx/r50k_int32", 3.0), ("fx/r50k_uint16", 1.0)],
        "epochs = 50\nwire_codec = \"auto\"",
    );
    kill_stalled_reader(
        &agent,
        &big,
        &agent.uri,
        "session streaming",
        "session ended early",
    );

    let mut agent = agent;
    agent.assert_running();
    let (on_agent, local) = plans(dir.path(), &root, "");
    let want = summary(&ok(&["read", s(&local), "--out", "/dev/null", "--json"]));
    let got = summary(&ok(&[
        "read",
        s(&on_agent),
        "--agent",
        &agent.uri,
        "--out",
        s(&dir.path().join("after")),
        "--json",
    ]));
    assert_eq!(got["stream_xxh3"], want["stream_xxh3"]);
    assert_eq!(got["bytes"], 2 * 631 * 256 * 2);
    agent.assert_running();
}

/// Runs `dquant args`, expecting it to exit on its own within a minute.
fn exits(args: &[&str]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("dquant {args:?} did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn bad_agent_configs_fail_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let ports = ["--listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0"];
    let missing = dir.path().join("missing");
    let conf = dir.path().join("agent.toml");
    std::fs::write(&conf, "prefetch = 3\n").unwrap();
    let cases: Vec<(Vec<String>, String)> = vec![
        (
            vec!["--root".into(), format!("corpus={}", missing.display())],
            format!("error: agent config: root \"corpus\" ({}): No such file or directory", missing.display()),
        ),
        (
            vec![],
            "error: agent config: roots: no dataset roots configured (give --root NAME=DIR|s3://BUCKET/PREFIX or a [roots] table)".into(),
        ),
        (
            vec!["--config".into(), conf.display().to_string()],
            format!("error: {}: agent config: ", conf.display()),
        ),
        (
            vec!["--root".into(), format!("x={}", dir.path().display()), "--prefetch-frames".into(), "0".into()],
            "error: agent config: prefetch_frames: must be at least 1".into(),
        ),
    ];
    for (extra, want) in cases {
        let mut args: Vec<&str> = vec!["serve"];
        args.extend(ports);
        args.extend(extra.iter().map(String::as_str));
        let o = exits(&args);
        let msg = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {msg}");
        assert!(msg.starts_with(&want), "{args:?}:\n{msg}\nwanted: {want}");
    }
    // A malformed --root is a usage error.
    let o = exits(&["serve", "--root", "nodir"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("expected NAME=DIR"));
}

#[test]
fn demo_streams_through_an_agent_and_checks_parity() {
    let dir = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let o = exits(&["demo", "--mb", "1", "-q", "--dir", s(dir.path())]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    eprintln!(
        "demo --mb 1 took {:.1} s:\n{out}",
        t.elapsed().as_secs_f64()
    );
    for want in [
        "offload == local: identical",
        "shared memory == TCP: identical",
        "wire: ",
        "bytes as int32",
        "consumer thread: ",
        "(text, r50k, 2049 tokens)",
        "(code, o200k, 2049 tokens)",
    ] {
        assert!(out.contains(want), "no {want:?} in:\n{out}");
    }
    // --dir keeps the datasets, ready to serve.
    for f in [
        "text_int32.bin",
        "text_int32.idx",
        "text.dqb",
        "code_int32.bin",
    ] {
        assert!(dir.path().join(f).is_file(), "{f} missing");
    }
}

/// The r50k plan of [`plans`], built in Rust, on the agent and locally.
fn rust_plans(root: &Path, epochs: u32) -> (dquant_plan::Plan, dquant_plan::Plan) {
    use dquant_plan::{OutputDType, Plan, Source};
    let mk = |a: String, b: String| {
        let mut p = Plan::new(
            vec![Source::new(a).weight(3.0), Source::new(b).weight(1.0)],
            255,
            2,
        );
        p.output = OutputDType::U16;
        p.seed = 3;
        p.epochs = Some(epochs);
        p
    };
    (
        mk("fx/r50k_int32".into(), "fx/r50k_uint16".into()),
        mk(
            root.join("r50k_int32").display().to_string(),
            root.join("r50k_uint16").display().to_string(),
        ),
    )
}

/// An agent serving copies of the fixtures in `dir` as `fx`, with a Unix socket there too;
/// returns it, the root and the socket's path.
fn agent_with_socket(dir: &Path) -> (AgentProcess, PathBuf, PathBuf) {
    let root = root_with_fixtures(dir);
    let sock = dir.join("agent.sock");
    let agent = AgentProcess::start(
        BIN,
        &[
            "--root",
            &format!("fx={}", root.display()),
            "--socket",
            s(&sock),
        ],
    );
    (agent, root, sock)
}

#[test]
fn read_through_the_agents_unix_socket_uses_shared_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, root, sock) = agent_with_socket(dir.path());
    let (on_agent, local) = plans(dir.path(), &root, "epochs = 2");
    let want = summary(&ok(&["read", s(&local), "--out", "/dev/null", "--json"]));
    for addr in [
        s(&sock).to_string(),
        format!("unix:{}?verify=true", s(&sock)),
    ] {
        let got = summary(&ok(&[
            "read",
            s(&on_agent),
            "--agent",
            &addr,
            "--out",
            "/dev/null",
            "--json",
        ]));
        assert_eq!(got["stream_xxh3"], want["stream_xxh3"], "{addr}");
        assert_eq!(got["offloaded"], true);
    }
    assert!(agent.log().contains("transport=\"shm\""), "{}", agent.log());
    // The control plane answers on the socket too.
    let ls = String::from_utf8(ok(&["ls", s(&sock)]).stdout).unwrap();
    assert!(ls.contains("fx"), "{ls}");

    // A reader killed mid-stream (its stdout is a pipe nobody reads, so it stalls with the
    // ring full): the agent sees its socket close and ends the session.
    let big = dir.path().join("big.toml");
    plan(
        &big,
        &[("fx/r50k_int32", 3.0), ("fx/r50k_uint16", 1.0)],
        "epochs = 50",
    );
    kill_stalled_reader(&agent, &big, s(&sock), "slot_size", "client went away");
    let mut agent = agent;
    agent.assert_running();
    let got = summary(&ok(&[
        "read",
        s(&on_agent),
        "--agent",
        s(&sock),
        "--out",
        "/dev/null",
        "--json",
    ]));
    assert_eq!(got["stream_xxh3"], want["stream_xxh3"]);
}

/// SIGKILL the agent while a reader streams from it over shared memory: the reader gets every
/// batch the agent completed, then a clear error; resuming from its cursor (on a new agent or
/// in-process) gives the rest, and the whole is the uninterrupted stream, byte for byte.
#[test]
fn an_agent_killed_mid_stream_loses_nothing_after_resume() {
    use dquant_client::{open, open_at, Offload, Reader};
    let dir = tempfile::tempdir().unwrap();
    let root = root_with_fixtures(dir.path());
    let sock = dir.path().join("agent.sock");
    let args = [
        "--root".to_string(),
        format!("fx={}", root.display()),
        "--socket".into(),
        s(&sock).into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (on_agent, local) = rust_plans(&root, 40);
    let mut whole = Reader::local(&local, dquant_plan::Cursor::START).unwrap();
    let mut want = Vec::new();
    while let Some(b) = whole.next_batch().unwrap() {
        want.extend_from_slice(b.tokens.as_bytes());
    }

    // Kill points: with the reader paused (the agent blocked on a full ring), and while it
    // reads flat out (the agent mid-write).
    for (trial, (read_first, kill_after)) in [
        (5usize, None),
        (0, Some(Duration::from_millis(3))),
        (50, Some(Duration::from_millis(20))),
    ]
    .into_iter()
    .enumerate()
    {
        let mut agent = AgentProcess::start(BIN, &args);
        let mut r = open(s(&sock), &on_agent, Offload::Yes).unwrap();
        let mut got = Vec::new();
        for _ in 0..read_first {
            got.extend_from_slice(r.next_batch().unwrap().unwrap().tokens.as_bytes());
        }
        let pid = agent.child.id();
        let killer = std::thread::spawn(move || {
            if let Some(d) = kill_after {
                std::thread::sleep(d);
            }
            let _ = kill(pid, libc::SIGKILL);
        });
        let mut killer = Some(killer);
        if kill_after.is_none() {
            killer.take().unwrap().join().unwrap();
            let _ = agent.child.wait();
        }
        let err = loop {
            match r.next_batch() {
                Ok(Some(b)) => got.extend_from_slice(b.tokens.as_bytes()),
                Ok(None) => panic!("trial {trial}: the stream ended although the agent was killed"),
                Err(e) => break e.to_string(),
            }
        };
        if let Some(k) = killer {
            k.join().unwrap();
        }
        assert!(
            err.starts_with("agent went away after delivering ")
                && err.ends_with(
                    " complete batches through shared memory; resume from the reader's cursor"
                ),
            "trial {trial}: {err}"
        );
        let cursor = r.cursor();
        assert_eq!(
            cursor.consumed_samples as usize * 256 * 2,
            got.len(),
            "trial {trial}"
        );
        drop(r);
        drop(agent);

        // Resume on a fresh agent (the dead one's socket file is stale and gets replaced)...
        let _agent = AgentProcess::start(BIN, &args);
        let mut r = open_at(s(&sock), &on_agent, cursor.clone(), Offload::Yes).unwrap();
        let mut rest = Vec::new();
        while let Some(b) = r.next_batch().unwrap() {
            rest.extend_from_slice(b.tokens.as_bytes());
        }
        let mut all = got.clone();
        all.extend_from_slice(&rest);
        assert_eq!(all.len(), want.len(), "trial {trial}");
        assert_eq!(
            xxh3(&all),
            xxh3(&want),
            "trial {trial}: resumed on a new agent"
        );
        // ... and in-process: the same tail.
        let mut r = Reader::local(&local, cursor).unwrap();
        let mut rest_local = Vec::new();
        while let Some(b) = r.next_batch().unwrap() {
            rest_local.extend_from_slice(b.tokens.as_bytes());
        }
        assert_eq!(
            xxh3(&rest_local),
            xxh3(&rest),
            "trial {trial}: resumed in-process"
        );
    }
}

#[test]
fn wait_ready_times_out_on_a_stopped_agent_and_the_stream_goes_on_whole() {
    use dquant_client::{open, Offload};
    use xxhash_rust::xxh3::Xxh3;

    let dir = tempfile::tempdir().unwrap();
    let (agent, root, sock) = agent_with_socket(dir.path());
    // 50 epochs: 32 MB of u16, far more than the ring (8 MiB) holds.
    let (on_agent, local) = plans(dir.path(), &root, "epochs = 50");
    let read_plan = |p: &Path| dquant_plan::Plan::from_toml(&std::fs::read_to_string(p).unwrap());
    let (on_agent, local) = (read_plan(&on_agent).unwrap(), read_plan(&local).unwrap());
    let mut want = Xxh3::new();
    let mut r = open("", &local, Offload::No).unwrap();
    assert!(
        r.wait_ready(Duration::ZERO).unwrap(),
        "in-process is always ready"
    );
    while let Some(b) = r.next_owned().unwrap() {
        want.update(b.bytes());
    }

    let mut r = open(s(&sock), &on_agent, Offload::Yes).unwrap();
    let mut got = Xxh3::new();
    got.update(r.next_owned().unwrap().unwrap().bytes());
    agent.signal(libc::SIGSTOP);
    // Should waits never time out, a read would block on the stopped agent for good: wake it
    // after a while, so that the stream ends while "stopped" and the test fails, not hangs.
    let pid = agent.child.id();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(60));
        let _ = kill(pid, libc::SIGCONT);
    });
    // Drain what the ring holds; then waits time out, and consume nothing.
    let mut drained = 0;
    loop {
        let cursor = r.cursor();
        let t = Instant::now();
        if !r.wait_ready(Duration::from_millis(50)).unwrap() {
            assert!(
                t.elapsed() >= Duration::from_millis(50),
                "{:?}",
                t.elapsed()
            );
            assert_eq!(r.cursor(), cursor, "a wait that timed out moved the cursor");
            break;
        }
        let b = r
            .next_owned()
            .unwrap()
            .expect("the stream cannot end while the agent is stopped");
        got.update(b.bytes());
        drained += 1;
        assert!(drained < 20_000, "wait_ready never timed out");
    }
    assert!(!r.wait_ready(Duration::from_millis(10)).unwrap());
    agent.signal(libc::SIGCONT);
    assert!(r.wait_ready(Duration::from_secs(30)).unwrap());
    while let Some(b) = r.next_owned().unwrap() {
        got.update(b.bytes());
    }
    assert_eq!(
        got.digest(),
        want.digest(),
        "the stream after the stall differs"
    );
}

/// `dquant top --json`: the agent's events as JSON lines, a session opened and closed among
/// them, and rate snapshots at the interval asked for.
#[test]
fn top_shows_sessions_and_rates() {
    let dir = tempfile::tempdir().unwrap();
    let root = root_with_fixtures(dir.path());
    let agent = AgentProcess::start(BIN, &["--root", &format!("fx={}", root.display())]);
    let top = Command::new(BIN)
        .args([
            "top",
            &agent.uri,
            "--json",
            "--interval-ms",
            "100",
            "--count",
            "40",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let (p, _) = plans(dir.path(), &root, "");
    ok(&[
        "read",
        s(&p),
        "--agent",
        &agent.uri,
        "--out",
        "/dev/null",
        "-q",
    ]);
    let out = top.wait_with_output().unwrap();
    assert!(out.status.success());
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 40);
    let opened = lines
        .iter()
        .position(|l| l["event"]["opened"]["kind"] == "plan");
    let closed = lines
        .iter()
        .position(|l| l["event"]["closed"]["how"] == "finished");
    assert!(opened.is_some() && opened < closed, "{lines:?}");
    assert!(
        lines
            .iter()
            .filter(|l| l["event"]["rates"].is_array())
            .count()
            >= 5
    );
}

/// A shared stream read by three processes (`read --share` and two `subscribe`s). One stops
/// reading (its stdout is never drained), so the stream waits for it: the slowest sets the
/// pace. It is then SIGKILLed mid-stream; the stream goes on, and the other two get every
/// batch, equal to a lone reader's stream.
#[test]
fn a_subscriber_killed_mid_stream_leaves_the_others_whole() {
    let dir = tempfile::tempdir().unwrap();
    let root = root_with_fixtures(dir.path());
    let agent = AgentProcess::start(BIN, &["--root", &format!("fx={}", root.display())]);
    // About 60 MB of u16 batches: more than a stalled reader's pipe, socket buffers and
    // prefetch hold.
    let (p, _) = plans(dir.path(), &root, "epochs = 100");
    let out = |name: &str| dir.path().join(name);
    let lone = ok(&[
        "read",
        s(&p),
        "--agent",
        &agent.uri,
        "--out",
        s(&out("lone")),
        "--json",
    ]);
    let want = summary(&lone)["stream_xxh3"].clone();
    let spawn = |args: &[&str], stdout: Stdio| {
        Command::new(BIN)
            .args(args)
            .stdout(stdout)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let start = r#"{"consumed_samples":0}"#;
    let sub = |o: &[&str]| {
        let mut v = vec!["subscribe", &agent.uri, "job7/dp0", "--cursor-json", start];
        v.extend_from_slice(o);
        v.iter().map(|x| x.to_string()).collect::<Vec<_>>()
    };
    // b asks before the stream is opened, as a rank that starts first does: it waits.
    let b_args = sub(&["--out", s(&out("b")), "--json", "--wait", "30"]);
    let b = spawn(
        &b_args.iter().map(String::as_str).collect::<Vec<_>>(),
        Stdio::null(),
    );
    std::thread::sleep(Duration::from_millis(500));
    let a = spawn(
        &[
            "read",
            s(&p),
            "--agent",
            &agent.uri,
            "--share",
            "job7/dp0",
            "--group",
            "3",
        ]
        .iter()
        .copied()
        .chain(["--out", s(&out("a")), "--json"])
        .collect::<Vec<_>>(),
        Stdio::null(),
    );
    assert!(
        agent.wait_log("shared plan opened", Duration::from_secs(30)),
        "{}",
        agent.log()
    );
    let stalled_args = sub(&["-q"]);
    let mut stalled = spawn(
        &stalled_args.iter().map(String::as_str).collect::<Vec<_>>(),
        Stdio::piped(),
    );
    // The stalled reader holds everyone back: after a second, the others have far less
    // than the whole stream.
    std::thread::sleep(Duration::from_secs(1));
    let total = std::fs::metadata(out("lone")).unwrap().len();
    let held = std::fs::metadata(out("a")).map_or(0, |m| m.len());
    assert!(
        held < total / 2,
        "a read {held} of {total} bytes past a stalled subscriber"
    );
    stalled.kill().unwrap();
    stalled.wait().unwrap();
    for (name, child) in [("a", a), ("b", b)] {
        let o = child.wait_with_output().unwrap();
        assert!(
            o.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(summary(&o)["stream_xxh3"], want, "{name}");
        assert_eq!(std::fs::metadata(out(name)).unwrap().len(), total, "{name}");
    }
    assert!(
        agent.wait_log("kind=\"subscriber\"", Duration::from_secs(5)),
        "{}",
        agent.log()
    );
}
