/* send/recv through the public API on the host backend: rings in both orders, self,
 * per-pair order on one or several streams, mismatches, and a concurrent exchange. */
#include <pthread.h>
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

#define NDEV 8

typedef struct fixture {
    ccq_runtime *rt;
    uint64_t expect_failed; /* commands a test makes fail on purpose */
} fixture;

static uint64_t env_count(const char *name, uint64_t def)
{
    const char *v = getenv(name);
    char *end;
    unsigned long long x;

    if (v == NULL || *v == '\0')
        return def;
    x = strtoull(v, &end, 10);
    return (*end != '\0' || x == 0) ? def : x;
}

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
    int rc = all_ended(f->rt, f->expect_failed);
    if (ccq_runtime_destroy(f->rt) != CCQ_OK)
        rc = -1;
    free(f);
    return rc;
}

/* Tagged data: element i of the buffer tagged t is t * 1000003 + i (never 0 for t >= 1). */
static void tag_fill(uint32_t *buf, size_t count, uint32_t tag)
{
    for (size_t i = 0; i < count; i++)
        buf[i] = tag * 1000003u + (uint32_t)i;
}

static void tag_check(const uint32_t *buf, size_t count, uint32_t tag, const char *what)
{
    for (size_t i = 0; i < count; i++)
        if (buf[i] != tag * 1000003u + (uint32_t)i)
            fail_msg("%s: element %zu is %u, expected tag %u (%u); it holds tag %u", what, i,
                     buf[i], tag, tag * 1000003u + (uint32_t)i, (buf[i] - (uint32_t)i) / 1000003u);
}

static void ok(ccq_status st, const char *what)
{
    if (st != CCQ_OK)
        fail_msg("%s: %s (%s)", what, ccq_status_name(st), ccq_last_error_detail());
}

static uint32_t *xalloc_u32(size_t count)
{
    uint32_t *p = calloc(count ? count : 1, sizeof *p);
    assert_non_null(p);
    return p;
}

/* ---- rings --------------------------------------------------------------------------- */

enum ring_order { SEND_FIRST, RECV_FIRST, ALTERNATE };

/* Every device d of 0..n-1 sends to d+1 and receives from d-1 on one stream; `order` says
 * which half each stream submits first. Either way the ring must complete, because the
 * pairs that can only run together go into one batch. */
static void run_ring(ccq_runtime *rt, uint32_t n, size_t count, enum ring_order order,
                     ccq_stream_id stream)
{
    uint32_t *sbuf[NDEV], *rbuf[NDEV];
    char what[96];

    for (uint32_t d = 0; d < n; d++) {
        sbuf[d] = xalloc_u32(count);
        rbuf[d] = xalloc_u32(count);
        tag_fill(sbuf[d], count, d + 1);
    }
    for (uint32_t d = 0; d < n; d++) {
        uint32_t to = (d + 1) % n, from = (d + n - 1) % n;
        bool send_first = order == SEND_FIRST || (order == ALTERNATE && d % 2 == 0);
        if (send_first) {
            ok(ccq_send(rt, d, stream, sbuf[d], count, CCQ_UINT32, to), "send");
            ok(ccq_recv(rt, d, stream, rbuf[d], count, CCQ_UINT32, from), "recv");
        } else {
            ok(ccq_recv(rt, d, stream, rbuf[d], count, CCQ_UINT32, from), "recv");
            ok(ccq_send(rt, d, stream, sbuf[d], count, CCQ_UINT32, to), "send");
        }
    }
    for (uint32_t d = 0; d < n; d++)
        ok(ccq_sync_collective(rt, d, stream), "fence");
    for (uint32_t d = 0; d < n; d++) {
        snprintf(what, sizeof what, "ring n=%u count=%zu order=%d: device %u", n, count, (int)order,
                 d);
        tag_check(rbuf[d], count, (d + n - 1) % n + 1, what);
        tag_check(sbuf[d], count, d + 1, "send buffer changed");
        free(sbuf[d]);
        free(rbuf[d]);
    }
}

static void test_ring_send_then_recv(void **state)
{
    fixture *f = *state;
    for (uint32_t n = 2; n <= NDEV; n++) {
        run_ring(f->rt, n, 1001, SEND_FIRST, 0);
        run_ring(f->rt, n, 70000, SEND_FIRST, 1); /* worker-pool sized */
    }
}

static void test_ring_recv_then_send(void **state)
{
    fixture *f = *state;
    for (uint32_t n = 2; n <= NDEV; n++) {
        run_ring(f->rt, n, 1001, RECV_FIRST, 0);
        run_ring(f->rt, n, 70000, RECV_FIRST, 1);
        run_ring(f->rt, n, 33, ALTERNATE, 2);
    }
}

/* ---- self ---------------------------------------------------------------------------- */

