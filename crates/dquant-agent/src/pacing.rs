//! The agent's side of bandwidth sharing: every data connection's frames wait for their
//! tenant's turn in the one [`Scheduler`] (see [`crate::bandwidth`] for the rule), and every
//! data socket carries its tenant's traffic class in its IP header (DSCP), so that switch
//! queues configured for those classes hold the guarantees beyond this host too.
//!
//! Shared-memory rings are not paced: they do not cross the link.

use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dquant_transport::Pacer;
use metrics::{Counter, Gauge};

use crate::bandwidth::Scheduler;
use crate::config::AgentConfig;
use crate::config_error::ConfigError;
use crate::metrics::Metrics;

/// The scheduler and what each tenant's sockets are marked with.
pub(crate) struct Shaping {
    sched: Mutex<Scheduler>,
    /// (tenant, DSCP) for the tenants with a class.
    dscp: Vec<(String, u8)>,
    /// Per tenant, in the scheduler's order: bytes, time throttled, achieved rate.
    meters: Vec<(Counter, Counter, Gauge)>,
}

impl Shaping {
    /// The shaping `config` asks for (`[bandwidth]`), or `None` without it. The config was
    /// validated, so its shares fit.
    pub fn new(config: &AgentConfig, metrics: &Metrics) -> Result<Option<Arc<Self>>, ConfigError> {
        let Some(b) = &config.bandwidth else {
            return Ok(None);
        };
        let shares = b.shares(&config.tenants)?;
        let dscp = shares
            .iter()
            .filter_map(|s| {
                b.dscp_of(&config.tenants, &s.tenant)
                    .map(|d| (s.tenant.clone(), d))
            })
            .collect();
        let meters = shares
            .iter()
            .map(|s| metrics.tenant_meters(&s.tenant))
            .collect();
        let sched = Scheduler::new(b.link_bytes_per_s, shares, Instant::now())?;
        Ok(Some(Arc::new(Shaping {
            sched: Mutex::new(sched),
            dscp,
            meters,
        })))
    }

    /// The pacer for one data connection of `tenant` (`None` for a tenant the scheduler does
    /// not know, which cannot happen for an authenticated one).
    pub fn pacer(self: &Arc<Self>, tenant: &str) -> Option<Box<dyn Pacer>> {
        let i = self.lock().tenant(tenant)?;
        Some(Box::new(TenantPacer {
            shaping: self.clone(),
            tenant: i,
        }))
    }

    /// Marks `sock` with `tenant`'s traffic class, if it has one.
    pub fn mark(&self, tenant: &str, sock: &TcpStream) -> std::io::Result<()> {
        match self.dscp.iter().find(|(t, _)| t == tenant) {
            Some((_, dscp)) => mark(sock, *dscp),
            None => Ok(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Scheduler> {
        self.sched.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Sets the DSCP of `sock`'s packets: the top six bits of the IPv4 TOS byte or the IPv6
/// traffic class.
pub(crate) fn mark(sock: &TcpStream, dscp: u8) -> std::io::Result<()> {
    let s = socket2::SockRef::from(sock);
    let tos = u32::from(dscp) << 2;
    match sock.local_addr()? {
        std::net::SocketAddr::V4(_) => s.set_tos_v4(tos),
        std::net::SocketAddr::V6(_) => s.set_tclass_v6(tos),
    }
}

/// One connection's frames, paced by its tenant's share.
struct TenantPacer {
    shaping: Arc<Shaping>,
    tenant: usize,
}

/// The longest a waiting sender sleeps before asking again (its turn may come earlier when
/// others go idle).
const MAX_NAP: Duration = Duration::from_millis(5);

impl Pacer for TenantPacer {
    fn pace(&mut self, bytes: usize) {
        let started = Instant::now();
        loop {
            let r = self
                .shaping
                .lock()
                .try_send(self.tenant, bytes as u64, Instant::now());
            match r {
                Ok(()) => break,
                Err(wait) => std::thread::sleep(wait.min(MAX_NAP)),
            }
        }
        let (sent, throttled, rate) = &self.shaping.meters[self.tenant];
        sent.increment(bytes as u64);
        throttled.increment(started.elapsed().as_micros() as u64);
        rate.set(self.shaping.lock().achieved(self.tenant));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A connected pair on `addr` (the accepted side first).
    fn pair(addr: &str) -> Option<(TcpStream, TcpStream)> {
        let l = TcpListener::bind(addr).ok()?;
        let c = TcpStream::connect(l.local_addr().ok()?).ok()?;
        Some((l.accept().ok()?.0, c))
    }

    #[test]
    fn marks_read_back_with_getsockopt() {
        let (s, _c) = pair("127.0.0.1:0").unwrap();
        mark(&s, 46).unwrap();
        assert_eq!(socket2::SockRef::from(&s).tos_v4().unwrap(), 46 << 2);
        mark(&s, 10).unwrap();
        assert_eq!(socket2::SockRef::from(&s).tos_v4().unwrap(), 10 << 2);
        let v6 = pair("[::1]:0");
        if dquant_testkit::require(
            "an IPv6 loopback (::1)",
            v6.is_some(),
            "the IPv6 traffic-class check",
        ) {
            let (s, _c) = v6.unwrap();
            mark(&s, 34).unwrap();
            assert_eq!(socket2::SockRef::from(&s).tclass_v6().unwrap(), 34 << 2);
        }
    }
}
