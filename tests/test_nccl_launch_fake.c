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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_failed_launch_records_after_abort, setup, teardown),
    };
    return cmocka_run_group_tests_name("nccl_launch_fake", tests, NULL, NULL);
}
