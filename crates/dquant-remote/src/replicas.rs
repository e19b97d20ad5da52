//! One dataset held by several storage agents: reads spread across them, and moved to the
//! others when one dies or stalls, with nothing lost.
//!
//! # Why a source of its own
//! A plan source `dquant://HOST1:PORT,HOST2:PORT/ROOT/PATH` names replicas: agents that
//! serve identical copies of a dataset. Token ranges are idempotent (a range read twice, from
//! either replica, is the same tokens), so a read that fails on one replica can simply be
//! asked again of another: the consumer sees no error and the stream stays byte-identical
//! to an uninterrupted one. Only when every replica stays gone does the read fail, and the
//! consumer resumes from its cursor like after any other failure.
//!
//! # Spreading reads
//! Sequential reads keep a readahead window (the same [`Window`] a single agent's source
//! uses) whose chunks are asked round-robin of the live replicas, so every replica's link
//! carries part of one sequential stream. Jumping reads (a shuffled batch) are split into one
//! request per live replica, all sent before any answer is read.
//!
//! # Identical data
//! A replica is used only once it matches the first one opened: tokens, documents, the
//! maximum token and the content checksum where both agents know them, and the tokens of a
//! few probe ranges spread over the dataset. A mismatch at open fails the open with both
//! sides of the difference; a replica coming back with other data stays out, with that
//! error.
//!
//! # Coming back
//! A replica that failed is retried after a back-off (1 s, doubling to 30 s, jittered) on a
//! thread of its own, so a reader never waits on a dead host's connect timeout; once it opens
//! and matches, reads use it again. While no replica is up, a read does not fail at once: it
//! waits up to the source's timeout (`upstream_timeout_secs` on an agent) per read, trying
//! the replicas again within 50 ms of their failure, doubling to a second, and goes on as soon
//! as one is back. Only a read with no replica answering for that whole time fails. An open
//! that finds no replica up waits the same way.

use std::ops::Range;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use dquant_proto::v1::{DatasetStat, StatRequest};
use dquant_storage::{check_ranges, SourceError, TokenSource};
use dquant_transport::record::MAX_REQUEST_RANGES;

mod health;

use crate::control::{Control, Credentials};
use crate::range_stream::RangeStream;
use crate::readahead::{read_ahead, ReadaheadConfig, Sequence, Served, Streams, Window};
use crate::source::RemoteSource;
use health::Health;

/// Probe ranges compared between replicas at open, of [`PROBE_TOKENS`] each.
const PROBES: u64 = 8;
const PROBE_TOKENS: u64 = 32;

/// How a replica is opened: everything but its address.
#[derive(Clone)]
struct Opener {
    dataset: StatRequest,
    wire_codec: String,
    timeout: Duration,
    creds: Credentials,
}

impl Opener {
    fn open(&self, authority: &str) -> Result<RemoteSource, SourceError> {
        let c = Control::connect_with(authority, self.timeout, &self.creds)?;
        let mut s = RemoteSource::open(c, self.dataset.clone(), &self.wire_codec)?;
        s.set_readahead(ReadaheadConfig::OFF);
        Ok(s)
    }
}

/// What every replica must match: the first replica's stat and probe tokens.
struct Reference {
    authority: String,
    stat: DatasetStat,
    probes: Vec<(Range<u64>, Vec<u32>)>,
}

/// The probe ranges of a dataset of `tokens` tokens: spread evenly, first and last included.
fn probe_ranges(tokens: u64) -> Vec<Range<u64>> {
    let len = PROBE_TOKENS.min(tokens);
    if len == 0 {
        return Vec::new();
    }
    let mut starts: Vec<u64> = (0..PROBES)
        .map(|i| (tokens - len) * i / (PROBES - 1))
        .collect();
    starts.dedup();
    starts.into_iter().map(|s| s..s + len).collect()
}

/// Reads `ranges` stop-and-wait on `s`.
fn read_probes(s: &mut RangeStream, ranges: &[Range<u64>]) -> Result<Vec<Vec<u32>>, SourceError> {
    let pairs: Vec<(u64, u64)> = ranges.iter().map(|r| (r.start, r.end - r.start)).collect();
    s.send(&pairs)?;
    ranges
        .iter()
        .map(|r| {
            let mut out = vec![0u32; (r.end - r.start) as usize];
            s.recv(r.start, r.end - r.start, Some(&mut out))?;
            Ok(out)
        })
        .collect()
}

