/* Matching and batching: interleaved comms and streams, stream order and hazards, and batch
 * boundaries observed through a recording test backend. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "test_util.h"

#include "ref.h"
#include "runtime/internal.h"

#define NDEV           4
#define MAX_STREAMS    16
#define TB_PARTS       8
#define TB_MAX_BATCHES 8192
#define TB_MAX_OPS     32768
#define WAIT_S         60 /* bound on waits for something that must happen (never hit) */

static uint64_t env_count(const char *name, uint64_t def)
{
    const char *v = getenv(name);
    char *end;
    unsigned long long x;

    if (v == NULL || *v == '\0')
        return def;
    x = strtoull(v, &end, 10);
    return (*end != '\0' || x == 0) ? def : x;
}

static void ok(ccq_status st, const char *what)
{
    if (st != CCQ_OK)
        fail_msg("%s: %s (%s)", what, ccq_status_name(st), ccq_last_error_detail());
}

/* ====================================================================================== */
/* The recording test backend                                                            */
/* ====================================================================================== */

/*
 * issue() records each batch (its ops in order, with kind, count, comm and parts) and then
 * either completes it at once (executing the data movement with tools/ref/ref.c, pushing it on
 * the done list and calling notify) or, in hold mode, keeps it until the test releases it.
 * With the gate closed, issue() blocks the scheduler thread until the test opens it: while
 * it is blocked, the test queues commands that the scheduler will then find all at once.
 */
typedef struct tb_comm {
    uint32_t n;
    ccq_device_id devs[TB_PARTS];
    _Atomic uint32_t aborted;
} tb_comm;

typedef struct rec_op {
    uint8_t kind, dtype, redop;
    size_t count;
    const tb_comm *comm;
    uint32_t comm_size, nparts;
    ccq_be_part parts[TB_PARTS];
} rec_op;

typedef struct rec_batch {
    uint64_t id;
    uint32_t nops, first; /* ops[first .. first + nops) */
} rec_batch;

typedef struct tb {
    ccq_backend base;
    ccq_be_hooks hooks;
    uint32_t ndev;
    pthread_mutex_t mu; /* guards everything below */
    pthread_cond_t cv;
    bool hold, gate, in_gate;
    rec_batch *batches;
    rec_op *ops;
    uint32_t nbatches, nops;
    bool overflow;
    ccq_be_batch *held; /* oldest first, next_done links */
    uint32_t nheld;
    ccq_be_batch *done;
    uint32_t inflight; /* issued and not yet returned by poll() */
    bool have_sched;
    pthread_t sched; /* the thread that calls the backend */
    _Atomic uint64_t published;
} tb;

/* Life-cycle checks that outlive a runtime (one runtime at a time in this file). */
static struct {
    uint32_t created, destroyed;
    uint32_t comms_created, comms_destroyed;
    uint32_t destroy_with_inflight; /* destroy() while batches were not returned */
    uint32_t wrong_thread;          /* backend called from another thread than the first */
} g_life;

static const ccq_backend_ops tb_ops;

static tb *tb_of(ccq_runtime *rt)
{
    return ccq_container_of(rt->be, tb, base);
}

/* Only the scheduler thread may call the backend (create and destroy excepted). */
static void tb_check_thread(tb *t)
{
    pthread_t self = pthread_self();
    if (!t->have_sched) {
        t->sched = self;
        t->have_sched = true;
    } else if (!pthread_equal(t->sched, self)) {
        g_life.wrong_thread++;
    }
}

