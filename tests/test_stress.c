/* Seeded stress: a random schedule of all_reduce and send/recv over random communicators,
 * dtypes, ops, counts and streams, submitted by T threads per device, every result checked
 * against the reference; and the same harness with one part deliberately never submitted.
 *
 * How the schedule stays deterministic with many submitting threads. DESIGN rule 3 matches
 * a communicator's collectives by per-(communicator, rank) order, and a send/recv direction
 * by per-pair order, so every rank must submit them in one agreed order. Each communicator
 * and each directed (src, dst) pair therefore belongs to one "lane" 0..T-1, and each
 * (device, lane) has its own thread and its own stream (stream id = lane). A thread walks
 * the global schedule and submits exactly the parts of the ops of its lane that involve its
 * device, so the parts of one communicator or pair come from one thread per device, in
 * schedule order, while the T lanes of a device run concurrently. It cannot deadlock: the
 * lowest unfinished op of a lane only waits for parts whose threads wait on nothing later.
 *
 * Every input is a function of (seed, op index, device), so a thread knows the expected
 * result of each of its parts after the fence that covers it (ref_allreduce of the ranks'
 * inputs, computed once per op and shared by its parts, or the sender's input for a recv)
 * and also checks that sources were not written. Threads fence every 1..ST_FENCE_MAX of
 * their ops, at random; buffers are private to one part and freed after it is verified.
 * The runtime's queue_depth, max_batch_ops, spin_us and host_workers are drawn from the
 * seed too, so schedules also cover backpressure and batch cuts.
 *
 * Knobs (environment): CCQ_STRESS_SEED (first seed; default fixed), CCQ_STRESS_THREADS (T,
 * lanes per device, default 2), CCQ_STRESS_OPS (ops per schedule; a smaller value runs a
 * prefix of the same schedule, which helps to shrink a failure), CCQ_STRESS_DEVICES
 * (default 6), CCQ_STRESS_SECONDS (if set, run schedules seed, seed+1, ... until that much
 * time has passed: bench/soak.sh), CCQ_STRESS_FILTER (a cmocka test-name filter). The
 * stress case prints "STRESS ops=N parts=P errors=E seconds=S seeds=K ..." on stdout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "ccq.h"
#include "ref.h"

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define ST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define ST_SANITIZED 1
#endif
#endif
#ifndef ST_SANITIZED
#define ST_SANITIZED 0
#endif

enum {
    ST_MAX_DEV = 16,
    ST_MAX_LANES = 64,
    ST_MAX_COMMS = 32,
    ST_FENCE_MAX = 8,     /* a thread fences after every 1..ST_FENCE_MAX of its ops */
    ST_SMALL_MAX = 5000,  /* most counts are 0..ST_SMALL_MAX */
    ST_LARGE_MIN = 65536, /* some reach the host backend's worker pool (>= 2 chunks of */
    ST_LARGE_MAX = 140000 /* 256 KiB for 4- and 8-byte types) */
};

#define ST_DEFAULT_SEED    20261201u
#define ST_DEFAULT_DEVICES 6u
#define ST_DEFAULT_THREADS 2u
/* Ops per schedule in CI: a few seconds normally, well under 90 s with ThreadSanitizer. */
#define ST_DEFAULT_OPS (ST_SANITIZED ? 4000u : 10000u)

/* ------------------------------------------------------------------------------------ */
/* Random numbers and knobs                                                              */
/* ------------------------------------------------------------------------------------ */

/* splitmix64's finaliser: a good 64-bit mix. */
static uint64_t st_mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t st_next(uint64_t *state)
{
    *state += 0x9e3779b97f4a7c15ull;
    return st_mix(*state);
}

static uint32_t st_below(uint64_t *state, uint32_t n)
{
    return (uint32_t)(st_next(state) % n);
}

/* A value that depends only on (seed, op, device, salt): what every thread agrees on. */
static uint64_t st_hash(uint64_t seed, uint32_t op, uint32_t dev, uint32_t salt)
{
    return st_mix(seed ^ st_mix(((uint64_t)op << 24) ^ ((uint64_t)dev << 8) ^ salt));
}

/* An unsigned environment knob; a malformed value fails the test rather than being
 * silently replaced. */
static uint64_t st_env_u64(const char *name, uint64_t dflt, uint64_t min, uint64_t max)
{
    const char *v = getenv(name);
    char *end;
    if (v == NULL || *v == '\0')
        return dflt;
    unsigned long long x = strtoull(v, &end, 0);
    if (*end != '\0' || x < min || x > max)
        fail_msg("%s=%s: expected an integer in %" PRIu64 "..%" PRIu64, name, v, min, max);
    return x;
}

static double st_env_seconds(void)
{
    const char *v = getenv("CCQ_STRESS_SECONDS");
    char *end;
    if (v == NULL || *v == '\0')
        return 0;
    double x = strtod(v, &end);
    if (*end != '\0' || !(x >= 0))
        fail_msg("CCQ_STRESS_SECONDS=%s: expected a number of seconds", v);
    return x;
}

