/* The communicator registry: lock-free lookup by sorted device set from any thread,
 * insertion under a mutex (rare), backend creation requested from the scheduler. */
#include <stdlib.h>
#include <string.h>

#include "runtime/internal.h"

static uint64_t hash_set(const ccq_device_id *d, uint32_t n)
{
    /* FNV-1a over the ids; sets are short, so this is a handful of multiplies. */
    uint64_t h = 1469598103934665603ull ^ n;
    for (uint32_t i = 0; i < n; i++) {
        h ^= d[i];
        h *= 1099511628211ull;
    }
    return h;
}

/*
 * Lookup is lock-free: a comm is fully built before it is published at the head of its
 * bucket with a release store, readers follow `next` with acquire loads, and nothing is
 * unlinked or freed before ccq_runtime_destroy (which does not race with other calls).
 */
ccq_comm *ccq_comm_lookup(ccq_runtime *rt, const ccq_device_id *sorted, uint32_t n)
{
    uint64_t h = hash_set(sorted, n);
    ccq_comm *c = atomic_load_explicit(&rt->buckets[h % CCQ_COMM_BUCKETS], memory_order_acquire);

    for (; c != NULL; c = atomic_load_explicit(&c->next, memory_order_acquire)) {
        if (c->hash == h && c->n == n && memcmp(c->devices, sorted, n * sizeof *sorted) == 0)
            return c;
    }
    return NULL;
}

static void comm_free(ccq_comm *c)
{
    if (c == NULL)
        return;
    free(c->devices);
    free(c->procs);
    free(c->coll_seq);
    free(c->coll_done);
    for (int i = 0; i < CCQ_CHAN_COUNT; i++) {
        /* Instances still in a window (operations that never resolved) die with it; at
         * destroy no batch holds one any more. */
        for (uint64_t k = 0; c->chan[i].win != NULL && k < c->chan[i].cap; k++) {
            ccq_inst *in = c->chan[i].win[k];
            if (in != NULL) {
                free(in->fail_detail);
                free(in);
            }
        }
        free(c->chan[i].win);
    }
    free(c);
}

/* This process's ranks in a sorted set (contiguous: a process's ids are), and the member
 * processes, ascending. */
static bool comm_place(ccq_runtime *rt, ccq_comm *c)
{
    uint32_t last = UINT32_MAX;
    c->first_local = c->n;
    c->nlocal = 0;
    c->nprocs = 0;
    c->procs = malloc(c->n * sizeof *c->procs);
    if (c->procs == NULL)
        return false;
    for (uint32_t r = 0; r < c->n; r++) {
        uint32_t p = ccq_world_owner(&rt->world, c->devices[r]);
        if (ccq_is_local(rt, c->devices[r])) {
            if (c->nlocal++ == 0)
                c->first_local = r;
        }
        if (p != last)
            c->procs[c->nprocs++] = last = p;
    }
    return true;
}

static ccq_comm *comm_new(ccq_runtime *rt, const ccq_device_id *sorted, uint32_t n, uint64_t h)
{
    ccq_comm *c = ccq_alloc_lines(sizeof *c);
    if (c == NULL)
        return NULL;
    memset(c, 0, sizeof *c);
    c->hash = h;
    c->n = n;
    c->devices = malloc(n * sizeof *sorted);
    c->coll_seq = ccq_alloc_lines(n * sizeof *c->coll_seq);
    c->coll_done = calloc(n, sizeof *c->coll_done);
    if (c->devices == NULL || c->coll_seq == NULL || c->coll_done == NULL) {
        comm_free(c);
        return NULL;
    }
    memcpy(c->devices, sorted, n * sizeof *sorted);
    if (!comm_place(rt, c)) {
        comm_free(c);
        return NULL;
    }
    c->group_limit = c->nprocs <= 1                      ? 0
                     : rt->be_ops->span_group_limit != 0 ? rt->be_ops->span_group_limit
                                                         : rt->span_batch_ops;
    for (uint32_t i = 0; i < n; i++)
        atomic_init(&c->coll_seq[i].v, 0);
    for (int i = 0; i < 2; i++) {
        atomic_init(&c->p2p_send[i].v, 0);
        atomic_init(&c->p2p_recv[i].v, 0);
    }
    atomic_init(&c->next, NULL);
    atomic_init(&c->state, CCQ_COMM_PENDING);
    atomic_init(&c->aborted, 0);
    atomic_init(&c->lost, 0);
    atomic_init(&c->requested, 0);
    ccq_signal_init(&c->ev);
    for (int i = 0; i < CCQ_CHAN_COUNT; i++) {
        c->chan[i].comm = c;
        c->chan[i].id = (uint8_t)i;
        /* Matching is local: an instance gathers this process's parts only (a pair with
         * another process's device has one half here). */
        c->chan[i].nparts = i == CCQ_CHAN_COLL ? c->nlocal : c->nlocal == n ? 2 : 1;
        c->chan[i].late_status = CCQ_ERR_TIMEOUT;
    }
    return c;
}

