//! Transport-level benchmark of the shared-memory ring (`dquant_transport::ring`), against a
//! single-thread memcpy of the same bytes in the same run.
//!
//! # Why it is shaped this way
//!
//! The target for the ring is that batches delivered to a consumer over shared memory
//! reach at least 0.7× memcpy bandwidth. So the benchmark isolates the ring from everything
//! else (no plan, no dataset, no codec) and keeps what a real deployment has:
//!
//! * **Two processes.** The producer (standing in for the agent) is this binary re-executed
//!   with the hidden `ring-produce` subcommand, like [`crate::procs::AgentProc`]. The parent
//!   (standing in for the trainer) creates the ring, listens on a Unix socket in a private
//!   temporary directory, and passes the memfd and eventfds to the child with SCM_RIGHTS
//!   (`RingFds::send`/`recv`), exactly as the host would hand them to an agent. Cross-process
//!   matters: the two sides have separate mappings (and page tables) of the memfd, the
//!   eventfd wakeups cross a process boundary, and the cache lines of the indices bounce
//!   between cores.
//! * **The producer writes like the agent will.** For each batch it reserves a slot, copies a
//!   prebuilt batch into it with `copy_from_slice` (the agent's last copy: decoded tokens into
//!   the ring) and commits (which computes the record's crc32c if the ring carries checksums).
//!   The batch is built before the clock starts and stays hot in the producer's cache, so the
//!   number measures the ring, not batch generation. The default batch is the plan: 16 samples of 4096 u16 tokens
//!   (128 KiB) plus the 48-byte batch record header.
//! * **The consumer does by default what a trainer does with a batch it hands to a GPU copy:
//!   nothing with the payload on the CPU.** It takes the view (`RingConsumer::next`) and drops
//!   it, releasing the slot; on a real host the view would be the source of a
//!   `cudaMemcpyAsync` from pinned memory. Note that a ring created with checksums
//!   (`RingConsumer::create_with(.., true)`, the default) has the producer compute and `next`
//!   check a crc32c of every batch, a pass over every payload byte on each side, so
//!   "untouched" still reads the batch once; every ring case is therefore measured with
//!   checksums on and off (`--crc`). The `ring-touch` case additionally reads the whole
//!   payload (a wrapping sum of u64 words, checked against the expected sum) to show the cost
//!   of a consumer that does look at the bytes.
//! * **The baseline is the copy the ring cannot avoid.** One thread copies the same number of
//!   bytes, batch by batch, from a prebuilt source buffer into a destination buffer as large
//!   as the ring's slot area, cycling through "slots" in the same order, so the destination's
//!   cache footprint is the ring's. The ring's ideal is to run at the speed of this copy (the
//!   producer's memcpy), with the rest (crc32c if on, index updates, wakeups) overlapped on
//!   the second core.
//! * **The ring is sized as the client sizes it.** By default 8 MiB of slots (63 slots of the
//!   default batch, 8 of a 1 MiB one), like the client's shared-memory reader. The size
//!   matters twice: a ring that fits the producer's L2 makes the baseline's copy cheaper, and
//!   a ring of a few slots leaves the producer too little room to run ahead while a sleeping
//!   consumer is being woken (try `--slots 8` against the default).
//! * **Rounds.** The machines are shared and noisy, so every round (`--runs`) measures its own
//!   baseline right before the ring cases, and ratios are taken within a round.
//!
//! CPU time is `getrusage(RUSAGE_SELF)` around the consumer's loop (this process is
//! single-threaded while measuring) and `wait4` for the producer child (whole process,
//! including exec and startup; the child also reports the CPU of its write loop alone, in the
//! JSON). Sleeps are voluntary context switches (`ru_nvcsw`) during the stream: with the
//! ring's need-wakeup protocol a side sleeps (and costs the other side an eventfd write) only
//! when it finds the ring empty (consumer; it then asks to be woken once several batches are
//! ready, `--batch-wakeups`) or full (producer), so they count wakeups. Minor faults show the
//! ring's first lap: the producer faults in every 4 KiB page of the memfd once.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use dquant_transport::record::RECORD_HEADER_LEN;
use dquant_transport::ring::{layout, RingConsumer, RingFds, RingProducer};
use serde_json::json;

