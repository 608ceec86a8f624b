/* The host backend across processes: each operation of a communicator spanning processes
 * becomes an engine operation (engine.h), started in the communicator's sequence order (the
 * same in every member process: engines match operations by it), and small ones fuse into
 * one engine operation once the member processes agreed on it. Scheduler thread only.
 *
 * The fusion agreement (docs/fusion.md). Each process's scheduler sees a different set of
 * ready operations, so a process must never decide a fusion alone: another process whose
 * user fences on operation s before it submits s + 1 could never supply s + 1. Instead, at
 * each operation s that may fuse (ccq_fuse_eligible: a property of the operation alone, so
 * every member process stops there) and is not inside an agreed window, every member starts
 * an element-wise minimum over the engine's own channel, in the communicator's order:
 *   [0]            how many consecutive operations from s this process has in this batch
 *                  (at most XP_AGREE_MAX): what it can start without waiting for anything;
 *   [1 + j]        a hash of operation s + j's signature, [1 + XP_AGREE_MAX + j] its
 *                  negation (unused entries INT64_MAX), so min and max of each come back.
 * The minimum N of [0] is what every member has: operations s .. s + N - 1 form the agreed
 * window, which every process cuts into fused groups with the same rule (ccq_fuse_group) from
 * the same operations. A hash whose min and max differ is a mismatch across processes: every
 * member sees it, fails the window's operations with CCQ_ERR_MISMATCH and aborts the
 * communicator (its engine channel may be out of step). Nobody waits for operations that have
 * not arrived: a process with one operation offers 1, and then starts it at once, without
 * waiting for the answer (the minimum cannot be more than 1); the answer then only checks its
 * signature, before the operation is reported complete. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/fuse.h"
#include "backends/host/host_impl.h"
#include "common/clock.h"

/* Operations one agreement can cover, and the length of its vector. A longer window means
 * fewer agreements for a burst, a longer vector every agreement carries (8 + 16 bytes per
 * operation). */
#define XP_AGREE_MAX 64u
#define XP_AGREE_LEN (1u + 2u * XP_AGREE_MAX)

enum { X_QUEUED, X_STARTED, X_DONE };

/* One op of a batch across processes. */
typedef struct host_xop {
    ccq_heng_op *h;   /* the engine operation it heads (covering n ops), or NULL */
    uint32_t n;       /* ops h covers */
    ccq_heng_op *chk; /* the agreement it was started without waiting for: its check */
    int64_t *chk_vec;
    uint8_t state;  /* X_* */
    bool data_done; /* its engine operation (its group's) completed */
} host_xop;

/* A batch holding operations across processes. */
typedef struct host_xbatch {
    ccq_be_batch *b;
    struct host_xbatch *next;
    uint64_t deadline; /* the engine's own: a little before the runtime's watchdog */
    uint32_t pending;  /* ops not done */
    host_xop x[];      /* [nops] */
} host_xbatch;

static void batch_fail_detail(ccq_be_batch *b, const char *msg)
{
    if (b->detail.msg[0] == '\0')
        snprintf(b->detail.msg, sizeof b->detail.msg, "%s", msg);
}

/* Op k ends with st (its first failure stays: a later check cannot turn it into success). */
static void op_end(host_xbatch *m, uint32_t k, ccq_status st)
{
    ccq_be_op *op = m->b->ops[k];
    if (m->x[k].state == X_DONE)
        return;
    if (op->status == CCQ_OK)
        op->status = st;
    m->x[k].state = X_DONE;
    m->pending--;
}

/* Op k fails with st. abort_comm: its communicator is aborted (the runtime is told through
 * comm_aborted when the batch returns; this backend stops starting anything on it at once, as
 * its engine channel may be out of step with the other processes'). */
