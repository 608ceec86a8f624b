/* The host backend across processes: each operation of a communicator spanning processes
 * becomes an engine operation (engine.h), started in batch order (the runtime's sequence
 * order, the same in every process: engines match operations by it), and each ends on its own
 * (ccq_be_op.done_early), so one waiting for another process never holds the streams of the
 * others. Scheduler thread only.
 *
 * Fusion (docs/fusion.md): operations of one communicator whose ranks are all here fuse by the
 * rule of backends/fuse.h, run whole by this thread. Across processes, each run of a
 * communicator's collectives in the batch (consecutive sequence numbers) goes to the engine's
 * start_run together: the engine lets the member processes agree on what fuses with what it
 * sends them for each operation anyway (the MPI engine: its signature records; the UCX engine:
 * its message headers), so the fused operations are the same in every member. An engine
 * without start_run never fuses. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/fuse.h"
#include "backends/host/host_impl.h"
#include "backends/module.h"
#include "common/clock.h"

/* A batch holding operations across processes: engine operations the scheduler tests in
 * poll(). */
typedef struct host_xbatch {
    ccq_be_batch *b;
    struct host_xbatch *next;
    uint64_t deadline; /* the engine's own: a little before the runtime's watchdog */
    uint32_t pending;
    void **staged;    /* [nops] or NULL: copies of stage_src sends' data */
    ccq_heng_op *h[]; /* [nops]: NULL once done (or for a local op) */
} host_xbatch;

/* The engine that reaches other processes (see engine.h): cfg->host_engine, or by default
 * UCX when its module loads and UCX starts, else MPI (which needs MPI initialised: its
 * world_ready says so). Each engine is a module (libccq-ucx.so, libccq-mpi.so), loaded here:
 * the first time a runtime of this process is in a world of several processes. Without one,
 * communicators spanning processes are refused with engine_err. */
static void engine_open(host_xp *x, const ccq_config *cfg)
{
    static const char no_span[] = "the host backend cannot span processes: ";
    const char *want = cfg->host_engine;
    const ccq_module *m = NULL;
    ccq_errbuf why = {{0}};

    if (want == NULL || strcmp(want, "ucx") == 0) {
        if (ccq_module_get("ucx", "the host backend cannot span processes: its ucx engine", &m,
                           &why) == CCQ_OK) {
            ccq_errbuf start = {{0}};
            if (m->host_engine == NULL)
                snprintf(why.msg, sizeof why.msg, "%sccq's ucx module has no engine", no_span);
            else if (m->host_engine->create(cfg, &x->engine, &start) == CCQ_OK)
                return;
            else
                snprintf(why.msg, sizeof why.msg, "%sits ucx engine cannot start: %.400s", no_span,
                         start.msg);
        }
        x->engine = NULL;
        snprintf(x->engine_err.msg, sizeof x->engine_err.msg, "%s", why.msg);
        if (want != NULL)
            return;
        /* The default goes on to MPI; what UCX said stays for a later refusal's detail. */
        snprintf(x->ucx_why, sizeof x->ucx_why, "%.319s", why.msg + strlen(no_span));
    }
    if (ccq_module_get("mpi", "the host backend cannot span processes: its mpi engine", &m, &why) !=
        CCQ_OK) {
        if (want == NULL) { /* neither: both reasons */
            size_t n = (size_t)snprintf(x->engine_err.msg, sizeof x->engine_err.msg, "%s%s",
                                        no_span, x->ucx_why);
            if (n < sizeof x->engine_err.msg)
                snprintf(x->engine_err.msg + n, sizeof x->engine_err.msg - n, "; %s",
                         why.msg + strlen(no_span));
        } else
            snprintf(x->engine_err.msg, sizeof x->engine_err.msg, "%s", why.msg);
        return;
    }
    if (m->host_engine == NULL) {
        snprintf(x->engine_err.msg, sizeof x->engine_err.msg, "%sccq's mpi module has no engine",
                 no_span);
        return;
    }
    if (m->host_engine->create(cfg, &x->engine, &x->engine_err) != CCQ_OK)
        x->engine = NULL;
}

void host_xp_open(host_xp *x, const ccq_config *cfg, const ccq_be_hooks *hooks)
{
    engine_open(x, cfg);
    if (x->engine != NULL) { /* a peer error the engine sees: the runtime's job health */
        x->engine->peer_failed = hooks->peer_failed;
        x->engine->peer_failed_arg = hooks->notify_arg;
    }
}

ccq_status host_xp_world_blob(host_xp *x, void *blob, size_t *len, ccq_errbuf *err)
{
    if (x->engine == NULL || x->engine->ops->world_blob == NULL) {
        *len = 0;
        return CCQ_OK;
    }
    return x->engine->ops->world_blob(x->engine, blob, len, err);
}

