//! The clients: well-behaved consumers (threads of this process), and the hostile ones mixed
//! in: a client killed mid-stream (a child process, SIGKILLed), a stalled client (a child
//! process that stops reading and keeps its connection), and a garbage sender (a thread
//! writing random bytes to the data and control ports).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use dquant_client::{open, Offload};
use dquant_plan::Plan;
use dquant_transport::{FrameKind, FrameWriter, Hello};
use rand::rngs::Xoshiro256PlusPlus;
use rand::{Rng, RngExt, SeedableRng};
use xxhash_rust::xxh3::xxh3_64;

use super::stats::message_kind;

/// One well-behaved consumer's counters, read by the main thread while it runs.
#[derive(Default)]
pub struct Slot {
    pub bytes: AtomicU64,
    pub batches: AtomicU64,
    /// Sessions it opened (1 unless an error made it open again).
    pub sessions: AtomicU64,
    /// Longest wait for one batch while the window was open, µs.
    pub max_gap_us: AtomicU64,
    pub errors: AtomicU64,
    /// Batches checked against the in-process stream, and those that differed.
    pub checked: AtomicU64,
    pub mismatched: AtomicU64,
}

/// What the consumers share.
pub struct Consumers {
    pub slots: Vec<Arc<Slot>>,
    /// Set when the measured window opens: from then on the longest waits are recorded.
    pub measuring: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    handles: Vec<std::thread::JoinHandle<()>>,
    /// Every error a consumer saw: (consumer, message).
    pub errors: Arc<Mutex<Vec<(usize, String)>>>,
}

impl Consumers {
    /// Starts one thread per plan, each streaming its plan from the agent at `uri` until
    /// stopped, opening it again after an error (which is counted). `reference[i]` holds the
    /// xxh3 of plan `i`'s first batches, in-process: each session's first batches must match.
    pub fn start(uri: &str, plans: Vec<Plan>, reference: Arc<Vec<Vec<u64>>>) -> Self {
        let measuring = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let errors: Arc<Mutex<Vec<(usize, String)>>> = Arc::default();
        let mut slots = Vec::new();
        let mut handles = Vec::new();
        for (i, plan) in plans.into_iter().enumerate() {
            let slot = Arc::new(Slot::default());
            slots.push(slot.clone());
            let (uri, measuring, stop, errors, reference) = (
                uri.to_string(),
                measuring.clone(),
                stop.clone(),
                errors.clone(),
                reference.clone(),
            );
            let h = std::thread::Builder::new()
                .name(format!("consumer-{i}"))
                .spawn(move || {
                    consume(
                        i,
                        &uri,
                        &plan,
                        &slot,
                        &measuring,
                        &stop,
                        &errors,
                        &reference[i],
                    )
                })
                .expect("cannot start a consumer thread");
            handles.push(h);
        }
        Consumers {
            slots,
            measuring,
            stop,
            handles,
            errors,
        }
    }

    /// Per consumer: bytes so far.
    pub fn bytes(&self) -> Vec<u64> {
        self.slots
            .iter()
            .map(|s| s.bytes.load(Ordering::Relaxed))
            .collect()
    }

    /// Consumers that have received at least one batch.
    pub fn started(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.batches.load(Ordering::Relaxed) > 0)
            .count()
    }

    /// Stops every consumer after its current batch and waits for them (each closes its
    /// session as its reader drops).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn consume(
    i: usize,
    uri: &str,
    plan: &Plan,
    slot: &Slot,
    measuring: &AtomicBool,
    stop: &AtomicBool,
    errors: &Mutex<Vec<(usize, String)>>,
    reference: &[u64],
) {
    let fail = |m: String| {
        slot.errors.fetch_add(1, Ordering::Relaxed);
        errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((i, m));
        // Not a tight loop against a failing agent.
        std::thread::sleep(Duration::from_millis(100));
    };
    while !stop.load(Ordering::Relaxed) {
        let mut r = match open(uri, plan, Offload::Yes) {
            Ok(r) => r,
            Err(e) => {
                fail(format!("open: {e}"));
                continue;
            }
        };
        slot.sessions.fetch_add(1, Ordering::Relaxed);
        let mut k = 0usize;
        let mut last = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            match r.next_batch() {
                Ok(Some(b)) => {
                    let bytes = b.tokens.as_bytes();
                    if let Some(&want) = reference.get(k) {
                        slot.checked.fetch_add(1, Ordering::Relaxed);
                        if xxh3_64(bytes) != want {
                            slot.mismatched.fetch_add(1, Ordering::Relaxed);
                            fail(format!("batch {k} differs from the in-process stream"));
                        }
                    }
                    k += 1;
                    std::hint::black_box(bytes.last());
                    slot.bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                    slot.batches.fetch_add(1, Ordering::Relaxed);
                    let now = Instant::now();
                    if measuring.load(Ordering::Relaxed) {
                        let gap = now.duration_since(last).as_micros() as u64;
                        slot.max_gap_us.fetch_max(gap, Ordering::Relaxed);
                    }
                    last = now;
                }
                Ok(None) => {
                    fail(format!("the stream ended after {k} batches"));
                    break;
                }
                Err(e) => {
                    fail(format!("after {k} batches: {e}"));
                    break;
                }
            }
        }
    }
}

