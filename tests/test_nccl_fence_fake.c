/* GPU-side waits (ccq_nccl_stream_wait) on the NCCL backend, against the fake CUDA/NCCL,
 * whose streams hold back work queued after a stream wait until its counter is reached:
 * the wait's value (ticket arithmetic), the counter writes after each batch (before the
 * completion event), the release of waiting streams on mismatch, watchdog timeout, abort
 * (also a batch returned before the GPU drained) and shutdown, and the unsupported
 * fallback. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test_util.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <pthread.h>

#include "ccq.h"
#include "ccq/ccq_nccl.h"
#include "fake/fake_cuda_nccl.h"
#include "ref.h"

enum { NDEV = 4, N = 64 };

static const ccq_device_id ALL[NDEV] = {0, 1, 2, 3};
static const ccq_device_id P01[2] = {0, 1};
static const ccq_device_id P23[2] = {2, 3};

static ccq_runtime *g_rt;

static ccq_runtime *make_rt(uint64_t timeout_ms)
{
    ccq_config cfg;
    ccq_config_init(&cfg);
    cfg.backend = "nccl";
    cfg.max_streams = 8;
    cfg.queue_depth = 16;
    cfg.timeout_ms = timeout_ms;
    assert_int_equal(ccq_runtime_create(&cfg, &g_rt), CCQ_OK);
    return g_rt;
}

static int setup(void **state)
{
    (void)state;
    fake_reset();
    g_rt = NULL;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char msg[256];
    ccq_runtime_destroy(g_rt);
    g_rt = NULL;
    assert_int_equal(fake_live("stream"), 0);
    assert_int_equal(fake_live("event"), 0);
    assert_int_equal(fake_live("comm"), 0);
    if (fake_errors(msg, sizeof msg) != 0)
        fail_msg("the fake saw a misuse: %s", msg);
    return 0;
}

static fake_call entry(size_t i)
{
    fake_call c;
    assert_true(fake_log_get(i, &c));
    return c;
}

/* The stream ccq's NCCL calls of rank `rank` of a communicator used first after `from`. */
static cudaStream_t nccl_stream_of_rank(int rank, size_t from)
{
    for (long i = fake_log_find("ncclAllReduce", from); i >= 0;
         i = fake_log_find("ncclAllReduce", (size_t)i + 1)) {
        fake_call c = entry((size_t)i);
        if (c.rank == rank)
            return c.stream;
    }
    fail_msg("no ncclAllReduce of rank %d", rank);
    return NULL;
}

/* Values of the stream memory operations `fn` on `stream`, in log order. */
static size_t values_on(const char *fn, cudaStream_t stream, uint64_t *out, size_t max)
{
    size_t n = 0;
    for (long i = fake_log_find(fn, 0); i >= 0; i = fake_log_find(fn, (size_t)i + 1)) {
        fake_call c = entry((size_t)i);
        if (c.stream == stream && c.result == 0 && n < max)
            out[n++] = (uint64_t)c.count;
    }
    return n;
}

/* Pump the fake's queues until `stream` has nothing pending (bounded; false if not). */
static bool drains(cudaStream_t stream)
{
    for (int i = 0; i < 5000; i++) {
        if (fake_stream_pending(stream) == 0)
            return true;
        sleep_ms(1);
    }
    return false;
}

/* A user "kernel": counts its runs and copies what it reads (the all_reduce result). */
typedef struct kernel {
    int runs;
    const float *src;
    float seen[N];
} kernel;

static void kernel_fn(void *arg)
{
    kernel *k = arg;
    k->runs++;
    if (k->src != NULL)
        memcpy(k->seen, k->src, sizeof k->seen);
}

static void fill(float in[NDEV][N], float want[N], uint32_t seed)
{
    const void *inputs[NDEV];
    for (int d = 0; d < NDEV; d++) {
        ref_fill(CCQ_FLOAT32, in[d], N, seed + (uint32_t)d);
        inputs[d] = in[d];
    }
    ref_allreduce(CCQ_FLOAT32, CCQ_SUM, NDEV, inputs, want, N);
}

static ccq_fence begin(ccq_runtime *rt, ccq_device_id d, ccq_stream_id s)
{
    ccq_fence f = 0;
    assert_int_equal(ccq_fence_begin(rt, d, s, &f), CCQ_OK);
    return f;
}

/*
 * The wait is queued and the call returns while the command it covers is not even issued
 * (a part is missing); the work queued after it is held back until the batch is done,
 * then reads the all_reduce's result; the communication stream wrote the counter after
 * the batch, before the batch's completion event; streams never waited on get no writes.
 */
