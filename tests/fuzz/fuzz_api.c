/* libFuzzer harness: runs the input as a small program of ccq API calls, good and bad, on the
 * host backend, and checks the contract of include/ccq.h and DESIGN.md after every call and at
 * the end (all commands accounted for, nothing pending, no leak, no hang). */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ccq.h"

/*
 * Input format (bytes past the end read as 0, so every input is a valid program):
 *
 *   h0  devices 1 + (h0 & 7); streams per device 1 + ((h0 >> 3) & 3);
 *       CCQ_FLAG_NONBLOCKING_SUBMIT if h0 & 0x20; host workers 1 + ((h0 >> 6) & 1)
 *   h1  queue_depth 1 + (h1 & 15); max_batch_ops 1 + ((h1 >> 4) & 7)
 *   h2  timeout_ms from {20, 20, 30, 40, 50, 80, 120, 200}[h2 & 7]; spin_us 20 if h2 & 0x80
 *       (else 0); trace_capacity fz_trace_caps[(h2 >> 3) & 15] (256 for 0; 0 = recorder off;
 *       at most 1024); trace_file is never set
 *   h3  seed of the pattern the harness buffers are filled with
 *   h4  fault plan (h4 >> 5): 0-2 none, 3 drop, 4 fail:op, 5 fail:every, 6 delay, 7 raw
 *       string of h5 & 31 input bytes (fuzzes the parser)
 *   h5  fault parameters
 *   h6  >= 0xF0: a bad (or seed-era) configuration, variant h6 & 15; the input ends there
 *
 * Then up to FZ_MAX_OPS opcodes, each followed by its operands (see the FZ_OP_* list). An
 * opcode byte below 0xE0 is (byte % FZ_OP_COUNT), as it has been since the first corpus;
 * 0xE0-0xEF is FZ_OP_COLL, 0xF0-0xF7 FZ_OP_COLL_ALL and 0xF8-0xFF FZ_OP_TRACE (for these two
 * the low three bits choose a variant). Operand pickers return mostly valid values and sometimes
 * invalid ones: devices, streams and roots out of range or out of the set, dtypes and ops out of
 * the enums, counts whose size in bytes (or count * n) overflows, NULL buffers, partly overlapping
 * src/dst, in-place layouts one element off, bad device sets.
 *
 * Buffers: commands borrow slices of heap buffers owned by the harness (FZ_NBUF per stream,
 * used only by that stream's commands), which stay alive until ccq_runtime_destroy has
 * returned, as the API's ownership rule requires. Slices are 16-byte aligned and within
 * their buffer when the count is not huge (collectives with count * n buffers get counts cut
 * to fit, see fz_coll_count, and every call the oracle expects to be accepted is checked to
 * lie within its stream's buffers), so an out-of-bounds access AddressSanitizer reports is
 * the library's, and so is a data race ThreadSanitizer reports (see fz_slice).
 *
 * Time: fences and blocking submits can wait up to timeout_ms. Each input has a budget of
 * FZ_BUDGET_MS of such worst-case waits; a call that could exceed it is skipped.
 *
 * Checks (a violation prints the calls so far and traps, which libFuzzer reports):
 *   - every status is a ccq_status, and every error comes with ccq_last_error_detail();
 *   - calls with bad arguments are refused with CCQ_ERR_INVALID_ARGUMENT (or another
 *     refusal that applies too: CCQ_ERR_SHUTDOWN, CCQ_ERR_NOT_INITIALIZED) and queue
 *     nothing; good ones never get CCQ_ERR_INVALID_ARGUMENT; a set without a communicator
 *     gives CCQ_ERR_NOT_INITIALIZED; after shutdown good submissions get CCQ_ERR_SHUTDOWN.
 *     For all nine kinds, from one table (fz_kinds) of docs/collectives.md's rules: roots
 *     in the set, count * n buffers, buffers a rank does not use may be NULL (and are not
 *     checked), in place only at NCCL's position, any other overlap refused;
 *   - CCQ_ERR_QUEUE_FULL only when queue_depth commands may be outstanding on the stream;
 *   - a fence on a stream with nothing submitted since its last CCQ_OK fence returns CCQ_OK;
 *     a fence's error is what ccq_stream_last_error then reports (parts that disagree end
 *     in CCQ_ERR_MISMATCH there);
 *   - stats.submitted equals the number of accepted calls, pending = submitted - ended,
 *     and after shutdown submitted == completed + failed + cancelled, pending == 0;
 *   - after shutdown every fence returns at once and a second one returns CCQ_OK;
 *   - ccq_mem_* refuse bad arguments and impossible sizes, blocks are 64-byte aligned and
 *     fully usable, copies copy; status, dtype, op, kind and event-type tables answer for
 *     any value;
 *   - event log: snapshots return at most cap events, oldest first, each of a known type
 *     with a name, command events with a valid kind, dtype, device, stream and root, none
 *     with the recorder off; after shutdown, when nothing was dropped, there is one
 *     SUBMITTED event per accepted command (distinct ids) and one COMPLETED or FAILED per
 *     command that ended (as the counters say), and ccq_get_metrics counts them all;
 *     ccq_trace_dump writes a JSON object, or fails with CCQ_ERR_BACKEND where it cannot
 *     write; metrics and queue depths stay within what the harness has outstanding (all 0
 *     after shutdown); the callback sees only well-formed events; NULL and out-of-range
 *     arguments are refused;
 *   - and, from the sanitizers: no memory error, no undefined behaviour, no leak (every
 *     runtime is destroyed before the input ends), and no input runs past -timeout.
 */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum {
    FZ_MAX_OPS = 64,
    FZ_BUDGET_MS = 600,
    FZ_NBUF = 4,
    FZ_BUF_BYTES = 1024,
    FZ_NMEM = 8,
    FZ_SCRATCH = 512,
    FZ_MAX_DEV = 8,
    FZ_MAX_STREAMS = 4,
    FZ_SET_MAX = 16,
    FZ_LOG_BYTES = 16384,
    /* Bytes a part may cover from a slice: slices start at up to 31 * 16 bytes into their
     * buffer, and the misplaced in-place layout (0xfd) reaches one element (<= 8) further. */
    FZ_SLICE_ROOM = FZ_BUF_BYTES - 31 * 16 - 8,
    FZ_TRACE_ALL = 2048, /* more events than the recorder keeps (1024 + 256 fences at most) */
};

enum {
    FZ_OP_COMM_INIT,      /* set */
    FZ_OP_ALL_REDUCE,     /* dev stream src dst count dtype op set */
    FZ_OP_SEND,           /* dev stream src count dtype peer */
    FZ_OP_RECV,           /* dev stream dst count dtype peer */
    FZ_OP_SYNC,           /* dev stream */
    FZ_OP_STATS,          /* struct_size variant */
    FZ_OP_LAST_ERROR,     /* dev stream buffer-length variant */
    FZ_OP_MEM_ALLOC,      /* dev size */
    FZ_OP_MEM_FREE,       /* slot device-variant */
    FZ_OP_MEM_COPY,       /* slot kind size */
    FZ_OP_SHUTDOWN,       /* variant: 0 shutdown(rt), 1 shutdown(NULL), else stats only */
    FZ_OP_ALL_REDUCE_ALL, /* set stream src dst count dtype op: every rank's part */
    FZ_OP_SENDRECV,       /* a b stream-a stream-b src dst count dtype order */
    FZ_OP_SYNC_ALL,       /* (none): fence every stream with commands */
    FZ_OP_MISC,           /* variant value: NULL handles, status and dtype tables */
    FZ_OP_RT2,            /* variant: a second runtime, destroyed with work pending */
    FZ_OP_COUNT,
    /* Opcode bytes 0xE0 and up (see fz_opcode): */
    FZ_OP_COLL = FZ_OP_COUNT, /* 0xE0-0xEF: kind dev stream src dst count dtype op root set: one
                                 rank's part of broadcast ... scatter (kind % 7); fz_coll_one */
    FZ_OP_COLL_ALL,           /* 0xF0-0xF7: kind set stream src dst count dtype op root: every
                                 rank's part, the low bits making unused buffers NULL or the
                                 last rank's part differ; fz_coll_all */
    FZ_OP_TRACE,              /* 0xF8-0xFF, by (byte & 7): 0 snapshot v, 1 dump v, 2 metrics v,
                                 3 queue_depth dev stream v, 4 callback v, 5 names x, 6 NULL
                                 runtime, 7 census; fz_trace */
};

/* What each kind of call takes and touches, from include/ccq.h and docs/collectives.md; the
 * harness's own table (in ccq_kind order), so the library's is checked, not trusted. */
enum {
    FZ_K_SET = 1u << 0,            /* a collective: over a device set */
    FZ_K_OP = 1u << 1,             /* takes a reduce op */
    FZ_K_ROOT = 1u << 2,           /* takes a root device, which must be in the set */
    FZ_K_SRC_ROOT = 1u << 3,       /* src is read on the root only (NULL elsewhere) */
    FZ_K_DST_ROOT = 1u << 4,       /* dst is written on the root only (NULL elsewhere) */
    FZ_K_NO_SRC = 1u << 5,         /* recv */
    FZ_K_NO_DST = 1u << 6,         /* send */
    FZ_K_SRC_BLOCKS = 1u << 7,     /* src holds count * n elements */
    FZ_K_DST_BLOCKS = 1u << 8,     /* dst holds count * n elements */
    FZ_K_IP_SAME = 1u << 9,        /* in place: src == dst */
    FZ_K_IP_SRC_IN_DST = 1u << 10, /* in place: src == dst + pos * count */
    FZ_K_IP_DST_IN_SRC = 1u << 11, /* in place: dst == src + pos * count */
    FZ_K_IP_AT_ROOT = 1u << 12,    /* pos is the root's rank (else the caller's) */
};

static const struct {
    const char *name;
    unsigned flags;
} fz_kinds[CCQ_KIND_COUNT_] = {
    [CCQ_KIND_ALL_REDUCE] = {"ccq_all_reduce", FZ_K_SET | FZ_K_OP | FZ_K_IP_SAME},
    [CCQ_KIND_SEND] = {"ccq_send", FZ_K_NO_DST},
    [CCQ_KIND_RECV] = {"ccq_recv", FZ_K_NO_SRC},
    [CCQ_KIND_BROADCAST] = {"ccq_broadcast", FZ_K_SET | FZ_K_ROOT | FZ_K_SRC_ROOT | FZ_K_IP_SAME},
    [CCQ_KIND_REDUCE] = {"ccq_reduce",
                         FZ_K_SET | FZ_K_OP | FZ_K_ROOT | FZ_K_DST_ROOT | FZ_K_IP_SAME},
    [CCQ_KIND_ALL_GATHER] = {"ccq_all_gather", FZ_K_SET | FZ_K_DST_BLOCKS | FZ_K_IP_SRC_IN_DST},
    [CCQ_KIND_REDUCE_SCATTER] = {"ccq_reduce_scatter",
                                 FZ_K_SET | FZ_K_OP | FZ_K_SRC_BLOCKS | FZ_K_IP_DST_IN_SRC},
    [CCQ_KIND_ALL_TO_ALL] = {"ccq_all_to_all", FZ_K_SET | FZ_K_SRC_BLOCKS | FZ_K_DST_BLOCKS},
    [CCQ_KIND_GATHER] = {"ccq_gather", FZ_K_SET | FZ_K_ROOT | FZ_K_DST_ROOT | FZ_K_DST_BLOCKS |
                                           FZ_K_IP_SRC_IN_DST | FZ_K_IP_AT_ROOT},
    [CCQ_KIND_SCATTER] = {"ccq_scatter", FZ_K_SET | FZ_K_ROOT | FZ_K_SRC_ROOT | FZ_K_SRC_BLOCKS |
                                             FZ_K_IP_DST_IN_SRC | FZ_K_IP_AT_ROOT},
};

/* Trace capacities h2 chooses (index 0, what every older input has, is 256). */
static const uint32_t fz_trace_caps[16] = {256, 0,   1,   2,   3,    8,    16, 64,
                                           100, 128, 255, 512, 1000, 1024, 0,  33};

#define FZ_BIT(st) (1u << (unsigned)(-(int)(st)))

typedef struct fz_mem {
    void *p;
    size_t bytes;
    ccq_device_id dev;
} fz_mem;

typedef struct fz_set {
    ccq_device_id ids[FZ_SET_MAX];
    const ccq_device_id *ptr;
    size_t n;
    int valid;
    unsigned mask; /* the set as a bit mask when valid */
} fz_set;

/* One part of a collective, or one send or recv, as the harness submits it. */
typedef struct fz_call {
    ccq_kind kind;
    ccq_device_id dev;
    ccq_stream_id stream;
    const void *src;
    void *dst;
    size_t count;
    ccq_dtype dtype;
    ccq_reduce_op op;   /* reductions */
    ccq_device_id peer; /* send/recv: the other device; rooted collectives: the root */
    const fz_set *set;  /* collectives */
} fz_call;

