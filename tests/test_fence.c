/* Fences (DESIGN rule 5): data is there when they return, other streams do not hold them,
 * first error since the previous fence then cleared, argument errors, concurrent fencers. */
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
#include <time.h>

#include "ccq.h"
#include "ref.h"
#include "runtime/internal.h"

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static ccq_runtime *make_rt(uint32_t devices, uint64_t timeout_ms)
{
    ccq_config cfg;
    ccq_runtime *rt = NULL;
    ccq_config_init(&cfg);
    cfg.host_devices = devices;
    cfg.timeout_ms = timeout_ms;
    assert_int_equal(ccq_runtime_create(&cfg, &rt), CCQ_OK);
    assert_non_null(rt);
    return rt;
}

/* Wait (bounded, never failing on its own) until `n` threads sleep in the stream's event,
 * so a test really has its fencers blocked before it releases them. */
static void wait_for_waiters(ccq_runtime *rt, ccq_device_id d, ccq_stream_id s, uint32_t n)
{
    ccq_signal *ev = &ccq_stream_at(rt, d, s)->ev;
    for (int i = 0; i < 10000 && atomic_load_explicit(&ev->waiters, memory_order_acquire) < n; i++)
        sleep_ms(1);
}

/* (a) After the fence every element of every output is the reduction. */
static void test_fence_data_complete(void **state)
{
    (void)state;
    enum { NDEV = 4 };
    const size_t count = (size_t)8 << 20; /* 8 Mi floats per device */
    const unsigned rounds = env_iters(3);
    ccq_runtime *rt = make_rt(NDEV, 600000);
    ccq_device_id devs[NDEV] = {3, 1, 0, 2}; /* any order names the same set */
    float *in[NDEV], *out[NDEV];
    float *want = malloc(count * sizeof *want);
    char msg[256];

    assert_non_null(want);
    assert_int_equal(ccq_comm_init(rt, devs, NDEV), CCQ_OK);
    for (int d = 0; d < NDEV; d++) {
        in[d] = malloc(count * sizeof(float));
        out[d] = malloc(count * sizeof(float));
        assert_non_null(in[d]);
        assert_non_null(out[d]);
    }
    for (unsigned r = 0; r < rounds; r++) {
        /* Odd rounds run in place: the output is the input buffer. */
        int inplace = r & 1;
        const void *inputs[NDEV];
        for (int d = 0; d < NDEV; d++) {
            ref_fill(CCQ_FLOAT32, in[d], count, 1000u * r + (uint32_t)d);
            inputs[d] = in[d];
        }
        ref_allreduce(CCQ_FLOAT32, CCQ_SUM, NDEV, inputs, want, count);
        for (int d = 0; d < NDEV; d++) {
            if (!inplace)
                memset(out[d], 0xff, count * sizeof(float)); /* NaN poison */
            float *dst = inplace ? in[d] : out[d];
            assert_int_equal(ccq_all_reduce(rt, (ccq_device_id)d, 0, in[d], dst, count, CCQ_FLOAT32,
                                            CCQ_SUM, devs, NDEV),
                             CCQ_OK);
        }
        /* Each device's output is checked right after its own fence, before the next
         * fence; the device fenced first changes with the round. */
        for (int k = 0; k < NDEV; k++) {
            int d = (int)((r + (unsigned)k) % NDEV);
            assert_int_equal(ccq_sync_collective(rt, (ccq_device_id)d, 0), CCQ_OK);
            const float *got = inplace ? in[d] : out[d];
            size_t bad = ref_compare(CCQ_FLOAT32, got, want, count, msg, sizeof msg);
            if (bad != 0)
                fail_msg("round %u device %d: %zu wrong elements, first: %s", r, d, bad, msg);
        }
    }
    ccq_stats st = stats_of(rt);
    assert_int_equal(st.submitted, NDEV * rounds);
    assert_int_equal(st.completed, NDEV * rounds);
    assert_int_equal(st.failed, 0);
    assert_int_equal(st.pending, 0);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
    for (int d = 0; d < NDEV; d++) {
        free(in[d]);
        free(out[d]);
    }
    free(want);
}

