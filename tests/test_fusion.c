/* Fusion of small collectives in one process (docs/fusion.md), host backend: fused and unfused
 * runs give bit-identical results for every dtype x op and every fusable kind, with sizes
 * around the threshold and the parts of one fused operation on different streams; the groups
 * are exactly those of the rule (tests/fusion_work.h) when one batch holds every op; a
 * mismatch or an injected failure inside a would-be group fails that op alone and cuts the
 * group around it; every part keeps its own completion and trace entry and names its fused
 * operation (CCQ_EV_FUSED), which the JSON dump draws with flows from its parts; submissions
 * from one thread per device in bursts fuse whatever their batches hold, correctly. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "test_util.h"

#include "ccq.h"
#include "fusion_work.h"
#include "ref.h"

#define NR     3    /* ranks of the communicator: devices 0, 1, 2 */
#define GATE   3    /* device of the gate's second part */
#define F      1024 /* the fusion threshold of these tests */
#define MAXOPS 128

static const ccq_device_id devs[NR] = {0, 1, 2};
static const ccq_device_id gate_devs[2] = {2, GATE};
static const ccq_dtype all_dts[] = {CCQ_INT8,    CCQ_UINT8,    CCQ_INT32,      CCQ_UINT32,
                                    CCQ_INT64,   CCQ_UINT64,   CCQ_FLOAT16,    CCQ_FLOAT32,
                                    CCQ_FLOAT64, CCQ_BFLOAT16, CCQ_FLOAT8E4M3, CCQ_FLOAT8E5M2};
static const ccq_reduce_op all_ops[] = {CCQ_SUM, CCQ_PROD, CCQ_MAX, CCQ_MIN, CCQ_AVG};

static void ok(ccq_status st, const char *what)
{
    if (st != CCQ_OK)
        fail_msg("%s: %s: %s", what, ccq_status_name(st), ccq_last_error_detail());
}

/* One run of the workload and what came out of it. */
typedef struct run {
    ccq_dtype dt;
    ccq_reduce_op op;
    fw_op ops[MAXOPS];
    size_t n;
    void *src[MAXOPS][NR], *dst[MAXOPS][NR];
    size_t dcount[MAXOPS][NR];
    ccq_status st[MAXOPS]; /* device 0's fence of each op (each has its own stream there) */
    ccq_event *ev;
    size_t nev;
} run;

/* How a run submits. */
typedef struct how {
    uint64_t fusion;   /* ccq_config.fusion_bytes */
    const char *fault; /* ccq_config.fault */
    bool all_kinds;    /* every fusable kind, else all_reduce only */
    long mismatch;     /* this op's part on device 1 has another count (-1: none) */
    const char *dump;  /* write the trace here (NULL: no) */
} how;

static void run_free(run *r)
{
    for (size_t i = 0; i < r->n; i++)
        for (uint32_t k = 0; k < NR; k++) {
            free(r->src[i][k]);
            free(r->dst[i][k]);
        }
    free(r->ev);
}

/*
 * Submit the plan on devices 0..2, device 0's op i on stream i, device 1's on stream i % 3
 * (so one fused operation has parts on several streams of a device and on different streams
 * across devices), device 2's on stream 0 behind the gate: an all_reduce on {2, 3} whose
 * device-3 part comes last, so every op waits for it and one batch then holds them all.
 */