static void op_fail(host_xbatch *m, uint32_t k, ccq_status st, bool abort_comm, const char *msg)
{
    if (m->x[k].state == X_DONE)
        return;
    if (abort_comm) {
        host_comm *c = (host_comm *)m->b->ops[k]->comm;
        m->b->ops[k]->comm_aborted = 1;
        atomic_store_explicit(&c->aborted, 1, memory_order_release);
    }
    if (msg != NULL)
        batch_fail_detail(m->b, msg);
    m->b->ops[k]->status = st;
    op_end(m, k, st);
}

/* ---- the queue of a communicator ----------------------------------------------------------- */

static bool q_push(host_xp *x, host_comm *c, host_xbatch *m, uint32_t k)
{
    if (c->qlen == c->qcap) {
        uint32_t ncap = c->qcap ? 2 * c->qcap : 64;
        host_xq_item *nq = malloc(ncap * sizeof *nq);
        if (nq == NULL)
            return false;
        for (uint32_t j = 0; j < c->qlen; j++)
            nq[j] = c->q[(c->qhead + j) % c->qcap];
        free(c->q);
        c->q = nq;
        c->qcap = ncap;
        c->qhead = 0;
    }
    c->q[(c->qhead + c->qlen) % c->qcap] = (host_xq_item){m, k};
    c->qlen++;
    if (!c->listed) {
        c->listed = true;
        c->list_next = x->queued;
        x->queued = c;
    }
    return true;
}

static host_xq_item q_at(const host_comm *c, uint32_t j)
{
    return c->q[(c->qhead + j) % c->qcap];
}

static void q_pop(host_comm *c, uint32_t n)
{
    c->qhead = (c->qhead + n) % c->qcap;
    c->qlen -= n;
}

/* Queued ops from the head that belong to its batch, with consecutive indexes and sequence
 * numbers, below `limit` (a sequence number) and at most `max`. */
static uint32_t q_run(const host_comm *c, uint64_t limit, uint32_t max)
{
    host_xq_item h = q_at(c, 0);
    uint64_t seq = h.m->b->ops[h.k]->seq;
    uint32_t n = 1;
    while (n < c->qlen && n < max) {
        host_xq_item it = q_at(c, n);
        if (it.m != h.m || it.k != h.k + n || it.m->b->ops[it.k]->seq != seq + n ||
            seq + n >= limit)
            break;
        n++;
    }
    return n;
}

/* ---- the agreement --------------------------------------------------------------------- */

/* A hash of what must agree across processes for an op to fuse the same way everywhere: kind,
 * dtype, op (reductions), root (rooted kinds) and count. In [0, 2^62). */
static int64_t sig_hash(const ccq_be_op *op)
{
    const ccq_kind_info *ki = &ccq_kinds[op->kind < CCQ_KIND_COUNT_ ? op->kind : 0];
    uint64_t v[5] = {op->kind, op->dtype, ki->reduces ? op->redop : 0, ki->rooted ? op->root : 0,
                     op->count};
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the words' bytes */
    for (int w = 0; w < 5; w++)
        for (int b = 0; b < 8; b++) {
            h ^= (v[w] >> (8 * b)) & 0xff;
            h *= 1099511628211ull;
        }
    return (int64_t)(h >> 2);
}

/* This process's offer for the window starting at the queue's head: n ops. */
static void agree_fill(const host_comm *c, int64_t *vec, uint32_t n)
{
    vec[0] = n;
    for (uint32_t j = 0; j < XP_AGREE_MAX; j++) {
        if (j < n) {
            host_xq_item it = q_at(c, j);
            int64_t h = sig_hash(it.m->b->ops[it.k]);
            vec[1 + j] = h;
            vec[1 + XP_AGREE_MAX + j] = -h;
        } else {
            vec[1 + j] = vec[1 + XP_AGREE_MAX + j] = INT64_MAX;
        }
    }
}

/* The answer: the agreed count (>= 1), or 0 when the processes disagree (a signature
 * mismatch within the window, or an answer outside what this process offered); *bad is then
 * the first op of the window that differs. */
