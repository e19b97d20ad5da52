//! The shared-memory transport end to end: an agent with a Unix socket, clients that hand it
//! a ring. Streams through shm equal those over TCP and in-process, batch for batch; slow and
//! vanishing consumers, and failing plans, behave as on TCP.

use std::os::unix::net::UnixStream;
use std::time::Duration;

use dquant_agent::AgentHandle;
use dquant_client::{open, open_at, ClientError, Control, Offload, Reader, Transport};
use dquant_plan::{Cursor, OutputDType, Plan};
use dquant_proto::v1::OpenRequest;
use dquant_testkit::agent::{plan, wait_idle, Corpus};
use dquant_testkit::stream::{drain, read_all};
use dquant_testkit::xxh3;
use dquant_transport::ring::RingConsumer;
use dquant_transport::{BufferPool, FrameReader, Hello, WireError};

/// Whole-stream checksum and batch sizes of `p` from `uri` (offloaded), checking that the
/// reader uses `transport`.
fn stream(uri: &str, p: &Plan, from: Cursor, transport: Transport) -> (u64, Vec<usize>, Cursor) {
    let mut r = open_at(uri, p, from, Offload::Yes).unwrap();
    assert_eq!(r.transport(), Some(transport), "{uri}");
    let (bytes, sizes) = drain(&mut r);
    (xxh3(&bytes), sizes, r.cursor())
}

/// The plan's stream is the same in-process, over TCP, over shm (with and without crc
/// checks), over shm reached through the TCP address, and handed over in memory to this
/// process's agent (loopback, with a 2-record queue too).
fn assert_parity(c: &Corpus, agent: &AgentHandle, sock: &str, p: &Plan, from: Cursor) {
    let mut local = Reader::local(&c.localized(p), from.clone()).unwrap();
    let (lb, ls) = drain(&mut local);
    assert!(!lb.is_empty(), "the plan yields data");
    let want = (xxh3(&lb), ls, local.cursor());
    let tcp = agent.uri();
    let loopback: Transport = "loopback".parse().unwrap();
    for (uri, t) in [
        (tcp.clone(), Transport::TCP),
        (sock.to_string(), Transport::SHM),
        (format!("unix:{sock}?verify=true&slots=3"), Transport::SHM),
        (format!("{tcp}?transport=shm"), Transport::SHM),
        (format!("{sock}?transport=tcp"), Transport::TCP),
        (format!("{tcp}?transport=loopback"), loopback),
        (format!("{tcp}?transport=loopback&slots=2"), loopback),
    ] {
        assert_eq!(stream(&uri, p, from.clone(), t), want, "{uri}");
    }
}

#[test]
fn shm_streams_equal_tcp_and_local_ones() {
    let c = Corpus::new();
    let (agent, sock) = c.agent_with_socket();
    for out in [OutputDType::U16, OutputDType::I32, OutputDType::I64] {
        let mut p = plan(&[("r50k", 1.0)], 255, 8);
        p.output = out;
        assert_parity(&c, &agent, &sock, &p, Cursor::START);
    }
    // Several epochs, compressed wire codecs (used on TCP; shm carries the output dtype).
    for codec in ["u16+zstd:3", "auto+lz4", "bits:16"] {
        let mut p = plan(&[("r50k.dqb", 1.0)], 100, 5);
        p.shuffle = false;
        p.epochs = Some(2);
        p.wire_codec = codec.into();
        assert_parity(&c, &agent, &sock, &p, Cursor::START);
    }
    // A 70/30 blend of 16- and 18-bit vocabularies, a short last batch, resumed mid-stream
    // and on one rank of four.
    let mut p = plan(&[("r50k.dqb", 0.7), ("wide", 0.3)], 511, 4);
    p.samples = Some(601);
    assert_parity(&c, &agent, &sock, &p, Cursor::START);
    assert_parity(&c, &agent, &sock, &p, Cursor::new(0, 200));
    p.world = 4;
    p.rank = 3;
    assert_parity(&c, &agent, &sock, &p, Cursor::START);
    // Batches bigger than the 1 MiB default slot: the ring is sized from the plan.
    let mut p = plan(&[("r50k", 1.0)], 4095, 40);
    p.output = OutputDType::I64;
    p.samples = Some(200);
    assert_parity(&c, &agent, &sock, &p, Cursor::START);
    wait_idle(&agent);
}

#[test]
fn read_over_shm_returns_the_bytes_of_next_batch() {
    let c = Corpus::new();
    let (_agent, sock) = c.agent_with_socket();
    let p = plan(&[("r50k", 0.5), ("wide", 0.5)], 127, 3);
    let (want, _) = drain(&mut open(&sock, &p, Offload::Yes).unwrap());
    let got = read_all(&mut open(&sock, &p, Offload::Yes).unwrap(), 1001);
    assert_eq!(xxh3(&got), xxh3(&want));
    assert_eq!(got.len(), want.len());
}

