//! Round trips: int32 Megatron -> u16 Megatron / .dqb (every codec) -> int32 Megatron.

use super::*;

fn round_trip(src: &Path, dir: &Path, targets: &[(&str, &[&str], &str)], counts: &str) {
    let checksum = inspect(src, &["--no-sizes"])["checksum"].clone();
    for (name, opts, dst_format) in targets {
        let dst = dir.join(name);
        let rep = convert(src, &dst, opts);
        assert!(
            rep["dst_format"].as_str().unwrap().starts_with(dst_format),
            "{name}: {}",
            rep["dst_format"]
        );
        assert_eq!(rep["checksum"], checksum, "{name}");
        assert_eq!(rep["verified"], true);
        // The report's size is the size on disk.
        let on_disk: u64 = rep["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| size(Path::new(f.as_str().unwrap())))
            .sum();
        assert_eq!(rep["dst_bytes"], on_disk, "{name}");
        assert_eq!(
            inspect(&dst, &["--no-sizes"])["checksum"],
            checksum,
            "{name}"
        );

        let line = assert_identical(src, &dst, &[]);
        assert_eq!(line, format!("identical: {counts}\n"), "{name}");
        assert_identical(&dst, src, &[]);

        let back = dir.join(format!("{name}_back"));
        let rep = convert(&dst, &back, &["--codec", "i32"]);
        assert_eq!(rep["dst_format"], "Megatron IndexedDataset (int32)");
        assert_identical(&dst, &back, &[]);
        assert_identical(src, &back, &[]);
        assert_same_megatron(&back, src);
    }
}

#[test]
fn r50k_multiseq_round_trips_through_every_codec() {
    let dir = tmp();
    let src = fixture("r50k_int32_multiseq");
    let targets: &[(&str, &[&str], &str)] = &[
        (
            "u16",
            &["--codec", "u16"],
            "Megatron IndexedDataset (uint16)",
        ),
        (
            "b17.dqb",
            &["--codec", "bits:17"],
            "dquant block file (bits:17,",
        ),
        (
            "b17_zstd3.dqb",
            &["--codec", "bits:17", "--zstd", "3"],
            "dquant block file (bits:17+zstd:3,",
        ),
        (
            "b17+zstd3.dqb",
            &["--codec", "bits:17+zstd:3"],
            "dquant block file (bits:17+zstd:3,",
        ),
        (
            "auto_lz4.dqb",
            &["--codec", "auto", "--lz4"],
            "dquant block file (u16+lz4,",
        ),
        (
            // Many blocks, the last one partial.
            "small_blocks.dqb",
            &["--codec", "bits:17+zstd:3", "--block-size", "64KiB"],
            "dquant block file (bits:17+zstd:3, 30720 tokens per block)",
        ),
        (
            "archive.dqb",
            &["--preset", "archive"],
            "dquant block file (u16+rank+zstd:19, 2097152 tokens per block)",
        ),
        (
            "dpu.dqb",
            &["--preset", "dpu"],
            "dquant block file (u16+lz4hc:9, 16384 tokens per block)",
        ),
        (
            "rank_small_blocks.dqb",
            &["--codec", "auto+rank+zstd:3", "--block-size", "64KiB"],
            "dquant block file (u16+rank+zstd:3, 32768 tokens per block)",
        ),
    ];
    round_trip(
        &src,
        dir.path(),
        targets,
        "161,032 tokens in 28 documents (175 sequences)",
    );
    // A .dqb re-encoded as another .dqb is still the same data.
    let again = dir.path().join("again.dqb");
    convert(&dir.path().join("b17.dqb"), &again, &["--codec", "u16+lz4"]);
    assert_identical(&src, &again, &[]);
    // Blocks compressed on several threads: the same file, byte for byte.
    let small = [
        "--codec",
        "bits:17+zstd:3",
        "--block-size",
        "64KiB",
        "--threads",
    ];
    for threads in ["1", "3"] {
        let out = dir.path().join(format!("threads{threads}.dqb"));
        convert(&src, &out, &[&small[..], &[threads]].concat());
    }
    let (one, three) = (
        dir.path().join("threads1.dqb"),
        dir.path().join("threads3.dqb"),
    );
    assert!(read(&one) == read(&three), "3 threads wrote another file");
    let r = dquant(&["convert", &s(&src), &s(&three), "--force", "--threads", "0"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    let e = "error: invalid value '0' for '--threads <N>': 0 is not in 1..=256";
    assert!(r.stderr.starts_with(e), "{}", r.stderr);
}

#[test]
fn cl100k_like_round_trips_through_every_codec() {
    let dir = tmp();
    let src = cl100k_like(dir.path());
    let facts = inspect(&src, &["--no-sizes"]);
    assert_eq!(facts["bits_needed"], 17);
    let docs = facts["documents"].as_u64().unwrap();
    let seqs = facts["sequences"].as_u64().unwrap();
    assert!(seqs > docs, "{facts}");
    let targets: &[(&str, &[&str], &str)] = &[
        (
            "b17.dqb",
            &["--codec", "bits:17"],
            "dquant block file (bits:17,",
        ),
        (
            "b17_zstd3.dqb",
            &["--codec", "bits:17", "--zstd", "3"],
            "dquant block file (bits:17+zstd:3,",
        ),
        (
            "b17+zstd3.dqb",
            &["--codec", "bits:17+zstd:3", "--block-size", "64KiB"],
            "dquant block file (bits:17+zstd:3, 30720 tokens per block)",
        ),
        (
            "auto_lz4.dqb",
            &["--codec", "auto", "--lz4"],
            "dquant block file (u24+lz4,",
        ),
        ("auto.dqb", &[], "dquant block file (bits:17,"),
        (
            "archive.dqb",
            &["--preset", "archive"],
            "dquant block file (u24+rank+zstd:19, 2097152 tokens per block)",
        ),
        (
            "dpu.dqb",
            &["--preset", "dpu"],
            "dquant block file (u24+lz4hc:9, 10752 tokens per block)",
        ),
        // `auto` to a Megatron prefix: int32, as Megatron-Core picks for ids above 65535.
        ("auto_megatron", &[], "Megatron IndexedDataset (int32)"),
    ];
    round_trip(
        &src,
        dir.path(),
        targets,
        &format!("120,000 tokens in {docs} documents ({seqs} sequences)"),
    );
    // u16 does not fit: an error naming the first token above 65535, and no output.
    let m = Megatron::read(&src);
    let first = m.tokens.iter().position(|&t| t > 65535).unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let err = fails(&["convert", &s(&src), &s(&out.join("u16")), "--codec", "u16"]);
    assert_eq!(
        err,
        format!(
            "{}: token {} at offset {first} does not fit in u16 (max 65535); it needs 17 bits: \
             use bits:17 or wider",
            with_ext(&src, "bin").display(),
            m.tokens[first]
        )
    );
    assert!(entries(&out).is_empty(), "{:?}", entries(&out));
}
