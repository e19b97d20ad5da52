//! Exhaustive check of the ring's index / need-wakeup protocol, with one reader and with two.
//!
//! The producer and its readers (`ring::producer`, `ring::consumer`, sleeping in `ring::wake`)
//! are modelled as small state machines whose steps are the shared-memory accesses and
//! syscalls of the real code (the SeqCst fences make the flag/index handshake sequentially
//! consistent, so interleavings of steps are the executions to explore). Every interleaving
//! for `N` slots, `ITEMS` batches and `R` readers is explored; the checks: no reachable state
//! is stuck (a lost wakeup shows up as a side asleep with nothing left to wake it) and no
//! reader ever reads a slot that is not exactly the batch it expects (torn, or overwritten
//! before every reader had it). Mutants with a step removed must fail, which shows the
//! checker can see each bug.
//!
//! What a ring with several readers adds (a shared stream's ring, `share::broadcast`): each
//! reader has its own block (index, need-wakeup flag, wake threshold, eventfd); the producer
//! may reuse a slot only once every reader still there has released it, checks every
//! reader's flag after each publish, and wakes each one through its own eventfd; a reader
//! that leaves marks its block closed and wakes the producer, which then stops waiting for
//! it (and gives up once no reader is left). The producer's flag and eventfd are shared:
//! any reader's release may wake it.
//!
//! Wake-up batching is modelled too: a reader about to sleep picks any threshold `k` in
//! `1..=N` (every choice is explored) and the producer wakes it only once its index reaches
//! `tail + k`; the producer closes the ring after the last batch, which always wakes. The
//! timeouts on sleeps are left out on purpose: the protocol must be live without them (they
//! only bound latency).

use std::collections::HashSet;

const N: u8 = 2;
const ITEMS: u8 = 3;

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum P {
    CheckSpace,
    SetFlag,
    Recheck,
    Sleep,
    WriteA,
    WriteB,
    Publish,
    /// After a publish: reader `r`'s flag and threshold.
    CheckFlag(u8),
    Wake(u8),
    Close,
    /// Closing wakes reader `r` (every reader, unconditionally).
    CloseWake(u8),
    Done,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum C {
    CheckAvail,
    SetFlag,
    Recheck,
    Sleep,
    ReadA,
    ReadB,
    Release,
    CheckFlag,
    Wake,
    /// Leaving: the block marked closed, then the producer woken.
    Leave,
    LeaveWake,
    Done,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct S<const R: usize> {
    head: u8,
    pflag: bool,
    pev: bool,
    closed: bool,
    /// Each slot is written in two halves, so a read of a half-written slot is detectable.
    slots: [(Option<u8>, Option<u8>); N as usize],
    p: P,
    /// Each reader's block and state.
    tail: [u8; R],
    cflag: [bool; R],
    cev: [bool; R],
    /// The reader's wake threshold (producer index).
    wake_at: [u8; R],
    /// The reader set `CONSUMER_CLOSED`.
    left: [bool; R],
    c: [C; R],
    read_a: [Option<u8>; R],
}

/// Protocol variants; `Mutant::None` is the real protocol.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mutant {
    None,
    /// Consumer sleeps without re-checking after setting its flag.
    NoConsumerRecheck,
    /// Producer sleeps without re-checking after setting its flag.
    NoProducerRecheck,
    /// Producer publishes before writing the second half.
    PublishEarly,
    /// Consumer releases before reading.
    ReleaseEarly,
    /// Producer wakes only past the threshold (`>` for `>=`).
    ThresholdOffByOne,
    /// Closing the ring does not wake a sleeping consumer.
    CloseWithoutWake,
    /// The producer's room counts reader 0 alone.
    RoomOfFirstReader,
    /// A publish checks reader 0's flag alone.
    WakeFirstReaderOnly,
    /// A reader that leaves does not wake the producer.
    LeaveWithoutWake,
}

/// What the model lets readers do besides reading to the end.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Readers {
    Stay,
    /// Any reader may leave whenever it looks for its next batch.
    MayLeave,
}

