//! Requests a hostile (or careless) client can make, each answered with its exact error
//! while the agent serves on: after every case, a well-behaved client's whole stream still
//! equals the in-process one, byte for byte.

use std::io::Read;
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use dquant_agent::{AgentConfig, AgentHandle};
use dquant_client::{open, Control, Offload, Reader};
use dquant_plan::{Cursor, OutputDType, Plan, WhenExhausted};
use dquant_proto::v1::{OpenRequest, OpenSourceRequest, StatRequest};
use dquant_testkit::agent::{plan, Corpus};
use dquant_testkit::stream::drain;
use dquant_testkit::xxh3;
use dquant_transport::ring::RingConsumer;
use dquant_transport::{tcp, BufferPool, FrameReader, Hello, WireError};

fn control(agent: &AgentHandle) -> Control {
    Control::connect(&agent.control_addr().to_string()).unwrap()
}

/// Opens `p` as raw JSON at `consumed_samples` and returns the agent's refusal.
fn open_refused(agent: &AgentHandle, p: &Plan, consumed_samples: u64) -> String {
    match control(agent).open(OpenRequest {
        plan_json: p.to_json(),
        epoch: 0,
        consumed_samples,
        ..Default::default()
    }) {
        Ok(r) => panic!("opened session {}", r.session),
        Err(e) => e.to_string(),
    }
}

/// Adds tenants ((name, token)) that may read the corpus root.
fn add_tenants(cfg: &mut AgentConfig, tenants: &[(&str, &str)]) {
    for (name, token) in tenants {
        cfg.tenants.push(dquant_agent::TenantConfig {
            name: name.to_string(),
            token: token.to_string(),
            roots: vec!["corpus".into()],
            ..Default::default()
        });
    }
}

fn start(cfg: AgentConfig) -> AgentHandle {
    dquant_agent::start(cfg).unwrap()
}

#[test]
fn plans_sized_to_abort_the_agent_are_refused_before_anything_is_allocated() {
    let c = Corpus::new();
    let agent = c.agent();
    // The plan from the report: seq_len 1, batch 2^32 − 1, 2^64 − 1 samples.
    let mut p = plan(&[("r50k", 1.0)], 1, u32::MAX);
    p.samples = Some(u64::MAX);
    assert_eq!(
        open_refused(&agent, &p, 0),
        "batch_size 4294967295 is above this agent's limit of 65536 samples per batch \
         (limits.max_batch_samples)"
    );
    // Few samples, each enormous: the product of the plan's numbers would wrap in u64.
    let mut p = plan(&[("r50k", 1.0)], u32::MAX, 65536);
    p.output = OutputDType::I64;
    assert_eq!(
        open_refused(&agent, &p, 0),
        "batch_size 65536 × (seq_len 4294967295 + 1) × 8 bytes (i64) = 2251799813685248 bytes \
         per batch, above this agent's limit of 268435456 (limits.max_batch_bytes)"
    );
    let mut p = plan(&[("r50k", 1.0)], 127, 4);
    p.world = u32::MAX;
    assert_eq!(
        open_refused(&agent, &p, 0),
        "world 4294967295 is above this agent's limit of 65536 ranks (limits.max_world)"
    );
    let mut p = plan(&[("r50k", 1.0)], 127, 4);
    p.wire_codec = "auto+zstd:22".into();
    assert_eq!(
        open_refused(&agent, &p, 0),
        "wire_codec: zstd level 22 is above this agent's limit of 9 (limits.max_zstd_level)"
    );
    let e = control(&agent)
        .open_source(OpenSourceRequest {
            dataset: Some(StatRequest {
                dataset: "corpus/r50k".into(),
                ..Default::default()
            }),
            wire_codec: "bits:17+zstd:19".into(),
        })
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "wire_codec: zstd level 19 is above this agent's limit of 9 (limits.max_zstd_level)"
    );
    p.wire_codec = "auto+stream:12".into();
    assert_eq!(
        open_refused(&agent, &p, 0),
        "wire_codec: zstd level 12 is above this agent's limit of 9 (limits.max_zstd_level)"
    );
    // Nothing was opened for any of them.
    assert_eq!(agent.sessions(), (0, 0));
    c.assert_serving(&agent);
}

