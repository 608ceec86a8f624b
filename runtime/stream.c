/* The stream contract (see stream.h): slot ring and tickets on the producer side, `ended`
 * and error records from the scheduler, and the fence that waits on them. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ccq/ccq_nccl.h"
#include "runtime/internal.h"

void ccq_stream_init(ccq_stream *s, ccq_device_id device, ccq_stream_id id, uint32_t index)
{
    memset(s, 0, sizeof *s);
    ccq_mpsc_init(&s->q);
    atomic_init(&s->tickets, 0);
    atomic_init(&s->ring, NULL);
    atomic_init(&s->ended, 0);
    atomic_init(&s->errw, 0);
    atomic_init(&s->issued_ns, 0);
    atomic_init(&s->passed_pub, 0);
    atomic_init(&s->bound, NULL);
    atomic_init(&s->gw, NULL);
    ccq_signal_init(&s->ev);
    pthread_mutex_init(&s->err_lock, NULL);
    s->device = device;
    s->id = id;
    s->index = index;
}

void ccq_stream_fini(ccq_stream *s)
{
    free(atomic_load_explicit(&s->ring, memory_order_relaxed));
    free(s->err_detail);
    free(s->last_detail);
    for (uint32_t i = 0; i < s->nheld; i++)
        free(s->held_errs[i].detail);
    free(s->held_errs);
    for (uint32_t i = 0; s->hist != NULL && i < CCQ_FENCE_HISTORY; i++)
        free(s->hist[i].detail);
    free(s->hist);
    ccq_gw_free(s);
    pthread_mutex_destroy(&s->err_lock);
}

ccq_status ccq_check_device(const ccq_runtime *rt, const char *fn, ccq_device_id device)
{
    if (ccq_is_local(rt, device))
        return CCQ_OK;
    if (device >= rt->ndev_world)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "%s: device %u does not exist (%u devices)", fn,
                        device, rt->ndev_world);
    return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                    "%s: device %u belongs to process %u; this process (world rank %u) owns "
                    "devices %u..%u",
                    fn, device, ccq_world_owner(&rt->world, device), rt->world.rank, rt->dev_first,
                    rt->dev_first + rt->ndev - 1);
}

ccq_status ccq_check_stream_slow(const ccq_runtime *rt, const char *fn, ccq_device_id device,
                                 ccq_stream_id stream)
{
    ccq_status st = ccq_check_device(rt, fn, device);
    if (st != CCQ_OK)
        return st;
    if (stream >= rt->max_streams)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "%s: stream %u out of range (max_streams = %u)",
                        fn, stream, rt->max_streams);
    return CCQ_OK;
}

/* ------------------------------------------------------------------------------------ */
/* Producers                                                                             */
/* ------------------------------------------------------------------------------------ */

/* Allocate the stream's slot ring on first use and announce the stream to the scheduler.
 * Happens once per stream, not per command. */
ccq_cmd *ccq_stream_ring_alloc(ccq_runtime *rt, ccq_stream *s)
{
    ccq_cmd *ring, *expected = NULL;

    ring = ccq_alloc_lines((size_t)rt->ring_size * sizeof *ring);
    if (ring == NULL)
        return NULL;
    memset(ring, 0, (size_t)rt->ring_size * sizeof *ring);
    for (uint32_t i = 0; i < rt->ring_size; i++) {
        atomic_init(&ring[i].busy, 0);
        ring[i].slot = i;
    }
    if (!atomic_compare_exchange_strong_explicit(&s->ring, &expected, ring, memory_order_acq_rel,
                                                 memory_order_acquire)) {
        free(ring); /* another thread won the race */
        return expected;
    }
    /* The scheduler scans only streams it has been told about. */
    ccq_mpsc_push_mpsc(&rt->new_streams, &s->new_node);
    ccq_wake_signal(&rt->wake);
    return ring;
}

/* How long a fence waiter (or a producer waiting for room) polls before it sleeps: spin_us, but not
 * while the scheduler busy-polls an engine (see ccq_runtime.engine_polling): that wait is long
 * enough that a futex wake-up costs little, and the core is better left to the progress thread. */
static uint64_t fence_spin_ns(const ccq_runtime *rt)
{
    if (!rt->fence_spin_always &&
        atomic_load_explicit(&((ccq_runtime *)rt)->engine_polling, memory_order_relaxed))
        return 0;
    return rt->spin_ns;
}

