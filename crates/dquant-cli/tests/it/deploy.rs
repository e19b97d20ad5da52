//! The deployment files say what the agent accepts: each agent.toml that the Kubernetes
//! manifests assemble (the ConfigMap's part and the Secret's, in the init container's order)
//! parses and validates, and the systemd unit starts the binary with flags it has.

use std::path::Path;

use dquant_agent::AgentConfig;

fn deploy(rel: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The block literal under `  KEY: |` in a manifest (its lines, 4-space indent removed).
fn block(yaml: &str, key: &str) -> String {
    let head = format!("  {key}: |");
    let mut lines = yaml.lines().skip_while(|l| *l != head);
    assert!(lines.next().is_some(), "no {key} block");
    let mut out = String::new();
    for l in lines {
        if !l.is_empty() && !l.starts_with("    ") {
            break;
        }
        out.push_str(l.strip_prefix("    ").unwrap_or(l));
        out.push('\n');
    }
    out
}

/// The files an init container concatenates, as it names them (`/config/X /tokens/Y`).
fn assembled(manifest: &str) -> String {
    let cmd = manifest
        .lines()
        .find(|l| l.contains("command: [\"sh\", \"-c\", \"cat "))
        .expect("an init container that assembles agent.toml");
    let files = cmd
        .split("cat ")
        .nth(1)
        .unwrap()
        .split(" >")
        .next()
        .unwrap();
    let (config, tokens) = (
        deploy("kubernetes/configmap.yaml"),
        deploy("kubernetes/secret.yaml"),
    );
    files
        .split(' ')
        .map(
            |f| match f.split_once('/').unwrap().1.split_once('/').unwrap() {
                ("config", key) => block(&config, key),
                ("tokens", key) => block(&tokens, key),
                other => panic!("unknown source {other:?}"),
            },
        )
        .collect()
}

#[test]
fn kubernetes_agent_configs_parse_and_validate() {
    for (manifest, roots, placement) in [("storage.yaml", 1, 0), ("host-daemonset.yaml", 0, 1)] {
        let toml = assembled(&deploy(&format!("kubernetes/{manifest}")));
        let c = AgentConfig::from_toml(&toml).unwrap_or_else(|e| panic!("{manifest}: {e}\n{toml}"));
        c.validate().unwrap_or_else(|e| panic!("{manifest}: {e}"));
        assert_eq!(
            (c.roots.len(), c.placement.len()),
            (roots, placement),
            "{manifest}"
        );
        if manifest == "storage.yaml" {
            assert_eq!(c.tenants.len(), 1);
        } else {
            assert!(c.upstream_token.is_some());
            assert_eq!(c.placement_of("corpus/web/x").map(|a| a.len()), Some(2));
        }
    }
}

#[test]
fn the_systemd_unit_runs_serve_with_a_config() {
    let unit = deploy("systemd/dquant-agent.service");
    assert!(unit.contains("ExecStart=/usr/local/bin/dquant serve --config /etc/dquant/agent.toml"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dquant"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("--config <FILE>"));
}
