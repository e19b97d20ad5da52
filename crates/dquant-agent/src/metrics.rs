//! The agent's Prometheus metrics, served at `metrics_listen` (off by default).
//!
//! Each agent keeps its own recorder rather than the process-global one: a process may run
//! several agents (the tests do), and each must count only its own sessions. Handles are
//! registered on that recorder directly (a session registers its tenant's counters once, then
//! each batch is an atomic add), and `metrics-exporter-prometheus` serves it over HTTP. With
//! no address configured every handle is a no-op.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `dquant_sessions` | gauge | `state`: `pending`, `streaming` |
//! | `dquant_open_queue_depth` | gauge | |
//! | `dquant_batches_total`, `dquant_tokens_total`, `dquant_bytes_total` | counter | `tenant` |
//! | `dquant_session_ends_total` | counter | `how`: `finished`, `failed`, `stopped`, `drained` |
//! | `dquant_refusals_total` | counter | `reason` |
//! | `dquant_corrupt_reads_total` | counter | `dataset`: range reads refused because this agent's copy failed its checksum |
//! | `dquant_source_samples_total` | counter | `tenant`, `dataset` (the plan's source URI) |
//! | `dquant_source_samples_per_epoch` | gauge | `dataset`: `samples_total / samples_per_epoch` is epochs |
//! | `dquant_batch_reads_total` | counter | `tenant`, `how`: `alone` (on the session's thread), `spread` (over the worker pool, reads slow enough to pay for it); with a pool only |
//! | `dquant_tenant_link_bytes_total` | counter | `tenant`: frame bytes paced through `[bandwidth]` |
//! | `dquant_tenant_throttled_microseconds_total` | counter | `tenant`: time its senders waited for their share |
//! | `dquant_tenant_rate_bytes_per_second` | gauge | `tenant`: achieved over the last second |
//! | `dquant_block_cache_hits_total`, `_misses_total`, `_corrupt_total`, `_evictions_total` | counter | (with `[block_cache]`) blocks served from disk, fetched from the root, found damaged, evicted |
//! | `dquant_block_cache_bytes`, `dquant_block_cache_entries` | gauge | (with `[block_cache]`) what it holds |

use std::net::SocketAddr;

use dquant_engine::BatchReads;
use metrics::{Counter, Gauge, Key, Label, Level, Metadata, Recorder};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// The metrics endpoint could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("metrics on {addr}: {source}")]
pub(crate) struct MetricsError {
    addr: SocketAddr,
    #[source]
    source: metrics_exporter_prometheus::BuildError,
}

/// One agent's metrics.
pub(crate) struct Metrics {
    recorder: Option<PrometheusRecorder>,
    pending: Gauge,
    streaming: Gauge,
    open_queue: Gauge,
    /// hits, misses, corrupt, evictions (counters set to the cache's totals), bytes, entries.
    block_cache: [Counter; 4],
    block_cache_held: [Gauge; 2],
}

impl Metrics {
    /// No metrics: every handle is a no-op.
    pub fn off() -> Self {
        Metrics {
            recorder: None,
            pending: Gauge::noop(),
            streaming: Gauge::noop(),
            open_queue: Gauge::noop(),
            block_cache: [(); 4].map(|()| Counter::noop()),
            block_cache_held: [(); 2].map(|()| Gauge::noop()),
        }
    }

    /// Metrics served over HTTP at `addr`. Must run inside the tokio runtime that will
    /// drive the returned exporter future (the listener is bound here).
    pub fn serve(
        addr: SocketAddr,
    ) -> Result<(Self, metrics_exporter_prometheus::ExporterFuture), MetricsError> {
        let (recorder, exporter) = PrometheusBuilder::new()
            .with_http_listener(addr)
            .build()
            .map_err(|source| MetricsError { addr, source })?;
        let mut m = Metrics {
            recorder: Some(recorder),
            ..Metrics::off()
        };
        m.pending = m.gauge("dquant_sessions", vec![Label::new("state", "pending")]);
        m.streaming = m.gauge("dquant_sessions", vec![Label::new("state", "streaming")]);
        m.open_queue = m.gauge("dquant_open_queue_depth", vec![]);
        m.block_cache = [
            "dquant_block_cache_hits_total",
            "dquant_block_cache_misses_total",
            "dquant_block_cache_corrupt_total",
            "dquant_block_cache_evictions_total",
        ]
        .map(|name| m.counter(name, vec![]));
        m.block_cache_held = ["dquant_block_cache_bytes", "dquant_block_cache_entries"]
            .map(|name| m.gauge(name, vec![]));
        Ok((m, exporter))
    }

    fn counter(&self, name: &'static str, labels: Vec<Label>) -> Counter {
        match &self.recorder {
            Some(r) => r.register_counter(&Key::from_parts(name, labels), &METADATA),
            None => Counter::noop(),
        }
    }

    fn gauge(&self, name: &'static str, labels: Vec<Label>) -> Gauge {
        match &self.recorder {
            Some(r) => r.register_gauge(&Key::from_parts(name, labels), &METADATA),
            None => Gauge::noop(),
        }
    }

    /// The session table and the open queue, now (the reaper calls this every second).
    pub fn set_gauges(&self, pending: usize, streaming: usize, open_queue: usize) {
        self.pending.set(pending as f64);
        self.streaming.set(streaming as f64);
        self.open_queue.set(open_queue as f64);
    }

    /// The block cache's totals, now (the reaper calls this every second).
    pub fn set_block_cache(&self, s: dquant_storage::BlockCacheStats) {
        for (c, v) in self
            .block_cache
            .iter()
            .zip([s.hits, s.misses, s.corrupt, s.evictions])
        {
            c.absolute(v);
        }
        for (g, v) in self.block_cache_held.iter().zip([s.bytes, s.entries]) {
            g.set(v as f64);
        }
    }