#[test]
fn a_consumer_that_stalls_for_two_seconds_loses_nothing() {
    let c = Corpus::new();
    let (agent, sock) = c.agent_with_socket();
    let mut p = plan(&[("r50k", 1.0)], 255, 8);
    p.epochs = Some(3);
    let want = xxh3(&drain(&mut Reader::local(&c.localized(&p), Cursor::START).unwrap()).0);
    let mut r = open(&format!("{sock}?slots=2"), &p, Offload::Yes).unwrap();
    let mut bytes = Vec::new();
    for _ in 0..3 {
        bytes.extend_from_slice(r.next_batch().unwrap().unwrap().tokens.as_bytes());
    }
    // The agent fills the two slots and waits; the session stays open meanwhile.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(agent.sessions(), (0, 1));
    let (rest, _) = drain(&mut r);
    bytes.extend_from_slice(&rest);
    assert_eq!(xxh3(&bytes), want);
    drop(r);
    wait_idle(&agent);
}

/// Opens a plan session and hands the agent a ring for it, by hand.
fn raw_ring(sock: &str, p: &Plan, ticket_flip: bool) -> (RingConsumer, UnixStream) {
    let control = Control::connect(sock).unwrap();
    let reply = control
        .open(OpenRequest {
            plan_json: p.to_json(),
            ..Default::default()
        })
        .unwrap();
    let mut ticket: [u8; 16] = reply.ticket.as_slice().try_into().unwrap();
    if ticket_flip {
        ticket[0] ^= 1;
    }
    let hello = Hello {
        session: reply.session,
        ticket,
        token: None,
    };
    let (ring, fds) = RingConsumer::create(4, 1 << 20).unwrap();
    let s = UnixStream::connect(sock).unwrap();
    fds.send_with(&s, &hello.encode()).unwrap();
    (ring, s)
}

#[test]
fn a_consumer_that_goes_away_without_closing_frees_its_session() {
    let c = Corpus::new();
    let (agent, sock) = c.agent_with_socket();
    let mut p = plan(&[("r50k", 1.0)], 255, 8);
    p.epochs = Some(50);
    // Read one batch, then vanish: the socket and the ring go, no Close is sent.
    let (mut ring, s) = raw_ring(&sock, &p, false);
    assert!(ring.next(Duration::from_secs(10)).unwrap().is_some());
    assert_eq!(agent.sessions(), (0, 1));
    drop(ring);
    drop(s);
    wait_idle(&agent);
    // Same with the socket alone closed (a process that died keeps no ring either, but the
    // socket is what the agent watches).
    let (ring, s) = raw_ring(&sock, &p, false);
    drop(s);
    wait_idle(&agent);
    drop(ring);
    // The agent serves on.
    let p = plan(&[("r50k.dqb", 1.0)], 127, 4);
    let want = xxh3(&drain(&mut Reader::local(&c.localized(&p), Cursor::START).unwrap()).0);
    assert_eq!(stream(&sock, &p, Cursor::START, Transport::SHM).0, want);
}

#[test]
fn bad_ring_handovers_get_exact_errors() {
    let c = Corpus::new();
    let (agent, sock) = c.agent_with_socket();
    let p = plan(&[("r50k", 1.0)], 255, 8);
    // A wrong ticket: the agent says why on the socket and never touches the ring.
    let (mut ring, s) = raw_ring(&sock, &p, true);
    let pool = BufferPool::new(1, 1 << 20);
    let mut buf = pool.get();
    let e = FrameReader::new(s).next_into(&mut buf).unwrap_err();
    assert!(matches!(e, WireError::Remote(_)), "{e:?}");
    let m = e.to_string();
    assert!(
        m.starts_with("data stream: unknown session ")
            && m.ends_with(
                " or wrong ticket (sessions are claimed once, within the ticket's lifetime)"
            ),
        "{m}"
    );
    assert!(ring.next(Duration::from_millis(50)).is_err());
    // Garbage that starts like a handshake.
    let mut s = UnixStream::connect(&sock).unwrap();
    std::io::Write::write_all(&mut s, b"dquant-nonsense").unwrap();
    let e = FrameReader::new(s).next_into(&mut buf).unwrap_err();
    assert_eq!(
        e.to_string(),
        "ring: fd handshake: expected tag \"dquant-ring/1\", got \"dquant-nonsen\""
    );
    // shm through a TCP address of an agent without a socket.
    let plain = c.agent();
    let e = open(&format!("{}?transport=shm", plain.uri()), &p, Offload::Yes)
        .err()
        .unwrap();
    assert_eq!(
        e.to_string(),
        format!(
            "transport=shm: the agent at {} has no Unix socket; start it on this host with `dquant serve --socket PATH` and use that path as its address",
            plain.control_addr()
        )
    );
    wait_idle(&plain);
    for (uri, want) in [
        (
            format!("{sock}?transport=dma"),
            format!("{sock:?}: option transport=\"dma\" is not valid; use tcp, shm or loopback"),
        ),
        (
            format!("{sock}?slots=1"),
            format!("{sock:?}: option slots=\"1\" is not valid; use 2 to 4096"),
        ),
        (
            format!("{sock}?zero_copy=1"),
            format!("{sock:?}: unknown option \"zero_copy\" (known: transport, verify, slots)"),
        ),
    ] {
        let uri_dbg = format!("{uri:?}");
        let want = want.replace(&format!("{sock:?}"), &uri_dbg);
        assert_eq!(
            open(&uri, &p, Offload::Yes).err().unwrap().to_string(),
            want
        );
    }
    // Only the session whose ticket was wrong is left, pending for its rightful owner until
    // the ticket expires (as on the TCP data port).
    assert_eq!(agent.sessions(), (1, 0));
}

