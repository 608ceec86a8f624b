/* Fault injection (CCQ_FAULT / ccq_config.fault, docs/reliability.md): an injected backend
 * failure, a slow op and a rank that never submits reach exactly the streams they should,
 * other streams and communicators keep working, an aborted communicator refuses new work at
 * once, the watchdog names the missing rank, and every command ends exactly once (the
 * counters after shutdown equal what each scenario predicts). CCQ_TEST_VERBOSE=1 prints
 * the error details the fences return. */
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
#include <stdbool.h>
#include <time.h>

#include "ccq.h"
#include "ref.h"

#ifdef CCQ_TEST_FAKE_NCCL
/* Built a second time as test_faults_nccl_fake: the same scenarios on the NCCL backend, run
 * against the fake CUDA/NCCL (tests/fake), which executes collectives on host memory. Fault
 * injection is a runtime layer, so every scenario must behave exactly as on the host. */
#include "fake/fake_cuda_nccl.h"
#define TEST_BACKEND "nccl"
#else
#define TEST_BACKEND "host"
#endif

#define MAXR         8     /* ranks of the largest op built here */
#define DETAIL_LEN   1024  /* at least the library's detail length */
#define POISON_BYTE  0x5a  /* output buffers start as this; a failed op must leave them so */
#define LONG_TIMEOUT 20000 /* timeout_ms where the watchdog must not matter (slow sanitizers) */

/* ------------------------------------------------------------------------------------ */
/* Helpers                                                                               */
/* ------------------------------------------------------------------------------------ */

static bool verbose(void)
{
    const char *v = getenv("CCQ_TEST_VERBOSE");
    return v != NULL && *v != '\0' && strcmp(v, "0") != 0;
}