use crate::procs;
use crate::report::{f, spread, Table};

const EXAMPLES: &str = "\
Examples:
  dquant-offload-bench ring
  dquant-offload-bench ring --gb 2 --runs 3
  # The issue's 128 KiB batches and 1 MiB ones, in a 16-slot ring, as JSON:
  dquant-offload-bench ring --batch-bytes 131120,1048624 --slots 16 --json > ring.json
  # A consumer woken for every batch (the ring's default batches wakeups):
  dquant-offload-bench ring --batch-wakeups 1
  # Only the ring, to profile the producer with perf meanwhile:
  dquant-offload-bench ring --runs 1 --gb 20 --cases ring";

/// Default batch: 16 samples × 4096 u16 tokens plus the batch record header.
const DEFAULT_BATCH: usize = 16 * 4096 * 2 + RECORD_HEADER_LEN;

/// What the table's columns mean.
const TABLE_NOTES: &str = "\
CPU is seconds per GB (1e9 bytes) of payload: 'cons' is this process (the memcpy thread or the
ring's consumer), 'prod' the producer process (wait4, whole process). c/p columns are
consumer/producer: sleeps and preempted are voluntary and involuntary context switches during
the stream, minflt minor page faults. Ratio is to the same run's memcpy. 'crc' is the ring's
per-batch crc32c (computed by the producer, checked by the consumer).";
/// How long the consumer waits for one batch before calling the producer stuck.
const BATCH_TIMEOUT: Duration = Duration::from_secs(60);

/// Shared-memory ring throughput against a single-thread memcpy, in the same run.
///
/// A producer process (this binary, re-executed) attaches to a memfd ring this process
/// creates (descriptors passed over a Unix socket) and writes --gb of batches of
/// --batch-bytes each: reserve a slot, copy_from_slice a prebuilt batch, commit. This
/// process consumes them: by default without reading the payload (as a trainer handing the
/// view to a GPU copy would), and in the `ring-touch` case reading every u64 word; each ring
/// case with the ring's crc32c on and off (--crc). The baseline copies the same
/// bytes in the same batch size into a buffer the size of the ring.
/// Reports GB/s, the ratio to memcpy (the target: at least 0.7), CPU seconds per GB
/// (1e9 bytes) on each side, sleeps (voluntary context switches) and minor page faults.
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// Payload bytes per stream (1e9 bytes), per case and batch size.
    #[arg(long, default_value_t = 4.0)]
    pub gb: f64,
    /// Bytes per batch; a comma-separated list measures each size (default: 16 × 4096 u16
    /// tokens + the 48-byte batch header).
    #[arg(long, value_delimiter = ',', default_values_t = [DEFAULT_BATCH])]
    pub batch_bytes: Vec<usize>,
    /// Slots in the ring (default: enough for an 8 MiB ring, at least 4 and at most 1024, as
    /// the client's shared-memory reader sizes its ring by default).
    #[arg(long)]
    pub slots: Option<u32>,
    /// Slot size in bytes (default: the batch size rounded up to a 4 KiB page).
    #[arg(long)]
    pub slot_size: Option<u64>,
    /// Rounds of all cases; each round has its own memcpy baseline.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Which cases to run in each round, in this order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "memcpy,ring,ring-touch"
    )]
    pub cases: Vec<Case>,
    /// The ring's per-batch crc32c, computed by the producer and checked by the consumer
    /// (`RingConsumer::create_with`): each ring case runs once per value given, in this order.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "off,on")]
    pub crc: Vec<Crc>,
    /// Wake a sleeping consumer only once this many batches are ready
    /// (`RingConsumer::set_batch_wakeups`; default: the ring's, half the slots). 1 wakes it
    /// for every batch.
    #[arg(long)]
    pub batch_wakeups: Option<u32>,
    #[command(flatten)]
    pub out: crate::report::JsonOpts,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Case {
    /// The baseline: one thread copies each batch into the next "slot" of a ring-sized buffer.
    Memcpy,
    /// Batches through the ring from a producer process; the consumer does not read them
    /// (beyond the ring's own crc32c check, if on).
    Ring,
    /// As `ring`, and the consumer reads every u64 word of each batch.
    RingTouch,
}