static void test_wait_holds_back_until_done(void **state)
{
    (void)state;
    static float in[NDEV][N], out[NDEV][N], want[N];
    ccq_runtime *rt = make_rt(600000);
    cudaStream_t us = fake_user_stream(0);
    kernel before = {0}, after = {0};
    char msg[256];

    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    fill(in, want, 11);
    fake_user_launch(us, kernel_fn, &before);
    assert_int_equal(before.runs, 1); /* nothing queued ahead: runs at once */
    assert_int_equal(ccq_all_reduce(rt, 0, 0, in[0], out[0], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV),
                     CCQ_OK);
    size_t mark = fake_log_size();
    assert_int_equal(ccq_nccl_stream_wait(rt, 0, 0, us), CCQ_OK);
    after.src = out[0];
    fake_user_launch(us, kernel_fn, &after);
    sleep_ms(20);
    assert_int_equal(fake_stream_pending(us), 2); /* the wait and the kernel */
    assert_int_equal(after.runs, 0);
    uint64_t v[8];
    assert_int_equal(values_on("cuStreamWaitValue64", us, v, 8), 1);
    assert_int_equal(v[0], 1); /* one command submitted before the call */
    assert_true(fake_log_find("ncclAllReduce", mark) < 0); /* not issued yet */

    for (ccq_device_id d = 1; d < NDEV; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 0, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV), CCQ_OK);
    assert_true(drains(us));
    assert_int_equal(after.runs, 1);
    if (ref_compare(CCQ_FLOAT32, after.seen, want, N, msg, sizeof msg) != 0)
        fail_msg("the kernel after the wait read: %s", msg);
    /* The fences before reading the log: the user stream drains as soon as the scheduler has
     * queued the write, which it does just before it records the batch's completion event;
     * a fence returns only after that event (the ASan build in CI read the log in between
     * once: no event yet). */
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_OK);

    /* The write: on rank 0's NCCL stream, value 1, after the all_reduce and before the
     * batch's completion event on that stream. */
    cudaStream_t cs = nccl_stream_of_rank(0, mark);
    assert_int_equal(values_on("cuStreamWriteValue64", cs, v, 8), 1);
    assert_int_equal(v[0], 1);
    long w = fake_log_find("cuStreamWriteValue64", mark);
    long ar = fake_log_find("ncclAllReduce", mark);
    assert_true(w > ar);
    long rec = -1;
    for (long i = fake_log_find("cudaEventRecord", (size_t)ar); i >= 0;
         i = fake_log_find("cudaEventRecord", (size_t)i + 1))
        if (entry((size_t)i).stream == cs) {
            rec = i;
            break;
        }
    assert_true(rec > w);
    /* Other devices' streams were never waited on: no writes for them. */
    for (int r = 1; r < NDEV; r++)
        assert_int_equal(values_on("cuStreamWriteValue64", nccl_stream_of_rank(r, mark), v, 8), 0);
}

/* Each counter wait's value is the number of commands submitted on its stream before the
 * call, and each batch's write is the number ended once it is done. (Each wait here covers
 * a command not launched yet, its last part still to come: see test_wait_policy.) */
static void test_ticket_arithmetic(void **state)
{
    (void)state;
    static float in[NDEV][N], out[NDEV][N], want[N];
    ccq_runtime *rt = make_rt(600000);
    cudaStream_t us = fake_user_stream(0);
    uint64_t v[16];

    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    fill(in, want, 3);
    for (int r = 0; r < 3; r++) {
        for (ccq_device_id d = 0; d + 1 < NDEV; d++)
            assert_int_equal(
                ccq_all_reduce(rt, d, 1, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV),
                CCQ_OK);
        assert_int_equal(ccq_nccl_stream_wait(rt, 0, 1, us), CCQ_OK);
        assert_int_equal(ccq_all_reduce(rt, NDEV - 1, 1, in[NDEV - 1], out[NDEV - 1], N,
                                        CCQ_FLOAT32, CCQ_SUM, ALL, NDEV),
                         CCQ_OK);
        assert_int_equal(ccq_fence_wait(rt, 0, 1, begin(rt, 0, 1), 10000), CCQ_OK);
    }
    /* A wait on device 1 counts device 1's commands on that stream. */
    cudaStream_t us1 = fake_user_stream(1);
    for (ccq_device_id d = 1; d < NDEV; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 1, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV), CCQ_OK);
    assert_int_equal(ccq_nccl_stream_wait(rt, 1, 1, us1), CCQ_OK);
    assert_int_equal(values_on("cuStreamWaitValue64", us1, v, 16), 1);
    assert_int_equal(v[0], 4);
    assert_int_equal(ccq_all_reduce(rt, 0, 1, in[0], out[0], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV),
                     CCQ_OK);
    assert_int_equal(values_on("cuStreamWaitValue64", us, v, 16), 3);
    for (int k = 0; k < 3; k++)
        assert_int_equal(v[k], (uint64_t)k + 1);
    assert_true(drains(us));
    assert_true(drains(us1));
    /* One batch per round: writes 1, 2, 3, 4 on device 0's NCCL stream. */
    cudaStream_t cs = nccl_stream_of_rank(0, 0);
    size_t nw = values_on("cuStreamWriteValue64", cs, v, 16);
    assert_int_equal(nw, 4);
    for (size_t k = 0; k < nw; k++)
        assert_int_equal(v[k], k + 1);
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 1), CCQ_OK);
}

/* Commands that fail without reaching the GPU (a mismatch) release the waiting stream from
 * the host; the error comes with the next host fence. */
static void test_release_on_mismatch(void **state)
{
    (void)state;
    static float a[N], b[N], oa[N], ob[N];
    ccq_runtime *rt = make_rt(600000);
    cudaStream_t us = fake_user_stream(0);
    kernel k = {0};

    assert_int_equal(ccq_comm_init(rt, P01, 2), CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 0, 2, a, oa, N, CCQ_FLOAT32, CCQ_SUM, P01, 2), CCQ_OK);
    assert_int_equal(ccq_nccl_stream_wait(rt, 0, 2, us), CCQ_OK);
    fake_user_launch(us, kernel_fn, &k);
    assert_int_equal(k.runs, 0);
    assert_int_equal(ccq_all_reduce(rt, 1, 2, b, ob, N - 1, CCQ_FLOAT32, CCQ_SUM, P01, 2), CCQ_OK);
    assert_true(drains(us));
    assert_int_equal(k.runs, 1);
    assert_int_equal(fake_log_count("cuStreamWriteValue64"), 0); /* it never reached the GPU */
    assert_int_equal(ccq_sync_collective(rt, 0, 2), CCQ_ERR_MISMATCH);
    assert_int_equal(ccq_sync_collective(rt, 1, 2), CCQ_ERR_MISMATCH);
}