fn slot(i: u8) -> usize {
    usize::from(i % N)
}

/// Whether the producer may write batch `head`: `Some(true)` free, `Some(false)` full, `None`
/// when no reader is left.
fn room<const R: usize>(s: &S<R>, m: Mutant) -> Option<bool> {
    let counted = if m == Mutant::RoomOfFirstReader { 1 } else { R };
    let mut any = false;
    for r in (0..counted).filter(|&r| !s.left[r]) {
        any = true;
        if s.head - s.tail[r] >= N {
            return Some(false);
        }
    }
    any.then_some(true)
}

/// The producer's step after checking reader `r`'s flag (the next reader, or the next batch).
fn after_flag<const R: usize>(r: u8, m: Mutant) -> P {
    let last = if m == Mutant::WakeFirstReaderOnly {
        1
    } else {
        R
    };
    if usize::from(r) + 1 < last {
        P::CheckFlag(r + 1)
    } else {
        P::CheckSpace
    }
}

/// The producer's successor, if it can move.
fn producer<const R: usize>(s: &S<R>, m: Mutant) -> Option<S<R>> {
    let mut t = *s;
    match s.p {
        P::CheckSpace => {
            t.p = match (s.head == ITEMS, room(s, m)) {
                (true, _) => P::Close,
                (false, None) => P::Done,
                (false, Some(true)) => P::WriteA,
                (false, Some(false)) => P::SetFlag,
            }
        }
        P::SetFlag => {
            t.pflag = true;
            t.p = if m == Mutant::NoProducerRecheck {
                P::Sleep
            } else {
                P::Recheck
            };
        }
        P::Recheck => {
            if room(s, m) != Some(false) {
                t.pflag = false;
                t.p = P::CheckSpace;
            } else {
                t.p = P::Sleep;
            }
        }
        P::Sleep => {
            if !s.pev {
                return None;
            }
            t.pev = false;
            t.pflag = false;
            t.p = P::CheckSpace;
        }
        P::WriteA => {
            t.slots[slot(s.head)].0 = Some(s.head);
            t.p = if m == Mutant::PublishEarly {
                P::Publish
            } else {
                P::WriteB
            };
        }
        P::WriteB => {
            // PublishEarly: the index already moved, so the slot being finished is head - 1.
            let seq = if m == Mutant::PublishEarly {
                s.head - 1
            } else {
                s.head
            };
            t.slots[slot(seq)].1 = Some(seq);
            t.p = if m == Mutant::PublishEarly {
                P::CheckFlag(0)
            } else {
                P::Publish
            };
        }
        P::Publish => {
            t.head += 1;
            t.p = if m == Mutant::PublishEarly {
                P::WriteB
            } else {
                P::CheckFlag(0)
            };
        }
        P::CheckFlag(r) => {
            let i = usize::from(r);
            let reached = if m == Mutant::ThresholdOffByOne {
                s.head > s.wake_at[i]
            } else {
                s.head >= s.wake_at[i]
            };
            t.p = if s.cflag[i] && reached {
                P::Wake(r)
            } else {
                after_flag::<R>(r, m)
            }
        }
        P::Wake(r) => {
            t.cev[usize::from(r)] = true;
            t.p = after_flag::<R>(r, m);
        }
        P::Close => {
            t.closed = true;
            t.p = if m == Mutant::CloseWithoutWake {
                P::Done
            } else {
                P::CloseWake(0)
            };
        }
        // The real producer writes every reader's eventfd on close, unconditionally.
        P::CloseWake(r) => {
            t.cev[usize::from(r)] = true;
            t.p = if usize::from(r) + 1 < R {
                P::CloseWake(r + 1)
            } else {
                P::Done
            };
        }
        P::Done => return None,
    }
    Some(t)
}