static uint32_t agree_read(const int64_t *vec, uint32_t mine, uint32_t *bad)
{
    int64_t n = vec[0];
    *bad = 0;
    if (n < 1 || n > (int64_t)mine)
        return 0;
    for (uint32_t j = 0; j < (uint32_t)n; j++)
        if (vec[1 + j] != -vec[1 + XP_AGREE_MAX + j]) {
            *bad = j;
            return 0;
        }
    return (uint32_t)n;
}

static void mismatch_detail(char *buf, size_t len, const ccq_be_op *op)
{
    snprintf(buf, len,
             "parts do not match across processes: the member processes submitted %s #%" PRIu64
             " with another kind, count, dtype, op or root (found by the fusion agreement, which "
             "compares them; check_signatures names the fields); the communicator is aborted",
             ccq_kinds[op->kind < CCQ_KIND_COUNT_ ? op->kind : 0].name, op->seq);
}

/* The agreement the queue waited for answered: set the window, or fail it. */
static void agreed(host_comm *c)
{
    uint32_t bad, n = agree_read(c->agree_vec, c->agree_mine, &bad);
    free(c->agree_vec);
    c->agree_vec = NULL;
    if (n > 0) {
        c->window = true;
        c->window_end = c->agree_seq + n;
        return;
    }
    /* Every member saw the same answer: they all fail this window and abort. */
    char msg[CCQ_DETAIL_LEN];
    host_xq_item it = q_at(c, bad < c->qlen ? bad : 0);
    mismatch_detail(msg, sizeof msg, it.m->b->ops[it.k]);
    for (uint32_t j = 0; j < c->agree_mine && c->qlen > 0; j++) {
        host_xq_item h = q_at(c, 0);
        q_pop(c, 1);
        op_fail(h.m, h.k, CCQ_ERR_MISMATCH, true, msg);
    }
}

/* ---- starting operations --------------------------------------------------------------- */

/* Start the ops at the head of the queue inside the agreed window: one fused group, or one. */
static void start_group(host_xp *x, host_comm *c, uint64_t now)
{
    ccq_host_engine *eng = x->engine;
    host_xq_item it = q_at(c, 0);
    host_xbatch *m = it.m;
    ccq_be_op **ops = m->b->ops + it.k;
    uint32_t g = 1;
    ccq_errbuf e = {{0}};
    ccq_status st;

    if (c->fusion_bytes > 0 && eng->ops->start_fused != NULL)
        g = ccq_fuse_group(ops, q_run(c, c->window_end, UINT32_MAX), c->fusion_bytes,
                           eng->ops->fuse_kinds);
    q_pop(c, g);
    if (g > 1)
        st = eng->ops->start_fused(eng, c->eng, (const ccq_be_op *const *)ops, g, now,
                                   &m->x[it.k].h, &e);
    else
        st = eng->ops->start(eng, c->eng, ops[0], now, &m->x[it.k].h, &e);
    if (st != CCQ_OK) {
        m->x[it.k].h = NULL;
        for (uint32_t j = 0; j < g; j++)
            op_fail(m, it.k + j, st, false, e.msg);
        return;
    }
    m->x[it.k].n = g;
    for (uint32_t j = 0; j < g; j++)
        m->x[it.k + j].state = X_STARTED;
    if (g > 1) {
        ops[0]->fused = g;
        ops[0]->fused_t0 = now;
    }
}

