//! The emulated NIC-bound link: two network namespaces joined by a veth pair whose both ends
//! are shaped by `tc tbf`.
//!
//! Why namespaces and not loopback: loopback has no rate and no device counters of its own,
//! and every process on it shares one stack. Here the storage node's processes live in
//! `storage`, the training host's in `host`, and the only way between them is the veth pair,
//! so the bytes a scenario moves are read off the veth counters and its speed is bounded by
//! the token bucket, as a real NIC bounds it.
//!
//! Everything created here is removed when the [`Link`] drops, and also on Ctrl-C / SIGTERM
//! (the handler kills the processes started in the namespaces, then deletes the namespaces,
//! which deletes the veth pair with them). Processes started in a namespace also get
//! `PR_SET_PDEATHSIG`, so a lab killed by SIGKILL does not leave servers running; only the
//! namespaces themselves can then be left behind, and `--cleanup` removes them.

use std::collections::BTreeSet;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// The storage node's namespace.
pub const STORAGE_NS: &str = "storage";
/// The training host's namespace.
pub const HOST_NS: &str = "host";
/// The veth end in `storage`, and its address.
pub const STORAGE_DEV: &str = "dqlab-st";
pub const STORAGE_IP: &str = "10.77.0.1";
/// The veth end in `host`, and its address.
pub const HOST_DEV: &str = "dqlab-host";
pub const HOST_IP: &str = "10.77.0.2";

/// Storage nodes the scale-out runs may add beside `storage`: `storage1`, `storage2`, ...,
/// each joined to `host` by a shaped veth pair of its own.
pub const MAX_STORAGE_NODES: usize = 4;

/// Storage node `i`'s namespace: `storage`, then `storage1`, `storage2`, ...
pub fn storage_ns(i: usize) -> String {
    match i {
        0 => STORAGE_NS.to_string(),
        i => format!("storage{i}"),
    }
}

/// Storage node `i`'s address (`10.77.i.1`; node 0 is [`STORAGE_IP`]).
pub fn storage_ip(i: usize) -> String {
    match i {
        0 => STORAGE_IP.to_string(),
        i => format!("10.77.{i}.1"),
    }
}

/// Node `i`'s veth ends (storage side, host side) and the host side's address.
fn pair(i: usize) -> (String, String, String) {
    match i {
        0 => (STORAGE_DEV.into(), HOST_DEV.into(), HOST_IP.into()),
        i => (
            format!("{STORAGE_DEV}{i}"),
            format!("dqlab-h{i}"),
            format!("10.77.{i}.2"),
        ),
    }
}

/// What the lab has created and not yet removed: what the signal handler must undo.
#[derive(Default)]
struct Live {
    namespaces: Vec<String>,
    pids: BTreeSet<u32>,
}

static LIVE: Mutex<Option<Live>> = Mutex::new(None);

/// Set by the Ctrl-C handler before it tears the lab down: errors that follow (a namespace
/// vanishing under a running scenario) are the interruption's, not failures to report.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the lab was interrupted by Ctrl-C / SIGTERM / SIGHUP.
pub fn interrupted() -> bool {
    INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst)
}

fn live<R>(f: impl FnOnce(&mut Live) -> R) -> R {
    let mut g = LIVE.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(Live::default))
}

/// Kills every process the lab started and deletes its namespaces. Idempotent.
fn undo_all() {
    let (pids, namespaces) = live(|l| {
        (
            std::mem::take(&mut l.pids),
            std::mem::take(&mut l.namespaces),
        )
    });
    for pid in &pids {
        // SAFETY: plain kill(2) on pids we started and have not reaped (reaping removes them
        // from the set first), so none can have been reused.
        unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) };
    }
    for pid in &pids {
        let mut status = 0;
        // SAFETY: waitpid on our own children; a pid already reaped just returns -1.
        unsafe { libc::waitpid(*pid as libc::pid_t, &mut status, 0) };
    }
    for ns in namespaces.iter().rev() {
        let _ = Command::new("ip")
            .args(["netns", "del", ns])
            .stderr(Stdio::null())
            .status();
    }
}

