//! Shared streams end to end: one plan run once on the agent, its batches delivered to many
//! consumers over TCP and shared memory. Every subscriber's stream is compared with the plan
//! run in this process, byte for byte, with its cursors.

use std::time::Duration;

use dquant_client::{open_shared, subscribe, ClientError, Reader, Share};
use dquant_plan::{Cursor, Plan};
use dquant_testkit::agent::{plan, wait_idle, Corpus};
use dquant_testkit::stream::drain;
use dquant_testkit::xxh3;

/// A checksum of a stream, its batch sizes and where it ended.
type Digest = (u64, Vec<usize>, Cursor);

fn digest(mut r: Reader) -> Digest {
    let (bytes, sizes) = drain(&mut r);
    (xxh3(&bytes), sizes, r.cursor())
}

/// The plan run in this process from `from`.
fn local(c: &Corpus, p: &Plan, from: Cursor) -> Digest {
    digest(Reader::local(&c.localized(p), from).unwrap())
}

fn share(group: u32) -> Share {
    Share {
        name: "job42/dp3".into(),
        group,
    }
}

/// Several epochs in a compressed wire codec: TCP subscribers get the lz4 records, ring
/// subscribers the output dtype made from them.
fn shared_plan() -> Plan {
    shared_plan_in("auto+lz4")
}

/// The wire codecs of a shared stream: records made for the window and converted once for
/// its shared ring (lz4), and records in the output dtype, made in the ring itself (i32).
const CODECS: [&str; 2] = ["auto+lz4", "i32"];

/// [`shared_plan`] in wire codec `codec`.
fn shared_plan_in(codec: &str) -> Plan {
    let mut p = plan(&[("r50k.dqb", 0.7), ("wide", 0.3)], 255, 4);
    p.epochs = Some(2);
    p.wire_codec = codec.into();
    p
}

#[test]
fn four_subscribers_over_tcp_and_shm_get_the_stream_a_single_consumer_gets() {
    for codec in CODECS {
        four_subscribers(codec);
    }
}

fn four_subscribers(codec: &str) {
    let c = Corpus::new();
    let (agent, sock) = c.agent_with_socket();
    let p = shared_plan_in(codec);
    let want = local(&c, &p, Cursor::START);
    let tcp = agent.uri();
    // Two open the plan as the stream (the first makes it, the second joins it), two
    // subscribe by name; the stream waits for all four before its first batch.
    let readers = [
        open_shared(&tcp, &p, Cursor::START, &share(4)),
        open_shared(&sock, &p, Cursor::START, &share(4)),
        subscribe(&tcp, "job42/dp3", Some(&Cursor::START)),
        subscribe(&sock, "job42/dp3", Some(&Cursor::START)),
    ];
    let got: Vec<Digest> = std::thread::scope(|s| {
        let handles: Vec<_> = readers
            .into_iter()
            .map(|r| s.spawn(move || digest(r.unwrap())))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g, &want, "{codec}: subscriber {i}");
    }
    wait_idle(&agent);
    // The name is free again once everyone has left.
    assert_eq!(
        digest(open_shared(&tcp, &p, Cursor::START, &share(1)).unwrap()),
        want
    );
    wait_idle(&agent);
}

#[test]
fn shm_subscribers_on_the_agents_host_read_one_ring_the_agent_writes_once() {
    for codec in CODECS {
        shm_subscribers(codec);
    }
}

