/* The NCCL backend (backends/nccl/nccl.c) through the real runtime, against the fake CUDA
 * runtime and NCCL of tests/fake/: exact call sequences, error mapping, abort, and the data. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test_util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "ccq.h"
#include "ccq/ccq_nccl.h"
#include "fake/fake_cuda_nccl.h"
#include "ref.h"

enum { NDEV = 4, MAX_STREAMS = 8, QUEUE_DEPTH = 16 };

static const ccq_device_id ALL[NDEV] = {0, 1, 2, 3};
static const ccq_device_id P01[2] = {0, 1};

/* The test's runtime; teardown destroys it if the test did not. */
static ccq_runtime *g_rt;

static ccq_runtime *make_rt(uint64_t timeout_ms)
{
    ccq_config cfg;
    ccq_config_init(&cfg);
    cfg.backend = "nccl";
    cfg.max_streams = MAX_STREAMS;
    cfg.queue_depth = QUEUE_DEPTH;
    cfg.timeout_ms = timeout_ms;
    assert_int_equal(ccq_runtime_create(&cfg, &g_rt), CCQ_OK);
    assert_string_equal(ccq_backend_name(g_rt), "nccl");
    assert_int_equal(ccq_device_count(g_rt), NDEV);
    return g_rt;
}

static int setup(void **state)
{
    (void)state;
    fake_reset();
    g_rt = NULL;
    return 0;
}

/* Once its runtime is destroyed, the backend must have released every stream, event and
 * communicator it created, and never misused a handle or sent NCCL an incomplete group. */
static void check_clean(void)
{
    char msg[256];
    assert_int_equal(fake_live("stream"), 0);
    assert_int_equal(fake_live("event"), 0);
    assert_int_equal(fake_live("mem"), 0);
    assert_int_equal(fake_live("comm"), 0);
    if (fake_errors(msg, sizeof msg) != 0)
        fail_msg("the fake saw a misuse: %s", msg);
}

static int teardown(void **state)
{
    (void)state;
    ccq_runtime_destroy(g_rt);
    g_rt = NULL;
    check_clean();
    return 0;
}

/* ---- Reading the log ---- */

static fake_call entry(size_t i)
{
    fake_call c;
    assert_true(fake_log_get(i, &c));
    return c;
}

static bool is(const fake_call *c, const char *fn)
{
    return strcmp(c->fn, fn) == 0;
}

static bool on_this_thread(const fake_call *c)
{
    return pthread_equal(c->thread, pthread_self()) != 0;
}

/* Index of the first call of fn on `stream` at or after `from`, or -1. */
static long find_on_stream(const char *fn, cudaStream_t stream, size_t from)
{
    for (long i = fake_log_find(fn, from); i >= 0; i = fake_log_find(fn, (size_t)i + 1)) {
        fake_call c = entry((size_t)i);
        if (c.stream == stream)
            return i;
    }
    return -1;
}

/* Index of the first call of fn by rank `rank` of a communicator at or after `from`, or -1. */
static long find_rank(const char *fn, int rank, size_t from)
{
    for (long i = fake_log_find(fn, from); i >= 0; i = fake_log_find(fn, (size_t)i + 1)) {
        fake_call c = entry((size_t)i);
        if (c.rank == rank)
            return i;
    }
    return -1;
}

/* Index of the ncclGroupStart that opened the group holding call i. */
static size_t group_start_before(size_t i)
{
    while (i > 0) {
        fake_call c = entry(--i);
        if (is(&c, "ncclGroupStart"))
            return i;
    }
    fail_msg("no ncclGroupStart before call %zu", i);
    return 0;
}

/* Calls of fn that returned `result`. */
static size_t count_result(const char *fn, int result)
{
    size_t n = 0;
    for (long i = fake_log_find(fn, 0); i >= 0; i = fake_log_find(fn, (size_t)i + 1))
        n += entry((size_t)i).result == result;
    return n;
}

/* Wait (bounded) until fn has been called at least n times since the last log reset. */
static void wait_calls(const char *fn, size_t n)
{
    for (int i = 0; i < 10000 && fake_log_count(fn) < n; i++)
        sleep_ms(1);
    assert_true(fake_log_count(fn) >= n);
}

typedef struct group_info {
    size_t start, end; /* log indices of ncclGroupStart and the matching ncclGroupEnd */
    size_t nallreduce, nsend, nrecv, ninit, nother;
    size_t ncoll;   /* the other collectives (is_other_coll) */
    size_t ndevset; /* cudaSetDevice calls */
} group_info;

/* ncclBroadcast, ncclReduce, ncclAllGather, ncclReduceScatter, ncclAlltoAll, ncclGather,
 * ncclScatter. */
static bool is_other_coll(const fake_call *c)
{
    static const char *const fns[] = {"ncclBroadcast",     "ncclReduce",   "ncclAllGather",
                                      "ncclReduceScatter", "ncclAlltoAll", "ncclGather",
                                      "ncclScatter"};
    for (size_t k = 0; k < sizeof fns / sizeof fns[0]; k++)
        if (is(c, fns[k]))
            return true;
    return false;
}

/* The outermost groups of the log carrying data operations (not communicator creation):
 * all_reduce, send/recv and the other collectives. Inside them, every data call must find
 * its communicator's device current, made so by a cudaSetDevice within the group (NCCL runs
 * one-rank communicators' calls at once, on the current device). */
static size_t data_groups(group_info *out, size_t max)
{
    size_t n = 0, size = fake_log_size();
    int depth = 0, cur = -1;
    group_info g;

    memset(&g, 0, sizeof g);
    for (size_t i = 0; i < size; i++) {
        fake_call c = entry(i);
        if (is(&c, "ncclGroupStart")) {
            if (depth++ == 0) {
                memset(&g, 0, sizeof g);
                g.start = i;
                cur = -1;
            }
        } else if (is(&c, "ncclGroupEnd")) {
            assert_true(depth > 0);
            if (--depth == 0 && g.nallreduce + g.nsend + g.nrecv + g.ncoll > 0) {
                g.end = i;
                if (n < max)
                    out[n] = g;
                n++;
            }
        } else if (depth > 0) {
            bool data = is(&c, "ncclAllReduce") || is(&c, "ncclSend") || is(&c, "ncclRecv") ||
                        is_other_coll(&c);
            if (is(&c, "cudaSetDevice"))
                cur = c.device;
            if (data && cur != c.device)
                fail_msg("log entry %zu: %s on a communicator of device %d with device %d current",
                         i, c.fn, c.device, cur);
            g.ndevset += is(&c, "cudaSetDevice");
            g.nallreduce += is(&c, "ncclAllReduce");
            g.nsend += is(&c, "ncclSend");
            g.nrecv += is(&c, "ncclRecv");
            g.ninit += is(&c, "ncclCommInitRankConfig");
            g.ncoll += is_other_coll(&c);
            /* cudaSetDevice: the part's device made current (one-rank communicators run
             * at the call); anything else inside a group is unexpected. */
            g.nother += !is(&c, "ncclAllReduce") && !is(&c, "ncclSend") && !is(&c, "ncclRecv") &&
                        !is_other_coll(&c) && !is(&c, "cudaSetDevice");
        }
    }
    assert_int_equal(depth, 0);
    return n;
}

static void assert_detail_has(const char *detail, const char *what)
{
    if (strstr(detail, what) == NULL)
        fail_msg("detail \"%s\" lacks \"%s\"", detail, what);
}

/* ---- Running work ---- */

/* A float32 sum over the comm ALL on stream s of every device, fenced and checked. */
static void allreduce_all(ccq_runtime *rt, ccq_stream_id s, uint32_t seed)
{
    enum { N = 512 };
    static float in[NDEV][N], out[NDEV][N], want[N];
    const void *inputs[NDEV];
    char msg[256];

    for (int d = 0; d < NDEV; d++) {
        ref_fill(CCQ_FLOAT32, in[d], N, seed + (uint32_t)d);
        memset(out[d], 0xff, sizeof out[d]);
        inputs[d] = in[d];
    }
    ref_allreduce(CCQ_FLOAT32, CCQ_SUM, NDEV, inputs, want, N);
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, s, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV), CCQ_OK);
    for (ccq_device_id d = 0; d < NDEV; d++) {
        assert_int_equal(ccq_sync_collective(rt, d, s), CCQ_OK);
        if (ref_compare(CCQ_FLOAT32, out[d], want, N, msg, sizeof msg) != 0)
            fail_msg("device %u: %s", d, msg);
    }
}

/* Submit the ALL float32 sum on stream s of every device; each fence must return `want`
 * and a detail holding every string of `has` (NULL-terminated). */
static void allreduce_expect(ccq_runtime *rt, ccq_stream_id s, ccq_status want,
                             const char *const *has)
{
    enum { N = 64 };
    static float in[NDEV][N], out[NDEV][N];
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, s, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV), CCQ_OK);
    for (ccq_device_id d = 0; d < NDEV; d++) {
        ccq_status st = ccq_sync_collective(rt, d, s);
        if (st != want)
            fail_msg("device %u: fence returned %s, expected %s (%s)", d, ccq_status_name(st),
                     ccq_status_name(want), ccq_last_error_detail());
        for (int k = 0; has != NULL && has[k] != NULL; k++)
            assert_detail_has(ccq_last_error_detail(), has[k]);
    }
}

/* Keeps the scheduler inside the creation of communicator {2,3} (asked for by a helper
 * thread, NCCL held in ncclInProgress) until released, so that everything queued
 * meanwhile is found ready in one pass and goes into one batch. This relies on the
 * scheduler creating requested communicators before it drains the stream queues, and on
 * the streams used having been used before (it only scans streams it knows). */
typedef struct blocker {
    pthread_t thread;
    ccq_runtime *rt;
    ccq_status st;
} blocker;

static void *blocker_main(void *arg)
{
    blocker *b = arg;
    static const ccq_device_id p23[2] = {2, 3};
    b->st = ccq_comm_init(b->rt, p23, 2);
    return NULL;
}

static void block_scheduler(blocker *b, ccq_runtime *rt)
{
    size_t polls = fake_log_count("ncclCommGetAsyncError");
    b->rt = rt;
    fake_hold_async(true);
    assert_int_equal(pthread_create(&b->thread, NULL, blocker_main, b), 0);
    wait_calls("ncclCommGetAsyncError", polls + 1);
}

static void release_scheduler(blocker *b)
{
    fake_hold_async(false);
    assert_int_equal(pthread_join(b->thread, NULL), 0);
    assert_int_equal(b->st, CCQ_OK);
}

/* ---- The fake itself ---- */

/* The fake refuses what NCCL would hang on: a group missing a rank's part of an
 * all_reduce, or a send without its recv. (The other tests rely on this to catch a backend
 * that splits an operation across groups.) */
static void test_fake_rejects_incomplete_groups(void **state)
{
    (void)state;
    ncclUniqueId id;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ncclComm_t comm[2];
    float x[2][4] = {{1, 2, 3, 4}, {10, 20, 30, 40}};
    char msg[256];

    assert_int_equal(ncclGetUniqueId(&id), ncclSuccess);
    assert_int_equal(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(cudaSetDevice(r), cudaSuccess);
        assert_int_equal(ncclCommInitRankConfig(&comm[r], 2, id, r, &config), ncclSuccess);
    }
    assert_int_equal(ncclGroupEnd(), ncclSuccess);

    assert_int_equal(ncclGroupStart(), ncclSuccess);
    assert_int_equal(ncclAllReduce(x[0], x[0], 4, ncclFloat32, ncclSum, comm[0], NULL),
                     ncclSuccess);
    assert_int_equal(ncclGroupEnd(), ncclInvalidUsage);
    assert_int_equal(fake_errors(msg, sizeof msg), 1);
    assert_non_null(strstr(msg, "lacks rank 1's part"));
    assert_true(x[0][0] == 1.0f); /* nothing ran */

    assert_int_equal(ncclGroupStart(), ncclSuccess);
    assert_int_equal(ncclSend(x[0], 4, ncclFloat32, 1, comm[0], NULL), ncclSuccess);
    assert_int_equal(ncclGroupEnd(), ncclInvalidUsage);
    assert_int_equal(fake_errors(msg, sizeof msg), 2);
    assert_non_null(strstr(msg, "has no matching ncclRecv"));

    /* Complete groups run: a sum, then a send/recv in the other direction. */
    assert_int_equal(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < 2; r++)
        assert_int_equal(ncclAllReduce(x[r], x[r], 4, ncclFloat32, ncclSum, comm[r], NULL),
                         ncclSuccess);
    assert_int_equal(ncclGroupEnd(), ncclSuccess);
    assert_true(x[0][3] == 44.0f && x[1][3] == 44.0f);
    x[1][0] = 7;
    assert_int_equal(ncclGroupStart(), ncclSuccess);
    assert_int_equal(ncclRecv(x[0], 4, ncclFloat32, 1, comm[0], NULL), ncclSuccess);
    assert_int_equal(ncclSend(x[1], 4, ncclFloat32, 0, comm[1], NULL), ncclSuccess);
    assert_int_equal(ncclGroupEnd(), ncclSuccess);
    assert_true(x[0][0] == 7.0f);
    assert_int_equal(fake_errors(NULL, 0), 2);
    for (int r = 0; r < 2; r++)
        assert_int_equal(ncclCommDestroy(comm[r]), ncclSuccess);
    fake_reset(); /* forget the two errors provoked on purpose */
}

/* The other collectives in the fake: matched across ranks in the communicator's one
 * sequence of collectives (a missing part, or parts of different kinds or roots, fail the
 * group with ncclInvalidUsage); argument misuse fails the call with ncclInvalidArgument;
 * NCCL's in-place forms and NULL buffers on non-roots run. */
