/* GPU-side waits and batching: the barriers ccq_nccl_stream_wait leaves on bound streams
 * (see gpu_wait.h for why). */
#include <stdlib.h>
#include <string.h>

#include "runtime/internal.h"

/* Raise an atomic counter to v (several threads advance a log's tail). */
static void store_max(_Atomic uint64_t *a, uint64_t v)
{
    uint64_t cur = atomic_load_explicit(a, memory_order_acquire);
    while (cur < v && !atomic_compare_exchange_weak_explicit(a, &cur, v, memory_order_acq_rel,
                                                             memory_order_acquire))
        ;
}

ccq_status ccq_gw_bind(ccq_runtime *rt, ccq_stream *s, void *native)
{
    if (native != NULL && atomic_load_explicit(&s->gw, memory_order_acquire) == NULL) {
        pthread_mutex_lock(&rt->bound_lock);
        if (atomic_load_explicit(&s->gw, memory_order_relaxed) == NULL) {
            ccq_gw_log *g = calloc(1, sizeof *g);
            /* Room for a barrier per command outstanding on two streams: unsatisfied ones
             * cover commands not issued yet, one per distinct ticket of each stream waited on
             * (gw_append skips a barrier an earlier one implies). */
            uint32_t cap = rt->ring_size * 2 < 64 ? 64 : rt->ring_size * 2;
            if (g == NULL || (g->e = calloc(cap, sizeof *g->e)) == NULL) {
                free(g);
                pthread_mutex_unlock(&rt->bound_lock);
                return ccq_fail(CCQ_ERR_NO_MEMORY, "ccq_nccl_bind_stream: out of memory");
            }
            g->cap = cap;
            pthread_mutex_init(&g->lock, NULL);
            atomic_init(&g->head, 0);
            atomic_init(&g->tail, 0);
            atomic_store_explicit(&s->gw, g, memory_order_release);
            s->bound_next = atomic_load_explicit(&rt->bound_head, memory_order_relaxed);
            atomic_store_explicit(&rt->bound_head, s, memory_order_release);
        }
        pthread_mutex_unlock(&rt->bound_lock);
    }
    atomic_store_explicit(&s->bound, native, memory_order_seq_cst);
    return CCQ_OK;
}

/* Whether barrier e is satisfied, as producers can tell (the published counts). */
static bool entry_done_pub(ccq_runtime *rt, const ccq_gw_entry *e)
{
    uint32_t xi = atomic_load_explicit(&e->stream, memory_order_relaxed);
    uint64_t t = atomic_load_explicit(&e->target, memory_order_relaxed);
    uint32_t n = rt->ndev * rt->max_streams;
    return xi < n && atomic_load_explicit(&rt->streams[xi].passed_pub, memory_order_acquire) >= t;
}

/* Add barrier (xi, target) to g, under g->lock. False when full. */
static bool gw_append(ccq_runtime *rt, ccq_gw_log *g, uint32_t xi, uint64_t target)
{
    uint64_t head = atomic_load_explicit(&g->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&g->tail, memory_order_acquire);
    /* Drop satisfied barriers at the front (also for streams nobody submits on). */
    while (tail < head && entry_done_pub(rt, &g->e[tail & (g->cap - 1)]))
        tail++;
    store_max(&g->tail, tail);
    tail = atomic_load_explicit(&g->tail, memory_order_acquire);
    /* An unsatisfied barrier on the same stream as far or farther implies this one for every
     * command that will see it. */
    for (uint64_t i = tail; i < head; i++) {
        const ccq_gw_entry *e = &g->e[i & (g->cap - 1)];
        if (atomic_load_explicit(&e->stream, memory_order_relaxed) == xi &&
            atomic_load_explicit(&e->target, memory_order_relaxed) >= target)
            return true;
    }
    if (head - tail >= g->cap)
        return false;
    ccq_gw_entry *e = &g->e[head & (g->cap - 1)];
    atomic_store_explicit(&e->stream, xi, memory_order_relaxed);
    atomic_store_explicit(&e->target, target, memory_order_relaxed);
    atomic_store_explicit(&g->head, head + 1, memory_order_seq_cst);
    return true;
}