/*
 * (b) A stream stuck on a collective whose rank 3 part never comes does not hold back the
 * fences of another stream of the same devices. The stuck collective is on comm {0,1,2,3}
 * and the live work on other communicators ({0,1}, {2,3}): collectives of one communicator
 * are ordered by sequence number whatever their streams (rule 3), so only another
 * communicator can be independent of the stuck one.
 */
static void test_fence_other_streams_unaffected(void **state)
{
    (void)state;
    enum { NDEV = 4, N = 4096, ROUNDS = 5 };
    const uint64_t timeout_ms = 2000;
    ccq_runtime *rt = make_rt(NDEV, timeout_ms);
    ccq_device_id all[NDEV] = {0, 1, 2, 3}, p01[2] = {0, 1}, p23[2] = {2, 3};
    static int32_t stuck_in[NDEV][N], stuck_out[NDEV][N];
    static int32_t in[NDEV][N], out[NDEV][N], want[2][N];
    char detail[CCQ_DETAIL_LEN], msg[256];

    assert_int_equal(ccq_comm_init(rt, all, NDEV), CCQ_OK);
    assert_int_equal(ccq_comm_init(rt, p01, 2), CCQ_OK);
    assert_int_equal(ccq_comm_init(rt, p23, 2), CCQ_OK);

    uint64_t t0 = now_ms();
    for (int d = 0; d < 3; d++) {
        ref_fill(CCQ_INT32, stuck_in[d], N, 77u + (uint32_t)d);
        memset(stuck_out[d], 0xab, sizeof stuck_out[d]);
        assert_int_equal(ccq_all_reduce(rt, (ccq_device_id)d, 1, stuck_in[d], stuck_out[d], N,
                                        CCQ_INT32, CCQ_SUM, all, NDEV),
                         CCQ_OK);
    }
    for (unsigned r = 0; r < ROUNDS; r++) {
        for (int d = 0; d < NDEV; d++) {
            ref_fill(CCQ_INT32, in[d], N, 100u * r + (uint32_t)d);
            memset(out[d], 0, sizeof out[d]);
            assert_int_equal(ccq_all_reduce(rt, (ccq_device_id)d, 0, in[d], out[d], N, CCQ_INT32,
                                            CCQ_MAX, d < 2 ? p01 : p23, 2),
                             CCQ_OK);
        }
        for (int d = 0; d < NDEV; d++)
            assert_int_equal(ccq_sync_collective(rt, (ccq_device_id)d, 0), CCQ_OK);
        const void *a[2] = {in[0], in[1]}, *b[2] = {in[2], in[3]};
        ref_allreduce(CCQ_INT32, CCQ_MAX, 2, a, want[0], N);
        ref_allreduce(CCQ_INT32, CCQ_MAX, 2, b, want[1], N);
        for (int d = 0; d < NDEV; d++) {
            size_t bad = ref_compare(CCQ_INT32, out[d], want[d / 2], N, msg, sizeof msg);
            if (bad != 0)
                fail_msg("round %u device %d: %zu wrong, first: %s", r, d, bad, msg);
        }
    }
    uint64_t live_ms = now_ms() - t0;
    /* The stream-0 fences returned before the watchdog failed anything: had they waited
     * for the stuck collective, its three parts would have failed first. */
    ccq_stats st = stats_of(rt);
    print_message("stream-0 work fenced after %llu ms (timeout_ms = %llu)\n",
                  (unsigned long long)live_ms, (unsigned long long)timeout_ms);
    assert_int_equal(st.failed, 0);
    assert_int_equal(st.completed, NDEV * ROUNDS);
    assert_int_equal(st.pending, 3);

    /* The stuck stream: its fences report the watchdog's timeout naming the missing rank. */
    for (int d = 0; d < 3; d++) {
        ccq_status s = fence_watchdog(rt, (ccq_device_id)d, 1, detail, sizeof detail);
        assert_int_equal(s, CCQ_ERR_TIMEOUT);
        if (strstr(detail, "rank 3") == NULL || strstr(detail, "device 3") == NULL)
            fail_msg("device %d: detail does not name rank 3 / device 3: %s", d, detail);
        for (size_t i = 0; i < N; i++)
            assert_int_equal(stuck_out[d][i], (int32_t)0xabababab);
    }
    assert_int_equal(ccq_sync_collective(rt, 3, 1), CCQ_OK); /* rank 3 submitted nothing */
    st = stats_of(rt);
    assert_int_equal(st.submitted, NDEV * ROUNDS + 3);
    assert_int_equal(st.failed, 3);
    assert_int_equal(st.pending, 0);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

/* (c) A stream that was never used, or that is idle again, fences at once with CCQ_OK. */
static void test_fence_idle_stream(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(4, 600000);
    ccq_device_id devs[2] = {1, 2};
    int32_t a[16] = {0}, b[16] = {0};

    for (ccq_device_id d = 0; d < 4; d++)
        for (ccq_stream_id s = 0; s < 64; s++)
            assert_int_equal(ccq_sync_collective(rt, d, s), CCQ_OK);
    assert_int_equal(ccq_comm_init(rt, devs, 2), CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 1, 5, a, a, 16, CCQ_INT32, CCQ_SUM, devs, 2), CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 2, 5, b, b, 16, CCQ_INT32, CCQ_SUM, devs, 2), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 1, 5), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 2, 5), CCQ_OK);
    /* Idle again: repeated fences cover nothing. */
    for (int i = 0; i < 100; i++) {
        assert_int_equal(ccq_sync_collective(rt, 1, 5), CCQ_OK);
        assert_int_equal(ccq_sync_collective(rt, 2, 5), CCQ_OK);
    }
    assert_int_equal(stats_of(rt).submitted, 2);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