/* What the event callback saw (it runs on the scheduler thread and on fencing threads). */
typedef struct fz_events {
    atomic_uint_fast64_t seen;
    atomic_uint_fast64_t bad; /* events with a type, kind, dtype or status out of range */
    atomic_uint bad_type;
} fz_events;

typedef struct fz {
    const uint8_t *p;
    size_t n;
    ccq_runtime *rt;
    uint32_t ndev, nstreams, depth;
    uint64_t timeout_ms;
    uint32_t trace_cap; /* the configured trace_capacity */
    int nonblocking, shut;
    long budget_ms;
    uint64_t accepted; /* submitting calls that returned CCQ_OK */
    unsigned step;
    uint8_t *buf[FZ_MAX_DEV][FZ_MAX_STREAMS][FZ_NBUF]; /* each stream its own */
    uint8_t scratch[FZ_SCRATCH];
    /* Per stream: commands accepted since its last CCQ_OK fence (an upper bound of what is
     * outstanding), and whether a fence must return CCQ_OK (nothing submitted since). */
    uint32_t out[FZ_MAX_DEV][FZ_MAX_STREAMS];
    uint8_t clean[FZ_MAX_DEV][FZ_MAX_STREAMS];
    uint8_t known[1u << FZ_MAX_DEV]; /* device sets that have a communicator */
    fz_mem mem[FZ_NMEM];
    fz_events events;
    char log[FZ_LOG_BYTES];
    size_t loglen;
} fz;

/* ---- Reporting ------------------------------------------------------------------------ */

static void fz_note(fz *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fz_note(fz *f, const char *fmt, ...)
{
    va_list ap;
    int w;

    if (f->loglen + 64 >= sizeof f->log)
        return; /* keep the beginning; the end is in the failure message */
    w = snprintf(f->log + f->loglen, sizeof f->log - f->loglen, "  #%u ", f->step);
    if (w > 0)
        f->loglen += (size_t)w;
    va_start(ap, fmt);
    w = vsnprintf(f->log + f->loglen, sizeof f->log - f->loglen, fmt, ap);
    va_end(ap);
    if (w > 0)
        f->loglen += (size_t)w;
    if (f->loglen >= sizeof f->log - 1)
        f->loglen = sizeof f->log - 2;
    f->log[f->loglen++] = '\n';
    f->log[f->loglen] = '\0';
}

static void fz_fail(fz *f, int line, const char *cond, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 4, 5)));
static void fz_fail(fz *f, int line, const char *cond, const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "\n==ccq-fuzz== invariant violated (fuzz_api.c:%d): %s\n==ccq-fuzz== ", line,
            cond);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n==ccq-fuzz== calls so far:\n%s", f->log);
    fflush(stderr);
    __builtin_trap();
}

