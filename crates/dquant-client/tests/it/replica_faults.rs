//! Replica faults a reader never sees, injected through the agent's debug-only hook
//! (`AgentHandle::inject`): one of two replicas cuts a range session's connection, as a
//! storage agent that dies under its readers does. The stream is byte-identical to a local
//! read and has no error. (`crates/dquant-cli/tests/it/replicas.rs` kills real agent
//! processes; these cut at chosen requests, which a kill cannot time.)
#![cfg(debug_assertions)]

use dquant_agent::faults::Fault;
use dquant_agent::AgentHandle;
use dquant_client::{open, Offload};
use dquant_plan::Plan;
use dquant_testkit::agent::{plan, Corpus};
use dquant_testkit::stream::{drain, until_error};
use dquant_testkit::xxh3;

/// A plan over `corpus/r50k` (the Megatron pair), in the u16 wire codec.
pub(crate) fn r50k() -> Plan {
    let mut p = plan(&[("r50k", 1.0)], 127, 4);
    p.wire_codec = "u16".into();
    p
}

/// [`r50k`] held by both agents, read from them as replicas by the client.
pub(crate) fn replicated(a: &AgentHandle, b: &AgentHandle) -> Plan {
    let mut p = r50k();
    let (x, y) = (a.control_addr(), b.control_addr());
    p.sources[0].uri = format!("dquant://{x},{y}/corpus/r50k");
    p
}

/// The same stream read from the local file.
pub(crate) fn local(c: &Corpus) -> Vec<u8> {
    drain(&mut open("", &c.localized(&r50k()), Offload::No).unwrap()).0
}

/// The second replica fails while the open checks that it holds the same data (its first
/// request is the open's probes): it is left out to be tried again, and the open goes on
/// with the first. (Before, a replica failing there failed the whole open.)
#[test]
fn a_replica_failing_while_it_is_checked_at_open_is_left_out() {
    let c = Corpus::new();
    let (a, b) = (c.agent(), c.agent());
    b.inject(Fault::CutRangeSession { request: 0 });
    let mut r = open("", &replicated(&a, &b), Offload::No).unwrap();
    let (got, _) = drain(&mut r);
    assert_eq!(b.faults_armed(), 0, "the cut happened");
    assert!(xxh3(&got) == xxh3(&local(&c)), "the streams differ");
}

/// Each replica cuts a session mid-stream in turn: every read moves to the other, and back.
#[test]
fn replicas_cut_mid_stream_in_turn_change_nothing() {
    let c = Corpus::new();
    let (a, b) = (c.agent(), c.agent());
    a.inject(Fault::CutRangeSession { request: 3 });
    b.inject(Fault::CutRangeSession { request: 2 });
    let mut r = open("", &replicated(&a, &b), Offload::No).unwrap();
    let (got, _) = drain(&mut r);
    assert_eq!(
        (a.faults_armed(), b.faults_armed()),
        (0, 0),
        "both cuts happened"
    );
    assert!(xxh3(&got) == xxh3(&local(&c)), "the streams differ");
}

/// One replica's copy of a block file has a flipped bit (its disk, not the network): its
/// agent's block check fails the ranges that touch it, the reads move to the other replica,
/// and the stream is that of the good copy, without an error.
#[test]
fn a_flipped_bit_in_one_replicas_copy_never_reaches_a_batch() {
    let (good, bad) = (Corpus::new(), Corpus::new());
    let path = bad.root().join("r50k.dqb");
    let mut bytes = std::fs::read(&path).unwrap();
    // A third of the way in: inside a block's payload, far from the footer and the index.
    let at = bytes.len() / 3;
    bytes[at] ^= 0x10;
    std::fs::write(&path, bytes).unwrap();
    let mut whole = plan(&[("r50k.dqb", 1.0)], 127, 4);
    whole.wire_codec = "u16".into();
    let want = drain(&mut open("", &good.localized(&whole), Offload::No).unwrap()).0;
    // The damage is real: the bad copy alone fails.
    let mut alone = open("", &bad.localized(&whole), Offload::No).unwrap();
    let e = until_error(&mut alone)
        .1
        .expect("the bad copy fails its check");
    assert!(e.contains("r50k.dqb: checksum mismatch in block"), "{e}");
    let (a, b) = (good.agent(), bad.agent());
    for (first, second) in [(&a, &b), (&b, &a)] {
        let mut p = replicated(first, second);
        p.sources[0].uri = p.sources[0].uri.replace("r50k", "r50k.dqb");
        let mut r = open("", &p, Offload::No).unwrap();
        let (got, _) = drain(&mut r);
        assert!(xxh3(&got) == xxh3(&want), "the streams differ");
    }
}

