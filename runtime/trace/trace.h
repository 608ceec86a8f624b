/* The flight recorder and live metrics (internal; the public API is in ccq.h). */
#ifndef CCQ_RUNTIME_TRACE_H
#define CCQ_RUNTIME_TRACE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ccq.h"
#include "queue/wake.h"
#include "runtime/trace/compat.h"
#include "runtime/trace/view.h"

/* Log2 histogram with 4 sub-buckets per power of two (values in ns): percentiles within a
 * factor of 2^(1/4). One writer (the scheduler), any number of readers. */
#define CCQ_HIST_BUCKETS 256
typedef struct ccq_hist {
    _Atomic uint64_t b[CCQ_HIST_BUCKETS];
} ccq_hist;

void ccq_hist_add(ccq_hist *h, uint64_t ns);
double ccq_hist_percentile_us(const ccq_hist *h, double p);

#define CCQ_TRACE_NOTES 64

typedef struct ccq_trace_cb {
    ccq_event_fn fn;
    ccq_event_fn_v0_1 fn_v0_1; /* set instead of fn by 0.1.0's entry point (trace/compat.c) */
    void *user;
    struct ccq_trace_cb *prev; /* replaced callbacks, freed at destroy (a reader may hold one) */
} ccq_trace_cb;

typedef struct ccq_trace {
    /* The scheduler's ring. Only the scheduler touches it while it runs, so it needs no
     * atomics; other threads get copies through a snapshot request that the scheduler
     * answers between passes (see ccq_trace_serve). */
    uint32_t cap; /* power of two; 0 = recorder disabled */
    ccq_event *ring;
    uint64_t head;             /* events recorded (scheduler only) */
    _Atomic uint64_t head_pub; /* a copy for metrics readers */

    /* Fence events come from user threads; fences are slow paths, so a mutex is fine. */
    pthread_mutex_t fence_lock;
    uint32_t fcap;
    ccq_event *fring;
    uint64_t fhead;

    /* Snapshot requests: one at a time (req_lock); the scheduler copies its ring. */
    pthread_mutex_t req_lock;
    _Atomic uint32_t req_state; /* 0 idle, 1 asked, 2 answered */
    ccq_event *req_buf;
    size_t req_cap, req_n;
    ccq_signal req_sig;

    ccq_trace_cb *_Atomic cb;
    pthread_mutex_t cb_lock; /* serialises ccq_set_event_callback */

    /* Notes: the text of recent errors (watchdog desync reports, aborts, mismatches, backend
     * failures), exported with the trace. Rare, so a mutex guards them. */
    pthread_mutex_t note_lock;
    ccq_note notes[CCQ_TRACE_NOTES];
    uint64_t nhead;

    /* Automatic dumps (trace_file): at destroy; by the scheduler in every pass that ends
     * failed commands, before it publishes them; for a fence about to report its own timeout
     * (dump_asked > dump_done: the scheduler writes it, dump_sig says when). */
    char *file;
    _Atomic uint64_t dump_asked, dump_done;
    ccq_signal dump_sig;

    /* Metrics (scheduler writes, anyone reads). */
    uint64_t start_ns;
    ccq_hist queue_ns, run_ns;
    _Atomic uint64_t rate_bits;        /* double: commands/s over the last full second */
    _Atomic uint64_t rate_t0, rate_n0; /* start of the current window (scheduler writes) */
} ccq_trace;

struct ccq_runtime;

int ccq_trace_init(ccq_trace *t, uint32_t capacity, const char *file);
void ccq_trace_fini(ccq_trace *t);

/* Every event the library records or hands to a callback goes through rec, commit or
 * rec_fence, which set its struct_size to sizeof(ccq_event). */

/* Record an event (scheduler thread only) and hand it to the callback. */
void ccq_trace_rec(ccq_trace *t, const ccq_event *ev);

/* The same in two steps, so the scheduler fills the ring slot in place (one write of the
 * event instead of build + copy): slot() returns the next ring slot, or `tmp` when the
 * recorder is off; fill every field, then commit(). Scheduler thread only. */
static inline ccq_event *ccq_trace_slot(ccq_trace *t, ccq_event *tmp)
{
    return t->cap != 0 ? &t->ring[t->head & (t->cap - 1)] : tmp;
}
void ccq_trace_commit(ccq_trace *t, ccq_event *ev);
/* Make the scheduler's ring writes (streaming stores) visible to other threads. */
void ccq_trace_fence_writes(void);
/* Record a fence event (any thread). */
void ccq_trace_rec_fence(ccq_trace *t, const ccq_event *ev);
/* Whether recording does anything (recorder on or a callback set): lets hot paths skip
 * building events. */
