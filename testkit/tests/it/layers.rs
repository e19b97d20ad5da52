//! The crate floors of `ARCHITECTURE.md`, enforced.
//!
//! `ARCHITECTURE.md` lists the workspace's crates floor by floor in a ```` ```layers ```` block,
//! lowest first: a crate may depend on the floors below its own, and on the crates listed
//! before it on its own floor; never upward. A floor marked `runtime none` must not reach an
//! async runtime through its normal dependencies. This test reads that block (the one place the
//! layering is written) and the workspace's `cargo metadata`, and fails on any crate that is on
//! no floor, any dependency that points up, and any runtime where none may be.
//!
//! Dev-dependencies are free: a test of a low crate may start an agent.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Crates that are async runtimes: what `runtime none` floors must not depend on.
const RUNTIMES: &[&str] = &[
    "tokio",
    "async-std",
    "smol",
    "async-executor",
    "futures-executor",
];

/// One floor of the block: its name, whether it may have a runtime, its crates in order.
#[derive(Debug)]
struct Floor {
    name: String,
    runtime: bool,
    crates: Vec<String>,
}

/// Where each crate stands: (floor, position on the floor).
type Places = HashMap<String, (usize, usize)>;

/// Parses the ```` ```layers ```` block: one floor a line, `NAME runtime none|any CRATE...`,
/// lowest floor first; `#` starts a comment.
fn parse_floors(doc: &str) -> Result<Vec<Floor>, String> {
    let start = doc
        .find("```layers\n")
        .ok_or("ARCHITECTURE.md has no ```layers block")?;
    let body = &doc[start + "```layers\n".len()..];
    let body = &body[..body
        .find("```")
        .ok_or("the ```layers block is not closed")?];
    let mut floors = Vec::new();
    for line in body.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let runtime = match words.get(1..3) {
            Some(["runtime", "none"]) => false,
            Some(["runtime", "any"]) => true,
            _ => {
                return Err(format!(
                    "layers line {line:?}: expected NAME runtime none|any CRATE..."
                ))
            }
        };
        floors.push(Floor {
            name: words[0].to_string(),
            runtime,
            crates: words[3..].iter().map(|s| s.to_string()).collect(),
        });
    }
    Ok(floors)
}

fn places(floors: &[Floor]) -> Places {
    let mut at = HashMap::new();
    for (f, floor) in floors.iter().enumerate() {
        for (i, c) in floor.crates.iter().enumerate() {
            at.insert(c.clone(), (f, i));
        }
    }
    at
}

/// The workspace as the test needs it: each member's workspace dependencies (normal and build
/// only), and the whole resolved graph of normal and build edges by package name.
struct Workspace {
    members: BTreeMap<String, Vec<String>>,
    graph: HashMap<String, BTreeSet<String>>,
}

fn read_workspace(meta: &Value) -> Workspace {
    let ids: BTreeSet<&str> = meta["workspace_members"]
        .as_array()
        .expect("workspace_members")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let packages: Vec<&Value> = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter(|p| ids.contains(p["id"].as_str().unwrap_or("")))
        .collect();
    let names: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    let mut members = BTreeMap::new();
    for p in packages {
        let deps = p["dependencies"]
            .as_array()
            .expect("dependencies")
            .iter()
            .filter(|d| d["kind"].as_str() != Some("dev"))
            .filter_map(|d| d["name"].as_str())
            .filter(|n| names.contains(n))
            .map(str::to_string)
            .collect();
        members.insert(p["name"].as_str().expect("name").to_string(), deps);
    }
    Workspace {
        members,
        graph: resolved_graph(meta),
    }
}

/// Package name → the names it depends on (normal and build edges) in the resolved graph.
fn resolved_graph(meta: &Value) -> HashMap<String, BTreeSet<String>> {
    let name_of: HashMap<&str, &str> = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter_map(|p| Some((p["id"].as_str()?, p["name"].as_str()?)))
        .collect();
    let mut graph: HashMap<String, BTreeSet<String>> = HashMap::new();
    for node in meta["resolve"]["nodes"].as_array().expect("resolve.nodes") {
        let from = name_of[node["id"].as_str().expect("id")].to_string();
        let out = graph.entry(from).or_default();
        for d in node["deps"].as_array().expect("deps") {
            let kinds = d["dep_kinds"].as_array().expect("dep_kinds");
            if kinds.iter().any(|k| k["kind"].as_str() != Some("dev")) {
                out.insert(name_of[d["pkg"].as_str().expect("pkg")].to_string());
            }
        }
    }
    graph
}

