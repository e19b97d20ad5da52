//! What an operator watches: the Prometheus endpoint counts exactly what was streamed, per
//! tenant, and every refusal by reason; the standard gRPC health service says SERVING, and
//! NOT_SERVING once a drain begins.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use dquant_agent::{AgentHandle, TenantConfig};
use dquant_client::{open, Control, Offload};
use dquant_testkit::agent::{plan, Corpus};
use dquant_testkit::stream::drain;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const TOKEN: &str = "observer-0123456789";

/// A free loopback port (bound and released: the agent binds it right after).
fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// The metrics page, over plain HTTP/1.0.
fn scrape(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut page = String::new();
    s.read_to_string(&mut page).unwrap();
    assert!(
        page.starts_with("HTTP/1.0 200") || page.starts_with("HTTP/1.1 200"),
        "{page}"
    );
    page
}

/// The value of the series `name{labels}` (labels exactly as rendered), or 0.
fn value(page: &str, series: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

fn health(agent: &AgentHandle) -> Result<i32, tonic::Status> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let url = format!("http://{}", agent.control_addr());
        let ch = tonic::transport::Endpoint::from_shared(url)
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut c = HealthClient::new(ch);
        let r = c
            .check(HealthCheckRequest {
                service: "dquant.v1.Agent".into(),
            })
            .await?;
        Ok(r.into_inner().status)
    })
}

#[test]
fn metrics_count_what_was_streamed_and_what_was_refused() {
    let c = Corpus::new();
    let metrics = free_addr();
    let mut cfg = c.config();
    cfg.metrics_listen = Some(metrics);
    cfg.tenants.push(TenantConfig {
        name: "team-a".into(),
        token: TOKEN.into(),
        roots: vec!["corpus".into()],
        ..Default::default()
    });
    let agent = dquant_agent::start(cfg).unwrap();
    // Health needs no token.
    assert_eq!(health(&agent).unwrap(), ServingStatus::Serving as i32);

    // Two refusals without a token, one with a wrong one.
    for _ in 0..2 {
        Control::connect(&agent.control_addr().to_string())
            .unwrap()
            .list("")
            .unwrap_err();
    }
    Control::connect(&agent.control_addr().to_string())
        .unwrap()
        .with_token("not-a-tenant-token")
        .unwrap()
        .list("")
        .unwrap_err();

    // One stream for the tenant: its batches, tokens and bytes are counted.
    std::env::set_var("DQUANT_TOKEN", TOKEN);
    let p = plan(&[("r50k", 1.0)], 127, 4);
    let mut r = open(&agent.uri(), &p, Offload::Yes).unwrap();
    let (bytes, sizes) = drain(&mut r);
    drop(r);
    let tokens = bytes.len() as f64 / 4.0;
    let deadline = Instant::now() + Duration::from_secs(10);
    let page = loop {
        let page = scrape(metrics);
        if value(&page, "dquant_session_ends_total{how=\"finished\"}") >= 1.0 {
            break page;
        }
        assert!(Instant::now() < deadline, "{page}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        value(&page, "dquant_batches_total{tenant=\"team-a\"}"),
        sizes.len() as f64,
        "{page}"
    );
    assert_eq!(
        value(&page, "dquant_tokens_total{tenant=\"team-a\"}"),
        tokens
    );
    // Per source: every sample of one epoch of corpus/r50k, and its epoch size beside it.
    let samples = sizes.iter().sum::<usize>() as f64;
    let ds = "dataset=\"corpus/r50k\"";
    assert_eq!(
        value(
            &page,
            &format!("dquant_source_samples_total{{tenant=\"team-a\",{ds}}}")
        ),
        samples,
        "{page}"
    );
    assert_eq!(
        value(&page, &format!("dquant_source_samples_per_epoch{{{ds}}}")),
        samples
    );
    // Wire bytes: each record's header and its payload in the narrowest width (`auto`).
    let wire = value(&page, "dquant_bytes_total{tenant=\"team-a\"}");
    let headers = 48.0 * sizes.len() as f64;
    assert!(wire > headers && wire <= headers + tokens * 4.0, "{wire}");
    assert_eq!(
        value(&page, "dquant_refusals_total{reason=\"no token\"}"),
        2.0
    );
    assert_eq!(
        value(&page, "dquant_refusals_total{reason=\"wrong token\"}"),
        1.0
    );
    // The gauges follow the session table (the reaper updates them every second).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let page = scrape(metrics);
        let idle = value(&page, "dquant_sessions{state=\"streaming\"}") == 0.0
            && page.contains("dquant_sessions{state=\"pending\"} 0")
            && page.contains("dquant_open_queue_depth 0");
        if idle {
            break;
        }
        assert!(Instant::now() < deadline, "{page}");
        std::thread::sleep(Duration::from_millis(100));
    }

    // A drain turns health to NOT_SERVING before the control plane stops.
    let handle = std::thread::spawn(move || agent.drain(Duration::from_secs(5)));
    let report = handle.join().unwrap();
    assert_eq!(report.forced, 0);
}

#[test]
fn health_is_served_without_metrics_and_reports_not_serving_when_draining() {
    let c = Corpus::new();
    let agent = c.agent();
    assert_eq!(health(&agent).unwrap(), ServingStatus::Serving as i32);
    // A long stream keeps the drain open while the health is asked.
    let mut p = plan(&[("r50k", 1.0)], 127, 4);
    p.epochs = Some(200);
    let mut r = open(&agent.uri(), &p, Offload::Yes).unwrap();
    r.next_batch().unwrap().unwrap();
    let addr = agent.control_addr();
    let drained = std::thread::spawn(move || agent.drain(Duration::from_secs(3)));
    // NOT_SERVING while the sessions drain (or the control plane already gone).
    std::thread::sleep(Duration::from_millis(300));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let status = rt.block_on(async {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .ok()?
            .connect()
            .await
            .ok()?;
        let mut c = HealthClient::new(ch);
        c.check(HealthCheckRequest {
            service: "dquant.v1.Agent".into(),
        })
        .await
        .ok()
        .map(|r| r.into_inner().status)
    });
    assert_ne!(status, Some(ServingStatus::Serving as i32));
    // The reader is told where to resume; the drain finishes within its grace.
    let e = loop {
        match r.next_batch() {
            Ok(Some(_)) => {}
            Ok(None) => panic!("the stream ended"),
            Err(e) => break e,
        }
    };
    assert!(e.resume_cursor().is_some(), "{e}");
    assert_eq!(drained.join().unwrap().forced, 0);
}
