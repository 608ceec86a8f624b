/* Job health on the scheduler thread: applying losses (every communicator with a lost member
 * process fails with CCQ_ERR_PROCESS_LOST; the event, the note and a dump), this process's
 * progress for its heartbeat record, and the health facts the watchdog's details quote. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/health/health_impl.h"
#include "runtime/sched.h"

bool ccq_health_due(ccq_runtime *rt)
{
    ccq_health *h = rt->health;
    return h != NULL &&
           (atomic_load_explicit(&h->epoch, memory_order_acquire) != h->applied_epoch ||
            atomic_load_explicit(&h->prog_req, memory_order_acquire) != 0);
}

/* The lost member process of comm to name (the lowest), or this process when it is fenced
 * off and comm spans processes; UINT32_MAX when none. */
static uint32_t lost_member(const ccq_health *h, const ccq_comm *comm)
{
    if (comm->nprocs <= 1)
        return UINT32_MAX;
    for (uint32_t k = 0; k < comm->nprocs; k++)
        if (ccq_health_state_of(h, comm->procs[k]) == CCQ_PROCESS_LOST)
            return comm->procs[k];
    return UINT32_MAX;
}

bool ccq_health_comm_lost(ccq_runtime *rt, const ccq_comm *comm, char *buf, size_t len)
{
    ccq_health *h = rt->health;
    uint32_t p;

    if (h == NULL || (p = lost_member(h, comm)) == UINT32_MAX)
        return false;
    pthread_mutex_lock(&h->lock);
    ccq_health_describe_loss(h, p, buf, len);
    pthread_mutex_unlock(&h->lock);
    return true;
}

/* Fail every communicator spanning processes that has a lost member. */
static void lose_comms(ccq_runtime *rt)
{
    char why[CCQ_DETAIL_LEN];

    pthread_mutex_lock(&rt->comm_lock);
    uint32_t n = atomic_load_explicit(&rt->ncomms, memory_order_acquire);
    for (uint32_t k = 0; k < n; k++) {
        ccq_comm *comm = rt->comms[k];
        if (atomic_load_explicit(&comm->lost, memory_order_relaxed))
            continue;
        if (ccq_health_comm_lost(rt, comm, why, sizeof why))
            sched_lose_comm(rt, comm, why);
    }
    pthread_mutex_unlock(&rt->comm_lock);
}

/* Record each loss not applied yet (event, note), fail what involves it, dump the recorder
 * before any fence can report the failures (they end later in this pass). */
static void apply_losses(ccq_runtime *rt)
{
    ccq_health *h = rt->health;
    bool any = false;
    uint64_t now = ccq_now_ns();

    for (uint32_t p = 0; p < h->size; p++) {
        hpeer *q = &h->peers[p];
        char note[CCQ_DETAIL_LEN];
        if (q->applied || ccq_health_state_of(h, p) != CCQ_PROCESS_LOST)
            continue;
        q->applied = true;
        any = true;
        if (ccq_trace_on(&rt->trace)) {
            ccq_event e;
            memset(&e, 0, sizeof e);
            e.time_ns = now;
            e.type = CCQ_EV_PROCESS_LOST;
            e.device = rt->world.first[p];
            e.stream = UINT32_MAX;
            e.comm = UINT32_MAX;
            e.peer_valid = 1;
            e.peer = p;
            e.status = CCQ_ERR_PROCESS_LOST;
            ccq_trace_rec(&rt->trace, &e);
        }
        pthread_mutex_lock(&h->lock);
        ccq_health_describe_loss(h, p, note, sizeof note);
        pthread_mutex_unlock(&h->lock);
        ccq_trace_note(&rt->trace, CCQ_EV_PROCESS_LOST, note);
    }
    if (!any)
        return;
    lose_comms(rt);
    /* The loss is on disk now; the failures it causes are, before any fence reports them
     * (the scheduler holds them for their own dump). */
    ccq_trace_autodump(rt, "process_lost");
}

/* ------------------------------------------------------------------------------------ */
/* This process's progress                                                               */
/* ------------------------------------------------------------------------------------ */

typedef struct pend_scan {
    uint64_t submit_ns; /* 0: nothing pending */
    uint32_t kind;
    uint64_t seq;
} pend_scan;

static void comm_counts(const ccq_comm *comm, uint64_t *submitted, uint64_t *completed)
{
    uint64_t sub = UINT64_MAX, done = UINT64_MAX;

    for (uint32_t i = 0; i < comm->nlocal; i++) {
        uint32_t r = comm->first_local + i;
        uint64_t s = atomic_load_explicit(&comm->coll_seq[r].v, memory_order_relaxed);
        sub = s < sub ? s : sub;
        done = comm->coll_done[r] < done ? comm->coll_done[r] : done;
    }
    if (comm->nlocal == 0)
        sub = done = 0;
    /* send/recv halves of a pair with another process's device (per direction). */
    for (int d = 0; d < 2; d++)
        sub += atomic_load_explicit(&comm->p2p_send[d].v, memory_order_relaxed) +
               atomic_load_explicit(&comm->p2p_recv[d].v, memory_order_relaxed);
    *submitted = sub;
    *completed = done + comm->p2p_done;
}

