//! Processes and what they cost: the agent and sender child processes, CPU time from
//! `getrusage`/`wait4` and a process's CPU-time clock (a thread's from
//! `/proc/PID/task/TID/stat`), resident memory from `/proc/PID/status`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dquant_transport::frame::MAX_PAYLOAD;
use dquant_transport::{BufferPool, FrameKind, FrameReader, FrameWriter, PooledBuf};

/// An agent in a child process (this binary's hidden `agent` subcommand), serving one root
/// named `bench`. It lives until the parent closes its stdin (on drop).
pub struct AgentProc {
    child: Child,
    stdin: Option<ChildStdin>,
    pub uri: String,
    /// Its Unix socket (shared-memory clients), when asked for one; in a temp dir that
    /// lives as long as the agent.
    pub socket: Option<std::path::PathBuf>,
    _socket_dir: Option<tempfile::TempDir>,
}

impl AgentProc {
    pub fn spawn(root: &Path, prefetch_frames: usize, with_socket: bool) -> Result<Self> {
        Self::spawn_with(root, prefetch_frames, with_socket, None, None, &[])
    }

    /// [`AgentProc::spawn`] with more of the hidden `agent` subcommand's flags.
    pub fn spawn_flags(
        root: &Path,
        prefetch_frames: usize,
        with_socket: bool,
        flags: &[String],
    ) -> Result<Self> {
        Self::spawn_with(root, prefetch_frames, with_socket, None, None, flags)
    }

    /// [`AgentProc::spawn`] with a worker pool of `worker_threads` threads (the agent's
    /// default when `None`), and its other `flags`.
    pub fn spawn_working(
        root: &Path,
        prefetch_frames: usize,
        with_socket: bool,
        worker_threads: Option<usize>,
        flags: &[String],
    ) -> Result<Self> {
        Self::spawn_with(
            root,
            prefetch_frames,
            with_socket,
            None,
            worker_threads,
            flags,
        )
    }

    /// A host agent whose plans may chain to the agent at `upstream` (HOST:PORT).
    pub fn spawn_chained(
        root: &Path,
        prefetch_frames: usize,
        worker_threads: Option<usize>,
        upstream: &str,
    ) -> Result<Self> {
        let flags = ["--upstream".to_string(), upstream.to_string()];
        Self::spawn_with(root, prefetch_frames, false, None, worker_threads, &flags)
    }

    /// An agent serving TLS on both planes with this certificate and key.
    pub fn spawn_tls(root: &Path, prefetch_frames: usize, cert: &Path, key: &Path) -> Result<Self> {
        Self::spawn_with(root, prefetch_frames, false, Some((cert, key)), None, &[])
    }