static void run_workload(run *r, ccq_dtype dt, ccq_reduce_op op, const how *h)
{
    ccq_config cfg;
    ccq_runtime *rt;
    float gate_in = 1, gate_out[2];
    size_t cap = 65536, dropped = 0;

    memset(r, 0, sizeof *r);
    r->dt = dt;
    r->op = op;
    r->n = fw_plan(r->ops, MAXOPS, dt, F, NR, h->all_kinds);
    ccq_config_init(&cfg);
    cfg.host_devices = 4;
    cfg.max_streams = MAXOPS;
    cfg.fusion_bytes = h->fusion;
    cfg.fault = h->fault;
    cfg.trace_capacity = 65536;
    cfg.timeout_ms = 60000;
    ok(ccq_runtime_create(&cfg, &rt), "create");
    ok(ccq_comm_init(rt, devs, NR), "comm");
    ok(ccq_comm_init(rt, gate_devs, 2), "gate comm");
    for (size_t i = 0; i < r->n; i++) {
        const fw_op *o = &r->ops[i];
        for (uint32_t k = 0; k < NR; k++) {
            size_t sc = ref_src_count(o->kind, NR, o->root, k, o->count + 1);
            size_t dc = ref_dst_count(o->kind, NR, o->root, k, o->count + 1);
            r->src[i][k] = xmalloc(sc * ref_dtype_size(dt));
            r->dst[i][k] = xmalloc(dc * ref_dtype_size(dt));
            ref_fill(dt, r->src[i][k], sc, (uint32_t)(i * 7 + k * 1013 + 1));
            memset(r->dst[i][k], 0x5a, dc * ref_dtype_size(dt));
            r->dcount[i][k] = ref_dst_count(o->kind, NR, o->root, k, o->count);
        }
    }
    ok(ccq_all_reduce(rt, 2, 0, &gate_in, &gate_out[0], 1, CCQ_FLOAT32, CCQ_SUM, gate_devs, 2),
       "gate");
    for (uint32_t k = 0; k < NR; k++)
        for (size_t i = 0; i < r->n; i++) {
            const fw_op *o = &r->ops[i];
            size_t count = k == 1 && (long)i == h->mismatch ? o->count + 1 : o->count;
            ccq_stream_id s = k == 0 ? (ccq_stream_id)i : k == 1 ? (ccq_stream_id)(i % 3) : 0;
            ok(ref_submit(rt, o->kind, k, s, r->src[i][k], r->dst[i][k], count, dt, op,
                          devs[o->root], devs, NR),
               "submit");
        }
    ok(ccq_all_reduce(rt, GATE, 0, &gate_in, &gate_out[1], 1, CCQ_FLOAT32, CCQ_SUM, gate_devs, 2),
       "gate opens");
    for (size_t i = 0; i < r->n; i++)
        r->st[i] = ccq_sync_collective(rt, 0, (ccq_stream_id)i);
    for (ccq_stream_id s = 0; s < 3; s++)
        (void)ccq_sync_collective(rt, 1, s);
    (void)ccq_sync_collective(rt, 2, 0);
    ok(ccq_sync_collective(rt, GATE, 0), "gate fence");
    if (h->dump != NULL)
        ok(ccq_trace_dump(rt, h->dump), "dump");
    r->ev = xmalloc(cap * sizeof *r->ev);
    r->ev[0].struct_size = sizeof(ccq_event);
    ok(ccq_trace_snapshot(rt, r->ev, cap, &r->nev, &dropped), "snapshot");
    assert_int_equal(dropped, 0);
    ok(ccq_runtime_destroy(rt), "destroy");
}

/* Every op that completed wrote what the reference says, on every rank. */
static void check_results(const run *r)
{
    for (size_t i = 0; i < r->n; i++) {
        const fw_op *o = &r->ops[i];
        if (r->st[i] != CCQ_OK)
            continue;
        for (uint32_t k = 0; k < NR; k++) {
            size_t dc = r->dcount[i][k];
            void *want = xmalloc(dc * ref_dtype_size(r->dt) + 1);
            char msg[256];
            const void *in[NR] = {r->src[i][0], r->src[i][1], r->src[i][2]};
            if (ref_collective(o->kind, r->dt, r->op, NR, o->root, in, k, want, o->count) != dc)
                fail_msg("op %zu: reference count", i);
            if (ref_compare(r->dt, r->dst[i][k], want, dc, msg, sizeof msg) != 0)
                fail_msg("%s %s op %zu (%s x %zu) rank %u: %s", ccq_dtype_name(r->dt),
                         ccq_reduce_op_name(r->op), i, ccq_kind_name(o->kind), o->count, k, msg);
            free(want);
        }
    }
}

