/* Errors (DESIGN rule 6): argument errors refused with nothing queued and a detail;
 * configuration and environment; status and dtype tables; mismatch, missing rank and
 * backpressure reported as the contract says. */
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
#include <sys/resource.h>
#include <time.h>

#include "ccq.h"
#include "ref.h"
#include "runtime/internal.h"

static ccq_runtime *make_rt_cfg(const ccq_config *cfg)
{
    ccq_runtime *rt = NULL;
    ccq_status st = ccq_runtime_create(cfg, &rt);
    if (st != CCQ_OK)
        fail_msg("ccq_runtime_create: %s: %s", ccq_status_name(st), ccq_last_error_detail());
    assert_non_null(rt);
    return rt;
}

static ccq_runtime *make_rt(uint32_t devices, uint64_t timeout_ms)
{
    ccq_config cfg;
    ccq_config_init(&cfg);
    cfg.host_devices = devices;
    cfg.timeout_ms = timeout_ms;
    return make_rt_cfg(&cfg);
}

/*
 * A refused call: the status, a non-empty detail containing `want` (the argument or value
 * it names), and nothing queued (the submitted count does not move).
 */
static void check_refused(ccq_runtime *rt, ccq_status got, ccq_status want_status, const char *want,
                          const char *what, uint64_t before)
{
    char detail[CCQ_DETAIL_LEN];
    snprintf(detail, sizeof detail, "%s", ccq_last_error_detail());
    if (got != want_status)
        fail_msg("%s: got %s, want %s (detail: %s)", what, ccq_status_name(got),
                 ccq_status_name(want_status), detail);
    if (detail[0] == '\0')
        fail_msg("%s: empty ccq_last_error_detail()", what);
    if (strstr(detail, want) == NULL)
        fail_msg("%s: detail does not mention \"%s\": %s", what, want, detail);
    if (rt != NULL && stats_of(rt).submitted != before)
        fail_msg("%s: refused call queued a command", what);
}

