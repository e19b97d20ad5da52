//! A failing disk under an agent, injected through its debug-only hook
//! (`Fault::Storage`, see `dquant_storage::faulty`): EIO, an object that ends early, a latency
//! spike. Under a replica set the reader sees none of them and its stream is unchanged; under
//! a lone agent the reader gets a clear error naming the object, never wrong tokens, and the
//! agent serves on.
#![cfg(debug_assertions)]

use std::time::{Duration, Instant};

use dquant_agent::faults::Fault;
use dquant_client::{open, Offload};
use dquant_storage::faulty::StorageFault;
use dquant_testkit::agent::Corpus;
use dquant_testkit::stream::{drain, until_error};
use dquant_testkit::xxh3;

// The plans are the replica faults' (the faults below hit `r50k.bin`, the pair's data).
use crate::replica_faults::{local, r50k, replicated};

fn eio(nth: u64) -> Fault {
    Fault::Storage(StorageFault::ReadError {
        object: "r50k.bin".into(),
        nth,
    })
}

/// One replica's disk returns EIO, the other's has its file end early: each read moves to
/// the other replica, and the stream is the local one, without an error.
#[test]
fn eio_and_a_short_read_on_replicas_disks_never_reach_the_reader() {
    let c = Corpus::new();
    let (a, b) = (c.agent(), c.agent());
    a.inject(eio(4));
    b.inject(Fault::Storage(StorageFault::ShortRead {
        object: "r50k.bin".into(),
        nth: 6,
    }));
    let (got, error) = until_error(&mut open("", &replicated(&a, &b), Offload::No).unwrap());
    assert_eq!(error, None);
    assert_eq!(
        (a.faults_armed(), b.faults_armed()),
        (0, 0),
        "both faults fired"
    );
    assert!(xxh3(&got) == xxh3(&local(&c)), "the streams differ");
}

/// A lone agent has no other copy: its reader gets the batches before the failed read, then
/// an error that names the object and the disk's error. The fault cost that session only:
/// the same agent then streams the whole plan correctly.
#[test]
fn eio_under_a_lone_agent_is_a_clear_error_and_the_agent_serves_on() {
    let c = Corpus::new();
    let agent = c.agent();
    agent.inject(eio(3));
    let (got, error) = until_error(&mut open(&agent.uri(), &r50k(), Offload::Yes).unwrap());
    let e = error.expect("the read error reaches the reader");
    assert!(
        e.contains("r50k.bin") && e.contains("Input/output error (os error 5)"),
        "{e}"
    );
    let want = local(&c);
    assert!(
        got.len() < want.len() && want.starts_with(&got),
        "before the error: a prefix of the stream"
    );
    assert_eq!(agent.faults_armed(), 0);
    c.assert_serving(&agent);
    let again = drain(&mut open(&agent.uri(), &r50k(), Offload::Yes).unwrap()).0;
    assert!(xxh3(&again) == xxh3(&want), "the streams differ");
}

/// A latency spike of three slow reads changes nothing but time.
#[test]
fn a_latency_spike_changes_nothing_but_time() {
    let c = Corpus::new();
    let agent = c.agent();
    let delay = Duration::from_millis(150);
    agent.inject(Fault::Storage(StorageFault::Slow {
        object: "r50k.bin".into(),
        nth: 2,
        reads: 3,
        delay,
    }));
    let t = Instant::now();
    let got = drain(&mut open(&agent.uri(), &r50k(), Offload::Yes).unwrap()).0;
    assert!(t.elapsed() >= delay * 3, "the reads were slowed");
    assert_eq!(agent.faults_armed(), 0);
    assert!(xxh3(&got) == xxh3(&local(&c)), "the streams differ");
}