/* A part that never comes: the watchdog's timeout releases the waiting stream. */
static void test_release_on_watchdog_timeout(void **state)
{
    (void)state;
    static float a[N], oa[N];
    ccq_runtime *rt = make_rt(200);
    cudaStream_t us = fake_user_stream(0);
    kernel k = {0};

    assert_int_equal(ccq_comm_init(rt, P01, 2), CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 0, 0, a, oa, N, CCQ_FLOAT32, CCQ_SUM, P01, 2), CCQ_OK);
    ccq_fence f = begin(rt, 0, 0);
    assert_int_equal(ccq_nccl_stream_wait(rt, 0, 0, us), CCQ_OK);
    fake_user_launch(us, kernel_fn, &k);
    assert_int_equal(ccq_fence_wait(rt, 0, 0, f, 10000), CCQ_ERR_TIMEOUT);
    assert_true(drains(us));
    assert_int_equal(k.runs, 1);
    assert_int_equal(fence_watchdog(rt, 0, 0, NULL, 0), CCQ_ERR_TIMEOUT);
}

/* Issued work the watchdog aborts: the aborted kernels exit, the NCCL stream drains and
 * runs its write; the commands queued behind it fail and the host writes for them. */
static void test_release_on_abort(void **state)
{
    (void)state;
    static float in[NDEV][N], out[NDEV][N], want[N];
    ccq_runtime *rt = make_rt(300);
    cudaStream_t us = fake_user_stream(0);
    kernel k = {0};
    uint64_t v[8];

    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    fill(in, want, 5);
    fake_set_manual_events(true); /* the batch never completes on its own */
    for (int r = 0; r < 2; r++)
        for (ccq_device_id d = 0; d < NDEV; d++)
            assert_int_equal(
                ccq_all_reduce(rt, d, 0, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV),
                CCQ_OK);
    assert_int_equal(ccq_nccl_stream_wait(rt, 0, 0, us), CCQ_OK);
    fake_user_launch(us, kernel_fn, &k);
    sleep_ms(50);
    assert_int_equal(k.runs, 0);
    assert_int_equal(fence_watchdog(rt, 0, 0, NULL, 0), CCQ_ERR_ABORTED);
    assert_true(drains(us));
    assert_int_equal(k.runs, 1);
    assert_int_equal(values_on("cuStreamWaitValue64", us, v, 8), 1);
    assert_int_equal(v[0], 2);
    for (ccq_device_id d = 1; d < NDEV; d++)
        assert_int_equal(fence_watchdog(rt, d, 0, NULL, 0), CCQ_ERR_ABORTED);
}

/*
 * A failed batch returned before its stream drained (its queued work, and so its counter
 * write, is stuck behind something else): the host releases the waits at once; when the
 * late GPU write finally runs it lowers the counter, and the backend raises it again at
 * its next poll, so a wait evaluated after it is not left waiting.
 */