static void test_self(void **state)
{
    fixture *f = *state;
    enum { C = 513 };
    uint32_t a[C], b[C], c[C], d[C];

    /* Send then recv on the same stream. */
    tag_fill(a, C, 7);
    memset(b, 0, sizeof b);
    ok(ccq_send(f->rt, 3, 0, a, C, CCQ_UINT32, 3), "self send");
    ok(ccq_recv(f->rt, 3, 0, b, C, CCQ_UINT32, 3), "self recv");
    ok(ccq_sync_collective(f->rt, 3, 0), "fence");
    tag_check(b, C, 7, "self send then recv");

    /* Recv then send on the same stream (no overlap, so they may share a batch). */
    tag_fill(c, C, 8);
    memset(d, 0, sizeof d);
    ok(ccq_recv(f->rt, 3, 0, d, C, CCQ_UINT32, 3), "self recv");
    ok(ccq_send(f->rt, 3, 0, c, C, CCQ_UINT32, 3), "self send");
    ok(ccq_sync_collective(f->rt, 3, 0), "fence");
    tag_check(d, C, 8, "self recv then send");

    /* Send and recv on two streams of the device, several in a row: per-pair order. */
    enum { K = 10 };
    uint32_t *s[K], *r[K];
    for (int k = 0; k < K; k++) {
        s[k] = xalloc_u32(C);
        r[k] = xalloc_u32(C);
        tag_fill(s[k], C, 100 + (uint32_t)k);
        ok(ccq_send(f->rt, 5, 1, s[k], C, CCQ_UINT32, 5), "self send");
    }
    for (int k = 0; k < K; k++)
        ok(ccq_recv(f->rt, 5, 2, r[k], C, CCQ_UINT32, 5), "self recv");
    ok(ccq_sync_collective(f->rt, 5, 1), "fence");
    ok(ccq_sync_collective(f->rt, 5, 2), "fence");
    for (int k = 0; k < K; k++) {
        tag_check(r[k], C, 100 + (uint32_t)k, "self, two streams");
        free(s[k]);
        free(r[k]);
    }
}

/* ---- per-pair order ------------------------------------------------------------------ */

/* K sends src -> dst and K recvs, each message tagged with its index; message k must land in
 * recv k whatever streams carry them. Streams are chosen by the callbacks' index. */
static void run_pair_order(ccq_runtime *rt, ccq_device_id src, ccq_device_id dst, uint32_t k_msgs,
                           uint32_t send_streams, uint32_t send_stream0, uint32_t recv_streams,
                           uint32_t recv_stream0, bool recvs_first)
{
    enum { C = 64 };
    uint32_t **s = calloc(k_msgs, sizeof *s), **r = calloc(k_msgs, sizeof *r);
    char what[96];

    assert_non_null(s);
    assert_non_null(r);
    for (uint32_t k = 0; k < k_msgs; k++) {
        s[k] = xalloc_u32(C);
        r[k] = xalloc_u32(C);
        tag_fill(s[k], C, k + 1);
    }
    for (int phase = 0; phase < 2; phase++) {
        bool do_recv = (phase == 0) == recvs_first;
        for (uint32_t k = 0; k < k_msgs; k++) {
            if (do_recv)
                ok(ccq_recv(rt, dst, recv_stream0 + k % recv_streams, r[k], C, CCQ_UINT32, src),
                   "recv");
            else
                ok(ccq_send(rt, src, send_stream0 + k % send_streams, s[k], C, CCQ_UINT32, dst),
                   "send");
        }
    }
    for (uint32_t i = 0; i < send_streams; i++)
        ok(ccq_sync_collective(rt, src, send_stream0 + i), "fence sender");
    for (uint32_t i = 0; i < recv_streams; i++)
        ok(ccq_sync_collective(rt, dst, recv_stream0 + i), "fence receiver");
    for (uint32_t k = 0; k < k_msgs; k++) {
        snprintf(what, sizeof what, "%u -> %u, message %u", src, dst, k);
        tag_check(r[k], C, k + 1, what);
        free(s[k]);
        free(r[k]);
    }
    free(s);
    free(r);
}

static void test_pair_order_same_stream(void **state)
{
    fixture *f = *state;
    run_pair_order(f->rt, 0, 1, 100, 1, 0, 1, 0, false);
    run_pair_order(f->rt, 0, 1, 100, 1, 0, 1, 0, true);
}

static void test_pair_order_different_streams(void **state)
{
    fixture *f = *state;
    /* Sender on stream 2, receiver on stream 5. */
    run_pair_order(f->rt, 0, 1, 100, 1, 2, 1, 5, false);
    /* Messages spread over 4 sender streams and 3 receiver streams: order is the
     * per-pair submission order, not the order on any one stream. */
    run_pair_order(f->rt, 4, 2, 100, 4, 0, 3, 0, false);
    run_pair_order(f->rt, 4, 2, 100, 4, 0, 3, 0, true);
    /* The other direction of the same pair has its own order. */
    run_pair_order(f->rt, 2, 4, 60, 3, 1, 2, 6, false);
}

