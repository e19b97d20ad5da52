//! Raw token files: split at EOD, round trips.

use super::*;

#[test]
fn raw_files_split_at_eod_and_round_trip() {
    let dir = tmp();
    let d = dir.path();
    // Three documents, the last without its end-of-document token.
    let tokens: [u16; 9] = [1, 2, 50256, 3, 4, 5, 50256, 65535, 7];
    let raw = d.join("tokens.u16");
    std::fs::write(
        &raw,
        tokens
            .iter()
            .flat_map(|t| t.to_le_bytes())
            .collect::<Vec<u8>>(),
    )
    .unwrap();
    let opts = ["--dtype", "u16", "--eod", "50256"];
    let v = inspect(&raw, &opts);
    assert_eq!(v["format"], "raw");
    assert_eq!(v["format_detail"], "raw token file (uint16)");
    assert_eq!(v["tokens"], 9);
    assert_eq!(v["documents"], 3);
    assert_eq!(v["max_token"], 65535);
    assert_eq!(v["bits_needed"], 16);
    // Without --eod, one document.
    assert_eq!(inspect(&raw, &["--dtype", "u16"])["documents"], 1);

    let dqb = d.join("tokens.dqb");
    let (r, q) = (s(&raw), s(&dqb));
    let mut args = vec!["convert", &r, &q, "--json"];
    args.extend_from_slice(&opts);
    let rep = json(&args);
    assert_eq!(rep["documents"], 3);
    assert_eq!(
        assert_identical(&raw, &dqb, &opts),
        "identical: 9 tokens in 3 documents (3 sequences)\n"
    );
    assert_eq!(inspect(&dqb, &["--no-sizes"])["checksum"], v["checksum"]);
    // Back to raw: the same bytes.
    let back = d.join("back.u16");
    convert(&dqb, &back, &["--format", "raw", "--codec", "u16"]);
    assert_eq!(read(&back), read(&raw));

    // Megatron-Core's uint16 .bin is a raw u16 file: split at 50256 it has the same documents
    // and content checksum as the Megatron dataset.
    let bin = d.join("r50k.u16");
    std::fs::copy(fixture("r50k_uint16.bin"), &bin).unwrap();
    let v = inspect(&bin, &["--dtype", "u16", "--eod", "50256", "--no-sizes"]);
    assert_eq!(v["documents"], 28);
    assert_eq!(
        v["checksum"],
        inspect(&fixture("r50k_int32"), &["--no-sizes"])["checksum"]
    );
    assert_identical(
        &bin,
        &fixture("r50k_int32"),
        &["--dtype", "u16", "--eod", "50256"],
    );

    // A raw file needs its dtype.
    assert_eq!(
        fails(&["inspect", &s(&raw)]),
        format!(
            "{}: unknown format: not a dquant block file, no Megatron .idx beside it; for a raw \
             token file give its dtype (--dtype u16|i32|...)",
            raw.display()
        )
    );
    // And whole tokens.
    let odd = d.join("odd.u16");
    std::fs::write(&odd, [1u8, 0, 2]).unwrap();
    let err = fails(&["inspect", &s(&odd), "--dtype", "u16"]);
    assert_eq!(
        err,
        format!(
            "{}: corrupt raw uint16 file: 3 bytes is not a whole number of 2-byte tokens",
            odd.display()
        )
    );
}