static void test_release_on_undrained_failure(void **state)
{
    (void)state;
    static float in[NDEV][N], out[NDEV][N], want[N];
    static float x[2][N], ox[2][N];
    ccq_runtime *rt = make_rt(300);
    cudaStream_t us = fake_user_stream(0);
    kernel k1 = {0}, k2 = {0};
    PFN_cuStreamWaitValue64_v11070 wait = NULL;
    enum cudaDriverEntryPointQueryResult q;
    uint64_t *gate = NULL;

    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    assert_int_equal(ccq_comm_init(rt, P23, 2), CCQ_OK);
    fill(in, want, 9);
    fake_set_manual_events(true);
    fake_set_abort_keeps_events(true);
    for (int r = 0; r < 2; r++)
        for (ccq_device_id d = 0; d < NDEV; d++)
            assert_int_equal(
                ccq_all_reduce(rt, d, 0, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV),
                CCQ_OK);
    assert_int_equal(ccq_nccl_stream_wait(rt, 0, 0, us), CCQ_OK); /* value 2 */
    fake_user_launch(us, kernel_fn, &k1);
    /* Aborted by the watchdog, returned undrained timeout_ms later; the second all_reduce
     * fails on the aborted communicator: the host writes 2. */
    assert_int_equal(fence_watchdog(rt, 0, 0, NULL, 0), CCQ_ERR_ABORTED);
    assert_true(drains(us));
    assert_int_equal(k1.runs, 1);
    /* A user stream busy until `gate` opens, then a wait for 2 queued through the driver
     * entry point the test gets like ccq does (so this wait is not ccq's, which would
     * raise the counter itself). */
    assert_int_equal(cudaHostAlloc((void **)&gate, 64, cudaHostAllocMapped), cudaSuccess);
    *gate = 0;
    assert_int_equal(cudaGetDriverEntryPointByVersion("cuStreamWaitValue64", (void **)&wait, 11070,
                                                      cudaEnableDefault, &q),
                     cudaSuccess);
    uint64_t v[8];
    size_t nw = values_on("cuStreamWaitValue64", us, v, 8);
    assert_int_equal(nw, 1);
    long wi = fake_log_find("cuStreamWaitValue64", 0);
    CUdeviceptr ctr = (CUdeviceptr)(uintptr_t)entry((size_t)wi).dst;
    cudaStream_t us2 = fake_user_stream(0);
    assert_int_equal(wait(us2, (CUdeviceptr)(uintptr_t)gate, 1, CU_STREAM_WAIT_VALUE_GEQ),
                     CUDA_SUCCESS);
    assert_int_equal(wait(us2, ctr, 2, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
    fake_user_launch(us2, kernel_fn, &k2);
    /* The late GPU write (1) runs now and lowers the counter; then the gate opens. */
    fake_complete_events();
    __atomic_store_n(gate, 1, __ATOMIC_RELEASE);
    fake_pump();
    /* Usually the counter now reads 1 and k2 waits: the hazard. On a loaded machine a poll of
     * the backend may already have repaired it (2) before this look; either way k2 must run
     * below, which it never does without the repair. */
    uint64_t now_ctr = *(volatile uint64_t *)(uintptr_t)ctr;
    assert_true(now_ctr == 1 || now_ctr == 2);
    if (now_ctr == 1)
        assert_int_equal(k2.runs, 0);
    /* The backend's next poll (any batch in flight) repairs it. */
    for (ccq_device_id d = 2; d < NDEV; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 3, x[d - 2], ox[d - 2], N, CCQ_FLOAT32, CCQ_SUM, P23, 2), CCQ_OK);
    for (int i = 0; i < 5000 && k2.runs == 0; i++) {
        fake_complete_events();
        sleep_ms(1);
    }
    assert_int_equal(k2.runs, 1);
    /* Events are completed by hand here: the pair's may be recorded after the loop above
     * stopped (k2 can run as soon as the repair is made), so keep completing them while its
     * fences wait, or the pair times out (timeout_ms is 300) on a loaded machine. */
    for (ccq_device_id d = 2; d < NDEV; d++) {
        ccq_fence f = begin(rt, d, 3);
        ccq_status st = CCQ_IN_PROGRESS;
        for (int i = 0; i < 5000 && st == CCQ_IN_PROGRESS; i++) {
            fake_complete_events();
            st = ccq_fence_test(rt, d, 3, f);
            if (st == CCQ_IN_PROGRESS)
                sleep_ms(1);
        }
        assert_int_equal(st, CCQ_OK);
    }
    for (ccq_device_id d = 1; d < NDEV; d++)
        assert_int_equal(fence_watchdog(rt, d, 0, NULL, 0), CCQ_ERR_ABORTED);
}

/* Shutdown cancels a command that can never run: the waiting stream is released. */
static void test_release_on_shutdown(void **state)
{
    (void)state;
    static float a[N], oa[N];
    ccq_runtime *rt = make_rt(600000);
    cudaStream_t us = fake_user_stream(0);
    kernel k = {0};

    assert_int_equal(ccq_comm_init(rt, P01, 2), CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 0, 4, a, oa, N, CCQ_FLOAT32, CCQ_SUM, P01, 2), CCQ_OK);
    assert_int_equal(ccq_nccl_stream_wait(rt, 0, 4, us), CCQ_OK);
    fake_user_launch(us, kernel_fn, &k);
    sleep_ms(20);
    assert_int_equal(k.runs, 0);
    assert_int_equal(ccq_runtime_shutdown(rt), CCQ_OK);
    assert_true(drains(us));
    assert_int_equal(k.runs, 1);
    assert_int_equal(ccq_sync_collective(rt, 0, 4), CCQ_ERR_SHUTDOWN);
}

/* Destroy raises every counter to its final value: a wait queued at the last moment on a
 * stream whose work never ran is released too. */
static void test_release_at_destroy(void **state)
{
    (void)state;
    static float a[N], oa[N];
    ccq_runtime *rt = make_rt(600000);
    cudaStream_t us = fake_user_stream(0);
    kernel k = {0};

    assert_int_equal(ccq_comm_init(rt, P01, 2), CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 0, 5, a, oa, N, CCQ_FLOAT32, CCQ_SUM, P01, 2), CCQ_OK);
    assert_int_equal(ccq_nccl_stream_wait(rt, 0, 5, us), CCQ_OK);
    fake_user_launch(us, kernel_fn, &k);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
    g_rt = NULL;
    assert_true(drains(us));
    assert_int_equal(k.runs, 1);
}

/* Where 64-bit stream memory operations are missing: CCQ_ERR_UNSUPPORTED with a detail,
 * nothing queued, and everything else works. Other backends and bad arguments too. */