/* Two runs wrote the same bits everywhere their ops completed. */
static void check_identical(const run *a, const run *b)
{
    assert_int_equal(a->n, b->n);
    for (size_t i = 0; i < a->n; i++) {
        if (a->st[i] != CCQ_OK || b->st[i] != CCQ_OK)
            continue;
        for (uint32_t k = 0; k < NR; k++)
            if (memcmp(a->dst[i][k], b->dst[i][k], a->dcount[i][k] * ref_dtype_size(a->dt)) != 0)
                fail_msg("%s %s op %zu (%s x %zu) rank %u: fused and unfused results differ",
                         ccq_dtype_name(a->dt), ccq_reduce_op_name(a->op), i,
                         ccq_kind_name(a->ops[i].kind), a->ops[i].count, k);
    }
}

/* The FUSED events are the oracle's groups, cut where an op failed (failed[i]); every part
 * of a fused op names it, every other part names none; returns the fused ops seen. */
static size_t check_groups(const run *r, const bool *failed, uint64_t fusion)
{
    size_t nfused = 0;
    for (size_t i = 0; i < r->n;) {
        size_t end = i, g;
        if (failed[i]) {
            i++;
            continue;
        }
        while (end < r->n && !failed[end])
            end++;
        g = fw_group(r->ops, i, end, r->dt, fusion);
        /* The FUSED event of ops [i, i + g), if any, and the parts' COMPLETED events. */
        const ccq_event *fe = NULL;
        for (size_t e = 0; e < r->nev; e++)
            if (r->ev[e].type == CCQ_EV_FUSED && r->ev[e].comm == 0 && r->ev[e].seq == i)
                fe = &r->ev[e];
        if (g > 1) {
            uint64_t bytes = 0;
            if (fe == NULL)
                fail_msg("ops %zu..%zu should have fused (%s), no CCQ_EV_FUSED", i, i + g - 1,
                         ccq_kind_name(r->ops[i].kind));
            for (size_t j = i; j < i + g; j++)
                bytes += r->ops[j].count * ref_dtype_size(r->dt);
            if (fe->count != g || fe->bytes != bytes || fe->kind != r->ops[i].kind ||
                fe->status != CCQ_OK)
                fail_msg("fused op at %zu: count %llu bytes %llu (want %zu, %llu)", i,
                         (unsigned long long)fe->count, (unsigned long long)fe->bytes, g,
                         (unsigned long long)bytes);
            nfused++;
        } else if (fe != NULL) {
            fail_msg("op %zu (%s x %zu) fused with %llu ops; the rule says alone", i,
                     ccq_kind_name(r->ops[i].kind), r->ops[i].count, (unsigned long long)fe->count);
        }
        for (size_t j = i; j < i + g; j++) {
            size_t parts = 0;
            for (size_t e = 0; e < r->nev; e++) {
                const ccq_event *ce = &r->ev[e];
                if (ce->type != CCQ_EV_COMPLETED || ce->comm != 0 || ce->seq != j)
                    continue;
                parts++;
                if (ce->fused != (fe != NULL && g > 1 ? fe->id : 0))
                    fail_msg("op %zu: part on device %u names fused op %llu", j, ce->device,
                             (unsigned long long)ce->fused);
            }
            assert_int_equal(parts, NR); /* each part its own completion */
        }
        i += g;
    }
    return nfused;
}

/* Every dtype x op, every fusable kind: fused == unfused == the reference, and the groups are
 * the rule's. */
static void test_identical_every_dtype_op(void **state)
{
    (void)state;
    bool none[MAXOPS] = {false};
    size_t fused_ops = 0;
    for (size_t d = 0; d < sizeof all_dts / sizeof all_dts[0]; d++)
        for (size_t o = 0; o < sizeof all_ops / sizeof all_ops[0]; o++) {
            run *a = xmalloc(sizeof *a), *b = xmalloc(sizeof *b);
            how off = {.fusion = 0, .all_kinds = true, .mismatch = -1};
            how on = {.fusion = F, .all_kinds = true, .mismatch = -1};
            run_workload(a, all_dts[d], all_ops[o], &off);
            run_workload(b, all_dts[d], all_ops[o], &on);
            for (size_t i = 0; i < a->n; i++) {
                assert_int_equal(a->st[i], CCQ_OK);
                assert_int_equal(b->st[i], CCQ_OK);
            }
            check_results(a);
            check_identical(a, b);
            assert_int_equal(check_groups(a, none, 0), 0);
            fused_ops += check_groups(b, none, F);
            run_free(a);
            run_free(b);
            free(a);
            free(b);
        }
    assert_true(fused_ops > 0);
}

