/* Fence values (ccq_fence_begin/test/wait, docs/semantics.md "Fence values"): answers while
 * work is pending, short waits, the error rule (mismatch, watchdog timeout, abort,
 * shutdown reported to every value that covers them and to no other), ordering, the same
 * answer from every thread and every call, the history of cleared epochs, arguments. */
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

#include "ccq.h"

static ccq_runtime *make_rt(uint32_t devices, uint64_t timeout_ms, const char *fault)
{
    ccq_config cfg;
    ccq_runtime *rt = NULL;
    ccq_config_init(&cfg);
    cfg.host_devices = devices;
    cfg.timeout_ms = timeout_ms;
    cfg.fault = fault;
    assert_int_equal(ccq_runtime_create(&cfg, &rt), CCQ_OK);
    return rt;
}

static ccq_fence begin(ccq_runtime *rt, ccq_device_id d, ccq_stream_id s)
{
    ccq_fence f = 0;
    assert_int_equal(ccq_fence_begin(rt, d, s, &f), CCQ_OK);
    return f;
}

/* The value's answer, checked the same by test and by a (long) wait, twice each. */
static void expect_final(ccq_runtime *rt, ccq_device_id d, ccq_stream_id s, ccq_fence f,
                         ccq_status want, const char *detail_has)
{
    for (int k = 0; k < 2; k++) {
        ccq_status w = ccq_fence_wait(rt, d, s, f, 20000);
        if (w != want)
            fail_msg("wait: %s, want %s (%s)", ccq_status_name(w), ccq_status_name(want),
                     ccq_last_error_detail());
        if (detail_has != NULL && strstr(ccq_last_error_detail(), detail_has) == NULL)
            fail_msg("wait detail lacks \"%s\": %s", detail_has, ccq_last_error_detail());
        ccq_status t = ccq_fence_test(rt, d, s, f);
        if (t != want)
            fail_msg("test: %s, want %s (%s)", ccq_status_name(t), ccq_status_name(want),
                     ccq_last_error_detail());
        if (detail_has != NULL && strstr(ccq_last_error_detail(), detail_has) == NULL)
            fail_msg("test detail lacks \"%s\": %s", detail_has, ccq_last_error_detail());
    }
}

/* Pending work: IN_PROGRESS from test and from a short wait; the earlier value is done;
 * then the data is there once the value says OK; values are ordered. */