static void test_unsupported_fallback(void **state)
{
    (void)state;
    static float in[NDEV][N], out[NDEV][N], want[N];
    cudaStream_t us = fake_user_stream(0);

    fake_set_memops(FAKE_MEMOPS_NO_SYMBOL);
    ccq_runtime *rt = make_rt(600000);
    assert_int_equal(ccq_nccl_stream_wait(rt, 0, 0, us), CCQ_ERR_UNSUPPORTED);
    assert_non_null(strstr(ccq_last_error_detail(), "cuStreamWaitValue64"));
    assert_non_null(strstr(ccq_last_error_detail(), "fence on the host"));
    assert_int_equal(ccq_nccl_stream_wait(rt, 0, 0, us), CCQ_ERR_UNSUPPORTED); /* remembered */
    assert_int_equal(fake_log_count("cudaHostAlloc"), 0);
    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    fill(in, want, 1);
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 0, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV), CCQ_OK);
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_OK);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);

    fake_set_memops(FAKE_MEMOPS_NO_ATTRIBUTE);
    rt = make_rt(600000);
    assert_int_equal(ccq_nccl_stream_wait(rt, 0, 0, us), CCQ_ERR_UNSUPPORTED);
    assert_non_null(strstr(ccq_last_error_detail(), "CAN_USE_64_BIT_STREAM_MEM_OPS"));
    assert_int_equal(fake_log_count("cuStreamWaitValue64"), 0);
    assert_int_equal(ccq_nccl_stream_wait(rt, 0, 0, NULL), CCQ_ERR_INVALID_ARGUMENT);
    assert_int_equal(ccq_nccl_stream_wait(rt, NDEV, 0, us), CCQ_ERR_INVALID_ARGUMENT);
    assert_int_equal(ccq_nccl_stream_wait(rt, 0, 8, us), CCQ_ERR_INVALID_ARGUMENT);
    assert_int_equal(ccq_nccl_stream_wait(NULL, 0, 0, us), CCQ_ERR_INVALID_ARGUMENT);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);

    ccq_config cfg;
    ccq_config_init(&cfg);
    cfg.backend = "host";
    assert_int_equal(ccq_runtime_create(&cfg, &g_rt), CCQ_OK);
    assert_int_equal(ccq_nccl_stream_wait(g_rt, 0, 0, us), CCQ_ERR_UNSUPPORTED);
    assert_non_null(strstr(ccq_last_error_detail(), "not \"nccl\""));
}

/* Many threads queue waits on the same ccq stream while others submit: every wait is
 * released once the work is done, and the values never exceed what was submitted. */

typedef struct waiter_arg {
    ccq_runtime *rt;
    cudaStream_t us;
} waiter_arg;

static void *waiter_main(void *arg)
{
    waiter_arg *w = arg;
    for (int i = 0; i < 200; i++)
        if (ccq_nccl_stream_wait(w->rt, 0, 6, w->us) != CCQ_OK)
            return (void *)1;
    return NULL;
}

static void test_concurrent_waits(void **state)
{
    (void)state;
    static float in[NDEV][N], out[NDEV][N], want[N];
    enum { WAITERS = 3, ROUNDS = 50 };
    ccq_runtime *rt = make_rt(600000);
    pthread_t th[WAITERS];
    waiter_arg wa[WAITERS];

    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    fill(in, want, 21);
    for (int i = 0; i < WAITERS; i++) {
        wa[i] = (waiter_arg){rt, fake_user_stream(0)};
        assert_int_equal(pthread_create(&th[i], NULL, waiter_main, &wa[i]), 0);
    }
    for (int r = 0; r < ROUNDS; r++) {
        for (ccq_device_id d = 0; d < NDEV; d++)
            assert_int_equal(
                ccq_all_reduce(rt, d, 6, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV),
                CCQ_OK);
        if (r % 8 == 0)
            for (ccq_device_id d = 0; d < NDEV; d++)
                assert_int_equal(ccq_sync_collective(rt, d, 6), CCQ_OK);
    }
    for (int i = 0; i < WAITERS; i++) {
        void *ret = NULL;
        assert_int_equal(pthread_join(th[i], &ret), 0);
        assert_null(ret);
    }
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 6), CCQ_OK);
    uint64_t v[256];
    for (int i = 0; i < WAITERS; i++) {
        assert_true(drains(wa[i].us));
        /* Each call queued a counter wait (its commands not launched yet), an event wait
         * (launched) or nothing (ended): never more than one. */
        size_t n = values_on("cuStreamWaitValue64", wa[i].us, v, 256);
        size_t ev = 0;
        for (long j = fake_log_find("cudaStreamWaitEvent", 0); j >= 0;
             j = fake_log_find("cudaStreamWaitEvent", (size_t)j + 1))
            ev += entry((size_t)j).stream == wa[i].us;
        assert_true(n + ev <= 200);
        for (size_t k = 0; k < n; k++) {
            assert_true(v[k] <= ROUNDS);
            assert_true(k == 0 || v[k] >= v[k - 1]); /* ordered per thread */
        }
    }
}

/* On a bound stream, ccq_fence_wait's CCQ_OK orders the stream after the completion event
 * (as ccq_sync_collective's); the polling ccq_fence_test does not queue anything. */
static void test_fence_values_and_bound_stream(void **state)
{
    (void)state;
    static float in[NDEV][N], out[NDEV][N], want[N];
    ccq_runtime *rt = make_rt(600000);
    cudaStream_t us = fake_user_stream(0);

    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    assert_int_equal(ccq_nccl_bind_stream(rt, 0, 0, us), CCQ_OK);
    fill(in, want, 2);
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 0, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV), CCQ_OK);
    ccq_fence f = begin(rt, 0, 0);
    assert_int_equal(ccq_fence_wait(rt, 0, 0, f, 10000), CCQ_OK);
    size_t mark = fake_log_size();
    for (int i = 0; i < 100; i++)
        assert_int_equal(ccq_fence_test(rt, 0, 0, f), CCQ_OK);
    assert_true(fake_log_find("cudaStreamWaitEvent", mark) < 0);
    assert_int_equal(ccq_fence_wait(rt, 0, 0, f, 10000), CCQ_OK);
    long i = fake_log_find("cudaStreamWaitEvent", mark);
    assert_true(i >= 0);
    assert_true(entry((size_t)i).stream == us);
    for (ccq_device_id d = 1; d < NDEV; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_OK);
    assert_int_equal(ccq_nccl_bind_stream(rt, 0, 0, NULL), CCQ_OK);
}

