/* The UCX engine's fusion (engine.h's start_run, docs/fusion.md): how the member processes of
 * a communicator agree on which small all_reduces fuse, without a message of its own, and how
 * a fused group runs.
 *
 * The agreement. Every message carries, in its header, `follow`: the fewest operations that
 * follow the sender's engine operation in a member's start_run (its run), among the members
 * the sender heard from in this operation (itself included). An all_reduce's schedule moves
 * information from every member to every member (recursive doubling, its pre and post steps
 * too, the direct exchange, and the ring), so when it ends every member holds the same fewest,
 * W: the next W operations are started in every member, in the same start_run call as that one
 * (so in one batch, as a fused operation's parts must be: backend.h). Those W operations form
 * the window: every member cuts it into fused groups by the rule of backends/fuse.h, from the
 * same operations, so alike, and starts them at once; the window's last engine operation tells
 * the next window. An operation at the start of a window whose predecessor has not ended
 * yet waits for it (it cannot know whether it fuses before); one the previous agreement
 * gave no window (W = 0) runs alone and tells the next. Nothing ever waits for an operation
 * to be submitted: a member that has fewer offers fewer, down to 0 (nothing fuses).
 *
 * all_gather's and reduce_scatter's schedules (direct and ring) move information from every
 * member to every member too, so the same agreement covers them.
 *
 * Which operations fuse (below fusion_bytes each): all_reduces whose own schedule would be
 * recursive doubling or the direct one, which combines along its tree (at most the ring
 * threshold, ucx/select.c); reduce_scatters whose own would be the direct exchange (at most its
 * threshold in all); either at any size with two member processes and a commutative combine
 * (integers; sum, product and average of floats);
 * all_gathers of any size (they combine nothing). A fused all_reduce runs recursive doubling
 * over its parts laid end to end (with two processes and a commuting combine above the ring
 * threshold, the ring: the same one combine of two partials per element, half the reduction
 * work of exchanging whole buffers), a fused reduce_scatter the direct exchange over its parts
 * interleaved (each rank's block the parts' blocks of that rank, end to end), so every element
 * meets the same combines in the same order as in its own operation: bit-identical results
 * (with two processes the ring's combines are the same pairs, operands swapped for some
 * blocks). A fused all_gather runs the schedule of its total size. Every other operation
 * (broadcast, large all_reduces...) never fuses: it starts at once, alone, and opens no window
 * (as if it offered 0), so it never waits either. A broadcast could fuse by its layout, but its
 * tree carries nothing from the members to the root, so it cannot agree this way.
 *
 * The parts are laid out by the local combine (engine.c, fused_inputs), which copies every
 * input into engine scratch anyway (UCX never touches a user buffer: engine.c): one contiguous
 * message per step, no iov datatype needed. A pair's fused ring in a process with one part in
 * each operation copies less: it reads their inputs where they are as the schedule goes
 * (ucx_op.own_at, engine.c's ucx_fused_own_block), as one operation with one part does.
 *
 * A disagreement: a fused group's header says how many operations it runs and a hash of
 * their counts, so members that cut differently (one submitted another count inside the
 * window) fail it with CCQ_ERR_MISMATCH like any disagreeing header. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/fuse.h"
#include "backends/host/ucx/ucx.h"
#include "common/clock.h"

/* The kinds this engine fuses: those whose schedules move information from every member to
 * every member, as the agreement needs. A broadcast's tree runs from its root only. */
#define UCX_FUSE_KINDS                                                                             \
    (CCQ_FUSE_KIND(CCQ_KIND_ALL_REDUCE) | CCQ_FUSE_KIND(CCQ_KIND_ALL_GATHER) |                     \
     CCQ_FUSE_KIND(CCQ_KIND_REDUCE_SCATTER))

/* Whether two elements' combine is the same bits in either order. */
static bool commutes(uint8_t dtype, uint8_t redop)
{
    bool integer = dtype == CCQ_INT8 || dtype == CCQ_UINT8 || dtype == CCQ_INT32 ||
                   dtype == CCQ_UINT32 || dtype == CCQ_INT64 || dtype == CCQ_UINT64;
    /* Floats: IEEE sums and products commute (NaN payloads aside); MAX and MIN pick an
     * operand, which differs for +0/-0 and NaNs. */
    return integer || redop == CCQ_SUM || redop == CCQ_PROD || redop == CCQ_AVG;
}

bool ucx_fused_ring(const ucx_op *head)
{
    return head->kind == CCQ_KIND_ALL_REDUCE && head->P == 2 &&
           commutes(head->dtype, head->redop) &&
           head->count * head->es > head->c->knobs.ring_bytes && head->count >= head->P;
}

/* Whether op may fuse on c (a property of the op and the communicator: the same answer in
 * every member). */
