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
    _Atomic int err_status;                        /* first unreported error, 0 if none */
    _Atomic uint64_t issued_ns; /* when its batch in flight was issued; 0 when none */
    /* Scheduler only. */
    alignas(CCQ_CACHELINE) struct ccq_cmd *fifo_head; /* commands received and not ended */
    struct ccq_cmd *fifo_tail;
    struct ccq_cmd *cursor; /* first command not issued (NULL: none) */
    struct ccq_cmd *bcur;   /* batch building: first command not included */
    struct ccq_cmd *bfirst; /* batch building: first included command */
    uint64_t bmark;         /* batch attempt that last touched this stream */
    struct ccq_cmd *bsave;  /* bcur before that attempt (for rollback) */
    ccq_span brd, bwr;      /* batch building: union of what included commands read, write */
    ccq_span brd_save, bwr_save;
    struct ccq_stream *undo_next;     /* streams touched by the current attempt */
    bool inflight;                    /* commands before `cursor` are in the batch in flight */
    bool active;                      /* in the scheduler's active list */
    uint64_t received;                /* commands drained from q */
    uint64_t bpass;                   /* batch pass in which bcur/bfirst are valid */
    uint64_t blisted;                 /* batch pass whose pass_streams list holds it */
    struct ccq_stream *bnext_touched; /* streams with commands in the batch being built */
    struct ccq_stream *batch_next;    /* streams of a batch in flight */
    /* Cold. */
    ccq_mpsc_node new_node; /* on rt->new_streams when first used */
    ccq_device_id device;
    ccq_stream_id id;
    uint32_t index;
    pthread_mutex_t err_lock; /* guards the strings below */
    char *err_detail;         /* malloc'd, whole (a desync report can exceed CCQ_DETAIL_LEN) */
    ccq_status last_status;
    char *last_detail; /* malloc'd or NULL */
} ccq_stream;

/* Set up a stream that has not been used yet, and free what it holds. */
void ccq_stream_init(ccq_stream *s, ccq_device_id device, ccq_stream_id id, uint32_t index);
void ccq_stream_fini(ccq_stream *s);

/* Argument checks shared by every call that names a device (one of this process's) or a
 * stream; the detail names the owner of another process's device. */
ccq_status ccq_check_device(const struct ccq_runtime *rt, const char *fn, ccq_device_id device);
ccq_status ccq_check_stream(const struct ccq_runtime *rt, const char *fn, ccq_device_id device,
                            ccq_stream_id stream);

/* ---- Producers (any thread) ---- */
/* The stream's slot ring, allocated (and the stream announced to the scheduler) on first
 * use; NULL when out of memory. */
struct ccq_cmd *ccq_stream_ring(struct ccq_runtime *rt, ccq_stream *s);
/* Reserve a ticket (a slot): one CAS when there is room; waits for room up to timeout_ms
 * unless submission is non-blocking. */
ccq_status ccq_stream_reserve(struct ccq_runtime *rt, ccq_stream *s, const char *fn,
                              uint64_t *ticket);
/* Shutdown: no ticket is handed out after this returns. */
void ccq_stream_close(ccq_stream *s);

/* ---- The scheduler ---- */
/* A command ended with an error: keep the first one for the next fence. */
void ccq_stream_record_error(ccq_stream *s, ccq_status st, const char *detail);
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