/* A thread without a current CUDA context (the driver says CUDA_ERROR_INVALID_CONTEXT):
 * the wait is queued again with the device current, and the thread's device restored. */
static void test_wait_without_current_context(void **state)
{
    (void)state;
    static float in[NDEV][N], out[NDEV][N], want[N];
    ccq_runtime *rt = make_rt(600000);
    cudaStream_t us = fake_user_stream(2);

    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    fill(in, want, 13);
    assert_int_equal(ccq_nccl_stream_wait(rt, 2, 0, us), CCQ_OK); /* set up */
    /* A command not launched yet (its other parts missing): a counter wait. */
    assert_int_equal(ccq_all_reduce(rt, 2, 0, in[2], out[2], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV),
                     CCQ_OK);
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    size_t mark = fake_log_size();
    fake_script("cuStreamWaitValue64", CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(ccq_nccl_stream_wait(rt, 2, 0, us), CCQ_OK);
    long a = fake_log_find("cuStreamWaitValue64", mark);
    long b = a >= 0 ? fake_log_find("cuStreamWaitValue64", (size_t)a + 1) : -1;
    assert_true(a >= 0 && b > a);
    assert_int_equal(entry((size_t)a).result, CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(entry((size_t)b).result, CUDA_SUCCESS);
    assert_int_equal(entry((size_t)b).device, 2);
    assert_int_equal(fake_current_device(), 1);
    for (ccq_device_id d = 0; d < NDEV; d++)
        if (d != 2)
            assert_int_equal(
                ccq_all_reduce(rt, d, 0, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV),
                CCQ_OK);
    assert_true(drains(us));
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_OK);
}

typedef struct init_job {
    ccq_runtime *rt;
    const ccq_device_id *set;
    uint32_t n;
    ccq_status st;
} init_job;

static void *init_main(void *arg)
{
    init_job *j = arg;
    j->st = ccq_comm_init(j->rt, j->set, j->n);
    return NULL;
}

/* Hold the scheduler (inside the creation of a one-device communicator on `dev`) so that
 * everything submitted until hold_end() is found in one pass. */
static void hold_begin(ccq_runtime *rt, const ccq_device_id *dev, pthread_t *th, init_job *job)
{
    *job = (init_job){rt, dev, 1, CCQ_OK};
    fake_hold_init(true);
    assert_int_equal(pthread_create(th, NULL, init_main, job), 0);
    for (int i = 0; i < 5000 && fake_inits_blocked() == 0; i++)
        sleep_ms(1);
    assert_int_equal(fake_inits_blocked(), 1);
}

static void hold_end(pthread_t th, const init_job *job)
{
    fake_hold_init(false);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(job->st, CCQ_OK);
}

/* The group (ncclGroupStart .. ncclGroupEnd) of the first ncclAllReduce on buffer src. */
static long group_of(const void *src)
{
    long g = -1;
    for (size_t i = 0;; i++) {
        fake_call c;
        if (!fake_log_get(i, &c))
            return -1;
        if (strcmp(c.fn, "ncclGroupStart") == 0)
            g = (long)i;
        if (strcmp(c.fn, "ncclAllReduce") == 0 && c.src == src)
            return g;
    }
}

/*
 * A command submitted after ccq_nccl_stream_wait on a bound stream (variant 0: the waited
 * stream itself; 1: another ccq stream bound to the same CUDA stream) records its event
 * after the wait. Found in one pass with the command before the wait (the scheduler is
 * held), it must not share its batch: the NCCL streams would wait for an event that waits
 * for the batch's own counter write (the fake's event records and waits hold streams back,
 * so that batch never runs and the watchdog ends it). Both run, one group after the other,
 * and a kernel queued after the wait reads the first one's result.
 */
static void test_wait_then_submit_runs_after(void **state)
{
    (void)state;
    static const ccq_device_id d3[1] = {3};
    static float a[NDEV][N], b[NDEV][N], oa[NDEV][N], ob[NDEV][N], wa[N], wb[N];
    char msg[256];

    for (int variant = 0; variant < 2; variant++) {
        ccq_runtime *rt = make_rt(1000);
        cudaStream_t us = fake_user_stream(0);
        ccq_stream_id s2 = variant == 0 ? 0 : 1;
        kernel k = {0};
        pthread_t th;
        init_job job;

        assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
        assert_int_equal(ccq_nccl_bind_stream(rt, 0, 0, us), CCQ_OK);
        if (variant == 1)
            assert_int_equal(ccq_nccl_bind_stream(rt, 0, 1, us), CCQ_OK);
        fill(a, wa, 30u + (uint32_t)variant);
        fill(b, wb, 40u + (uint32_t)variant);
        hold_begin(rt, d3, &th, &job);
        assert_int_equal(ccq_all_reduce(rt, 0, 0, a[0], oa[0], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV),
                         CCQ_OK);
        assert_int_equal(ccq_nccl_stream_wait(rt, 0, 0, us), CCQ_OK);
        k.src = oa[0];
        fake_user_launch(us, kernel_fn, &k);
        assert_int_equal(ccq_all_reduce(rt, 0, s2, b[0], ob[0], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV),
                         CCQ_OK);
        for (ccq_device_id d = 1; d < NDEV; d++) {
            assert_int_equal(
                ccq_all_reduce(rt, d, 0, a[d], oa[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV), CCQ_OK);
            assert_int_equal(
                ccq_all_reduce(rt, d, s2, b[d], ob[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV), CCQ_OK);
        }
        hold_end(th, &job);
        for (ccq_device_id d = 0; d < NDEV; d++) {
            assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_OK);
            assert_int_equal(ccq_sync_collective(rt, d, s2), CCQ_OK);
            if (ref_compare(CCQ_FLOAT32, oa[d], wa, N, msg, sizeof msg) != 0 ||
                ref_compare(CCQ_FLOAT32, ob[d], wb, N, msg, sizeof msg) != 0)
                fail_msg("variant %d device %u: %s", variant, d, msg);
        }
        assert_true(drains(us));
        assert_int_equal(k.runs, 1);
        if (ref_compare(CCQ_FLOAT32, k.seen, wa, N, msg, sizeof msg) != 0)
            fail_msg("the kernel after the wait read: %s", msg);
        long ga = group_of(a[0]), gb = group_of(b[0]);
        assert_true(ga >= 0 && gb >= 0);
        assert_true(gb > ga); /* another group, after */
        assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
        g_rt = NULL;
        fake_reset();
    }
}

/*
 * A command held back by a GPU-side wait whose covered command never runs (a part missing):
 * the watchdog fails it after timeout_ms, and the detail says why (the wait), not only
 * "not issued"; the waiting stream is released. Both reach their deadline at about the same
 * time: when the watchdog fails the covered command first (a slow machine, a sanitizer),
 * the held one is free and runs, which is right too.
 */
static void test_wait_barrier_timeout_detail(void **state)
{
    (void)state;
    static float a[NDEV][N], b[NDEV][N], oa[NDEV][N], ob[NDEV][N];
    ccq_runtime *rt = make_rt(300);
    cudaStream_t us = fake_user_stream(0);

    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    assert_int_equal(ccq_comm_init(rt, P01, 2), CCQ_OK);
    assert_int_equal(ccq_nccl_bind_stream(rt, 0, 0, us), CCQ_OK);
    assert_int_equal(ccq_nccl_bind_stream(rt, 0, 1, us), CCQ_OK);
    /* Device 3 never submits its part of the first all_reduce. */
    for (ccq_device_id d = 0; d + 1 < NDEV; d++)
        assert_int_equal(ccq_all_reduce(rt, d, 0, a[d], oa[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV),
                         CCQ_OK);
    assert_int_equal(ccq_nccl_stream_wait(rt, 0, 0, us), CCQ_OK);
    for (ccq_device_id d = 0; d < 2; d++)
        assert_int_equal(ccq_all_reduce(rt, d, 1, b[d], ob[d], N, CCQ_FLOAT32, CCQ_SUM, P01, 2),
                         CCQ_OK);
    ccq_status held = fence_watchdog(rt, 0, 1, NULL, 0);
    if (held == CCQ_ERR_TIMEOUT && strstr(ccq_last_error_detail(), "GPU-side wait") == NULL)
        fail_msg("detail: %s", ccq_last_error_detail());
    assert_true(held == CCQ_ERR_TIMEOUT || held == CCQ_OK);
    assert_int_equal(fence_watchdog(rt, 0, 0, NULL, 0), CCQ_ERR_TIMEOUT);
    assert_true(drains(us));
    assert_int_equal(fence_watchdog(rt, 1, 1, NULL, 0), held);
    for (ccq_device_id d = 1; d + 1 < NDEV; d++)
        assert_int_equal(fence_watchdog(rt, d, 0, NULL, 0), CCQ_ERR_TIMEOUT);
    assert_int_equal(ccq_nccl_bind_stream(rt, 0, 0, NULL), CCQ_OK);
    assert_int_equal(ccq_nccl_bind_stream(rt, 0, 1, NULL), CCQ_OK);
}

/* Calls of fn on `stream` logged at or after `from`. */
static size_t calls_on(const char *fn, cudaStream_t stream, size_t from)
{
    size_t n = 0;
    for (long i = fake_log_find(fn, from); i >= 0; i = fake_log_find(fn, (size_t)i + 1))
        n += entry((size_t)i).stream == stream;
    return n;
}

/*
 * How a wait is queued, by what its commands reached: all ended, nothing; all launched (the
 * completion event after them recorded), cudaStreamWaitEvent on that event, a dependency
 * CUDA sees; not launched yet (a part missing), the counter wait (CUDA_DEVICE_MAX_CONNECTIONS
 * at its default, 8).
 */
static void test_wait_policy(void **state)
{
    (void)state;
    static float in[NDEV][N], out[NDEV][N], want[N];
    ccq_runtime *rt = make_rt(600000);
    cudaStream_t us = fake_user_stream(0);
    kernel k = {0};
    char msg[256];

    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    fill(in, want, 17);
    /* Ended. */
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 0, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV), CCQ_OK);
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_OK);
    size_t mark = fake_log_size();
    assert_int_equal(ccq_nccl_stream_wait(rt, 0, 0, us), CCQ_OK);
    assert_int_equal(calls_on("cuStreamWaitValue64", us, mark), 0);
    assert_int_equal(calls_on("cudaStreamWaitEvent", us, mark), 0);

    /* Launched, not ended (events complete only when the test says). */
    fake_set_manual_events(true);
    memset(out, 0, sizeof out);
    mark = fake_log_size();
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 0, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV), CCQ_OK);
    for (int i = 0; i < 5000 && fake_log_find("cudaEventRecord", mark) < 0; i++)
        sleep_ms(1);
    long rec = fake_log_find("cudaEventRecord", mark);
    assert_true(rec >= 0);
    sleep_ms(5); /* every stream's event recorded */
    mark = fake_log_size();
    assert_int_equal(ccq_nccl_stream_wait(rt, 0, 0, us), CCQ_OK);
    assert_int_equal(calls_on("cuStreamWaitValue64", us, mark), 0);
    assert_int_equal(calls_on("cudaStreamWaitEvent", us, mark), 1);
    k.src = out[0];
    fake_user_launch(us, kernel_fn, &k);
    sleep_ms(20);
    assert_int_equal(k.runs, 0); /* held by the event */
    fake_complete_events();
    assert_true(drains(us));
    assert_int_equal(k.runs, 1);
    if (ref_compare(CCQ_FLOAT32, k.seen, want, N, msg, sizeof msg) != 0)
        fail_msg("the kernel after the event wait read: %s", msg);
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_OK);
    fake_set_manual_events(false);

    /* Not launched: device 3's part is missing. */
    for (ccq_device_id d = 0; d + 1 < NDEV; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 0, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV), CCQ_OK);
    mark = fake_log_size();
    assert_int_equal(ccq_nccl_stream_wait(rt, 0, 0, us), CCQ_OK);
    assert_int_equal(calls_on("cuStreamWaitValue64", us, mark), 1);
    assert_int_equal(calls_on("cudaStreamWaitEvent", us, mark), 0);
    assert_int_equal(ccq_all_reduce(rt, 3, 0, in[3], out[3], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV),
                     CCQ_OK);
    assert_true(drains(us));
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_OK);
}

