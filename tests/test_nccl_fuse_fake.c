/* Fusion on the NCCL backend (opt-in: CCQ_NCCL_FUSION=1), against the fake CUDA runtime and
 * NCCL of tests/fake/, which checks the data and the order of the copies and the collective
 * on each stream: a batch of small all_reduces fuses into, per device, one
 * cudaMemcpyBatchAsync packing the parts (before the group), one ncclAllReduce of the packed
 * buffer (in the group) and one cudaMemcpyBatchAsync copying out (after the launch, also when
 * ncclGroupEnd returned ncclInProgress and the launch finished later), the parts' other
 * streams joining the first part's and back; results bit-identical to unfused; off without
 * the opt-in; a failed copy fails the batch before anything started; every device buffer and
 * event freed at the end. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test_util.h"

#include "ccq.h"
#include "fake/fake_cuda_nccl.h"
#include "fusion_work.h"
#include "ref.h"

enum { NDEV = 4, MAX_STREAMS = 4, NS = 3 };
#define F      4096
#define MAXOPS 64

static const ccq_device_id ALL[NDEV] = {0, 1, 2, 3};
static ccq_runtime *g_rt;

static int setup(void **state)
{
    (void)state;
    fake_reset();
    g_rt = NULL;
    return 0;
}

static int teardown(void **state)
{
    char msg[256];
    (void)state;
    if (g_rt != NULL)
        ccq_runtime_destroy(g_rt);
    g_rt = NULL;
    unsetenv("CCQ_NCCL_FUSION");
    assert_int_equal(fake_live("stream"), 0);
    assert_int_equal(fake_live("event"), 0);
    assert_int_equal(fake_live("mem"), 0);
    assert_int_equal(fake_live("comm"), 0);
    if (fake_errors(msg, sizeof msg) != 0)
        fail_msg("the fake saw a misuse: %s", msg);
    return 0;
}

static void ok(ccq_status st, const char *what)
{
    if (st != CCQ_OK)
        fail_msg("%s: %s: %s", what, ccq_status_name(st), ccq_last_error_detail());
}

/* Keeps the scheduler inside the creation of communicator {2,3} (the fake holds its
 * ncclCommInitRankConfig) until released, so everything queued meanwhile is one batch. */
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

/* A run: the plan's all_reduces on every device, device k's op i on stream (i + k) % NS. */
typedef struct run {
    fw_op ops[MAXOPS];
    size_t n;
    ccq_dtype dt;
    ccq_reduce_op op;
    void *buf[MAXOPS][NDEV]; /* device memory (the fake's cudaMalloc: host memory) */
    void *in[MAXOPS][NDEV];  /* the inputs, kept for the reference */
    ccq_status st;
    char detail[512]; /* the first failure's */
} run;

static ccq_runtime *make_rt(bool fuse)
{
    ccq_config cfg;
    if (fuse)
        setenv("CCQ_NCCL_FUSION", "1", 1);
    else
        unsetenv("CCQ_NCCL_FUSION");
    ccq_config_init(&cfg);
    cfg.backend = "nccl";
    cfg.max_streams = MAX_STREAMS;
    cfg.fusion_bytes = F;
    cfg.timeout_ms = 30000;
    ok(ccq_runtime_create(&cfg, &g_rt), "create");
    ok(ccq_comm_init(g_rt, ALL, NDEV), "comm");
    return g_rt;
}

/* Submit the run in one batch (behind the blocker); script is called just before release. */
static void run_batch(ccq_runtime *rt, run *r, ccq_dtype dt, ccq_reduce_op op, void (*script)(void),
                      long mismatch)
{
    blocker b = {.rt = rt};
    float one[NDEV], out[NDEV];
    memset(r, 0, sizeof *r);
    r->dt = dt;
    r->op = op;
    r->n = fw_plan(r->ops, MAXOPS, dt, F, NDEV, false);
    for (size_t i = 0; i < r->n; i++)
        for (uint32_t k = 0; k < NDEV; k++) {
            size_t bytes = r->ops[i].count * ref_dtype_size(dt);
            ok(ccq_mem_alloc(rt, k, bytes, &r->buf[i][k]), "mem_alloc");
            r->in[i][k] = xmalloc(bytes);
            ref_fill(dt, r->in[i][k], r->ops[i].count, (uint32_t)(i * 11 + k + 1));
            memcpy(r->buf[i][k], r->in[i][k], bytes);
        }
    /* Every stream used once first: the scheduler scans only streams it knows. */
    for (ccq_stream_id s = 0; s < NS; s++) {
        for (uint32_t k = 0; k < NDEV; k++)
            ok(ccq_all_reduce(rt, k, s, &one[k], &out[k], 1, CCQ_FLOAT32, CCQ_SUM, ALL, NDEV),
               "warm");
        for (uint32_t k = 0; k < NDEV; k++)
            ok(ccq_sync_collective(rt, k, s), "warm fence");
    }
    fake_hold_init(true);
    assert_int_equal(pthread_create(&b.thread, NULL, blocker_main, &b), 0);
    while (fake_inits_blocked() == 0)
        sleep_ms(1);
    for (size_t i = 0; i < r->n; i++)
        for (uint32_t k = 0; k < NDEV; k++)
            ok(ccq_all_reduce(rt, k, (ccq_stream_id)((i + k) % NS), r->buf[i][k], r->buf[i][k],
                              r->ops[i].count - (k == 1 && (long)i == mismatch), dt, op, ALL, NDEV),
               "submit");
    fake_log_reset();
    if (script != NULL)
        script();
    fake_hold_init(false);
    assert_int_equal(pthread_join(b.thread, NULL), 0);
    assert_int_equal(b.st, CCQ_OK);
    r->st = CCQ_OK;
    for (uint32_t k = 0; k < NDEV; k++)
        for (ccq_stream_id s = 0; s < NS; s++) {
            ccq_status st = ccq_sync_collective(rt, k, s);
            if (r->st == CCQ_OK && st != CCQ_OK) {
                r->st = st;
                snprintf(r->detail, sizeof r->detail, "%s", ccq_last_error_detail());
            }
        }
}

