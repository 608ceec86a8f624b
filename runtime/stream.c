/* The stream contract (see stream.h): slot ring and tickets on the producer side, `ended`
 * and error records from the scheduler, and the fence that waits on them. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/internal.h"

void ccq_stream_init(ccq_stream *s, ccq_device_id device, ccq_stream_id id, uint32_t index)
{
    memset(s, 0, sizeof *s);
    ccq_mpsc_init(&s->q);
    atomic_init(&s->tickets, 0);
    atomic_init(&s->ring, NULL);
    atomic_init(&s->ended, 0);
    atomic_init(&s->err_status, 0);
    atomic_init(&s->issued_ns, 0);
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

ccq_status ccq_check_stream(const ccq_runtime *rt, const char *fn, ccq_device_id device,
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
ccq_cmd *ccq_stream_ring(ccq_runtime *rt, ccq_stream *s)
{
    ccq_cmd *ring = atomic_load_explicit(&s->ring, memory_order_acquire);
    ccq_cmd *expected = NULL;

    if (ring != NULL)
        return ring;
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

typedef struct room_wait {
    ccq_stream *s;
    uint32_t depth;
} room_wait;

static bool has_room_or_closed(void *arg)
{
    room_wait *w = arg;
    uint64_t t = atomic_load_explicit(&w->s->tickets, memory_order_acquire);
    uint64_t e = atomic_load_explicit(&w->s->ended, memory_order_acquire);
    return (t & CCQ_TICKET_CLOSED) || (t & ~CCQ_TICKET_CLOSED) - e < w->depth;
}

ccq_status ccq_stream_reserve(ccq_runtime *rt, ccq_stream *s, const char *fn, uint64_t *out)
{
    uint64_t t = atomic_load_explicit(&s->tickets, memory_order_relaxed);
    uint64_t deadline = 0;

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
        if (deadline == 0)
            deadline = ccq_deadline_in(rt->timeout_ns);
        room_wait w = {s, rt->cfg.queue_depth};
        if (!ccq_signal_wait_spin(&s->ev, has_room_or_closed, &w, deadline, rt->spin_ns))
            return ccq_fail(CCQ_ERR_QUEUE_FULL,
                            "%s: device %u stream %u stayed full (queue_depth = %u) for "
                            "timeout_ms = %llu",
                            fn, s->device, s->id, rt->cfg.queue_depth,
                            (unsigned long long)rt->cfg.timeout_ms);
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

void ccq_stream_record_error(ccq_stream *s, ccq_status st, const char *detail)
{
    pthread_mutex_lock(&s->err_lock);
    if (atomic_load_explicit(&s->err_status, memory_order_relaxed) == 0) {
        char *d = strdup(detail ? detail : "");
        free(s->err_detail);
        s->err_detail = d; /* NULL on no memory: reported as "" */
        atomic_store_explicit(&s->err_status, (int)st, memory_order_release);
    }
    pthread_mutex_unlock(&s->err_lock);
}

void ccq_stream_publish_ended(ccq_stream *s, uint64_t n)
{
    atomic_store_explicit(&s->ended, atomic_load_explicit(&s->ended, memory_order_relaxed) + n,
                          memory_order_release);
    ccq_signal_notify(&s->ev);
}

/* ------------------------------------------------------------------------------------ */
/* Fences                                                                                */
/* ------------------------------------------------------------------------------------ */

typedef struct fence_wait {
    ccq_stream *s;
    uint64_t target;
} fence_wait;

static bool fence_done(void *arg)
{
    fence_wait *w = arg;
    return atomic_load_explicit(&w->s->ended, memory_order_acquire) >= w->target;
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

static ccq_status sync_collective(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream)
{
    ccq_stream *s;
    fence_wait w;
    ccq_status st;
    uint64_t deadline = UINT64_MAX;
    int err;

    ccq_clear_detail();
    if (rt == NULL)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_sync_collective: rt is NULL");
    st = ccq_check_stream(rt, "ccq_sync_collective", device, stream);
    if (st != CCQ_OK)
        return st;
    s = ccq_stream_at(rt, device, stream);
    w.s = s;
    /* Every command whose submission returned before this load has a smaller ticket, and
     * commands end in stream order, so `ended` reaching the ticket count covers them. */
    w.target = atomic_load_explicit(&s->tickets, memory_order_acquire) & ~CCQ_TICKET_CLOSED;
    if (!fence_done(&w)) {
        /* A grace beyond timeout_ms lets the watchdog, which fires at the same deadline for
         * the oldest queued command, report why instead of a bare timeout. */
        uint64_t grace =
            rt->timeout_ns / 4 < 250000000ull ? rt->timeout_ns / 4 + 50000000ull : 300000000ull;
        deadline = ccq_deadline_in(ccq_add_sat(rt->timeout_ns, grace));
        bool ok = ccq_signal_wait_spin(&s->ev, fence_done, &w, deadline, rt->spin_ns);
        /* Issued work is aborted timeout_ms after it was issued, which can be later than
         * this fence's deadline: wait for that verdict rather than report a bare timeout. */
        uint64_t issued = atomic_load_explicit(&s->issued_ns, memory_order_acquire);
        uint64_t verdict = ccq_add_sat(issued, ccq_add_sat(rt->timeout_ns, grace));
        if (!ok && issued != 0 && deadline != UINT64_MAX && verdict > deadline)
            ok = ccq_signal_wait_spin(&s->ev, fence_done, &w, verdict, 0);
        if (!ok) {
            uint64_t e = atomic_load_explicit(&s->ended, memory_order_acquire);
            if (atomic_load_explicit(&s->err_status, memory_order_acquire) == 0)
                return ccq_fail(CCQ_ERR_TIMEOUT,
                                "ccq_sync_collective: device %u stream %u: %llu of the "
                                "commands it covers still pending after timeout_ms = %llu",
                                device, stream, (unsigned long long)(w.target - e),
                                (unsigned long long)rt->cfg.timeout_ms);
        }
    }
    err = atomic_load_explicit(&s->err_status, memory_order_acquire);
    if (err == 0) {
        if (rt->be_ops->fence != NULL)
            rt->be_ops->fence(rt->be, s->index);
        return CCQ_OK;
    }
    pthread_mutex_lock(&s->err_lock);
    err = atomic_load_explicit(&s->err_status, memory_order_relaxed);
    if (err != 0) {
        ccq_set_detail("%s", s->err_detail ? s->err_detail : "");
        s->last_status = (ccq_status)err;
        free(s->last_detail);
        s->last_detail = s->err_detail;
        s->err_detail = NULL;
        atomic_store_explicit(&s->err_status, 0, memory_order_relaxed);
    }
    pthread_mutex_unlock(&s->err_lock);
    return (ccq_status)err;
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
