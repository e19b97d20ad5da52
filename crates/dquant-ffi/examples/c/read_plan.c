/*
 * read_plan: reads a plan's whole stream through the dquant C API and prints a checksum.
 *
 *   read_plan URI PLAN.json OFFLOAD [MODE] [EPOCH:CONSUMED]
 *
 *   URI      dquant://HOST:PORT of an agent, or "-" for none (sources are local paths)
 *   PLAN     a file holding the plan as JSON
 *   OFFLOAD  1 runs the plan on the agent, 0 in this process
 *   MODE     "batches" (default): dq_next_batch, zero copy; "read": dq_read into a 64 KiB
 *            buffer. Both print the same bytes= and fnv=.
 *   EPOCH:CONSUMED  start at this cursor (from an earlier run's `cursor` line) with dq_open_at
 *
 * Prints
 *   batches=N bytes=M fnv=HEX      (MODE batches; "reads=N" instead of batches= for MODE read)
 *   cursor epoch=E consumed_samples=C
 * where fnv is FNV-1a 64 over every byte of the stream. On error it prints dq_last_error()
 * to stderr and exits 1.
 *
 * Build (from the repository root, after `cargo build -p dquant-ffi`):
 *   cc -std=c11 -Wall -Icrates/dquant-ffi/include crates/dquant-ffi/examples/c/read_plan.c \
 *      target/debug/libdquant_ffi.a -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc -o read_plan
 */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dquant.h"

#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL

static uint64_t fnv1a(uint64_t h, const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= FNV_PRIME;
    }
    return h;
}

/* Reports the library's last error and exits. The reader may be NULL. */
static void die(const char *what, dq_reader *r) {
    const char *msg = dq_last_error();
    /* dq_close never changes dq_last_error(), so closing first is safe. */
    dq_close(r);
    fprintf(stderr, "read_plan: %s failed: %s\n", what, msg ? msg : "(no message)");
    exit(1);
}

/* The whole file at path, NUL-terminated; exits on error. */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(1);
    }
    size_t cap = 4096, len = 0;
    char *text = malloc(cap);
    size_t n;
    while (text && (n = fread(text + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len - 1 == 0) {
            cap *= 2;
            char *grown = realloc(text, cap);
            if (!grown) free(text);
            text = grown;
        }
    }
    if (!text || ferror(f)) {
        fprintf(stderr, "read_plan: cannot read %s\n", path);
        exit(1);
    }
    fclose(f);
    text[len] = '\0';
    return text;
}

int main(int argc, char **argv) {
    if (argc < 4 || argc > 6) {
        fprintf(stderr,
                "usage: %s URI|- PLAN.json OFFLOAD(0|1) [batches|read] [EPOCH:CONSUMED]\n",
                argv[0]);
        return 2;
    }
    const char *uri = strcmp(argv[1], "-") == 0 ? NULL : argv[1];
    char *plan = slurp(argv[2]);
    int offload = atoi(argv[3]);
    const char *mode = argc > 4 ? argv[4] : "batches";
    int use_read = strcmp(mode, "read") == 0;
    if (!use_read && strcmp(mode, "batches") != 0) {
        fprintf(stderr, "read_plan: MODE is batches or read, not %s\n", mode);
        return 2;
    }

    dq_reader *r;
    if (argc > 5) {
        uint64_t epoch, consumed;
        if (sscanf(argv[5], "%" SCNu64 ":%" SCNu64, &epoch, &consumed) != 2) {
            fprintf(stderr, "read_plan: the cursor is EPOCH:CONSUMED, not %s\n", argv[5]);
            return 2;
        }
        r = dq_open_at(uri, plan, offload, epoch, consumed);
    } else {
        r = dq_open(uri, plan, offload);
    }
    free(plan);
    if (!r) die("dq_open", NULL);

    uint64_t h = FNV_OFFSET, bytes = 0, count = 0;
    if (use_read) {
        enum { BUF = 64 * 1024 };
        unsigned char *buf = malloc(BUF);
        if (!buf) {
            fprintf(stderr, "read_plan: out of memory\n");
            return 1;
        }
        int64_t n;
        while ((n = dq_read(r, buf, BUF)) > 0) {
            h = fnv1a(h, buf, (size_t)n);
            bytes += (uint64_t)n;
            count++;
        }
        free(buf);
        if (n < 0) die("dq_read", r);
    } else {
        dq_batch b;
        int rc;
        uint64_t next_index = 0;
        while ((rc = dq_next_batch(r, &b)) == 1) {
            /* b.data is the reader's own buffer: use it before the next call. Batch indexes
             * count from the plan's start, also when resuming from a cursor. */
            if ((count > 0 && b.index != next_index) ||
                b.bytes != (size_t)b.samples * b.sample_len * b.itemsize) {
                fprintf(stderr, "read_plan: inconsistent batch %" PRIu64 "\n", b.index);
                dq_close(r);
                return 1;
            }
            h = fnv1a(h, (const unsigned char *)b.data, b.bytes);
            bytes += b.bytes;
            count++;
            next_index = b.index + 1;
        }
        if (rc < 0) die("dq_next_batch", r);
    }

    uint64_t epoch, consumed;
    if (dq_cursor(r, &epoch, &consumed) != 0) die("dq_cursor", r);
    dq_close(r);

    printf("%s=%" PRIu64 " bytes=%" PRIu64 " fnv=%016" PRIx64 "\n", use_read ? "reads" : "batches",
           count, bytes, h);
    printf("cursor epoch=%" PRIu64 " consumed_samples=%" PRIu64 "\n", epoch, consumed);
    return 0;
}
