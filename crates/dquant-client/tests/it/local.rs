//! In-process reading of plans: every path to the bytes agrees, on real Megatron data.

use std::path::Path;

use dquant_client::{ClientError, Reader, Tokens};
use dquant_codec::Codec;
use dquant_format::{DType, DocIndexBuilder};
use dquant_plan::{Cursor, OutputDType, Plan, Source};
use dquant_storage::{Dataset, DatasetWriter, OpenOptions, OutputFormat};
use dquant_testkit::agent::write_block_copy;
use dquant_testkit::fixture_str;
use dquant_testkit::stream::{drain, read_all};

fn plan(sources: Vec<Source>, output: OutputDType) -> Plan {
    let mut p = Plan::new(sources, 127, 4);
    p.seed = 7;
    p.output = output;
    p
}

/// The whole stream through `next_batch`, as bytes, with per-batch sample counts.
fn batches(p: &Plan, from: Cursor) -> (Vec<u8>, Vec<usize>) {
    drain(&mut Reader::local(p, from).unwrap())
}

fn all_tokens(path: &str) -> Vec<u32> {
    let ds = Dataset::open(Path::new(path), &OpenOptions::default()).unwrap();
    let mut out = Vec::new();
    ds.reader().read(0..ds.tokens(), &mut out).unwrap();
    out
}

#[test]
fn read_and_next_batch_deliver_the_planned_tokens() {
    let p = plan(
        vec![Source::new(fixture_str("r50k_int32"))],
        OutputDType::U16,
    );
    let (via_batches, sizes) = batches(&p, Cursor::START);
    let mut r = Reader::local(&p, Cursor::START).unwrap();
    let total = r.schedule().unwrap().rank_samples() as usize;
    assert_eq!(sizes.iter().sum::<usize>(), total);
    assert_eq!(via_batches.len(), total * 128 * 2);
    let via_read = read_all(&mut r, 1000);
    assert_eq!(via_read, via_batches);
    // Every sample is exactly the source's tokens over the range the schedule names.
    let src = all_tokens(&fixture_str("r50k_int32"));
    let it = r.schedule().unwrap().iter_rank(Cursor::START).unwrap();
    let words: Vec<u16> = via_batches
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect();
    for (k, s) in it.enumerate() {
        let want: Vec<u16> = src[s.tokens.start as usize..s.tokens.end as usize]
            .iter()
            .map(|&t| t as u16)
            .collect();
        assert_eq!(&words[k * 128..(k + 1) * 128], &want[..], "sample {k}");
    }
}

#[test]
fn output_dtypes_hold_the_same_tokens() {
    let src = vec![Source::new(fixture_str("r50k_int32"))];
    let (u16s, _) = batches(&plan(src.clone(), OutputDType::U16), Cursor::START);
    let (i64s, _) = batches(&plan(src, OutputDType::I64), Cursor::START);
    let a: Vec<u64> = u16s
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]) as u64)
        .collect();
    let b: Vec<u64> = i64s
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u64)
        .collect();
    assert_eq!(a, b);
    let mut r = Reader::local(
        &plan(
            vec![Source::new(fixture_str("r50k_int32"))],
            OutputDType::I32,
        ),
        Cursor::START,
    )
    .unwrap();
    assert!(matches!(
        r.next_batch().unwrap().unwrap().tokens,
        Tokens::I32(_)
    ));
}

/// A `.dqb` copy of a Megatron dataset, written with `codec`.
fn dqb_copy(src: &str, codec: &str, dir: &Path) -> String {
    let codec: Codec = codec.parse().unwrap();
    let dst = dir.join(format!(
        "copy-{}.dqb",
        codec.to_string().replace([':', '+'], "_")
    ));
    write_block_copy(Path::new(src), &dst, codec);
    dst.display().to_string()
}

#[test]
fn the_stream_does_not_depend_on_the_source_format() {
    let dir = tempfile::tempdir().unwrap();
    let reference = batches(
        &plan(
            vec![Source::new(fixture_str("r50k_int32"))],
            OutputDType::I32,
        ),
        Cursor::START,
    )
    .0;
    for src in [
        fixture_str("r50k_uint16"),
        dqb_copy(&fixture_str("r50k_int32"), "bits:16+zstd:3", dir.path()),
        dqb_copy(&fixture_str("r50k_int32"), "u24+lz4", dir.path()),
    ] {
        let got = batches(
            &plan(vec![Source::new(src.clone())], OutputDType::I32),
            Cursor::START,
        )
        .0;
        assert!(got == reference, "{src} gives a different stream");
    }
}