/* ...and whether it gives its core away after its first step (CCQ_WAIT_HANDOFF): in a world of
 * several processes, where a submitting thread and its scheduler take turns on shared cores
 * (one 8-byte all_reduce then a fence, 2 x 1: the queue part 8 -> 3 us); in one process a
 * back-to-back fence only paid the system call (docs/performance.md, "A waiter's first
 * yield"). */
static unsigned fence_wait_flags(const ccq_runtime *rt)
{
    return rt->world.size > 1 ? CCQ_WAIT_HANDOFF : 0;
}

/*
 * A producer that finds its stream full sleeps until a quarter of the queue is free again
 * (room_slack), not one slot: woken at every ended command, a long chain of small operations
 * cost a futex wake-up for the scheduler and a context switch per submission (a quarter of all
 * CPU time of 4 processes on 2 cores; 1.35-4.1x the time per operation of a chain of 5000,
 * docs/performance.md). The sleep is capped at ROOM_NAP_NS, after which one free slot is
 * enough: a stream whose next commands can end only once this thread submitted elsewhere (a
 * few of them end now, the rest wait for its later submissions) still moves, as it did when one
 * slot woke the producer, at most ROOM_NAP_NS later. A producer that stays blocked (a stalled
 * peer) naps twice as long each time, up to ROOM_NAP_MAX_NS: a few wake-ups a second, not a
 * thousand.
 */
#define ROOM_NAP_NS     1000000u
#define ROOM_NAP_MAX_NS 64000000u

typedef struct room_wait {
    ccq_stream *s;
    uint32_t depth;
    uint32_t want; /* free slots to wait for: room_slack(depth), at least 1 */
} room_wait;

static uint32_t room_slack(uint32_t depth)
{
    return depth / 4 > 0 ? depth / 4 : 1;
}

/* The ended count at which w->want commands more fit (closing wakes with a plain notify). */
static uint64_t room_level(void *arg)
{
    room_wait *w = arg;
    uint64_t t = atomic_load_explicit(&w->s->tickets, memory_order_acquire) & ~CCQ_TICKET_CLOSED;
    return t + w->want > w->depth ? t + w->want - w->depth : 0;
}

static bool has_room_or_closed(void *arg)
{
    room_wait *w = arg;
    uint64_t t = atomic_load_explicit(&w->s->tickets, memory_order_acquire);
    uint64_t e = atomic_load_explicit(&w->s->ended, memory_order_acquire);
    return (t & CCQ_TICKET_CLOSED) || (t & ~CCQ_TICKET_CLOSED) - e + w->want <= w->depth;
}

ccq_status ccq_stream_reserve_slow(ccq_runtime *rt, ccq_stream *s, const char *fn, uint64_t *out)
{
    uint64_t t = atomic_load_explicit(&s->tickets, memory_order_relaxed);
    uint64_t deadline = 0, nap_ns = ROOM_NAP_NS;

    for (;;) {
        if (t & CCQ_TICKET_CLOSED)
            return ccq_fail(CCQ_ERR_SHUTDOWN, "%s: the runtime is shutting down", fn);
        uint64_t e = atomic_load_explicit(&s->ended, memory_order_acquire);
        if (t - e < rt->cfg.queue_depth) {
            if (atomic_compare_exchange_weak_explicit(&s->tickets, &t, t + 1, memory_order_acq_rel,
                                                      memory_order_relaxed)) {
                *out = t;
                return CCQ_OK;
            }
            continue;
        }
        if (ccq_tls_inside != 0) /* waiting for room would stall the scheduler that makes it */
            return ccq_fail(CCQ_ERR_QUEUE_FULL,
                            "%s: device %u stream %u has queue_depth = %u commands outstanding, "
                            "and a submission from inside an event callback never waits for "
                            "room",
                            fn, s->device, s->id, rt->cfg.queue_depth);
        if (rt->cfg.flags & CCQ_FLAG_NONBLOCKING_SUBMIT)
            return ccq_fail(CCQ_ERR_QUEUE_FULL,
                            "%s: device %u stream %u has queue_depth = %u commands outstanding", fn,
                            s->device, s->id, rt->cfg.queue_depth);
        uint64_t now = ccq_now_ns();
        if (deadline == 0)
            deadline = ccq_add_sat(now, rt->timeout_ns);
        else if (now >= deadline)
            return ccq_fail(CCQ_ERR_QUEUE_FULL,
                            "%s: device %u stream %u stayed full (queue_depth = %u) for "
                            "timeout_ms = %llu",
                            fn, s->device, s->id, rt->cfg.queue_depth,
                            (unsigned long long)rt->cfg.timeout_ms);
        room_wait w = {s, rt->cfg.queue_depth, room_slack(rt->cfg.queue_depth)};
        uint64_t nap = ccq_add_sat(now, nap_ns);
        /* Either way round again: one free slot takes a ticket, none waits on. */
        (void)ccq_signal_wait_level_flags(&s->ev, has_room_or_closed, room_level, &w,
                                          nap < deadline ? nap : deadline, fence_spin_ns(rt),
                                          fence_wait_flags(rt));
        nap_ns = nap_ns < ROOM_NAP_MAX_NS / 2 ? 2 * nap_ns : ROOM_NAP_MAX_NS;
        t = atomic_load_explicit(&s->tickets, memory_order_relaxed);
    }
}

