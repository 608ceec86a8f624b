/* Fusion across processes (docs/fusion.md): the host backend across processes through the
 * whole runtime, on its MPI engine (under mpiexec) or its UCX engine (CCQ_HOST_ENGINE=ucx,
 * under mpiexec or as plain processes over CCQ_BOOTSTRAP=tcp://), 2, 3 or 4 processes,
 * process p with 1 + p % 2 host devices. The member
 * processes of a communicator see different sets of ready operations at any moment, and must
 * still fuse identically:
 *  - 600 small collectives of every fusable kind, sizes around the threshold, submitted by
 *    each process in its own way at once: all of them before its scheduler can issue any (a
 *    gate), one at a time with pauses, fencing each before the next, or in bursts; every
 *    round, every process's fused operations are the same list (exchanged and compared),
 *    every result is right, nothing mismatches or hangs;
 *  - fused and unfused runs (two runtimes side by side) give bit-identical results for every
 *    dtype x op with random inputs (fused operations stay below the size at which Open MPI
 *    changes its reduction schedule: docs/fusion.md);
 *  - a mismatch across processes inside a would-be fused group (one process submits another
 *    count) fails that op with CCQ_ERR_MISMATCH in every process, also when one of them
 *    started it without waiting (it fences each op), and never hangs (MPI: it alone, the
 *    rest fused alike; UCX: it and the fused group around it, and the communicator is
 *    unusable afterwards, as for any fused group's mismatch there; a UCX pair also at 128 KiB,
 *    where the group runs the ring and process 0 reads its inputs in place);
 *  - an injected failure inside a group (every process fails the same op) fails it alone
 *    (MPI only: the UCX engine cannot tell a member that it skipped an operation);
 *  - a process that stops submitting halfway: the others end with CCQ_ERR_TIMEOUT within
 *    timeout_ms, and destroy returns;
 *  - a batch holds at most 64 collectives of the world's communicator (span_batch_ops) where
 *    the processes do not outnumber the cores, any number where they do, and as
 *    CCQ_SPAN_BATCH_OPS says.
 * Float inputs of the result checks are in {-1, 0, 1} (any order of combining gives the same
 * bits); the bit-identity check uses ref_fill's full values. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sched.h>

#include "ccq.h"
#include "fusion_work.h"
#include "ref.h"
#include "world_check.h"

#define F      4096 /* fusion threshold here: every fused op stays below 64 KiB */
#define MAXOPS 640
#define MAXRK  16
#define MAXF   4000 /* fused ops one list can hold */

static uint32_t wrank, wsize;
/* The threshold the plans' sizes sit around (F; larger for identical_ucx_pair). */
static uint64_t plan_f = F;

static uint32_t ndev_of(uint32_t p)
{
    return 1 + p % 2;
}

static uint64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000u + (uint64_t)t.tv_nsec / 1000000u;
}