static bool fusable(const ucx_comm *c, const ccq_be_op *op)
{
    uint64_t bytes = ccq_fuse_bytes(op);
    bool pair = c->nprocs == 2 && commutes(op->dtype, op->redop);
    if (c->fusion_bytes == 0 || !ccq_fuse_eligible(op, c->fusion_bytes, UCX_FUSE_KINDS))
        return false;
    switch (op->kind) {
    case CCQ_KIND_ALL_GATHER: /* no combine: any schedule gives the same bits */
        return true;
    case CCQ_KIND_REDUCE_SCATTER: /* its own schedule is the direct one, or a commuting pair */
        return ucx_rs_direct(bytes * c->nranks) || pair;
    default: /* all_reduce: its own is recursive doubling (ucx_select), or a commuting pair */
        return bytes <= c->knobs.ring_bytes || op->count < c->nprocs || pair;
    }
}

/* ---- the queue of collectives not decided yet ------------------------------------------ */

static ucx_pend *pq_at(const ucx_comm *c, uint32_t i)
{
    return &c->pq[(c->pq_head + i) % c->pq_cap];
}

static bool pq_reserve(ucx_comm *c, uint32_t more)
{
    uint32_t cap = c->pq_cap ? c->pq_cap : 64;
    ucx_pend *q;
    if (c->pq_n + more <= c->pq_cap)
        return true;
    while (cap < c->pq_n + more)
        cap *= 2;
    if ((q = malloc(cap * sizeof *q)) == NULL)
        return false;
    for (uint32_t i = 0; i < c->pq_n; i++)
        q[i] = *pq_at(c, i);
    free(c->pq);
    c->pq = q;
    c->pq_cap = cap;
    c->pq_head = 0;
    return true;
}

static void pq_push(ucx_comm *c, uint64_t seq, ucx_op *o)
{
    ucx_pend *p = &c->pq[(c->pq_head + c->pq_n) % c->pq_cap];
    p->seq = seq;
    p->o = o;
    c->pq_n++;
}

static void pq_pop(ucx_comm *c, uint32_t n)
{
    c->pq_head = (c->pq_head + n) % c->pq_cap;
    c->pq_n -= n;
}

/* The entry of sequence seq (the queue is in sequence order), or NULL. */
static ucx_pend *pq_find(const ucx_comm *c, uint64_t seq)
{
    uint32_t lo = 0, hi = c->pq_n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        ucx_pend *p = pq_at(c, mid);
        if (p->seq == seq)
            return p;
        if (p->seq < seq)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

bool ucx_pend_has(const ucx_comm *c, uint64_t seq)
{
    const ucx_pend *p = c->pq_n > 0 ? pq_find(c, seq) : NULL;
    return p != NULL && p->o != NULL;
}

void ucx_pend_forget(ucx_op *o)
{
    ucx_pend *p = o->c->pq_n > 0 ? pq_find(o->c, o->seq) : NULL;
    if (p != NULL && p->o == o)
        p->o = NULL;
}

/* ---- fused groups ----------------------------------------------------------------------- */

void ucx_fused_unref(ucx_fused *fz)
{
    if (fz != NULL && --fz->refs == 0)
        free(fz);
}

void ucx_fused_end(ucx_op *head, ccq_status st, const char *detail)
{
    ucx_fused *fz = head->fz;
    if (fz == NULL || fz->head != head)
        return;
    fz->head = NULL;
    fz->status = st;
    if (st != CCQ_OK)
        snprintf(fz->detail.msg, sizeof fz->detail.msg, "%s", detail);
}

/* FNV-1a of the parts' counts: members that cut a window differently disagree on it. */
static uint64_t shape_of(const ucx_comm *c, uint32_t first, uint32_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t v = pq_at(c, first + i)->o->op->count;
        for (int b = 0; b < 8; b++) {
            h ^= (v >> (8 * b)) & 0xffu;
            h *= 1099511628211ull;
        }
    }
    return h ? h : 1;
}

/* Start the group of queue entries first .. first + n - 1 (waiting ops; n >= 2: fused).
 * A failure fails the group's ops (their tests say so). */
static void start_fused(ucx_comm *c, uint32_t first, uint32_t n)
{
    ucx_op *head = pq_at(c, first)->o;
    ucx_fused *fz = calloc(1, sizeof *fz + n * sizeof fz->part[0]);
    ccq_errbuf err = {{0}};
    ccq_status st;
    uint64_t total = 0;

    if (fz == NULL) {
        for (uint32_t i = 0; i < n; i++) {
            ucx_op *o = pq_at(c, first + i)->o;
            o->phase = UCX_PH_RUN;
            ucx_op_fail(o, CCQ_ERR_NO_MEMORY, "out of memory for a fused operation");
        }
        return;
    }
    fz->n = n;
    fz->status = CCQ_IN_PROGRESS;
    fz->head = head;
    for (uint32_t i = 0; i < n; i++) {
        ucx_op *o = pq_at(c, first + i)->o;
        /* The runtime's op (start_run's, not const): the head reports the group on it. */
        fz->part[i].op = (ccq_be_op *)o->op;
        fz->part[i].count = o->op->count;
        total += o->op->count;
        o->fz = fz;
        fz->refs++;
        if (i > 0)
            o->phase = UCX_PH_MEMBER;
    }
    head->shape = shape_of(c, first, n);
    head->nops = n;
    head->count = total;
    head->follow = pq_at(c, first + n - 1)->o->follow; /* what follows the group */
    st = ucx_op_launch(head, &err);
    if (st != CCQ_OK) {
        head->phase = UCX_PH_RUN;
        ucx_op_fail(head, st, "%s", err.msg);
        return; /* its test fails it, and the members with it */
    }
    fz->part[0].op->fused = n;
    fz->part[0].op->fused_t0 = ccq_now_ns();
}