#[test]
fn limits_come_from_the_config() {
    let c = Corpus::new();
    let mut cfg = c.config();
    cfg.limits.max_sources = 1;
    cfg.limits.max_batch_bytes = 4 * 128 * 4 - 1;
    let agent = start(cfg);
    let p = plan(&[("r50k", 0.5), ("wide", 0.5)], 127, 4);
    assert_eq!(
        open_refused(&agent, &p, 0),
        "sources: 2 sources, above this agent's limit of 1 (limits.max_sources)"
    );
    let p = plan(&[("r50k", 1.0)], 127, 4);
    assert_eq!(
        open_refused(&agent, &p, 0),
        "batch_size 4 × (seq_len 127 + 1) × 4 bytes (i32) = 2048 bytes per batch, above this \
         agent's limit of 2047 (limits.max_batch_bytes)"
    );
    let mut p = plan(&[("r50k", 1.0)], 127, 4);
    p.output = OutputDType::U16;
    let want = xxh3(&drain(&mut Reader::local(&c.localized(&p), Cursor::START).unwrap()).0);
    let got = xxh3(&drain(&mut open(&agent.uri(), &p, Offload::Yes).unwrap()).0);
    assert_eq!(got, want, "a u16 batch of 1024 bytes is within the limit");
}

#[test]
fn a_far_cursor_in_a_blend_is_stopped_at_the_time_limit_and_frees_its_worker() {
    let c = Corpus::new();
    let mut cfg = c.config();
    cfg.limits.open_timeout_secs = 1;
    cfg.limits.open_workers = 1;
    let agent = start(cfg);
    let mut p = plan(&[("r50k", 0.5), ("wide", 0.5)], 127, 4);
    p.samples = Some(u64::MAX);
    // The blend climbs to a far cursor at once: the stream goes on from there.
    let mut r =
        dquant_client::open_at(&agent.uri(), &p, Cursor::new(0, 1 << 62), Offload::Yes).unwrap();
    assert!(r.next_batch().unwrap().is_some());
    drop(r);
    // With limits that renormalize it must replay: for centuries, so the time limit ends it.
    p.sources[0].max_samples = Some(1 << 63);
    p.when_exhausted = WhenExhausted::Renormalize;
    let t = Instant::now();
    assert_eq!(
        open_refused(&agent, &p, 1 << 62),
        "Open: stopped at the agent's time limit for one request (limits.open_timeout_secs)"
    );
    let took = t.elapsed();
    assert!(took < Duration::from_secs(10), "{took:?}");
    // Its place in the session table and its one worker are free again.
    assert_eq!(agent.sessions(), (0, 0));
    assert_eq!(agent.open_queue(), 0);
    c.assert_serving(&agent);
}

#[test]
fn abandoned_opens_are_reaped_without_waiting_for_the_next_open() {
    let c = Corpus::new();
    let mut cfg = c.config();
    cfg.max_sessions = 2;
    cfg.ticket_ttl_secs = 1;
    let agent = start(cfg);
    let ctl = control(&agent);
    for _ in 0..2 {
        ctl.open(OpenRequest {
            plan_json: plan(&[("r50k", 1.0)], 127, 4).to_json(),
            ..Default::default()
        })
        .unwrap();
    }
    assert_eq!(agent.sessions(), (2, 0));
    // The reaper frees them within about a second after their ticket expires, with no
    // request to trigger it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while agent.sessions() != (0, 0) {
        assert!(Instant::now() < deadline, "{:?}", agent.sessions());
        std::thread::sleep(Duration::from_millis(50));
    }
    c.assert_serving(&agent);
}

/// Reads the error frame an agent sends on a refused connection.
fn refusal(conn: TcpStream) -> String {
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut frames = FrameReader::new(conn);
    let pool = BufferPool::new(1, 1 << 16);
    let mut buf = pool.get();
    match frames.next_into(&mut buf) {
        Err(WireError::Remote(m)) => m,
        other => panic!("expected an error frame, got {other:?}"),
    }
}

#[test]
fn connections_that_never_say_hello_are_bounded() {
    let c = Corpus::new();
    let mut cfg = c.config();
    cfg.limits.max_handshakes = 3;
    let agent = start(cfg);
    let silent: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(agent.data_addr()).unwrap())
        .collect();
    // The accept loop counts them in order; the fourth finds the limit reached.
    std::thread::sleep(Duration::from_millis(200));
    let fourth = TcpStream::connect(agent.data_addr()).unwrap();
    assert_eq!(
        refusal(fourth),
        "agent is at its limit of 3 connections waiting for their hello \
         (limits.max_handshakes); retry later"
    );
    // Hanging up frees their places: a well-behaved client gets through.
    drop(silent);
    std::thread::sleep(Duration::from_millis(200));
    c.assert_serving(&agent);
}