/// Reader `r`'s successors (several where it chooses), or the violated property.
fn reader<const R: usize>(
    s: &S<R>,
    r: usize,
    m: Mutant,
    readers: Readers,
) -> Result<Vec<S<R>>, String> {
    let mut t = *s;
    let early = m == Mutant::ReleaseEarly;
    match s.c[r] {
        C::CheckAvail => {
            t.c[r] = if s.tail[r] == ITEMS {
                C::Done
            } else if s.head != s.tail[r] {
                if early {
                    C::Release
                } else {
                    C::ReadA
                }
            } else {
                C::SetFlag
            };
            if readers == Readers::MayLeave && t.c[r] != C::Done {
                let mut u = *s;
                u.c[r] = C::Leave;
                return Ok(vec![t, u]);
            }
        }
        C::SetFlag => {
            // Every threshold the real consumer may pick: one successor per k.
            let next = if m == Mutant::NoConsumerRecheck {
                C::Sleep
            } else {
                C::Recheck
            };
            return Ok((1..=N)
                .map(|k| {
                    let mut u = t;
                    u.wake_at[r] = s.tail[r] + k;
                    u.cflag[r] = true;
                    u.c[r] = next;
                    u
                })
                .collect());
        }
        C::Recheck => {
            if s.head >= s.wake_at[r] || s.closed {
                t.cflag[r] = false;
                t.c[r] = C::CheckAvail;
            } else {
                t.c[r] = C::Sleep;
            }
        }
        C::Sleep => {
            if !s.cev[r] {
                return Ok(vec![]);
            }
            t.cev[r] = false;
            t.cflag[r] = false;
            t.c[r] = C::CheckAvail;
        }
        C::ReadA => {
            // ReleaseEarly already advanced tail: the batch being read is tail - 1.
            let seq = if early { s.tail[r] - 1 } else { s.tail[r] };
            t.read_a[r] = s.slots[slot(seq)].0;
            t.c[r] = C::ReadB;
        }
        C::ReadB => {
            let want = if early { s.tail[r] - 1 } else { s.tail[r] };
            let got = (t.read_a[r], s.slots[slot(want)].1);
            if got != (Some(want), Some(want)) {
                return Err(format!(
                    "torn read of batch {want} by reader {r}: {got:?} in {s:?}"
                ));
            }
            t.read_a[r] = None;
            t.c[r] = if early { C::CheckFlag } else { C::Release };
        }
        C::Release => {
            t.tail[r] += 1;
            t.c[r] = if early { C::ReadA } else { C::CheckFlag };
        }
        C::CheckFlag => t.c[r] = if s.pflag { C::Wake } else { C::CheckAvail },
        C::Wake => {
            t.pev = true;
            t.c[r] = C::CheckAvail;
        }
        C::Leave => {
            t.left[r] = true;
            t.c[r] = if m == Mutant::LeaveWithoutWake {
                C::Done
            } else {
                C::LeaveWake
            };
        }
        // The real consumer kicks the producer's eventfd on close, unconditionally.
        C::LeaveWake => {
            t.pev = true;
            t.c[r] = C::Done;
        }
        C::Done => return Ok(vec![]),
    }
    Ok(vec![t])
}

/// Successors of `s`, or an error naming the violated property.
fn step<const R: usize>(s: &S<R>, m: Mutant, readers: Readers) -> Result<Vec<S<R>>, String> {
    let mut out: Vec<S<R>> = producer(s, m).into_iter().collect();
    for r in 0..R {
        out.extend(reader(s, r, m, readers)?);
    }
    if out.is_empty() && !(s.p == P::Done && s.c.iter().all(|&c| c == C::Done)) {
        return Err(format!("stuck (lost wakeup): {s:?}"));
    }
    Ok(out)
}