static void sleep_us(unsigned us)
{
    struct timespec ts = {(time_t)(us / 1000000u), (long)(us % 1000000u) * 1000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

typedef struct world {
    ccq_runtime *rt;
    ccq_device_id first, devs[MAXRK];
    uint32_t cnt, total;
} world;

/* slot: a second runtime alive beside another one; over tcp:// it meets on the next port
 * (one rendezvous serves one world at a time). */
static void world_open_slot(world *w, uint64_t fusion, const char *fault, uint64_t timeout_ms,
                            unsigned slot)
{
    static char spec[2][256];
    ccq_config cfg;
    ccq_config_init(&cfg);
    if (cfg.bootstrap == NULL) /* under mpiexec; else CCQ_BOOTSTRAP (tcp://) */
        cfg.bootstrap = "mpi";
    if (slot > 0 && strncmp(cfg.bootstrap, "tcp://", 6) == 0) {
        const char *colon = strrchr(cfg.bootstrap, ':');
        CHECK(colon != NULL && slot < 2, "bootstrap %s", cfg.bootstrap);
        snprintf(spec[slot], sizeof spec[slot], "%.*s:%ld", (int)(colon - cfg.bootstrap),
                 cfg.bootstrap, strtol(colon + 1, NULL, 10) + (long)slot);
        cfg.bootstrap = spec[slot];
    }
    cfg.host_devices = ndev_of(wrank);
    cfg.timeout_ms = timeout_ms;
    cfg.max_streams = MAXOPS;
    cfg.fusion_bytes = fusion;
    cfg.fault = fault;
    cfg.trace_capacity = 1u << 18;
    CHECK(ccq_runtime_create(&cfg, &w->rt) == CCQ_OK, "ccq_runtime_create");
    CHECK(ccq_local_devices(w->rt, &w->first, &w->cnt) == CCQ_OK, "local devices");
    w->total = ccq_device_count(w->rt);
    CHECK(w->total <= MAXRK, "%u devices", w->total);
    for (uint32_t d = 0; d < w->total; d++)
        w->devs[d] = d;
    CHECK(ccq_comm_init(w->rt, w->devs, w->total) == CCQ_OK, "comm of the world");
}

static void world_open(world *w, uint64_t fusion, const char *fault, uint64_t timeout_ms)
{
    world_open_slot(w, fusion, fault, timeout_ms, 0);
}

static void world_close(world *w)
{
    CHECK(ccq_runtime_destroy(w->rt) == CCQ_OK, "destroy");
    w->rt = NULL;
}

/* How a process submits. */
enum { P_GATED, P_TRICKLE, P_FENCE, P_BURSTS, P_COUNT };
static const char *const pattern_names[] = {"all at once (gated)", "one at a time with pauses",
                                            "fence after each", "bursts"};

/* Which stream each op goes on (submit). */
enum { L_SPREAD, L_PER_OP, L_ONE };

typedef struct run {
    fw_op ops[MAXOPS];
    size_t n;
    ccq_dtype dt;
    ccq_reduce_op op;
    bool exact; /* inputs from ref_fill_exact (else ref_fill) */
    void *src[MAXOPS][2], *dst[MAXOPS][2];
    size_t dcount[MAXOPS][2];
    ccq_status st[MAXOPS]; /* with per-op streams: each op's fence on the first device */
} run;

/* Rank r's input of op i (the same in every process: the reference needs all of them). */
static void *input_of(const run *r, size_t i, uint32_t rank, uint32_t n)
{
    const fw_op *o = &r->ops[i];
    size_t c = ref_src_count(o->kind, n, o->root, rank, o->count);
    void *p = malloc(c * ref_dtype_size(r->dt) + 1);
    uint32_t seed = (uint32_t)(i * 131 + rank * 7 + 3);
    if (r->exact)
        ref_fill_exact(r->dt, p, c, seed);
    else
        ref_fill(r->dt, p, c, seed);
    return p;
}

static void run_alloc(run *r, const world *w, size_t nops, ccq_dtype dt, ccq_reduce_op op,
                      bool exact)
{
    memset(r, 0, sizeof *r);
    r->dt = dt;
    r->op = op;
    r->exact = exact;
    r->n = fw_plan_n(r->ops, MAXOPS, nops, dt, plan_f, w->total, true);
    for (size_t i = 0; i < r->n; i++)
        for (uint32_t k = 0; k < w->cnt; k++) {
            const fw_op *o = &r->ops[i];
            uint32_t rank = w->first + k;
            size_t dc = ref_dst_count(o->kind, w->total, o->root, rank, o->count + 1);
            r->src[i][k] = input_of(r, i, rank, w->total);
            /* room for one more element: a mismatching process submits count + 1 */
            r->src[i][k] = realloc(
                r->src[i][k], (ref_src_count(o->kind, w->total, o->root, rank, o->count + 1) + 1) *
                                  ref_dtype_size(dt));
            r->dst[i][k] = malloc(dc * ref_dtype_size(dt) + 1);
            memset(r->dst[i][k], 0x5a, dc * ref_dtype_size(dt));
            r->dcount[i][k] = ref_dst_count(o->kind, w->total, o->root, rank, o->count);
        }
}

static void run_free(run *r, const world *w)
{
    for (size_t i = 0; i < r->n; i++)
        for (uint32_t k = 0; k < w->cnt; k++) {
            free(r->src[i][k]);
            free(r->dst[i][k]);
        }
}

/*
 * Submit ops [0, upto) in `pattern`; op `mismatch` with one more element on process 1.
 * Streams (`layout`): L_PER_OP, device k's op i on stream i (each op's fence says how it
 * ended); L_SPREAD, op 0 on stream 0 and op i on stream (i + k) % 3, so one fused operation has
 * parts on several streams; L_ONE, every op on stream 0. The gate: a send to itself on stream
 * 0 of every local device, before anything, its recv on another stream after everything: op 0
 * waits behind it, and every later op behind op 0 (sequence order), so the scheduler then finds
 * all of them ready at once.
 *
 * Gated, which operations fuse is fixed only where the batches are: the first batch holds
 * every op or the first span_batch_ops (a cut), and a later batch takes a stream only once
 * that stream's batch in flight ended. L_SPREAD's streams end at different moments, so after
 * a cut the next batch's size, hence the fusion window of each process, depends on timing (a
 * sweep's reduce_scatters fused 3 to 31 times in runs of test_fusion_world_ucx_cut_np3);
 * L_ONE's next batch waits for the whole batch before it, the same in every run.
 */
static ccq_stream_id stream_of(int layout, size_t i, uint32_t k)
{
    return layout == L_PER_OP          ? (ccq_stream_id)i
           : layout == L_ONE || i == 0 ? 0
                                       : (ccq_stream_id)((i + k) % 3);
}

static void submit(world *w, run *r, int pattern, size_t upto, long mismatch, int layout,
                   uint32_t seed)
{
    bool per_op = layout == L_PER_OP;
    static uint32_t gate_out[2][1], gate_in[2][1];
    ccq_stream_id gate_s = per_op ? (ccq_stream_id)(MAXOPS - 1) : 3;
    unsigned burst = 1 + seed % 37;
    if (pattern == P_GATED)
        for (uint32_t k = 0; k < w->cnt; k++)
            CHECK(ccq_send(w->rt, w->first + k, 0, gate_in[k], 1, CCQ_UINT32, w->first + k) ==
                      CCQ_OK,
                  "gate");
    for (size_t i = 0; i < upto; i++) {
        const fw_op *o = &r->ops[i];
        for (uint32_t k = 0; k < w->cnt; k++) {
            ccq_stream_id s = stream_of(layout, i, k);
            size_t count = (long)i == mismatch && wrank == 1 ? o->count + 1 : o->count;
            ccq_status st = ref_submit(w->rt, o->kind, w->first + k, s, r->src[i][k], r->dst[i][k],
                                       count, r->dt, r->op, w->devs[o->root], w->devs, w->total);
            /* After a mismatch the communicator is aborted: later submissions are refused. */
            if (st != CCQ_OK && mismatch >= 0 && (long)i > mismatch && per_op) {
                r->st[i] = st;
                continue;
            }
            CHECK(st == CCQ_OK, "submit op %zu", i);
        }
        seed = seed * 1103515245u + 12345u;
        if (pattern == P_TRICKLE && (seed >> 16) % 5 == 0)
            sleep_us(100 + (seed >> 8) % 400);
        if (pattern == P_FENCE)
            for (uint32_t k = 0; k < w->cnt; k++) {
                ccq_status st = ccq_sync_collective(w->rt, w->first + k, stream_of(layout, i, k));
                if (per_op && k == 0 && r->st[i] == CCQ_OK)
                    r->st[i] = st;
            }
        if (pattern == P_BURSTS && (i + 1) % burst == 0) {
            sleep_us(1000);
            burst = 1 + (seed >> 16) % 37;
        }
    }
    if (pattern == P_GATED)
        for (uint32_t k = 0; k < w->cnt; k++)
            CHECK(ccq_recv(w->rt, w->first + k, gate_s, gate_out[k], 1, CCQ_UINT32, w->first + k) ==
                      CCQ_OK,
                  "gate opens");
}

/* Fence everything; with per-op streams (L_PER_OP), record each op's outcome on the first device.
 */
static void fence_all(world *w, run *r, int pattern, int layout)
{
    bool per_op = layout == L_PER_OP;
    for (uint32_t k = 0; k < w->cnt; k++) {
        if (per_op) {
            for (size_t i = 0; i < r->n; i++) {
                ccq_status st = ccq_sync_collective(w->rt, w->first + k, (ccq_stream_id)i);
                if (k == 0 && pattern != P_FENCE && r->st[i] == CCQ_OK)
                    r->st[i] = st;
            }
            (void)ccq_sync_collective(w->rt, w->first + k, MAXOPS - 1);
        } else {
            for (ccq_stream_id s = 0; s < 4; s++)
                CHECK(ccq_sync_collective(w->rt, w->first + k, s) == CCQ_OK,
                      "fence of device %u stream %u", w->first + k, s);
        }
    }
}

/* Every op with status OK (all of them without per-op status) wrote the reference. */
static void check_results(const world *w, const run *r, bool per_op)
{
    void *in[MAXRK];
    for (size_t i = 0; i < r->n; i++) {
        const fw_op *o = &r->ops[i];
        if (per_op && r->st[i] != CCQ_OK)
            continue;
        for (uint32_t rk = 0; rk < w->total; rk++)
            in[rk] = input_of(r, i, rk, w->total);
        for (uint32_t k = 0; k < w->cnt; k++) {
            uint32_t rank = w->first + k;
            size_t dc = r->dcount[i][k];
            void *want = malloc(dc * ref_dtype_size(r->dt) + 1);
            char msg[256];
            ref_collective(o->kind, r->dt, r->op, w->total, o->root, (const void *const *)in, rank,
                           want, o->count);
            CHECK(ref_compare(r->dt, r->dst[i][k], want, dc, msg, sizeof msg) == 0,
                  "%s %s op %zu (%s x %zu) rank %u: %s", ccq_dtype_name(r->dt),
                  ccq_reduce_op_name(r->op), i, ccq_kind_name(o->kind), o->count, rank, msg);
            free(want);
        }
        for (uint32_t rk = 0; rk < w->total; rk++)
            free(in[rk]);
    }
}

/* This process's fused operations on the world communicator (id 0), as (seq, count) pairs
 * after a count; returns how many. */
static uint64_t fused_list(world *w, uint64_t *list)
{
    size_t cap = 1u << 18, n = 0;
    ccq_event *ev = malloc(cap * sizeof *ev);
    uint64_t nf = 0;
    ev[0].struct_size = sizeof *ev;
    CHECK(ccq_trace_snapshot(w->rt, ev, cap, &n, NULL) == CCQ_OK, "snapshot");
    memset(list, 0, (1 + 2 * MAXF) * sizeof *list);
    for (size_t e = 0; e < n; e++)
        if (ev[e].type == CCQ_EV_FUSED && ev[e].comm == 0) {
            CHECK(nf < MAXF, "too many fused ops");
            CHECK(ev[e].status == CCQ_OK, "fused op at #%llu failed",
                  (unsigned long long)ev[e].seq);
            list[1 + 2 * nf] = ev[e].seq;
            list[2 + 2 * nf] = ev[e].count;
            nf++;
        }
    list[0] = nf;
    free(ev);
    return nf;
}

/* This process's fused operations on the world communicator, counted by kind. */
static void fused_kinds(world *w, uint64_t *per_kind)
{
    size_t cap = 1u << 18, n = 0;
    ccq_event *ev = malloc(cap * sizeof *ev);
    ev[0].struct_size = sizeof *ev;
    CHECK(ccq_trace_snapshot(w->rt, ev, cap, &n, NULL) == CCQ_OK, "snapshot");
    memset(per_kind, 0, CCQ_KIND_COUNT_ * sizeof *per_kind);
    for (size_t e = 0; e < n; e++)
        if (ev[e].type == CCQ_EV_FUSED && ev[e].comm == 0 && ev[e].kind < CCQ_KIND_COUNT_)
            per_kind[ev[e].kind]++;
    free(ev);
}

/* Every kind the engine fuses was fused at least once: all_reduce, all_gather and
 * reduce_scatter on both engines, broadcast on the MPI engine (the UCX engine's broadcast tree
 * carries no word from every member, which its agreement needs: ucx/fused.c). Certain only for
 * sweeps whose batches are the same in every run (submit, L_ONE). */
static void check_kinds_fused(world *w, bool ucx)
{
    static const ccq_kind kinds[] = {CCQ_KIND_ALL_REDUCE, CCQ_KIND_ALL_GATHER,
                                     CCQ_KIND_REDUCE_SCATTER, CCQ_KIND_BROADCAST};
    uint64_t per_kind[CCQ_KIND_COUNT_];
    fused_kinds(w, per_kind);
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        bool expect = !(ucx && kinds[k] == CCQ_KIND_BROADCAST);
        CHECK((per_kind[kinds[k]] > 0) == expect, "%s: %llu fused operations (expected %s)",
              ccq_kind_name(kinds[k]), (unsigned long long)per_kind[kinds[k]],
              expect ? "some" : "none");
    }
}

/* Every process fused the same operations: the lists, all-gathered, are equal. */
static uint64_t check_same_fusion(world *w)
{
    enum { L = 1 + 2 * MAXF };
    static uint64_t mine[L], all[2][MAXRK * L];
    uint64_t nf = fused_list(w, mine);
    /* The exchange: an all_gather on the world (L elements: far above F, never fused). */
    for (uint32_t k = 0; k < w->cnt; k++)
        CHECK(ccq_all_gather(w->rt, w->first + k, 5, mine, all[k], L, CCQ_UINT64, w->devs,
                             w->total) == CCQ_OK,
              "exchange");
    for (uint32_t k = 0; k < w->cnt; k++)
        CHECK(ccq_sync_collective(w->rt, w->first + k, 5) == CCQ_OK, "exchange fence");
    for (uint32_t rk = 0; rk < w->total; rk++) {
        const uint64_t *theirs = all[0] + (size_t)rk * L;
        if (memcmp(theirs, mine, sizeof mine) == 0)
            continue;
        for (uint64_t j = 0; j < L; j++)
            CHECK(theirs[j] == mine[j],
                  "rank %u fused differently: entry %llu is %llu here, %llu there (%llu fused "
                  "ops here, %llu there)",
                  rk, (unsigned long long)j, (unsigned long long)mine[j],
                  (unsigned long long)theirs[j], (unsigned long long)nf,
                  (unsigned long long)theirs[0]);
    }
    return nf;
}

/* 600 ops, each process its own pattern, every round another assignment. */
static void patterns(void)
{
    unsigned rounds = P_COUNT;
    const char *e = getenv("CCQ_TEST_ITERS");
    if (e != NULL && atoi(e) > 0)
        rounds = (unsigned)atoi(e);
    for (unsigned round = 0; round < rounds; round++) {
        world w;
        run *r = malloc(sizeof *r);
        int pattern = (int)((wrank + round) % P_COUNT);
        uint64_t t0 = now_ms(), nf;
        world_open(&w, F, NULL, 30000);
        run_alloc(r, &w, 600, round % 2 ? CCQ_INT32 : CCQ_FLOAT32, round % 2 ? CCQ_MAX : CCQ_SUM,
                  true);
        submit(&w, r, pattern, r->n, -1, L_SPREAD, 17 + round * 7 + wrank);
        fence_all(&w, r, pattern, L_SPREAD);
        check_results(&w, r, false);
        nf = check_same_fusion(&w);
        printf("process %u round %u: %s: %zu ops, %llu fused operations (the same in every "
               "process), %llu ms\n",
               wrank, round, pattern_names[pattern], r->n, (unsigned long long)nf,
               (unsigned long long)(now_ms() - t0));
        run_free(r, &w);
        free(r);
        world_close(&w);
    }
}

static bool ucx_engine(void)
{
    const char *e = getenv("CCQ_HOST_ENGINE");
    return e != NULL && strcmp(e, "ucx") == 0;
}

/* Fused and unfused side by side, every dtype x op, random inputs: the same bits. */
static void identical(void)
{
    static const ccq_reduce_op ops[] = {CCQ_SUM, CCQ_PROD, CCQ_MAX, CCQ_MIN, CCQ_AVG};
    world off, on;
    uint64_t fused = 0, l[1 + 2 * MAXF];
    world_open(&off, 0, NULL, 30000);
    world_open_slot(&on, F, NULL, 30000, 1);
    for (int dt = 0; dt < CCQ_DTYPE_COUNT_; dt++)
        for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
            run *a = malloc(sizeof *a), *b = malloc(sizeof *b);
            /* Every other sweep on one stream: check_kinds_fused needs those (submit). */
            int layout = (dt * (int)(sizeof ops / sizeof ops[0]) + (int)o) % 2 ? L_SPREAD : L_ONE;
            run_alloc(a, &off, 0, (ccq_dtype)dt, ops[o], false);
            run_alloc(b, &on, 0, (ccq_dtype)dt, ops[o], false);
            submit(&off, a, P_GATED, a->n, -1, layout, 1);
            submit(&on, b, P_GATED, b->n, -1, layout, 1);
            fence_all(&off, a, P_GATED, layout);
            fence_all(&on, b, P_GATED, layout);
            for (size_t i = 0; i < a->n; i++)
                for (uint32_t k = 0; k < on.cnt; k++)
                    CHECK(memcmp(a->dst[i][k], b->dst[i][k],
                                 a->dcount[i][k] * ref_dtype_size(a->dt)) == 0,
                          "%s %s op %zu (%s x %zu) rank %u: fused and unfused results differ",
                          ccq_dtype_name(a->dt), ccq_reduce_op_name(a->op), i,
                          ccq_kind_name(a->ops[i].kind), a->ops[i].count, on.first + k);
            run_free(a, &off);
            run_free(b, &on);
            free(a);
            free(b);
        }
    CHECK(fused_list(&off, l) == 0, "fusion off fused something");
    fused = check_same_fusion(&on);
    CHECK(fused > 0, "nothing fused");
    check_kinds_fused(&on, ucx_engine());
    if (wrank == 0)
        printf("bit-identical fused (%llu fused operations) and unfused, every dtype x op\n",
               (unsigned long long)fused);
    world_close(&on);
    world_close(&off);
}

