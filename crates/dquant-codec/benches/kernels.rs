//! Kernel throughput against `memcpy` of the same bytes, measured in the same run.
//!
//! Every benchmark in a `kernels/<set>` group reports `Throughput::Bytes` of the **u32 side**
//! (4 bytes per token): the input of a store/pack/scan, the output of a load/unpack. The
//! `memcpy` benchmark in the same group copies exactly that many bytes between two preallocated
//! buffers (measured first and again last, as `memcpy_last`: on a shared machine take the faster
//! of the two), so `kernel MiB/s / memcpy MiB/s` is the ratio the goals are stated in:
//!
//! * `store_u16` (u32 -> u16 with the range check) >= 1.0x memcpy;
//! * `pack_bits17/18` and `unpack_bits17/18` >= 0.5x memcpy.
//!
//! Two working sets: `l2` (256 KiB of u32 input, fits the per-core L2 with its output) and
//! `big` (64 MiB of input, far beyond L2). The `zstd` group encodes and decodes one 1 MiB
//! block (262144 tokens) through `Encoder`/`Decoder` and prints each codec's compression ratio.
//!
//! Token ids are Zipf(1.0)-distributed over a tokenizer-sized vocabulary (deterministic
//! generator below, frequent tokens mostly at low ids as in BPE vocabularies). They are i.i.d.,
//! so the zstd ratios here carry no n-gram repetition: real text compresses better.
//!
//! The `ranks` group decodes and encodes frequency-rank codes (the archive codec's step after
//! zstd) in tokens per second, beside a copy of the u32 output.
//!
//! Run: `cargo bench -p dquant-codec --bench kernels` (add a filter such as `kernels/l2` to run
//! one group).

use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use dquant_codec::{
    decode_width, encode_width, kernels, Codec, Decoder, Encoder, RankTable, Width,
};

/// Working sets for the kernel groups: (name, tokens).
const SETS: [(&str, usize); 2] = [("l2", 64 * 1024), ("big", 16 * 1024 * 1024)];

/// Tokens in one 1 MiB block of u32 ids: the unit the zstd group compresses.
const BLOCK_TOKENS: usize = 256 * 1024;

/// Vocabulary sizes of common tokenizers: GPT-2 (u16), cl100k (bits:17), o200k (bits:18).
const VOCAB_16: u32 = 50_257;
const VOCAB_17: u32 = 100_277;
const VOCAB_18: u32 = 200_019;

/// splitmix64: small, deterministic, good enough to drive a sampler.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `n` Zipf(1.0) token ids below `vocab`. Rank r maps to an id near r (BPE vocabularies put
/// frequent merges early) with local shuffling, and the largest id `vocab - 1` is always
/// present so the data needs exactly the width its vocabulary implies.
fn zipf_tokens(n: usize, vocab: u32, seed: u64) -> Vec<u32> {
    let mut rng = Rng(seed);
    // Inverse-CDF table over ranks 1..=vocab.
    let mut cdf = Vec::with_capacity(vocab as usize);
    let mut sum = 0.0f64;
    for r in 1..=vocab {
        sum += 1.0 / r as f64;
        cdf.push(sum);
    }
    // Rank -> id: identity perturbed by swaps within windows of 64 ids.
    let mut id_of: Vec<u32> = (0..vocab).collect();
    for i in 0..vocab as usize {
        let lo = i & !63;
        let hi = (lo + 64).min(vocab as usize);
        let j = lo + (rng.next() % (hi - lo) as u64) as usize;
        id_of.swap(i, j);
    }
    let mut out: Vec<u32> = (0..n)
        .map(|_| {
            let u = rng.unit() * sum;
            let rank = cdf.partition_point(|&c| c < u).min(vocab as usize - 1);
            id_of[rank]
        })
        .collect();
    if let Some(last) = out.last_mut() {
        *last = vocab - 1;
    }
    out
}

/// `n` tokens built by repeating one 1 MiB block: cheap to build at 64 MiB, and the kernels are
/// data-independent anyway.
fn tiled(block: &[u32], n: usize) -> Vec<u32> {
    block.iter().copied().cycle().take(n).collect()
}

fn configure(g: &mut BenchmarkGroup<'_, WallTime>) {
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
}