static void sleep_us(unsigned us)
{
    struct timespec ts = {(time_t)(us / 1000000u), (long)(us % 1000000u) * 1000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* A host runtime with `fault` set explicitly (so a CCQ_FAULT in the caller's environment
 * cannot change what a test injects). */
static ccq_runtime *make_rt(uint32_t devices, uint64_t timeout_ms, const char *fault)
{
    ccq_config cfg;
    ccq_runtime *rt = NULL;
    ccq_status st;

    ccq_config_init(&cfg);
    cfg.host_devices = devices;
    cfg.timeout_ms = timeout_ms;
    cfg.fault = fault;
    cfg.backend = TEST_BACKEND;
#ifdef CCQ_TEST_FAKE_NCCL
    fake_reset();
    fake_set_devices((int)devices, 9);
#endif
    st = ccq_runtime_create(&cfg, &rt);
    if (st != CCQ_OK)
        fail_msg("ccq_runtime_create (fault \"%s\"): %s: %s", fault ? fault : "(null)",
                 ccq_status_name(st), ccq_last_error_detail());
    assert_non_null(rt);
    return rt;
}

static void comm_init(ccq_runtime *rt, const ccq_device_id *devs, uint32_t n)
{
    ccq_status st = ccq_comm_init(rt, devs, n);
    if (st != CCQ_OK)
        fail_msg("ccq_comm_init: %s: %s", ccq_status_name(st), ccq_last_error_detail());
}

/*
 * The end of every scenario: shut down, then the counters must show every command ended
 * exactly once, in the numbers the scenario predicts.
 */
static void finish_ex(ccq_runtime *rt, uint64_t want_completed, uint64_t want_failed,
                      uint64_t want_cancelled)
{
    ccq_stats st;

    assert_int_equal(ccq_runtime_shutdown(rt), CCQ_OK);
    st = stats_of(rt);
    if (st.submitted != st.completed + st.failed + st.cancelled || st.pending != 0 ||
        st.completed != want_completed || st.failed != want_failed ||
        st.cancelled != want_cancelled)
        fail_msg("counters: submitted %llu completed %llu failed %llu cancelled %llu pending "
                 "%llu; want completed %llu failed %llu cancelled %llu pending 0",
                 (unsigned long long)st.submitted, (unsigned long long)st.completed,
                 (unsigned long long)st.failed, (unsigned long long)st.cancelled,
                 (unsigned long long)st.pending, (unsigned long long)want_completed,
                 (unsigned long long)want_failed, (unsigned long long)want_cancelled);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

/* Most scenarios fence everything before they shut down: nothing is cancelled. */
static void finish(ccq_runtime *rt, uint64_t want_completed, uint64_t want_failed)
{
    finish_ex(rt, want_completed, want_failed, 0);
}

/* Wait until the backend has been handed `n` operations in all (stats.batched_ops). The
 * host backend numbers operations in issue order, so submitting the next op only after
 * this makes its number known, without fencing (earlier ops may still be running). */
static void wait_issued(ccq_runtime *rt, uint64_t n)
{
    uint64_t deadline = now_ns() + 10000000000ull;
    while (stats_of(rt).batched_ops < n) {
        if (now_ns() > deadline)
            fail_msg("operation %llu was not issued within 10 s (batched_ops %llu)",
                     (unsigned long long)n - 1, (unsigned long long)stats_of(rt).batched_ops);
        sleep_us(100);
    }
    assert_int_equal(stats_of(rt).batched_ops, n);
}

/* Fences that hit their own deadline before the watchdog's report (see fence_expect). */
static unsigned fence_retries;

/*
 * A fence that must return `want`; for an error, its detail must contain `want_detail`
 * (and ccq_stream_last_error must report the same). The detail is copied to `out` (if
 * given) and printed with CCQ_TEST_VERBOSE.
 */
static void fence_expect(ccq_runtime *rt, ccq_device_id d, ccq_stream_id s, ccq_status want,
                         const char *want_detail, char *out, size_t outlen)
{
    char detail[DETAIL_LEN], last[DETAIL_LEN];
    uint64_t give_up = now_ns() + 5000000000ull;
    ccq_status st;

    for (;;) {
        st = ccq_sync_collective(rt, d, s);
        snprintf(detail, sizeof detail, "%s", ccq_last_error_detail());
        /* The fence's own deadline is timeout_ms plus a short grace (57 ms at 300 ms) from
         * the call. On a loaded machine (sanitizer runs of other tests on two cores) the
         * watchdog's verdict can miss it: that bare CCQ_ERR_TIMEOUT consumes nothing, so
         * fence again, for a bounded time, and still require the watchdog's verdict. */
        if (want == CCQ_OK || st != CCQ_ERR_TIMEOUT ||
            strstr(detail, "still pending after timeout_ms") == NULL || now_ns() > give_up)
            break;
        fence_retries++;
        if (verbose())
            printf("    fence device %u stream %u: own deadline first (%s); again\n", d, s, detail);
    }
    if (st != want)
        fail_msg("fence device %u stream %u: got %s, want %s (detail: %s)", d, s,
                 ccq_status_name(st), ccq_status_name(want), detail);
    if (want != CCQ_OK) {
        if (want_detail != NULL && strstr(detail, want_detail) == NULL)
            fail_msg("fence device %u stream %u: %s detail lacks \"%s\": %s", d, s,
                     ccq_status_name(st), want_detail, detail);
        assert_int_equal(ccq_stream_last_error(rt, d, s, last, sizeof last), want);
        assert_string_equal(last, detail);
        if (verbose())
            printf("    fence device %u stream %u -> %s: %s\n", d, s, ccq_status_name(st), detail);
    }
    if (out != NULL)
        snprintf(out, outlen, "%s", detail);
}

/* ------------------------------------------------------------------------------------ */
/* Operations with their buffers and expected results                                   */
/* ------------------------------------------------------------------------------------ */

/* One operation: an int32 sum all_reduce over `n` devices (rank order = sorted devices),
 * or a send/recv pair (rank 0 sends, rank 1 receives). Every part uses `stream`. */
typedef struct xop {
    bool p2p;
    uint32_t n;
    ccq_device_id dev[MAXR];
    ccq_device_id set[MAXR]; /* the set as given to the call (any order) */
    ccq_stream_id stream;
    size_t count;
    int32_t *src[MAXR], *dst[MAXR], *want;
} xop;

static int32_t *xalloc(size_t count)
{
    int32_t *p = malloc((count ? count : 1) * sizeof *p);
    assert_non_null(p);
    return p;
}

static void xop_init_ar(xop *o, const ccq_device_id *devs, uint32_t n, ccq_stream_id s,
                        size_t count, uint32_t seed)
{
    const void *inputs[MAXR];

    memset(o, 0, sizeof *o);
    assert_true(n >= 1 && n <= MAXR);
    o->n = n;
    o->stream = s;
    o->count = count;
    memcpy(o->set, devs, n * sizeof *devs);
    memcpy(o->dev, devs, n * sizeof *devs);
    for (uint32_t i = 1; i < n; i++)
        for (uint32_t j = i; j > 0 && o->dev[j - 1] > o->dev[j]; j--) {
            ccq_device_id t = o->dev[j];
            o->dev[j] = o->dev[j - 1];
            o->dev[j - 1] = t;
        }
    for (uint32_t r = 0; r < n; r++) {
        o->src[r] = xalloc(count);
        o->dst[r] = xalloc(count);
        ref_fill(CCQ_INT32, o->src[r], count, seed + 7 * r);
        memset(o->dst[r], POISON_BYTE, count * sizeof(int32_t));
        inputs[r] = o->src[r];
    }
    o->want = xalloc(count);
    ref_allreduce(CCQ_INT32, CCQ_SUM, n, inputs, o->want, count);
}

static void xop_init_p2p(xop *o, ccq_device_id from, ccq_device_id to, ccq_stream_id s,
                         size_t count, uint32_t seed)
{
    memset(o, 0, sizeof *o);
    o->p2p = true;
    o->n = 2;
    o->dev[0] = from;
    o->dev[1] = to;
    o->stream = s;
    o->count = count;
    o->src[0] = xalloc(count);
    ref_fill(CCQ_INT32, o->src[0], count, seed);
    o->dst[1] = xalloc(count);
    memset(o->dst[1], POISON_BYTE, count * sizeof(int32_t));
    o->want = xalloc(count);
    memcpy(o->want, o->src[0], count * sizeof(int32_t));
}

static void xop_free(xop *o)
{
    for (uint32_t r = 0; r < MAXR; r++) {
        free(o->src[r]);
        free(o->dst[r]);
    }
    free(o->want);
    memset(o, 0, sizeof *o);
}

static void xop_submit(ccq_runtime *rt, const xop *o)
{
    for (uint32_t r = 0; r < o->n; r++) {
        ccq_status st;
        if (!o->p2p)
            st = ccq_all_reduce(rt, o->dev[r], o->stream, o->src[r], o->dst[r], o->count, CCQ_INT32,
                                CCQ_SUM, o->set, o->n);
        else if (r == 0)
            st = ccq_send(rt, o->dev[0], o->stream, o->src[0], o->count, CCQ_INT32, o->dev[1]);
        else
            st = ccq_recv(rt, o->dev[1], o->stream, o->dst[1], o->count, CCQ_INT32, o->dev[0]);
        if (st != CCQ_OK)
            fail_msg("submit on device %u stream %u: %s: %s", o->dev[r], o->stream,
                     ccq_status_name(st), ccq_last_error_detail());
    }
}

/* Whether stream (d, s) takes part in the op. */
static bool xop_has(const xop *o, ccq_device_id d, ccq_stream_id s)
{
    if (s != o->stream)
        return false;
    for (uint32_t r = 0; r < o->n; r++)
        if (o->dev[r] == d)
            return true;
    return false;
}

static bool all_poison(const int32_t *p, size_t count)
{
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < count * sizeof *p; i++)
        if (b[i] != POISON_BYTE)
            return false;
    return true;
}

/* ok: every output holds the reference result; !ok: every output is untouched. */
static void xop_check(const xop *o, bool ok, const char *what)
{
    char msg[256];
    for (uint32_t r = 0; r < o->n; r++) {
        if (o->dst[r] == NULL)
            continue;
        if (ok) {
            size_t bad = ref_compare(CCQ_INT32, o->dst[r], o->want, o->count, msg, sizeof msg);
            if (bad != 0)
                fail_msg("%s: rank %u (device %u): %zu wrong, first: %s", what, r, o->dev[r], bad,
                         msg);
        } else if (!all_poison(o->dst[r], o->count)) {
            fail_msg("%s: rank %u (device %u): the failed op wrote its output", what, r, o->dev[r]);
        }
    }
}

/* Fence every stream of the op expecting `want`. */
static void xop_fence(ccq_runtime *rt, const xop *o, ccq_status want, const char *want_detail)
{
    for (uint32_t r = 0; r < o->n; r++)
        fence_expect(rt, o->dev[r], o->stream, want, want_detail, NULL, 0);
}

/* ------------------------------------------------------------------------------------ */
/* fail:op=N and fail:every=K                                                            */
/* ------------------------------------------------------------------------------------ */

/*
 * One round: five independent operations on four devices, each on its own streams:
 * {0,1} and {2,3} on stream 0, {0,1,2,3} on stream 1, send 0->2 on stream 2, send 3->1 on
 * stream 3. Twelve commands.
 */
enum { ROUND_OPS = 5, ROUND_CMDS = 12, ROUNDS = 3, NSTREAMS = 12 };

static const ccq_device_id SET01[2] = {1, 0}, SET23[2] = {3, 2}, WORLD[4] = {2, 0, 3, 1};

static const struct {
    ccq_device_id d;
    ccq_stream_id s;
} ROUND_STREAMS[NSTREAMS] = {{0, 0}, {1, 0}, {2, 0}, {3, 0}, {0, 1}, {1, 1},
                             {2, 1}, {3, 1}, {0, 2}, {2, 2}, {3, 3}, {1, 3}};

static void make_op(xop *o, uint32_t kind, size_t count, uint32_t seed)
{
    switch (kind % ROUND_OPS) {
    case 0:
        xop_init_ar(o, SET01, 2, 0, count, seed);
        break;
    case 1:
        xop_init_ar(o, SET23, 2, 0, count, seed);
        break;
    case 2:
        xop_init_ar(o, WORLD, 4, 1, count, seed);
        break;
    case 3:
        xop_init_p2p(o, 0, 2, 2, count, seed);
        break;
    default:
        xop_init_p2p(o, 3, 1, 3, count, seed);
        break;
    }
}

static void init_round_comms(ccq_runtime *rt)
{
    comm_init(rt, SET01, 2);
    comm_init(rt, SET23, 2);
    comm_init(rt, WORLD, 4);
}

/*
 * fail:op=N with all five kinds of op in flight. ROUNDS rounds are submitted one op at a
 * time, each only once the previous one was issued (so op i is the i-th the backend runs)
 * and nothing fenced in between, so several commands are outstanding on every stream. Then
 * each stream's fence: CCQ_ERR_BACKEND exactly where op N ran, CCQ_OK elsewhere; every
 * other op's data is right and op N's outputs are untouched. A last round on the same
 * communicators and streams then works: a backend failure does not abort a communicator.
 * Round 1 is big enough (1.2 MB per buffer) to run in chunks on the workers.
 */
static void run_fail_op(uint32_t n_fail)
{
    static const size_t sizes[ROUNDS + 1] = {1000, 300000, 77, 4099};
    xop ops[ROUNDS + 1][ROUND_OPS];
    char spec[64];
    const xop *bad;
    uint64_t issued = 0;
    ccq_runtime *rt;

    assert_true(n_fail < ROUNDS * ROUND_OPS);
    snprintf(spec, sizeof spec, "fail:op=%u", n_fail);
    rt = make_rt(4, LONG_TIMEOUT, spec);
    init_round_comms(rt);
    for (uint32_t r = 0; r < ROUNDS; r++)
        for (uint32_t k = 0; k < ROUND_OPS; k++) {
            make_op(&ops[r][k], k, sizes[r], 100 * r + 10 * k);
            xop_submit(rt, &ops[r][k]);
            wait_issued(rt, ++issued);
        }
    bad = &ops[n_fail / ROUND_OPS][n_fail % ROUND_OPS];
    for (uint32_t k = 0; k < NSTREAMS; k++) {
        ccq_device_id d = ROUND_STREAMS[k].d;
        ccq_stream_id s = ROUND_STREAMS[k].s;
        bool hit = xop_has(bad, d, s);
        fence_expect(rt, d, s, hit ? CCQ_ERR_BACKEND : CCQ_OK, "fault injection", NULL, 0);
    }
    for (uint32_t r = 0; r < ROUNDS; r++)
        for (uint32_t k = 0; k < ROUND_OPS; k++) {
            char what[64];
            snprintf(what, sizeof what, "round %u op %u (op #%u)", r, k, r * ROUND_OPS + k);
            xop_check(&ops[r][k], &ops[r][k] != bad, what);
        }
    /* The same communicators and streams again, all submitted at once: all complete. */
    for (uint32_t k = 0; k < ROUND_OPS; k++) {
        make_op(&ops[ROUNDS][k], k, sizes[ROUNDS], 1000 + k);
        xop_submit(rt, &ops[ROUNDS][k]);
    }
    for (uint32_t k = 0; k < NSTREAMS; k++)
        fence_expect(rt, ROUND_STREAMS[k].d, ROUND_STREAMS[k].s, CCQ_OK, NULL, NULL, 0);
    for (uint32_t k = 0; k < ROUND_OPS; k++)
        xop_check(&ops[ROUNDS][k], true, "after the failure");

    finish(rt, (ROUNDS + 1) * ROUND_CMDS - bad->n, bad->n);
    for (uint32_t r = 0; r <= ROUNDS; r++)
        for (uint32_t k = 0; k < ROUND_OPS; k++)
            xop_free(&ops[r][k]);
}

/* The failed op is the 4-rank all_reduce of the big round (it runs in chunks). */
static void test_fail_op_world(void **state)
{
    (void)state;
    run_fail_op(1 * ROUND_OPS + 2);
}

/* The failed op is a 2-rank all_reduce, {2,3}, of the first round. */
static void test_fail_op_pair(void **state)
{
    (void)state;
    run_fail_op(0 * ROUND_OPS + 1);
}

/* The failed op is a send/recv pair (0 -> 2) of the last round. */
static void test_fail_op_sendrecv(void **state)
{
    (void)state;
    run_fail_op(2 * ROUND_OPS + 3);
}

/*
 * fail:every=K over M ops, each fenced before the next: exactly ops K-1, 2K-1, ... fail
 * (floor(M/K) of them) on exactly their streams, the others complete with correct data.
 */
static void test_fail_every(void **state)
{
    enum { M = 53, K = 7 };
    ccq_runtime *rt;
    uint64_t failed_cmds = 0, all_cmds = 0;
    uint32_t failed_ops = 0;

    (void)state;
    rt = make_rt(4, LONG_TIMEOUT, "fail:every=7");
    init_round_comms(rt);
    for (uint32_t i = 0; i < M; i++) {
        xop o;
        bool fails = (i + 1) % K == 0;
        char what[64];
        make_op(&o, i, 64 + 13 * i, 5000 + i);
        xop_submit(rt, &o);
        xop_fence(rt, &o, fails ? CCQ_ERR_BACKEND : CCQ_OK, "fault injection");
        snprintf(what, sizeof what, "op %u", i);
        xop_check(&o, !fails, what);
        all_cmds += o.n;
        if (fails) {
            failed_cmds += o.n;
            failed_ops++;
        }
        xop_free(&o);
    }
    assert_int_equal(failed_ops, M / K);
    /* Streams untouched by the failures had nothing to report. */
    for (uint32_t k = 0; k < NSTREAMS; k++)
        fence_expect(rt, ROUND_STREAMS[k].d, ROUND_STREAMS[k].s, CCQ_OK, NULL, NULL, 0);
    finish(rt, all_cmds - failed_cmds, failed_cmds);
}

/* fail:op=N,count=C: ops N .. N+C-1 fail, on a mix of collectives and send/recv. */
static void test_fail_op_count(void **state)
{
    enum { M = 12, FIRST = 3, COUNT = 4 };
    ccq_runtime *rt;
    uint64_t failed_cmds = 0, all_cmds = 0;

    (void)state;
    rt = make_rt(4, LONG_TIMEOUT, "fail:op=3,count=4");
    init_round_comms(rt);
    for (uint32_t i = 0; i < M; i++) {
        xop o;
        bool fails = i >= FIRST && i < FIRST + COUNT;
        char what[64];
        make_op(&o, i, 100 + i, 7000 + i);
        xop_submit(rt, &o);
        xop_fence(rt, &o, fails ? CCQ_ERR_BACKEND : CCQ_OK, "fault injection");
        snprintf(what, sizeof what, "op %u", i);
        xop_check(&o, !fails, what);
        all_cmds += o.n;
        failed_cmds += fails ? o.n : 0;
        xop_free(&o);
    }
    finish(rt, all_cmds - failed_cmds, failed_cmds);
}

/* ------------------------------------------------------------------------------------ */
/* delay:us=U                                                                            */
/* ------------------------------------------------------------------------------------ */

/*
 * A slow op (delay 5 s) on {0,1} with timeout_ms = 300: while it hangs, {2,3}, the
 * 4-device communicator (which shares devices 0 and 1, on another stream) and send/recv
 * 0 -> 2 keep working. The watchdog aborts it: its fences return CCQ_ERR_ABORTED naming
 * the watchdog, well before the 5 s are up, with the outputs untouched. Then every new
 * submission on {0,1} (all_reduce, send and recv between 0 and 1) fails in the call with
 * CCQ_ERR_ABORTED and queues nothing, and the other communicators still work.
 */
static void test_delay_watchdog_aborts(void **state)
{
    static const ccq_device_id set01[2] = {0, 1};
    ccq_runtime *rt;
    xop x0, y1, slow, y3, w4, p5, y6, w7, p8;
    uint64_t t0, waited_ms, before, cmds = 0;
    char detail[DETAIL_LEN];
    int32_t buf[16], out[16];

    (void)state;
    rt = make_rt(4, 300, "delay:us=5000000,op=2,count=1");
    init_round_comms(rt);
    /* Ops 0 and 1 are fast. */
    make_op(&x0, 0, 256, 1);
    xop_submit(rt, &x0);
    xop_fence(rt, &x0, CCQ_OK, NULL);
    xop_check(&x0, true, "op 0 on {0,1}");
    make_op(&y1, 1, 256, 2);
    xop_submit(rt, &y1);
    xop_fence(rt, &y1, CCQ_OK, NULL);
    xop_check(&y1, true, "op 1 on {2,3}");
    /* Op 2 hangs on a worker. */
    make_op(&slow, 0, 256, 3);
    t0 = now_ns();
    xop_submit(rt, &slow);
    wait_issued(rt, 3);
    /* Meanwhile the other communicators work. */
    make_op(&y3, 1, 256, 4);
    make_op(&w4, 2, 256, 5);
    make_op(&p5, 3, 256, 6);
    xop_submit(rt, &y3);
    xop_submit(rt, &w4);
    xop_submit(rt, &p5);
    xop_fence(rt, &y3, CCQ_OK, NULL);
    xop_fence(rt, &w4, CCQ_OK, NULL);
    xop_fence(rt, &p5, CCQ_OK, NULL);
    xop_check(&y3, true, "{2,3} while {0,1} hangs");
    xop_check(&w4, true, "{0,1,2,3} while {0,1} hangs");
    xop_check(&p5, true, "send 0->2 while {0,1} hangs");
    /* The watchdog aborts the slow op. */
    fence_expect(rt, 0, 0, CCQ_ERR_ABORTED, "watchdog", detail, sizeof detail);
    fence_expect(rt, 1, 0, CCQ_ERR_ABORTED, "watchdog", NULL, 0);
    waited_ms = (now_ns() - t0) / 1000000u;
    if (waited_ms < 250 || waited_ms > 3000)
        fail_msg("the slow op ended after %llu ms; want about timeout_ms = 300 (it is delayed "
                 "5000 ms unless aborted)",
                 (unsigned long long)waited_ms);
    xop_check(&slow, false, "the aborted op");
    if (verbose())
        printf("    aborted after %llu ms\n", (unsigned long long)waited_ms);

    /* Fail fast: refused in the call, nothing queued. */
    memset(buf, 0, sizeof buf);
    before = stats_of(rt).submitted;
    assert_int_equal(ccq_all_reduce(rt, 0, 0, buf, out, 16, CCQ_INT32, CCQ_SUM, set01, 2),
                     CCQ_ERR_ABORTED);
    snprintf(detail, sizeof detail, "%s", ccq_last_error_detail());
    if (strstr(detail, "aborted") == NULL || strstr(detail, "watchdog") == NULL)
        fail_msg("refused all_reduce: detail does not say aborted by the watchdog: %s", detail);
    if (verbose())
        printf("    ccq_all_reduce on the aborted communicator -> CCQ_ERR_ABORTED: %s\n", detail);
    assert_int_equal(ccq_all_reduce(rt, 1, 5, buf, buf, 16, CCQ_INT32, CCQ_SUM, set01, 2),
                     CCQ_ERR_ABORTED);
    assert_int_equal(ccq_send(rt, 0, 4, buf, 16, CCQ_INT32, 1), CCQ_ERR_ABORTED);
    assert_int_equal(ccq_recv(rt, 0, 4, out, 16, CCQ_INT32, 1), CCQ_ERR_ABORTED);
    assert_int_equal(ccq_send(rt, 1, 4, buf, 16, CCQ_INT32, 0), CCQ_ERR_ABORTED);
    assert_int_equal(ccq_comm_init(rt, set01, 2), CCQ_ERR_ABORTED);
    assert_int_equal(stats_of(rt).submitted, before);
    /* The error was reported once; nothing new is pending on those streams. */
    fence_expect(rt, 0, 0, CCQ_OK, NULL, NULL, 0);
    fence_expect(rt, 1, 0, CCQ_OK, NULL, NULL, 0);

    /* Other communicators, including ones sharing devices 0 and 1, still work. */
    make_op(&y6, 1, 999, 7);
    make_op(&w7, 2, 999, 8);
    make_op(&p8, 4, 999, 9);
    xop_submit(rt, &y6);
    xop_submit(rt, &w7);
    xop_submit(rt, &p8);
    xop_fence(rt, &y6, CCQ_OK, NULL);
    xop_fence(rt, &w7, CCQ_OK, NULL);
    xop_fence(rt, &p8, CCQ_OK, NULL);
    xop_check(&y6, true, "{2,3} after the abort");
    xop_check(&w7, true, "{0,1,2,3} after the abort");
    xop_check(&p8, true, "send 3->1 after the abort");

    cmds = x0.n + y1.n + y3.n + w4.n + p5.n + y6.n + w7.n + p8.n;
    finish(rt, cmds, slow.n);
    xop_free(&x0);
    xop_free(&y1);
    xop_free(&slow);
    xop_free(&y3);
    xop_free(&w4);
    xop_free(&p5);
    xop_free(&y6);
    xop_free(&w7);
    xop_free(&p8);
}

/* M ops one at a time under `fault`, each fenced: every one completes correctly, nothing
 * fails, and ops slow_first..slow_last end at least slow_ms after their submission. */
static void slow_ops_complete(const char *fault, uint32_t m, uint32_t slow_first,
                              uint32_t slow_last, unsigned slow_ms)
{
    ccq_runtime *rt = make_rt(4, 300, fault);
    uint64_t cmds = 0;

    init_round_comms(rt);
    for (uint32_t i = 0; i < m; i++) {
        xop o;
        uint64_t t0, ms;
        char what[64];
        make_op(&o, i % 2 ? 2 : 3, 512, 300 + i);
        t0 = now_ns();
        xop_submit(rt, &o);
        xop_fence(rt, &o, CCQ_OK, NULL);
        ms = (now_ns() - t0) / 1000000u;
        snprintf(what, sizeof what, "op %u", i);
        xop_check(&o, true, what);
        if (i >= slow_first && i <= slow_last && ms + 5 < slow_ms)
            fail_msg("%s: op %u should take %u ms more but completed after %llu ms", fault, i,
                     slow_ms, (unsigned long long)ms);
        if (verbose())
            printf("    op %u: %llu ms\n", i, (unsigned long long)ms);
        cmds += o.n;
        xop_free(&o);
    }
    finish(rt, cmds, 0);
}

/* A delay shorter than timeout_ms: ops 1 and 2 take at least 60 ms longer and complete
 * correctly; nothing fails. */
static void test_delay_short_completes(void **state)
{
    (void)state;
    slow_ops_complete("delay:us=60000,op=1,count=2", 5, 1, 2, 60);
}

/* stall shorter than timeout_ms: the scheduler stands still once, right after issuing op 1
 * (as a stopped or preempted process); op 1 ends that much later, every op completes
 * correctly and nothing fails. (Past timeout_ms across processes: test_host_drills late.) */
static void test_stall_short_completes(void **state)
{
    (void)state;
    slow_ops_complete("stall:us=80000,op=1", 4, 1, 1, 80);
}

/*
 * The watchdog aborts a whole batch: a fast op on another communicator that went into the
 * same backend group as the slow one is aborted with it (as a hung NCCL group would take
 * all its communicators). Built deterministically: on device 0 stream 0 the part of {0,2}
 * comes first and the part of {0,1} after it, so {0,1} cannot be issued before {0,2} is
 * complete, and the part of {0,2} on device 2 comes last: both go into one batch, in
 * communicator order ({0,1} was created first: op 1, delayed; {0,2}: op 2). {2,3}, in no
 * batch with them, keeps working. The fast op is reported aborted even when the backend
 * finished it before the watchdog's abort of its communicator reached it (abort_batch
 * aborts the communicators one by one; a 20 ms sleep between them made that visible).
 */
static void test_delay_abort_takes_batch(void **state)
{
    static const ccq_device_id x[2] = {0, 1}, z[2] = {0, 2}, q[2] = {2, 3};
    ccq_runtime *rt;
    xop q0, xs, zf, q3, p4;
    int32_t buf[8];

    (void)state;
    rt = make_rt(4, 300, "delay:us=5000000,op=1,count=1");
    comm_init(rt, x, 2);
    comm_init(rt, z, 2);
    comm_init(rt, q, 2);
    xop_init_ar(&q0, q, 2, 0, 64, 40); /* op 0 */
    xop_submit(rt, &q0);
    xop_fence(rt, &q0, CCQ_OK, NULL);
    xop_check(&q0, true, "op 0 on {2,3}");
    xop_init_ar(&zf, z, 2, 0, 64, 41);
    xop_init_ar(&xs, x, 2, 0, 64, 42);
    assert_int_equal(ccq_all_reduce(rt, 0, 0, zf.src[0], zf.dst[0], 64, CCQ_INT32, CCQ_SUM, z, 2),
                     CCQ_OK);
    xop_submit(rt, &xs);
    wait_issued(rt, 1); /* nothing more can be issued yet */
    assert_int_equal(ccq_all_reduce(rt, 2, 0, zf.src[1], zf.dst[1], 64, CCQ_INT32, CCQ_SUM, z, 2),
                     CCQ_OK);
    wait_issued(rt, 3);
    assert_int_equal(stats_of(rt).batches, 2);
    /* {2,3} on another stream of device 2 works while the batch hangs. */
    xop_init_ar(&q3, q, 2, 1, 64, 43);
    xop_submit(rt, &q3);
    xop_fence(rt, &q3, CCQ_OK, NULL);
    xop_check(&q3, true, "{2,3} while the batch hangs");
    /* Both communicators of the batch are aborted. */
    fence_expect(rt, 0, 0, CCQ_ERR_ABORTED, "watchdog", NULL, 0);
    fence_expect(rt, 1, 0, CCQ_ERR_ABORTED, "watchdog", NULL, 0);
    fence_expect(rt, 2, 0, CCQ_ERR_ABORTED, "watchdog", NULL, 0);
    xop_check(&xs, false, "the delayed op");
    memset(buf, 0, sizeof buf);
    assert_int_equal(ccq_all_reduce(rt, 0, 1, buf, buf, 8, CCQ_INT32, CCQ_SUM, x, 2),
                     CCQ_ERR_ABORTED);
    assert_int_equal(ccq_all_reduce(rt, 2, 1, buf, buf, 8, CCQ_INT32, CCQ_SUM, z, 2),
                     CCQ_ERR_ABORTED);
    assert_int_equal(ccq_send(rt, 2, 2, buf, 8, CCQ_INT32, 0), CCQ_ERR_ABORTED);
    /* {2,3} still works, also as the pair of send 3 -> 2. */
    xop_init_p2p(&p4, 3, 2, 3, 64, 44);
    xop_submit(rt, &p4);
    xop_fence(rt, &p4, CCQ_OK, NULL);
    xop_check(&p4, true, "send 3->2 after the abort");

    finish(rt, q0.n + q3.n + p4.n, xs.n + zf.n);
    xop_free(&q0);
    xop_free(&xs);
    xop_free(&zf);
    xop_free(&q3);
    xop_free(&p4);
}

/*
 * Shutdown while a slow op is issued: shutdown waits (at most timeout_ms) for issued work
 * and does not wait for the 5 s delay: the op is aborted, its commands end failed
 * (CCQ_ERR_ABORTED, not cancelled) and the fences after shutdown say why.
 */
static void test_delay_then_shutdown(void **state)
{
    ccq_runtime *rt;
    xop fast, slow;
    ccq_stats st;
    uint64_t t0, ms;

    (void)state;
    rt = make_rt(4, 300, "delay:us=5000000,op=1");
    init_round_comms(rt);
    make_op(&fast, 2, 100, 50);
    xop_submit(rt, &fast);
    xop_fence(rt, &fast, CCQ_OK, NULL);
    xop_check(&fast, true, "op 0");
    make_op(&slow, 1, 100, 51);
    xop_submit(rt, &slow);
    wait_issued(rt, 2);
    t0 = now_ns();
    assert_int_equal(ccq_runtime_shutdown(rt), CCQ_OK);
    ms = (now_ns() - t0) / 1000000u;
    if (ms > 3000)
        fail_msg("shutdown took %llu ms with a 5 s op in flight; want about timeout_ms = 300",
                 (unsigned long long)ms);
    /* The watchdog's deadline (issue + timeout_ms) comes just before shutdown's own
     * (shutdown + timeout_ms); either one aborts it. */
    xop_fence(rt, &slow, CCQ_ERR_ABORTED, "communicator aborted");
    xop_check(&slow, false, "the op aborted by shutdown");
    st = stats_of(rt);
    assert_int_equal(st.failed, slow.n);
    finish(rt, fast.n, slow.n);
    xop_free(&fast);
    xop_free(&slow);
}

/* ------------------------------------------------------------------------------------ */
/* drop:rank=R                                                                           */
/* ------------------------------------------------------------------------------------ */

/*
 * drop:rank=2,count=1 on the communicator {1,2,3} (device 2 is rank 1 there): device 2's
 * part is dropped, so its own fence reports the drop at once while devices 1 and 3 time
 * out with a detail naming rank 1 (device 2). Meanwhile {0,1} on another stream works. With
 * count=1 the next collective on {1,2,3} completes on every rank.
 */
static void test_drop_rank_count1(void **state)
{
    static const ccq_device_id set123[3] = {3, 1, 2}, set01[2] = {0, 1};
    ccq_runtime *rt;
    xop lost, side, again;
    uint64_t t0, ms;

    (void)state;
    rt = make_rt(4, 300, "drop:rank=2,count=1");
    comm_init(rt, set123, 3);
    comm_init(rt, set01, 2);
    xop_init_ar(&lost, set123, 3, 0, 333, 11);
    t0 = now_ns();
    xop_submit(rt, &lost);
    /* Device 2's own stream: the injected drop, without waiting for the watchdog. */
    fence_expect(rt, 2, 0, CCQ_ERR_BACKEND, "dropped by fault injection (CCQ_FAULT drop:rank=2)",
                 NULL, 0);
    ms = (now_ns() - t0) / 1000000u;
    if (ms >= 250)
        fail_msg("the dropped rank's fence took %llu ms; want it at once", (unsigned long long)ms);
    /* Another communicator over device 1, on another stream, is not held up. */
    xop_init_ar(&side, set01, 2, 1, 333, 12);
    xop_submit(rt, &side);
    xop_fence(rt, &side, CCQ_OK, NULL);
    xop_check(&side, true, "{0,1} while device 2 is missing");
    /* The waiting ranks time out, naming the missing one. */
    fence_expect(rt, 1, 0, CCQ_ERR_TIMEOUT, "missing rank 1 (device 2)", NULL, 0);
    fence_expect(rt, 3, 0, CCQ_ERR_TIMEOUT, "missing rank 1 (device 2)", NULL, 0);
    ms = (now_ns() - t0) / 1000000u;
    if (ms < 250)
        fail_msg("the waiting ranks timed out after %llu ms; want timeout_ms = 300",
                 (unsigned long long)ms);
    xop_check(&lost, false, "the collective missing device 2");
    /* count=1: the next one has every rank and completes. */
    xop_init_ar(&again, set123, 3, 0, 333, 13);
    xop_submit(rt, &again);
    xop_fence(rt, &again, CCQ_OK, NULL);
    xop_check(&again, true, "{1,2,3} after the drop");

    finish(rt, side.n + again.n, lost.n);
    xop_free(&lost);
    xop_free(&side);
    xop_free(&again);
}

/*
 * drop:rank=3,after=2 (count unlimited) on {0,1,2,3}: the first two collectives complete;
 * from the third on, device 3's part is dropped every time: device 3 sees the drop, the
 * other three time out naming rank 3 (device 3).
 */
static void test_drop_rank_after(void **state)
{
    enum { M = 4, AFTER = 2 };
    static const ccq_device_id world[4] = {0, 1, 2, 3};
    ccq_runtime *rt;
    uint64_t done = 0, failed = 0;

    (void)state;
    rt = make_rt(4, 300, "drop:rank=3,after=2");
    comm_init(rt, world, 4);
    for (uint32_t i = 0; i < M; i++) {
        xop o;
        char what[64];
        xop_init_ar(&o, world, 4, 0, 128, 20 + i);
        xop_submit(rt, &o);
        if (i < AFTER) {
            xop_fence(rt, &o, CCQ_OK, NULL);
            done += o.n;
        } else {
            fence_expect(rt, 3, 0, CCQ_ERR_BACKEND, "drop:rank=3", NULL, 0);
            for (ccq_device_id d = 0; d < 3; d++)
                fence_expect(rt, d, 0, CCQ_ERR_TIMEOUT, "missing rank 3 (device 3)", NULL, 0);
            failed += o.n;
        }
        snprintf(what, sizeof what, "collective %u", i);
        xop_check(&o, i < AFTER, what);
        xop_free(&o);
    }
    finish(rt, done, failed);
}

/* A dropped send: the recv on the peer times out naming the missing send. */
static void test_drop_rank_sendrecv(void **state)
{
    ccq_runtime *rt;
    xop o, again;

    (void)state;
    rt = make_rt(4, 300, "drop:rank=0,count=1");
    xop_init_p2p(&o, 0, 3, 2, 100, 31);
    xop_submit(rt, &o);
    fence_expect(rt, 0, 2, CCQ_ERR_BACKEND, "drop:rank=0", NULL, 0);
    fence_expect(rt, 3, 2, CCQ_ERR_TIMEOUT, "missing the matching send on device 0", NULL, 0);
    xop_check(&o, false, "the recv without its send");
    xop_init_p2p(&again, 0, 3, 2, 100, 32);
    xop_submit(rt, &again);
    xop_fence(rt, &again, CCQ_OK, NULL);
    xop_check(&again, true, "send/recv after the drop");
    finish(rt, again.n, o.n);
    xop_free(&o);
    xop_free(&again);
}

/*
 * Shutdown while the other ranks wait for a dropped one (long timeout, so the watchdog does
 * not fire first): the dropped command failed at arrival, the waiting parts are cancelled
 * by shutdown at once; each command ended exactly once.
 */
static void test_drop_then_shutdown(void **state)
{
    static const ccq_device_id world[4] = {0, 1, 2, 3};
    ccq_runtime *rt;
    xop o;
    uint64_t t0, ms;

    (void)state;
    rt = make_rt(4, LONG_TIMEOUT, "drop:rank=1");
    comm_init(rt, world, 4);
    xop_init_ar(&o, world, 4, 0, 64, 60);
    xop_submit(rt, &o);
    fence_expect(rt, 1, 0, CCQ_ERR_BACKEND, "drop:rank=1", NULL, 0);
    t0 = now_ns();
    assert_int_equal(ccq_runtime_shutdown(rt), CCQ_OK);
    ms = (now_ns() - t0) / 1000000u;
    if (ms > 5000)
        fail_msg("shutdown took %llu ms; parts that can never run are cancelled at once",
                 (unsigned long long)ms);
    for (ccq_device_id d = 0; d < 4; d++)
        if (d != 1)
            fence_expect(rt, d, 0, CCQ_ERR_SHUTDOWN, "cancelled by shutdown", NULL, 0);
    xop_check(&o, false, "the collective missing device 1");
    finish_ex(rt, 0, 1, 3);
    xop_free(&o);
}

/* ------------------------------------------------------------------------------------ */
/* Configuration and environment                                                         */
/* ------------------------------------------------------------------------------------ */

/* Run M ops of every kind, each fenced; op i fails when fails_mask has bit i. Returns the
 * commands it submitted; failed ones are added to *failed. */
static uint64_t run_ops_expect(ccq_runtime *rt, uint32_t m, uint32_t fails_mask, uint64_t *failed)
{
    uint64_t cmds = 0;
    init_round_comms(rt);
    for (uint32_t i = 0; i < m; i++) {
        xop o;
        bool fails = (fails_mask >> i) & 1u;
        char what[64];
        make_op(&o, i, 50, 900 + i);
        xop_submit(rt, &o);
        xop_fence(rt, &o, fails ? CCQ_ERR_BACKEND : CCQ_OK, "fault injection");
        snprintf(what, sizeof what, "op %u", i);
        xop_check(&o, !fails, what);
        cmds += o.n;
        *failed += fails ? o.n : 0;
        xop_free(&o);
    }
    return cmds;
}

/* CCQ_FAULT in the environment (set before ccq_config_init) is applied. */
static void test_fault_from_env(void **state)
{
    ccq_config cfg;
    ccq_runtime *rt = NULL;
    uint64_t cmds, failed = 0;

    (void)state;
    assert_int_equal(setenv("CCQ_FAULT", "fail:op=1;;fail:op=1", 1), 0);
    ccq_config_init(&cfg);
    assert_non_null(cfg.fault);
    assert_string_equal(cfg.fault, "fail:op=1;;fail:op=1");
    cfg.host_devices = 4;
    cfg.timeout_ms = LONG_TIMEOUT;
    assert_int_equal(ccq_runtime_create(&cfg, &rt), CCQ_OK);
    cmds = run_ops_expect(rt, 5, 1u << 1, &failed);
    finish(rt, cmds - failed, failed);

    /* The same from a NULL config (defaults read from the environment). */
    assert_int_equal(setenv("CCQ_FAULT", "fail:every=2", 1), 0);
    assert_int_equal(setenv("CCQ_TIMEOUT_MS", "20000", 1), 0);
    rt = NULL;
    assert_int_equal(ccq_runtime_create(NULL, &rt), CCQ_OK);
    failed = 0;
    cmds = run_ops_expect(rt, 6, (1u << 1) | (1u << 3) | (1u << 5), &failed);
    finish(rt, cmds - failed, failed);
    assert_int_equal(unsetenv("CCQ_TIMEOUT_MS"), 0);
    assert_int_equal(unsetenv("CCQ_FAULT"), 0);
}

/* A malformed spec, from the config or from the environment, makes ccq_runtime_create fail
 * with CCQ_ERR_INVALID_ARGUMENT and a detail that names the problem. */
static void test_fault_malformed(void **state)
{
    static const struct {
        const char *spec, *want;
    } bad[] = {
        {"fail", "expected kind:key=value"},
        {"explode:op=1", "unknown kind \"explode\""},
        {"fail:op=x", "\"op=x\" is not key=N"},
        {"fail:op=-1", "\"op=-1\" is not key=N"},
        {"fail:op=", "\"op=\" is not key=N"},
        {"fail:op=3,bogus=2", "unknown or invalid key \"bogus\""},
        {"fail:every=0", "unknown or invalid key \"every\""},
        {"fail:count=2", "needs op=N or every=K"},
        {"delay:op=3", "needs us=U > 0"},
        {"delay:us=0", "needs us=U > 0"},
        {"drop:after=2", "needs rank=R"},
        {"drop:rank=1,us=5", "unknown or invalid key \"us\""},
        {"lag:us=0", "unknown or invalid key \"us\""},
        {"lag:op=2", "unknown or invalid key \"op\""},
        {"lag:", "needs us=U > 0"},
        {"stall:op=2", "needs us=U > 0"},
        {"stall:us=5,rank=1", "unknown or invalid key \"rank\""},
        {"freeze:us=5", "(fail, delay, drop, lag or stall)"},
        {"fail:op=1;drop", "expected kind:key=value"},
        {"fail:op=99999999999999999999999", "is not key=N"},
    };
    char detail[DETAIL_LEN];

    (void)state;
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        ccq_config cfg;
        ccq_runtime *rt = (ccq_runtime *)&cfg; /* must be set to NULL */
        ccq_status st;
        ccq_config_init(&cfg);
        cfg.fault = bad[k].spec;
        st = ccq_runtime_create(&cfg, &rt);
        snprintf(detail, sizeof detail, "%s", ccq_last_error_detail());
        if (st != CCQ_ERR_INVALID_ARGUMENT || rt != NULL)
            fail_msg("fault \"%s\": got %s (rt %p), want CCQ_ERR_INVALID_ARGUMENT and NULL",
                     bad[k].spec, ccq_status_name(st), (void *)rt);
        if (strstr(detail, "ccq_config.fault") == NULL || strstr(detail, bad[k].want) == NULL)
            fail_msg("fault \"%s\": detail lacks \"%s\": %s", bad[k].spec, bad[k].want, detail);
        if (verbose())
            printf("    fault \"%s\" -> %s\n", bad[k].spec, detail);
    }
    /* From the environment. */
    assert_int_equal(setenv("CCQ_FAULT", "drop:rank=two", 1), 0);
    {
        ccq_config cfg;
        ccq_runtime *rt = NULL;
        ccq_config_init(&cfg);
        assert_int_equal(ccq_runtime_create(&cfg, &rt), CCQ_ERR_INVALID_ARGUMENT);
        assert_null(rt);
        snprintf(detail, sizeof detail, "%s", ccq_last_error_detail());
        if (strstr(detail, "\"rank=two\" is not key=N") == NULL)
            fail_msg("CCQ_FAULT=drop:rank=two: detail does not name it: %s", detail);
        assert_int_equal(ccq_runtime_create(NULL, &rt), CCQ_ERR_INVALID_ARGUMENT);
        assert_null(rt);
    }
    assert_int_equal(unsetenv("CCQ_FAULT"), 0);
}

/* fault = NULL or "" is off, also over a CCQ_FAULT that would fail every op; and without
 * CCQ_FAULT the default is off. */
static void test_fault_off(void **state)
{
    static const char *const specs[] = {NULL, "", ";"};
    uint64_t cmds, failed = 0;
    ccq_runtime *rt;
    ccq_config cfg;

    (void)state;
    assert_int_equal(unsetenv("CCQ_FAULT"), 0);
    ccq_config_init(&cfg);
    assert_null(cfg.fault);
    assert_int_equal(setenv("CCQ_FAULT", "fail:every=1", 1), 0);
    for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++) {
        rt = make_rt(4, LONG_TIMEOUT, specs[k]);
        cmds = run_ops_expect(rt, 5, 0, &failed);
        assert_int_equal(failed, 0);
        finish(rt, cmds, 0);
    }
    /* An empty CCQ_FAULT is off too. */
    assert_int_equal(setenv("CCQ_FAULT", "", 1), 0);
    ccq_config_init(&cfg);
    assert_true(cfg.fault == NULL || cfg.fault[0] == '\0');
    assert_null(cfg.env_error);
    assert_int_equal(unsetenv("CCQ_FAULT"), 0);
}

