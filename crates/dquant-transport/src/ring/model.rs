//! Exhaustive check of the ring's index / need-wakeup protocol.
//!
//! The producer and consumer (`ring::producer`, `ring::consumer`, sleeping in `ring::wake`)
//! are modelled as small state machines whose steps are the shared-memory accesses and
//! syscalls of the real code (the SeqCst fences make the flag/index handshake sequentially
//! consistent, so interleavings of steps are the executions to explore). Every interleaving
//! for `N` slots and `ITEMS` batches is explored; the checks:
//! no reachable state is stuck (a lost wakeup shows up as both sides asleep, or one asleep with
//! nothing left to wake it) and the consumer never reads a slot that is not exactly the batch it
//! expects (torn or overwritten). Mutants with a step removed must fail, which shows the
//! checker can see each bug.
//!
//! Wake-up batching is modelled too: a consumer about to sleep picks any threshold
//! `k` in `1..=N` (every choice is explored) and the producer wakes it only once its index
//! reaches `tail + k`; the producer closes the ring after the last batch, which always wakes.
//! The consumer's timeout on such sleeps is left out on purpose: the protocol must be live
//! without it (the timeout only bounds latency).

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
    CheckFlag,
    Wake,
    Close,
    CloseWake,
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
    Done,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct S {
    head: u8,
    tail: u8,
    cflag: bool,
    pflag: bool,
    cev: bool,
    pev: bool,
    /// The consumer's wake threshold (producer index).
    wake_at: u8,
    closed: bool,
    /// Each slot is written in two halves, so a read of a half-written slot is detectable.
    slots: [(Option<u8>, Option<u8>); N as usize],
    p: P,
    c: C,
    read_a: Option<u8>,
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
}

fn slot(i: u8) -> usize {
    usize::from(i % N)
}

/// Successors of `s`, or an error naming the violated property.
fn step(s: &S, m: Mutant) -> Result<Vec<S>, String> {
    let mut out = Vec::new();
    // Producer.
    let mut t = *s;
    let mut moved = true;
    match s.p {
        P::CheckSpace => {
            t.p = if s.head == ITEMS {
                P::Close
            } else if s.head - s.tail < N {
                P::WriteA
            } else {
                P::SetFlag
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
            if s.head - s.tail < N {
                t.pflag = false;
                t.p = P::WriteA;
            } else {
                t.p = P::Sleep;
            }
        }
        P::Sleep => {
            if s.pev {
                t.pev = false;
                t.pflag = false;
                t.p = P::CheckSpace;
            } else {
                moved = false;
            }
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
                P::CheckFlag
            } else {
                P::Publish
            };
        }
        P::Publish => {
            t.head += 1;
            t.p = if m == Mutant::PublishEarly {
                P::WriteB
            } else {
                P::CheckFlag
            };
        }
        P::CheckFlag => {
            let reached = if m == Mutant::ThresholdOffByOne {
                s.head > s.wake_at
            } else {
                s.head >= s.wake_at
            };
            t.p = if s.cflag && reached {
                P::Wake
            } else {
                P::CheckSpace
            }
        }
        P::Wake => {
            t.cev = true;
            t.p = P::CheckSpace;
        }
        P::Close => {
            t.closed = true;
            t.p = if m == Mutant::CloseWithoutWake {
                P::Done
            } else {
                P::CloseWake
            };
        }
        // The real producer writes the eventfd on close unconditionally.
        P::CloseWake => {
            t.cev = true;
            t.p = P::Done;
        }
        P::Done => moved = false,
    }
    if moved {
        out.push(t);
    }
    // Consumer.
    let mut t = *s;
    let mut moved = true;
    match s.c {
        C::CheckAvail => {
            t.c = if s.tail == ITEMS {
                C::Done
            } else if s.head != s.tail {
                if m == Mutant::ReleaseEarly {
                    C::Release
                } else {
                    C::ReadA
                }
            } else {
                C::SetFlag
            }
        }
        C::SetFlag => {
            // Every threshold the real consumer may pick: one successor per k.
            for k in 1..=N {
                let mut u = t;
                u.wake_at = s.tail + k;
                u.cflag = true;
                u.c = if m == Mutant::NoConsumerRecheck {
                    C::Sleep
                } else {
                    C::Recheck
                };
                out.push(u);
            }
            moved = false;
        }
        C::Recheck => {
            if s.head >= s.wake_at || s.closed {
                t.cflag = false;
                t.c = C::CheckAvail;
            } else {
                t.c = C::Sleep;
            }
        }
        C::Sleep => {
            if s.cev {
                t.cev = false;
                t.cflag = false;
                t.c = C::CheckAvail;
            } else {
                moved = false;
            }
        }
        C::ReadA => {
            // ReleaseEarly already advanced tail: the batch being read is tail - 1.
            let seq = if m == Mutant::ReleaseEarly {
                s.tail - 1
            } else {
                s.tail
            };
            t.read_a = s.slots[slot(seq)].0;
            t.c = C::ReadB;
        }
        C::ReadB => {
            let want = if m == Mutant::ReleaseEarly {
                s.tail - 1
            } else {
                s.tail
            };
            let got = (t.read_a, s.slots[slot(want)].1);
            if got != (Some(want), Some(want)) {
                return Err(format!("torn read of batch {want}: {got:?} in {s:?}"));
            }
            t.read_a = None;
            t.c = if m == Mutant::ReleaseEarly {
                C::CheckFlag
            } else {
                C::Release
            };
        }
        C::Release => {
            t.tail += 1;
            t.c = if m == Mutant::ReleaseEarly {
                C::ReadA
            } else {
                C::CheckFlag
            };
        }
        C::CheckFlag => t.c = if s.pflag { C::Wake } else { C::CheckAvail },
        C::Wake => {
            t.pev = true;
            t.c = C::CheckAvail;
        }
        C::Done => moved = false,
    }
    if moved {
        out.push(t);
    }
    if out.is_empty() && !(s.p == P::Done && s.c == C::Done) {
        return Err(format!("stuck (lost wakeup): {s:?}"));
    }
    Ok(out)
}

