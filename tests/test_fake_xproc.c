/* The fake NCCL across processes (tests/fake/fake_xproc.c): cliques whose ranks live in 2
 * and 3 forked processes, driven through the NCCL API directly, move and reduce every
 * process's data (checked against tools/ref/ref.h); a peer that never comes or exits fails the
 * call instead of hanging; calls that differ across processes are fake errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fake/fake_cuda_nccl.h"
#include "ref.h"

/* A child never uses cmocka's asserts: a failing one would jump into the child's copy of
 * the test runner. CHECK prints and exits the child with status 1. */
#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "child %d: %s:%d: CHECK(%s) failed\n", (int)getpid(), __FILE__,        \
                    __LINE__, #cond);                                                              \
            fflush(stderr);                                                                        \
            _exit(1);                                                                              \
        }                                                                                          \
    } while (0)

enum { MAX_PROC = 3, MAX_LOCAL = 2, MAX_RANKS = 4, COUNT = 37, TIMEOUT_S = 40 };

/* Which ranks of the clique each process holds: first[p] .. first[p] + nlocal[p] - 1, on
 * its devices 0 .. nlocal[p] - 1. */
typedef struct layout {
    int nproc, nranks;
    int first[MAX_PROC], nlocal[MAX_PROC];
} layout;

/* A process with 2 local ranks and one with 1; and the same with a third process. */
static const layout L2 = {2, 3, {0, 2, 0}, {2, 1, 0}};
static const layout L3 = {3, 4, {0, 2, 3}, {2, 1, 1}};
/* One rank per process. */
static const layout P2 = {2, 2, {0, 1, 0}, {1, 1, 0}};

/* What every child gets (copied by fork): ids made by the parent before forking. */
typedef struct job {
    const layout *l;
    ncclUniqueId id, id2;
    int variant;
} job;

typedef int (*child_fn)(int proc, const job *j);

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void nap(void)
{
    nanosleep(&(struct timespec){0, 200000}, NULL);
}

/*
 * Fork one child per process of the layout (the parent has no threads, so fork is safe),
 * each running fn and exiting with its result; reap them as they exit (a dead peer must be
 * seen dead, not as a zombie), kill those still running after TIMEOUT_S. status[p]: the
 * exit status, or 128 + the signal.
 */
static void run_procs(const job *j, child_fn fn, int *status)
{
    pid_t pid[MAX_PROC];
    int left = j->l->nproc;
    long long deadline = now_ms() + TIMEOUT_S * 1000;

    fflush(NULL);
    for (int p = 0; p < j->l->nproc; p++) {
        pid[p] = fork();
        assert_true(pid[p] >= 0);
        if (pid[p] == 0) {
            int rc = fn(p, j);
            fflush(NULL);
            _exit(rc);
        }
    }
    while (left > 0) {
        for (int p = 0; p < j->l->nproc; p++) {
            int st;
            if (pid[p] <= 0 || waitpid(pid[p], &st, WNOHANG) != pid[p])
                continue;
            status[p] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            pid[p] = 0;
            left--;
        }
        if (left > 0 && now_ms() > deadline) {
            for (int p = 0; p < j->l->nproc; p++) {
                if (pid[p] > 0) {
                    fprintf(stderr, "child %d (process %d) overran: killed\n", (int)pid[p], p);
                    kill(pid[p], SIGKILL);
                }
            }
            deadline = now_ms() + 60 * 1000;
        }
        nap();
    }
}

static void run_ok(const job *j, child_fn fn)
{
    int status[MAX_PROC];
    run_procs(j, fn, status);
    for (int p = 0; p < j->l->nproc; p++) {
        if (status[p] != 0)
            fail_msg("process %d of %d ended with status %d", p, j->l->nproc, status[p]);
    }
    /* The last process to leave unlinked the clique's segment and data files. */
    assert_int_equal(fake_xproc_files(&j->id), 0);
    assert_int_equal(fake_xproc_files(&j->id2), 0);
}

static job make_job(const layout *l, int variant)
{
    job j = {.l = l, .variant = variant};
    assert_int_equal(ncclGetUniqueId(&j.id), ncclSuccess);
    assert_int_equal(ncclGetUniqueId(&j.id2), ncclSuccess);
    return j;
}

/* ---- In the children ---- */

/* Init this process's ranks first .. first + n - 1 of a clique of nranks, grouped as ccq
 * does, on devices dev0 .. dev0 + n - 1; poll until every communicator is ready. Returns
 * the first failure, or ncclSuccess. */