static void test_fake_collectives(void **state)
{
    (void)state;
    ncclUniqueId id;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ncclComm_t comm[2];
    float g[2][8], x[2][4] = {{1, 2, 3, 4}, {10, 20, 30, 40}}, y[4];
    unsigned char b8[2][4] = {{0}};
    void *dev = NULL;
    char msg[256];
    int errors = 0;

    assert_int_equal(ncclGetUniqueId(&id), ncclSuccess);
    assert_int_equal(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(cudaSetDevice(r), cudaSuccess);
        assert_int_equal(ncclCommInitRankConfig(&comm[r], 2, id, r, &config), ncclSuccess);
    }
    assert_int_equal(ncclGroupEnd(), ncclSuccess);

    /* A broadcast missing rank 1's part. */
    assert_int_equal(ncclGroupStart(), ncclSuccess);
    assert_int_equal(ncclBroadcast(x[0], x[0], 4, ncclFloat32, 0, comm[0], NULL), ncclSuccess);
    assert_int_equal(ncclGroupEnd(), ncclInvalidUsage);
    assert_int_equal(fake_errors(msg, sizeof msg), ++errors);
    assert_non_null(strstr(msg, "the ncclBroadcast of"));
    assert_non_null(strstr(msg, "lacks rank 1's part"));

    /* Roots that differ; kinds that differ (one sequence: the all_reduce is rank 0's first
     * collective, the gather rank 1's). Nothing runs. */
    assert_int_equal(ncclGroupStart(), ncclSuccess);
    assert_int_equal(ncclBroadcast(x[0], x[0], 4, ncclFloat32, 0, comm[0], NULL), ncclSuccess);
    assert_int_equal(ncclBroadcast(x[1], x[1], 4, ncclFloat32, 1, comm[1], NULL), ncclSuccess);
    assert_int_equal(ncclGroupEnd(), ncclInvalidUsage);
    assert_int_equal(fake_errors(msg, sizeof msg), ++errors);
    assert_non_null(strstr(msg, "differs"));
    assert_true(x[1][0] == 10.0f);
    assert_int_equal(ncclGroupStart(), ncclSuccess);
    assert_int_equal(ncclAllReduce(x[0], x[0], 4, ncclFloat32, ncclSum, comm[0], NULL),
                     ncclSuccess);
    assert_int_equal(ncclGather(x[1], g[1], 4, ncclFloat32, 1, comm[1], NULL), ncclSuccess);
    assert_int_equal(ncclGroupEnd(), ncclInvalidUsage);
    assert_int_equal(fake_errors(msg, sizeof msg), ++errors);
    assert_non_null(strstr(msg, "differs"));
    assert_true(x[0][0] == 1.0f);

    /* Misuse at the call: the group then reports the call's error and runs nothing. */
    assert_int_equal(ncclGroupStart(), ncclSuccess);
    assert_int_equal(ncclReduce(x[0], y, 4, ncclFloat32, ncclSum, 2, comm[0], NULL),
                     ncclInvalidArgument);
    assert_int_equal(ncclGroupEnd(), ncclInvalidArgument);
    assert_int_equal(fake_errors(msg, sizeof msg), ++errors);
    assert_non_null(strstr(msg, "root 2 out of range"));
    assert_int_equal(ncclScatter(NULL, y, 2, ncclFloat32, 0, comm[0], NULL), ncclInvalidArgument);
    assert_int_equal(fake_errors(msg, sizeof msg), ++errors);
    assert_non_null(strstr(msg, "NULL sendbuff"));
    assert_int_equal(ncclAllGather(g[0] + 4, g[0], 4, ncclFloat32, comm[0], NULL),
                     ncclInvalidArgument); /* rank 0's in-place position is g[0] + 0 */
    assert_int_equal(fake_errors(msg, sizeof msg), ++errors);
    assert_non_null(strstr(msg, "overlap"));
    assert_int_equal(ncclAlltoAll(g[0], g[0], 4, ncclFloat32, comm[0], NULL), ncclInvalidArgument);
    assert_int_equal(fake_errors(msg, sizeof msg), ++errors);
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaMalloc(&dev, 6 * sizeof(float)), cudaSuccess); /* holds 1.5 blocks */
    assert_int_equal(ncclAllGather(x[0], dev, 4, ncclFloat32, comm[0], NULL), ncclInvalidArgument);
    assert_int_equal(fake_errors(msg, sizeof msg), ++errors);
    assert_non_null(strstr(msg, "does not hold the 32 bytes"));
    assert_int_equal(cudaFree(dev), cudaSuccess);
    fake_set_devices(2, 8);
    assert_int_equal(ncclReduceScatter(g[0], y, 4, ncclFloat8e4m3, ncclSum, comm[0], NULL),
                     ncclInvalidArgument);
    assert_int_equal(fake_errors(msg, sizeof msg), ++errors);
    assert_non_null(strstr(msg, "fp8"));
    b8[0][0] = 0x38;
    assert_int_equal(ncclGroupStart(), ncclSuccess); /* moving fp8 is fine below sm90 */
    assert_int_equal(ncclBroadcast(b8[0], b8[0], 4, ncclFloat8e4m3, 0, comm[0], NULL), ncclSuccess);
    assert_int_equal(ncclBroadcast(NULL, b8[1], 4, ncclFloat8e4m3, 0, comm[1], NULL), ncclSuccess);
    assert_int_equal(ncclGroupEnd(), ncclSuccess);
    assert_int_equal(b8[1][0], 0x38);
    assert_int_equal(fake_errors(NULL, 0), errors);
    fake_set_devices(NDEV, 9);

    /* Complete groups run: in-place all_gather, reduce and scatter with NULL on the
     * non-root, gather in place on the root. */
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 4; i++)
            g[r][r * 4 + i] = (float)(r * 10 + i);
    assert_int_equal(ncclGroupStart(), ncclSuccess);
    assert_int_equal(ncclAllGather(g[0], g[0], 4, ncclFloat32, comm[0], NULL), ncclSuccess);
    assert_int_equal(ncclAllGather(g[1] + 4, g[1], 4, ncclFloat32, comm[1], NULL), ncclSuccess);
    assert_int_equal(ncclReduce(x[0], NULL, 4, ncclFloat32, ncclMax, 1, comm[0], NULL),
                     ncclSuccess);
    assert_int_equal(ncclReduce(x[1], y, 4, ncclFloat32, ncclMax, 1, comm[1], NULL), ncclSuccess);
    assert_int_equal(ncclGroupEnd(), ncclSuccess);
    for (int i = 0; i < 8; i++) {
        float want = (float)((i / 4) * 10 + i % 4);
        assert_true(g[0][i] == want && g[1][i] == want);
    }
    assert_true(y[0] == 10.0f && y[3] == 40.0f);
    /* NCCL_CHECK_POINTERS=1 checks a non-root's scatter sendbuff and gather recvbuff too
     * (misc/argcheck.cc): NULL is refused, any valid pointer goes (it is not used). */
    assert_int_equal(ncclGather(x[0], NULL, 2, ncclFloat32, 1, comm[0], NULL), ncclInvalidArgument);
    assert_int_equal(fake_errors(msg, sizeof msg), ++errors);
    assert_non_null(strstr(msg, "NCCL_CHECK_POINTERS"));
    assert_int_equal(ncclGroupStart(), ncclSuccess);
    assert_int_equal(ncclScatter(y, y, 4, ncclFloat32, 1, comm[0], NULL), ncclSuccess);
    assert_int_equal(ncclScatter(g[0], g[0] + 4, 4, ncclFloat32, 1, comm[1], NULL), ncclSuccess);
    assert_int_equal(ncclGather(x[0], x[0], 2, ncclFloat32, 1, comm[0], NULL), ncclSuccess);
    assert_int_equal(ncclGather(g[1] + 2, g[1], 2, ncclFloat32, 1, comm[1], NULL), ncclSuccess);
    assert_int_equal(ncclGroupEnd(), ncclSuccess);
    assert_true(y[0] == 0.0f && y[3] == 3.0f);       /* block 0 of root 1's g[0] */
    assert_true(g[1][0] == 1.0f && g[1][1] == 2.0f); /* rank 0's x[0][0..1] */
    assert_true(g[1][2] == 2.0f && g[1][3] == 3.0f); /* in place: the root's own block */
    assert_int_equal(fake_errors(NULL, 0), errors);
    for (int r = 0; r < 2; r++)
        assert_int_equal(ncclCommDestroy(comm[r]), ncclSuccess);
    fake_reset(); /* forget the errors provoked on purpose */
}

/* ---- Creation ---- */

/* Create asks for devices, the NCCL version and each device's compute capability;
 * ccq_comm_init is ncclGetUniqueId, one group of cudaSetDevice + non-blocking
 * ncclCommInitRankConfig per rank, then ncclCommGetAsyncError polls until none is in
 * progress, all on the scheduler thread. */
static void test_init_sequence(void **state)
{
    (void)state;
    static const ccq_device_id shuffled[NDEV] = {2, 0, 3, 1};
    enum { PENDING = 3 };
    fake_set_pending(PENDING);
    ccq_runtime *rt = make_rt(10000);
    long at = fake_log_find("cudaDeviceGetAttribute", 0);

    assert_int_equal(fake_log_count("cudaGetDeviceCount"), 1);
    assert_int_equal(fake_log_count("ncclGetVersion"), 1);
    assert_int_equal(fake_log_count("cudaDeviceGetAttribute"), NDEV);
    for (int d = 0; d < NDEV; d++) {
        fake_call c = entry((size_t)at + (size_t)d);
        assert_string_equal(c.fn, "cudaDeviceGetAttribute");
        assert_int_equal(c.device, d);
        assert_int_equal(c.value, cudaDevAttrComputeCapabilityMajor);
    }
    assert_int_equal(fake_log_count("ncclCommInitRankConfig"), 0);

    fake_log_reset();
    assert_int_equal(ccq_comm_init(rt, shuffled, NDEV), CCQ_OK);
    size_t i = 0;
    fake_call c = entry(i++);
    ncclComm_t comms[NDEV];
    pthread_t sched = c.thread;
    assert_string_equal(c.fn, "ncclGetUniqueId");
    assert_false(on_this_thread(&c));
    c = entry(i++);
    assert_string_equal(c.fn, "ncclGroupStart");
    for (int r = 0; r < NDEV; r++) {
        c = entry(i++);
        assert_string_equal(c.fn, "cudaSetDevice");
        assert_int_equal(c.device, r); /* rank r is the r-th device of the sorted set */
        c = entry(i++);
        assert_string_equal(c.fn, "ncclCommInitRankConfig");
        assert_int_equal(c.rank, r);
        assert_int_equal(c.nranks, NDEV);
        assert_int_equal(c.device, r);
        assert_int_equal(c.value, 0); /* config.blocking */
        assert_int_equal(c.result, ncclSuccess);
        comms[r] = c.comm;
    }
    c = entry(i++);
    assert_string_equal(c.fn, "ncclGroupEnd");
    assert_int_equal(c.result, ncclInProgress);
    /* Each round asks every rank; the rounds stop once none is in progress. */
    for (int round = 0; round <= PENDING; round++) {
        for (int r = 0; r < NDEV; r++) {
            c = entry(i++);
            assert_string_equal(c.fn, "ncclCommGetAsyncError");
            assert_ptr_equal(c.comm, comms[r]);
            assert_int_equal(c.value, round < PENDING ? ncclInProgress : ncclSuccess);
        }
    }
    assert_int_equal(fake_log_size(), i);
    assert_int_equal(fake_log_count("ncclGetUniqueId"), 1);
    for (size_t k = 0; k < i; k++) {
        c = entry(k);
        assert_true(pthread_equal(c.thread, sched));
    }
    /* The same set again is a no-op. */
    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    assert_int_equal(fake_log_size(), i);
    allreduce_all(rt, 0, 1);
}

/* Creation failures: the group is always closed, the ranks created so far are aborted,
 * and the set reports why afterwards. */
static void test_init_errors(void **state)
{
    (void)state;
    static const ccq_device_id p23[2] = {2, 3};
    ccq_runtime *rt = make_rt(300);
    char detail[512];
    int x = 0;

    /* ncclCommInitRankConfig fails on rank 1. */
    fake_set_last_error("fake: no memory for the proxy");
    fake_script("ncclCommInitRankConfig", ncclSuccess);
    fake_script("ncclCommInitRankConfig", ncclSystemError);
    assert_int_equal(ccq_comm_init(rt, P01, 2), CCQ_ERR_BACKEND);
    snprintf(detail, sizeof detail, "%s", ccq_last_error_detail());
    assert_detail_has(detail, "ncclCommInitRankConfig");
    assert_detail_has(detail, "unhandled system error");
    assert_detail_has(detail, "fake: no memory for the proxy");
    assert_int_equal(fake_log_count("ncclGroupStart"), fake_log_count("ncclGroupEnd"));
    assert_int_equal(fake_log_count("ncclCommAbort"), 1);
    fake_call made = entry((size_t)fake_log_find("ncclCommInitRankConfig", 0));
    fake_call aborted = entry((size_t)fake_log_find("ncclCommAbort", 0));
    assert_ptr_equal(aborted.comm, made.comm);
    assert_int_equal(ccq_all_reduce(rt, 0, 0, &x, &x, 1, CCQ_INT32, CCQ_SUM, P01, 2),
                     CCQ_ERR_BACKEND);
    assert_detail_has(ccq_last_error_detail(), "could not be created");

    /* An asynchronous error while the communicators initialise: every rank is aborted. */
    fake_log_reset();
    fake_set_last_error("");
    fake_script_async_error(2, ncclRemoteError);
    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_ERR_BACKEND);
    assert_detail_has(ccq_last_error_detail(), "remote process exited");
    assert_int_equal(fake_log_count("ncclCommAbort"), NDEV);
    assert_int_equal(fake_log_count("ncclCommDestroy"), 0);

    /* Creation that never finishes: CCQ_ERR_TIMEOUT, then the ranks are aborted. */
    fake_log_reset();
    fake_hold_async(true);
    assert_int_equal(ccq_comm_init(rt, p23, 2), CCQ_ERR_TIMEOUT);
    wait_calls("ncclCommAbort", 2);
    fake_hold_async(false);
    assert_int_equal(fake_log_count("ncclCommAbort"), 2);
}

/* No GPU, or an NCCL too old: ccq_runtime_create says so with CCQ_ERR_UNSUPPORTED. */
static void test_no_gpu(void **state)
{
    (void)state;
    ccq_config cfg;
    ccq_runtime *rt = NULL;

    ccq_config_init(&cfg);
    cfg.backend = "nccl";
    fake_script("cudaGetDeviceCount", cudaErrorNoDevice);
    assert_int_equal(ccq_runtime_create(&cfg, &rt), CCQ_ERR_UNSUPPORTED);
    assert_null(rt);
    assert_detail_has(ccq_last_error_detail(), "no usable CUDA device");
    assert_detail_has(ccq_last_error_detail(), "no CUDA-capable device is detected");
    assert_detail_has(ccq_last_error_detail(), "cudaErrorNoDevice");
    assert_detail_has(ccq_last_error_detail(), "use backend \"host\"");

    fake_set_devices(0, 9);
    assert_int_equal(ccq_runtime_create(&cfg, &rt), CCQ_ERR_UNSUPPORTED);
    assert_null(rt);
    assert_detail_has(ccq_last_error_detail(), "0 devices");

    fake_set_devices(NDEV, 9);
    fake_set_nccl_version(NCCL_VERSION(2, 18, 5));
    assert_int_equal(ccq_runtime_create(&cfg, &rt), CCQ_ERR_UNSUPPORTED);
    assert_null(rt);
    assert_detail_has(ccq_last_error_detail(), "too old");
    assert_int_equal(fake_log_count("cudaStreamCreateWithFlags"), 0);
}

/* ---- Batches ---- */

/* One all_reduce: one group holding every rank's ncclAllReduce, each on its device's own
 * non-blocking stream; then one completion event recorded per stream. */
static void test_allreduce_one_group(void **state)
{
    (void)state;
    enum { N = 1000 };
    static float in[NDEV][N], out[NDEV][N], want[N];
    const void *inputs[NDEV];
    cudaStream_t cs[NDEV] = {0};
    group_info g[4];
    char msg[256];
    ccq_runtime *rt = make_rt(10000);

    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    fake_log_reset();
    for (int d = 0; d < NDEV; d++) {
        ref_fill(CCQ_FLOAT32, in[d], N, 10u + (uint32_t)d);
        memset(out[d], 0xff, sizeof out[d]);
        inputs[d] = in[d];
    }
    ref_allreduce(CCQ_FLOAT32, CCQ_SUM, NDEV, inputs, want, N);
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 0, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV), CCQ_OK);
    for (ccq_device_id d = 0; d < NDEV; d++) {
        assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_OK);
        if (ref_compare(CCQ_FLOAT32, out[d], want, N, msg, sizeof msg) != 0)
            fail_msg("device %u: %s", d, msg);
    }

    assert_int_equal(fake_log_count("ncclGroupStart"), 1);
    assert_int_equal(data_groups(g, 4), 1);
    assert_int_equal(g[0].nallreduce, NDEV);
    assert_int_equal(g[0].nother, 0);
    for (size_t i = g[0].start + 1; i < g[0].end; i++) {
        fake_call c = entry(i);
        assert_false(on_this_thread(&c));
        if (is(&c, "cudaSetDevice"))
            continue;
        assert_true(c.rank >= 0 && c.rank < NDEV);
        assert_null(cs[c.rank]); /* each rank once */
        assert_non_null(c.stream);
        cs[c.rank] = c.stream;
        assert_int_equal(c.nranks, NDEV);
        assert_int_equal(c.device, c.rank);
        assert_ptr_equal(c.src, in[c.rank]);
        assert_ptr_equal(c.dst, out[c.rank]);
        assert_int_equal(c.count, N);
        assert_int_equal(c.dtype, ncclFloat32);
        assert_int_equal(c.op, ncclSum);
    }
    for (int d = 0; d < NDEV; d++) {
        long made = find_on_stream("cudaStreamCreateWithFlags", cs[d], 0);
        assert_true(made >= 0 && (size_t)made < g[0].start);
        fake_call c = entry((size_t)made);
        assert_int_equal(c.device, d);
        assert_int_equal(c.value, cudaStreamNonBlocking);
        for (int e = 0; e < d; e++)
            assert_ptr_not_equal(cs[e], cs[d]);
        long rec = find_on_stream("cudaEventRecord", cs[d], g[0].end);
        assert_true(rec > (long)g[0].end);
        assert_int_equal(find_on_stream("cudaEventRecord", cs[d], (size_t)rec + 1), -1);
    }
    assert_int_equal(fake_log_count("cudaEventRecord"), NDEV);
    ccq_stats st = stats_of(rt);
    assert_int_equal(st.batches, 1);
    assert_int_equal(st.completed, NDEV);
}

/* Everything found ready in one pass is one group: eight all_reduces of every rank and a
 * send/recv pair of another communicator, each rank's collectives in submission order. */
static void test_batch_is_one_group(void **state)
{
    (void)state;
    enum { K = 8, N = 256 };
    static int32_t in[K][NDEV][N], out[K][NDEV][N], want[K][N], sbuf[N], rbuf[N];
    int next[NDEV] = {0};
    group_info g[4];
    blocker b;
    char msg[256];
    ccq_runtime *rt = make_rt(10000);

    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    assert_int_equal(ccq_comm_init(rt, P01, 2), CCQ_OK);
    /* Warm the streams up: the scheduler only scans streams it already knows. */
    allreduce_all(rt, 1, 7);
    assert_int_equal(ccq_send(rt, 0, 3, sbuf, N, CCQ_INT32, 1), CCQ_OK);
    assert_int_equal(ccq_recv(rt, 1, 3, rbuf, N, CCQ_INT32, 0), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 1, 3), CCQ_OK);
    ccq_stats before = stats_of(rt);
    fake_log_reset();

    block_scheduler(&b, rt);
    ref_fill(CCQ_INT32, sbuf, N, 99);
    memset(rbuf, 0, sizeof rbuf);
    assert_int_equal(ccq_send(rt, 0, 3, sbuf, N, CCQ_INT32, 1), CCQ_OK);
    assert_int_equal(ccq_recv(rt, 1, 3, rbuf, N, CCQ_INT32, 0), CCQ_OK);
    for (int k = 0; k < K; k++) {
        const void *inputs[NDEV];
        for (int d = 0; d < NDEV; d++) {
            ref_fill(CCQ_INT32, in[k][d], N, 100u * (uint32_t)k + (uint32_t)d);
            inputs[d] = in[k][d];
        }
        ref_allreduce(CCQ_INT32, CCQ_SUM, NDEV, inputs, want[k], N);
        for (ccq_device_id d = 0; d < NDEV; d++)
            assert_int_equal(
                ccq_all_reduce(rt, d, 1, in[k][d], out[k][d], N, CCQ_INT32, CCQ_SUM, ALL, NDEV),
                CCQ_OK);
    }
    release_scheduler(&b);
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 1), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 0, 3), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 1, 3), CCQ_OK);
    assert_memory_equal(rbuf, sbuf, sizeof sbuf);
    for (int k = 0; k < K; k++)
        for (int d = 0; d < NDEV; d++)
            if (ref_compare(CCQ_INT32, out[k][d], want[k], N, msg, sizeof msg) != 0)
                fail_msg("all_reduce %d device %d: %s", k, d, msg);

    assert_int_equal(data_groups(g, 4), 1);
    assert_int_equal(g[0].nallreduce, K * NDEV);
    assert_int_equal(g[0].nsend, 1);
    assert_int_equal(g[0].nrecv, 1);
    assert_int_equal(g[0].nother, 0);
    for (size_t i = g[0].start + 1; i < g[0].end; i++) {
        fake_call c = entry(i);
        if (!is(&c, "ncclAllReduce"))
            continue;
        assert_true(next[c.rank] < K);
        assert_ptr_equal(c.src, in[next[c.rank]][c.rank]);
        next[c.rank]++;
    }
    ccq_stats st = stats_of(rt);
    assert_int_equal(st.batches - before.batches, 1);
    assert_int_equal(st.max_batch_ops, K + 1);
}

