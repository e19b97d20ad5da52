//! Which replicas may serve: the first replica that opens and answers becomes the reference
//! (its stat and the tokens of a few probe ranges), and every other one, at open and each
//! time it comes back, must match it. Kept apart from the reads: this is the part that
//! decides what "the same dataset" means and when an open gives up.

use std::ops::Range;
use std::time::{Duration, Instant};

use dquant_proto::v1::{DatasetStat, StatRequest};
use dquant_storage::SourceError;
use dquant_transport::WireError;

use super::health::Health;
use crate::control::{Control, Credentials};
use crate::range_stream::RangeStream;
use crate::readahead::ReadaheadConfig;
use crate::source::RemoteSource;

/// Probe ranges compared between replicas at open, of [`PROBE_TOKENS`] each.
const PROBES: u64 = 8;
const PROBE_TOKENS: u64 = 32;

/// How a replica is opened: everything but its address.
#[derive(Clone)]
pub(super) struct Opener {
    pub(super) dataset: StatRequest,
    pub(super) wire_codec: String,
    pub(super) timeout: Duration,
    pub(super) creds: Credentials,
}

impl Opener {
    pub(super) fn open(&self, authority: &str) -> Result<RemoteSource, SourceError> {
        let c = Control::connect_with(authority, self.timeout, &self.creds)?;
        let mut s = RemoteSource::open(c, self.dataset.clone(), &self.wire_codec)?;
        s.set_readahead(ReadaheadConfig::OFF);
        Ok(s)
    }
}

/// What every replica must match: the first replica's stat and probe tokens.
pub(super) struct Reference {
    authority: String,
    pub(super) stat: DatasetStat,
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

/// Reads `ranges` stop-and-wait on `s` (no request at all for none: an agent alone has no
/// probes).
fn read_probes(s: &mut RangeStream, ranges: &[Range<u64>]) -> Result<Vec<Vec<u32>>, SourceError> {
    if ranges.is_empty() {
        return Ok(Vec::new());
    }
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
    /// `src`'s stat, and its probe tokens when there are other replicas to compare with
    /// (`probe`): an agent alone is compared, when it comes back, by its stat only.
    fn of(authority: &str, src: &mut RemoteSource, probe: bool) -> Result<Self, SourceError> {
        let ranges = match probe {
            true => probe_ranges(src.stat.tokens),
            false => Vec::new(),
        };
        let tokens = read_probes(&mut src.stream, &ranges)?;
        Ok(Reference {
            authority: authority.to_string(),
            stat: src.stat.clone(),
            probes: ranges.into_iter().zip(tokens).collect(),
        })
    }

    /// Whether `src` (at `authority`) holds the reference's data: [`Check::Differs`] says
    /// why not, [`Check::Failed`] that the replica failed while being checked.
    pub(super) fn mismatch(&self, authority: &str, src: &mut RemoteSource) -> Result<(), Check> {
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
pub(super) enum Check {
    Differs(SourceError),
    Failed(SourceError),
}

impl Check {
    pub(super) fn error(self) -> SourceError {
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
    probe: bool,
) -> Result<RemoteSource, Check> {
    let mut src = opener.open(authority).map_err(Check::Failed)?;
    match reference {
        None => {
            let r = Reference::of(authority, &mut src, probe).map_err(Check::Failed)?;
            *reference = Some(r);
        }
        Some(r) => r.mismatch(authority, &mut src)?,
    }
    Ok(src)
}

/// The agent's own error in `e`, when it is one (an error frame): not the connection's.
pub(super) fn refusal(e: &SourceError) -> Option<&str> {
    match e {
        SourceError::Wire(WireError::Remote(m)) => Some(m),
        _ => None,
    }
}

/// Admits every replica that opens and matches. While none does, tries them again (each
/// within [`Health`]'s urgent back-off) until `opener.timeout` passes, unless no wait can
/// mend it ([`Pass::hopeless`]). An agent alone is not waited for: its own error is the
/// open's, at once, as a wrong address must be. Returns the reference the admitted matched.
pub(super) fn first_admission(
    opener: &Opener,
    replicas: &mut [Replica],
    health: &mut Health,
) -> Result<Reference, SourceError> {
    let deadline = Instant::now() + opener.timeout;
    let probe = replicas.len() > 1;
    let mut reference: Option<Reference> = None;
    let mut due: Vec<usize> = (0..replicas.len()).collect();
    let mut warned = false;
    loop {
        let mut pass = Pass::default();
        for i in due {
            let a = &replicas[i].authority;
            match admit(opener, a, &mut reference, probe) {
                Ok(src) => {
                    replicas[i].conn = Some(src);
                    health.reopened(i, None, Instant::now());
                }
                Err(Check::Differs(e)) => return Err(e),
                Err(Check::Failed(e)) => {
                    health.reopened(i, Some(&e.to_string()), Instant::now());
                    pass.failed(e);
                }
            }
        }
        if let Some(r) = reference {
            return Ok(r);
        }
        let now = Instant::now();
        if replicas.len() == 1 || now >= deadline || pass.hopeless() {
            return Err(pass.last.unwrap_or_else(|| {
                SourceError::Agent(format!(
                    "no replica of {} could be opened: {}",
                    opener.dataset.dataset,
                    errors(replicas, health)
                ))
            }));
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

/// The failures of one pass over the replicas at open.
#[derive(Default)]
struct Pass {
    /// The last failure, what a hopeless open fails with when the others said the same.
    last: Option<SourceError>,
    /// The agents' own errors (error frames), verbatim.
    refusals: Vec<String>,
    /// Failures a wait may mend: a connection refused or cut, a timeout.
    transient: bool,
    failures: usize,
}

impl Pass {
    fn failed(&mut self, e: SourceError) {
        self.failures += 1;
        match refusal(&e) {
            Some(m) => self.refusals.push(m.to_string()),
            None if e.is_not_found() || matches!(e, SourceError::Usage(_)) => {}
            None => self.transient = true,
        }
        self.last = Some(e);
    }

    /// Whether no wait can mend this pass: every replica tried says the dataset is not
    /// there or the request is wrong, or (two or more) refused it with one and the same
    /// message (a token that does not fit the wire codec, met by the probes). A replica's
    /// own fault (a failing disk) reads differently from the others' and is waited out.
    fn hopeless(&self) -> bool {
        let alike = self.refusals.len() >= 2 && self.refusals.windows(2).all(|w| w[0] == w[1]);
        self.failures > 0 && !self.transient && (self.refusals.is_empty() || alike)
    }
}

/// Each replica's last error, `HOST:PORT: error; ...`.
pub(super) fn errors(replicas: &[Replica], health: &Health) -> String {
    let why: Vec<String> = replicas
        .iter()
        .enumerate()
        .map(|(i, r)| format!("{}: {}", r.authority, health.error(i)))
        .collect();
    why.join("; ")
}

/// A replica's address and, while it is up, its connection (`Some` exactly while
/// [`Health`] has it up).
pub(super) struct Replica {
    pub(super) authority: String,
    pub(super) conn: Option<RemoteSource>,
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
