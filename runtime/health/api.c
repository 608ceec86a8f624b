/* The public calls of job health (ccq_world_process_state, ccq_world_progress) and
 * ccq_comm_init's check of a device set against lost processes. User threads. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "runtime/health/health_impl.h"
#include "runtime/internal.h"

ccq_process_state ccq_health_state(ccq_runtime *rt, uint32_t process)
{
    ccq_health *h = rt->health;
    if (h == NULL || process >= h->size)
        return CCQ_PROCESS_ALIVE;
    return (ccq_process_state)ccq_health_state_of(h, process);
}

CCQ_API ccq_status ccq_world_process_state(ccq_runtime *rt, uint32_t process,
                                           ccq_process_state *out)
{
    ccq_clear_detail();
    if (rt == NULL || out == NULL)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_world_process_state: %s is NULL",
                        rt == NULL ? "rt" : "out");
    if (process >= rt->world.size)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "ccq_world_process_state: process %u is not below world_size %u", process,
                        rt->world.size);
    *out = ccq_health_state(rt, process);
    return CCQ_OK;
}

ccq_status ccq_health_check_set(ccq_runtime *rt, const char *fn, const uint32_t *sorted, uint32_t n)
{
    ccq_health *h = rt->health;
    bool spans = false;
    uint32_t last = UINT32_MAX;
    char why[CCQ_DETAIL_LEN];

    if (h == NULL)
        return CCQ_OK;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t p = ccq_world_owner(&rt->world, sorted[i]);
        if (p == last)
            continue;
        last = p;
        spans |= p != h->rank;
        if (p == h->rank || ccq_health_state_of(h, p) != CCQ_PROCESS_LOST)
            continue;
        pthread_mutex_lock(&h->lock);
        ccq_health_describe_loss(h, p, why, sizeof why);
        pthread_mutex_unlock(&h->lock);
        return ccq_fail(CCQ_ERR_PROCESS_LOST,
                        "%s: the device set holds device %u of a lost process: %s (create the "
                        "communicator over the surviving devices)",
                        fn, sorted[i], why);
    }
    if (spans && ccq_health_state_of(h, h->rank) == CCQ_PROCESS_LOST) {
        pthread_mutex_lock(&h->lock);
        ccq_health_describe_loss(h, h->rank, why, sizeof why);
        pthread_mutex_unlock(&h->lock);
        return ccq_fail(CCQ_ERR_PROCESS_LOST, "%s: %s", fn, why);
    }
    return CCQ_OK;
}

/* ------------------------------------------------------------------------------------ */
/* ccq_world_progress                                                                    */
/* ------------------------------------------------------------------------------------ */

typedef struct prog_out {
    ccq_progress *out;
    size_t cap, n, elem;
} prog_out;

static void put(prog_out *o, const ccq_progress *p)
{
    if (o->n < o->cap) {
        ccq_progress tmp = *p;
        tmp.struct_size = (uint32_t)o->elem;
        memcpy((char *)o->out + o->n * o->elem, &tmp, o->elem);
    }
    o->n++;
}

static void fill(ccq_progress *p, uint32_t process, uint32_t state, uint32_t comm,
                 const ccq_hb_comm *e, uint64_t hb_age)
{
    memset(p, 0, sizeof *p);
    p->process = process;
    p->state = state;
    p->comm = comm;
    p->submitted = e->submitted;
    p->completed = e->completed;
    p->pending_kind = e->pending_kind;
    p->pending_seq = e->pending_seq;
    p->pending_age_ns = e->pending_age_ns;
    p->heartbeat_age_ns = hb_age;
}