/// Installs the Ctrl-C / SIGTERM / SIGHUP handler that undoes the lab, then exits 130.
pub fn install_signal_cleanup() -> Result<()> {
    ctrlc::set_handler(|| {
        INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
        eprintln!("\ninterrupted: removing the lab's processes and namespaces");
        undo_all();
        std::process::exit(130);
    })
    .context("cannot install the Ctrl-C handler")
}

/// Runs `ip`/`tc` and fails with its stderr.
fn run(program: &str, args: &[&str]) -> Result<()> {
    output(program, args).map(drop)
}

/// Runs `ip`/`tc` and returns its stdout, or fails with its stderr.
fn output(program: &str, args: &[&str]) -> Result<Vec<u8>> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {program} (iproute2 is needed)"))?;
    if !out.status.success() {
        bail!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

fn netns_exists(name: &str) -> bool {
    std::path::Path::new("/var/run/netns").join(name).exists()
}

/// Removes namespaces a lab killed by SIGKILL left behind (`--cleanup`). Returns their names.
pub fn remove_leftovers() -> Result<Vec<String>> {
    let mut gone = Vec::new();
    let all = (0..MAX_STORAGE_NODES)
        .map(storage_ns)
        .chain([HOST_NS.to_string()]);
    for ns in all {
        if netns_exists(&ns) {
            run("ip", &["netns", "del", &ns])?;
            gone.push(ns);
        }
    }
    Ok(gone)
}

/// The link's shape.
#[derive(Clone, Debug)]
pub struct LinkSpec {
    /// `tc` rate, e.g. `1gbit`.
    pub rate: String,
    /// The rate in bits per second, parsed from `rate`.
    pub bits_per_s: f64,
    pub mtu: u32,
}

impl LinkSpec {
    pub fn new(rate: &str, mtu: u32) -> Result<Self> {
        Ok(LinkSpec {
            rate: rate.to_string(),
            bits_per_s: parse_rate(rate)?,
            mtu,
        })
    }

    /// Bytes per second the link carries (at layer 2, headers included).
    pub fn bytes_per_s(&self) -> f64 {
        self.bits_per_s / 8.0
    }

    /// The token bucket: 2 ms at the rate, at least 64 KiB so that a GSO burst of one
    /// 64 KiB segment passes whole. With it, a bulk TCP stream got 0.956 of 1 Gbit/s at MTU
    /// 1500 (the rest is TCP/IP/Ethernet headers) and 0.988 at MTU 9000, measured by hand
    /// with a Python sender and receiver (see bench/lab/README.md).
    pub fn burst_bytes(&self) -> u64 {
        ((self.bytes_per_s() * 0.002) as u64).max(64 << 10)
    }
}

/// Parses a `tc` rate: a number with an optional `k`/`m`/`g` prefix and `bit` or `bps`
/// (bytes) unit, e.g. `1gbit`, `500mbit`, `10gbit`, `125mbps`.
pub fn parse_rate(s: &str) -> Result<f64> {
    let t = s.trim().to_ascii_lowercase();
    let (num, unit) = t.split_at(
        t.find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len()),
    );
    let n: f64 = num
        .parse()
        .ok()
        .filter(|n: &f64| *n > 0.0 && n.is_finite())
        .with_context(|| {
            format!("--rate {s:?}: expected a tc rate such as 1gbit, 500mbit or 10gbit")
        })?;
    let (mult, bits) = match unit {
        "bit" => (1.0, true),
        "kbit" => (1e3, true),
        "mbit" => (1e6, true),
        "gbit" => (1e9, true),
        "bps" => (1.0, false),
        "kbps" => (1e3, false),
        "mbps" => (1e6, false),
        "gbps" => (1e9, false),
        _ => bail!("--rate {s:?}: expected a tc rate such as 1gbit, 500mbit or 10gbit"),
    };
    Ok(n * mult * if bits { 1.0 } else { 8.0 })
}

