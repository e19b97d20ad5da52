//! Megatron files: the hand-written code these tests trust agrees with Megatron-Core,
//! and `convert` writes Megatron's own bytes.

use super::*;

#[test]
fn hand_written_megatron_files_match_megatron_core() {
    let dir = tmp();
    for name in ["r50k_int32", "r50k_int32_multiseq"] {
        let m = Megatron::read(&fixture(name));
        let out = dir.path().join(name);
        m.write_i32(&out);
        assert_same_megatron(&out, &fixture(name));
    }
    let one = Megatron::read(&fixture("r50k_int32"));
    let multi = Megatron::read(&fixture("r50k_int32_multiseq"));
    assert_eq!(one.tokens, Megatron::read(&fixture("r50k_uint16")).tokens);
    assert_eq!(one.tokens, multi.tokens);
    assert_eq!((one.seq_lens.len(), one.doc_indices.len()), (28, 29));
    assert_eq!((multi.seq_lens.len(), multi.doc_indices.len()), (175, 29));
    assert_eq!(one.split_sequences(1000).seq_lens, multi.seq_lens);
    assert_eq!(one.split_sequences(1000).doc_indices, multi.doc_indices);
}

// ---------------------------------------------------------------------------------------------
// 1. Megatron byte identity

#[test]
fn int32_to_u16_is_byte_identical_to_megatron_core() {
    let dir = tmp();
    let src = fixture("r50k_int32");
    let u16 = dir.path().join("u16");
    let rep = convert(&src, &u16, &["--codec", "u16"]);
    assert_eq!(rep["dst_format"], "Megatron IndexedDataset (uint16)");
    assert_eq!(rep["tokens"], 161032);
    assert_eq!(rep["documents"], 28);
    assert_same_megatron(&u16, &fixture("r50k_uint16"));
    assert_eq!(
        rep["dst_bytes"],
        size(&fixture("r50k_uint16.bin")) + size(&fixture("r50k_uint16.idx"))
    );
    assert_eq!(
        rep["files"],
        serde_json::json!([s(&with_ext(&u16, "bin")), s(&with_ext(&u16, "idx"))])
    );

    // `auto` to a Megatron prefix makes Megatron-Core's own choice: uint16 for these ids.
    let auto = dir.path().join("auto");
    let rep = convert(&src, &auto, &[]);
    assert_eq!(rep["dst_format"], "Megatron IndexedDataset (uint16)");
    assert_same_megatron(&auto, &fixture("r50k_uint16"));

    // The destination may be named by its .idx or .bin too.
    let by_idx = dir.path().join("by_idx");
    convert(&src, &with_ext(&by_idx, "idx"), &["--codec", "u16"]);
    assert_same_megatron(&by_idx, &fixture("r50k_uint16"));

    // And back: uint16 -> int32 gives Megatron-Core's int32 files.
    let i32 = dir.path().join("i32");
    convert(&fixture("r50k_uint16"), &i32, &["--codec", "i32"]);
    assert_same_megatron(&i32, &src);

    // Output files get the mode of any file the user creates (0o666 less the umask), not the
    // owner-only 0o600 of a temporary file.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let other = tmp();
    let plain = other.path().join("plain");
    std::fs::write(&plain, b"x").unwrap();
    for f in [with_ext(&u16, "bin"), with_ext(&u16, "idx")] {
        assert_eq!(mode(&f), mode(&plain), "{}", f.display());
    }
    assert_eq!(
        entries(dir.path()),
        [
            "auto.bin",
            "auto.idx",
            "by_idx.bin",
            "by_idx.idx",
            "i32.bin",
            "i32.idx",
            "u16.bin",
            "u16.idx"
        ]
    );
}