/// The xxh3 of each of the first `n` batches of `plan`, run in this process (the reference
/// each consumer's first batches are checked against).
pub fn reference_digests(plan: &Plan, n: usize) -> Result<Vec<u64>> {
    let mut r = open("", plan, Offload::No)?;
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        match r.next_batch()? {
            Some(b) => out.push(xxh3_64(b.tokens.as_bytes())),
            None => break,
        }
    }
    Ok(out)
}

/// The hidden `load-client` subcommand: streams `plan` from the agent at `uri`, printing
/// `streaming` after the first batch; with `stall_after`, prints `stalled` after that many
/// batches and then reads nothing more, holding the connection, until killed.
pub fn run_child(uri: &str, plan_json: &str, stall_after: Option<u64>) -> Result<()> {
    let plan: Plan = serde_json::from_str(plan_json).context("--plan")?;
    let mut r = open(uri, &plan, Offload::Yes)?;
    let mut out = std::io::stdout();
    let mut n = 0u64;
    while r.next_batch()?.is_some() {
        n += 1;
        if n == 1 {
            writeln!(out, "streaming")?;
            out.flush()?;
        }
        if stall_after == Some(n) {
            writeln!(out, "stalled")?;
            out.flush()?;
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
    }
    anyhow::bail!("the stream ended after {n} batches")
}

fn spawn_child(uri: &str, plan: &Plan, stall_after: Option<u64>) -> Result<Child> {
    let exe = std::env::current_exe().context("cannot find this executable")?;
    let mut cmd = Command::new(exe);
    cmd.arg("load-client")
        .arg("--uri")
        .arg(uri)
        .arg("--plan")
        .arg(serde_json::to_string(plan)?);
    if let Some(k) = stall_after {
        cmd.arg("--stall-after").arg(k.to_string());
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start a load-client process")
}

/// SIGKILLs `child`, reaps it, and returns what it printed.
fn kill_and_read(mut child: Child) -> String {
    let _ = child.kill();
    let _ = child.wait();
    let mut s = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut s);
    }
    s
}

/// What the hostile clients did, for the report.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct HostileTally {
    /// Killed clients that had received a batch (killed mid-stream).
    pub killed_mid_stream: u64,
    /// Killed clients that had not received a batch yet (killed while opening).
    pub killed_before_first_batch: u64,
    /// Stalled clients that got their batches and stalled, and those that did not get there.
    pub stalled: u64,
    pub stalled_not_reached: u64,
    /// Garbage connections, by probe and what the agent answered.
    pub garbage: BTreeMap<String, u64>,
    pub garbage_connections: u64,
}

/// The hostile clients, each on its own thread, until stopped.
pub struct Hostile {
    stop: Arc<AtomicBool>,
    handles: Vec<std::thread::JoinHandle<()>>,
    tally: Arc<Mutex<HostileTally>>,
    stalled: Vec<Child>,
}

/// How the hostile clients behave.
#[derive(Debug, Clone)]
pub struct HostileOpts {
    pub stalled: usize,
    pub stall_after: u64,
    pub kill_min_ms: u64,
    pub kill_max_ms: u64,
    pub garbage_every: Duration,
    pub garbage_bytes: usize,
    pub seed: u64,
}