#define REFUSED(rt, call, status, want)                                                            \
    do {                                                                                           \
        uint64_t before_ = (rt) != NULL ? stats_of(rt).submitted : 0;                              \
        check_refused((rt), (call), (status), (want), #call, before_);                             \
    } while (0)

/* Run one all_reduce on every rank of `devs` (stream s) and check the result. */
static void run_good_allreduce(ccq_runtime *rt, const ccq_device_id *devs, uint32_t n,
                               ccq_stream_id s, uint32_t seed)
{
    enum { N = 257, MAXN = 8 };
    int32_t in[MAXN][N], out[MAXN][N], want[N];
    const void *inputs[MAXN];
    char msg[256];

    assert_true(n <= MAXN);
    for (uint32_t r = 0; r < n; r++) {
        ref_fill(CCQ_INT32, in[r], N, seed + r);
        inputs[r] = in[r];
        memset(out[r], 0x5a, sizeof out[r]);
    }
    /* Inputs indexed by rank: ref wants them in sorted device order. */
    ccq_device_id sorted[MAXN];
    memcpy(sorted, devs, n * sizeof *devs);
    for (uint32_t i = 1; i < n; i++)
        for (uint32_t j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
            ccq_device_id t = sorted[j];
            sorted[j] = sorted[j - 1];
            sorted[j - 1] = t;
        }
    ref_allreduce(CCQ_INT32, CCQ_SUM, n, inputs, want, N);
    for (uint32_t r = 0; r < n; r++)
        assert_int_equal(
            ccq_all_reduce(rt, sorted[r], s, in[r], out[r], N, CCQ_INT32, CCQ_SUM, devs, n),
            CCQ_OK);
    for (uint32_t r = 0; r < n; r++) {
        ccq_status st = ccq_sync_collective(rt, sorted[r], s);
        if (st != CCQ_OK)
            fail_msg("fence device %u: %s: %s", sorted[r], ccq_status_name(st),
                     ccq_last_error_detail());
    }
    for (uint32_t r = 0; r < n; r++) {
        size_t bad = ref_compare(CCQ_INT32, out[r], want, N, msg, sizeof msg);
        if (bad != 0)
            fail_msg("rank %u: %zu wrong, first: %s", r, bad, msg);
    }
}

/* Every argument error of ccq_all_reduce. */
static void test_allreduce_argument_errors(void **state)
{
    (void)state;
    ccq_config cfg;
    ccq_config_init(&cfg);
    cfg.host_devices = 4;
    cfg.max_streams = 8;
    ccq_runtime *rt = make_rt_cfg(&cfg);
    ccq_device_id all[4] = {0, 1, 2, 3};
    float buf[64];
    float *src = buf, *dst = buf + 32;
    const size_t n = 16;

    memset(buf, 0, sizeof buf);
    assert_int_equal(ccq_comm_init(rt, all, 4), CCQ_OK);

    REFUSED(NULL, ccq_all_reduce(NULL, 0, 0, src, dst, n, CCQ_FLOAT32, CCQ_SUM, all, 4),
            CCQ_ERR_INVALID_ARGUMENT, "rt");
    REFUSED(rt, ccq_all_reduce(rt, 4, 0, src, dst, n, CCQ_FLOAT32, CCQ_SUM, all, 4),
            CCQ_ERR_INVALID_ARGUMENT, "device 4");
    REFUSED(rt, ccq_all_reduce(rt, UINT32_MAX, 0, src, dst, n, CCQ_FLOAT32, CCQ_SUM, all, 4),
            CCQ_ERR_INVALID_ARGUMENT, "device");
    REFUSED(rt, ccq_all_reduce(rt, 0, 8, src, dst, n, CCQ_FLOAT32, CCQ_SUM, all, 4),
            CCQ_ERR_INVALID_ARGUMENT, "stream 8");
    REFUSED(rt, ccq_all_reduce(rt, 0, UINT32_MAX, src, dst, n, CCQ_FLOAT32, CCQ_SUM, all, 4),
            CCQ_ERR_INVALID_ARGUMENT, "stream");
    REFUSED(rt, ccq_all_reduce(rt, 0, 0, src, dst, n, CCQ_DTYPE_COUNT_, CCQ_SUM, all, 4),
            CCQ_ERR_INVALID_ARGUMENT, "dtype");
    REFUSED(rt, ccq_all_reduce(rt, 0, 0, src, dst, n, (ccq_dtype)-1, CCQ_SUM, all, 4),
            CCQ_ERR_INVALID_ARGUMENT, "dtype");
    REFUSED(rt, ccq_all_reduce(rt, 0, 0, src, dst, n, (ccq_dtype)1000, CCQ_SUM, all, 4),
            CCQ_ERR_INVALID_ARGUMENT, "dtype");
    REFUSED(rt, ccq_all_reduce(rt, 0, 0, src, dst, n, CCQ_FLOAT32, CCQ_REDUCE_OP_COUNT_, all, 4),
            CCQ_ERR_INVALID_ARGUMENT, "op");
    REFUSED(rt, ccq_all_reduce(rt, 0, 0, src, dst, n, CCQ_FLOAT32, (ccq_reduce_op)-1, all, 4),
            CCQ_ERR_INVALID_ARGUMENT, "op");
    /* Byte sizes that overflow: SIZE_MAX / 2 floats is 2 * SIZE_MAX bytes. */
    REFUSED(rt, ccq_all_reduce(rt, 0, 0, src, dst, SIZE_MAX / 2, CCQ_FLOAT32, CCQ_SUM, all, 4),
            CCQ_ERR_INVALID_ARGUMENT, "count");
    REFUSED(rt, ccq_all_reduce(rt, 0, 0, src, dst, SIZE_MAX, CCQ_INT8, CCQ_SUM, all, 4),
            CCQ_ERR_INVALID_ARGUMENT, "count");
    REFUSED(rt, ccq_all_reduce(rt, 0, 0, src, dst, SIZE_MAX / 8 + 1, CCQ_FLOAT64, CCQ_SUM, all, 4),
            CCQ_ERR_INVALID_ARGUMENT, "count");
    REFUSED(rt, ccq_all_reduce(rt, 0, 0, NULL, dst, n, CCQ_FLOAT32, CCQ_SUM, all, 4),
            CCQ_ERR_INVALID_ARGUMENT, "src");
    REFUSED(rt, ccq_all_reduce(rt, 0, 0, src, NULL, n, CCQ_FLOAT32, CCQ_SUM, all, 4),
            CCQ_ERR_INVALID_ARGUMENT, "dst");
    REFUSED(rt, ccq_all_reduce(rt, 0, 0, NULL, NULL, 1, CCQ_FLOAT32, CCQ_SUM, all, 4),
            CCQ_ERR_INVALID_ARGUMENT, "NULL");
    /* Partial overlaps in both directions, by one element and by one byte. */
    REFUSED(rt, ccq_all_reduce(rt, 0, 0, buf, buf + 1, n, CCQ_FLOAT32, CCQ_SUM, all, 4),
            CCQ_ERR_INVALID_ARGUMENT, "overlap");
    REFUSED(rt, ccq_all_reduce(rt, 0, 0, buf + 1, buf, n, CCQ_FLOAT32, CCQ_SUM, all, 4),
            CCQ_ERR_INVALID_ARGUMENT, "overlap");
    REFUSED(rt,
            ccq_all_reduce(rt, 0, 0, buf, (char *)buf + n * sizeof(float) - 1, n, CCQ_FLOAT32,
                           CCQ_SUM, all, 4),
            CCQ_ERR_INVALID_ARGUMENT, "overlap");
    /* Device sets. */
    ccq_device_id dup[4] = {0, 1, 1, 3}, unknown[4] = {0, 1, 2, 7}, three[3] = {1, 2, 3};
    ccq_device_id never[3] = {0, 1, 2};
    REFUSED(rt, ccq_all_reduce(rt, 0, 0, src, dst, n, CCQ_FLOAT32, CCQ_SUM, NULL, 4),
            CCQ_ERR_INVALID_ARGUMENT, "devices");
    REFUSED(rt, ccq_all_reduce(rt, 0, 0, src, dst, n, CCQ_FLOAT32, CCQ_SUM, all, 0),
            CCQ_ERR_INVALID_ARGUMENT, "n == 0");
    REFUSED(rt, ccq_all_reduce(rt, 0, 0, src, dst, n, CCQ_FLOAT32, CCQ_SUM, dup, 4),
            CCQ_ERR_INVALID_ARGUMENT, "device 1");
    REFUSED(rt, ccq_all_reduce(rt, 0, 0, src, dst, n, CCQ_FLOAT32, CCQ_SUM, all, 5),
            CCQ_ERR_INVALID_ARGUMENT, "devices");
    REFUSED(rt, ccq_all_reduce(rt, 0, 0, src, dst, n, CCQ_FLOAT32, CCQ_SUM, unknown, 4),
            CCQ_ERR_INVALID_ARGUMENT, "7");
    REFUSED(rt, ccq_all_reduce(rt, 0, 0, src, dst, n, CCQ_FLOAT32, CCQ_SUM, three, 3),
            CCQ_ERR_INVALID_ARGUMENT, "device 0");
    REFUSED(rt, ccq_all_reduce(rt, 0, 0, src, dst, n, CCQ_FLOAT32, CCQ_SUM, never, 3),
            CCQ_ERR_NOT_INITIALIZED, "ccq_comm_init");

    /* Nothing was queued and no sequence number was used: a real collective still matches
     * across ranks, in place (src == dst is fine) and out of place. */
    assert_int_equal(stats_of(rt).submitted, 0);
    run_good_allreduce(rt, all, 4, 0, 11);
    float v[4][8];
    for (int d = 0; d < 4; d++) {
        for (int i = 0; i < 8; i++)
            v[d][i] = (float)(d + i);
        assert_int_equal(
            ccq_all_reduce(rt, (ccq_device_id)d, 7, v[d], v[d], 8, CCQ_FLOAT32, CCQ_MAX, all, 4),
            CCQ_OK);
    }
    for (int d = 0; d < 4; d++)
        assert_int_equal(ccq_sync_collective(rt, (ccq_device_id)d, 7), CCQ_OK);
    for (int d = 0; d < 4; d++)
        for (int i = 0; i < 8; i++)
            assert_true(v[d][i] == (float)(3 + i));
    /* count == 0 needs no buffers. */
    for (int d = 0; d < 4; d++)
        assert_int_equal(
            ccq_all_reduce(rt, (ccq_device_id)d, 1, NULL, NULL, 0, CCQ_FLOAT32, CCQ_SUM, all, 4),
            CCQ_OK);
    for (int d = 0; d < 4; d++)
        assert_int_equal(ccq_sync_collective(rt, (ccq_device_id)d, 1), CCQ_OK);
    ccq_stats st = stats_of(rt);
    assert_int_equal(st.submitted, 12);
    assert_int_equal(st.completed, 12);
    assert_int_equal(st.failed, 0);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

/* Every argument error of ccq_send and ccq_recv. */
static void test_sendrecv_argument_errors(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(4, 600000);
    int32_t a[16], b[16];

    for (int i = 0; i < 16; i++)
        a[i] = i * 3;
    memset(b, 0, sizeof b);
    REFUSED(NULL, ccq_send(NULL, 0, 0, a, 16, CCQ_INT32, 1), CCQ_ERR_INVALID_ARGUMENT, "rt");
    REFUSED(NULL, ccq_recv(NULL, 1, 0, b, 16, CCQ_INT32, 0), CCQ_ERR_INVALID_ARGUMENT, "rt");
    REFUSED(rt, ccq_send(rt, 4, 0, a, 16, CCQ_INT32, 1), CCQ_ERR_INVALID_ARGUMENT, "device 4");
    REFUSED(rt, ccq_recv(rt, 4, 0, b, 16, CCQ_INT32, 0), CCQ_ERR_INVALID_ARGUMENT, "device 4");
    REFUSED(rt, ccq_send(rt, 0, 64, a, 16, CCQ_INT32, 1), CCQ_ERR_INVALID_ARGUMENT, "stream 64");
    REFUSED(rt, ccq_recv(rt, 1, 64, b, 16, CCQ_INT32, 0), CCQ_ERR_INVALID_ARGUMENT, "stream 64");
    REFUSED(rt, ccq_send(rt, 0, 0, a, 16, CCQ_DTYPE_COUNT_, 1), CCQ_ERR_INVALID_ARGUMENT, "dtype");
    REFUSED(rt, ccq_recv(rt, 1, 0, b, 16, (ccq_dtype)-3, 0), CCQ_ERR_INVALID_ARGUMENT, "dtype");
    REFUSED(rt, ccq_send(rt, 0, 0, a, SIZE_MAX / 2, CCQ_FLOAT32, 1), CCQ_ERR_INVALID_ARGUMENT,
            "count");
    REFUSED(rt, ccq_recv(rt, 1, 0, b, SIZE_MAX / 2, CCQ_FLOAT32, 0), CCQ_ERR_INVALID_ARGUMENT,
            "count");
    REFUSED(rt, ccq_send(rt, 0, 0, NULL, 16, CCQ_INT32, 1), CCQ_ERR_INVALID_ARGUMENT, "src");
    REFUSED(rt, ccq_recv(rt, 1, 0, NULL, 16, CCQ_INT32, 0), CCQ_ERR_INVALID_ARGUMENT, "dst");
    REFUSED(rt, ccq_send(rt, 0, 0, a, 16, CCQ_INT32, 4), CCQ_ERR_INVALID_ARGUMENT, "peer");
    REFUSED(rt, ccq_recv(rt, 1, 0, b, 16, CCQ_INT32, UINT32_MAX), CCQ_ERR_INVALID_ARGUMENT, "peer");
    assert_int_equal(stats_of(rt).submitted, 0);

    /* No sequence number was used: the first real pair matches. */
    assert_int_equal(ccq_send(rt, 0, 0, a, 16, CCQ_INT32, 1), CCQ_OK);
    assert_int_equal(ccq_recv(rt, 1, 0, b, 16, CCQ_INT32, 0), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 0, 0), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 1, 0), CCQ_OK);
    assert_memory_equal(a, b, sizeof a);
    ccq_stats st = stats_of(rt);
    assert_int_equal(st.submitted, 2);
    assert_int_equal(st.completed, 2);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

/* ccq_comm_init refuses bad sets; a good set in any order is one communicator. */
static void test_comm_init_errors(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(4, 600000);
    ccq_device_id dup[3] = {2, 0, 2}, unknown[2] = {1, 4}, all[4] = {0, 1, 2, 3};
    ccq_device_id rev[4] = {3, 2, 1, 0};

    REFUSED(NULL, ccq_comm_init(NULL, all, 4), CCQ_ERR_INVALID_ARGUMENT, "rt");
    REFUSED(rt, ccq_comm_init(rt, NULL, 4), CCQ_ERR_INVALID_ARGUMENT, "devices");
    REFUSED(rt, ccq_comm_init(rt, all, 0), CCQ_ERR_INVALID_ARGUMENT, "n == 0");
    REFUSED(rt, ccq_comm_init(rt, dup, 3), CCQ_ERR_INVALID_ARGUMENT, "device 2");
    REFUSED(rt, ccq_comm_init(rt, unknown, 2), CCQ_ERR_INVALID_ARGUMENT, "4");
    REFUSED(rt, ccq_comm_init(rt, all, 5), CCQ_ERR_INVALID_ARGUMENT, "devices");
    /* The refused sets were not created. */
    ccq_device_id two[2] = {0, 2};
    int32_t x[4] = {0};
    REFUSED(rt, ccq_all_reduce(rt, 0, 0, x, x, 4, CCQ_INT32, CCQ_SUM, two, 2),
            CCQ_ERR_NOT_INITIALIZED, "{0,2}");
    assert_int_equal(ccq_comm_init(rt, all, 4), CCQ_OK);
    assert_int_equal(ccq_comm_init(rt, rev, 4), CCQ_OK); /* same set: a no-op */
    run_good_allreduce(rt, rev, 4, 3, 5);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

static void check_bad_config(const ccq_config *cfg, ccq_status want, const char *mention)
{
    ccq_runtime *rt = (ccq_runtime *)(uintptr_t)1; /* must come back NULL */
    ccq_status st = ccq_runtime_create(cfg, &rt);
    const char *d = ccq_last_error_detail();
    if (st != want)
        fail_msg("config (%s): got %s, want %s: %s", mention, ccq_status_name(st),
                 ccq_status_name(want), d);
    assert_null(rt);
    if (d[0] == '\0' || strstr(d, mention) == NULL)
        fail_msg("config: detail does not mention \"%s\": %s", mention, d);
}

/* Configuration fields are validated by ccq_runtime_create. */
static void test_config_errors(void **state)
{
    (void)state;
    ccq_config cfg;

    assert_int_equal(ccq_runtime_create(NULL, NULL), CCQ_ERR_INVALID_ARGUMENT);
    assert_true(ccq_last_error_detail()[0] != '\0');

    ccq_config_init(&cfg);
    assert_int_equal(cfg.struct_size, sizeof cfg);
    cfg.struct_size = 0;
    check_bad_config(&cfg, CCQ_ERR_INVALID_ARGUMENT, "struct_size");
    cfg.struct_size = 3;
    check_bad_config(&cfg, CCQ_ERR_INVALID_ARGUMENT, "struct_size");
    cfg.struct_size = sizeof cfg + 8;
    check_bad_config(&cfg, CCQ_ERR_INVALID_ARGUMENT, "struct_size");

    ccq_config_init(&cfg);
    cfg.host_devices = 0;
    check_bad_config(&cfg, CCQ_ERR_INVALID_ARGUMENT, "host_devices");
    ccq_config_init(&cfg);
    cfg.max_streams = 0;
    check_bad_config(&cfg, CCQ_ERR_INVALID_ARGUMENT, "max_streams");
    ccq_config_init(&cfg);
    cfg.queue_depth = 0;
    check_bad_config(&cfg, CCQ_ERR_INVALID_ARGUMENT, "queue_depth");
    ccq_config_init(&cfg);
    cfg.max_batch_ops = 0;
    check_bad_config(&cfg, CCQ_ERR_INVALID_ARGUMENT, "max_batch_ops");
    ccq_config_init(&cfg);
    cfg.backend = "tpu";
    check_bad_config(&cfg, CCQ_ERR_INVALID_ARGUMENT, "tpu");
    ccq_config_init(&cfg);
    cfg.backend = NULL;
    check_bad_config(&cfg, CCQ_ERR_INVALID_ARGUMENT, "backend");
    ccq_config_init(&cfg);
    cfg.flags = 0x80u;
    check_bad_config(&cfg, CCQ_ERR_INVALID_ARGUMENT, "flags");
    ccq_config_init(&cfg);
    cfg.flags = CCQ_FLAG_NONBLOCKING_SUBMIT | 0x100u;
    check_bad_config(&cfg, CCQ_ERR_INVALID_ARGUMENT, "flags");

    /* "nccl": unsupported when not built in; when it is, this machine may still run it. */
    ccq_runtime *rt = NULL;
    ccq_config_init(&cfg);
    cfg.backend = "nccl";
    ccq_status st = ccq_runtime_create(&cfg, &rt);
    if (st == CCQ_OK) {
        print_message("nccl backend available here: unsupported-backend check skipped\n");
        assert_string_equal(ccq_backend_name(rt), "nccl");
        assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
    } else {
        assert_int_equal(st, CCQ_ERR_UNSUPPORTED);
        assert_null(rt);
        assert_non_null(strstr(ccq_last_error_detail(), "nccl"));
    }

    /* The defaults, and NULL meaning the defaults. */
    ccq_config_init(&cfg);
    assert_string_equal(cfg.backend, "host");
    assert_int_equal(cfg.host_devices, 4);
    assert_int_equal(cfg.max_streams, 64);
    assert_int_equal(cfg.queue_depth, 1024);
    assert_int_equal(cfg.max_batch_ops, 256);
    assert_int_equal(cfg.timeout_ms, 600000);
    assert_int_equal(cfg.flags, 0);
    assert_null(cfg.env_error);
    rt = NULL;
    assert_int_equal(ccq_runtime_create(NULL, &rt), CCQ_OK);
    assert_int_equal(ccq_device_count(rt), 4);
    assert_string_equal(ccq_backend_name(rt), "host");
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
    assert_int_equal(ccq_device_count(NULL), 0);
    assert_string_equal(ccq_backend_name(NULL), "");

    /* ccq_get_stats validates its output. */
    rt = make_rt(2, 600000);
    ccq_stats stats;
    memset(&stats, 0, sizeof stats);
    assert_int_equal(ccq_get_stats(rt, &stats), CCQ_ERR_INVALID_ARGUMENT); /* struct_size 0 */
    stats.struct_size = sizeof stats + 1;
    assert_int_equal(ccq_get_stats(rt, &stats), CCQ_ERR_INVALID_ARGUMENT);
    stats.struct_size = sizeof stats;
    assert_int_equal(ccq_get_stats(NULL, &stats), CCQ_ERR_INVALID_ARGUMENT);
    assert_int_equal(ccq_get_stats(rt, NULL), CCQ_ERR_INVALID_ARGUMENT);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

static const char *const env_names[] = {
    "CCQ_BACKEND",           "CCQ_HOST_DEVICES", "CCQ_MAX_STREAMS",        "CCQ_QUEUE_DEPTH",
    "CCQ_MAX_BATCH_OPS",     "CCQ_TIMEOUT_MS",   "CCQ_NONBLOCKING_SUBMIT", "CCQ_HOST_WORKERS",
    "CCQ_HOST_STREAM_BYTES",
};

static void env_clear(void)
{
    for (size_t i = 0; i < sizeof env_names / sizeof env_names[0]; i++)
        unsetenv(env_names[i]);
}

static int env_setup(void **state)
{
    (void)state;
    env_clear();
    return 0;
}

static int env_teardown(void **state)
{
    (void)state;
    env_clear();
    return 0;
}

/* CCQ_* variables override the defaults in ccq_config_init. */
static void test_env_overrides(void **state)
{
    (void)state;
    ccq_config cfg;
    ccq_runtime *rt;

    setenv("CCQ_BACKEND", "host", 1);
    setenv("CCQ_HOST_DEVICES", "3", 1);
    setenv("CCQ_MAX_STREAMS", "5", 1);
    setenv("CCQ_QUEUE_DEPTH", "7", 1);
    setenv("CCQ_MAX_BATCH_OPS", "9", 1);
    setenv("CCQ_TIMEOUT_MS", "1234", 1);
    setenv("CCQ_NONBLOCKING_SUBMIT", "1", 1);
    setenv("CCQ_HOST_WORKERS", "2", 1);
    setenv("CCQ_HOST_STREAM_BYTES", "1048576", 1);
    ccq_config_init(&cfg);
    assert_string_equal(cfg.backend, "host");
    assert_int_equal(cfg.host_devices, 3);
    assert_int_equal(cfg.max_streams, 5);
    assert_int_equal(cfg.queue_depth, 7);
    assert_int_equal(cfg.max_batch_ops, 9);
    assert_int_equal(cfg.timeout_ms, 1234);
    assert_int_equal(cfg.flags, CCQ_FLAG_NONBLOCKING_SUBMIT);
    assert_int_equal(cfg.host_workers, 2);
    assert_int_equal(cfg.host_stream_bytes, 1048576);
    assert_null(cfg.env_error);

    /* The runtime uses them, also when created from NULL. */
    rt = make_rt_cfg(NULL);
    assert_int_equal(ccq_device_count(rt), 3);
    assert_int_equal(ccq_sync_collective(rt, 2, 4), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 2, 5), CCQ_ERR_INVALID_ARGUMENT);
    assert_int_equal(ccq_sync_collective(rt, 3, 0), CCQ_ERR_INVALID_ARGUMENT);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);

    /* Fields set after ccq_config_init win over the environment. */
    ccq_config_init(&cfg);
    cfg.host_devices = 6;
    rt = make_rt_cfg(&cfg);
    assert_int_equal(ccq_device_count(rt), 6);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);

    setenv("CCQ_NONBLOCKING_SUBMIT", "0", 1);
    setenv("CCQ_TIMEOUT_MS", "0", 1);
    setenv("CCQ_HOST_DEVICES", "", 1); /* empty: ignored */
    ccq_config_init(&cfg);
    assert_int_equal(cfg.flags, 0);
    assert_int_equal(cfg.timeout_ms, 0);
    assert_int_equal(cfg.host_devices, 4);
    assert_null(cfg.env_error);

    env_clear();
    ccq_config_init(&cfg);
    assert_int_equal(cfg.host_devices, 4);
    assert_int_equal(cfg.max_streams, 64);
    assert_int_equal(cfg.timeout_ms, 600000);
}