/* A ring of send-then-recv over the four devices: one group with four ncclSend and four
 * ncclRecv, each addressed to the right peer, and the data moved. */
static void test_sendrecv_ring(void **state)
{
    (void)state;
    enum { N = 300 };
    static double src[NDEV][N], dst[NDEV][N];
    group_info g[4];
    ccq_runtime *rt = make_rt(10000);

    for (int d = 0; d < NDEV; d++) {
        ref_fill(CCQ_FLOAT64, src[d], N, 40u + (uint32_t)d);
        memset(dst[d], 0, sizeof dst[d]);
    }
    for (ccq_device_id d = 0; d < NDEV; d++) {
        assert_int_equal(ccq_send(rt, d, 0, src[d], N, CCQ_FLOAT64, (d + 1) % NDEV), CCQ_OK);
        assert_int_equal(ccq_recv(rt, d, 0, dst[d], N, CCQ_FLOAT64, (d + NDEV - 1) % NDEV), CCQ_OK);
    }
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_OK);
    for (int d = 0; d < NDEV; d++)
        assert_memory_equal(dst[d], src[(d + NDEV - 1) % NDEV], sizeof dst[d]);

    assert_int_equal(data_groups(g, 4), 1);
    assert_int_equal(g[0].nsend, NDEV);
    assert_int_equal(g[0].nrecv, NDEV);
    assert_int_equal(g[0].nallreduce + g[0].nother, 0);
    for (size_t i = g[0].start + 1; i < g[0].end; i++) {
        fake_call c = entry(i);
        if (is(&c, "cudaSetDevice"))
            continue;
        assert_int_equal(c.nranks, 2);
        assert_int_equal(c.peer, 1 - c.rank);
        assert_int_equal(c.count, N);
        assert_int_equal(c.dtype, ncclFloat64);
        if (is(&c, "ncclSend")) {
            assert_ptr_equal(c.src, src[c.device]);
            assert_int_equal(c.peer_device, (c.device + 1) % NDEV);
        } else {
            assert_ptr_equal(c.dst, dst[c.device]);
            assert_int_equal(c.peer_device, (c.device + NDEV - 1) % NDEV);
        }
    }
}

/* A device sending to itself: a one-rank communicator, ncclSend and ncclRecv to rank 0 in
 * one group. */
static void test_self_sendrecv(void **state)
{
    (void)state;
    enum { N = 77 };
    static uint8_t src[N], dst[N];
    group_info g[2];
    ccq_runtime *rt = make_rt(10000);

    ref_fill(CCQ_UINT8, src, N, 3);
    assert_int_equal(ccq_send(rt, 2, 0, src, N, CCQ_UINT8, 2), CCQ_OK);
    assert_int_equal(ccq_recv(rt, 2, 0, dst, N, CCQ_UINT8, 2), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 2, 0), CCQ_OK);
    assert_memory_equal(dst, src, N);

    fake_call init = entry((size_t)fake_log_find("ncclCommInitRankConfig", 0));
    assert_int_equal(init.nranks, 1);
    assert_int_equal(init.device, 2);
    assert_int_equal(data_groups(g, 2), 1);
    assert_int_equal(g[0].nsend, 1);
    assert_int_equal(g[0].nrecv, 1);
    for (size_t i = g[0].start + 1; i < g[0].end; i++) {
        fake_call c = entry(i);
        if (is(&c, "cudaSetDevice")) {
            assert_int_equal(c.device, 2);
            continue;
        }
        assert_ptr_equal(c.comm, init.comm);
        assert_int_equal(c.peer, 0);
        assert_int_equal(c.peer_device, 2);
        assert_int_equal(c.dtype, ncclUint8);
    }
}

/* Issue 11: the largest timeout_ms does not wrap the backend's deadlines: a communicator
 * whose creation reports ncclInProgress a few times is still waited for. */
static void test_max_timeout(void **state)
{
    (void)state;
    static float buf[NDEV][8];
    const uint64_t max = UINT64_MAX / 1000000u;
    for (uint64_t t = max - 1; t <= max; t++) {
        ccq_runtime *rt = make_rt(t);
        fake_set_pending(3);
        assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
        for (ccq_device_id d = 0; d < NDEV; d++)
            assert_int_equal(
                ccq_all_reduce(rt, d, 0, buf[d], buf[d], 8, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV),
                CCQ_OK);
        for (ccq_device_id d = 0; d < NDEV; d++)
            assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_OK);
        assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
        g_rt = NULL;
        fake_set_pending(0);
    }
}

/* Issue 11: an in-place exchange, ring shift or self send/recv (a send whose src a later
 * recv of its stream overwrites, in one group) cannot be staged by the NCCL backend: every
 * part fails at once with CCQ_ERR_UNSUPPORTED (never the watchdog, never part of a ring),
 * no NCCL call is made for them, and later work on the same streams runs. */
static void test_inplace_sendrecv_refused(void **state)
{
    (void)state;
    enum { N = 64 };
    static float buf[NDEV][N], other[NDEV][N];
    group_info g[2];
    setenv("CCQ_SPIN_US", "0", 1); /* the scheduler sleeps as soon as it has nothing to do */
    ccq_runtime *rt = make_rt(10000);
    unsetenv("CCQ_SPIN_US");
    uint64_t t0 = now_ns();

    for (int shape = 0; shape < 3; shape++) {
        uint32_t nd = shape == 0 ? 2 : shape == 1 ? NDEV : 1;
        for (ccq_device_id d = 0; d < nd; d++) {
            ccq_device_id next = (d + 1) % nd, prev = (d + nd - 1) % nd;
            assert_int_equal(ccq_send(rt, d, 0, buf[d], N, CCQ_FLOAT32, next), CCQ_OK);
            assert_int_equal(ccq_recv(rt, d, 0, buf[d], N, CCQ_FLOAT32, prev), CCQ_OK);
        }
        for (ccq_device_id d = 0; d < nd; d++) {
            assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_ERR_UNSUPPORTED);
            assert_non_null(strstr(ccq_last_error_detail(), "cannot stage"));
        }
    }
    assert_true(now_ns() - t0 < 5000000000ull);
    assert_int_equal(data_groups(g, 2), 0);
    /* An all_reduce before the exchange on the same streams does not need it: it runs, and
     * only the exchange fails. */
    static float ar[2][N];
    ccq_device_id pair[2] = {0, 1};
    uint64_t completed = stats_of(rt).completed;
    for (ccq_device_id d = 0; d < 2; d++) {
        ar[d][0] = (float)(d + 1);
        assert_int_equal(ccq_all_reduce(rt, d, 0, ar[d], ar[d], N, CCQ_FLOAT32, CCQ_SUM, pair, 2),
                         CCQ_OK);
        assert_int_equal(ccq_send(rt, d, 0, buf[d], N, CCQ_FLOAT32, 1 - d), CCQ_OK);
        assert_int_equal(ccq_recv(rt, d, 0, buf[d], N, CCQ_FLOAT32, 1 - d), CCQ_OK);
    }
    for (ccq_device_id d = 0; d < 2; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_ERR_UNSUPPORTED);
    assert_int_equal(stats_of(rt).completed, completed + 2);
    assert_true(ar[0][0] == 3.0f && ar[1][0] == 3.0f);
    /* Separate buffers on the same streams still work. */
    for (ccq_device_id d = 0; d < 2; d++) {
        assert_int_equal(ccq_send(rt, d, 0, buf[d], N, CCQ_FLOAT32, 1 - d), CCQ_OK);
        assert_int_equal(ccq_recv(rt, d, 0, other[d], N, CCQ_FLOAT32, 1 - d), CCQ_OK);
    }
    for (ccq_device_id d = 0; d < 2; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_OK);
}

/* NCCL runs a one-rank communicator's operation at the call, on the calling thread's current
 * device (the fake refuses it otherwise): the scheduler makes each part's device current
 * before it calls NCCL, also after work on other devices left another one current. */
static void test_one_rank_current_device(void **state)
{
    (void)state;
    enum { N = 33 };
    static float in[N], out[N];
    static uint8_t src[N], dst[N];
    static const ccq_device_id one[1] = {1};
    ccq_runtime *rt = make_rt(10000);

    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    assert_int_equal(ccq_comm_init(rt, one, 1), CCQ_OK);
    allreduce_all(rt, 0, 5); /* NCCL streams of stream 0 on every device; the last stays current */
    ref_fill(CCQ_FLOAT32, in, N, 8);
    assert_int_equal(ccq_all_reduce(rt, 1, 0, in, out, N, CCQ_FLOAT32, CCQ_AVG, one, 1), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 1, 0), CCQ_OK);
    assert_memory_equal(out, in, sizeof in);

    allreduce_all(rt, 0, 6);
    ref_fill(CCQ_UINT8, src, N, 9);
    assert_int_equal(ccq_send(rt, 2, 0, src, N, CCQ_UINT8, 2), CCQ_OK);
    assert_int_equal(ccq_recv(rt, 2, 0, dst, N, CCQ_UINT8, 2), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 2, 0), CCQ_OK);
    assert_memory_equal(dst, src, N);
}

/* ---- Bound streams ---- */

typedef struct submitter {
    ccq_runtime *rt;
    ccq_device_id d;
    const float *src[2];
    float *dst[2];
    ccq_status st[2];
} submitter;

static void *submitter_main(void *arg)
{
    submitter *s = arg;
    for (int k = 0; k < 2; k++)
        s->st[k] = ccq_all_reduce(s->rt, s->d, 0, s->src[k], s->dst[k], 128, CCQ_FLOAT32, CCQ_MAX,
                                  ALL, NDEV);
    return NULL;
}

/* On a bound stream, the submitting thread records an event on the caller's stream, and
 * the scheduler makes the NCCL stream wait on that event before the group holding the
 * op. An unbound stream has neither. */
static void test_bound_stream_waits_for_submission(void **state)
{
    (void)state;
    enum { N = 128 };
    static float in[2][NDEV][N], out[2][NDEV][N], want[2][N];
    cudaStream_t user[NDEV];
    submitter sub[NDEV];
    pthread_t tid[NDEV];
    char msg[256];
    ccq_runtime *rt = make_rt(10000);

    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    assert_int_equal(cudaSetDevice(3), cudaSuccess);
    for (int d = 0; d < NDEV; d++) {
        size_t events = (size_t)fake_live("event");
        user[d] = fake_user_stream(d);
        assert_int_equal(ccq_nccl_bind_stream(rt, (ccq_device_id)d, 0, user[d]), CCQ_OK);
        /* One event per queue slot, made on the stream's device; the caller's device is
         * restored. */
        assert_int_equal((size_t)fake_live("event"), events + QUEUE_DEPTH);
        assert_int_equal(fake_current_device(), 3);
    }
    for (int k = 0; k < 2; k++) {
        const void *inputs[NDEV];
        for (int d = 0; d < NDEV; d++) {
            ref_fill(CCQ_FLOAT32, in[k][d], N, 10u * (uint32_t)k + (uint32_t)d);
            inputs[d] = in[k][d];
        }
        ref_allreduce(CCQ_FLOAT32, CCQ_MAX, NDEV, inputs, want[k], N);
    }
    fake_log_reset();
    for (int d = 0; d < NDEV; d++) {
        sub[d] = (submitter){rt, (ccq_device_id)d, {in[0][d], in[1][d]}, {out[0][d], out[1][d]}};
        assert_int_equal(pthread_create(&tid[d], NULL, submitter_main, &sub[d]), 0);
    }
    for (int d = 0; d < NDEV; d++) {
        assert_int_equal(pthread_join(tid[d], NULL), 0);
        assert_int_equal(sub[d].st[0], CCQ_OK);
        assert_int_equal(sub[d].st[1], CCQ_OK);
    }
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_OK);
    for (int k = 0; k < 2; k++)
        for (int d = 0; d < NDEV; d++)
            if (ref_compare(CCQ_FLOAT32, out[k][d], want[k], N, msg, sizeof msg) != 0)
                fail_msg("round %d device %d: %s", k, d, msg);

    for (int d = 0; d < NDEV; d++) {
        long rec[2], wait[2], op[2];
        cudaStream_t comm_stream;
        for (int k = 0; k < 2; k++) {
            rec[k] = find_on_stream("cudaEventRecord", user[d], k ? (size_t)rec[0] + 1 : 0);
            assert_true(rec[k] >= 0);
        }
        assert_int_equal(find_on_stream("cudaEventRecord", user[d], (size_t)rec[1] + 1), -1);
        fake_call r0 = entry((size_t)rec[0]), r1 = entry((size_t)rec[1]);
        assert_true(pthread_equal(r0.thread, tid[d]));
        assert_true(pthread_equal(r1.thread, tid[d]));
        assert_ptr_not_equal(r0.event, r1.event); /* one event per slot */
        /* The ops of rank d, in order, and the NCCL stream they ran on. */
        op[0] = find_rank("ncclAllReduce", d, 0);
        assert_true(op[0] >= 0);
        op[1] = find_rank("ncclAllReduce", d, (size_t)op[0] + 1);
        assert_true(op[1] >= 0);
        fake_call a0 = entry((size_t)op[0]), a1 = entry((size_t)op[1]);
        assert_ptr_equal(a0.src, in[0][d]);
        assert_ptr_equal(a1.src, in[1][d]);
        comm_stream = a0.stream;
        assert_ptr_equal(a1.stream, comm_stream);
        for (int k = 0; k < 2; k++) {
            wait[k] =
                find_on_stream("cudaStreamWaitEvent", comm_stream, k ? (size_t)wait[0] + 1 : 0);
            assert_true(wait[k] >= 0);
            fake_call w = entry((size_t)wait[k]), r = entry((size_t)rec[k]);
            assert_ptr_equal(w.event, r.event);
            assert_false(on_this_thread(&w));
            assert_true(rec[k] < wait[k]);
            assert_true((size_t)wait[k] < group_start_before((size_t)op[k]));
        }
        assert_int_equal(find_on_stream("cudaStreamWaitEvent", comm_stream, (size_t)wait[1] + 1),
                         -1);
    }

    /* Stream 1 is not bound: nothing recorded at submission, nothing waited on. */
    fake_log_reset();
    allreduce_all(rt, 1, 5);
    assert_int_equal(fake_log_count("cudaStreamWaitEvent"), 0);
    for (long i = fake_log_find("cudaEventRecord", 0); i >= 0;
         i = fake_log_find("cudaEventRecord", (size_t)i + 1)) {
        fake_call c = entry((size_t)i);
        assert_false(on_this_thread(&c));
    }
}

/* A fence that returns CCQ_OK on a bound stream makes the caller's stream wait on the
 * completion event recorded on the NCCL stream after the group. */
static void test_fence_makes_user_stream_wait(void **state)
{
    (void)state;
    cudaStream_t user[NDEV];
    ccq_runtime *rt = make_rt(10000);

    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    for (int d = 0; d < NDEV; d++) {
        user[d] = fake_user_stream(d);
        assert_int_equal(ccq_nccl_bind_stream(rt, (ccq_device_id)d, 0, user[d]), CCQ_OK);
    }
    fake_log_reset();
    allreduce_all(rt, 0, 3);
    for (int d = 0; d < NDEV; d++) {
        fake_call op, done, wait;
        long i = find_rank("ncclAllReduce", d, 0);
        assert_true(i >= 0);
        op = entry((size_t)i);
        long rec = find_on_stream("cudaEventRecord", op.stream, (size_t)i);
        assert_true(rec > i);
        done = entry((size_t)rec);
        long w = find_on_stream("cudaStreamWaitEvent", user[d], 0);
        assert_true(w > rec);
        wait = entry((size_t)w);
        assert_true(on_this_thread(&wait)); /* the fencing thread */
        assert_ptr_equal(wait.event, done.event);
        assert_int_equal(find_on_stream("cudaStreamWaitEvent", user[d], (size_t)w + 1), -1);
    }

    /* An unbound stream's fence touches no CUDA stream. */
    fake_log_reset();
    allreduce_all(rt, 1, 4);
    assert_int_equal(fake_log_count("cudaStreamWaitEvent"), 0);
}

/* ---- Completion ---- */

typedef struct fencer {
    pthread_t thread;
    ccq_runtime *rt;
    ccq_device_id d;
    _Atomic int done;
    ccq_status st;
} fencer;

static void *fencer_main(void *arg)
{
    fencer *f = arg;
    f->st = ccq_sync_collective(f->rt, f->d, 0);
    atomic_store_explicit(&f->done, 1, memory_order_release);
    return NULL;
}

/* Completion events are recorded after the group and polled: the fence does not return
 * while they are not ready, and returns CCQ_OK once they are. */
