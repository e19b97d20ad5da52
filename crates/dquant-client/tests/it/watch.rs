//! The `Watch` RPC: a watcher sees sessions opened and closed in order, with what they
//! moved, refusals, and rate snapshots; a tenant sees only its own sessions.

use std::io::Write;
use std::sync::mpsc;
use std::time::Duration;

use dquant_agent::TenantConfig;
use dquant_client::{AgentUri, Control, Credentials, Offload, Reader};
use dquant_plan::{Cursor, OutputDType, Plan};
use dquant_proto::v1::event::Kind;
use dquant_proto::v1::Event;
use dquant_testkit::stream::drain;
use dquant_testkit::{agent, fixture};

fn root() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for ext in ["bin", "idx"] {
        let f = format!("r50k_int32.{ext}");
        std::fs::copy(fixture(&f), dir.path().join(&f)).unwrap();
    }
    dir
}

fn plan() -> Plan {
    let mut p = agent::plan_in("c", &[("r50k_int32", 1.0)], 255, 8, 3);
    p.output = OutputDType::U16;
    p
}

/// Collects `watch`'s events on a thread until `done` says the list is complete (or 20 s).
fn collect(
    mut watch: dquant_client::Watch,
    done: impl Fn(&[Event]) -> bool + Send + 'static,
) -> mpsc::Receiver<Vec<Event>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        for e in watch.by_ref() {
            seen.push(e.unwrap());
            if done(&seen) {
                break;
            }
        }
        let _ = tx.send(seen);
    });
    rx
}

/// An agent serving `dir` as `c` to tenants `a` and `b` (tokens `tenant-a-0123456789`,
/// `tenant-b-…`) and the operator `ops` (`tenant-ops-0123456789`), its URI, and tenant a's
/// watch of it.
fn two_tenants(
    dir: &tempfile::TempDir,
) -> (dquant_agent::AgentHandle, AgentUri, dquant_client::Watch) {
    let mut cfg = agent::config(&[("c", dir.path().to_path_buf())]);
    for name in ["a", "b", "ops"] {
        cfg.tenants.push(TenantConfig {
            name: name.into(),
            token: format!("tenant-{name}-0123456789"),
            roots: vec!["*".into()],
            operator: name == "ops",
            ..Default::default()
        });
    }
    let agent = dquant_agent::start(cfg).unwrap();
    let uri = AgentUri::parse(&agent.uri()).unwrap();
    let watch_a = watch_as(&agent, "tenant-a-0123456789");
    (agent, uri, watch_a)
}

fn watch_as(agent: &dquant_agent::AgentHandle, token: &str) -> dquant_client::Watch {
    Control::connect(&agent.control_addr().to_string())
        .unwrap()
        .with_token(token)
        .unwrap()
        .watch(100)
        .unwrap()
}

fn creds(token: &str) -> Credentials {
    Credentials {
        token: Some(token.into()),
        tls: None,
    }
}

fn closed(evs: &[Event]) -> bool {
    evs.iter().any(|e| matches!(e.kind, Some(Kind::Closed(_))))
}