static void check_env_malformed(const char *name, const char *value)
{
    ccq_config cfg;
    ccq_runtime *rt = NULL;
    ccq_status st;

    env_clear();
    setenv(name, value, 1);
    ccq_config_init(&cfg);
    assert_non_null(cfg.env_error);
    st = ccq_runtime_create(&cfg, &rt);
    if (st != CCQ_ERR_INVALID_ARGUMENT || strstr(ccq_last_error_detail(), name) == NULL)
        fail_msg("%s=\"%s\": got %s: %s", name, value, ccq_status_name(st),
                 ccq_last_error_detail());
    assert_null(rt);
    /* The same from a NULL config (defaults read from the environment). */
    st = ccq_runtime_create(NULL, &rt);
    if (st != CCQ_ERR_INVALID_ARGUMENT || strstr(ccq_last_error_detail(), name) == NULL)
        fail_msg("%s=\"%s\" (NULL cfg): got %s: %s", name, value, ccq_status_name(st),
                 ccq_last_error_detail());
    assert_null(rt);
    env_clear();
}

/* A malformed CCQ_* value makes ccq_runtime_create fail, naming the variable. */
static void test_env_malformed(void **state)
{
    (void)state;
    check_env_malformed("CCQ_HOST_DEVICES", "abc");
    check_env_malformed("CCQ_HOST_DEVICES", "4x");
    check_env_malformed("CCQ_HOST_DEVICES", "-1");
    check_env_malformed("CCQ_HOST_DEVICES", "100000");
    check_env_malformed("CCQ_MAX_STREAMS", "1e3");
    check_env_malformed("CCQ_QUEUE_DEPTH", "99999999999999999999999");
    check_env_malformed("CCQ_MAX_BATCH_OPS", " ");
    check_env_malformed("CCQ_TIMEOUT_MS", "soon");
    check_env_malformed("CCQ_NONBLOCKING_SUBMIT", "2");
    check_env_malformed("CCQ_NONBLOCKING_SUBMIT", "yes");
    check_env_malformed("CCQ_HOST_WORKERS", "many");
    check_env_malformed("CCQ_HOST_STREAM_BYTES", "64M");
    /* A count that must be at least 1, set to 0, names the variable too (issue 11). */
    check_env_malformed("CCQ_HOST_DEVICES", "0");
    check_env_malformed("CCQ_MAX_STREAMS", "0");
    check_env_malformed("CCQ_QUEUE_DEPTH", "0");
    check_env_malformed("CCQ_MAX_BATCH_OPS", "0");

    /* An unknown backend named in the environment fails like one set in the config. */
    ccq_runtime *rt = NULL;
    setenv("CCQ_BACKEND", "quantum", 1);
    assert_int_equal(ccq_runtime_create(NULL, &rt), CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(ccq_last_error_detail(), "quantum"));
    assert_null(rt);
    env_clear();
}