/* ------------------------------------------------------------------------------------ */
/* Many threads                                                                          */
/* ------------------------------------------------------------------------------------ */

/*
 * Four threads, one per device, started on a barrier; in each iteration each submits its
 * part of an all_reduce over all four devices (stream 0) and of one over its pair {0,1} or
 * {2,3} (stream 1), then fences both. fail:every=7: ops are numbered in the order the
 * scheduler issues them, which the threads' timing decides, but exactly floor(ops/7) of
 * them fail, every part of an op sees the same result, a failed op leaves its outputs
 * untouched and a completed one has the reference result. Threads record, the main thread
 * checks (CMocka's assertions are not for other threads).
 */
enum { MT_DEV = 4, MT_COUNT = 96 };

typedef struct mt_shared {
    ccq_runtime *rt;
    unsigned iters;
    pthread_barrier_t start;
    /* [iter][device][0 world, 1 pair]: the fence's status; written by one thread each. */
    int8_t *status;
    char error[MT_DEV][512]; /* first unexpected thing each thread saw */
} mt_shared;

typedef struct mt_arg {
    mt_shared *sh;
    ccq_device_id dev;
} mt_arg;

static uint32_t mt_seed(unsigned iter, ccq_device_id d, int which)
{
    return 100000u + 16u * iter + 4u * (uint32_t)which + d;
}