static ccq_status tb_create(const ccq_config *cfg, const ccq_be_hooks *hooks, ccq_backend **out,
                            ccq_errbuf *err)
{
    tb *t = calloc(1, sizeof *t);
    if (t == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    t->batches = calloc(TB_MAX_BATCHES, sizeof *t->batches);
    t->ops = calloc(TB_MAX_OPS, sizeof *t->ops);
    if (t->batches == NULL || t->ops == NULL) {
        free(t->batches);
        free(t->ops);
        free(t);
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    t->base.ops = &tb_ops;
    t->hooks = *hooks;
    t->ndev = cfg->host_devices;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    atomic_init(&t->published, 0);
    g_life.created++;
    *out = &t->base;
    return CCQ_OK;
}

static void tb_destroy(ccq_backend *be)
{
    tb *t = ccq_container_of(be, tb, base);
    if (t->inflight != 0 || t->nheld != 0 || t->done != NULL)
        g_life.destroy_with_inflight++;
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    free(t->batches);
    free(t->ops);
    free(t);
    g_life.destroyed++;
}

static uint32_t tb_device_count(const ccq_backend *be)
{
    return ccq_container_of(be, const tb, base)->ndev;
}

static ccq_status tb_comm_create(ccq_backend *be, const ccq_be_comm_desc *d, ccq_be_comm **out,
                                 ccq_errbuf *err)
{
    tb *t = ccq_container_of(be, tb, base);
    const ccq_device_id *devices = d->local_devices;
    uint32_t n = d->nlocal;
    tb_comm *c;

    tb_check_thread(t);
    if (n > TB_PARTS) {
        snprintf(err->msg, sizeof err->msg, "test backend: %u devices", n);
        return CCQ_ERR_UNSUPPORTED;
    }
    c = calloc(1, sizeof *c);
    if (c == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    c->n = n;
    memcpy(c->devs, devices, n * sizeof *devices);
    atomic_init(&c->aborted, 0);
    g_life.comms_created++;
    *out = (ccq_be_comm *)c;
    return CCQ_OK;
}

static void tb_comm_destroy(ccq_backend *be, ccq_be_comm *comm)
{
    (void)be;
    free(comm);
    g_life.comms_destroyed++;
}

/* Run a batch's data movement in op order, set statuses, and hand it back. Any thread. */
static void tb_complete(tb *t, ccq_be_batch *b)
{
    for (uint32_t k = 0; k < b->nops; k++) {
        ccq_be_op *op = b->ops[k];
        const tb_comm *c = (const tb_comm *)op->comm;
        size_t bytes = op->count * ref_dtype_size((ccq_dtype)op->dtype);
        if (atomic_load(&c->aborted)) {
            op->status = CCQ_ERR_ABORTED;
            continue;
        }
        op->status = CCQ_OK;
        if (bytes == 0)
            continue;
        if (op->kind == CCQ_KIND_ALL_REDUCE) {
            const void *in[TB_PARTS];
            void *tmp = malloc(bytes);
            if (tmp == NULL) {
                op->status = CCQ_ERR_NO_MEMORY;
                continue;
            }
            for (uint32_t p = 0; p < op->nparts; p++)
                in[p] = op->parts[p].src;
            ref_allreduce((ccq_dtype)op->dtype, (ccq_reduce_op)op->redop, op->nparts, in, tmp,
                          op->count);
            for (uint32_t p = 0; p < op->nparts; p++)
                memcpy(op->parts[p].dst, tmp, bytes);
            free(tmp);
        } else {
            memmove(op->parts[1].dst, op->parts[0].src, bytes);
        }
    }
    b->status = CCQ_OK;
    pthread_mutex_lock(&t->mu);
    b->next_done = NULL;
    if (t->done == NULL) {
        t->done = b;
    } else {
        ccq_be_batch *x = t->done;
        while (x->next_done != NULL)
            x = x->next_done;
        x->next_done = b;
    }
    pthread_mutex_unlock(&t->mu);
    /* The scheduler's wake-up wants the completion published by an atomic RMW before
     * notify reads its sleep flag. */
    atomic_fetch_add_explicit(&t->published, 1, memory_order_seq_cst);
    t->hooks.notify(t->hooks.notify_arg);
}

static ccq_status tb_issue(ccq_backend *be, ccq_be_batch *b, ccq_errbuf *err)
{
    tb *t = ccq_container_of(be, tb, base);
    (void)err;

    tb_check_thread(t);
    pthread_mutex_lock(&t->mu);
    if (t->nbatches < TB_MAX_BATCHES && t->nops + b->nops <= TB_MAX_OPS) {
        rec_batch *rb = &t->batches[t->nbatches];
        rb->id = b->id;
        rb->nops = b->nops;
        rb->first = t->nops;
        for (uint32_t k = 0; k < b->nops; k++) {
            const ccq_be_op *op = b->ops[k];
            rec_op *r = &t->ops[t->nops++];
            r->kind = op->kind;
            r->dtype = op->dtype;
            r->redop = op->redop;
            r->count = op->count;
            r->comm = (const tb_comm *)op->comm;
            r->comm_size = op->comm_size;
            r->nparts = op->nparts;
            for (uint32_t p = 0; p < op->nparts && p < TB_PARTS; p++)
                r->parts[p] = op->parts[p];
        }
        t->nbatches++;
    } else {
        t->overflow = true;
    }
    t->inflight++;
    pthread_cond_broadcast(&t->cv);
    if (t->gate) {
        t->in_gate = true;
        pthread_cond_broadcast(&t->cv);
        while (t->gate)
            pthread_cond_wait(&t->cv, &t->mu);
        /* The test waits for this; in hold mode the batch is on the held list before the
         * lock is released. */
        t->in_gate = false;
        pthread_cond_broadcast(&t->cv);
    }
    if (t->hold) {
        b->next_done = NULL;
        if (t->held == NULL) {
            t->held = b;
        } else {
            ccq_be_batch *x = t->held;
            while (x->next_done != NULL)
                x = x->next_done;
            x->next_done = b;
        }
        t->nheld++;
        pthread_cond_broadcast(&t->cv);
        pthread_mutex_unlock(&t->mu);
        return CCQ_OK;
    }
    pthread_mutex_unlock(&t->mu);
    tb_complete(t, b);
    return CCQ_OK;
}

static ccq_be_batch *tb_poll(ccq_backend *be)
{
    tb *t = ccq_container_of(be, tb, base);
    ccq_be_batch *list, *x;

    tb_check_thread(t);
    pthread_mutex_lock(&t->mu);
    list = t->done;
    t->done = NULL;
    for (x = list; x != NULL; x = x->next_done)
        t->inflight--;
    pthread_mutex_unlock(&t->mu);
    return list;
}

/* Release held batches: all of them, or only the oldest. Called by the test thread. */
static void tb_release(tb *t, bool all)
{
    ccq_be_batch *list;

    pthread_mutex_lock(&t->mu);
    list = t->held;
    if (list != NULL && !all) {
        t->held = list->next_done;
        list->next_done = NULL;
        t->nheld--;
    } else {
        t->held = NULL;
        t->nheld = 0;
    }
    pthread_mutex_unlock(&t->mu);
    while (list != NULL) {
        ccq_be_batch *next = list->next_done;
        tb_complete(t, list);
        list = next;
    }
}

/* Release the held batch that was recorded as batch `index`. */
static void tb_release_index(tb *t, uint32_t index)
{
    ccq_be_batch *b = NULL;

    pthread_mutex_lock(&t->mu);
    assert_true(index < t->nbatches);
    uint64_t id = t->batches[index].id;
    for (ccq_be_batch **pp = &t->held; *pp != NULL; pp = &(*pp)->next_done) {
        if ((*pp)->id == id) {
            b = *pp;
            *pp = b->next_done;
            b->next_done = NULL;
            t->nheld--;
            break;
        }
    }
    pthread_mutex_unlock(&t->mu);
    if (b == NULL)
        fail_msg("batch %u is not held", index);
    tb_complete(t, b);
}

static void tb_abort(ccq_backend *be, ccq_be_comm *comm)
{
    tb *t = ccq_container_of(be, tb, base);
    tb_check_thread(t);
    atomic_store(&((tb_comm *)comm)->aborted, 1);
    /* Held work on it must still come back (failed); release everything held. */
    tb_release(t, true);
}

static const ccq_backend_ops tb_ops = {
    .name = "test",
    .create = tb_create,
    .destroy = tb_destroy,
    .device_count = tb_device_count,
    .comm_create = tb_comm_create,
    .comm_destroy = tb_comm_destroy,
    .issue = tb_issue,
    .poll = tb_poll,
    .abort = tb_abort,
    .poll_interval_ns = 0,
};

static void deadline_in(struct timespec *ts, int seconds)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += seconds;
}

/* Wait until at least n batches were recorded (bounded only against hangs). */
static void tb_wait_batches(tb *t, uint32_t n)
{
    struct timespec ts;
    int rc = 0;
    deadline_in(&ts, WAIT_S);
    pthread_mutex_lock(&t->mu);
    while (t->nbatches < n && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&t->cv, &t->mu, &ts);
    uint32_t got = t->nbatches;
    pthread_mutex_unlock(&t->mu);
    if (got < n)
        fail_msg("waited %d s for batch %u; %u recorded", WAIT_S, n, got);
}

static uint32_t tb_nbatches(tb *t)
{
    pthread_mutex_lock(&t->mu);
    uint32_t n = t->nbatches;
    pthread_mutex_unlock(&t->mu);
    return n;
}

/* Close the gate: the next issue() blocks until tb_open_gate. */
static void tb_close_gate(tb *t)
{
    pthread_mutex_lock(&t->mu);
    t->gate = true;
    pthread_mutex_unlock(&t->mu);
}

/* Wait until the scheduler is blocked in the gate. */
static void tb_wait_in_gate(tb *t)
{
    struct timespec ts;
    int rc = 0;
    deadline_in(&ts, WAIT_S);
    pthread_mutex_lock(&t->mu);
    while (!t->in_gate && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&t->cv, &t->mu, &ts);
    bool in = t->in_gate;
    pthread_mutex_unlock(&t->mu);
    if (!in)
        fail_msg("the scheduler never reached the gate");
}

/* Open the gate and wait until the scheduler has left it (with the batch held, in hold
 * mode), so the test's next step sees the state after the gated issue(). */
static void tb_open_gate(tb *t)
{
    struct timespec ts;
    int rc = 0;
    deadline_in(&ts, WAIT_S);
    pthread_mutex_lock(&t->mu);
    t->gate = false;
    pthread_cond_broadcast(&t->cv);
    while (t->in_gate && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&t->cv, &t->mu, &ts);
    bool stuck = t->in_gate;
    pthread_mutex_unlock(&t->mu);
    if (stuck)
        fail_msg("the scheduler did not leave the gate");
}

static void tb_set_hold(tb *t, bool hold)
{
    pthread_mutex_lock(&t->mu);
    t->hold = hold;
    pthread_mutex_unlock(&t->mu);
}

/* A recorded batch and its ops. Records are append-only in preallocated arrays, so a
 * batch read after tb_wait_batches stays valid. */
static const rec_batch *tb_batch(tb *t, uint32_t i)
{
    pthread_mutex_lock(&t->mu);
    assert_false(t->overflow);
    assert_true(i < t->nbatches);
    const rec_batch *b = &t->batches[i];
    pthread_mutex_unlock(&t->mu);
    return b;
}

static const rec_op *tb_op(tb *t, const rec_batch *b, uint32_t k)
{
    assert_true(k < b->nops);
    return &t->ops[b->first + k];
}

/* ====================================================================================== */
/* Fixture                                                                               */
/* ====================================================================================== */

typedef struct fixture {
    ccq_runtime *rt;
    tb *t; /* NULL on the host backend */
    uint64_t expect_failed;
    bool wedged; /* a fence timed out: destroying the runtime could hang, so leak it */
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    if (f == NULL)
        return -1;
    memset(&g_life, 0, sizeof g_life);
    *state = f;
    return 0;
}

/* Create the runtime of a test: the recording backend (test_be) or the host backend. */
static void start(fixture *f, bool test_be, uint32_t max_batch_ops)
{
    ccq_config cfg;
    ccq_device_id all[NDEV] = {0, 1, 2, 3}, b[2] = {0, 1}, c[2] = {2, 3};

    ccq_config_init(&cfg);
    cfg.host_devices = NDEV;
    cfg.max_streams = MAX_STREAMS;
    cfg.max_batch_ops = max_batch_ops;
    /* Only matters if something hangs: everything here takes milliseconds. */
    cfg.timeout_ms = 10000;
    if (test_be) {
        ok(ccq_runtime_create_with(&cfg, &tb_ops, &f->rt), "create (test backend)");
        f->t = tb_of(f->rt);
        assert_string_equal(ccq_backend_name(f->rt), "test");
    } else {
        ok(ccq_runtime_create(&cfg, &f->rt), "create (host backend)");
    }
    assert_int_equal(ccq_device_count(f->rt), NDEV);
    /* Comm ids in creation order: A = {0,1,2,3}, then B = {0,1}, then C = {2,3}. */
    ok(ccq_comm_init(f->rt, all, NDEV), "comm_init A");
    ok(ccq_comm_init(f->rt, b, 2), "comm_init B");
    ok(ccq_comm_init(f->rt, c, 2), "comm_init C");
}

/* The runtime's counters agree with each other and with what the backend recorded. */
static void check_stats(fixture *f)
{
    ccq_stats st = {.struct_size = sizeof st};
    ok(ccq_get_stats(f->rt, &st), "get_stats");
    assert_int_equal(st.submitted, st.completed + st.failed + st.cancelled + st.pending);
    assert_int_equal(st.pending, 0);
    assert_int_equal(st.cancelled, 0);
    assert_int_equal(st.failed, f->expect_failed);
    uint64_t hist = 0;
    for (int i = 0; i < 8; i++)
        hist += st.batch_size_hist[i];
    assert_int_equal(hist, st.batches);
    assert_true(st.batched_ops >= st.batches);
    if (f->t != NULL) {
        tb *t = f->t;
        uint64_t ops = 0, maxops = 0, h[8] = {0};
        pthread_mutex_lock(&t->mu);
        uint32_t nb = t->nbatches;
        bool overflow = t->overflow;
        pthread_mutex_unlock(&t->mu);
        assert_false(overflow);
        for (uint32_t i = 0; i < nb; i++) {
            uint32_t n = t->batches[i].nops;
            int bucket = 0;
            while (bucket < 7 && (2u << bucket) <= n)
                bucket++;
            h[bucket]++;
            ops += n;
            maxops = n > maxops ? n : maxops;
        }
        assert_int_equal(st.batches, nb);
        assert_int_equal(st.batched_ops, ops);
        assert_int_equal(st.max_batch_ops, maxops);
        for (int i = 0; i < 8; i++)
            assert_int_equal(st.batch_size_hist[i], h[i]);
    }
}

static int teardown(void **state)
{
    fixture *f = *state;
    int rc = 0;

    if (f->wedged) {
        /* A command never completed, and the watchdog did not end it either: shutdown
         * would wait for it forever. Leave the runtime behind so the other tests run. */
        fprintf(stderr, "runtime wedged: not destroyed\n");
        free(f);
        return 0;
    }
    if (f->t != NULL) {
        /* Let anything a failed test left behind finish. */
        pthread_mutex_lock(&f->t->mu);
        f->t->hold = false;
        f->t->gate = false;
        pthread_cond_broadcast(&f->t->cv);
        pthread_mutex_unlock(&f->t->mu);
        tb_release(f->t, true);
    }
    if (f->rt != NULL && ccq_runtime_destroy(f->rt) != CCQ_OK)
        rc = -1;
    if (f->t != NULL) {
        if (g_life.created != 1 || g_life.destroyed != 1 || g_life.destroy_with_inflight != 0 ||
            g_life.wrong_thread != 0 || g_life.comms_created != g_life.comms_destroyed) {
            fprintf(stderr,
                    "test backend life cycle: created %u destroyed %u, destroyed with %u in "
                    "flight, %u calls from another thread, comms %u created %u destroyed\n",
                    g_life.created, g_life.destroyed, g_life.destroy_with_inflight,
                    g_life.wrong_thread, g_life.comms_created, g_life.comms_destroyed);
            rc = -1;
        }
    }
    free(f);
    return rc;
}

static void fence(fixture *f, ccq_device_id d, ccq_stream_id s)
{
    ccq_status st = ccq_sync_collective(f->rt, d, s);
    if (st == CCQ_ERR_TIMEOUT)
        f->wedged = true;
    if (st != CCQ_OK)
        fail_msg("fence device %u stream %u: %s (%s)", d, s, ccq_status_name(st),
                 ccq_last_error_detail());
}

static void fence_all(fixture *f)
{
    for (ccq_device_id d = 0; d < NDEV; d++)
        for (ccq_stream_id s = 0; s < MAX_STREAMS; s++)
            fence(f, d, s);
}

static const ccq_device_id DEV_A[4] = {0, 1, 2, 3};
static const ccq_device_id DEV_B[2] = {0, 1};
static const ccq_device_id DEV_C[2] = {2, 3};

/* ====================================================================================== */
/* Interleaved comms and streams                                                         */
/* ====================================================================================== */

/*
 * Four threads (one per device), started together. Iteration k of device d submits, each
 * on a stream that depends on (k, d): an all_reduce over A = {0,1,2,3}, an all_reduce over
 * its pair (B = {0,1} or C = {2,3}), a send to its pair partner and a recv from it. Every
 * rank submits a comm's collectives in the same order, so everything matches; dtypes, ops,
 * counts and in-place vary with k. All results are checked against tools/ref/ref.c.
 */
typedef struct inter_op {
    ccq_dtype dt;
    ccq_reduce_op op;
    size_t count;
    bool inplace;
    void *in[NDEV];  /* original inputs */
    void *buf[NDEV]; /* what was submitted as dst (src too when in place) */
} inter_op;

typedef struct inter {
    ccq_runtime *rt;
    uint32_t iters;
    pthread_barrier_t start;
    inter_op *a, *pair;                /* [iters] */
    uint32_t *sbuf[NDEV], *rbuf[NDEV]; /* [iters * PCOUNT] */
} inter;

#define PCOUNT 40

typedef struct inter_arg {
    inter *x;
    ccq_device_id d;
    ccq_status st;
    char detail[CCQ_DETAIL_LEN];
} inter_arg;

static void *inter_thread(void *arg)
{
    inter_arg *a = arg;
    inter *x = a->x;
    ccq_device_id d = a->d, partner = d ^ 1u;
    const ccq_device_id *pset = d < 2 ? DEV_B : DEV_C;
    ccq_status st = CCQ_OK;

    pthread_barrier_wait(&x->start);
    for (uint32_t k = 0; k < x->iters && st == CCQ_OK; k++) {
        inter_op *o = &x->a[k];
        void *src = o->inplace ? o->buf[d] : o->in[d];
        st =
            ccq_all_reduce(x->rt, d, (k + d) % 4, src, o->buf[d], o->count, o->dt, o->op, DEV_A, 4);
        if (st != CCQ_OK)
            break;
        o = &x->pair[k];
        src = o->inplace ? o->buf[d] : o->in[d];
        st = ccq_all_reduce(x->rt, d, (3 * k + d) % 4, src, o->buf[d], o->count, o->dt, o->op, pset,
                            2);
        if (st != CCQ_OK)
            break;
        st = ccq_send(x->rt, d, (k + 1) % 4, x->sbuf[d] + (size_t)k * PCOUNT, PCOUNT, CCQ_UINT32,
                      partner);
        if (st != CCQ_OK)
            break;
        st = ccq_recv(x->rt, d, (k + 2) % 4, x->rbuf[d] + (size_t)k * PCOUNT, PCOUNT, CCQ_UINT32,
                      partner);
    }
    for (ccq_stream_id s = 0; s < 4 && st == CCQ_OK; s++)
        st = ccq_sync_collective(x->rt, d, s);
    a->st = st;
    if (st != CCQ_OK)
        snprintf(a->detail, sizeof a->detail, "%s", ccq_last_error_detail());
    return NULL;
}

static void inter_op_init(inter_op *o, uint32_t k, uint32_t salt, uint32_t nranks)
{
    o->dt = (ccq_dtype)((k * 7 + salt) % CCQ_DTYPE_COUNT_);
    o->op = (ccq_reduce_op)((k + salt) % CCQ_REDUCE_OP_COUNT_);
    o->count = 1 + (k * 37 + salt * 11) % 300;
    o->inplace = (k + salt) % 3 == 0;
    size_t bytes = o->count * ref_dtype_size(o->dt);
    for (uint32_t r = 0; r < nranks; r++) {
        o->in[r] = xmalloc(bytes);
        o->buf[r] = xmalloc(bytes);
        ref_fill(o->dt, o->in[r], o->count, k * 131u + salt * 17u + r);
        if (o->inplace)
            memcpy(o->buf[r], o->in[r], bytes);
        else
            memset(o->buf[r], 0x77, bytes);
    }
}

static void inter_op_check(const inter_op *o, uint32_t first, uint32_t nranks, const char *what,
                           uint32_t k)
{
    const void *inputs[NDEV];
    char msg[256];
    void *want = xmalloc(o->count * ref_dtype_size(o->dt));

    for (uint32_t r = 0; r < nranks; r++)
        inputs[r] = o->in[first + r];
    ref_allreduce(o->dt, o->op, nranks, inputs, want, o->count);
    for (uint32_t r = 0; r < nranks; r++)
        if (ref_compare(o->dt, o->buf[first + r], want, o->count, msg, sizeof msg) != 0)
            fail_msg("%s #%u rank %u (%s %s x %zu%s): %s", what, k, r, ccq_dtype_name(o->dt),
                     ccq_reduce_op_name(o->op), o->count, o->inplace ? ", in place" : "", msg);
    free(want);
}

static void run_interleaved(fixture *f)
{
    inter x = {.rt = f->rt};
    inter_arg args[NDEV];
    pthread_t th[NDEV];

    x.iters = (uint32_t)env_count("CCQ_TEST_ITERS", 200);
    x.a = calloc(x.iters, sizeof *x.a);
    x.pair = calloc(x.iters, sizeof *x.pair);
    assert_non_null(x.a);
    assert_non_null(x.pair);
    for (uint32_t k = 0; k < x.iters; k++) {
        inter_op_init(&x.a[k], k, 1, NDEV);
        /* The pair ops: B uses in/buf[0..1], C uses in/buf[2..3]; one description. */
        inter_op_init(&x.pair[k], k, 2, NDEV);
    }
    for (ccq_device_id d = 0; d < NDEV; d++) {
        x.sbuf[d] = xmalloc((size_t)x.iters * PCOUNT * sizeof(uint32_t));
        x.rbuf[d] = xmalloc((size_t)x.iters * PCOUNT * sizeof(uint32_t));
        for (size_t i = 0; i < (size_t)x.iters * PCOUNT; i++) {
            x.sbuf[d][i] = d * 100000000u + (uint32_t)i;
            x.rbuf[d][i] = 0xdeadbeef;
        }
    }
    assert_int_equal(pthread_barrier_init(&x.start, NULL, NDEV), 0);
    for (ccq_device_id d = 0; d < NDEV; d++) {
        args[d] = (inter_arg){.x = &x, .d = d};
        assert_int_equal(pthread_create(&th[d], NULL, inter_thread, &args[d]), 0);
    }
    for (ccq_device_id d = 0; d < NDEV; d++)
        pthread_join(th[d], NULL);
    pthread_barrier_destroy(&x.start);
    for (ccq_device_id d = 0; d < NDEV; d++) {
        if (args[d].st == CCQ_ERR_TIMEOUT)
            f->wedged = true;
        if (args[d].st != CCQ_OK)
            fail_msg("device %u: %s (%s)", d, ccq_status_name(args[d].st), args[d].detail);
    }

    for (uint32_t k = 0; k < x.iters; k++) {
        inter_op_check(&x.a[k], 0, 4, "all_reduce over {0,1,2,3}", k);
        inter_op_check(&x.pair[k], 0, 2, "all_reduce over {0,1}", k);
        inter_op_check(&x.pair[k], 2, 2, "all_reduce over {2,3}", k);
    }
    for (ccq_device_id d = 0; d < NDEV; d++) {
        ccq_device_id p = d ^ 1u;
        for (size_t i = 0; i < (size_t)x.iters * PCOUNT; i++)
            if (x.rbuf[d][i] != p * 100000000u + (uint32_t)i)
                fail_msg("recv on device %u, element %zu: %u, want %u", d, i, x.rbuf[d][i],
                         p * 100000000u + (uint32_t)i);
    }
    for (uint32_t k = 0; k < x.iters; k++)
        for (uint32_t r = 0; r < NDEV; r++) {
            free(x.a[k].in[r]);
            free(x.a[k].buf[r]);
            free(x.pair[k].in[r]);
            free(x.pair[k].buf[r]);
        }
    for (ccq_device_id d = 0; d < NDEV; d++) {
        free(x.sbuf[d]);
        free(x.rbuf[d]);
    }
    free(x.a);
    free(x.pair);
    check_stats(f);
}

static void test_interleaved_host(void **state)
{
    fixture *f = *state;
    start(f, false, 256);
    run_interleaved(f);
}

static void test_interleaved_recording(void **state)
{
    fixture *f = *state;
    start(f, true, 256);
    run_interleaved(f);
    /* Every op the backend saw had all its local parts, in rank order. */
    tb *t = f->t;
    uint32_t nb = tb_nbatches(t);
    for (uint32_t i = 0; i < nb; i++) {
        const rec_batch *b = tb_batch(t, i);
        for (uint32_t k = 0; k < b->nops; k++) {
            const rec_op *o = tb_op(t, b, k);
            assert_int_equal(o->nparts, o->kind == CCQ_KIND_SEND ? 2 : o->comm->n);
            assert_int_equal(o->comm_size, o->comm->n);
            if (o->kind == CCQ_KIND_ALL_REDUCE)
                for (uint32_t p = 0; p < o->nparts; p++) {
                    assert_int_equal(o->parts[p].rank, p);
                    assert_int_equal(o->parts[p].device, o->comm->devs[p]);
                }
        }
    }
}

/* ====================================================================================== */
/* Stream order and hazards on the host backend                                          */
/* ====================================================================================== */

/* Big enough that the host backend cuts the ops into chunks for its worker pool, where
 * ops of one batch run concurrently: a missed hazard would show up as wrong data. */
#define BIG 100000

static void test_chained_in_place_host(void **state)
{
    fixture *f = *state;
    static const ccq_dtype dts[] = {CCQ_INT32, CCQ_FLOAT32, CCQ_FLOAT16};
    start(f, false, 256);

    for (size_t t = 0; t < sizeof dts / sizeof dts[0]; t++) {
        ccq_dtype dt = dts[t];
        size_t bytes = BIG * ref_dtype_size(dt);
        void *x[NDEV], *want[NDEV];
        const void *in[NDEV];
        char msg[256];
        for (uint32_t d = 0; d < NDEV; d++) {
            x[d] = xmalloc(bytes);
            want[d] = xmalloc(bytes);
            ref_fill(dt, x[d], BIG, 500 + d);
            memcpy(want[d], x[d], bytes);
            in[d] = want[d];
        }
        /* x -> sum over A -> sum over A again -> sum over B (devices 0, 1 only) -> max
         * over A, all in place on stream 0 of each device. */
        for (uint32_t d = 0; d < NDEV; d++) {
            ok(ccq_all_reduce(f->rt, d, 0, x[d], x[d], BIG, dt, CCQ_SUM, DEV_A, 4), "ar 1");
            ok(ccq_all_reduce(f->rt, d, 0, x[d], x[d], BIG, dt, CCQ_SUM, DEV_A, 4), "ar 2");
            if (d < 2)
                ok(ccq_all_reduce(f->rt, d, 0, x[d], x[d], BIG, dt, CCQ_SUM, DEV_B, 2), "ar 3");
            ok(ccq_all_reduce(f->rt, d, 0, x[d], x[d], BIG, dt, CCQ_MAX, DEV_A, 4), "ar 4");
        }
        for (uint32_t d = 0; d < NDEV; d++)
            fence(f, d, 0);
        /* The same steps, applied one after the other by the reference. */
        ref_allreduce(dt, CCQ_SUM, 4, in, want[0], BIG);
        for (uint32_t d = 1; d < NDEV; d++)
            memcpy(want[d], want[0], bytes);
        ref_allreduce(dt, CCQ_SUM, 4, in, want[0], BIG);
        for (uint32_t d = 1; d < NDEV; d++)
            memcpy(want[d], want[0], bytes);
        ref_allreduce(dt, CCQ_SUM, 2, in, want[0], BIG);
        memcpy(want[1], want[0], bytes);
        ref_allreduce(dt, CCQ_MAX, 4, in, want[0], BIG);
        for (uint32_t d = 0; d < NDEV; d++)
            if (ref_compare(dt, x[d], want[0], BIG, msg, sizeof msg) != 0)
                fail_msg("chained in place, %s, device %u: %s", ccq_dtype_name(dt), d, msg);
        for (uint32_t d = 0; d < NDEV; d++) {
            free(x[d]);
            free(want[d]);
        }
    }
    check_stats(f);
}

/* An all_reduce, then a send of its output on the same stream, received elsewhere; and a
 * recv, then an all_reduce of the received buffer on the same stream. */
static void test_reduce_then_send_host(void **state)
{
    fixture *f = *state;
    float *x[NDEV], *y[NDEV], *z, *w, *v0;
    const void *in[NDEV];
    float *want = xmalloc(BIG * sizeof(float));
    start(f, false, 256);

    for (int round = 0; round < 3; round++) {
        for (uint32_t d = 0; d < NDEV; d++) {
            x[d] = xmalloc(BIG * sizeof(float));
            y[d] = xmalloc(BIG * sizeof(float));
            ref_fill(CCQ_FLOAT32, x[d], BIG, 900 + d + (uint32_t)round * 10);
            memset(y[d], 0, BIG * sizeof(float));
            in[d] = x[d];
        }
        z = xmalloc(BIG * sizeof(float));
        w = xmalloc(BIG * sizeof(float));
        v0 = xmalloc(BIG * sizeof(float));
        memset(z, 0, BIG * sizeof(float));
        memset(w, 0, BIG * sizeof(float));
        ref_fill(CCQ_FLOAT32, v0, BIG, 77 + (uint32_t)round);

        for (uint32_t d = 0; d < NDEV; d++)
            ok(ccq_all_reduce(f->rt, d, 0, x[d], y[d], BIG, CCQ_FLOAT32, CCQ_SUM, DEV_A, 4), "ar");
        /* Device 0 sends its result to device 2 (stream 0: after the all_reduce). */
        ok(ccq_send(f->rt, 0, 0, y[0], BIG, CCQ_FLOAT32, 2), "send");
        ok(ccq_recv(f->rt, 2, 5, z, BIG, CCQ_FLOAT32, 0), "recv");
        /* Device 1 receives device 3's result on stream 0 into w, then all_reduces w with
         * device 0's v0 over B, in place. */
        ok(ccq_send(f->rt, 3, 0, y[3], BIG, CCQ_FLOAT32, 1), "send");
        ok(ccq_recv(f->rt, 1, 0, w, BIG, CCQ_FLOAT32, 3), "recv");
        ok(ccq_all_reduce(f->rt, 1, 0, w, w, BIG, CCQ_FLOAT32, CCQ_SUM, DEV_B, 2), "ar B");
        ok(ccq_all_reduce(f->rt, 0, 1, v0, v0, BIG, CCQ_FLOAT32, CCQ_SUM, DEV_B, 2), "ar B");

        for (uint32_t d = 0; d < NDEV; d++) {
            fence(f, d, 0);
            fence(f, d, 1);
            fence(f, d, 5);
        }
        char msg[256];
        ref_allreduce(CCQ_FLOAT32, CCQ_SUM, 4, in, want, BIG);
        for (uint32_t d = 0; d < NDEV; d++)
            if (ref_compare(CCQ_FLOAT32, y[d], want, BIG, msg, sizeof msg) != 0)
                fail_msg("all_reduce output on device %u: %s", d, msg);
        if (ref_compare(CCQ_FLOAT32, z, want, BIG, msg, sizeof msg) != 0)
            fail_msg("device 2 received something else than the reduced data: %s", msg);
        /* w = reduced (received) + v0 (original), rank order: device 0 (v0) first. */
        float *v0_orig = xmalloc(BIG * sizeof(float));
        ref_fill(CCQ_FLOAT32, v0_orig, BIG, 77 + (uint32_t)round);
        const void *pin[2] = {v0_orig, want};
        ref_allreduce(CCQ_FLOAT32, CCQ_SUM, 2, pin, v0_orig, BIG);
        if (ref_compare(CCQ_FLOAT32, w, v0_orig, BIG, msg, sizeof msg) != 0)
            fail_msg("recv then all_reduce on device 1: %s", msg);
        if (ref_compare(CCQ_FLOAT32, v0, v0_orig, BIG, msg, sizeof msg) != 0)
            fail_msg("recv then all_reduce on device 0: %s", msg);
        free(v0_orig);
        for (uint32_t d = 0; d < NDEV; d++) {
            free(x[d]);
            free(y[d]);
        }
        free(z);
        free(w);
        free(v0);
    }
    free(want);
    check_stats(f);
}

/* ====================================================================================== */
/* Batch boundaries with the recording backend                                           */
/* ====================================================================================== */

enum { GC = 8 }; /* elements of the small ops below */

/* Buffers of one all_reduce over A: per rank src and dst. */
typedef struct arbuf {
    int32_t src[NDEV][GC];
    int32_t dst[NDEV][GC];
} arbuf;

static void arbuf_init(arbuf *b, int32_t tag)
{
    for (int d = 0; d < NDEV; d++)
        for (int i = 0; i < GC; i++) {
            b->src[d][i] = tag * 1000 + d * 100 + i;
            b->dst[d][i] = -1;
        }
}

/* Submit an all_reduce (int32 sum) over devices set[0..n) on stream s of every rank. */
static void submit_ar(fixture *f, arbuf *b, const ccq_device_id *set, uint32_t n, ccq_stream_id s)
{
    for (uint32_t r = 0; r < n; r++)
        ok(ccq_all_reduce(f->rt, set[r], s, b->src[set[r]], b->dst[set[r]], GC, CCQ_INT32, CCQ_SUM,
                          set, n),
           "all_reduce");
}

static void check_ar_result(const arbuf *b, const ccq_device_id *set, uint32_t n)
{
    for (uint32_t r = 0; r < n; r++)
        for (int i = 0; i < GC; i++) {
            int32_t want = 0;
            for (uint32_t q = 0; q < n; q++)
                want += b->src[set[q]][i];
            if (b->dst[set[r]][i] != want)
                fail_msg("all_reduce result on device %u element %d: %d, want %d", set[r], i,
                         b->dst[set[r]][i], want);
        }
}

/* Is op `o` the all_reduce with buffers b over `set`, on stream s of every rank, with every
 * local rank's part present in rank order? */
static bool is_ar(const rec_op *o, const arbuf *b, const ccq_device_id *set, uint32_t n,
                  ccq_stream_id s)
{
    if (o->kind != CCQ_KIND_ALL_REDUCE || o->nparts != n || o->comm_size != n || o->count != GC ||
        o->dtype != CCQ_INT32 || o->redop != CCQ_SUM)
        return false;
    for (uint32_t r = 0; r < n; r++) {
        const ccq_be_part *p = &o->parts[r];
        if (p->rank != r || p->device != set[r] || p->stream_index != set[r] * MAX_STREAMS + s ||
            p->src != b->src[set[r]] || p->dst != b->dst[set[r]])
            return false;
    }
    return true;
}

static void expect_ar(tb *t, uint32_t batch, uint32_t k, const arbuf *b, const ccq_device_id *set,
                      uint32_t n, ccq_stream_id s, const char *what)
{
    const rec_batch *rb = tb_batch(t, batch);
    if (k >= rb->nops)
        fail_msg("%s: batch %u has %u ops, wanted op %u", what, batch, rb->nops, k);
    if (!is_ar(tb_op(t, rb, k), b, set, n, s))
        fail_msg("%s: batch %u op %u is not the expected all_reduce", what, batch, k);
}

/* The gate op: an all_reduce over A on stream s; its issue() blocks the scheduler. Returns
 * once the scheduler is blocked in it. */
static void gate_on_set(fixture *f, arbuf *g, const ccq_device_id *set, uint32_t n, ccq_stream_id s)
{
    tb_close_gate(f->t);
    arbuf_init(g, 99);
    submit_ar(f, g, set, n, s);
    tb_wait_in_gate(f->t);
}

static void gate_on(fixture *f, arbuf *g, ccq_stream_id s)
{
    gate_on_set(f, g, DEV_A, 4, s);
}

/* (a) A held batch blocks stream 0 of every device; K more matched ops queue behind it.
 * Once released, the next batch holds exactly min(K, max_batch_ops) of them, in sequence
 * order, each with every rank's part; the rest follow in full batches. */
static void run_cut(fixture *f, uint32_t k_ops, uint32_t max_ops)
{
    tb *t = f->t;
    arbuf g, *ops = calloc(k_ops, sizeof *ops);
    uint32_t base = tb_nbatches(t);

    assert_non_null(ops);
    tb_set_hold(t, true);
    gate_on(f, &g, 0);
    for (uint32_t j = 0; j < k_ops; j++) {
        arbuf_init(&ops[j], (int32_t)j);
        submit_ar(f, &ops[j], DEV_A, 4, 0);
    }
    tb_open_gate(t);
    tb_wait_batches(t, base + 1);
    expect_ar(t, base, 0, &g, DEV_A, 4, 0, "held batch");
    assert_int_equal(tb_batch(t, base)->nops, 1);

    uint32_t next = 0, batch = base + 1;
    while (next < k_ops) {
        /* Nothing more is issued while the previous batch is held. */
        assert_int_equal(tb_nbatches(t), batch);
        tb_release(t, false);
        tb_wait_batches(t, batch + 1);
        const rec_batch *rb = tb_batch(t, batch);
        uint32_t want = k_ops - next < max_ops ? k_ops - next : max_ops;
        if (rb->nops != want)
            fail_msg("batch %u: %u ops, expected min(%u left, max_batch_ops %u) = %u", batch,
                     rb->nops, k_ops - next, max_ops, want);
        for (uint32_t k = 0; k < rb->nops; k++)
            expect_ar(t, batch, k, &ops[next + k], DEV_A, 4, 0, "cut batch");
        next += rb->nops;
        batch++;
    }
    tb_set_hold(t, false);
    tb_release(t, true);
    for (ccq_device_id d = 0; d < NDEV; d++)
        fence(f, d, 0);
    assert_int_equal(tb_nbatches(t), batch);
    check_ar_result(&g, DEV_A, 4);
    for (uint32_t j = 0; j < k_ops; j++)
        check_ar_result(&ops[j], DEV_A, 4);
    free(ops);
}

static void test_batch_cut_at_max(void **state)
{
    fixture *f = *state;
    start(f, true, 8);
    run_cut(f, 20, 8); /* 8 + 8 + 4 */
    run_cut(f, 5, 8);  /* all 5 at once */
    run_cut(f, 8, 8);  /* exactly full */
    check_stats(f);
}

/* (b) With max_batch_ops = 1 every batch holds one op, even when many are ready. */
static void test_batch_max_one(void **state)
{
    fixture *f = *state;
    arbuf g, ops[9];
    start(f, true, 1);
    tb *t = f->t;

    gate_on(f, &g, 0);
    for (uint32_t j = 0; j < 6; j++) {
        arbuf_init(&ops[j], (int32_t)j);
        submit_ar(f, &ops[j], DEV_A, 4, 1 + j); /* six streams */
    }
    for (uint32_t j = 6; j < 9; j++) {
        arbuf_init(&ops[j], (int32_t)j);
        submit_ar(f, &ops[j], DEV_A, 4, 7); /* three on one stream, no overlap */
    }
    tb_open_gate(t);
    fence_all(f);
    assert_int_equal(tb_nbatches(t), 10);
    for (uint32_t i = 0; i < 10; i++)
        assert_int_equal(tb_batch(t, i)->nops, 1);
    /* Sequence order across batches: op j of A in batch j + 1. */
    expect_ar(t, 0, 0, &g, DEV_A, 4, 0, "max 1");
    for (uint32_t j = 0; j < 9; j++)
        expect_ar(t, j + 1, 0, &ops[j], DEV_A, 4, j < 6 ? 1 + j : 7, "max 1");
    for (uint32_t j = 0; j < 9; j++)
        check_ar_result(&ops[j], DEV_A, 4);
    check_stats(f);
}

/* Find the op with src pointer `src` in part 0 within a batch, or -1. */
static int find_op(tb *t, const rec_batch *rb, const void *part0_src)
{
    for (uint32_t k = 0; k < rb->nops; k++)
        if (tb_op(t, rb, k)->parts[0].src == part0_src)
            return (int)k;
    return -1;
}

/* (c) Ops on independent streams that are ready at the same time go into one batch, sorted
 * by communicator and sequence number. */
static void test_batch_independent_streams(void **state)
{
    fixture *f = *state;
    arbuf g, a[6], b, c;
    uint32_t sv[4], rv[4] = {0};
    start(f, true, 256);
    tb *t = f->t;

    for (int i = 0; i < 4; i++)
        sv[i] = 0x1000u + (uint32_t)i;
    gate_on(f, &g, 0);
    for (uint32_t j = 0; j < 6; j++) {
        arbuf_init(&a[j], (int32_t)j);
        submit_ar(f, &a[j], DEV_A, 4, 1 + j);
    }
    arbuf_init(&b, 10);
    arbuf_init(&c, 11);
    submit_ar(f, &b, DEV_B, 2, 7);
    submit_ar(f, &c, DEV_C, 2, 8);
    ok(ccq_send(f->rt, 1, 9, sv, 4, CCQ_UINT32, 3), "send");
    ok(ccq_recv(f->rt, 3, 10, rv, 4, CCQ_UINT32, 1), "recv");
    tb_open_gate(t);
    fence_all(f);

    assert_int_equal(tb_nbatches(t), 2);
    const rec_batch *rb = tb_batch(t, 1);
    assert_int_equal(rb->nops, 9);
    /* A's six first (comm A was created first), in sequence order; then B, C, and the
     * send/recv pair's comm {1,3}, created last. */
    for (uint32_t j = 0; j < 6; j++)
        expect_ar(t, 1, j, &a[j], DEV_A, 4, 1 + j, "independent streams");
    expect_ar(t, 1, 6, &b, DEV_B, 2, 7, "independent streams");
    expect_ar(t, 1, 7, &c, DEV_C, 2, 8, "independent streams");
    const rec_op *p2p = tb_op(t, rb, 8);
    assert_int_equal(p2p->kind, CCQ_KIND_SEND);
    assert_int_equal(p2p->nparts, 2);
    assert_int_equal(p2p->count, 4);
    assert_int_equal(p2p->parts[0].device, 1);
    assert_ptr_equal(p2p->parts[0].src, sv);
    assert_null(p2p->parts[0].dst);
    assert_int_equal(p2p->parts[0].stream_index, 1 * MAX_STREAMS + 9);
    assert_int_equal(p2p->parts[1].device, 3);
    assert_ptr_equal(p2p->parts[1].dst, rv);
    assert_null(p2p->parts[1].src);
    assert_int_equal(p2p->parts[1].stream_index, 3 * MAX_STREAMS + 10);
    assert_memory_equal(sv, rv, sizeof sv);
    for (uint32_t j = 0; j < 6; j++)
        check_ar_result(&a[j], DEV_A, 4);
    check_ar_result(&b, DEV_B, 2);
    check_ar_result(&c, DEV_C, 2);
    check_stats(f);
}

/* (d) A command whose stream predecessor is in a held batch is not issued until that batch
 * completes, while ops on other streams go ahead; and a command behind one that is still
 * missing parts waits for it, then both go in one batch. */
static void test_batch_stream_order(void **state)
{
    fixture *f = *state;
    arbuf g, y, zb, zc, s1, w1;
    uint32_t sv[4] = {1, 2, 3, 4}, rv[4] = {0};
    start(f, true, 256);
    tb *t = f->t;

    tb_set_hold(t, true);
    gate_on(f, &g, 0); /* batch 0, held */
    arbuf_init(&y, 1);
    submit_ar(f, &y, DEV_A, 4, 0); /* behind the held batch on stream 0 */
    arbuf_init(&zb, 2);
    arbuf_init(&zc, 3);
    submit_ar(f, &zb, DEV_B, 2, 1); /* other streams, other comms: free to go */
    submit_ar(f, &zc, DEV_C, 2, 1);
    tb_open_gate(t);
    tb_wait_batches(t, 2);
    const rec_batch *rb = tb_batch(t, 1);
    assert_int_equal(rb->nops, 2);
    expect_ar(t, 1, 0, &zb, DEV_B, 2, 1, "stream order");
    expect_ar(t, 1, 1, &zc, DEV_C, 2, 1, "stream order");
    assert_int_equal(find_op(t, rb, y.src[0]), -1);

    /* Completing the other streams' batch does not free stream 0: a sentinel submitted
     * after that completion was processed is issued, y still is not. */
    tb_release_index(t, 1);
    for (ccq_device_id d = 0; d < NDEV; d++)
        fence(f, d, 1);
    arbuf_init(&s1, 4);
    submit_ar(f, &s1, DEV_C, 2, 3);
    tb_wait_batches(t, 3);
    rb = tb_batch(t, 2);
    assert_int_equal(rb->nops, 1);
    expect_ar(t, 2, 0, &s1, DEV_C, 2, 3, "sentinel");
    assert_int_equal(find_op(t, rb, y.src[0]), -1);
    tb_release_index(t, 2);
    fence(f, 2, 3);
    fence(f, 3, 3);
    assert_int_equal(tb_nbatches(t), 3);

    /* Completing the held batch frees it. */
    tb_release_index(t, 0);
    tb_wait_batches(t, 4);
    rb = tb_batch(t, 3);
    assert_int_equal(rb->nops, 1);
    expect_ar(t, 3, 0, &y, DEV_A, 4, 0, "after the held batch");
    tb_set_hold(t, false);
    tb_release(t, true);
    fence_all(f);
    assert_int_equal(tb_nbatches(t), 4);
    check_ar_result(&s1, DEV_C, 2);

    /* Behind a command that is missing a part: device 0 stream 2 has an all_reduce over B
     * (device 1's part not yet submitted), then a send to device 2. */
    uint32_t before = tb_nbatches(t);
    arbuf_init(&w1, 5);
    arbuf z2;
    arbuf_init(&z2, 6);
    gate_on(f, &g, 0);
    ok(ccq_all_reduce(f->rt, 0, 2, w1.src[0], w1.dst[0], GC, CCQ_INT32, CCQ_SUM, DEV_B, 2),
       "w1 part 0");
    ok(ccq_send(f->rt, 0, 2, sv, 4, CCQ_UINT32, 2), "send");
    ok(ccq_recv(f->rt, 2, 2, rv, 4, CCQ_UINT32, 0), "recv");
    submit_ar(f, &z2, DEV_C, 2, 3); /* a sentinel that can go */
    tb_open_gate(t);
    fence(f, 2, 3);
    fence(f, 3, 3);
    /* The gate batch and the sentinel went; the send did not. */
    assert_int_equal(tb_nbatches(t), before + 2);
    rb = tb_batch(t, before + 1);
    assert_int_equal(rb->nops, 1);
    expect_ar(t, before + 1, 0, &z2, DEV_C, 2, 3, "sentinel");
    /* Now the missing part: the all_reduce and the send go, together. */
    ok(ccq_all_reduce(f->rt, 1, 2, w1.src[1], w1.dst[1], GC, CCQ_INT32, CCQ_SUM, DEV_B, 2),
       "w1 part 1");
    fence_all(f);
    assert_int_equal(tb_nbatches(t), before + 3);
    rb = tb_batch(t, before + 2);
    assert_int_equal(rb->nops, 2);
    expect_ar(t, before + 2, 0, &w1, DEV_B, 2, 2, "w1");
    assert_int_equal(tb_op(t, rb, 1)->kind, CCQ_KIND_SEND);
    assert_memory_equal(sv, rv, sizeof sv);
    check_ar_result(&g, DEV_A, 4);
    check_ar_result(&y, DEV_A, 4);
    check_ar_result(&zb, DEV_B, 2);
    check_ar_result(&zc, DEV_C, 2);
    check_ar_result(&w1, DEV_B, 2);
    check_ar_result(&z2, DEV_C, 2);
    check_stats(f);
}

/* (e) A ring of send-then-recv (and recv-then-send) over 4 devices with max_batch_ops = 1
 * completes: the pairs can only run together, so they go in one batch beyond the limit. */
static void test_ring_beyond_max(void **state)
{
    fixture *f = *state;
    uint32_t s[NDEV][GC], r[NDEV][GC];
    start(f, true, 1);
    tb *t = f->t;

    for (int order = 0; order < 2; order++) {
        uint32_t before = tb_nbatches(t);
        for (uint32_t d = 0; d < NDEV; d++)
            for (int i = 0; i < GC; i++) {
                s[d][i] = (uint32_t)order * 1000u + d * 100u + (uint32_t)i;
                r[d][i] = 0;
            }
        for (uint32_t d = 0; d < NDEV; d++) {
            uint32_t to = (d + 1) % NDEV, from = (d + NDEV - 1) % NDEV;
            if (order == 0) {
                ok(ccq_send(f->rt, d, 0, s[d], GC, CCQ_UINT32, to), "send");
                ok(ccq_recv(f->rt, d, 0, r[d], GC, CCQ_UINT32, from), "recv");
            } else {
                ok(ccq_recv(f->rt, d, 0, r[d], GC, CCQ_UINT32, from), "recv");
                ok(ccq_send(f->rt, d, 0, s[d], GC, CCQ_UINT32, to), "send");
            }
        }
        for (uint32_t d = 0; d < NDEV; d++)
            fence(f, d, 0);
        for (uint32_t d = 0; d < NDEV; d++)
            assert_memory_equal(r[d], s[(d + NDEV - 1) % NDEV], sizeof r[d]);
        /* No subset of the ring can run alone, so it was one batch of all four pairs. */
        assert_int_equal(tb_nbatches(t), before + 1);
        const rec_batch *rb = tb_batch(t, before);
        assert_int_equal(rb->nops, NDEV);
        bool seen[NDEV] = {false};
        for (uint32_t k = 0; k < rb->nops; k++) {
            const rec_op *o = tb_op(t, rb, k);
            assert_int_equal(o->kind, CCQ_KIND_SEND);
            assert_int_equal(o->nparts, 2);
            uint32_t from = o->parts[0].device;
            assert_true(from < NDEV);
            assert_false(seen[from]);
            seen[from] = true;
            assert_ptr_equal(o->parts[0].src, s[from]);
            assert_int_equal(o->parts[1].device, (from + 1) % NDEV);
            assert_ptr_equal(o->parts[1].dst, r[(from + 1) % NDEV]);
        }
    }
    check_stats(f);
}

/* Hazards on one stream: chained in-place all_reduces go in separate batches, in order;
 * non-overlapping ones share a batch; a send of an all_reduce's output waits for it. */
static void test_batch_hazards(void **state)
{
    fixture *f = *state;
    arbuf g, h, j1, j2;
    int32_t x[NDEV][GC];
    start(f, true, 256);
    tb *t = f->t;

    /* Chained in place on stream 1: x -> sum -> sum. */
    for (int d = 0; d < NDEV; d++)
        for (int i = 0; i < GC; i++)
            x[d][i] = d * 10 + i;
    gate_on(f, &g, 0);
    for (int rep = 0; rep < 2; rep++)
        for (uint32_t d = 0; d < NDEV; d++)
            ok(ccq_all_reduce(f->rt, d, 1, x[d], x[d], GC, CCQ_INT32, CCQ_SUM, DEV_A, 4), "ar");
    tb_open_gate(t);
    fence_all(f);
    assert_int_equal(tb_nbatches(t), 3);
    for (uint32_t i = 1; i < 3; i++) {
        const rec_batch *rb = tb_batch(t, i);
        assert_int_equal(rb->nops, 1);
        assert_ptr_equal(tb_op(t, rb, 0)->parts[0].src, x[0]);
    }
    for (int d = 0; d < NDEV; d++)
        for (int i = 0; i < GC; i++)
            assert_int_equal(x[d][i], 4 * (0 + 10 + 20 + 30 + 4 * i));

    /* Not overlapping on one stream: one batch. */
    arbuf_init(&j1, 1);
    arbuf_init(&j2, 2);
    gate_on(f, &g, 0);
    submit_ar(f, &j1, DEV_A, 4, 1);
    submit_ar(f, &j2, DEV_A, 4, 1);
    tb_open_gate(t);
    fence_all(f);
    assert_int_equal(tb_nbatches(t), 5);
    assert_int_equal(tb_batch(t, 4)->nops, 2);
    expect_ar(t, 4, 0, &j1, DEV_A, 4, 1, "no hazard");
    expect_ar(t, 4, 1, &j2, DEV_A, 4, 1, "no hazard");
    check_ar_result(&j1, DEV_A, 4);
    check_ar_result(&j2, DEV_A, 4);

    /* Out of place chain: h.src -> h.dst, then a send of h.dst on device 0's stream 1 and
     * an all_reduce that reads h.dst on every device's stream 1 (read after write). */
    int32_t z[GC] = {0}, q[NDEV][GC];
    arbuf_init(&h, 3);
    gate_on(f, &g, 0);
    submit_ar(f, &h, DEV_A, 4, 1);
    ok(ccq_send(f->rt, 0, 1, h.dst[0], GC, CCQ_INT32, 2), "send");
    ok(ccq_recv(f->rt, 2, 4, z, GC, CCQ_INT32, 0), "recv");
    for (uint32_t d = 0; d < NDEV; d++)
        ok(ccq_all_reduce(f->rt, d, 1, h.dst[d], q[d], GC, CCQ_INT32, CCQ_MAX, DEV_A, 4), "ar");
    tb_open_gate(t);
    fence_all(f);
    /* Gate, then h alone; then the send and the max (they only read h.dst) together. */
    assert_int_equal(tb_nbatches(t), 8);
    const rec_batch *rb = tb_batch(t, 6);
    assert_int_equal(rb->nops, 1);
    expect_ar(t, 6, 0, &h, DEV_A, 4, 1, "before its readers");
    rb = tb_batch(t, 7);
    assert_int_equal(rb->nops, 2);
    assert_int_equal(tb_op(t, rb, 0)->kind, CCQ_KIND_ALL_REDUCE);
    assert_int_equal(tb_op(t, rb, 1)->kind, CCQ_KIND_SEND);
    check_ar_result(&h, DEV_A, 4);
    assert_memory_equal(z, h.dst[0], sizeof z);
    for (uint32_t d = 0; d < NDEV; d++)
        assert_memory_equal(q[d], h.dst[0], sizeof q[d]);
    check_stats(f);
}

/* ====================================================================================== */
/* A stream walk that is blocked part-way must leave nothing behind                      */
/* ====================================================================================== */

/*
 * Devices 0 and 1 queue, on stream 0, in place on one buffer: all_reduce over A, all_reduce
 * over B, all_reduce over A; devices 2 and 3 queue the two all_reduces over A. Each op must
 * wait for the previous one on its stream (they all write the same buffer), so the batches
 * are {A#0}, {B#0}, {A#1}, and the result is x -> S -> 2S on devices 0, 1 -> 6S.
 *
 * On the recording backend the commands are queued while the scheduler is held in the gate
 * (an op on C = {2,3}, stream 5), so the scheduler finds them all in one drain and lists
 * A's channel before B's: after {A#0} completes it first tries A#1, whose walk along
 * device 0's stream passes B#0 (ready) and then stops at the hazard before A#1.
 */
static void queue_a_b_a(fixture *f, int32_t (*x)[GC])
{
    for (uint32_t d = 0; d < NDEV; d++)
        for (int i = 0; i < GC; i++)
            x[d][i] = (int32_t)(d * 10 + (uint32_t)i);
    for (uint32_t d = 0; d < NDEV; d++) {
        ok(ccq_all_reduce(f->rt, d, 0, x[d], x[d], GC, CCQ_INT32, CCQ_SUM, DEV_A, 4), "A#0");
        if (d < 2)
            ok(ccq_all_reduce(f->rt, d, 0, x[d], x[d], GC, CCQ_INT32, CCQ_SUM, DEV_B, 2), "B#0");
        ok(ccq_all_reduce(f->rt, d, 0, x[d], x[d], GC, CCQ_INT32, CCQ_SUM, DEV_A, 4), "A#1");
    }
}

static void check_a_b_a(int32_t (*x)[GC])
{
    for (uint32_t d = 0; d < NDEV; d++)
        for (int i = 0; i < GC; i++)
            assert_int_equal(x[d][i], 6 * (60 + 4 * i));
}

static void test_blocked_walk_recording(void **state)
{
    fixture *f = *state;
    arbuf g;
    int32_t x[NDEV][GC];
    start(f, true, 256);
    tb *t = f->t;

    gate_on_set(f, &g, DEV_C, 2, 5);
    queue_a_b_a(f, x);
    tb_open_gate(t);
    fence_all(f);
    check_a_b_a(x);
    assert_int_equal(tb_nbatches(t), 4);
    for (uint32_t i = 1; i < 4; i++) {
        const rec_batch *rb = tb_batch(t, i);
        assert_int_equal(rb->nops, 1);
        const rec_op *o = tb_op(t, rb, 0);
        assert_int_equal(o->nparts, i == 2 ? 2 : 4);
        assert_ptr_equal(o->parts[0].src, x[0]);
    }
    check_stats(f);
}

/* The same on the host backend, repeated (there the order in which the scheduler meets the
 * channels depends on when the parts arrive). */
static void test_blocked_walk_host(void **state)
{
    fixture *f = *state;
    int32_t x[NDEV][GC];
    start(f, false, 256);

    for (int rep = 0; rep < 20; rep++) {
        queue_a_b_a(f, x);
        for (ccq_device_id d = 0; d < NDEV; d++)
            fence(f, d, 0);
        check_a_b_a(x);
    }
    check_stats(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_interleaved_host, setup, teardown),
        cmocka_unit_test_setup_teardown(test_interleaved_recording, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chained_in_place_host, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reduce_then_send_host, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_cut_at_max, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_max_one, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_independent_streams, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_stream_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ring_beyond_max, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_hazards, setup, teardown),
        cmocka_unit_test_setup_teardown(test_blocked_walk_recording, setup, teardown),
        cmocka_unit_test_setup_teardown(test_blocked_walk_host, setup, teardown),
    };
    /* CCQ_TEST_FILTER=pattern runs only the matching tests (cmocka's wildcard syntax). */
    const char *filter = getenv("CCQ_TEST_FILTER");
    if (filter != NULL && *filter != '\0')
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests_name("matching", tests, NULL, NULL);
}
