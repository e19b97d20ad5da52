//! A shared stream's window: the last batch records made, and where each subscriber stands.
//!
//! Sans I/O and generic over the record, so the rules are tested alone: the producer pushes
//! a record only when the window has room or its oldest record is one every subscriber has
//! passed (the slowest subscriber sets the pace, within `capacity` records); a subscriber
//! joins at a batch boundary still in the window, or at the head (the next batch made);
//! nothing a subscriber has not read is ever dropped.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// A stream position: the cursor's epoch and `consumed_samples`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Pos {
    pub epoch: u64,
    pub consumed: u64,
}

impl std::fmt::Display for Pos {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "epoch {} consumed_samples {}", self.epoch, self.consumed)
    }
}

/// How a stream ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum End {
    /// Every batch was made.
    Finished,
    /// The plan failed after the records before it (the message, verbatim).
    Failed(String),
    /// The agent is shutting down; the message says where to resume.
    Drained(String),
    /// Nobody was left to deliver to, or the producer could not start.
    Stopped(String),
}

/// What a subscriber gets next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next<R> {
    /// Its next record, and the position after it.
    Record(R, Pos),
    /// Nothing yet: the producer has not made it.
    Wait,
    /// It has every record; the stream ended so.
    End(End),
}

/// Why a subscriber cannot join where it asked.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum JoinError {
    #[error(
        "cursor ({asked}) is no longer in the stream's window, which holds batches from \
         ({oldest}) to ({head}); join at the current cursor ({head}) or a later one"
    )]
    Behind { asked: Pos, oldest: Pos, head: Pos },
    #[error(
        "cursor ({asked}) is not where a batch of the stream starts; the window holds batches \
         from ({oldest}) to ({head})"
    )]
    NotABoundary { asked: Pos, oldest: Pos, head: Pos },
    #[error("cursor ({asked}) is ahead of the stream, which has made batches up to ({head})")]
    Ahead { asked: Pos, head: Pos },
}

struct Entry<R> {
    /// Where the record's batch starts.
    from: Pos,
    /// The position once it is consumed.
    to: Pos,
    record: R,
}

pub(crate) struct Window<R> {
    capacity: usize,
    entries: VecDeque<Entry<R>>,
    /// The stream index of `entries[0]`.
    base: u64,
    /// The position after the last record pushed (where the next starts).
    head: Pos,
    /// Each subscriber's next record index.
    subs: BTreeMap<u64, u64>,
    /// Subscribers that are not consumers: a shared ring's writer, which holds records like
    /// any subscriber but is not counted as one.
    silent: BTreeSet<u64>,
    end: Option<End>,
}

impl<R: Clone> Window<R> {
    /// An empty window of `capacity` records (at least 1) for a stream starting at `start`.
    pub fn new(capacity: usize, start: Pos) -> Self {
        Window {
            capacity: capacity.max(1),
            entries: VecDeque::new(),
            base: 0,
            head: start,
            subs: BTreeMap::new(),
            silent: BTreeSet::new(),
            end: None,
        }
    }

    fn next_index(&self) -> u64 {
        self.base + self.entries.len() as u64
    }

    /// Where the oldest record held starts (the head when none is held).
    fn oldest(&self) -> Pos {
        self.entries.front().map_or(self.head, |e| e.from)
    }

    /// The position after the last record pushed: where a subscriber joining now starts.
    pub fn head(&self) -> Pos {
        self.head
    }

    /// Subscribers, not counting silent ones.
    pub fn subscribers(&self) -> usize {
        self.subs.len() - self.silent.len()
    }

    /// Subscriber `id`'s next record index.
    pub fn index_of(&self, id: u64) -> Option<u64> {
        self.subs.get(&id).copied()
    }

    /// Adds `id` as a silent subscriber where `beside` is: it holds records from there on,
    /// but does not count in [`Window::subscribers`]. `None`: `beside` is not subscribed, or
    /// `id` already is.
    pub fn join_silent_beside(&mut self, id: u64, beside: u64) -> Option<u64> {
        let index = *self.subs.get(&beside)?;
        if self.subs.contains_key(&id) {
            return None;
        }
        self.subs.insert(id, index);
        self.silent.insert(id);
        Some(index)
    }

    /// The lowest next record index among the subscribers `skip` does not pick.
    pub fn slowest_except(&self, skip: impl Fn(u64) -> bool) -> Option<u64> {
        self.subs
            .iter()
            .filter(|(&id, _)| !skip(id))
            .map(|(_, &i)| i)
            .min()
    }