static double st_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------------------------------ */
/* The schedule                                                                          */
/* ------------------------------------------------------------------------------------ */

typedef enum st_kind { ST_AR, ST_P2P } st_kind;
typedef enum st_role { ST_ROLE_AR, ST_ROLE_SEND, ST_ROLE_RECV } st_role;

typedef struct st_comm {
    uint32_t n, lane;
    ccq_device_id dev[ST_MAX_DEV]; /* sorted */
} st_comm;

typedef struct st_op {
    st_kind kind;
    ccq_dtype dtype;
    ccq_reduce_op redop; /* ST_AR */
    uint32_t lane;
    uint32_t comm;          /* ST_AR: index into st_sched.comms */
    ccq_device_id src, dst; /* ST_P2P */
    int recv_first;         /* ST_P2P with src == dst: submit order on the one stream */
    size_t count;
    /* Failure case: the part (skip_role, skip_dev) is never submitted, so the op's other
     * parts must fail with CCQ_ERR_TIMEOUT. skip_dev < 0: a normal op. */
    int skip_dev;
    st_role skip_role;
} st_op;

typedef struct st_sched {
    uint64_t seed;
    uint32_t ndev, lanes, nops, ncomm;
    st_comm comms[ST_MAX_COMMS];
    uint32_t pair_lane[ST_MAX_DEV][ST_MAX_DEV]; /* lane of direction src -> dst */
    st_op *ops;
    /* Runtime configuration, drawn from the seed too. */
    uint32_t queue_depth, max_batch_ops, spin_us, host_workers;
    uint64_t timeout_ms;
    uint64_t expected_failed; /* parts that must end failed (failure case) */
} st_sched;

static uint32_t st_pick(uint64_t *r, const uint32_t *v, size_t n)
{
    return v[st_below(r, (uint32_t)n)];
}

static size_t st_draw_count(uint64_t *r, int large_ok)
{
    uint32_t x = st_below(r, 100);
    if (x < 4 && large_ok)
        return ST_LARGE_MIN + st_below(r, ST_LARGE_MAX - ST_LARGE_MIN + 1);
    if (x < 14)
        return st_below(r, 17); /* 0..16, empty ones included */
    return st_below(r, ST_SMALL_MAX + 1);
}

static int st_comm_has(const st_comm *c, ccq_device_id d)
{
    for (uint32_t k = 0; k < c->n; k++)
        if (c->dev[k] == d)
            return 1;
    return 0;
}

/*
 * Draw a schedule. Everything that is not an op (configuration, communicators, lanes) is
 * drawn first and the ops one after another from the same stream of numbers, so a smaller
 * nops gives a prefix of the same schedule. with_failures appends, after the normal ops,
 * one all_reduce on a communicator of >= 2 ranks that one rank never submits and one send
 * whose recv is never submitted. They come last (and on different lanes when there are
 * two), so no other op waits behind them and everything else still completes
 * (deterministically, as long as normal ops finish well within timeout_ms).
 */