void ccq_stream_close(ccq_stream *s)
{
    /* A submitter either got its ticket before this (and will push; the scheduler waits
     * for exactly those) or sees the closed bit. */
    atomic_fetch_or_explicit(&s->tickets, CCQ_TICKET_CLOSED, memory_order_acq_rel);
    /* Producers waiting for room must see the closed bit. */
    ccq_signal_notify(&s->ev);
}

/* ------------------------------------------------------------------------------------ */
/* The scheduler's side                                                                  */
/* ------------------------------------------------------------------------------------ */

void ccq_stream_record_error(ccq_stream *s, uint64_t pos, ccq_status st, const char *detail)
{
    pthread_mutex_lock(&s->err_lock);
    uint64_t w = atomic_load_explicit(&s->errw, memory_order_relaxed);
    if ((uint32_t)w == 0) {
        char *d = strdup(detail ? detail : "");
        free(s->err_detail);
        s->err_detail = d; /* NULL on no memory: reported as "" */
        s->err_pos = pos & CCQ_FENCE_TARGET_MASK;
        /* Release: `ended` is published after this, so a fence that sees the command ended
         * sees the flag (and reads err_pos and err_detail under the lock). */
        atomic_store_explicit(&s->errw, (w & ~0xffffffffull) | (uint32_t)st, memory_order_release);
    }
    pthread_mutex_unlock(&s->err_lock);
}

void ccq_stream_publish_ended(ccq_stream *s, uint64_t n)
{
    uint64_t e = atomic_load_explicit(&s->ended, memory_order_relaxed) + n;
    atomic_store_explicit(&s->ended, e, memory_order_release);
    /* Wakes only a waiter whose level (fence_level, room_level) this reaches. */
    ccq_signal_notify_level(&s->ev, e);
}

/* ------------------------------------------------------------------------------------ */
/* Fences                                                                                */
/* ------------------------------------------------------------------------------------ */

/*
 * The error rule (docs/semantics.md, "Fence values"). Commands end, and their errors are
 * recorded, in end order; a command's end position is how many ended before it. Time is
 * split into clear epochs: epoch k runs from the k-th error ccq_sync_collective reported
 * (and cleared) to the next, so every closed epoch has exactly one first error, the one
 * reported, and first errors have increasing positions. A value (e, t) covers positions
 * < t; the first error of the epochs >= e is epoch e's, so its answer is that error if its
 * position is < t, else no error. Epoch e's first error is the stream's current one while e
 * is current, and a record in s->hist once it is closed.
 */

typedef struct fence_wait {
    ccq_stream *s;
    uint64_t target; /* 48 bits */
} fence_wait;

/* Every command the value covers has ended. */
static bool fence_done(void *arg)
{
    fence_wait *w = arg;
    uint64_t e = atomic_load_explicit(&w->s->ended, memory_order_acquire);
    return !ccq_fence_before(e & CCQ_FENCE_TARGET_MASK, w->target);
}