/* Every process of the world calls this at the same point. */
ccq_status host_xp_world_ready(host_xp *x, uint32_t world_rank, uint32_t world_size, bool crowded,
                               const void *const *blobs, const size_t *blob_len, ccq_errbuf *err)
{
    ccq_status st;
    if (x->engine == NULL) {
        snprintf(err->msg, sizeof err->msg, "%s", x->engine_err.msg);
        return CCQ_ERR_UNSUPPORTED;
    }
    st = x->engine->ops->world_ready(x->engine, world_rank, world_size, crowded, blobs, blob_len,
                                     err);
    if (st != CCQ_OK) {
        if (x->ucx_why[0] != '\0') { /* the default's fallback: say why not UCX too */
            size_t n = strlen(err->msg);
            snprintf(err->msg + n, sizeof err->msg - n, " (the ucx engine, tried first: %s)",
                     x->ucx_why);
        }
        snprintf(x->engine_err.msg, sizeof x->engine_err.msg, "%s", err->msg);
        x->engine->ops->destroy(x->engine);
        x->engine = NULL;
    }
    return st;
}

static void batch_fail_detail(ccq_be_batch *b, const ccq_errbuf *err)
{
    if (b->detail.msg[0] == '\0')
        snprintf(b->detail.msg, sizeof b->detail.msg, "%s", err->msg);
}

/* An op of a batch across processes has ended (status set) while others of the batch may
 * still wait for other processes: the runtime ends its commands now (ccq_be_op.done_early),
 * so a stuck engine operation never holds the streams of unrelated ones. */
static void op_ended(ccq_be_batch *b, ccq_be_op *op)
{
    op->done_early = 1;
    b->ndone_early++;
}

bool host_xp_needs(const ccq_be_batch *b)
{
    for (uint32_t k = 0; k < b->nops; k++)
        if (host_op_eng(b->ops[k]) != NULL ||
            (b->ops[k]->nparts < 2 && !ccq_kinds[b->ops[k]->kind].collective))
            return true;
    return false;
}

/* The collectives from b->ops[k] that go to the engine's start_run together: one
 * communicator's, consecutive in the batch and in sequence order. */
static uint32_t run_len(const ccq_be_batch *b, uint32_t k)
{
    const ccq_be_op *op = b->ops[k];
    uint32_t n = 1;
    while (k + n < b->nops) {
        const ccq_be_op *nx = b->ops[k + n];
        if (nx->comm != op->comm || !ccq_kinds[nx->kind].collective || nx->seq != op->seq + n ||
            host_op_aborted(nx))
            break;
        n++;
    }
    return n;
}

/* Start b->ops[k .. k + n - 1] (a run of one communicator's collectives) on the engine. */
static void start_run(host_xp *x, host_xbatch *m, uint32_t k, uint32_t n, uint64_t now)
{
    ccq_host_engine *eng = x->engine;
    ccq_be_batch *b = m->b;
    ccq_heng_comm *mc = host_op_eng(b->ops[k]);
    ccq_errbuf e = {{0}};
    uint32_t started = 0;
    ccq_status st = eng->ops->start_run(eng, mc, b->ops + k, n, now, m->h + k, &started, &e);

    m->pending += started;
    if (st == CCQ_OK)
        return;
    for (uint32_t j = started; j < n; j++) {
        ccq_be_op *op = b->ops[k + j];
        m->h[k + j] = NULL;
        op->status = st;
        batch_fail_detail(b, &e);
        op_ended(b, op);
    }
}

/* A batch with operations across processes: local ones (fused groups whole) run now, on this
 * thread; each of the others combines its local parts and starts its engine operation, in
 * batch order. */
ccq_status host_xp_issue(host_xp *x, ccq_be_batch *b, ccq_errbuf *err)
{
    ccq_host_engine *eng = x->engine;
    host_xbatch *m = calloc(1, sizeof *m + b->nops * sizeof m->h[0]);
    uint64_t now = ccq_now_ns();

    if (m == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    m->b = b;
    if (host_stage_sends(b, &m->staged, err) != CCQ_OK) {
        free(m);
        return CCQ_ERR_NO_MEMORY;
    }
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
            op->status = CCQ_ERR_ABORTED;
            op_ended(b, op);
            continue;
        }
        if (mc == NULL && op->nparts < 2 && !ccq_kinds[op->kind].collective) {
            /* A half of a pair across processes without its engine side: never run it as a
             * local copy (it would read a second part that does not exist). */
            op->status = CCQ_ERR_BACKEND;
            snprintf(e.msg, sizeof e.msg,
                     "internal: a %s half across processes reached the host backend before "
                     "its communicator's engine side existed",
                     ccq_kinds[op->kind].name);
            batch_fail_detail(b, &e);
            op_ended(b, op);
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
            for (uint32_t j = 0; j < g; j++) {
                if (host_op_aborted(b->ops[k + j]))
                    b->ops[k + j]->status = CCQ_ERR_ABORTED;
                op_ended(b, b->ops[k + j]);
            }
            k += g - 1;
            continue;
        }
        if (ccq_kinds[op->kind].collective && eng->ops->start_run != NULL &&
            ((const host_comm *)op->comm)->fusion_bytes > 0) {
            uint32_t n = run_len(b, k);
            start_run(x, m, k, n, now);
            k += n - 1;
            continue;
        }
        st = eng->ops->start(eng, mc, op, now, &m->h[k], &e);
        if (st != CCQ_OK) {
            op->status = st;
            batch_fail_detail(b, &e);
            op_ended(b, op);
            continue;
        }
        if (op->kind == CCQ_KIND_SEND && eng->ops->detach(eng, m->h[k])) {
            /* it sends a copy: done here, the engine finishes it in the background */
            m->h[k] = NULL;
            x->background++;
            op_ended(b, op);
            continue;
        }
        m->pending++;
    }
    m->next = x->xbatches;
    x->xbatches = m;
    return CCQ_OK;
}