#define FZ_CHECK(f, cond, ...)                                                                     \
    do {                                                                                           \
        if (!(cond))                                                                               \
            fz_fail((f), __LINE__, #cond, __VA_ARGS__);                                            \
    } while (0)

/* Every ccq_status a call returns is one of the enum, and an error comes with a detail. */
static void fz_status(fz *f, ccq_status st, const char *call)
{
    FZ_CHECK(f, (int)st <= 0 && (int)st >= (int)CCQ_ERR_UNSUPPORTED,
             "%s returned %d, which is not a ccq_status", call, (int)st);
    if (st != CCQ_OK)
        FZ_CHECK(f, ccq_last_error_detail()[0] != '\0',
                 "%s returned %s with an empty ccq_last_error_detail()", call, ccq_status_name(st));
}

static void fz_expect(fz *f, ccq_status st, ccq_status want, const char *call)
{
    FZ_CHECK(f, st == want, "%s returned %s, expected %s (detail: %s)", call, ccq_status_name(st),
             ccq_status_name(want), ccq_last_error_detail());
}

static void fz_expect_not(fz *f, ccq_status st, unsigned bits, const char *call)
{
    FZ_CHECK(f, (FZ_BIT(st) & bits) == 0, "%s returned %s, which it must not here (detail: %s)",
             call, ccq_status_name(st), ccq_last_error_detail());
}

/* ---- Operands ------------------------------------------------------------------------- */

static uint8_t fz_u8(fz *f)
{
    if (f->n == 0)
        return 0;
    f->n--;
    return *f->p++;
}

/* The harness's own table, so ccq_dtype_size is checked rather than trusted. */
static size_t fz_esize(ccq_dtype t)
{
    static const uint8_t sz[CCQ_DTYPE_COUNT_] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    return (unsigned)t < CCQ_DTYPE_COUNT_ ? sz[t] : 0;
}

/* A device: b % ndev, or (1 in 32) one that does not exist. */
static ccq_device_id fz_dev(fz *f, uint8_t b)
{
    const uint32_t bad[8] = {f->ndev, f->ndev + 1, f->ndev + 7, FZ_MAX_DEV + f->ndev,
                             1023,    1024,        0x7fffffffu, UINT32_MAX};
    return (b & 0xf8) == 0xf8 ? bad[b & 7] : b % f->ndev;
}

/* A stream: b % max_streams, or (1 in 16) one out of range. */
static ccq_stream_id fz_stream(fz *f, uint8_t b)
{
    const uint32_t bad[4] = {f->nstreams, f->nstreams + 1, 64, UINT32_MAX};
    return (b & 0xf0) == 0xf0 ? bad[b & 3] : b % f->nstreams;
}

static ccq_dtype fz_dtype(uint8_t b)
{
    static const uint32_t bad[4] = {CCQ_DTYPE_COUNT_, 13, 255, UINT32_MAX};
    if (b >= 0xf0)
        return (ccq_dtype)bad[b & 3];
    return (ccq_dtype)(b % CCQ_DTYPE_COUNT_);
}

static ccq_reduce_op fz_redop(uint8_t b)
{
    static const uint32_t bad[4] = {CCQ_REDUCE_OP_COUNT_, 6, 255, UINT32_MAX};
    if (b >= 0xf0)
        return (ccq_reduce_op)bad[b & 3];
    return (ccq_reduce_op)(b % CCQ_REDUCE_OP_COUNT_);
}

/* A small count (0..63 elements), or a huge one whose size in bytes exceeds PTRDIFF_MAX
 * (some of them wrap around SIZE_MAX when multiplied by the element size). */
static size_t fz_count(uint8_t b, ccq_dtype t)
{
    size_t es = fz_esize(t) ? fz_esize(t) : 1;
    if (b < 0xf8)
        return b & 63;
    switch (b & 7) {
    case 0:
        return SIZE_MAX;
    case 1:
        return (size_t)PTRDIFF_MAX + 1;
    case 2:
        return (size_t)PTRDIFF_MAX / es + 1;
    case 3:
        return es > 1 ? SIZE_MAX / es + 1 : SIZE_MAX; /* count * es wraps to a small value */
    case 4:
        return SIZE_MAX / es;
    case 5:
        return es > 1 ? SIZE_MAX / es + 2 : SIZE_MAX - 1;
    case 6:
        return ((size_t)1 << 62) / es * 2 + 1;
    default:
        return SIZE_MAX - 7;
    }
}

/* A slice (16-byte aligned) of one of the buffers of the stream that submits, or NULL.
 * Commands of one stream are ordered and the API orders nothing across streams, so only
 * the stream's own buffers keep what the harness asks race-free: a race ThreadSanitizer
 * reports on them is the library's. A refused call's bad device or stream maps anywhere. */
static uint8_t *fz_slice(fz *f, uint8_t b, ccq_device_id dev, ccq_stream_id stream)
{
    if (b == 0xff)
        return NULL;
    return f->buf[dev % f->ndev][stream % f->nstreams][b & 3] + ((b >> 2) & 31) * 16;
}

static void fz_read_set(fz *f, fz_set *s)
{
    uint8_t m = fz_u8(f);
    unsigned kind = m >> 5;

    memset(s, 0, sizeof *s);
    s->ptr = s->ids;
    if (kind == 0) { /* NULL array */
        s->ptr = NULL;
        s->n = m & 7;
    } else if (kind == 1) { /* empty, or a length the library must not trust */
        s->n = (m & 1) ? SIZE_MAX : 0;
        s->ids[0] = 0;
    } else if (kind == 2) { /* every device, rotated */
        s->n = f->ndev;
        for (uint32_t i = 0; i < f->ndev; i++)
            s->ids[i] = (i + (m & 7)) % f->ndev;
    } else if (kind <= 4) { /* a pair */
        s->n = 2;
        s->ids[0] = fz_dev(f, fz_u8(f));
        s->ids[1] = fz_dev(f, fz_u8(f));
    } else { /* 1..8 devices, each picked (duplicates and unknown ones possible) */
        s->n = 1 + (m & 7);
        for (size_t i = 0; i < s->n; i++)
            s->ids[i] = fz_dev(f, fz_u8(f));
    }
    if (s->ptr == NULL || s->n == 0 || s->n > f->ndev)
        return;
    for (size_t i = 0; i < s->n; i++) {
        if (s->ids[i] >= f->ndev || (s->mask & (1u << s->ids[i])))
            return;
        s->mask |= 1u << s->ids[i];
    }
    s->valid = 1;
}

static void fz_set_text(const fz_set *s, char *buf, size_t len)
{
    size_t w = 0;
    if (s->ptr == NULL) {
        snprintf(buf, len, "NULL,n=%zu", s->n);
        return;
    }
    if (s->n > FZ_SET_MAX) {
        snprintf(buf, len, "{..},n=%zu", s->n);
        return;
    }
    w += (size_t)snprintf(buf, len, "{");
    for (size_t i = 0; i < s->n && w < len; i++)
        w += (size_t)snprintf(buf + w, len - w, i ? ",%u" : "%u", s->ids[i]);
    if (w < len)
        snprintf(buf + w, len - w, "}");
}

/* A device's rank in a valid set (its position in the sorted set), or -1. */
static int fz_rank(const fz_set *s, ccq_device_id d)
{
    if (s == NULL || !s->valid || d >= FZ_MAX_DEV || !(s->mask & (1u << d)))
        return -1;
    return __builtin_popcount(s->mask & ((1u << d) - 1u));
}

/* One of the seven collectives besides all_reduce. */
static ccq_kind fz_coll_kind(uint8_t b)
{
    return (ccq_kind)(CCQ_KIND_BROADCAST + b % 7);
}

/* A root: mostly the (b % n)-th device of the set; for b >= 0xf0 any device (maybe not in
 * the set) or, for b >= 0xf8, one that does not exist. */
static ccq_device_id fz_root(fz *f, uint8_t b, const fz_set *s)
{
    if (b >= 0xf0 || s->ptr == NULL || s->n == 0 || s->n > FZ_SET_MAX)
        return fz_dev(f, b);
    return s->ids[b % s->n];
}

/* The count of a collective part: fz_count's huge ones (0xf8-0xff); for kinds with count * n
 * buffers, 0xf0-0xf7 give counts whose block fits in memory but whose count * n buffer does
 * not; else a small count cut so the part's buffers fit in FZ_SLICE_ROOM. The cut depends on
 * the kind and the set, so parts of one operation can differ here: a mismatch. */
static size_t fz_coll_count(uint8_t b, ccq_dtype t, ccq_kind kind, const fz_set *s)
{
    size_t es = fz_esize(t) ? fz_esize(t) : 1;
    size_t blocks =
        (fz_kinds[kind].flags & (FZ_K_SRC_BLOCKS | FZ_K_DST_BLOCKS)) && s->valid ? s->n : 1;

    if (b >= 0xf8)
        return fz_count(b, t);
    if (b >= 0xf0 && blocks > 1)
        return (size_t)PTRDIFF_MAX / es / blocks + 1 + (b & 7);
    return (size_t)(b & 63) % (FZ_SLICE_ROOM / (blocks * es) + 1);
}

/* Another count for a part meant to disagree: small counts stay within the cut, huge ones
 * stay refused (or wrap to 0). */
static size_t fz_other_count(size_t count)
{
    return count > FZ_SLICE_ROOM ? count + 1 : count > 0 ? count - 1 : 1;
}

/* src and dst of a collective part: slices sb and db of its stream's buffers (0xff: NULL),
 * or for db 0xfe the kind's in-place layout on slice sb (NCCL's: the same buffer, or the
 * rank's or the root's block of the count * n one), and for db 0xfd that layout one element
 * off (an overlap the API must refuse unless it happens not to overlap). */
static void fz_part_buffers(fz *f, fz_call *c, uint8_t sb, uint8_t db)
{
    unsigned k = fz_kinds[c->kind].flags;
    uint8_t *p = fz_slice(f, sb, c->dev, c->stream);
    size_t es = fz_esize(c->dtype), off = 0;
    int pos = fz_rank(c->set, (k & FZ_K_IP_AT_ROOT) ? c->peer : c->dev);

    c->src = p;
    c->dst = db < 0xfd ? fz_slice(f, db, c->dev, c->stream) : p;
    if (db < 0xfd || p == NULL || es == 0 || c->count > FZ_SLICE_ROOM)
        return;
    if ((k & (FZ_K_IP_SRC_IN_DST | FZ_K_IP_DST_IN_SRC)) && pos > 0)
        off = (size_t)pos * c->count * es;
    if (db == 0xfd)
        off += es;
    if (k & FZ_K_IP_SRC_IN_DST)
        c->src = p + off;
    else
        c->dst = p + off;
}

/* Worst-case time of a fence: timeout_ms plus the grace ccq_sync_collective adds. */
static long fz_fence_cost(const fz *f)
{
    uint64_t t = f->timeout_ms;
    return (long)(t + (t / 8 + 20 < 200 ? t / 8 + 20 : 200) + 10);
}

static int fz_spend(fz *f, long ms)
{
    if (f->budget_ms < ms) {
        fz_note(f, "(skipped: time budget)");
        return 0;
    }
    f->budget_ms -= ms;
    return 1;
}

/* ---- Calls ---------------------------------------------------------------------------- */

static void fz_comm_init(fz *f, const fz_set *s)
{
    char set[96];
    ccq_status st = ccq_comm_init(f->rt, s->ptr, s->n);

    fz_set_text(s, set, sizeof set);
    fz_note(f, "ccq_comm_init(%s) -> %s", set, ccq_status_name(st));
    fz_status(f, st, "ccq_comm_init");
    if (!s->valid && f->shut) {
        FZ_CHECK(f, st == CCQ_ERR_INVALID_ARGUMENT || st == CCQ_ERR_SHUTDOWN,
                 "ccq_comm_init with a bad set after shutdown returned %s", ccq_status_name(st));
    } else if (!s->valid) {
        fz_expect(f, st, CCQ_ERR_INVALID_ARGUMENT, "ccq_comm_init (bad set)");
    } else if (f->shut) {
        fz_expect(f, st, CCQ_ERR_SHUTDOWN, "ccq_comm_init after shutdown");
    } else {
        fz_expect_not(f, st,
                      FZ_BIT(CCQ_ERR_INVALID_ARGUMENT) | FZ_BIT(CCQ_ERR_NOT_INITIALIZED) |
                          FZ_BIT(CCQ_ERR_SHUTDOWN),
                      "ccq_comm_init");
        f->known[s->mask] = 1;
    }
}

/* Whether the API must refuse the call, by the rules of include/ccq.h and
 * docs/collectives.md taken in no particular order; else the bytes of src and dst the part
 * uses (0 for a buffer it does not use). */
static int fz_bad(const fz *f, const fz_call *c, size_t *sb, size_t *db)
{
    unsigned k = fz_kinds[c->kind].flags;
    size_t es = fz_esize(c->dtype), n = 1, block, pos;
    int rank = 0, root = 0;
    uintptr_t s0 = (uintptr_t)c->src, d0 = (uintptr_t)c->dst;

    *sb = *db = 0;
    if (c->dev >= f->ndev || c->stream >= f->nstreams || es == 0 ||
        ((k & FZ_K_OP) && (unsigned)c->op >= CCQ_REDUCE_OP_COUNT_) ||
        c->count > (size_t)PTRDIFF_MAX / es)
        return 1;
    if (k & FZ_K_SET) {
        rank = fz_rank(c->set, c->dev);
        root = (k & FZ_K_ROOT) ? fz_rank(c->set, c->peer) : rank;
        if (rank < 0 || root < 0)
            return 1; /* a bad set, or the device or the root not in it */
        n = c->set->n;
        if ((k & (FZ_K_SRC_BLOCKS | FZ_K_DST_BLOCKS)) && c->count * es > (size_t)PTRDIFF_MAX / n)
            return 1; /* the count * n buffer cannot exist */
    } else if (c->peer >= f->ndev) {
        return 1;
    }
    block = c->count * es;
    if (!(k & FZ_K_NO_SRC) && (!(k & FZ_K_SRC_ROOT) || rank == root))
        *sb = (k & FZ_K_SRC_BLOCKS) ? block * n : block;
    if (!(k & FZ_K_NO_DST) && (!(k & FZ_K_DST_ROOT) || rank == root))
        *db = (k & FZ_K_DST_BLOCKS) ? block * n : block;
    if ((*sb > 0 && c->src == NULL) || (*db > 0 && c->dst == NULL))
        return 1;
    if (*sb == 0 || *db == 0 || s0 >= d0 + *db || d0 >= s0 + *sb)
        return 0; /* a buffer unused, or no overlap */
    pos = (size_t)((k & FZ_K_IP_AT_ROOT) ? root : rank) * block;
    if (k & FZ_K_IP_SAME)
        return s0 != d0;
    if (k & FZ_K_IP_SRC_IN_DST)
        return s0 != d0 + pos;
    if (k & FZ_K_IP_DST_IN_SRC)
        return d0 != s0 + pos;
    return 1; /* no in-place form */
}

/* The call itself, on any runtime (the NULL-runtime checks use it too). */
static ccq_status fz_call_api(ccq_runtime *rt, const fz_call *c)
{
    const ccq_device_id *ids = c->set != NULL ? c->set->ptr : NULL;
    size_t n = c->set != NULL ? c->set->n : 0;

    switch (c->kind) {
    case CCQ_KIND_ALL_REDUCE:
        return ccq_all_reduce(rt, c->dev, c->stream, c->src, c->dst, c->count, c->dtype, c->op, ids,
                              n);
    case CCQ_KIND_SEND:
        return ccq_send(rt, c->dev, c->stream, c->src, c->count, c->dtype, c->peer);
    case CCQ_KIND_RECV:
        return ccq_recv(rt, c->dev, c->stream, c->dst, c->count, c->dtype, c->peer);
    case CCQ_KIND_BROADCAST:
        return ccq_broadcast(rt, c->dev, c->stream, c->src, c->dst, c->count, c->dtype, c->peer,
                             ids, n);
    case CCQ_KIND_REDUCE:
        return ccq_reduce(rt, c->dev, c->stream, c->src, c->dst, c->count, c->dtype, c->op, c->peer,
                          ids, n);
    case CCQ_KIND_ALL_GATHER:
        return ccq_all_gather(rt, c->dev, c->stream, c->src, c->dst, c->count, c->dtype, ids, n);
    case CCQ_KIND_REDUCE_SCATTER:
        return ccq_reduce_scatter(rt, c->dev, c->stream, c->src, c->dst, c->count, c->dtype, c->op,
                                  ids, n);
    case CCQ_KIND_ALL_TO_ALL:
        return ccq_all_to_all(rt, c->dev, c->stream, c->src, c->dst, c->count, c->dtype, ids, n);
    case CCQ_KIND_GATHER:
        return ccq_gather(rt, c->dev, c->stream, c->src, c->dst, c->count, c->dtype, c->peer, ids,
                          n);
    default:
        return ccq_scatter(rt, c->dev, c->stream, c->src, c->dst, c->count, c->dtype, c->peer, ids,
                           n);
    }
}

/* A harness self-check: the bytes a part the API must accept uses lie within its stream's
 * buffers, so whatever AddressSanitizer or ThreadSanitizer reports about them is the
 * library's. */
static void fz_check_room(fz *f, const fz_call *c, const void *p, size_t bytes)
{
    uintptr_t a = (uintptr_t)p;

    if (bytes == 0)
        return;
    for (int i = 0; i < FZ_NBUF; i++) {
        uintptr_t b = (uintptr_t)f->buf[c->dev][c->stream][i];
        if (a >= b && a - b <= FZ_BUF_BYTES && bytes <= FZ_BUF_BYTES - (a - b))
            return;
    }
    FZ_CHECK(f, 0,
             "harness bug: %s on device %u stream %u would use %zu bytes at %p, outside "
             "the stream's buffers",
             fz_kinds[c->kind].name, c->dev, c->stream, bytes, p);
}

/* One submitting call: predict from the arguments whether it must be refused, and how. */
static void fz_submit(fz *f, const fz_call *c)
{
    unsigned k = fz_kinds[c->kind].flags;
    const char *name = fz_kinds[c->kind].name;
    size_t sb, db;
    int bad = fz_bad(f, c, &sb, &db), maybe_blocks, in_set = fz_rank(c->set, c->dev) >= 0;
    char settxt[96] = "";
    ccq_status st;

    if (!bad) {
        fz_check_room(f, c, c->src, sb);
        fz_check_room(f, c, c->dst, db);
    }
    /* A blocking submit to a stream that may be full can wait up to timeout_ms. */
    maybe_blocks = !bad && !f->shut && !f->nonblocking && f->out[c->dev][c->stream] >= f->depth;
    if (maybe_blocks && !fz_spend(f, (long)f->timeout_ms + 10))
        return;

    if (k & FZ_K_SET)
        fz_set_text(c->set, settxt, sizeof settxt);
    st = fz_call_api(f->rt, c);
    fz_note(f, "%s(dev=%u, stream=%u, src=%p, dst=%p, count=%zu, dtype=%u, op=%u, %s=%u%s%s) -> %s",
            name, c->dev, c->stream, c->src, c->dst, c->count, (unsigned)c->dtype, (unsigned)c->op,
            (k & FZ_K_ROOT) ? "root" : "peer", c->peer, (k & FZ_K_SET) ? ", set=" : "", settxt,
            ccq_status_name(st));
    fz_status(f, st, name);

    /* A bad call is refused with CCQ_ERR_INVALID_ARGUMENT, or with another refusal that
     * applies as well (the API does not order its checks): CCQ_ERR_SHUTDOWN after shutdown,
     * CCQ_ERR_NOT_INITIALIZED for a well-formed set without a communicator. */
    if (bad) {
        unsigned ok = FZ_BIT(CCQ_ERR_INVALID_ARGUMENT);
        if (f->shut)
            ok |= FZ_BIT(CCQ_ERR_SHUTDOWN);
        if ((k & FZ_K_SET) && in_set && !f->known[c->set->mask])
            ok |= FZ_BIT(CCQ_ERR_NOT_INITIALIZED);
        FZ_CHECK(f, (FZ_BIT(st) & ok) != 0, "%s with bad arguments returned %s (detail: %s)", name,
                 ccq_status_name(st), ccq_last_error_detail());
        return;
    }
    if (f->shut) {
        fz_expect(f, st, CCQ_ERR_SHUTDOWN, "submitting call after ccq_runtime_shutdown");
    } else if ((k & FZ_K_SET) && !f->known[c->set->mask]) {
        fz_expect(f, st, CCQ_ERR_NOT_INITIALIZED, "collective on a set without a communicator");
    } else {
        fz_expect_not(f, st,
                      FZ_BIT(CCQ_ERR_INVALID_ARGUMENT) | FZ_BIT(CCQ_ERR_NOT_INITIALIZED) |
                          FZ_BIT(CCQ_ERR_SHUTDOWN),
                      name);
        if (!(k & FZ_K_SET)) /* send/recv create the pair's communicator on first use */
            f->known[(1u << c->dev) | (1u << c->peer)] = 1;
    }
    if (st == CCQ_ERR_QUEUE_FULL)
        FZ_CHECK(f, f->out[c->dev][c->stream] >= f->depth,
                 "%s: CCQ_ERR_QUEUE_FULL with at most %u of queue_depth %u outstanding", name,
                 f->out[c->dev][c->stream], f->depth);
    if (st == CCQ_OK) {
        f->accepted++;
        f->out[c->dev][c->stream]++;
        f->clean[c->dev][c->stream] = 0;
    }
}

static void fz_sync(fz *f, ccq_device_id dev, ccq_stream_id stream)
{
    const unsigned allowed = FZ_BIT(CCQ_OK) | FZ_BIT(CCQ_ERR_MISMATCH) | FZ_BIT(CCQ_ERR_TIMEOUT) |
                             FZ_BIT(CCQ_ERR_BACKEND) | FZ_BIT(CCQ_ERR_ABORTED) |
                             FZ_BIT(CCQ_ERR_SHUTDOWN);
    char buf[256];
    ccq_status st, last;
    int valid = dev < f->ndev && stream < f->nstreams;

    if (valid && !f->clean[dev][stream] && !f->shut && !fz_spend(f, fz_fence_cost(f)))
        return;
    st = ccq_sync_collective(f->rt, dev, stream);
    fz_note(f, "ccq_sync_collective(dev=%u, stream=%u) -> %s", dev, stream, ccq_status_name(st));
    fz_status(f, st, "ccq_sync_collective");
    if (!valid) {
        fz_expect(f, st, CCQ_ERR_INVALID_ARGUMENT, "ccq_sync_collective (bad stream)");
        return;
    }
    if (f->clean[dev][stream])
        fz_expect(f, st, CCQ_OK, "ccq_sync_collective on a stream with nothing new");
    FZ_CHECK(f, (FZ_BIT(st) & allowed) != 0, "ccq_sync_collective returned %s (detail: %s)",
             ccq_status_name(st), ccq_last_error_detail());
    if (st != CCQ_OK && st != CCQ_ERR_TIMEOUT) {
        /* The error a fence returns is what ccq_stream_last_error reports next. */
        last = ccq_stream_last_error(f->rt, dev, stream, buf, sizeof buf);
        fz_expect(f, last, st, "ccq_stream_last_error after a failed fence");
        FZ_CHECK(f, buf[0] != '\0', "ccq_stream_last_error: empty detail for %s",
                 ccq_status_name(st));
    }
    /* CCQ_OK means everything it covers has ended. After shutdown everything has ended, so
     * the fence cleared the only error there could be. */
    if (st == CCQ_OK || f->shut) {
        f->out[dev][stream] = 0;
        f->clean[dev][stream] = 1;
    }
}

static void fz_sync_all(fz *f)
{
    for (uint32_t d = 0; d < f->ndev; d++)
        for (uint32_t s = 0; s < f->nstreams; s++)
            if (!f->clean[d][s])
                fz_sync(f, d, s);
}

/* Counters: exact here because every submitting call of this runtime has returned. */
static void fz_check_stats(fz *f, const ccq_stats *s, size_t size, int idle)
{
    uint64_t ended = s->completed + s->failed + s->cancelled;

    FZ_CHECK(f, s->submitted == f->accepted,
             "stats.submitted = %llu but %llu submitting calls returned CCQ_OK",
             (unsigned long long)s->submitted, (unsigned long long)f->accepted);
    FZ_CHECK(f, ended <= s->submitted,
             "completed %llu + failed %llu + cancelled %llu > submitted %llu",
             (unsigned long long)s->completed, (unsigned long long)s->failed,
             (unsigned long long)s->cancelled, (unsigned long long)s->submitted);
    FZ_CHECK(f, s->pending == s->submitted - ended, "stats.pending = %llu, expected %llu",
             (unsigned long long)s->pending, (unsigned long long)(s->submitted - ended));
    if (idle) {
        uint64_t sum = 0;
        for (int i = 0; i < 8; i++)
            sum += s->batch_size_hist[i];
        FZ_CHECK(f, s->pending == 0,
                 "after shutdown: submitted %llu, completed %llu, failed %llu, cancelled %llu, "
                 "pending %llu",
                 (unsigned long long)s->submitted, (unsigned long long)s->completed,
                 (unsigned long long)s->failed, (unsigned long long)s->cancelled,
                 (unsigned long long)s->pending);
        if (size >= offsetof(ccq_stats, batch_size_hist) + sizeof s->batch_size_hist)
            FZ_CHECK(f, sum == s->batches, "batch_size_hist sums to %llu, batches = %llu",
                     (unsigned long long)sum, (unsigned long long)s->batches);
        FZ_CHECK(f, s->batched_ops >= s->batches, "batched_ops %llu < batches %llu",
                 (unsigned long long)s->batched_ops, (unsigned long long)s->batches);
    }
}

/* A struct of exactly `size` bytes (at least its uint32_t struct_size) whose struct_size
 * says `size`, so a write past it is a heap overflow. NULL when out of memory. */
static uint8_t *fz_sized_struct(size_t size)
{
    size_t alloc = size < sizeof(uint32_t) ? sizeof(uint32_t) : size;
    uint8_t *mem = malloc(alloc);
    uint32_t ss = (uint32_t)size;

    if (mem != NULL) {
        memset(mem, 0xa5, alloc);
        memcpy(mem, &ss, sizeof ss);
    }
    return mem;
}

static void fz_stats(fz *f, uint8_t v)
{
    const size_t min = offsetof(ccq_stats, batch_size_hist);
    size_t sizes[6] = {sizeof(ccq_stats), min, min - 1, sizeof(ccq_stats) + 1, 0, 0};
    size_t size = sizes[v % 6];
    int null_out = v % 6 == 5;
    int valid = size >= min && size <= sizeof(ccq_stats) && !null_out;
    uint8_t *mem = fz_sized_struct(size);
    uint32_t ss = (uint32_t)size;
    ccq_stats s;
    ccq_status st;

    if (mem == NULL)
        return;
    st = ccq_get_stats(f->rt, null_out ? NULL : (ccq_stats *)(void *)mem);
    fz_note(f, "ccq_get_stats(struct_size=%zu%s) -> %s", size, null_out ? ", out=NULL" : "",
            ccq_status_name(st));
    fz_status(f, st, "ccq_get_stats");
    fz_expect(f, st, valid ? CCQ_OK : CCQ_ERR_INVALID_ARGUMENT, "ccq_get_stats");
    if (st == CCQ_OK) {
        memset(&s, 0, sizeof s);
        memcpy(&s, mem, size);
        FZ_CHECK(f, s.struct_size == ss, "ccq_get_stats changed struct_size to %u", s.struct_size);
        fz_check_stats(f, &s, size, f->shut);
    }
    free(mem);
}

static void fz_last_error(fz *f, ccq_device_id dev, ccq_stream_id stream, uint8_t v)
{
    static const size_t lens[6] = {0, 1, 7, 64, 300, 5};
    size_t len = lens[v % 6];
    int null_buf = v % 6 == 0 || v % 6 == 5;
    int valid = dev < f->ndev && stream < f->nstreams && !(null_buf && len > 0);
    char *buf = len ? malloc(len) : NULL; /* exactly len bytes */
    ccq_status st;

    if (len && buf == NULL)
        return;
    if (buf)
        memset(buf, 'x', len);
    st = ccq_stream_last_error(f->rt, dev, stream, null_buf ? NULL : buf, len);
    fz_note(f, "ccq_stream_last_error(dev=%u, stream=%u, len=%zu%s) -> %s", dev, stream, len,
            null_buf ? ", buf=NULL" : "", ccq_status_name(st));
    FZ_CHECK(f, (int)st <= 0 && (int)st >= (int)CCQ_ERR_UNSUPPORTED,
             "ccq_stream_last_error returned %d", (int)st);
    if (!valid)
        fz_expect(f, st, CCQ_ERR_INVALID_ARGUMENT, "ccq_stream_last_error (bad arguments)");
    else if (!null_buf && len > 0)
        FZ_CHECK(f, memchr(buf, '\0', len) != NULL,
                 "ccq_stream_last_error did not NUL-terminate its %zu-byte buffer", len);
    free(buf);
}

static void fz_mem_alloc(fz *f, ccq_device_id dev, uint8_t v)
{
    /* Small sizes, or sizes within 62 of SIZE_MAX that no allocation can satisfy (sizes in
     * between would only trip the sanitizer's allocation limit). */
    size_t bytes = v >= 0xf0 ? SIZE_MAX - (size_t)(v & 15) * 4 : (size_t)v * 3;
    int null_out = v == 0xef;
    int slot = -1;
    void *p = (void *)&p; /* must be set to NULL or a block */
    ccq_status st;

    for (int i = 0; i < FZ_NMEM && slot < 0; i++)
        if (f->mem[i].p == NULL)
            slot = i;
    if (slot < 0)
        return;
    st = ccq_mem_alloc(f->rt, dev, bytes, null_out ? NULL : &p);
    fz_note(f, "ccq_mem_alloc(dev=%u, bytes=%zu%s) -> %s, %p", dev, bytes,
            null_out ? ", out=NULL" : "", ccq_status_name(st), null_out ? NULL : p);
    fz_status(f, st, "ccq_mem_alloc");
    if (null_out || dev >= f->ndev) {
        fz_expect(f, st, CCQ_ERR_INVALID_ARGUMENT, "ccq_mem_alloc (bad arguments)");
        if (!null_out)
            FZ_CHECK(f, p == NULL, "ccq_mem_alloc failed but left *out = %p", p);
        return;
    }
    if (bytes > (size_t)PTRDIFF_MAX)
        FZ_CHECK(f, st != CCQ_OK,
                 "ccq_mem_alloc(%zu bytes) returned CCQ_OK (%p): no allocation can be that large; "
                 "the size was rounded up past SIZE_MAX",
                 bytes, p);
    if (st != CCQ_OK) {
        FZ_CHECK(f, p == NULL, "ccq_mem_alloc failed but left *out = %p", p);
        return;
    }
    FZ_CHECK(f, p != NULL || bytes == 0, "ccq_mem_alloc(%zu) returned CCQ_OK and NULL", bytes);
    FZ_CHECK(f, ((uintptr_t)p & 63) == 0, "ccq_mem_alloc returned %p, not 64-byte aligned", p);
    if (p == NULL)
        return;
    memset(p, 0xa5, bytes); /* the whole block must be usable */
    f->mem[slot].p = p;
    f->mem[slot].bytes = bytes;
    f->mem[slot].dev = dev;
}

static void fz_mem_free(fz *f, uint8_t v)
{
    fz_mem *m = &f->mem[v % FZ_NMEM];
    /* The block's own device, or one that does not exist (then nothing is freed). An empty
     * slot frees NULL, a no-op. */
    ccq_device_id dev = (v & 0x80) ? ((v & 0x40) ? UINT32_MAX : f->ndev) : m->dev;
    ccq_status st;

    st = ccq_mem_free(f->rt, dev, m->p);
    fz_note(f, "ccq_mem_free(dev=%u, %p) -> %s", dev, m->p, ccq_status_name(st));
    fz_status(f, st, "ccq_mem_free");
    if (dev >= f->ndev) {
        fz_expect(f, st, CCQ_ERR_INVALID_ARGUMENT, "ccq_mem_free (bad device)");
        return; /* not freed: the harness still owns it */
    }
    fz_expect(f, st, CCQ_OK, "ccq_mem_free");
    memset(m, 0, sizeof *m);
}

static void fz_mem_copy(fz *f, uint8_t v, uint8_t k, uint8_t len)
{
    fz_mem *m = &f->mem[v % FZ_NMEM];
    ccq_copy_kind kind = (k & 3) == 2   ? (ccq_copy_kind)2
                         : (k & 3) == 3 ? (ccq_copy_kind)-1
                                        : (ccq_copy_kind)(k & 1);
    ccq_device_id dev = (k & 0x80) ? f->ndev : m->dev;
    size_t cap = m->bytes < FZ_SCRATCH ? m->bytes : FZ_SCRATCH;
    size_t bytes = m->p ? (cap ? len % (cap + 1) : 0) : len;
    int kind_ok = kind == CCQ_COPY_TO_DEVICE || kind == CCQ_COPY_TO_HOST;
    void *dst, *src;
    ccq_status st;

    if (kind == CCQ_COPY_TO_HOST) {
        dst = f->scratch;
        src = m->p;
    } else {
        dst = m->p;
        src = f->scratch;
    }
    if (k & 0x40) { /* the host side NULL instead */
        if (kind == CCQ_COPY_TO_HOST)
            dst = NULL;
        else
            src = NULL;
    }
    for (size_t i = 0; i < FZ_SCRATCH; i++)
        f->scratch[i] = (uint8_t)(i * 7 + k);
    st = ccq_mem_copy(f->rt, dev, dst, src, bytes, kind);
    fz_note(f, "ccq_mem_copy(dev=%u, dst=%p, src=%p, bytes=%zu, kind=%d) -> %s", dev, dst, src,
            bytes, (int)kind, ccq_status_name(st));
    fz_status(f, st, "ccq_mem_copy");
    if (dev >= f->ndev || !kind_ok || (bytes > 0 && (dst == NULL || src == NULL))) {
        fz_expect(f, st, CCQ_ERR_INVALID_ARGUMENT, "ccq_mem_copy (bad arguments)");
        return;
    }
    fz_expect(f, st, CCQ_OK, "ccq_mem_copy");
    if (bytes > 0)
        FZ_CHECK(f, memcmp(dst, src, bytes) == 0, "ccq_mem_copy: %zu bytes differ after the copy",
                 bytes);
}

static void fz_shutdown(fz *f, uint8_t v)
{
    ccq_stats s;
    ccq_status st;

    if (v % 4 == 1) {
        st = ccq_runtime_shutdown(NULL);
        fz_note(f, "ccq_runtime_shutdown(NULL) -> %s", ccq_status_name(st));
        fz_status(f, st, "ccq_runtime_shutdown");
        fz_expect(f, st, CCQ_ERR_INVALID_ARGUMENT, "ccq_runtime_shutdown(NULL)");
        return;
    }
    if (v % 4 == 0) {
        st = ccq_runtime_shutdown(f->rt);
        fz_note(f, "ccq_runtime_shutdown(rt) -> %s", ccq_status_name(st));
        fz_expect(f, st, CCQ_OK, "ccq_runtime_shutdown");
        f->shut = 1;
    }
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    st = ccq_get_stats(f->rt, &s);
    fz_expect(f, st, CCQ_OK, "ccq_get_stats");
    fz_check_stats(f, &s, sizeof s, f->shut);
}

static void fz_misc(fz *f, uint8_t v, uint8_t x)
{
    ccq_device_id one = 0;
    ccq_stats s;
    void *p = (void *)&p;
    const char *t;

    switch (v % 4) {
    case 0: { /* status tables, for any int */
        int code = (int)(int8_t)x;
        const char *a = ccq_status_string((ccq_status)code), *b = ccq_status_name((ccq_status)code);
        fz_note(f, "ccq_status_string/name(%d) -> \"%s\", \"%s\"", code, a ? a : "(null)",
                b ? b : "(null)");
        FZ_CHECK(f, a != NULL && a[0] != '\0' && b != NULL && b[0] != '\0',
                 "status %d: empty or NULL text", code);
        if (code <= 0 && code >= (int)CCQ_ERR_UNSUPPORTED)
            FZ_CHECK(f, strncmp(b, "CCQ_", 4) == 0 && strcmp(a, "unknown status") != 0,
                     "status %d: name \"%s\", text \"%s\"", code, b, a);
        break;
    }
    case 1: { /* dtype and op tables */
        uint32_t d = x < 0x80 ? x % 16u : (x < 0xc0 ? UINT32_MAX - (x & 7) : 0x80000000u | x);
        size_t es = ccq_dtype_size((ccq_dtype)d);
        fz_note(f, "ccq_dtype_size/name(%u), ccq_reduce_op_name(%u) -> %zu", d, d, es);
        FZ_CHECK(f, es == fz_esize((ccq_dtype)d), "ccq_dtype_size(%u) = %zu, expected %zu", d, es,
                 fz_esize((ccq_dtype)d));
        t = ccq_dtype_name((ccq_dtype)d);
        FZ_CHECK(f, t != NULL && t[0] != '\0', "ccq_dtype_name(%u) empty", d);
        t = ccq_reduce_op_name((ccq_reduce_op)d);
        FZ_CHECK(f, t != NULL && t[0] != '\0', "ccq_reduce_op_name(%u) empty", d);
        break;
    }
    case 2: /* every call with a NULL runtime */
        fz_note(f, "NULL-runtime calls");
        FZ_CHECK(f, ccq_device_count(NULL) == 0, "ccq_device_count(NULL) != 0");
        FZ_CHECK(f, strcmp(ccq_backend_name(NULL), "") == 0, "ccq_backend_name(NULL) not \"\"");
        fz_expect(f, ccq_comm_init(NULL, &one, 1), CCQ_ERR_INVALID_ARGUMENT, "comm_init(NULL)");
        fz_expect(f,
                  ccq_all_reduce(NULL, 0, 0, f->buf[0][0][0], f->buf[0][0][0], 1, CCQ_FLOAT32,
                                 CCQ_SUM, &one, 1),
                  CCQ_ERR_INVALID_ARGUMENT, "all_reduce(NULL)");
        fz_expect(f, ccq_send(NULL, 0, 0, f->buf[0][0][0], 1, CCQ_INT8, 0),
                  CCQ_ERR_INVALID_ARGUMENT, "send(NULL)");
        fz_expect(f, ccq_recv(NULL, 0, 0, f->buf[0][0][0], 1, CCQ_INT8, 0),
                  CCQ_ERR_INVALID_ARGUMENT, "recv(NULL)");
        fz_expect(f, ccq_sync_collective(NULL, 0, 0), CCQ_ERR_INVALID_ARGUMENT, "sync(NULL)");
        fz_expect(f, ccq_stream_last_error(NULL, 0, 0, NULL, 0), CCQ_ERR_INVALID_ARGUMENT,
                  "stream_last_error(NULL)");
        s.struct_size = sizeof s;
        fz_expect(f, ccq_get_stats(NULL, &s), CCQ_ERR_INVALID_ARGUMENT, "get_stats(NULL)");
        fz_expect(f, ccq_get_stats(f->rt, NULL), CCQ_ERR_INVALID_ARGUMENT, "get_stats(rt, NULL)");
        fz_expect(f, ccq_mem_alloc(NULL, 0, 64, &p), CCQ_ERR_INVALID_ARGUMENT, "mem_alloc(NULL)");
        FZ_CHECK(f, p == NULL, "ccq_mem_alloc(NULL, ...) left *out = %p", p);
        fz_expect(f, ccq_mem_free(NULL, 0, NULL), CCQ_ERR_INVALID_ARGUMENT, "mem_free(NULL)");
        fz_expect(f, ccq_mem_copy(NULL, 0, f->scratch, f->scratch, 1, CCQ_COPY_TO_HOST),
                  CCQ_ERR_INVALID_ARGUMENT, "mem_copy(NULL)");
        fz_expect(f, ccq_runtime_shutdown(NULL), CCQ_ERR_INVALID_ARGUMENT, "shutdown(NULL)");
        fz_expect(f, ccq_runtime_destroy(NULL), CCQ_OK, "destroy(NULL)");
        fz_expect(f, ccq_runtime_create(NULL, NULL), CCQ_ERR_INVALID_ARGUMENT,
                  "runtime_create(cfg, NULL)");
        ccq_config_init(NULL);
        break;
    default:
        fz_note(f, "ccq_device_count, ccq_backend_name");
        FZ_CHECK(f, ccq_device_count(f->rt) == f->ndev, "ccq_device_count = %u, expected %u",
                 ccq_device_count(f->rt), f->ndev);
        FZ_CHECK(f, strcmp(ccq_backend_name(f->rt), "host") == 0, "ccq_backend_name = \"%s\"",
                 ccq_backend_name(f->rt));
        break;
    }
}

/* A second runtime, used while the first one lives, and destroyed with work pending. */
static void fz_rt2(fz *f, uint8_t v)
{
    ccq_device_id devs[2] = {0, 1};
    ccq_runtime *rt2 = NULL;
    ccq_config cfg;
    ccq_stats s;
    uint64_t accepted = 0;
    float *b = calloc(2, 8 * sizeof *b);
    ccq_status st;

    if (b == NULL)
        return;
    ccq_config_init(&cfg);
    cfg.host_devices = 2;
    cfg.max_streams = 1;
    cfg.queue_depth = 2;
    cfg.timeout_ms = 20;
    cfg.host_workers = 1;
    cfg.spin_us = 0;
    cfg.flags = 0;
    cfg.fault = NULL;
    cfg.env_error = NULL;
    st = ccq_runtime_create(&cfg, &rt2);
    fz_note(f, "rt2: ccq_runtime_create -> %s", ccq_status_name(st));
    fz_expect(f, st, CCQ_OK, "ccq_runtime_create (second runtime)");
    st = ccq_comm_init(rt2, devs, 2);
    fz_note(f, "rt2: ccq_comm_init({0,1}) -> %s", ccq_status_name(st));
    fz_status(f, st, "ccq_comm_init (second runtime)");
    if (st == CCQ_OK) {
        for (uint32_t d = 0; d < ((v & 1) ? 2u : 1u); d++) {
            st = ccq_all_reduce(rt2, d, 0, b + 8 * d, b + 8 * d, 8, CCQ_FLOAT32, CCQ_SUM, devs, 2);
            fz_note(f, "rt2: ccq_all_reduce(dev=%u) -> %s", d, ccq_status_name(st));
            fz_status(f, st, "ccq_all_reduce (second runtime)");
            accepted += st == CCQ_OK;
        }
    }
    if ((v & 2) && fz_spend(f, 20 + 22 + 10)) {
        st = ccq_sync_collective(rt2, 0, 0);
        fz_note(f, "rt2: ccq_sync_collective(0, 0) -> %s", ccq_status_name(st));
        fz_status(f, st, "ccq_sync_collective (second runtime)");
    }
    if (v & 4) {
        fz_expect(f, ccq_runtime_shutdown(rt2), CCQ_OK, "ccq_runtime_shutdown (second runtime)");
        memset(&s, 0, sizeof s);
        s.struct_size = sizeof s;
        fz_expect(f, ccq_get_stats(rt2, &s), CCQ_OK, "ccq_get_stats (second runtime)");
        FZ_CHECK(f,
                 s.submitted == accepted && s.pending == 0 &&
                     s.completed + s.failed + s.cancelled == s.submitted,
                 "second runtime after shutdown: accepted %llu, submitted %llu, completed %llu, "
                 "failed %llu, cancelled %llu, pending %llu",
                 (unsigned long long)accepted, (unsigned long long)s.submitted,
                 (unsigned long long)s.completed, (unsigned long long)s.failed,
                 (unsigned long long)s.cancelled, (unsigned long long)s.pending);
    }
    fz_expect(f, ccq_runtime_destroy(rt2), CCQ_OK, "ccq_runtime_destroy (second runtime)");
    fz_note(f, "rt2: destroyed");
    free(b);
}

/* ---- Event log and metrics ------------------------------------------------------------ */

/* The event callback: thread-safe (atomics only) and quick, as ccq.h asks. What it finds is
 * checked on the harness thread (fz_check_callback). */
static void fz_on_event(const ccq_event *ev, void *user)
{
    fz_events *e = user;

    atomic_fetch_add_explicit(&e->seen, 1, memory_order_relaxed);
    if (ev->struct_size != sizeof *ev || ev->type >= CCQ_EV_TYPE_COUNT_ ||
        ev->kind >= CCQ_KIND_COUNT_ || ev->dtype >= CCQ_DTYPE_COUNT_ || ev->status > 0 ||
        ev->status < (int)CCQ_ERR_UNSUPPORTED) {
        atomic_store_explicit(&e->bad_type, ev->type, memory_order_relaxed);
        atomic_fetch_add_explicit(&e->bad, 1, memory_order_relaxed);
    }
}

static void fz_check_callback(fz *f)
{
    uint64_t bad = atomic_load_explicit(&f->events.bad, memory_order_relaxed);
    FZ_CHECK(f, bad == 0, "the event callback got %llu malformed events of %llu (one of type %u)",
             (unsigned long long)bad,
             (unsigned long long)atomic_load_explicit(&f->events.seen, memory_order_relaxed),
             atomic_load_explicit(&f->events.bad_type, memory_order_relaxed));
}

static int fz_is_cmd_event(uint32_t type)
{
    return type == CCQ_EV_SUBMITTED || type == CCQ_EV_ISSUED || type == CCQ_EV_COMPLETED ||
           type == CCQ_EV_FAILED;
}

/* What every snapshot must hold: events oldest first, of known types, and command events
 * that describe a command this runtime could have accepted. */
static void fz_check_events(fz *f, const ccq_event *ev, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const ccq_event *e = &ev[i];
        const char *tn = ccq_event_type_name(e->type);
        FZ_CHECK(f, e->type < CCQ_EV_TYPE_COUNT_ && tn[0] != '\0' && strcmp(tn, "?") != 0,
                 "event %zu of %zu: type %u (\"%s\")", i, n, e->type, tn);
        FZ_CHECK(f, e->struct_size == sizeof *e, "event %zu (%s): struct_size %u, not %zu", i, tn,
                 e->struct_size, sizeof *e);
        FZ_CHECK(f, e->status <= 0 && e->status >= (int)CCQ_ERR_UNSUPPORTED,
                 "event %zu (%s): status %d is not a ccq_status", i, tn, (int)e->status);
        FZ_CHECK(f, i == 0 || ev[i - 1].time_ns <= e->time_ns,
                 "events not oldest first: %zu (%s) at %llu ns after one at %llu ns", i, tn,
                 (unsigned long long)e->time_ns, (unsigned long long)ev[i - 1].time_ns);
        if (!fz_is_cmd_event(e->type))
            continue;
        FZ_CHECK(f,
                 e->kind < CCQ_KIND_COUNT_ && e->dtype < CCQ_DTYPE_COUNT_ && e->device < f->ndev &&
                     e->stream < f->nstreams,
                 "%s event %zu: kind %u, dtype %u, device %u, stream %u", tn, i, e->kind, e->dtype,
                 e->device, e->stream);
        FZ_CHECK(f, e->bytes == e->count * fz_esize((ccq_dtype)e->dtype),
                 "%s event %zu: %llu bytes for %llu elements of dtype %u", tn, i,
                 (unsigned long long)e->bytes, (unsigned long long)e->count, e->dtype);
        if ((fz_kinds[e->kind].flags & FZ_K_ROOT) || !(fz_kinds[e->kind].flags & FZ_K_SET))
            FZ_CHECK(f, e->peer_valid == 1 && e->peer < f->ndev,
                     "%s event %zu of a %s: peer_valid %u, peer (root) %u", tn, i,
                     fz_kinds[e->kind].name, e->peer_valid, e->peer);
        if (e->type == CCQ_EV_COMPLETED || e->type == CCQ_EV_FAILED)
            FZ_CHECK(f, (e->status == CCQ_OK) == (e->type == CCQ_EV_COMPLETED),
                     "%s event %zu with status %s", tn, i, ccq_status_name((ccq_status)e->status));
    }
}