/* The UCX engine with two processes also fuses all_reduces above its ring threshold (32 KiB)
 * and reduce_scatters above its direct threshold (64 KiB in all) whose combine commutes
 * (ucx/fused.c): their fused recursive doubling and direct exchange must give the ring's bits.
 * Sizes around `big` (every kind of the plan), fused and unfused side by side, the first
 * ncases cases. Process 0 has one device: its fused rings read their parts' inputs in place
 * (engine.c, ucx_fused_own_block), and from 1 MiB a group also lands its partials in place
 * (ucx/allreduce_ring.c); process 1 packs its two devices' combine. */
static void identical_ucx_pair(uint64_t big, size_t ncases)
{
    static const struct {
        ccq_dtype dt;
        ccq_reduce_op op;
    } cases[] = {{CCQ_FLOAT32, CCQ_SUM},   {CCQ_FLOAT32, CCQ_AVG}, {CCQ_FLOAT16, CCQ_SUM},
                 {CCQ_BFLOAT16, CCQ_PROD}, {CCQ_FLOAT64, CCQ_SUM}, {CCQ_INT32, CCQ_MAX},
                 {CCQ_UINT8, CCQ_MIN}};
    world off, on;
    uint64_t l[1 + 2 * MAXF], fused;
    plan_f = big;
    world_open(&off, 0, NULL, 30000);
    world_open_slot(&on, big, NULL, 30000, 1);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0] && c < ncases; c++) {
        run *a = malloc(sizeof *a), *b = malloc(sizeof *b);
        int layout = c % 2 ? L_SPREAD : L_ONE; /* as in identical() */
        run_alloc(a, &off, 0, cases[c].dt, cases[c].op, false);
        run_alloc(b, &on, 0, cases[c].dt, cases[c].op, false);
        submit(&off, a, P_GATED, a->n, -1, layout, 1);
        submit(&on, b, P_GATED, b->n, -1, layout, 1);
        fence_all(&off, a, P_GATED, layout);
        fence_all(&on, b, P_GATED, layout);
        for (size_t i = 0; i < a->n; i++)
            for (uint32_t k = 0; k < on.cnt; k++)
                CHECK(memcmp(a->dst[i][k], b->dst[i][k], a->dcount[i][k] * ref_dtype_size(a->dt)) ==
                          0,
                      "%s %s op %zu (%s x %zu): fused and unfused results differ (2 "
                      "processes, large parts)",
                      ccq_dtype_name(a->dt), ccq_reduce_op_name(a->op), i,
                      ccq_kind_name(a->ops[i].kind), a->ops[i].count);
        run_free(a, &off);
        run_free(b, &on);
        free(a);
        free(b);
    }
    CHECK(fused_list(&off, l) == 0, "fusion off fused something");
    fused = fused_list(&on, l);
    CHECK(fused > 0, "nothing fused");
    check_kinds_fused(&on, true);
    if (wrank == 0)
        printf("2 processes, parts up to %llu KiB: bit-identical fused (%llu fused "
               "operations) and unfused\n",
               (unsigned long long)(2 * big / 1024), (unsigned long long)fused);
    world_close(&on);
    world_close(&off);
    plan_f = F;
}