/// Every way the workspace breaks the floors, one line each.
fn violations(floors: &[Floor], ws: &Workspace) -> Vec<String> {
    let at = places(floors);
    let mut bad = Vec::new();
    for (krate, deps) in &ws.members {
        let Some(&(floor, pos)) = at.get(krate) else {
            bad.push(format!(
                "{krate} is on no floor of ARCHITECTURE.md's layers block"
            ));
            continue;
        };
        for dep in deps {
            match at.get(dep) {
                Some(&(f, p)) if f < floor || (f == floor && p < pos) => {}
                Some(&(f, _)) => bad.push(format!(
                    "{krate} (floor {}) depends on {dep} (floor {}): a dependency may only point down",
                    floors[floor].name, floors[f].name
                )),
                None => {} // reported as a crate on no floor
            }
        }
        if !floors[floor].runtime {
            if let Some(path) = path_to_runtime(krate, &ws.graph) {
                bad.push(format!(
                    "{krate} is on floor {}, which has no async runtime, but reaches one: {}",
                    floors[floor].name,
                    path.join(" -> ")
                ));
            }
        }
    }
    bad
}

/// The dependency path from `krate` to the first runtime it reaches, if any (breadth first,
/// so the path is a shortest one).
fn path_to_runtime(krate: &str, graph: &HashMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    let mut parent: HashMap<&str, &str> = HashMap::new();
    let mut queue = std::collections::VecDeque::from([krate]);
    while let Some(n) = queue.pop_front() {
        if RUNTIMES.contains(&n) {
            let mut path = vec![n.to_string()];
            let mut at = n;
            while let Some(&p) = parent.get(at) {
                path.push(p.to_string());
                at = p;
            }
            path.reverse();
            return Some(path);
        }
        for d in graph.get(n).into_iter().flatten() {
            if d != krate && !parent.contains_key(d.as_str()) {
                parent.insert(d, n);
                queue.push_back(d);
            }
        }
    }
    None
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn cargo_metadata() -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let host = String::from_utf8(
        Command::new("rustc")
            .arg("-vV")
            .output()
            .expect("rustc -vV")
            .stdout,
    )
    .expect("rustc -vV is UTF-8");
    let host = host
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names the host")
        .to_string();
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline", "--locked"])
        .args(["--filter-platform", &host])
        .current_dir(repo_root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON")
}

#[test]
fn crates_depend_only_down_the_floors_of_architecture_md() {
    let doc =
        std::fs::read_to_string(repo_root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let floors = parse_floors(&doc).unwrap_or_else(|e| panic!("{e}"));
    let ws = read_workspace(&cargo_metadata());
    let listed: BTreeSet<&String> = floors.iter().flat_map(|f| &f.crates).collect();
    let stale: Vec<_> = listed
        .iter()
        .filter(|c| !ws.members.contains_key(**c))
        .collect();
    assert!(
        stale.is_empty(),
        "ARCHITECTURE.md lists crates the workspace does not have: {stale:?}"
    );
    let bad = violations(&floors, &ws);
    assert!(
        bad.is_empty(),
        "the layering is broken:\n  {}",
        bad.join("\n  ")
    );
}

/// The checker itself finds each kind of break (so the test above cannot pass by not looking).
#[test]
fn the_checker_finds_upward_deps_runtimes_and_unplaced_crates() {
    let floors = parse_floors(
        "x\n```layers\n# comment\ncore runtime none a b\nservice runtime any c\n```\n",
    )
    .unwrap();
    let graph = |edges: &[(&str, &str)]| {
        let mut g: HashMap<String, BTreeSet<String>> = HashMap::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
        }
        g
    };
    let members = |m: &[(&str, &[&str])]| {
        m.iter()
            .map(|(k, d)| (k.to_string(), d.iter().map(|s| s.to_string()).collect()))
            .collect()
    };
    let fine = Workspace {
        members: members(&[("a", &[]), ("b", &["a"]), ("c", &["a", "b"])]),
        graph: graph(&[("b", "a"), ("c", "tokio")]),
    };
    assert_eq!(violations(&floors, &fine), Vec::<String>::new());

    let broken = Workspace {
        members: members(&[("a", &["b"]), ("b", &["c"]), ("c", &[]), ("d", &[])]),
        graph: graph(&[("a", "b"), ("b", "helper"), ("helper", "tokio")]),
    };
    assert_eq!(
        violations(&floors, &broken),
        vec![
            "a (floor core) depends on b (floor core): a dependency may only point down",
            "a is on floor core, which has no async runtime, but reaches one: a -> b -> helper -> tokio",
            "b (floor core) depends on c (floor service): a dependency may only point down",
            "b is on floor core, which has no async runtime, but reaches one: b -> helper -> tokio",
            "d is on no floor of ARCHITECTURE.md's layers block",
        ]
    );
    assert_eq!(
        parse_floors("```layers\ncore runtime maybe a\n```").unwrap_err(),
        "layers line \"core runtime maybe a\": expected NAME runtime none|any CRATE..."
    );
}
