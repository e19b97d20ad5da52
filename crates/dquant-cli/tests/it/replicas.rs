//! Replicas: a plan source `dquant://A,B/ROOT/PATH` read through a host agent from two
//! storage agents (`dquant serve` processes). One storage agent SIGKILLed mid-stream, its
//! metrics showing it served the stream up to then and the survivor's that it served the rest:
//! the stream is byte-identical to an uninterrupted one. Both killed: an error, and the stream
//! resumed from the reader's cursor gives exactly the rest. A replica with other data is
//! refused at open. The placement map routes plain dataset names the same way.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use dquant_client::{open, open_at, Offload, Reader};
use dquant_format::{DType, DocIndexBuilder};
use dquant_plan::{Cursor, OutputDType, Plan, Source};
use dquant_storage::{DatasetWriter, OutputFormat};
use dquant_testkit::metrics::{free_addr, scrape};
use dquant_testkit::netns::{self, Netns};
use dquant_testkit::process::AgentProcess;
use dquant_testkit::stream::until_error;
use dquant_testkit::xxh3;

const BIN: &str = env!("CARGO_BIN_EXE_dquant");

/// Writes `DIR/corpus/big` (Megatron int32): 4 Mi tokens in documents of 100..4000, ids
/// below 50 000 from `seed` (an LCG: deterministic).
fn corpus(dir: &Path, seed: u64) {
    corpus_of(dir, seed, 4 << 20);
}

/// As [`corpus`], with `tokens` tokens.
fn corpus_of(dir: &Path, seed: u64, tokens: u64) {
    let root = dir.join("corpus");
    std::fs::create_dir_all(&root).unwrap();
    let mut w = DatasetWriter::create(
        &root.join("big"),
        OutputFormat::Megatron { dtype: DType::I32 },
    )
    .unwrap();
    let mut ix = DocIndexBuilder::new();
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ seed;
    let mut next = move || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) as u32
    };
    let mut left = tokens;
    while left > 0 {
        let n = (100 + next() as u64 % 3900).min(left);
        let doc: Vec<u32> = (0..n).map(|_| next() % 50_000).collect();
        w.push(&doc).unwrap();
        ix.push_document(n);
        left -= n;
    }
    w.finish(&ix.finish()).unwrap();
}

fn storage(dir: &Path) -> AgentProcess {
    storage_with_metrics(dir).0
}

/// A storage agent that serves its Prometheus page on the address returned beside it.
fn storage_with_metrics(dir: &Path) -> (AgentProcess, SocketAddr) {
    let root = format!("corpus={}", dir.join("corpus").display());
    let metrics = free_addr();
    let m = metrics.to_string();
    let args = [
        "--root",
        &root,
        "--worker-threads",
        "0",
        "--metrics-listen",
        &m,
    ];
    (AgentProcess::start(BIN, &args), metrics)
}