/* ccq_trace_snapshot. v & 7: cap; 8: out NULL; 16: n NULL; 32: dropped NULL; 64: out[0]'s
 * struct_size is no ccq_event layout (sizeof + 8). The buffer holds exactly cap events, so a
 * write past it is a heap overflow. */
static void fz_snapshot(fz *f, uint8_t v)
{
    static const size_t caps[8] = {0, 1, 2, 5, 16, 64, FZ_TRACE_ALL, FZ_TRACE_ALL};
    size_t cap = caps[v & 7], n = SIZE_MAX;
    int null_out = (v & 8) != 0, null_n = (v & 16) != 0, null_dropped = (v & 32) != 0;
    int bad_size = (v & 64) != 0;
    ccq_event *ev = malloc(cap * sizeof *ev);
    uint64_t dropped = UINT64_MAX;
    ccq_status st;

    if (cap > 0 && ev == NULL)
        return;
    if (cap > 0)
        ev[0].struct_size = (uint32_t)sizeof *ev + (bad_size ? 8 : 0);
    st = ccq_trace_snapshot(f->rt, null_out ? NULL : ev, cap, null_n ? NULL : &n,
                            null_dropped ? NULL : &dropped);
    fz_note(f, "ccq_trace_snapshot(cap=%zu%s%s%s%s) -> %s, n=%zu, dropped=%llu", cap,
            null_out ? ", out=NULL" : "", null_n ? ", n=NULL" : "",
            null_dropped ? ", dropped=NULL" : "", bad_size ? ", bad struct_size" : "",
            ccq_status_name(st), n, (unsigned long long)dropped);
    fz_status(f, st, "ccq_trace_snapshot");
    if (null_n || (null_out && cap > 0)) {
        fz_expect(f, st, CCQ_ERR_INVALID_ARGUMENT, "ccq_trace_snapshot (NULL pointer)");
    } else if (bad_size && cap > 0) {
        fz_expect(f, st, CCQ_ERR_INVALID_ARGUMENT, "ccq_trace_snapshot (bad struct_size)");
    } else {
        fz_expect(f, st, CCQ_OK, "ccq_trace_snapshot");
        FZ_CHECK(f, n <= cap, "ccq_trace_snapshot: n = %zu > cap = %zu", n, cap);
        if (f->trace_cap == 0)
            FZ_CHECK(f, n == 0 && (null_dropped || dropped == 0),
                     "recorder off, but ccq_trace_snapshot gave %zu events, %llu dropped", n,
                     (unsigned long long)dropped);
        if (!null_out)
            fz_check_events(f, ev, n);
    }
    free(ev);
}

