//! Tenants' shares of an agent's link (`[bandwidth]`): every data-plane frame waits for its
//! tenant's turn, so a tenant alone gets the declared link and no more, and under contention
//! the guarantees split it. Lower bounds and orderings only: a slow machine makes streams
//! slower, never faster than the pacing lets them be. The rates themselves are measured by
//! the scheduler's simulated-time tests (`crates/dquant-agent/src/bandwidth.rs`) and the lab.

use std::time::{Duration, Instant};

use dquant_agent::{AgentConfig, BandwidthConfig, TenantConfig, TrafficClass};
use dquant_client::{AgentUri, Credentials, Reader};
use dquant_plan::{Cursor, OutputDType, Plan};
use dquant_testkit::stream::drain;
use dquant_testkit::{agent, fixture};

const TOKEN_A: &str = "tenant-a-0123456789";
const TOKEN_B: &str = "tenant-b-0123456789";

/// r50k_int32 as uint16, `epochs` times: 322 KB an epoch, on the wire as it is (the link's
/// bytes are what the tests measure).
fn plan(epochs: u32) -> Plan {
    let mut p = agent::plan_in("c", &[("r50k_int32", 1.0)], 1023, 8, 7);
    p.output = OutputDType::U16;
    p.epochs = Some(epochs);
    p.wire_codec = "auto".into();
    p
}

fn tenant(name: &str, token: &str, share: f64) -> TenantConfig {
    TenantConfig {
        name: name.into(),
        token: token.into(),
        roots: vec!["*".into()],
        guarantee_share: Some(share),
        ..Default::default()
    }
}

fn start(link: u64, tenants: Vec<TenantConfig>) -> (tempfile::TempDir, dquant_agent::AgentHandle) {
    start_with(link, tenants, Vec::new())
}

fn start_with(
    link: u64,
    tenants: Vec<TenantConfig>,
    classes: Vec<TrafficClass>,
) -> (tempfile::TempDir, dquant_agent::AgentHandle) {
    let dir = tempfile::tempdir().unwrap();
    for ext in ["bin", "idx"] {
        std::fs::copy(
            fixture(&format!("r50k_int32.{ext}")),
            dir.path().join(format!("r50k_int32.{ext}")),
        )
        .unwrap();
    }
    let mut cfg: AgentConfig = agent::config(&[("c", dir.path().to_path_buf())]);
    cfg.tenants = tenants;
    cfg.bandwidth = Some(BandwidthConfig {
        link_bytes_per_s: link,
        classes,
    });
    cfg.validate().unwrap();
    (dir, dquant_agent::start(cfg).unwrap())
}

/// Reads `plan` whole as the tenant of `token`: its bytes and how long it took.
fn read_as(a: &dquant_agent::AgentHandle, token: &str, plan: &Plan) -> (Vec<u8>, Duration) {
    let uri = AgentUri::parse(&a.uri()).unwrap();
    let creds = Credentials {
        token: Some(token.into()),
        tls: None,
    };
    let t0 = Instant::now();
    let mut r = Reader::remote_with(&uri, plan, Cursor::START, &creds).unwrap();
    let (bytes, _) = drain(&mut r);
    (bytes, t0.elapsed())
}

fn local(plan: &Plan, dir: &std::path::Path) -> Vec<u8> {
    let mut p = plan.clone();
    for s in &mut p.sources {
        s.uri = dir
            .join(s.uri.trim_start_matches("c/"))
            .display()
            .to_string();
    }
    drain(&mut dquant_client::open("", &p, dquant_client::Offload::No).unwrap()).0
}

