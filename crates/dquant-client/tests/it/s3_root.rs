//! An agent serving an `s3://` root (a real S3 server, s3s-fs, on loopback) streams exactly
//! what the same files give in-process: whole-stream checksums for Megatron, block-file and
//! blended plans, listing, and missing datasets refused end to end.

use std::path::PathBuf;

use dquant_client::{open, Control, Offload, Reader};
use dquant_objstore::S3Settings;
use dquant_plan::{Cursor, Plan};
use dquant_testkit::agent::{plan, plan_in, Corpus};
use dquant_testkit::metrics::{free_addr, scrape, value};
use dquant_testkit::s3::{S3Server, ACCESS_KEY, SECRET_KEY};
use dquant_testkit::stream::drain;
use dquant_testkit::xxh3;

/// The corpus's files put under `s3://corpus/tokens/` on `server`.
fn upload(c: &Corpus, server: &S3Server) {
    for e in std::fs::read_dir(c.root()).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        server.put(
            "corpus",
            &format!("tokens/{name}"),
            &std::fs::read(e.path()).unwrap(),
        );
    }
}

/// Small parts, so that the fixtures span many GETs and the readahead.
fn settings(server: &S3Server) -> S3Settings {
    S3Settings {
        endpoint: Some(server.endpoint()),
        access_key_id: Some(ACCESS_KEY.into()),
        secret_access_key: Some(SECRET_KEY.into()),
        part_bytes: 64 << 10,
        readahead_bytes: 256 << 10,
        ..S3Settings::default()
    }
}

/// `p` (over `corpus/…`) run in-process from the local files.
fn local(c: &Corpus, p: &Plan) -> u64 {
    let mut r = Reader::local(&c.localized(p), Cursor::START).unwrap();
    xxh3(&drain(&mut r).0)
}

/// `p` with its `corpus/` sources read from root `s3` of the agent at `uri`.
fn through_s3(uri: &str, p: &Plan) -> u64 {
    let mut p = p.clone();
    for s in &mut p.sources {
        s.uri = s.uri.replacen("corpus/", "s3/", 1);
    }
    let mut r = open(uri, &p, Offload::Yes).unwrap();
    assert!(r.is_offloaded());
    xxh3(&drain(&mut r).0)
}

#[test]
fn an_s3_root_streams_what_the_local_files_do() {
    let c = Corpus::new();
    let server = S3Server::start();
    upload(&c, &server);
    let mut cfg = c.config();
    cfg.roots
        .insert("s3".into(), PathBuf::from("s3://corpus/tokens"));
    cfg.s3 = settings(&server);
    let agent = dquant_agent::start(cfg).unwrap();
    let uri = agent.uri();

    // Megatron int32, shuffled; the block-file copy; a blend with a wide vocabulary and a
    // compressing wire codec; unshuffled over two epochs.
    let mut plans = vec![
        plan(&[("r50k", 1.0)], 255, 8),
        plan(&[("r50k.dqb", 1.0)], 255, 8),
    ];
    let mut p = plan(&[("r50k.dqb", 0.7), ("wide", 0.3)], 511, 4);
    p.wire_codec = "auto+zstd:1".into();
    p.samples = Some(600);
    plans.push(p);
    let mut p = plan(&[("r50k", 1.0)], 100, 5);
    p.shuffle = false;
    p.epochs = Some(2);
    plans.push(p);
    for p in &plans {
        assert_eq!(through_s3(&uri, p), local(&c, p), "{:?}", p.sources);
    }

    // Chained: a near agent pulls shuffled ranges from the S3 root of this one (each
    // request's ranges announced to the store), the same stream again.
    let (near, _empty) = c.near_agent(&agent);
    let mut p = plan(&[("r50k", 1.0)], 255, 8);
    let want = local(&c, &p);
    p.sources[0].uri = format!("dquant://{}/s3/r50k", agent.control_addr());
    let mut r = open(&near.uri(), &p, Offload::Yes).unwrap();
    assert_eq!(xxh3(&drain(&mut r).0), want);

    // Listed like the directory it was copied from.
    let ctl = Control::connect(&agent.control_addr().to_string()).unwrap();
    let names = |root: &str| -> Vec<(String, String, u64)> {
        ctl.list(root)
            .unwrap()
            .into_iter()
            .map(|e| {
                (
                    e.name.split_once('/').unwrap().1.to_string(),
                    e.kind,
                    e.bytes,
                )
            })
            .collect()
    };
    assert_eq!(names("s3"), names("corpus"));

    // A missing dataset is NotFound end to end.
    let e = open(
        &uri,
        &plan_in("s3", &[("missing", 1.0)], 127, 4, 1),
        Offload::Yes,
    )
    .err()
    .unwrap()
    .to_string();
    assert_eq!(
        e,
        "sources[0] (s3/missing): dataset \"s3/missing\": no such dataset under root \"s3\""
    );
}

#[test]
fn a_block_cache_serves_repeats_and_changes_nothing() {
    let c = Corpus::new();
    let server = S3Server::start();
    upload(&c, &server);
    let cache = tempfile::tempdir().unwrap();
    let mut cfg = c.config();
    cfg.roots
        .insert("s3".into(), PathBuf::from("s3://corpus/tokens"));
    cfg.s3 = settings(&server);
    cfg.block_cache = Some(dquant_agent::BlockCacheConfig {
        dir: cache.path().to_path_buf(),
        max_bytes: 64 << 20,
        block_bytes: 64 << 10,
    });
    let metrics = free_addr();
    cfg.metrics_listen = Some(metrics);
    let agent = dquant_agent::start(cfg).unwrap();
    let p = plan(&[("r50k.dqb", 0.5), ("wide", 0.5)], 255, 8);
    let want = local(&c, &p);
    assert_eq!(through_s3(&agent.uri(), &p), want);
    let files = std::fs::read_dir(cache.path()).unwrap().count();
    assert!(files > 0, "the cache holds blocks");
    // The agent itself served the repeat from the cache: its hit counter moved, and the
    // misses did not (the reaper publishes the cache's totals every second: one tick
    // passes first, so that no figure from the middle of the first read is taken).
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let before = block_cache_counts(metrics, |(_, misses)| misses > 0.0);
    assert_eq!(through_s3(&agent.uri(), &p), want);
    let after = block_cache_counts(metrics, |(hits, _)| hits > before.0);
    assert_eq!(
        after.1, before.1,
        "a repeat read missed the cache: {after:?}"
    );
    // Every entry damaged: the stream is still the store's, and the entries are rewritten.
    for e in std::fs::read_dir(cache.path()).unwrap() {
        let p = e.unwrap().path();
        let mut b = std::fs::read(&p).unwrap();
        b[0] ^= 1;
        std::fs::write(&p, &b).unwrap();
    }
    assert_eq!(through_s3(&agent.uri(), &p), want);
    assert_eq!(through_s3(&agent.uri(), &p), want);
}

/// The agent's block-cache (hits, misses) once `ready` holds of them (within 5 s).
fn block_cache_counts(
    metrics: std::net::SocketAddr,
    ready: impl Fn((f64, f64)) -> bool,
) -> (f64, f64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let page = scrape(metrics);
        let counts = (
            value(&page, "dquant_block_cache_hits_total"),
            value(&page, "dquant_block_cache_misses_total"),
        );
        if ready(counts) {
            return counts;
        }
        assert!(std::time::Instant::now() < deadline, "{counts:?}\n{page}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