impl Reference {
    fn of(authority: &str, src: &mut RemoteSource) -> Result<Self, SourceError> {
        let ranges = probe_ranges(src.stat.tokens);
        let tokens = read_probes(&mut src.stream, &ranges)?;
        Ok(Reference {
            authority: authority.to_string(),
            stat: src.stat.clone(),
            probes: ranges.into_iter().zip(tokens).collect(),
        })
    }

    /// Whether `src` (at `authority`) holds the reference's data: [`Check::Differs`] says
    /// why not, [`Check::Failed`] that the replica failed while being checked.
    fn mismatch(&self, authority: &str, src: &mut RemoteSource) -> Result<(), Check> {
        let (a, b) = (&self.stat, &src.stat);
        let refuse = |what: String| {
            SourceError::Agent(format!(
                "replica {authority} of {} holds other data than replica {}: {what}; every \
                 replica must serve the same dataset",
                self.stat.dataset, self.authority
            ))
        };
        let differs = |what: &str, x: &dyn std::fmt::Display, y: &dyn std::fmt::Display| {
            refuse(format!(
                "{what} {x} on {}, {y} on {authority}",
                self.authority
            ))
        };
        if a.tokens != b.tokens {
            return Err(Check::Differs(differs("tokens", &a.tokens, &b.tokens)));
        }
        if a.documents != 0 && b.documents != 0 && a.documents != b.documents {
            return Err(Check::Differs(differs(
                "documents",
                &a.documents,
                &b.documents,
            )));
        }
        if let (Some(x), Some(y)) = (a.stored_max_token, b.stored_max_token) {
            if x != y {
                return Err(Check::Differs(differs("largest token", &x, &y)));
            }
        }
        if !a.checksum.is_empty() && !b.checksum.is_empty() && a.checksum != b.checksum {
            return Err(Check::Differs(differs(
                "content checksum",
                &a.checksum,
                &b.checksum,
            )));
        }
        let ranges: Vec<Range<u64>> = self.probes.iter().map(|p| p.0.clone()).collect();
        let got = read_probes(&mut src.stream, &ranges).map_err(Check::Failed)?;
        for ((r, want), got) in self.probes.iter().zip(got) {
            if *want != got {
                let e = refuse(format!("tokens {}..{} differ", r.start, r.end));
                return Err(Check::Differs(e));
            }
        }
        Ok(())
    }
}

/// Why a replica was not admitted: it holds other data (the open fails: a replica set must
/// serve one dataset), or it failed on the way (it is left out, to be tried again).
enum Check {
    Differs(SourceError),
    Failed(SourceError),
}

impl Check {
    fn error(self) -> SourceError {
        match self {
            Check::Differs(e) | Check::Failed(e) => e,
        }
    }
}

/// Opens replica `authority` and checks it against `reference`, which the first replica
/// that opens and answers its probes becomes.
fn admit(
    opener: &Opener,
    authority: &str,
    reference: &mut Option<Reference>,
) -> Result<RemoteSource, Check> {
    let mut src = opener.open(authority).map_err(Check::Failed)?;
    match reference {
        None => *reference = Some(Reference::of(authority, &mut src).map_err(Check::Failed)?),
        Some(r) => r.mismatch(authority, &mut src)?,
    }
    Ok(src)
}

/// Admits every replica that opens and matches; while none does, tries them again (each
/// within [`Health`]'s urgent back-off) until `opener.timeout` passes. Returns the
/// reference the admitted ones matched.
fn first_admission(
    opener: &Opener,
    replicas: &mut [Replica],
    health: &mut Health,
) -> Result<Reference, SourceError> {
    let deadline = Instant::now() + opener.timeout;
    let mut reference: Option<Reference> = None;
    let mut due: Vec<usize> = (0..replicas.len()).collect();
    let mut warned = false;
    loop {
        // Whether every failure of this pass is one no wait can mend.
        let mut hopeless = !due.is_empty();
        for i in due {
            let a = &replicas[i].authority;
            match admit(opener, a, &mut reference) {
                Ok(src) => {
                    replicas[i].conn = Some(src);
                    health.reopened(i, None, Instant::now());
                }
                Err(Check::Differs(e)) => return Err(e),
                Err(Check::Failed(e)) => {
                    hopeless &= e.is_not_found() || matches!(e, SourceError::Usage(_));
                    health.reopened(i, Some(&e.to_string()), Instant::now());
                }
            }
        }
        if let Some(r) = reference {
            return Ok(r);
        }
        let now = Instant::now();
        if now >= deadline || hopeless {
            return Err(SourceError::Agent(format!(
                "no replica of {} could be opened: {}",
                opener.dataset.dataset,
                errors(replicas, health)
            )));
        }
        if !warned {
            warned = true;
            tracing::warn!(
                dataset = %opener.dataset.dataset,
                errors = %errors(replicas, health),
                "no replica answered the open; trying them again for up to {} s",
                opener.timeout.as_secs_f64()
            );
        }
        let wake = health.next_due(true).map_or(deadline, |t| t.min(deadline));
        std::thread::sleep(wake.saturating_duration_since(now));
        due = health.due(Instant::now(), true);
    }
}