/* ccq_trace_dump (v % 5): 0 a file in a fresh directory; 1 a file in a directory that does
 * not exist; 2 the directory itself; 3 ""; 4 NULL. Everything is removed afterwards. */
static void fz_dump(fz *f, uint8_t v)
{
    char dir[] = "/tmp/ccq-fuzz-XXXXXX", path[64], head = 0, tail = 0;
    unsigned kind = v % 5;
    ccq_status st;
    struct stat sb;
    int cleaned = 1;

    if (kind <= 2 && mkdtemp(dir) == NULL)
        return;
    snprintf(path, sizeof path, "%s%s", kind <= 2 ? dir : "",
             kind == 0   ? "/trace.json"
             : kind == 1 ? "/missing/trace.json"
                         : "");
    st = ccq_trace_dump(f->rt, kind == 4 ? NULL : path);
    if (kind == 0 && stat(path, &sb) == 0) {
        FILE *fp = fopen(path, "r");
        int ch;
        if (fp != NULL) {
            while ((ch = fgetc(fp)) != EOF)
                if (ch != ' ' && ch != '\n' && ch != '\r' && ch != '\t') {
                    tail = (char)ch;
                    if (head == 0)
                        head = (char)ch;
                }
            fclose(fp);
        }
        cleaned = unlink(path) == 0;
    }
    if (kind <= 2)
        cleaned &= rmdir(dir) == 0;
    fz_note(f, "ccq_trace_dump(%s%s%s) -> %s", kind == 4 ? "NULL" : "\"", kind == 4 ? "" : path,
            kind == 4 ? "" : "\"", ccq_status_name(st));
    fz_status(f, st, "ccq_trace_dump");
    FZ_CHECK(f, cleaned, "could not remove %s after ccq_trace_dump (%s)", dir, ccq_status_name(st));
    if (kind == 4) {
        fz_expect(f, st, CCQ_ERR_INVALID_ARGUMENT, "ccq_trace_dump(rt, NULL)");
    } else if (f->trace_cap == 0) {
        /* Refused as the recorder is off, or (the checks are not ordered) for the path. */
        FZ_CHECK(f, st == CCQ_ERR_INVALID_ARGUMENT || (kind != 0 && st == CCQ_ERR_BACKEND),
                 "ccq_trace_dump with the recorder off returned %s", ccq_status_name(st));
    } else if (kind != 0) {
        fz_expect(f, st, CCQ_ERR_BACKEND, "ccq_trace_dump to a path it cannot write");
    } else {
        fz_expect(f, st, CCQ_OK, "ccq_trace_dump");
        FZ_CHECK(f, head == '{' && tail == '}', "ccq_trace_dump wrote no JSON object ('%c'...'%c')",
                 head ? head : '?', tail ? tail : '?');
    }
}