/// The namespaces and the shaped veth pairs between them. Dropping it removes them.
pub struct Link {
    pub spec: LinkSpec,
    /// Storage nodes (namespaces `storage`, `storage1`, ...), each with its own link.
    pub nodes: usize,
}

impl Link {
    /// Creates `host` and `nodes` storage namespaces, a veth pair from each to `host`,
    /// addresses and `tbf` qdiscs on both ends of every pair.
    pub fn create(spec: LinkSpec, nodes: usize) -> Result<Link> {
        if !(1..=MAX_STORAGE_NODES).contains(&nodes) {
            bail!("the lab makes 1 to {MAX_STORAGE_NODES} storage nodes, not {nodes}");
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            bail!(
                "the lab creates network namespaces and must run as root (sudo bench/lab/run.sh)"
            );
        }
        let namespaces: Vec<String> = (0..nodes)
            .map(storage_ns)
            .chain([HOST_NS.to_string()])
            .collect();
        for ns in &namespaces {
            if netns_exists(ns) {
                bail!(
                    "network namespace {ns:?} already exists (left by a lab that was killed?); \
                     remove it with `ip netns del {ns}` or run the lab with --cleanup"
                );
            }
        }
        let link = Link { spec, nodes };
        for ns in &namespaces {
            run("ip", &["netns", "add", ns])?;
            live(|l| l.namespaces.push(ns.clone()));
        }
        for i in 0..nodes {
            link.add_pair(i)?;
        }
        Ok(link)
    }

    /// The veth pair of storage node `i`, shaped at both ends.
    fn add_pair(&self, i: usize) -> Result<()> {
        let (st_dev, host_dev, host_ip) = pair(i);
        let (st_ns, st_ip) = (storage_ns(i), storage_ip(i));
        // Created in the host's root namespace, then moved: the pair is deleted with either
        // namespace.
        run(
            "ip",
            &[
                "link", "add", &st_dev, "type", "veth", "peer", "name", &host_dev,
            ],
        )?;
        let mtu = self.spec.mtu.to_string();
        let burst = self.spec.burst_bytes().to_string();
        for (ns, dev, ip) in [
            (&st_ns, &st_dev, &st_ip),
            (&HOST_NS.to_string(), &host_dev, &host_ip),
        ] {
            run("ip", &["link", "set", dev, "netns", ns])?;
            run(
                "ip",
                &["-n", ns, "addr", "add", &format!("{ip}/24"), "dev", dev],
            )?;
            run("ip", &["-n", ns, "link", "set", dev, "mtu", &mtu, "up"])?;
            run("ip", &["-n", ns, "link", "set", "lo", "up"])?;
            run(
                "tc",
                &[
                    "-n",
                    ns,
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    "root",
                    "tbf",
                    "rate",
                    &self.spec.rate,
                    "burst",
                    &burst,
                    "latency",
                    "20ms",
                ],
            )?;
        }
        Ok(())
    }

