//! Bad input: exact errors, exit code 1, no panic, nothing left behind.

use super::*;

#[test]
fn token_too_wide_for_u16_fails_naming_source_offset_and_width() {
    let dir = tmp();
    // 3 documents; token 70000 at offset 1234 (document 1), nothing else above 50256.
    let mut docs = vec![vec![17u32; 1000], vec![42; 800], vec![7; 300]];
    for d in &mut docs {
        *d.last_mut().unwrap() = 50256;
    }
    docs[1][234] = 70000;
    let src = dir.path().join("wide_int32");
    Megatron::from_docs(&docs).write_i32(&src);
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let want = format!(
        "{}: token 70000 at offset 1234 does not fit in u16 (max 65535); it needs 17 bits: use \
         bits:17 or wider",
        with_ext(&src, "bin").display()
    );
    for (dst, opts) in [
        ("u16", &["--codec", "u16"][..]),
        ("u16.dqb", &["--codec", "u16"]),
        ("u16z.dqb", &["--codec", "u16+zstd:3"]),
        // The bad token in the second of several blocks.
        ("small.dqb", &["--codec", "u16", "--block-size", "1KiB"]),
        ("u16.raw", &["--codec", "u16", "--format", "raw"]),
    ] {
        let (src_s, dst_s) = (s(&src), s(&out.join(dst)));
        let mut args = vec!["convert", &src_s, &dst_s];
        args.extend_from_slice(opts);
        assert_eq!(fails(&args), want, "{dst}");
        assert!(entries(&out).is_empty(), "{dst}: left {:?}", entries(&out));
    }
    // 17 bits do fit, and lose nothing.
    let ok17 = out.join("b17.dqb");
    convert(&src, &ok17, &["--codec", "bits:17"]);
    assert_identical(&src, &ok17, &[]);
    assert_eq!(entries(&out), ["b17.dqb"]);
}

#[test]
fn token_outside_declared_vocabulary_fails() {
    let dir = tmp();
    let src = fixture("r50k_int32");
    let tokens = Megatron::read(&src).tokens;
    let first = tokens.iter().position(|&t| t >= 50000).unwrap();
    let want = format!(
        "{}: token {} at offset {first} is outside the declared vocabulary (--vocab 50000)",
        with_ext(&src, "bin").display(),
        tokens[first]
    );
    assert_eq!(
        want,
        format!(
            "{}: token 50256 at offset 603 is outside the declared vocabulary (--vocab 50000)",
            with_ext(&src, "bin").display()
        )
    );
    for (dst, codec) in [
        ("m", "auto"),
        ("a.dqb", "auto"),
        ("b.dqb", "bits:17+zstd:3"),
    ] {
        let dst = dir.path().join(dst);
        assert_eq!(
            fails(&[
                "convert",
                &s(&src),
                &s(&dst),
                "--vocab",
                "50000",
                "--codec",
                codec
            ]),
            want
        );
        assert!(entries(dir.path()).is_empty(), "{:?}", entries(dir.path()));
    }
    assert_eq!(
        fails(&[
            "convert",
            &s(&src),
            &s(&dir.path().join("z.dqb")),
            "--vocab",
            "0"
        ]),
        "--vocab must be at least 1"
    );
    // The right vocabulary passes and is stored.
    let dqb = dir.path().join("v.dqb");
    let rep = convert(&src, &dqb, &["--vocab", "50257"]);
    assert_eq!(
        rep["dst_format"],
        "dquant block file (u16, 524288 tokens per block)"
    );
    assert_identical(&src, &dqb, &[]);
}

