/* The NCCL backend's CUDA streams and contexts on user threads, against the fake CUDA/NCCL
 * (tests/fake/): hooks that make a device current on the caller's thread (bind, memory,
 * the no-context fallback of ccq_nccl_stream_wait, destroy) give it back exactly the
 * context it had, none included; binding a stream under CUDA Graph capture is refused;
 * ccq_config.nccl_high_priority creates the communication streams at the device's
 * greatest priority. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <cuda.h>
#include <pthread.h>

#include "ccq.h"
#include "ccq/ccq_nccl.h"
#include "fake/fake_cuda_nccl.h"
#include "test_util.h"

enum { NDEV = 4, N = 64 };

static const ccq_device_id ALL[NDEV] = {0, 1, 2, 3};
static ccq_runtime *g_rt;

static ccq_runtime *make_rt(uint32_t high_priority)
{
    ccq_config cfg;
    ccq_config_init(&cfg);
    cfg.backend = "nccl";
    cfg.max_streams = 4;
    cfg.queue_depth = 8;
    cfg.timeout_ms = 20000;
    cfg.nccl_high_priority = high_priority;
    assert_int_equal(ccq_runtime_create(&cfg, &g_rt), CCQ_OK);
    return g_rt;
}

static int setup(void **state)
{
    (void)state;
    fake_reset();
    fake_context_set(NULL);
    g_rt = NULL;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char msg[256];
    ccq_runtime_destroy(g_rt);
    g_rt = NULL;
    fake_context_set(NULL);
    if (fake_errors(msg, sizeof msg) != 0)
        fail_msg("the fake saw a misuse: %s", msg);
    return 0;
}

/* ---- The caller's context ---- */

typedef struct ctx_job {
    ccq_runtime *rt;
    cudaStream_t us;
    CUcontext before, after;
    ccq_status bind, wait, mem;
} ctx_job;

/* On a thread that never used CUDA (no current context): bind, device memory, and a
 * GPU-side wait whose first try finds no context. */
static void *fresh_thread(void *arg)
{
    ctx_job *j = arg;
    void *p = NULL;
    float x[N] = {0};
    j->before = fake_current_context();
    j->bind = ccq_nccl_bind_stream(j->rt, 1, 0, j->us);
    j->mem = ccq_mem_alloc(j->rt, 2, sizeof x, &p);
    if (j->mem == CCQ_OK)
        j->mem = ccq_mem_copy(j->rt, 2, p, x, sizeof x, CCQ_COPY_TO_DEVICE);
    if (p != NULL)
        ccq_mem_free(j->rt, 2, p);
    fake_script("cuStreamWaitValue64", CUDA_ERROR_INVALID_CONTEXT);
    j->wait = ccq_nccl_stream_wait(j->rt, 3, 1, j->us);
    j->after = fake_current_context();
    return NULL;
}

/*
 * A thread without a context stays without one (cudaGetDevice + cudaSetDevice would have
 * made device 0's primary context current there); a thread whose current context is not a
 * primary one keeps it (cudaSetDevice would have replaced it by the primary one); the
 * runtime's destroy leaves its caller's context as it found it.
 */
static void test_hooks_keep_callers_context(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(0);
    pthread_t th;
    ctx_job j = {.rt = rt, .us = fake_user_stream(1)};

    assert_int_equal(pthread_create(&th, NULL, fresh_thread, &j), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(j.bind, CCQ_OK);
    assert_int_equal(j.mem, CCQ_OK);
    assert_int_equal(j.wait, CCQ_OK);
    assert_null(j.before);
    if (j.after != NULL)
        fail_msg("a thread without a CUDA context got one from ccq's hooks");

    /* A non-primary context of device 2, current on this thread. */
    CUcontext mine = fake_context_create(2);
    fake_context_set(mine);
    assert_int_equal(ccq_nccl_bind_stream(rt, 0, 1, fake_user_stream(0)), CCQ_OK);
    assert_ptr_equal(fake_current_context(), mine);
    void *p = NULL;
    assert_int_equal(ccq_mem_alloc(rt, 1, 64, &p), CCQ_OK);
    ccq_mem_free(rt, 1, p);
    assert_ptr_equal(fake_current_context(), mine);
    assert_int_equal(ccq_nccl_bind_stream(rt, 0, 1, NULL), CCQ_OK);
    assert_int_equal(ccq_nccl_bind_stream(rt, 1, 0, NULL), CCQ_OK);

    /* Destroy, from this thread: its context is put back after the streams are released. */
    static float in[NDEV][N], out[NDEV][N];
    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 0, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV), CCQ_OK);
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_OK);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
    g_rt = NULL;
    assert_ptr_equal(fake_current_context(), mine);
}