static void st_make(st_sched *s, uint64_t seed, uint32_t ndev, uint32_t lanes, uint32_t nops,
                    int with_failures, int large_ok, uint64_t timeout_ms)
{
    static const uint32_t depths[] = {2, 3, 8, 64, 1024, 1024};
    static const uint32_t batch[] = {1, 2, 7, 64, 256, 256};
    static const uint32_t spins[] = {0, 50, 50, 200};
    static const uint32_t workers[] = {1, 2, 3};
    uint64_t r = st_mix(seed ^ 0x5eed5eed5eedull);
    uint64_t masks[ST_MAX_COMMS];

    memset(s, 0, sizeof *s);
    s->seed = seed;
    s->ndev = ndev;
    s->lanes = lanes;
    s->timeout_ms = timeout_ms;
    /* queue_depth >= 2: a self send and its recv come from one thread on one stream, so
     * with depth 1 the recv could never be queued while the send waits for it. */
    s->queue_depth = st_pick(&r, depths, sizeof depths / sizeof depths[0]);
    s->max_batch_ops = st_pick(&r, batch, sizeof batch / sizeof batch[0]);
    s->spin_us = st_pick(&r, spins, sizeof spins / sizeof spins[0]);
    s->host_workers = st_pick(&r, workers, sizeof workers / sizeof workers[0]);

    /* Communicators: the full set, then random subsets of 1..ndev devices. */
    uint32_t want = ndev + 6 < ST_MAX_COMMS ? ndev + 6 : ST_MAX_COMMS;
    for (uint32_t tries = 0; s->ncomm < want && tries < 1000; tries++) {
        st_comm *c = &s->comms[s->ncomm];
        ccq_device_id perm[ST_MAX_DEV];
        uint64_t m = 0;
        c->n = s->ncomm == 0 ? ndev : 1 + st_below(&r, ndev);
        for (uint32_t k = 0; k < ndev; k++)
            perm[k] = k;
        for (uint32_t k = 0; k < c->n; k++) {
            uint32_t j = k + st_below(&r, ndev - k);
            ccq_device_id x = perm[k];
            perm[k] = perm[j];
            perm[j] = x;
            m |= 1ull << perm[k];
        }
        uint32_t dup = 0;
        for (uint32_t p = 0; p < s->ncomm; p++)
            dup |= masks[p] == m;
        if (dup)
            continue;
        masks[s->ncomm] = m;
        c->n = 0;
        for (uint32_t k = 0; k < ndev; k++)
            if (m >> k & 1)
                c->dev[c->n++] = k;
        c->lane = st_below(&r, lanes);
        s->ncomm++;
    }
    for (uint32_t a = 0; a < ndev; a++)
        for (uint32_t b = 0; b < ndev; b++)
            s->pair_lane[a][b] = st_below(&r, lanes);

    s->nops = nops + (with_failures ? 2 : 0);
    s->ops = calloc(s->nops ? s->nops : 1, sizeof *s->ops);
    assert_non_null(s->ops);
    for (uint32_t i = 0; i < nops; i++) {
        st_op *op = &s->ops[i];
        op->skip_dev = -1;
        op->dtype = (ccq_dtype)st_below(&r, CCQ_DTYPE_COUNT_);
        op->redop = (ccq_reduce_op)st_below(&r, CCQ_REDUCE_OP_COUNT_);
        op->count = st_draw_count(&r, large_ok);
        if (st_below(&r, 100) < 65) {
            op->kind = ST_AR;
            op->comm = st_below(&r, s->ncomm);
            op->lane = s->comms[op->comm].lane;
        } else {
            op->kind = ST_P2P;
            op->src = st_below(&r, ndev);
            op->dst = st_below(&r, 4) == 0 ? op->src : st_below(&r, ndev);
            op->recv_first = (int)st_below(&r, 2);
            op->lane = s->pair_lane[op->src][op->dst];
        }
    }
    if (!with_failures)
        return;

    /* An all_reduce that one rank never submits: its other n-1 parts fail. */
    st_op *f = &s->ops[nops];
    uint32_t c;
    do
        c = st_below(&r, s->ncomm);
    while (s->comms[c].n < 2);
    f->kind = ST_AR;
    f->comm = c;
    f->lane = s->comms[c].lane;
    f->dtype = CCQ_FLOAT32;
    f->redop = CCQ_SUM;
    f->count = 1000;
    f->skip_dev = (int)s->comms[c].dev[st_below(&r, s->comms[c].n)];
    f->skip_role = ST_ROLE_AR;
    s->expected_failed += s->comms[c].n - 1;

    /* A send whose recv never comes (on another lane when there is one). */
    f = &s->ops[nops + 1];
    f->kind = ST_P2P;
    for (uint32_t tries = 0;; tries++) {
        f->src = st_below(&r, ndev);
        do
            f->dst = st_below(&r, ndev);
        while (f->dst == f->src);
        f->lane = s->pair_lane[f->src][f->dst];
        if (f->lane != s->ops[nops].lane || tries > 100)
            break;
    }
    f->dtype = CCQ_INT32;
    f->count = 777;
    f->skip_dev = (int)f->dst;
    f->skip_role = ST_ROLE_RECV;
    s->expected_failed += 1;
}

/* ------------------------------------------------------------------------------------ */
/* Threads                                                                               */
/* ------------------------------------------------------------------------------------ */

/*
 * The expected result of an all_reduce, computed once by the first of its parts to be
 * verified and freed by the last (left counts the parts that will be submitted and are not
 * yet done with it). Guarded by one of ST_LOCKS striped mutexes.
 */
typedef struct st_slot {
    void *want;
    uint32_t left;
} st_slot;

enum { ST_LOCKS = 64 };

typedef struct st_run {
    const st_sched *s;
    ccq_runtime *rt;
    pthread_barrier_t start;
    atomic_int stop; /* set on the first submit or fence failure: threads wind down */
    st_slot *slots;  /* [s->nops] */
    pthread_mutex_t locks[ST_LOCKS];
} st_run;

/* One submitted part, kept until the fence that covers it has been verified. */
typedef struct st_part {
    uint32_t op;
    st_role role;
    void *src_mem, *dst_mem; /* allocations; dst_mem is NULL in place and for a send */
    void *src, *dst;         /* dst == src in place */
} st_part;

typedef struct st_thread {
    pthread_t th;
    st_run *run;
    ccq_device_id dev;
    uint32_t lane;
    st_part *pending;
    uint32_t npending, cap;
    uint64_t submitted, verified, expected_failed, timeout_fences, errors;
    char first_error[768];
} st_thread;