static void test_values_pending_then_done(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(2, 600000, NULL);
    ccq_device_id devs[2] = {0, 1};
    int32_t a[64], b[64], oa[64], ob[64];

    for (int i = 0; i < 64; i++) {
        a[i] = i;
        b[i] = 2;
    }
    assert_int_equal(ccq_comm_init(rt, devs, 2), CCQ_OK);
    ccq_fence f0 = begin(rt, 0, 0);
    assert_int_equal(ccq_fence_test(rt, 0, 0, f0), CCQ_OK); /* idle stream */
    assert_int_equal(ccq_all_reduce(rt, 0, 0, a, oa, 64, CCQ_INT32, CCQ_SUM, devs, 2), CCQ_OK);
    ccq_fence f1 = begin(rt, 0, 0);
    ccq_fence f1b = begin(rt, 0, 0);
    assert_true(f1 > f0);   /* ordered: it covers one more command */
    assert_true(f1b == f1); /* nothing submitted in between */
    for (int k = 0; k < 1000; k++)
        assert_int_equal(ccq_fence_test(rt, 0, 0, f1), CCQ_IN_PROGRESS);
    uint64_t t0 = now_ns();
    assert_int_equal(ccq_fence_wait(rt, 0, 0, f1, 30), CCQ_IN_PROGRESS);
    assert_true(now_ns() - t0 >= 25000000ull); /* it did wait (a lower bound only) */
    assert_non_null(strstr(ccq_last_error_detail(), "still pending"));
    assert_int_equal(ccq_fence_test(rt, 0, 0, f0), CCQ_OK); /* the earlier value is done */
    /* The other part arrives: the value completes and the data is there. */
    assert_int_equal(ccq_all_reduce(rt, 1, 0, b, ob, 64, CCQ_INT32, CCQ_SUM, devs, 2), CCQ_OK);
    expect_final(rt, 0, 0, f1, CCQ_OK, NULL);
    for (int i = 0; i < 64; i++)
        assert_int_equal(oa[i], i + 2);
    expect_final(rt, 1, 0, begin(rt, 1, 0), CCQ_OK, NULL);
    for (int i = 0; i < 64; i++)
        assert_int_equal(ob[i], i + 2);
    /* ccq_sync_collective is unchanged and does not disturb values. */
    assert_int_equal(ccq_sync_collective(rt, 0, 0), CCQ_OK);
    expect_final(rt, 0, 0, f1, CCQ_OK, NULL);
    expect_final(rt, 0, 0, f0, CCQ_OK, NULL);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

/* A mismatch is reported to every value that covers it, before and after
 * ccq_sync_collective reported (and cleared) it, and to no value that does not. */
static void test_values_mismatch_rule(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(2, 600000, NULL);
    ccq_device_id devs[2] = {0, 1};
    float x[8] = {0}, y[8] = {0}, ox[8], oy[8];
    const ccq_stream_id S = 3;

    assert_int_equal(ccq_comm_init(rt, devs, 2), CCQ_OK);
    ccq_fence f_none = begin(rt, 0, S);
    /* #0 good, #1 count mismatch, #2 good. */
    assert_int_equal(ccq_all_reduce(rt, 0, S, x, ox, 8, CCQ_FLOAT32, CCQ_SUM, devs, 2), CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 1, S, y, oy, 8, CCQ_FLOAT32, CCQ_SUM, devs, 2), CCQ_OK);
    ccq_fence f_good = begin(rt, 0, S);
    assert_int_equal(ccq_all_reduce(rt, 0, S, x, ox, 4, CCQ_FLOAT32, CCQ_SUM, devs, 2), CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 1, S, y, oy, 5, CCQ_FLOAT32, CCQ_SUM, devs, 2), CCQ_OK);
    ccq_fence f_bad = begin(rt, 0, S);
    assert_int_equal(ccq_all_reduce(rt, 0, S, x, ox, 8, CCQ_FLOAT32, CCQ_SUM, devs, 2), CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 1, S, y, oy, 8, CCQ_FLOAT32, CCQ_SUM, devs, 2), CCQ_OK);
    ccq_fence f_after = begin(rt, 0, S);

    expect_final(rt, 0, S, f_none, CCQ_OK, NULL);
    expect_final(rt, 0, S, f_good, CCQ_OK, NULL);
    expect_final(rt, 0, S, f_bad, CCQ_ERR_MISMATCH, "#1");
    expect_final(rt, 0, S, f_after, CCQ_ERR_MISMATCH, "#1");
    /* Values do not clear: the blocking fence still reports it, once. */
    assert_int_equal(ccq_sync_collective(rt, 0, S), CCQ_ERR_MISMATCH);
    assert_non_null(strstr(ccq_last_error_detail(), "#1"));
    assert_int_equal(ccq_sync_collective(rt, 0, S), CCQ_OK);
    /* After the clear: the same answers (the cleared epoch's record), and a new value does
     * not see the reported error. */
    expect_final(rt, 0, S, f_bad, CCQ_ERR_MISMATCH, "#1");
    expect_final(rt, 0, S, f_after, CCQ_ERR_MISMATCH, "#1");
    expect_final(rt, 0, S, f_good, CCQ_OK, NULL);
    ccq_fence f_new = begin(rt, 0, S);
    expect_final(rt, 0, S, f_new, CCQ_OK, NULL);
    char buf[512];
    assert_int_equal(ccq_stream_last_error(rt, 0, S, buf, sizeof buf), CCQ_ERR_MISMATCH);
    /* The other device's stream: its own values, its own (uncleared) error. */
    expect_final(rt, 1, S, begin(rt, 1, S), CCQ_ERR_MISMATCH, "#1");
    assert_int_equal(ccq_sync_collective(rt, 1, S), CCQ_ERR_MISMATCH);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

/* A second error after a clear goes to the values of the new epoch only; a value older than
 * 16 reports is refused with a detail. */