/* ---- mismatch ------------------------------------------------------------------------ */

static void expect_mismatch(ccq_runtime *rt, ccq_device_id dev, ccq_stream_id stream,
                            const char *other)
{
    char buf[512];
    ccq_status st = ccq_sync_collective(rt, dev, stream);
    if (st != CCQ_ERR_MISMATCH)
        fail_msg("fence on device %u: %s, expected CCQ_ERR_MISMATCH (%s)", dev, ccq_status_name(st),
                 ccq_last_error_detail());
    const char *detail = ccq_last_error_detail();
    if (strstr(detail, "device 2") == NULL || strstr(detail, "device 5") == NULL)
        fail_msg("mismatch detail does not name both devices: \"%s\"", detail);
    if (other != NULL && strstr(detail, other) == NULL)
        fail_msg("mismatch detail does not mention \"%s\": \"%s\"", other, detail);
    assert_int_equal(ccq_stream_last_error(rt, dev, stream, buf, sizeof buf), CCQ_ERR_MISMATCH);
    assert_string_equal(buf, detail);
    /* The error was reported once: the next fence is clean. */
    ok(ccq_sync_collective(rt, dev, stream), "second fence");
}

static void test_mismatch(void **state)
{
    fixture *f = *state;
    enum { C = 16 };
    uint32_t a[C], b[C + 1];

    tag_fill(a, C, 3);
    memset(b, 0, sizeof b);

    /* Count differs. */
    ok(ccq_send(f->rt, 2, 0, a, C, CCQ_UINT32, 5), "send");
    ok(ccq_recv(f->rt, 5, 1, b, C + 1, CCQ_UINT32, 2), "recv");
    f->expect_failed += 2;
    expect_mismatch(f->rt, 2, 0, "17");
    expect_mismatch(f->rt, 5, 1, "17");
    for (int i = 0; i < C + 1; i++)
        assert_int_equal(b[i], 0); /* nothing was executed */

    /* Dtype differs (same size in bytes). */
    ok(ccq_send(f->rt, 2, 0, a, C, CCQ_UINT32, 5), "send");
    ok(ccq_recv(f->rt, 5, 1, b, C, CCQ_FLOAT32, 2), "recv");
    f->expect_failed += 2;
    expect_mismatch(f->rt, 5, 1, "float32");
    expect_mismatch(f->rt, 2, 0, "uint32");
    for (int i = 0; i < C + 1; i++)
        assert_int_equal(b[i], 0);

    /* The pair's order is intact afterwards: the next pair matches and runs. */
    ok(ccq_send(f->rt, 2, 0, a, C, CCQ_UINT32, 5), "send");
    ok(ccq_recv(f->rt, 5, 1, b, C, CCQ_UINT32, 2), "recv");
    ok(ccq_sync_collective(f->rt, 2, 0), "fence");
    ok(ccq_sync_collective(f->rt, 5, 1), "fence");
    tag_check(b, C, 3, "after the mismatches");
    assert_int_equal(b[C], 0);

    /* The last errors stay readable from any thread. */
    assert_int_equal(ccq_stream_last_error(f->rt, 2, 0, NULL, 0), CCQ_ERR_MISMATCH);
}

/* ---- bidirectional ------------------------------------------------------------------- */

typedef struct bidi {
    ccq_runtime *rt;
    pthread_barrier_t start;
    uint32_t iters;
    size_t count;
} bidi;

typedef struct bidi_arg {
    bidi *b;
    ccq_device_id self, peer;
    bool recv_first;
    uint32_t **sbuf, **rbuf;
    ccq_status st;
    char detail[256];
} bidi_arg;

static void *bidi_thread(void *arg)
{
    bidi_arg *a = arg;
    bidi *b = a->b;

    a->st = CCQ_OK;
    pthread_barrier_wait(&b->start);
    for (uint32_t it = 0; it < b->iters && a->st == CCQ_OK; it++) {
        ccq_status s1, s2;
        if (a->recv_first) {
            s1 = ccq_recv(b->rt, a->self, 0, a->rbuf[it], b->count, CCQ_UINT32, a->peer);
            s2 = ccq_send(b->rt, a->self, 0, a->sbuf[it], b->count, CCQ_UINT32, a->peer);
        } else {
            s1 = ccq_send(b->rt, a->self, 0, a->sbuf[it], b->count, CCQ_UINT32, a->peer);
            s2 = ccq_recv(b->rt, a->self, 0, a->rbuf[it], b->count, CCQ_UINT32, a->peer);
        }
        a->st = s1 != CCQ_OK ? s1 : s2;
        /* Fence now and then, so both fenced and free-running stretches happen. */
        if (a->st == CCQ_OK && it % 64 == 63)
            a->st = ccq_sync_collective(b->rt, a->self, 0);
    }
    if (a->st == CCQ_OK)
        a->st = ccq_sync_collective(b->rt, a->self, 0);
    if (a->st != CCQ_OK)
        snprintf(a->detail, sizeof a->detail, "%s", ccq_last_error_detail());
    return NULL;
}