static ncclResult_t init_local(const ncclUniqueId *id, int nranks, int first, int n, int dev0,
                               bool blocking, ncclComm_t *comm)
{
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ncclResult_t r;
    long long deadline = now_ms() + 20000;
    config.blocking = blocking ? 1 : 0;
    /* These tests check data and matching; first launches that stay ncclInProgress until
     * every process launched (NCCL_RUNTIME_CONNECT) are ccq's tests' business. */
    fake_set_runtime_connect(false);
    CHECK(ncclGroupStart() == ncclSuccess);
    for (int i = 0; i < n; i++) {
        CHECK(cudaSetDevice(dev0 + i) == cudaSuccess);
        CHECK(ncclCommInitRankConfig(&comm[i], nranks, *id, first + i, &config) == ncclSuccess);
    }
    r = ncclGroupEnd();
    if (r != ncclSuccess && r != ncclInProgress)
        return r;
    for (int i = 0; i < n; i++) {
        ncclResult_t st;
        do {
            CHECK(ncclCommGetAsyncError(comm[i], &st) == ncclSuccess);
            if (st == ncclInProgress)
                nap();
        } while (st == ncclInProgress && now_ms() < deadline);
        if (st != ncclSuccess)
            return st;
    }
    return ncclSuccess;
}

/* Wait until each stream's work is done: an event recorded after it completes. */
static void wait_streams(const cudaStream_t *s, const cudaEvent_t *ev, int n)
{
    long long deadline = now_ms() + 20000;
    for (int i = 0; i < n; i++) {
        CHECK(cudaSetDevice(i) == cudaSuccess);
        CHECK(cudaEventRecord(ev[i], s[i]) == cudaSuccess);
    }
    for (int i = 0; i < n; i++) {
        cudaError_t e;
        while ((e = cudaEventQuery(ev[i])) == cudaErrorNotReady && now_ms() < deadline)
            nap();
        CHECK(e == cudaSuccess);
    }
}

static void make_streams(int n, cudaStream_t *s, cudaEvent_t *ev)
{
    for (int i = 0; i < n; i++) {
        CHECK(cudaSetDevice(i) == cudaSuccess);
        CHECK(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking) == cudaSuccess);
        CHECK(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming) == cudaSuccess);
    }
}

static void destroy(ncclComm_t *comm, int n)
{
    for (int i = 0; i < n; i++)
        CHECK(ncclCommDestroy(comm[i]) == ncclSuccess);
}

static void check_no_fake_errors(void)
{
    char msg[256];
    int n = fake_errors(msg, sizeof msg);
    if (n != 0)
        fprintf(stderr, "child %d: %d fake errors, the last: %s\n", (int)getpid(), n, msg);
    CHECK(n == 0);
}

static const ncclDataType_t to_nccl_dtype[] = {
    [CCQ_INT32] = ncclInt32,       [CCQ_FLOAT32] = ncclFloat32, [CCQ_FLOAT64] = ncclFloat64,
    [CCQ_BFLOAT16] = ncclBfloat16, [CCQ_INT8] = ncclInt8,
};
static const ncclRedOp_t to_nccl_op[] = {
    [CCQ_SUM] = ncclSum, [CCQ_PROD] = ncclProd, [CCQ_MAX] = ncclMax,
    [CCQ_MIN] = ncclMin, [CCQ_AVG] = ncclAvg,
};

/* One rank's call of a collective of any kind. */
static ncclResult_t issue(ccq_kind kind, const void *src, void *dst, size_t count, ccq_dtype dt,
                          ccq_reduce_op op, int root, ncclComm_t comm, cudaStream_t s)
{
    ncclDataType_t t = to_nccl_dtype[dt];
    ncclRedOp_t o = to_nccl_op[op];
    switch (kind) {
    case CCQ_KIND_ALL_REDUCE:
        return ncclAllReduce(src, dst, count, t, o, comm, s);
    case CCQ_KIND_BROADCAST:
        return ncclBroadcast(src, dst, count, t, root, comm, s);
    case CCQ_KIND_REDUCE:
        return ncclReduce(src, dst, count, t, o, root, comm, s);
    case CCQ_KIND_ALL_GATHER:
        return ncclAllGather(src, dst, count, t, comm, s);
    case CCQ_KIND_REDUCE_SCATTER:
        return ncclReduceScatter(src, dst, count, t, o, comm, s);
    case CCQ_KIND_ALL_TO_ALL:
        return ncclAlltoAll(src, dst, count, t, comm, s);
    case CCQ_KIND_GATHER:
        return ncclGather(src, dst, count, t, root, comm, s);
    case CCQ_KIND_SCATTER:
        return ncclScatter(src, dst, count, t, root, comm, s);
    default:
        return ncclInvalidArgument;
    }
}

typedef struct coll_case {
    ccq_kind kind;
    ccq_dtype dt;
    ccq_reduce_op op;
    int root;
    bool in_place; /* all_reduce: src == dst */
} coll_case;