ccq_status ccq_comm_get_or_create(ccq_runtime *rt, const ccq_device_id *sorted, uint32_t n,
                                  ccq_comm **out)
{
    ccq_comm *c = ccq_comm_lookup(rt, sorted, n);
    uint64_t h;

    if (c != NULL) {
        *out = c;
        return CCQ_OK;
    }
    h = hash_set(sorted, n);
    pthread_mutex_lock(&rt->comm_lock);
    /* Re-check under the lock: another thread may have inserted it meanwhile. */
    c = ccq_comm_lookup(rt, sorted, n);
    if (c == NULL) {
        uint32_t id = atomic_load_explicit(&rt->ncomms, memory_order_relaxed);
        if (id == rt->comms_cap) {
            /* The scheduler reads rt->comms only at teardown, so growing it here under
             * the registry lock is safe; comms are reached through their pointers. */
            uint32_t cap = rt->comms_cap ? rt->comms_cap * 2 : 16;
            ccq_comm **nc = realloc(rt->comms, cap * sizeof *nc);
            if (nc == NULL) {
                pthread_mutex_unlock(&rt->comm_lock);
                return ccq_fail(CCQ_ERR_NO_MEMORY, "out of memory creating a communicator");
            }
            rt->comms = nc;
            rt->comms_cap = cap;
        }
        c = comm_new(rt, sorted, n, h);
        if (c == NULL) {
            pthread_mutex_unlock(&rt->comm_lock);
            return ccq_fail(CCQ_ERR_NO_MEMORY, "out of memory creating a communicator");
        }
        c->id = id;
        rt->comms[id] = c;
        atomic_store_explicit(&rt->ncomms, id + 1, memory_order_release);
        ccq_comm *_Atomic *bucket = &rt->buckets[h % CCQ_COMM_BUCKETS];
        atomic_store_explicit(&c->next, atomic_load_explicit(bucket, memory_order_relaxed),
                              memory_order_relaxed);
        /* Publishes the fully initialised comm to lock-free readers. */
        atomic_store_explicit(bucket, c, memory_order_release);
    }
    pthread_mutex_unlock(&rt->comm_lock);
    *out = c;
    return CCQ_OK;
}

/* Ask the scheduler to create the backend communicator (once per comm). */
void ccq_comm_request_init(ccq_runtime *rt, ccq_comm *comm)
{
    if (atomic_load_explicit(&comm->requested, memory_order_relaxed) ||
        atomic_exchange_explicit(&comm->requested, 1, memory_order_acq_rel))
        return;
    ccq_mpsc_push_mpsc(&rt->comm_reqs, &comm->req_node);
    ccq_wake_signal(&rt->wake);
}

void ccq_comm_free_all(ccq_runtime *rt)
{
    uint32_t n = atomic_load_explicit(&rt->ncomms, memory_order_acquire);
    for (uint32_t i = 0; i < n; i++) {
        ccq_comm *c = rt->comms[i];
        if (c->be != NULL && rt->be != NULL)
            rt->be_ops->comm_destroy(rt->be, c->be);
        comm_free(c);
    }
    free(rt->comms);
    rt->comms = NULL;
}