/* The ended count fence_done waits for (targets are 48 bits; `ended` counts on). */
static uint64_t fence_level(void *arg)
{
    fence_wait *w = arg;
    uint64_t e = atomic_load_explicit(&w->s->ended, memory_order_acquire);
    uint64_t ahead = (w->target - e) & CCQ_FENCE_TARGET_MASK;
    return ccq_fence_before(e & CCQ_FENCE_TARGET_MASK, w->target) ? e + ahead : e;
}

static ccq_fence fence_make(uint64_t errw, uint64_t tickets)
{
    return ((errw >> 32) & 0xffffull) << CCQ_FENCE_TARGET_BITS |
           (tickets & ~CCQ_TICKET_CLOSED & CCQ_FENCE_TARGET_MASK);
}

/* The answer for a value whose covered commands all ended and whose epoch had an error or
 * is closed: under err_lock, which the scheduler holds while it records. */
static ccq_status fence_verdict(ccq_stream *s, const char *fn, ccq_fence f)
{
    uint32_t e = (uint32_t)(f >> CCQ_FENCE_TARGET_BITS);
    uint64_t t = f & CCQ_FENCE_TARGET_MASK;
    ccq_status st = CCQ_OK;

    pthread_mutex_lock(&s->err_lock);
    uint64_t w = atomic_load_explicit(&s->errw, memory_order_relaxed);
    uint32_t cur = (uint32_t)(w >> 32);
    uint32_t back = (uint16_t)(cur - e); /* clears since the value's epoch */
    if (back == 0) {
        if ((uint32_t)w != 0 && ccq_fence_before(s->err_pos, t)) {
            st = (ccq_status)(int32_t)(uint32_t)w;
            ccq_set_detail("%s", s->err_detail ? s->err_detail : "");
        }
    } else if (back <= CCQ_FENCE_HISTORY && s->hist != NULL &&
               s->hist[(cur - back) % CCQ_FENCE_HISTORY].epoch == cur - back &&
               s->hist[(cur - back) % CCQ_FENCE_HISTORY].status != CCQ_OK) {
        const ccq_err_record *r = &s->hist[(cur - back) % CCQ_FENCE_HISTORY];
        if (ccq_fence_before(r->pos, t)) {
            st = r->status;
            ccq_set_detail("%s", r->detail ? r->detail : "");
        }
    } else {
        st = ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                      "%s: device %u stream %u: fence value older than %u error reports "
                      "(ccq_sync_collective cleared %u errors since ccq_fence_begin), or not a "
                      "value of this stream",
                      fn, s->device, s->id, CCQ_FENCE_HISTORY, back);
    }
    pthread_mutex_unlock(&s->err_lock);
    return st;
}

/* The answer now, never blocking. Two atomic loads when nothing failed since the value's
 * epoch began. `hook`: on CCQ_OK, let the backend order a bound native stream after the
 * work (ccq_fence_wait, as ccq_sync_collective); ccq_fence_test skips it so polling stays
 * two loads (the work is complete on the device when it says CCQ_OK). */
static ccq_status fence_status(ccq_runtime *rt, ccq_stream *s, const char *fn, ccq_fence f,
                               bool hook)
{
    fence_wait w = {s, f & CCQ_FENCE_TARGET_MASK};

    /* `ended` first: the scheduler records an error before it publishes `ended` past it,
     * so once the covered commands are seen ended, errw shows their errors (or a clear). */
    if (!fence_done(&w)) {
        uint64_t k = atomic_load_explicit(&s->tickets, memory_order_acquire) & ~CCQ_TICKET_CLOSED;
        if (ccq_fence_before(k & CCQ_FENCE_TARGET_MASK, w.target))
            return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                            "%s: device %u stream %u: fence value covers %llu commands, more "
                            "than were ever submitted (%llu): not a value of this stream",
                            fn, s->device, s->id, (unsigned long long)w.target,
                            (unsigned long long)k);
        /* Errors are reported only once every covered command ended, so the user's buffers
         * are free when any answer but CCQ_IN_PROGRESS comes back. */
        return CCQ_IN_PROGRESS;
    }
    uint64_t ew = atomic_load_explicit(&s->errw, memory_order_acquire);
    ccq_status st = CCQ_OK;
    if ((uint16_t)(ew >> 32) != (uint16_t)(f >> CCQ_FENCE_TARGET_BITS) || (uint32_t)ew != 0)
        st = fence_verdict(s, fn, f);
    if (st == CCQ_OK && hook && rt->be_ops->fence != NULL)
        rt->be_ops->fence(rt->be, s->index);
    return st;
}