/* The fields of a ccq_get_metrics answer the harness can bound: nothing the harness does
 * not have outstanding, and nothing at all after shutdown. */
static void fz_check_metrics(fz *f, const ccq_metrics *m)
{
    uint64_t out = 0;

    for (uint32_t d = 0; d < f->ndev; d++)
        for (uint32_t k = 0; k < f->nstreams; k++)
            out += f->out[d][k];
    FZ_CHECK(f, m->commands_ended <= f->accepted && m->queued_now <= out,
             "metrics: %llu commands ended and %llu queued, but %llu accepted and at most %llu "
             "outstanding",
             (unsigned long long)m->commands_ended, (unsigned long long)m->queued_now,
             (unsigned long long)f->accepted, (unsigned long long)out);
    FZ_CHECK(f,
             m->deepest_depth <= m->queued_now &&
                 (m->deepest_depth == 0 ||
                  (m->deepest_device < f->ndev && m->deepest_stream < f->nstreams)),
             "metrics: deepest stream %u/%u with %llu of %llu queued", m->deepest_device,
             m->deepest_stream, (unsigned long long)m->deepest_depth,
             (unsigned long long)m->queued_now);
    /* p50 <= p99 only when idle: they are read one after the other. */
    FZ_CHECK(
        f,
        m->commands_per_s >= 0 && m->commands_per_s_total >= 0 && m->queue_p50_us >= 0 &&
            m->queue_p99_us >= 0 && m->run_p50_us >= 0 && m->run_p99_us >= 0 &&
            (!f->shut || (m->queue_p99_us >= m->queue_p50_us && m->run_p99_us >= m->run_p50_us)),
        "metrics: rates %g, %g/s, queue p50/p99 %g/%g us, run p50/p99 %g/%g us", m->commands_per_s,
        m->commands_per_s_total, m->queue_p50_us, m->queue_p99_us, m->run_p50_us, m->run_p99_us);
    FZ_CHECK(f, m->trace_dropped <= m->trace_events, "metrics: %llu of %llu events dropped",
             (unsigned long long)m->trace_dropped, (unsigned long long)m->trace_events);
    if (f->trace_cap == 0)
        FZ_CHECK(f, m->trace_events == 0, "recorder off, but metrics count %llu events",
                 (unsigned long long)m->trace_events);
    if (f->shut)
        FZ_CHECK(f, m->commands_ended == f->accepted && m->queued_now == 0,
                 "after shutdown: metrics count %llu ended and %llu queued of %llu accepted",
                 (unsigned long long)m->commands_ended, (unsigned long long)m->queued_now,
                 (unsigned long long)f->accepted);
}

/* ccq_get_metrics with struct_size (v % 8): sizeof, the size without the trace counters and
 * one byte less, 3, 0, sizeof + 1, sizeof + 8, or out = NULL. ccq.h serves sizeof and the
 * sizes from offsetof(ccq_metrics, trace_events) up, and refuses the rest. Exactly
 * struct_size bytes, so a write past them is a heap overflow. */
static void fz_metrics(fz *f, uint8_t v)
{
    const size_t full = sizeof(ccq_metrics), old = offsetof(ccq_metrics, trace_events);
    const size_t sizes[8] = {full, old, old - 1, 3, 0, full + 1, full + 8, full};
    size_t size = sizes[v % 8];
    int null_out = v % 8 == 7;
    uint8_t *mem = fz_sized_struct(size);
    uint32_t ss = (uint32_t)size;
    ccq_metrics m;
    ccq_status st;

    if (mem == NULL)
        return;
    st = ccq_get_metrics(f->rt, null_out ? NULL : (ccq_metrics *)(void *)mem);
    fz_note(f, "ccq_get_metrics(struct_size=%zu%s) -> %s", size, null_out ? ", out=NULL" : "",
            ccq_status_name(st));
    fz_status(f, st, "ccq_get_metrics");
    /* ccq.h: sizeof(ccq_metrics), or from offsetof(ccq_metrics, trace_events) up. */
    fz_expect(f, st, !null_out && size >= old && size <= full ? CCQ_OK : CCQ_ERR_INVALID_ARGUMENT,
              "ccq_get_metrics");
    if (st == CCQ_OK) {
        memset(&m, 0, sizeof m);
        memcpy(&m, mem, size);
        FZ_CHECK(f, m.struct_size == ss, "ccq_get_metrics changed struct_size to %u",
                 m.struct_size);
        if (size == full)
            fz_check_metrics(f, &m);
    }
    free(mem);
}

/* ccq_stream_queue_depth: refused for a bad stream or NULL; else at most what the harness
 * may have outstanding there (0 once a fence returned CCQ_OK, or after shutdown). */
static void fz_queue_depth(fz *f, ccq_device_id dev, ccq_stream_id stream, uint8_t v)
{
    uint64_t depth = UINT64_MAX;
    int null_out = v & 1, valid = dev < f->ndev && stream < f->nstreams && !null_out;
    ccq_status st = ccq_stream_queue_depth(f->rt, dev, stream, null_out ? NULL : &depth);

    fz_note(f, "ccq_stream_queue_depth(dev=%u, stream=%u%s) -> %s, %llu", dev, stream,
            null_out ? ", depth=NULL" : "", ccq_status_name(st), (unsigned long long)depth);
    fz_status(f, st, "ccq_stream_queue_depth");
    if (!valid) {
        fz_expect(f, st, CCQ_ERR_INVALID_ARGUMENT, "ccq_stream_queue_depth (bad arguments)");
        return;
    }
    fz_expect(f, st, CCQ_OK, "ccq_stream_queue_depth");
    FZ_CHECK(f, depth <= f->out[dev][stream] && depth <= f->depth,
             "ccq_stream_queue_depth(%u, %u) = %llu, but at most %u are outstanding (queue_depth "
             "%u)",
             dev, stream, (unsigned long long)depth, f->out[dev][stream], f->depth);
}

/* ccq_set_event_callback (v % 3): the harness's callback, NULL (clears it), or rt = NULL. */
static void fz_callback(fz *f, uint8_t v)
{
    unsigned kind = v % 3;
    ccq_status st = ccq_set_event_callback(kind == 2 ? NULL : f->rt, kind == 0 ? fz_on_event : NULL,
                                           &f->events);

    fz_note(f, "ccq_set_event_callback(%s%s) -> %s", kind == 2 ? "rt=NULL, " : "",
            kind == 1 ? "NULL" : "fz_on_event", ccq_status_name(st));
    fz_status(f, st, "ccq_set_event_callback");
    if (kind == 2)
        fz_expect(f, st, CCQ_ERR_INVALID_ARGUMENT, "ccq_set_event_callback(NULL, ...)");
    else if (!f->shut || st != CCQ_ERR_SHUTDOWN)
        fz_expect(f, st, CCQ_OK, "ccq_set_event_callback");
}

/* Kind and event-type names for any value: the API's name for a known one, "?" otherwise. */
static void fz_names(fz *f, uint8_t x)
{
    uint32_t d = x < 0x80 ? x % 16u : (x < 0xc0 ? UINT32_MAX - (x & 7) : 0x80000000u | x);
    const char *kn = ccq_kind_name(d), *tn = ccq_event_type_name(d);

    fz_note(f, "ccq_kind_name/ccq_event_type_name(%u) -> \"%s\", \"%s\"", d, kn ? kn : "(null)",
            tn ? tn : "(null)");
    FZ_CHECK(f, kn != NULL && tn != NULL, "NULL name for %u", d);
    if (d < CCQ_KIND_COUNT_)
        FZ_CHECK(f, strcmp(kn, fz_kinds[d].name + 4) == 0, "ccq_kind_name(%u) = \"%s\", not %s", d,
                 kn, fz_kinds[d].name + 4);
    else
        FZ_CHECK(f, strcmp(kn, "?") == 0, "ccq_kind_name(%u) = \"%s\", not \"?\"", d, kn);
    FZ_CHECK(f, (d < CCQ_EV_TYPE_COUNT_) == (tn[0] != '\0' && strcmp(tn, "?") != 0),
             "ccq_event_type_name(%u) = \"%s\"", d, tn);
}