static void start_alone(ucx_op *o)
{
    ccq_errbuf err = {{0}};
    ccq_status st = ucx_op_launch(o, &err);
    if (st != CCQ_OK) {
        o->phase = UCX_PH_RUN;
        ucx_op_fail(o, st, "%s", err.msg);
    }
}

/* ---- the agreement -------------------------------------------------------------------- */

void ucx_fuse_decide(ucx_comm *c)
{
    while (c->pq_n > 0 && c->failed == CCQ_OK) {
        uint64_t y = pq_at(c, 0)->seq;
        uint32_t w = 0, n, i;
        ucx_op *last = NULL;

        if (y == c->agree_seq) {
            if (c->agree_unit != NULL)
                return; /* the operation before it has not ended: it tells the window */
            w = c->agree_w;
        }
        /* else a sequence number never started here (its parts failed before the engine):
         * no window (the members that ran it wait for this one until their deadline) */
        n = w > 0 ? w : 1;
        /* Every member started the window's ops in the run of the one that told it: they
         * are all here, consecutive. (Defensive: never past what is here.) */
        for (i = 1; i < n && i < c->pq_n && pq_at(c, i)->seq == y + i; i++)
            ;
        n = i;
        /* Cut the window by backends/fuse.h: waiting entries are the fusable ops; the others
         * (NULL) started at once, alone. */
        for (i = 0; i < n;) {
            ucx_pend *p = pq_at(c, i);
            uint32_t g = 1;
            if (p->o != NULL) {
                uint64_t total = ccq_fuse_bytes(p->o->op);
                while (i + g < n && pq_at(c, i + g)->o != NULL &&
                       ccq_fuse_joins(pq_at(c, i + g - 1)->o->op, pq_at(c, i + g)->o->op, total,
                                      c->fusion_bytes, UCX_FUSE_KINDS)) {
                    total += ccq_fuse_bytes(pq_at(c, i + g)->o->op);
                    g++;
                }
                last = p->o;
                if (g > 1)
                    start_fused(c, i, g);
                else
                    start_alone(p->o);
            } else {
                last = NULL;
            }
            i += g;
        }
        pq_pop(c, n);
        /* The window's last engine operation tells the next one: a fusable one when it
         * ends (its following ops' fewest), any other at once (none). */
        c->agree_seq = y + n;
        c->agree_unit = last;
        c->agree_w = 0;
    }
}

ccq_status ucx_start_run(ccq_host_engine *base, ccq_heng_comm *hc, ccq_be_op *const *ops,
                         uint32_t n, uint64_t now_ns, ccq_heng_op **out, uint32_t *nstarted,
                         ccq_errbuf *err)
{
    ucx_comm *c = (ucx_comm *)hc;
    ccq_status st = CCQ_OK;
    uint64_t run_bytes = 0;
    uint32_t i;

    (void)base;
    for (i = 0; i < n; i++)
        run_bytes += ccq_fuse_bytes(ops[i]);
    *nstarted = 0;
    if (c->failed != CCQ_OK)
        return ucx_comm_refuse(c, ops[0], now_ns, err);
    if (!pq_reserve(c, n)) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    for (i = 0; i < n; i++) {
        ucx_op *o = ucx_op_new(c, ops[i], now_ns);
        if (o == NULL) {
            st = CCQ_ERR_NO_MEMORY;
            snprintf(err->msg, sizeof err->msg, "out of memory");
            break;
        }
        o->follow = n - 1 - i;
        o->run_bytes = run_bytes;
        if (fusable(c, ops[i])) {
            pq_push(c, ops[i]->seq, o); /* decided below, or once its window is agreed on */
        } else {
            /* It never fuses: it starts now, alone, whatever the agreement says. */
            if ((st = ucx_op_launch(o, err)) != CCQ_OK) {
                o->status = st;
                ucx_op_discard(o);
                break;
            }
            pq_push(c, ops[i]->seq, NULL);
        }
        out[i] = (ccq_heng_op *)o;
    }
    *nstarted = i;
    /* The ops that did not start end the run: those before them offer only what started. */
    for (uint32_t k = 0; k < i && i < n; k++)
        ((ucx_op *)out[k])->follow = i - 1 - k;
    ucx_fuse_decide(c);
    return st;
}