impl Hostile {
    pub fn start(
        uri: &str,
        control: SocketAddr,
        data: SocketAddr,
        plan: &Plan,
        o: &HostileOpts,
    ) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let tally: Arc<Mutex<HostileTally>> = Arc::default();
        let mut stalled = Vec::new();
        for _ in 0..o.stalled {
            stalled.push(spawn_child(uri, plan, Some(o.stall_after))?);
        }
        let mut handles = Vec::new();
        {
            let (stop, tally, uri, plan, o) = (
                stop.clone(),
                tally.clone(),
                uri.to_string(),
                plan.clone(),
                o.clone(),
            );
            handles.push(std::thread::spawn(move || {
                let mut rng = Xoshiro256PlusPlus::seed_from_u64(o.seed);
                while !stop.load(Ordering::Relaxed) {
                    let mut child = match spawn_child(&uri, &plan, None) {
                        Ok(c) => c,
                        Err(e) => {
                            eprintln!("load: {e:#}");
                            return;
                        }
                    };
                    // Killed mid-stream: once it has its first batch (or after 15 s, then
                    // while opening), a random 0.2-1.5 s later.
                    let (tx, rx) = std::sync::mpsc::channel();
                    let out = child.stdout.take();
                    let reader = std::thread::spawn(move || {
                        let mut said = String::new();
                        if let Some(o) = out {
                            let mut lines = std::io::BufReader::new(o);
                            let mut line = String::new();
                            while std::io::BufRead::read_line(&mut lines, &mut line)
                                .is_ok_and(|n| n > 0)
                            {
                                let _ = tx.send(());
                                said.push_str(&line);
                                line.clear();
                            }
                        }
                        said
                    });
                    let t = Instant::now();
                    while t.elapsed() < Duration::from_secs(15) && !stop.load(Ordering::Relaxed) {
                        if rx.recv_timeout(Duration::from_millis(10)).is_ok() {
                            break;
                        }
                    }
                    let wait =
                        Duration::from_millis(rng.random_range(o.kill_min_ms..=o.kill_max_ms));
                    let t = Instant::now();
                    while t.elapsed() < wait && !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    let _ = child.kill();
                    let _ = child.wait();
                    let said = reader.join().unwrap_or_default();
                    let mut t = tally.lock().unwrap_or_else(PoisonError::into_inner);
                    if said.contains("streaming") {
                        t.killed_mid_stream += 1;
                    } else {
                        t.killed_before_first_batch += 1;
                    }
                }
            }));
        }
        {
            let (stop, tally, o) = (stop.clone(), tally.clone(), o.clone());
            handles.push(std::thread::spawn(move || {
                let mut rng = Xoshiro256PlusPlus::seed_from_u64(o.seed ^ 0x5EED);
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    for probe in Probe::ALL {
                        let answer = probe.run(control, data, o.garbage_bytes, &mut rng);
                        let mut tl = tally.lock().unwrap_or_else(PoisonError::into_inner);
                        tl.garbage_connections += 1;
                        *tl.garbage
                            .entry(format!("{}: {answer}", probe.name()))
                            .or_insert(0) += 1;
                    }
                    while t.elapsed() < o.garbage_every && !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            }));
        }
        Ok(Hostile {
            stop,
            handles,
            tally,
            stalled,
        })
    }

    /// Stops every hostile client (the stalled ones are killed) and returns the tally.
    pub fn stop(mut self) -> HostileTally {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
        let mut t = std::mem::take(&mut *self.tally.lock().unwrap_or_else(PoisonError::into_inner));
        for c in self.stalled.drain(..) {
            if kill_and_read(c).contains("stalled") {
                t.stalled += 1;
            } else {
                t.stalled_not_reached += 1;
            }
        }
        t
    }
}

/// One kind of garbage.
#[derive(Clone, Copy, Debug)]
enum Probe {
    /// Random bytes to the data port.
    DataRandom,
    /// A frame header's magic (`DQFR`), then random bytes.
    DataMagic,
    /// A well-formed hello frame for a random session id and ticket.
    DataHello,
    /// Random bytes to the control port.
    ControlRandom,
    /// The HTTP/2 preface, then random bytes, to the control port.
    ControlH2,
}