/* Every status has its text and name; other values get the fallbacks. */
static void test_status_strings(void **state)
{
    (void)state;
    static const struct {
        ccq_status s;
        int value;
        const char *name;
        const char *text;
    } table[] = {
        {CCQ_OK, 0, "CCQ_OK", "success"},
        {CCQ_IN_PROGRESS, 1, "CCQ_IN_PROGRESS", "in progress"},
        {CCQ_ERR_INVALID_ARGUMENT, -1, "CCQ_ERR_INVALID_ARGUMENT", "invalid argument"},
        {CCQ_ERR_NO_MEMORY, -2, "CCQ_ERR_NO_MEMORY", "out of memory"},
        {CCQ_ERR_QUEUE_FULL, -3, "CCQ_ERR_QUEUE_FULL", "stream queue full"},
        {CCQ_ERR_NOT_INITIALIZED, -4, "CCQ_ERR_NOT_INITIALIZED", "communicator not initialized"},
        {CCQ_ERR_MISMATCH, -5, "CCQ_ERR_MISMATCH", "collective parts do not match across ranks"},
        {CCQ_ERR_TIMEOUT, -6, "CCQ_ERR_TIMEOUT", "timed out"},
        {CCQ_ERR_BACKEND, -7, "CCQ_ERR_BACKEND", "backend error"},
        {CCQ_ERR_ABORTED, -8, "CCQ_ERR_ABORTED", "communicator aborted"},
        {CCQ_ERR_SHUTDOWN, -9, "CCQ_ERR_SHUTDOWN", "runtime is shutting down"},
        {CCQ_ERR_UNSUPPORTED, -10, "CCQ_ERR_UNSUPPORTED", "unsupported"},
        {CCQ_ERR_PROCESS_LOST, -11, "CCQ_ERR_PROCESS_LOST", "a member process was lost"},
    };
    const size_t n = sizeof table / sizeof table[0];

    for (size_t i = 0; i < n; i++) {
        assert_int_equal((int)table[i].s, table[i].value);
        assert_string_equal(ccq_status_name(table[i].s), table[i].name);
        assert_string_equal(ccq_status_string(table[i].s), table[i].text);
        for (size_t j = 0; j < i; j++) {
            assert_string_not_equal(ccq_status_string(table[i].s), ccq_status_string(table[j].s));
            assert_string_not_equal(ccq_status_name(table[i].s), ccq_status_name(table[j].s));
        }
    }
    const int unknown[] = {2, -12, 42, -1000, INT32_MIN};
    for (size_t k = 0; k < sizeof unknown / sizeof unknown[0]; k++) {
        ccq_status s = (ccq_status)unknown[k];
        assert_string_equal(ccq_status_string(s), "unknown status");
        const char *name = ccq_status_name(s);
        assert_non_null(name);
        assert_true(name[0] != '\0');
        for (size_t i = 0; i < n; i++)
            assert_string_not_equal(name, table[i].name);
    }
}