impl Case {
    fn label(self, crc: Option<bool>) -> String {
        let crc = match crc {
            Some(true) => ", crc on",
            Some(false) => ", crc off",
            None => "",
        };
        match self {
            Case::Memcpy => "memcpy, 1 thread (baseline)".into(),
            Case::Ring => format!("ring, untouched{crc}"),
            Case::RingTouch => format!("ring, consumer reads{crc}"),
        }
    }

    fn key(self) -> &'static str {
        match self {
            Case::Memcpy => "memcpy",
            Case::Ring => "ring",
            Case::RingTouch => "ring-touch",
        }
    }
}

/// The ring's per-batch crc32c.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Crc {
    /// Computed by the producer and checked by the consumer (the ring's default).
    On,
    /// Neither: only sequence number and length are checked.
    Off,
}

/// `getrusage(RUSAGE_SELF)` figures this benchmark uses.
#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    cpu: Duration,
    minflt: u64,
    /// Voluntary context switches: the process blocked (here: slept in poll on the ring).
    nvcsw: u64,
    /// Involuntary context switches: the scheduler took the CPU away.
    nivcsw: u64,
}

impl Usage {
    fn now() -> Usage {
        // SAFETY: getrusage writes into the struct we pass; RUSAGE_SELF is always valid.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
        let tv = |t: libc::timeval| {
            Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
        };
        Usage {
            cpu: tv(ru.ru_utime) + tv(ru.ru_stime),
            minflt: ru.ru_minflt as u64,
            nvcsw: ru.ru_nvcsw as u64,
            nivcsw: ru.ru_nivcsw as u64,
        }
    }

    fn since(self, before: Usage) -> Usage {
        Usage {
            cpu: self.cpu.saturating_sub(before.cpu),
            minflt: self.minflt.saturating_sub(before.minflt),
            nvcsw: self.nvcsw.saturating_sub(before.nvcsw),
            nivcsw: self.nivcsw.saturating_sub(before.nivcsw),
        }
    }