fn shm_subscribers(codec: &str) {
    let c = Corpus::new();
    let (agent, sock) = c.agent_with_socket();
    let p = shared_plan_in(codec);
    let want = local(&c, &p, Cursor::START);
    let verify = format!("{sock}?verify=true");
    let readers = [
        open_shared(&sock, &p, Cursor::START, &share(5)),
        open_shared(&sock, &p, Cursor::START, &share(5)),
        subscribe(&sock, "job42/dp3", Some(&Cursor::START)),
        subscribe(&sock, "job42/dp3", Some(&Cursor::START)),
        // Asks for checksums the ring (made as the first subscriber's) does not carry: it
        // gets its own ring.
        subscribe(&verify, "job42/dp3", Some(&Cursor::START)),
    ];
    let got: Vec<(bool, Digest)> = std::thread::scope(|s| {
        let handles: Vec<_> = readers
            .into_iter()
            .map(|r| {
                s.spawn(move || {
                    let r = r.unwrap();
                    (r.reads_shared_ring(), digest(r))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let shared: Vec<bool> = got.iter().map(|g| g.0).collect();
    assert_eq!(shared, [true, true, true, true, false], "{codec}");
    for (i, (_, g)) in got.iter().enumerate() {
        assert_eq!(g, &want, "{codec}: subscriber {i}");
    }
    wait_idle(&agent);
}

/// (A subscriber SIGKILLed mid-stream: `crates/dquant-cli/tests/it/agent.rs`.)
#[test]
fn a_subscriber_closed_mid_stream_leaves_the_others_streams_whole() {
    // The quitter over TCP, then as a reader of the stream's shared ring.
    for over_shm in [false, true] {
        closed_mid_stream(over_shm);
    }
}

fn closed_mid_stream(over_shm: bool) {
    for codec in CODECS {
        closed_mid_stream_in(over_shm, codec);
    }
}

fn closed_mid_stream_in(over_shm: bool, codec: &str) {
    let c = Corpus::new();
    let (agent, sock) = c.agent_with_socket();
    let p = shared_plan_in(codec);
    let want = local(&c, &p, Cursor::START);
    let tcp = agent.uri();
    let a = open_shared(&tcp, &p, Cursor::START, &share(3)).unwrap();
    let b = subscribe(&sock, "job42/dp3", None).unwrap();
    let quitter_at = if over_shm { &sock } else { &tcp };
    let mut quitter = subscribe(quitter_at, "job42/dp3", None).unwrap();
    assert_eq!(quitter.reads_shared_ring(), over_shm);
    let got = std::thread::scope(|s| {
        let a = s.spawn(move || digest(a));
        let b = s.spawn(move || digest(b));
        for _ in 0..5 {
            quitter.next_batch().unwrap().unwrap();
        }
        // Closed mid-stream: its session ends, and the stream no longer waits for it.
        drop(quitter);
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(got.0, want, "{codec}");
    assert_eq!(got.1, want, "{codec}");
}

#[test]
fn a_late_joiner_starts_at_the_current_cursor_and_an_earlier_one_is_refused() {
    // The transport preset too: a shared stream compresses each record alone (a stream
    // codec's late joiner would have missed its stream's start).
    for codec in ["auto+lz4", "transport"] {
        late_joiner(codec, false);
    }
    // Over shared memory: the late joiner reads the stream's shared ring from the stream's
    // head, which the ring may not have reached yet (records made for the window), or has
    // (records made in the ring).
    for codec in CODECS {
        late_joiner(codec, true);
    }
}

/// A batch made in the shared ring while every subscriber read it there is not in the
/// window for a subscriber outside the ring that joins behind the stream's head: it is told
/// so, and the ring's reader gets the whole stream.
#[test]
fn a_batch_only_the_shared_ring_has_is_refused_to_a_subscriber_outside_it() {
    let c = Corpus::new();
    let mut cfg = c.config();
    cfg.share_window_batches = 64;
    cfg.prefetch_frames = 1;
    let sock = c.root().with_file_name("agent.sock");
    cfg.socket = Some(sock.clone());
    let agent = dquant_agent::start(cfg).unwrap();
    let mut p = shared_plan_in("i32");
    p.epochs = Some(50);
    let want = local(&c, &p, Cursor::START);
    let first = open_shared(&sock.display().to_string(), &p, Cursor::START, &share(1)).unwrap();
    assert!(first.reads_shared_ring());
    let mut first = first;
    let mut head = Vec::new();
    let mut cursors = Vec::new();
    for _ in 0..80 {
        let b = first.next_batch().unwrap().unwrap();
        head.extend_from_slice(b.tokens.as_bytes());
        cursors.push(first.cursor());
    }
    // The producer takes the ring in before the window (64 batches) is full, so batch 77 was
    // made in the ring alone, and is still in the window, as a place in the stream only.
    let behind = subscribe(&agent.uri(), "job42/dp3", Some(&cursors[75])).unwrap();
    let (err, rest) = std::thread::scope(|s| {
        let rest = s.spawn(move || drain(&mut first).0);
        (drain_err(behind), rest.join().unwrap())
    });
    assert_eq!(
        err,
        "share \"job42/dp3\": the batches at this subscriber's cursor went only into the \
         stream's shared ring, which this subscriber does not read; subscribe at the stream's \
         current cursor"
    );
    head.extend_from_slice(&rest);
    assert_eq!(
        xxh3(&head),
        want.0,
        "the ring's reader gets the whole stream"
    );
    wait_idle(&agent);
}

/// Reads `r` to its end, which must be an error: its message.
fn drain_err(mut r: Reader) -> String {
    loop {
        match r.next_batch() {
            Ok(Some(_)) => {}
            Ok(None) => panic!("the stream ended without an error"),
            Err(e) => return e.to_string(),
        }
    }
}

fn late_joiner(codec: &str, over_shm: bool) {
    let c = Corpus::new();
    let mut cfg = c.config();
    cfg.share_window_batches = 2;
    // Little ahead of the consumer, and a long stream: the late joiner comes mid-stream.
    cfg.prefetch_frames = 1;
    let sock = c.root().with_file_name("agent.sock");
    cfg.socket = over_shm.then(|| sock.clone());
    let agent = dquant_agent::start(cfg).unwrap();
    let tcp = if over_shm {
        sock.display().to_string()
    } else {
        agent.uri()
    };
    let mut p = shared_plan();
    p.epochs = Some(50);
    p.wire_codec = codec.into();
    let mut first = open_shared(&tcp, &p, Cursor::START, &share(1)).unwrap();
    let mut head = Vec::new();
    for _ in 0..10 {
        let b = first.next_batch().unwrap().unwrap();
        head.extend_from_slice(b.tokens.as_bytes());
    }
    // The window holds two batches, so batch 0 left it long ago.
    let refused = subscribe(&tcp, "job42/dp3", Some(&Cursor::START))
        .err()
        .unwrap();
    let m = refused.to_string();
    assert!(
        m.contains(
            "share \"job42/dp3\": cursor (epoch 0 consumed_samples 0) is no longer in the \
             stream's window, which holds batches from (epoch "
        ),
        "{m}"
    );
    let late = subscribe(&tcp, "job42/dp3", None).unwrap();
    assert_eq!(late.reads_shared_ring(), over_shm);
    let from = late.cursor();
    assert!(
        (from.epoch, from.consumed_samples) >= (0, 40),
        "joined at {from:?}"
    );
    let (late, rest) = std::thread::scope(|s| {
        let late = s.spawn(move || digest(late));
        let (bytes, _) = drain(&mut first);
        head.extend_from_slice(&bytes);
        (late.join().unwrap(), xxh3(&head))
    });
    assert!(!late.1.is_empty(), "the late joiner came before the end");
    assert_eq!(
        late,
        local(&c, &p, from),
        "the late joiner's stream is the plan's tail"
    );
    assert_eq!(
        rest,
        local(&c, &p, Cursor::START).0,
        "the first one's is whole"
    );
    wait_idle(&agent);
}

#[test]
fn bad_shares_are_refused_by_name() {
    let c = Corpus::new();
    let agent = c.agent();
    let tcp = agent.uri();
    let err = |r: Result<Reader, ClientError>| r.err().unwrap().to_string();
    assert!(err(subscribe(&tcp, "job42/dp9", None)).contains(
        "no shared stream \"job42/dp9\": a consumer of this tenant opens it with share = \
         \"job42/dp9\" beside its plan"
    ));
    let bad = Share {
        name: "job 42".into(),
        group: 0,
    };
    assert!(err(open_shared(&tcp, &shared_plan(), Cursor::START, &bad))
        .contains("share: \"job 42\" is not a share name"));
    // A stream of one plan, then another plan under its name.
    let _first = open_shared(&tcp, &shared_plan(), Cursor::START, &share(1)).unwrap();
    let other = plan(&[("r50k", 1.0)], 127, 2);
    assert!(
        err(open_shared(&tcp, &other, Cursor::START, &share(1))).contains(
            "share \"job42/dp3\" runs a different plan; subscribe to it, or choose another name"
        )
    );
    drop(_first);
    c.assert_serving(&agent);
    wait_idle(&agent);
    std::thread::sleep(Duration::from_millis(10));
}

/// Records over 1 MiB go out as several frames, their checksums made once; subscribers over
/// TLS get the same stream as plain ones would.
#[test]
fn large_records_reach_tls_subscribers_whole() {
    use dquant_client::{AgentUri, Credentials};
    use dquant_transport::ClientTls;
    let c = Corpus::new();
    let dir = tempfile::tempdir().unwrap();
    let (cfg, pki) = c.tls_config(dir.path());
    let agent = dquant_agent::start(cfg).unwrap();
    let mut p = plan(&[("r50k", 1.0)], 4095, 80);
    p.wire_codec = "u32".into();
    p.epochs = Some(20);
    let want = local(&c, &p, Cursor::START);
    let creds = Credentials {
        token: None,
        tls: Some(ClientTls::from_ca_file(&pki.ca).unwrap()),
    };
    let uri = AgentUri::parse(&agent.uri()).unwrap();
    let first = Reader::remote_shared(&uri, &p, Cursor::START, &share(2), &creds).unwrap();
    let second = Reader::subscribe_with(&uri, "job42/dp3", None, &creds).unwrap();
    let got = std::thread::scope(|s| {
        let a = s.spawn(move || digest(first));
        (a.join().unwrap(), digest(second))
    });
    assert!(want.1.len() >= 3, "several batches of 1.3 MB records");
    assert_eq!(got.0, want);
    assert_eq!(got.1, want);
}

/// Four readers opening the same plan under one name at once make one stream: every join
/// counts one more subscriber of it, and each reader gets the whole stream.
#[test]
fn concurrent_opens_of_one_name_make_one_stream() {
    use dquant_proto::v1::event::Kind;
    let c = Corpus::new();
    let agent = c.agent();
    let tcp = agent.uri();
    let p = shared_plan();
    let want = local(&c, &p, Cursor::START);
    let control = dquant_client::Control::connect(&agent.control_addr().to_string()).unwrap();
    let mut watch = control.watch(1000).unwrap();
    let got: Vec<Digest> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| s.spawn(|| digest(open_shared(&tcp, &p, Cursor::START, &share(4)).unwrap())))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(got.iter().all(|g| g == &want));
    let mut joins = Vec::new();
    while joins.len() < 4 {
        if let Some(Kind::Subscriber(e)) = watch.next().unwrap().unwrap().kind {
            if e.joined {
                joins.push(e.subscribers);
            }
        }
    }
    assert_eq!(joins, vec![1, 2, 3, 4]);
}