/* A mismatch (one rank's count) and an injected failure inside what would be a fused group:
 * that op fails alone, the group is cut around it, the others complete bit-identical. */
static void test_failure_inside_group(void **state)
{
    (void)state;
    /* In the all_reduce run, ops 4 and 5 (F/2 each) fuse; op 10 (5/16 F) joins 9 and 11. */
    static const long bad[] = {5, 10};
    for (size_t v = 0; v < 2; v++) {
        for (size_t b = 0; b < 2; b++) {
            run *a = xmalloc(sizeof *a), *r = xmalloc(sizeof *r);
            bool failed[MAXOPS] = {false};
            char fault[64];
            how off = {.fusion = 0, .all_kinds = false, .mismatch = -1};
            how on = {.fusion = F, .all_kinds = false, .mismatch = -1};
            snprintf(fault, sizeof fault, "fail:op=%ld", bad[b]);
            if (v == 0)
                on.mismatch = bad[b];
            else
                on.fault = fault;
            run_workload(a, CCQ_FLOAT32, CCQ_SUM, &off);
            run_workload(r, CCQ_FLOAT32, CCQ_SUM, &on);
            failed[bad[b]] = true;
            for (size_t i = 0; i < r->n; i++)
                if ((long)i == bad[b])
                    assert_int_equal(r->st[i], v == 0 ? CCQ_ERR_MISMATCH : CCQ_ERR_BACKEND);
                else
                    assert_int_equal(r->st[i], CCQ_OK);
            check_results(r);
            check_identical(a, r);
            assert_true(check_groups(r, failed, F) > 0);
            run_free(a);
            run_free(r);
            free(a);
            free(r);
        }
    }
}

/* The JSON dump draws each fused operation on the scheduler's "fused operations" track with
 * a flow from every part. */
static void test_trace_dump(void **state)
{
    (void)state;
    char path[] = "/tmp/ccq-fusion-trace-XXXXXX";
    int fd = mkstemp(path);
    run *r = xmalloc(sizeof *r);
    how on = {.fusion = F, .all_kinds = true, .mismatch = -1, .dump = path};
    bool none[MAXOPS] = {false};
    FILE *f;
    long len;
    char *text;
    size_t fused, flows = 0, parts = 0;

    assert_true(fd >= 0);
    close(fd);
    run_workload(r, CCQ_FLOAT32, CCQ_AVG, &on);
    fused = check_groups(r, none, F);
    for (size_t e = 0; e < r->nev; e++)
        parts += r->ev[e].type == CCQ_EV_COMPLETED && r->ev[e].fused != 0;
    f = fopen(path, "r");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    text = xmalloc((size_t)len + 1);
    assert_int_equal(fread(text, 1, (size_t)len, f), (size_t)len);
    text[len] = '\0';
    fclose(f);
    remove(path);
    assert_non_null(strstr(text, "\"name\":\"fused operations\""));
    assert_non_null(strstr(text, "\"cat\":\"fused\",\"name\":\"fused all_reduce #"));
    for (const char *p = text; (p = strstr(p, "\"ph\":\"s\",\"cat\":\"fused\"")) != NULL; p++)
        flows++;
    assert_true(fused > 0);
    assert_int_equal(flows, parts); /* one flow from every part of a fused op */
    free(text);
    run_free(r);
    free(r);
}

/* Free submission from one thread per device, in bursts with pauses: batches hold whatever is
 * ready, fused or not, and every result is right and the same as unfused. */
typedef struct burst_arg {
    ccq_runtime *rt;
    uint32_t dev;
    run *r;
} burst_arg;