/* The calls added after the first corpus, with a NULL runtime: each refused. */
static void fz_null_runtime(fz *f)
{
    const ccq_device_id one = 0;
    const fz_set set = {{0}, &one, 1, 1, 1};
    uint8_t *b = f->buf[0][0][0]; /* never touched: the calls must fail first */
    ccq_event ev;
    ccq_metrics m;
    size_t n = 0;
    uint64_t depth = 0;

    ev.struct_size = sizeof ev;
    fz_note(f, "NULL-runtime calls (collectives, event log)");
    for (int k = CCQ_KIND_BROADCAST; k < CCQ_KIND_COUNT_; k++) {
        fz_call c = {(ccq_kind)k, 0, 0, b, b + 64, 1, CCQ_INT8, CCQ_SUM, 0, &set};
        fz_expect(f, fz_call_api(NULL, &c), CCQ_ERR_INVALID_ARGUMENT, fz_kinds[k].name);
    }
    fz_expect(f, ccq_trace_snapshot(NULL, &ev, 1, &n, NULL), CCQ_ERR_INVALID_ARGUMENT,
              "ccq_trace_snapshot(NULL)");
    fz_expect(f, ccq_trace_dump(NULL, "/nonexistent-ccq-fuzz/t.json"), CCQ_ERR_INVALID_ARGUMENT,
              "ccq_trace_dump(NULL)");
    m.struct_size = sizeof m;
    fz_expect(f, ccq_get_metrics(NULL, &m), CCQ_ERR_INVALID_ARGUMENT, "ccq_get_metrics(NULL)");
    fz_expect(f, ccq_stream_queue_depth(NULL, 0, 0, &depth), CCQ_ERR_INVALID_ARGUMENT,
              "ccq_stream_queue_depth(NULL)");
    fz_expect(f, ccq_set_event_callback(NULL, NULL, NULL), CCQ_ERR_INVALID_ARGUMENT,
              "ccq_set_event_callback(NULL)");
}

/* Everything the recorder holds, against the counters. After shutdown nothing runs, so when
 * nothing was dropped the counts are exact: one SUBMITTED per accepted command (distinct
 * ids), one COMPLETED or FAILED per command that ended, every event in the metrics. */
static void fz_census(fz *f)
{
    ccq_event *ev = malloc(FZ_TRACE_ALL * sizeof *ev);
    uint8_t *seen = calloc(f->accepted + 1, 1); /* per id: 1 submitted, 2 ended */
    size_t n = 0, submitted = 0, completed = 0, failed = 0;
    uint64_t dropped = 0;
    ccq_stats s;
    ccq_metrics m;
    int exact;

    if (ev == NULL || seen == NULL) {
        free(ev);
        free(seen);
        return;
    }
    ev[0].struct_size = sizeof *ev;
    fz_expect(f, ccq_trace_snapshot(f->rt, ev, FZ_TRACE_ALL, &n, &dropped), CCQ_OK,
              "ccq_trace_snapshot");
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    fz_expect(f, ccq_get_stats(f->rt, &s), CCQ_OK, "ccq_get_stats");
    memset(&m, 0, sizeof m);
    m.struct_size = sizeof m;
    fz_expect(f, ccq_get_metrics(f->rt, &m), CCQ_OK, "ccq_get_metrics");
    fz_note(f, "census: %zu events, %llu dropped; metrics: %llu events, %llu dropped", n,
            (unsigned long long)dropped, (unsigned long long)m.trace_events,
            (unsigned long long)m.trace_dropped);
    fz_check_events(f, ev, n);
    fz_check_metrics(f, &m);
    exact = f->shut && f->trace_cap > 0 && dropped == 0 && n < FZ_TRACE_ALL;
    for (size_t i = 0; i < n; i++) {
        const ccq_event *e = &ev[i];
        if (e->type == CCQ_EV_SUBMITTED) {
            FZ_CHECK(f, !exact || (e->id >= 1 && e->id <= f->accepted && !(seen[e->id] & 1)),
                     "SUBMITTED event with id %llu (%llu commands accepted)",
                     (unsigned long long)e->id, (unsigned long long)f->accepted);
            if (e->id <= f->accepted)
                seen[e->id] |= 1;
            submitted++;
        } else if (e->type == CCQ_EV_COMPLETED || e->type == CCQ_EV_FAILED) {
            FZ_CHECK(f, !exact || (e->id <= f->accepted && seen[e->id] == 1),
                     "%s event for command %llu, which %s", ccq_event_type_name(e->type),
                     (unsigned long long)e->id,
                     e->id > f->accepted ? "does not exist" : "was not submitted or ended twice");
            if (e->id <= f->accepted)
                seen[e->id] |= 2;
            completed += e->type == CCQ_EV_COMPLETED;
            failed += e->type == CCQ_EV_FAILED;
        }
    }
    FZ_CHECK(f, submitted <= f->accepted, "%zu SUBMITTED events, %llu commands accepted", submitted,
             (unsigned long long)f->accepted);
    if (exact)
        FZ_CHECK(f,
                 submitted == f->accepted && completed == s.completed &&
                     failed == s.failed + s.cancelled && n == m.trace_events,
                 "after shutdown: %zu SUBMITTED, %zu COMPLETED, %zu FAILED events of %zu, but "
                 "%llu accepted, %llu completed, %llu failed + %llu cancelled, %llu recorded",
                 submitted, completed, failed, n, (unsigned long long)f->accepted,
                 (unsigned long long)s.completed, (unsigned long long)s.failed,
                 (unsigned long long)s.cancelled, (unsigned long long)m.trace_events);
    free(seen);
    free(ev);
}

/* FZ_OP_TRACE: one event-log or metrics call, v = opcode & 7. */
static void fz_trace(fz *f, unsigned v)
{
    switch (v) {
    case 0:
        fz_snapshot(f, fz_u8(f));
        break;
    case 1:
        fz_dump(f, fz_u8(f));
        break;
    case 2:
        fz_metrics(f, fz_u8(f));
        break;
    case 3: {
        ccq_device_id dev = fz_dev(f, fz_u8(f));
        ccq_stream_id stream = fz_stream(f, fz_u8(f));
        fz_queue_depth(f, dev, stream, fz_u8(f));
        break;
    }
    case 4:
        fz_callback(f, fz_u8(f));
        break;
    case 5:
        fz_names(f, fz_u8(f));
        break;
    case 6:
        fz_null_runtime(f);
        break;
    default:
        fz_census(f);
        break;
    }
    fz_check_callback(f);
}

/* ---- Configuration -------------------------------------------------------------------- */

/* A configuration ccq_runtime_create must refuse (or, variant 15, a seed-era caller's
 * smaller struct, which it must accept). */
static void fz_bad_config(fz *f, ccq_config *cfg, unsigned variant)
{
    ccq_runtime *rt = (ccq_runtime *)(void *)&rt;
    ccq_status st;

    switch (variant) {
    case 0:
        cfg->host_devices = 0;
        break;
    case 1:
        cfg->host_devices = 1025;
        break;
    case 2:
        cfg->max_streams = 0;
        break;
    case 3:
        cfg->max_streams = 65537;
        break;
    case 4:
        cfg->queue_depth = 0;
        break;
    case 5:
        cfg->queue_depth = (1u << 20) + 1;
        break;
    case 6:
        cfg->max_batch_ops = 0;
        break;
    case 7:
        cfg->max_batch_ops = 65537;
        break;
    case 8:
        cfg->struct_size = 0;
        break;
    case 9:
        cfg->struct_size = sizeof *cfg + 8;
        break;
    case 10:
        cfg->backend = NULL;
        break;
    case 11:
        cfg->backend = "bogus";
        break;
    case 12:
        cfg->flags = 0x2 | CCQ_FLAG_NONBLOCKING_SUBMIT;
        break;
    case 13:
        cfg->spin_us = 1000001;
        break;
    case 14:
        cfg->env_error = "CCQ_QUEUE_DEPTH: injected by the fuzzer";
        break;
    default:
        cfg->struct_size = (uint32_t)offsetof(ccq_config, host_workers);
        break;
    }
    st = ccq_runtime_create(cfg, &rt);
    fz_note(f, "ccq_runtime_create(bad config variant %u) -> %s", variant, ccq_status_name(st));
    fz_status(f, st, "ccq_runtime_create");
    if (variant == 15 && st == CCQ_OK) {
        FZ_CHECK(f, ccq_device_count(rt) == cfg->host_devices,
                 "seed-era config: %u devices, expected %u", ccq_device_count(rt),
                 cfg->host_devices);
        fz_expect(f, ccq_runtime_destroy(rt), CCQ_OK, "ccq_runtime_destroy");
        return;
    }
    if (variant != 15)
        fz_expect(f, st, CCQ_ERR_INVALID_ARGUMENT, "ccq_runtime_create (bad config)");
    FZ_CHECK(f, rt == NULL, "ccq_runtime_create failed but left *out = %p", (void *)rt);
}

/* The fault plan h4/h5 choose; raw strings come from the input (up to 31 bytes). */
static const char *fz_fault(fz *f, uint8_t h4, uint8_t h5, char *buf, size_t len, int *raw)
{
    *raw = 0;
    switch (h4 >> 5) {
    case 3:
        snprintf(buf, len, "drop:rank=%u,after=%u%s", (h5 & 7) % f->ndev, (h5 >> 3) & 3,
                 (h5 & 0x40) ? ",count=1" : "");
        return buf;
    case 4:
        snprintf(buf, len, "fail:op=%u,count=%u", h5 & 15, 1 + ((h5 >> 4) & 3));
        return buf;
    case 5:
        snprintf(buf, len, "fail:every=%u", 1 + (h5 & 7));
        return buf;
    case 6:
        snprintf(buf, len, "delay:us=%u,op=%u,count=%u", 500u * (1 + (h5 & 7)), (h5 >> 3) & 3,
                 1 + ((h5 >> 5) & 3));
        return buf;
    case 7: {
        size_t n = h5 & 31;
        *raw = 1;
        for (size_t i = 0; i < n && i + 1 < len; i++)
            buf[i] = (char)fz_u8(f);
        buf[n < len ? n : len - 1] = '\0';
        return buf;
    }
    default:
        return (h4 & 1) ? "" : NULL;
    }
}

/* ---- The program ---------------------------------------------------------------------- */

/* Opcode bytes below 0xE0 keep the meaning they had before the collectives and the event
 * log were fuzzed (byte % FZ_OP_COUNT), so the corpus keeps its meaning too. */
static int fz_opcode(uint8_t b)
{
    if (b < 0xe0)
        return b % FZ_OP_COUNT;
    return b < 0xf0 ? FZ_OP_COLL : b < 0xf8 ? FZ_OP_COLL_ALL : FZ_OP_TRACE;
}

/* FZ_OP_COLL: one rank's part of a collective (its other ranks' parts, if any, come from
 * other opcodes, and may disagree). */
static void fz_coll_one(fz *f)
{
    fz_set set;
    fz_call c = {fz_coll_kind(fz_u8(f))};
    uint8_t sb, db, cb, rb;

    c.dev = fz_dev(f, fz_u8(f));
    c.stream = fz_stream(f, fz_u8(f));
    sb = fz_u8(f);
    db = fz_u8(f);
    cb = fz_u8(f);
    c.dtype = fz_dtype(fz_u8(f));
    c.op = fz_redop(fz_u8(f));
    rb = fz_u8(f);
    fz_read_set(f, &set);
    c.set = &set;
    c.peer = (fz_kinds[c.kind].flags & FZ_K_ROOT) ? fz_root(f, rb, &set) : 0;
    c.count = fz_coll_count(cb, c.dtype, c.kind, &set);
    fz_part_buffers(f, &c, sb, db);
    fz_submit(f, &c);
}

/* FZ_OP_COLL_ALL: every rank's part of one collective over a set, each on stream sv (or
 * sv + rank if sv & 0x80) with that stream's buffers. v = opcode & 7: bit 0: buffers the
 * non-root ranks do not use are NULL; bits 1-2: the last rank's part differs in its count
 * (1), root (2) or kind (3), so the operation must fail with CCQ_ERR_MISMATCH. */
static void fz_coll_all(fz *f, unsigned v)
{
    ccq_kind kind = fz_coll_kind(fz_u8(f));
    unsigned diff = (v >> 1) & 3;
    fz_set set;
    uint8_t sv, sb, db, cb, rb;
    ccq_dtype t;
    ccq_reduce_op op;
    size_t n;

    fz_read_set(f, &set);
    sv = fz_u8(f);
    sb = fz_u8(f);
    db = fz_u8(f);
    cb = fz_u8(f);
    t = fz_dtype(fz_u8(f));
    op = fz_redop(fz_u8(f));
    rb = fz_u8(f);
    n = set.ptr != NULL && set.n <= FZ_SET_MAX ? set.n : 0;
    for (size_t r = 0; r < n; r++) {
        int odd = diff != 0 && r + 1 == n;
        fz_call c = {odd && diff == 3 ? fz_coll_kind((uint8_t)(kind - CCQ_KIND_BROADCAST + 1))
                                      : kind,
                     set.ids[r], fz_stream(f, (uint8_t)(sv + ((sv & 0x80) ? r : 0)))};
        unsigned k = fz_kinds[c.kind].flags;
        c.dtype = t;
        c.op = op;
        c.set = &set;
        c.peer = (k & FZ_K_ROOT) ? fz_root(f, (uint8_t)(rb + (odd && diff == 2)), &set) : 0;
        c.count = fz_coll_count(cb, t, c.kind, &set);
        if (odd && diff == 1)
            c.count = fz_other_count(c.count);
        fz_part_buffers(f, &c, sb, db);
        if ((v & 1) && c.dev != c.peer) {
            if (k & FZ_K_SRC_ROOT)
                c.src = NULL;
            if (k & FZ_K_DST_ROOT)
                c.dst = NULL;
        }
        fz_submit(f, &c);
    }
}

