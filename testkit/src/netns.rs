//! A network namespace joined to the test's by a veth pair, for tests of network faults.
//!
//! A process started in the namespace (`ip netns exec`, see
//! [`AgentProcess::start_in`](crate::process::AgentProcess::start_in)) is reached at
//! [`Netns::addr`]. [`Netns::partition`] takes the link down: packets in both directions
//! vanish, with no reset and no refusal, as when a switch or a cable fails; a connect then
//! times out and a call in flight hears nothing. [`Netns::heal`] brings it back. Dropping a
//! `Netns` deletes the pair and the namespace. Needs root and `ip` (iproute2); see
//! [`available`].

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Namespaces made by this process so far: names and subnets stay distinct.
static MADE: AtomicU32 = AtomicU32::new(0);

/// A namespace and its link (see the module docs).
pub struct Netns {
    /// The namespace's name, for `ip netns exec`.
    pub name: String,
    /// The address inside it, where its processes listen.
    pub addr: String,
    /// The veth end on this side.
    link: String,
    /// The end inside the namespace.
    peer: String,
}

/// Whether namespaces can be made here: root and `ip`. For [`crate::require`].
pub fn available() -> bool {
    let root = unsafe { libc::geteuid() } == 0;
    root && Command::new("ip")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs `ip ARGS`, panicking with its stderr when it fails.
fn ip(args: &[&str]) {
    let o = Command::new("ip").args(args).output().expect("running ip");
    assert!(
        o.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&o.stderr)
    );
}

impl Netns {
    /// A new namespace `dqt<pid>n<k>` with a /30 of its own: this side `.1`, the namespace
    /// `.2` (and its loopback up).
    pub fn new() -> Netns {
        let k = MADE.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let name = format!("dqt{pid}n{k}");
        // Interface names have at most 15 bytes.
        let (link, peer) = (
            format!("dqh{}x{k}", pid % 100_000),
            format!("dqp{}x{k}", pid % 100_000),
        );
        // 10.215.0.0/16 in /30s: 16,384 of them, by pid and count.
        let slot = (pid.wrapping_mul(64).wrapping_add(k)) % 16_384;
        let (b, c) = (slot * 4 / 256, slot * 4 % 256);
        let here = format!("10.215.{b}.{}", c + 1);
        let there = format!("10.215.{b}.{}", c + 2);
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        ip(&["netns", "add", &name]);
        let ns = Netns {
            name,
            addr: there.clone(),
            link,
            peer,
        };
        ip(&[
            "link", "add", &ns.link, "type", "veth", "peer", "name", &ns.peer,
        ]);
        ip(&["link", "set", &ns.peer, "netns", &ns.name]);
        ip(&["addr", "add", &format!("{here}/30"), "dev", &ns.link]);
        ip(&["link", "set", &ns.link, "up"]);
        ip(&[
            "-n",
            &ns.name,
            "addr",
            "add",
            &format!("{there}/30"),
            "dev",
            &ns.peer,
        ]);
        ip(&["-n", &ns.name, "link", "set", &ns.peer, "up"]);
        ip(&["-n", &ns.name, "link", "set", "lo", "up"]);
        ns
    }

    /// Takes the link down at the namespace's end: nothing passes either way until
    /// [`Netns::heal`]. This side keeps its route (a link without carrier), so what it sends
    /// is dropped in silence, not refused: a partition, not an unreachable host.
    pub fn partition(&self) {
        ip(&["-n", &self.name, "link", "set", &self.peer, "down"]);
    }

    /// Brings the link back up.
    pub fn heal(&self) {
        ip(&["-n", &self.name, "link", "set", &self.peer, "up"]);
    }
}

impl Default for Netns {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting one end deletes the pair; then the namespace.
        let _ = Command::new("ip")
            .args(["link", "del", &self.link])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}
