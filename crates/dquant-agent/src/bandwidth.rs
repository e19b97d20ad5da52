//! Tenant bandwidth guarantees on one agent's link: who may send how much, when.
//!
//! One storage agent and its link serve many training jobs, and a greedy job would otherwise
//! take whatever it can get. Parfait gives each tenant of a shared fabric a guaranteed rate;
//! here every data-plane frame of every session passes through one [`Scheduler`] before it
//! is written. The rule, for the tenants that are *backlogged* (a sender waited within the
//! last [`IDLE`]):
//!
//! ```text
//! rate(t) = guarantee(t) + (link − Σ guarantee(backlogged)) × weight(t) / Σ weight(backlogged)
//! ```
//!
//! so floors hold under contention and the capacity an idle tenant leaves is shared by weight
//! (work-conserving), within [`IDLE`] of its going quiet. Each tenant's bytes come out of a
//! token bucket filled at that rate and capped at [`BURST`] of it; the sessions of one tenant
//! draw on the same bucket, so they share its allocation. A tenant without a guarantee has a
//! floor of 0 and still gets its weight's share of what is left.
//!
//! The scheduler does no I/O and reads no clock: callers pass the time, so the tests below
//! drive it with simulated time, as quinn-proto's are driven.

use std::time::{Duration, Instant};

/// A tenant that asked for nothing this long is idle: its share goes to the others.
pub const IDLE: Duration = Duration::from_millis(50);
/// The most a bucket holds: this long at its tenant's rate (a burst after a pause).
pub const BURST: Duration = Duration::from_millis(20);
/// What a tenant's achieved rate is measured over.
pub const RATE_WINDOW: Duration = Duration::from_secs(1);

/// One tenant's share of the link, as the config gives it.
#[derive(Clone, Debug, PartialEq)]
pub struct Share {
    pub tenant: String,
    /// Bytes per second this tenant gets whenever it wants them.
    pub guarantee: u64,
    /// Its part of the capacity nobody's guarantee claims.
    pub weight: u32,
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum ShareError {
    /// The guarantees add up to more than the link carries.
    #[error("tenant guarantees add up to {total} B/s ({parts}) but the link carries {link} B/s (bandwidth.link_bytes_per_s); lower a guarantee or declare the link's real rate")]
    Oversubscribed {
        total: u64,
        parts: String,
        link: u64,
    },
    #[error("tenant {0:?}: weight must be at least 1")]
    ZeroWeight(String),
}

#[derive(Debug)]
struct Tenant {
    share: Share,
    /// Bytes it may send now.
    bucket: f64,
    /// When a sender of it last asked and had to wait, or sent.
    asked: Option<Instant>,
    /// Bytes sent since the window's start; the rate of the last whole window.
    window: (Instant, u64),
    achieved: f64,
}

/// The link's allocation among tenants; see the module docs.
#[derive(Debug)]
pub struct Scheduler {
    link: u64,
    tenants: Vec<Tenant>,
    /// The time the buckets were last filled up to.
    at: Instant,
}

impl Scheduler {
    /// Whether `shares` fit a link of `link` bytes/s: weights of at least 1, guarantees that
    /// add up to no more than the link (else the arithmetic, in the error).
    pub fn check(link: u64, shares: &[Share]) -> Result<(), ShareError> {
        if let Some(s) = shares.iter().find(|s| s.weight == 0) {
            return Err(ShareError::ZeroWeight(s.tenant.clone()));
        }
        let total: u64 = shares.iter().map(|s| s.guarantee).sum();
        if total > link {
            let parts = shares
                .iter()
                .filter(|s| s.guarantee > 0)
                .map(|s| format!("{} {}", s.tenant, s.guarantee))
                .collect::<Vec<_>>()
                .join(" + ");
            return Err(ShareError::Oversubscribed { total, parts, link });
        }
        Ok(())
    }

    /// A scheduler for a link of `link` bytes/s; refuses guarantees that do not fit it.
    pub fn new(link: u64, shares: Vec<Share>, now: Instant) -> Result<Self, ShareError> {
        Self::check(link, &shares)?;
        let tenants = shares
            .into_iter()
            .map(|share| Tenant {
                share,
                bucket: 0.0,
                asked: None,
                window: (now, 0),
                achieved: 0.0,
            })
            .collect();
        Ok(Scheduler {
            link,
            tenants,
            at: now,
        })
    }

    /// The index of `tenant`, if the scheduler knows it.
    pub fn tenant(&self, name: &str) -> Option<usize> {
        self.tenants.iter().position(|t| t.share.tenant == name)
    }

    fn backlogged(&self, i: usize, now: Instant) -> bool {
        self.tenants[i]
            .asked
            .is_some_and(|a| now.saturating_duration_since(a) < IDLE)
    }

