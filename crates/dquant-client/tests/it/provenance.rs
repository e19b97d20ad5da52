//! `provenance = true`: each batch carries its samples' origins, equal to what `locate`
//! computes from the plan alone, and the same in-process, over TCP (in any wire codec), over
//! shared memory and over loopback, with boundaries or without, and after a resume. A source
//! without a document index is refused at open, by name.

use dquant_client::{open, open_at, Offload, Provenance, Reader};
use dquant_plan::{Boundaries, Cursor, OriginPiece, Plan};
use dquant_testkit::agent::{plan, Corpus};

/// Every batch's origins: per batch, per sample, its pieces.
type Origins = Vec<Vec<Vec<OriginPiece>>>;

fn drain_origins(r: &mut Reader) -> Origins {
    let mut out = Vec::new();
    while let Some(b) = r.next_batch().unwrap() {
        let o = b.origins.expect("the plan has provenance");
        assert_eq!(o.samples(), b.samples);
        out.push((0..b.samples).map(|k| o.sample(k).collect()).collect());
    }
    assert!(!out.is_empty(), "the plan yields data");
    out
}

/// What `locate` says of each sample of the rank's stream, batch by batch.
fn located(p: &Plan, batches: usize) -> Origins {
    let mut prov = Provenance::open(p).unwrap();
    let (world, rank, bs) = (
        u64::from(p.world),
        u64::from(p.rank),
        u64::from(p.batch_size),
    );
    let rank_samples = prov.schedule().rank_samples();
    (0..batches as u64)
        .map(|b| {
            (b * bs..((b + 1) * bs).min(rank_samples))
                .map(|local| {
                    let at = prov.locate(local * world + rank).unwrap();
                    at.pieces
                        .iter()
                        .map(|x| OriginPiece {
                            source: x.source as u32,
                            document: x.document,
                            offset: x.offset,
                            length: x.length as u32,
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}

#[test]
fn origins_match_locate_through_every_transport() {
    let c = Corpus::new();
    let (agent, sock) = c.agent_with_socket();
    let tcp = agent.uri();
    let loopback = format!("{tcp}?transport=loopback");
    for (world, codec, boundaries) in [
        (1, "auto", false),
        (3, "auto+zstd:1", true),
        (2, "bits:18+lz4", false),
    ] {
        let mut p = plan(&[("r50k.dqb", 0.6), ("wide", 0.4)], 200, 5);
        p.samples = Some(240);
        p.wire_codec = codec.into();
        p.world = world;
        p.rank = world - 1;
        p.provenance = true;
        p.boundaries = boundaries.then_some(Boundaries::Documents);
        let local = c.localized(&p);
        let want = drain_origins(&mut Reader::local(&local, Cursor::START).unwrap());
        assert_eq!(want, located(&local, want.len()), "world {world}: locate");
        for uri in [&tcp, &sock, &loopback] {
            let got = drain_origins(&mut open(uri, &p, Offload::Yes).unwrap());
            assert_eq!(got, want, "world {world} {codec} via {uri}");
        }
        // Resumed from a cursor: the origins of the rest, unchanged.
        let mut r = open(&tcp, &p, Offload::Yes).unwrap();
        r.next_batch().unwrap().unwrap();
        let rest = drain_origins(&mut open_at(&tcp, &p, r.cursor(), Offload::Yes).unwrap());
        assert_eq!(rest[..], want[1..], "world {world} resumed");
    }
}

#[test]
fn a_source_without_an_index_is_refused_for_provenance() {
    let c = Corpus::new();
    let storage = c.agent();
    let (near, _empty) = c.near_agent(&storage);
    let mut p = plan(&[("wide", 1.0)], 100, 2);
    p.provenance = true;
    p.sources[0].uri = format!("{}/corpus/wide", storage.uri());
    let Err(err) = open(&near.uri(), &p, Offload::Yes) else {
        panic!("a provenance plan over a dquant:// source opened")
    };
    let err = err.to_string();
    assert!(
        err.contains(
            "provenance = true needs each source's document index, and this source does not \
             carry one (a dataset on another agent)"
        ),
        "{err}"
    );
}