#[test]
fn damaged_megatron_files_give_clear_errors() {
    let dir = tmp();
    let d = dir.path();
    let good = fixture("r50k_int32");

    // .bin cut by one byte.
    let t = d.join("truncated");
    std::fs::copy(with_ext(&good, "idx"), with_ext(&t, "idx")).unwrap();
    let bin = read(&with_ext(&good, "bin"));
    std::fs::write(with_ext(&t, "bin"), &bin[..bin.len() - 1]).unwrap();
    let want = format!(
        "{}: truncated Megatron .bin (161032 tokens of int32 in the .idx): needs 644128 bytes \
         but has 644127",
        with_ext(&t, "bin").display()
    );
    assert_eq!(fails(&["inspect", &s(&t)]), want);
    assert_eq!(fails(&["verify", &s(&good), &s(&t)]), want);
    assert_eq!(fails(&["convert", &s(&t), &s(&d.join("x.dqb"))]), want);

    // .idx with a wrong magic.
    let w = d.join("magic");
    std::fs::copy(with_ext(&good, "bin"), with_ext(&w, "bin")).unwrap();
    let mut idx = read(&with_ext(&good, "idx"));
    idx[0] = b'X';
    idx[1] = b'X';
    std::fs::write(with_ext(&w, "idx"), idx).unwrap();
    let want = format!(
        r#"{}: not a Megatron .idx file: bad magic "XXIDIDX\0\0" (expected "MMIDIDX\0\0")"#,
        with_ext(&w, "idx").display()
    );
    assert_eq!(fails(&["inspect", &s(&w)]), want);
    assert_eq!(fails(&["verify", &s(&w), &s(&good)]), want);
    assert_eq!(fails(&["convert", &s(&w), &s(&d.join("y.dqb"))]), want);

    // Missing .bin beside an .idx.
    let m = d.join("nobin");
    std::fs::copy(with_ext(&good, "idx"), with_ext(&m, "idx")).unwrap();
    assert_eq!(
        fails(&["inspect", &s(&m)]),
        format!(
            "{}: No such file or directory (os error 2)",
            with_ext(&m, "bin").display()
        )
    );

    // Nothing was written by the failed converts.
    assert_eq!(
        entries(d),
        [
            "magic.bin",
            "magic.idx",
            "nobin.idx",
            "truncated.bin",
            "truncated.idx"
        ]
    );
}