static void test_completion_events_polled(void **state)
{
    (void)state;
    enum { N = 64 };
    static float in[NDEV][N], out[NDEV][N];
    cudaEvent_t done[NDEV];
    group_info g[2];
    fencer f = {0};
    ccq_runtime *rt = make_rt(10000);

    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    fake_set_manual_events(true);
    fake_log_reset();
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 0, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV), CCQ_OK);
    f.rt = rt;
    f.d = 0;
    atomic_init(&f.done, 0);
    assert_int_equal(pthread_create(&f.thread, NULL, fencer_main, &f), 0);
    wait_calls("cudaEventQuery", 20);
    sleep_ms(50);
    assert_int_equal(atomic_load_explicit(&f.done, memory_order_acquire), 0);
    fake_complete_events();
    assert_int_equal(pthread_join(f.thread, NULL), 0);
    assert_int_equal(f.st, CCQ_OK);
    for (ccq_device_id d = 1; d < NDEV; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_OK);

    assert_int_equal(data_groups(g, 2), 1);
    for (size_t i = g[0].end + 1, n = 0; n < NDEV; i++, n++) {
        fake_call c = entry(i); /* right after the group */
        assert_string_equal(c.fn, "cudaEventRecord");
        done[n] = c.event;
    }
    assert_int_equal(fake_log_count("cudaEventRecord"), NDEV);
    size_t size = fake_log_size(), notready = 0;
    int last[NDEV];
    for (int n = 0; n < NDEV; n++)
        last[n] = -1;
    for (size_t i = 0; i < size; i++) {
        fake_call c = entry(i);
        if (!is(&c, "cudaEventQuery"))
            continue;
        int n = 0;
        while (n < NDEV && c.event != done[n])
            n++;
        assert_true(n < NDEV); /* only completion events are polled */
        assert_true(i > g[0].end);
        assert_false(on_this_thread(&c));
        last[n] = c.result;
        notready += c.result == cudaErrorNotReady;
    }
    assert_true(notready >= 20);
    for (int n = 0; n < NDEV; n++)
        assert_int_equal(last[n], cudaSuccess);
}

/* ncclGroupEnd returning ncclInProgress: the scheduler polls ncclCommGetAsyncError until
 * every communicator left ncclInProgress, then records the completion events. */
static void test_group_end_in_progress(void **state)
{
    (void)state;
    enum { PENDING = 3 };
    group_info g[2];
    ccq_runtime *rt = make_rt(10000);

    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    fake_set_pending(PENDING);
    fake_script("ncclGroupEnd", ncclInProgress);
    fake_log_reset();
    allreduce_all(rt, 0, 9);

    assert_int_equal(data_groups(g, 2), 1);
    fake_call end = entry(g[0].end);
    assert_int_equal(end.result, ncclInProgress);
    long first_record = fake_log_find("cudaEventRecord", g[0].end);
    long first_query = fake_log_find("cudaEventQuery", g[0].end);
    size_t inprogress = 0, last_inprogress = 0;
    for (long i = fake_log_find("ncclCommGetAsyncError", g[0].end); i >= 0;
         i = fake_log_find("ncclCommGetAsyncError", (size_t)i + 1)) {
        fake_call c = entry((size_t)i);
        if (c.value == ncclInProgress) {
            inprogress++;
            last_inprogress = (size_t)i;
        }
    }
    assert_int_equal(inprogress, PENDING * NDEV);
    assert_true(first_record > (long)last_inprogress);
    assert_true(first_query > first_record);
}

/* While a group's launch is still in progress on a communicator (ncclGroupEnd returned
 * ncclInProgress), NCCL refuses every other call on it (the fake logs such a call as a
 * misuse): a batch on another stream that uses the communicator waits until it has left
 * ncclInProgress, then runs, and both batches complete with the right data. */
static void test_busy_comm_waits(void **state)
{
    (void)state;
    enum { N = 64, S = 2 };
    static float in[S][NDEV][N], out[S][NDEV][N], want[S][N];
    ccq_runtime *rt = make_rt(10000);
    char msg[256];

    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    for (int s = 0; s < S; s++) {
        const void *inputs[NDEV];
        for (int d = 0; d < NDEV; d++) {
            ref_fill(CCQ_FLOAT32, in[s][d], N, 40u + (uint32_t)(s * NDEV + d));
            inputs[d] = in[s][d];
        }
        ref_allreduce(CCQ_FLOAT32, CCQ_SUM, NDEV, inputs, want[s], N);
    }
    fake_set_pending(1);
    fake_script("ncclGroupEnd", ncclInProgress);
    fake_hold_async(true); /* the launch of the first batch does not finish */
    fake_log_reset();
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 0, in[0][d], out[0][d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV),
            CCQ_OK);
    wait_calls("ncclCommGetAsyncError", 1); /* batch 1 issued, its comms polled */
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 1, in[1][d], out[1][d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV),
            CCQ_OK);
    size_t polls = fake_log_count("ncclCommGetAsyncError");
    wait_calls("ncclCommGetAsyncError", polls + 4 * NDEV); /* still polled, nothing else */
    assert_int_equal(fake_log_count("ncclAllReduce"), NDEV);
    fake_hold_async(false);
    for (ccq_stream_id s = 0; s < S; s++)
        for (ccq_device_id d = 0; d < NDEV; d++) {
            assert_int_equal(ccq_sync_collective(rt, d, s), CCQ_OK);
            if (ref_compare(CCQ_FLOAT32, out[s][d], want[s], N, msg, sizeof msg) != 0)
                fail_msg("stream %u device %u: %s", s, d, msg);
        }
    assert_int_equal(fake_log_count("ncclAllReduce"), 2 * NDEV);
}

/* ---- Errors ---- */

/* NCCL and CUDA failures become ccq statuses per nccl_status(), with NCCL's own message
 * (ncclGetErrorString and ncclGetLastError) in the detail; the group is always closed. A
 * failure inside the group aborts its communicators; one before it leaves them usable. */
static void test_error_mapping(void **state)
{
    (void)state;
    static const struct {
        const char *fn;
        ncclResult_t r;
        ccq_status want;
        const char *text;
    } cases[] = {
        {"ncclAllReduce", ncclUnhandledCudaError, CCQ_ERR_BACKEND, "unhandled cuda error"},
        {"ncclAllReduce", ncclInvalidArgument, CCQ_ERR_INVALID_ARGUMENT, "invalid argument"},
        {"ncclGroupEnd", ncclInvalidUsage, CCQ_ERR_INVALID_ARGUMENT, "invalid usage"},
        {"ncclGroupEnd", ncclSystemError, CCQ_ERR_BACKEND, "unhandled system error"},
        {"ncclGroupEnd", ncclInternalError, CCQ_ERR_BACKEND, "internal error"},
        {"ncclGroupEnd", ncclRemoteError, CCQ_ERR_BACKEND, "remote process exited"},
        {"ncclGroupStart", ncclInternalError, CCQ_ERR_BACKEND, "internal error"},
    };
    ccq_runtime *rt;
    char last[64];

    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char text[128];
        bool started = strcmp(cases[k].fn, "ncclGroupStart") != 0;
        fake_reset();
        rt = make_rt(10000);
        assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
        snprintf(last, sizeof last, "fake last error %zu", k);
        snprintf(text, sizeof text, "NCCL error '%s", cases[k].text);
        fake_set_last_error(last);
        fake_script(cases[k].fn, cases[k].r);
        const char *has[] = {cases[k].fn, text, last, NULL};
        allreduce_expect(rt, 0, cases[k].want, has);
        /* Every group opened was closed (a failed ncclGroupStart opened none). */
        assert_int_equal(count_result("ncclGroupStart", ncclSuccess),
                         fake_log_count("ncclGroupEnd"));
        /* A failure after ncclGroupStart is not "nothing started": every communicator of
         * the group is aborted (NCCL may leave the error on them). Before it, the
         * communicator stays usable. */
        assert_int_equal(fake_log_count("ncclCommAbort"), started ? NDEV : 0);
        fake_set_last_error("");
        if (!started)
            allreduce_all(rt, 0, 21);
        assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
        g_rt = NULL;
        check_clean();
    }
    fake_reset();
    rt = make_rt(10000);
    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    allreduce_all(rt, 0, 21);

    /* A CUDA failure while setting up a stream's NCCL stream. */
    fake_script("cudaStreamCreateWithFlags", cudaErrorMemoryAllocation);
    static const char *const stream_has[] = {"cudaStreamCreateWithFlags", "out of memory",
                                             "cudaErrorMemoryAllocation", NULL};
    allreduce_expect(rt, 2, CCQ_ERR_BACKEND, stream_has);
    allreduce_all(rt, 2, 22);

    /* The submission event fails to record on the caller's stream: the op fails at once on
     * every rank, without reaching NCCL. */
    enum { N = 16 };
    static float in[NDEV][N], out[NDEV][N];
    cudaStream_t user = fake_user_stream(0);
    size_t ops = fake_log_count("ncclAllReduce");
    assert_int_equal(ccq_nccl_bind_stream(rt, 0, 3, user), CCQ_OK);
    fake_script("cudaEventRecord", cudaErrorLaunchFailure);
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 3, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 0, 3), CCQ_ERR_BACKEND);
    assert_detail_has(ccq_last_error_detail(), "cudaEventRecord on the bound stream");
    assert_detail_has(ccq_last_error_detail(), "unspecified launch failure");
    for (ccq_device_id d = 1; d < NDEV; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 3), CCQ_ERR_BACKEND);
    assert_int_equal(fake_log_count("ncclAllReduce"), ops);
    assert_int_equal(ccq_nccl_bind_stream(rt, 0, 3, NULL), CCQ_OK);
    allreduce_all(rt, 3, 23);
}

/* Shared by the abort tests: comms ALL and {0,1} (their NCCL handles by rank in all and
 * pair), then an asynchronous error on rank 1 during an all_reduce over ALL, which every
 * fence reports. The log starts just before that all_reduce. */
static void fail_all_comm(ccq_runtime *rt, ncclComm_t all[NDEV], ncclComm_t pair[2])
{
    static const char *const has[] = {"asynchronous error", "unhandled cuda error",
                                      "fake: illegal memory access", NULL};
    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    assert_int_equal(ccq_comm_init(rt, P01, 2), CCQ_OK);
    for (long i = fake_log_find("ncclCommInitRankConfig", 0); i >= 0;
         i = fake_log_find("ncclCommInitRankConfig", (size_t)i + 1)) {
        fake_call c = entry((size_t)i);
        if (c.nranks == NDEV)
            all[c.rank] = c.comm;
        else
            pair[c.rank] = c.comm;
    }
    fake_log_reset();
    fake_set_last_error("fake: illegal memory access");
    fake_script_async_error(1, ncclUnhandledCudaError);
    allreduce_expect(rt, 0, CCQ_ERR_BACKEND, has);
    fake_set_last_error("");
}

/* An asynchronous error during a batch aborts every communicator of the failed group and
 * fails its ops with NCCL's message; later work on it fails with CCQ_ERR_ABORTED without
 * reaching NCCL; another communicator keeps working. */
/* A failed batch (here an asynchronous error) is handed back only once the GPU no longer
 * touches its buffers: its fences wait for the completion events even after the abort, and
 * return the error once they complete; if they never do, the fences return after
 * timeout_ms more with a detail saying the buffers may still change. */
static void test_failed_batch_waits_for_gpu(void **state)
{
    (void)state;
    enum { N = 16 };
    static float in[NDEV][N], out[NDEV][N];
    static const ccq_device_id p23[2] = {2, 3};
    ccq_runtime *rt = make_rt(400);

    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    assert_int_equal(ccq_comm_init(rt, p23, 2), CCQ_OK);
    allreduce_all(rt, 0, 7);
    fake_set_manual_events(true);
    fake_set_abort_keeps_events(true); /* the batch's work is stuck behind something else */

    /* Aborted, then drained: the fences return the error only once the GPU is done. */
    fake_script_async_error(2, ncclUnhandledCudaError);
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 1, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV), CCQ_OK);
    wait_calls("ncclCommAbort", NDEV);
    sleep_ms(100);
    for (ccq_device_id d = 0; d < NDEV; d++) {
        uint64_t depth = 0;
        assert_int_equal(ccq_stream_queue_depth(rt, d, 1, &depth), CCQ_OK);
        assert_int_equal(depth, 1); /* not ended while the GPU may still write out[d] */
    }
    fake_complete_events();
    for (ccq_device_id d = 0; d < NDEV; d++) {
        assert_int_equal(ccq_sync_collective(rt, d, 1), CCQ_ERR_BACKEND);
        assert_detail_has(ccq_last_error_detail(), "asynchronous error");
        if (strstr(ccq_last_error_detail(), "may still change") != NULL)
            fail_msg("a drained batch reported as not drained: %s", ccq_last_error_detail());
    }

    /* Never drained: handed back timeout_ms after the failure, saying so. */
    fake_script_async_error(0, ncclUnhandledCudaError);
    for (ccq_device_id d = 2; d < NDEV; d++)
        assert_int_equal(ccq_all_reduce(rt, d, 2, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, p23, 2),
                         CCQ_OK);
    for (ccq_device_id d = 2; d < NDEV; d++) {
        assert_int_equal(fence_watchdog(rt, d, 2, NULL, 0), CCQ_ERR_BACKEND);
        assert_detail_has(ccq_last_error_detail(), "may still change");
    }
    fake_complete_events(); /* destroy then finds the streams idle */
}

static void test_async_error_aborts_group(void **state)
{
    (void)state;
    enum { N = 32 };
    static float in[NDEV][N], out[NDEV][N];
    ncclComm_t all[NDEV], pair[2];
    ccq_runtime *rt = make_rt(10000);

    fail_all_comm(rt, all, pair);
    long err_at = -1;
    for (long i = fake_log_find("ncclCommGetAsyncError", 0); i >= 0 && err_at < 0;
         i = fake_log_find("ncclCommGetAsyncError", (size_t)i + 1)) {
        fake_call c = entry((size_t)i);
        if (c.value == ncclUnhandledCudaError) {
            err_at = i;
            assert_ptr_equal(c.comm, all[1]);
        }
    }
    assert_true(err_at >= 0);
    assert_int_equal(fake_log_count("ncclCommAbort"), NDEV);
    for (int r = 0; r < NDEV; r++) {
        long i = fake_log_find("ncclCommAbort", 0);
        fake_call c = entry((size_t)i);
        while (c.comm != all[r]) {
            i = fake_log_find("ncclCommAbort", (size_t)i + 1);
            assert_true(i >= 0);
            c = entry((size_t)i);
        }
        assert_true(i > err_at);
        assert_false(on_this_thread(&c));
    }

    /* Later work on the aborted communicator: refused at the call (see
     * test_aborted_comm_refuses_submission) or failed by the fence, CCQ_ERR_ABORTED either
     * way, and NCCL never sees it. */
    size_t groups = fake_log_count("ncclGroupStart");
    bool refused[NDEV];
    for (ccq_device_id d = 0; d < NDEV; d++) {
        ccq_status st = ccq_all_reduce(rt, d, 2, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV);
        assert_true(st == CCQ_OK || st == CCQ_ERR_ABORTED);
        refused[d] = st == CCQ_ERR_ABORTED;
    }
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 2), refused[d] ? CCQ_OK : CCQ_ERR_ABORTED);
    assert_int_equal(fake_log_count("ncclGroupStart"), groups);

    /* The other communicator ({0,1}, same devices) works. */
    float a[N], b[N], ra[N], rb[N];
    const void *inputs[2] = {a, b};
    float want[N];
    ref_fill(CCQ_FLOAT32, a, N, 1);
    ref_fill(CCQ_FLOAT32, b, N, 2);
    ref_allreduce(CCQ_FLOAT32, CCQ_MIN, 2, inputs, want, N);
    assert_int_equal(ccq_all_reduce(rt, 0, 1, a, ra, N, CCQ_FLOAT32, CCQ_MIN, P01, 2), CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 1, 1, b, rb, N, CCQ_FLOAT32, CCQ_MIN, P01, 2), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 0, 1), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 1, 1), CCQ_OK);
    assert_memory_equal(ra, want, sizeof want);
    assert_memory_equal(rb, want, sizeof want);
    long last = fake_log_find("ncclAllReduce", 0);
    for (long i = last; i >= 0; i = fake_log_find("ncclAllReduce", (size_t)i + 1))
        last = i;
    fake_call c = entry((size_t)last);
    assert_true(c.comm == pair[0] || c.comm == pair[1]);
    assert_int_equal(fake_log_count("ncclCommAbort"), NDEV);
}

/* A failed group takes down every communicator in it, not only the one that reported the
 * error: here ALL (rank 1 fails) and {0,1}, batched together; {2,3} is not in the group and
 * keeps working. */
static void test_async_error_aborts_every_comm_of_group(void **state)
{
    (void)state;
    enum { N = 16 };
    static float in[NDEV][N], out[NDEV][N];
    static const ccq_device_id p23[2] = {2, 3};
    static const char *const has[] = {"asynchronous error", "unhandled cuda error", NULL};
    group_info g[2];
    blocker blk;
    ccq_runtime *rt = make_rt(10000);

    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    assert_int_equal(ccq_comm_init(rt, P01, 2), CCQ_OK);
    allreduce_all(rt, 0, 1); /* warm up the streams used below */
    for (ccq_device_id d = 0; d < 2; d++)
        assert_int_equal(ccq_all_reduce(rt, d, 1, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, P01, 2),
                         CCQ_OK);
    for (ccq_device_id d = 0; d < 2; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 1), CCQ_OK);
    fake_log_reset();

    block_scheduler(&blk, rt);
    fake_script_async_error(1, ncclUnhandledCudaError);
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 0, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV), CCQ_OK);
    for (ccq_device_id d = 0; d < 2; d++)
        assert_int_equal(ccq_all_reduce(rt, d, 1, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, P01, 2),
                         CCQ_OK);
    release_scheduler(&blk);
    for (ccq_device_id d = 0; d < NDEV; d++) {
        for (ccq_stream_id s = 0; s < (d < 2 ? 2u : 1u); s++) {
            assert_int_equal(ccq_sync_collective(rt, d, s), CCQ_ERR_BACKEND);
            for (int k = 0; has[k] != NULL; k++)
                assert_detail_has(ccq_last_error_detail(), has[k]);
        }
    }
    assert_int_equal(data_groups(g, 2), 1);
    assert_int_equal(g[0].nallreduce, NDEV + 2);
    assert_int_equal(fake_log_count("ncclCommAbort"), NDEV + 2);

    for (ccq_device_id d = 2; d < NDEV; d++)
        assert_int_equal(ccq_all_reduce(rt, d, 3, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, p23, 2),
                         CCQ_OK);
    for (ccq_device_id d = 2; d < NDEV; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 3), CCQ_OK);
    assert_int_equal(fake_log_count("ncclCommAbort"), NDEV + 2);
}

