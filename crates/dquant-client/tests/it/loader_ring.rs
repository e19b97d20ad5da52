//! DataLoader workers' rings (`serve_loader_ring` on one end, `Reader::from_loader_ring` on
//! the other): the loop gets exactly the stream the plan gives in-process, with its cursors
//! and document starts, and every way a worker can fail reaches the loop as the worker's own
//! error.

use std::os::unix::net::UnixStream;
use std::thread;

use dquant_client::{serve_loader_ring, Reader};
use dquant_plan::{Boundaries, Cursor, OutputDType, Plan, Source};
use dquant_testkit::fixture_str;
use dquant_testkit::stream::drain;

/// Two sources blended 3:1, shuffled, with document starts at the EOD token: every trailer
/// section a worker's records carry (documents, the blend's counts).
fn plan() -> Plan {
    let mut a = Source::new(fixture_str("r50k_int32"));
    a.weight = 3.0;
    let b = Source::new(fixture_str("r50k_int32"));
    let mut p = Plan::new(vec![a, b], 127, 4);
    p.seed = 11;
    p.shuffle = true;
    p.output = OutputDType::I32;
    p.boundaries = Some(Boundaries::Eod);
    p.eod = Some(50256);
    p
}

/// A reader of `plan` from `cursor` through a worker thread's ring of `slots` slots, and the
/// worker's result once it ends.
fn through_worker(
    plan: &Plan,
    cursor: Cursor,
    slots: u32,
) -> (
    Result<Reader, String>,
    thread::JoinHandle<Result<(), String>>,
) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let (p, c) = (plan.clone(), cursor.clone());
    let worker = thread::spawn(move || serve_loader_ring(&p, c, theirs).map_err(|e| e.to_string()));
    let r = Reader::from_loader_ring(plan, ours, slots).map_err(|e| e.to_string());
    (r, worker)
}

#[test]
fn a_worker_ring_delivers_the_in_process_stream_with_its_cursors() {
    let p = plan();
    let mut local = Reader::local(&p, Cursor::START).unwrap();
    // A resume point in the middle, with the blend's counts, as a loop's state holds it.
    for _ in 0..3 {
        local.next_batch().unwrap().unwrap();
    }
    let middle = local.cursor();
    assert!(!middle.blend.is_empty());
    for from in [Cursor::START, middle] {
        let mut want = Reader::local(&p, from.clone()).unwrap();
        let (r, worker) = through_worker(&p, from.clone(), 4);
        let mut got = r.unwrap();
        assert_eq!(got.rank_batches(), want.rank_batches());
        assert_eq!(got.rank_samples(), want.rank_samples());
        assert_eq!(
            got.cursor(),
            want.cursor(),
            "before the first batch, from {from:?}"
        );
        loop {
            let (g, w) = (got.next_owned().unwrap(), want.next_owned().unwrap());
            let (Some(g), Some(w)) = (g, w) else {
                break;
            };
            assert!(g.in_ring());
            assert_eq!(g.bytes(), w.bytes(), "batch {}", w.index);
            assert_eq!(g.docs, w.docs, "batch {}", w.index);
            assert_eq!((g.index, g.samples), (w.index, w.samples));
            assert_eq!(got.cursor(), want.cursor(), "after batch {}", w.index);
        }
        assert!(
            want.next_owned().unwrap().is_none(),
            "the worker's stream ended early"
        );
        assert!(got.next_owned().unwrap().is_none());
        assert_eq!(got.source_use(), want.source_use());
        worker.join().unwrap().unwrap();
    }
}

#[test]
fn a_loop_that_keeps_every_batch_of_a_small_ring_still_gets_the_whole_stream() {
    let p = plan();
    let (want, _) = drain(&mut Reader::local(&p, Cursor::START).unwrap());
    let (r, worker) = through_worker(&p, Cursor::START, 2);
    let mut r = r.unwrap();
    // All batches held at once: the ring copies out kept ones to make room.
    let mut kept = Vec::new();
    while let Some(b) = r.next_owned().unwrap() {
        kept.push(b);
        r.make_room().unwrap();
    }
    let got: Vec<u8> = kept.iter().flat_map(|b| b.bytes().to_vec()).collect();
    assert_eq!(got, want);
    worker.join().unwrap().unwrap();
}

#[test]
fn a_plan_the_worker_cannot_open_fails_the_loop_with_the_workers_error() {
    let mut p = plan();
    p.sources[1] = Source::new("/nonexistent/dquant-loader-ring/corpus");
    let local = Reader::local(&p, Cursor::START).err().unwrap().to_string();
    let (r, worker) = through_worker(&p, Cursor::START, 4);
    assert_eq!(r.err().unwrap(), local);
    assert_eq!(worker.join().unwrap().unwrap_err(), local);
}

#[test]
fn closing_the_loop_ends_the_worker() {
    let (r, worker) = through_worker(&plan(), Cursor::START, 2);
    let mut r = r.unwrap();
    r.next_owned().unwrap().unwrap();
    drop(r);
    assert_eq!(worker.join().unwrap(), Ok(()));
}

#[test]
fn a_worker_that_goes_away_before_its_plan_is_open_is_an_error() {
    let (ours, theirs) = UnixStream::pair().unwrap();
    drop(theirs);
    let e = Reader::from_loader_ring(&plan(), ours, 4).err().unwrap();
    assert!(
        e.to_string().starts_with("DataLoader worker"),
        "unexpected error: {e}"
    );
}