/* Element sizes and names of every dtype, and of the op names. */
static void test_dtype_sizes(void **state)
{
    (void)state;
    static const struct {
        ccq_dtype t;
        size_t size;
        const char *name;
    } table[] = {
        {CCQ_INT8, 1, "int8"},
        {CCQ_UINT8, 1, "uint8"},
        {CCQ_INT32, 4, "int32"},
        {CCQ_UINT32, 4, "uint32"},
        {CCQ_INT64, 8, "int64"},
        {CCQ_UINT64, 8, "uint64"},
        {CCQ_FLOAT16, 2, "float16"},
        {CCQ_FLOAT32, 4, "float32"},
        {CCQ_FLOAT64, 8, "float64"},
        {CCQ_BFLOAT16, 2, "bfloat16"},
        {CCQ_FLOAT8E4M3, 1, "float8e4m3"},
        {CCQ_FLOAT8E5M2, 1, "float8e5m2"},
    };
    assert_int_equal(sizeof table / sizeof table[0], CCQ_DTYPE_COUNT_);
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        assert_int_equal(table[i].t, (ccq_dtype)i);
        assert_int_equal(ccq_dtype_size(table[i].t), table[i].size);
        assert_int_equal(ccq_dtype_size(table[i].t), ref_dtype_size(table[i].t));
        assert_string_equal(ccq_dtype_name(table[i].t), table[i].name);
    }
    assert_int_equal(ccq_dtype_size(CCQ_DTYPE_COUNT_), 0);
    assert_int_equal(ccq_dtype_size((ccq_dtype)-1), 0);
    assert_int_equal(ccq_dtype_size((ccq_dtype)255), 0);
    assert_string_equal(ccq_dtype_name(CCQ_DTYPE_COUNT_), "?");
    assert_string_equal(ccq_dtype_name((ccq_dtype)-1), "?");

    static const char *const ops[] = {"sum", "prod", "max", "min", "avg"};
    assert_int_equal(sizeof ops / sizeof ops[0], CCQ_REDUCE_OP_COUNT_);
    for (int i = 0; i < CCQ_REDUCE_OP_COUNT_; i++)
        assert_string_equal(ccq_reduce_op_name((ccq_reduce_op)i), ops[i]);
    assert_string_equal(ccq_reduce_op_name(CCQ_REDUCE_OP_COUNT_), "?");
    assert_string_equal(ccq_reduce_op_name((ccq_reduce_op)-1), "?");
}