    /// Replaces the first storage node's egress shaping with an HTB tree that classifies by
    /// DSCP, standing in for a switch's queues: one class per `(dscp, share)` with `share` of
    /// the link as its guaranteed rate and the whole link as its ceiling, and a default class
    /// (`1:99`) for unmarked traffic. Class `1:1N` is the N-th of `classes`. A share of 0
    /// gives a class no guarantee (1 Mbit/s): the tree then only counts, and each class
    /// borrows up to the link.
    pub fn classify_by_dscp(&self, classes: &[(u8, f64)]) -> Result<()> {
        let (dev, ns) = (STORAGE_DEV, STORAGE_NS);
        let rate = self.spec.bytes_per_s() * 8.0;
        let burst = self.spec.burst_bytes().to_string();
        let bits = |b: f64| format!("{}bit", b.round() as u64);
        // Whatever is there (the tbf, or a tree of an earlier call) goes first: an HTB root
        // cannot be changed in place.
        let _ = Command::new("tc")
            .args(["-n", ns, "qdisc", "del", "dev", dev, "root"])
            .output();
        run(
            "tc",
            &[
                "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default",
                "99",
            ],
        )?;
        run(
            "tc",
            &[
                "-n",
                ns,
                "class",
                "add",
                "dev",
                dev,
                "parent",
                "1:",
                "classid",
                "1:1",
                "htb",
                "rate",
                &bits(rate),
                "ceil",
                &bits(rate),
                "burst",
                &burst,
            ],
        )?;
        for (i, (dscp, share)) in classes.iter().enumerate() {
            let id = format!("1:{}", 10 + i);
            let floor = if *share > 0.0 {
                bits(rate * share)
            } else {
                "1mbit".into()
            };
            htb_class(&id, &floor, &bits(rate), &burst)?;
            let tos = format!("0x{:02x}", u32::from(*dscp) << 2);
            run(
                "tc",
                &[
                    "-n", ns, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip",
                    "prio", "1", "u32", "match", "ip", "dsfield", &tos, "0xfc", "flowid", &id,
                ],
            )?;
        }
        htb_class("1:99", "1mbit", &bits(rate), &burst)?;
        Ok(())
    }

    /// Bytes each HTB class of [`Link::classify_by_dscp`] has sent: (class id, bytes), from
    /// `tc -s class show` (text: this iproute2 prints no JSON for classes).
    pub fn class_bytes(&self) -> Result<Vec<(String, u64)>> {
        let out = output(
            "tc",
            &["-n", STORAGE_NS, "-s", "class", "show", "dev", STORAGE_DEV],
        )?;
        Ok(parse_class_bytes(&String::from_utf8_lossy(&out)))
    }

    /// Bytes sent so far over all the links: (storage → host, host → storage).
    pub fn counters(&self) -> Result<(u64, u64)> {
        let (mut down, mut up) = (0, 0);
        for i in 0..self.nodes {
            let (st_dev, host_dev, _) = pair(i);
            down += tx_bytes(&storage_ns(i), &st_dev)?;
            up += tx_bytes(HOST_NS, &host_dev)?;
        }
        Ok((down, up))
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        undo_all();
    }
}

/// A class `id` under the storage node's HTB class `1:1`, guaranteed `rate`, borrowing up to
/// `ceil`.
fn htb_class(id: &str, rate: &str, ceil: &str, burst: &str) -> Result<()> {
    run(
        "tc",
        &[
            "-n",
            STORAGE_NS,
            "class",
            "add",
            "dev",
            STORAGE_DEV,
            "parent",
            "1:1",
            "classid",
            id,
            "htb",
            "rate",
            rate,
            "ceil",
            ceil,
            "burst",
            burst,
        ],
    )
}

/// `class htb 1:10 parent 1:1 ...` followed by ` Sent 123 bytes ...`: (class id, bytes).
fn parse_class_bytes(text: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut class: Option<String> = None;
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["class", _, id, ..] => class = Some(id.to_string()),
            ["Sent", n, "bytes", ..] => {
                if let (Some(c), Ok(n)) = (class.take(), n.parse()) {
                    out.push((c, n));
                }
            }
            _ => {}
        }
    }
    out
}

/// A veth end's transmitted bytes, from `ip -s -j link` (the kernel's device counters).
fn tx_bytes(ns: &str, dev: &str) -> Result<u64> {
    let out = output("ip", &["-n", ns, "-s", "-j", "link", "show", "dev", dev])
        .with_context(|| format!("reading {dev}'s counters in {ns}"))?;
    let v: serde_json::Value = serde_json::from_slice(&out)
        .with_context(|| format!("`ip -s -j link show dev {dev}` printed no JSON"))?;
    v[0]["stats64"]["tx"]["bytes"]
        .as_u64()
        .with_context(|| format!("no tx byte counter for {dev} in {ns}"))
}