/* Every process here before any goes on: an all_reduce on a communicator of each process's
 * first device (not the world's, which a fused group's mismatch on the UCX engine leaves
 * unusable). So no process destroys its runtime while another still waits to hear of a
 * failure from it (its exit would reach the other as a lost peer first). */
static void barrier(world *w)
{
    ccq_device_id firsts[8];
    uint32_t x = 1, y = 0;
    for (uint32_t p = 0, d = 0; p < wsize; d += ndev_of(p), p++)
        firsts[p] = d;
    CHECK(ccq_comm_init(w->rt, firsts, wsize) == CCQ_OK, "barrier comm");
    CHECK(ccq_all_reduce(w->rt, w->first, 7, &x, &y, 1, CCQ_UINT32, CCQ_SUM, firsts, wsize) ==
              CCQ_OK,
          "barrier");
    CHECK(ccq_sync_collective(w->rt, w->first, 7) == CCQ_OK && y == wsize, "barrier fence");
}

/* The cores the world's processes (all on this host) may run on together: the union of their
 * affinity masks, counted with the world's own all_reduce. */
static uint32_t world_cores(const world *w)
{
    static uint32_t on[2][CPU_SETSIZE], sum[2][CPU_SETSIZE];
    cpu_set_t set;
    uint32_t n = 0;
    CHECK(sched_getaffinity(0, sizeof set, &set) == 0, "affinity");
    for (uint32_t k = 0; k < w->cnt; k++) {
        for (int c = 0; c < CPU_SETSIZE; c++)
            on[k][c] = CPU_ISSET(c, &set) ? 1u : 0u;
        CHECK(ccq_all_reduce(w->rt, w->first + k, 0, on[k], sum[k], CPU_SETSIZE, CCQ_UINT32,
                             CCQ_SUM, w->devs, w->total) == CCQ_OK,
              "cores");
    }
    for (uint32_t k = 0; k < w->cnt; k++)
        CHECK(ccq_sync_collective(w->rt, w->first + k, 0) == CCQ_OK, "cores fence");
    for (int c = 0; c < CPU_SETSIZE; c++)
        n += sum[0][c] != 0;
    return n;
}

