/* all_reduce through the public API on the host backend: every dtype x op, 1..8 devices,
 * small to pool-sized counts, out of place and in place, bit-exact against tools/ref/ref.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test_util.h"

#include "ccq.h"
#include "ref.h"

#define NDEV       8
#define NDT        CCQ_DTYPE_COUNT_
#define NOP        CCQ_REDUCE_OP_COUNT_
#define GUARD      32 /* bytes after every output buffer that nothing may write */
#define GUARD_BYTE 0xa5
#define NSTREAMS   3

/* Counts below the host backend's inline threshold; LARGE_COUNT goes to its worker pool
 * (65537 elements x 2+ ranks > 128 KiB for every dtype). */
static const size_t small_counts[] = {1, 3, 17, 1001};
#define LARGE_COUNT 65537

typedef struct fixture {
    ccq_runtime *rt;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    ccq_config cfg;

    if (f == NULL)
        return -1;
    ccq_config_init(&cfg);
    cfg.host_devices = NDEV;
    cfg.timeout_ms = 60000; /* only matters if something hangs */
    if (ccq_runtime_create(&cfg, &f->rt) != CCQ_OK) {
        free(f);
        return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    /* Every command ended; exactly the ones made to fail failed; nothing leaked. */
    int rc = all_ended(f->rt, 0);
    if (ccq_runtime_destroy(f->rt) != CCQ_OK)
        rc = -1;
    free(f);
    return rc;
}

/* A seed that differs for every (dtype, count, device). */
static uint32_t seed_of(ccq_dtype dt, size_t count, uint32_t dev)
{
    return (uint32_t)(dt * 1000003u + count * 7919u + dev * 104729u + 1u);
}

static void fence_all(ccq_runtime *rt, uint32_t n, const ccq_device_id *devs)
{
    for (uint32_t r = 0; r < n; r++)
        for (ccq_stream_id s = 0; s < NSTREAMS; s++) {
            ccq_status st = ccq_sync_collective(rt, devs[r], s);
            if (st != CCQ_OK)
                fail_msg("fence device %u stream %u: %s (%s)", devs[r], s, ccq_status_name(st),
                         ccq_last_error_detail());
        }
}

/* got must equal want bit for bit (NaN == NaN), and the guard after it must be intact. */
static void check_output(ccq_dtype dt, ccq_reduce_op op, uint32_t n, size_t count, uint32_t dev,
                         const char *mode, const void *got, const void *want)
{
    char msg[256];
    size_t es = ref_dtype_size(dt);
    size_t bad = ref_compare(dt, got, want, count, msg, sizeof msg);
    if (bad != 0)
        fail_msg("%s %s n=%u count=%zu device %u (%s): %zu wrong; %s", ccq_dtype_name(dt),
                 ccq_reduce_op_name(op), n, count, dev, mode, bad, msg);
    const unsigned char *g = (const unsigned char *)got + count * es;
    for (int i = 0; i < GUARD; i++)
        if (g[i] != GUARD_BYTE)
            fail_msg("%s %s n=%u count=%zu device %u (%s): wrote past the end", ccq_dtype_name(dt),
                     ccq_reduce_op_name(op), n, count, dev, mode);
}

/*
 * One round: for the given dtypes and ops, all_reduce `count` elements over the device set
 * `devs` (n devices, in the order given), out of place then in place, every op of the round
 * queued before the fences. The reference reduces in rank order, i.e. sorted device order.
 */
static void run_round(ccq_runtime *rt, const ccq_device_id *devs, uint32_t n, size_t count,
                      const ccq_dtype *dts, uint32_t ndt, const ccq_reduce_op *ops, uint32_t nop)
{
    ccq_device_id sorted[NDEV];
    void *in[NDT][NDEV];
    void *out[NDT][NOP][NDEV];
    void *want[NDT][NOP];

    /* Sorted copy: rank r is the r-th smallest device id. */
    memcpy(sorted, devs, n * sizeof *devs);
    for (uint32_t i = 1; i < n; i++)
        for (uint32_t j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
            ccq_device_id t = sorted[j];
            sorted[j] = sorted[j - 1];
            sorted[j - 1] = t;
        }

    for (uint32_t a = 0; a < ndt; a++) {
        ccq_dtype dt = dts[a];
        size_t bytes = count * ref_dtype_size(dt);
        const void *inputs[NDEV];
        for (uint32_t r = 0; r < n; r++) {
            in[a][r] = xmalloc(bytes);
            ref_fill(dt, in[a][r], count, seed_of(dt, count, sorted[r]));
            inputs[r] = in[a][r];
        }
        for (uint32_t b = 0; b < nop; b++) {
            want[a][b] = xmalloc(bytes);
            ref_allreduce(dt, ops[b], n, inputs, want[a][b], count);
            for (uint32_t r = 0; r < n; r++) {
                out[a][b][r] = xmalloc(bytes + GUARD);
                memset(out[a][b][r], GUARD_BYTE, bytes + GUARD);
            }
        }
    }

    for (int inplace = 0; inplace < 2; inplace++) {
        /* Submit by rank in the order the set was given, each op on a stream of its own
         * choosing (the same on every rank or not: it must not matter). */
        for (uint32_t k = 0; k < n; k++) {
            ccq_device_id d = devs[k];
            uint32_t r = 0;
            while (sorted[r] != d)
                r++;
            for (uint32_t a = 0; a < ndt; a++)
                for (uint32_t b = 0; b < nop; b++) {
                    size_t bytes = count * ref_dtype_size(dts[a]);
                    void *dst = out[a][b][r];
                    const void *src = in[a][r];
                    if (inplace) {
                        memcpy(dst, in[a][r], bytes);
                        src = dst;
                    }
                    ccq_stream_id s = (ccq_stream_id)((a + b + (inplace ? d : 0)) % NSTREAMS);
                    ccq_status st =
                        ccq_all_reduce(rt, d, s, src, dst, count, dts[a], ops[b], devs, n);
                    if (st != CCQ_OK)
                        fail_msg("all_reduce on device %u: %s (%s)", d, ccq_status_name(st),
                                 ccq_last_error_detail());
                }
        }
        fence_all(rt, n, devs);
        for (uint32_t a = 0; a < ndt; a++)
            for (uint32_t b = 0; b < nop; b++)
                for (uint32_t r = 0; r < n; r++)
                    check_output(dts[a], ops[b], n, count, sorted[r],
                                 inplace ? "in place" : "out of place", out[a][b][r], want[a][b]);
        /* Out of place leaves the inputs alone. */
        if (!inplace)
            for (uint32_t a = 0; a < ndt; a++)
                for (uint32_t r = 0; r < n; r++) {
                    void *orig = xmalloc(count * ref_dtype_size(dts[a]));
                    ref_fill(dts[a], orig, count, seed_of(dts[a], count, sorted[r]));
                    assert_memory_equal(orig, in[a][r], count * ref_dtype_size(dts[a]));
                    free(orig);
                }
        for (uint32_t a = 0; a < ndt; a++)
            for (uint32_t b = 0; b < nop; b++)
                for (uint32_t r = 0; r < n; r++)
                    memset(out[a][b][r], GUARD_BYTE, count * ref_dtype_size(dts[a]) + GUARD);
    }

    for (uint32_t a = 0; a < ndt; a++) {
        for (uint32_t r = 0; r < n; r++)
            free(in[a][r]);
        for (uint32_t b = 0; b < nop; b++) {
            free(want[a][b]);
            for (uint32_t r = 0; r < n; r++)
                free(out[a][b][r]);
        }
    }
}

static const ccq_dtype all_dts[NDT] = {CCQ_INT8,    CCQ_UINT8,    CCQ_INT32,      CCQ_UINT32,
                                       CCQ_INT64,   CCQ_UINT64,   CCQ_FLOAT16,    CCQ_FLOAT32,
                                       CCQ_FLOAT64, CCQ_BFLOAT16, CCQ_FLOAT8E4M3, CCQ_FLOAT8E5M2};
static const ccq_reduce_op all_ops[NOP] = {CCQ_SUM, CCQ_PROD, CCQ_MAX, CCQ_MIN, CCQ_AVG};

static void init_prefix(ccq_runtime *rt, uint32_t n, ccq_device_id *devs)
{
    for (uint32_t i = 0; i < n; i++)
        devs[i] = i;
    assert_int_equal(ccq_comm_init(rt, devs, n), CCQ_OK);
}

/* Every dtype x op x n = 1..8 x small counts, all queued per (n, count). */
static void test_small_counts_all_types_ops(void **state)
{
    fixture *f = *state;
    ccq_device_id devs[NDEV];

    for (uint32_t n = 1; n <= NDEV; n++) {
        init_prefix(f->rt, n, devs);
        for (size_t c = 0; c < sizeof small_counts / sizeof small_counts[0]; c++)
            run_round(f->rt, devs, n, small_counts[c], all_dts, NDT, all_ops, NOP);
    }
}

/* The worker-pool path: every dtype x op x n = 1..8 at a count above the inline threshold
 * (n = 1 is a plain copy and stays inline for the 1-byte types). One dtype per round keeps
 * the buffers small. */
static void test_large_count(void **state)
{
    fixture *f = *state;
    ccq_device_id devs[NDEV];

    for (uint32_t n = 1; n <= NDEV; n++) {
        init_prefix(f->rt, n, devs);
        for (uint32_t a = 0; a < NDT; a++)
            run_round(f->rt, devs, n, LARGE_COUNT, &all_dts[a], 1, all_ops, NOP);
    }
}

/* A set that is not a prefix, given unsorted: rank order is sorted device order (the float
 * sums below depend on the order), and every rank gets the same bits. */
static void test_non_prefix_set_rank_order(void **state)
{
    fixture *f = *state;
    const ccq_device_id init_order[3] = {6, 1, 4};
    const ccq_device_id submit_order[3] = {4, 6, 1};

    assert_int_equal(ccq_comm_init(f->rt, init_order, 3), CCQ_OK);
    /* Calling it again, in another order, is a no-op. */
    assert_int_equal(ccq_comm_init(f->rt, submit_order, 3), CCQ_OK);
    for (size_t c = 0; c < sizeof small_counts / sizeof small_counts[0]; c++)
        run_round(f->rt, submit_order, 3, small_counts[c], all_dts, NDT, all_ops, NOP);
    run_round(f->rt, init_order, 3, LARGE_COUNT, all_dts + 6, 6, all_ops, NOP);

    /* The check above is sensitive to the order: for float32 sum, reducing in the given
     * order would give different bits. */
    enum { C = 1001 };
    float *x[3], want_sorted[C], want_given[C];
    const void *in_sorted[3], *in_given[3];
    const ccq_device_id sorted[3] = {1, 4, 6};
    for (int r = 0; r < 3; r++) {
        x[r] = xmalloc(C * sizeof(float));
        ref_fill(CCQ_FLOAT32, x[r], C, seed_of(CCQ_FLOAT32, C, sorted[r]));
        in_sorted[r] = x[r];
    }
    in_given[0] = x[2]; /* 6 */
    in_given[1] = x[0]; /* 1 */
    in_given[2] = x[1]; /* 4 */
    ref_allreduce(CCQ_FLOAT32, CCQ_SUM, 3, in_sorted, want_sorted, C);
    ref_allreduce(CCQ_FLOAT32, CCQ_SUM, 3, in_given, want_given, C);
    assert_true(ref_compare(CCQ_FLOAT32, want_sorted, want_given, C, NULL, 0) > 0);
    for (int r = 0; r < 3; r++)
        free(x[r]);
}

/* count == 0 is accepted (NULL buffers allowed) and completes, on every set size. */
static void test_count_zero(void **state)
{
    fixture *f = *state;
    ccq_device_id devs[NDEV];
    ccq_stats before = {.struct_size = sizeof before}, after = {.struct_size = sizeof after};
    unsigned char buf[NDEV][8];
    uint64_t submitted = 0;

    memset(buf, 0x3c, sizeof buf);
    assert_int_equal(ccq_get_stats(f->rt, &before), CCQ_OK);
    for (uint32_t n = 1; n <= NDEV; n++) {
        init_prefix(f->rt, n, devs);
        for (uint32_t r = 0; r < n; r++) {
            assert_int_equal(
                ccq_all_reduce(f->rt, r, 0, NULL, NULL, 0, CCQ_FLOAT32, CCQ_SUM, devs, n), CCQ_OK);
            assert_int_equal(
                ccq_all_reduce(f->rt, r, 1, buf[r], buf[r], 0, CCQ_INT64, CCQ_MAX, devs, n),
                CCQ_OK);
            submitted += 2;
        }
        for (uint32_t r = 0; r < n; r++) {
            assert_int_equal(ccq_sync_collective(f->rt, r, 0), CCQ_OK);
            assert_int_equal(ccq_sync_collective(f->rt, r, 1), CCQ_OK);
        }
    }
    for (uint32_t r = 0; r < NDEV; r++)
        for (int i = 0; i < 8; i++)
            assert_int_equal(buf[r][i], 0x3c);
    assert_int_equal(ccq_get_stats(f->rt, &after), CCQ_OK);
    assert_int_equal(after.submitted - before.submitted, submitted);
    assert_int_equal(after.completed - before.completed, submitted);
    assert_int_equal(after.pending, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_small_counts_all_types_ops, setup, teardown),
        cmocka_unit_test_setup_teardown(test_large_count, setup, teardown),
        cmocka_unit_test_setup_teardown(test_non_prefix_set_rank_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_count_zero, setup, teardown),
    };
    /* CCQ_TEST_FILTER=pattern runs only the matching tests (cmocka's wildcard syntax). */
    const char *filter = getenv("CCQ_TEST_FILTER");
    if (filter != NULL && *filter != '\0')
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests_name("allreduce", tests, NULL, NULL);
}