/* Start the agreement for the window at the queue's head. */
static void start_agreement(host_xp *x, host_comm *c, uint64_t now)
{
    ccq_host_engine *eng = x->engine;
    host_xq_item it = q_at(c, 0);
    uint32_t mine = q_run(c, UINT64_MAX, XP_AGREE_MAX);
    int64_t *vec = malloc(XP_AGREE_LEN * sizeof *vec);
    ccq_heng_op *a = NULL;
    ccq_errbuf e = {{0}};
    ccq_status st;

    if (vec == NULL) {
        st = CCQ_ERR_NO_MEMORY;
        snprintf(e.msg, sizeof e.msg, "out of memory for the fusion agreement");
    } else {
        agree_fill(c, vec, mine);
        st = eng->ops->start_min(eng, c->eng, vec, XP_AGREE_LEN, now, &a, &e);
    }
    if (st != CCQ_OK) {
        /* The others started theirs: this communicator is out of step for good. */
        free(vec);
        q_pop(c, 1);
        op_fail(it.m, it.k, st, true, e.msg);
        return;
    }
    if (mine == 1) {
        /* The answer cannot be more than 1: start the op now; the answer checks it. */
        it.m->x[it.k].chk = a;
        it.m->x[it.k].chk_vec = vec;
        c->window = true;
        c->window_end = it.m->b->ops[it.k]->seq + 1;
        return;
    }
    c->agree = a;
    c->agree_vec = vec;
    c->agree_seq = it.m->b->ops[it.k]->seq;
    c->agree_mine = mine;
}

/* Fail every queued op of c (the agreement's engine failure, an abort). */
static void q_fail_all(host_comm *c, ccq_status st, bool abort_comm, const char *msg)
{
    while (c->qlen > 0) {
        host_xq_item it = q_at(c, 0);
        q_pop(c, 1);
        op_fail(it.m, it.k, st, abort_comm, msg);
    }
}

/* Start what can start on c, in its order; stops at an agreement not answered yet. */
static void pump(host_xp *x, host_comm *c, uint64_t now)
{
    ccq_host_engine *eng = x->engine;
    while (c->qlen > 0) {
        host_xq_item it = q_at(c, 0);
        ccq_be_op *op = it.m->b->ops[it.k];
        if (atomic_load_explicit(&c->aborted, memory_order_acquire)) {
            if (c->agree != NULL) {
                eng->ops->abandon(eng, c->agree);
                x->background++;
                c->agree = NULL;
                free(c->agree_vec);
                c->agree_vec = NULL;
            }
            q_fail_all(c, CCQ_ERR_ABORTED, false, NULL); /* the runtime's reason is on the comm */
            return;
        }
        if (c->agree != NULL) {
            ccq_errbuf e = {{0}};
            ccq_status st = eng->ops->test(eng, c->agree, &e);
            if (st == CCQ_IN_PROGRESS)
                return;
            c->agree = NULL;
            if (st != CCQ_OK) {
                x->background++; /* the engine keeps a failed request */
                free(c->agree_vec);
                c->agree_vec = NULL;
                q_fail_all(c, st, true, e.msg);
                return;
            }
            agreed(c);
            continue;
        }
        if (c->window && op->seq < c->window_end) {
            start_group(x, c, now);
            continue;
        }
        c->window = false;
        if (c->fusion_bytes > 0 && eng->ops->start_min != NULL &&
            ccq_fuse_eligible(op, c->fusion_bytes, eng->ops->fuse_kinds)) {
            start_agreement(x, c, now);
            continue;
        }
        c->window = true; /* a window of one, without an agreement: it cannot fuse */
        c->window_end = op->seq + 1;
    }
}

static void pump_all(host_xp *x, uint64_t now)
{
    for (host_comm **pp = &x->queued; *pp != NULL;) {
        host_comm *c = *pp;
        pump(x, c, now);
        if (c->qlen == 0) {
            c->listed = false;
            *pp = c->list_next;
        } else {
            pp = &c->list_next;
        }
    }
}

/* ---- issue and poll -------------------------------------------------------------------- */

bool host_xp_needs(const ccq_be_batch *b)
{
    for (uint32_t k = 0; k < b->nops; k++)
        if (host_op_eng(b->ops[k]) != NULL ||
            (b->ops[k]->nparts < 2 && !ccq_kinds[b->ops[k]->kind].collective))
            return true;
    return false;
}

/* A batch with operations across processes: local ones (fused groups whole) run now, on this
 * thread; a half of a pair across processes starts now (send/recv have no fusion and their
 * own channel); collectives across processes queue on their communicator and start in its
 * order (pump). */