/* Parts that disagree all fail with CCQ_ERR_MISMATCH; nothing runs; the next one works. */
static void test_mismatch(void **state)
{
    (void)state;
    enum { N = 100 };
    ccq_runtime *rt = make_rt(4, 600000);
    ccq_device_id all[4] = {0, 1, 2, 3};
    static float in[4][N], out[4][N];
    char detail[CCQ_DETAIL_LEN];

    assert_int_equal(ccq_comm_init(rt, all, 4), CCQ_OK);
    for (int d = 0; d < 4; d++) {
        ref_fill(CCQ_FLOAT32, in[d], N, (uint32_t)d);
        memset(out[d], 0xee, sizeof out[d]);
    }
    assert_int_equal(ccq_all_reduce(rt, 0, 0, in[0], out[0], N, CCQ_FLOAT32, CCQ_SUM, all, 4),
                     CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 1, 0, in[1], out[1], N, CCQ_FLOAT32, CCQ_SUM, all, 4),
                     CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 2, 0, in[2], out[2], N / 2, CCQ_FLOAT32, CCQ_SUM, all, 4),
                     CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 3, 0, in[3], out[3], N, CCQ_INT32, CCQ_SUM, all, 4),
                     CCQ_OK);
    for (int d = 0; d < 4; d++) {
        ccq_status st = ccq_sync_collective(rt, (ccq_device_id)d, 0);
        snprintf(detail, sizeof detail, "%s", ccq_last_error_detail());
        if (st != CCQ_ERR_MISMATCH)
            fail_msg("device %d: %s: %s", d, ccq_status_name(st), detail);
        if (strstr(detail, "count") == NULL || strstr(detail, "dtype") == NULL ||
            strstr(detail, "rank 2") == NULL || strstr(detail, "rank 3") == NULL)
            fail_msg("device %d: detail should name ranks 2, 3 and fields count, dtype: %s", d,
                     detail);
        /* Rank 1 agrees with rank 0 and is not blamed. */
        assert_null(strstr(detail, "rank 1"));
    }
    for (int d = 0; d < 4; d++)
        for (int i = 0; i < N; i++) {
            uint32_t bits;
            memcpy(&bits, &out[d][i], sizeof bits);
            assert_int_equal(bits, 0xeeeeeeeeu);
        }
    ccq_stats st = stats_of(rt);
    assert_int_equal(st.failed, 4);
    assert_int_equal(st.completed, 0);
    assert_int_equal(st.batched_ops, 0);
    /* The communicator goes on with the next collective. */
    run_good_allreduce(rt, all, 4, 0, 99);
    st = stats_of(rt);
    assert_int_equal(st.submitted, 8);
    assert_int_equal(st.completed, 4);
    assert_int_equal(st.failed, 4);
    assert_int_equal(st.pending, 0);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