/* ---- CUDA Graph capture ---- */

static void test_bind_refuses_capturing_stream(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(0);
    cudaStream_t us = fake_user_stream(0);

    fake_set_capturing(us, true);
    assert_int_equal(ccq_nccl_bind_stream(rt, 0, 0, us), CCQ_ERR_UNSUPPORTED);
    assert_non_null(strstr(ccq_last_error_detail(), "CUDA Graph"));
    assert_int_equal(fake_live("event"), 0); /* refused before anything was made */
    fake_set_capturing(us, false);
    assert_int_equal(ccq_nccl_bind_stream(rt, 0, 0, us), CCQ_OK);
    assert_int_equal(ccq_nccl_bind_stream(rt, 0, 0, NULL), CCQ_OK); /* unbinding never asks */
}

/* ---- Stream priority ---- */

/* The communication streams ccq created, and how (fn of the creating call). */
static size_t comm_streams(const char *fn, cudaStream_t *out, size_t max)
{
    size_t n = 0;
    for (long i = fake_log_find(fn, 0); i >= 0; i = fake_log_find(fn, (size_t)i + 1)) {
        fake_call c;
        assert_true(fake_log_get((size_t)i, &c));
        if (c.result == cudaSuccess && n < max)
            out[n++] = c.stream;
    }
    return n;
}

static void run_all_reduce(ccq_runtime *rt)
{
    static float in[NDEV][N], out[NDEV][N];
    assert_int_equal(ccq_comm_init(rt, ALL, NDEV), CCQ_OK);
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 2, in[d], out[d], N, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV), CCQ_OK);
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 2), CCQ_OK);
}

static void test_high_priority_streams(void **state)
{
    (void)state;
    cudaStream_t s[16];

    /* Default: ordinary streams. */
    run_all_reduce(make_rt(0));
    assert_int_equal(comm_streams("cudaStreamCreateWithFlags", s, 16), NDEV);
    assert_int_equal(comm_streams("cudaStreamCreateWithPriority", s, 16), 0);
    assert_int_equal(ccq_runtime_destroy(g_rt), CCQ_OK);
    g_rt = NULL;

    /* nccl_high_priority = 1: the device's greatest priority (the fake's is -5). */
    fake_reset();
    run_all_reduce(make_rt(1));
    assert_int_equal(comm_streams("cudaStreamCreateWithFlags", s, 16), 0);
    assert_int_equal(comm_streams("cudaStreamCreateWithPriority", s, 16), NDEV);
    for (int i = 0; i < NDEV; i++)
        assert_int_equal(fake_stream_priority(s[i]), -5);
    /* Asked once per device, not per stream. */
    assert_int_equal(fake_log_count("cudaDeviceGetStreamPriorityRange"), NDEV);
    assert_int_equal(ccq_runtime_destroy(g_rt), CCQ_OK);
    g_rt = NULL;

    /* The environment variable, and a malformed value. */
    fake_reset();
    ccq_config cfg;
    setenv("CCQ_NCCL_HIGH_PRIORITY", "1", 1);
    ccq_config_init(&cfg);
    assert_int_equal(cfg.nccl_high_priority, 1);
    setenv("CCQ_NCCL_HIGH_PRIORITY", "2", 1);
    ccq_config_init(&cfg);
    cfg.backend = "nccl";
    assert_int_equal(ccq_runtime_create(&cfg, &g_rt), CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(ccq_last_error_detail(), "CCQ_NCCL_HIGH_PRIORITY"));
    unsetenv("CCQ_NCCL_HIGH_PRIORITY");
    ccq_config_init(&cfg);
    cfg.nccl_high_priority = 7;
    cfg.backend = "nccl";
    assert_int_equal(ccq_runtime_create(&cfg, &g_rt), CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(ccq_last_error_detail(), "nccl_high_priority"));
    g_rt = NULL;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_hooks_keep_callers_context, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bind_refuses_capturing_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_high_priority_streams, setup, teardown),
    };
    return cmocka_run_group_tests_name("nccl_streams_fake", tests, NULL, NULL);
}