#[test]
fn a_frame_sized_hello_is_refused_from_its_header() {
    // One connection sends a frame header declaring a 1 MiB payload instead of a hello: it
    // is refused from the header alone (a hello is 32 bytes), without reading the payload.
    let c = Corpus::new();
    let agent = c.agent();
    let mut conn = TcpStream::connect(agent.data_addr()).unwrap();
    let h = dquant_transport::frame::FrameHeader::for_payload(
        dquant_transport::FrameKind::Data,
        0,
        &vec![0u8; 1 << 20],
    )
    .unwrap();
    std::io::Write::write_all(&mut conn, &h.encode()).unwrap();
    assert_eq!(
        refusal(conn.try_clone().unwrap()),
        "data stream: frame 0 claims 1048576 payload bytes, over the 4096-byte limit"
    );
    let mut rest = Vec::new();
    let _ = conn.read_to_end(&mut rest);
    c.assert_serving(&agent);
}

/// A plan naming another agent makes this one dial it only when its operator listed that
/// agent: otherwise the plan could make the agent probe its network, and the error would say
/// which ports are open.
#[test]
fn chaining_to_an_unlisted_host_is_refused_without_dialing_it() {
    let c = Corpus::new();
    let agent = c.agent();
    // A listener that counts connections: nothing may reach it.
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    probe.set_nonblocking(true).unwrap();
    let addr = probe.local_addr().unwrap();
    let mut p = plan(&[("r50k", 1.0)], 127, 4);
    p.sources[0].uri = format!("dquant://{addr}/corpus/r50k");
    let e = open_refused(&agent, &p, 0);
    assert_eq!(
        e,
        format!(
            "sources[0] (dquant://{addr}/corpus/r50k): upstream agent {addr} is not in this \
             agent's upstreams list; its operator allows chaining with `upstreams = \
             [\"{addr}\"]` in the config (or `dquant serve --upstream {addr}`)"
        )
    );
    // A closed port gets the very same answer.
    p.sources[0].uri = "dquant://127.0.0.1:1/corpus/r50k".into();
    assert!(open_refused(&agent, &p, 0).contains("upstream agent 127.0.0.1:1 is not in"));
    assert!(
        probe.accept().is_err(),
        "the agent dialed the unlisted host"
    );
    c.assert_serving(&agent);
}

/// An allowed upstream that accepts and then says nothing costs the request the agent's
/// upstream timeout, not a thread forever.
#[test]
fn a_stalled_upstream_fails_the_open_at_the_upstream_timeout() {
    let c = Corpus::new();
    let stall = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = stall.local_addr().unwrap();
    // Accepts every connection and keeps it open, silent.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in stall.incoming() {
            held.push(conn);
        }
    });
    let mut cfg = c.config();
    cfg.upstreams = vec![addr.to_string()];
    cfg.upstream_timeout_secs = 1;
    let agent = start(cfg);
    let mut p = plan(&[("r50k", 1.0)], 127, 4);
    p.sources[0].uri = format!("dquant://{addr}/corpus/r50k");
    let t = Instant::now();
    let e = open_refused(&agent, &p, 0);
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    assert_eq!(
        e,
        format!(
            "sources[0] (dquant://{addr}/corpus/r50k): agent {addr}: no answer to OpenSource \
             within 1 s"
        )
    );
    assert_eq!(agent.sessions(), (0, 0));
    c.assert_serving(&agent);
}