/* A call that fails inside a group may leave its error on the communicators already in the
 * group (NCCL's group cleanup; armed here with fake_script_async_error), which then refuse
 * every call. The backend aborts those, so the batch's fences report the failure and later
 * work on the communicator fails fast with CCQ_ERR_ABORTED without reaching NCCL. */
static void test_failed_call_in_group_aborts_poisoned_comm(void **state)
{
    (void)state;
    enum { N = 8 };
    static float in[N], out[N];
    static const char *const has[] = {"ncclAllReduce", "invalid argument", NULL};
    ccq_runtime *rt = make_rt(10000);

    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    allreduce_all(rt, 0, 2);
    fake_log_reset();
    fake_script_async_error(0, ncclInvalidArgument);
    fake_script("ncclAllReduce", ncclSuccess); /* rank 0's call joins the group */
    fake_script("ncclAllReduce", ncclInvalidArgument);
    allreduce_expect(rt, 0, CCQ_ERR_INVALID_ARGUMENT, has);
    assert_int_equal(fake_log_count("ncclCommAbort"), NDEV);
    size_t calls = fake_log_count("ncclAllReduce");
    assert_int_equal(ccq_all_reduce(rt, 0, 1, in, out, N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV),
                     CCQ_ERR_ABORTED);
    assert_int_equal(fake_log_count("ncclAllReduce"), calls);
}

/* docs/nccl.md: "later submissions on an aborted communicator | fail fast: CCQ_ERR_ABORTED
 * from the submitting call", whatever aborted it (here an asynchronous error, which the
 * backend reports to the runtime through the batch's ops). */
static void test_aborted_comm_refuses_submission(void **state)
{
    (void)state;
    enum { N = 8 };
    static float in[N], out[N];
    ncclComm_t all[NDEV], pair[2];
    ccq_runtime *rt = make_rt(10000);

    fail_all_comm(rt, all, pair);
    ccq_status st = ccq_all_reduce(rt, 0, 2, in, out, N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV);
    if (st != CCQ_ERR_ABORTED)
        fail_msg("ccq_all_reduce on the communicator aborted by an asynchronous error returned "
                 "%s, expected CCQ_ERR_ABORTED",
                 ccq_status_name(st));
}

/* New work on a communicator aborted by an asynchronous error must not take down work of
 * healthy communicators that the scheduler puts into the same batch: nccl_issue() fails only
 * the ops of the aborted communicator. */
static void test_abort_spares_other_comms_in_batch(void **state)
{
    (void)state;
    enum { N = 32 };
    static float in[NDEV][N], out[NDEV][N], a[N], b[N], ra[N], rb[N];
    ncclComm_t all[NDEV], pair[2];
    blocker blk;
    ccq_runtime *rt = make_rt(10000);

    fail_all_comm(rt, all, pair);
    /* Warm up the streams used below, one communicator at a time. */
    assert_int_equal(ccq_all_reduce(rt, 0, 1, a, ra, N, CCQ_FLOAT32, CCQ_SUM, P01, 2), CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 1, 1, b, rb, N, CCQ_FLOAT32, CCQ_SUM, P01, 2), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 0, 1), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 1, 1), CCQ_OK);
    for (ccq_device_id d = 0; d < NDEV; d++)
        (void)ccq_all_reduce(rt, d, 2, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV);
    for (ccq_device_id d = 0; d < NDEV; d++)
        (void)ccq_sync_collective(rt, d, 2);

    block_scheduler(&blk, rt);
    for (ccq_device_id d = 0; d < NDEV; d++)
        (void)ccq_all_reduce(rt, d, 2, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV);
    assert_int_equal(ccq_all_reduce(rt, 0, 1, a, ra, N, CCQ_FLOAT32, CCQ_SUM, P01, 2), CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 1, 1, b, rb, N, CCQ_FLOAT32, CCQ_SUM, P01, 2), CCQ_OK);
    release_scheduler(&blk);
    for (ccq_device_id d = 0; d < NDEV; d++)
        (void)ccq_sync_collective(rt, d, 2);
    for (ccq_device_id d = 0; d < 2; d++) {
        ccq_status st = ccq_sync_collective(rt, d, 1);
        if (st != CCQ_OK)
            fail_msg("device %u: the all_reduce on the healthy communicator {0,1} failed with "
                     "%s: %s",
                     d, ccq_status_name(st), ccq_last_error_detail());
    }
}

/* Issued work whose completion events never fire: the watchdog aborts its communicators
 * with ncclCommAbort and the fences return CCQ_ERR_ABORTED; the runtime then refuses new
 * work on that communicator at the call. */
static void test_watchdog_aborts_stuck_batch(void **state)
{
    (void)state;
    enum { N = 16 };
    static float in[NDEV][N], out[NDEV][N];
    ccq_runtime *rt = make_rt(300);
    ncclComm_t comms[NDEV];

    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    for (int r = 0; r < NDEV; r++)
        comms[r] = entry((size_t)find_rank("ncclCommInitRankConfig", r, 0)).comm;
    fake_set_manual_events(true);
    fake_log_reset();
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 0, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV), CCQ_OK);
    for (ccq_device_id d = 0; d < NDEV; d++) {
        assert_int_equal(fence_watchdog(rt, d, 0, NULL, 0), CCQ_ERR_ABORTED);
        assert_detail_has(ccq_last_error_detail(), "aborted");
    }
    assert_int_equal(fake_log_count("ncclCommAbort"), NDEV);
    for (int r = 0; r < NDEV; r++) {
        bool found = false;
        for (long i = fake_log_find("ncclCommAbort", 0); i >= 0 && !found;
             i = fake_log_find("ncclCommAbort", (size_t)i + 1))
            found = entry((size_t)i).comm == comms[r];
        assert_true(found);
    }
    /* The runtime knows (the watchdog aborted through it) and says why. */
    assert_int_equal(ccq_all_reduce(rt, 0, 0, in[0], out[0], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV),
                     CCQ_ERR_ABORTED);
    assert_detail_has(ccq_last_error_detail(), "watchdog");
}

/* ---- Issue 19: what real NCCL 2.28 does that the fake used to accept ---- */

/* A float32 sum over {0,1} on stream 0, fenced. */
static void allreduce_pair_ok(ccq_runtime *rt)
{
    enum { N = 16 };
    static float in[2][N], out[2][N];
    for (ccq_device_id d = 0; d < 2; d++)
        assert_int_equal(ccq_all_reduce(rt, d, 0, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, P01, 2),
                         CCQ_OK);
    for (ccq_device_id d = 0; d < 2; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_OK);
}

/* A one-rank avg is the identity and runs as ncclSum: NCCL refuses fp8 ncclAvg on a
 * one-rank communicator (its one-rank kernel lacks fp8), for all_reduce, reduce and
 * reduce_scatter alike. */
static void test_one_rank_avg(void **state)
{
    (void)state;
    enum { N = 32 };
    static const ccq_device_id d0[1] = {0};
    static uint8_t in[N], out[N];
    ccq_runtime *rt = make_rt(10000);

    assert_int_equal(ccq_comm_init(rt, d0, 1), CCQ_OK);
    for (int t = CCQ_FLOAT8E4M3; t <= CCQ_FLOAT8E5M2; t++) {
        for (int k = 0; k < 3; k++) {
            ccq_status st;
            ref_fill((ccq_dtype)t, in, N, (uint32_t)(t * 3 + k));
            memset(out, 0, sizeof out);
            fake_log_reset();
            if (k == 0)
                st = ccq_all_reduce(rt, 0, 0, in, out, N, (ccq_dtype)t, CCQ_AVG, d0, 1);
            else if (k == 1)
                st = ccq_reduce(rt, 0, 0, in, out, N, (ccq_dtype)t, CCQ_AVG, 0, d0, 1);
            else
                st = ccq_reduce_scatter(rt, 0, 0, in, out, N, (ccq_dtype)t, CCQ_AVG, d0, 1);
            assert_int_equal(st, CCQ_OK);
            st = ccq_sync_collective(rt, 0, 0);
            if (st != CCQ_OK)
                fail_msg("%s avg kind %d on one rank: %s (%s)", ccq_dtype_name((ccq_dtype)t), k,
                         ccq_status_name(st), ccq_last_error_detail());
            assert_memory_equal(out, in, N);
            assert_int_equal(fake_log_count("ncclCommAbort"), 0);
        }
    }
}

/* A CUDA error inside the group (here cudaSetDevice for rank 2's part) leaves NCCL's group
 * error unset, so ncclGroupEnd would launch the partial group: the backend makes NCCL
 * refuse the group, aborts its communicators, and hands the batch back only through the
 * drain path, once the GPU is done with its buffers. */
static void test_cuda_error_in_group_drains(void **state)
{
    (void)state;
    enum { N = 16 };
    static float in[NDEV][N], out[NDEV][N];
    ccq_runtime *rt = make_rt(10000);

    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    allreduce_all(rt, 0, 3); /* warm up stream 0 of every device */
    fake_set_manual_events(true);
    fake_set_abort_keeps_events(true);
    fake_log_reset();
    fake_script("cudaSetDevice", cudaSuccess);
    fake_script("cudaSetDevice", cudaSuccess);
    fake_script("cudaSetDevice", cudaErrorInvalidDevice);
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 0, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV), CCQ_OK);
    wait_calls("ncclCommAbort", NDEV);
    sleep_ms(50);
    for (ccq_device_id d = 0; d < NDEV; d++) {
        uint64_t depth = 0;
        assert_int_equal(ccq_stream_queue_depth(rt, d, 0, &depth), CCQ_OK);
        assert_int_equal(depth, 1); /* not handed back while the GPU may still run it */
    }
    assert_int_equal(fake_errors(NULL, 0), 0); /* no partial group launched */
    fake_complete_events();
    for (ccq_device_id d = 0; d < NDEV; d++) {
        assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_ERR_BACKEND);
        assert_detail_has(ccq_last_error_detail(), "cudaErrorInvalidDevice");
    }
}

typedef struct fence_thread {
    pthread_t thread;
    ccq_runtime *rt;
    ccq_device_id dev;
    ccq_stream_id s;
    ccq_status st;
    atomic_int done;
} fence_thread;

static void *fence_main(void *arg)
{
    fence_thread *f = arg;
    f->st = ccq_sync_collective(f->rt, f->dev, f->s);
    atomic_store(&f->done, 1);
    return NULL;
}

/* ncclCommAbort of a multi-rank communicator can block (its reclaim synchronizes a stream):
 * while one is held, another communicator's batch still completes. */
static void test_abort_does_not_block_scheduler(void **state)
{
    (void)state;
    enum { N = 16 };
    static float in[NDEV][N], out[NDEV][N];
    static const ccq_device_id p23[2] = {2, 3};
    fence_thread f[2];
    ccq_runtime *rt = make_rt(10000);

    assert_int_equal(ccq_comm_init(rt, P01, 2), CCQ_OK);
    assert_int_equal(ccq_comm_init(rt, p23, 2), CCQ_OK);
    fake_hold_abort(true);
    fake_script_async_error(0, ncclUnhandledCudaError); /* {0,1}'s next group */
    for (ccq_device_id d = 0; d < 2; d++)
        assert_int_equal(ccq_all_reduce(rt, d, 0, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, P01, 2),
                         CCQ_OK);
    for (int i = 0; i < 5000 && fake_aborts_blocked() == 0; i++)
        sleep_ms(1);
    assert_true(fake_aborts_blocked() > 0);
    for (ccq_device_id d = 2; d < NDEV; d++)
        assert_int_equal(ccq_all_reduce(rt, d, 0, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, p23, 2),
                         CCQ_OK);
    for (int k = 0; k < 2; k++) {
        f[k] = (fence_thread){.rt = rt, .dev = (ccq_device_id)(2 + k), .s = 0};
        atomic_init(&f[k].done, 0);
        assert_int_equal(pthread_create(&f[k].thread, NULL, fence_main, &f[k]), 0);
    }
    for (int i = 0; i < 3000 && !(atomic_load(&f[0].done) && atomic_load(&f[1].done)); i++)
        sleep_ms(1);
    bool completed = atomic_load(&f[0].done) && atomic_load(&f[1].done);
    fake_hold_abort(false);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(pthread_join(f[k].thread, NULL), 0);
        assert_int_equal(f[k].st, CCQ_OK);
    }
    if (!completed)
        fail_msg("communicator {2,3}'s batch did not complete while {0,1}'s abort was held");
    for (ccq_device_id d = 0; d < 2; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_ERR_BACKEND);
    assert_int_equal(fake_log_count("ncclCommAbort"), 2);
}

/* Launches are serialized per device: while a group on {0,1} still launches (ncclGroupEnd
 * returned ncclInProgress), a batch on {1,2}, another communicator sharing device 1, waits
 * before its group instead of launching concurrently. */
static void test_launch_serialized_per_device(void **state)
{
    (void)state;
    enum { N = 32 };
    static const ccq_device_id p12[2] = {1, 2};
    static float in[2][NDEV][N], out[2][NDEV][N];
    ccq_runtime *rt = make_rt(10000);

    assert_int_equal(ccq_comm_init(rt, P01, 2), CCQ_OK);
    assert_int_equal(ccq_comm_init(rt, p12, 2), CCQ_OK);
    fake_set_pending(1);
    fake_script("ncclGroupEnd", ncclInProgress);
    fake_hold_async(true); /* {0,1}'s launch does not finish */
    fake_log_reset();
    for (ccq_device_id d = 0; d < 2; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 0, in[0][d], out[0][d], N, CCQ_FLOAT32, CCQ_SUM, P01, 2), CCQ_OK);
    wait_calls("ncclCommGetAsyncError", 1);
    for (ccq_device_id d = 1; d < 3; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 1, in[1][d], out[1][d], N, CCQ_FLOAT32, CCQ_SUM, p12, 2), CCQ_OK);
    size_t polls = fake_log_count("ncclCommGetAsyncError");
    wait_calls("ncclCommGetAsyncError", polls + 8);
    sleep_ms(20);
    assert_int_equal(fake_log_count("ncclAllReduce"), 2); /* {1,2} not launched yet */
    fake_hold_async(false);
    for (ccq_device_id d = 0; d < 2; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_OK);
    for (ccq_device_id d = 1; d < 3; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 1), CCQ_OK);
    assert_int_equal(fake_log_count("ncclAllReduce"), 4);
}

/* At destroy, a communicator with one rank in error is aborted on every rank, never
 * destroyed on some and aborted on others. */
static void test_destroy_aborts_every_rank(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(10000);

    assert_int_equal(ccq_comm_init(rt, P01, 2), CCQ_OK);
    allreduce_pair_ok(rt);
    fake_log_reset();
    fake_script("ncclCommGetAsyncError", ncclSuccess);
    fake_script("ncclCommGetAsyncError", ncclRemoteError); /* rank 1 */
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
    g_rt = NULL;
    assert_int_equal(fake_log_count("ncclCommDestroy"), 0);
    assert_int_equal(fake_log_count("ncclCommAbort"), 2);
    check_clean();
}

/* Shutdown touches only devices whose streams were used: cudaSetDevice on another device
 * would create its primary context. */
static void test_destroy_skips_unused_devices(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(10000);

    assert_int_equal(ccq_comm_init(rt, P01, 2), CCQ_OK);
    allreduce_pair_ok(rt);
    fake_log_reset();
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
    g_rt = NULL;
    for (long i = fake_log_find("cudaSetDevice", 0); i >= 0;
         i = fake_log_find("cudaSetDevice", (size_t)i + 1))
        if (entry((size_t)i).device > 1)
            fail_msg("log entry %ld: cudaSetDevice(%d) at shutdown; only devices 0 and 1 were "
                     "used",
                     i, entry((size_t)i).device);
    check_clean();
}

/* NCCL refuses an fp8 reduction by the lowest compute capability in the communicator: a
 * submission from the sm90 device of a {sm90, sm80} set is refused at the call too. */
static void test_fp8_lowest_capability(void **state)
{
    (void)state;
    enum { N = 16 };
    static uint8_t in[N], out[N];
    ccq_runtime *rt;

    fake_set_device_cc(1, 8);
    rt = make_rt(10000);
    assert_int_equal(ccq_comm_init(rt, P01, 2), CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 0, 0, in, out, N, CCQ_FLOAT8E4M3, CCQ_SUM, P01, 2),
                     CCQ_ERR_UNSUPPORTED);
    assert_detail_has(ccq_last_error_detail(), "device 1 is 8.x");
    assert_int_equal(stats_of(rt).submitted, 0);
}

/* A batch whose work completed is not failed by an error that a later batch on the same
 * communicator hits before the earlier one is polled: completion is checked first. */