/* Test the batches' engine operations; return those that completed (or failed) on `list`. */
ccq_be_batch *host_xp_poll(host_xp *x, ccq_be_batch *list)
{
    ccq_host_engine *eng = x->engine;
    /* The engine operations' deadlines (timeout_ms, a little less) are checked every 8th
     * poll, not at each: the scheduler polls back to back while an operation waits for a
     * peer, and reading the clock at every poll was 5% of its time per operation (an 8-byte
     * all_reduce, 2 x 1: docs/performance.md, "Where the time of a small operation goes").
     * 8 polls are microseconds while busy, and while a peer is late 8 of the engine's slow
     * polls (UCX 200 us, MPI its poll_us, each plus the kernel's timer slack): a timeout fires
     * that much later, never sooner, and still well inside the 10 ms or more by which the
     * engine's deadline comes before the watchdog's (host_xp_issue). A scheduler that stood
     * still past both (its process stopped or preempted) runs the watchdog before its 8th
     * poll: the watchdog then asks for the check first (host_check_deadlines), so the
     * stuck operation still fails alone, naming what it waits for. */
    uint64_t now = (++x->polls & 7) == 0 || x->deadlines_due ? ccq_now_ns() : 0;

    x->deadlines_due = false;

    /* Background work: given up, detached, or (UCX) done here while its last messages still
     * move. The engine knows what it has; asking costs little. */
    x->background = eng->ops->reap(eng);
    for (host_xbatch **pp = &x->xbatches; *pp != NULL;) {
        host_xbatch *m = *pp;
        ccq_be_batch *b = m->b;
        /* In batch order: the ops of a fused group come after its first, whose test ends
         * the group's engine operation, so all of them end in this pass. */
        for (uint32_t k = 0; k < b->nops && m->pending > 0; k++) {
            ccq_be_op *op = b->ops[k];
            ccq_errbuf e = {{0}};
            ccq_status st;
            if (m->h[k] == NULL)
                continue;
            eng->op_error_only = false;
            if (host_op_aborted(op)) {
                /* Give the operation up (the engine keeps what its transport may still touch);
                 * the runtime's reason is on the comm. */
                eng->ops->abandon(eng, m->h[k]);
                x->background++;
                op->status = CCQ_ERR_ABORTED;
            } else if ((st = eng->ops->test(eng, m->h[k], &e)) == CCQ_IN_PROGRESS) {
                if (now == 0 || now < m->deadline)
                    continue;
                eng->ops->describe(eng, m->h[k], now, &e);
                eng->ops->abandon(eng, m->h[k]);
                x->background++;
                op->status = CCQ_ERR_TIMEOUT;
                op->comm_aborted = 1; /* later work on it would queue behind the stuck call */
                batch_fail_detail(b, &e);
            } else if (st != CCQ_OK) {
                op->status = st;
                /* A mismatch across processes is found before any data moves and leaves
                 * nothing pending: the communicator goes on with the next operation. Other
                 * errors may leave MPI state behind: later work would queue behind it. */
                op->comm_aborted = st != CCQ_ERR_MISMATCH && !eng->op_error_only;
                batch_fail_detail(b, &e);
                x->background++;
            }
            m->h[k] = NULL;
            m->pending--;
            op_ended(b, op);
        }
        if (m->pending > 0) {
            pp = &m->next;
            continue;
        }
        *pp = m->next;
        host_free_staged(m->staged, b->nops);
        free(m);
        b->be_priv = NULL;
        b->next_done = list;
        list = b;
    }
    return list;
}

uint64_t host_xp_poll_interval(const host_xp *x)
{
    if (x->engine == NULL)
        return 0;
    /* The engine says: operations in flight, or background work only polling moves (a send
     * completed early whose data UCX or MPI still moves). */
    return x->engine->ops->poll_interval(x->engine, x->xbatches != NULL);
}

bool host_xp_busy(const host_xp *x)
{
    return x->engine != NULL &&
           (x->xbatches != NULL || x->background > 0 || host_xp_poll_interval(x) > 0);
}