/* Every kind, roots in this and in other processes, several types and operations. */
static const coll_case cases[] = {
    {CCQ_KIND_ALL_REDUCE, CCQ_FLOAT32, CCQ_SUM, 0, false},
    {CCQ_KIND_ALL_REDUCE, CCQ_INT32, CCQ_MAX, 0, true},
    {CCQ_KIND_ALL_REDUCE, CCQ_BFLOAT16, CCQ_AVG, 0, false},
    {CCQ_KIND_ALL_REDUCE, CCQ_FLOAT64, CCQ_PROD, 0, false},
    {CCQ_KIND_BROADCAST, CCQ_FLOAT32, CCQ_SUM, 2, false},
    {CCQ_KIND_BROADCAST, CCQ_INT8, CCQ_SUM, 1, false},
    {CCQ_KIND_REDUCE, CCQ_FLOAT32, CCQ_SUM, 2, false},
    {CCQ_KIND_REDUCE, CCQ_INT32, CCQ_MIN, 0, false},
    {CCQ_KIND_ALL_GATHER, CCQ_FLOAT32, CCQ_SUM, 0, false},
    {CCQ_KIND_REDUCE_SCATTER, CCQ_FLOAT32, CCQ_SUM, 0, false},
    {CCQ_KIND_REDUCE_SCATTER, CCQ_INT32, CCQ_MAX, 0, false},
    {CCQ_KIND_ALL_TO_ALL, CCQ_INT32, CCQ_SUM, 0, false},
    {CCQ_KIND_GATHER, CCQ_FLOAT32, CCQ_SUM, 2, false},
    {CCQ_KIND_SCATTER, CCQ_FLOAT64, CCQ_SUM, 1, false},
};
enum { NCASES = sizeof cases / sizeof cases[0] };

/* Rank r's input of case c (every process can make every rank's). */
static void *case_input(const coll_case *c, int n, int r)
{
    size_t cnt = ref_src_count(c->kind, (uint32_t)n, (uint32_t)c->root, (uint32_t)r, COUNT);
    void *p = calloc(COUNT * MAX_RANKS + 1, 8); /* room for any kind's src, or its dst */
    CHECK(p != NULL);
    ref_fill(c->dt, p, cnt, (uint32_t)(1000 * (c - cases) + 17 * r + 1));
    return p;
}

/* Every case, in one group per case and then all of them in one group: each local rank's
 * output against the reference computed from every rank's input. */
static int child_collectives(int proc, const job *j)
{
    const layout *l = j->l;
    int n = l->nranks, first = l->first[proc], nl = l->nlocal[proc];
    ncclComm_t comm[MAX_LOCAL];
    cudaStream_t s[MAX_LOCAL];
    cudaEvent_t ev[MAX_LOCAL];
    void *in[NCASES][MAX_RANKS], *out[NCASES][MAX_LOCAL], *want = calloc(COUNT * MAX_RANKS, 8);
    char msg[256];

    fake_set_xproc_timeout_ms(20000);
    CHECK(want != NULL);
    CHECK(init_local(&j->id, n, first, nl, 0, false, comm) == ncclSuccess);
    make_streams(nl, s, ev);
    for (int pass = 0; pass < 2; pass++) {
        bool one_group = pass == 1;
        for (int c = 0; c < NCASES; c++) {
            for (int r = 0; r < n; r++)
                in[c][r] = case_input(&cases[c], n, r);
            for (int i = 0; i < nl; i++)
                CHECK((out[c][i] = calloc(COUNT * MAX_RANKS + 1, 8)) != NULL);
        }
        if (one_group)
            CHECK(ncclGroupStart() == ncclSuccess);
        for (int c = 0; c < NCASES; c++) {
            const coll_case *k = &cases[c];
            CHECK(ncclGroupStart() == ncclSuccess);
            for (int i = 0; i < nl; i++) {
                void *src = in[c][first + i];
                void *dst = k->in_place ? src : out[c][i];
                CHECK(cudaSetDevice(i) == cudaSuccess);
                CHECK(issue(k->kind, src, dst, COUNT, k->dt, k->op, k->root, comm[i], s[i]) ==
                      ncclSuccess);
            }
            CHECK(ncclGroupEnd() == ncclSuccess);
            if (!one_group)
                wait_streams(s, ev, nl);
        }
        if (one_group) {
            CHECK(ncclGroupEnd() == ncclSuccess);
            wait_streams(s, ev, nl);
        }
        for (int c = 0; c < NCASES; c++) {
            const coll_case *k = &cases[c];
            const void *inputs[MAX_RANKS];
            for (int r = 0; r < n; r++)
                inputs[r] = case_input(k, n, r); /* fresh: an in-place call changed in[c] */
            for (int i = 0; i < nl; i++) {
                const void *got = k->in_place ? in[c][first + i] : out[c][i];
                size_t m = ref_collective(k->kind, k->dt, k->op, (uint32_t)n, (uint32_t)k->root,
                                          inputs, (uint32_t)(first + i), want, COUNT);
                if (ref_compare(k->dt, got, want, m, msg, sizeof msg) != 0) {
                    fprintf(stderr, "process %d rank %d case %d pass %d: %s\n", proc, first + i, c,
                            pass, msg);
                    CHECK(false);
                }
                free(out[c][i]);
            }
            for (int r = 0; r < n; r++) {
                free((void *)inputs[r]);
                free(in[c][r]);
            }
        }
    }
    destroy(comm, nl);
    check_no_fake_errors();
    CHECK(fake_live("comm") == 0);
    free(want);
    return 0;
}