typedef struct last_error_probe {
    ccq_runtime *rt;
    ccq_device_id device;
    ccq_stream_id stream;
    ccq_status status;
    char detail[CCQ_DETAIL_LEN];
    char own_detail[CCQ_DETAIL_LEN];
} last_error_probe;

static void *last_error_thread(void *arg)
{
    last_error_probe *p = arg;
    p->status = ccq_stream_last_error(p->rt, p->device, p->stream, p->detail, sizeof p->detail);
    snprintf(p->own_detail, sizeof p->own_detail, "%s", ccq_last_error_detail());
    return NULL;
}

static last_error_probe probe_from_thread(ccq_runtime *rt, ccq_device_id d, ccq_stream_id s)
{
    last_error_probe p;
    pthread_t th;
    memset(&p, 0, sizeof p);
    p.rt = rt;
    p.device = d;
    p.stream = s;
    assert_int_equal(pthread_create(&th, NULL, last_error_thread, &p), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    return p;
}

/* (d) A fence returns the first error since the previous fence, then clears it; another
 * thread reads that status and detail with ccq_stream_last_error. */
static void test_fence_first_error_then_cleared(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(2, 600000);
    ccq_device_id devs[2] = {0, 1};
    float f0[32], f1[32], o0[32], o1[32];
    int32_t i1[32], j1[32];
    char detail[CCQ_DETAIL_LEN], buf[CCQ_DETAIL_LEN];
    const ccq_stream_id S = 2;

    memset(f0, 0, sizeof f0);
    memset(f1, 0, sizeof f1);
    memset(i1, 0, sizeof i1);
    assert_int_equal(ccq_comm_init(rt, devs, 2), CCQ_OK);

    /* Before any error: CCQ_OK and an empty detail. */
    last_error_probe p = probe_from_thread(rt, 0, S);
    assert_int_equal(p.status, CCQ_OK);
    assert_string_equal(p.detail, "");

    /* #0: count mismatch; #1: dtype mismatch. Both fail on both ranks. */
    assert_int_equal(ccq_all_reduce(rt, 0, S, f0, o0, 10, CCQ_FLOAT32, CCQ_SUM, devs, 2), CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 1, S, f1, o1, 20, CCQ_FLOAT32, CCQ_SUM, devs, 2), CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 0, S, f0, o0, 8, CCQ_FLOAT32, CCQ_SUM, devs, 2), CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 1, S, i1, j1, 8, CCQ_INT32, CCQ_SUM, devs, 2), CCQ_OK);

    assert_int_equal(ccq_sync_collective(rt, 0, S), CCQ_ERR_MISMATCH);
    snprintf(detail, sizeof detail, "%s", ccq_last_error_detail());
    if (strstr(detail, "#0") == NULL || strstr(detail, "count") == NULL ||
        strstr(detail, "dtype") != NULL)
        fail_msg("expected the first error (collective #0, count) only: %s", detail);
    /* Cleared: the second mismatch came before this fence's report and is not repeated. */
    assert_int_equal(ccq_sync_collective(rt, 0, S), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 0, S), CCQ_OK);

    /* From another thread: the last error a fence returned, with its detail; the other
     * thread's own ccq_last_error_detail() is untouched (thread-local). */
    p = probe_from_thread(rt, 0, S);
    assert_int_equal(p.status, CCQ_ERR_MISMATCH);
    assert_string_equal(p.detail, detail);
    assert_string_equal(p.own_detail, "");
    /* Device 1 has not fenced yet: its stream has no last error, but a pending one. */
    p = probe_from_thread(rt, 1, S);
    assert_int_equal(p.status, CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 1, S), CCQ_ERR_MISMATCH);
    assert_non_null(strstr(ccq_last_error_detail(), "count"));
    assert_int_equal(ccq_sync_collective(rt, 1, S), CCQ_OK);
    p = probe_from_thread(rt, 1, S);
    assert_int_equal(p.status, CCQ_ERR_MISMATCH);

    /* A good collective, then a new error (#3: op). */
    for (int i = 0; i < 8; i++) {
        f0[i] = (float)i;
        f1[i] = 1.0f;
    }
    assert_int_equal(ccq_all_reduce(rt, 0, S, f0, o0, 8, CCQ_FLOAT32, CCQ_SUM, devs, 2), CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 1, S, f1, o1, 8, CCQ_FLOAT32, CCQ_SUM, devs, 2), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 0, S), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 1, S), CCQ_OK);
    for (int i = 0; i < 8; i++) {
        assert_true(o0[i] == (float)i + 1.0f);
        assert_true(o1[i] == (float)i + 1.0f);
    }
    assert_int_equal(ccq_all_reduce(rt, 0, S, f0, o0, 8, CCQ_FLOAT32, CCQ_SUM, devs, 2), CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 1, S, f1, o1, 8, CCQ_FLOAT32, CCQ_MAX, devs, 2), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 0, S), CCQ_ERR_MISMATCH);
    snprintf(detail, sizeof detail, "%s", ccq_last_error_detail());
    if (strstr(detail, "#3") == NULL || strstr(detail, "op") == NULL)
        fail_msg("expected collective #3's op mismatch: %s", detail);
    assert_int_equal(ccq_stream_last_error(rt, 0, S, buf, sizeof buf), CCQ_ERR_MISMATCH);
    assert_string_equal(buf, detail);
    /* Truncation and the size-only query. */
    assert_int_equal(ccq_stream_last_error(rt, 0, S, buf, 5), CCQ_ERR_MISMATCH);
    assert_int_equal(strlen(buf), 4);
    assert_int_equal(ccq_stream_last_error(rt, 0, S, NULL, 0), CCQ_ERR_MISMATCH);
    assert_int_equal(ccq_sync_collective(rt, 1, S), CCQ_ERR_MISMATCH);

    /* Argument errors of ccq_stream_last_error. */
    assert_int_equal(ccq_stream_last_error(NULL, 0, S, buf, sizeof buf), CCQ_ERR_INVALID_ARGUMENT);
    assert_int_equal(ccq_stream_last_error(rt, 2, S, buf, sizeof buf), CCQ_ERR_INVALID_ARGUMENT);
    assert_int_equal(ccq_stream_last_error(rt, 0, 64, buf, sizeof buf), CCQ_ERR_INVALID_ARGUMENT);
    assert_int_equal(ccq_stream_last_error(rt, 0, S, NULL, 8), CCQ_ERR_INVALID_ARGUMENT);

    ccq_stats st = stats_of(rt);
    assert_int_equal(st.submitted, 8);
    assert_int_equal(st.completed, 2);
    assert_int_equal(st.failed, 6);
    assert_int_equal(st.pending, 0);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

