//! Bad input: every mistake gets its exact error, and the agent keeps serving other clients
//! correctly afterwards.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use dquant_agent::AgentHandle;
use dquant_client::{open, ClientError, Control, Offload, Reader, SourceError};
use dquant_codec::bits_needed;
use dquant_plan::{Cursor, OutputDType};
use dquant_proto::v1::OpenRequest;
use dquant_storage::{Dataset, OpenOptions};
use dquant_testkit::agent::{plan, wait_idle, Corpus};
use dquant_transport::{BufferPool, FrameKind, FrameReader, FrameWriter, Hello, WireError};

fn open_err(agent: &AgentHandle, names: &[(&str, f64)]) -> String {
    match open(&agent.uri(), &plan(names, 127, 4), Offload::Yes) {
        Ok(_) => panic!("opening {names:?} succeeded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn unknown_datasets_and_path_escapes_are_refused() {
    let c = Corpus::new();
    std::fs::write(c.dir.path().join("secret"), b"not yours").unwrap();
    std::os::unix::fs::symlink(c.dir.path().join("secret"), c.root().join("escape")).unwrap();
    let agent = c.agent();
    assert_eq!(
        open_err(&agent, &[("r50k", 1.0), ("missing", 1.0)]),
        "sources[1] (corpus/missing): dataset \"corpus/missing\": no such dataset under root \"corpus\""
    );
    let mut p = plan(&[("r50k", 1.0)], 127, 4);
    p.sources[0].uri = "nope/x".into();
    assert_eq!(
        open(&agent.uri(), &p, Offload::Yes).err().unwrap().to_string(),
        "sources[0] (nope/x): dataset \"nope/x\": unknown root \"nope\" (this agent serves: corpus)"
    );
    assert_eq!(
        open_err(&agent, &[("../secret", 1.0)]),
        "sources[0] (corpus/../secret): dataset \"corpus/../secret\": '..' is not allowed; names are relative to a root"
    );
    assert_eq!(
        open_err(&agent, &[("escape", 1.0)]),
        "sources[0] (corpus/escape): dataset \"corpus/escape\": resolves outside root \"corpus\" (symlink escape)"
    );
    p.sources[0].uri = "/etc/passwd".into();
    assert_eq!(
        open(&agent.uri(), &p, Offload::Yes).err().unwrap().to_string(),
        "sources[0] (/etc/passwd): dataset \"/etc/passwd\": absolute paths are not allowed; name a dataset as ROOT/PATH"
    );
    // The same refusals on the source path (chaining, Offload::No with an agent).
    let e = open(
        &agent.uri(),
        &plan(&[("../secret", 1.0)], 127, 4),
        Offload::No,
    )
    .err()
    .unwrap();
    assert_eq!(
        e.to_string(),
        "sources[0] (corpus/../secret): dataset \"corpus/../secret\": '..' is not allowed; names are relative to a root"
    );
    assert_eq!(agent.sessions(), (0, 0), "refused opens hold nothing");
    c.assert_serving(&agent);
}

#[test]
fn malformed_plans_name_what_is_wrong() {
    let c = Corpus::new();
    let agent = c.agent();
    let control = Control::connect(&agent.control_addr().to_string()).unwrap();
    let open_json = |json: &str, consumed: u64| match control.open(OpenRequest {
        plan_json: json.into(),
        epoch: 0,
        consumed_samples: consumed,
        ..Default::default()
    }) {
        Ok(_) => panic!("{json} was accepted"),
        Err(SourceError::Agent(m)) => m,
        Err(e) => panic!("not an agent error: {e}"),
    };
    assert_eq!(
        open_json("{not json", 0),
        "plan: key must be a string at line 1 column 2"
    );
    assert_eq!(
        open_json(
            r#"{"sources":[{"uri":"corpus/r50k","weight":-1}],"seq_len":16,"batch_size":2}"#,
            0
        ),
        "sources[0].weight: must be a finite number > 0 (got -1)"
    );
    assert_eq!(
        open_json(
            r#"{"sources":[{"uri":"corpus/r50k"}],"seq_len":0,"batch_size":2}"#,
            0
        ),
        "seq_len: must be at least 1"
    );
    assert_eq!(
        open_json(r#"{"sources":[],"seq_len":8,"batch_size":2}"#, 0),
        "sources: at least one source is required"
    );
    assert_eq!(
        open_json(
            r#"{"sources":[{"uri":"corpus/r50k"}],"seq_len":8,"batch_size":2,"rank":4,"world":4}"#,
            0
        ),
        "rank: 4 is not below world 4"
    );
    assert_eq!(
        open_json(
            r#"{"sources":[{"uri":"corpus/r50k"}],"seq_len":8,"batch_size":2,"wire_codec":"u17"}"#,
            0
        ),
        "wire_codec: invalid codec 'u17': expected u8, u16, u24, u32, i32, i64 or bits:N (N in 1..=32)"
    );
    let e = open_json(
        r#"{"sources":[{"uri":"corpus/r50k"}],"seq_len":8,"batch_size":2,"world":2}"#,
        1 << 50,
    );
    assert!(
        e.starts_with("cursor: consumed_samples 1125899906842624 is past the end of the plan ("),
        "{e}"
    );
    // A cursor's optional parts are checked before anything is sized from them.
    let bad_cursor = |blend: Vec<u64>, delivered: Vec<u64>| {
        match control.open(OpenRequest {
        plan_json: r#"{"sources":[{"uri":"corpus/r50k"},{"uri":"corpus/r50k","weight":3}],"seq_len":8,"batch_size":2}"#.into(),
        consumed_samples: 40,
        blend,
        delivered,
        ..Default::default()
    }) {
        Ok(_) => panic!("accepted"),
        Err(SourceError::Agent(m)) => m,
        Err(e) => panic!("not an agent error: {e}"),
    }
    };
    assert_eq!(
        bad_cursor(vec![], vec![45, 41]),
        "cursor: delivered is not strictly ascending: [0] = 45 then [1] = 41"
    );
    assert_eq!(
        bad_cursor(vec![1; 3], vec![]),
        "cursor: blend has 3 counts, the plan has 2 sources"
    );
    assert_eq!(
        bad_cursor(vec![30, 10], vec![]),
        "cursor: blend[0] = 30 is not this plan's blend after 40 samples (source 0's share is \
         10.0)"
    );
    assert_eq!(agent.sessions(), (0, 0));
    c.assert_serving(&agent);
}

#[test]
fn garbage_on_the_data_port_gets_an_error_frame() {
    let c = Corpus::new();
    let agent = c.agent();
    let pool = BufferPool::new(1, 1 << 20);
    let mut buf = pool.get();

    // An HTTP request is not a frame.
    let mut s = TcpStream::connect(agent.data_addr()).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: dquant\r\nAccept: */*\r\n\r\n")
        .unwrap();
    let mut r = FrameReader::new(s);
    match r.next_into(&mut buf) {
        Err(WireError::Remote(m)) => assert_eq!(
            m,
            "data stream: bad frame magic [47, 45, 54, 20] (not a dquant data stream, or out of sync)"
        ),
        other => panic!("expected an error frame, got {other:?}"),
    }

    // A well-formed hello for a session that does not exist.
    let s = TcpStream::connect(agent.data_addr()).unwrap();
    let mut w = FrameWriter::new(s.try_clone().unwrap());
    w.send(
        FrameKind::Data,
        &Hello {
            session: 99,
            ticket: [7; 16],
            token: None,
        }
        .encode(),
    )
    .unwrap();
    match FrameReader::new(s).next_into(&mut buf) {
        Err(WireError::Remote(m)) => assert_eq!(
            m,
            "data stream: unknown session 99 or wrong ticket (sessions are claimed once, within the ticket's lifetime)"
        ),
        other => panic!("expected an error frame, got {other:?}"),
    }

    // A frame with a wrong payload checksum, and a connection that just closes.
    let mut s = TcpStream::connect(agent.data_addr()).unwrap();
    let mut frame = Vec::new();
    FrameWriter::new(&mut frame)
        .send(FrameKind::Data, &[1u8; 32])
        .unwrap();
    frame[40] ^= 1;
    s.write_all(&frame).unwrap();
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    assert!(!reply.is_empty(), "the agent explains before closing");
    drop(TcpStream::connect(agent.data_addr()).unwrap());

    // Random bytes, many times over.
    for seed in 0..20u32 {
        let mut s = TcpStream::connect(agent.data_addr()).unwrap();
        let junk: Vec<u8> = (0..4096u32)
            .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed * 97) >> 13) as u8)
            .collect();
        let _ = s.write_all(&junk);
        let _ = s.read_to_end(&mut Vec::new());
    }
    c.assert_serving(&agent);
}

#[test]
fn a_client_killed_mid_stream_frees_its_session() {
    let c = Corpus::new();
    let agent = c.agent();
    let mut p = plan(&[("r50k", 1.0)], 1023, 8);
    p.epochs = Some(200);
    let control = Control::connect(&agent.control_addr().to_string()).unwrap();
    for _ in 0..3 {
        let reply = control
            .open(OpenRequest {
                plan_json: p.to_json(),
                ..Default::default()
            })
            .unwrap();
        let (_w, mut records) = control.connect_data(&reply).unwrap();
        // Read a little, then vanish without a Close, as a killed process does.
        let mut first = [0u8; 4096];
        records.read_exact(&mut first, "test").unwrap();
        assert_eq!(agent.sessions().1, 1);
        drop(records);
        drop(_w);
        wait_idle(&agent);
    }
    // A reader dropped mid-stream (it also sends Close) frees everything too.
    let mut r = open(&agent.uri(), &p, Offload::Yes).unwrap();
    r.next_batch().unwrap().unwrap();
    drop(r);
    wait_idle(&agent);
    // A session opened but never connected is dropped once its ticket expires.
    let mut cfg = c.config();
    cfg.ticket_ttl_secs = 1;
    let short = dquant_agent::start(cfg).unwrap();
    let ctl = Control::connect(&short.control_addr().to_string()).unwrap();
    ctl.open(OpenRequest {
        plan_json: p.to_json(),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(short.sessions(), (1, 0));
    std::thread::sleep(Duration::from_millis(1100));
    // Expired sessions are reaped when the next one opens.
    let reply = ctl
        .open(OpenRequest {
            plan_json: plan(&[("r50k", 1.0)], 127, 4).to_json(),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(short.sessions(), (1, 0));
    assert!(ctl.close(reply.session, &reply.ticket).unwrap());
    assert_eq!(short.sessions(), (0, 0));
    c.assert_serving(&agent);
}

#[test]
fn session_limit_is_enforced_with_a_clear_error() {
    let c = Corpus::new();
    let mut cfg = c.config();
    cfg.max_sessions = 2;
    let agent = dquant_agent::start(cfg).unwrap();
    // Long enough that the first two stay active (stalled by back-pressure).
    let mut p = plan(&[("r50k", 1.0)], 127, 4);
    p.epochs = Some(500);
    let a = open(&agent.uri(), &p, Offload::Yes).unwrap();
    let b = open(&agent.uri(), &p, Offload::Yes).unwrap();
    let e = open(&agent.uri(), &p, Offload::Yes).err().unwrap();
    assert_eq!(
        e.to_string(),
        "agent is at its limit of 2 sessions; close finished readers or raise max_sessions"
    );
    drop((a, b));
    wait_idle(&agent);
    c.assert_serving(&agent);
}

#[test]
fn tokens_too_wide_for_a_u16_wire_codec_are_an_exact_error() {
    let c = Corpus::new();
    let agent = c.agent();
    let ds = Dataset::open(&c.root().join("wide"), &OpenOptions::default()).unwrap();
    let mut toks = Vec::new();
    ds.reader().read(0..ds.tokens(), &mut toks).unwrap();
    let o = toks.iter().position(|&t| t > 65535).unwrap();
    let v = toks[o];
    let n = bits_needed(v);
    let mut p = plan(&[("wide", 1.0)], 255, 4);
    p.shuffle = false;
    p.output = OutputDType::I32;
    p.wire_codec = "u16".into();
    let want = format!(
        "sources[0] (corpus/wide): wire codec u16: token {v} at offset {o} does not fit in u16 (max 65535); it needs {n} bits: use bits:{n} or wider"
    );
    // Batches before the bad one arrive intact, then the error.
    let expect_batches = (o.saturating_sub(1) / 255) / 4;
    let mut r = open(&agent.uri(), &p, Offload::Yes).unwrap();
    let mut good = 0;
    let e = loop {
        match r.next_batch() {
            Ok(Some(_)) => good += 1,
            Ok(None) => panic!("no error"),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(e, ClientError::Wire(WireError::Remote(_))),
        "{e:?}"
    );
    assert_eq!(e.to_string(), want);
    assert_eq!(good, expect_batches);

    // With a u16 *output*, the agent fails exactly as the in-process reader does.
    p.wire_codec = "auto".into();
    p.output = OutputDType::U16;
    let local = drain_err(Reader::local(&c.localized(&p), Cursor::START).unwrap());
    let remote = drain_err(open(&agent.uri(), &p, Offload::Yes).unwrap());
    assert_eq!(remote, local.replace(&c.path("wide"), "corpus/wide"));
    assert_eq!(
        remote,
        format!(
            "sources[0] (corpus/wide): token {v} at offset {o} does not fit in u16 (max 65535); it needs {n} bits: use bits:{n} or wider"
        )
    );
    // With the output's plain codec on the wire the agent narrows straight into the record
    // (`Pipeline::next_batch_into`, whose narrowing is the only check): the same error.
    p.wire_codec = "u16".into();
    let plain = drain_err(open(&agent.uri(), &p, Offload::Yes).unwrap());
    assert_eq!(plain, remote);
    wait_idle(&agent);
    c.assert_serving(&agent);
}

fn drain_err(mut r: Reader) -> String {
    loop {
        match r.next_batch() {
            Ok(Some(_)) => {}
            Ok(None) => panic!("no error"),
            Err(e) => return e.to_string(),
        }
    }
}