static void test_completed_batch_survives_later_error(void **state)
{
    (void)state;
    enum { N = 16 };
    static float in[2][NDEV][N], out[2][NDEV][N];
    ccq_runtime *rt = make_rt(10000);

    assert_int_equal(ccq_comm_init(rt, P01, 2), CCQ_OK);
    for (ccq_stream_id s = 0; s < 2; s++) { /* warm up streams 0 and 1 */
        for (ccq_device_id d = 0; d < 2; d++)
            assert_int_equal(
                ccq_all_reduce(rt, d, s, in[s][d], out[s][d], N, CCQ_FLOAT32, CCQ_SUM, P01, 2),
                CCQ_OK);
        for (ccq_device_id d = 0; d < 2; d++)
            assert_int_equal(ccq_sync_collective(rt, d, s), CCQ_OK);
    }
    fake_set_manual_events(true);
    fake_log_reset();
    for (ccq_device_id d = 0; d < 2; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 0, in[0][d], out[0][d], N, CCQ_FLOAT32, CCQ_SUM, P01, 2), CCQ_OK);
    wait_calls("cudaEventQuery", 2); /* batch 1 issued and polled, not complete */
    /* The GPU finishes batch 1 while batch 2 launches; batch 2 then fails. */
    fake_complete_events_at_next_group();
    fake_script_async_error(0, ncclUnhandledCudaError);
    for (ccq_device_id d = 0; d < 2; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 1, in[1][d], out[1][d], N, CCQ_FLOAT32, CCQ_SUM, P01, 2), CCQ_OK);
    for (ccq_device_id d = 0; d < 2; d++) {
        ccq_status st = ccq_sync_collective(rt, d, 0);
        if (st != CCQ_OK)
            fail_msg("device %u: the completed batch failed with %s: %s", d, ccq_status_name(st),
                     ccq_last_error_detail());
    }
    for (ccq_device_id d = 0; d < 2; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 1), CCQ_ERR_BACKEND);
}

/* ---- Types ---- */

/* fp8 all_reduce needs compute capability 9: refused at the call below it (nothing
 * queued), while fp8 send/recv works; accepted on 9 and reduced as NCCL would. */
static void test_fp8_capability(void **state)
{
    (void)state;
    enum { N = 64 };
    static uint8_t in[2][N], out[2][N], want[N];
    const void *inputs[2] = {in[0], in[1]};
    ccq_runtime *rt;

    fake_set_devices(NDEV, 8);
    rt = make_rt(10000);
    assert_int_equal(ccq_comm_init(rt, P01, 2), CCQ_OK);
    for (int t = CCQ_FLOAT8E4M3; t <= CCQ_FLOAT8E5M2; t++) {
        assert_int_equal(ccq_all_reduce(rt, 0, 0, in[0], out[0], N, (ccq_dtype)t, CCQ_SUM, P01, 2),
                         CCQ_ERR_UNSUPPORTED);
        assert_detail_has(ccq_last_error_detail(), "compute capability 9.0");
        assert_detail_has(ccq_last_error_detail(), "device 0 is 8.x");
    }
    assert_int_equal(stats_of(rt).submitted, 0);
    ref_fill(CCQ_FLOAT8E4M3, in[0], N, 8);
    assert_int_equal(ccq_send(rt, 0, 0, in[0], N, CCQ_FLOAT8E4M3, 1), CCQ_OK);
    assert_int_equal(ccq_recv(rt, 1, 0, out[1], N, CCQ_FLOAT8E4M3, 0), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 1, 0), CCQ_OK);
    assert_memory_equal(out[1], in[0], N);
    fake_call c = entry((size_t)fake_log_find("ncclSend", 0));
    assert_int_equal(c.dtype, ncclFloat8e4m3);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
    g_rt = NULL;
    check_clean();

    fake_reset();
    fake_set_devices(NDEV, 9);
    rt = make_rt(10000);
    assert_int_equal(ccq_comm_init(rt, P01, 2), CCQ_OK);
    ref_fill(CCQ_FLOAT8E5M2, in[0], N, 1);
    ref_fill(CCQ_FLOAT8E5M2, in[1], N, 2);
    ref_allreduce(CCQ_FLOAT8E5M2, CCQ_SUM, 2, inputs, want, N);
    for (ccq_device_id d = 0; d < 2; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 0, in[d], out[d], N, CCQ_FLOAT8E5M2, CCQ_SUM, P01, 2), CCQ_OK);
    for (ccq_device_id d = 0; d < 2; d++) {
        assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_OK);
        assert_int_equal(ref_compare(CCQ_FLOAT8E5M2, out[d], want, N, NULL, 0), 0);
    }
    c = entry((size_t)fake_log_find("ncclAllReduce", 0));
    assert_int_equal(c.dtype, ncclFloat8e5m2);
}

/* Every ccq dtype and reduce op reaches ncclAllReduce as the matching NCCL value. */
static void test_dtype_op_mapping(void **state)
{
    (void)state;
    enum { N = 16, NT = CCQ_DTYPE_COUNT_, NO = CCQ_REDUCE_OP_COUNT_ };
    static const ncclDataType_t dtypes[NT] = {
        [CCQ_INT8] = ncclInt8,
        [CCQ_UINT8] = ncclUint8,
        [CCQ_INT32] = ncclInt32,
        [CCQ_UINT32] = ncclUint32,
        [CCQ_INT64] = ncclInt64,
        [CCQ_UINT64] = ncclUint64,
        [CCQ_FLOAT16] = ncclFloat16,
        [CCQ_FLOAT32] = ncclFloat32,
        [CCQ_FLOAT64] = ncclFloat64,
        [CCQ_BFLOAT16] = ncclBfloat16,
        [CCQ_FLOAT8E4M3] = ncclFloat8e4m3,
        [CCQ_FLOAT8E5M2] = ncclFloat8e5m2,
    };
    static const ncclRedOp_t ops[NO] = {
        [CCQ_SUM] = ncclSum, [CCQ_PROD] = ncclProd, [CCQ_MAX] = ncclMax,
        [CCQ_MIN] = ncclMin, [CCQ_AVG] = ncclAvg,
    };
    static uint64_t in[NT][NO][2][N], out[NT][NO][2][N], want[N];
    int seen[NT][NO] = {{0}};
    char msg[256];
    ccq_runtime *rt = make_rt(10000);

    assert_int_equal(ccq_comm_init(rt, P01, 2), CCQ_OK);
    fake_log_reset();
    for (int t = 0; t < NT; t++) {
        for (int o = 0; o < NO; o++) {
            for (ccq_device_id d = 0; d < 2; d++) {
                ref_fill((ccq_dtype)t, in[t][o][d], N, (uint32_t)(t * 100 + o * 10) + d);
                assert_int_equal(ccq_all_reduce(rt, d, 0, in[t][o][d], out[t][o][d], N,
                                                (ccq_dtype)t, (ccq_reduce_op)o, P01, 2),
                                 CCQ_OK);
            }
        }
    }
    assert_int_equal(ccq_sync_collective(rt, 0, 0), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 1, 0), CCQ_OK);
    for (long i = fake_log_find("ncclAllReduce", 0); i >= 0;
         i = fake_log_find("ncclAllReduce", (size_t)i + 1)) {
        fake_call c = entry((size_t)i);
        for (int t = 0; t < NT; t++)
            for (int o = 0; o < NO; o++)
                if (c.src == in[t][o][c.rank]) {
                    assert_int_equal(c.dtype, dtypes[t]);
                    assert_int_equal(c.op, ops[o]);
                    assert_int_equal(c.count, N);
                    seen[t][o]++;
                }
    }
    for (int t = 0; t < NT; t++) {
        for (int o = 0; o < NO; o++) {
            const void *inputs[2] = {in[t][o][0], in[t][o][1]};
            assert_int_equal(seen[t][o], 2);
            ref_allreduce((ccq_dtype)t, (ccq_reduce_op)o, 2, inputs, want, N);
            for (int d = 0; d < 2; d++)
                if (ref_compare((ccq_dtype)t, out[t][o][d], want, N, msg, sizeof msg) != 0)
                    fail_msg("%s %s device %d: %s", ccq_dtype_name((ccq_dtype)t),
                             ccq_reduce_op_name((ccq_reduce_op)o), d, msg);
        }
    }
}

/* ---- The other collectives ---- */

/* Kinds, in the table below; the seven new ones first, all_reduce last (for mixed batches). */
enum {
    K_BROADCAST,
    K_REDUCE,
    K_ALL_GATHER,
    K_REDUCE_SCATTER,
    K_ALL_TO_ALL,
    K_GATHER,
    K_SCATTER,
    K_ALL_REDUCE,
    NKINDS
};
enum { NSEVEN = K_ALL_REDUCE };
/* Which ranks use a buffer. */
enum { U_ALL = 1, U_ROOT = 2 };

/* Each collective as ccq.h and nccl.h define it: the NCCL function it must become, who
 * reads src and writes dst, which of them holds count * n elements, and whether it has an
 * in-place form. Written from the headers, independently of the library's own table. */
static const struct tkind {
    const char *name, *fn;
    bool reduces, rooted, has_in_place;
    int src_use, dst_use;
    bool src_n, dst_n;
} tkinds[NKINDS] = {
    [K_BROADCAST] = {"broadcast", "ncclBroadcast", false, true, true, U_ROOT, U_ALL, false, false},
    [K_REDUCE] = {"reduce", "ncclReduce", true, true, true, U_ALL, U_ROOT, false, false},
    [K_ALL_GATHER] = {"all_gather", "ncclAllGather", false, false, true, U_ALL, U_ALL, false, true},
    [K_REDUCE_SCATTER] = {"reduce_scatter", "ncclReduceScatter", true, false, true, U_ALL, U_ALL,
                          true, false},
    [K_ALL_TO_ALL] = {"all_to_all", "ncclAlltoAll", false, false, false, U_ALL, U_ALL, true, true},
    [K_GATHER] = {"gather", "ncclGather", false, true, true, U_ALL, U_ROOT, false, true},
    [K_SCATTER] = {"scatter", "ncclScatter", false, true, true, U_ROOT, U_ALL, true, false},
    [K_ALL_REDUCE] = {"all_reduce", "ncclAllReduce", true, false, true, U_ALL, U_ALL, false, false},
};

static const ncclDataType_t nccl_dtype_of[CCQ_DTYPE_COUNT_] = {
    [CCQ_INT8] = ncclInt8,
    [CCQ_UINT8] = ncclUint8,
    [CCQ_INT32] = ncclInt32,
    [CCQ_UINT32] = ncclUint32,
    [CCQ_INT64] = ncclInt64,
    [CCQ_UINT64] = ncclUint64,
    [CCQ_FLOAT16] = ncclFloat16,
    [CCQ_FLOAT32] = ncclFloat32,
    [CCQ_FLOAT64] = ncclFloat64,
    [CCQ_BFLOAT16] = ncclBfloat16,
    [CCQ_FLOAT8E4M3] = ncclFloat8e4m3,
    [CCQ_FLOAT8E5M2] = ncclFloat8e5m2,
};

static const ncclRedOp_t nccl_op_of[CCQ_REDUCE_OP_COUNT_] = {
    [CCQ_SUM] = ncclSum, [CCQ_PROD] = ncclProd, [CCQ_MAX] = ncclMax,
    [CCQ_MIN] = ncclMin, [CCQ_AVG] = ncclAvg,
};

static ccq_status submit_kind(ccq_runtime *rt, int k, ccq_device_id d, ccq_stream_id s,
                              const void *src, void *dst, size_t count, ccq_dtype dt,
                              ccq_reduce_op op, ccq_device_id root, const ccq_device_id *devs,
                              size_t n)
{
    static const ccq_kind kind_of[NKINDS] = {
        [K_BROADCAST] = CCQ_KIND_BROADCAST,   [K_REDUCE] = CCQ_KIND_REDUCE,
        [K_ALL_GATHER] = CCQ_KIND_ALL_GATHER, [K_REDUCE_SCATTER] = CCQ_KIND_REDUCE_SCATTER,
        [K_ALL_TO_ALL] = CCQ_KIND_ALL_TO_ALL, [K_GATHER] = CCQ_KIND_GATHER,
        [K_SCATTER] = CCQ_KIND_SCATTER,       [K_ALL_REDUCE] = CCQ_KIND_ALL_REDUCE,
    };
    return ref_submit(rt, kind_of[k], d, s, src, dst, count, dt, op, root, devs, n);
}

/* One collective over a device set: its arguments and, per rank (position in the sorted
 * set), the buffers passed (NULL where the rank uses none), src's contents before the
 * collective, and dst's expected contents. */
typedef struct coll {
    int k;
    const ccq_device_id *api_devs; /* the set as passed to ccq (any order) */
    uint32_t n, root;              /* ranks; the root's rank (rooted kinds) */
    ccq_device_id dev[NDEV];       /* device of each rank */
    ccq_device_id root_dev;
    ccq_dtype dt;
    ccq_reduce_op op;
    size_t count, es;
    size_t sb[NDEV], db[NDEV]; /* bytes of src and dst rank r uses */
    bool in_place[NDEV];       /* src and dst of rank r are at NCCL's in-place position */
    unsigned char *mem[NDEV][2];
    const void *src[NDEV];
    void *dst[NDEV];
    unsigned char *in[NDEV], *want[NDEV];
} coll;

/* The reference: dst of every rank that has one, from the inputs, per ccq.h. */
static void coll_reference(coll *c)
{
    size_t blk = c->count * c->es;
    const void *inputs[NDEV];
    uint32_t n = c->n, root = c->root;

    switch (c->k) {
    case K_BROADCAST:
        for (uint32_t r = 0; r < n; r++)
            memcpy(c->want[r], c->in[root], blk);
        break;
    case K_REDUCE:
    case K_ALL_REDUCE:
        for (uint32_t j = 0; j < n; j++)
            inputs[j] = c->in[j];
        for (uint32_t r = 0; r < n; r++)
            if (c->want[r] != NULL)
                ref_allreduce(c->dt, c->op, n, inputs, c->want[r], c->count);
        break;
    case K_ALL_GATHER:
        for (uint32_t r = 0; r < n; r++)
            for (uint32_t j = 0; j < n; j++)
                memcpy(c->want[r] + j * blk, c->in[j], blk);
        break;
    case K_REDUCE_SCATTER:
        for (uint32_t r = 0; r < n; r++) {
            for (uint32_t j = 0; j < n; j++)
                inputs[j] = c->in[j] + r * blk;
            ref_allreduce(c->dt, c->op, n, inputs, c->want[r], c->count);
        }
        break;
    case K_ALL_TO_ALL:
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t j = 0; j < n; j++)
                memcpy(c->want[j] + i * blk, c->in[i] + j * blk, blk);
        break;
    case K_GATHER:
        for (uint32_t j = 0; j < n; j++)
            memcpy(c->want[root] + j * blk, c->in[j], blk);
        break;
    case K_SCATTER:
        for (uint32_t r = 0; r < n; r++)
            memcpy(c->want[r], c->in[root] + r * blk, blk);
        break;
    default:
        fail();
    }
}

/* Set up collective k over `devs` (any order): buffers (in place where asked and the kind
 * has an in-place form for the rank), inputs from ref_fill, dst filled with 0xA5 elsewhere,
 * and the expected results. */
static void coll_make(coll *c, int k, const ccq_device_id *devs, size_t n, ccq_device_id root_dev,
                      ccq_dtype dt, ccq_reduce_op op, size_t count, bool in_place, uint32_t seed)
{
    const struct tkind *t = &tkinds[k];
    size_t blk;

    memset(c, 0, sizeof *c);
    assert_true(n >= 1 && n <= NDEV);
    c->k = k;
    c->api_devs = devs;
    c->n = (uint32_t)n;
    c->dt = dt;
    c->op = op;
    c->count = count;
    c->es = ccq_dtype_size(dt);
    blk = count * c->es;
    for (size_t i = 0; i < n; i++) { /* insertion sort: rank order */
        size_t j = i;
        while (j > 0 && c->dev[j - 1] > devs[i]) {
            c->dev[j] = c->dev[j - 1];
            j--;
        }
        c->dev[j] = devs[i];
    }
    c->root_dev = t->rooted ? root_dev : c->dev[0];
    while (c->root < c->n && c->dev[c->root] != c->root_dev)
        c->root++;
    assert_true(c->root < c->n);
    for (uint32_t r = 0; r < c->n; r++) {
        bool is_root = r == c->root;
        bool use_src = t->src_use == U_ALL || (t->src_use == U_ROOT && is_root);
        bool use_dst = t->dst_use == U_ALL || (t->dst_use == U_ROOT && is_root);
        c->sb[r] = use_src ? blk * (t->src_n ? n : 1) : 0;
        c->db[r] = use_dst ? blk * (t->dst_n ? n : 1) : 0;
        c->in_place[r] = in_place && t->has_in_place && use_src && use_dst;
        if (c->in_place[r]) {
            unsigned char *buf = xmalloc(c->sb[r] > c->db[r] ? c->sb[r] : c->db[r]);
            c->mem[r][0] = buf;
            switch (k) {
            case K_ALL_GATHER: /* src == dst + rank * count */
                c->dst[r] = buf;
                c->src[r] = buf + r * blk;
                break;
            case K_REDUCE_SCATTER: /* dst == src + rank * count */
                c->src[r] = buf;
                c->dst[r] = buf + r * blk;
                break;
            case K_GATHER: /* root: src == dst + root * count */
                c->dst[r] = buf;
                c->src[r] = buf + c->root * blk;
                break;
            case K_SCATTER: /* root: dst == src + root * count */
                c->src[r] = buf;
                c->dst[r] = buf + c->root * blk;
                break;
            default: /* src == dst */
                c->src[r] = c->dst[r] = buf;
                break;
            }
        } else {
            if (use_src)
                c->src[r] = c->mem[r][0] = xmalloc(c->sb[r]);
            if (use_dst)
                c->dst[r] = c->mem[r][1] = xmalloc(c->db[r]);
        }
        if (use_dst) {
            memset(c->dst[r], 0xA5, c->db[r]);
            c->want[r] = xmalloc(c->db[r]);
        }
        if (use_src) {
            ref_fill(dt, (void *)(uintptr_t)c->src[r], c->sb[r] / c->es, seed * 131u + r);
            c->in[r] = xmalloc(c->sb[r]);
            memcpy(c->in[r], c->src[r], c->sb[r]);
        }
    }
    coll_reference(c);
}