    /// Each tenant's rate now, bytes/s: the rule of the module docs for backlogged tenants,
    /// the guarantee alone for idle ones (what they may burst at when they come back).
    pub fn rates(&self, now: Instant) -> Vec<f64> {
        let busy: Vec<bool> = (0..self.tenants.len())
            .map(|i| self.backlogged(i, now))
            .collect();
        let floors: u64 = self
            .tenants
            .iter()
            .zip(&busy)
            .filter(|(_, b)| **b)
            .map(|(t, _)| t.share.guarantee)
            .sum();
        let weights: u64 = self
            .tenants
            .iter()
            .zip(&busy)
            .filter(|(_, b)| **b)
            .map(|(t, _)| u64::from(t.share.weight))
            .sum();
        let spare = self.link.saturating_sub(floors) as f64;
        self.tenants
            .iter()
            .zip(&busy)
            .map(|(t, &b)| match b {
                true => {
                    t.share.guarantee as f64 + spare * f64::from(t.share.weight) / weights as f64
                }
                false => t.share.guarantee as f64,
            })
            .collect()
    }

    /// Fills every bucket for the time since the last call, at the rates of that time.
    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        if dt <= 0.0 {
            return;
        }
        let rates = self.rates(self.at);
        for (t, r) in self.tenants.iter_mut().zip(rates) {
            t.bucket = (t.bucket + r * dt).min(r * BURST.as_secs_f64());
        }
        self.at = now;
    }

    /// A sender of tenant `i` wants to send `bytes` at `now`: `Ok` when it may (its bucket
    /// pays), else how long until it should ask again. A frame larger than the bucket's cap
    /// is let through once the bucket is full, leaving it in debt.
    pub fn try_send(&mut self, i: usize, bytes: u64, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        let cap = self.rates(now)[i] * BURST.as_secs_f64();
        let t = &mut self.tenants[i];
        t.asked = Some(now);
        let need = (bytes as f64).min(cap.max(1.0));
        if t.bucket >= need {
            t.bucket -= bytes as f64;
            t.window.1 += bytes;
            let span = now.saturating_duration_since(t.window.0);
            if span >= RATE_WINDOW {
                t.achieved = t.window.1 as f64 / span.as_secs_f64();
                t.window = (now, 0);
            }
            return Ok(());
        }
        // The rate it will have now that it is backlogged.
        let rate = self.rates(now)[i].max(1.0);
        let t = &self.tenants[i];
        let wait = (need - t.bucket) / rate;
        Err(Duration::from_secs_f64(wait).max(Duration::from_micros(50)))
    }

