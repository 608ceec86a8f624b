/* Non-blocking NCCL launches against the fake CUDA/NCCL (tests/fake/): a group whose
 * ncclGroupEnd returned ncclInProgress is still being enqueued by NCCL's launch thread, so
 * a failed batch's completion events are recorded only once every communicator left
 * ncclInProgress or finished its abort (an event recorded before would complete ahead of
 * the group's kernels and hand the buffers back too early). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <pthread.h>

#include "ccq.h"
#include "fake/fake_cuda_nccl.h"
#include "test_util.h"

enum { NDEV = 4, N = 64 };

static const ccq_device_id ALL[NDEV] = {0, 1, 2, 3};
static ccq_runtime *g_rt;

static ccq_runtime *make_rt(uint64_t timeout_ms)
{
    ccq_config cfg;
    ccq_config_init(&cfg);
    cfg.backend = "nccl";
    cfg.max_streams = 4;
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
    fake_hold_abort(false); /* a failed check must not leave destroy waiting for an abort */
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

/*
 * The watchdog aborts a batch whose launch never leaves ncclInProgress (a peer that never
 * connects, say). Its completion events must not be recorded while NCCL's launch thread may
 * still enqueue the group's kernels: only after every communicator's abort (which joins
 * that thread) finished. The fake counts an event recorded on a stream of a launching group
 * as a misuse (teardown checks).
 */
static void test_failed_launch_records_after_abort(void **state)
{
    (void)state;
    static float in[NDEV][N], out[NDEV][N];
    ccq_runtime *rt = make_rt(300);

    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    fake_set_pending(1000000000);
    fake_script("ncclGroupEnd", ncclInProgress);
    size_t mark = fake_log_size();
    /* Aborts block (as NCCL's reclaim can) so the scheduler sees the failure first. */
    fake_hold_abort(true);
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 0, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV), CCQ_OK);
    for (int i = 0; i < 5000 && fake_aborts_blocked() == 0; i++)
        sleep_ms(1);
    assert_int_equal(fake_aborts_blocked(), 1);
    sleep_ms(50); /* the scheduler polls the failed batch meanwhile */
    assert_true(fake_log_find("cudaEventRecord", mark) < 0);
    fake_hold_abort(false);
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(fence_watchdog(rt, d, 0, NULL, 0), CCQ_ERR_ABORTED);
    /* Every completion event after the last abort. */
    long last_abort = -1;
    for (long i = fake_log_find("ncclCommAbort", mark); i >= 0;
         i = fake_log_find("ncclCommAbort", (size_t)i + 1))
        last_abort = i;
    assert_true(last_abort >= 0);
    size_t records = 0;
    for (long i = fake_log_find("cudaEventRecord", mark); i >= 0;
         i = fake_log_find("cudaEventRecord", (size_t)i + 1)) {
        assert_true(i > last_abort);
        assert_int_equal(entry((size_t)i).result, cudaSuccess);
        records++;
    }
    assert_int_equal(records, NDEV); /* one per stream of the batch */
}

/* Wait (bounded) until fn has been logged at least n times. */
static void wait_calls(const char *fn, size_t n)
{
    for (int i = 0; i < 10000 && fake_log_count(fn) < n; i++)
        sleep_ms(1);
    assert_true(fake_log_count(fn) >= n);
}

/*
 * A batch on {1,2} waits for {0,1}'s launch, which does not finish (ncclInProgress: a peer
 * that is slow to connect, say): the scheduler keeps serving everything else meanwhile (an
 * all_reduce on {3} completes at once), and launches {1,2} at a poll once {0,1}'s launch
 * finished. Before, it slept in 100 us steps inside issue until then (or timeout_ms).
 */
