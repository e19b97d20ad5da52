//! One dataset, opened once, shared by every session of an agent: concurrent sessions and
//! stats reuse the open dataset, each stream still equals the in-process one; a file
//! truncated under a streaming session ends that session with an error saying so, and the
//! agent serves on.

use dquant_client::{open, Offload, Reader};
use dquant_plan::Cursor;
use dquant_testkit::agent::{plan, Corpus};
use dquant_testkit::stream::drain;
use dquant_testkit::xxh3;

#[test]
fn concurrent_sessions_read_through_one_open_dataset() {
    let c = Corpus::new();
    let agent = c.agent();
    let p = plan(&[("r50k.dqb", 0.5), ("wide", 0.5)], 127, 4);
    let want = xxh3(&drain(&mut Reader::local(&c.localized(&p), Cursor::START).unwrap()).0);
    let mut readers: Vec<Reader> = (0..4)
        .map(|_| open(&agent.uri(), &p, Offload::Yes).unwrap())
        .collect();
    // Two datasets opened once each, for four sessions at once.
    let s = agent.datasets();
    assert_eq!((s.opened, s.shared, s.entries), (2, 6, 2), "{s:?}");
    for r in &mut readers {
        assert_eq!(xxh3(&drain(r).0), want);
    }
    drop(readers);
    // Unused now, and kept: the next session opens nothing.
    c.assert_serving(&agent);
    assert_eq!(agent.datasets().opened, 2);
}

#[test]
fn a_file_truncated_under_a_session_ends_it_with_an_error_and_the_agent_serves_on() {
    let c = Corpus::new();
    let mut cfg = c.config();
    cfg.prefetch_frames = 1;
    let agent = dquant_agent::start(cfg).unwrap();
    for ext in ["bin", "idx"] {
        std::fs::copy(
            c.root().join(format!("r50k.{ext}")),
            c.root().join(format!("victim.{ext}")),
        )
        .unwrap();
    }
    let mut p = plan(&[("victim", 1.0)], 127, 4);
    // Far more than the agent can run ahead by (1 frame of prefetch plus socket buffers).
    p.samples = Some(200_000);
    let mut r = open(&agent.uri(), &p, Offload::Yes).unwrap();
    assert!(r.next_batch().unwrap().is_some());
    std::fs::OpenOptions::new()
        .write(true)
        .open(c.root().join("victim.bin"))
        .unwrap()
        .set_len(4096)
        .unwrap();
    let e = loop {
        match r.next_batch() {
            Ok(Some(_)) => {}
            Ok(None) => panic!("the stream ended without an error"),
            Err(e) => break e.to_string(),
        }
    };
    assert!(
        e.contains("victim.bin: the file is shorter than when it was opened")
            && e.contains("it was truncated or rewritten while being read"),
        "{e}"
    );
    drop(r);
    c.assert_serving(&agent);
}