ccq_status ccq_gw_before_wait(ccq_runtime *rt, ccq_stream *x, void *native, uint64_t target,
                              const char *fn)
{
    if (atomic_load_explicit(&x->passed_pub, memory_order_acquire) >= target)
        return CCQ_OK; /* every covered command is issued already */
    for (ccq_stream *y = atomic_load_explicit(&rt->bound_head, memory_order_acquire); y != NULL;
         y = y->bound_next) {
        if (atomic_load_explicit(&y->bound, memory_order_seq_cst) != native)
            continue;
        ccq_gw_log *g = atomic_load_explicit(&y->gw, memory_order_acquire);
        pthread_mutex_lock(&g->lock);
        bool ok = gw_append(rt, g, x->index, target);
        pthread_mutex_unlock(&g->lock);
        if (!ok)
            return ccq_fail(CCQ_ERR_QUEUE_FULL,
                            "%s: the CUDA stream is bound to device %u stream %u, which already "
                            "holds %u GPU-side waits for commands that are not issued yet; fence "
                            "on the host (ccq_fence_wait) or let those commands run first",
                            fn, y->device, y->id, g->cap);
    }
    return CCQ_OK;
}

uint64_t ccq_gw_mark(ccq_stream *s)
{
    ccq_gw_log *g = atomic_load_explicit(&s->gw, memory_order_acquire);
    return g != NULL ? atomic_load_explicit(&g->head, memory_order_seq_cst) : 0;
}

bool ccq_gw_clear(ccq_runtime *rt, ccq_stream *s, uint64_t mark)
{
    ccq_gw_log *g = atomic_load_explicit(&s->gw, memory_order_acquire);
    uint32_t n = rt->ndev * rt->max_streams;
    uint64_t tail, i;
    if (g == NULL)
        return true;
    tail = atomic_load_explicit(&g->tail, memory_order_acquire);
    for (i = tail; i < mark; i++) {
        const ccq_gw_entry *e = &g->e[i & (g->cap - 1)];
        uint32_t xi = atomic_load_explicit(&e->stream, memory_order_relaxed);
        /* The scheduler's own count: commands issued in earlier batches, or ended. */
        if (xi >= n ||
            rt->streams[xi].passed < atomic_load_explicit(&e->target, memory_order_relaxed))
            break;
    }
    if (i > tail)
        store_max(&g->tail, i);
    return i >= mark;
}

bool ccq_gw_blocker(ccq_runtime *rt, ccq_stream *s, uint64_t mark, uint32_t *stream,
                    uint64_t *target)
{
    ccq_gw_log *g = atomic_load_explicit(&s->gw, memory_order_acquire);
    uint32_t n = rt->ndev * rt->max_streams;
    if (g == NULL || ccq_gw_clear(rt, s, mark))
        return false;
    for (uint64_t i = atomic_load_explicit(&g->tail, memory_order_acquire); i < mark; i++) {
        const ccq_gw_entry *e = &g->e[i & (g->cap - 1)];
        uint32_t xi = atomic_load_explicit(&e->stream, memory_order_relaxed);
        uint64_t t = atomic_load_explicit(&e->target, memory_order_relaxed);
        if (xi < n && rt->streams[xi].passed < t) {
            *stream = xi;
            *target = t;
            return true;
        }
    }
    return false;
}

void ccq_gw_passed(ccq_stream *s, uint64_t passed)
{
    if (passed > s->passed) {
        s->passed = passed;
        atomic_store_explicit(&s->passed_pub, passed, memory_order_release);
    }
}

void ccq_gw_free(ccq_stream *s)
{
    ccq_gw_log *g = atomic_load_explicit(&s->gw, memory_order_relaxed);
    if (g != NULL) {
        pthread_mutex_destroy(&g->lock);
        free(g->e);
        free(g);
    }
}