#[test]
fn a_plan_that_fails_mid_stream_delivers_earlier_batches_then_the_error() {
    let c = Corpus::new();
    let (agent, sock) = c.agent_with_socket();
    fails_mid_stream(&c, &agent, &sock);
}

/// An agent narrows int32 datasets straight from maps kept with them within its map budget
/// (by default half the host's memory), and one with a budget of 0 reads by `pread`: both
/// stream what the process reading the plan itself streams, on every path, and fail where
/// and as it fails. The maps are really made (and kept after the sessions end), or really
/// not.
#[test]
fn agents_that_map_and_that_read_stream_and_fail_as_the_process_itself() {
    for budget in [None, Some(0)] {
        let c = Corpus::new();
        let (agent, sock) = c.agent_with_socket_and(|cfg| cfg.map_budget = budget);
        for out in [OutputDType::U16, OutputDType::I32, OutputDType::I64] {
            let mut p = plan(&[("r50k", 1.0)], 255, 8);
            p.output = out;
            assert_parity(&c, &agent, &sock, &p, Cursor::START);
        }
        let mut p = plan(&[("r50k", 0.7), ("wide", 0.3)], 511, 4);
        p.samples = Some(601);
        assert_parity(&c, &agent, &sock, &p, Cursor::new(0, 200));
        let data = c.path("r50k.bin");
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        assert_eq!(
            maps.contains(&data),
            budget.is_none(),
            "{data} mapped: {budget:?}"
        );
        fails_mid_stream(&c, &agent, &sock);
    }
}

/// Datasets take an agent's map budget in the order they are first read: one that does not
/// fit in what is left is read by `pread`, and streams the same.
#[test]
fn a_dataset_past_the_map_budget_is_read_by_pread() {
    let c = Corpus::new();
    let r50k = std::fs::metadata(c.path("r50k.bin")).unwrap().len();
    let (agent, sock) = c.agent_with_socket_and(|cfg| cfg.map_budget = Some(r50k));
    assert_parity(
        &c,
        &agent,
        &sock,
        &plan(&[("r50k", 1.0)], 255, 8),
        Cursor::START,
    );
    let mut p = plan(&[("r50k", 0.7), ("wide", 0.3)], 511, 4);
    p.samples = Some(601);
    assert_parity(&c, &agent, &sock, &p, Cursor::START);
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    assert!(maps.contains(&c.path("r50k.bin")), "r50k is not mapped");
    assert!(
        !maps.contains(&c.path("wide.bin")),
        "wide is mapped past the budget"
    );
}

fn fails_mid_stream(c: &Corpus, agent: &AgentHandle, sock: &str) {
    let mut p = plan(&[("wide", 1.0)], 255, 4);
    p.shuffle = false;
    p.output = OutputDType::U16;
    let run = |mut r: Reader| {
        let mut good = 0;
        loop {
            match r.next_batch() {
                Ok(Some(_)) => good += 1,
                Ok(None) => panic!("no error"),
                Err(e) => return (good, e),
            }
        }
    };
    let (lgood, le) = run(Reader::local(&c.localized(&p), Cursor::START).unwrap());
    let (good, e) = run(open(sock, &p, Offload::Yes).unwrap());
    assert!(matches!(e, ClientError::Agent(_)), "{e:?}");
    assert_eq!(good, lgood);
    assert_eq!(
        e.to_string(),
        le.to_string().replace(&c.path("wide"), "corpus/wide")
    );
    wait_idle(agent);
}

