//! Start-up cost: a plan over 10^12 tokens gives its first samples at once, in O(#sources)
//! memory. A counting allocator measures every byte allocated on the way: it counts the
//! whole process's allocations, which is why these tests are a binary of their own, outside
//! `tests/it`, where no other test allocates beside them.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use dquant_plan::{Cursor, Plan, Schedule, Source, SourceInfo};

struct Counting;

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn first_thousand_samples_of_a_terabyte_token_plan() {
    let weights = [0.5, 0.3, 0.15, 0.05];
    let tokens = [4e11 as u64, 3e11 as u64, 2e11 as u64, 1e11 as u64]; // 10^12 in all
    let mut plan = Plan::new(
        weights
            .iter()
            .enumerate()
            .map(|(d, &w)| Source::new(format!("/data/shard{d}")).weight(w))
            .collect(),
        4096,
        8,
    );
    (plan.seed, plan.rank, plan.world, plan.epochs) = (42, 5, 8, Some(3));
    let infos: Vec<SourceInfo> = tokens.iter().map(|&tokens| SourceInfo { tokens }).collect();

    let before = ALLOCATED.load(Ordering::Relaxed);
    let t0 = Instant::now();
    let schedule = Schedule::new(&plan, &infos).unwrap();
    let mut checksum = 0u64;
    let mut n = 0;
    for r in schedule.iter_rank(Cursor::START).unwrap().take(1000) {
        checksum = checksum
            .wrapping_mul(31)
            .wrapping_add(r.tokens.start ^ r.source as u64);
        n += 1;
    }
    let elapsed = t0.elapsed();
    let bytes = ALLOCATED.load(Ordering::Relaxed) - before;
    println!(
        "10^12 tokens, {} samples: schedule + first 1000 samples of rank 5/8 in {:?}, {bytes} bytes allocated",
        schedule.total_samples(),
        elapsed
    );
    assert_eq!(n, 1000);
    assert_ne!(checksum, 0);
    assert_eq!(
        schedule.total_samples(),
        3 * tokens.iter().map(|t| (t - 1) / 4096).sum::<u64>()
    );
    assert!(elapsed.as_secs_f64() < 1.0, "{elapsed:?}");
    // A handful of O(#sources) vectors; an index over 7e8 samples would be gigabytes.
    assert!(bytes < 4096, "{bytes} bytes allocated");

    // Resuming deep into the plan is bounded by the replay, and still allocates nothing big.
    let before = ALLOCATED.load(Ordering::Relaxed);
    let t0 = Instant::now();
    let c = schedule.cursor_at(2_000_000);
    let first = schedule.iter_rank(c).unwrap().next().unwrap();
    let elapsed = t0.elapsed();
    println!("resume at 2e6 consumed samples: {elapsed:?}");
    assert_eq!(first.global, 2_000_005);
    assert!(ALLOCATED.load(Ordering::Relaxed) - before < 4096);
}
