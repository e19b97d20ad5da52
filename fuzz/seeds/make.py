#!/usr/bin/env python3
"""Writes the seed inputs of the fuzz targets into fuzz/seeds/<target>/ (committed; rerun
after a format change). Each seed is a small well-formed input, so the fuzzer starts from
deep states (valid frames, records, ring headers, plans) instead of finding every magic
number and checksum itself. Layouts are the format tables in dquant-transport (frame.rs,
record.rs, ring/layout.rs) and agent.proto."""
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "..", "testkit", "fixtures", "megatron")
# ring/layout.rs's VERSION.
RING_VERSION = 3


def _table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


TABLE = _table()


def crc32c(b):
    c = 0xFFFFFFFF
    for x in b:
        c = TABLE[(c ^ x) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def frame(kind, seq, payload):
    h = b"DQFR" + bytes([kind, 0, 0, 0]) + struct.pack("<QII", seq, len(payload), crc32c(payload)) + b"\0" * 4
    return h + struct.pack("<I", crc32c(h)) + payload


def stream(payloads, end=True, error=None):
    out = b"".join(frame(1, i, p) for i, p in enumerate(payloads))
    if error is not None:
        out += frame(3, len(payloads), error)
    elif end:
        out += frame(2, len(payloads), b"")
    return out


U16 = bytes([2, 16, 0, 0])  # Codec::to_bytes of u16
LZ4_U8 = bytes([1, 8, 2, 0])


def batch(index, samples, sample_len, payload, codec=U16, cursor=(0, 0)):
    return (b"DQBT" + codec + struct.pack("<QIIII", index, samples, sample_len, len(payload), 0)
            + struct.pack("<QQ", *cursor) + payload)


def range_rec(start, n, payload, codec=U16):
    return b"DQRG" + codec + struct.pack("<QQII", start, n, len(payload), 0) + b"\0" * 16 + payload


def hello(session, ticket=bytes(range(16)), token=None):
    if token is None:
        return b"DQHELLO1" + struct.pack("<Q", session) + ticket
    return b"DQHELLO2" + struct.pack("<Q", session) + ticket + struct.pack("<H", len(token)) + token


def request(ranges):
    return b"DQRQ" + struct.pack("<I", len(ranges)) + b"".join(struct.pack("<QQ", s, n) for s, n in ranges)


def ring_meta(slots, slot_size, flags=1):
    slots_off = (448 + 16 * slots + 4095) // 4096 * 4096
    total = slots_off + slots * slot_size
    meta = struct.pack("<QIIQQQQII", int.from_bytes(b"DQRING\0\x01", "little"), RING_VERSION, slots,
                       slot_size, 448, slots_off, total, flags, 1)
    return meta + b"\0" * 8, total


def shared_ring_meta(slots, slot_size, readers, flags=1):
    """A shared ring's Meta (ring/layout.rs): 192 header bytes, 256 a reader block, 16 a
    completion record, slots from the next page."""
    records = 192 + 256 * readers
    slots_off = (records + 16 * slots + 4095) // 4096 * 4096
    total = slots_off + slots * slot_size
    meta = struct.pack("<QIIQQQQII", int.from_bytes(b"DQRING\0\x01", "little"), RING_VERSION,
                       slots, slot_size, records, slots_off, total, flags, readers)
    return meta + b"\0" * 8, total


def lz4_literals(b):
    """An LZ4 block of literals only (what lz4_flex decodes)."""
    n = len(b)
    if n < 15:
        return bytes([n << 4]) + b
    out = bytearray([0xF0])
    n -= 15
    while n >= 255:
        out.append(255)
        n -= 255
    out.append(n)
    return bytes(out) + b


def write(target, name, data):
    d = os.path.join(HERE, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def main():
    for t in os.listdir(HERE):
        if os.path.isdir(os.path.join(HERE, t)):
            shutil.rmtree(os.path.join(HERE, t))

    # Data-plane frames.
    write("frame_stream", "data-end", stream([b"hello", bytes(range(100))]))
    write("frame_stream", "error", stream([b"x" * 10], error=b"dquant: dataset c/a is gone"))
    write("frame_stream", "truncated", stream([b"abc", b"defg"], end=False))

    # The hello: raw (a ring offer's bytes), framed, and a bad one.
    write("hello", "raw", hello(7))
    write("hello", "framed", stream([hello(1 << 40)], end=False))
    write("hello", "token", stream([hello(5, token=b"tenant-a-token-0123456789")], end=False))
    write("hello", "http", stream([b"GET / HTTP/1.1\r\n"]))

    # Range requests: framed, and raw payloads split at \n--\n (the target frames those).
    reqs = [request([(0, 10), (1 << 35, 4097)]), request([]), request([(5, 1)])]
    write("range_request", "framed", stream(reqs))
    write("range_request", "split", b"\x00" + b"\n--\n".join(reqs))

    # Records: 4 shape bytes (sample_len - 1 as u16, batch_size - 1, kind), then the stream.
    toks = struct.pack("<8H", *range(100, 108))
    recs = batch(0, 2, 4, toks, cursor=(0, 2)) + batch(1, 1, 4, toks[:8], cursor=(0, 3))
    client = struct.pack("<HBB", 3, 1, 0)
    write("batch_records", "client-raw", client + recs)
    write("batch_records", "client-framed", client + stream([recs[:30], recs[30:]]))
    lz = lz4_literals(bytes(range(8)))
    write("batch_records", "client-lz4", client + batch(0, 2, 4, lz, codec=LZ4_U8))
    remote = struct.pack("<HBB", 7, 0, 1)
    write("batch_records", "range", remote + range_rec(1 << 20, 8, toks) + b"\n--\n" + range_rec(8, 8, toks))

    # Ring header: flags (bit 0 sealed, bits 1-2 descriptors sent), file length, commit
    # length, handshake length, handshake, file contents.
    meta, total = ring_meta(2, 4096)
    write("ring_header", "direct", struct.pack("<BIHB", 1, total, 100, 0) + meta)
    offer = b"dquant-ring/1" + hello(3)
    write("ring_header", "offer", struct.pack("<BIHB", 1 | 3 << 1, total, 64, len(offer)) + offer + meta)
    meta, total = ring_meta(3, 100, 0)
    write("ring_header", "odd-slots", struct.pack("<BIHB", 1, total, 100, 0) + meta)

    # The agent's answer to a subscriber: flags (bit 0 sealed, bits 1-2 descriptors sent, bit
    # 3 verify, bit 4 one more), file length, answer length, answer, file contents.
    meta, total = shared_ring_meta(4, 4096, 3)
    reader = b"dquant-ring/a\x01" + struct.pack("<I", 2)
    write("ring_answer", "reader", struct.pack("<BIB", 1 | 3 << 1 | 8, total, len(reader)) + reader + meta)
    behind = reader + stream([b"the stream failed"], end=False)
    write("ring_answer", "reader-then-error", struct.pack("<BIB", 1 | 3 << 1, total, len(behind)) + behind + meta)
    # Reader 2's consumer index past what a ring counts to (once an overflow in `take`).
    far = meta + bytes(192 + 256 * 2 - len(meta)) + struct.pack("<Q", 0xCACACACACACACACA)
    write("ring_answer", "reader-index-far", struct.pack("<BIB", 1 | 3 << 1, total, len(reader)) + reader + far)
    own = b"dquant-ring/a\x00"
    write("ring_answer", "own", struct.pack("<BIB", 0, 0, len(own)) + own)
    refused = stream([b"unknown tenant"], end=False)
    write("ring_answer", "refused", struct.pack("<BIB", 0, 0, len(refused)) + refused)

    # Ring consumer scripts: shape (slots - 1 in bits 0-1, page slots, crc), then steps:
    # 0 publish (len u16, well-formed flag, bytes), 2 take (how), 4 drop (index),
    # 5 close/abort, 6 make_room, 7 scribble (offset u16, n, bytes).
    pub = lambda n: bytes([0]) + struct.pack("<HB", n, 0) + bytes(n)
    take_keep, take_drop = bytes([2, 0]), bytes([2, 2])
    write("ring_consumer", "keep-and-detach",
          bytes([0x0D]) + pub(100) + take_keep + pub(200) + take_keep + pub(60) + take_keep
          + bytes([4, 0]) + pub(48) + take_drop + bytes([5, 0]) + take_keep + take_keep)
    write("ring_consumer", "small-slots-abort",
          bytes([0x02]) + pub(150) + pub(48) + take_keep + take_keep + bytes([6]) + bytes([5, 1]) + take_drop)
    write("ring_consumer", "scribble",
          bytes([0x0C]) + pub(64) + take_keep + bytes([7]) + struct.pack("<HB", 448 + 8, 4) + b"\xff" * 4 + take_keep)

    # Plans.
    plan_json = ('{"sources": [{"uri": "corpus/web", "weight": 0.7}, {"uri": "corpus/code", "weight": 0.3}],'
                 ' "seq_len": 8, "batch_size": 2, "seed": 7, "world": 2, "rank": 1,'
                 ' "wire_codec": "auto+zstd:3", "output": "u16"}')
    write("plan_json", "blend", plan_json)
    write("plan_json", "raw", '{"sources": [{"uri": "raw/t.bin", "dtype": "uint16", "eod": 0}],'
                              ' "seq_len": 4, "batch_size": 1, "samples": 10, "drop_last": true,'
                              ' "wire_codec": "bits:17+lz4", "shuffle": false, "output": "i64"}')
    write("plan_toml", "blend", 'seq_len = 4\nbatch_size = 2\nseed = 7\nworld = 2\nrank = 1\n'
                                'wire_codec = "u16+zstd:3"\n\n[[sources]]\nuri = "data/web"\nweight = 0.7\n\n'
                                '[[sources]]\nuri = "data/code"\nweight = 0.3\n')
    write("plan_toml", "raw", 'seq_len = 16\nbatch_size = 1\nepochs = 3\noutput = "i64"\n\n[[sources]]\n'
                              'uri = "raw/t.bin"\ndtype = "u16"\neod = 50256\n')

    # The Open request: plan_json = 1, epoch = 2, consumed_samples = 3 (agent.proto).
    def varint(v):
        out = bytearray()
        while True:
            b, v = v & 0x7F, v >> 7
            out.append(b | (0x80 if v else 0))
            if not v:
                return bytes(out)

    def open_req(plan, epoch, consumed):
        p = plan.encode()
        return b"\x0a" + varint(len(p)) + p + b"\x10" + varint(epoch) + b"\x18" + varint(consumed)

    write("grpc_open", "start", open_req(plan_json, 0, 0))
    write("grpc_open", "resume", open_req(plan_json, 0, 4))
    one = '{"sources": [{"uri": "c/a"}], "seq_len": 3, "batch_size": 4}'
    write("grpc_open", "one-source-far", open_req(one, 3, 12))

    # Document sections (doc_section target: u16 samples, u16 seq_len, then the trailer).
    def section(fmt, n, words=None, rows=None):
        body = struct.pack("<II", fmt, n) + (struct.pack("<%dI" % len(words), *words) if words else rows)
        return body + b"\0" * (-len(body) % 8)

    write("doc_section", "list", struct.pack("<HH", 2, 16) + section(1, 3, words=[1, 2, 5, 3, 9]))
    write("doc_section", "bitmask", struct.pack("<HH", 2, 16) + section(2, 3, rows=bytes([0x10, 0, 0x04, 0x01])))
    write("doc_section", "with-cursor", struct.pack("<HH", 1, 7) + section(1, 1, words=[1, 6]) + b"\1" * 16)

    # The format targets: small real files.
    for name in ("r50k_uint16.idx", "r50k_int32_multiseq.idx"):
        src = os.path.join(FIXTURES, name)
        if os.path.exists(src):
            with open(src, "rb") as f:
                write("idx_parser", name, f.read())
    data = os.path.join(HERE, "..", "..", "crates", "dquant-format", "tests", "data")
    for src, name in (("fuzz-crash-first-token-overflow.dqb", "first-token-overflow.dqb"),
                      ("ranked-v2.dqb", "ranked-v2.dqb")):
        with open(os.path.join(data, src), "rb") as f:
            write("block_file", name, f.read())

    # Chunk sums of a fixture's .bin in 4 KiB chunks (the sidecar `dquant sums` writes):
    # magic, chunk size, zero, the .bin's length, a crc32c a chunk, the crc32c of all before.
    src = os.path.join(FIXTURES, "r50k_uint16.bin")
    if os.path.exists(src):
        with open(src, "rb") as f:
            b = f.read()
        chunk = 4096
        body = b"DQSUMS\0\x01" + struct.pack("<IIQ", chunk, 0, len(b))
        body += b"".join(struct.pack("<I", crc32c(b[i:i + chunk])) for i in range(0, len(b), chunk))
        write("chunk_sums", "r50k_uint16.dqsum", body + struct.pack("<I", crc32c(body)))
        empty = b"DQSUMS\0\x01" + struct.pack("<IIQ", 65536, 0, 0)
        write("chunk_sums", "empty.dqsum", empty + struct.pack("<I", crc32c(empty)))
        # Found by the target: bytes 12..16 not zero were ignored, so the sidecar did not
        # re-encode to its bytes; now refused.
        reserved = b"DQSUMS\0\x01" + struct.pack("<IIQ", 65536, 0x27000000, 0)
        write("chunk_sums", "reserved-not-zero.dqsum", reserved + struct.pack("<I", crc32c(reserved)))


if __name__ == "__main__":
    main()