    /// Adds subscriber `id` at `at` (`None`: the head). Returns where it starts.
    pub fn join(&mut self, id: u64, at: Option<Pos>) -> Result<Pos, JoinError> {
        let (head, oldest) = (self.head, self.oldest());
        let index = match at {
            None => self.next_index(),
            Some(asked) if asked == head => self.next_index(),
            Some(asked) if asked > head => return Err(JoinError::Ahead { asked, head }),
            Some(asked) if asked < oldest => {
                return Err(JoinError::Behind {
                    asked,
                    oldest,
                    head,
                })
            }
            Some(asked) => match self.entries.iter().position(|e| e.from == asked) {
                Some(i) => self.base + i as u64,
                None => {
                    return Err(JoinError::NotABoundary {
                        asked,
                        oldest,
                        head,
                    })
                }
            },
        };
        self.subs.insert(id, index);
        Ok(self.position_of(index))
    }

    /// The position before record `index` (held, or the next to be made).
    pub fn position_of(&self, index: u64) -> Pos {
        let i = index.saturating_sub(self.base) as usize;
        self.entries.get(i).map_or(self.head, |e| e.from)
    }

    /// Removes subscriber `id`; returns how far it got (the position after its last record),
    /// or `None` when it was not subscribed.
    pub fn leave(&mut self, id: u64) -> Option<Pos> {
        let index = self.subs.remove(&id)?;
        self.silent.remove(&id);
        Some(self.position_of(index))
    }

    /// Whether the producer may push a record now: the window has room, or every subscriber
    /// has passed its oldest record.
    pub fn has_room(&self) -> bool {
        let slowest = self.subs.values().min().copied().unwrap_or(u64::MAX);
        self.entries.len() < self.capacity || slowest > self.base
    }

    /// Adds the next record, whose batch ends at `to`, dropping the oldest when the window is
    /// full. The caller checked [`Window::has_room`]; a record some subscriber still needs is
    /// never dropped (`false`: not pushed).
    pub fn push(&mut self, record: R, to: Pos) -> bool {
        if !self.has_room() {
            return false;
        }
        if self.entries.len() >= self.capacity {
            self.entries.pop_front();
            self.base += 1;
        }
        let from = self.head;
        self.entries.push_back(Entry { from, to, record });
        self.head = to;
        true
    }

    /// The stream ends (after every record pushed); the first end stands.
    pub fn end(&mut self, end: End) {
        self.end.get_or_insert(end);
    }

    /// What subscriber `id` gets next (`None`: not subscribed).
    pub fn next(&self, id: u64) -> Option<Next<R>> {
        let index = *self.subs.get(&id)?;
        let i = index.checked_sub(self.base)? as usize;
        Some(match self.entries.get(i) {
            Some(e) => Next::Record(e.record.clone(), e.to),
            None => match &self.end {
                Some(end) => Next::End(end.clone()),
                None => Next::Wait,
            },
        })
    }

    /// The records subscriber `id` may take now, its next first (none when it has them all
    /// or is not subscribed).
    pub fn ready(&self, id: u64) -> impl Iterator<Item = &R> {
        let from = self.subs.get(&id).map_or(self.entries.len(), |&i| {
            i.saturating_sub(self.base) as usize
        });
        self.entries.iter().skip(from).map(|e| &e.record)
    }