/* The expected all_reduce of iteration `iter` for `which` over `devs` (sorted). */
static void mt_want(unsigned iter, int which, const ccq_device_id *devs, uint32_t n, int32_t *want)
{
    int32_t in[MT_DEV][MT_COUNT];
    const void *inputs[MT_DEV];
    for (uint32_t r = 0; r < n; r++) {
        ref_fill(CCQ_INT32, in[r], MT_COUNT, mt_seed(iter, devs[r], which));
        inputs[r] = in[r];
    }
    ref_allreduce(CCQ_INT32, CCQ_SUM, n, inputs, want, MT_COUNT);
}

static void *mt_main(void *p)
{
    mt_arg *a = p;
    mt_shared *sh = a->sh;
    ccq_device_id d = a->dev;
    static const ccq_device_id world[MT_DEV] = {0, 1, 2, 3};
    ccq_device_id pair[2] = {d & ~1u, d | 1u};
    int32_t src[2][MT_COUNT], dst[2][MT_COUNT], want[MT_COUNT];
    char *err = sh->error[d];

    pthread_barrier_wait(&sh->start);
    for (unsigned i = 0; i < sh->iters && err[0] == '\0'; i++) {
        ccq_status st;
        ref_fill(CCQ_INT32, src[0], MT_COUNT, mt_seed(i, d, 0));
        ref_fill(CCQ_INT32, src[1], MT_COUNT, mt_seed(i, d, 1));
        memset(dst, POISON_BYTE, sizeof dst);
        st = ccq_all_reduce(sh->rt, d, 0, src[0], dst[0], MT_COUNT, CCQ_INT32, CCQ_SUM, world,
                            MT_DEV);
        if (st == CCQ_OK)
            st =
                ccq_all_reduce(sh->rt, d, 1, src[1], dst[1], MT_COUNT, CCQ_INT32, CCQ_SUM, pair, 2);
        if (st != CCQ_OK) {
            snprintf(err, 512, "iter %u device %u: submit: %s: %s", i, d, ccq_status_name(st),
                     ccq_last_error_detail());
            break;
        }
        for (int w = 0; w < 2; w++) {
            st = ccq_sync_collective(sh->rt, d, (ccq_stream_id)w);
            sh->status[((size_t)i * MT_DEV + d) * 2 + (size_t)w] = (int8_t)st;
            if (st == CCQ_ERR_BACKEND) {
                if (strstr(ccq_last_error_detail(), "fault injection") == NULL)
                    snprintf(err, 512, "iter %u device %u stream %d: detail: %s", i, d, w,
                             ccq_last_error_detail());
                else if (!all_poison(dst[w], MT_COUNT))
                    snprintf(err, 512, "iter %u device %u stream %d: failed op wrote output", i, d,
                             w);
            } else if (st == CCQ_OK) {
                char msg[256];
                mt_want(i, w, w == 0 ? world : pair, w == 0 ? MT_DEV : 2, want);
                if (ref_compare(CCQ_INT32, dst[w], want, MT_COUNT, msg, sizeof msg) != 0)
                    snprintf(err, 512, "iter %u device %u stream %d: wrong data: %s", i, d, w, msg);
            } else {
                snprintf(err, 512, "iter %u device %u stream %d: fence %s: %s", i, d, w,
                         ccq_status_name(st), ccq_last_error_detail());
            }
        }
    }
    return NULL;
}