static void st_error(st_thread *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void st_error(st_thread *t, const char *fmt, ...)
{
    va_list ap;
    t->errors++;
    if (t->errors > 1)
        return;
    int w = snprintf(t->first_error, sizeof t->first_error, "device %u lane %u: ", t->dev, t->lane);
    va_start(ap, fmt);
    vsnprintf(t->first_error + w, sizeof t->first_error - (size_t)w, fmt, ap);
    va_end(ap);
}

/*
 * Inputs come from one pool per dtype, filled once by ref_fill from a fixed seed: the input
 * of (op, device) is the slice at an offset drawn from (seed, op, device). Filling every
 * buffer with ref_fill instead made the reference (its narrow-float encoder) take over 90%
 * of the run; slices of a shared pool keep the same values for a memcpy. The pool is
 * written before any thread starts and read-only afterwards.
 */
enum { ST_POOL = 1 << 18 };
static unsigned char *st_pool[CCQ_DTYPE_COUNT_];

static void st_pool_init(void)
{
    for (int d = 0; d < CCQ_DTYPE_COUNT_; d++) {
        if (st_pool[d] != NULL)
            continue;
        st_pool[d] = malloc((size_t)ST_POOL * ref_dtype_size((ccq_dtype)d));
        assert_non_null(st_pool[d]);
        ref_fill((ccq_dtype)d, st_pool[d], ST_POOL, 0x9001u + (uint32_t)d);
    }
}

static void st_pool_free(void)
{
    for (int d = 0; d < CCQ_DTYPE_COUNT_; d++) {
        free(st_pool[d]);
        st_pool[d] = NULL;
    }
}

static const void *st_input(const st_sched *s, uint32_t op, ccq_device_id dev)
{
    const st_op *o = &s->ops[op];
    size_t off = (size_t)(st_hash(s->seed, op, dev, 1) % (ST_POOL - o->count + 1));
    return st_pool[o->dtype] + off * ref_dtype_size(o->dtype);
}

/* Per part: in place about one time in three, and a start 0..3 elements past a 64-byte
 * boundary so that the kernels see unaligned buffers too. */
static int st_in_place(const st_sched *s, uint32_t op, ccq_device_id dev)
{
    return st_hash(s->seed, op, dev, 2) % 3 == 0;
}

static void *st_alloc(const st_sched *s, uint32_t op, ccq_device_id dev, uint32_t salt,
                      size_t bytes, size_t esize, void **mem)
{
    size_t off = (size_t)(st_hash(s->seed, op, dev, salt) % 4) * esize;
    size_t total = (bytes + off + 63) / 64 * 64;
    *mem = aligned_alloc(64, total ? total : 64);
    return *mem ? (char *)*mem + off : NULL;
}

static pthread_mutex_t *st_lock_of(st_run *run, uint32_t op)
{
    return &run->locks[op % ST_LOCKS];
}

/* The part is done with its slot; the last one frees it. */
static void st_slot_release(st_run *run, uint32_t op)
{
    st_slot *sl = &run->slots[op];
    pthread_mutex_lock(st_lock_of(run, op));
    if (--sl->left == 0) {
        free(sl->want);
        sl->want = NULL;
    }
    pthread_mutex_unlock(st_lock_of(run, op));
}

static void st_describe(const st_sched *s, uint32_t i, char *buf, size_t len)
{
    const st_op *op = &s->ops[i];
    if (op->kind == ST_AR) {
        const st_comm *c = &s->comms[op->comm];
        int w = snprintf(buf, len, "op %u all_reduce %s %s x %zu on {", i,
                         ccq_dtype_name(op->dtype), ccq_reduce_op_name(op->redop), op->count);
        for (uint32_t k = 0; k < c->n && w > 0 && (size_t)w < len; k++)
            w += snprintf(buf + w, len - (size_t)w, k ? ",%u" : "%u", c->dev[k]);
        if (w > 0 && (size_t)w < len)
            snprintf(buf + w, len - (size_t)w, "}");
    } else {
        snprintf(buf, len, "op %u send/recv %s x %zu %u -> %u", i, ccq_dtype_name(op->dtype),
                 op->count, op->src, op->dst);
    }
}

/* Queue one part; on success it joins the thread's pending list. */
static int st_submit(st_thread *t, uint32_t i, st_role role)
{
    const st_sched *s = t->run->s;
    const st_op *op = &s->ops[i];
    const size_t es = ref_dtype_size(op->dtype), bytes = op->count * es;
    st_part p;
    ccq_status st;
    char what[160];

    memset(&p, 0, sizeof p);
    p.op = i;
    p.role = role;
    if (t->npending == t->cap) {
        uint32_t ncap = t->cap ? 2 * t->cap : 16;
        st_part *np = realloc(t->pending, ncap * sizeof *np);
        if (np == NULL) {
            st_error(t, "out of memory");
            return -1;
        }
        t->pending = np;
        t->cap = ncap;
    }
    if (role != ST_ROLE_RECV) {
        p.src = st_alloc(s, i, t->dev, 3, bytes, es, &p.src_mem);
        if (p.src == NULL)
            goto oom;
        memcpy(p.src, st_input(s, i, t->dev), bytes);
    }
    if (role == ST_ROLE_RECV || (role == ST_ROLE_AR && !st_in_place(s, i, t->dev))) {
        p.dst = st_alloc(s, i, t->dev, 4, bytes, es, &p.dst_mem);
        if (p.dst == NULL)
            goto oom;
        memset(p.dst, 0xa5, bytes); /* so an op that writes nothing is seen */
    } else if (role == ST_ROLE_AR) {
        p.dst = p.src;
    }
    switch (role) {
    case ST_ROLE_AR: {
        const st_comm *c = &s->comms[op->comm];
        st = ccq_all_reduce(t->run->rt, t->dev, t->lane, p.src, p.dst, op->count, op->dtype,
                            op->redop, c->dev, c->n);
        break;
    }
    case ST_ROLE_SEND:
        st = ccq_send(t->run->rt, t->dev, t->lane, p.src, op->count, op->dtype, op->dst);
        break;
    default:
        st = ccq_recv(t->run->rt, t->dev, t->lane, p.dst, op->count, op->dtype, op->src);
        break;
    }
    if (st != CCQ_OK) {
        st_describe(s, i, what, sizeof what);
        st_error(t, "%s: submit (%s): %s: %s", what,
                 role == ST_ROLE_AR     ? "all_reduce"
                 : role == ST_ROLE_SEND ? "send"
                                        : "recv",
                 ccq_status_name(st), ccq_last_error_detail());
        free(p.src_mem);
        free(p.dst_mem);
        return -1;
    }
    t->pending[t->npending++] = p;
    t->submitted++;
    return 0;
oom:
    free(p.src_mem);
    free(p.dst_mem);
    st_error(t, "out of memory");
    return -1;
}

/* Check one completed part against the reference. */
static void st_verify(st_thread *t, const st_part *p)
{
    st_run *run = t->run;
    const st_sched *s = run->s;
    const st_op *op = &s->ops[p->op];
    char msg[256], what[160];
    const void *want;
    size_t bad;

    st_describe(s, p->op, what, sizeof what);
    if (p->role == ST_ROLE_AR) {
        const st_comm *c = &s->comms[op->comm];
        st_slot *sl = &run->slots[p->op];
        pthread_mutex_lock(st_lock_of(run, p->op));
        if (sl->want == NULL) {
            const void *inputs[ST_MAX_DEV];
            for (uint32_t k = 0; k < c->n; k++)
                inputs[k] = st_input(s, p->op, c->dev[k]);
            sl->want = malloc(op->count * ref_dtype_size(op->dtype) + 1);
            if (sl->want != NULL)
                ref_allreduce(op->dtype, op->redop, c->n, inputs, sl->want, op->count);
        }
        want = sl->want;
        pthread_mutex_unlock(st_lock_of(run, p->op));
        if (want == NULL) {
            st_error(t, "out of memory");
            return;
        }
        /* The slot stays until this part releases it, so want is read unlocked. */
        bad = ref_compare(op->dtype, p->dst, want, op->count, msg, sizeof msg);
        if (bad != 0) {
            st_error(t, "%s: %s: %zu wrong elements: %s", what,
                     p->dst == p->src ? "in place" : "out of place", bad, msg);
            return;
        }
        if (p->dst != p->src) {
            bad = ref_compare(op->dtype, p->src, st_input(s, p->op, t->dev), op->count, msg,
                              sizeof msg);
            if (bad != 0) {
                st_error(t, "%s: source written (%zu elements): %s", what, bad, msg);
                return;
            }
        }
    } else {
        /* A send's source must be intact; a recv must hold the sender's input. */
        int send = p->role == ST_ROLE_SEND;
        want = st_input(s, p->op, op->src);
        bad = ref_compare(op->dtype, send ? p->src : p->dst, want, op->count, msg, sizeof msg);
        if (bad != 0) {
            st_error(t, "%s: %s: %zu wrong elements: %s", what,
                     send ? "send source written" : "recv", bad, msg);
            return;
        }
    }
    t->verified++;
}

static int st_part_fails(const st_sched *s, const st_part *p)
{
    return s->ops[p->op].skip_dev >= 0;
}

/*
 * Fence the thread's stream and verify everything the fence covered. The fence must
 * return CCQ_ERR_TIMEOUT exactly when it covers a part of an op with a missing part, and
 * CCQ_OK otherwise. After an error a second fence (which must return CCQ_OK) makes sure
 * every covered command has ended before the results are read.
 */
static void st_fence(st_thread *t)
{
    const st_sched *s = t->run->s;
    ccq_runtime *rt = t->run->rt;
    int expect_fail = 0;
    int ended = 1;

    for (uint32_t k = 0; k < t->npending; k++)
        expect_fail |= st_part_fails(s, &t->pending[k]);
    ccq_status st = ccq_sync_collective(rt, t->dev, t->lane);
    ccq_status want = expect_fail ? CCQ_ERR_TIMEOUT : CCQ_OK;
    if (st != want) {
        st_error(t, "fence over %u parts (first op %u): %s, expected %s: %s", t->npending,
                 t->npending ? t->pending[0].op : 0, ccq_status_name(st), ccq_status_name(want),
                 ccq_last_error_detail());
        atomic_store(&t->run->stop, 1);
    } else if (expect_fail) {
        /* It must be the watchdog's verdict on the op, not the fence's own deadline. */
        char detail[512], fence_detail[512];
        snprintf(fence_detail, sizeof fence_detail, "%s", ccq_last_error_detail());
        if (ccq_stream_last_error(rt, t->dev, t->lane, detail, sizeof detail) != CCQ_ERR_TIMEOUT ||
            strstr(detail, "missing") == NULL)
            st_error(t, "fence returned CCQ_ERR_TIMEOUT without the watchdog's detail: %s",
                     fence_detail);
        t->timeout_fences++;
    }
    if (st != CCQ_OK) {
        ccq_status again = ccq_sync_collective(rt, t->dev, t->lane);
        if (again != CCQ_OK) {
            st_error(t, "second fence: %s: %s", ccq_status_name(again), ccq_last_error_detail());
            atomic_store(&t->run->stop, 1);
            ended = 0;
        }
    }
    for (uint32_t k = 0; k < t->npending; k++) {
        st_part *p = &t->pending[k];
        if (!ended) {
            /* The library may still write them: leak rather than risk a use after free. */
            continue;
        }
        if (st_part_fails(s, p))
            t->expected_failed++;
        else
            st_verify(t, p);
        if (p->role == ST_ROLE_AR)
            st_slot_release(t->run, p->op);
        free(p->src_mem);
        free(p->dst_mem);
    }
    t->npending = 0;
}

static void *st_thread_main(void *arg)
{
    st_thread *t = arg;
    const st_sched *s = t->run->s;
    uint64_t r = st_mix(s->seed ^ st_mix(0xfe7ce000u + t->dev * 256u + t->lane));
    uint32_t left = 1 + st_below(&r, ST_FENCE_MAX);

    pthread_barrier_wait(&t->run->start);
    for (uint32_t i = 0; i < s->nops && !atomic_load_explicit(&t->run->stop, memory_order_relaxed);
         i++) {
        const st_op *op = &s->ops[i];
        st_role roles[2];
        int nroles = 0, did = 0;
        if (op->lane != t->lane)
            continue;
        if (op->kind == ST_AR) {
            if (st_comm_has(&s->comms[op->comm], t->dev))
                roles[nroles++] = ST_ROLE_AR;
        } else {
            int send = op->src == t->dev, recv = op->dst == t->dev;
            if (recv && op->recv_first)
                roles[nroles++] = ST_ROLE_RECV;
            if (send)
                roles[nroles++] = ST_ROLE_SEND;
            if (recv && !op->recv_first)
                roles[nroles++] = ST_ROLE_RECV;
        }
        for (int k = 0; k < nroles; k++) {
            if (op->skip_dev == (int)t->dev && op->skip_role == roles[k])
                continue; /* the deliberately missing part */
            if (st_submit(t, i, roles[k]) != 0) {
                atomic_store(&t->run->stop, 1);
                break;
            }
            did = 1;
        }
        if (did && --left == 0) {
            st_fence(t);
            left = 1 + st_below(&r, ST_FENCE_MAX);
            if (st_below(&r, 16) == 0)
                st_fence(t); /* an empty fence now and then */
        }
    }
    st_fence(t);
    return NULL;
}

/* ------------------------------------------------------------------------------------ */
/* One schedule                                                                          */
/* ------------------------------------------------------------------------------------ */

typedef struct st_totals {
    uint64_t ops, parts, errors, seeds, timeout_fences;
} st_totals;

static void st_report(const st_sched *s, uint64_t *errors, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void st_report(const st_sched *s, uint64_t *errors, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    (*errors)++;
    print_error("stress seed %" PRIu64 ": %s\n", s->seed, msg);
}

/* Run one schedule on a fresh runtime; returns its error count (0 = all verified). */
static uint64_t st_run_schedule(const st_sched *s, st_totals *tot)
{
    const uint32_t nthreads = s->ndev * s->lanes;
    st_run run;
    st_thread *t = calloc(nthreads, sizeof *t);
    ccq_config cfg;
    uint64_t errors = 0, submitted = 0, verified = 0, failed_parts = 0, timeout_fences = 0;
    uint64_t r = st_mix(s->seed ^ 0xc0ffee);

    assert_non_null(t);
    memset(&run, 0, sizeof run);
    run.s = s;
    st_pool_init();
    run.slots = calloc(s->nops ? s->nops : 1, sizeof *run.slots);
    assert_non_null(run.slots);
    for (uint32_t i = 0; i < s->nops; i++) {
        const st_op *op = &s->ops[i];
        if (op->kind == ST_AR)
            run.slots[i].left = s->comms[op->comm].n - (op->skip_dev >= 0);
    }
    for (int k = 0; k < ST_LOCKS; k++)
        assert_int_equal(pthread_mutex_init(&run.locks[k], NULL), 0);
    ccq_config_init(&cfg);
    cfg.backend = "host";
    cfg.host_devices = s->ndev;
    cfg.max_streams = s->lanes;
    cfg.queue_depth = s->queue_depth;
    cfg.max_batch_ops = s->max_batch_ops;
    cfg.spin_us = s->spin_us;
    cfg.host_workers = s->host_workers;
    cfg.timeout_ms = s->timeout_ms;
    ccq_status st = ccq_runtime_create(&cfg, &run.rt);
    if (st != CCQ_OK)
        fail_msg("ccq_runtime_create: %s: %s", ccq_status_name(st), ccq_last_error_detail());
    /* Initialise every communicator up front, each device set in a shuffled order. */
    for (uint32_t c = 0; c < s->ncomm; c++) {
        ccq_device_id set[ST_MAX_DEV];
        uint32_t n = s->comms[c].n;
        memcpy(set, s->comms[c].dev, n * sizeof set[0]);
        for (uint32_t k = n; k > 1; k--) {
            uint32_t j = st_below(&r, k);
            ccq_device_id x = set[k - 1];
            set[k - 1] = set[j];
            set[j] = x;
        }
        st = ccq_comm_init(run.rt, set, n);
        if (st != CCQ_OK)
            fail_msg("ccq_comm_init: %s: %s", ccq_status_name(st), ccq_last_error_detail());
    }
    assert_int_equal(pthread_barrier_init(&run.start, NULL, nthreads), 0);
    for (uint32_t k = 0; k < nthreads; k++) {
        t[k].run = &run;
        t[k].dev = k / s->lanes;
        t[k].lane = k % s->lanes;
        assert_int_equal(pthread_create(&t[k].th, NULL, st_thread_main, &t[k]), 0);
    }
    for (uint32_t k = 0; k < nthreads; k++) {
        assert_int_equal(pthread_join(t[k].th, NULL), 0);
        if (t[k].errors != 0) {
            errors += t[k].errors;
            print_error("stress seed %" PRIu64 ": %" PRIu64 " error(s), first: %s\n", s->seed,
                        t[k].errors, t[k].first_error);
        }
        submitted += t[k].submitted;
        verified += t[k].verified;
        failed_parts += t[k].expected_failed;
        timeout_fences += t[k].timeout_fences;
        free(t[k].pending);
    }
    assert_int_equal(pthread_barrier_destroy(&run.start), 0);
    /* Slots of parts that never got verified (only after an error). */
    for (uint32_t i = 0; i < s->nops; i++)
        free(run.slots[i].want);
    free(run.slots);
    for (int k = 0; k < ST_LOCKS; k++)
        assert_int_equal(pthread_mutex_destroy(&run.locks[k]), 0);

    /* The runtime is idle now, so the counters are exact. */
    ccq_stats stats;
    memset(&stats, 0, sizeof stats);
    stats.struct_size = sizeof stats;
    assert_int_equal(ccq_get_stats(run.rt, &stats), CCQ_OK);
    if (errors == 0) {
        if (stats.submitted != submitted)
            st_report(s, &errors, "stats: submitted %" PRIu64 ", threads submitted %" PRIu64,
                      stats.submitted, submitted);
        if (stats.failed != s->expected_failed || failed_parts != s->expected_failed)
            st_report(s, &errors,
                      "stats: failed %" PRIu64 ", parts seen failing %" PRIu64
                      ", expected %" PRIu64,
                      stats.failed, failed_parts, s->expected_failed);
        if (stats.completed + stats.failed != stats.submitted || stats.cancelled != 0 ||
            stats.pending != 0)
            st_report(s, &errors,
                      "stats: submitted %" PRIu64 " completed %" PRIu64 " failed %" PRIu64
                      " cancelled %" PRIu64 " pending %" PRIu64,
                      stats.submitted, stats.completed, stats.failed, stats.cancelled,
                      stats.pending);
        if (verified != submitted - failed_parts)
            st_report(s, &errors, "verified %" PRIu64 " parts of %" PRIu64 " submitted", verified,
                      submitted);
    }
    st = ccq_runtime_destroy(run.rt);
    if (st != CCQ_OK)
        st_report(s, &errors, "ccq_runtime_destroy: %s", ccq_status_name(st));
    if (errors != 0)
        print_error("stress: FAILED; reproduce with CCQ_STRESS_SEED=%" PRIu64
                    " CCQ_STRESS_DEVICES=%u CCQ_STRESS_THREADS=%u CCQ_STRESS_OPS=%u "
                    "(queue_depth %u, max_batch_ops %u, spin_us %u, host_workers %u)\n",
                    s->seed, s->ndev, s->lanes, s->nops - (s->expected_failed ? 2 : 0),
                    s->queue_depth, s->max_batch_ops, s->spin_us, s->host_workers);
    tot->ops += errors == 0 ? s->nops : 0;
    tot->parts += verified;
    tot->errors += errors;
    tot->seeds++;
    tot->timeout_fences += timeout_fences;
    free(t);
    return errors;
}

/* ------------------------------------------------------------------------------------ */
/* Tests                                                                                 */
/* ------------------------------------------------------------------------------------ */

/* The stress run: one schedule, or schedules seed, seed+1, ... for CCQ_STRESS_SECONDS. */
static void test_stress_random_schedule(void **state)
{
    (void)state;
    const uint64_t seed0 = st_env_u64("CCQ_STRESS_SEED", ST_DEFAULT_SEED, 0, UINT64_MAX);
    const uint32_t ndev = (uint32_t)st_env_u64("CCQ_STRESS_DEVICES", ST_DEFAULT_DEVICES, 1, 16);
    const uint32_t lanes =
        (uint32_t)st_env_u64("CCQ_STRESS_THREADS", ST_DEFAULT_THREADS, 1, ST_MAX_LANES);
    const uint32_t nops = (uint32_t)st_env_u64("CCQ_STRESS_OPS", ST_DEFAULT_OPS, 0, 100000000);
    const double seconds = st_env_seconds();
    const double t0 = st_now();
    st_totals tot;
    st_sched s;

    memset(&tot, 0, sizeof tot);
    for (uint64_t seed = seed0;; seed++) {
        /* A long timeout: a hang is reported as a timeout instead of killing the test. */
        st_make(&s, seed, ndev, lanes, nops, 0, 1, 60000);
        uint64_t e = st_run_schedule(&s, &tot);
        free(s.ops);
        if (e != 0 || st_now() - t0 >= seconds)
            break;
    }
    printf("STRESS ops=%" PRIu64 " parts=%" PRIu64 " errors=%" PRIu64 " seconds=%.1f seeds=%" PRIu64
           " first_seed=%" PRIu64 " devices=%u threads=%u ops_per_seed=%u\n",
           tot.ops, tot.parts, tot.errors, st_now() - t0, tot.seeds, seed0, ndev, lanes, nops);
    fflush(stdout);
    assert_int_equal(tot.errors, 0);
}

/*
 * The harness survives a failed op: a small timeout_ms, a normal schedule, then one
 * all_reduce that one rank never submits and one send without its recv, each the last op of
 * its lane. Exactly the fences that cover their parts return CCQ_ERR_TIMEOUT (with the
 * watchdog's "missing" detail), everything else is verified, and the counters balance:
 * submitted == completed + failed, failed == the parts of the two ops that were submitted.
 */
static void test_stress_missing_part(void **state)
{
    (void)state;
    const uint64_t seed = st_env_u64("CCQ_STRESS_SEED", ST_DEFAULT_SEED, 0, UINT64_MAX);
    st_totals tot;
    st_sched s;

    memset(&tot, 0, sizeof tot);
    /* Normal ops must finish well within timeout_ms for the outcome to be deterministic:
     * small counts only, and more slack under the sanitizers. */
    st_make(&s, seed, ST_DEFAULT_DEVICES, ST_DEFAULT_THREADS, 300, 1, 0,
            ST_SANITIZED ? 5000 : 2000);
    uint64_t e = st_run_schedule(&s, &tot);
    assert_int_equal(e, 0);
    assert_true(s.expected_failed >= 2);
    /* Every stream that held a part of them returned CCQ_ERR_TIMEOUT from one fence, or
     * from two when it held parts of both and fenced in between. */
    int streams[ST_MAX_DEV][ST_MAX_LANES] = {{0}};
    uint32_t nstreams = 0;
    for (uint32_t i = 0; i < s.nops; i++) {
        const st_op *op = &s.ops[i];
        if (op->skip_dev < 0)
            continue;
        for (ccq_device_id d = 0; d < s.ndev; d++) {
            int has = op->kind == ST_AR ? st_comm_has(&s.comms[op->comm], d) : op->src == d;
            if (has && (int)d != op->skip_dev && !streams[d][op->lane]++)
                nstreams++;
        }
    }
    assert_true(nstreams >= 2);
    assert_true(tot.timeout_fences >= nstreams);
    assert_true(tot.timeout_fences <= s.expected_failed);
    print_message("missing part: %" PRIu64 " parts verified, %" PRIu64
                  " failed as expected, %" PRIu64 " fences returned CCQ_ERR_TIMEOUT\n",
                  tot.parts, s.expected_failed, tot.timeout_fences);
    free(s.ops);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stress_random_schedule),
        cmocka_unit_test(test_stress_missing_part),
    };
    const char *filter = getenv("CCQ_STRESS_FILTER");
    if (filter != NULL && *filter != '\0')
        cmocka_set_test_filter(filter);
    int failed = cmocka_run_group_tests_name("stress", tests, NULL, NULL);
    st_pool_free();
    return failed;
}