/* (e) Invalid device or stream. */
static void test_fence_invalid_arguments(void **state)
{
    (void)state;
    ccq_config cfg;
    ccq_runtime *rt = NULL;
    ccq_config_init(&cfg);
    cfg.host_devices = 3;
    cfg.max_streams = 5;
    assert_int_equal(ccq_runtime_create(&cfg, &rt), CCQ_OK);

    assert_int_equal(ccq_sync_collective(NULL, 0, 0), CCQ_ERR_INVALID_ARGUMENT);
    assert_true(ccq_last_error_detail()[0] != '\0');
    assert_int_equal(ccq_sync_collective(rt, 3, 0), CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(ccq_last_error_detail(), "device"));
    assert_int_equal(ccq_sync_collective(rt, UINT32_MAX, 0), CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(ccq_last_error_detail(), "device"));
    assert_int_equal(ccq_sync_collective(rt, 0, 5), CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(ccq_last_error_detail(), "stream"));
    assert_int_equal(ccq_sync_collective(rt, 2, UINT32_MAX), CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(ccq_last_error_detail(), "stream"));
    /* The last valid ones are fine, and a success clears the detail. */
    assert_int_equal(ccq_sync_collective(rt, 2, 4), CCQ_OK);
    assert_string_equal(ccq_last_error_detail(), "");
    assert_int_equal(stats_of(rt).submitted, 0);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

typedef struct fencer {
    pthread_t th;
    pthread_barrier_t *start;
    ccq_runtime *rt;
    ccq_device_id device;
    ccq_stream_id stream;
    ccq_status status;
} fencer;

static void *fencer_main(void *arg)
{
    fencer *f = arg;
    pthread_barrier_wait(f->start);
    f->status = ccq_sync_collective(f->rt, f->device, f->stream);
    return NULL;
}

/* (f) Several threads fencing one stream at once all return; exactly one gets an error. */
static void test_fence_concurrent_fencers(void **state)
{
    (void)state;
    enum { K = 6, N = 1 << 16 };
    const unsigned rounds = env_iters(20);
    ccq_runtime *rt = make_rt(2, 600000);
    ccq_device_id devs[2] = {0, 1};
    const ccq_stream_id S = 3;
    int32_t *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
    int32_t *oa = malloc(N * sizeof *oa), *ob = malloc(N * sizeof *ob);
    fencer f[K];
    pthread_barrier_t start;
    uint64_t expect_completed = 0, expect_failed = 0;

    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(oa);
    assert_non_null(ob);
    assert_int_equal(ccq_comm_init(rt, devs, 2), CCQ_OK);
    assert_int_equal(pthread_barrier_init(&start, NULL, K + 1), 0);
    for (unsigned r = 0; r < rounds; r++) {
        int mismatch = r % 4 == 3;
        for (int i = 0; i < N; i++) {
            a[i] = (int32_t)(r + (unsigned)i);
            b[i] = 2 * i;
        }
        memset(oa, 0, N * sizeof *oa);
        /* Rank 0's part first: the fencers block on it until rank 1's part comes. */
        assert_int_equal(ccq_all_reduce(rt, 0, S, a, oa, N, CCQ_INT32, CCQ_SUM, devs, 2), CCQ_OK);
        if (mismatch)
            assert_int_equal(ccq_all_reduce(rt, 1, S, b, ob, N / 2, CCQ_INT32, CCQ_SUM, devs, 2),
                             CCQ_OK);
        for (int k = 0; k < K; k++) {
            f[k] = (fencer){.start = &start, .rt = rt, .device = 0, .stream = S};
            assert_int_equal(pthread_create(&f[k].th, NULL, fencer_main, &f[k]), 0);
        }
        pthread_barrier_wait(&start);
        if (!mismatch) {
            wait_for_waiters(rt, 0, S, K);
            assert_int_equal(ccq_all_reduce(rt, 1, S, b, ob, N, CCQ_INT32, CCQ_SUM, devs, 2),
                             CCQ_OK);
        }
        int errors = 0;
        for (int k = 0; k < K; k++) {
            assert_int_equal(pthread_join(f[k].th, NULL), 0);
            if (f[k].status == CCQ_ERR_MISMATCH)
                errors++;
            else
                assert_int_equal(f[k].status, CCQ_OK);
        }
        assert_int_equal(errors, mismatch ? 1 : 0);
        assert_int_equal(ccq_sync_collective(rt, 1, S), mismatch ? CCQ_ERR_MISMATCH : CCQ_OK);
        if (mismatch) {
            expect_failed += 2;
            for (int i = 0; i < N; i++)
                assert_int_equal(oa[i], 0);
        } else {
            expect_completed += 2;
            for (int i = 0; i < N; i++)
                assert_int_equal(oa[i], (int32_t)(r + (unsigned)i) + 2 * i);
        }
    }
    assert_int_equal(pthread_barrier_destroy(&start), 0);
    ccq_stats st = stats_of(rt);
    assert_int_equal(st.completed, expect_completed);
    assert_int_equal(st.failed, expect_failed);
    assert_int_equal(st.pending, 0);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
    free(a);
    free(b);
    free(oa);
    free(ob);
}

typedef struct late_submit {
    ccq_runtime *rt;
    const void *src;
    void *dst;
    size_t count;
    const ccq_device_id *devs;
    ccq_status status;
} late_submit;

static void *late_submit_main(void *arg)
{
    late_submit *l = arg;
    sleep_ms(300);
    l->status =
        ccq_all_reduce(l->rt, 1, 0, l->src, l->dst, l->count, CCQ_INT32, CCQ_SUM, l->devs, 2);
    return NULL;
}

/* A waiting fence sleeps: it uses far less CPU time than the time it waits (rule 5). */
static void test_fence_does_not_spin(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(2, 600000);
    ccq_device_id devs[2] = {0, 1};
    int32_t a[64], b[64], oa[64], ob[64];
    struct timespec c0, c1;
    pthread_t th;

    for (int i = 0; i < 64; i++) {
        a[i] = i;
        b[i] = 1;
    }
    assert_int_equal(ccq_comm_init(rt, devs, 2), CCQ_OK);
    late_submit l = {rt, b, ob, 64, devs, CCQ_ERR_BACKEND};
    assert_int_equal(ccq_all_reduce(rt, 0, 0, a, oa, 64, CCQ_INT32, CCQ_SUM, devs, 2), CCQ_OK);
    assert_int_equal(pthread_create(&th, NULL, late_submit_main, &l), 0);
    uint64_t w0 = now_ms();
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    assert_int_equal(ccq_sync_collective(rt, 0, 0), CCQ_OK);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    uint64_t wall = now_ms() - w0;
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(l.status, CCQ_OK);
    double cpu_ms = (double)(c1.tv_sec - c0.tv_sec) * 1e3 + (double)(c1.tv_nsec - c0.tv_nsec) / 1e6;
    print_message("fence waited %llu ms using %.3f ms of CPU\n", (unsigned long long)wall, cpu_ms);
    assert_true(wall >= 100); /* it did wait for the late part */
    assert_true(cpu_ms < (double)wall / 4);
    assert_int_equal(ccq_sync_collective(rt, 1, 0), CCQ_OK);
    for (int i = 0; i < 64; i++)
        assert_int_equal(oa[i], i + 1);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fence_data_complete),
        cmocka_unit_test(test_fence_other_streams_unaffected),
        cmocka_unit_test(test_fence_idle_stream),
        cmocka_unit_test(test_fence_first_error_then_cleared),
        cmocka_unit_test(test_fence_invalid_arguments),
        cmocka_unit_test(test_fence_concurrent_fencers),
        cmocka_unit_test(test_fence_does_not_spin),
    };
    return cmocka_run_group_tests_name("fence", tests, NULL, NULL);
}