static void test_threads_fail_every(void **state)
{
    mt_shared sh;
    mt_arg args[MT_DEV];
    pthread_t th[MT_DEV];
    static const ccq_device_id world[MT_DEV] = {0, 1, 2, 3}, p01[2] = {0, 1}, p23[2] = {2, 3};
    uint64_t ops, failed_ops = 0, failed_cmds = 0;

    (void)state;
    memset(&sh, 0, sizeof sh);
    sh.iters = env_iters(150);
    sh.rt = make_rt(MT_DEV, LONG_TIMEOUT, "fail:every=7");
    comm_init(sh.rt, world, MT_DEV);
    comm_init(sh.rt, p01, 2);
    comm_init(sh.rt, p23, 2);
    sh.status = calloc((size_t)sh.iters * MT_DEV * 2, 1);
    assert_non_null(sh.status);
    assert_int_equal(pthread_barrier_init(&sh.start, NULL, MT_DEV), 0);
    for (uint32_t d = 0; d < MT_DEV; d++) {
        args[d].sh = &sh;
        args[d].dev = d;
        assert_int_equal(pthread_create(&th[d], NULL, mt_main, &args[d]), 0);
    }
    for (uint32_t d = 0; d < MT_DEV; d++)
        assert_int_equal(pthread_join(th[d], NULL), 0);
    assert_int_equal(pthread_barrier_destroy(&sh.start), 0);
    for (uint32_t d = 0; d < MT_DEV; d++)
        if (sh.error[d][0] != '\0')
            fail_msg("%s", sh.error[d]);

    /* Every part of an op saw the same result; count the failed ops. */
    for (unsigned i = 0; i < sh.iters; i++) {
        const int8_t *s = &sh.status[(size_t)i * MT_DEV * 2];
        /* world: s[d * 2]; pairs: s[d * 2 + 1] for d = 0,1 and d = 2,3 */
        for (uint32_t d = 1; d < MT_DEV; d++)
            if (s[d * 2] != s[0])
                fail_msg("iter %u: the world all_reduce ended %s on device 0 but %s on %u", i,
                         ccq_status_name((ccq_status)s[0]), ccq_status_name((ccq_status)s[d * 2]),
                         d);
        for (uint32_t d = 0; d < MT_DEV; d += 2)
            if (s[d * 2 + 1] != s[(d + 1) * 2 + 1])
                fail_msg("iter %u: pair {%u,%u} ended %s and %s", i, d, d + 1,
                         ccq_status_name((ccq_status)s[d * 2 + 1]),
                         ccq_status_name((ccq_status)s[(d + 1) * 2 + 1]));
        if (s[0] != CCQ_OK) {
            failed_ops++;
            failed_cmds += MT_DEV;
        }
        for (uint32_t d = 0; d < MT_DEV; d += 2)
            if (s[d * 2 + 1] != CCQ_OK) {
                failed_ops++;
                failed_cmds += 2;
            }
    }
    ops = (uint64_t)sh.iters * 3;
    if (failed_ops != ops / 7)
        fail_msg("%llu of %llu ops failed; fail:every=7 wants %llu", (unsigned long long)failed_ops,
                 (unsigned long long)ops, (unsigned long long)(ops / 7));
    assert_int_equal(stats_of(sh.rt).batched_ops, ops);
    finish(sh.rt, (uint64_t)sh.iters * 8 - failed_cmds, failed_cmds);
    free(sh.status);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fail_op_world),
        cmocka_unit_test(test_fail_op_pair),
        cmocka_unit_test(test_fail_op_sendrecv),
        cmocka_unit_test(test_fail_every),
        cmocka_unit_test(test_fail_op_count),
        cmocka_unit_test(test_delay_watchdog_aborts),
        cmocka_unit_test(test_delay_short_completes),
        cmocka_unit_test(test_stall_short_completes),
        cmocka_unit_test(test_delay_abort_takes_batch),
        cmocka_unit_test(test_delay_then_shutdown),
        cmocka_unit_test(test_drop_rank_count1),
        cmocka_unit_test(test_drop_rank_after),
        cmocka_unit_test(test_drop_rank_sendrecv),
        cmocka_unit_test(test_drop_then_shutdown),
        cmocka_unit_test(test_fault_from_env),
        cmocka_unit_test(test_fault_malformed),
        cmocka_unit_test(test_fault_off),
        cmocka_unit_test(test_threads_fail_every),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (fence_retries > 0)
        printf("note: %u fence(s) reached their own deadline before the watchdog's verdict "
               "(a loaded machine) and were repeated\n",
               fence_retries);
    return failed;
}