    /// Tenant `i`'s achieved rate over its last whole [`RATE_WINDOW`], bytes/s.
    pub fn achieved(&self, i: usize) -> f64 {
        self.tenants[i].achieved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1_000_000;
    const FRAME: u64 = 64 * 1024;
    /// A sender that sends for the whole simulation.
    const ALWAYS: &[(f64, f64)] = &[(0.0, 9.0)];

    fn share(tenant: &str, guarantee: u64, weight: u32) -> Share {
        Share {
            tenant: tenant.into(),
            guarantee,
            weight,
        }
    }

    /// Simulated senders: tenant `i` sends frames back to back while the clock is in one of
    /// its windows `greedy[i]` (from, to seconds). Returns bytes sent per tenant per 100 ms
    /// slot.
    fn simulate(
        s: &mut Scheduler,
        t0: Instant,
        secs: f64,
        greedy: &[&[(f64, f64)]],
    ) -> Vec<Vec<u64>> {
        let slots = (secs * 10.0).round() as usize;
        let mut sent = vec![vec![0u64; slots]; greedy.len()];
        // Each sender's next attempt; a 0.1 ms tick.
        let mut next = vec![t0; greedy.len()];
        let tick = Duration::from_micros(100);
        let mut now = t0;
        while (now - t0).as_secs_f64() < secs {
            for (i, windows) in greedy.iter().enumerate() {
                let at = (now - t0).as_secs_f64();
                let on = windows.iter().any(|&(from, to)| at >= from && at < to);
                if !on || now < next[i] {
                    continue;
                }
                match s.try_send(i, FRAME, now) {
                    Ok(()) => sent[i][(at * 10.0) as usize] += FRAME,
                    Err(d) => next[i] = now + d,
                }
            }
            now += tick;
        }
        sent
    }

    /// MB/s of tenant `i` over slots `a..b`.
    fn mb(sent: &[Vec<u64>], i: usize, a: usize, b: usize) -> f64 {
        sent[i][a..b].iter().sum::<u64>() as f64 / ((b - a) as f64 / 10.0) / MB as f64
    }

    /// A 100 MB/s link with tenants a, b and c guaranteed 50, 30 and 20 MB/s.
    fn fifty_thirty_twenty(t0: Instant) -> Scheduler {
        let shares = vec![
            share("a", 50 * MB, 1),
            share("b", 30 * MB, 1),
            share("c", 20 * MB, 1),
        ];
        Scheduler::new(100 * MB, shares, t0).unwrap()
    }

    #[test]
    fn floors_hold_and_the_rest_goes_by_weight() {
        let t0 = Instant::now();
        let link = 100 * MB;
        let mut s = fifty_thirty_twenty(t0);
        let sent = simulate(&mut s, t0, 3.0, &[ALWAYS; 3]);
        for (i, g) in [50.0, 30.0, 20.0].into_iter().enumerate() {
            let r = mb(&sent, i, 5, 30);
            assert!(
                r >= 0.95 * g && r <= 1.05 * g,
                "tenant {i}: {r:.1} MB/s, guarantee {g}"
            );
        }
        // Unequal weights share what nobody's guarantee claims.
        let mut s = Scheduler::new(
            link,
            vec![share("a", 20 * MB, 3), share("b", 20 * MB, 1)],
            t0,
        )
        .unwrap();
        let sent = simulate(&mut s, t0, 2.0, &[ALWAYS; 2]);
        let (a, b) = (mb(&sent, 0, 5, 20), mb(&sent, 1, 5, 20));
        assert!(
            (a - 65.0).abs() < 3.5 && (b - 35.0).abs() < 2.0,
            "a {a:.1}, b {b:.1}"
        );
    }

    #[test]
    fn an_idle_tenants_share_is_absorbed_and_given_back() {
        let t0 = Instant::now();
        let mut s = fifty_thirty_twenty(t0);
        // a sends 0..1 s and from 2 s on; b and c throughout.
        let sent = simulate(
            &mut s,
            t0,
            3.0,
            &[&[(0.0, 1.0), (2.0, 9.0)], &[(0.0, 9.0)], &[(0.0, 9.0)]],
        );
        // While a is away (from 0.1 s after it stops), b and c share its 50: 30 + 25, 20 + 25.
        let (b, c) = (mb(&sent, 1, 11, 20), mb(&sent, 2, 11, 20));
        assert!(
            (b - 55.0).abs() < 3.0 && (c - 45.0).abs() < 3.0,
            "b {b:.1}, c {c:.1}"
        );
        // Work-conserving: the link stays full.
        let total: f64 = (0..3).map(|i| mb(&sent, i, 11, 20)).sum();
        assert!(total > 97.0 && total < 103.0, "total {total:.1}");
        // Back, a has its floor again within the first 100 ms.
        let a = mb(&sent, 0, 21, 30);
        assert!(a >= 0.95 * 50.0, "a back: {a:.1}");
    }

    #[test]
    fn a_tenant_joining_gets_its_floor_at_once() {
        let t0 = Instant::now();
        let mut s = Scheduler::new(
            100 * MB,
            vec![share("a", 10 * MB, 1), share("b", 60 * MB, 1)],
            t0,
        )
        .unwrap();
        let sent = simulate(&mut s, t0, 2.0, &[&[(0.0, 9.0)], &[(1.0, 9.0)]]);
        let a_alone = mb(&sent, 0, 2, 10);
        assert!((a_alone - 100.0).abs() < 3.0, "a alone: {a_alone:.1}");
        // From b's first 100 ms on: b at 60 + 15, a at 10 + 15.
        let (a, b) = (mb(&sent, 0, 11, 20), mb(&sent, 1, 11, 20));
        assert!(
            (a - 25.0).abs() < 2.0 && (b - 75.0).abs() < 3.0,
            "a {a:.1}, b {b:.1}"
        );
    }

    #[test]
    fn sessions_of_one_tenant_share_its_bucket() {
        let t0 = Instant::now();
        let mut s = Scheduler::new(
            100 * MB,
            vec![share("a", 50 * MB, 1), share("b", 50 * MB, 1)],
            t0,
        )
        .unwrap();
        // Two senders of tenant a (index 0 twice) against one of b.
        let tick = Duration::from_micros(100);
        let (mut now, mut next) = (t0, [t0; 3]);
        let mut sent = [0u64; 3];
        let owner = [0usize, 0, 1];
        while now - t0 < Duration::from_secs(2) {
            for k in 0..3 {
                if now >= next[k] {
                    match s.try_send(owner[k], FRAME, now) {
                        Ok(()) if now - t0 > Duration::from_millis(500) => sent[k] += FRAME,
                        Ok(()) => {}
                        Err(d) => next[k] = now + d,
                    }
                }
            }
            now += tick;
        }
        let a = (sent[0] + sent[1]) as f64 / 1.5 / MB as f64;
        let b = sent[2] as f64 / 1.5 / MB as f64;
        assert!(
            (a - 50.0).abs() < 2.5 && (b - 50.0).abs() < 2.5,
            "a {a:.1}, b {b:.1}"
        );
    }

    #[test]
    fn guarantees_that_do_not_fit_are_refused_with_the_arithmetic() {
        let t0 = Instant::now();
        let err = Scheduler::new(
            100 * MB,
            vec![
                share("a", 60 * MB, 1),
                share("b", 50 * MB, 1),
                share("c", 0, 1),
            ],
            t0,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "tenant guarantees add up to 110000000 B/s (a 60000000 + b 50000000) but the link \
             carries 100000000 B/s (bandwidth.link_bytes_per_s); lower a guarantee or declare \
             the link's real rate"
        );
        let err = Scheduler::new(100, vec![share("z", 0, 0)], t0).unwrap_err();
        assert_eq!(err.to_string(), "tenant \"z\": weight must be at least 1");
    }
}
