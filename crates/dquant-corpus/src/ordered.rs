//! Ordered parallel map: items tokenized on worker threads, consumed in their input order.
//!
//! Apart from the corpus because it is a general tool with its own invariants (order kept,
//! memory bounded by a window, a worker's panic re-raised in the consumer, no deadlock when the
//! consumer stops), tested here on its own. Written here because `rayon` gives results in
//! order only by collecting them all first; this streams them, holding at most `window`.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// State shared by the workers and the consumer of [`ordered_parallel`].
struct Pipeline<T> {
    state: Mutex<PipelineState<T>>,
    /// Signalled when the window moves or the run stops.
    workers: Condvar,
    /// Signalled when a result is ready.
    consumer: Condvar,
}

struct PipelineState<T> {
    /// Next item index a worker will take.
    next_claim: usize,
    /// Next item index the consumer waits for.
    next_emit: usize,
    /// Finished items not yet consumed, by index (`Err`: the work panicked).
    ready: BTreeMap<usize, std::thread::Result<T>>,
    /// Set when the consumer is done (finished, failed or panicking): workers exit.
    stop: bool,
}

impl<T> Pipeline<T> {
    /// The next item for a worker to work on, once it is within `window` of the consumer;
    /// `None` when there is none left or the run stopped.
    fn claim(&self, n: usize, window: usize) -> Option<usize> {
        let mut st = self.lock();
        loop {
            if st.stop || st.next_claim >= n {
                return None;
            }
            if st.next_claim < st.next_emit + window {
                break;
            }
            st = self
                .workers
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner);
        }
        st.next_claim += 1;
        Some(st.next_claim - 1)
    }

    /// Item `i`'s result (or its worker's panic), once it is there.
    fn take(&self, i: usize) -> std::thread::Result<T> {
        let mut st = self.lock();
        loop {
            if let Some(out) = st.ready.remove(&i) {
                st.next_emit = i + 1;
                return out;
            }
            st = self
                .consumer
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn lock(&self) -> MutexGuard<'_, PipelineState<T>> {
        // Nothing panics while holding the lock; if it ever did, the state is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Sets `stop` when the consumer leaves, including by panic from its callback, so that
/// `thread::scope` never waits on workers blocked for a window that will not move.
struct StopOnDrop<'a, T>(&'a Pipeline<T>);

impl<T> Drop for StopOnDrop<'_, T> {
    fn drop(&mut self) {
        self.0.lock().stop = true;
        self.0.workers.notify_all();
    }
}

/// Runs `work(&mut state, i)` for `i in 0..n` on `threads` threads, each with its own
/// `state = init(worker_index)` (made on that thread), and feeds the results to `consume` in
/// index order on the calling thread. At most `window` items are claimed but not yet consumed,
/// which bounds memory. Stops at the first error from `consume`.
pub(crate) fn ordered_parallel<S, T, I, W, C, E>(
    n: usize,
    threads: usize,
    window: usize,
    init: I,
    work: W,
    mut consume: C,
) -> Result<(), E>
where
    T: Send,
    I: Fn(usize) -> S + Sync,
    W: Fn(&mut S, usize) -> T + Sync,
    C: FnMut(T) -> Result<(), E>,
{
    let window = window.max(1);
    let pipeline = Pipeline {
        state: Mutex::new(PipelineState {
            next_claim: 0,
            next_emit: 0,
            ready: BTreeMap::new(),
            stop: false,
        }),
        workers: Condvar::new(),
        consumer: Condvar::new(),
    };
    std::thread::scope(|scope| {
        let _stop = StopOnDrop(&pipeline);
        for worker in 0..threads {
            let (init, work, pipeline) = (&init, &work, &pipeline);
            scope.spawn(move || {
                // Made on the worker's first item, inside `catch_unwind` like `work`, so that a
                // panic there is reported the same way (and retried on the next item).
                let mut state: Option<S> = None;
                loop {
                    let Some(i) = pipeline.claim(n, window) else {
                        return;
                    };
                    // A panicking `work` must not leave the consumer waiting for item `i`
                    // forever: the panic is carried over and resumed on the consumer's thread.
                    let out = catch_unwind(AssertUnwindSafe(|| {
                        work(state.get_or_insert_with(|| init(worker)), i)
                    }));
                    pipeline.lock().ready.insert(i, out);
                    pipeline.consumer.notify_one();
                }
            });
        }
        for i in 0..n {
            let out = pipeline.take(i);
            pipeline.workers.notify_all();
            match out {
                Ok(out) => consume(out)?,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordered_parallel_keeps_order_and_propagates_worker_panics() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let started = AtomicUsize::new(0);
        let inits = AtomicUsize::new(0);
        let mut got = Vec::new();
        let r: Result<(), ()> = ordered_parallel(
            200,
            3,
            4,
            |worker| {
                inits.fetch_add(1, Ordering::SeqCst);
                (worker, 0usize)
            },
            |(worker, items), i| {
                // Per-worker state stays with its worker.
                assert!(*worker < 3);
                *items += 1;
                started.fetch_add(1, Ordering::SeqCst);
                // Later items finish first.
                std::thread::sleep(std::time::Duration::from_micros(
                    ((200 - i) % 7) as u64 * 50,
                ));
                i * 2
            },
            |v| {
                // Bounded memory: no more than `window` (4) items beyond the one consumed.
                assert!(started.load(Ordering::SeqCst) <= v / 2 + 1 + 4);
                got.push(v);
                Ok(())
            },
        );
        assert_eq!(r, Ok(()));
        assert_eq!(got, (0..200).map(|i| i * 2).collect::<Vec<_>>());
        assert!((1..=3).contains(&inits.load(Ordering::SeqCst)));

        let r = std::panic::catch_unwind(|| {
            ordered_parallel(
                10,
                2,
                2,
                |_| (),
                |_, i| {
                    if i == 3 {
                        panic!("worker panics on purpose")
                    } else {
                        i
                    }
                },
                |_| Ok::<(), ()>(()),
            )
        });
        assert!(r.is_err());
    }
}