/// An open handle on a namespace, for `setns`.
fn ns_fd(ns: &str) -> Result<OwnedFd> {
    let f = File::open(format!("/var/run/netns/{ns}"))
        .with_context(|| format!("network namespace {ns:?} is gone"))?;
    Ok(f.into())
}

/// A process the lab started in a namespace; killed and reaped on drop. Its stdout and
/// stderr are drained by threads from the start (a chatty server must never block on a full
/// pipe); stdout is kept whole, stderr's last 64 KiB.
pub struct NsChild {
    child: Child,
    stdout: Option<std::thread::JoinHandle<Vec<u8>>>,
    stderr: Option<std::thread::JoinHandle<Vec<u8>>>,
}

/// CPU seconds per thread id, with the thread's name.
pub type ThreadCpu = std::collections::HashMap<String, (String, f64)>;

/// A server process's resource use over a scenario run.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ProcStats {
    pub name: String,
    pub peak_rss: u64,
    /// User + system CPU of all its threads.
    pub cpu_s: f64,
    /// Name and CPU time of the thread that used the most.
    pub busiest_thread: String,
    pub busiest_cpu_s: f64,
}

/// Reads `r` to its end on a thread, keeping at most `keep` trailing bytes.
fn drain(
    mut r: impl std::io::Read + Send + 'static,
    keep: usize,
) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut buf = [0u8; 8192];
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 {
                break;
            }
            all.extend_from_slice(&buf[..n]);
            if all.len() > 2 * keep {
                all.drain(..all.len() - keep);
            }
        }
        if all.len() > keep {
            all.drain(..all.len() - keep);
        }
        all
    })
}

impl NsChild {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Peak RSS so far (`VmHWM`), in bytes.
    pub fn peak_rss(&self) -> Result<u64> {
        Ok(crate::procs::status_kib(self.pid(), "VmHWM")? * 1024)
    }

