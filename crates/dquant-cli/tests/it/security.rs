//! Who may use a real `dquant serve`: no open agent beyond loopback, tenants and their tokens
//! on the control plane (then the data plane streams for them), and the Unix socket's mode
//! and peer credentials.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use dquant_testkit::process::AgentProcess;
use dquant_testkit::{copy_fixture, xxh3};

const BIN: &str = env!("CARGO_BIN_EXE_dquant");
const TOKEN_A: &str = "team-a-0123456789abcdef";
const TOKEN_OPS: &str = "ops-fedcba9876543210";

/// `dquant ARGS` with `DQUANT_TOKEN` set to `token` (or unset).
fn dquant(args: &[&str], token: Option<&str>) -> Output {
    let mut c = Command::new(BIN);
    c.args(args).env_remove("DQUANT_TOKEN");
    if let Some(t) = token {
        c.env("DQUANT_TOKEN", t);
    }
    c.output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Two roots: `fx` (the r50k fixture) and `web` (empty).
fn roots(dir: &Path) -> (PathBuf, PathBuf) {
    let fx = dir.join("fx");
    let web = dir.join("web");
    std::fs::create_dir_all(&fx).unwrap();
    std::fs::create_dir_all(&web).unwrap();
    copy_fixture("r50k_uint16", &fx.join("r50k"));
    (fx, web)
}

#[test]
fn an_agent_without_tenants_refuses_to_listen_beyond_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let (fx, _) = roots(dir.path());
    let root = format!("fx={}", fx.display());
    for listen in [
        ["--listen", "0.0.0.0:0", "--data-listen", "127.0.0.1:0"],
        ["--listen", "127.0.0.1:0", "--data-listen", "0.0.0.0:0"],
    ] {
        let mut args = vec!["serve", "--root", &root];
        args.extend(listen);
        let t = Instant::now();
        let o = dquant(&args, None);
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(t.elapsed() < Duration::from_secs(30));
        assert_eq!(
            stderr(&o),
            "error: agent config: refusing to listen on 0.0.0.0:0 without tenants: anyone who \
             can reach it could read every root. Configure [[tenants]] with a token each (see \
             README, Security and limits), or listen on loopback (127.0.0.1)\n"
        );
    }
}