/* A batch holds at most CCQ_HOST_SPAN_BATCH_OPS (64) collectives of a communicator spanning
 * processes (backend.h, span_batch_ops) where the host's processes do not outnumber the
 * cores they may run on together (the union of their affinities: processes bound to a core
 * each by a launcher do not, though each sees one), and any number where they do: 200
 * one-element all_reduces, all queued before the
 * scheduler may issue any (the gate), run in batches of at most 64 of them (and the gate's
 * pair per local device), or in one (max_batch_ops' 256 bounds it), every result right.
 * env: CCQ_SPAN_BATCH_OPS for every process (NULL: as the test was started, the default when
 * unset; a ctest variant runs the whole test with a small cut, see tests/CMakeLists.txt). */
static void batch_cap(const char *env)
{
    enum { N = 200, CAP = 64 };
    static float v[N][2];
    static uint32_t gate_out[2][1], gate_in[2][1];
    world w;
    ccq_stats st = {.struct_size = sizeof st};
    const char *given = getenv("CCQ_SPAN_BATCH_OPS");
    char saved[32];
    snprintf(saved, sizeof saved, "%s", given != NULL ? given : "");
    const char *cut = env != NULL ? env : given != NULL ? saved : NULL;
    bool capped;
    uint64_t limit;
    uint32_t cores;
    if (env != NULL)
        setenv("CCQ_SPAN_BATCH_OPS", env, 1);
    world_open(&w, F, NULL, 60000);
    if (given != NULL) /* as the test was started, for the rest of it */
        setenv("CCQ_SPAN_BATCH_OPS", saved, 1);
    else
        unsetenv("CCQ_SPAN_BATCH_OPS");
    float want = (float)w.total * (float)(w.total + 1) / 2.0f;
    for (uint32_t k = 0; k < w.cnt; k++)
        CHECK(ccq_send(w.rt, w.first + k, 0, gate_in[k], 1, CCQ_UINT32, w.first + k) == CCQ_OK,
              "gate");
    for (size_t i = 0; i < N; i++)
        for (uint32_t k = 0; k < w.cnt; k++) {
            v[i][k] = (float)(w.first + k + 1);
            CHECK(ccq_all_reduce(w.rt, w.first + k, 0, v[i] + k, v[i] + k, 1, CCQ_FLOAT32, CCQ_SUM,
                                 w.devs, w.total) == CCQ_OK,
                  "all_reduce %zu", i);
        }
    for (uint32_t k = 0; k < w.cnt; k++)
        CHECK(ccq_recv(w.rt, w.first + k, 3, gate_out[k], 1, CCQ_UINT32, w.first + k) == CCQ_OK,
              "gate opens");
    for (uint32_t k = 0; k < w.cnt; k++)
        CHECK(ccq_sync_collective(w.rt, w.first + k, 0) == CCQ_OK &&
                  ccq_sync_collective(w.rt, w.first + k, 3) == CCQ_OK,
              "fence: %s", ccq_last_error_detail());
    for (size_t i = 0; i < N; i++)
        for (uint32_t k = 0; k < w.cnt; k++)
            CHECK(v[i][k] == want, "all_reduce %zu: %g, want %g", i, (double)v[i][k], (double)want);
    CHECK(ccq_get_stats(w.rt, &st) == CCQ_OK, "stats");
    cores = world_cores(&w); /* after the stats: its own batch is not counted */
    capped = cut != NULL ? strcmp(cut, "0") != 0 : wsize <= cores;
    /* The cut this run must show: the one set (a ctest variant's 8 as much as 64), else 64. */
    limit = cut != NULL && capped ? strtoull(cut, NULL, 10) : CAP;
    if (capped)
        CHECK(limit > 0 && st.max_batch_ops <= limit + w.cnt &&
                  st.batches >= (N + limit - 1) / limit,
              "capped (CCQ_SPAN_BATCH_OPS %s): %llu operations in the largest batch, %llu "
              "batches (want at most %llu, at least %llu)",
              cut ? cut : "unset", (unsigned long long)st.max_batch_ops,
              (unsigned long long)st.batches, (unsigned long long)(limit + w.cnt),
              (unsigned long long)((N + limit - 1) / (limit ? limit : 1)));
    else
        CHECK(st.max_batch_ops > CAP + w.cnt,
              "not capped (CCQ_SPAN_BATCH_OPS %s): %llu operations in the largest batch",
              cut ? cut : "unset", (unsigned long long)st.max_batch_ops);
    world_close(&w);
    if (wrank == 0)
        printf("CCQ_SPAN_BATCH_OPS %s, %u processes on %u cores: largest batch %llu operations, "
               "%llu batches\n",
               cut ? cut : "unset", wsize, cores, (unsigned long long)st.max_batch_ops,
               (unsigned long long)st.batches);
}