static ccq_status fence_args(ccq_runtime *rt, const char *fn, ccq_device_id device,
                             ccq_stream_id stream, ccq_stream **out)
{
    if (rt == NULL)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "%s: rt is NULL", fn);
    ccq_status st = ccq_check_stream(rt, fn, device, stream);
    if (st != CCQ_OK)
        return st;
    *out = ccq_stream_at(rt, device, stream);
    return CCQ_OK;
}

CCQ_API ccq_status ccq_fence_begin(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                                   ccq_fence *out)
{
    ccq_stream *s = NULL;
    ccq_status st;

    ccq_clear_detail();
    if (out == NULL)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_fence_begin: out is NULL");
    st = fence_args(rt, "ccq_fence_begin", device, stream, &s);
    if (st != CCQ_OK)
        return st;
    /* The epoch first: a clear between the two loads leaves the value in the older epoch,
     * whose record the history keeps, so the error that clear reported is still seen. */
    uint64_t ew = atomic_load_explicit(&s->errw, memory_order_acquire);
    /* Every command whose submission returned before this load has a smaller ticket, and
     * commands end in stream order, so `ended` reaching the ticket count covers them. */
    *out = fence_make(ew, atomic_load_explicit(&s->tickets, memory_order_acquire));
    return CCQ_OK;
}

CCQ_API ccq_status ccq_fence_test(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                                  ccq_fence f)
{
    ccq_stream *s = NULL;
    ccq_status st;

    ccq_clear_detail();
    st = fence_args(rt, "ccq_fence_test", device, stream, &s);
    if (st != CCQ_OK)
        return st;
    return fence_status(rt, s, "ccq_fence_test", f, false);
}

CCQ_API ccq_status ccq_fence_wait(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                                  ccq_fence f, uint64_t timeout_ms)
{
    ccq_stream *s = NULL;
    ccq_status st;

    ccq_clear_detail();
    if (ccq_tls_inside != 0) /* an event callback: it would wait for its own scheduler */
        return ccq_refuse_inside("ccq_fence_wait");
    st = fence_args(rt, "ccq_fence_wait", device, stream, &s);
    if (st != CCQ_OK)
        return st;
    fence_wait w = {s, f & CCQ_FENCE_TARGET_MASK};
    if (!fence_done(&w)) {
        uint64_t ns = timeout_ms == 0                      ? rt->timeout_ns
                      : timeout_ms > UINT64_MAX / 1000000u ? UINT64_MAX
                                                           : timeout_ms * 1000000u;
        uint64_t deadline = ccq_deadline_in(ns);
        st = fence_status(rt, s, "ccq_fence_wait", f, false); /* arguments, before sleeping */
        if (st != CCQ_IN_PROGRESS)
            return st;
        if (!ccq_signal_wait_level_flags(&s->ev, fence_done, fence_level, &w, deadline,
                                         fence_spin_ns(rt), fence_wait_flags(rt))) {
            uint64_t e = atomic_load_explicit(&s->ended, memory_order_acquire);
            return ccq_fail(CCQ_IN_PROGRESS,
                            "ccq_fence_wait: device %u stream %u: %llu of the commands it "
                            "covers still pending after %llu ms",
                            device, stream,
                            (unsigned long long)((w.target - e) & CCQ_FENCE_TARGET_MASK),
                            (unsigned long long)(timeout_ms ? timeout_ms : rt->cfg.timeout_ms));
        }
    }
    return fence_status(rt, s, "ccq_fence_wait", f, true);
}

static ccq_status sync_collective(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream);

static void fence_event(ccq_runtime *rt, uint32_t type, ccq_device_id device, ccq_stream_id stream,
                        ccq_status st)
{
    ccq_event ev;
    memset(&ev, 0, sizeof ev);
    ev.time_ns = ccq_now_ns();
    ev.type = type;
    ev.thread = ccq_thread_id();
    ev.device = device;
    ev.stream = stream;
    ev.status = st;
    ccq_trace_rec_fence(&rt->trace, &ev);
}

