/* A stream's contract, both sides in one place: producers reserve tickets and fill slots of
 * its ring, the scheduler publishes how many commands ended (in stream order) and records
 * errors, and fences wait on that count. As libuv keeps both sides of uv_async_t in
 * src/unix/async.c. */
#ifndef CCQ_RUNTIME_STREAM_H
#define CCQ_RUNTIME_STREAM_H

#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "backends/backend.h"
#include "ccq.h"
#include "queue/mpsc.h"
#include "queue/wake.h"
#include "runtime/gpu_wait.h"
#include "runtime/span.h"

#define CCQ_CACHELINE 64

struct ccq_cmd;
struct ccq_runtime;

/* Tickets word of a stream: submitted count, plus the closed bit set by shutdown. */
#define CCQ_TICKET_CLOSED (1ull << 63)

/*
 * A stream: (device, stream id). Producers touch the first cache line group; the
 * scheduler publishes progress in the second; the rest is scheduler-only or cold.
 */
typedef struct ccq_stream {
    /* Producer side. */
    alignas(CCQ_CACHELINE) ccq_mpsc q;
    _Atomic uint64_t tickets;     /* commands submitted (reserved) | CCQ_TICKET_CLOSED */
    struct ccq_cmd *_Atomic ring; /* slot ring, allocated on first use */
    /* Scheduler -> waiters. */
    alignas(CCQ_CACHELINE) _Atomic uint64_t ended; /* commands ended, in stream order */
    ccq_signal ev;                                 /* fences and producers waiting for room */
    /* (clear epoch << 32) | the current epoch's first error as (uint32_t)ccq_status, 0 if
     * none: one word, so a fence test reads "no error since my epoch began" in one load. */
    _Atomic uint64_t errw;
    _Atomic uint64_t issued_ns;  /* when its batch in flight was issued; 0 when none */
    _Atomic uint64_t passed_pub; /* commands issued or ended (`passed`), for waiting threads */
    /* Scheduler only. */
    alignas(CCQ_CACHELINE) struct ccq_cmd *fifo_head; /* commands received and not ended */
    struct ccq_cmd *fifo_tail;
    struct ccq_cmd *cursor;          /* first command not issued (NULL: none) */
    struct ccq_cmd *build_next;      /* batch building: first command not included */
    struct ccq_cmd *build_first;     /* batch building: first included command */
    uint64_t attempt_seen;           /* batch attempt that last touched this stream */
    struct ccq_cmd *undo_build_next; /* build_next before that attempt (for rollback) */
    ccq_span build_rd, build_wr; /* batch building: union of what included commands read, write */
    ccq_span undo_rd, undo_wr;
    struct ccq_stream *undo_next;  /* streams touched by the current attempt */
    bool inflight;                 /* commands before `cursor` are in the batch in flight */
    bool active;                   /* in the scheduler's active list */
    uint64_t received;             /* commands drained from q */
    uint64_t ending;               /* commands ended, published or not: the next one's
                                      position in end order (errors are kept by it) */
    uint64_t batch_done;           /* `ending` once the batch being issued is done */
    uint64_t build_pass;           /* batch pass in which build_next/build_first are valid */
    uint64_t listed_pass;          /* batch pass whose pass_streams list holds it */
    struct ccq_stream *pass_next;  /* streams with commands in the batch being built */
    struct ccq_stream *batch_next; /* streams of a batch in flight */
    /* Failures held back until a dump holding them is on disk (trace_file): their error
     * records and the `ended` count that covers them are published after the dump. */
    struct ccq_held_err *held_errs; /* [nheld] in end order */
    uint32_t nheld, capheld;
    uint64_t held_n;              /* ended commands not published yet */
    bool held;                    /* on the scheduler's list of held streams */
    struct ccq_stream *held_next; /* that list */
    uint64_t passed;               /* commands issued (in batches handed over) or ended */
    /* Cold. */
    ccq_mpsc_node new_node; /* on rt->new_streams when first used */
    ccq_device_id device;
    ccq_stream_id id;
    uint32_t index;
    pthread_mutex_t err_lock;    /* guards errw's changes, the fields below and hist */
    uint64_t err_pos;            /* end position of the current epoch's first error */
    char *err_detail;            /* malloc'd, whole (a desync report can exceed CCQ_DETAIL_LEN) */
    struct ccq_err_record *hist; /* [CCQ_FENCE_HISTORY]: first errors of the last cleared
                                    epochs, at epoch % CCQ_FENCE_HISTORY; NULL until the
                                    first clear */
    ccq_status last_status;
    char *last_detail; /* malloc'd or NULL */
    /* GPU-side waits on bound streams (runtime/gpu_wait.h): the CUDA stream bound to it, its
     * barrier log (made at the first bind), the runtime's list of streams ever bound. */
    void *_Atomic bound;
    ccq_gw_log *_Atomic gw;
    struct ccq_stream *bound_next;
} ccq_stream;