/* Process 1 submits op m (of the plan's first nops) with one more element. m = 5: inside the
 * first all_reduce run (ops 4 and 5, F/2 each, would fuse); 53: the all_gather run's; 69: the
 * reduce_scatter run's. */
static void mismatch(int variant, long m, size_t nops)
{
    world w;
    run *r = malloc(sizeof *r);
    /* variant 1: process 0 fences each op, so it offers 1 and starts op m without waiting */
    int pattern = variant == 1 && wrank == 0 ? P_FENCE : P_GATED;
    uint64_t t0 = now_ms();
    world_open(&w, plan_f, NULL, 20000);
    run_alloc(r, &w, nops, CCQ_FLOAT32, CCQ_SUM, true);
    CHECK((size_t)m < r->n, "op %ld of %zu", m, r->n);
    submit(&w, r, pattern, r->n, m, L_PER_OP, 5);
    fence_all(&w, r, pattern, L_PER_OP);
    CHECK(r->st[m] == CCQ_ERR_MISMATCH, "variant %d: op %ld (%s) ended with %s", variant, m,
          ccq_kind_name(r->ops[m].kind), ccq_status_name(r->st[m]));
    if (ucx_engine()) {
        /* The UCX engine finds a mismatch in the headers of the data messages: the fused
         * operation holding op m (here ops m - 1 and m, or m alone) fails in every process,
         * and the communicator with it (docs/multiprocess-host.md), failing what was still in
         * flight on it (the ops before m run beside it): every op is right or fails with
         * CCQ_ERR_MISMATCH, nothing hangs. */
        for (size_t i = 0; i < r->n; i++)
            CHECK(r->st[i] == CCQ_OK || r->st[i] == CCQ_ERR_MISMATCH ||
                      (i > (size_t)m && r->st[i] == CCQ_ERR_ABORTED),
                  "variant %d: op %zu: %s", variant, i, ccq_status_name(r->st[i]));
        CHECK(now_ms() - t0 < 15000, "variant %d: the mismatch took %llu ms", variant,
              (unsigned long long)(now_ms() - t0));
        check_results(&w, r, true);
        barrier(&w);
        if (wrank == 0)
            printf("mismatch inside a fused %s group on UCX (%s): CCQ_ERR_MISMATCH in every "
                   "process, %llu ms\n",
                   ccq_kind_name(r->ops[m].kind),
                   variant ? "one process fenced each op" : "every process gated",
                   (unsigned long long)(now_ms() - t0));
        run_free(r, &w);
        free(r);
        /* A stray payload of the mismatch that its receiver dropped unfetched must not hold
         * its sender's destroy for timeout_ms (20 s: the next world's deadline, which the
         * others then missed, CI 2026-12-03): the receiver's goodbye ends the wait. */
        t0 = now_ms();
        world_close(&w);
        CHECK(now_ms() - t0 < 10000, "variant %d: destroy took %llu ms", variant,
              (unsigned long long)(now_ms() - t0));
        if (getenv("CCQ_TEST_VERBOSE") != NULL)
            printf("process %u: destroy after the mismatch: %llu ms\n", wrank,
                   (unsigned long long)(now_ms() - t0));
        return;
    }
    /* The engine checks every member's signature before data moves (issue 22): the mismatched
     * op fails alone, cut out of its fused group, and the communicator goes on. */
    for (size_t i = 0; i < r->n; i++)
        CHECK(i == (size_t)m || r->st[i] == CCQ_OK, "variant %d: op %zu: %s", variant, i,
              ccq_status_name(r->st[i]));
    CHECK(now_ms() - t0 < 15000, "variant %d: the mismatch took %llu ms", variant,
          (unsigned long long)(now_ms() - t0));
    check_results(&w, r, true);
    check_same_fusion(&w);
    if (wrank == 0)
        printf("mismatch inside a fused %s group (%s): CCQ_ERR_MISMATCH for it alone in every "
               "process, the rest fused alike and right, %llu ms\n",
               ccq_kind_name(r->ops[m].kind),
               variant ? "one process fenced each op" : "every process gated",
               (unsigned long long)(now_ms() - t0));
    run_free(r, &w);
    free(r);
    world_close(&w);
}