#[test]
fn a_tenant_alone_gets_the_declared_link_and_no_more() {
    let link = 2_000_000;
    let (dir, a) = start(link, vec![tenant("a", TOKEN_A, 0.5)]);
    let p = plan(10);
    let (bytes, took) = read_as(&a, TOKEN_A, &p);
    assert!(bytes == local(&p, dir.path()), "the paced stream differs");
    // 3.2 MB at 2 MB/s: at least 1.6 s, less a burst and one frame of head start.
    let least = (bytes.len() as f64 - 1.1e6) / link as f64;
    assert!(
        took.as_secs_f64() >= least,
        "{} bytes in {took:?} (at least {least:.2} s)",
        bytes.len()
    );
}

#[test]
fn guarantees_split_the_link_and_the_larger_one_finishes_first() {
    let (dir, a) = start(
        4_000_000,
        vec![tenant("a", TOKEN_A, 0.75), tenant("b", TOKEN_B, 0.25)],
    );
    let p = plan(20);
    let (want, (ra, rb)) = std::thread::scope(|s| {
        let ha = s.spawn(|| read_as(&a, TOKEN_A, &p));
        let hb = s.spawn(|| read_as(&a, TOKEN_B, &p));
        let want = local(&p, dir.path());
        (want, (ha.join().unwrap(), hb.join().unwrap()))
    });
    assert!(ra.0 == want && rb.0 == want, "a paced stream differs");
    // 6.4 MB each: a at 3 MB/s while both read (about 2.1 s), b at 1 MB/s and then at the
    // whole 4 MB/s (about 3.2 s).
    assert!(
        ra.1.as_secs_f64() < 0.85 * rb.1.as_secs_f64(),
        "a took {:?}, b {:?}",
        ra.1,
        rb.1
    );
    assert!(
        rb.1.as_secs_f64() >= (2.0 * want.len() as f64 - 2.2e6) / 4e6,
        "b {:?}",
        rb.1
    );
}

/// The marks are checked on the packets the agent's own data socket sent, as the kernel put
/// them on `lo` (a packet tap), not on a socket of the test's: tenant a's class, and none for
/// tenant b, which has no class.
#[test]
fn the_agent_marks_the_packets_of_a_tenants_data_socket_with_its_class() {
    let tap = dquant_testkit::tap::LoopbackTap::start();
    let why = tap
        .as_ref()
        .err()
        .map(|e| format!("an AF_PACKET tap on lo needs root: {e}"));
    if !dquant_testkit::require("a packet tap", tap.is_ok(), why.as_deref().unwrap_or("")) {
        return;
    }
    let tap = tap.unwrap();
    let mut gold = tenant("a", TOKEN_A, 0.5);
    gold.class = Some("gold".into());
    let classes = vec![TrafficClass {
        name: "gold".into(),
        dscp: 46,
    }];
    let (dir, a) = start_with(
        1_000_000_000,
        vec![gold, tenant("b", TOKEN_B, 0.25)],
        classes,
    );
    let port = a.data_addr().port();
    let p = plan(1);
    let (bytes, _) = read_as(&a, TOKEN_A, &p);
    assert!(bytes == local(&p, dir.path()), "the marked stream differs");
    std::thread::sleep(Duration::from_millis(200));
    let a_tos: Vec<u8> = tap.sent_from(port).iter().map(|s| s.tos).collect();
    assert!(a_tos.len() >= 2, "no data segments seen from port {port}");
    assert!(
        a_tos.iter().all(|&t| t == 46 << 2),
        "tenant a's segments carry TOS {a_tos:?}"
    );
    let before = a_tos.len();
    let (bytes, _) = read_as(&a, TOKEN_B, &p);
    assert!(
        bytes == local(&p, dir.path()),
        "the unmarked stream differs"
    );
    std::thread::sleep(Duration::from_millis(200));
    let b_tos: Vec<u8> = tap.sent_from(port)[before..]
        .iter()
        .map(|s| s.tos)
        .collect();
    assert!(
        b_tos.len() >= 2,
        "no data segments seen from port {port} for tenant b"
    );
    assert!(
        b_tos.iter().all(|&t| t == 0),
        "tenant b's segments carry TOS {b_tos:?}"
    );
}