/// The bytes an agent has sent to its consumers so far, over every tenant: a range session
/// counts each answer as it goes out.
fn served(metrics: SocketAddr) -> f64 {
    scrape(metrics)
        .lines()
        .filter(|l| l.starts_with("dquant_bytes_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits (up to 10 s) until `metrics` shows more than `than` bytes served; returns them.
fn served_more_than(metrics: SocketAddr, than: f64, who: &str) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = served(metrics);
        if now > than {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "{who} served nothing past {than} bytes"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn authority(a: &AgentProcess) -> String {
    a.uri.strip_prefix("dquant://").unwrap().to_string()
}

/// A host agent (in this process) that may chain to `upstreams`, with one frame of
/// prefetch, so that it reads from its upstreams as the consumer goes.
fn host(upstreams: &[String]) -> (dquant_agent::AgentHandle, tempfile::TempDir) {
    host_config(upstreams, |_| {})
}

/// [`host`], its config changed by `edit` first.
fn host_config(
    upstreams: &[String],
    edit: impl FnOnce(&mut dquant_agent::AgentConfig),
) -> (dquant_agent::AgentHandle, tempfile::TempDir) {
    let empty = tempfile::tempdir().unwrap();
    let mut cfg = dquant_testkit::agent::config(&[("none", empty.path().to_path_buf())]);
    cfg.upstreams = upstreams.to_vec();
    cfg.prefetch_frames = 1;
    cfg.upstream_timeout_secs = 5;
    edit(&mut cfg);
    (dquant_agent::start(cfg).unwrap(), empty)
}

/// The failovers a host agent's metrics count for `replica`.
fn failovers(metrics: SocketAddr, replica: &str) -> f64 {
    let label = format!("replica=\"{replica}\"");
    scrape(metrics)
        .lines()
        .filter(|l| l.starts_with("dquant_replica_failovers_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn plan(uri: &str, shuffle: bool) -> Plan {
    let mut p = Plan::new(vec![Source::new(uri)], 255, 8);
    p.seed = 7;
    p.shuffle = shuffle;
    p.output = OutputDType::U16;
    p
}

/// The whole stream of `p` over the local file.
fn local(dir: &Path, p: &Plan) -> Vec<u8> {
    let mut p = p.clone();
    p.sources[0].uri = dir.join("corpus/big").display().to_string();
    until_error(&mut Reader::local(&p, Cursor::START).unwrap()).0
}

/// Reads the rest of `r` onto `got`: no error may come (`why` says why none), and the
/// whole stream equals `want`, byte for byte.
fn assert_rest_completes(r: &mut Reader, mut got: Vec<u8>, want: &[u8], why: &str) {
    let (rest, err) = until_error(r);
    assert_eq!(err, None, "{why}");
    got.extend(rest);
    assert_eq!(got.len(), want.len());
    assert!(xxh3(&got) == xxh3(want), "the streams differ");
}

/// Reads `n` batches of `r`.
fn read_batches(r: &mut Reader, n: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    for _ in 0..n {
        let b = r.next_batch().unwrap().expect("the stream is longer");
        bytes.extend_from_slice(b.tokens.as_bytes());
    }
    bytes
}

#[test]
fn a_replica_killed_mid_stream_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // 48 MiB of u16 output: far more than the host agent's prefetch and the sockets hold, so
    // the rest of the stream is still to be read from a replica when b dies (with 8 MiB, a
    // host agent on an idle pool had fetched it all before the kill, and a served nothing).
    corpus_of(dir.path(), 0, 24 << 20);
    for shuffle in [false, true] {
        let ((a, a_metrics), (mut b, b_metrics)) = (
            storage_with_metrics(dir.path()),
            storage_with_metrics(dir.path()),
        );
        let reps = [authority(&a), authority(&b)];
        let host_metrics = free_addr();
        let (h, _empty) = host_config(&reps, |c| c.metrics_listen = Some(host_metrics));
        let p = plan(
            &format!("dquant://{},{}/corpus/big", reps[0], reps[1]),
            shuffle,
        );
        let want = local(dir.path(), &p);
        let mut r = open(&h.uri(), &p, Offload::Yes).unwrap();
        // What the open's probes read of b, then proof that b served the stream itself
        // before it dies: its served bytes grow past the probes while we read.
        let b_at_open = served(b_metrics);
        let mut got = read_batches(&mut r, 20);
        served_more_than(b_metrics, b_at_open, "replica b, before the kill,");
        b.signal(libc::SIGKILL);
        let _ = b.child.wait();
        let a_at_kill = served(a_metrics);
        let (rest, err) = until_error(&mut r);
        assert_eq!(err, None, "shuffle={shuffle}");
        // The survivor served what b no longer could; the host counted b's failover.
        served_more_than(a_metrics, a_at_kill, "replica a, after the kill,");
        assert!(
            failovers(host_metrics, &reps[1]) >= 1.0,
            "shuffle={shuffle}"
        );
        assert_eq!(failovers(host_metrics, &reps[0]), 0.0, "shuffle={shuffle}");
        got.extend(rest);
        assert_eq!(got.len(), want.len(), "shuffle={shuffle}");
        assert!(
            xxh3(&got) == xxh3(&want),
            "shuffle={shuffle}: the streams differ"
        );
        drop(a);
    }
}

/// `a` started again where it was (its control and data ports), serving the same corpus.
fn restart(dir: &Path, a: &AgentProcess) -> AgentProcess {
    let root = format!("corpus={}", dir.join("corpus").display());
    let args = ["--root", &root, "--worker-threads", "0"];
    AgentProcess::start_on(BIN, &authority(a), &a.data, &args)
}

/// Two storage agents of one corpus, a host agent chained to both, and a reader of the
/// replicated plan through it, 10 batches in.
struct Pair {
    dir: tempfile::TempDir,
    a: AgentProcess,
    b: AgentProcess,
    _host: (dquant_agent::AgentHandle, tempfile::TempDir),
    /// The whole stream, read locally, and what the reader got so far.
    want: Vec<u8>,
    got: Vec<u8>,
    r: Reader,
}

fn pair(shuffle: bool) -> Pair {
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path(), 0);
    let (a, b) = (storage(dir.path()), storage(dir.path()));
    let reps = [authority(&a), authority(&b)];
    let host = host(&reps);
    let p = plan(
        &format!("dquant://{},{}/corpus/big", reps[0], reps[1]),
        shuffle,
    );
    let want = local(dir.path(), &p);
    let mut r = open(&host.0.uri(), &p, Offload::Yes).unwrap();
    let got = read_batches(&mut r, 10);
    Pair {
        dir,
        a,
        b,
        _host: host,
        want,
        got,
        r,
    }
}

/// What the chaos runs found: the replica serving alone dies a moment after the other one
/// came back (still inside the back-off its failure earned). The read waits for the one
/// that is back instead of failing, and the stream is unchanged.
#[test]
fn the_last_replica_dying_just_after_another_came_back_is_no_error() {
    let mut x = pair(true);
    x.a.signal(libc::SIGKILL);
    let _ = x.a.child.wait();
    // The reads move to b; a is out for its back-off.
    x.got.extend(read_batches(&mut x.r, 10));
    let _a = restart(x.dir.path(), &x.a);
    x.b.signal(libc::SIGKILL);
    let got = std::mem::take(&mut x.got);
    assert_rest_completes(&mut x.r, got, &x.want, "a was back before b died");
}

#[test]
fn all_replicas_killed_is_an_error_and_the_cursor_resumes_the_rest() {
    let Pair {
        dir,
        a,
        b,
        _host,
        want,
        mut got,
        mut r,
    } = pair(false);
    for s in [&a, &b] {
        s.signal(libc::SIGKILL);
    }
    let (rest, err) = until_error(&mut r);
    got.extend(rest);
    let err = err.expect("every replica is gone");
    assert!(
        err.contains("every replica of corpus/big failed ("),
        "{err}"
    );
    let cursor = r.cursor();
    drop(r);
    // Another storage agent with the same data; the stream goes on from the cursor.
    let c = storage(dir.path());
    let (h2, _empty2) = host(&[authority(&c)]);
    let p2 = plan(&format!("{}/corpus/big", c.uri), false);
    let mut r = open_at(&h2.uri(), &p2, cursor, Offload::Yes).unwrap();
    assert_rest_completes(&mut r, got, &want, "resumed on another storage agent");
}

/// One storage agent, no replicas: killed mid-stream and started again at its address a
/// moment later, it is waited for (up to the host's upstream timeout) like a replica set
/// of one. The reader sees no error and the stream is unchanged.
#[test]
fn a_lone_storage_agent_restarted_mid_stream_is_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path(), 0);
    let mut a = storage(dir.path());
    let (h, _empty) = host(&[authority(&a)]);
    let p = plan(&format!("{}/corpus/big", a.uri), true);
    let want = local(dir.path(), &p);
    let mut r = open(&h.uri(), &p, Offload::Yes).unwrap();
    let got = read_batches(&mut r, 10);
    a.signal(libc::SIGKILL);
    let _ = a.child.wait();
    let at = dir.path().to_path_buf();
    let back = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        restart(&at, &a)
    });
    let why = "the agent was back within the upstream timeout";
    assert_rest_completes(&mut r, got, &want, why);
    drop(back.join().unwrap());
}

