//! `dquant serve` as a child process, and the signals tests send to their children: for tests
//! that kill, stop or stall an agent the way an operator or a crash would.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A `dquant serve` process on ephemeral ports (loopback, or a namespace's address); killed
/// when dropped. Its stderr (the agent's log) is collected for [`AgentProcess::log`] and for
/// panic messages.
pub struct AgentProcess {
    pub child: Child,
    /// `dquant://HOST:PORT`, from the agent's listening line.
    pub uri: String,
    /// The data plane's `HOST:PORT`.
    pub data: String,
    log: Arc<Mutex<String>>,
}

impl AgentProcess {
    /// Starts `BIN serve` (`bin`: the `dquant` binary, `env!("CARGO_BIN_EXE_dquant")` in the
    /// CLI's tests) on ephemeral loopback ports with `args` and waits for its listening line.
    pub fn start(bin: impl AsRef<OsStr>, args: &[&str]) -> AgentProcess {
        Self::start_on(bin, "127.0.0.1:0", "127.0.0.1:0", args)
    }

    /// Starts `BIN serve` on the given control and data addresses: how a test restarts an
    /// agent where its clients knew it.
    pub fn start_on(
        bin: impl AsRef<OsStr>,
        listen: &str,
        data: &str,
        args: &[&str],
    ) -> AgentProcess {
        Self::spawn(Command::new(bin), listen, data, args)
    }

    /// Starts `BIN serve` inside network namespace `ns` (`ip netns exec`, which becomes the
    /// agent itself), on `ns`'s address at ephemeral ports.
    pub fn start_in(
        ns: &crate::netns::Netns,
        bin: impl AsRef<OsStr>,
        args: &[&str],
    ) -> AgentProcess {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &ns.name]).arg(bin);
        let any_port = format!("{}:0", ns.addr);
        Self::spawn(c, &any_port, &any_port, args)
    }

    /// Starts `command serve ...` (see [`AgentProcess::start_on`]).
    fn spawn(mut command: Command, listen: &str, data: &str, args: &[&str]) -> AgentProcess {
        let host = listen.rsplit_once(':').map_or("", |(h, _)| h).to_string();
        let mut child = command
            .args(["serve", "--listen", listen, "--data-listen", data])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Keep draining stderr (the agent logs every session) so the pipe never fills.
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.strip_prefix("dquant agent listening: ") {
                    let _ = tx.send(rest.to_string());
                }
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let mut agent = AgentProcess {
            child,
            uri: String::new(),
            data: String::new(),
            log,
        };
        let line = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => line,
            Err(_) => panic!("the agent did not say it listens:\n{}", agent.log()),
        };
        // uri=dquant://127.0.0.1:PORT control=... data=... roots=...
        let field = |k: &str| {
            line.split(' ')
                .find_map(|f| f.strip_prefix(k))
                .unwrap_or_else(|| panic!("no {k} in {line:?}"))
                .to_string()
        };
        agent.uri = field("uri=");
        assert_eq!(agent.uri, format!("dquant://{}", field("control=")));
        assert!(field("data=").starts_with(&format!("{host}:")), "{line}");
        agent.data = field("data=");
        agent
    }

    /// The agent's log so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits until the agent's log contains `what` (true) or `timeout` passes (false).
    pub fn wait_log(&self, what: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.log().contains(what) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Panics, with the log, if the agent has exited.
    pub fn assert_running(&mut self) {
        assert!(
            self.child.try_wait().unwrap().is_none(),
            "the agent exited:\n{}",
            self.log()
        );
    }

    /// Sends `sig` (`libc::SIGSTOP`, `SIGCONT`, `SIGKILL`, …) to the agent process.
    pub fn signal(&self, sig: libc::c_int) {
        kill(self.child.id(), sig).unwrap_or_else(|e| panic!("kill({sig}): {e}"));
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `sig` to process `pid` (one of our children). `Child::kill` only sends SIGKILL; this
/// also stops and continues, and works from a thread that holds only the pid.
pub fn kill(pid: u32, sig: libc::c_int) -> std::io::Result<()> {
    // SAFETY: plain kill(2); no memory is passed.
    match unsafe { libc::kill(pid as libc::pid_t, sig) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Starts `client` (a reader of `agent`, such as `dquant read PLAN --agent ADDR`) with its
/// stdout a pipe nobody reads, so it stalls with its session mid-stream; once the agent logs
/// `started`, kills it, and waits for the agent to log `ended`: how a test checks that a
/// client that dies mid-stream leaves the agent serving.
pub fn kill_stalled_reader(agent: &AgentProcess, client: &mut Command, started: &str, ended: &str) {
    let mut client = client
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        agent.wait_log(started, Duration::from_secs(30)),
        "no session started ({started:?}):\n{}",
        agent.log()
    );
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        client.try_wait().unwrap().is_none(),
        "the client finished already"
    );
    client.kill().unwrap();
    client.wait().unwrap();
    assert!(
        agent.wait_log(ended, Duration::from_secs(30)),
        "the agent did not end the killed client's session:\n{}",
        agent.log()
    );
}