    /// Wire form for the producer's report to the parent: five little-endian u64s.
    fn encode(self, published: u64) -> [u8; 40] {
        let mut b = [0u8; 40];
        let cpu_ns = u64::try_from(self.cpu.as_nanos()).unwrap_or(u64::MAX);
        for (i, v) in [cpu_ns, self.minflt, self.nvcsw, self.nivcsw, published]
            .into_iter()
            .enumerate()
        {
            b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    fn decode(b: &[u8; 40]) -> (Usage, u64) {
        let w = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        (
            Usage {
                cpu: Duration::from_nanos(w(0)),
                minflt: w(1),
                nvcsw: w(2),
                nivcsw: w(3),
            },
            w(4),
        )
    }
}

/// The prebuilt batch both sides use: deterministic, not zeros and not a short period, so
/// nothing on the path can be clever about it and the consumer can check what it read.
fn batch_data(n: usize) -> Vec<u8> {
    (0..n as u64)
        .map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8)
        .collect()
}

/// The `ring-touch` consumer's read of a batch: a wrapping sum of its u64 words (and the
/// trailing bytes), which compiles to wide vector loads, so it costs about one pass over the
/// bytes at memory/cache bandwidth.
fn sum_words(b: &[u8]) -> u64 {
    let mut chunks = b.chunks_exact(8);
    let mut s = chunks.by_ref().fold(0u64, |s, c| {
        s.wrapping_add(u64::from_ne_bytes(c.try_into().unwrap()))
    });
    for &x in chunks.remainder() {
        s = s.wrapping_add(u64::from(x));
    }
    s
}

/// One measured stream.
struct M {
    run: usize,
    batch_bytes: usize,
    slots: u32,
    slot_size: usize,
    case: Case,
    /// The ring's crc32c; `None` for memcpy.
    crc: Option<bool>,
    batches: u64,
    wall: Duration,
    /// This process: the memcpy thread, or the ring's consumer.
    consumer: Usage,
    /// The producer child, whole process (wait4); ring cases only.
    producer_total_cpu: Option<Duration>,
    /// The producer child's own figures for its write loop alone; ring cases only.
    producer_loop: Option<Usage>,
    load: String,
}

impl M {
    fn bytes(&self) -> u64 {
        self.batches * self.batch_bytes as u64
    }
    fn gbps(&self) -> f64 {
        self.bytes() as f64 / self.wall.as_secs_f64() / 1e9
    }
    fn per_gb(&self, d: Duration) -> f64 {
        d.as_secs_f64() / (self.bytes() as f64 / 1e9)
    }
}

/// The baseline: `batches` copies of a prebuilt `batch_bytes` batch into a buffer of
/// `slots × slot_size` bytes, slot after slot, as the producer writes the ring.
fn memcpy_case(run: usize, g: &Geometry) -> Result<M> {
    let load = procs::loadavg();
    let src = batch_data(g.batch_bytes);
    // Touched once beforehand, as the ring's pages are after its first lap (and the first
    // lap's faults are a negligible part of a multi-GB stream either way).
    let mut dst = vec![1u8; g.slots as usize * g.slot_size];
    let u0 = Usage::now();
    let t0 = Instant::now();
    for i in 0..g.batches {
        let at = (i % u64::from(g.slots)) as usize * g.slot_size;
        dst[at..at + g.batch_bytes].copy_from_slice(&src);
        // Keep the compiler from reasoning the copies away or merging them.
        std::hint::black_box(&mut dst);
    }
    let wall = t0.elapsed();
    let consumer = Usage::now().since(u0);
    Ok(M {
        run,
        batch_bytes: g.batch_bytes,
        slots: g.slots,
        slot_size: g.slot_size,
        case: Case::Memcpy,
        crc: None,
        batches: g.batches,
        wall,
        consumer,
        producer_total_cpu: None,
        producer_loop: None,
        load,
    })
}

/// A private directory for the rendezvous socket, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<TempDir> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let p = std::env::temp_dir().join(format!(
            "dquant-ring-bench-{}-{nanos:08x}",
            std::process::id()
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&p)
            .with_context(|| format!("creating {}", p.display()))?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A producer child that has not been reaped: killed and reaped if the parent bails out.
struct ProducerChild(Option<Child>);

impl ProducerChild {
    fn take(&mut self) -> Child {
        self.0.take().expect("producer child already taken")
    }
}