/// A network partition, not a dead process, in two network namespaces the test makes: the
/// replica whose link goes down drops every packet in silence (no reset, no refusal), so its
/// reads hear nothing, and after the host's upstream timeout they move to the other replica.
/// Healed, it is used again when the other one's link goes down in turn. The reader sees no
/// error and its stream is the local one.
#[test]
fn a_partitioned_replica_is_waited_out_and_used_again_once_healed() {
    if !dquant_testkit::require(
        "network namespaces",
        netns::available(),
        "root and iproute2",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path(), 0);
    let (na, nb) = (Netns::new(), Netns::new());
    // Beyond loopback an agent serves tenants only; plaintext is allowed on this private link.
    const TOKEN: &str = "partition-test-token-0123";
    let conf = dir.path().join("storage.toml");
    let roots = dir.path().join("corpus");
    let toml = format!(
        "allow_plaintext = true\nworker_threads = 0\n[[tenants]]\nname = \"host\"\n\
         token = \"{TOKEN}\"\nroots = [\"*\"]\n[roots]\ncorpus = \"{}\"\n",
        roots.display()
    );
    std::fs::write(&conf, toml).unwrap();
    let args = ["--config", conf.to_str().unwrap()];
    let a = AgentProcess::start_in(&na, BIN, &args);
    let b = AgentProcess::start_in(&nb, BIN, &args);
    let reps = [authority(&a), authority(&b)];
    let host_metrics = free_addr();
    let (h, _empty) = host_config(&reps, |c| {
        c.upstream_timeout_secs = 2;
        c.upstream_token = Some(TOKEN.into());
        c.metrics_listen = Some(host_metrics);
    });
    let p = plan(
        &format!("dquant://{},{}/corpus/big", reps[0], reps[1]),
        true,
    );
    let want = local(dir.path(), &p);
    let mut r = open(&h.uri(), &p, Offload::Yes).unwrap();
    let mut got = read_batches(&mut r, 10);
    na.partition();
    // Batches already read ahead keep coming for a while; then a read that went to a hears
    // nothing, is waited out for the timeout, and the host counts a's failover.
    while failovers(host_metrics, &reps[0]) < 1.0 {
        got.extend(read_batches(&mut r, 1));
    }
    na.heal();
    // Past a's back-off: the next read reopens it.
    std::thread::sleep(Duration::from_secs(2));
    got.extend(read_batches(&mut r, 5));
    nb.partition();
    assert_rest_completes(&mut r, got, &want, "a was back before b's link went down");
    assert!(
        failovers(host_metrics, &reps[1]) >= 1.0,
        "b's reads were waited out too"
    );
}