/* A failure ended on a stream whose publication waits for the dump (see ccq_stream.held). */
typedef struct ccq_held_err {
    uint64_t pos;
    ccq_status status;
    char *detail; /* malloc'd */
} ccq_held_err;
/* Clear epochs a fence value can be older than: ccq_fence_test on a value whose epoch had
 * more error reports (ccq_sync_collective clears) after it returns CCQ_ERR_INVALID_ARGUMENT. */
#define CCQ_FENCE_HISTORY 16u

/* The first error of a cleared epoch: what ccq_sync_collective reported when it cleared it. */
typedef struct ccq_err_record {
    uint32_t epoch;
    ccq_status status;
    uint64_t pos; /* its end position */
    char *detail; /* malloc'd, or NULL ("") */
} ccq_err_record;

/* A fence value: the clear epoch at ccq_fence_begin (low 16 bits) and the stream's ticket
 * count then (48 bits, compared modulo 2^48). */
#define CCQ_FENCE_TARGET_BITS 48
#define CCQ_FENCE_TARGET_MASK ((1ull << CCQ_FENCE_TARGET_BITS) - 1)

/* a comes strictly before b, modulo 2^48 (end positions and targets never lie 2^47 apart). */
static inline bool ccq_fence_before(uint64_t a, uint64_t b)
{
    uint64_t d = (b - a) & CCQ_FENCE_TARGET_MASK;
    return d != 0 && d < (1ull << (CCQ_FENCE_TARGET_BITS - 1));
}

/* Set up a stream that has not been used yet, and free what it holds. */
void ccq_stream_init(ccq_stream *s, ccq_device_id device, ccq_stream_id id, uint32_t index);
void ccq_stream_fini(ccq_stream *s);

/* Argument checks shared by every call that names a device (one of this process's) or a
 * stream; the detail names the owner of another process's device. */
ccq_status ccq_check_device(const struct ccq_runtime *rt, const char *fn, ccq_device_id device);
ccq_status ccq_check_stream_slow(const struct ccq_runtime *rt, const char *fn, ccq_device_id device,
                                 ccq_stream_id stream);

/* ---- Producers (any thread) ---- */
/* The stream's slot ring, allocated (and the stream announced to the scheduler) on first
 * use; NULL when out of memory. */
struct ccq_cmd *ccq_stream_ring_alloc(struct ccq_runtime *rt, ccq_stream *s);
/* Reserve a ticket (a slot): one CAS when there is room; waits for room up to timeout_ms
 * unless submission is non-blocking. */
ccq_status ccq_stream_reserve_slow(struct ccq_runtime *rt, ccq_stream *s, const char *fn,
                                   uint64_t *ticket);
/* (ccq_check_stream, ccq_stream_ring and ccq_stream_reserve are inline in internal.h: their
 * fast paths are on every submission; the _slow / _alloc functions above do the rest.) */
/* Shutdown: no ticket is handed out after this returns. */
void ccq_stream_close(ccq_stream *s);

/* ---- The scheduler ---- */
/* The command at end position `pos` (s->ending before it ended) ended with an error: keep
 * the current epoch's first one for fences. Before `ended` is published past it. */
void ccq_stream_record_error(ccq_stream *s, uint64_t pos, ccq_status st, const char *detail);
/* n more commands ended, in stream order: wake fences and producers waiting for room. */
void ccq_stream_publish_ended(ccq_stream *s, uint64_t n);

/* Commands submitted on a stream and not ended yet (queued or in flight). */
static inline uint64_t ccq_stream_outstanding(ccq_stream *s)
{
    uint64_t e = atomic_load_explicit(&s->ended, memory_order_acquire);
    uint64_t k = atomic_load_explicit(&s->tickets, memory_order_acquire) & ~CCQ_TICKET_CLOSED;
    return k > e ? k - e : 0;
}

#endif /* CCQ_RUNTIME_STREAM_H */