/// crc32c (Castagnoli), bit by bit: the sidecar's sums checked without dquant's code.
fn crc32c(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 == 1 {
                (c >> 1) ^ 0x82F6_3B78
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// Copies the Megatron dataset `src` (its .idx and .bin) to the prefix `dst`.
fn copy_megatron(src: &Path, dst: &Path) {
    for ext in ["idx", "bin"] {
        std::fs::copy(with_ext(src, ext), with_ext(dst, ext)).unwrap();
    }
}

#[test]
fn megatron_chunk_sums_catch_a_flipped_bit_in_the_bin() {
    let dir = tmp();
    let d = dir.path();
    let good = fixture("r50k_int32");
    let x = d.join("x");
    copy_megatron(&good, &x);
    let (bin, sidecar) = (with_ext(&x, "bin"), with_ext(&x, "dqsum"));
    let r = json(&["sums", &s(&x), "--chunk-kib", "4", "--json"]);
    assert_eq!(
        (&r["chunks"], &r["bytes"], &r["chunk_bytes"]),
        (&Value::from(158), &Value::from(644_128), &Value::from(4096))
    );
    // The sidecar, read by hand: magic, chunk size, length, one crc per 4 KiB, a trailer crc.
    let data = read(&bin);
    let sums = read(&sidecar);
    assert_eq!(sums.len(), 24 + 158 * 4 + 4);
    assert_eq!(&sums[..8], b"DQSUMS\0\x01");
    assert_eq!(sums[8..12], 4096u32.to_le_bytes());
    assert_eq!(sums[16..24], 644_128u64.to_le_bytes());
    let crc_at = |o: usize| u32::from_le_bytes(sums[o..o + 4].try_into().unwrap());
    for (i, chunk) in data.chunks(4096).enumerate() {
        assert_eq!(crc_at(24 + 4 * i), crc32c(chunk), "chunk {i}");
    }
    assert_eq!(crc_at(sums.len() - 4), crc32c(&sums[..sums.len() - 4]));
    let ok_check = format!("{}: 0 of 158 chunks differ\n", bin.display());
    assert_eq!(ok(&["sums", &s(&x), "--check"]), ok_check);
    assert!(ok(&["inspect", &s(&x), "--no-sizes"]).contains(&format!(
        "chunk sums  {} (4 KiB chunks, crc32c/4KiB:{:08x})",
        sidecar.display(),
        crc_at(sums.len() - 4)
    )));

    // One flipped bit in chunk 52: the scrub names it, and every reader refuses the chunk.
    let mut flipped = data.clone();
    flipped[213_200] ^= 0x10;
    std::fs::write(&bin, &flipped).unwrap();
    let r = dquant(&["sums", &s(&x), "--check"]);
    assert_eq!(
        (r.code, r.stdout),
        (
            1,
            format!(
                "{b}: chunk 52 (bytes 212992..217088) differs from {}\n{b}: 1 of 158 chunks \
                 differ\n",
                sidecar.display(),
                b = bin.display()
            )
        )
    );
    let want = format!(
        "{}: checksum mismatch in chunk 52 (bytes 212992..217088), against {}: stored \
         {:#010x}, computed {:#010x}",
        bin.display(),
        sidecar.display(),
        crc32c(&data[212_992..217_088]),
        crc32c(&flipped[212_992..217_088])
    );
    assert_eq!(fails(&["inspect", &s(&x)]), want);
    assert_eq!(fails(&["verify", &s(&good), &s(&x)]), want);
    assert_eq!(fails(&["convert", &s(&x), &s(&d.join("y.dqb"))]), want);
    assert_eq!(entries(d), ["x.bin", "x.dqsum", "x.idx"]);
    assert_eq!(
        fails(&["sums", &s(&d.join("none"))]),
        format!(
            "{}: No such file or directory (os error 2)",
            d.join("none.bin").display()
        )
    );
    // --check with no sidecar, and with one of another file (the r50k uint16 fixture's .bin
    // is half as long): it is read as every open reads it.
    let y = d.join("y");
    copy_megatron(&good, &y);
    assert_eq!(
        fails(&["sums", &s(&y), "--check"]),
        format!(
            "{}: no chunk sums sidecar; write one with `dquant sums {}`",
            with_ext(&y, "dqsum").display(),
            y.display()
        )
    );
    let half = fixture("r50k_uint16");
    let z = d.join("z");
    copy_megatron(&half, &z);
    ok(&["sums", &s(&z)]);
    std::fs::rename(with_ext(&z, "dqsum"), with_ext(&y, "dqsum")).unwrap();
    assert_eq!(
        fails(&["sums", &s(&y), "--check"]),
        format!(
            "{}: covers 322064 bytes of {}, which has 644128: the sidecar is stale; write it again with `dquant sums`",
            with_ext(&y, "dqsum").display(),
            with_ext(&y, "bin").display()
        )
    );
}

/// (offset, payload length) of each block of a .dqb, walked by hand: a 64-byte file header,
/// then blocks of a 32-byte header ("DQBK", codec, tokens u32, payload_len u32, ...) and payload.
fn blocks(file: &[u8]) -> Vec<(usize, usize)> {
    let mut o = 64;
    let mut v = Vec::new();
    while &file[o..o + 4] == b"DQBK" {
        let len = u32::from_le_bytes(file[o + 12..o + 16].try_into().unwrap()) as usize;
        v.push((o, len));
        o += 32 + len;
    }
    v
}

#[test]
fn damaged_block_files_give_clear_errors() {
    let dir = tmp();
    let d = dir.path();
    let src = fixture("r50k_int32");
    let good = d.join("good.dqb");
    convert(
        &src,
        &good,
        &["--codec", "u16+zstd:3", "--block-size", "64KiB"],
    );
    let bytes = read(&good);
    let bl = blocks(&bytes);
    assert_eq!(bl.len(), 5, "161032 tokens in blocks of 32768");

    // "PATH: checksum mismatch in block B (file bytes X..Y) PART: stored S, computed C", S
    // being the CRC stored at `crc_at` in the block header and C another 8 hex digits.
    let check = |err: String, path: &Path, block: usize, part: &str, crc_at: usize| {
        let (o, len) = bl[block];
        let stored = u32::from_le_bytes(bytes[o + crc_at..o + crc_at + 4].try_into().unwrap());
        let prefix = format!(
            "{}: checksum mismatch in block {block} (file bytes {o}..{}) {part}: stored \
             {stored:#010x}, computed 0x",
            path.display(),
            o + 32 + len
        );
        let computed = err
            .strip_prefix(&prefix)
            .unwrap_or_else(|| panic!("{err:?} does not start with {prefix:?}"));
        assert_eq!(computed.len(), 8, "{err}");
        assert_ne!(u32::from_str_radix(computed, 16).unwrap(), stored, "{err}");
    };

    // One flipped bit in block 2's payload: inspect, verify and convert all refuse it.
    let (o, len) = bl[2];
    let mut flipped = bytes.clone();
    flipped[o + 32 + len / 2] ^= 0x10;
    let f = d.join("flipped.dqb");
    std::fs::write(&f, &flipped).unwrap();
    check(fails(&["inspect", &s(&f)]), &f, 2, "payload", 24);
    check(fails(&["verify", &s(&src), &s(&f)]), &f, 2, "payload", 24);
    check(
        fails(&["convert", &s(&f), &s(&d.join("out.dqb"))]),
        &f,
        2,
        "payload",
        24,
    );

    // One flipped bit in block 3's header (its token count).
    let mut hdr = bytes.clone();
    hdr[bl[3].0 + 8] ^= 0x01;
    let h = d.join("header.dqb");
    std::fs::write(&h, &hdr).unwrap();
    check(fails(&["inspect", &s(&h)]), &h, 3, "header", 28);
    check(fails(&["verify", &s(&h), &s(&src)]), &h, 3, "header", 28);

    // Cut by 10 bytes: the trailer is gone.
    let t = d.join("truncated.dqb");
    std::fs::write(&t, &bytes[..bytes.len() - 10]).unwrap();
    let want = format!(
        "{}: corrupt block file trailer: no end marker; the file is truncated or was not finished",
        t.display()
    );
    assert_eq!(fails(&["inspect", &s(&t)]), want);
    assert_eq!(fails(&["verify", &s(&t), &s(&src)]), want);
    assert_eq!(fails(&["convert", &s(&t), &s(&d.join("out2"))]), want);

    // Nothing was written by the failed converts, and the good file still verifies.
    assert_eq!(
        entries(d),
        ["flipped.dqb", "good.dqb", "header.dqb", "truncated.dqb"]
    );
    assert_identical(&src, &good, &[]);
}

#[test]
fn existing_destination_needs_force() {
    let dir = tmp();
    let d = dir.path();
    let src = fixture("r50k_int32");

    // Megatron destination: the .idx decides.
    let m = d.join("m");
    std::fs::write(with_ext(&m, "idx"), b"keep me").unwrap();
    assert_eq!(
        fails(&["convert", &s(&src), &s(&m), "--codec", "u16"]),
        format!(
            "{} exists; pass --force to replace it",
            with_ext(&m, "idx").display()
        )
    );
    assert_eq!(read(&with_ext(&m, "idx")), b"keep me");
    assert_eq!(entries(d), ["m.idx"]);
    convert(&src, &m, &["--codec", "u16", "--force"]);
    assert_same_megatron(&m, &fixture("r50k_uint16"));

    // Block file destination.
    let b = d.join("b.dqb");
    std::fs::write(&b, b"keep me too").unwrap();
    assert_eq!(
        fails(&["convert", &s(&src), &s(&b)]),
        format!("{} exists; pass --force to replace it", b.display())
    );
    assert_eq!(read(&b), b"keep me too");
    convert(&src, &b, &["--force"]);
    assert_identical(&src, &b, &[]);
    assert_eq!(entries(d), ["b.dqb", "m.bin", "m.idx"]);
}

#[test]
fn usage_errors_are_clear() {
    let dir = tmp();
    let src = s(&fixture("r50k_int32"));
    let dst = s(&dir.path().join("x"));
    assert_eq!(
        fails(&["convert", &src, &dst, "--codec", "bits:17"]),
        "Megatron .bin files store u8, u16, i32 or i64 (not bits:17); write a .dqb block file \
         for bits:17"
    );
    assert_eq!(
        fails(&["convert", &src, &dst, "--zstd", "3"]),
        "Megatron .bin files cannot be compressed; write a .dqb block file for zstd:3"
    );
    let dqb = s(&dir.path().join("x.dqb"));
    assert_eq!(
        fails(&[
            "convert",
            &src,
            &dqb,
            "--codec",
            "u16+zstd:3",
            "--zstd",
            "5"
        ]),
        "--codec says zstd:3 but the flags say zstd:5; give one"
    );
    let missing = dir.path().join("missing");
    assert_eq!(
        fails(&["inspect", &s(&missing)]),
        format!(
            "{}: No such file or directory (os error 2)",
            missing.display()
        )
    );
    // An output directory that does not exist is named (the message also shows the temporary
    // file that could not be created there), once.
    let nodir = dir.path().join("nodir");
    let err = fails(&["convert", &src, &s(&nodir.join("x.dqb"))]);
    let want = format!(
        "{}: No such file or directory (os error 2)",
        nodir.display()
    );
    assert!(err.starts_with(&want), "{err}");
    assert_eq!(err.matches("No such file").count(), 1, "{err}");
    assert!(entries(dir.path()).is_empty());
    // clap's own usage errors exit 2.
    let r = dquant(&["convert", &src]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("<DST>"), "{}", r.stderr);
    let r = dquant(&["convert", &src, &dqb, "--preset", "archive", "--zstd", "3"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("the argument '--preset <PRESET>' cannot be used with '--zstd <LEVEL>'"),
        "{}",
        r.stderr
    );
}

#[test]
fn archive_refusals_name_the_cause() {
    let dir = tmp();
    let src = s(&fixture("r50k_int32"));
    let dst = s(&dir.path().join("x"));
    assert_eq!(
        fails(&["convert", &src, &dst, "--preset", "archive", "--format", "megatron"]),
        "Megatron .bin files cannot be compressed; write a .dqb block file for rank+zstd:19"
    );
    // Ids at or over 2^24 have no rank: the first is named, nothing is written.
    let big = dir.path().join("big");
    Megatron::from_docs(&[vec![5, 1 << 24, 7]]).write_i32(&big);
    let out = s(&dir.path().join("big.dqb"));
    assert_eq!(
        fails(&["convert", &s(&big), &out, "--codec", "auto+rank+zstd:3"]),
        format!(
            "{}: token 16777216 at offset 1 is over 2^24 - 1, the largest id rank+zstd takes; use zstd:LEVEL",
            with_ext(&big, "bin").display()
        )
    );
    assert!(!Path::new(&out).exists());
    // `bench codecs` over ids near 2^31: the entropy is counted without a table indexed by
    // id (it would be 16 GB), and a rank+zstd row is refused before its counts are.
    let huge = dir.path().join("huge");
    Megatron::from_docs(&[vec![5, 2_000_000_000, 7, 5, 5, 9]]).write_i32(&huge);
    let v = json(&[
        "bench",
        "codecs",
        &s(&huge),
        "--codecs",
        "u32",
        "--no-presets",
        "--json",
    ]);
    let e = v[0]["order0_entropy_bits_per_token"].as_f64().unwrap();
    assert!((e - (0.5 + 0.5 * 6f64.log2())).abs() < 1e-12, "{e}");
    assert_eq!(
        fails(&[
            "bench",
            "codecs",
            &s(&huge),
            "--codecs",
            "u32+rank+zstd:3",
            "--no-presets",
            "-q"
        ]),
        "token 2000000000 is over 2^24 - 1, the largest id rank+zstd takes"
    );
}
