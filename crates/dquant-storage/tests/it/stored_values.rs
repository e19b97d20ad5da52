//! Stored values that are not token ids: a negative int32 in a Megatron `.bin` fails every
//! read that meets it, naming the file, the value and its offset, and reads around it are the
//! stored tokens. int32 is read straight into the caller's buffer and checked there (not
//! loaded from a read buffer), so the message must be the load's, whichever path reads it.

use dquant_storage::{Dataset, OpenOptions};
use dquant_testkit::copy_fixture;

use crate::common::tokens;

#[test]
fn a_negative_int32_fails_the_reads_that_meet_it_and_only_those() {
    let dir = tempfile::tempdir().unwrap();
    let x = dir.path().join("x");
    copy_fixture("r50k_int32", &x);
    let good = Dataset::open(&x, &OpenOptions::default()).unwrap();
    let n = good.tokens();
    let want: Vec<Result<Vec<u32>, String>> = [0..1000, 1001..5000, 0..1, n - 3..n]
        .into_iter()
        .map(|r| tokens(&good, r))
        .collect();

    let bin = dir.path().join("x.bin");
    let mut b = std::fs::read(&bin).unwrap();
    b[4000..4004].copy_from_slice(&(-7i32).to_le_bytes());
    b[4 * (n as usize - 2)..4 * (n as usize - 1)].copy_from_slice(&i32::MIN.to_le_bytes());
    std::fs::write(&bin, b).unwrap();
    let bad = Dataset::open(&x, &OpenOptions::default()).unwrap();

    for (r, w) in [0..1000, 1001..5000, 0..1, n - 3..n].into_iter().zip(&want) {
        if r.end < n - 2 {
            assert_eq!(&tokens(&bad, r.clone()), w, "{r:?}");
        }
    }
    let msg = |v: i64, at: u64| {
        format!(
            "{}: stored value {v} at offset {at} is not a token id (i32 data must hold 0..=4294967295)",
            bin.display()
        )
    };
    for r in [1000..1001, 990..1010, 0..n] {
        assert_eq!(tokens(&bad, r.clone()), Err(msg(-7, 1000)), "{r:?}");
    }
    assert_eq!(tokens(&bad, n - 3..n), Err(msg(i32::MIN as i64, n - 2)));
}