static void test_collectives_2proc(void **state)
{
    (void)state;
    job j = make_job(&L2, 0);
    run_ok(&j, child_collectives);
}

static void test_collectives_3proc(void **state)
{
    (void)state;
    job j = make_job(&L3, 0);
    run_ok(&j, child_collectives);
}

/* A ring of send/recv across processes, two messages per pair per group (kept in order per
 * pair), plus a send from a rank to another of its own process on the same clique. */
static int child_sendrecv(int proc, const job *j)
{
    const layout *l = j->l;
    int n = l->nranks, first = l->first[proc], nl = l->nlocal[proc];
    ncclComm_t comm[MAX_LOCAL];
    cudaStream_t s[MAX_LOCAL];
    cudaEvent_t ev[MAX_LOCAL];
    int32_t snd[MAX_LOCAL][2][COUNT], rcv[MAX_LOCAL][2][COUNT];

    fake_set_xproc_timeout_ms(20000);
    CHECK(init_local(&j->id, n, first, nl, 0, j->variant == 1, comm) == ncclSuccess);
    make_streams(nl, s, ev);
    for (int round = 0; round < 3; round++) {
        memset(rcv, 0xff, sizeof rcv);
        CHECK(ncclGroupStart() == ncclSuccess);
        for (int i = 0; i < nl; i++) {
            int r = first + i, next = (r + 1) % n, prev = (r + n - 1) % n;
            CHECK(cudaSetDevice(i) == cudaSuccess);
            for (int m = 0; m < 2; m++) {
                for (int e = 0; e < COUNT; e++)
                    snd[i][m][e] = 1000000 * round + 10000 * r + 1000 * m + e;
                /* Receives first on odd ranks: order within a group does not matter. */
                if (r % 2) {
                    CHECK(ncclRecv(rcv[i][m], COUNT, ncclInt32, prev, comm[i], s[i]) ==
                          ncclSuccess);
                    CHECK(ncclSend(snd[i][m], COUNT, ncclInt32, next, comm[i], s[i]) ==
                          ncclSuccess);
                } else {
                    CHECK(ncclSend(snd[i][m], COUNT, ncclInt32, next, comm[i], s[i]) ==
                          ncclSuccess);
                    CHECK(ncclRecv(rcv[i][m], COUNT, ncclInt32, prev, comm[i], s[i]) ==
                          ncclSuccess);
                }
            }
        }
        CHECK(ncclGroupEnd() == ncclSuccess);
        wait_streams(s, ev, nl);
        for (int i = 0; i < nl; i++) {
            int r = first + i, prev = (r + n - 1) % n;
            for (int m = 0; m < 2; m++)
                for (int e = 0; e < COUNT; e++)
                    CHECK(rcv[i][m][e] == 1000000 * round + 10000 * prev + 1000 * m + e);
        }
    }
    destroy(comm, nl);
    check_no_fake_errors();
    return 0;
}

static void test_sendrecv_2proc(void **state)
{
    (void)state;
    job j = make_job(&L2, 0);
    run_ok(&j, child_sendrecv);
}

static void test_sendrecv_3proc(void **state)
{
    (void)state;
    job j = make_job(&L3, 0);
    run_ok(&j, child_sendrecv);
}

/* Blocking communicators: the group's ncclGroupEnd returns once every rank of every process
 * joined (both local ranks of process 0 register before either waits). */
static void test_blocking_init_3proc(void **state)
{
    (void)state;
    job j = make_job(&L3, 1);
    run_ok(&j, child_sendrecv);
}

/*
 * Two communicators at once: the world of L3 and a subset {world rank 1 (process 0's
 * device 1), world rank 2 (process 1)}, as sub ranks 0 and 1. Process 0 issues the world's
 * all_reduce and then the subset's, process 1 the other way round, each in its own group on
 * its own stream: launches do not wait for peers (as NCCL's), so this cannot deadlock.
 */