#[test]
fn resuming_from_a_cursor_gives_exactly_the_tail() {
    let sources = vec![
        Source::new(fixture_str("r50k_int32")).weight(0.7),
        Source::new(fixture_str("r50k_int32_multiseq")).weight(0.3),
    ];
    let mut p = plan(sources, OutputDType::U16);
    p.epochs = Some(2);
    let (full, _) = batches(&p, Cursor::START);
    let bytes_per_batch = 4 * 128 * 2;
    for stop in [0usize, 1, 5, 17] {
        let mut r = Reader::local(&p, Cursor::START).unwrap();
        for _ in 0..stop {
            r.next_batch().unwrap().unwrap();
        }
        let c = r.cursor();
        assert_eq!(c.consumed_samples, stop as u64 * 4);
        let (tail, _) = batches(&p, c);
        assert!(
            tail == full[stop * bytes_per_batch..],
            "resume after {stop} batches"
        );
    }
    // A cursor taken in the middle of a `read` covers whole batches only.
    let mut r = Reader::local(&p, Cursor::START).unwrap();
    let mut buf = vec![0u8; bytes_per_batch + 10];
    assert_eq!(r.read(&mut buf).unwrap(), buf.len());
    assert_eq!(r.cursor().consumed_samples, 4);
}

#[test]
fn ranks_partition_the_global_stream() {
    let sources = vec![
        Source::new(fixture_str("r50k_int32")).weight(2.0),
        Source::new(fixture_str("r50k_uint16")).weight(1.0),
    ];
    let global = batches(&plan(sources.clone(), OutputDType::U16), Cursor::START).0;
    let sample = 128 * 2;
    let world = 4;
    let mut rebuilt = vec![0u8; global.len()];
    let mut covered = 0;
    for rank in 0..world {
        let mut p = plan(sources.clone(), OutputDType::U16);
        p.rank = rank;
        p.world = world;
        let (mine, _) = batches(&p, Cursor::START);
        for (k, s) in mine.chunks_exact(sample).enumerate() {
            let g = k * world as usize + rank as usize;
            rebuilt[g * sample..(g + 1) * sample].copy_from_slice(s);
            covered += 1;
        }
    }
    assert_eq!(covered * sample, global.len());
    assert!(
        rebuilt == global,
        "the ranks' samples, interleaved, are the global stream"
    );
}

#[test]
fn tokens_too_wide_for_the_output_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("wide");
    let mut w =
        DatasetWriter::create(&prefix, OutputFormat::Megatron { dtype: DType::I32 }).unwrap();
    let mut toks: Vec<u32> = (0..1000).collect();
    toks[700] = 70000;
    w.push(&toks).unwrap();
    let mut ix = DocIndexBuilder::new();
    ix.push_document(1000);
    w.finish(&ix.finish()).unwrap();
    let mut p = plan(
        vec![Source::new(prefix.display().to_string())],
        OutputDType::U16,
    );
    p.shuffle = false;
    let mut r = Reader::local(&p, Cursor::START).unwrap();
    let e = loop {
        match r.next_batch() {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("no error"),
            Err(e) => break e,
        }
    };
    assert_eq!(
        e.to_string(),
        format!(
            "sources[0] ({}): token 70000 at offset 700 does not fit in u16 (max 65535); it needs 17 bits: use bits:17 or wider",
            prefix.display()
        )
    );
}

#[test]
fn bad_sources_are_named() {
    let p = plan(
        vec![
            Source::new(fixture_str("r50k_int32")),
            Source::new("/nonexistent/data"),
        ],
        OutputDType::U16,
    );
    let e = Reader::local(&p, Cursor::START).err().unwrap();
    assert!(matches!(
        e,
        ClientError::Engine(dquant_engine::EngineError::Source { index: 1, .. })
    ));
    assert_eq!(
        e.to_string(),
        "sources[1] (/nonexistent/data): /nonexistent/data: No such file or directory (os error 2)"
    );
    // An agent source whose agent is not there (port 1 on loopback refuses at once).
    let p = plan(
        vec![Source::new("dquant://127.0.0.1:1/web")],
        OutputDType::U16,
    );
    assert_eq!(
        Reader::local(&p, Cursor::START).err().unwrap().to_string(),
        "sources[0] (dquant://127.0.0.1:1/web): cannot reach agent 127.0.0.1:1: transport error: tcp connect error: Connection refused (os error 111)"
    );
    let p = plan(vec![Source::new("dquant://127.0.0.1:1")], OutputDType::U16);
    assert_eq!(
        Reader::local(&p, Cursor::START).err().unwrap().to_string(),
        "sources[0] (dquant://127.0.0.1:1): the URI names an agent but no dataset (dquant://HOST:PORT/ROOT/PATH)"
    );
}