/// Explores every reachable state with `R` readers; returns how many, or the first violation.
fn explore<const R: usize>(m: Mutant, readers: Readers) -> Result<usize, String> {
    let init = S::<R> {
        head: 0,
        pflag: false,
        pev: false,
        closed: false,
        slots: [(None, None); N as usize],
        p: P::CheckSpace,
        tail: [0; R],
        cflag: [false; R],
        cev: [false; R],
        wake_at: [0; R],
        left: [false; R],
        c: [C::CheckAvail; R],
        read_a: [None; R],
    };
    let mut seen = HashSet::from([init]);
    let mut stack = vec![init];
    while let Some(s) = stack.pop() {
        for t in step(&s, m, readers)? {
            if seen.insert(t) {
                stack.push(t);
            }
        }
    }
    Ok(seen.len())
}

/// The first violation `m` leads to, with one reader and with two: it must be caught in both
/// (each reader follows the one-reader protocol on its own block).
fn caught(m: Mutant) -> [String; 2] {
    [
        explore::<1>(m, Readers::Stay).unwrap_err(),
        explore::<2>(m, Readers::Stay).unwrap_err(),
    ]
}

#[test]
fn protocol_has_no_lost_wakeup_or_torn_read() {
    let one = explore::<1>(Mutant::None, Readers::Stay).unwrap();
    assert!(one > 100, "explored only {one} states");
    let two = explore::<2>(Mutant::None, Readers::Stay).unwrap();
    assert!(
        two > 10 * one,
        "explored only {two} states with two readers"
    );
}

#[test]
fn readers_that_leave_at_any_point_hold_up_no_one() {
    for states in [
        explore::<1>(Mutant::None, Readers::MayLeave).unwrap(),
        explore::<2>(Mutant::None, Readers::MayLeave).unwrap(),
    ] {
        assert!(states > 100, "explored only {states} states");
    }
}

#[test]
fn checker_catches_missing_consumer_recheck() {
    for e in caught(Mutant::NoConsumerRecheck) {
        assert!(e.starts_with("stuck"), "{e}");
    }
}

#[test]
fn checker_catches_missing_producer_recheck() {
    for e in caught(Mutant::NoProducerRecheck) {
        assert!(e.starts_with("stuck"), "{e}");
    }
}

#[test]
fn checker_catches_publish_before_write() {
    for e in caught(Mutant::PublishEarly) {
        assert!(e.starts_with("torn"), "{e}");
    }
}

#[test]
fn checker_catches_release_before_read() {
    for e in caught(Mutant::ReleaseEarly) {
        assert!(e.starts_with("torn"), "{e}");
    }
}

#[test]
fn checker_catches_an_off_by_one_wake_threshold() {
    for e in caught(Mutant::ThresholdOffByOne) {
        assert!(e.starts_with("stuck"), "{e}");
    }
}

#[test]
fn checker_catches_a_close_that_does_not_wake() {
    for e in caught(Mutant::CloseWithoutWake) {
        assert!(e.starts_with("stuck"), "{e}");
    }
}

#[test]
fn checker_catches_room_that_counts_one_reader_of_two() {
    explore::<1>(Mutant::RoomOfFirstReader, Readers::Stay).unwrap();
    let e = explore::<2>(Mutant::RoomOfFirstReader, Readers::Stay).unwrap_err();
    assert!(e.starts_with("torn read of batch 0 by reader 1"), "{e}");
}

#[test]
fn checker_catches_a_publish_that_wakes_one_reader_of_two() {
    explore::<1>(Mutant::WakeFirstReaderOnly, Readers::Stay).unwrap();
    let e = explore::<2>(Mutant::WakeFirstReaderOnly, Readers::Stay).unwrap_err();
    assert!(e.starts_with("stuck"), "{e}");
}

#[test]
fn checker_catches_a_reader_that_leaves_without_waking_the_producer() {
    explore::<2>(Mutant::LeaveWithoutWake, Readers::Stay).unwrap();
    let e = explore::<2>(Mutant::LeaveWithoutWake, Readers::MayLeave).unwrap_err();
    assert!(e.starts_with("stuck"), "{e}");
}
