#!/usr/bin/env bash
# Codecs on real text: the criterion kernels against memcpy, then `dquant bench codecs` on
# English prose and on code, each tokenized three ways (r50k, cl100k, o200k), against whole-file
# `zstd -3` and `zstd -19 --long` of the int32 file and the order-0 entropy, all in the same
# run. Writes OUT/codecs.json, OUT/kernels.txt and OUT/figures.json, then records the figures
# (bench/results.py record codecs) unless --no-record.
#
#   bench/codecs/run.sh [--no-record] [DATA_DIR [OUT_DIR]]
#
# Prose comes from Debian packages (installed when missing): the Collaborative International
# Dictionary of English (dict-gcide, split in 200 KB documents) and the Python 3.11 manual's
# reStructuredText sources (python3.11-doc). Code is the Rust crate sources under
# $CARGO_HOME/registry/src. Code compresses about twice as well as prose: judge on both.
set -euo pipefail
cd "$(dirname "$0")/../.."
record=1
if [ "${1:-}" = --no-record ]; then record=0; shift; fi
data=${1:-/work/bench-data/codecs}
out=${2:-bench/codecs/out/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$data" "$out"
cargo build --release --locked -q -p dquant-cli
dquant=target/release/dquant

if [ ! -d "$data/prose" ]; then
  if [ ! -e /usr/share/dictd/gcide.dict.dz ] || [ ! -d /usr/share/doc/python3.11/html/_sources ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dict-gcide python3.11-doc
  fi
  mkdir -p "$data/prose.tmp/gcide" "$data/prose.tmp/python"
  zcat /usr/share/dictd/gcide.dict.dz | split -C 200k -d -a 4 --additional-suffix=.txt - "$data/prose.tmp/gcide/gcide_"
  find /usr/share/doc/python3.11/html/_sources -name '*.txt' | sort | while read -r f; do
    cp "$f" "$data/prose.tmp/python/$(echo "$f" | md5sum | cut -c1-12).txt"
  done
  mv "$data/prose.tmp" "$data/prose"
fi
sets=()
for enc in r50k cl100k o200k; do
  [ -e "$data/prose_$enc.idx" ] || $dquant corpus real --root "$data/prose" --ext txt --max-mb 64 --encoding $enc -q "$data/prose_$enc" >/dev/null
  [ -e "$data/code_$enc.idx" ] || $dquant corpus real --max-mb 32 --encoding $enc -q "$data/code_$enc" >/dev/null
done
for kind in prose code; do for enc in r50k cl100k o200k; do sets+=("$data/${kind}_$enc"); done; done

cargo bench -p dquant-codec --bench kernels 2>&1 | grep -E '^(kernels|zstd|ranks)/|thrpt|ratio|rank codes' > "$out/kernels.txt"
$dquant bench codecs "${sets[@]}" --json > "$out/codecs.json"
# What the archive preset's convert holds in memory (the counts, zstd -19's context, a block).
rm -f "$out/archive.dqb"
/usr/bin/time -v $dquant convert "$data/prose_o200k" "$out/archive.dqb" --preset archive -q --json \
  > "$out/convert.json" 2> "$out/convert.time"
rm -f "$out/archive.dqb"
lscpu | grep -E 'Model name|^CPU\(s\)' > "$out/machine.txt"

python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
est = lambda g, b: json.load(open(f"target/criterion/{g}/{b}/new/estimates.json"))["mean"]["point_estimate"]
figs = []
memcpy = min(est("kernels_big", "memcpy"), est("kernels_big", "memcpy_last"))
for bench, goal, what in [("store_u16", ">= 1.0", "u32→u16 narrowing with range check"),
                          ("pack_bits17", ">= 0.5", "pack bits:17"), ("unpack_bits18", ">= 0.5", "unpack bits:18")]:
    figs.append({"name": f"{what}, 64 MiB set, ratio to memcpy", "value": round(memcpy / est("kernels_big", bench), 2),
                 "unit": "×", "baseline": f"memcpy of the same bytes, same group: {64 * 2**20 / memcpy * 1e9 / 2**20:.0f} MiB/s", "goal": goal})
ranks = 2**20 / est("ranks_1Mi", "decode") * 1e3
figs.append({"name": "rank codes alone (the archive codec's step after zstd), Zipf ids of an o200k vocabulary, decode, 1 thread",
             "value": round(ranks), "unit": "Mtok/s", "baseline": f"a copy of the u32 output, same group: {2**20 / est('ranks_1Mi', 'memcpy_u32') * 1e3:.0f} Mtok/s", "goal": None})
for r in json.load(open(out / "codecs.json")):
    name = pathlib.Path(r["path"]).name.replace("_", " ")
    arch = next(c for c in r["codecs"] if c["codec"].startswith("archive"))
    z3, long = r["baseline"], r["baseline_long"]
    figs.append({"name": f"{name}: archive preset ({arch['codec'][9:]}, 2 Mi-token blocks, rank table included), bytes against whole-file zstd -19 --long",
                 "value": round(arch["vs_zstd19_long_whole"], 3), "unit": "×",
                 "baseline": f"zstd -19 --long over the raw int32 file: {long['bits_per_token']:.2f} bits/token (archive {arch['bits_per_token']:.2f}; order-0 entropy {r['order0_entropy_bits_per_token']:.2f}; zstd -3 {z3['bits_per_token']:.2f})",
                 "goal": "<= 1.0"})
    figs.append({"name": f"{name}: archive preset, decode, 1 thread", "value": round(arch["decode_mtok_s"]), "unit": "Mtok/s",
                 "baseline": f"zstd -3 decode of the raw int32 file, same run: {z3['decode_mtok_s']:.0f} Mtok/s", "goal": ">= 250"})
    dpu = next(c for c in r["codecs"] if c["codec"].startswith("dpu"))
    lz4 = next(c for c in r["codecs"] if c["codec"].endswith("+lz4") and c["codec"][:3] in ("u16", "u24"))
    figs.append({"name": f"{name}: dpu preset ({dpu['codec'][5:]}, 32 KiB blocks, BlueField-3's LZ4 window), bytes against {lz4['codec']} in 1 MiB blocks",
                 "value": round(dpu["bytes"] / lz4["bytes"], 3), "unit": "×",
                 "baseline": f"{lz4['codec']}, same run: {lz4['bits_per_token']:.2f} bits/token (dpu {dpu['bits_per_token']:.2f}; {dpu['vs_zstd3_whole']:.3f}× whole-file zstd -3)",
                 "goal": None})
    figs.append({"name": f"{name}: dpu preset, software decode (a host, or an ARM core without the engine), 1 thread", "value": round(dpu["decode_mtok_s"]), "unit": "Mtok/s",
                 "baseline": f"{lz4['codec']} in 1 MiB blocks, same run: {lz4['decode_mtok_s']:.0f} Mtok/s; zstd -3 of the raw int32 file: {z3['decode_mtok_s']:.0f} Mtok/s", "goal": None})
    z3blk = next(c for c in r["codecs"] if c["codec"].endswith("+zstd:3") and c["codec"][:3] in ("u16", "u24"))
    tr = next(c for c in r["codecs"] if c["codec"].startswith("transport"))
    figs.append({"name": f"{name}: transport preset ({tr['codec'][11:]}: one session's 32 Ki-token wire batches in one zstd stream, record headers included), bytes against whole-file zstd -3",
                 "value": round(tr["vs_zstd3_whole"], 3), "unit": "×",
                 "baseline": f"zstd -3 over the raw int32 file: {z3['bits_per_token']:.2f} bits/token (transport {tr['bits_per_token']:.2f}; {z3blk['codec']} in 1 MiB blocks {z3blk['vs_zstd3_whole']:.3f}×)",
                 "goal": "<= 0.85"})
    figs.append({"name": f"{name}: transport preset, decode in order, 1 thread", "value": round(tr["decode_mtok_s"]), "unit": "Mtok/s",
                 "baseline": f"{z3blk['codec']} in 1 MiB blocks, same run: {z3blk['decode_mtok_s']:.0f} Mtok/s; zstd -3 of the raw int32 file: {z3['decode_mtok_s']:.0f} Mtok/s; encode {tr['encode_mtok_s']:.0f} Mtok/s",
                 "goal": ">= 500"})
    # Where the transport's decode time goes: zstd inflating the chunks alone, and the rest
    # (the byte code for ids over 16 bits, or the width) by difference.
    rest = 1e3 / tr["decode_mtok_s"] - 1e3 / tr["inflate_mtok_s"]
    figs.append({"name": f"{name}: transport preset, its zstd stage alone (inflating each batch's chunk), decode in order, 1 thread", "value": round(tr["inflate_mtok_s"]), "unit": "Mtok/s",
                 "baseline": f"the whole decode, same run: {tr['decode_mtok_s']:.0f} Mtok/s; the stage after zstd (byte code or width) takes the rest, {rest:.2f} ns/token",
                 "goal": None})
rss = next(int(l.split(":")[1]) for l in open(out / "convert.time") if "Maximum resident set size" in l)
conv = json.load(open(out / "convert.json"))
figs.append({"name": "dquant convert --preset archive, max RSS (prose o200k)", "value": round(rss * 1024 / 1e6, 1), "unit": "MB",
             "baseline": f"the goal is 256 MiB (= 268.4 MB) whatever the input; this input is {conv['src_bytes'] / 1e6:.0f} MB, written at {conv['tokens'] / conv['seconds'] / 1e6:.1f} M tokens/s",
             "goal": "<= 268.435456"})
json.dump({"figures": figs}, open(out / "figures.json", "w"), indent=1, ensure_ascii=False)
PY
echo "wrote $out"
if [ $record = 1 ]; then
  bench/results.py record codecs --figures "$out/figures.json" --command "bench/codecs/run.sh" \
    --machine "$(sed -n 's/Model name: *//p' "$out/machine.txt" | head -1), $(sed -n 's/^CPU(s): *//p' "$out/machine.txt") vCPU" \
    --title "Codecs: kernels against memcpy; on English prose and on code, the archive preset against whole-file zstd -19 --long, the dpu preset against lz4, and the transport preset against whole-file zstd -3" \
    --notes "Corpora: prose is 64 MB of English (the GCIDE dictionary from dict-gcide, split in 200 KB documents, and the Python 3.11 manual's reStructuredText from python3.11-doc), code 32 MB of Rust crate sources, each tokenized with r50k, cl100k and o200k (dquant corpus real). Baselines are whole-file zstd over the raw int32 file (libzstd via the zstd crate; -19 --long is level 19 with long-distance matching and a 2^27 window, as the CLI's --long), measured in the same run; codec sizes are whole .dqb files (headers, block table, and for the archive preset its rank table). The dpu preset (dquant convert --preset dpu) is LZ4 written by liblz4's high-compression parser (level 9) in blocks of at most 32 KiB, the largest LZ4 window of BlueField-3's decompression engine; its decode here is software (lz4_flex), what a host or an ARM core pays without the engine. The transport preset (plan wire_codec transport, the default) is measured as one session sends it: the tokens cut into wire batches of 32,768 (8 × 4,096), each batch's width picked from its largest id as the agent picks it, all in one zstd stream (level 5) flushed at each batch, decoded in order by one reader; its bytes are the payloads plus a 48-byte record header a batch. Speeds are one thread, data in memory, decode best of 3. Kernel ratios are criterion means against memcpy of the same bytes (the 64 MiB set; the faster of the group's two memcpy runs)."
fi