/// Each replica's last error, `HOST:PORT: error; ...`.
fn errors(replicas: &[Replica], health: &Health) -> String {
    let why: Vec<String> = replicas
        .iter()
        .enumerate()
        .map(|(i, r)| format!("{}: {}", r.authority, health.error(i)))
        .collect();
    why.join("; ")
}

/// A replica's address and, while it is up, its connection (`Some` exactly while
/// [`Health`] has it up).
struct Replica {
    authority: String,
    conn: Option<RemoteSource>,
}

/// A reopen attempt's result: the replica's index and its source, checked.
type Revived = (usize, Result<RemoteSource, SourceError>);

/// Told of each failover of a [`ReplicatedSource`]: the replica that failed (its
/// `HOST:PORT`) and the dataset. An agent counts them in its metrics, by replica.
pub type OnFailover = std::sync::Arc<dyn Fn(&str, &str) + Send + Sync>;

/// A dataset on several agents as one [`TokenSource`] (see the module docs).
pub struct ReplicatedSource {
    opener: Opener,
    replicas: Vec<Replica>,
    health: Health,
    reference: std::sync::Arc<Reference>,
    tokens: u64,
    max_token: u32,
    readahead: ReadaheadConfig,
    seq: Sequence,
    window: Option<Window>,
    /// The replica the next chunk or request goes to, round-robin.
    next: usize,
    revived_tx: Sender<Revived>,
    revived: Receiver<Revived>,
    failovers: u64,
    on_failover: Option<OnFailover>,
}

impl ReplicatedSource {
    /// Opens `dataset` on every replica in `authorities`, checks that they hold the same data
    /// (see the module docs), and reads from those that opened. While none opens, tries them
    /// again as a read with no replica up does, until `timeout` passes; fails then, at once
    /// when one holds other data, and at once when every replica tried says the dataset is
    /// not there or the request is wrong (no wait makes those right).
    pub fn open(
        authorities: &[&str],
        dataset: StatRequest,
        wire_codec: &str,
        timeout: Duration,
        creds: &Credentials,
    ) -> Result<Self, SourceError> {
        let opener = Opener {
            dataset,
            wire_codec: wire_codec.to_string(),
            timeout,
            creds: creds.clone(),
        };
        let mut replicas: Vec<Replica> = authorities
            .iter()
            .map(|a| Replica {
                authority: a.to_string(),
                conn: None,
            })
            .collect();
        let mut health = Health::new(authorities.len());
        let reference = first_admission(&opener, &mut replicas, &mut health)?;
        let max_token = replicas
            .iter()
            .filter_map(|r| r.conn.as_ref().map(|c| c.max_token_bound()))
            .max()
            .unwrap_or(u32::MAX);
        let (revived_tx, revived) = channel();
        Ok(ReplicatedSource {
            tokens: reference.stat.tokens,
            max_token,
            opener,
            replicas,
            health,
            reference: std::sync::Arc::new(reference),
            readahead: ReadaheadConfig::DEFAULT,
            seq: Sequence::default(),
            window: None,
            next: 0,
            revived_tx,
            revived,
            failovers: 0,
            on_failover: None,
        })
    }

    /// Replicas serving reads now.
    pub fn live(&self) -> usize {
        self.replicas.iter().filter(|r| r.conn.is_some()).count()
    }

    /// Reads moved off a failed replica so far.
    pub fn failovers(&self) -> u64 {
        self.failovers
    }

    /// Calls `f` at each failover from now on (see [`OnFailover`]).
    pub fn set_on_failover(&mut self, f: OnFailover) {
        self.on_failover = Some(f);
    }

    pub fn set_readahead(&mut self, config: ReadaheadConfig) {
        self.readahead = config;
    }

    /// Takes a replica out after `e`, to be tried again after its back-off.
    fn fail(&mut self, i: usize, e: &SourceError) {
        self.replicas[i].conn = None;
        self.health.failed(i, &e.to_string(), Instant::now());
        self.failovers += 1;
        if let Some(f) = &self.on_failover {
            f(&self.replicas[i].authority, &self.opener.dataset.dataset);
        }
    }