static inline bool ccq_trace_on(ccq_trace *t)
{
    return t->cap != 0 || atomic_load_explicit(&t->cb, memory_order_relaxed) != NULL;
}

/* Install a callback (fn, or 0.1.0's fn_v0_1; both NULL clears it). Any thread. CCQ_OK or
 * CCQ_ERR_NO_MEMORY (with its detail). */
ccq_status ccq_trace_set_callback(ccq_trace *t, ccq_event_fn fn, ccq_event_fn_v0_1 fn_v0_1,
                                  void *user);

/* Keep the text of an error for the trace (any thread; cheap enough for rare events). */
void ccq_trace_note(ccq_trace *t, uint32_t type, const char *text);

/* Scheduler side: answer a pending snapshot request; true if one was pending. */
bool ccq_trace_serve(ccq_trace *t);
static inline bool ccq_trace_requested(ccq_trace *t)
{
    return atomic_load_explicit(&t->req_state, memory_order_acquire) == 1;
}
/* Copy both rings, oldest first (sorted by time). Only the scheduler may call it while it
 * runs (other threads ask it through ccq_trace_snapshot); anyone may once it has exited. */
size_t ccq_trace_copy(ccq_trace *t, ccq_event *out, size_t cap, uint64_t *dropped);

/* The size of ccq_event in 0.2.0, the first layout with struct_size: the smallest element
 * size ccq_trace_snapshot accepts. Fixed forever; later layouts only append. */
#define CCQ_EVENT_SIZE_0_2 88u

/* Copy n events into an array of elements of `elem_size` bytes (CCQ_EVENT_SIZE_0_2 ..
 * sizeof(ccq_event), a multiple of ccq_event's alignment): the first elem_size bytes of
 * each, with struct_size = elem_size. */
void ccq_events_copy_out(void *out, size_t elem_size, const ccq_event *ev, size_t n);

/* Scheduler side: when the next rate tick is due (UINT64_MAX: none needed). */
uint64_t ccq_trace_next_tick(ccq_trace *t, uint64_t ended);
/* Scheduler side: update the commands/s rate once a second. */
void ccq_trace_tick(ccq_trace *t, uint64_t now, uint64_t ended);

/* ---- dumps to trace_file (runtime/trace/recorder.c) and on SIGUSR1 (runtime/trace/signal.c) ----
 */

/* trace_file as a path for this process: "%r" becomes the world rank, "%p" the pid, "%%" a
 * "%"; without "%r", a world of several processes gets ".rank<R>" before the file name's
 * extension ("/tmp/t.json" -> "/tmp/t.rank3.json"), so processes never write one file.
 * Writes at most len bytes with the NUL; returns the length the whole path needs (>= len:
 * truncated). */
size_t ccq_trace_expand_path(char *out, size_t len, const char *tmpl, uint32_t rank, uint32_t size,
                             long pid);

/* Write trace_file (expanded) now, with `reason` in its header ("destroy", "error",
 * "signal"); failures go to stderr. Any thread (the scheduler's too: ccq_trace_autodump). */
void ccq_trace_dump_to_file(struct ccq_runtime *rt, const char *reason);

/* A fence about to report a failure of its own (its timeout): ask the scheduler to write
 * trace_file and wait until it did, the scheduler exited, or deadline_ns (the scheduler may
 * be stuck: the wait is bounded). Nothing when no trace_file is set. Not on the scheduler. */
void ccq_trace_request_dump(struct ccq_runtime *rt, uint64_t deadline_ns);
static inline bool ccq_trace_dump_requested(ccq_trace *t)
{
    return atomic_load_explicit(&t->dump_asked, memory_order_acquire) !=
           atomic_load_explicit(&t->dump_done, memory_order_relaxed);
}
/* Scheduler side: write the requested dump; true if one was asked for. */
bool ccq_trace_serve_dump(struct ccq_runtime *rt);

/* Once the scheduler runs (ccq_runtime_create): register the runtime for SIGUSR1 dumps if it
 * has a trace_file, and, if wants_signal (ccq_config.trace_signal), make sure the handler
 * is installed and the dump thread runs. CCQ_OK, or an error with its detail (no pipe, no
 * thread, sigaction refused). Undone by ccq_trace_fini (ccq_trace_detach). */
ccq_status ccq_trace_attach(struct ccq_runtime *rt, bool wants_signal);
void ccq_trace_detach(ccq_trace *t);
/* How many SIGUSR1 requests the dump thread has served in this process (tests). */
unsigned long ccq_trace_signal_dumps(void);

/* The calling thread's id (Linux tid), cached per thread. */
uint32_t ccq_thread_id(void);

#endif /* CCQ_RUNTIME_TRACE_H */
