//! Panics contained: a producer that panics (a fault the tests inject through the agent's
//! debug-only hook, `AgentHandle::inject`) ends its own session, or its own shared stream,
//! with a clear error after the batches before it. Every other client streams on, byte for
//! byte, and the agent keeps serving new sessions. The hook does not exist in release builds.
#![cfg(debug_assertions)]

use dquant_agent::faults::{Fault, Site};
use dquant_client::{open, open_at, open_shared, subscribe, Offload, Reader, Share};
use dquant_plan::{Cursor, Plan};
use dquant_testkit::agent::{plan, wait_idle, Corpus};
use dquant_testkit::stream::drain;
use dquant_testkit::xxh3;

/// Four epochs of 4-sample batches: long enough that a bystander is mid-stream throughout.
fn long_plan() -> Plan {
    let mut p = plan(&[("r50k.dqb", 0.7), ("wide", 0.3)], 127, 4);
    p.epochs = Some(4);
    p
}

/// The batches `r` yields before its first error, and that error's message.
fn until_error(r: &mut Reader) -> (Vec<u8>, String) {
    let mut bytes = Vec::new();
    loop {
        match r.next_batch() {
            Ok(Some(b)) => bytes.extend_from_slice(b.tokens.as_bytes()),
            Ok(None) => panic!("the stream ended without the injected failure"),
            Err(e) => return (bytes, e.to_string()),
        }
    }
}

/// The first `n` batches of `r`, as bytes.
fn batches(r: &mut Reader, n: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    for _ in 0..n {
        let b = r.next_batch().unwrap().expect("a longer stream");
        bytes.extend_from_slice(b.tokens.as_bytes());
    }
    bytes
}

#[test]
fn a_session_whose_producer_panics_ends_alone_and_resumes_whole() {
    let c = Corpus::new();
    let (agent, sock) = c.agent_with_socket();
    let p = long_plan();
    let want = drain(&mut Reader::local(&c.localized(&p), Cursor::START).unwrap()).0;
    let batch_bytes = 4 * 128 * 4;
    for uri in [agent.uri(), sock] {
        // A bystander whose producer is past batch 3 before the fault is armed.
        let mut bystander = open(&uri, &p, Offload::Yes).unwrap();
        let mut seen = batches(&mut bystander, 5);
        agent.inject(Fault::PanicAtBatch {
            site: Site::Session,
            batch: 3,
        });
        let mut victim = open(&uri, &p, Offload::Yes).unwrap();
        let (got, e) = until_error(&mut victim);
        assert_eq!(
            e,
            "internal error on the agent (injected fault: Session producer panics at batch 3): \
             this stream is ended, the agent serves on; resume from consumed_samples 12",
            "{uri}"
        );
        assert_eq!(
            got.len(),
            3 * batch_bytes,
            "{uri}: the batches before the panic"
        );
        assert_eq!(got[..], want[..got.len()], "{uri}");
        // The victim resumes from its own cursor: nothing lost, nothing repeated.
        assert_eq!(victim.cursor().consumed_samples, 12, "{uri}");
        let mut rest = open_at(&uri, &p, victim.cursor(), Offload::Yes).unwrap();
        let whole = [got, drain(&mut rest).0].concat();
        assert!(
            xxh3(&whole) == xxh3(&want),
            "{uri}: the resumed stream differs"
        );
        // The bystander never noticed.
        seen.extend(drain(&mut bystander).0);
        assert!(
            xxh3(&seen) == xxh3(&want),
            "{uri}: the bystander's stream differs"
        );
        wait_idle(&agent);
    }
}

#[test]
fn a_shared_stream_whose_producer_panics_ends_every_subscriber_and_nobody_else() {
    let c = Corpus::new();
    let (agent, sock) = c.agent_with_socket();
    let p = long_plan();
    let want = drain(&mut Reader::local(&c.localized(&p), Cursor::START).unwrap()).0;
    let tcp = agent.uri();
    let mut bystander = open(&tcp, &p, Offload::Yes).unwrap();
    let mut seen = batches(&mut bystander, 5);
    agent.inject(Fault::PanicAtBatch {
        site: Site::SharedStream,
        batch: 2,
    });
    let share = Share {
        name: "job7/dp0".into(),
        group: 4,
    };
    // Two read the stream's shared ring: each finds the message on its own socket.
    let readers = [
        open_shared(&tcp, &p, Cursor::START, &share),
        open_shared(&sock, &p, Cursor::START, &share),
        subscribe(&tcp, "job7/dp0", Some(&Cursor::START)),
        subscribe(&sock, "job7/dp0", Some(&Cursor::START)),
    ];
    let ends: Vec<(Vec<u8>, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = readers
            .into_iter()
            .map(|r| s.spawn(move || until_error(&mut r.unwrap())))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (got, e)) in ends.iter().enumerate() {
        assert_eq!(
            e,
            "internal error on the agent (injected fault: SharedStream producer panics at \
             batch 2): this stream is ended, the agent serves on; resume from consumed_samples 8",
            "subscriber {i}"
        );
        assert_eq!(got[..], want[..got.len()], "subscriber {i}");
        assert_eq!(got.len(), 2 * 4 * 128 * 4, "subscriber {i}");
    }
    seen.extend(drain(&mut bystander).0);
    assert!(xxh3(&seen) == xxh3(&want), "the bystander's stream differs");
    wait_idle(&agent);
    // The name is free again, and a new stream under it runs whole.
    let again = open_shared(&tcp, &p, Cursor::START, &Share { group: 1, ..share });
    assert!(xxh3(&drain(&mut again.unwrap()).0) == xxh3(&want));
    wait_idle(&agent);
}
