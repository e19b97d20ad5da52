//! What an operator watches: the Prometheus endpoint counts exactly what was streamed, per
//! tenant, and every refusal by reason; the standard gRPC health service says SERVING, and
//! NOT_SERVING once a drain begins.

use std::time::{Duration, Instant};

use dquant_agent::{AgentHandle, TenantConfig};
use dquant_client::{open, AgentUri, Control, Credentials, Offload, Reader};
use dquant_plan::Cursor;
use dquant_testkit::agent::{plan, Corpus};
use dquant_testkit::metrics::{free_addr, scrape, value};
use dquant_testkit::stream::drain;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const TOKEN: &str = "observer-0123456789";

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
    // A pool that takes a share of every batch of two samples or more.
    cfg.worker_threads = 2;
    cfg.worker_min_share_us = 0;
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
    let p = plan(&[("r50k", 1.0)], 127, 4);
    let creds = Credentials {
        token: Some(TOKEN.into()),
        tls: None,
    };
    let uri = AgentUri::parse(&agent.uri()).unwrap();
    let mut r = Reader::remote_with(&uri, &p, Cursor::START, &creds).unwrap();
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
    // How the batches were read: all but a last one-sample batch spread over the pool.
    let reads = |how: &str| {
        value(
            &page,
            &format!("dquant_batch_reads_total{{tenant=\"team-a\",how=\"{how}\"}}"),
        )
    };
    let alone = sizes.iter().filter(|&&n| n < 2).count() as f64;
    assert_eq!(reads("alone"), alone, "{page}");
    assert_eq!(reads("spread"), sizes.len() as f64 - alone, "{page}");
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
    let mut p = plan(&[("r50k", 1.0)], 127, 4);
    p.epochs = Some(200);
    // Uncompressed, so that the batches outgrow the socket's buffers (below).
    p.wire_codec = "auto".into();
    let mut r = open(&agent.uri(), &p, Offload::Yes).unwrap();
    r.next_batch().unwrap().unwrap();
    // A consumer that never reads keeps the drain open for its whole grace: its session's
    // end cannot be written behind the batches that fill its socket.
    let (addr, uri) = (agent.control_addr(), agent.uri());
    let ctl = Control::connect(&addr.to_string()).unwrap();
    let reply = ctl
        .open(dquant_proto::v1::OpenRequest {
            plan_json: p.to_json(),
            ..Default::default()
        })
        .unwrap();
    let (_w, _stuck) = ctl.connect_data(&reply).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let drained = std::thread::spawn(move || agent.drain(Duration::from_secs(3)));
    // NOT_SERVING while the sessions drain: the control plane answers until they end.
    std::thread::sleep(Duration::from_millis(300));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let status = rt.block_on(async {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| e.to_string())?
            .connect()
            .await
            .map_err(|e| format!("connect: {e:?}"))?;
        let mut c = HealthClient::new(ch);
        c.check(HealthCheckRequest {
            service: "dquant.v1.Agent".into(),
        })
        .await
        .map_err(|e| format!("check: {e}"))
        .map(|r| r.into_inner().status)
    });
    assert_eq!(status, Ok(ServingStatus::NotServing as i32));
    // A new session is refused while the agent drains, and says why.
    let e = open(&uri, &p, Offload::Yes)
        .err()
        .expect("an open while draining");
    assert!(e.to_string().contains("agent is draining"), "{e}");
    // The reader is told where to resume; the drain finishes within its grace.
    let e = loop {
        match r.next_batch() {
            Ok(Some(_)) => {}
            Ok(None) => panic!("the stream ended"),
            Err(e) => break e,
        }
    };
    assert!(e.resume_cursor().is_some(), "{e}");
    // The consumer that never read is the one session the drain had to cancel.
    assert_eq!(drained.join().unwrap().forced, 1);
}