    /// The counters one session adds its batches to.
    pub fn meter(&self, tenant: &str) -> Meter {
        let t = || vec![Label::new("tenant", tenant.to_string())];
        Meter {
            batches: self.counter("dquant_batches_total", t()),
            tokens: self.counter("dquant_tokens_total", t()),
            bytes: self.counter("dquant_bytes_total", t()),
            ..Meter::off()
        }
    }

    /// The counters of a plan's pipeline run for `tenant` (a session's, or a shared
    /// stream's producer).
    pub fn pipeline_meter(&self, tenant: &str, pipeline: &dquant_engine::Pipeline) -> Meter {
        let s = pipeline.schedule();
        let uris = pipeline.uris().iter().cloned();
        let sources: Vec<(String, u64)> = uris
            .zip((0..s.sources()).map(|d| s.samples_per_epoch(d)))
            .collect();
        let mut m = self.meter(tenant);
        m.reads = ["alone", "spread"].map(|how| {
            let labels = vec![
                Label::new("tenant", tenant.to_string()),
                Label::new("how", how),
            ];
            self.counter("dquant_batch_reads_total", labels)
        });
        for (uri, per_epoch) in &sources {
            let dataset = || Label::new("dataset", uri.clone());
            self.gauge("dquant_source_samples_per_epoch", vec![dataset()])
                .set(*per_epoch as f64);
            let labels = vec![Label::new("tenant", tenant.to_string()), dataset()];
            m.sources
                .push(self.counter("dquant_source_samples_total", labels));
        }
        m.drawn = vec![0; sources.len()];
        m
    }

    /// A tenant's bandwidth series (`[bandwidth]`): bytes paced, time throttled, achieved
    /// rate.
    pub fn tenant_meters(&self, tenant: &str) -> (Counter, Counter, Gauge) {
        let t = || vec![Label::new("tenant", tenant.to_string())];
        (
            self.counter("dquant_tenant_link_bytes_total", t()),
            self.counter("dquant_tenant_throttled_microseconds_total", t()),
            self.gauge("dquant_tenant_rate_bytes_per_second", t()),
        )
    }

    /// A session ended: `how` is `finished`, `failed`, `stopped` or `drained`.
    pub fn session_end(&self, how: &'static str) {
        self.counter("dquant_session_ends_total", vec![Label::new("how", how)])
            .increment(1);
    }

    /// Counts the reads moved off `replica` (`HOST:PORT`), which failed, for `dataset`.
    pub fn failovers(&self, replica: &str, dataset: &str) -> Counter {
        let labels = vec![
            Label::new("replica", replica.to_string()),
            Label::new("dataset", dataset.to_string()),
        ];
        self.counter("dquant_replica_failovers_total", labels)
    }

    /// Counts the reads of `dataset` refused because its stored bytes failed their checksum
    /// (this agent's copy is damaged: a block's crc, or a chunk's sum in a Megatron sidecar).
    pub fn corrupt_reads(&self, dataset: &str) -> Counter {
        let labels = vec![Label::new("dataset", dataset.to_string())];
        self.counter("dquant_corrupt_reads_total", labels)
    }

    /// A request or connection was refused for `reason`.
    pub fn refusal(&self, reason: &'static str) {
        self.counter("dquant_refusals_total", vec![Label::new("reason", reason)])
            .increment(1);
    }
}

/// One session's counters (its tenant's series).
pub(crate) struct Meter {
    batches: Counter,
    tokens: Counter,
    bytes: Counter,
    /// Per source of a plan session: samples taken.
    sources: Vec<Counter>,
    /// What `sources` counted so far.
    drawn: Vec<u64>,
    /// A plan session's batches read alone and spread over the worker pool.
    reads: [Counter; 2],
    /// What `reads` counted so far.
    reads_seen: BatchReads,
    /// The tenant's running total for the `Watch` feed's rates.
    tally: Option<std::sync::Arc<crate::events::Tally>>,
}

impl Meter {
    /// Counts nothing (sessions of an agent without metrics, and tests).
    pub fn off() -> Self {
        Meter {
            batches: Counter::noop(),
            tokens: Counter::noop(),
            bytes: Counter::noop(),
            sources: Vec::new(),
            drawn: Vec::new(),
            reads: [(); 2].map(|()| Counter::noop()),
            reads_seen: BatchReads::default(),
            tally: None,
        }
    }

    /// Also adds the bytes to `tally` (the tenant's, for the `Watch` feed).
    pub fn with_tally(mut self, tally: std::sync::Arc<crate::events::Tally>) -> Self {
        self.tally = Some(tally);
        self
    }

    /// `batches` records of `tokens` tokens in `bytes` wire bytes went out.
    pub fn add(&self, batches: u64, tokens: u64, bytes: u64) {
        self.batches.increment(batches);
        self.tokens.increment(tokens);
        self.bytes.increment(bytes);
        if let Some(t) = &self.tally {
            t.bytes
                .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The stream has now taken `drawn[d]` samples from source `d`: counts what is new.
    pub fn drawn(&mut self, drawn: &[u64]) {
        for ((c, seen), &now) in self.sources.iter().zip(&mut self.drawn).zip(drawn) {
            c.increment(now.saturating_sub(*seen));
            *seen = now;
        }
    }

    /// The stream's pipeline has now read `now.alone` batches on its own thread and
    /// `now.spread` over the pool: counts what is new.
    pub fn batch_reads(&mut self, now: BatchReads) {
        let [alone, spread] = &self.reads;
        alone.increment(now.alone.saturating_sub(self.reads_seen.alone));
        spread.increment(now.spread.saturating_sub(self.reads_seen.spread));
        self.reads_seen = now;
    }
}