/* The local communicator an entry of another process's record names, or NULL. */
static ccq_comm *local_comm(ccq_runtime *rt, const ccq_hb_comm *e, const uint32_t *r,
                            uint32_t *devs)
{
    uint32_t n = 0;
    for (uint32_t k = 0; k < e->nranges; k++) {
        if (r[2 * k] > r[2 * k + 1] || r[2 * k + 1] >= rt->ndev_world ||
            n + (r[2 * k + 1] - r[2 * k] + 1) > e->ndevices)
            return NULL;
        for (uint32_t d = r[2 * k]; d <= r[2 * k + 1]; d++)
            devs[n++] = d;
    }
    if (n != e->ndevices) /* more ranges than a record holds: not identifiable */
        return NULL;
    ccq_comm *c = ccq_comm_lookup(rt, devs, n);
    return c != NULL && c->hash == e->hash ? c : NULL;
}

static bool prog_answered(void *arg)
{
    ccq_runtime *rt = arg;
    return atomic_load_explicit(&rt->health->prog_req, memory_order_acquire) == 0 ||
           atomic_load_explicit(&rt->sched_exited, memory_order_acquire) != 0;
}

CCQ_API ccq_status ccq_world_progress(ccq_runtime *rt, ccq_progress *out, size_t cap, size_t *n)
{
    ccq_health *h;
    prog_out o;
    uint32_t *devs;
    uint64_t now;

    ccq_clear_detail();
    if (rt == NULL || n == NULL || (cap > 0 && out == NULL))
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_world_progress: %s is NULL",
                        rt == NULL  ? "rt"
                        : n == NULL ? "n"
                                    : "out");
    if (cap > 0 && out[0].struct_size != sizeof(ccq_progress))
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "ccq_world_progress: out[0].struct_size is %u; set it to "
                        "sizeof(ccq_progress) (%zu)",
                        out[0].struct_size, sizeof(ccq_progress));
    *n = 0;
    h = rt->health;
    if (h == NULL)
        return CCQ_OK;
    o = (prog_out){out, cap, 0, sizeof(ccq_progress)};
    /* This process's own records, fresh: one scheduler pass (not from the scheduler itself
     * or a callback, which would wait for itself: those get the last ones made). */
    if (ccq_tls_inside == 0 && !atomic_load_explicit(&rt->sched_exited, memory_order_acquire)) {
        atomic_store_explicit(&h->prog_req, 1, memory_order_release);
        ccq_wake_signal(&rt->wake);
        ccq_signal_wait(&h->prog_sig, prog_answered, rt, ccq_deadline_in(200000000u));
    }
    devs = malloc((rt->ndev_world ? rt->ndev_world : 1) * sizeof *devs);
    if (devs == NULL)
        return ccq_fail(CCQ_ERR_NO_MEMORY, "ccq_world_progress: out of memory");
    now = ccq_now_ns();
    pthread_mutex_lock(&h->lock);
    for (uint32_t q = 0; q < h->size; q++) {
        const unsigned char *cur;
        uint32_t state = ccq_health_state_of(h, q), count;
        uint64_t age;
        if (q == h->rank) {
            cur = h->mine;
            count = h->mine_n;
            age = 0;
        } else {
            ccq_hb_view v;
            const char *why;
            const hpeer *p = &h->peers[q];
            if (p->rec == NULL || ccq_hb_decode(p->rec, p->rec_len, &v, &why) != 0)
                continue;
            cur = v.comms;
            count = v.head->ncomms;
            age = now - p->change_ns;
        }
        for (uint32_t k = 0; k < count; k++) {
            const uint32_t *r;
            const ccq_hb_comm *e = ccq_hb_next_comm(&cur, &r);
            ccq_progress rec;
            uint32_t id;
            if (q == h->rank) {
                id = h->mine_ids[k];
            } else {
                ccq_comm *c = local_comm(rt, e, r, devs);
                if (c == NULL)
                    continue; /* a communicator this process is not in */
                id = c->id;
            }
            fill(&rec, q, state, id, e, age);
            put(&o, &rec);
        }
    }
    pthread_mutex_unlock(&h->lock);
    free(devs);
    *n = o.n;
    return CCQ_OK;
}
