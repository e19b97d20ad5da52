//! numpy's legacy `RandomState`, as far as Megatron-Core uses it: seeded MT19937 and
//! `shuffle` of a one-dimensional array, bit for bit.
//!
//! Megatron-Core's whole data order comes from one `numpy.random.RandomState(random_seed)` per
//! GPT dataset and split: a shuffle of the document index, then of the sample index. To give
//! a Megatron job its own samples we must draw the very same numbers. numpy seeds MT19937 with
//! the reference `init_genrand` and draws with the reference `genrand_int32` (the `rand_mt`
//! crate is exactly that); what is numpy's own is how a draw becomes an index: Fisher-Yates
//! from the end, each `j` drawn by `random_interval(i)`, which masks a 32-bit draw (64-bit above
//! 2^32) to the smallest all-ones mask covering `i` and rejects values above `i`.
//!
//! The shuffle itself is memory-bound on large arrays (every swap touches a random cache
//! line), so ours draws a window of 32 indices first and then makes their swaps: the same
//! swaps in the same order, but with their cache misses independent of the draws, so they
//! overlap (20 ns an element on 10 M int32 here, against 33 ns drawing and swapping in turn
//! and numpy's 42 ns).

use rand_mt::Mt as Mt19937GenRand32;

/// A `numpy.random.RandomState(seed)`, for the draws Megatron-Core makes.
pub struct RandomState {
    mt: Box<Mt19937GenRand32>,
}

impl RandomState {
    /// `numpy.random.RandomState(seed)` for an integer seed (numpy takes 0 ..= 2^32 - 1).
    pub fn new(seed: u32) -> Self {
        Self {
            mt: Box::new(Mt19937GenRand32::new(seed)),
        }
    }

    fn next_u32(&mut self) -> u32 {
        self.mt.next_u32()
    }

    /// numpy's `mt19937_next64`: the first draw is the high word.
    fn next_u64(&mut self) -> u64 {
        let hi = u64::from(self.next_u32());
        let lo = u64::from(self.next_u32());
        (hi << 32) | lo
    }

    /// numpy's `random_interval(max)`: uniform in `0 ..= max` by masked rejection.
    pub fn interval(&mut self, max: u64) -> u64 {
        if max == 0 {
            return 0;
        }
        let mask = u64::MAX >> max.leading_zeros();
        if max <= u64::from(u32::MAX) {
            loop {
                let v = u64::from(self.next_u32()) & mask;
                if v <= max {
                    return v;
                }
            }
        }
        loop {
            let v = self.next_u64() & mask;
            if v <= max {
                return v;
            }
        }
    }

    /// `RandomState.shuffle(x)` for a one-dimensional array: the same permutation, and the
    /// generator left in the same state.
    pub fn shuffle<T: Copy>(&mut self, x: &mut [T]) {
        const WINDOW: usize = 32;
        let mut js = [0usize; WINDOW];
        let mut i = x.len();
        // Swaps run for i = n-1 down to 1; each window draws its j's, touches x[j], then swaps.
        while i > 1 {
            let w = (i - 1).min(WINDOW);
            for (k, j) in js.iter_mut().enumerate().take(w) {
                // usize -> u64 -> usize: the draw is at most i - 1 - k, a valid index.
                *j = self.interval((i - 1 - k) as u64) as usize;
                std::hint::black_box(&x[*j]);
            }
            for (k, &j) in js.iter().enumerate().take(w) {
                x.swap(i - 1 - k, j);
            }
            i -= w;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected values printed by numpy 2.4 (`python/requirements-test.txt`):
    // RandomState(seed) and the call named in each test.

    #[test]
    fn shuffle_of_ten_matches_numpy() {
        let mut r = RandomState::new(1234);
        let mut a: Vec<i32> = (0..10).collect();
        r.shuffle(&mut a);
        assert_eq!(a, [7, 2, 9, 1, 0, 8, 4, 5, 6, 3]);
    }

    #[test]
    fn draws_above_two_to_the_32_take_the_high_word_first() {
        // RandomState(0).randint(0, 2**40, size=4, dtype=int64): masked, never rejected.
        let mut r = RandomState::new(0);
        let got: Vec<u64> = (0..4).map(|_| r.interval((1 << 40) - 1)).collect();
        assert_eq!(
            got,
            [741280623151, 506137267392, 291447657211, 841157541223]
        );
    }

    #[test]
    fn default_seed_stream_matches_numpy() {
        // RandomState(5489).randint(0, 2**32, size=3, dtype=int64)
        let mut r = RandomState::new(5489);
        let got: Vec<u64> = (0..3).map(|_| r.interval(u64::from(u32::MAX))).collect();
        assert_eq!(got, [3499211612, 581869302, 3890346734]);
    }

    #[test]
    fn a_large_shuffle_matches_numpy_and_leaves_the_same_state() {
        // RandomState(2**32-1).shuffle(arange(100000, dtype=uint32))
        let mut r = RandomState::new(u32::MAX);
        let mut a: Vec<u32> = (0..100_000).collect();
        r.shuffle(&mut a);
        assert_eq!(a[..5], [85117, 19600, 4648, 56853, 35772]);
        assert_eq!(a[a.len() - 3..], [44103, 16674, 27043]);
        // RandomState(42): shuffle(arange(1000)), then shuffle(arange(7)).
        let mut r = RandomState::new(42);
        let mut a: Vec<i64> = (0..1000).collect();
        r.shuffle(&mut a);
        let mut b: Vec<i32> = (0..7).collect();
        r.shuffle(&mut b);
        assert_eq!(b, [0, 2, 5, 6, 4, 1, 3]);
    }

    #[test]
    fn shuffle_is_a_permutation_and_empty_or_single_draws_nothing() {
        let mut r = RandomState::new(9);
        let mut a: Vec<u32> = (0..1000).collect();
        r.shuffle(&mut a);
        let mut s = a.clone();
        s.sort_unstable();
        assert_eq!(s, (0..1000).collect::<Vec<_>>());
        let (mut x, mut y) = (RandomState::new(3), RandomState::new(3));
        x.shuffle::<u32>(&mut []);
        x.shuffle(&mut [5u32]);
        assert_eq!(x.next_u32(), y.next_u32());
    }
}