/* One device's thread of the documented example (docs/nccl.md): all_reduce, then
 * ccq_nccl_stream_wait on its compute stream, then a kernel there reads the result. */
typedef struct example_thread {
    ccq_runtime *rt;
    ccq_device_id dev;
    cudaStream_t us;
    const float *in;
    float *out;
    kernel k;
    ccq_status st;
} example_thread;

static void *example_main(void *arg)
{
    example_thread *t = arg;
    if (t->dev != 0)
        sleep_ms(50); /* device 0's wait comes before the others' parts */
    t->st = ccq_all_reduce(t->rt, t->dev, 0, t->in, t->out, N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV);
    if (t->st == CCQ_OK)
        t->st = ccq_nccl_stream_wait(t->rt, t->dev, 0, t->us);
    t->k.src = t->out;
    if (t->st == CCQ_OK)
        fake_user_launch(t->us, kernel_fn, &t->k);
    return NULL;
}

/*
 * CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron-LM and TransformerEngine set it): every stream of
 * a device shares one hardware queue, and a counter wait queued before the NCCL work it
 * waits for would hold that work back behind it for good (the fake models the queues). The
 * documented example, one thread per device, must finish: ccq waits on the host until the
 * covered commands are launched, then queues a CUDA-visible event wait.
 */