/*
 * Rank 3 never submits: the watchdog fails the other parts with CCQ_ERR_TIMEOUT naming
 * rank 3. Rank 3's late part then fails too (its operation was resolved without it), and
 * the next collective of the communicator works.
 */
static void test_missing_rank_timeout(void **state)
{
    (void)state;
    enum { N = 64 };
    ccq_runtime *rt = make_rt(4, 300);
    ccq_device_id all[4] = {0, 1, 2, 3};
    int32_t in[4][N], out[4][N];
    char detail[CCQ_DETAIL_LEN];

    assert_int_equal(ccq_comm_init(rt, all, 4), CCQ_OK);
    for (int d = 0; d < 4; d++) {
        ref_fill(CCQ_INT32, in[d], N, (uint32_t)d);
        memset(out[d], 0x11, sizeof out[d]);
    }
    for (int d = 0; d < 3; d++)
        assert_int_equal(
            ccq_all_reduce(rt, (ccq_device_id)d, 2, in[d], out[d], N, CCQ_INT32, CCQ_SUM, all, 4),
            CCQ_OK);
    for (int d = 0; d < 3; d++) {
        ccq_status st = fence_watchdog(rt, (ccq_device_id)d, 2, detail, sizeof detail);
        if (st != CCQ_ERR_TIMEOUT)
            fail_msg("device %d: %s: %s", d, ccq_status_name(st), detail);
        if (strstr(detail, "rank 3") == NULL || strstr(detail, "device 3") == NULL)
            fail_msg("device %d: detail does not name the missing rank 3: %s", d, detail);
        /* The last sequence number each rank reached: rank 3 submitted none. */
        if (strstr(detail, "3:0/0") == NULL)
            fail_msg("device %d: detail lacks rank 3's progress (3:0/0): %s", d, detail);
        for (int i = 0; i < N; i++)
            assert_int_equal(out[d][i], 0x11111111);
    }
    ccq_stats st = stats_of(rt);
    assert_int_equal(st.failed, 3);
    assert_int_equal(st.pending, 0);

    /* The late part fails with the same status; it is not matched with anything else. */
    assert_int_equal(ccq_all_reduce(rt, 3, 2, in[3], out[3], N, CCQ_INT32, CCQ_SUM, all, 4),
                     CCQ_OK);
    ccq_status s3 = ccq_sync_collective(rt, 3, 2);
    if (s3 != CCQ_ERR_TIMEOUT)
        fail_msg("late part: %s: %s", ccq_status_name(s3), ccq_last_error_detail());
    assert_true(ccq_last_error_detail()[0] != '\0');
    for (int i = 0; i < N; i++)
        assert_int_equal(out[3][i], 0x11111111);
    st = stats_of(rt);
    assert_int_equal(st.failed, 4);

    /* The next collective works on every rank. */
    run_good_allreduce(rt, all, 4, 2, 1234);
    st = stats_of(rt);
    assert_int_equal(st.submitted, 8);
    assert_int_equal(st.completed, 4);
    assert_int_equal(st.failed, 4);
    assert_int_equal(st.pending, 0);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

/* The backpressure tests' world: 2 devices of one process, one all_reduce per index k on
 * stream 0 of each ("part" r of operation k), inputs that tell every (r, k, i) apart. */
enum { BP_N = 16, BP_MAX = 9 };

typedef struct bp_world {
    ccq_runtime *rt;
    ccq_device_id devs[2];
    int32_t in[2][BP_MAX][BP_N], out[2][BP_MAX][BP_N];
} bp_world;

static void bp_open(bp_world *w, uint32_t depth, uint32_t flags, uint64_t timeout_ms)
{
    ccq_config cfg;
    ccq_config_init(&cfg);
    cfg.host_devices = 2;
    cfg.queue_depth = depth;
    cfg.flags = flags;
    if (timeout_ms != 0)
        cfg.timeout_ms = timeout_ms;
    w->rt = make_rt_cfg(&cfg);
    w->devs[0] = 0;
    w->devs[1] = 1;
    assert_int_equal(ccq_comm_init(w->rt, w->devs, 2), CCQ_OK);
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < BP_MAX; k++)
            for (int i = 0; i < BP_N; i++)
                w->in[r][k][i] = (r + 1) * 1000 * (k + 1) + i;
}

static ccq_status bp_part(bp_world *w, int r, int k)
{
    return ccq_all_reduce(w->rt, (ccq_device_id)r, 0, w->in[r][k], w->out[r][k], BP_N, CCQ_INT32,
                          CCQ_SUM, w->devs, 2);
}

/* Both parts of operations 0..last fenced and summed. */
static void bp_check(bp_world *w, int last)
{
    assert_int_equal(ccq_sync_collective(w->rt, 0, 0), CCQ_OK);
    assert_int_equal(ccq_sync_collective(w->rt, 1, 0), CCQ_OK);
    for (int k = 0; k <= last; k++)
        for (int i = 0; i < BP_N; i++) {
            assert_int_equal(w->out[0][k][i], w->in[0][k][i] + w->in[1][k][i]);
            assert_int_equal(w->out[1][k][i], w->in[0][k][i] + w->in[1][k][i]);
        }
}

/* Non-blocking submit: the queue_depth + 1st outstanding command is refused, nothing queued,
 * no sequence number used; once the stream drains it works again. */