/// The same for a Megatron `.bin`, which has no checksums of its own: both replicas carry the
/// good copy's chunk sums sidecar (`dquant sums`), one `.bin` has a flipped bit. Its agent
/// fails the reads that meet the damaged chunk, naming the chunk; they move to the other
/// replica, and the stream is the good copy's, without an error.
#[test]
fn a_flipped_bit_in_one_replicas_megatron_bin_never_reaches_a_batch() {
    use dquant_format::chunk_sums::{ChunkSums, MIN_CHUNK};
    let (good, bad) = (Corpus::new(), Corpus::new());
    let bin = std::fs::read(good.root().join("r50k.bin")).unwrap();
    let sums = ChunkSums::of(&bin, MIN_CHUNK).unwrap().encode();
    for c in [&good, &bad] {
        std::fs::write(c.root().join("r50k.dqsum"), &sums).unwrap();
    }
    let mut flipped = bin.clone();
    flipped[bin.len() / 3] ^= 0x10;
    std::fs::write(bad.root().join("r50k.bin"), flipped).unwrap();
    let want = local(&good);
    let mut alone = open("", &bad.localized(&r50k()), Offload::No).unwrap();
    let e = until_error(&mut alone)
        .1
        .expect("the bad copy fails its check");
    assert!(
        e.contains("r50k.bin: checksum mismatch in chunk 52 (bytes 212992..217088), against"),
        "{e}"
    );
    // The bad agent counts the reads it refused for its damaged copy (an operator's signal).
    let mut cfg = bad.config();
    let metrics = dquant_testkit::metrics::free_addr();
    cfg.metrics_listen = Some(metrics);
    let (a, b) = (good.agent(), dquant_agent::start(cfg).unwrap());
    let failed = || {
        let page = dquant_testkit::metrics::scrape(metrics);
        dquant_testkit::metrics::value(&page, "dquant_corrupt_reads_total{dataset=\"corpus/r50k\"}")
    };
    for (first, second) in [(&a, &b), (&b, &a)] {
        let before = failed();
        let mut r = open("", &replicated(first, second), Offload::No).unwrap();
        let (got, _) = drain(&mut r);
        assert!(xxh3(&got) == xxh3(&want), "the streams differ");
        assert!(failed() > before, "the bad replica never met the damage");
    }
}

/// An error every replica reports alike (a token too wide for the plan's wire codec) is the
/// request's, not a replica's: the read fails at once with the agents' message, as from one
/// agent. (Before, the reads failed over from one replica to the other until the timeout,
/// 120 s, and then named every replica as failed.)
#[test]
fn an_error_every_replica_reports_alike_fails_at_once() {
    let c = Corpus::new();
    let (a, b) = (c.agent(), c.agent());
    let mut p = plan(&[("wide", 1.0)], 255, 4);
    p.shuffle = false;
    p.wire_codec = "u16".into();
    let (x, y) = (a.control_addr(), b.control_addr());
    p.sources[0].uri = format!("dquant://{x},{y}/corpus/wide");
    let t = std::time::Instant::now();
    // The open's probes of the replicas' data already meet a wide token, or the reads do.
    let e = match open("", &p, Offload::No) {
        Err(e) => e.to_string(),
        Ok(mut r) => loop {
            match r.next_batch() {
                Ok(Some(_)) => {}
                Ok(None) => panic!("a u16 wire codec carried 18-bit tokens"),
                Err(e) => break e.to_string(),
            }
        },
    };
    assert!(t.elapsed().as_secs() < 10, "{:?}", t.elapsed());
    assert!(
        e.contains("corpus/wide: token ") && e.ends_with("it needs 18 bits: use bits:18 or wider"),
        "{e}"
    );
}