static void run_free(ccq_runtime *rt, run *r)
{
    for (size_t i = 0; i < r->n; i++)
        for (uint32_t k = 0; k < NDEV; k++) {
            ccq_mem_free(rt, k, r->buf[i][k]);
            free(r->in[i][k]);
        }
}

/* Every result is the reference (the fake reduces with the host kernels, in rank order). */
static void check_results(const run *r, long skip)
{
    for (size_t i = 0; i < r->n; i++) {
        size_t c = r->ops[i].count;
        if ((long)i == skip)
            continue;
        void *want = xmalloc(c * ref_dtype_size(r->dt));
        char msg[256];
        const void *in[NDEV] = {r->in[i][0], r->in[i][1], r->in[i][2], r->in[i][3]};
        ref_allreduce(r->dt, r->op, NDEV, in, want, c);
        for (uint32_t k = 0; k < NDEV; k++)
            if (ref_compare(r->dt, r->buf[i][k], want, c, msg, sizeof msg) != 0)
                fail_msg("%s %s op %zu (x %zu) device %u: %s", ccq_dtype_name(r->dt),
                         ccq_reduce_op_name(r->op), i, c, k, msg);
        free(want);
    }
}

static fake_call entry(size_t i)
{
    fake_call c;
    assert_true(fake_log_get(i, &c));
    return c;
}

/*
 * The calls of the fused groups, from the log: for each group of the rule (fusion_work.h)
 * and each device, one ncclAllReduce of the group's elements, inside the group, and on its
 * stream a cudaMemcpyBatchAsync of the group's copies before ncclGroupStart and one after
 * ncclGroupEnd, before that stream's completion event. Returns the fused groups.
 */
static size_t check_calls(const run *r, long failed)
{
    size_t ngroups = 0, nlog = fake_log_size();
    /* The batch's group (the blocker's ncclGroupEnd, released last, may come before it). */
    long gs = fake_log_find("ncclGroupStart", 0);
    long ge = gs >= 0 ? fake_log_find("ncclGroupEnd", (size_t)gs) : -1;
    assert_true(gs >= 0 && ge > gs);
    for (size_t i = 0; i < r->n;) {
        /* a failed op is never in the batch: the groups are cut around it */
        size_t end = failed >= (long)i ? (size_t)failed : r->n;
        size_t g = (long)i == failed ? 1 : fw_group(r->ops, i, end, r->dt, F), total = 0;
        if (g < 2) {
            i++;
            continue;
        }
        for (size_t j = i; j < i + g; j++)
            total += r->ops[j].count;
        for (int d = 0; d < NDEV; d++) {
            long ar = -1, pack = -1, unpack = -1, done = -1;
            cudaStream_t x = NULL;
            for (size_t e = 0; e < nlog; e++) {
                fake_call c = entry(e);
                if (strcmp(c.fn, "ncclAllReduce") == 0 && c.device == d && c.count == total &&
                    c.src == c.dst)
                    ar = (long)e, x = c.stream;
            }
            if (ar < 0)
                fail_msg("ops %zu..%zu: no ncclAllReduce of %zu elements on device %d", i,
                         i + g - 1, total, d);
            for (size_t e = 0; e < nlog; e++) {
                fake_call c = entry(e);
                if (strcmp(c.fn, "cudaMemcpyBatchAsync") == 0 && c.stream == x && c.count == g) {
                    if ((long)e < gs && pack < 0)
                        pack = (long)e;
                    else if ((long)e > ge && unpack < 0)
                        unpack = (long)e;
                }
                if (strcmp(c.fn, "cudaEventRecord") == 0 && c.stream == x && (long)e > unpack &&
                    unpack >= 0 && done < 0)
                    done = (long)e;
            }
            if (!(pack >= 0 && pack < gs && gs < ar && ar < ge && ge < unpack && unpack < done))
                fail_msg("ops %zu..%zu device %d: pack %ld, group %ld..%ld, all_reduce %ld, "
                         "unpack %ld, completion %ld: out of order",
                         i, i + g - 1, d, pack, gs, ge, ar, unpack, done);
        }
        ngroups++;
        i += g;
    }
    return ngroups;
}