CCQ_API ccq_status ccq_sync_collective(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream)
{
    ccq_status st;
    if (ccq_tls_inside != 0) { /* before the fence events: a fence callback would recurse */
        ccq_clear_detail();
        return ccq_refuse_inside("ccq_sync_collective");
    }
    bool traced = rt != NULL && ccq_is_local(rt, device) && stream < rt->max_streams &&
                  ccq_trace_on(&rt->trace);
    if (traced)
        fence_event(rt, CCQ_EV_FENCE_BEGIN, device, stream, CCQ_OK);
    st = sync_collective(rt, device, stream);
    if (traced)
        fence_event(rt, CCQ_EV_FENCE_END, device, stream, st);
    return st;
}

/* Report the current epoch's first error and close the epoch: its record goes to the
 * history, for values begun in it. */
static ccq_status report_and_clear(ccq_stream *s)
{
    ccq_status err = CCQ_OK;

    pthread_mutex_lock(&s->err_lock);
    uint64_t w = atomic_load_explicit(&s->errw, memory_order_relaxed);
    if ((uint32_t)w != 0) {
        uint32_t epoch = (uint32_t)(w >> 32);
        err = (ccq_status)(int32_t)(uint32_t)w;
        ccq_set_detail("%s", s->err_detail ? s->err_detail : "");
        s->last_status = err;
        if (s->hist == NULL) /* the first clear of this stream; without memory, values of the
                                closed epoch get CCQ_ERR_INVALID_ARGUMENT */
            s->hist = calloc(CCQ_FENCE_HISTORY, sizeof *s->hist);
        if (s->hist != NULL) {
            ccq_err_record *r = &s->hist[epoch % CCQ_FENCE_HISTORY];
            r->epoch = epoch;
            r->status = err;
            r->pos = s->err_pos;
            free(r->detail);
            r->detail = s->err_detail ? strdup(s->err_detail) : NULL; /* NULL: "" */
        }
        free(s->last_detail);
        s->last_detail = s->err_detail;
        s->err_detail = NULL;
        atomic_store_explicit(&s->errw, (uint64_t)(epoch + 1) << 32, memory_order_release);
    }
    pthread_mutex_unlock(&s->err_lock);
    return err;
}

/* How long a fence that times out waits for the dump it asks for. */
#define CCQ_FENCE_DUMP_NS 2000000000ull

/* Begin + wait (with the watchdog's grace) + report-then-clear. */
static ccq_status sync_collective(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream)
{
    ccq_stream *s = NULL;
    ccq_fence f;
    ccq_status st;
    uint64_t deadline = UINT64_MAX;

    ccq_clear_detail();
    st = fence_args(rt, "ccq_sync_collective", device, stream, &s);
    if (st != CCQ_OK)
        return st;
    f = fence_make(atomic_load_explicit(&s->errw, memory_order_acquire),
                   atomic_load_explicit(&s->tickets, memory_order_acquire));
    fence_wait w = {s, f & CCQ_FENCE_TARGET_MASK};
    if (!fence_done(&w)) {
        /* A grace beyond timeout_ms lets the watchdog, which fires at the same deadline for
         * the oldest queued command, report why instead of a bare timeout. */
        uint64_t grace =
            rt->timeout_ns / 4 < 250000000ull ? rt->timeout_ns / 4 + 50000000ull : 300000000ull;
        deadline = ccq_deadline_in(ccq_add_sat(rt->timeout_ns, grace));
        bool ok = ccq_signal_wait_level_flags(&s->ev, fence_done, fence_level, &w, deadline,
                                              fence_spin_ns(rt), fence_wait_flags(rt));
        /* Issued work is aborted timeout_ms after it was issued, which can be later than
         * this fence's deadline: wait for that verdict rather than report a bare timeout. */
        uint64_t issued = atomic_load_explicit(&s->issued_ns, memory_order_acquire);
        uint64_t verdict = ccq_add_sat(issued, ccq_add_sat(rt->timeout_ns, grace));
        if (!ok && issued != 0 && deadline != UINT64_MAX && verdict > deadline)
            ok = ccq_signal_wait_level(&s->ev, fence_done, fence_level, &w, verdict, 0);
        if (!ok && (uint32_t)atomic_load_explicit(&s->errw, memory_order_acquire) == 0) {
            /* A failure of this fence's own: with trace_file set, the dump is on disk before
             * it is reported (a user prints the error and exits), bounded by CCQ_FENCE_DUMP_NS
             * (a scheduler stuck in a call never writes it). */
            ccq_trace_request_dump(rt, ccq_deadline_in(CCQ_FENCE_DUMP_NS));
        }
        if (!ok) {
            uint64_t e = atomic_load_explicit(&s->ended, memory_order_acquire);
            if ((uint32_t)atomic_load_explicit(&s->errw, memory_order_acquire) == 0)
                return ccq_fail(CCQ_ERR_TIMEOUT,
                                "ccq_sync_collective: device %u stream %u: %llu of the "
                                "commands it covers still pending after timeout_ms = %llu",
                                device, stream,
                                (unsigned long long)((w.target - e) & CCQ_FENCE_TARGET_MASK),
                                (unsigned long long)rt->cfg.timeout_ms);
        }
    }
    /* As before fence values: the first error recorded since the previous clear, whatever
     * its position (also one of a command submitted after this call began). */
    if ((uint32_t)atomic_load_explicit(&s->errw, memory_order_acquire) == 0) {
        if (rt->be_ops->fence != NULL)
            rt->be_ops->fence(rt->be, s->index);
        return CCQ_OK;
    }
    st = report_and_clear(s);
    if (st == CCQ_OK && rt->be_ops->fence != NULL)
        rt->be_ops->fence(rt->be, s->index);
    return st;
}

