//! One dataset held by several storage agents: reads spread across them, and moved to the
//! others when one dies or stalls, with nothing lost. A dataset on one agent is a set of one,
//! so a read that meets its agent restarting waits for it the same way.
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
//! that finds no replica of a set up waits the same way (an agent alone is not waited for at
//! open: a wrong address must fail at once).
//!
//! # The request's errors, not a replica's
//! An error the agent itself reports (an error frame) may be its replica's fault (a failing
//! disk, a corrupt copy: the read moves on) or the request's (a token too wide for the wire
//! codec: every replica says the same). A read that meets the same agent error on two
//! replicas, or on an agent alone, fails at once with it; so does an open whose replicas all
//! refuse it alike. Nothing is waited out that no wait can mend.

use std::ops::Range;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use dquant_proto::v1::StatRequest;
use dquant_storage::{check_ranges, SourceError, TokenSource};
use dquant_transport::record::MAX_REQUEST_RANGES;

mod admission;
mod health;

use crate::control::Credentials;
use crate::range_stream::RangeStream;
use crate::readahead::{read_ahead, ReadaheadConfig, Sequence, Served, Streams, Window};
use crate::source::RemoteSource;
use admission::{errors, first_admission, refusal, Check, Opener, Reference, Replica};
use health::Health;

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

    /// Takes a replica out after `e`, to be tried again after its back-off, and counts the
    /// failover.
    fn fail(&mut self, i: usize, e: &SourceError) {
        self.drop_conn(i, e);
        self.failovers += 1;
        if let Some(f) = &self.on_failover {
            f(&self.replicas[i].authority, &self.opener.dataset.dataset);
        }
    }

    /// Drops replica `i`'s connection after `e` (its session is over), to be reopened after
    /// its back-off: no failover when the error was the request's.
    fn drop_conn(&mut self, i: usize, e: &SourceError) {
        self.replicas[i].conn = None;
        self.health.failed(i, &e.to_string(), Instant::now());
    }

    /// Replica `i` failed a read with `e`: out with it ([`Self::fail`]), and with the read
    /// state built on its stream. A failed read leaves no sequence to go on from: the next
    /// one starts afresh.
    fn failed_read(&mut self, i: usize, e: &SourceError) {
        self.fail(i, e);
        self.restart_reads();
    }

    /// Replica `i` refused a read with the request's own error ([`Self::same_everywhere`]):
    /// its session is over, but it did not fail, so no failover is counted.
    fn refused_read(&mut self, i: usize, e: &SourceError) {
        self.drop_conn(i, e);
        self.restart_reads();
    }

    /// Drops the read state built on the streams: the next read starts afresh.
    fn restart_reads(&mut self) {
        self.abandon_window();
        self.seq = Sequence::default();
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

    /// Whether replica `i`'s failure `e` is the request's, not the replica's: an error the
    /// agent itself reported (a token that does not fit the wire codec) that every replica
    /// gives alike. It is one when the set has one replica, or another replica reported the
    /// same message for this read; no failover or wait would mend it, so the read fails at
    /// once. (A corrupt copy's checksum error names its own replica's failure and differs
    /// from the others' answers: that one fails over.)
    fn same_everywhere(
        &self,
        refusals: &mut Vec<(usize, String)>,
        i: usize,
        e: &SourceError,
    ) -> bool {
        let Some(m) = refusal(e) else {
            return false;
        };
        let seen = refusals.iter().any(|(j, n)| *j != i && n == m);
        refusals.push((i, m.to_string()));
        seen || self.replicas.len() == 1
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
        // The agents' own errors this read met, by replica.
        let mut refusals: Vec<(usize, String)> = Vec::new();
        loop {
            self.revive();
            self.await_replica(deadline)?;
            match self.try_read(ranges, out) {
                Ok(()) => return Ok(()),
                Err((Some(i), e)) if self.same_everywhere(&mut refusals, i, &e) => {
                    self.refused_read(i, &e);
                    return Err(e);
                }
                Err((Some(i), e)) => {
                    tracing::warn!(
                        replica = %self.replicas[i].authority,
                        dataset = %self.opener.dataset.dataset,
                        error = %e,
                        "replica failed; its reads move to the others"
                    );
                    self.failed_read(i, &e);
                }
                Err((None, e)) => return Err(e),
            }
        }
    }
}