static void coll_free(coll *c)
{
    for (uint32_t r = 0; r < c->n; r++) {
        free(c->mem[r][0]);
        free(c->mem[r][1]);
        free(c->in[r]);
        free(c->want[r]);
    }
    memset(c, 0, sizeof *c);
}

/* Submit every rank's part on stream s, in reverse rank order (so that the order of the
 * NCCL calls cannot come from the order of submission). */
static void coll_submit(ccq_runtime *rt, const coll *c, ccq_stream_id s)
{
    for (uint32_t r = c->n; r-- > 0;) {
        ccq_status st = submit_kind(rt, c->k, c->dev[r], s, c->src[r], c->dst[r], c->count, c->dt,
                                    c->op, c->root_dev, c->api_devs, c->n);
        if (st != CCQ_OK)
            fail_msg("%s on device %u (rank %u): %s: %s", tkinds[c->k].name, c->dev[r], r,
                     ccq_status_name(st), ccq_last_error_detail());
    }
}

static void coll_fence(ccq_runtime *rt, const coll *c, ccq_stream_id s)
{
    for (uint32_t r = 0; r < c->n; r++) {
        ccq_status st = ccq_sync_collective(rt, c->dev[r], s);
        if (st != CCQ_OK)
            fail_msg("%s: fence on device %u: %s: %s", tkinds[c->k].name, c->dev[r],
                     ccq_status_name(st), ccq_last_error_detail());
    }
}

/* Every dst holds the reference's result; every src that is not also a dst is intact. */
static void coll_verify(const coll *c)
{
    char msg[256];
    for (uint32_t r = 0; r < c->n; r++) {
        if (c->dst[r] != NULL &&
            ref_compare(c->dt, c->dst[r], c->want[r], c->db[r] / c->es, msg, sizeof msg) != 0)
            fail_msg("%s %s x %zu%s over %u ranks (root rank %u): rank %u (device %u): %s",
                     tkinds[c->k].name, ccq_dtype_name(c->dt), c->count,
                     c->in_place[r] ? " in place" : "", c->n, c->root, r, c->dev[r], msg);
        if (c->src[r] != NULL && !c->in_place[r] && memcmp(c->src[r], c->in[r], c->sb[r]) != 0)
            fail_msg("%s: rank %u's src was modified", tkinds[c->k].name, r);
    }
}

/* The buffers the backend passes NCCL for a part: as submitted, except that a non-root's
 * unused gather dst and scatter src are its other buffer (NCCL_CHECK_POINTERS=1 refuses
 * NULL there). */
static const void *nccl_src_of(int k, const void *src, const void *dst)
{
    return k == K_SCATTER && src == NULL ? dst : src;
}

static const void *nccl_dst_of(int k, const void *src, const void *dst)
{
    return k == K_GATHER && dst == NULL ? src : dst;
}

/* The op NCCL gets: a one-rank reduction is run as ncclSum (NCCL refuses fp8 ncclAvg on one
 * rank; any one-rank reduction is the identity). */
static int nccl_op_for(uint32_t n, int op)
{
    return n == 1 ? (int)ncclSum : (int)nccl_op_of[op];
}

/* Calls first .. first + n - 1 of the log are the n NCCL calls of c: the kind's function,
 * ranks 0..n-1 in order on their devices, NCCL's root rank, count, dtype and op, and the
 * buffers as passed (nccl_src_of, nccl_dst_of). */
static void coll_check_calls(const coll *c, size_t first)
{
    const struct tkind *t = &tkinds[c->k];
    for (uint32_t j = 0; j < c->n; j++, first++) {
        fake_call e = entry(first);
        if (is(&e, "cudaSetDevice")) /* the part's device made current (data_groups) */
            e = entry(++first);
        if (!is(&e, t->fn) || e.rank != (int)j) {
            fake_log_dump();
            fail_msg("call %zu is %s of rank %d; expected %s of rank %u", first, e.fn, e.rank,
                     t->fn, j);
        }
        assert_int_equal(e.result, ncclSuccess);
        assert_false(on_this_thread(&e));
        assert_int_equal(e.nranks, c->n);
        assert_int_equal(e.device, c->dev[j]);
        assert_non_null(e.stream);
        if (e.root != (t->rooted ? (int)c->root : -1))
            fail_msg("%s of rank %u: root %d; expected %d (root device %u)", t->fn, j, e.root,
                     t->rooted ? (int)c->root : -1, c->root_dev);
        if (e.count != c->count)
            fail_msg("%s of rank %u: count %zu; expected %zu (NCCL's per-rank count)", t->fn, j,
                     e.count, c->count);
        assert_int_equal(e.dtype, nccl_dtype_of[c->dt]);
        assert_int_equal(e.op, t->reduces ? nccl_op_for(c->n, c->op) : -1);
        assert_ptr_equal(e.src, nccl_src_of(c->k, c->src[j], c->dst[j]));
        assert_ptr_equal(e.dst, nccl_dst_of(c->k, c->src[j], c->dst[j]));
    }
}

/* The whole log since the reset is one group holding exactly c's n calls. */
static void coll_check_one_group(const coll *c)
{
    group_info g[4];
    assert_int_equal(fake_log_count("ncclGroupStart"), 1);
    assert_int_equal(fake_log_count("ncclGroupEnd"), 1);
    assert_int_equal(data_groups(g, 4), 1);
    if (c->k == K_ALL_REDUCE)
        assert_int_equal(g[0].nallreduce, c->n);
    else
        assert_int_equal(g[0].ncoll, c->n);
    assert_int_equal(g[0].nallreduce + g[0].ncoll + g[0].nsend + g[0].nrecv + g[0].nother, c->n);
    assert_int_equal(g[0].end, g[0].start + c->n + g[0].ndevset + 1);
    assert_int_equal(entry(g[0].end).result, ncclSuccess);
    coll_check_calls(c, g[0].start + 1);
}

/* Run one collective on its own and check calls and data. */
static void coll_run(ccq_runtime *rt, int k, const ccq_device_id *devs, size_t n,
                     ccq_device_id root_dev, ccq_dtype dt, ccq_reduce_op op, size_t count,
                     bool in_place, uint32_t seed)
{
    coll c;
    assert_int_equal(ccq_comm_init(rt, devs, n), CCQ_OK);
    coll_make(&c, k, devs, n, root_dev, dt, op, count, in_place, seed);
    fake_log_reset();
    coll_submit(rt, &c, 0);
    coll_fence(rt, &c, 0);
    coll_verify(&c);
    coll_check_one_group(&c);
    coll_free(&c);
}

/* One collective kind over 4 devices (given shuffled; root device 3, not 0; in place with
 * root device 1), over 3 devices {1,2,3} (root device 2 is rank 1, root device 3 rank 2;
 * out of place and in place), and over one device: one group of n calls of the NCCL
 * function, ranks 0..n-1, NCCL's root rank and counts, and the data. */
static void coll_kind_cases(int k)
{
    static const ccq_device_id all_shuffled[NDEV] = {2, 0, 3, 1};
    static const ccq_device_id three[3] = {3, 1, 2};
    static const ccq_device_id one[1] = {2};
    ccq_runtime *rt = make_rt(10000);

    coll_run(rt, k, all_shuffled, NDEV, 3, CCQ_FLOAT32, CCQ_SUM, 1000, false, 1);
    coll_run(rt, k, ALL, NDEV, 1, CCQ_INT32, CCQ_MAX, 257, true, 2);
    coll_run(rt, k, three, 3, 2, CCQ_BFLOAT16, CCQ_AVG, 100, false, 3);
    coll_run(rt, k, three, 3, 3, CCQ_UINT8, CCQ_PROD, 33, true, 4);
    coll_run(rt, k, one, 1, 2, CCQ_FLOAT64, CCQ_MIN, 5, true, 5);
    coll_run(rt, k, one, 1, 2, CCQ_INT64, CCQ_SUM, 6, false, 6);
}

static void test_broadcast(void **state)
{
    (void)state;
    coll_kind_cases(K_BROADCAST);
}

static void test_reduce(void **state)
{
    (void)state;
    coll_kind_cases(K_REDUCE);
}

static void test_all_gather(void **state)
{
    (void)state;
    coll_kind_cases(K_ALL_GATHER);
}

static void test_reduce_scatter(void **state)
{
    (void)state;
    coll_kind_cases(K_REDUCE_SCATTER);
}

static void test_all_to_all(void **state)
{
    (void)state;
    coll_kind_cases(K_ALL_TO_ALL);
}

static void test_gather(void **state)
{
    (void)state;
    coll_kind_cases(K_GATHER);
}

static void test_scatter(void **state)
{
    (void)state;
    coll_kind_cases(K_SCATTER);
}

/* Every ccq dtype (and op, for the reductions) of the seven reaches NCCL as the matching
 * value, on {0,1} with root device 1; each (dtype, op) has its own count so that its calls
 * can be told apart in the log. */
static void test_coll_dtype_op_mapping(void **state)
{
    (void)state;
    enum { NO = CCQ_REDUCE_OP_COUNT_ };
    ccq_runtime *rt = make_rt(10000);

    assert_int_equal(ccq_comm_init(rt, P01, 2), CCQ_OK);
    for (int k = 0; k < NSEVEN; k++) {
        const struct tkind *t = &tkinds[k];
        int nops = t->reduces ? NO : 1;
        for (int dt = 0; dt < CCQ_DTYPE_COUNT_; dt++) {
            coll cs[NO];
            int seen[NO] = {0};
            for (int o = 0; o < nops; o++)
                coll_make(&cs[o], k, P01, 2, 1, (ccq_dtype)dt, (ccq_reduce_op)o,
                          1 + (size_t)(dt * NO + o), false, (uint32_t)(k * 1000 + dt * 10 + o));
            fake_log_reset();
            for (int o = 0; o < nops; o++)
                coll_submit(rt, &cs[o], 0);
            for (int o = 0; o < nops; o++)
                coll_fence(rt, &cs[o], 0);
            for (long i = fake_log_find(t->fn, 0); i >= 0;
                 i = fake_log_find(t->fn, (size_t)i + 1)) {
                fake_call e = entry((size_t)i);
                int o = 0;
                while (o < nops && cs[o].count != e.count)
                    o++;
                assert_true(o < nops);
                assert_true(e.rank >= 0 && e.rank < 2);
                assert_int_equal(e.dtype, nccl_dtype_of[dt]);
                assert_int_equal(e.op, t->reduces ? (int)nccl_op_of[o] : -1);
                assert_int_equal(e.root, t->rooted ? 1 : -1);
                assert_ptr_equal(e.src, nccl_src_of(cs[o].k, cs[o].src[e.rank], cs[o].dst[e.rank]));
                assert_ptr_equal(e.dst, nccl_dst_of(cs[o].k, cs[o].src[e.rank], cs[o].dst[e.rank]));
                seen[o]++;
            }
            for (int o = 0; o < nops; o++) {
                if (seen[o] != 2)
                    fail_msg("%s %s %s: %d NCCL calls, expected 2", t->name,
                             ccq_dtype_name((ccq_dtype)dt), ccq_reduce_op_name((ccq_reduce_op)o),
                             seen[o]);
                coll_verify(&cs[o]);
                coll_free(&cs[o]);
            }
        }
    }
}

/* Everything found ready in one pass is one group, whatever the kinds: an all_reduce, a
 * broadcast and an all_gather over the four devices and a send/recv of {0,1}; each rank's
 * collectives in submission order, each collective's calls in rank order. */
static void test_coll_mixed_batch(void **state)
{
    (void)state;
    enum { N = 96 };
    static int32_t sbuf[N], rbuf[N];
    coll ar, bc, ag;
    group_info g[4];
    blocker b;
    ccq_runtime *rt = make_rt(10000);

    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    assert_int_equal(ccq_comm_init(rt, P01, 2), CCQ_OK);
    /* Warm the streams up: the scheduler only scans streams it already knows. */
    allreduce_all(rt, 1, 7);
    assert_int_equal(ccq_send(rt, 0, 3, sbuf, N, CCQ_INT32, 1), CCQ_OK);
    assert_int_equal(ccq_recv(rt, 1, 3, rbuf, N, CCQ_INT32, 0), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 1, 3), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 0, 3), CCQ_OK);
    ccq_stats before = stats_of(rt);
    coll_make(&ar, K_ALL_REDUCE, ALL, NDEV, 0, CCQ_FLOAT32, CCQ_SUM, 64, false, 11);
    coll_make(&bc, K_BROADCAST, ALL, NDEV, 2, CCQ_INT32, CCQ_SUM, N, false, 12);
    coll_make(&ag, K_ALL_GATHER, ALL, NDEV, 0, CCQ_UINT8, CCQ_SUM, 40, true, 13);
    ref_fill(CCQ_INT32, sbuf, N, 14);
    memset(rbuf, 0, sizeof rbuf);
    fake_log_reset();

    block_scheduler(&b, rt);
    coll_submit(rt, &ar, 1);
    assert_int_equal(ccq_send(rt, 0, 3, sbuf, N, CCQ_INT32, 1), CCQ_OK);
    coll_submit(rt, &bc, 1);
    assert_int_equal(ccq_recv(rt, 1, 3, rbuf, N, CCQ_INT32, 0), CCQ_OK);
    coll_submit(rt, &ag, 1);
    release_scheduler(&b);
    coll_fence(rt, &ar, 1);
    assert_int_equal(ccq_sync_collective(rt, 0, 3), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 1, 3), CCQ_OK);
    coll_verify(&ar);
    coll_verify(&bc);
    coll_verify(&ag);
    assert_memory_equal(rbuf, sbuf, sizeof sbuf);

    if (data_groups(g, 4) != 1) {
        fake_log_dump();
        fail_msg("%zu data groups, expected 1", data_groups(g, 4));
    }
    assert_int_equal(g[0].nallreduce, NDEV);
    assert_int_equal(g[0].ncoll, 2 * NDEV);
    assert_int_equal(g[0].nsend, 1);
    assert_int_equal(g[0].nrecv, 1);
    assert_int_equal(g[0].nother, 0);
    coll_check_calls(&ar, (size_t)fake_log_find("ncclAllReduce", g[0].start));
    coll_check_calls(&bc, (size_t)fake_log_find("ncclBroadcast", g[0].start));
    coll_check_calls(&ag, (size_t)fake_log_find("ncclAllGather", g[0].start));
    assert_true(fake_log_find("ncclAllReduce", g[0].start) <
                fake_log_find("ncclBroadcast", g[0].start));
    assert_true(fake_log_find("ncclBroadcast", g[0].start) <
                fake_log_find("ncclAllGather", g[0].start));
    ccq_stats st = stats_of(rt);
    assert_int_equal(st.batches - before.batches, 1);
    assert_int_equal(st.max_batch_ops, 4);
    coll_free(&ar);
    coll_free(&bc);
    coll_free(&ag);
}

/* fp8: reduce and reduce_scatter are refused at the call below compute capability 9
 * (nothing queued), like all_reduce; the collectives that only move data run there; on 9
 * the reductions run and reduce as NCCL would. */
static void test_coll_fp8_capability(void **state)
{
    (void)state;
    enum { N = 48 };
    static uint8_t in[2 * N], out[2 * N];
    ccq_runtime *rt;

    fake_set_devices(NDEV, 8);
    rt = make_rt(10000);
    assert_int_equal(ccq_comm_init(rt, P01, 2), CCQ_OK);
    for (int t = CCQ_FLOAT8E4M3; t <= CCQ_FLOAT8E5M2; t++) {
        ccq_status st[4] = {
            ccq_reduce(rt, 0, 0, in, NULL, N, (ccq_dtype)t, CCQ_SUM, 1, P01, 2),
            ccq_reduce(rt, 1, 0, in, out, N, (ccq_dtype)t, CCQ_MAX, 1, P01, 2),
            ccq_reduce_scatter(rt, 0, 0, in, out, N, (ccq_dtype)t, CCQ_SUM, P01, 2),
            ccq_reduce_scatter(rt, 1, 0, in, out, N, (ccq_dtype)t, CCQ_MIN, P01, 2),
        };
        for (int k = 0; k < 4; k++)
            if (st[k] != CCQ_ERR_UNSUPPORTED)
                fail_msg("%s case %d on compute capability 8: %s, expected CCQ_ERR_UNSUPPORTED",
                         ccq_dtype_name((ccq_dtype)t), k, ccq_status_name(st[k]));
        assert_int_equal(ccq_reduce_scatter(rt, 1, 0, in, out, N, (ccq_dtype)t, CCQ_SUM, P01, 2),
                         CCQ_ERR_UNSUPPORTED);
        assert_detail_has(ccq_last_error_detail(), "compute capability 9.0");
        assert_detail_has(ccq_last_error_detail(), "device 1 is 8.x");
    }
    assert_int_equal(stats_of(rt).submitted, 0);
    for (int k = 0; k < NSEVEN; k++)
        if (!tkinds[k].reduces)
            for (int t = CCQ_FLOAT8E4M3; t <= CCQ_FLOAT8E5M2; t++)
                coll_run(rt, k, P01, 2, 1, (ccq_dtype)t, CCQ_SUM, N, false, (uint32_t)(k + t));
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
    g_rt = NULL;
    check_clean();

    fake_reset();
    fake_set_devices(NDEV, 9);
    rt = make_rt(10000);
    for (int t = CCQ_FLOAT8E4M3; t <= CCQ_FLOAT8E5M2; t++) {
        for (int o = CCQ_SUM; o <= CCQ_MIN; o++) {
            coll_run(rt, K_REDUCE, P01, 2, 1, (ccq_dtype)t, (ccq_reduce_op)o, N, false,
                     (uint32_t)(t * 10 + o));
            coll_run(rt, K_REDUCE_SCATTER, P01, 2, 1, (ccq_dtype)t, (ccq_reduce_op)o, N, o == 0,
                     (uint32_t)(t * 10 + o + 5));
            coll_run(rt, K_REDUCE, ALL, NDEV, 3, (ccq_dtype)t, (ccq_reduce_op)o, N, true,
                     (uint32_t)(t * 10 + o + 7));
        }
    }
}