impl Probe {
    const ALL: [Probe; 5] = [
        Probe::DataRandom,
        Probe::DataMagic,
        Probe::DataHello,
        Probe::ControlRandom,
        Probe::ControlH2,
    ];

    fn name(self) -> &'static str {
        match self {
            Probe::DataRandom => "data port, random bytes",
            Probe::DataMagic => "data port, frame magic + random",
            Probe::DataHello => "data port, hello for a random session",
            Probe::ControlRandom => "control port, random bytes",
            Probe::ControlH2 => "control port, HTTP/2 preface + random",
        }
    }

    /// Connects, writes the garbage, and says how the agent answered.
    fn run(
        self,
        control: SocketAddr,
        data: SocketAddr,
        bytes: usize,
        rng: &mut Xoshiro256PlusPlus,
    ) -> String {
        let addr = match self {
            Probe::ControlRandom | Probe::ControlH2 => control,
            _ => data,
        };
        let timeout = Duration::from_secs(2);
        let mut s = match TcpStream::connect_timeout(&addr, timeout) {
            Ok(s) => s,
            Err(e) => return format!("connect failed ({})", e.kind()),
        };
        let _ = s.set_read_timeout(Some(timeout));
        let _ = s.set_write_timeout(Some(timeout));
        let mut garbage = vec![0u8; bytes.max(64)];
        rng.fill(&mut garbage);
        let wrote = match self {
            Probe::DataRandom | Probe::ControlRandom => s.write_all(&garbage),
            Probe::DataMagic => {
                garbage[..4].copy_from_slice(b"DQFR");
                s.write_all(&garbage)
            }
            Probe::ControlH2 => {
                let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
                garbage[..preface.len()].copy_from_slice(preface);
                s.write_all(&garbage)
            }
            Probe::DataHello => {
                let mut ticket = [0u8; 16];
                rng.fill(&mut ticket);
                let hello = Hello {
                    session: rng.next_u64(),
                    ticket,
                    token: None,
                };
                FrameWriter::new(&s)
                    .send(FrameKind::Data, &hello.encode())
                    .map_err(|e| std::io::Error::other(e.to_string()))
            }
        };
        let mut answer = Vec::new();
        let read = (&s).take(1 << 16).read_to_end(&mut answer);
        let how = match (&wrote, &read) {
            (_, Ok(_)) => "then closed".to_string(),
            (_, Err(e))
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                "still open after 2 s".to_string()
            }
            (_, Err(e)) => format!("then {}", e.kind()),
        };
        let wrote = match wrote {
            Ok(()) => String::new(),
            Err(e) => format!("write: {}; ", e.kind()),
        };
        format!("{wrote}{}, {how}", describe_answer(&answer))
    }
}

/// What came back: a dquant error frame's message, or how many bytes of something else.
fn describe_answer(b: &[u8]) -> String {
    if b.is_empty() {
        return "no answer".into();
    }
    if b.len() >= 32 && &b[..4] == b"DQFR" && b[4] == 3 {
        let len = u32::from_le_bytes([b[16], b[17], b[18], b[19]]) as usize;
        let msg = String::from_utf8_lossy(&b[32..b.len().min(32 + len)]).into_owned();
        return format!("error frame \"{}\"", message_kind(&msg));
    }
    if b.len() >= 9 {
        // An HTTP/2 frame: 3 bytes of length, 1 of type (7 = GOAWAY).
        let kind = match b[3] {
            4 => "SETTINGS",
            7 => "GOAWAY",
            _ => "other",
        };
        return format!("{} bytes (HTTP/2, first frame {kind})", b.len());
    }
    format!("{} bytes", b.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_described() {
        assert_eq!(describe_answer(&[]), "no answer");
        let mut frame = Vec::new();
        FrameWriter::new(&mut frame)
            .fail("data stream: bad frame magic 12345")
            .unwrap();
        assert_eq!(
            describe_answer(&frame),
            "error frame \"data stream: bad frame magic N\""
        );
        let goaway = [0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        assert_eq!(
            describe_answer(&goaway),
            "17 bytes (HTTP/2, first frame GOAWAY)"
        );
    }
}
