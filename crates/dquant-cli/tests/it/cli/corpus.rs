//! `dquant corpus real` is deterministic.

use super::*;

#[test]
fn corpus_real_is_deterministic_one_document_per_file() {
    let dir = tmp();
    let root = dir.path().join("src");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(
        root.join("a.rs"),
        "fn main() {\n    println!(\"hello\");\n}\n",
    )
    .unwrap();
    std::fs::write(root.join("sub/b.rs"), "// b\npub struct B { x: u32 }\n").unwrap();
    std::fs::write(root.join("sub/c.rs"), "hello hello hello\n").unwrap();
    std::fs::write(root.join("notes.txt"), "not Rust: not tokenized").unwrap();
    std::fs::write(root.join("bad.rs"), [0xffu8, 0xfe, b'x']).unwrap();

    let mut outputs = Vec::new();
    for run in ["one", "two"] {
        let out = dir.path().join(run);
        let v = json(&["corpus", "real", "--root", &s(&root), &s(&out), "--json"]);
        assert_eq!(v["files"], 4, "{v}"); // bad.rs is counted, then skipped
        assert_eq!(v["documents"], 3, "{v}");
        assert_eq!(v["skipped_non_utf8"], 1, "{v}");
        outputs.push((out, v));
    }
    assert_same_megatron(&outputs[0].0, &outputs[1].0);
    assert_eq!(outputs[0].1, {
        let mut v = outputs[1].1.clone();
        v["out"] = outputs[0].1["out"].clone();
        v
    });

    let m = Megatron::read(&outputs[0].0);
    assert_eq!(m.doc_indices, [0, 1, 2, 3]);
    let starts = m.doc_starts();
    let ends: Vec<u64> = starts[1..]
        .iter()
        .copied()
        .chain([m.tokens.len() as u64])
        .collect();
    for &e in &ends {
        assert_eq!(
            m.tokens[e as usize - 1],
            50256,
            "every document ends with 50256"
        );
    }
    assert_eq!(m.tokens.iter().filter(|&&t| t == 50256).count(), 3);
    // Files in path order; a.rs in r50k (GPT-2) ids: "fn" " main" "()" " {" "\n" " " " " " "
    // " println" "!" "(\"" "hello" "\");" "\n" "}" "\n", then end of text.
    assert_eq!(
        m.tokens[..starts[1] as usize],
        [
            22184, 1388, 3419, 1391, 198, 220, 220, 220, 44872, 0, 7203, 31373, 15341, 198, 92,
            198, 50256
        ]
    );
    // sub/c.rs: "hello" " hello" " hello" "\n" EOT.
    assert_eq!(
        m.tokens[starts[2] as usize..],
        [31373, 23748, 23748, 198, 50256]
    );
    let v = inspect(&outputs[0].0, &["--no-sizes"]);
    assert_eq!(v["max_token"], 50256);
}