/* Every process fails its operation number 10 by injection (inside a would-be group 9-11).
 * Which operation that is depends on when the gates' pairs were issued (a loaded process can
 * number one more first), so each process checks what holds either way: the ops the
 * injection hit in any process fail (CCQ_ERR_BACKEND where it hit, CCQ_ERR_MISMATCH "did not
 * run" in the others: issue 22's check), at most one per process, every other op completes
 * right, and the fused operations are the same list in every process. */
static void injected(void)
{
    world w;
    run *r = malloc(sizeof *r);
    uint32_t nbackend = 0, nfailed = 0;
    world_open(&w, F, "fail:op=10", 20000);
    run_alloc(r, &w, 32, CCQ_FLOAT32, CCQ_SUM, true);
    submit(&w, r, P_GATED, r->n, -1, L_PER_OP, 9);
    fence_all(&w, r, P_GATED, L_PER_OP);
    for (size_t i = 0; i < r->n; i++) {
        CHECK(r->st[i] == CCQ_OK || r->st[i] == CCQ_ERR_BACKEND || r->st[i] == CCQ_ERR_MISMATCH,
              "op %zu: %s", i, ccq_status_name(r->st[i]));
        CHECK(r->st[i] == CCQ_OK || (i >= 7 && i <= 11), "op %zu: %s (not where injected)", i,
              ccq_status_name(r->st[i]));
        nbackend += r->st[i] == CCQ_ERR_BACKEND;
        nfailed += r->st[i] != CCQ_OK;
    }
    CHECK(nbackend == 1, "%u ops failed by the injection here", nbackend);
    CHECK(nfailed <= wsize, "%u ops failed", nfailed);
    check_results(&w, r, true);
    check_same_fusion(&w);
    run_free(r, &w);
    free(r);
    world_close(&w);
}