static void test_waiting_launch_does_not_block_scheduler(void **state)
{
    (void)state;
    static const ccq_device_id p01[2] = {0, 1}, p12[2] = {1, 2}, d3[1] = {3};
    static float in[3][NDEV][N], out[3][NDEV][N];
    ccq_runtime *rt = make_rt(5000);

    assert_int_equal(ccq_comm_init(rt, p01, 2), CCQ_OK);
    assert_int_equal(ccq_comm_init(rt, p12, 2), CCQ_OK);
    assert_int_equal(ccq_comm_init(rt, d3, 1), CCQ_OK);
    for (int j = 0; j < 3; j++)
        for (int d = 0; d < NDEV; d++)
            for (int k = 0; k < N; k++)
                in[j][d][k] = (float)(100 * j + 10 * d + k);
    fake_set_pending(1);
    fake_script("ncclGroupEnd", ncclInProgress);
    fake_hold_async(true); /* {0,1}'s launch does not finish */
    fake_log_reset();
    for (ccq_device_id d = 0; d < 2; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 0, in[0][d], out[0][d], N, CCQ_FLOAT32, CCQ_SUM, p01, 2), CCQ_OK);
    wait_calls("ncclCommGetAsyncError", 1);
    for (ccq_device_id d = 1; d < 3; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 1, in[1][d], out[1][d], N, CCQ_FLOAT32, CCQ_SUM, p12, 2), CCQ_OK);
    sleep_ms(20); /* issued: waiting for {0,1}'s launch */
    uint64_t t0 = now_ns();
    assert_int_equal(ccq_all_reduce(rt, 3, 2, in[2][3], out[2][3], N, CCQ_FLOAT32, CCQ_SUM, d3, 1),
                     CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 3, 2), CCQ_OK);
    uint64_t ms = (now_ns() - t0) / 1000000u;
    if (ms > 1000)
        fail_msg("an all_reduce on an idle device took %llu ms while another batch waited for a "
                 "launch (the scheduler was blocked)",
                 (unsigned long long)ms);
    assert_int_equal(fake_log_count("ncclAllReduce"), 3); /* {0,1}'s two and {3}'s */
    fake_hold_async(false);
    for (ccq_device_id d = 0; d < 2; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_OK);
    for (ccq_device_id d = 1; d < 3; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 1), CCQ_OK);
    for (int k = 0; k < N; k++) {
        assert_true(out[0][0][k] == in[0][0][k] + in[0][1][k]);
        assert_true(out[1][2][k] == in[1][1][k] + in[1][2][k]);
        assert_true(out[2][3][k] == in[2][3][k]);
    }
}

/*
 * The earlier launch never finishes: the watchdog aborts it timeout_ms after its issue, and
 * the batch waiting for it then launches (only once the aborts finished: until then NCCL's
 * launch thread may still enqueue kernels on the shared device) and completes.
 */
static void test_waiting_launch_after_abort(void **state)
{
    (void)state;
    static const ccq_device_id p01[2] = {0, 1}, p12[2] = {1, 2};
    static float in[NDEV][N], out[NDEV][N], in1[N], out1[N];
    ccq_runtime *rt = make_rt(500);

    assert_int_equal(ccq_comm_init(rt, p01, 2), CCQ_OK);
    assert_int_equal(ccq_comm_init(rt, p12, 2), CCQ_OK);
    fake_set_pending(1000000000);
    fake_script("ncclGroupEnd", ncclInProgress);
    fake_log_reset();
    for (ccq_device_id d = 0; d < 2; d++)
        assert_int_equal(ccq_all_reduce(rt, d, 0, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, p01, 2),
                         CCQ_OK);
    wait_calls("ncclCommGetAsyncError", 1);
    fake_set_pending(0);
    /* Well after {0,1}'s issue, so its watchdog fires long before this batch's. */
    sleep_ms(250);
    for (int k = 0; k < N; k++)
        in1[k] = in[2][k] = (float)k;
    assert_int_equal(ccq_all_reduce(rt, 1, 1, in1, out1, N, CCQ_FLOAT32, CCQ_SUM, p12, 2), CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 2, 1, in[2], out[2], N, CCQ_FLOAT32, CCQ_SUM, p12, 2),
                     CCQ_OK);
    for (ccq_device_id d = 0; d < 2; d++)
        assert_int_equal(fence_watchdog(rt, d, 0, NULL, 0), CCQ_ERR_ABORTED);
    for (ccq_device_id d = 1; d < 3; d++)
        assert_int_equal(fence_watchdog(rt, d, 1, NULL, 0), CCQ_OK);
    for (int k = 0; k < N; k++)
        assert_true(out[2][k] == 2.0f * (float)k && out1[k] == out[2][k]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_failed_launch_records_after_abort, setup, teardown),
        cmocka_unit_test_setup_teardown(test_waiting_launch_does_not_block_scheduler, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_waiting_launch_after_abort, setup, teardown),
    };
    return cmocka_run_group_tests_name("nccl_launch_fake", tests, NULL, NULL);
}