impl Drop for ProducerChild {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn_producer(socket: &Path, batch_bytes: usize, batches: u64) -> Result<Child> {
    let exe = std::env::current_exe().context("cannot find this executable")?;
    Command::new(exe)
        .arg("ring-produce")
        .arg("--socket")
        .arg(socket)
        .arg("--batch-bytes")
        .arg(batch_bytes.to_string())
        .arg("--batches")
        .arg(batches.to_string())
        .stdin(Stdio::null())
        .spawn()
        .context("cannot start the ring producer process")
}

/// Waits for the producer child to connect, failing (instead of hanging) if it exits first.
fn accept_producer(listener: &UnixListener, child: &mut ProducerChild) -> Result<UnixStream> {
    listener.set_nonblocking(true)?;
    let t0 = Instant::now();
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e).context("waiting for the producer"),
        }
        if let Some(st) = child.0.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            bail!("ring: the producer process exited ({st}) before connecting");
        }
        if t0.elapsed() > BATCH_TIMEOUT {
            bail!("ring: the producer did not connect within {BATCH_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// One stream through the ring from a producer child.
fn ring_case(
    run: usize,
    case: Case,
    crc: bool,
    batch_wakeups: Option<u32>,
    g: &Geometry,
) -> Result<M> {
    let touch = case == Case::RingTouch;
    let load = procs::loadavg();
    let dir = TempDir::new()?;
    let sock_path = dir.0.join("ring.sock");
    let listener = UnixListener::bind(&sock_path)
        .with_context(|| format!("listening on {}", sock_path.display()))?;
    let (mut consumer, fds) = RingConsumer::create_with(g.slots, g.slot_size as u64, crc)?;
    if let Some(k) = batch_wakeups {
        consumer.set_batch_wakeups(k);
    }
    let mut child = ProducerChild(Some(spawn_producer(&sock_path, g.batch_bytes, g.batches)?));
    let mut stream = accept_producer(&listener, &mut child)?;
    drop(listener);
    consumer.set_peer(OwnedFd::from(stream.try_clone()?));
    let expect_sum = sum_words(&batch_data(g.batch_bytes));

    // The clock starts when the producer gets the ring: attaching (fstat, mmap) is part of
    // the stream, the child's exec and batch building are not.
    let u0 = Usage::now();
    let t0 = Instant::now();
    fds.send(&stream)?;
    drop(fds);
    let (mut n, mut sum) = (0u64, 0u64);
    while let Some(slot) = consumer.next(BATCH_TIMEOUT)? {
        if slot.len() != g.batch_bytes {
            bail!(
                "ring: batch {} has {} bytes, expected {}",
                slot.seq(),
                slot.len(),
                g.batch_bytes
            );
        }
        if touch {
            sum = sum.wrapping_add(sum_words(&slot));
        } else {
            // Hand the view on without reading it, as to a GPU copy.
            std::hint::black_box(slot.as_ptr());
        }
        n += 1;
        // Dropping `slot` releases it to the producer.
    }
    let wall = t0.elapsed();
    let consumer_usage = Usage::now().since(u0);

    let mut report = [0u8; 40];
    stream
        .read_exact(&mut report)
        .context("reading the producer's report")?;
    let (producer_loop, published) = Usage::decode(&report);
    let (ok, producer_total) = procs::wait_with_cpu(child.take())?;
    if !ok {
        bail!("ring: the producer process failed");
    }
    if n != g.batches || published != g.batches {
        bail!(
            "ring: the producer published {published} and the consumer read {n} of {} batches",
            g.batches
        );
    }
    if touch && sum != expect_sum.wrapping_mul(n) {
        bail!("ring: the payload the consumer read differs from what the producer wrote");
    }
    Ok(M {
        run,
        batch_bytes: g.batch_bytes,
        slots: g.slots,
        slot_size: g.slot_size,
        case,
        crc: Some(crc),
        batches: n,
        wall,
        consumer: consumer_usage,
        producer_total_cpu: Some(producer_total),
        producer_loop: Some(producer_loop),
        load,
    })
}

/// The hidden `ring-produce` subcommand: connects to `socket`, receives the ring's
/// descriptors, writes `batches` copies of the prebuilt batch and closes the ring, then
/// writes its own CPU figures for the write loop back on the socket.
pub fn run_producer(socket: &Path, batch_bytes: usize, batches: u64) -> Result<()> {
    let src = batch_data(batch_bytes);
    let mut stream = UnixStream::connect(socket)
        .with_context(|| format!("connecting to {}", socket.display()))?;
    let fds = RingFds::recv(&stream)?;
    let u0 = Usage::now();
    let mut producer = RingProducer::attach(fds)?;
    producer.set_peer(OwnedFd::from(stream.try_clone()?));
    for _ in 0..batches {
        let mut slot = producer.reserve()?;
        slot[..batch_bytes].copy_from_slice(&src);
        slot.commit(batch_bytes)?;
    }
    let published = producer.published();
    producer.close();
    let usage = Usage::now().since(u0);
    stream.write_all(&usage.encode(published))?;
    Ok(())
}

/// One batch size's stream geometry.
struct Geometry {
    batch_bytes: usize,
    slot_size: usize,
    slots: u32,
    batches: u64,
}

pub fn run(a: &Args) -> Result<()> {
    if a.runs == 0 || a.cases.is_empty() || a.batch_bytes.is_empty() || a.crc.is_empty() {
        bail!("nothing to run: give --runs ≥ 1 and at least one case, batch size and --crc value");
    }
    if !(a.gb > 0.0 && a.gb.is_finite()) {
        bail!("--gb must be positive");
    }
    let mut geoms = Vec::new();
    for &b in &a.batch_bytes {
        if b == 0 {
            bail!("--batch-bytes must be positive");
        }
        let slot_size = a
            .slot_size
            .unwrap_or((b as u64).div_ceil(layout::PAGE) * layout::PAGE);
        if slot_size < b as u64 {
            bail!("--slot-size {slot_size} is smaller than a {b}-byte batch");
        }
        // Checks slot count and size the way the ring will.
        let slots = a
            .slots
            .unwrap_or_else(|| dquant_client::shm::default_slots(slot_size));
        layout::Layout::new(slots, slot_size)?;
        geoms.push(Geometry {
            batch_bytes: b,
            slot_size: usize::try_from(slot_size)?,
            slots,
            batches: ((a.gb * 1e9) / b as f64).ceil() as u64,
        });
    }

    let mut ms: Vec<M> = Vec::new();
    for run in 1..=a.runs {
        for g in &geoms {
            for &case in &a.cases {
                let crcs = match case {
                    Case::Memcpy => vec![None],
                    Case::Ring | Case::RingTouch => {
                        a.crc.iter().map(|&c| Some(c == Crc::On)).collect()
                    }
                };
                for crc in crcs {
                    let m = match crc {
                        None => memcpy_case(run, g)?,
                        Some(c) => ring_case(run, case, c, a.batch_wakeups, g)?,
                    };
                    eprintln!(
                        "run {run}/{}: {:>8} B  {:<34} {:>7.3} GB/s  (load {})",
                        a.runs,
                        g.batch_bytes,
                        case.label(crc),
                        m.gbps(),
                        m.load
                    );
                    ms.push(m);
                }
            }
        }
    }

    let base = |run: usize, batch: usize| {
        ms.iter()
            .find(|m| m.run == run && m.batch_bytes == batch && m.case == Case::Memcpy)
            .map(M::gbps)
    };
    let ratio = |m: &M| base(m.run, m.batch_bytes).map(|b| m.gbps() / b);
    {
        let rows: Vec<_> = ms
            .iter()
            .map(|m| {
                json!({
                    "run": m.run, "case": m.case.key(), "batch_bytes": m.batch_bytes,
                    "slots": m.slots, "slot_size": m.slot_size,
                    "batches": m.batches, "bytes": m.bytes(), "seconds": m.wall.as_secs_f64(),
                    "gb_per_s": m.gbps(), "ratio_to_memcpy": ratio(m),
                    "crc": m.crc,
                    "consumer_cpu_s": m.consumer.cpu.as_secs_f64(),
                    "consumer_cpu_s_per_gb": m.per_gb(m.consumer.cpu),
                    "consumer_sleeps": m.consumer.nvcsw,
                    "consumer_preemptions": m.consumer.nivcsw,
                    "consumer_minflt": m.consumer.minflt,
                    "producer_cpu_s": m.producer_total_cpu.map(|d| d.as_secs_f64()),
                    "producer_cpu_s_per_gb": m.producer_total_cpu.map(|d| m.per_gb(d)),
                    "producer_loop_cpu_s_per_gb": m.producer_loop.map(|u| m.per_gb(u.cpu)),
                    "producer_sleeps": m.producer_loop.map(|u| u.nvcsw),
                    "producer_preemptions": m.producer_loop.map(|u| u.nivcsw),
                    "producer_minflt": m.producer_loop.map(|u| u.minflt),
                    "loadavg": m.load,
                })
            })
            .collect();
        let out = json!({
            "bench": "ring", "gb_per_stream": a.gb,
            "batch_wakeups": a.batch_wakeups,
            "target_ratio_to_memcpy": 0.7, "measurements": rows,
        });
        if a.out.emit(&out)? {
            return Ok(());
        }
    }

    for g in &geoms {
        println!(
            "batch {} B in {} slots of {} B ({:.2} MiB of slots); {} batches = {:.3} GB per stream",
            g.batch_bytes,
            g.slots,
            g.slot_size,
            (g.slots as usize * g.slot_size) as f64 / (1 << 20) as f64,
            g.batches,
            (g.batches * g.batch_bytes as u64) as f64 / 1e9
        );
    }
    println!(
        "consumer wakeups batched by {}\n",
        a.batch_wakeups
            .map_or_else(|| "the ring's default".to_string(), |k| k.to_string())
    );
    println!("{TABLE_NOTES}\n");
    let mut t = Table::new(&[
        "run",
        "batch B",
        "case",
        "GB/s",
        "ratio",
        "cons CPU s/GB",
        "prod CPU s/GB",
        "sleeps c/p",
        "preempted c/p",
        "minflt c/p",
        "load",
    ])
    .left(3);
    for m in &ms {
        // "consumer/producer"; the memcpy baseline has no producer.
        let pair = |c: u64, p: Option<u64>| match p {
            Some(p) => format!("{c}/{p}"),
            None => format!("{c}/-"),
        };
        t.row(vec![
            m.run.to_string(),
            m.batch_bytes.to_string(),
            m.case.label(m.crc),
            f(m.gbps(), 3),
            ratio(m).map_or("-".into(), |r| f(r, 2)),
            f(m.per_gb(m.consumer.cpu), 3),
            m.producer_total_cpu
                .map_or("-".into(), |d| f(m.per_gb(d), 3)),
            pair(m.consumer.nvcsw, m.producer_loop.map(|u| u.nvcsw)),
            pair(m.consumer.nivcsw, m.producer_loop.map(|u| u.nivcsw)),
            pair(m.consumer.minflt, m.producer_loop.map(|u| u.minflt)),
            m.load.clone(),
        ]);
    }
    t.print();
    println!();
    let mut s = Table::new(&[
        "batch B",
        "case (over runs: min–max)",
        "GB/s",
        "ratio to memcpy",
        "median ratio",
        "cons CPU s/GB",
        "prod CPU s/GB",
    ])
    .left(2);
    let range = |xs: Vec<f64>, d: usize| {
        if xs.is_empty() {
            return "-".to_string();
        }
        let (lo, _, hi) = spread(&xs);
        format!("{}–{}", f(lo, d), f(hi, d))
    };
    // Each (batch size, case, check) in the order measured.
    let mut kinds: Vec<(usize, Case, Option<bool>)> = Vec::new();
    for m in &ms {
        let k = (m.batch_bytes, m.case, m.crc);
        if !kinds.contains(&k) {
            kinds.push(k);
        }
    }
    for (batch_bytes, case, crc) in kinds {
        let of: Vec<&M> = ms
            .iter()
            .filter(|m| m.case == case && m.batch_bytes == batch_bytes && m.crc == crc)
            .collect();
        let ratios: Vec<f64> = of.iter().filter_map(|m| ratio(m)).collect();
        s.row(vec![
            batch_bytes.to_string(),
            case.label(crc),
            range(of.iter().map(|m| m.gbps()).collect(), 3),
            range(ratios.clone(), 2),
            if ratios.is_empty() {
                "-".into()
            } else {
                f(spread(&ratios).1, 2)
            },
            range(of.iter().map(|m| m.per_gb(m.consumer.cpu)).collect(), 3),
            range(
                of.iter()
                    .filter_map(|m| m.producer_total_cpu.map(|d| m.per_gb(d)))
                    .collect(),
                3,
            ),
        ]);
    }
    s.print();
    println!("\ntarget: ring ≥ 0.7 × memcpy");
    Ok(())
}