/// A plan opened while every replica is down (a storage restart under a starting job)
/// waits for one to come back instead of failing, and streams the whole plan.
#[test]
fn an_open_with_every_replica_down_waits_for_one_to_come_back() {
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path(), 0);
    let (mut a, mut b) = (storage(dir.path()), storage(dir.path()));
    let reps = [authority(&a), authority(&b)];
    let (h, _empty) = host(&reps);
    let p = plan(
        &format!("dquant://{},{}/corpus/big", reps[0], reps[1]),
        true,
    );
    let want = local(dir.path(), &p);
    for s in [&mut a, &mut b] {
        s.signal(libc::SIGKILL);
        let _ = s.child.wait();
    }
    let at = dir.path().to_path_buf();
    let back = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(500));
        restart(&at, &b)
    });
    let mut r = open(&h.uri(), &p, Offload::Yes).unwrap();
    assert_rest_completes(&mut r, Vec::new(), &want, "b came back within the timeout");
    drop(back.join().unwrap());
}

#[test]
fn a_replica_with_other_data_is_refused_at_open() {
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    corpus(one.path(), 0);
    corpus(two.path(), 0);
    // Same documents, one token changed near the end.
    let bin = two.path().join("corpus/big.bin");
    let mut bytes = std::fs::read(&bin).unwrap();
    let at = bytes.len() - 40;
    bytes[at] ^= 1;
    std::fs::write(&bin, &bytes).unwrap();
    let (a, b) = (storage(one.path()), storage(two.path()));
    let reps = [authority(&a), authority(&b)];
    let (h, _empty) = host(&reps);
    let p = plan(
        &format!("dquant://{},{}/corpus/big", reps[0], reps[1]),
        false,
    );
    let e = open(&h.uri(), &p, Offload::Yes).err().unwrap().to_string();
    let last = (4u64 << 20) - 32;
    assert_eq!(
        e,
        format!(
            "sources[0] ({}): replica {} of corpus/big holds other data than replica {}: \
             tokens {last}..{} differ; every replica must serve the same dataset",
            p.sources[0].uri,
            reps[1],
            reps[0],
            last + 32
        )
    );
}

#[test]
fn the_placement_map_routes_datasets_to_their_replicas() {
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path(), 0);
    let (a, mut b) = (storage(dir.path()), storage(dir.path()));
    let reps = vec![authority(&a), authority(&b)];
    let mut cfg = dquant_testkit::agent::config(&[]);
    cfg.placement.insert("corpus/".into(), reps.clone());
    cfg.prefetch_frames = 1;
    cfg.upstream_timeout_secs = 5;
    let h = dquant_agent::start(cfg).unwrap();
    let p = plan("corpus/big", true);
    let want = local(dir.path(), &p);
    let mut r = open(&h.uri(), &p, Offload::Yes).unwrap();
    let got = read_batches(&mut r, 5);
    b.signal(libc::SIGKILL);
    let _ = b.child.wait();
    std::thread::sleep(Duration::from_millis(50));
    assert_rest_completes(&mut r, got, &want, "a serves on");
}