static int child_two_comms(int proc, const job *j)
{
    const layout *l = j->l;
    int n = l->nranks, first = l->first[proc], nl = l->nlocal[proc];
    bool in_sub = proc == 0 || proc == 1;
    int sub_local = proc == 0 ? 1 : 0; /* the local index of the subset's rank */
    ncclComm_t comm[MAX_LOCAL], sub;
    cudaStream_t s[MAX_LOCAL], ss;
    cudaEvent_t ev[MAX_LOCAL], sev;
    float x[MAX_LOCAL][COUNT], y[COUNT];

    fake_set_xproc_timeout_ms(20000);
    CHECK(init_local(&j->id, n, first, nl, 0, false, comm) == ncclSuccess);
    if (in_sub)
        CHECK(init_local(&j->id2, 2, proc, 1, sub_local, false, &sub) == ncclSuccess);
    make_streams(nl, s, ev);
    CHECK(cudaSetDevice(sub_local) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&ss, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaEventCreateWithFlags(&sev, cudaEventDisableTiming) == cudaSuccess);
    for (int i = 0; i < nl; i++)
        for (int e = 0; e < COUNT; e++)
            x[i][e] = (float)(first + i + 1) * (float)e;
    for (int e = 0; e < COUNT; e++)
        y[e] = (float)(proc + 1) * 100.0f + (float)e;

    for (int step = 0; step < 2; step++) {
        bool world = (step == 0) == (proc != 1);
        if (world) {
            CHECK(ncclGroupStart() == ncclSuccess);
            for (int i = 0; i < nl; i++) {
                CHECK(cudaSetDevice(i) == cudaSuccess);
                CHECK(ncclAllReduce(x[i], x[i], COUNT, ncclFloat32, ncclSum, comm[i], s[i]) ==
                      ncclSuccess);
            }
            CHECK(ncclGroupEnd() == ncclSuccess);
        } else if (in_sub) {
            CHECK(cudaSetDevice(sub_local) == cudaSuccess);
            CHECK(ncclAllReduce(y, y, COUNT, ncclFloat32, ncclMax, sub, ss) == ncclSuccess);
        }
    }
    wait_streams(s, ev, nl);
    if (in_sub) {
        long long deadline = now_ms() + 20000;
        cudaError_t e;
        CHECK(cudaSetDevice(sub_local) == cudaSuccess);
        CHECK(cudaEventRecord(sev, ss) == cudaSuccess);
        while ((e = cudaEventQuery(sev)) == cudaErrorNotReady && now_ms() < deadline)
            nap();
        CHECK(e == cudaSuccess);
    }
    for (int i = 0; i < nl; i++)
        for (int e = 0; e < COUNT; e++)
            CHECK(x[i][e] == (float)(1 + 2 + 3 + 4) * (float)e);
    for (int e = 0; in_sub && e < COUNT; e++)
        CHECK(y[e] == 200.0f + (float)e);
    destroy(comm, nl);
    if (in_sub)
        destroy(&sub, 1);
    check_no_fake_errors();
    return 0;
}

static void test_two_comms_issued_in_different_orders(void **state)
{
    (void)state;
    job j = make_job(&L3, 0);
    run_ok(&j, child_two_comms);
}

/* Stream order: a second in-place all_reduce launched on the stream right after the first
 * (no wait between) reads the first's output, though the peer is late (process 1 starts
 * 200 ms after process 0), so the first is still pending at the second's launch. */
static int child_stream_order(int proc, const job *j)
{
    ncclComm_t comm;
    cudaStream_t s;
    cudaEvent_t ev;
    int64_t x[COUNT];

    fake_set_xproc_timeout_ms(20000);
    CHECK(init_local(&j->id, 2, proc, 1, 0, false, &comm) == ncclSuccess);
    make_streams(1, &s, &ev);
    for (int e = 0; e < COUNT; e++)
        x[e] = (proc + 1) * 1000 + e;
    if (proc == 1)
        nanosleep(&(struct timespec){0, 200000000}, NULL);
    for (int k = 0; k < 3; k++)
        CHECK(ncclAllReduce(x, x, COUNT, ncclInt64, ncclSum, comm, s) == ncclSuccess);
    wait_streams(&s, &ev, 1);
    for (int e = 0; e < COUNT; e++) /* (1000 + e) + (2000 + e), doubled twice */
        CHECK(x[e] == 4 * (3000 + 2 * e));
    destroy(&comm, 1);
    check_no_fake_errors();
    return 0;
}

static void test_stream_order(void **state)
{
    (void)state;
    job j = make_job(&P2, 0);
    run_ok(&j, child_stream_order);
}

/* More calls than the segment has slots (256 collectives, 32 sends per pair): 600
 * all_reduces per rank in one group (twice, in two orders), then 300 sends and recvs around
 * the ring in groups of 40 with no wait between, reuse every slot several times. */