    /// Records the CPU time of each of its live threads into `threads` (by thread id): a
    /// server's per-session threads end with their session, so they are sampled while the
    /// consumer runs.
    pub fn sample_threads(&self, threads: &mut ThreadCpu) {
        let pid = self.pid();
        let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return;
        };
        for t in dir.flatten() {
            let tid = t.file_name().to_string_lossy().into_owned();
            let Ok(cpu) = crate::procs::proc_cpu_path(&format!("/proc/{pid}/task/{tid}/stat"))
            else {
                continue;
            };
            let e = threads.entry(tid.clone()).or_insert_with(|| {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
                    .unwrap_or_default();
                (comm.trim().to_string(), 0.0)
            });
            e.1 = e.1.max(cpu.as_secs_f64());
        }
    }

    /// Its peak RSS and CPU time so far, and the busiest thread seen by
    /// [`Self::sample_threads`]: tells whether a server was bound by one thread (a share
    /// near 100% of the wall time) or waited.
    pub fn stats(&self, name: &str, threads: &ThreadCpu) -> Result<ProcStats> {
        let (busiest_thread, busiest_cpu_s) = threads
            .values()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .cloned()
            .unwrap_or_default();
        Ok(ProcStats {
            name: name.to_string(),
            peak_rss: self.peak_rss()?,
            cpu_s: crate::procs::proc_cpu(self.pid())?.as_secs_f64(),
            busiest_thread,
            busiest_cpu_s,
        })
    }

    /// Whether the process is still running.
    /// SIGKILLs the process (a crash, as the failover run needs); [`NsChild::stop`] reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
    }

    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits for the process to exit by itself, at most `timeout` (then kills it); returns
    /// its exit success, stdout and the tail of its stderr.
    /// `tick` runs about every 50 ms meanwhile.
    pub fn finish(
        mut self,
        timeout: Duration,
        mut tick: impl FnMut(),
    ) -> Result<(bool, String, String)> {
        let start = Instant::now();
        let mut last_tick = start;
        let status = loop {
            if let Some(st) = self.child.try_wait()? {
                break Some(st);
            }
            if start.elapsed() > timeout {
                break None;
            }
            if last_tick.elapsed() >= Duration::from_millis(50) {
                tick();
                last_tick = Instant::now();
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let (out, err) = self.stop();
        match status {
            Some(st) => Ok((st.success(), out, err)),
            None => bail!("timed out after {timeout:?}; its stderr ends:\n{err}"),
        }
    }

    /// Kills the process (if still running), reaps it, and returns its output.
    pub fn stop(&mut self) -> (String, String) {
        let pid = self.pid();
        let _ = self.child.kill();
        let _ = self.child.wait();
        live(|l| l.pids.remove(&pid));
        let text = |h: Option<std::thread::JoinHandle<Vec<u8>>>| {
            h.and_then(|h| h.join().ok())
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default()
        };
        (text(self.stdout.take()), text(self.stderr.take()))
    }
}

impl Drop for NsChild {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts `cmd` inside namespace `ns`, with stdout and stderr captured.
pub fn spawn_in(ns: &str, mut cmd: Command, what: &str) -> Result<NsChild> {
    let fd = ns_fd(ns)?;
    let raw = fd.as_raw_fd();
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe
    // syscalls (prctl, setns) on an fd that stays open in the parent until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0
                || libc::setns(raw, libc::CLONE_NEWNET) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {what} in namespace {ns}"))?;
    drop(fd);
    live(|l| l.pids.insert(child.id()));
    let stdout = child.stdout.take().map(|o| drain(o, usize::MAX / 4));
    let stderr = child.stderr.take().map(|e| drain(e, 64 << 10));
    Ok(NsChild {
        child,
        stdout,
        stderr,
    })
}

/// Runs `f` on a thread that has joined namespace `ns` (sockets it opens live there): how the
/// lab probes servers inside the namespaces.
pub fn in_ns<R: Send + 'static>(ns: &str, f: impl FnOnce() -> R + Send + 'static) -> Result<R> {
    let fd = ns_fd(ns)?;
    let ns = ns.to_string();
    std::thread::spawn(move || -> Result<R> {
        // SAFETY: setns on this thread only; fd is a valid namespace handle.
        if unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            bail!("setns({ns}): {}", std::io::Error::last_os_error());
        }
        Ok(f())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("probe thread panicked"))?
}

/// Waits until something accepts TCP connections at `addr` inside `ns`.
pub fn wait_listening(ns: &str, addr: &str, timeout: Duration) -> Result<()> {
    let a: std::net::SocketAddr = addr.parse().context("probe address")?;
    let ok = in_ns(ns, move || {
        let t = Instant::now();
        while t.elapsed() < timeout {
            if std::net::TcpStream::connect_timeout(&a, Duration::from_millis(200)).is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    })?;
    if !ok {
        bail!("nothing listens on {addr} in namespace {ns} after {timeout:?}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_like_tc() {
        assert_eq!(parse_rate("1gbit").unwrap(), 1e9);
        assert_eq!(parse_rate("500mbit").unwrap(), 5e8);
        assert_eq!(parse_rate("2.5Gbit").unwrap(), 2.5e9);
        assert_eq!(parse_rate("125mbps").unwrap(), 1e9);
        assert_eq!(
            parse_rate("fast").unwrap_err().to_string(),
            "--rate \"fast\": expected a tc rate such as 1gbit, 500mbit or 10gbit"
        );
        assert_eq!(
            parse_rate("1gib").unwrap_err().to_string(),
            "--rate \"1gib\": expected a tc rate such as 1gbit, 500mbit or 10gbit"
        );
    }

    #[test]
    fn the_bucket_holds_a_gso_segment_and_two_ms() {
        assert_eq!(LinkSpec::new("1gbit", 1500).unwrap().burst_bytes(), 250_000);
        assert_eq!(
            LinkSpec::new("10mbit", 1500).unwrap().burst_bytes(),
            64 << 10
        );
    }
}
