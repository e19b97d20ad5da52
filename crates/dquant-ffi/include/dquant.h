/*
 * dquant.h: the C API of dquant's host reader (libdquant_ffi.so / libdquant_ffi.a).
 *
 * dquant delivers an LLM training plan's token batches: sources blended by weight, packed into
 * samples of seq_len + 1 tokens, shuffled, sharded by data-parallel rank. The plan is JSON,
 * the same text `dquant` and the Rust and Python APIs take, e.g.
 *
 *     {"sources":[{"uri":"corpus/r50k"}],"seq_len":2048,"batch_size":8,"seed":7,"output":"i32"}
 *
 * A plan runs in this process (offload = 0) or on a dquant agent (offload = 1, uri =
 * "dquant://HOST:PORT", or the agent's Unix socket path on this host, e.g.
 * "/run/dquant.sock"), and gives the same bytes either way. Through a Unix socket the agent
 * writes batches into shared memory this process created, and dq_next_batch points into it.
 *
 *     dq_reader *r = dq_open("dquant://10.0.0.5:7070", plan_json, 1);
 *     if (!r) { fprintf(stderr, "dquant: %s\n", dq_last_error()); exit(1); }
 *     dq_batch b;
 *     int rc;
 *     while ((rc = dq_next_batch(r, &b)) == 1)
 *         train_step(b.data, b.samples, b.sample_len);  // b.data: borrowed, no copy
 *     if (rc < 0) fprintf(stderr, "dquant: %s\n", dq_last_error());
 *     uint64_t epoch, consumed;
 *     dq_cursor(r, &epoch, &consumed);  // checkpoint this; dq_open_at resumes from it
 *     dq_close(r);
 *
 * Linking: `-ldquant_ffi` (shared), or libdquant_ffi.a plus the system libraries the Rust
 * standard library needs, on Linux `-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc` (the list
 * `rustc --print native-static-libs` prints for a static library).
 *
 * Errors: a failing call returns NULL or -1 and stores a message for this thread, which
 * dq_last_error() returns (as errno / dlerror()). Messages are the same text the Rust API and
 * the `dquant` command print, e.g. "seq_len: must be at least 1".
 *
 * Threads: a reader may move between threads but must not be used by two at once. Error
 * messages are per thread.
 *
 * Strings are UTF-8 and NUL-terminated. Token data is little-endian.
 */

#ifndef DQUANT_H
#define DQUANT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A reader of one rank's batches of a plan. Opaque; from dq_open / dq_open_at, freed by
 * dq_close. */
typedef struct dq_reader dq_reader;

/* One batch: `samples` rows of `sample_len` token ids, each `itemsize` bytes, row-major. */
typedef struct dq_batch {
    /* The tokens, in the plan's output dtype: uint16_t ("u16"), int32_t ("i32") or
     * int64_t ("i64"). Borrowed from the reader: valid until the next call on that reader
     * (dq_next_batch, dq_read, dq_close); copy what you need to keep. */
    const void *data;
    /* Bytes at data: samples * sample_len * itemsize. */
    size_t bytes;
    /* Index of this batch in the rank's stream (0 for the first batch of the plan). */
    uint64_t index;
    /* Samples in this batch: the plan's batch_size, or fewer in a short last batch. */
    uint32_t samples;
    /* Tokens per sample: the plan's seq_len + 1 (inputs are the first seq_len tokens,
     * labels the last seq_len). */
    uint32_t sample_len;
    /* Bytes per token id: 2, 4 or 8. */
    uint32_t itemsize;
    /* Document boundaries, when the plan sets "boundaries" ("eod" with "eod": ID, or
     * "documents"); NULL and 0 otherwise. Sample k's document starts, the input positions
     * in 1..=seq_len at which a document begins, are doc_starts[doc_offsets[k]] up to
     * doc_starts[doc_offsets[k + 1]] (exclusive); doc_offsets has samples + 1 entries.
     * Then position_ids[i] = i - (the last start <= i, or 0), loss_mask[i] = 0 where i + 1
     * is a start, and each start below seq_len begins a cu_seqlens segment. Borrowed like
     * data. */
    const uint32_t *doc_offsets;
    const uint32_t *doc_starts;
    /* Entries at doc_starts. */
    size_t doc_starts_len;
} dq_batch;

/* Opens plan_json (a plan as JSON) from the start of its stream.
 *
 * uri: "dquant://HOST:PORT" of an agent, its Unix socket path (batches then arrive through
 *      a shared-memory ring: "/run/dquant.sock", "unix:PATH"; options "?transport=shm|tcp",
 *      "&verify=true", "&slots=N"), or NULL or "" for none. Without an agent, plan
 *      sources are local paths (a Megatron .bin/.idx prefix, a .dqb block file, a raw token
 *      file with a "dtype"). With one, a relative source name ("corpus/r50k") is a dataset
 *      on that agent.
 * offload: nonzero runs the plan on the agent (uri required), which streams finished
 *      batches; 0 runs it in this process (pulling the tokens of agent datasets by range).
 *
 * Returns the reader, or NULL on error (see dq_last_error()). */