static void test_wait_with_one_hardware_queue(void **state)
{
    (void)state;
    static float in[NDEV][N], out[NDEV][N], want[N];
    example_thread t[NDEV];
    pthread_t th[NDEV];
    char msg[256];

    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1", 1);
    fake_reset(); /* the fake reads it too */
    ccq_runtime *rt = make_rt(10000);
    unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    fill(in, want, 23);
    for (ccq_device_id d = 0; d < NDEV; d++) {
        t[d] = (example_thread){
            .rt = rt, .dev = d, .us = fake_user_stream((int)d), .in = in[d], .out = out[d]};
        assert_int_equal(pthread_create(&th[d], NULL, example_main, &t[d]), 0);
    }
    for (ccq_device_id d = 0; d < NDEV; d++) {
        assert_int_equal(pthread_join(th[d], NULL), 0);
        assert_int_equal(t[d].st, CCQ_OK);
    }
    for (ccq_device_id d = 0; d < NDEV; d++) {
        if (!drains(t[d].us))
            fail_msg("device %u's compute stream never ran the kernel after its wait (a wait "
                     "holding back its own NCCL work in the one hardware queue)",
                     d);
        assert_int_equal(t[d].k.runs, 1);
        if (ref_compare(CCQ_FLOAT32, t[d].k.seen, want, N, msg, sizeof msg) != 0)
            fail_msg("device %u's kernel after the wait read: %s", d, msg);
        assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_OK);
    }
    assert_int_equal(fake_log_count("cuStreamWaitValue64"), 0); /* host waits, then events */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_wait_holds_back_until_done, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ticket_arithmetic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_release_on_mismatch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_release_on_watchdog_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_release_on_abort, setup, teardown),
        cmocka_unit_test_setup_teardown(test_release_on_undrained_failure, setup, teardown),
        cmocka_unit_test_setup_teardown(test_release_on_shutdown, setup, teardown),
        cmocka_unit_test_setup_teardown(test_release_at_destroy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unsupported_fallback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_waits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fence_values_and_bound_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wait_without_current_context, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wait_then_submit_runs_after, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wait_policy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wait_barrier_timeout_detail, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wait_with_one_hardware_queue, setup, teardown),
    };
    return cmocka_run_group_tests_name("nccl_fence_fake", tests, NULL, NULL);
}