#[test]
fn a_watcher_sees_sessions_refusals_and_rates_in_order() {
    let dir = root();
    let a = agent::start(&[("c", dir.path().to_path_buf())]);
    let c = Control::connect(&a.control_addr().to_string()).unwrap();
    let watch = c.watch(100).unwrap();
    // A refusal: garbage instead of a hello on the data port.
    let mut s = std::net::TcpStream::connect(a.data_addr()).unwrap();
    s.write_all(b"not a hello frame at all, just bytes........")
        .unwrap();
    drop(s);
    let got = collect(watch, |evs| {
        closed(evs)
            && evs
                .iter()
                .rev()
                .take_while(|e| !matches!(e.kind, Some(Kind::Closed(_))))
                .any(|e| matches!(&e.kind, Some(Kind::Rates(r)) if r.tenants.iter().all(|t| t.sessions == 0)))
    });
    let mut r = dquant_client::open(&a.uri(), &plan(), Offload::Yes).unwrap();
    let (bytes, _) = drain(&mut r);
    let batches = r.rank_batches();
    drop(r);
    let evs = got
        .recv_timeout(Duration::from_secs(20))
        .expect("the events arrive");

    let refusal = evs
        .iter()
        .find_map(|e| match &e.kind {
            Some(Kind::Error(x)) => Some(x.clone()),
            _ => None,
        })
        .expect("the refusal is an event");
    assert_eq!(
        (refusal.plane.as_str(), refusal.reason.as_str()),
        ("data", "bad hello")
    );
    let opened = evs
        .iter()
        .position(|e| matches!(&e.kind, Some(Kind::Opened(o)) if o.kind == "plan" && o.detail == "c/r50k_int32" && o.tenant.is_empty()))
        .expect("an Opened event");
    let closed_at = evs
        .iter()
        .position(|e| matches!(e.kind, Some(Kind::Closed(_))))
        .unwrap();
    assert!(opened < closed_at);
    let (Some(Kind::Opened(o)), Some(Kind::Closed(x))) = (&evs[opened].kind, &evs[closed_at].kind)
    else {
        unreachable!()
    };
    assert_eq!(x.session, o.session);
    assert_eq!(
        (x.how.as_str(), x.transport.as_str(), x.kind.as_str()),
        ("finished", "tcp", "plan")
    );
    assert_eq!(x.records, batches);
    assert_eq!(x.tokens * 2, bytes.len() as u64);
    // Published events are numbered one by one, in order.
    let seqs: Vec<u64> = evs
        .iter()
        .filter(|e| !matches!(e.kind, Some(Kind::Rates(_))))
        .map(|e| e.seq)
        .collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    // The last snapshot counts what the session moved, and no session streaming.
    let Some(Kind::Rates(last)) = &evs.last().unwrap().kind else {
        unreachable!("the collection ends on a snapshot")
    };
    let t = last.tenants.iter().find(|t| t.tenant.is_empty()).unwrap();
    assert_eq!(t.bytes_total, x.wire_bytes);
    assert_eq!(t.sessions, 0);
}

#[test]
fn a_tenant_watches_only_its_own_sessions_and_an_operator_everyones() {
    let dir = root();
    let (agent, uri, watch_a) = two_tenants(&dir);
    let got = collect(watch_a, closed);
    let all = collect(watch_as(&agent, "tenant-ops-0123456789"), |evs| {
        closed_count(evs, 2)
    });
    for t in ["tenant-b-0123456789", "tenant-a-0123456789"] {
        let mut r = Reader::remote_with(&uri, &plan(), Cursor::START, &creds(t)).unwrap();
        drain(&mut r);
    }
    let evs = got
        .recv_timeout(Duration::from_secs(20))
        .expect("the events arrive");
    for e in &evs {
        match &e.kind {
            Some(Kind::Opened(o)) => assert_eq!(o.tenant, "a"),
            Some(Kind::Closed(c)) => assert_eq!(c.tenant, "a"),
            Some(Kind::Rates(r)) => assert!(r.tenants.iter().all(|t| t.tenant == "a"), "{r:?}"),
            other => panic!("a tenant's watch showed {other:?}"),
        }
    }
    let evs = all
        .recv_timeout(Duration::from_secs(20))
        .expect("the events arrive");
    // Both, in either order: b's session publishes its end after its last record, and on
    // a loaded machine a's whole session can fit in between.
    let mut tenants: Vec<&str> = evs
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::Closed(c)) => Some(c.tenant.as_str()),
            _ => None,
        })
        .collect();
    tenants.sort_unstable();
    assert_eq!(
        tenants,
        vec!["a", "b"],
        "the operator sees both tenants' sessions"
    );
}

fn closed_count(evs: &[Event], n: usize) -> bool {
    evs.iter()
        .filter(|e| matches!(e.kind, Some(Kind::Closed(_))))
        .count()
        >= n
}