CCQ_API ccq_status ccq_stream_last_error(ccq_runtime *rt, ccq_device_id device,
                                         ccq_stream_id stream, char *buf, size_t len)
{
    ccq_stream *s;
    ccq_status st;

    if (rt == NULL)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_stream_last_error: rt is NULL");
    st = ccq_check_stream(rt, "ccq_stream_last_error", device, stream);
    if (st != CCQ_OK)
        return st;
    if (buf == NULL && len > 0)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_stream_last_error: buf is NULL");
    s = ccq_stream_at(rt, device, stream);
    pthread_mutex_lock(&s->err_lock);
    st = s->last_status;
    if (len > 0) {
        const char *d = s->last_detail ? s->last_detail : "";
        if ((size_t)snprintf(buf, len, "%s", d) >= len)
            ccq_mark_truncated(buf, len);
    }
    pthread_mutex_unlock(&s->err_lock);
    return st;
}

/* ------------------------------------------------------------------------------------ */
/* GPU-side waits                                                                        */
/* ------------------------------------------------------------------------------------ */

CCQ_API ccq_status ccq_nccl_stream_wait(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                                        struct CUstream_st *cuda_stream)
{
    ccq_errbuf err = {{0}};
    ccq_stream *s = NULL;
    ccq_status st;

    ccq_clear_detail();
    st = fence_args(rt, "ccq_nccl_stream_wait", device, stream, &s);
    if (st != CCQ_OK)
        return st;
    if (strcmp(rt->be_ops->name, "nccl") != 0 || rt->be_ops->stream_wait == NULL)
        return ccq_fail(CCQ_ERR_UNSUPPORTED,
                        "ccq_nccl_stream_wait: the runtime's backend is \"%s\", not \"nccl\"; "
                        "use ccq_sync_collective or ccq_fence_wait",
                        rt->be_ops->name);
    if (cuda_stream == NULL)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "ccq_nccl_stream_wait: cuda_stream is NULL (the legacy default stream "
                        "cannot be a wait's target here; pass a stream you created)");
    /* As ccq_fence_begin: every command whose submission returned before this load. */
    uint64_t target = atomic_load_explicit(&s->tickets, memory_order_acquire) & ~CCQ_TICKET_CLOSED;
    /* Commands submitted after this on a stream bound to cuda_stream must not run with (or
     * before) the ones the wait covers: a barrier, before the wait is queued. */
    st = ccq_gw_before_wait(rt, s, cuda_stream, target, "ccq_nccl_stream_wait");
    if (st != CCQ_OK)
        return st;
    /* The backend's own device, as every other hook gets (in any process but the first of
     * a world the global id is past the end of its tables). */
    st = rt->be_ops->stream_wait(rt->be, ccq_backend_device(rt, device), s->index, cuda_stream,
                                 target, &s->ended, &err);
    if (st != CCQ_OK)
        return ccq_fail(st, "ccq_nccl_stream_wait: %s", err.msg);
    return CCQ_OK;
}
