//! The agent under load: a real `dquant serve` process on loopback, configured by a TOML file
//! this writes, and a sampler of what it costs (`/proc/PID/status`, `/proc/PID/task/*/comm`,
//! its own Prometheus metrics).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::stats::{prom_series, status_field};

/// What the agent is started with (written to its config file).
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub root: PathBuf,
    pub prefetch_frames: usize,
    pub max_sessions: usize,
}

/// A `dquant serve` child process. Stopped with SIGTERM on [`ServeProc::stop`] (or killed on
/// drop).
pub struct ServeProc {
    child: Option<Child>,
    pub uri: String,
    pub control: SocketAddr,
    pub data: SocketAddr,
    pub metrics: SocketAddr,
    pub log: PathBuf,
    pub config_text: String,
    _dir: tempfile::TempDir,
}

/// A free loopback port, for the metrics endpoint (its listener is bound by the agent, which
/// prints no address for it). Another process could take it in between; the agent then
/// fails to start and says so.
fn free_port() -> Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?)
}

impl ServeProc {
    /// The bounds are on the agent's own memory. Pages of maps it keeps for narrowing are the
    /// page cache's, yet VmRSS and VmHWM count them, so this agent reads by pread
    /// (`map_budget = 0`): what it allocates per session is the same either way, or more.
    pub fn spawn(dquant: &Path, c: &ServeConfig) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let metrics = free_port()?;
        let config_text = format!(
            "listen = \"127.0.0.1:0\"\n\
             data_listen = \"127.0.0.1:0\"\n\
             metrics_listen = \"{metrics}\"\n\
             prefetch_frames = {}\n\
             max_sessions = {}\n\
             map_budget = 0\n\
             [roots]\n\
             bench = {:?}\n",
            c.prefetch_frames,
            c.max_sessions,
            c.root.display().to_string(),
        );
        let config = dir.path().join("agent.toml");
        std::fs::write(&config, &config_text)?;
        let log = dir.path().join("agent.log");
        let log_file = std::fs::File::create(&log)?;
        let child = Command::new(dquant)
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .env("DQUANT_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("cannot start {} serve", dquant.display()))?;
        let mut me = ServeProc {
            child: Some(child),
            uri: String::new(),
            control: "0.0.0.0:0".parse()?,
            data: "0.0.0.0:0".parse()?,
            metrics,
            log,
            config_text,
            _dir: dir,
        };
        // The one line `dquant serve` prints when listening:
        // "dquant agent listening: uri=dquant://A control=A data=A roots=...".
        let t = Instant::now();
        loop {
            let text = std::fs::read_to_string(&me.log).unwrap_or_default();
            if let Some(line) = text
                .lines()
                .find(|l| l.starts_with("dquant agent listening:"))
            {
                let field = |k: &str| {
                    line.split_whitespace()
                        .find_map(|w| w.strip_prefix(k))
                        .map(str::to_string)
                        .with_context(|| format!("no {k} in {line:?}"))
                };
                me.uri = field("uri=")?;
                me.control = field("control=")?.parse()?;
                me.data = field("data=")?.parse()?;
                return Ok(me);
            }
            if let Some(st) = me.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                bail!("dquant serve exited ({st}) before listening:\n{text}");
            }
            if t.elapsed() > Duration::from_secs(20) {
                bail!("dquant serve did not say it was listening within 20 s:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    /// Whether the agent process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// SIGTERM, then waits up to `grace`: the exit status and how long it took, or `None`
    /// when it had to be killed.
    pub fn stop(&mut self, grace: Duration) -> Option<(i32, Duration)> {
        let mut child = self.child.take()?;
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let t = Instant::now();
        while t.elapsed() < grace {
            if let Ok(Some(st)) = child.try_wait() {
                return Some((st.code().unwrap_or(-1), t.elapsed()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// The agent's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ServeProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The metrics page of the agent (`GET /metrics`), or an empty string when it does not answer
/// within `timeout`.
pub fn scrape(addr: SocketAddr, timeout: Duration) -> String {
    let get = || -> std::io::Result<String> {
        let mut s = TcpStream::connect_timeout(&addr, timeout)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf)?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        Ok(text
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_string())
            .unwrap_or_default())
    };
    get().unwrap_or_default()
}

/// (pending, streaming) sessions from a metrics page.
pub fn sessions_of(page: &str) -> Option<(u64, u64)> {
    let s = prom_series(page, "dquant_sessions");
    let pending = *s.get("state=\"pending\"")?;
    let streaming = *s.get("state=\"streaming\"")?;
    Some((pending as u64, streaming as u64))
}

/// The agent's threads by name (`/proc/PID/task/*/comm`).
pub fn threads_by_name(pid: u32) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for e in rd.flatten() {
            if let Ok(c) = std::fs::read_to_string(e.path().join("comm")) {
                *out.entry(c.trim().to_string()).or_insert(0) += 1;
            }
        }
    }
    out
}

/// One sample of the agent.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Sample {
    pub t: f64,
    pub rss_kib: u64,
    pub hwm_kib: u64,
    pub threads: u64,
    /// From the agent's metrics; `None` when the scrape failed.
    pub pending: Option<u64>,
    pub streaming: Option<u64>,
}

/// Samples the agent every `every` until stopped; keeps the thread census of the sample with
/// the most threads.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
    samples: Arc<Mutex<Vec<Sample>>>,
    census: Arc<Mutex<(u64, BTreeMap<String, u64>)>>,
}

impl Sampler {
    pub fn start(pid: u32, metrics: SocketAddr, t0: Instant, every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
        let census: Arc<Mutex<(u64, BTreeMap<String, u64>)>> = Arc::default();
        let handle = {
            let (stop, samples, census) = (stop.clone(), samples.clone(), census.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(s) = sample(pid, metrics, t0) {
                        let mut c = census.lock().unwrap_or_else(PoisonError::into_inner);
                        if s.threads > c.0 {
                            *c = (s.threads, threads_by_name(pid));
                        }
                        drop(c);
                        samples
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(s);
                    }
                    std::thread::sleep(every);
                }
            })
        };
        Sampler {
            stop,
            handle: Some(handle),
            samples,
            census,
        }
    }

    /// Stops sampling: every sample, and the thread census at the most threads.
    pub fn finish(mut self) -> (Vec<Sample>, BTreeMap<String, u64>) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        let samples =
            std::mem::take(&mut *self.samples.lock().unwrap_or_else(PoisonError::into_inner));
        let census =
            std::mem::take(&mut self.census.lock().unwrap_or_else(PoisonError::into_inner).1);
        (samples, census)
    }
}

/// One sample: `/proc/PID/status` and the metrics page.
pub fn sample(pid: u32, metrics: SocketAddr, t0: Instant) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let page = scrape(metrics, Duration::from_secs(1));
    let sessions = sessions_of(&page);
    Some(Sample {
        t: t0.elapsed().as_secs_f64(),
        rss_kib: status_field(&status, "VmRSS")?,
        hwm_kib: status_field(&status, "VmHWM")?,
        threads: status_field(&status, "Threads")?,
        pending: sessions.map(|s| s.0),
        streaming: sessions.map(|s| s.1),
    })
}
