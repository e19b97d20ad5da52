//! The loopback transport end to end: a consumer in the agent's own process, batches handed
//! over in memory (streams equal to TCP and in-process ones are checked in `shm.rs`). Here:
//! the session's lifecycle without a socket to shut down: a reader dropped mid-stream, a
//! stalled reader at shutdown, a drain's resume cursor.

use std::time::{Duration, Instant};

use dquant_client::{open, open_at, ClientError, Offload, Reader};
use dquant_testkit::agent::{plan, wait_idle, Corpus};
use dquant_testkit::stream::drain;
use dquant_testkit::xxh3;

fn loopback(agent: &dquant_agent::AgentHandle) -> String {
    format!("{}?transport=loopback&slots=2", agent.uri())
}

/// A loopback reader of a plan with no end in sight, one batch read.
fn streaming(agent: &dquant_agent::AgentHandle) -> Reader {
    let mut p = plan(&[("r50k", 1.0)], 255, 8);
    p.epochs = Some(50);
    let mut r = open(&loopback(agent), &p, Offload::Yes).unwrap();
    r.next_batch().unwrap().unwrap();
    r
}

/// A reader dropped mid-stream frees its session (the producer waiting for room sees the
/// hang-up), and the agent serves on.
#[test]
fn a_reader_dropped_mid_stream_frees_its_session() {
    let c = Corpus::new();
    let agent = c.agent();
    let r = streaming(&agent);
    assert_eq!(agent.sessions(), (0, 1));
    drop(r);
    wait_idle(&agent);
    let p = plan(&[("r50k.dqb", 1.0)], 127, 4);
    let want = xxh3(&drain(&mut open(&agent.uri(), &p, Offload::No).unwrap()).0);
    let mut r = open(&loopback(&agent), &p, Offload::Yes).unwrap();
    assert_eq!(xxh3(&drain(&mut r).0), want);
}

/// A drain tells a loopback reader where to resume, as over TCP; the rest of the stream,
/// from that cursor on a new agent, completes it exactly.
#[test]
fn a_drain_gives_a_loopback_reader_its_resume_cursor() {
    let c = Corpus::new();
    let agent = c.agent();
    let mut p = plan(&[("r50k", 1.0)], 127, 4);
    p.epochs = Some(3);
    let mut whole = open(&agent.uri(), &p, Offload::No).unwrap();
    let want = xxh3(&drain(&mut whole).0);
    let mut r = open(&loopback(&agent), &p, Offload::Yes).unwrap();
    let mut got = Vec::new();
    for _ in 0..5 {
        got.extend_from_slice(r.next_batch().unwrap().unwrap().tokens.as_bytes());
    }
    let drained = std::thread::spawn(move || agent.drain(Duration::from_secs(5)));
    let e = loop {
        match r.next_batch() {
            Ok(Some(b)) => got.extend_from_slice(b.tokens.as_bytes()),
            Ok(None) => panic!("the stream ended before the drain"),
            Err(e) => break e,
        }
    };
    assert!(e.to_string().contains("resume from"), "{e}");
    assert_eq!(drained.join().unwrap().forced, 0);
    let agent = c.agent();
    let mut rest = open_at(&loopback(&agent), &p, r.cursor(), Offload::Yes).unwrap();
    got.extend_from_slice(&drain(&mut rest).0);
    assert_eq!(xxh3(&got), want);
}

/// A reader that stalls is cancelled at shutdown within the queue's cancel check, not left
/// waiting; its next read says the stream ended early.
#[test]
fn shutdown_cancels_a_stalled_loopback_session() {
    let c = Corpus::new();
    let agent = c.agent();
    let mut r = streaming(&agent);
    let t = Instant::now();
    agent.shutdown();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let e = loop {
        match r.next_batch() {
            Ok(Some(_)) => {}
            Ok(None) => panic!("a cancelled stream ended cleanly"),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(e, ClientError::Agent(_) | ClientError::Wire(_)),
        "{e:?}"
    );
}