static int child_many(int proc, const job *j)
{
    enum { NCOLL = 600, NP2P = 300, BATCH = 40, C = 3 };
    const layout *l = j->l;
    int n = l->nranks, first = l->first[proc], nl = l->nlocal[proc];
    ncclComm_t comm[MAX_LOCAL];
    cudaStream_t s[MAX_LOCAL];
    cudaEvent_t ev[MAX_LOCAL];
    static int32_t x[MAX_LOCAL][NCOLL][C], snd[MAX_LOCAL][NP2P][C], rcv[MAX_LOCAL][NP2P][C];

    fake_set_xproc_timeout_ms(20000);
    CHECK(init_local(&j->id, n, first, nl, 0, false, comm) == ncclSuccess);
    make_streams(nl, s, ev);
    for (int by_rank = 0; by_rank < 2; by_rank++) {
        /* Interleaved (as ccq issues them), then all of rank 0's before rank 1's: a group
         * may hold its calls in any order. */
        for (int i = 0; i < nl; i++)
            for (int k = 0; k < NCOLL; k++)
                for (int e = 0; e < C; e++)
                    x[i][k][e] = (first + i + 1) * (k + 1) + e;
        CHECK(ncclGroupStart() == ncclSuccess);
        for (int a = 0; a < NCOLL * nl; a++) {
            int i = by_rank ? a / NCOLL : a % nl, k = by_rank ? a % NCOLL : a / nl;
            CHECK(cudaSetDevice(i) == cudaSuccess);
            CHECK(ncclAllReduce(x[i][k], x[i][k], C, ncclInt32, ncclSum, comm[i], s[i]) ==
                  ncclSuccess);
        }
        CHECK(ncclGroupEnd() == ncclSuccess);
        wait_streams(s, ev, nl);
        for (int i = 0; i < nl; i++)
            for (int k = 0; k < NCOLL; k++)
                for (int e = 0; e < C; e++) /* sum over ranks r of (r + 1)(k + 1) + e */
                    CHECK(x[i][k][e] == n * (n + 1) / 2 * (k + 1) + n * e);
    }

    for (int i = 0; i < nl; i++)
        for (int k = 0; k < NP2P; k++)
            for (int e = 0; e < C; e++)
                snd[i][k][e] = 100000 * (first + i) + 10 * k + e;
    for (int b = 0; b < NP2P; b += BATCH) {
        CHECK(ncclGroupStart() == ncclSuccess);
        for (int i = 0; i < nl; i++) {
            int r = first + i;
            CHECK(cudaSetDevice(i) == cudaSuccess);
            for (int k = b; k < b + BATCH && k < NP2P; k++) {
                CHECK(ncclSend(snd[i][k], C, ncclInt32, (r + 1) % n, comm[i], s[i]) == ncclSuccess);
                CHECK(ncclRecv(rcv[i][k], C, ncclInt32, (r + n - 1) % n, comm[i], s[i]) ==
                      ncclSuccess);
            }
        }
        CHECK(ncclGroupEnd() == ncclSuccess);
    }
    wait_streams(s, ev, nl);
    for (int i = 0; i < nl; i++)
        for (int k = 0; k < NP2P; k++)
            for (int e = 0; e < C; e++)
                CHECK(rcv[i][k][e] == 100000 * ((first + i + n - 1) % n) + 10 * k + e);
    destroy(comm, nl);
    check_no_fake_errors();
    return 0;
}

static void test_slots_reused(void **state)
{
    (void)state;
    job j = make_job(&L2, 0);
    run_ok(&j, child_many);
}

/* ---- Failures: an error, never a hang ---- */

static void run_failing(const job *j, child_fn fn)
{
    int status[MAX_PROC];
    run_procs(j, fn, status);
    for (int p = 0; p < j->l->nproc; p++)
        if (status[p] != 0)
            fail_msg("process %d of %d ended with status %d", p, j->l->nproc, status[p]);
    /* A process that exited without leaving leaves the segment: cleaned up once it is dead. */
    fake_xproc_cleanup();
    assert_int_equal(fake_xproc_files(&j->id), 0);
}

/* Process 1 never comes: process 0's non-blocking init reports ncclSystemError after the
 * fake's timeout (variant 0), its blocking init's ncclGroupEnd returns it (variant 1). No
 * fake error: a missing peer is not a misuse. */
static int child_absent_peer(int proc, const job *j)
{
    ncclComm_t comm;
    long long t0 = now_ms();
    ncclResult_t r, st = ncclSuccess;
    if (proc == 1)
        return 0;
    fake_set_xproc_timeout_ms(300);
    r = init_local(&j->id, 2, 0, 1, 0, j->variant == 1, &comm);
    CHECK(r == ncclSystemError);
    CHECK(now_ms() - t0 >= 250 && now_ms() - t0 < 10000);
    CHECK(ncclCommGetAsyncError(comm, &st) == ncclSuccess && st == ncclSystemError);
    CHECK(ncclCommAbort(comm) == ncclSuccess);
    check_no_fake_errors();
    return 0;
}