#[test]
fn next_batch_refuses_to_skip_a_partly_read_batch() {
    let p = plan(
        vec![Source::new(fixture_str("r50k_int32"))],
        OutputDType::U16,
    );
    let mut r = Reader::local(&p, Cursor::START).unwrap();
    assert_eq!(r.sample_len(), 128);
    assert_eq!(r.output(), OutputDType::U16);
    let mut buf = [0u8; 100];
    assert_eq!(r.read(&mut buf).unwrap(), 100);
    assert_eq!(
        r.next_batch().err().unwrap().to_string(),
        "next_batch: batch 0 is partly read (100 of 1024 bytes); finish it with read() first"
    );
    let mut rest = vec![0u8; 1024 - 100];
    assert_eq!(r.read(&mut rest).unwrap(), rest.len());
    assert_eq!(r.next_batch().unwrap().unwrap().index, 1);
}

/// A uint16 dataset read into u16 batches takes the stored fast path (one vectored read per
/// run of consecutive samples, no conversion). Its streams must equal the decoding path's
/// (the same tokens stored as int32), byte for byte: unshuffled (long runs), shuffled (runs
/// of one), blended across two stored sources, over epochs, on a rank, resumed, and through
/// both `next_batch` and `read`.
#[test]
fn the_stored_fast_path_equals_decoding() {
    let dir = tempfile::tempdir().unwrap();
    // A second uint16 source (a raw file of the same tokens), so blends stay on the fast
    // path, and its int32 twin for the reference.
    let toks = all_tokens(&fixture_str("r50k_int32"));
    let raw16 = dir.path().join("r50k.u16");
    let raw32 = dir.path().join("r50k.i32");
    std::fs::write(
        &raw16,
        toks.iter()
            .flat_map(|&t| (t as u16).to_le_bytes())
            .collect::<Vec<_>>(),
    )
    .unwrap();
    std::fs::write(
        &raw32,
        toks.iter()
            .flat_map(|&t| (t as i32).to_le_bytes())
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let raw = |p: &Path, dtype: &str| {
        let mut s = Source::new(p.display().to_string());
        s.dtype = Some(dtype.into());
        s
    };
    let fast = vec![
        Source::new(fixture_str("r50k_uint16")).weight(0.6),
        raw(&raw16, "uint16").weight(0.4),
    ];
    let slow = vec![
        Source::new(fixture_str("r50k_int32")).weight(0.6),
        raw(&raw32, "int32").weight(0.4),
    ];
    for (shuffle, epochs, world, rank, sources) in [
        (false, 3, 1, 0, 1),
        (true, 2, 1, 0, 1),
        (false, 2, 1, 0, 2),
        (true, 1, 1, 0, 2),
        (false, 2, 3, 2, 2),
    ] {
        let mk = |srcs: &Vec<Source>| {
            let mut p = plan(srcs[..sources].to_vec(), OutputDType::U16);
            p.shuffle = shuffle;
            p.epochs = Some(epochs);
            p.world = world;
            p.rank = rank;
            p
        };
        let (pf, ps) = (mk(&fast), mk(&slow));
        let what =
            format!("shuffle={shuffle} epochs={epochs} rank {rank}/{world} sources={sources}");
        let (a, sa) = batches(&pf, Cursor::START);
        let (b, sb) = batches(&ps, Cursor::START);
        assert_eq!(sa, sb, "{what}");
        assert!(a == b, "{what}: the fast path gives a different stream");
        let mid = Cursor::new(0, (sa.len() as u64 / 2) * 4 * world as u64);
        assert!(
            batches(&pf, mid.clone()).0 == batches(&ps, mid).0,
            "{what}: resumed"
        );
        let mut r = Reader::local(&pf, Cursor::START).unwrap();
        let via_read = read_all(&mut r, 777);
        assert!(via_read == a, "{what}: read");
    }
}

/// A plan read in this process narrows an int32 dataset straight from a map of its `.bin`
/// (within `DQUANT_MAP_BUDGET`, unset here: half the host's memory), held while the dataset
/// is open and gone with the reader; its stream is the one a block copy (read without a
/// map) gives, shuffled.
#[test]
fn in_process_reads_keep_a_map_of_int32_data_while_open() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("r50k");
    dquant_testkit::copy_fixture("r50k_int32", &prefix);
    let (prefix, bin) = (
        prefix.display().to_string(),
        format!("{}.bin", prefix.display()),
    );
    let mapped = || {
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .contains(&bin)
    };
    let p = plan(vec![Source::new(prefix.clone())], OutputDType::I32);
    let mut r = Reader::local(&p, Cursor::START).unwrap();
    let mut got = Vec::new();
    while let Some(b) = r.next_batch().unwrap() {
        assert!(mapped(), "{bin} is not mapped while it is read");
        got.extend_from_slice(b.tokens.as_bytes());
    }
    drop(r);
    assert!(!mapped(), "{bin} is still mapped after its reader is gone");
    let copy = dqb_copy(&prefix, "u24+lz4", dir.path());
    let want = batches(
        &plan(vec![Source::new(copy)], OutputDType::I32),
        Cursor::START,
    )
    .0;
    assert!(
        got == want,
        "the mapped stream differs from the block copy's"
    );
}