static void test_fused_identical(void **state)
{
    (void)state;
    static const struct {
        ccq_dtype dt;
        ccq_reduce_op op;
    } cases[] = {{CCQ_FLOAT32, CCQ_SUM},
                 {CCQ_BFLOAT16, CCQ_AVG},
                 {CCQ_INT32, CCQ_MAX},
                 {CCQ_FLOAT64, CCQ_PROD},
                 {CCQ_UINT8, CCQ_MIN}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        run *a = xmalloc(sizeof *a), *b = xmalloc(sizeof *b);
        ccq_runtime *rt = make_rt(false);
        run_batch(rt, a, cases[c].dt, cases[c].op, NULL, -1);
        ok(a->st, "unfused");
        assert_int_equal(fake_log_count("cudaMemcpyBatchAsync"), 0); /* not opted in */
        check_results(a, -1);
        for (size_t i = 0; i < a->n; i++) /* keep the results on the host, free the buffers */
            for (uint32_t k = 0; k < NDEV; k++) {
                size_t bytes = a->ops[i].count * ref_dtype_size(a->dt);
                void *h = xmalloc(bytes);
                memcpy(h, a->buf[i][k], bytes);
                ccq_mem_free(rt, k, a->buf[i][k]);
                a->buf[i][k] = h;
            }
        ok(ccq_runtime_destroy(rt), "destroy");
        g_rt = NULL;
        rt = make_rt(true);
        run_batch(rt, b, cases[c].dt, cases[c].op, NULL, -1);
        ok(b->st, "fused");
        check_results(b, -1);
        assert_true(check_calls(b, -1) > 0);
        for (size_t i = 0; i < a->n; i++)
            for (uint32_t k = 0; k < NDEV; k++)
                assert_memory_equal(a->buf[i][k], b->buf[i][k],
                                    a->ops[i].count * ref_dtype_size(a->dt));
        run_free(rt, b);
        for (size_t i = 0; i < a->n; i++)
            for (uint32_t k = 0; k < NDEV; k++) {
                free(a->buf[i][k]);
                free(a->in[i][k]);
            }
        ok(ccq_runtime_destroy(rt), "destroy");
        g_rt = NULL;
        free(a);
        free(b);
    }
}

/* ncclGroupEnd returns ncclInProgress and the launch finishes a few polls later: the copies
 * out wait for it (the fake flags a copy queued while the launch is in progress). */
static void script_in_progress(void)
{
    fake_script("ncclGroupEnd", ncclSuccess);    /* the blocker's communicator, created first */
    fake_script("ncclGroupEnd", ncclInProgress); /* the batch's group */
    fake_set_pending(3);
}

static void test_nonblocking_launch(void **state)
{
    (void)state;
    run *r = xmalloc(sizeof *r);
    ccq_runtime *rt = make_rt(true);
    run_batch(rt, r, CCQ_FLOAT32, CCQ_SUM, script_in_progress, -1);
    ok(r->st, "fused, launched in the background");
    assert_true(fake_log_count("ncclCommGetAsyncError") > 0);
    check_results(r, -1);
    assert_true(check_calls(r, -1) > 0);
    run_free(rt, r);
    free(r);
}

/* A copy that fails before the group: nothing started, every op fails with the CUDA error. */
static void script_copy_fails(void)
{
    fake_script("cudaMemcpyBatchAsync", cudaErrorInvalidValue);
}

static void test_copy_fails(void **state)
{
    (void)state;
    run *r = xmalloc(sizeof *r);
    ccq_runtime *rt = make_rt(true);
    run_batch(rt, r, CCQ_FLOAT32, CCQ_SUM, script_copy_fails, -1);
    assert_int_equal(r->st, CCQ_ERR_BACKEND);
    if (strstr(r->detail, "cudaMemcpyBatchAsync") == NULL)
        fail_msg("detail: %s", r->detail);
    assert_int_equal(fake_log_count("ncclGroupStart"), 0);
    run_free(rt, r);
    free(r);
}

/* A mismatch inside what would be a fused group (ops 4 and 5 fuse; op 5 mismatches): op 5
 * fails alone, the groups are cut around it, every other op fused or not is right. */
static void test_mismatch_inside_group(void **state)
{
    (void)state;
    run *r = xmalloc(sizeof *r);
    ccq_runtime *rt = make_rt(true);
    run_batch(rt, r, CCQ_FLOAT32, CCQ_SUM, NULL, 5);
    assert_int_equal(r->st, CCQ_ERR_MISMATCH);
    check_results(r, 5);
    assert_true(check_calls(r, 5) > 0);
    run_free(rt, r);
    free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_fused_identical, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nonblocking_launch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_copy_fails, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mismatch_inside_group, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