static void test_absent_peer_nonblocking(void **state)
{
    (void)state;
    job j = make_job(&P2, 0);
    run_failing(&j, child_absent_peer);
}

static void test_absent_peer_blocking(void **state)
{
    (void)state;
    job j = make_job(&P2, 1);
    run_failing(&j, child_absent_peer);
}

/* Process 1 joins and exits without calling the all_reduce (variant 0) or the recv (variant
 * 1): process 0's call fails with ncclRemoteError once process 1 is gone, long before the
 * fake's timeout. */
static int child_exiting_peer(int proc, const job *j)
{
    ncclComm_t comm;
    cudaStream_t s;
    cudaEvent_t ev;
    float x[COUNT] = {0};
    ncclResult_t st = ncclSuccess;
    long long t0, deadline;

    fake_set_xproc_timeout_ms(15000);
    CHECK(init_local(&j->id, 2, proc, 1, 0, false, &comm) == ncclSuccess);
    if (proc == 1)
        return 0; /* exits, communicator and all */
    make_streams(1, &s, &ev);
    t0 = now_ms();
    if (j->variant == 0)
        CHECK(ncclAllReduce(x, x, COUNT, ncclFloat32, ncclSum, comm, s) == ncclSuccess);
    else
        CHECK(ncclSend(x, COUNT, ncclFloat32, 1, comm, s) == ncclSuccess);
    CHECK(cudaEventRecord(ev, s) == cudaSuccess);
    deadline = t0 + 10000;
    do {
        CHECK(ncclCommGetAsyncError(comm, &st) == ncclSuccess);
        if (st == ncclSuccess)
            nap();
    } while (st == ncclSuccess && now_ms() < deadline);
    CHECK(st == ncclRemoteError);
    CHECK(now_ms() - t0 < 10000);
    /* As NCCL's kernels of a failed collective, the call never finishes by itself: the event
     * after it completes only once the communicator is aborted. */
    CHECK(cudaEventQuery(ev) == cudaErrorNotReady);
    nap();
    CHECK(cudaEventQuery(ev) == cudaErrorNotReady);
    CHECK(ncclCommAbort(comm) == ncclSuccess);
    CHECK(cudaEventQuery(ev) == cudaSuccess);
    check_no_fake_errors();
    return 0;
}

static void test_exiting_peer_allreduce(void **state)
{
    (void)state;
    job j = make_job(&P2, 0);
    run_failing(&j, child_exiting_peer);
}

static void test_exiting_peer_send(void **state)
{
    (void)state;
    job j = make_job(&P2, 1);
    run_failing(&j, child_exiting_peer);
}

/* The processes disagree on the same position of the communicator's sequence: the count
 * (variant 0) or the kind (1) of an all_reduce: every process sees ncclInvalidUsage as the
 * asynchronous error, and a fake error; or a recv's count (2): its receiver does. */
static int child_mismatch(int proc, const job *j)
{
    const layout *l = j->l;
    int first = l->first[proc], nl = l->nlocal[proc];
    ncclComm_t comm[MAX_LOCAL];
    cudaStream_t s[MAX_LOCAL];
    cudaEvent_t ev[MAX_LOCAL];
    float x[MAX_LOCAL][COUNT] = {{0}};
    long long deadline = now_ms() + 10000;
    char msg[256];

    fake_set_xproc_timeout_ms(15000);
    CHECK(init_local(&j->id, l->nranks, first, nl, 0, false, comm) == ncclSuccess);
    make_streams(nl, s, ev);
    CHECK(ncclGroupStart() == ncclSuccess);
    for (int i = 0; i < nl; i++) {
        size_t count = proc == 1 && j->variant != 1 ? COUNT - 1 : COUNT;
        CHECK(cudaSetDevice(i) == cudaSuccess);
        if (j->variant == 2) {
            int r = first + i, nr = l->nranks;
            CHECK(ncclSend(x[i], COUNT, ncclFloat32, (r + 1) % nr, comm[i], s[i]) == ncclSuccess);
            CHECK(ncclRecv(x[i], count, ncclFloat32, (r + nr - 1) % nr, comm[i], s[i]) ==
                  ncclSuccess);
        } else if (j->variant == 1 && proc == 1) {
            CHECK(ncclBroadcast(x[i], x[i], count, ncclFloat32, 0, comm[i], s[i]) == ncclSuccess);
        } else {
            CHECK(ncclAllReduce(x[i], x[i], count, ncclFloat32, ncclSum, comm[i], s[i]) ==
                  ncclSuccess);
        }
    }
    CHECK(ncclGroupEnd() == ncclSuccess);
    if (j->variant == 2 && proc == 0) {
        /* Its send was consumed (by a recv of another size) and its recv matched: done. */
        ncclResult_t st = ncclInProgress;
        wait_streams(s, ev, nl);
        CHECK(ncclCommGetAsyncError(comm[0], &st) == ncclSuccess && st == ncclSuccess);
        CHECK(ncclCommAbort(comm[0]) == ncclSuccess);
        return 0;
    }
    for (int i = 0; i < nl; i++) {
        ncclResult_t st = ncclSuccess;
        do {
            CHECK(ncclCommGetAsyncError(comm[i], &st) == ncclSuccess);
            if (st == ncclSuccess)
                nap();
        } while (st == ncclSuccess && now_ms() < deadline);
        CHECK(st == ncclInvalidUsage);
    }
    CHECK(fake_errors(msg, sizeof msg) >= 1);
    CHECK(strstr(msg, "(process ") != NULL);
    for (int i = 0; i < nl; i++)
        CHECK(ncclCommAbort(comm[i]) == ncclSuccess);
    return 0;
}