#[test]
fn subscribers_join_and_leave_a_tenants_shared_stream_in_order() {
    let dir = root();
    let (_agent, uri, watch_a) = two_tenants(&dir);
    let got = collect(watch_a, |evs| closed_count(evs, 2));
    let a = creds("tenant-a-0123456789");
    let share = dquant_client::Share {
        name: "job1/dp0".into(),
        group: 2,
    };
    let first = Reader::remote_shared(&uri, &plan(), Cursor::START, &share, &a).unwrap();
    // Another tenant's stream is no stream at all.
    let b = Reader::subscribe_with(&uri, "job1/dp0", None, &creds("tenant-b-0123456789"));
    assert!(b
        .err()
        .unwrap()
        .to_string()
        .contains("no shared stream \"job1/dp0\""));
    let second = Reader::subscribe_with(&uri, "job1/dp0", None, &a).unwrap();
    let read = |mut r: Reader| (drain(&mut r).0, r.cursor());
    let (one, two) = std::thread::scope(|s| {
        let one = s.spawn(move || read(first));
        (one.join().unwrap(), read(second))
    });
    assert_eq!(one, two);
    let end = one.1;
    let evs = got
        .recv_timeout(Duration::from_secs(20))
        .expect("the events arrive");
    let shown: Vec<(bool, (u64, u64), u32)> = evs
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::Subscriber(s)) => {
                assert_eq!((s.share.as_str(), s.tenant.as_str()), ("job1/dp0", "a"));
                Some((s.joined, (s.epoch, s.consumed_samples), s.subscribers))
            }
            _ => None,
        })
        .collect();
    // Both join at the start (the second before the first batch: the group waits for
    // it), and both leave at the end.
    let end = (end.epoch, end.consumed_samples);
    assert_eq!(
        shown,
        vec![
            (true, (0, 0), 1),
            (true, (0, 0), 2),
            (false, end, 1),
            (false, end, 0)
        ],
        "{evs:?}"
    );
    let kinds: Vec<(&str, &str)> = evs
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::Opened(o)) => Some(("opened", o.kind.as_str())),
            Some(Kind::Closed(c)) => Some((c.how.as_str(), c.kind.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("opened", "subscriber"),
            ("opened", "subscriber"),
            ("finished", "subscriber"),
            ("finished", "subscriber")
        ]
    );
}

#[test]
fn sessions_never_claimed_are_closed_as_stopped_or_expired() {
    let dir = root();
    let mut cfg = agent::config(&[("c", dir.path().to_path_buf())]);
    cfg.ticket_ttl_secs = 1;
    let agent = dquant_agent::start(cfg).unwrap();
    let c = Control::connect(&agent.control_addr().to_string()).unwrap();
    // Until two sessions closed, then a snapshot: nobody counted as streaming.
    let got = collect(c.watch(100).unwrap(), |evs| {
        closed_count(evs, 2) && matches!(&evs[evs.len() - 1].kind, Some(Kind::Rates(_)))
    });
    let open = || {
        c.open(dquant_proto::v1::OpenRequest {
            plan_json: plan().to_json(),
            ..Default::default()
        })
        .unwrap()
    };
    let (closed_one, expired) = (open(), open());
    assert!(c.close(closed_one.session, &closed_one.ticket).unwrap());
    let evs = got
        .recv_timeout(Duration::from_secs(20))
        .expect("the events arrive");
    let ends: Vec<(u64, String, String, String)> = evs
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::Closed(x)) => {
                Some((x.session, x.kind.clone(), x.how.clone(), x.message.clone()))
            }
            _ => None,
        })
        .collect();
    let s = String::from;
    assert_eq!(
        ends,
        vec![
            (
                closed_one.session,
                s("plan"),
                s("stopped"),
                s("closed by the client")
            ),
            (
                expired.session,
                s("plan"),
                s("expired"),
                s("its data connection did not come within the ticket's lifetime (1 s)")
            ),
        ]
    );
    let Some(Kind::Rates(r)) = &evs[evs.len() - 1].kind else {
        unreachable!("the collection ends on a snapshot")
    };
    assert!(r.tenants.iter().all(|t| t.sessions == 0), "{r:?}");
}