static void run_bidi(ccq_runtime *rt, bool second_recv_first)
{
    bidi b = {.rt = rt, .count = 100};
    bidi_arg args[2];
    pthread_t th[2];

    b.iters = (uint32_t)env_count("CCQ_TEST_ITERS", 500);
    assert_int_equal(pthread_barrier_init(&b.start, NULL, 2), 0);
    for (int t = 0; t < 2; t++) {
        args[t] = (bidi_arg){.b = &b, .self = (ccq_device_id)t, .peer = (ccq_device_id)(1 - t)};
        args[t].recv_first = t == 1 && second_recv_first;
        args[t].sbuf = calloc(b.iters, sizeof(uint32_t *));
        args[t].rbuf = calloc(b.iters, sizeof(uint32_t *));
        assert_non_null(args[t].sbuf);
        assert_non_null(args[t].rbuf);
        for (uint32_t it = 0; it < b.iters; it++) {
            args[t].sbuf[it] = xalloc_u32(b.count);
            args[t].rbuf[it] = xalloc_u32(b.count);
            tag_fill(args[t].sbuf[it], b.count, (uint32_t)t * 100000u + it + 1);
        }
    }
    for (int t = 0; t < 2; t++)
        assert_int_equal(pthread_create(&th[t], NULL, bidi_thread, &args[t]), 0);
    for (int t = 0; t < 2; t++)
        pthread_join(th[t], NULL);
    pthread_barrier_destroy(&b.start);
    for (int t = 0; t < 2; t++)
        if (args[t].st != CCQ_OK)
            fail_msg("device %d: %s (%s)", t, ccq_status_name(args[t].st), args[t].detail);
    for (int t = 0; t < 2; t++) {
        for (uint32_t it = 0; it < b.iters; it++) {
            char what[64];
            snprintf(what, sizeof what, "device %d iteration %u", t, it);
            tag_check(args[t].rbuf[it], b.count, (uint32_t)(1 - t) * 100000u + it + 1, what);
            free(args[t].sbuf[it]);
            free(args[t].rbuf[it]);
        }
        free(args[t].sbuf);
        free(args[t].rbuf);
    }
}

static void test_bidirectional(void **state)
{
    fixture *f = *state;
    run_bidi(f->rt, false);
    run_bidi(f->rt, true);
}

/* ---- sizes and dtypes ---------------------------------------------------------------- */

/* Every dtype, from nothing to a worker-pool-sized message, bytes copied exactly. */
static void test_sizes_and_dtypes(void **state)
{
    fixture *f = *state;
    static const size_t counts[] = {0, 1, 17, 100003};

    for (int dt = 0; dt < CCQ_DTYPE_COUNT_; dt++) {
        size_t es = ref_dtype_size((ccq_dtype)dt);
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
            size_t n = counts[c];
            unsigned char *s = malloc(n * es + 1), *r = malloc(n * es + 16);
            assert_non_null(s);
            assert_non_null(r);
            ref_fill((ccq_dtype)dt, s, n, (uint32_t)(dt * 31 + c));
            memset(r, 0xee, n * es + 16);
            ok(ccq_send(f->rt, 2, 1, n ? s : NULL, n, (ccq_dtype)dt, 6), "send");
            ok(ccq_recv(f->rt, 6, 2, n ? r : NULL, n, (ccq_dtype)dt, 2), "recv");
            ok(ccq_sync_collective(f->rt, 6, 2), "fence receiver");
            ok(ccq_sync_collective(f->rt, 2, 1), "fence sender");
            if (n > 0)
                assert_memory_equal(r, s, n * es);
            for (int i = 0; i < 16; i++)
                assert_int_equal(r[n * es + (size_t)i], 0xee);
            free(s);
            free(r);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ring_send_then_recv, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ring_recv_then_send, setup, teardown),
        cmocka_unit_test_setup_teardown(test_self, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pair_order_same_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pair_order_different_streams, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mismatch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bidirectional, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sizes_and_dtypes, setup, teardown),
    };
    /* CCQ_TEST_FILTER=pattern runs only the matching tests (cmocka's wildcard syntax). */
    const char *filter = getenv("CCQ_TEST_FILTER");
    if (filter != NULL && *filter != '\0')
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests_name("sendrecv", tests, NULL, NULL);
}