/* Append comm's entry to h->mine (lock held). */
static bool add_entry(ccq_health *h, const ccq_comm *comm, const pend_scan *ps, uint64_t now)
{
    uint32_t r[2 * CCQ_HB_MAX_RANGES], nr = 0;
    ccq_hb_comm e;
    size_t need;

    for (uint32_t i = 0; i < comm->n && nr < CCQ_HB_MAX_RANGES;) {
        uint32_t j = i;
        while (j + 1 < comm->n && comm->devices[j + 1] == comm->devices[j] + 1)
            j++;
        r[2 * nr] = comm->devices[i];
        r[2 * nr + 1] = comm->devices[j];
        nr++;
        i = j + 1;
    }
    memset(&e, 0, sizeof e);
    e.hash = comm->hash;
    e.ndevices = comm->n;
    e.nranges = nr;
    comm_counts(comm, &e.submitted, &e.completed);
    e.pending_kind = ps->submit_ns ? ps->kind : UINT32_MAX;
    e.pending_seq = ps->submit_ns ? ps->seq : 0;
    e.pending_age_ns = ps->submit_ns && now > ps->submit_ns ? now - ps->submit_ns : 0;
    need = h->mine_len + ccq_hb_comm_size(nr);
    if (need > h->mine_cap) {
        unsigned char *m = realloc(h->mine, need * 2);
        if (m == NULL)
            return false;
        h->mine = m;
        h->mine_cap = need * 2;
    }
    uint32_t *ids = realloc(h->mine_ids, (h->mine_n + 1) * sizeof *ids);
    if (ids == NULL)
        return false;
    h->mine_ids = ids;
    memcpy(h->mine + h->mine_len, &e, sizeof e);
    memcpy(h->mine + h->mine_len + sizeof e, r, (size_t)nr * 2 * sizeof *r);
    h->mine_len = need;
    h->mine_ids[h->mine_n++] = comm->id;
    return true;
}

/* Make this process's progress records: per communicator spanning processes, its counts and
 * its oldest pending command (the first of that communicator in each stream's FIFO: FIFOs are
 * in submission order). */
static void make_progress(ccq_runtime *rt)
{
    ccq_health *h = rt->health;
    ccq_sched *S = rt->sched;
    uint32_t n = atomic_load_explicit(&rt->ncomms, memory_order_acquire);
    pend_scan *ps = calloc(n ? n : 1, sizeof *ps);
    uint64_t now = ccq_now_ns();

    if (ps == NULL)
        return; /* the record keeps the last answer */
    for (uint32_t k = 0; k < S->nactive; k++)
        for (ccq_cmd *c = S->active[k]->fifo_head; c != NULL; c = c->fifo_next) {
            pend_scan *p = c->comm->id < n ? &ps[c->comm->id] : NULL;
            if (p != NULL && c->comm->nprocs > 1 &&
                (p->submit_ns == 0 || c->submit_ns < p->submit_ns)) {
                p->submit_ns = c->submit_ns;
                p->kind = c->kind;
                p->seq = c->seq;
            }
        }
    pthread_mutex_lock(&rt->comm_lock); /* rt->comms grows under it */
    pthread_mutex_lock(&h->lock);
    h->mine_len = 0;
    h->mine_n = 0;
    for (uint32_t k = 0; k < n && h->mine_n < CCQ_HB_MAX_COMMS; k++) {
        const ccq_comm *comm = rt->comms[k];
        if (comm->nprocs > 1 &&
            atomic_load_explicit(&comm->state, memory_order_acquire) == CCQ_COMM_READY &&
            !add_entry(h, comm, &ps[k], now))
            break;
    }
    h->mine_ns = now;
    pthread_mutex_unlock(&h->lock);
    pthread_mutex_unlock(&rt->comm_lock);
    free(ps);
}

bool ccq_health_serve(ccq_runtime *rt)
{
    ccq_health *h = rt->health;
    bool did = false;
    uint64_t e;

    if (h == NULL)
        return false;
    e = atomic_load_explicit(&h->epoch, memory_order_acquire);
    if (e != h->applied_epoch) {
        h->applied_epoch = e;
        apply_losses(rt);
        did = true;
    }
    if (atomic_load_explicit(&h->prog_req, memory_order_acquire)) {
        make_progress(rt);
        atomic_store_explicit(&h->prog_req, 0, memory_order_release);
        ccq_signal_notify(&h->prog_sig);
        did = true;
    }
    return did;
}

