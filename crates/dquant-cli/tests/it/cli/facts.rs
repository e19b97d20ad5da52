//! `inspect` and `verify`: facts, exact sizes, a codec-independent checksum, and the
//! first difference between two datasets.

use super::*;

#[test]
fn inspect_reports_facts_exact_sizes_and_a_codec_independent_checksum() {
    let dir = tmp();
    let v = inspect(&fixture("r50k_int32"), &[]);
    assert_eq!(v["format"], "megatron");
    assert_eq!(v["format_detail"], "Megatron IndexedDataset (int32)");
    assert_eq!(v["tokens"], 161032);
    assert_eq!(v["documents"], 28);
    assert_eq!(v["sequences"], 28);
    assert_eq!(v["max_token"], 50256);
    assert_eq!(v["bits_needed"], 16);
    assert_eq!(
        v["bytes"],
        size(&fixture("r50k_int32.bin")) + size(&fixture("r50k_int32.idx"))
    );
    let checksum = v["checksum"].as_str().unwrap().to_string();
    assert!(checksum.starts_with("xxh3:"), "{checksum}");

    // Every size inspect announces is the size the file really has.
    let sizes: Vec<(String, u64)> = v["sizes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["codec"].as_str().unwrap().to_string(),
                r["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    let names: Vec<&str> = sizes.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "megatron int32",
            "megatron uint16",
            "dqb u16",
            "dqb u16+lz4",
            "dqb u16+zstd:1",
            "dqb u16+zstd:3",
            "dqb u16+zstd:9",
            "dqb i32+zstd:3"
        ]
    );
    assert_eq!(sizes[0].1, v["bytes"].as_u64().unwrap());
    assert_eq!(
        sizes[1].1,
        size(&fixture("r50k_uint16.bin")) + size(&fixture("r50k_uint16.idx"))
    );
    for (name, bytes) in &sizes[2..] {
        let codec = name.strip_prefix("dqb ").unwrap();
        let dst = dir.path().join(format!("{}.dqb", codec.replace(':', "_")));
        let rep = convert(&fixture("r50k_int32"), &dst, &["--codec", codec]);
        assert_eq!(size(&dst), *bytes, "{name}");
        assert_eq!(rep["dst_bytes"], *bytes, "{name}");
        assert_eq!(rep["checksum"], checksum.as_str(), "{name}");
    }

    // The checksum does not depend on the dtype or codec...
    let dqb = dir.path().join("u16+zstd_3.dqb");
    for p in [fixture("r50k_uint16"), dqb.clone()] {
        assert_eq!(inspect(&p, &["--no-sizes"])["checksum"], checksum.as_str());
    }
    let d = inspect(&dqb, &["--no-sizes"]);
    assert_eq!(d["format"], "dqb");
    assert_eq!(
        d["format_detail"],
        "dquant block file (u16+zstd:3, 524288 tokens per block)"
    );
    assert_eq!(
        (&d["tokens"], &d["documents"]),
        (&v["tokens"], &v["documents"])
    );
    // ...but it does depend on the boundaries: same tokens, other sequences.
    let multi = inspect(&fixture("r50k_int32_multiseq"), &["--no-sizes"]);
    let multi = multi["checksum"].as_str().unwrap();
    assert_eq!(multi.split('-').next(), checksum.split('-').next());
    assert_ne!(multi, checksum);

    // The text form says the same.
    let text = ok(&["inspect", &s(&fixture("r50k_uint16")), "--no-sizes"]);
    assert!(
        text.contains("format      Megatron IndexedDataset (uint16)\n"),
        "{text}"
    );
    assert!(text.contains("documents   28 (28 sequences)\n"), "{text}");
    assert!(text.contains("tokens      161,032\n"), "{text}");
    assert!(
        text.contains("max token   50256 (needs 16 bits)\n"),
        "{text}"
    );
    assert!(
        text.contains(&format!("checksum    {checksum}\n")),
        "{text}"
    );
}

// ---------------------------------------------------------------------------------------------
// 4. verify finds differences

#[test]
fn verify_reports_the_first_different_token() {
    let dir = tmp();
    let orig = Megatron::read(&fixture("r50k_int32"));
    let offset = 100_000u64;
    let (a, b) = (
        orig.tokens[offset as usize],
        (orig.tokens[offset as usize] + 1) % 50257,
    );
    let mut changed = orig.clone();
    changed.tokens[offset as usize] = b;
    let prefix = dir.path().join("changed");
    changed.write_i32(&prefix);
    // Only the one token differs.
    let (x, y) = (
        read(&fixture("r50k_int32.bin")),
        read(&with_ext(&prefix, "bin")),
    );
    let diff: Vec<usize> = (0..x.len()).filter(|&i| x[i] != y[i]).collect();
    assert!(
        !diff.is_empty() && diff.iter().all(|&i| i / 4 == offset as usize),
        "{diff:?}"
    );

    let (doc, in_doc) = orig.locate(offset);
    assert_eq!((doc, in_doc), (12, 135));
    let want =
        format!("token {offset} (document {doc}, token {in_doc} of it): A has {a}, B has {b}");
    assert_eq!(difference(&fixture("r50k_int32"), &prefix), want);

    // Same answer when B is compressed (found through the block reader) and from --json.
    let dqb = dir.path().join("changed.dqb");
    convert(
        &prefix,
        &dqb,
        &["--codec", "bits:17+zstd:3", "--block-size", "64KiB"],
    );
    assert_eq!(difference(&fixture("r50k_uint16"), &dqb), want);
    let r = dquant(&["verify", &s(&fixture("r50k_int32")), &s(&dqb), "--json"]);
    assert_eq!(r.code, 1);
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["identical"], false);
    assert_eq!(v["difference"], want.as_str());
    // A against B and B against A name the same place.
    assert_eq!(
        difference(&dqb, &fixture("r50k_int32")),
        format!("token {offset} (document {doc}, token {in_doc} of it): A has {b}, B has {a}")
    );
}