ccq_status host_xp_issue(host_xp *x, ccq_be_batch *b, ccq_errbuf *err)
{
    ccq_host_engine *eng = x->engine;
    host_xbatch *m = calloc(1, sizeof *m + b->nops * sizeof m->x[0]);
    uint64_t now = ccq_now_ns();

    if (m == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    m->b = b;
    m->pending = b->nops;
    /* The engine's deadline comes a little before the watchdog's (issue time + timeout_ms),
     * so a stuck engine operation fails alone (CCQ_ERR_TIMEOUT naming what it waits for) and
     * only its communicator is aborted, not every communicator of the batch. */
    if (x->timeout_ns == UINT64_MAX) {
        m->deadline = UINT64_MAX;
    } else {
        uint64_t grace = x->timeout_ns / 16;
        grace = grace < 10000000u ? 10000000u : grace > 200000000u ? 200000000u : grace;
        m->deadline = now + (x->timeout_ns > grace ? x->timeout_ns - grace : x->timeout_ns / 2);
    }
    for (uint32_t k = 0; k < b->nops; k++) {
        ccq_be_op *op = b->ops[k];
        ccq_heng_comm *mc = host_op_eng(op);
        ccq_errbuf e = {{0}};
        ccq_status st;
        op->status = CCQ_OK;
        if (host_op_aborted(op)) {
            op_end(m, k, CCQ_ERR_ABORTED);
            continue;
        }
        if (mc == NULL && op->nparts < 2 && !ccq_kinds[op->kind].collective) {
            /* A half of a pair across processes without its engine side: never run it as a
             * local copy (it would read a second part that does not exist). */
            snprintf(e.msg, sizeof e.msg,
                     "internal: a %s half across processes reached the host backend before "
                     "its communicator's engine side existed",
                     ccq_kinds[op->kind].name);
            op_fail(m, k, CCQ_ERR_BACKEND, false, e.msg);
            continue;
        }
        if (mc == NULL) {
            const host_comm *lc = (const host_comm *)op->comm;
            uint32_t g =
                lc != NULL && lc->fusion_bytes > 0
                    ? ccq_fuse_group(b->ops + k, b->nops - k, lc->fusion_bytes, CCQ_FUSE_KINDS_ALL)
                    : 1;
            if (g > 1) {
                host_run_fused(b->ops + k, g, x->stream_bytes);
                op->fused = g;
            } else {
                host_run_range(op, 0, op->count, x->stream_bytes);
            }
            for (uint32_t j = 0; j < g; j++)
                op_end(m, k + j, host_op_aborted(b->ops[k + j]) ? CCQ_ERR_ABORTED : CCQ_OK);
            k += g - 1;
            continue;
        }
        if (ccq_kinds[op->kind].collective) {
            if (!q_push(x, (host_comm *)op->comm, m, k))
                op_fail(m, k, CCQ_ERR_NO_MEMORY, true, "out of memory queueing an operation");
            continue;
        }
        st = eng->ops->start(eng, mc, op, now, &m->x[k].h, &e);
        if (st != CCQ_OK) {
            m->x[k].h = NULL;
            op_fail(m, k, st, false, e.msg);
            continue;
        }
        m->x[k].n = 1;
        m->x[k].state = X_STARTED;
        if (op->kind == CCQ_KIND_SEND && eng->ops->detach(eng, m->x[k].h)) {
            /* it sends a copy: done here, the engine finishes it in the background */
            m->x[k].h = NULL;
            x->background++;
            op_end(m, k, CCQ_OK);
        }
    }
    m->next = x->xbatches;
    x->xbatches = m;
    pump_all(x, now);
    return CCQ_OK;
}

/* Remove batch m's ops from every queue (m is about to be returned): an agreement started
 * for one of them is given up. */
static void q_purge(host_xp *x, host_xbatch *m)
{
    for (host_comm *c = x->queued; c != NULL; c = c->list_next) {
        uint32_t w = 0;
        if (c->qlen > 0 && q_at(c, 0).m == m && c->agree != NULL) {
            x->engine->ops->abandon(x->engine, c->agree);
            x->background++;
            c->agree = NULL;
            free(c->agree_vec);
            c->agree_vec = NULL;
        }
        for (uint32_t j = 0; j < c->qlen; j++) {
            host_xq_item it = q_at(c, j);
            if (it.m != m)
                c->q[(c->qhead + w++) % c->qcap] = it;
        }
        c->qlen = w;
    }
}

/* Op k's data and check are both in: it is done. */
static void maybe_done(host_xbatch *m, uint32_t k)
{
    if (m->x[k].data_done && m->x[k].chk == NULL)
        op_end(m, k, CCQ_OK);
}

/* Test op k's engine operation (its group's) and its check; true if anything ended. */
static void test_op(host_xp *x, host_xbatch *m, uint32_t k, uint64_t now)
{
    ccq_host_engine *eng = x->engine;
    host_xop *xo = &m->x[k];
    ccq_be_op *op = m->b->ops[k];
    ccq_errbuf e = {{0}};
    ccq_status st;

    if (xo->chk != NULL) {
        if (host_op_aborted(op)) {
            eng->ops->abandon(eng, xo->chk);
            x->background++;
            xo->chk = NULL;
        } else if ((st = eng->ops->test(eng, xo->chk, &e)) == CCQ_IN_PROGRESS) {
            /* Past the deadline the data operation, if still running, says what hangs. */
            if (now >= m->deadline && xo->h == NULL) {
                char msg[CCQ_DETAIL_LEN];
                eng->ops->describe(eng, xo->chk, now, &e);
                eng->ops->abandon(eng, xo->chk);
                x->background++;
                xo->chk = NULL;
                snprintf(msg, sizeof msg, "the fusion agreement at %s #%" PRIu64 ": %.400s",
                         ccq_kinds[op->kind].name, op->seq, e.msg);
                op_fail(m, k, CCQ_ERR_TIMEOUT, true, msg);
            }
        } else {
            uint32_t bad;
            xo->chk = NULL;
            if (st != CCQ_OK) {
                x->background++;
                op_fail(m, k, st, true, e.msg);
            } else if (agree_read(xo->chk_vec, 1, &bad) != 1) {
                char msg[CCQ_DETAIL_LEN];
                mismatch_detail(msg, sizeof msg, op);
                op_fail(m, k, CCQ_ERR_MISMATCH, true, msg);
            }
        }
        if (xo->chk == NULL) {
            free(xo->chk_vec);
            xo->chk_vec = NULL;
        }
    }
    if (xo->h == NULL) {
        maybe_done(m, k);
        return;
    }
    if (host_op_aborted(op) || m->x[k].state == X_DONE) {
        /* Aborted, or failed by its check: give the engine operation up (the engine keeps
         * what its transport may still touch); the runtime's reason is on the comm. */
        eng->ops->abandon(eng, xo->h);
        x->background++;
        for (uint32_t j = 0; j < xo->n; j++)
            op_end(m, k + j, CCQ_ERR_ABORTED);
    } else if ((st = eng->ops->test(eng, xo->h, &e)) == CCQ_IN_PROGRESS) {
        if (now < m->deadline)
            return;
        eng->ops->describe(eng, xo->h, now, &e);
        eng->ops->abandon(eng, xo->h);
        x->background++;
        if (xo->chk != NULL) {
            eng->ops->abandon(eng, xo->chk);
            x->background++;
            xo->chk = NULL;
            free(xo->chk_vec);
            xo->chk_vec = NULL;
        }
        for (uint32_t j = 0; j < xo->n; j++)
            op_fail(m, k + j, CCQ_ERR_TIMEOUT, true, e.msg); /* later work would queue behind it */
    } else if (st != CCQ_OK) {
        x->background++;
        for (uint32_t j = 0; j < xo->n; j++)
            op_fail(m, k + j, st, true, e.msg);
    } else {
        if (xo->n > 1)
            op->fused_t1 = now;
        for (uint32_t j = 0; j < xo->n; j++) {
            m->x[k + j].data_done = true;
            maybe_done(m, k + j);
        }
    }
    xo->h = NULL;
}

/* The engine's deadline passed for ops of m that never started: they wait behind an
 * agreement or an operation of their communicator that some member never joined. */
static void expire_queued(host_xp *x, host_xbatch *m, uint64_t now)
{
    for (uint32_t k = 0; k < m->b->nops; k++) {
        host_comm *c = (host_comm *)m->b->ops[k]->comm;
        char msg[CCQ_DETAIL_LEN];
        if (m->x[k].state != X_QUEUED)
            continue;
        if (c->agree != NULL && c->qlen > 0 && q_at(c, 0).m == m) {
            ccq_errbuf e = {{0}};
            x->engine->ops->describe(x->engine, c->agree, now, &e);
            snprintf(msg, sizeof msg, "the fusion agreement before %s #%" PRIu64 ": %.400s",
                     ccq_kinds[m->b->ops[k]->kind].name, c->agree_seq, e.msg);
        } else {
            snprintf(msg, sizeof msg,
                     "%s #%" PRIu64 " never started: it waits behind an earlier operation of its "
                     "communicator that a member process never joined",
                     ccq_kinds[m->b->ops[k]->kind].name, m->b->ops[k]->seq);
        }
        batch_fail_detail(m->b, msg);
    }
    q_purge(x, m);
    for (uint32_t k = 0; k < m->b->nops; k++)
        if (m->x[k].state == X_QUEUED)
            op_fail(m, k, CCQ_ERR_TIMEOUT, true, NULL);
}

ccq_be_batch *host_xp_poll(host_xp *x, ccq_be_batch *list)
{
    ccq_host_engine *eng = x->engine;
    uint64_t now = ccq_now_ns();

    if (x->background > 0)
        x->background = eng->ops->reap(eng, now);
    pump_all(x, now);
    for (host_xbatch **pp = &x->xbatches; *pp != NULL;) {
        host_xbatch *m = *pp;
        ccq_be_batch *b = m->b;
        for (uint32_t k = 0; k < b->nops && m->pending > 0; k++)
            if (m->x[k].h != NULL || m->x[k].chk != NULL)
                test_op(x, m, k, now);
        if (m->pending > 0 && now >= m->deadline)
            expire_queued(x, m, now);
        if (m->pending > 0) {
            pp = &m->next;
            continue;
        }
        /* Every op ended; what the engine may still hold for them (an op failed before its
         * engine operation or its check finished) is given up before the batch goes back. */
        for (uint32_t k = 0; k < b->nops; k++) {
            if (m->x[k].h != NULL) {
                eng->ops->abandon(eng, m->x[k].h);
                x->background++;
            }
            if (m->x[k].chk != NULL) {
                eng->ops->abandon(eng, m->x[k].chk);
                x->background++;
            }
            free(m->x[k].chk_vec);
        }
        *pp = m->next;
        free(m);
        b->be_priv = NULL;
        b->next_done = list;
        list = b;
    }
    /* What ended may let a queue move on (an op's failure aborted its communicator). */
    pump_all(x, now);
    return list;
}

bool host_xp_busy(const host_xp *x)
{
    return x->xbatches != NULL || x->background > 0;
}

uint64_t host_xp_poll_interval(const host_xp *x)
{
    if (x->engine == NULL || !host_xp_busy(x))
        return 0;
    return x->engine->ops->poll_interval(x->engine, x->xbatches != NULL);
}

void host_xp_comm_fini(host_xp *x, host_comm *c)
{
    if (c->agree != NULL) {
        x->engine->ops->abandon(x->engine, c->agree);
        x->background++;
    }
    free(c->agree_vec);
    free(c->q);
    if (c->listed) /* cannot happen: destroyed with nothing in flight */
        for (host_comm **pp = &x->queued; *pp != NULL; pp = &(*pp)->list_next)
            if (*pp == c) {
                *pp = c->list_next;
                break;
            }
}