    /// Subscriber `id` has its next `n` records.
    pub fn advance_by(&mut self, id: u64, n: usize) {
        let next = self.next_index();
        if let Some(i) = self.subs.get_mut(&id) {
            *i = i.saturating_add(n as u64).min(next);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(consumed: u64) -> Pos {
        Pos { epoch: 0, consumed }
    }

    /// A window of `cap` records with records 0..n pushed (batches of 4 samples).
    fn window(cap: usize, n: u64) -> Window<u64> {
        let mut w = Window::new(cap, p(0));
        w.join(1, None).unwrap();
        for i in 0..n {
            assert!(w.push(i, p(4 * (i + 1))));
            w.advance_by(1, 1);
        }
        w
    }

    fn drain(w: &mut Window<u64>, id: u64) -> Vec<u64> {
        let mut got = Vec::new();
        while let Some(Next::Record(r, _)) = w.next(id) {
            got.push(r);
            w.advance_by(id, 1);
        }
        got
    }

    #[test]
    fn every_subscriber_gets_every_record_in_order() {
        let mut w = Window::new(3, p(0));
        w.join(1, None).unwrap();
        w.join(2, None).unwrap();
        let (mut one, mut two) = (Vec::new(), Vec::new());
        for i in 0..10u64 {
            // Subscriber 2 reads only when the producer is held up: it sets the pace.
            while !w.has_room() {
                two.extend(drain(&mut w, 2));
            }
            assert!(w.push(i, p(4 * (i + 1))));
            one.extend(drain(&mut w, 1));
        }
        w.end(End::Finished);
        two.extend(drain(&mut w, 2));
        assert_eq!(one, (0..10).collect::<Vec<_>>());
        assert_eq!(two, one);
        assert_eq!(w.next(1), Some(Next::End(End::Finished)));
        assert_eq!(w.next(2), Some(Next::End(End::Finished)));
    }

    #[test]
    fn the_slowest_subscriber_holds_the_producer_within_the_window() {
        let mut w = Window::new(2, p(0));
        w.join(1, None).unwrap();
        w.join(2, None).unwrap();
        assert!(w.push(0, p(4)) && w.push(1, p(8)));
        drain(&mut w, 1);
        // Full, and 2 has read nothing: no room, and a push is refused.
        assert!(!w.has_room());
        assert!(!w.push(2, p(12)));
        assert_eq!(w.next(2), Some(Next::Record(0, p(4))));
        w.advance_by(2, 1);
        assert!(w.has_room());
        assert!(w.push(2, p(12)));
        assert_eq!(drain(&mut w, 2), vec![1, 2]);
    }

    #[test]
    fn a_silent_subscriber_holds_records_but_is_not_counted() {
        let mut w = Window::new(2, p(0));
        w.join(1, None).unwrap();
        assert_eq!(w.join_silent_beside(9, 1), Some(0));
        assert_eq!(w.join_silent_beside(9, 1), None);
        assert_eq!(w.join_silent_beside(8, 7), None);
        assert_eq!(w.subscribers(), 1);
        assert!(w.push(0, p(4)) && w.push(1, p(8)));
        w.advance_by(1, 2);
        // The silent one has read nothing: it holds the window.
        assert!(!w.has_room());
        assert_eq!(w.slowest_except(|id| id == 9), Some(2));
        assert_eq!(w.slowest_except(|_| false), Some(0));
        assert_eq!(w.index_of(9), Some(0));
        assert_eq!(w.leave(9), Some(p(0)));
        assert!(w.has_room());
        assert_eq!(w.subscribers(), 1);
    }

    #[test]
    fn a_subscriber_that_leaves_no_longer_holds_the_producer() {
        let mut w = Window::new(1, p(0));
        w.join(1, None).unwrap();
        w.join(2, None).unwrap();
        assert!(w.push(0, p(4)));
        w.advance_by(1, 1);
        assert!(!w.has_room());
        assert_eq!(w.leave(2), Some(p(0)));
        assert!(w.has_room());
        assert_eq!(w.leave(1), Some(p(4)));
        assert_eq!(w.leave(1), None);
        assert_eq!(w.subscribers(), 0);
    }

    #[test]
    fn a_late_joiner_starts_at_the_head_or_at_a_boundary_in_the_window() {
        let mut w = window(3, 5);
        // Held: records 2, 3, 4 (from 8, 12, 16); the head is 20.
        assert_eq!(w.join(2, None), Ok(p(20)));
        assert_eq!(w.join(3, Some(p(20))), Ok(p(20)));
        assert_eq!(w.join(4, Some(p(12))), Ok(p(12)));
        assert_eq!(drain(&mut w, 4), vec![3, 4]);
        assert_eq!(drain(&mut w, 2), Vec::<u64>::new());
        assert!(w.push(5, p(24)));
        assert_eq!(drain(&mut w, 2), vec![5]);
        assert_eq!(drain(&mut w, 3), vec![5]);
    }

    #[test]
    fn a_cursor_outside_the_window_is_refused_with_what_it_holds() {
        let mut w = window(3, 5);
        let behind = w.join(9, Some(p(4))).unwrap_err();
        assert_eq!(
            behind.to_string(),
            "cursor (epoch 0 consumed_samples 4) is no longer in the stream's window, which \
             holds batches from (epoch 0 consumed_samples 8) to (epoch 0 consumed_samples 20); \
             join at the current cursor (epoch 0 consumed_samples 20) or a later one"
        );
        assert_eq!(
            w.join(9, Some(p(10))),
            Err(JoinError::NotABoundary {
                asked: p(10),
                oldest: p(8),
                head: p(20)
            })
        );
        assert_eq!(
            w.join(9, Some(p(24))).unwrap_err().to_string(),
            "cursor (epoch 0 consumed_samples 24) is ahead of the stream, which has made \
             batches up to (epoch 0 consumed_samples 20)"
        );
        assert_eq!(w.subscribers(), 1);
    }

    #[test]
    fn a_subscriber_takes_every_ready_record_at_once() {
        let mut w = window(4, 2);
        w.join(2, Some(p(4))).unwrap();
        assert!(w.push(2, p(12)));
        assert_eq!(w.ready(2).copied().collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(w.ready(1).copied().collect::<Vec<_>>(), vec![2]);
        assert_eq!(w.ready(9).count(), 0);
        w.advance_by(2, 5);
        assert_eq!(w.ready(2).count(), 0);
        assert_eq!(w.next(2), Some(Next::Wait));
    }

    #[test]
    fn a_joiner_at_the_head_of_an_ended_stream_gets_the_end() {
        let mut w = window(2, 3);
        w.end(End::Failed("source 0: gone".into()));
        w.end(End::Finished);
        w.join(2, None).unwrap();
        assert_eq!(
            w.next(2),
            Some(Next::End(End::Failed("source 0: gone".into())))
        );
    }
}