static void *burst_main(void *p)
{
    burst_arg *a = p;
    run *r = a->r;
    for (size_t i = 0; i < r->n; i++) {
        const fw_op *o = &r->ops[i];
        ccq_status st =
            ref_submit(a->rt, o->kind, a->dev, (ccq_stream_id)(i % 2), r->src[i][a->dev],
                       r->dst[i][a->dev], o->count, r->dt, r->op, devs[o->root], devs, NR);
        if (st != CCQ_OK)
            return (void *)1;
        if ((i + a->dev) % 7 == 0)
            sleep_ms(1 + a->dev);
    }
    for (ccq_stream_id s = 0; s < 2; s++)
        if (ccq_sync_collective(a->rt, a->dev, s) != CCQ_OK)
            return (void *)1;
    return NULL;
}

static void bursts(run *r, uint64_t fusion)
{
    ccq_config cfg;
    ccq_runtime *rt;
    pthread_t th[NR];
    burst_arg args[NR];
    ccq_config_init(&cfg);
    cfg.host_devices = NR;
    cfg.fusion_bytes = fusion;
    cfg.timeout_ms = 60000;
    ok(ccq_runtime_create(&cfg, &rt), "create");
    ok(ccq_comm_init(rt, devs, NR), "comm");
    for (uint32_t k = 0; k < NR; k++) {
        args[k] = (burst_arg){rt, k, r};
        assert_int_equal(pthread_create(&th[k], NULL, burst_main, &args[k]), 0);
    }
    for (uint32_t k = 0; k < NR; k++) {
        void *ret;
        pthread_join(th[k], &ret);
        assert_null(ret);
    }
    ok(ccq_runtime_destroy(rt), "destroy");
}

static void test_bursts(void **state)
{
    (void)state;
    unsigned rounds = env_iters(3);
    for (unsigned round = 0; round < rounds; round++) {
        run *a = xmalloc(sizeof *a);
        how h = {.fusion = 0, .all_kinds = true, .mismatch = -1};
        void *keep[MAXOPS][NR];
        /* Buffers and reference from a gated unfused run; then the same inputs in bursts. */
        run_workload(a, round % 2 ? CCQ_BFLOAT16 : CCQ_INT32, round % 2 ? CCQ_SUM : CCQ_MAX, &h);
        for (size_t i = 0; i < a->n; i++)
            for (uint32_t k = 0; k < NR; k++) {
                size_t bytes = a->dcount[i][k] * ref_dtype_size(a->dt);
                keep[i][k] = xmalloc(bytes);
                memcpy(keep[i][k], a->dst[i][k], bytes);
                memset(a->dst[i][k], 0x5a, bytes);
            }
        bursts(a, F);
        for (size_t i = 0; i < a->n; i++)
            for (uint32_t k = 0; k < NR; k++) {
                if (memcmp(keep[i][k], a->dst[i][k], a->dcount[i][k] * ref_dtype_size(a->dt)))
                    fail_msg("round %u op %zu rank %u: bursts differ from the gated run", round, i,
                             k);
                free(keep[i][k]);
            }
        run_free(a);
        free(a);
    }
}

/* ccq_config.fusion_bytes: its default, the environment, validation. */
static void test_config(void **state)
{
    (void)state;
    ccq_config cfg;
    ccq_runtime *rt = NULL;
    ccq_config_init(&cfg);
    assert_int_equal(cfg.fusion_bytes, 1048576);
    setenv("CCQ_FUSION_BYTES", "4096", 1);
    ccq_config_init(&cfg);
    assert_int_equal(cfg.fusion_bytes, 4096);
    setenv("CCQ_FUSION_BYTES", "lots", 1);
    ccq_config_init(&cfg);
    assert_int_equal(ccq_runtime_create(&cfg, &rt), CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(ccq_last_error_detail(), "CCQ_FUSION_BYTES"));
    unsetenv("CCQ_FUSION_BYTES");
    ccq_config_init(&cfg);
    cfg.fusion_bytes = (1ull << 40) + 1;
    assert_int_equal(ccq_runtime_create(&cfg, &rt), CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(ccq_last_error_detail(), "fusion_bytes"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_identical_every_dtype_op),
        cmocka_unit_test(test_failure_inside_group),
        cmocka_unit_test(test_trace_dump),
        cmocka_unit_test(test_bursts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