fn bench_kernels(c: &mut Criterion) {
    let base16 = zipf_tokens(BLOCK_TOKENS, VOCAB_16, 16);
    let base17 = zipf_tokens(BLOCK_TOKENS, VOCAB_17, 17);
    let base18 = zipf_tokens(BLOCK_TOKENS, VOCAB_18, 18);
    for (set, n) in SETS {
        let t16 = tiled(&base16, n);
        let t17 = tiled(&base17, n);
        let t18 = tiled(&base18, n);
        let bytes = (n * 4) as u64;

        let mut g = c.benchmark_group(format!("kernels/{set}"));
        configure(&mut g);
        g.throughput(Throughput::Bytes(bytes));

        // The yardstick: memcpy of the u32 bytes, both buffers preallocated. Measured first
        // and again last, so drift on a shared machine shows (compare against the faster).
        let src: Vec<u8> = t16.iter().flat_map(|t| t.to_le_bytes()).collect();
        let mut dst = vec![0u8; src.len()];
        let mut memcpy = |g: &mut BenchmarkGroup<'_, WallTime>, name: &str| {
            g.bench_function(name, |b| {
                b.iter(|| dst.copy_from_slice(black_box(&src)));
            });
        };
        memcpy(&mut g, "memcpy");

        g.bench_function("max_token", |b| {
            b.iter(|| kernels::max_token(black_box(&t16)));
        });

        let mut out = vec![0u32; n];
        for (name, w, toks) in [("u16", Width::U16, &t16), ("u24", Width::U24, &t18)] {
            let mut enc = vec![0u8; w.encoded_len(n)];
            g.bench_function(format!("store_{name}"), |b| {
                b.iter(|| kernels::store_plain(w, black_box(toks), &mut enc).unwrap());
            });
            g.bench_function(format!("load_{name}"), |b| {
                b.iter(|| kernels::load_plain(w, black_box(&enc), &mut out).unwrap());
            });
            // Once more outside criterion, whose filter may have skipped the closures.
            kernels::store_plain(w, toks, &mut enc).unwrap();
            kernels::load_plain(w, &enc, &mut out).unwrap();
            assert_eq!(&out, toks, "{name} round trip");
        }

        for (bits, toks) in [(17, &t17), (18, &t18)] {
            let w = Width::Bits(bits);
            let mut enc = vec![0u8; w.encoded_len(n)];
            g.bench_function(format!("pack_bits{bits}"), |b| {
                b.iter(|| encode_width(w, black_box(toks), &mut enc).unwrap());
            });
            g.bench_function(format!("unpack_bits{bits}"), |b| {
                b.iter(|| decode_width(w, black_box(&enc), &mut out).unwrap());
            });
            encode_width(w, toks, &mut enc).unwrap();
            decode_width(w, &enc, &mut out).unwrap();
            assert_eq!(&out, toks, "bits:{bits} round trip");
        }
        memcpy(&mut g, "memcpy_last");
        g.finish();
    }
}

fn bench_zstd(c: &mut Criterion) {
    let t16 = zipf_tokens(BLOCK_TOKENS, VOCAB_16, 16);
    let t18 = zipf_tokens(BLOCK_TOKENS, VOCAB_18, 18);
    let mut g = c.benchmark_group("zstd/block1MiB");
    configure(&mut g);
    g.throughput(Throughput::ElementsAndBytes {
        elements: BLOCK_TOKENS as u64,
        bytes: (BLOCK_TOKENS * 4) as u64,
    });
    for (name, toks) in [
        ("u16+zstd:1", &t16),
        ("u16+zstd:3", &t16),
        ("u24+zstd:3", &t18),
    ] {
        let codec: Codec = name.parse().unwrap();
        let mut enc = Encoder::new(codec).unwrap();
        let mut payload = Vec::new();
        enc.encode(toks, &mut payload).unwrap();
        let raw = codec.raw_len(toks.len());
        println!(
            "ratio {name}: {} tokens, {} B compressed; {:.3}x vs {} ({} B), {:.3}x vs u32, {:.2} bits/token",
            toks.len(),
            payload.len(),
            raw as f64 / payload.len() as f64,
            codec.width,
            raw,
            (toks.len() * 4) as f64 / payload.len() as f64,
            payload.len() as f64 * 8.0 / toks.len() as f64,
        );
        let mut buf = Vec::new();
        g.bench_function(format!("encode/{name}"), |b| {
            b.iter(|| {
                buf.clear();
                enc.encode(black_box(toks), &mut buf).unwrap()
            });
        });
        let mut dec = Decoder::new();
        let mut out = vec![0u32; toks.len()];
        g.bench_function(format!("decode/{name}"), |b| {
            b.iter(|| dec.decode(codec, black_box(&payload), &mut out).unwrap());
        });
        dec.decode(codec, &payload, &mut out).unwrap();
        assert_eq!(&out, toks, "{name} round trip");
    }
    g.finish();
}

/// Rank codes alone (`RankTable::decode`, the archive codec's step after zstd): Zipf ids of an
/// o200k-sized vocabulary ranked by their counts, against a copy of the u32 output.
fn bench_ranks(c: &mut Criterion) {
    let toks = zipf_tokens(4 * BLOCK_TOKENS, VOCAB_18, 7);
    let mut counts = vec![0u64; VOCAB_18 as usize];
    toks.iter().for_each(|&t| counts[t as usize] += 1);
    let table = RankTable::from_counts(&counts).unwrap();
    let mut codes = Vec::new();
    table.encoder().encode(&toks, &mut codes).unwrap();
    println!(
        "rank codes: {} tokens, {:.3} bytes/token",
        toks.len(),
        codes.len() as f64 / toks.len() as f64
    );
    let mut g = c.benchmark_group("ranks/1Mi");
    configure(&mut g);
    g.throughput(Throughput::Elements(toks.len() as u64));
    let mut out = vec![0u32; toks.len()];
    g.bench_function("memcpy_u32", |b| {
        b.iter(|| out.copy_from_slice(black_box(&toks)))
    });
    g.bench_function("decode", |b| {
        b.iter(|| table.decode(black_box(&codes), &mut out).unwrap())
    });
    table.decode(&codes, &mut out).unwrap();
    assert_eq!(out, toks, "rank codes round trip");
    let enc = table.encoder();
    g.bench_function("encode", |b| {
        b.iter(|| {
            codes.clear();
            enc.encode(black_box(&toks), &mut codes).unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, bench_kernels, bench_zstd, bench_ranks);
criterion_main!(benches);