/// The address ranges of this process's mappings of ring memfds (`/proc/self/maps` names
/// them `/memfd:dquant-ring (deleted)`).
fn ring_mappings() -> Vec<(usize, usize)> {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains("memfd:dquant-ring"))
        .map(|l| {
            let (a, b) = l
                .split_whitespace()
                .next()
                .unwrap()
                .split_once('-')
                .unwrap();
            (
                usize::from_str_radix(a, 16).unwrap(),
                usize::from_str_radix(b, 16).unwrap(),
            )
        })
        .collect()
}

#[test]
fn batches_are_viewed_in_the_ring_without_a_copy() {
    let c = Corpus::new();
    let (_agent, sock) = c.agent_with_socket();
    let p = plan(&[("r50k", 1.0)], 255, 8);
    let mut r = open(&format!("{sock}?slots=8"), &p, Offload::Yes).unwrap();
    // (Other tests in this process may have rings of their own mapped meanwhile.)
    let maps = ring_mappings();
    assert!(!maps.is_empty());
    let mut seen = std::collections::HashSet::new();
    for _ in 0..20 {
        let b = r.next_batch().unwrap().unwrap();
        let bytes = b.tokens.as_bytes();
        let (start, end) = (
            bytes.as_ptr() as usize,
            bytes.as_ptr() as usize + bytes.len(),
        );
        assert!(
            maps.iter().any(|&(a, z)| a <= start && end <= z),
            "batch {} at {start:#x}..{end:#x} is not in a ring mapping {maps:?}",
            b.index
        );
        seen.insert(start);
    }
    // The 8 slots take turns.
    assert_eq!(seen.len(), 8);
    // Over TCP, batches are copied out of frames into the reader's buffer instead.
    let mut t = open(&format!("{sock}?transport=tcp"), &p, Offload::Yes).unwrap();
    let b = t.next_batch().unwrap().unwrap();
    let at = b.tokens.as_bytes().as_ptr() as usize;
    assert!(!maps.iter().any(|&(a, z)| a <= at && at < z));
}

/// `next_owned` batches may be kept past later ones, dropped in any order, outlive the reader
/// and move to other threads: in-process, over TCP and over shm (views of ring slots, with
/// slots detached when kept batches would stall the ring), every kept batch still holds its
/// bytes, and the kept stream equals the `next_batch` stream.
#[test]
fn owned_batches_outlive_later_batches_and_the_reader() {
    fn assert_send_sync<T: Send + Sync>() {}
    fn assert_send<T: Send>() {}
    assert_send_sync::<dquant_client::OwnedBatch>();
    assert_send::<Reader>();
    let c = Corpus::new();
    let (agent, sock) = c.agent_with_socket();
    let mut p = plan(&[("r50k", 0.6), ("wide", 0.4)], 255, 4);
    p.epochs = Some(2);
    let want = drain(&mut Reader::local(&c.localized(&p), Cursor::START).unwrap()).0;
    let readers: Vec<(Reader, bool)> = vec![
        (
            Reader::local(&c.localized(&p), Cursor::START).unwrap(),
            false,
        ),
        (open(&agent.uri(), &p, Offload::Yes).unwrap(), false),
        (
            open(&format!("{sock}?slots=4"), &p, Offload::Yes).unwrap(),
            true,
        ),
    ];
    for (mut r, ring) in readers {
        let mut kept = Vec::new();
        let mut n = 0usize;
        while let Some(b) = r.next_owned().unwrap() {
            assert_eq!(b.in_ring(), ring);
            assert_eq!(b.index, n as u64);
            assert_eq!(b.cursor, r.cursor());
            // Keep every third batch to the end; drop the others a few batches later, out of
            // order.
            kept.push(b);
            if kept.len() > 3 && !n.is_multiple_of(3) {
                let i = kept.len() - 3;
                if !kept[i].index.is_multiple_of(3) {
                    kept.remove(i);
                }
            }
            n += 1;
        }
        drop(r);
        let bytes = std::thread::spawn(move || {
            kept.retain(|b| b.index.is_multiple_of(3));
            kept.iter().map(|b| b.bytes().to_vec()).collect::<Vec<_>>()
        })
        .join()
        .unwrap();
        let per_batch = 4 * 256 * 4;
        let expect: Vec<&[u8]> = want.chunks(per_batch).step_by(3).collect();
        assert_eq!(bytes.len(), expect.len());
        for (i, (got, want)) in bytes.iter().zip(expect).enumerate() {
            assert!(got.as_slice() == want, "batch {} (ring: {ring})", i * 3);
        }
    }
    wait_idle(&agent);
}