    fn spawn_with(
        root: &Path,
        prefetch_frames: usize,
        with_socket: bool,
        tls: Option<(&Path, &Path)>,
        worker_threads: Option<usize>,
        flags: &[String],
    ) -> Result<Self> {
        let exe = std::env::current_exe().context("cannot find this executable")?;
        let socket_dir = with_socket.then(tempfile::tempdir).transpose()?;
        let socket = socket_dir.as_ref().map(|d| d.path().join("agent.sock"));
        let mut cmd = Command::new(exe);
        cmd.arg("agent")
            .arg("--root")
            .arg(format!("bench={}", root.display()))
            .arg("--prefetch-frames")
            .arg(prefetch_frames.to_string());
        if let Some(s) = &socket {
            cmd.arg("--socket").arg(s);
        }
        if let Some(n) = worker_threads {
            cmd.arg("--worker-threads").arg(n.to_string());
        }
        if let Some((cert, key)) = tls {
            cmd.arg("--tls-cert").arg(cert).arg("--tls-key").arg(key);
        }
        cmd.args(flags);
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("cannot start the agent process")?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("agent stdout")?;
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .context("reading the agent's URI")?;
        let uri = line.trim().to_string();
        let mut me = AgentProc {
            child,
            stdin,
            uri,
            socket,
            _socket_dir: socket_dir,
        };
        if !me.uri.starts_with("dquant://") {
            me.stop();
            bail!("the agent process did not print its URI (got {line:?})");
        }
        Ok(me)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn stop(&mut self) {
        // EOF on its stdin is the agent's signal to shut down.
        drop(self.stdin.take());
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The hidden `agent` subcommand: starts an agent with `cfg` and `roots` on loopback (ports
/// chosen by the kernel), prints its URI, serves until
/// stdin closes.
pub fn run_agent(roots: &[String], cfg: dquant_agent::AgentConfig) -> Result<()> {
    let mut cfg = dquant_agent::AgentConfig {
        listen: "127.0.0.1:0".parse()?,
        data_listen: Some("127.0.0.1:0".parse()?),
        ..cfg
    };
    for r in roots {
        let (name, dir) = r
            .split_once('=')
            .with_context(|| format!("--root {r:?}: expected NAME=DIR"))?;
        cfg.roots.insert(name.to_string(), dir.into());
    }
    let agent = dquant_agent::start(cfg)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", agent.uri())?;
    out.flush()?;
    drop(out);
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    agent.shutdown();
    Ok(())
}

/// How the baseline's sender writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SendMode {
    /// Plain `write_all` of 1 MiB buffers.
    Raw,
    /// dquant frames (`FrameWriter`: 32-byte header with crc32c, TCP_NODELAY) of 1 MiB
    /// payloads, from one thread.
    Framed,
    /// As `framed`, but a producer thread copies each payload into a pooled 1 MiB buffer and
    /// hands it to the sending thread over a bounded channel: the agent's session layout
    /// (`session.rs` `stream_plan`) with the plan work left out.
    Threaded,
}

/// The hidden `send` subcommand: the baselines' sender. Connects to `addr` and writes
/// `bytes` bytes from one in-memory buffer of `buf` bytes, as `mode` says.
pub fn run_sender(
    addr: SocketAddr,
    bytes: u64,
    buf: usize,
    mode: SendMode,
    prefetch: usize,
) -> Result<()> {
    let s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    // Not zeros, in case anything on the path is clever about them.
    let data: Vec<u8> = (0..buf).map(|i| (i * 7 + 3) as u8).collect();
    let chunks = move || {
        let mut left = bytes;
        std::iter::from_fn(move || {
            (left > 0).then(|| {
                let k = left.min(buf as u64) as usize;
                left -= k as u64;
                k
            })
        })
    };
    match mode {
        SendMode::Raw => {
            let mut s = s;
            for k in chunks() {
                s.write_all(&data[..k])?;
            }
            s.shutdown(std::net::Shutdown::Write)?;
        }
        SendMode::Framed => {
            s.set_nodelay(true)?;
            let mut w = FrameWriter::new(s);
            for k in chunks() {
                w.send(FrameKind::Data, &data[..k])?;
            }
            w.finish(&[])?;
        }
        SendMode::Threaded => {
            s.set_nodelay(true)?;
            let pool = BufferPool::new(prefetch, MAX_PAYLOAD);
            let (tx, rx) = std::sync::mpsc::sync_channel::<PooledBuf>(prefetch + 2);
            let producer = std::thread::spawn(move || {
                for k in chunks() {
                    let mut b = pool.get();
                    b.spare()[..k].copy_from_slice(&data[..k]);
                    b.set_len(k);
                    if tx.send(b).is_err() {
                        return;
                    }
                }
            });
            let mut w = FrameWriter::new(s);
            for b in rx.iter() {
                w.send(FrameKind::Data, &b)?;
            }
            w.finish(&[])?;
            let _ = producer.join();
        }
    }
    Ok(())
}

/// The baseline receiver for framed senders: `FrameReader` into a pooled 1 MiB buffer, then
/// a copy into a destination buffer, as `Reader::next_batch` does for a plain wire codec.
pub fn receive_frames(s: TcpStream) -> Result<u64> {
    let pool = BufferPool::new(1, MAX_PAYLOAD);
    let mut buf = pool.get();
    let mut dst = vec![0u8; MAX_PAYLOAD];
    let mut r = FrameReader::new(s);
    let mut n = 0u64;
    while r.next_into(&mut buf)? {
        dst[..buf.len()].copy_from_slice(&buf);
        n += buf.len() as u64;
    }
    std::hint::black_box(&dst);
    Ok(n)
}

/// Spawns this binary's `send` subcommand.
pub fn spawn_sender(addr: SocketAddr, bytes: u64, buf: usize, mode: SendMode) -> Result<Child> {
    let exe = std::env::current_exe().context("cannot find this executable")?;
    let mode = match mode {
        SendMode::Raw => "raw",
        SendMode::Framed => "framed",
        SendMode::Threaded => "threaded",
    };
    Command::new(exe)
        .arg("send")
        .arg("--addr")
        .arg(addr.to_string())
        .arg("--bytes")
        .arg(bytes.to_string())
        .arg("--buf")
        .arg(buf.to_string())
        .arg("--mode")
        .arg(mode)
        .stdin(Stdio::null())
        .spawn()
        .context("cannot start the sender process")
}

fn tv(t: libc::timeval) -> Duration {
    Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
}

/// Seconds on CLOCK_MONOTONIC, the clock `perf record -k CLOCK_MONOTONIC` stamps its samples
/// with: a run that prints its phases' times lets a profile be cut by phase.
pub fn monotonic_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// User + system CPU time of this whole process (all threads).
pub fn self_cpu() -> Duration {
    // SAFETY: getrusage writes into the struct we pass; RUSAGE_SELF is always valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Reaps `child` and returns its exit success and total CPU time (user + system).
pub fn wait_with_cpu(child: Child) -> Result<(bool, Duration)> {
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: wait4 on our own child; both out-pointers are valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    if r != pid {
        bail!("wait4({pid}): {}", std::io::Error::last_os_error());
    }
    // Child's own Drop does not wait, so reaping it here is safe.
    drop(child);
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    Ok((ok, tv(ru.ru_utime) + tv(ru.ru_stime)))
}

/// Minor page faults of process `pid` so far (all threads).
pub fn proc_minflt(pid: u32) -> Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = s
        .rsplit_once(") ")
        .map(|(_, r)| r)
        .context("/proc/PID/stat format")?;
    // minflt is field 10; the text after "(comm) " starts at field 3.
    Ok(rest
        .split_whitespace()
        .nth(7)
        .context("/proc/PID/stat is too short")?
        .parse()?)
}

/// Minor page faults of this process so far.
pub fn self_minflt() -> u64 {
    // SAFETY: getrusage writes into the struct we pass; RUSAGE_SELF is always valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    ru.ru_minflt as u64
}

/// User + system CPU time of process `pid` so far, all its threads (those that ended too), to
/// the nanosecond: its CPU-time clock (`clock_getcpuclockid`), the scheduler's own count.
/// `/proc/PID/stat` has the same time in 10 ms ticks, which the two readings around a 0.2 s
/// measurement turned into ±10% (the fan-out area's agent CPU ratios swung 1.14-1.47 between
/// recordings).
pub fn proc_cpu(pid: u32) -> Result<Duration> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: clock_getcpuclockid writes one clockid_t into `clock`, which we own.
    let rc = unsafe { libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock) };
    if rc != 0 {
        bail!(
            "no CPU clock for process {pid}: {}",
            std::io::Error::from_raw_os_error(rc)
        );
    }
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`, which we own.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        bail!(
            "the CPU clock of process {pid}: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// User + system CPU time from a `/proc/PID/stat` or `/proc/PID/task/TID/stat` file.
pub fn proc_cpu_path(path: &str) -> Result<Duration> {
    let s = std::fs::read_to_string(path)?;
    // Fields after "(comm) ": state is field 3; utime and stime are fields 14 and 15.
    let rest = s
        .rsplit_once(") ")
        .map(|(_, r)| r)
        .context("/proc/PID/stat format")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field =
        |i: usize| -> Result<u64> { Ok(f.get(i).context("/proc/PID/stat is too short")?.parse()?) };
    let ticks = field(11)? + field(12)?;
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Ok(Duration::from_secs_f64(ticks as f64 / hz as f64))
}

/// A `/proc/PID/status` field in KiB (`VmRSS`, `VmHWM`).
pub fn status_kib(pid: u32, field: &str) -> Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    for line in s.lines() {
        if let Some(v) = line.strip_prefix(field).and_then(|v| v.strip_prefix(':')) {
            let kb = v.trim().trim_end_matches("kB").trim();
            return Ok(kb.parse()?);
        }
    }
    bail!("/proc/{pid}/status has no {field}")
}

/// Drops this file's pages from the page cache (clean pages only; only this file).
pub fn drop_file_cache(path: &Path) -> Result<()> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let _ = f.sync_data();
    // SAFETY: a valid fd; fadvise only changes caching.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if r != 0 {
        bail!(
            "posix_fadvise({}): {}",
            path.display(),
            std::io::Error::from_raw_os_error(r)
        );
    }
    Ok(())
}

/// Reads a file once so its pages are in the page cache.
pub fn warm_file(path: &Path) -> Result<u64> {
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut buf = vec![0u8; 4 << 20];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf)?;
        if k == 0 {
            return Ok(n);
        }
        n += k as u64;
    }
}

/// The system's 1-minute load average.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread_cpu() -> Duration {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec into `ts`, which we own.
        assert_eq!(
            unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) },
            0
        );
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }

    /// A process's CPU clock counts a thread's time after the thread has ended, to well under
    /// a clock tick of getrusage's figure for the same process.
    #[test]
    fn a_process_cpu_clock_counts_ended_threads_and_matches_getrusage() {
        let pid = std::process::id();
        let before = proc_cpu(pid).unwrap();
        // The thread spins until it has had 150 ms of CPU (by its own clock), however busy
        // the machine is.
        std::thread::spawn(|| {
            let mut x = 0u64;
            while thread_cpu() < Duration::from_millis(150) {
                for _ in 0..10_000 {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                }
            }
        })
        .join()
        .unwrap();
        let (clock, rusage) = (proc_cpu(pid).unwrap(), self_cpu());
        assert!(
            clock - before >= Duration::from_millis(140),
            "{:?}",
            clock - before
        );
        let gap = clock.abs_diff(rusage);
        assert!(
            gap < Duration::from_millis(5),
            "clock {clock:?}, getrusage {rusage:?}"
        );
        // A process that is gone (reaped) has no clock.
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        gone.wait().unwrap();
        assert!(proc_cpu(gone.id()).is_err());
    }
}