bool ccq_health_probe(ccq_runtime *rt, ccq_comm *comm)
{
    ccq_health *h = rt->health;

    if (h == NULL || comm->nprocs <= 1)
        return false;
    for (uint32_t k = 0; k < comm->nprocs; k++) {
        uint32_t p = comm->procs[k];
        bool gone;
        if (p == h->rank || ccq_health_state_of(h, p) != CCQ_PROCESS_ALIVE)
            continue;
        pthread_mutex_lock(&h->lock);
        gone = ccq_os_exited(&h->peers[p]);
        pthread_mutex_unlock(&h->lock);
        if (gone)
            ccq_health_exited(h, p);
    }
    if (atomic_load_explicit(&h->epoch, memory_order_acquire) != h->applied_epoch)
        ccq_health_serve(rt);
    return atomic_load_explicit(&comm->lost, memory_order_acquire) != 0;
}

/* ------------------------------------------------------------------------------------ */
/* The watchdog's details                                                                */
/* ------------------------------------------------------------------------------------ */

/* Process q's entry for comm in its latest record (lock held), or NULL. */
static const ccq_hb_comm *entry_of(const hpeer *p, const ccq_comm *comm)
{
    ccq_hb_view v;
    const char *why;
    const unsigned char *cur;

    if (p->rec == NULL || ccq_hb_decode(p->rec, p->rec_len, &v, &why) != 0)
        return NULL;
    cur = v.comms;
    for (uint32_t k = 0; k < v.head->ncomms; k++) {
        const uint32_t *r;
        const ccq_hb_comm *e = ccq_hb_next_comm(&cur, &r);
        if (e->hash == comm->hash && e->ndevices == comm->n && e->nranges > 0 &&
            r[0] == comm->devices[0])
            return e;
    }
    return NULL;
}

/* One member process, for the watchdog (lock held). */
static size_t describe_member(const ccq_health *h, const ccq_comm *comm, uint32_t q,
                              uint64_t wait_seq, uint64_t now, char *buf, size_t len)
{
    const hpeer *p = &h->peers[q];
    uint32_t st = ccq_health_state_of(h, q);
    size_t w;

    if (st == CCQ_PROCESS_LOST)
        return ccq_format(buf, len, "; process %u lost %.1f s ago (%s)", q,
                          (double)(now - p->lost_ns) / 1e9, ccq_health_how_name(p->how));
    if (st == CCQ_PROCESS_LEFT)
        return ccq_format(buf, len, "; process %u left (destroyed its runtime)", q);
    if (!h->beats)
        return ccq_format(buf, len, "; process %u: no heartbeats (%s)", q,
                          h->hb_ns == 0 ? "heartbeat_ms = 0" : "the bootstrap carries none");
    if (p->rec == NULL)
        return ccq_format(buf, len, "; process %u: no heartbeat read from it yet", q);
    const ccq_hb_comm *e = entry_of(p, comm);
    w = ccq_format(buf, len, "; process %u is alive (heartbeat %.1f s ago)", q,
                   (double)(now - p->change_ns) / 1e9);
    if (e == NULL)
        return w + ccq_format(buf + w, len - w, " but has not formed this communicator");
    if (e->submitted <= wait_seq)
        w += ccq_format(buf + w, len - w, " but has not submitted #%" PRIu64 " yet:", wait_seq);
    else
        w += ccq_format(buf + w, len - w, " and");
    w += ccq_format(buf + w, len - w, " has submitted %" PRIu64 " and completed %" PRIu64,
                    e->submitted, e->completed);
    if (e->pending_kind != UINT32_MAX)
        w += ccq_format(buf + w, len - w, ", its oldest pending %s #%" PRIu64 " for %.1f s",
                        ccq_kind_name(e->pending_kind), e->pending_seq,
                        (double)e->pending_age_ns / 1e9);
    return w;
}

/* Whether member q is one the wait is likely for: lost, left, silent, or behind. */
static bool behind(const ccq_health *h, const ccq_comm *comm, uint32_t q, uint64_t wait_seq)
{
    const hpeer *p = &h->peers[q];
    const ccq_hb_comm *e;
    if (ccq_health_state_of(h, q) != CCQ_PROCESS_ALIVE || !h->beats || p->rec == NULL)
        return true;
    e = entry_of(p, comm);
    return e == NULL || e->submitted <= wait_seq;
}

size_t ccq_health_describe_members(ccq_runtime *rt, const ccq_comm *comm, uint64_t wait_seq,
                                   char *buf, size_t len)
{
    ccq_health *h = rt->health;
    uint64_t now = ccq_now_ns();
    size_t w = 0;

    if (h == NULL || comm->nprocs <= 1 || len == 0)
        return 0;
    pthread_mutex_lock(&h->lock);
    /* The processes the wait is for first (a detail may be cut to fit), then the others. */
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t k = 0; k < comm->nprocs && w + 1 < len; k++) {
            uint32_t q = comm->procs[k];
            if (q == h->rank || behind(h, comm, q, wait_seq) != (pass == 0))
                continue;
            w += describe_member(h, comm, q, wait_seq, now, buf + w, len - w);
        }
    pthread_mutex_unlock(&h->lock);
    return w;
}