/* The last process submits only the first half: the others time out, destroy returns. */
static void stopped(void)
{
    world w;
    run *r = malloc(sizeof *r);
    bool stopper = wrank == wsize - 1;
    uint64_t t0 = now_ms();
    world_open(&w, F, NULL, 3000);
    run_alloc(r, &w, 64, CCQ_FLOAT32, CCQ_SUM, true);
    submit(&w, r, P_GATED, stopper ? r->n / 2 : r->n, -1, L_PER_OP, 3);
    if (stopper) {
        for (size_t i = 0; i < r->n; i++)
            r->st[i] = i < r->n / 2 ? ccq_sync_collective(w.rt, w.first, (ccq_stream_id)i)
                                    : CCQ_ERR_INVALID_ARGUMENT; /* never submitted */
        for (size_t i = 0; i < r->n / 2; i++)
            CHECK(r->st[i] == CCQ_OK, "op %zu: %s", i, ccq_status_name(r->st[i]));
    } else {
        bool timed_out = false;
        fence_all(&w, r, P_GATED, L_PER_OP);
        for (size_t i = 0; i < r->n; i++) {
            if (i < r->n / 2)
                CHECK(r->st[i] == CCQ_OK, "op %zu: %s", i, ccq_status_name(r->st[i]));
            else /* UCX: the stopper's exit may end them first (a peer error) */
                CHECK(r->st[i] == CCQ_ERR_TIMEOUT || r->st[i] == CCQ_ERR_ABORTED ||
                          (ucx_engine() &&
                           (r->st[i] == CCQ_ERR_BACKEND || r->st[i] == CCQ_ERR_PROCESS_LOST)),
                      "op %zu: %s", i, ccq_status_name(r->st[i]));
            timed_out |= r->st[i] == CCQ_ERR_TIMEOUT;
        }
        /* The MPI engine's own deadline comes first; the UCX engine's ops may all end by the
         * watchdog's abort instead (docs/multiprocess-host.md, Failure). */
        CHECK(timed_out || ucx_engine(), "no op timed out");
        CHECK(now_ms() - t0 < 12000, "the others took %llu ms",
              (unsigned long long)(now_ms() - t0));
    }
    check_results(&w, r, true);
    run_free(r, &w);
    free(r);
    world_close(&w);
    if (wrank == 0)
        printf("a process stopped halfway: the others timed out, %llu ms\n",
               (unsigned long long)(now_ms() - t0));
}

int main(void)
{
    ccq_config cfg;
    ccq_config_init(&cfg);
    wrank = cfg.world_rank;
    wsize = cfg.world_size;
    CHECK(wsize >= 2 && wsize <= 8, "run me under mpiexec -n 2..8 (world_size %u)", wsize);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (getenv("CCQ_TEST_BIND_CORE") != NULL) {
        /* As a launcher that binds each process to a core of its own (mpirun --bind-to core,
         * srun --cpu-bind=cores): process r on the (r mod n)-th of its n cores. Each then sees
         * one core, and the cap must still hold where the processes have a core each. Only
         * the cap is checked this way. */
        cpu_set_t all, one;
        int seen = 0;
        CHECK(sched_getaffinity(0, sizeof all, &all) == 0, "affinity");
        CPU_ZERO(&one);
        for (int c = 0, want = (int)(wrank % (uint32_t)CPU_COUNT(&all)); c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &all) && seen++ == want)
                CPU_SET(c, &one);
        CHECK(sched_setaffinity(0, sizeof one, &one) == 0, "bind");
        batch_cap(NULL);
        return 0;
    }
    batch_cap(NULL);
    batch_cap("64");
    batch_cap("0");
    patterns();
    identical();
    if (ucx_engine() && wsize == 2) {
        identical_ucx_pair(256u * 1024u, 7);
        identical_ucx_pair(1024u * 1024u, 2); /* groups of 1 MiB: float32 sum and average */
    }
    mismatch(0, 5, 32);
    mismatch(1, 5, 32);
    if (ucx_engine() && wsize == 2) { /* ops 4 and 5 (128 KiB each) fuse into a pair's ring */
        plan_f = 256u * 1024u;
        mismatch(0, 5, 32);
        plan_f = F;
    }
    mismatch(0, 53, 80); /* inside an all_gather group */
    mismatch(1, 69, 80); /* inside a reduce_scatter group */
    /* An op one process skips (its parts failed before the engine): the MPI engine's records
     * tell the members; the UCX engine's members wait for it until their deadline. */
    if (!ucx_engine())
        injected();
    stopped();
    printf("process %u: OK\n", wrank);
    return 0;
}