#[test]
fn verify_reports_boundary_differences() {
    let dir = tmp();
    let orig = Megatron::read(&fixture("r50k_int32"));
    let starts = orig.doc_starts();

    // Document 5 starts one token later: same tokens, same number of documents.
    let mut moved = orig.clone();
    moved.seq_lens[4] += 1;
    moved.seq_lens[5] -= 1;
    let p = dir.path().join("moved");
    moved.write_i32(&p);
    assert_eq!(
        difference(&fixture("r50k_int32"), &p),
        format!(
            "document 5 starts at token {} in A but at token {} in B",
            starts[5],
            starts[5] + 1
        )
    );
    // Also through a .dqb, whose boundaries live in its footer.
    let dqb = dir.path().join("moved.dqb");
    convert(&p, &dqb, &["--codec", "u16+lz4"]);
    assert_eq!(
        difference(&fixture("r50k_uint16"), &dqb),
        format!(
            "document 5 starts at token {} in A but at token {} in B",
            starts[5],
            starts[5] + 1
        )
    );

    // Documents 3 and 4 merged.
    let mut merged = orig.clone();
    merged.seq_lens[3] += merged.seq_lens.remove(4);
    merged.doc_indices = (0..=27).collect();
    let p = dir.path().join("merged");
    merged.write_i32(&p);
    assert_eq!(
        difference(&fixture("r50k_int32"), &p),
        "A has 28 documents, B has 27"
    );

    // Same documents, other sequences: Megatron-Core's multi-sequence file.
    let multi = Megatron::read(&fixture("r50k_int32_multiseq"));
    assert_eq!(multi.doc_starts(), starts);
    // The first document longer than 1000 tokens is where the sequences part.
    let d = orig.seq_lens.iter().position(|&l| l > 1000).unwrap();
    assert_eq!(multi.doc_indices[d], d as u64);
    assert_eq!(
        difference(&fixture("r50k_int32"), &fixture("r50k_int32_multiseq")),
        format!(
            "sequence {} starts at token {} in A but at token {} in B",
            d + 1,
            starts[d + 1],
            starts[d] + 1000
        )
    );

    // One token fewer.
    let mut short = orig.clone();
    short.tokens.pop();
    *short.seq_lens.last_mut().unwrap() -= 1;
    let p = dir.path().join("short");
    short.write_i32(&p);
    assert_eq!(
        difference(&fixture("r50k_int32"), &p),
        "A has 161032 tokens, B has 161031"
    );
}

#[test]
fn inspect_shows_an_archive_s_rank_table() {
    let dir = tmp();
    let src = fixture("r50k_int32");
    let dst = dir.path().join("archive.dqb");
    convert(&src, &dst, &["--preset", "archive"]);
    // The ids the table must rank: every distinct token, the most frequent first.
    let mut counts = std::collections::HashMap::<u32, u64>::new();
    for t in read(&fixture("r50k_int32.bin")).chunks_exact(4) {
        *counts
            .entry(u32::from_le_bytes(t.try_into().unwrap()))
            .or_default() += 1;
    }
    let top = counts
        .iter()
        .max_by_key(|(&id, &n)| (n, std::cmp::Reverse(id)))
        .unwrap();
    let v = inspect(&dst, &["--no-sizes"]);
    let r = &v["rank_table"];
    assert_eq!(r["ids"], counts.len() as u64, "{r}");
    assert_eq!(r["most_frequent"][0], *top.0, "{r}");
    assert_eq!(r["most_frequent"].as_array().unwrap().len(), 8, "{r}");
    let bytes = r["bytes"].as_u64().unwrap();
    assert!(bytes > 0 && bytes < size(&dst), "{r}");
    let text = ok(&["inspect", &s(&dst), "--no-sizes"]);
    let line = format!(
        "rank table  {} ids by frequency, ",
        counts
            .len()
            .to_string()
            .as_bytes()
            .rchunks(3)
            .rev()
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect::<Vec<_>>()
            .join(",")
    );
    assert!(text.contains(&line), "{text}");
    // No table in a file without ranks.
    assert!(inspect(&src, &["--no-sizes"])["rank_table"].is_null());
}
