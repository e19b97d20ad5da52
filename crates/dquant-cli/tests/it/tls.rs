//! TLS on both planes of a real `dquant serve`: a client that trusts the agent's CA reads
//! the local bytes, directly and through a chained agent (range sessions over TLS); a
//! client that does not is refused with what to fix; and an agent with tenants will not
//! listen beyond loopback in the clear.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use dquant_testkit::process::AgentProcess;
use dquant_testkit::tls::{make_pki, TestPki};
use dquant_testkit::{copy_fixture, xxh3};

const BIN: &str = env!("CARGO_BIN_EXE_dquant");
const TOKEN: &str = "team-a-0123456789abcdef";

/// `dquant ARGS` with the tenant token, and `DQUANT_TLS_CA` set to `ca` (or unset).
fn dquant(args: &[&str], ca: Option<&Path>) -> Output {
    let mut c = Command::new(BIN);
    c.args(args)
        .env("DQUANT_TOKEN", TOKEN)
        .env_remove("DQUANT_TLS_CA")
        .env_remove("DQUANT_TLS_NAME");
    if let Some(ca) = ca {
        c.env("DQUANT_TLS_CA", ca);
    }
    c.output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The storage agent's config: the fixture root, one tenant, TLS with `pki`'s certificate.
fn storage_config(dir: &Path, pki: &TestPki) -> PathBuf {
    let fx = dir.join("fx");
    std::fs::create_dir_all(&fx).unwrap();
    copy_fixture("r50k_uint16", &fx.join("r50k"));
    let conf = dir.join("storage.toml");
    std::fs::write(
        &conf,
        format!(
            "[roots]\nfx = \"{}\"\n[tls]\ncert = \"{}\"\nkey = \"{}\"\n\
             [[tenants]]\nname = \"team-a\"\ntoken = \"{TOKEN}\"\nroots = [\"*\"]\n",
            fx.display(),
            pki.cert.display(),
            pki.key.display()
        ),
    )
    .unwrap();
    conf
}

/// Reads `plan_body` (with source `uri`) through `agent` (or locally when `None`) into a
/// file; its bytes.
fn read(dir: &Path, name: &str, uri: &str, agent: Option<&str>, ca: Option<&Path>) -> Vec<u8> {
    let plan = dir.join(format!("{name}.toml"));
    std::fs::write(
        &plan,
        format!(
            "seq_len = 255\nbatch_size = 4\noutput = \"u16\"\nseed = 5\n\
             [[sources]]\nuri = \"{uri}\"\n"
        ),
    )
    .unwrap();
    let out = dir.join(format!("{name}.u16"));
    let mut args = vec![
        "read",
        plan.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    if let Some(a) = agent {
        args.extend(["--agent", a]);
    }
    let o = dquant(&args, ca);
    assert!(o.status.success(), "{name}: {}", stderr(&o));
    std::fs::read(out).unwrap()
}

#[test]
fn tls_agents_stream_the_local_bytes_directly_and_chained() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path(), "storage", &["localhost", "127.0.0.1"]);
    let conf = storage_config(dir.path(), &pki);
    let storage = AgentProcess::start(BIN, &["--config", conf.to_str().unwrap()]);
    let storage_addr = storage.uri.trim_start_matches("dquant://").to_string();

    let local = read(
        dir.path(),
        "local",
        dir.path().join("fx/r50k").to_str().unwrap(),
        None,
        None,
    );
    assert!(!local.is_empty());
    let direct = read(
        dir.path(),
        "direct",
        "fx/r50k",
        Some(&storage.uri),
        Some(&pki.ca),
    );
    assert_eq!(xxh3(&direct), xxh3(&local), "plan session over TLS");

    // A host agent on plain loopback chained to the TLS storage agent: ranges over TLS.
    let host_conf = dir.path().join("host.toml");
    std::fs::write(
        &host_conf,
        format!(
            "upstreams = [\"{storage_addr}\"]\nupstream_token = \"{TOKEN}\"\n\
             upstream_tls_ca = \"{}\"\n[roots]\nnone = \"{}\"\n",
            pki.ca.display(),
            dir.path().join("fx").display()
        ),
    )
    .unwrap();
    let host = AgentProcess::start(BIN, &["--config", host_conf.to_str().unwrap()]);
    let chained_uri = format!("{}/fx/r50k", storage.uri);
    let chained = read(dir.path(), "chained", &chained_uri, Some(&host.uri), None);
    assert_eq!(xxh3(&chained), xxh3(&local), "range session over TLS");
    assert!(
        storage.log().contains("kind=\"source\""),
        "{}",
        storage.log()
    );
}

#[test]
fn clients_without_the_agents_ca_are_refused_saying_what_to_set() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path(), "storage", &["localhost", "127.0.0.1"]);
    let stranger = make_pki(dir.path(), "stranger", &["localhost", "127.0.0.1"]);
    let conf = storage_config(dir.path(), &pki);
    let agent = AgentProcess::start(BIN, &["--config", conf.to_str().unwrap()]);

    let o = dquant(&["ls", &agent.uri], Some(&pki.ca));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "fx\n");

    let plain = dquant(&["ls", &agent.uri], None);
    assert_eq!(plain.status.code(), Some(1));
    // The failure itself in words, not tonic's `code: '...', source: ...` debug form.
    assert!(!stderr(&plain).contains("code: '"), "{}", stderr(&plain));
    assert!(
        stderr(&plain).contains(
            "(if the agent serves TLS, set DQUANT_TLS_CA to the CA that signed its certificate)"
        ),
        "{}",
        stderr(&plain)
    );
    let wrong = dquant(&["ls", &agent.uri], Some(&stranger.ca));
    assert_eq!(wrong.status.code(), Some(1));
    assert!(
        stderr(&wrong).contains("UnknownIssuer") && stderr(&wrong).contains("check DQUANT_TLS_CA"),
        "{}",
        stderr(&wrong)
    );
    let missing = dir.path().join("nope.pem");
    let o = dquant(&["ls", &agent.uri], Some(&missing));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains(&format!(
            "TLS CA {}: No such file or directory (os error 2)",
            missing.display()
        )),
        "{}",
        stderr(&o)
    );
}

#[test]
fn tenants_without_tls_do_not_listen_beyond_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path(), "storage", &["localhost"]);
    let conf = storage_config(dir.path(), &pki);
    let text = std::fs::read_to_string(&conf).unwrap();
    let no_tls = text.replace(
        &format!(
            "[tls]\ncert = \"{}\"\nkey = \"{}\"\n",
            pki.cert.display(),
            pki.key.display()
        ),
        "",
    );
    assert_ne!(no_tls, text);
    std::fs::write(&conf, no_tls).unwrap();
    let o = dquant(
        &[
            "serve",
            "--config",
            conf.to_str().unwrap(),
            "--listen",
            "0.0.0.0:0",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(
        stderr(&o),
        "error: agent config: refusing to listen on 0.0.0.0:0 without TLS: tenant tokens and \
         data would cross the network in the clear. Configure [tls] cert and key (or \
         --tls-cert and --tls-key), set allow_plaintext = true for a link nobody else can \
         read, or listen on loopback (127.0.0.1)\n"
    );
    let o = dquant(
        &[
            "serve",
            "--config",
            conf.to_str().unwrap(),
            "--tls-cert",
            "x.pem",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--tls-key <FILE>"), "{}", stderr(&o));
}