    /// Installs replicas reopened since the last read, and starts reopening those that are
    /// due (sooner while none is up: see [`Health`]).
    fn revive(&mut self) {
        while let Ok((i, r)) = self.revived.try_recv() {
            self.install(i, r);
        }
        self.start_reopens();
    }

    /// A reopen's outcome: replica `i` up again with its source, or out for longer.
    fn install(&mut self, i: usize, r: Result<RemoteSource, SourceError>) {
        let failure = match r {
            Ok(src) => {
                self.replicas[i].conn = Some(src);
                None
            }
            Err(e) => Some(e.to_string()),
        };
        self.health.reopened(i, failure.as_deref(), Instant::now());
    }

    /// Reopens, each on a thread of its own, the replicas that are due.
    fn start_reopens(&mut self) {
        let urgent = self.live() == 0;
        for i in self.health.due(Instant::now(), urgent) {
            let (opener, reference, authority) = (
                self.opener.clone(),
                self.reference.clone(),
                self.replicas[i].authority.clone(),
            );
            let tx = self.revived_tx.clone();
            std::thread::spawn(move || {
                let r = opener.open(&authority).and_then(|mut src| {
                    reference
                        .mismatch(&authority, &mut src)
                        .map_err(Check::error)?;
                    Ok(src)
                });
                let _ = tx.send((i, r));
            });
        }
    }

    /// With no replica up: reopens them (see [`Health`]) until one is back, or fails with
    /// every replica's last error once `deadline` passes. A reader never sees a failover
    /// while some replica answers within the deadline.
    fn await_replica(&mut self, deadline: Instant) -> Result<(), SourceError> {
        while self.live() == 0 {
            self.start_reopens();
            let now = Instant::now();
            if now >= deadline {
                return Err(self.all_down());
            }
            let wake = self
                .health
                .next_due(true)
                .map_or(deadline, |t| t.min(deadline));
            match self
                .revived
                .recv_timeout(wake.saturating_duration_since(now))
            {
                Ok((i, r)) => self.install(i, r),
                Err(RecvTimeoutError::Timeout) => {}
                // Never: this source holds a sender.
                Err(RecvTimeoutError::Disconnected) => return Err(self.all_down()),
            }
        }
        Ok(())
    }

    /// The error when no replica is left: each one's last error.
    fn all_down(&self) -> SourceError {
        SourceError::Agent(format!(
            "every replica of {} failed ({}), and none answered again within {} s",
            self.opener.dataset.dataset,
            errors(&self.replicas, &self.health),
            self.opener.timeout.as_secs_f64()
        ))
    }

    /// Drops the readahead window, reading the answers still in flight on live replicas off
    /// their streams (a replica that fails meanwhile is taken out).
    fn abandon_window(&mut self) {
        let Some(mut w) = self.window.take() else {
            return;
        };
        loop {
            let mut live = Live {
                replicas: &mut self.replicas,
                next: &mut self.next,
            };
            match w.drain(&mut live) {
                Ok(()) => return,
                Err(e) => match w.failed_stream() {
                    Some(i) => self.fail(i, &e),
                    None => return,
                },
            }
        }
    }

    /// One try of a read on the live replicas; an error says which replica failed, when one
    /// did.
    fn try_read(
        &mut self,
        ranges: &[Range<u64>],
        out: &mut [u32],
    ) -> Result<(), (Option<usize>, SourceError)> {
        let mut live = Live {
            replicas: &mut self.replicas,
            next: &mut self.next,
        };
        let read = read_ahead(
            &mut self.window,
            &mut self.seq,
            &mut live,
            self.readahead,
            self.tokens,
            ranges,
            out,
        );
        let Served {
            ranges: done,
            tokens: at,
        } = read.map_err(|e| (self.window.as_ref().and_then(|w| w.failed_stream()), e))?;
        if done < ranges.len() {
            self.abandon_window();
        }
        self.read_spread(&ranges[done..], &mut out[at..])
    }