dq_reader *dq_open(const char *uri, const char *plan_json, int offload);

/* As dq_open, but starts at a cursor saved with dq_cursor from a reader of the same plan:
 * the stream continues exactly after the last batch that reader handed out whole.
 * dq_open_at(uri, plan, offload, 0, 0) is dq_open(uri, plan, offload). */
dq_reader *dq_open_at(const char *uri, const char *plan_json, int offload, uint64_t epoch,
                      uint64_t consumed_samples);

/* As dq_open_at, at a whole cursor in JSON, as dq_cursor_json or dq_merge_cursors wrote it:
 * {"epoch":E,"consumed_samples":N,"blend":[...],"delivered":[...]}, the last two optional.
 * With "blend" (the blend's per-source counts) a blended plan resumes without replaying the
 * blend from sample 0; a merged cursor resumes on another number of ranks. cursor_json NULL
 * starts at the beginning. Returns NULL on error. */
dq_reader *dq_open_cursor(const char *uri, const char *plan_json, int offload,
                          const char *cursor_json);

/* Opens plan_json on the agent at uri as the shared stream named share (e.g. "job42/dp3"),
 * or joins the stream of that name another reader of this tenant opened with the same plan:
 * the agent runs the plan once and every reader of the stream gets the same batches (the
 * tensor-parallel ranks of one data-parallel rank). cursor_json (NULL: the start) must be
 * the stream's current cursor or a batch boundary still in its window when the stream
 * exists. The stream makes no batch until group readers have joined (this one included),
 * at most the agent's ticket lifetime; 0 or 1 starts at once. Returns NULL on error. */
dq_reader *dq_open_shared(const char *uri, const char *plan_json, const char *cursor_json,
                          const char *share, uint32_t group);

/* Joins the shared stream named share on the agent at uri (see dq_open_shared) at
 * cursor_json (a batch boundary still in the stream's window) or, NULL, at the stream's
 * current cursor. The plan comes from the agent. Returns NULL on error (no such stream for
 * this tenant, a cursor no longer in the window). */
dq_reader *dq_subscribe(const char *uri, const char *share, const char *cursor_json);

/* Copies the next bytes of the stream (batches back to back, in the plan's output dtype)
 * into buf, up to len bytes. Returns the bytes written (fewer than len only at the end of the
 * stream), 0 at the end (or when len is 0), -1 on error.
 *
 * A reader is consumed either with dq_read or with dq_next_batch: the first call decides, and
 * calling the other one afterwards is an error. */
int64_t dq_read(dq_reader *r, void *buf, size_t len);

/* Takes the next batch into *out, without copying it (see dq_batch.data).
 * Returns 1 with *out filled, 0 at the end of the stream, -1 on error; when it returns 0 or
 * -1, *out has data == NULL and zero sizes. */
int dq_next_batch(dq_reader *r, dq_batch *out);

/* Stores the reader's cursor (where a resumed reader continues: after the last batch handed
 * out whole, by dq_next_batch or completely by dq_read) in *epoch and *consumed_samples.
 * Either pointer may be NULL to skip that value. Returns 0, or -1 on error. */
int dq_cursor(const dq_reader *r, uint64_t *epoch, uint64_t *consumed_samples);

/* Writes the reader's whole cursor (what dq_cursor gives, plus the blend's counts and the
 * samples a merged cursor listed as delivered past it) as JSON into buf, snprintf-style: at
 * most len bytes, NUL-terminated when len > 0. Returns the JSON's length without the NUL (a
 * result >= len means buf was too small: call again with more), or -1 on error. */
int64_t dq_cursor_json(const dq_reader *r, char *buf, size_t len);

/* Merges the cursors of all n sub-ranks of one run (cursors[r]: the dq_cursor_json of the
 * reader that ran the plan as rank r of world n, after the last batch the loop received from
 * it) into one cursor that a job on any number of ranks opens with dq_open_cursor: nothing
 * lost, nothing repeated. Writes it as JSON into buf, snprintf-style (as dq_cursor_json).
 * Returns its length, or -1 on error. */
int64_t dq_merge_cursors(const char *const *cursors, size_t n, char *buf, size_t len);

/* Closes the reader (ending its session on the agent, if offloaded) and frees it. NULL is
 * ignored. Does not change dq_last_error(), so a program can close a reader before it
 * reports why it stopped. */
void dq_close(dq_reader *r);

/* The message of the last failing dq_* call on this thread (NUL-terminated, UTF-8), or NULL
 * if none has failed. Like errno, it is only meaningful right after a call that reported
 * failure: successful calls leave it unchanged. The string is owned by the library and valid
 * until the next failing dq_* call on this thread. */
const char *dq_last_error(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DQUANT_H */