static void test_count_mismatch(void **state)
{
    (void)state;
    job j = make_job(&L2, 0);
    run_failing(&j, child_mismatch);
}

static void test_kind_mismatch(void **state)
{
    (void)state;
    job j = make_job(&L3, 1);
    run_failing(&j, child_mismatch);
}

static void test_recv_count_mismatch(void **state)
{
    (void)state;
    job j = make_job(&P2, 2);
    run_failing(&j, child_mismatch);
}

/* Both processes claim rank 0 (a wrong global rank): the one registering second gets
 * ncclInvalidArgument and a fake error (exit 10), the other never sees rank 1 and fails
 * after the fake's timeout (exit 11). */
static int child_same_rank(int proc, const job *j)
{
    ncclComm_t comm;
    ncclResult_t r;
    (void)proc;
    fake_set_xproc_timeout_ms(1000);
    r = init_local(&j->id, 2, 0, 1, 0, false, &comm);
    if (r == ncclInvalidArgument) {
        CHECK(fake_errors(NULL, 0) == 1);
        return 10;
    }
    CHECK(r == ncclSystemError);
    check_no_fake_errors();
    CHECK(ncclCommAbort(comm) == ncclSuccess);
    return 11;
}

static void test_same_rank_in_two_processes(void **state)
{
    (void)state;
    job j = make_job(&P2, 0);
    int status[MAX_PROC];
    run_procs(&j, child_same_rank, status);
    assert_true((status[0] == 10 && status[1] == 11) || (status[0] == 11 && status[1] == 10));
    fake_xproc_cleanup();
    assert_int_equal(fake_xproc_files(&j.id), 0);
}

/* Ids differ across processes, and are not the in-process counter alone. */
static void test_unique_ids(void **state)
{
    (void)state;
    ncclUniqueId a, b;
    int fd[2];
    pid_t pid;
    int st;
    assert_int_equal(pipe(fd), 0);
    assert_int_equal(ncclGetUniqueId(&a), ncclSuccess);
    fflush(NULL);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        ncclUniqueId c;
        fake_reset(); /* the counter starts again: the id must still differ */
        ncclGetUniqueId(&c);
        _exit(write(fd[1], &c, sizeof c) == (ssize_t)sizeof c ? 0 : 1);
    }
    assert_int_equal(read(fd[0], &b, sizeof b), (ssize_t)sizeof b);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_memory_not_equal(&a, &b, sizeof a);
    close(fd[0]);
    close(fd[1]);
}

static int setup(void **state)
{
    (void)state;
    fake_reset();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_unique_ids, setup),
        cmocka_unit_test_setup(test_collectives_2proc, setup),
        cmocka_unit_test_setup(test_collectives_3proc, setup),
        cmocka_unit_test_setup(test_sendrecv_2proc, setup),
        cmocka_unit_test_setup(test_sendrecv_3proc, setup),
        cmocka_unit_test_setup(test_blocking_init_3proc, setup),
        cmocka_unit_test_setup(test_two_comms_issued_in_different_orders, setup),
        cmocka_unit_test_setup(test_stream_order, setup),
        cmocka_unit_test_setup(test_slots_reused, setup),
        cmocka_unit_test_setup(test_same_rank_in_two_processes, setup),
        cmocka_unit_test_setup(test_absent_peer_nonblocking, setup),
        cmocka_unit_test_setup(test_absent_peer_blocking, setup),
        cmocka_unit_test_setup(test_exiting_peer_allreduce, setup),
        cmocka_unit_test_setup(test_exiting_peer_send, setup),
        cmocka_unit_test_setup(test_count_mismatch, setup),
        cmocka_unit_test_setup(test_kind_mismatch, setup),
        cmocka_unit_test_setup(test_recv_count_mismatch, setup),
    };
    fake_xproc_cleanup(); /* what a crashed earlier run left */
    return cmocka_run_group_tests(tests, NULL, NULL);
}