    /// Stop-and-wait for `ranges`, split into one request per live replica (at most
    /// `MAX_REQUEST_RANGES` each), all sent before any answer is read. When one replica
    /// fails, the answers the others still owe are read off their streams (so they stay
    /// usable), and the read fails with that replica's error.
    fn read_spread(
        &mut self,
        ranges: &[Range<u64>],
        out: &mut [u32],
    ) -> Result<(), (Option<usize>, SourceError)> {
        if ranges.is_empty() {
            return Ok(());
        }
        let per = ranges
            .len()
            .div_ceil(self.live().max(1))
            .min(MAX_REQUEST_RANGES);
        let mut live = Live {
            replicas: &mut self.replicas,
            next: &mut self.next,
        };
        let mut sent = Vec::new();
        let mut failed: Option<(usize, SourceError)> = None;
        for group in ranges.chunks(per) {
            let i = match live.pick() {
                Ok(i) => i,
                Err(e) => {
                    failed = Some((usize::MAX, e));
                    break;
                }
            };
            let pairs: Vec<(u64, u64)> = group.iter().map(|r| (r.start, r.end - r.start)).collect();
            if let Err(e) = live.stream(i).send(&pairs) {
                failed = Some((i, e));
                break;
            }
            sent.push((i, group));
        }
        let mut at = 0;
        let mut also_failed = Vec::new();
        for (i, group) in sent {
            for r in group {
                let n = (r.end - r.start) as usize;
                match &failed {
                    // This replica's stream is dropped anyway.
                    Some((f, _)) if *f == i => break,
                    // Read what is owed, to keep the stream usable.
                    Some(_) => {
                        if let Err(e) = live.stream(i).recv(r.start, r.end - r.start, None) {
                            also_failed.push((i, e));
                            break;
                        }
                    }
                    None => {
                        let got = live.stream(i).recv(
                            r.start,
                            r.end - r.start,
                            Some(&mut out[at..at + n]),
                        );
                        if let Err(e) = got {
                            failed = Some((i, e));
                            break;
                        }
                    }
                }
                at += n;
            }
        }
        for (i, e) in also_failed {
            self.fail(i, &e);
        }
        match failed {
            None => {
                for r in ranges {
                    self.seq.note(r);
                }
                Ok(())
            }
            Some((usize::MAX, e)) => Err((None, e)),
            Some((i, e)) => Err((Some(i), e)),
        }
    }
}

/// The live replicas' streams, for a [`Window`] and for spread reads.
struct Live<'a> {
    replicas: &'a mut [Replica],
    next: &'a mut usize,
}

impl Streams for Live<'_> {
    fn pick(&mut self) -> Result<usize, SourceError> {
        let n = self.replicas.len();
        for k in 0..n {
            let i = (*self.next + k) % n;
            if self.replicas[i].conn.is_some() {
                *self.next = (i + 1) % n;
                return Ok(i);
            }
        }
        Err(SourceError::Agent("no replica is live".into()))
    }

    fn stream(&mut self, i: usize) -> &mut RangeStream {
        // Only streams `pick` chose are asked for, and a replica's connection is dropped only
        // after every window and request on it is abandoned.
        &mut self.replicas[i]
            .conn
            .as_mut()
            .expect("a picked replica has its connection")
            .stream
    }

    fn alive(&self, i: usize) -> bool {
        self.replicas[i].conn.is_some()
    }
}

impl TokenSource for ReplicatedSource {
    fn tokens(&self) -> u64 {
        self.tokens
    }

    fn max_token_bound(&self) -> u32 {
        self.max_token
    }

    fn read_ranges(&mut self, ranges: &[Range<u64>], out: &mut [u32]) -> Result<(), SourceError> {
        check_ranges(ranges, out)?;
        if let Some(r) = ranges.iter().find(|r| r.end > self.tokens) {
            return Err(SourceError::Usage(format!(
                "{}: token range {}..{} is outside its {} tokens",
                self.opener.dataset.dataset, r.start, r.end, self.tokens
            )));
        }
        let deadline = Instant::now() + self.opener.timeout;
        loop {
            self.revive();
            self.await_replica(deadline)?;
            match self.try_read(ranges, out) {
                Ok(()) => return Ok(()),
                Err((Some(i), e)) => {
                    tracing::warn!(
                        replica = %self.replicas[i].authority,
                        dataset = %self.opener.dataset.dataset,
                        error = %e,
                        "replica failed; its reads move to the others"
                    );
                    self.fail(i, &e);
                    self.abandon_window();
                    // A failed read leaves no sequence to go on from: start afresh.
                    self.seq = Sequence::default();
                }
                Err((None, e)) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_cover_the_dataset_ends() {
        assert_eq!(probe_ranges(0), Vec::<Range<u64>>::new());
        assert_eq!(probe_ranges(10), vec![0..10]);
        let p = probe_ranges(1000);
        assert_eq!(p.len(), 8);
        assert_eq!(p[0], 0..32);
        assert_eq!(p[7], 968..1000);
    }
}