static void test_values_epochs_and_history(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(2, 600000, NULL);
    ccq_device_id devs[2] = {0, 1};
    float x[8] = {0}, y[8] = {0}, ox[8], oy[8];
    ccq_fence v[20];

    assert_int_equal(ccq_comm_init(rt, devs, 2), CCQ_OK);
    for (int r = 0; r < 20; r++) {
        /* A mismatch, a value covering it, the report. */
        assert_int_equal(ccq_all_reduce(rt, 0, 0, x, ox, 4, CCQ_FLOAT32, CCQ_SUM, devs, 2), CCQ_OK);
        assert_int_equal(ccq_all_reduce(rt, 1, 0, y, oy, 3, CCQ_FLOAT32, CCQ_SUM, devs, 2), CCQ_OK);
        v[r] = begin(rt, 0, 0);
        char want[16];
        snprintf(want, sizeof want, "#%d", r);
        expect_final(rt, 0, 0, v[r], CCQ_ERR_MISMATCH, want);
        assert_int_equal(ccq_sync_collective(rt, 0, 0), CCQ_ERR_MISMATCH);
        assert_int_equal(ccq_sync_collective(rt, 1, 0), CCQ_ERR_MISMATCH);
        /* Each earlier value still gets its own epoch's error while it is in the history. */
        for (int k = r; k >= 0 && r - k < 16; k--) {
            snprintf(want, sizeof want, "#%d", k);
            expect_final(rt, 0, 0, v[k], CCQ_ERR_MISMATCH, want);
        }
    }
    /* v[0] has seen 20 clears since: no record is kept. */
    assert_int_equal(ccq_fence_test(rt, 0, 0, v[0]), CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(ccq_last_error_detail(), "older than 16 error reports"));
    assert_int_equal(ccq_fence_test(rt, 0, 0, v[4]), CCQ_ERR_MISMATCH); /* 16 clears: kept */
    assert_int_equal(ccq_fence_test(rt, 0, 0, v[3]), CCQ_ERR_INVALID_ARGUMENT);
    assert_int_equal(ccq_fence_test(rt, 0, 0, begin(rt, 0, 0)), CCQ_OK);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

/* The watchdog's timeout (a part never submitted): reported to the values that cover it. */
static void test_values_watchdog_timeout(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(2, 200, NULL);
    ccq_device_id devs[2] = {0, 1};
    int32_t a[8] = {0}, oa[8];

    assert_int_equal(ccq_comm_init(rt, devs, 2), CCQ_OK);
    ccq_fence before = begin(rt, 0, 0);
    assert_int_equal(ccq_all_reduce(rt, 0, 0, a, oa, 8, CCQ_INT32, CCQ_SUM, devs, 2), CCQ_OK);
    ccq_fence f = begin(rt, 0, 0);
    assert_int_equal(ccq_fence_test(rt, 0, 0, f), CCQ_IN_PROGRESS);
    expect_final(rt, 0, 0, f, CCQ_ERR_TIMEOUT, "missing");
    expect_final(rt, 0, 0, before, CCQ_OK, NULL);
    assert_int_equal(fence_watchdog(rt, 0, 0, NULL, 0), CCQ_ERR_TIMEOUT);
    expect_final(rt, 0, 0, f, CCQ_ERR_TIMEOUT, "missing");
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

/* Issued work the watchdog aborts (fault injection holds the batch 5 s): both ranks' values
 * get CCQ_ERR_ABORTED, well before the 5 s. */
static void test_values_abort(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(2, 200, "delay:us=5000000,op=0,count=1");
    ccq_device_id devs[2] = {0, 1};
    int32_t a[8] = {0}, b[8] = {0}, oa[8], ob[8];

    assert_int_equal(ccq_comm_init(rt, devs, 2), CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 0, 0, a, oa, 8, CCQ_INT32, CCQ_SUM, devs, 2), CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 1, 0, b, ob, 8, CCQ_INT32, CCQ_SUM, devs, 2), CCQ_OK);
    ccq_fence f0 = begin(rt, 0, 0), f1 = begin(rt, 1, 0);
    uint64_t t0 = now_ns();
    expect_final(rt, 0, 0, f0, CCQ_ERR_ABORTED, "aborted");
    expect_final(rt, 1, 0, f1, CCQ_ERR_ABORTED, "aborted");
    assert_true(now_ns() - t0 < 4500000000ull);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

/* Shutdown cancels a part that can never run: its value gets CCQ_ERR_SHUTDOWN; the value
 * taken before it stays OK. */
static void test_values_shutdown(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(2, 600000, NULL);
    ccq_device_id devs[2] = {0, 1};
    int32_t a[8] = {0}, oa[8];

    assert_int_equal(ccq_comm_init(rt, devs, 2), CCQ_OK);
    ccq_fence before = begin(rt, 0, 1);
    assert_int_equal(ccq_all_reduce(rt, 0, 1, a, oa, 8, CCQ_INT32, CCQ_SUM, devs, 2), CCQ_OK);
    ccq_fence f = begin(rt, 0, 1);
    assert_int_equal(ccq_fence_test(rt, 0, 1, f), CCQ_IN_PROGRESS);
    assert_int_equal(ccq_runtime_shutdown(rt), CCQ_OK);
    expect_final(rt, 0, 1, f, CCQ_ERR_SHUTDOWN, "shutdown");
    expect_final(rt, 0, 1, before, CCQ_OK, NULL);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

/* Arguments: NULLs, bad device/stream, a value no begin on this stream gave. */
static void test_values_invalid(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(2, 600000, NULL);
    ccq_fence f = 0;

    assert_int_equal(ccq_fence_begin(NULL, 0, 0, &f), CCQ_ERR_INVALID_ARGUMENT);
    assert_int_equal(ccq_fence_begin(rt, 0, 0, NULL), CCQ_ERR_INVALID_ARGUMENT);
    assert_int_equal(ccq_fence_begin(rt, 2, 0, &f), CCQ_ERR_INVALID_ARGUMENT);
    assert_int_equal(ccq_fence_begin(rt, 0, 64, &f), CCQ_ERR_INVALID_ARGUMENT);
    assert_int_equal(ccq_fence_test(NULL, 0, 0, 0), CCQ_ERR_INVALID_ARGUMENT);
    assert_int_equal(ccq_fence_test(rt, 5, 0, 0), CCQ_ERR_INVALID_ARGUMENT);
    assert_int_equal(ccq_fence_wait(rt, 0, 99, 0, 1), CCQ_ERR_INVALID_ARGUMENT);
    assert_int_equal(ccq_fence_test(rt, 0, 0, begin(rt, 0, 0) + 5), CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(ccq_last_error_detail(), "not a value of this stream"));
    assert_int_equal(ccq_fence_wait(rt, 0, 0, 7, 1000), CCQ_ERR_INVALID_ARGUMENT);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

/*
 * Many threads: one submitter per device (rounds of all_reduce on stream 0; round BAD has a
 * count mismatch on device 3), each publishing a value after each round; testers test random
 * published values (never blocking) and wait on others, all at once. Every answer is
 * IN_PROGRESS or the value's final answer (OK for rounds < BAD, MISMATCH from BAD on), and
 * once final it never changes, whichever thread asks.
 */
enum { TD_DEV = 4, TD_ROUNDS = 300, TD_BAD = 150, TD_TESTERS = 4, TD_COUNT = 16 };

typedef struct td_shared {
    ccq_runtime *rt;
    _Atomic uint64_t published[TD_DEV]; /* rounds with a value in vals */
    ccq_fence vals[TD_DEV][TD_ROUNDS];
    _Atomic int final_seen[TD_DEV][TD_ROUNDS]; /* 0: none yet, else the answer + 100 */
    _Atomic int bad;                           /* a wrong or changed answer */
    _Atomic int submitters_done;
} td_shared;

typedef struct td_sub {
    td_shared *sh;
    ccq_device_id dev;
} td_sub;

static void *td_submitter(void *arg)
{
    td_sub *s = arg;
    td_shared *sh = s->sh;
    ccq_device_id devs[TD_DEV] = {0, 1, 2, 3};
    float *buf = calloc(TD_COUNT * 2, sizeof(float));
    for (int r = 0; r < TD_ROUNDS; r++) {
        size_t count = (r == TD_BAD && s->dev == 3) ? TD_COUNT - 1 : TD_COUNT;
        if (ccq_all_reduce(sh->rt, s->dev, 0, buf, buf + TD_COUNT, count, CCQ_FLOAT32, CCQ_SUM,
                           devs, TD_DEV) != CCQ_OK)
            atomic_store(&sh->bad, 1);
        if (ccq_fence_begin(sh->rt, s->dev, 0, &sh->vals[s->dev][r]) != CCQ_OK)
            atomic_store(&sh->bad, 2);
        atomic_store_explicit(&sh->published[s->dev], (uint64_t)r + 1, memory_order_release);
    }
    /* Wait for the last value, so the buffer stays borrowed until then. */
    if (ccq_fence_wait(sh->rt, s->dev, 0, sh->vals[s->dev][TD_ROUNDS - 1], 60000) !=
        CCQ_ERR_MISMATCH)
        atomic_store(&sh->bad, 3);
    free(buf);
    atomic_fetch_add(&sh->submitters_done, 1);
    return NULL;
}

static void td_check(td_shared *sh, uint32_t d, uint32_t r, ccq_status st)
{
    ccq_status want = r < TD_BAD ? CCQ_OK : CCQ_ERR_MISMATCH;
    if (st == CCQ_IN_PROGRESS) {
        if (atomic_load(&sh->final_seen[d][r]) != 0)
            atomic_store(&sh->bad, 10); /* final, then pending again */
        return;
    }
    if (st != want)
        atomic_store(&sh->bad, 11);
    int expect = 0;
    if (!atomic_compare_exchange_strong(&sh->final_seen[d][r], &expect, (int)st + 100) &&
        expect != (int)st + 100)
        atomic_store(&sh->bad, 12);
}

static void *td_tester(void *arg)
{
    td_shared *sh = arg;
    uint64_t x = (uint64_t)(uintptr_t)arg * 0x9e3779b97f4a7c15ull | 1;
    for (int it = 0; atomic_load(&sh->submitters_done) < TD_DEV || it < 2000; it++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        uint32_t d = (uint32_t)(x % TD_DEV);
        uint64_t n = atomic_load_explicit(&sh->published[d], memory_order_acquire);
        if (n == 0)
            continue;
        uint32_t r = (uint32_t)((x >> 8) % n);
        ccq_status st = (it % 16 == 0) ? ccq_fence_wait(sh->rt, d, 0, sh->vals[d][r], 1)
                                       : ccq_fence_test(sh->rt, d, 0, sh->vals[d][r]);
        td_check(sh, d, r, st);
    }
    return NULL;
}

static void test_values_many_threads(void **state)
{
    (void)state;
    td_shared *sh = calloc(1, sizeof *sh);
    assert_non_null(sh);
    sh->rt = make_rt(TD_DEV, 600000, NULL);
    ccq_device_id devs[TD_DEV] = {0, 1, 2, 3};
    assert_int_equal(ccq_comm_init(sh->rt, devs, TD_DEV), CCQ_OK);
    pthread_t sub[TD_DEV], tst[TD_TESTERS];
    td_sub subs[TD_DEV];
    for (uint32_t i = 0; i < TD_TESTERS; i++)
        assert_int_equal(pthread_create(&tst[i], NULL, td_tester, sh), 0);
    for (uint32_t d = 0; d < TD_DEV; d++) {
        subs[d] = (td_sub){sh, d};
        assert_int_equal(pthread_create(&sub[d], NULL, td_submitter, &subs[d]), 0);
    }
    for (uint32_t d = 0; d < TD_DEV; d++)
        assert_int_equal(pthread_join(sub[d], NULL), 0);
    for (uint32_t i = 0; i < TD_TESTERS; i++)
        assert_int_equal(pthread_join(tst[i], NULL), 0);
    assert_int_equal(atomic_load(&sh->bad), 0);
    /* Every value once more from this thread, then after the blocking fence's clear. */
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t d = 0; d < TD_DEV; d++)
            for (uint32_t r = 0; r < TD_ROUNDS; r++)
                td_check(sh, d, r, ccq_fence_test(sh->rt, d, 0, sh->vals[d][r]));
        assert_int_equal(atomic_load(&sh->bad), 0);
        for (uint32_t d = 0; pass == 0 && d < TD_DEV; d++) {
            assert_int_equal(ccq_sync_collective(sh->rt, d, 0), CCQ_ERR_MISMATCH);
            assert_int_equal(ccq_sync_collective(sh->rt, d, 0), CCQ_OK);
        }
    }
    assert_int_equal(ccq_runtime_destroy(sh->rt), CCQ_OK);
    free(sh);
}

/* A waiting ccq_fence_wait sleeps: it uses far less CPU than the time it waits. */
static void test_values_wait_sleeps(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(2, 600000, NULL);
    ccq_device_id devs[2] = {0, 1};
    int32_t a[8] = {0}, oa[8];
    struct timespec c0, c1;

    assert_int_equal(ccq_comm_init(rt, devs, 2), CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 0, 0, a, oa, 8, CCQ_INT32, CCQ_SUM, devs, 2), CCQ_OK);
    ccq_fence f = begin(rt, 0, 0);
    uint64_t w0 = now_ns();
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    assert_int_equal(ccq_fence_wait(rt, 0, 0, f, 300), CCQ_IN_PROGRESS);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    double wall_ms = (double)(now_ns() - w0) / 1e6;
    double cpu_ms = (double)(c1.tv_sec - c0.tv_sec) * 1e3 + (double)(c1.tv_nsec - c0.tv_nsec) / 1e6;
    print_message("fence_wait waited %.1f ms using %.3f ms of CPU\n", wall_ms, cpu_ms);
    assert_true(cpu_ms < wall_ms / 4);
    assert_int_equal(ccq_runtime_shutdown(rt), CCQ_OK);
    expect_final(rt, 0, 0, f, CCQ_ERR_SHUTDOWN, NULL);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

/* From inside an event callback (the scheduler thread), ccq_fence_wait is refused at once
 * (it would wait for its own scheduler); ccq_fence_test and ccq_fence_begin work. */
typedef struct cb_probe {
    ccq_runtime *rt;
    _Atomic int wait_st, test_st, calls;
} cb_probe;

static void probe_cb(const ccq_event *ev, void *user)
{
    cb_probe *p = user;
    ccq_fence f = 0;
    if (ev->type != CCQ_EV_SUBMITTED || atomic_fetch_add(&p->calls, 1) != 0)
        return;
    ccq_status b = ccq_fence_begin(p->rt, 0, 0, &f);
    atomic_store(&p->test_st, b != CCQ_OK ? -100 : (int)ccq_fence_test(p->rt, 0, 0, f));
    atomic_store(&p->wait_st, (int)ccq_fence_wait(p->rt, 0, 0, f, 1000));
}

static void test_values_inside_callback(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(2, 600000, NULL);
    ccq_device_id devs[2] = {0, 1};
    int32_t a[8] = {0}, b[8] = {0}, oa[8], ob[8];
    cb_probe p = {rt, 99, 99, 0};

    assert_int_equal(ccq_comm_init(rt, devs, 2), CCQ_OK);
    assert_int_equal(ccq_set_event_callback(rt, probe_cb, &p), CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 0, 0, a, oa, 8, CCQ_INT32, CCQ_SUM, devs, 2), CCQ_OK);
    assert_int_equal(ccq_all_reduce(rt, 1, 0, b, ob, 8, CCQ_INT32, CCQ_SUM, devs, 2), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 0, 0), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 1, 0), CCQ_OK);
    assert_int_equal(ccq_set_event_callback(rt, NULL, NULL), CCQ_OK);
    assert_true(atomic_load(&p.calls) >= 1);
    assert_int_equal(atomic_load(&p.wait_st), CCQ_ERR_INVALID_ARGUMENT);
    /* The first part is queued, the second may be too: pending or done, never an error. */
    int t = atomic_load(&p.test_st);
    assert_true(t == CCQ_IN_PROGRESS || t == CCQ_OK);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values_pending_then_done),
        cmocka_unit_test(test_values_mismatch_rule),
        cmocka_unit_test(test_values_epochs_and_history),
        cmocka_unit_test(test_values_watchdog_timeout),
        cmocka_unit_test(test_values_abort),
        cmocka_unit_test(test_values_shutdown),
        cmocka_unit_test(test_values_invalid),
        cmocka_unit_test(test_values_many_threads),
        cmocka_unit_test(test_values_wait_sleeps),
        cmocka_unit_test(test_values_inside_callback),
    };
    return cmocka_run_group_tests_name("fence_values", tests, NULL, NULL);
}