/* The parts of a rooted collective that disagree on the root, or parts of different kinds:
 * CCQ_ERR_MISMATCH on every rank, naming the field, and NCCL never sees them; the
 * communicator keeps working. */
static void test_coll_mismatch(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(10000);

    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    for (int k = 0; k < NSEVEN + 1; k++) {
        bool kind_case = k == NSEVEN; /* broadcast on ranks 0-2, all_gather on rank 3 */
        int k0 = kind_case ? K_BROADCAST : k;
        coll a, b;
        if (!kind_case && !tkinds[k].rooted)
            continue;
        coll_make(&a, k0, ALL, NDEV, 1, CCQ_FLOAT32, CCQ_SUM, 32, false, 1);
        coll_make(&b, kind_case ? K_ALL_GATHER : k0, ALL, NDEV, 2, CCQ_FLOAT32, CCQ_SUM, 32, false,
                  2);
        fake_log_reset();
        for (uint32_t r = 0; r < NDEV; r++) {
            const coll *c = r < 3 ? &a : &b;
            assert_int_equal(submit_kind(rt, c->k, r, 0, c->src[r], c->dst[r], c->count, c->dt,
                                         c->op, c->root_dev, ALL, NDEV),
                             CCQ_OK);
        }
        for (ccq_device_id d = 0; d < NDEV; d++) {
            ccq_status st = ccq_sync_collective(rt, d, 0);
            if (st != CCQ_ERR_MISMATCH)
                fail_msg("%s: device %u: fence returned %s, expected CCQ_ERR_MISMATCH (%s)",
                         kind_case ? "broadcast vs all_gather" : tkinds[k].name, d,
                         ccq_status_name(st), ccq_last_error_detail());
            if (kind_case) {
                assert_detail_has(ccq_last_error_detail(), "kind");
                assert_detail_has(ccq_last_error_detail(), "all_gather");
            } else {
                assert_detail_has(ccq_last_error_detail(), "root");
                assert_detail_has(ccq_last_error_detail(), "device 1");
                assert_detail_has(ccq_last_error_detail(), "device 2");
            }
        }
        assert_int_equal(fake_log_count(tkinds[a.k].fn), 0);
        assert_int_equal(fake_log_count(tkinds[b.k].fn), 0);
        assert_int_equal(fake_log_count("ncclGroupStart"), 0);
        for (uint32_t r = 0; r < NDEV; r++) {
            const coll *c = r < 3 ? &a : &b;
            for (size_t i = 0; c->dst[r] != NULL && i < c->db[r]; i++)
                assert_int_equal(((const unsigned char *)c->dst[r])[i], 0xA5);
        }
        coll_free(&a);
        coll_free(&b);
        coll_run(rt, k0, ALL, NDEV, 3, CCQ_INT32, CCQ_SUM, 17, false, 3);
    }
}

/* ncclAlltoAll, ncclGather and ncclScatter exist only from NCCL 2.28 on (an older libnccl
 * lacks the symbols: the program does not load, or stops at the first call), yet creation
 * accepts any NCCL >= 2.19. Either creation must refuse an NCCL older than 2.28, or those
 * three collectives must be refused at the call there (CCQ_ERR_UNSUPPORTED); never may a
 * group call them. At the time of writing this fails: backends/nccl/nccl.c:192 checks for
 * 2.19 only, and ccq_all_to_all is queued and issued as ncclAlltoAll. */
static void test_old_nccl_lacks_new_collectives(void **state)
{
    (void)state;
    enum { N = 4 };
    static float in[2][2 * N], out[2][2 * N];
    ccq_config cfg;
    ccq_runtime *rt = NULL;
    ccq_status st;
    size_t calls;

    fake_set_nccl_version(NCCL_VERSION(2, 27, 7));
    ccq_config_init(&cfg);
    cfg.backend = "nccl";
    cfg.max_streams = MAX_STREAMS;
    cfg.queue_depth = QUEUE_DEPTH;
    cfg.timeout_ms = 10000;
    st = ccq_runtime_create(&cfg, &rt);
    if (st == CCQ_ERR_UNSUPPORTED) {
        assert_detail_has(ccq_last_error_detail(), "2.28");
        return;
    }
    assert_int_equal(st, CCQ_OK);
    g_rt = rt;
    assert_int_equal(ccq_comm_init(rt, P01, 2), CCQ_OK);
    st = ccq_all_to_all(rt, 0, 0, in[0], out[0], N, CCQ_FLOAT32, P01, 2);
    if (st == CCQ_ERR_UNSUPPORTED)
        return;
    if (st == CCQ_OK) { /* let it end, so that the runtime is left clean */
        assert_int_equal(ccq_all_to_all(rt, 1, 0, in[1], out[1], N, CCQ_FLOAT32, P01, 2), CCQ_OK);
        (void)ccq_sync_collective(rt, 0, 0);
        (void)ccq_sync_collective(rt, 1, 0);
    }
    ccq_runtime_destroy(rt);
    g_rt = NULL;
    calls = fake_log_count("ncclAlltoAll");
    fake_reset(); /* the fake error of the call into the missing symbol */
    fail_msg("NCCL 2.27.7: ccq_runtime_create accepted it and ccq_all_to_all returned %s, and "
             "%zu ncclAlltoAll call(s) were made, a function NCCL 2.27 does not have; expected "
             "CCQ_ERR_UNSUPPORTED from creation or from the call (backends/nccl/nccl.c:192 "
             "only requires NCCL >= 2.19)",
             ccq_status_name(st), calls);
}

/* ccq_runtime_destroy releases CUDA objects of every device on the caller's thread and
 * leaves that thread's current device as it was. */
static void test_destroy_restores_device(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(10000);

    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    allreduce_all(rt, 0, 3);
    allreduce_all(rt, 1, 4);
    assert_int_equal(cudaSetDevice(2), cudaSuccess);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
    g_rt = NULL;
    assert_int_equal(fake_current_device(), 2);
}

/* fp8 appeared in NCCL 2.24: with an older library, fp8 work is refused at the call with
 * CCQ_ERR_UNSUPPORTED (reduction or not), nothing reaches NCCL, other dtypes work. */
static void test_old_nccl_lacks_fp8(void **state)
{
    (void)state;
    enum { N = 4 };
    static uint8_t in[2][N], out[2][N];
    static float fin[2][N], fout[2][N];
    ccq_runtime *rt;

    fake_set_nccl_version(NCCL_VERSION(2, 23, 4));
    rt = make_rt(10000);
    assert_int_equal(ccq_comm_init(rt, P01, 2), CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 0, 0, in[0], out[0], N, CCQ_FLOAT8E4M3, CCQ_SUM, P01, 2),
                     CCQ_ERR_UNSUPPORTED);
    assert_detail_has(ccq_last_error_detail(), "fp8 needs NCCL 2.24");
    assert_detail_has(ccq_last_error_detail(), "2.23.4");
    assert_int_equal(ccq_broadcast(rt, 0, 0, in[0], out[0], N, CCQ_FLOAT8E5M2, 0, P01, 2),
                     CCQ_ERR_UNSUPPORTED);
    for (ccq_device_id d = 0; d < 2; d++)
        assert_int_equal(ccq_all_reduce(rt, d, 0, fin[d], fout[d], N, CCQ_FLOAT32, CCQ_SUM, P01, 2),
                         CCQ_OK);
    for (ccq_device_id d = 0; d < 2; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_OK);
    assert_int_equal(fake_log_count("ncclBroadcast"), 0);
    assert_int_equal(fake_log_count("ncclAllReduce"), 2);
}

/* ---- Binding ---- */

/* Binding: refused on another backend, for a bad device or stream, and while commands are
 * outstanding; a CUDA failure while making the slot events cleans up after itself. */
static void test_bind_errors(void **state)
{
    (void)state;
    enum { N = 8 };
    static float in[2][N], out[2][N];
    ccq_config cfg;
    ccq_runtime *host = NULL;
    cudaStream_t s0 = fake_user_stream(0), s1 = fake_user_stream(1);

    ccq_config_init(&cfg);
    cfg.backend = "host";
    assert_int_equal(ccq_runtime_create(&cfg, &host), CCQ_OK);
    assert_int_equal(ccq_nccl_bind_stream(host, 0, 0, s0), CCQ_ERR_UNSUPPORTED);
    assert_detail_has(ccq_last_error_detail(), "\"host\"");
    assert_int_equal(ccq_runtime_destroy(host), CCQ_OK);
    assert_int_equal(ccq_nccl_bind_stream(NULL, 0, 0, s0), CCQ_ERR_INVALID_ARGUMENT);

    ccq_runtime *rt = make_rt(10000);
    assert_int_equal(ccq_nccl_bind_stream(rt, NDEV, 0, s0), CCQ_ERR_INVALID_ARGUMENT);
    assert_int_equal(ccq_nccl_bind_stream(rt, 0, MAX_STREAMS, s0), CCQ_ERR_INVALID_ARGUMENT);

    /* Outstanding work: device 0's part waits for device 1's. */
    assert_int_equal(ccq_comm_init(rt, P01, 2), CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 0, 0, in[0], out[0], N, CCQ_FLOAT32, CCQ_SUM, P01, 2),
                     CCQ_OK);
    assert_int_equal(ccq_nccl_bind_stream(rt, 0, 0, s0), CCQ_ERR_INVALID_ARGUMENT);
    assert_detail_has(ccq_last_error_detail(), "outstanding");
    assert_int_equal(ccq_all_reduce(rt, 1, 0, in[1], out[1], N, CCQ_FLOAT32, CCQ_SUM, P01, 2),
                     CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 0, 0), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 1, 0), CCQ_OK);
    assert_int_equal(ccq_nccl_bind_stream(rt, 0, 0, s0), CCQ_OK);

    /* The third slot event fails: the two made are destroyed, the device restored. */
    int events = fake_live("event");
    assert_int_equal(cudaSetDevice(2), cudaSuccess);
    fake_script("cudaEventCreateWithFlags", cudaSuccess);
    fake_script("cudaEventCreateWithFlags", cudaSuccess);
    fake_script("cudaEventCreateWithFlags", cudaErrorMemoryAllocation);
    assert_int_equal(ccq_nccl_bind_stream(rt, 1, 0, s1), CCQ_ERR_BACKEND);
    assert_detail_has(ccq_last_error_detail(), "cudaEventCreateWithFlags");
    assert_detail_has(ccq_last_error_detail(), "cudaErrorMemoryAllocation");
    assert_int_equal(fake_live("event"), events);
    assert_int_equal(fake_current_device(), 2);
    assert_int_equal(ccq_nccl_bind_stream(rt, 1, 0, s1), CCQ_OK);
    assert_int_equal(fake_live("event"), events + QUEUE_DEPTH);

    /* Bound work runs; after unbinding nothing is recorded at submission. */
    fake_log_reset();
    for (ccq_device_id d = 0; d < 2; d++)
        assert_int_equal(ccq_all_reduce(rt, d, 0, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, P01, 2),
                         CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 0, 0), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 1, 0), CCQ_OK);
    assert_int_equal(fake_log_count("cudaStreamWaitEvent"), 4); /* 2 submissions, 2 fences */
    assert_int_equal(ccq_nccl_bind_stream(rt, 0, 0, NULL), CCQ_OK);
    assert_int_equal(ccq_nccl_bind_stream(rt, 1, 0, NULL), CCQ_OK);
    fake_log_reset();
    for (ccq_device_id d = 0; d < 2; d++)
        assert_int_equal(ccq_all_reduce(rt, d, 0, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, P01, 2),
                         CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 0, 0), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 1, 0), CCQ_OK);
    assert_int_equal(fake_log_count("cudaStreamWaitEvent"), 0);
}

/* ---- Memory ---- */

/* ccq_mem_alloc/copy/free are cudaMalloc/cudaMemcpy/cudaFree on the right device, with the
 * caller's device restored; the memory works as collective buffers. */
static void test_device_memory(void **state)
{
    (void)state;
    enum { N = 100 };
    const size_t bytes = N * sizeof(float);
    static float host[NDEV][N], back[N], want[N];
    const void *inputs[NDEV];
    void *buf[NDEV], *none = &none;
    ccq_runtime *rt = make_rt(10000);

    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    fake_log_reset();
    for (ccq_device_id d = 0; d < NDEV; d++) {
        assert_int_equal(ccq_mem_alloc(rt, d, bytes, &buf[d]), CCQ_OK);
        assert_int_equal(fake_current_device(), 1);
        fake_call c = entry((size_t)fake_log_size() - 2); /* then cudaSetDevice(prev) */
        assert_string_equal(c.fn, "cudaMalloc");
        assert_int_equal(c.device, d);
        assert_int_equal(c.count, bytes);
        assert_ptr_equal(c.dst, buf[d]);
        ref_fill(CCQ_FLOAT32, host[d], N, 60u + d);
        inputs[d] = host[d];
        assert_int_equal(ccq_mem_copy(rt, d, buf[d], host[d], bytes, CCQ_COPY_TO_DEVICE), CCQ_OK);
        c = entry((size_t)fake_log_size() - 2);
        assert_string_equal(c.fn, "cudaMemcpy");
        assert_int_equal(c.device, d);
        assert_int_equal(c.value, cudaMemcpyHostToDevice);
    }
    ref_allreduce(CCQ_FLOAT32, CCQ_SUM, NDEV, inputs, want, N);
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 0, buf[d], buf[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV), CCQ_OK);
    for (ccq_device_id d = 0; d < NDEV; d++) {
        assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_OK);
        memset(back, 0, sizeof back);
        assert_int_equal(ccq_mem_copy(rt, d, back, buf[d], bytes, CCQ_COPY_TO_HOST), CCQ_OK);
        fake_call c = entry((size_t)fake_log_size() - 2);
        assert_int_equal(c.value, cudaMemcpyDeviceToHost);
        assert_int_equal(ref_compare(CCQ_FLOAT32, back, want, N, NULL, 0), 0);
    }

    fake_script("cudaMalloc", cudaErrorMemoryAllocation);
    assert_int_equal(ccq_mem_alloc(rt, 2, bytes, &none), CCQ_ERR_BACKEND);
    assert_null(none);
    assert_detail_has(ccq_last_error_detail(), "cudaMalloc");
    assert_detail_has(ccq_last_error_detail(), "cudaErrorMemoryAllocation");
    assert_int_equal(fake_current_device(), 1);
    assert_int_equal(fake_live("mem"), NDEV);
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(ccq_mem_free(rt, d, buf[d]), CCQ_OK);
    assert_int_equal(fake_live("mem"), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_fake_rejects_incomplete_groups, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fake_collectives, setup, teardown),
        cmocka_unit_test_setup_teardown(test_init_sequence, setup, teardown),
        cmocka_unit_test_setup_teardown(test_init_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_gpu, setup, teardown),
        cmocka_unit_test_setup_teardown(test_allreduce_one_group, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_is_one_group, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sendrecv_ring, setup, teardown),
        cmocka_unit_test_setup_teardown(test_self_sendrecv, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inplace_sendrecv_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_max_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_busy_comm_waits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_one_rank_current_device, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bound_stream_waits_for_submission, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fence_makes_user_stream_wait, setup, teardown),
        cmocka_unit_test_setup_teardown(test_completion_events_polled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_group_end_in_progress, setup, teardown),
        cmocka_unit_test_setup_teardown(test_error_mapping, setup, teardown),
        cmocka_unit_test_setup_teardown(test_async_error_aborts_group, setup, teardown),
        cmocka_unit_test_setup_teardown(test_async_error_aborts_every_comm_of_group, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_aborted_comm_refuses_submission, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_batch_waits_for_gpu, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_call_in_group_aborts_poisoned_comm, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_abort_spares_other_comms_in_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_watchdog_aborts_stuck_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fp8_capability, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dtype_op_mapping, setup, teardown),
        cmocka_unit_test_setup_teardown(test_broadcast, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reduce, setup, teardown),
        cmocka_unit_test_setup_teardown(test_all_gather, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reduce_scatter, setup, teardown),
        cmocka_unit_test_setup_teardown(test_all_to_all, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gather, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scatter, setup, teardown),
        cmocka_unit_test_setup_teardown(test_coll_dtype_op_mapping, setup, teardown),
        cmocka_unit_test_setup_teardown(test_coll_mixed_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_coll_fp8_capability, setup, teardown),
        cmocka_unit_test_setup_teardown(test_coll_mismatch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_old_nccl_lacks_new_collectives, setup, teardown),
        cmocka_unit_test_setup_teardown(test_old_nccl_lacks_fp8, setup, teardown),
        cmocka_unit_test_setup_teardown(test_destroy_restores_device, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bind_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_device_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(test_one_rank_avg, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cuda_error_in_group_drains, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_does_not_block_scheduler, setup, teardown),
        cmocka_unit_test_setup_teardown(test_launch_serialized_per_device, setup, teardown),
        cmocka_unit_test_setup_teardown(test_destroy_aborts_every_rank, setup, teardown),
        cmocka_unit_test_setup_teardown(test_destroy_skips_unused_devices, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fp8_lowest_capability, setup, teardown),
        cmocka_unit_test_setup_teardown(test_completed_batch_survives_later_error, setup, teardown),
    };
    return cmocka_run_group_tests_name("nccl_fake", tests, NULL, NULL);
}