static void fz_run(fz *f)
{
    for (int k = 0; k < FZ_MAX_OPS && f->n > 0; k++) {
        uint8_t byte = fz_u8(f);
        int op = fz_opcode(byte);
        fz_set set;
        f->step++;
        switch (op) {
        case FZ_OP_COMM_INIT:
            fz_read_set(f, &set);
            fz_comm_init(f, &set);
            break;
        case FZ_OP_ALL_REDUCE: {
            ccq_device_id dev = fz_dev(f, fz_u8(f));
            ccq_stream_id stream = fz_stream(f, fz_u8(f));
            uint8_t sb = fz_u8(f), db = fz_u8(f), cb = fz_u8(f);
            ccq_dtype t = fz_dtype(fz_u8(f));
            ccq_reduce_op rop = fz_redop(fz_u8(f));
            uint8_t *src = fz_slice(f, sb, dev, stream);
            uint8_t *dst = db == 0xfe ? src : fz_slice(f, db, dev, stream);
            fz_read_set(f, &set);
            fz_submit(f, &(fz_call){CCQ_KIND_ALL_REDUCE, dev, stream, src, dst, fz_count(cb, t), t,
                                    rop, 0, &set});
            break;
        }
        case FZ_OP_SEND:
        case FZ_OP_RECV: {
            ccq_device_id dev = fz_dev(f, fz_u8(f));
            ccq_stream_id stream = fz_stream(f, fz_u8(f));
            uint8_t *b = fz_slice(f, fz_u8(f), dev, stream);
            uint8_t cb = fz_u8(f);
            ccq_dtype t = fz_dtype(fz_u8(f));
            ccq_device_id peer = fz_dev(f, fz_u8(f));
            if (op == FZ_OP_SEND)
                fz_submit(f, &(fz_call){CCQ_KIND_SEND, dev, stream, b, NULL, fz_count(cb, t), t,
                                        CCQ_SUM, peer, NULL});
            else
                fz_submit(f, &(fz_call){CCQ_KIND_RECV, dev, stream, NULL, b, fz_count(cb, t), t,
                                        CCQ_SUM, peer, NULL});
            break;
        }
        case FZ_OP_SYNC: {
            ccq_device_id dev = fz_dev(f, fz_u8(f));
            fz_sync(f, dev, fz_stream(f, fz_u8(f)));
            break;
        }
        case FZ_OP_STATS:
            fz_stats(f, fz_u8(f));
            break;
        case FZ_OP_LAST_ERROR: {
            ccq_device_id dev = fz_dev(f, fz_u8(f));
            ccq_stream_id stream = fz_stream(f, fz_u8(f));
            fz_last_error(f, dev, stream, fz_u8(f));
            break;
        }
        case FZ_OP_MEM_ALLOC: {
            ccq_device_id dev = fz_dev(f, fz_u8(f));
            fz_mem_alloc(f, dev, fz_u8(f));
            break;
        }
        case FZ_OP_MEM_FREE:
            fz_mem_free(f, fz_u8(f));
            break;
        case FZ_OP_MEM_COPY: {
            uint8_t v = fz_u8(f), kb = fz_u8(f);
            fz_mem_copy(f, v, kb, fz_u8(f));
            break;
        }
        case FZ_OP_SHUTDOWN:
            fz_shutdown(f, fz_u8(f));
            break;
        case FZ_OP_ALL_REDUCE_ALL: {
            fz_read_set(f, &set);
            uint8_t sv = fz_u8(f), sb = fz_u8(f), db = fz_u8(f), cb = fz_u8(f);
            ccq_dtype t = fz_dtype(fz_u8(f));
            ccq_reduce_op rop = fz_redop(fz_u8(f));
            size_t n = set.ptr != NULL && set.n <= FZ_SET_MAX ? set.n : 0;
            for (size_t r = 0; r < n; r++) {
                /* Each rank on stream sv or sv + rank, with that stream's buffers. */
                ccq_stream_id stream = fz_stream(f, (uint8_t)(sv + ((sv & 0x80) ? r : 0)));
                uint8_t *src = fz_slice(f, sb, set.ids[r], stream);
                uint8_t *dst = db == 0xfe ? src : fz_slice(f, db, set.ids[r], stream);
                fz_submit(f, &(fz_call){CCQ_KIND_ALL_REDUCE, set.ids[r], stream, src, dst,
                                        fz_count(cb, t), t, rop, 0, &set});
            }
            break;
        }
        case FZ_OP_SENDRECV: {
            ccq_device_id a = fz_dev(f, fz_u8(f)), b = fz_dev(f, fz_u8(f));
            ccq_stream_id sa = fz_stream(f, fz_u8(f)), sb = fz_stream(f, fz_u8(f));
            uint8_t *src = fz_slice(f, fz_u8(f), a, sa), *dst = fz_slice(f, fz_u8(f), b, sb);
            uint8_t cb = fz_u8(f);
            ccq_dtype t = fz_dtype(fz_u8(f));
            size_t count = fz_count(cb, t);
            fz_call send = {CCQ_KIND_SEND, a, sa, src, NULL, count, t, CCQ_SUM, b, NULL};
            fz_call recv = {CCQ_KIND_RECV, b, sb, NULL, dst, count, t, CCQ_SUM, a, NULL};
            int recv_first = fz_u8(f) & 1;
            fz_submit(f, recv_first ? &recv : &send);
            fz_submit(f, recv_first ? &send : &recv);
            break;
        }
        case FZ_OP_SYNC_ALL:
            fz_sync_all(f);
            break;
        case FZ_OP_MISC: {
            uint8_t v = fz_u8(f);
            fz_misc(f, v, fz_u8(f));
            break;
        }
        case FZ_OP_RT2:
            fz_rt2(f, fz_u8(f));
            break;
        case FZ_OP_COLL:
            fz_coll_one(f);
            break;
        case FZ_OP_COLL_ALL:
            fz_coll_all(f, byte & 7u);
            break;
        default:
            fz_trace(f, byte & 7u);
            break;
        }
    }
}

/* The end of every input: shut down, check the counters, fence every stream (each must
 * return at once, and a second fence CCQ_OK), free what the harness allocated, destroy. */
static void fz_finish(fz *f)
{
    ccq_stats s;
    ccq_status st;

    f->step++;
    st = ccq_runtime_shutdown(f->rt);
    fz_note(f, "ccq_runtime_shutdown(rt) -> %s (end of input)", ccq_status_name(st));
    fz_expect(f, st, CCQ_OK, "ccq_runtime_shutdown");
    f->shut = 1;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    fz_expect(f, ccq_get_stats(f->rt, &s), CCQ_OK, "ccq_get_stats");
    fz_note(f, "stats: submitted %llu completed %llu failed %llu cancelled %llu pending %llu",
            (unsigned long long)s.submitted, (unsigned long long)s.completed,
            (unsigned long long)s.failed, (unsigned long long)s.cancelled,
            (unsigned long long)s.pending);
    fz_check_stats(f, &s, sizeof s, 1);
    /* Everything has ended: each fence returns at once, with the stream's error if any,
     * and the error is cleared, so a second fence returns CCQ_OK. */
    for (uint32_t d = 0; d < f->ndev; d++) {
        for (uint32_t k = 0; k < f->nstreams; k++) {
            fz_sync(f, d, k);
            FZ_CHECK(f, f->clean[d][k], "stream %u/%u not clean after its fence", d, k);
            fz_sync(f, d, k);
        }
    }
    for (int i = 0; i < FZ_NMEM; i++)
        if (f->mem[i].p != NULL)
            fz_expect(f, ccq_mem_free(f->rt, f->mem[i].dev, f->mem[i].p), CCQ_OK, "ccq_mem_free");
    fz_expect(f, ccq_runtime_destroy(f->rt), CCQ_OK, "ccq_runtime_destroy");
    f->rt = NULL;
    fz_check_callback(f); /* every callback has returned */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static fz f; /* large (the call log); one input at a time */
    uint8_t h[7];
    ccq_config cfg;
    char fault[40];
    const char *fault_spec;
    int raw, ok = 1;
    uint32_t seed;
    ccq_status st;

    memset(&f, 0, sizeof f);
    f.p = data;
    f.n = size;
    for (int i = 0; i < 7; i++)
        h[i] = fz_u8(&f);
    f.ndev = 1 + (h[0] & 7);
    f.nstreams = 1 + ((h[0] >> 3) & 3);
    f.nonblocking = (h[0] >> 5) & 1;
    f.depth = 1 + (h[1] & 15);
    f.timeout_ms = (const uint64_t[]){20, 20, 30, 40, 50, 80, 120, 200}[h[2] & 7];
    f.trace_cap = fz_trace_caps[(h[2] >> 3) & 15];
    f.budget_ms = FZ_BUDGET_MS;
    for (uint32_t d = 0; d < FZ_MAX_DEV; d++)
        for (uint32_t s = 0; s < FZ_MAX_STREAMS; s++)
            f.clean[d][s] = 1;

    ccq_config_init(&cfg);
    cfg.backend = "host";
    cfg.host_devices = f.ndev;
    cfg.max_streams = f.nstreams;
    cfg.queue_depth = f.depth;
    cfg.max_batch_ops = 1 + ((h[1] >> 4) & 7);
    cfg.timeout_ms = f.timeout_ms;
    cfg.host_workers = 1 + ((h[0] >> 6) & 1);
    cfg.flags = f.nonblocking ? CCQ_FLAG_NONBLOCKING_SUBMIT : 0;
    cfg.spin_us = (h[2] & 0x80) ? 20 : 0;
    /* Streaming stores for every output, or the default (only ops moving 64 MiB, which the
     * harness never makes): results must not depend on it. */
    cfg.host_stream_bytes = (h[1] & 0x80) ? 1 : 0;
    cfg.trace_capacity = f.trace_cap; /* small: snapshots and dumps stay cheap */
    cfg.trace_file = NULL;
    cfg.env_error = NULL; /* the harness sets every field; the environment must not matter */
    fault_spec = fz_fault(&f, h[4], h[5], fault, sizeof fault, &raw);
    cfg.fault = fault_spec;
    fz_note(&f,
            "config: devices %u, streams %u, queue_depth %u%s, max_batch_ops %u, timeout_ms "
            "%llu, workers %u, spin_us %u, fault \"%s\", trace_capacity %u, host_stream_bytes "
            "%llu",
            cfg.host_devices, cfg.max_streams, cfg.queue_depth,
            f.nonblocking ? " (non-blocking)" : "", cfg.max_batch_ops,
            (unsigned long long)cfg.timeout_ms, cfg.host_workers, cfg.spin_us,
            fault_spec ? fault_spec : "(null)", cfg.trace_capacity,
            (unsigned long long)cfg.host_stream_bytes);

    if (h[6] >= 0xf0) {
        cfg.fault = NULL;
        fz_bad_config(&f, &cfg, h[6] & 15);
        ok = 0;
    }
    if (ok) {
        st = ccq_runtime_create(&cfg, &f.rt);
        fz_note(&f, "ccq_runtime_create -> %s", ccq_status_name(st));
        fz_status(&f, st, "ccq_runtime_create");
        if (st != CCQ_OK) {
            /* Only a malformed raw fault string may be refused. */
            FZ_CHECK(&f, raw && st == CCQ_ERR_INVALID_ARGUMENT,
                     "ccq_runtime_create refused a valid configuration: %s (%s)",
                     ccq_status_name(st), ccq_last_error_detail());
            FZ_CHECK(&f, f.rt == NULL, "ccq_runtime_create failed but set *out");
            ok = 0;
        }
    }
    if (ok) {
        seed = 0x9e3779b9u ^ h[3];
        for (uint32_t d = 0; d < f.ndev; d++) {
            for (uint32_t s = 0; s < f.nstreams; s++) {
                for (int i = 0; i < FZ_NBUF; i++) {
                    uint8_t *b = malloc(FZ_BUF_BYTES); /* exactly: overruns are reported */
                    if (b == NULL)
                        abort();
                    for (size_t j = 0; j < FZ_BUF_BYTES; j++) { /* xorshift32 */
                        seed ^= seed << 13;
                        seed ^= seed >> 17;
                        seed ^= seed << 5;
                        b[j] = (uint8_t)seed;
                    }
                    f.buf[d][s][i] = b;
                }
            }
        }
        fz_run(&f);
        fz_finish(&f);
        /* Only now may the buffers the commands borrowed go away. */
        for (uint32_t d = 0; d < f.ndev; d++)
            for (uint32_t s = 0; s < f.nstreams; s++)
                for (int i = 0; i < FZ_NBUF; i++)
                    free(f.buf[d][s][i]);
    }
    if (getenv("CCQ_FUZZ_TRACE") != NULL)
        fprintf(stderr, "%s", f.log);
    return 0;
}