#[test]
fn tenants_need_their_token_and_read_only_their_roots() {
    let dir = tempfile::tempdir().unwrap();
    let (fx, web) = roots(dir.path());
    let conf = dir.path().join("agent.toml");
    std::fs::write(
        &conf,
        format!(
            "[roots]\nfx = \"{}\"\nweb = \"{}\"\n\
             [[tenants]]\nname = \"team-a\"\ntoken = \"{TOKEN_A}\"\nroots = [\"fx\"]\n\
             [[tenants]]\nname = \"ops\"\ntoken = \"{TOKEN_OPS}\"\nroots = [\"*\"]\n",
            fx.display(),
            web.display()
        ),
    )
    .unwrap();
    let agent = AgentProcess::start(BIN, &["--config", conf.to_str().unwrap()]);
    let u = &agent.uri;

    let refused = |token: Option<&str>, want: &str| {
        let o = dquant(&["ls", u], token);
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(stderr(&o).contains(want), "{}", stderr(&o));
    };
    refused(
        None,
        "this agent serves tenants only: send a tenant's token (set DQUANT_TOKEN)",
    );
    refused(
        Some("not-a-tenant-token"),
        "the token is not a tenant's of this agent",
    );

    // Each tenant sees its own roots.
    assert_eq!(stdout(&dquant(&["ls", u], Some(TOKEN_A))), "fx\n");
    assert_eq!(stdout(&dquant(&["ls", u], Some(TOKEN_OPS))), "fx\nweb\n");
    let o = dquant(&["ls", &format!("{u}/web")], Some(TOKEN_A));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("dataset \"web\": tenant \"team-a\" may not read root \"web\""),
        "{}",
        stderr(&o)
    );
    let o = dquant(&["stat", &format!("{u}/web/x")], Some(TOKEN_A));
    assert!(
        stderr(&o).contains("tenant \"team-a\" may not read root \"web\""),
        "{}",
        stderr(&o)
    );

    // With its token a tenant streams, and gets the local bytes.
    let (on_agent, local) = (dir.path().join("a.toml"), dir.path().join("l.toml"));
    let plan = |uri: &str| {
        format!(
            "seq_len = 255\nbatch_size = 4\noutput = \"u16\"\nseed = 5\n\
             [[sources]]\nuri = \"{uri}\"\n"
        )
    };
    std::fs::write(&on_agent, plan("fx/r50k")).unwrap();
    std::fs::write(&local, plan(fx.join("r50k").to_str().unwrap())).unwrap();
    let (a_out, l_out) = (dir.path().join("a.u16"), dir.path().join("l.u16"));
    let o = dquant(
        &[
            "read",
            on_agent.to_str().unwrap(),
            "--agent",
            u,
            "--out",
            a_out.to_str().unwrap(),
        ],
        Some(TOKEN_A),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = dquant(
        &[
            "read",
            local.to_str().unwrap(),
            "--out",
            l_out.to_str().unwrap(),
        ],
        None,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let (a, l) = (
        std::fs::read(&a_out).unwrap(),
        std::fs::read(&l_out).unwrap(),
    );
    assert!(!a.is_empty());
    assert_eq!(xxh3(&a), xxh3(&l));
    // Refusals are logged once per peer and reason, never with the secret.
    for _ in 0..3 {
        let _ = dquant(&["ls", u], Some("not-a-tenant-token"));
    }
    let log = agent.log();
    assert_eq!(log.matches("reason=\"wrong token\"").count(), 1, "{log}");
    assert!(
        !log.contains("not-a-tenant-token") && !log.contains(TOKEN_A),
        "{log}"
    );
}

/// `dquant ls SOCKET` as user `uid` (nobody).
fn ls_as(uid: u32, sock: &Path) -> Output {
    Command::new(BIN)
        .args(["ls", sock.to_str().unwrap()])
        .env_remove("DQUANT_TOKEN")
        .uid(uid)
        .gid(uid)
        .output()
        .unwrap()
}

#[test]
fn the_unix_socket_is_0660_and_checks_its_peers() {
    const NOBODY: u32 = 65534;
    let dir = tempfile::tempdir().unwrap();
    // nobody must reach the socket's directory to be refused by the agent, not the file system.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (fx, _) = roots(dir.path());
    let root = format!("fx={}", fx.display());
    let sock = dir.path().join("agent.sock");
    let mut agent =
        AgentProcess::start(BIN, &["--root", &root, "--socket", sock.to_str().unwrap()]);
    assert_eq!(std::fs::metadata(&sock).unwrap().mode() & 0o777, 0o660);
    // Root (the agent's own user here) is served.
    assert_eq!(
        stdout(&dquant(&["ls", sock.to_str().unwrap()], None)),
        "fx\n"
    );
    // Widen the mode: nobody can connect, and the peer check refuses it.
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let o = ls_as(NOBODY, &sock);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        agent.log().contains(
            "uid 65534 gid 65534 may not connect (allow it with socket_uids or socket_gids)"
        ),
        "{}",
        agent.log()
    );
    agent.assert_running();
    drop(agent);

    // Allowed by uid, nobody is served.
    let agent = AgentProcess::start(
        BIN,
        &[
            "--root",
            &root,
            "--socket",
            sock.to_str().unwrap(),
            "--config",
            &{
                let conf = dir.path().join("peers.toml");
                std::fs::write(&conf, format!("socket_uids = [{NOBODY}]\n")).unwrap();
                conf.display().to_string()
            },
        ],
    );
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let o = ls_as(NOBODY, &sock);
    assert!(o.status.success(), "{}\n{}", stderr(&o), agent.log());
    assert_eq!(stdout(&o), "fx\n");
}