/// Explores every reachable state; returns how many, or the first violation.
fn explore(m: Mutant) -> Result<usize, String> {
    let init = S {
        head: 0,
        tail: 0,
        cflag: false,
        pflag: false,
        cev: false,
        pev: false,
        wake_at: 0,
        closed: false,
        slots: [(None, None); N as usize],
        p: P::CheckSpace,
        c: C::CheckAvail,
        read_a: None,
    };
    let mut seen = HashSet::from([init]);
    let mut stack = vec![init];
    while let Some(s) = stack.pop() {
        for t in step(&s, m)? {
            if seen.insert(t) {
                stack.push(t);
            }
        }
    }
    Ok(seen.len())
}

#[test]
fn protocol_has_no_lost_wakeup_or_torn_read() {
    let states = explore(Mutant::None).unwrap();
    assert!(states > 100, "explored only {states} states");
}

#[test]
fn checker_catches_missing_consumer_recheck() {
    let e = explore(Mutant::NoConsumerRecheck).unwrap_err();
    assert!(e.starts_with("stuck"), "{e}");
}

#[test]
fn checker_catches_missing_producer_recheck() {
    let e = explore(Mutant::NoProducerRecheck).unwrap_err();
    assert!(e.starts_with("stuck"), "{e}");
}

#[test]
fn checker_catches_publish_before_write() {
    let e = explore(Mutant::PublishEarly).unwrap_err();
    assert!(e.starts_with("torn"), "{e}");
}

#[test]
fn checker_catches_release_before_read() {
    let e = explore(Mutant::ReleaseEarly).unwrap_err();
    assert!(e.starts_with("torn"), "{e}");
}

#[test]
fn checker_catches_an_off_by_one_wake_threshold() {
    let e = explore(Mutant::ThresholdOffByOne).unwrap_err();
    assert!(e.starts_with("stuck"), "{e}");
}

#[test]
fn checker_catches_a_close_that_does_not_wake() {
    let e = explore(Mutant::CloseWithoutWake).unwrap_err();
    assert!(e.starts_with("stuck"), "{e}");
}