/// `Close` needs the session's ticket (and, with tenants, the tenant that opened it): a
/// stranger who knows or guesses an id cannot end another client's stream.
#[test]
fn close_needs_the_ticket_and_the_owner() {
    let c = Corpus::new();
    let mut cfg = c.config();
    add_tenants(
        &mut cfg,
        &[("a", "tenant-a-0123456789"), ("b", "tenant-b-0123456789")],
    );
    let agent = start(cfg);
    let as_tenant = |t: &str| control(&agent).with_token(t).unwrap();
    let (a, b) = (
        as_tenant("tenant-a-0123456789"),
        as_tenant("tenant-b-0123456789"),
    );
    let reply = a
        .open(OpenRequest {
            plan_json: plan(&[("r50k", 1.0)], 127, 4).to_json(),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(agent.sessions(), (1, 0));
    // Another tenant, even with the ticket; the owner without it, or with a wrong one.
    assert!(!b.close(reply.session, &reply.ticket).unwrap());
    assert!(!a.close(reply.session, &[]).unwrap());
    assert!(!a.close(reply.session, &[0u8; 16]).unwrap());
    assert_eq!(agent.sessions(), (1, 0));
    assert!(a.close(reply.session, &reply.ticket).unwrap());
    assert_eq!(agent.sessions(), (0, 0));
    // No token at all is refused before any handler.
    let e = control(&agent)
        .close(reply.session, &reply.ticket)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "this agent serves tenants only: send a tenant's token (set DQUANT_TOKEN)"
    );
}

/// With tenants, the data plane checks the token too: a hello (TCP, or a ring hand-over on
/// the Unix socket) must carry the token of the tenant that opened the session, beside its
/// ticket. Every refusal leaves the session pending for its owner, who then streams it.
#[test]
fn the_data_plane_hello_needs_the_sessions_tenant_token() {
    let c = Corpus::new();
    let mut cfg = c.config();
    let sock = c.dir.path().join("tenants.sock");
    cfg.socket = Some(sock.clone());
    let (token_a, token_b) = ("tenant-a-0123456789", "tenant-b-0123456789");
    add_tenants(&mut cfg, &[("a", token_a), ("b", token_b)]);
    let agent = start(cfg);
    let a = control(&agent).with_token(token_a).unwrap();
    // Far longer than the agent can run ahead (prefetch and socket buffers), so the session
    // is still streaming when its owner closes it.
    let mut long = plan(&[("r50k", 1.0)], 127, 4);
    long.samples = Some(1_000_000);
    let reply = a
        .open(OpenRequest {
            plan_json: long.to_json(),
            ..Default::default()
        })
        .unwrap();
    let hello = |token: Option<&str>| Hello {
        token: token.map(str::to_string),
        ..a.hello(&reply).unwrap()
    };
    let no_token = "this agent serves tenants only: send a tenant's token (set DQUANT_TOKEN)";
    let unknown = format!(
        "data stream: unknown session {} or wrong ticket (sessions are claimed once, within \
         the ticket's lifetime)",
        reply.session
    );
    let mut buf = BufferPool::new(1, 1 << 20).get();
    let tcp_refusal = |h: &Hello, buf: &mut _| {
        let (_w, r) = tcp::connect(&agent.data_addr().to_string(), h, None).unwrap();
        match FrameReader::new(r.get_ref().get_ref().try_clone().unwrap()).next_into(buf) {
            Err(WireError::Remote(m)) => m,
            other => panic!("expected a refusal, got {other:?}"),
        }
    };
    assert_eq!(
        tcp_refusal(&hello(None), &mut buf),
        format!("data stream: {no_token}")
    );
    assert_eq!(
        tcp_refusal(&hello(Some("not-a-tenant-token-at-all")), &mut buf),
        "data stream: the token is not a tenant's of this agent"
    );
    // Tenant b's token with tenant a's ticket: as if the session did not exist.
    assert_eq!(tcp_refusal(&hello(Some(token_b)), &mut buf), unknown);
    // The ring hand-over on the Unix socket, without a token.
    let (_ring, fds) = RingConsumer::create(4, 1 << 20).unwrap();
    let s = UnixStream::connect(&sock).unwrap();
    fds.send_with(&s, &hello(None).encode()).unwrap();
    match FrameReader::new(s).next_into(&mut buf) {
        Err(WireError::Remote(m)) => assert_eq!(m, format!("shared-memory ring: {no_token}")),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(
        agent.sessions(),
        (1, 0),
        "every refusal left the session pending"
    );
    // The owner's hello, built by its control connection, carries its token and streams.
    let (_w, r) = tcp::connect(
        &agent.data_addr().to_string(),
        &a.hello(&reply).unwrap(),
        None,
    )
    .unwrap();
    let mut frames = FrameReader::new(r.get_ref().get_ref().try_clone().unwrap());
    assert!(frames.next_into(&mut buf).unwrap());
    assert_eq!(&buf[..4], b"DQBT");
    assert_eq!(agent.sessions(), (0, 1));
    assert!(a.close(reply.session, &reply.ticket).unwrap());
}

/// A consumer that stops reading holds its session only until `consumer_idle_secs`; then
/// that session alone is released (TCP: the socket's send timeout; shared memory: the wait
/// for a free slot), and the agent serves on.
#[test]
fn a_consumer_that_stops_reading_is_released_after_the_idle_limit() {
    let c = Corpus::new();
    let mut cfg = c.config();
    cfg.consumer_idle_secs = 1;
    let sock = c.dir.path().join("idle.sock");
    cfg.socket = Some(sock.clone());
    let agent = start(cfg);
    let mut p = plan(&[("r50k", 1.0)], 127, 4);
    p.epochs = Some(500);
    for addr in [agent.uri(), sock.display().to_string()] {
        let mut r = open(&addr, &p, Offload::Yes).unwrap();
        r.next_batch().unwrap().unwrap();
        assert_eq!(agent.sessions(), (0, 1), "{addr}");
        // Stop reading; the session is released within the limit and a few seconds.
        let deadline = Instant::now() + Duration::from_secs(20);
        while agent.sessions() != (0, 0) {
            assert!(Instant::now() < deadline, "{addr}: {:?}", agent.sessions());
            std::thread::sleep(Duration::from_millis(50));
        }
        drop(r);
    }
    c.assert_serving(&agent);
}

/// A TLS agent's data port: connections that do not complete a handshake (a plaintext
/// hello, bytes that are not TLS, a peer that hangs up mid-handshake) are closed one by one,
/// each handing its handshake place back; a client with the agent's CA then opens a plan on
/// the TLS control plane and streams it to its end over the TLS data plane.
#[test]
fn a_tls_data_port_closes_what_is_not_tls_and_serves_on() {
    use dquant_client::Credentials;
    use dquant_transport::ClientTls;
    let c = Corpus::new();
    let dir = tempfile::tempdir().unwrap();
    let (mut cfg, pki) = c.tls_config(dir.path());
    cfg.limits.max_handshakes = 2;
    let agent = start(cfg);
    let plain_hello = Hello {
        session: 1,
        ticket: [7; 16],
        token: None,
    };
    let mut hello_frame = Vec::new();
    dquant_transport::FrameWriter::new(&mut hello_frame)
        .send(dquant_transport::FrameKind::Data, &plain_hello.encode())
        .unwrap();
    let tls_start = [0x16u8, 3, 1, 0, 200, 1, 0];
    for bytes in [&hello_frame[..], b"GET / HTTP/1.1\r\n\r\n", &tls_start[..]] {
        for _ in 0..3 {
            let mut s = TcpStream::connect(agent.data_addr()).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            std::io::Write::write_all(&mut s, bytes).unwrap();
            if bytes == &tls_start[..] {
                // Half a ClientHello, then the peer hangs up.
                s.shutdown(std::net::Shutdown::Write).unwrap();
            }
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest);
        }
    }
    let creds = Credentials {
        token: None,
        tls: Some(ClientTls::from_ca_file(&pki.ca).unwrap()),
    };
    let addr = agent.control_addr().to_string();
    let ctl = Control::connect_with(&addr, Duration::from_secs(30), &creds).unwrap();
    let mut p = plan(&[("r50k.dqb", 1.0)], 63, 4);
    // Plain on the wire, so that the payloads are the stream's bytes as they are.
    p.wire_codec = "i32".into();
    let reply = ctl
        .open(OpenRequest {
            plan_json: p.to_json(),
            ..Default::default()
        })
        .unwrap();
    let (_w, mut records) = ctl.connect_data(&reply).unwrap();
    assert!(records.get_ref().get_ref().is_tls());
    let mut streamed = Vec::new();
    while let Some(h) = records.next_header().unwrap() {
        let h = dquant_transport::BatchHeader::parse(&h).unwrap();
        let mut payload = vec![0u8; h.payload_len as usize];
        records.read_exact(&mut payload, "batch payload").unwrap();
        streamed.extend_from_slice(&payload);
    }
    let mut local = Reader::local(&c.localized(&p), Cursor::START).unwrap();
    let (tokens, _) = drain(&mut local);
    assert!(!tokens.is_empty());
    assert_eq!(
        xxh3(&streamed),
        xxh3(&tokens),
        "the TLS stream differs from the local one"
    );
}