static void test_backpressure_nonblocking(void **state)
{
    (void)state;
    enum { DEPTH = 4 };
    bp_world w;
    bp_open(&w, DEPTH, CCQ_FLAG_NONBLOCKING_SUBMIT, 0);
    for (int k = 0; k < DEPTH; k++)
        assert_int_equal(bp_part(&w, 0, k), CCQ_OK);
    REFUSED(w.rt, bp_part(&w, 0, DEPTH), CCQ_ERR_QUEUE_FULL, "queue_depth");
    REFUSED(w.rt, ccq_send(w.rt, 0, 0, w.in[0][DEPTH], BP_N, CCQ_INT32, 1), CCQ_ERR_QUEUE_FULL,
            "queue_depth");
    assert_int_equal(stats_of(w.rt).submitted, DEPTH);
    /* Another stream of the same device is not full. */
    assert_int_equal(ccq_send(w.rt, 0, 1, w.in[0][DEPTH], BP_N, CCQ_INT32, 1), CCQ_OK);
    assert_int_equal(ccq_recv(w.rt, 1, 1, w.out[1][DEPTH], BP_N, CCQ_INT32, 0), CCQ_OK);
    assert_int_equal(ccq_sync_collective(w.rt, 1, 1), CCQ_OK);
    assert_memory_equal(w.out[1][DEPTH], w.in[0][DEPTH], sizeof w.out[1][DEPTH]);

    for (int k = 0; k < DEPTH; k++)
        assert_int_equal(bp_part(&w, 1, k), CCQ_OK);
    bp_check(&w, DEPTH - 1);
    /* Drained: the refused collective can go now, and matches rank 1's next part. */
    assert_int_equal(bp_part(&w, 0, DEPTH), CCQ_OK);
    assert_int_equal(bp_part(&w, 1, DEPTH), CCQ_OK);
    bp_check(&w, DEPTH);
    ccq_stats st = stats_of(w.rt);
    assert_int_equal(st.submitted, 2 * DEPTH + 4);
    assert_int_equal(st.completed, 2 * DEPTH + 4);
    assert_int_equal(st.pending, 0);
    assert_int_equal(ccq_runtime_destroy(w.rt), CCQ_OK);
}

typedef struct blocked_submit {
    bp_world *w;
    int k;
    _Atomic int done;
    ccq_status status;
    long sleeps; /* voluntary context switches while it waited */
} blocked_submit;

static void *blocked_submit_main(void *arg)
{
    blocked_submit *b = arg;
    struct rusage r0, r1;
    getrusage(RUSAGE_THREAD, &r0);
    b->status = bp_part(b->w, 0, b->k);
    getrusage(RUSAGE_THREAD, &r1);
    b->sleeps = r1.ru_nvcsw - r0.ru_nvcsw;
    atomic_store(&b->done, 1);
    return NULL;
}

/* Blocking submit: a submitter on a full stream waits, and is released when it drains. */
static void test_backpressure_blocking(void **state)
{
    (void)state;
    enum { DEPTH = 2 };
    bp_world w;
    pthread_t th;

    bp_open(&w, DEPTH, 0, 0);
    for (int k = 0; k < DEPTH; k++)
        assert_int_equal(bp_part(&w, 0, k), CCQ_OK);
    blocked_submit b = {&w, DEPTH, 0, CCQ_ERR_BACKEND, 0};
    assert_int_equal(pthread_create(&th, NULL, blocked_submit_main, &b), 0);
    /* It stays blocked while the stream is full (however long we look). */
    for (int i = 0; i < 20; i++) {
        sleep_ms(5);
        assert_int_equal(atomic_load(&b.done), 0);
    }
    assert_int_equal(stats_of(w.rt).submitted, DEPTH);
    /* Rank 1's parts drain the stream; the blocked submitter gets in. */
    for (int k = 0; k < DEPTH; k++)
        assert_int_equal(bp_part(&w, 1, k), CCQ_OK);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(b.status, CCQ_OK);
    /* Blocked 100 ms or more, it napped 1, 2, 4 ... ms (stream.c, ROOM_NAP_NS), not every
     * millisecond (100 wake-ups or more). */
    assert_true(b.sleeps < 40);
    assert_int_equal(bp_part(&w, 1, DEPTH), CCQ_OK);
    bp_check(&w, DEPTH);
    ccq_stats st = stats_of(w.rt);
    assert_int_equal(st.submitted, 2 * (DEPTH + 1));
    assert_int_equal(st.completed, 2 * (DEPTH + 1));
    assert_int_equal(ccq_runtime_destroy(w.rt), CCQ_OK);
}

/* A full stream of which only a few commands can end before this thread submits elsewhere:
 * a producer waiting for room sleeps until a quarter of the queue is free, but at most a
 * millisecond at a time, after which one free slot lets it in (stream.c, ROOM_NAP_NS). Here
 * one thread fills device 0's stream with DEPTH all_reduce parts, device 1 has submitted one
 * part only, so exactly one of device 0's can end: the next submission must get in (not wait
 * for a quarter, DEPTH / 4 = 2, until timeout_ms), and the thread then submits device 1's. */
static void test_backpressure_partial_drain(void **state)
{
    (void)state;
    enum { DEPTH = 8 };
    bp_world w;
    bp_open(&w, DEPTH, 0, 20000);
    assert_int_equal(bp_part(&w, 1, 0), CCQ_OK);
    for (int k = 0; k < DEPTH; k++)
        assert_int_equal(bp_part(&w, 0, k), CCQ_OK);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(bp_part(&w, 0, DEPTH), CCQ_OK);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double waited_ms =
        (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    /* A bound far from timeout_ms (a loaded machine may take a while), never near it. */
    assert_true(waited_ms < 5000);
    for (int k = 1; k <= DEPTH; k++)
        assert_int_equal(bp_part(&w, 1, k), CCQ_OK);
    bp_check(&w, DEPTH);
    assert_int_equal(ccq_runtime_destroy(w.rt), CCQ_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allreduce_argument_errors),
        cmocka_unit_test(test_sendrecv_argument_errors),
        cmocka_unit_test(test_comm_init_errors),
        cmocka_unit_test_setup_teardown(test_config_errors, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_env_overrides, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_env_malformed, env_setup, env_teardown),
        cmocka_unit_test(test_status_strings),
        cmocka_unit_test(test_dtype_sizes),
        cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_missing_rank_timeout),
        cmocka_unit_test(test_backpressure_nonblocking),
        cmocka_unit_test(test_backpressure_blocking),
        cmocka_unit_test(test_backpressure_partial_drain),
    };
    return cmocka_run_group_tests_name("errors", tests, NULL, NULL);
}
