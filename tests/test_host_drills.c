/* Drills of the host backend across processes, one mode per run (argv[1]): under mpiexec
 * (bootstrap "mpi") on the engine CCQ_HOST_ENGINE names, or as plain processes (tests/launch,
 * CCQ_BOOTSTRAP=tcp://...) on the UCX engine. Each bounds itself in time (alarm) and names
 * what it waited for when it fails. Issue 22's failures, each reproduced here:
 *
 *   dump DIR   -n 3: process 2 joins the world's communicator, never joins its all_reduce
 *              and destroys its runtime; 0 and 1 print their fence's error and _exit at
 *              once. run_drill_dump.sh then checks that every process's dump is on disk,
 *              whole (valid JSON, no temporary file left), holding the failure.
 *   mismatch   -n 3: count, dtype, op, root and kind mismatches across processes (a
 *              collective of the world, of a pair; a send/recv count): CCQ_ERR_MISMATCH on
 *              every member naming processes, ranks and fields, never an MPI abort, and the
 *              operations after each run with exact results.
 *   stall      -n 3: process 2 stops submitting on the world's communicator; a warmed-up
 *              pair {0,1} keeps working on another stream at its usual speed.
 *   destroy    -n 2: a pair's first collective is never joined by process 1: process 0's
 *              fence fails and its ccq_runtime_destroy returns.
 *   early      -n 3, 2 devices each: one batch of process 0 holds the world's all_reduce
 *              (process 2 never joins it) and a pair's (made so by a stall of its scheduler:
 *              CCQ_FAULT stall, which installs the fault layer): the pair's fence returns at
 *              once, not at the world's deadline (ccq_be_op.done_early passed on by the fault
 *              layer).
 *   told       -n 4, UCX engine: the path where members completed an operation the others
 *              failed alone over a disagreement among themselves, and their next operation
 *              tells them (ucx_comm_tell). Processes 0 and 1 run all_reduces of two counts
 *              (recursive doubling: each other's partner at its first step), 2 and 3 a
 *              broadcast rooted at 2 (2 sends to 0 and 3; 3 receives only from 2). Ordered by
 *              when each submits: 1 first, then 2 and 3 (who complete: nobody has failed
 *              anything yet), then 0, whose queue holds 1's header before 2's: it fails the
 *              all_reduce alone on the count and tells everyone; 2 and 3, done with it, can
 *              only fail the communicator; they submit their next operation after they
 *              heard, which is refused and tells 0 and 1. Every process's next operation
 *              fails with CCQ_ERR_MISMATCH, soon. Without the tell, 0 and 1 would wait for 2
 *              and 3 until timeout_ms.
 *   raced      -n 4, UCX engine: the same disagreement, but 2 and 3 submit their next
 *              operation (everyone to everyone at once: CCQ_UCX_DIRECT_AR_BYTES) as soon as
 *              the broadcast completed, and their schedulers stand still 800 ms after its
 *              messages left (CCQ_FAULT stall): 0 and 1 hold every message of it before they
 *              start it. Those say that 2 and 3 completed the operation 0 and 1 failed alone
 *              (ucx_hdr.prior_sum, ucx/prior.c): the next operation fails with
 *              CCQ_ERR_MISMATCH on every process. Without that, 0 and 1 completed it
 *              (exact) while 2 and 3 failed it.
 *   late       -n 2: process 0's scheduler stands still past timeout_ms (CCQ_FAULT stall)
 *              right after issuing an all_reduce process 1 never joins, as a stopped or
 *              preempted process: it wakes past both the engine's deadline and the
 *              watchdog's, and the engine's still ends the operation (CCQ_ERR_TIMEOUT naming
 *              what it waits for), not the watchdog's abort of its batch's communicators.
 *   idle       -n 3: process 2 creates its runtime and makes no ccq call for 4 s; the pair
 *              {0,1} forms and works at once, and every process exits cleanly (MPI_Finalize).
 *   stress N   -n 3: 3 devices per process, one thread each, N rounds of rings both ways,
 *              an in-place shift and all pairs on several streams, sizes up to 20000
 *              elements; every received element checked. */
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ccq.h"

static uint32_t wrank, wsize;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "process %u: line %d: ", wrank, __LINE__);                             \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, " (last detail: %s)\n", ccq_last_error_detail());                      \
            fflush(stderr);                                                                        \
            _exit(1);                                                                              \
        }                                                                                          \
    } while (0)

static uint64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000u + (uint64_t)t.tv_nsec / 1000000u;
}

static void on_alarm(int sig)
{
    static const char msg[] = "drill: over its time bound (a hang)\n";
    (void)sig;
    if (write(2, msg, sizeof msg - 1) < 0) {
    }
    _exit(3);
}

/* Bound the whole process: a hang fails with a message instead of waiting for ctest. */
static void bound(unsigned seconds)
{
    signal(SIGALRM, on_alarm);
    alarm(seconds);
}

static ccq_runtime *make_faulty(uint32_t ndev, uint64_t timeout_ms, const char *trace_file,
                                const char *fault)
{
    ccq_config cfg;
    ccq_runtime *rt = NULL;
    ccq_config_init(&cfg);
    cfg.fault = fault;
    if (cfg.bootstrap == NULL) /* under mpiexec; plain processes set CCQ_BOOTSTRAP (tcp://) */
        cfg.bootstrap = "mpi";
    cfg.host_devices = ndev;
    cfg.timeout_ms = timeout_ms;
    if (trace_file != NULL)
        cfg.trace_file = trace_file;
    CHECK(ccq_runtime_create(&cfg, &rt) == CCQ_OK, "ccq_runtime_create");
    return rt;
}

static ccq_runtime *make(uint32_t ndev, uint64_t timeout_ms, const char *trace_file)
{
    return make_faulty(ndev, timeout_ms, trace_file, NULL);
}

/* A fence that may end before the command it covers (its own wait started later): fence
 * again until the command itself ended. */
static ccq_status fence_end(ccq_runtime *rt, ccq_device_id d, ccq_stream_id s)
{
    ccq_status st;
    do
        st = ccq_sync_collective(rt, d, s);
    while (st == CCQ_ERR_TIMEOUT && strstr(ccq_last_error_detail(), "still pending") != NULL &&
           strstr(ccq_last_error_detail(), "commands it covers") != NULL);
    return st;
}

/* ---- 1. dumps on disk before the failure is reported ------------------------------------ */

static int drill_dump(const char *dir)
{
    char file[512];
    ccq_runtime *rt;
    ccq_device_id all[3] = {0, 1, 2};
    float x[256], y[256];
    ccq_status st;

    bound(60);
    snprintf(file, sizeof file, "%s/dump-%%r.json", dir);
    rt = make(1, 1000, file);
    CHECK(ccq_comm_init(rt, all, 3) == CCQ_OK, "comm_init of the world");
    if (wrank == 2) {
        /* Never joins the all_reduce; its dump is written by its destroy. */
        CHECK(ccq_runtime_destroy(rt) == CCQ_OK, "destroy");
        printf("process 2: destroyed without joining\n");
        fflush(stdout);
        sleep(20); /* the launcher ends it once the others left */
        return 0;
    }
    for (int e = 0; e < 256; e++)
        x[e] = 1.0f;
    CHECK(ccq_all_reduce(rt, wrank, 0, x, y, 256, CCQ_FLOAT32, CCQ_SUM, all, 3) == CCQ_OK,
          "submit");
    st = ccq_sync_collective(rt, wrank, 0);
    /* What users do: print the error and leave at once, without ccq_runtime_destroy. */
    printf("process %u: fence: %s: %s\n", wrank, ccq_status_name(st), ccq_last_error_detail());
    fflush(stdout);
    _exit(st == CCQ_OK ? 1 : 0);
}

/* ---- 2. mismatches across processes ------------------------------------------------------ */

/* An all_reduce (or another collective) of `n` devices where this process may disagree. */
static void expect_mismatch(ccq_runtime *rt, ccq_device_id d, ccq_stream_id s, const char *field,
                            const char *what)
{
    ccq_status st = fence_end(rt, d, s);
    const char *det = ccq_last_error_detail();
    CHECK(st == CCQ_ERR_MISMATCH, "%s: %s, not CCQ_ERR_MISMATCH", what, ccq_status_name(st));
    CHECK(strstr(det, field) != NULL && strstr(det, "process") != NULL &&
              strstr(det, "rank") != NULL,
          "%s: the detail names processes, ranks and %s: %s", what, field, det);
    if (d == 0)
        printf("process %u: %s: %s\n", wrank, what, det);
}

/* A correct all_reduce after a mismatch: it runs, with exact results. */
static void expect_works(ccq_runtime *rt, const ccq_device_id *devs, uint32_t n, ccq_device_id d,
                         ccq_stream_id s, const char *what)
{
    float x[64], y[64];
    for (int e = 0; e < 64; e++)
        x[e] = (float)(d + 1);
    CHECK(ccq_all_reduce(rt, d, s, x, y, 64, CCQ_FLOAT32, CCQ_SUM, devs, n) == CCQ_OK, "submit");
    CHECK(fence_end(rt, d, s) == CCQ_OK, "%s: the next all_reduce runs", what);
    float want = 0;
    for (uint32_t r = 0; r < n; r++)
        want += (float)(devs[r] + 1);
    for (int e = 0; e < 64; e++)
        CHECK(y[e] == want, "%s: next all_reduce [%d] = %g, want %g", what, e, (double)y[e],
              (double)want);
}

static int drill_mismatch(void)
{
    ccq_runtime *rt;
    ccq_device_id all[3] = {0, 1, 2}, pair[2] = {0, 1}, d = wrank;
    static float x[4096], y[4096];
    uint64_t t0;

    bound(90);
    rt = make(1, 20000, NULL); /* a hang would show as a timeout long after the bound */
    CHECK(ccq_comm_init(rt, all, 3) == CCQ_OK, "comm_init of the world");
    t0 = now_ms();
    /* count: process 2 passes 2048 where the others pass 1024 (issue 22's program) */
    CHECK(ccq_all_reduce(rt, d, 0, x, y, wrank == 2 ? 2048 : 1024, CCQ_FLOAT32, CCQ_SUM, all, 3) ==
              CCQ_OK,
          "submit");
    expect_mismatch(rt, d, 0, "count", "count mismatch");
    CHECK(now_ms() - t0 < 5000, "found before the data moved, not by a timeout (%llu ms)",
          (unsigned long long)(now_ms() - t0));
    expect_works(rt, all, 3, d, 0, "after count");
    /* dtype */
    CHECK(ccq_all_reduce(rt, d, 0, x, y, 64, wrank == 1 ? CCQ_INT32 : CCQ_FLOAT32, CCQ_SUM, all,
                         3) == CCQ_OK,
          "submit");
    expect_mismatch(rt, d, 0, "dtype", "dtype mismatch");
    expect_works(rt, all, 3, d, 0, "after dtype");
    /* op */
    CHECK(ccq_all_reduce(rt, d, 0, x, y, 64, CCQ_FLOAT32, wrank == 0 ? CCQ_MAX : CCQ_SUM, all, 3) ==
              CCQ_OK,
          "submit");
    expect_mismatch(rt, d, 0, "op", "op mismatch");
    expect_works(rt, all, 3, d, 0, "after op");
    /* root */
    CHECK(ccq_broadcast(rt, d, 0, x, y, 64, CCQ_FLOAT32, wrank == 2 ? 2 : 0, all, 3) == CCQ_OK,
          "submit");
    expect_mismatch(rt, d, 0, "root", "root mismatch");
    expect_works(rt, all, 3, d, 0, "after root");
    /* kind: an all_gather against all_reduces (counts chosen so MPI would not notice) */
    if (wrank == 1)
        CHECK(ccq_all_gather(rt, d, 0, x, y, 16, CCQ_FLOAT32, all, 3) == CCQ_OK, "submit");
    else
        CHECK(ccq_all_reduce(rt, d, 0, x, y, 48, CCQ_FLOAT32, CCQ_SUM, all, 3) == CCQ_OK, "submit");
    expect_mismatch(rt, d, 0, "kind", "kind mismatch");
    expect_works(rt, all, 3, d, 0, "after kind");
    /* Several in a row, the middle one mismatched: they travel together. */
    for (int k = 0; k < 3; k++)
        CHECK(ccq_all_reduce(rt, d, 1, x + k * 1024, y + k * 1024, k == 1 && wrank == 0 ? 100 : 200,
                             CCQ_FLOAT32, CCQ_SUM, all, 3) == CCQ_OK,
              "submit");
    expect_mismatch(rt, d, 1, "count", "middle of three");
    expect_works(rt, all, 3, d, 1, "after three");

    /* A pair of devices in two processes: a collective and a send/recv count. */
    if (wrank < 2) {
        CHECK(ccq_comm_init(rt, pair, 2) == CCQ_OK, "comm_init of the pair");
        expect_works(rt, pair, 2, d, 2, "pair first");
        CHECK(ccq_all_reduce(rt, d, 2, x, y, wrank == 0 ? 10 : 12, CCQ_FLOAT32, CCQ_SUM, pair, 2) ==
                  CCQ_OK,
              "submit");
        expect_mismatch(rt, d, 2, "count", "pair count mismatch");
        expect_works(rt, pair, 2, d, 2, "pair after");
        /* send/recv: the receiver fails, naming both sides; its buffer is untouched. */
        for (int e = 0; e < 64; e++)
            y[e] = -7.0f;
        if (wrank == 0) {
            CHECK(ccq_send(rt, 0, 3, x, 40, CCQ_FLOAT32, 1) == CCQ_OK, "send");
            CHECK(fence_end(rt, 0, 3) == CCQ_OK, "a send completes when its data is copied");
        } else {
            CHECK(ccq_recv(rt, 1, 3, y, 32, CCQ_FLOAT32, 0) == CCQ_OK, "recv");
            expect_mismatch(rt, 1, 3, "count", "send/recv count mismatch");
            for (int e = 0; e < 64; e++)
                CHECK(y[e] == -7.0f, "a mismatched recv wrote its buffer ([%d] = %g)", e,
                      (double)y[e]);
        }
        /* and the pair's messages after it still pair up */
        for (int e = 0; e < 64; e++)
            x[e] = (float)e;
        if (wrank == 0)
            CHECK(ccq_send(rt, 0, 3, x, 64, CCQ_FLOAT32, 1) == CCQ_OK, "send");
        else
            CHECK(ccq_recv(rt, 1, 3, y, 64, CCQ_FLOAT32, 0) == CCQ_OK, "recv");
        CHECK(fence_end(rt, d, 3) == CCQ_OK, "send/recv after a mismatch");
        for (int e = 0; e < 64 && wrank == 1; e++)
            CHECK(y[e] == (float)e, "recv after a mismatch [%d] = %g", e, (double)y[e]);
    }
    expect_works(rt, all, 3, d, 0, "world at the end");
    CHECK(ccq_runtime_destroy(rt) == CCQ_OK, "destroy");
    printf("process %u: mismatch drill OK\n", wrank);
    return 0;
}

/* ---- 3. a stuck communicator does not stall another ------------------------------------ */

static int drill_stall(void)
{
    enum { ROUNDS = 2, OPS = 5 };
    ccq_device_id all[3] = {0, 1, 2}, pair[2] = {0, 1}, d = wrank;
    float w[1024], wy[1024];

    bound(90);
    for (int e = 0; e < 1024; e++)
        w[e] = 1.0f;
    for (int round = 0; round < ROUNDS; round++) {
        ccq_runtime *rt = make(1, 3000, NULL);
        CHECK(ccq_comm_init(rt, all, 3) == CCQ_OK, "comm_init of the world");
        if (wrank < 2) {
            CHECK(ccq_comm_init(rt, pair, 2) == CCQ_OK, "comm_init of the pair");
            for (int k = 0; k < 20; k++) /* warm up */
                expect_works(rt, pair, 2, d, 1, "warm-up");
            /* The world's all_reduce: process 2 never submits it. */
            CHECK(ccq_all_reduce(rt, d, 0, w, wy, 1024, CCQ_FLOAT32, CCQ_SUM, all, 3) == CCQ_OK,
                  "submit on the world");
            uint64_t worst = 0, t0 = now_ms();
            for (int k = 0; k < OPS; k++) {
                uint64_t t = now_ms();
                expect_works(rt, pair, 2, d, 1, "pair while the world is stuck");
                if (now_ms() - t > worst)
                    worst = now_ms() - t;
            }
            uint64_t total = now_ms() - t0;
            printf("process %u round %d: %d pair all_reduces while the world is stuck: %llu ms "
                   "(slowest %llu ms)\n",
                   wrank, round, OPS, (unsigned long long)total, (unsigned long long)worst);
            /* A stall lasts until the world's deadline (~2.8 s); a loaded 2-core machine
             * takes far less than 1 s for these. */
            CHECK(total < 1000, "the pair stalled behind the stuck world (%llu ms)",
                  (unsigned long long)total);
            ccq_status st = fence_end(rt, d, 0);
            CHECK(st == CCQ_ERR_TIMEOUT || st == CCQ_ERR_ABORTED, "the world's fails: %s",
                  ccq_status_name(st));
            expect_works(rt, pair, 2, d, 1, "pair after the world failed");
        } else {
            sleep(4); /* past the others' deadline */
        }
        CHECK(ccq_runtime_destroy(rt) == CCQ_OK, "destroy");
    }
    printf("process %u: stall drill OK\n", wrank);
    return 0;
}

/* ---- 4. destroy after a pair's first collective was never joined ------------------------ */

static int drill_destroy(void)
{
    ccq_device_id pair[2] = {0, 1}, d = wrank;
    float x[64] = {0}, y[64];
    ccq_runtime *rt;
    uint64_t t0;

    bound(60);
    rt = make(1, 1200, NULL);
    CHECK(ccq_comm_init(rt, pair, 2) == CCQ_OK, "comm_init of the pair");
    if (wrank == 0) {
        CHECK(ccq_all_reduce(rt, 0, 0, x, y, 64, CCQ_FLOAT32, CCQ_SUM, pair, 2) == CCQ_OK,
              "submit");
        ccq_status st = fence_end(rt, 0, 0);
        CHECK(st == CCQ_ERR_TIMEOUT || st == CCQ_ERR_ABORTED, "the lone part fails: %s",
              ccq_status_name(st));
    } else {
        sleep(3); /* never joins; leaves after process 0's failure */
    }
    t0 = now_ms();
    CHECK(ccq_runtime_destroy(rt) == CCQ_OK, "destroy");
    printf("process %u: destroy returned in %llu ms\n", wrank, (unsigned long long)(now_ms() - t0));
    CHECK(now_ms() - t0 < 5000, "destroy took %llu ms", (unsigned long long)(now_ms() - t0));
    (void)d;
    return 0;
}

static ccq_stats stats_of(ccq_runtime *rt)
{
    ccq_stats st = {.struct_size = sizeof st};
    CHECK(ccq_get_stats(rt, &st) == CCQ_OK, "ccq_get_stats");
    return st;
}

/* ---- 3b. operations of one batch end one by one ------------------------------------------ */

static int drill_early(void)
{
    enum { N = 64, TIMEOUT_MS = 3000 };
    /* Process p has devices 2p and 2p + 1. */
    ccq_device_id world[3] = {0, 2, 4}, pair[2] = {1, 3}, local[2] = {0, 1};
    float lx[N], ly[2][N], wx[N], wy[N], px[N], py[N];
    ccq_runtime *rt;

    bound(60);
    /* Process 0's scheduler stands still 300 ms right after issuing operation 0 (the local
     * all_reduce), meanwhile the world's and the pair's parts are submitted: when it goes on,
     * both are ready and issue in one batch. The stall installs the fault layer, whose batches
     * must pass early ends on (before, the pair's fence waited for the world's deadline). */
    rt = make_faulty(2, TIMEOUT_MS, NULL, wrank == 0 ? "stall:us=300000,op=0" : "");
    for (int e = 0; e < N; e++) {
        lx[e] = wx[e] = 1.0f;
        px[e] = (float)(wrank + 1);
    }
    CHECK(ccq_comm_init(rt, world, 3) == CCQ_OK, "comm_init of the world");
    if (wrank < 2)
        CHECK(ccq_comm_init(rt, pair, 2) == CCQ_OK, "comm_init of the pair");
    if (wrank == 0) {
        uint64_t before = stats_of(rt).batched_ops;
        CHECK(ccq_comm_init(rt, local, 2) == CCQ_OK, "comm_init of the local pair");
        for (ccq_device_id d = 0; d < 2; d++)
            CHECK(ccq_all_reduce(rt, d, 1, lx, ly[d], N, CCQ_FLOAT32, CCQ_SUM, local, 2) == CCQ_OK,
                  "local part %u", d);
        while (stats_of(rt).batched_ops == before) /* issued: the stall has begun */
            usleep(1000);
        CHECK(ccq_all_reduce(rt, 0, 0, wx, wy, N, CCQ_FLOAT32, CCQ_SUM, world, 3) == CCQ_OK,
              "world");
        CHECK(ccq_all_reduce(rt, 1, 0, px, py, N, CCQ_FLOAT32, CCQ_SUM, pair, 2) == CCQ_OK, "pair");
    } else if (wrank == 1) {
        CHECK(ccq_all_reduce(rt, 2, 0, wx, wy, N, CCQ_FLOAT32, CCQ_SUM, world, 3) == CCQ_OK,
              "world");
        CHECK(ccq_all_reduce(rt, 3, 0, px, py, N, CCQ_FLOAT32, CCQ_SUM, pair, 2) == CCQ_OK, "pair");
    }
    if (wrank < 2) {
        uint64_t t0 = now_ms(), took;
        CHECK(fence_end(rt, wrank == 0 ? 1 : 3, 0) == CCQ_OK, "the pair's all_reduce");
        took = now_ms() - t0;
        printf("process %u: the pair's all_reduce beside the stuck world's: %llu ms\n", wrank,
               (unsigned long long)took);
        CHECK(took < TIMEOUT_MS / 2, "the pair's all_reduce waited for the world's (%llu ms)",
              (unsigned long long)took);
        for (int e = 0; e < N; e++)
            CHECK(py[e] == 3.0f, "pair [%d] = %g", e, (double)py[e]);
        if (wrank == 0) {
            CHECK(stats_of(rt).batches == 2,
                  "%llu batches (want the local one, then the "
                  "world's and the pair's together)",
                  (unsigned long long)stats_of(rt).batches);
            for (ccq_device_id d = 0; d < 2; d++)
                CHECK(fence_end(rt, d, 1) == CCQ_OK && ly[d][0] == 2.0f, "the local all_reduce");
        }
        ccq_status st = fence_end(rt, wrank == 0 ? 0 : 2, 0);
        CHECK(st == CCQ_ERR_TIMEOUT || st == CCQ_ERR_ABORTED, "the world's all_reduce: %s",
              ccq_status_name(st));
        if (wrank == 1)
            sleep(1); /* its deadline came 300 ms before process 0's: stay until that one */
    } else {
        sleep(5); /* never joins; leaves after the others' deadline */
    }
    CHECK(ccq_runtime_destroy(rt) == CCQ_OK, "destroy");
    printf("process %u: early drill OK\n", wrank);
    return 0;
}

/* ---- 3c. members that completed what the others failed alone ---------------------------- */

/* The disagreement of drill_told and drill_raced (the header comment), then the next
 * operation: it must fail with CCQ_ERR_MISMATCH on every process, soon. raced: 2 and 3 submit
 * it as soon as theirs completed, and their schedulers stand still 800 ms right after its
 * messages left (CCQ_FAULT stall); else they submit it 600 ms later, after they heard. */
static int told_or_raced(bool raced)
{
    enum { N = 16, TIMEOUT_MS = 10000 };
    ccq_device_id world[4] = {0, 1, 2, 3}, d = wrank;
    static float src[2 * N], dst[2 * N];
    float x[4] = {(float)wrank + 1, 1, 2, 3}, y[4] = {0};
    /* When each submits after the warm-up (ms): 1, then 2 and 3, then 0. */
    static const unsigned after_ms[4] = {400, 0, 100, 100};
    const char *name = raced ? "raced" : "told";
    char detail[1024];
    ccq_runtime *rt;
    ccq_status st;
    uint64_t t0;

    bound(60);
    /* Unfused: a fused run's operations wait for the members' agreement on its window (the
     * broadcast would wait for word from 0 and 1, docs/fusion.md). */
    CHECK(setenv("CCQ_FUSION_BYTES", "0", 1) == 0, "setenv");
    /* raced: the next operation (16 bytes) everyone to everyone at once, so that 2's and 3's
     * messages for it leave before they hear; the disagreement's (64 and 128 bytes) recursive
     * doubling still. Operation 4 is the next one (3 warm-ups, the disagreement). */
    if (raced)
        CHECK(setenv("CCQ_UCX_DIRECT_AR_BYTES", "16", 1) == 0, "setenv");
    rt = make_faulty(1, TIMEOUT_MS, NULL, raced && wrank >= 2 ? "stall:us=800000,op=4" : "");
    CHECK(ccq_comm_init(rt, world, 4) == CCQ_OK, "comm_init of the world");
    for (int k = 0; k < 3; k++) /* also lines the processes up within a few ms */
        expect_works(rt, world, 4, d, 0, "warm-up");
    usleep(after_ms[wrank] * 1000u);
    st = wrank < 2
             ? ccq_all_reduce(rt, d, 0, src, dst, N * (1 + wrank), CCQ_FLOAT32, CCQ_SUM, world, 4)
             : ccq_broadcast(rt, d, 0, src, dst, N, CCQ_FLOAT32, 2, world, 4);
    CHECK(st == CCQ_OK, "submit the disagreement");
    st = fence_end(rt, d, 0);
    snprintf(detail, sizeof detail, "%s", ccq_last_error_detail());
    printf("process %u: %s: %s\n", wrank, ccq_status_name(st), st == CCQ_OK ? "" : detail);
    if (wrank >= 2) {
        CHECK(st == CCQ_OK, "the broadcast completed before it heard: %s", ccq_status_name(st));
        if (!raced)
            usleep(600 * 1000u); /* 0 fails it at 400 ms: 2 and 3 hear before they go on */
    } else {
        /* Found on the other's header (the count), not on the root's (the kind). */
        CHECK(st == CCQ_ERR_MISMATCH && strstr(detail, "count") != NULL &&
                  strstr(detail, "broadcast") == NULL,
              "0 and 1 disagree among themselves: %s: %s", ccq_status_name(st), detail);
    }
    /* The next operation fails everywhere: told, 2's and 3's is refused and tells 0 and 1
     * (without the tell 0 and 1 would wait for them until timeout_ms); raced, 0 and 1 hold 2's
     * and 3's messages for it when they start it, which say that 2 and 3 completed the one
     * before (without that, 0 and 1 would complete it, exact, while 2 and 3 fail it). */
    t0 = now_ms();
    CHECK(ccq_all_reduce(rt, d, 0, x, y, 4, CCQ_FLOAT32, CCQ_SUM, world, 4) == CCQ_OK,
          "submit the next");
    st = fence_end(rt, d, 0);
    snprintf(detail, sizeof detail, "%s", ccq_last_error_detail());
    printf("process %u: next operation: %s after %llu ms: %s\n", wrank, ccq_status_name(st),
           (unsigned long long)(now_ms() - t0), detail);
    CHECK(st == CCQ_ERR_MISMATCH && now_ms() - t0 < TIMEOUT_MS / 4,
          "the next operation: %s after %llu ms (result %g)", ccq_status_name(st),
          (unsigned long long)(now_ms() - t0), (double)y[0]);
    if (raced && wrank < 2)
        CHECK(strstr(detail, "ended the collectives before sequence") != NULL,
              "found on 2's or 3's message: %s", detail);
    sleep(1); /* the others may still read this process's notices */
    CHECK(ccq_runtime_destroy(rt) == CCQ_OK, "destroy");
    printf("process %u: %s drill OK\n", wrank, name);
    return 0;
}

static int drill_told(void)
{
    return told_or_raced(false);
}

static int drill_raced(void)
{
    return told_or_raced(true);
}

/* ---- 4b. a scheduler that stood still past both deadlines -------------------------------- */

static int drill_late(void)
{
    enum { WARM = 3, TIMEOUT_MS = 1000, STALL_MS = 1500 };
    ccq_device_id pair[2] = {0, 1}, d = wrank;
    char fault[64];
    ccq_runtime *rt;

    bound(60);
    /* Operations 0..WARM-1 are the warm-up's (each fenced before the next: numbered in
     * order); the stall follows the issue of operation WARM, the one process 1 never joins. */
    snprintf(fault, sizeof fault, "stall:us=%d,op=%d", STALL_MS * 1000, WARM);
    rt = make_faulty(1, TIMEOUT_MS, NULL, wrank == 0 ? fault : "");
    CHECK(ccq_comm_init(rt, pair, 2) == CCQ_OK, "comm_init of the pair");
    for (int k = 0; k < WARM; k++)
        expect_works(rt, pair, 2, d, 1, "warm-up");
    if (wrank == 0) {
        float x[64] = {0}, y[64];
        uint64_t t0 = now_ms();
        char detail[1024];
        CHECK(ccq_all_reduce(rt, 0, 0, x, y, 64, CCQ_FLOAT32, CCQ_SUM, pair, 2) == CCQ_OK,
              "submit");
        ccq_status st = fence_end(rt, 0, 0);
        snprintf(detail, sizeof detail, "%s", ccq_last_error_detail());
        printf("process 0: after a %d ms stall (timeout_ms %d): %s: %s\n", STALL_MS, TIMEOUT_MS,
               ccq_status_name(st), detail);
        CHECK(now_ms() - t0 >= STALL_MS, "the stall did not happen (%llu ms)",
              (unsigned long long)(now_ms() - t0));
        CHECK(st == CCQ_ERR_TIMEOUT, "the stuck all_reduce: %s, want the engine's timeout",
              ccq_status_name(st));
        /* The engine's detail names what the operation waits for: its sequence and the
         * process whose part it lacks (MPI: "process 1 never submitted it", UCX: "waits for
         * process 1's message"). */
        CHECK(strstr(detail, "timed out: ") != NULL && strstr(detail, "sequence 3") != NULL &&
                  (strstr(detail, "process 1 never submitted it") != NULL ||
                   strstr(detail, "waits for process 1's message") != NULL) &&
                  strstr(detail, "watchdog") == NULL,
              "the engine's detail: %s", detail);
    } else {
        sleep(4); /* never joins; stays until process 0 has seen its operation fail */
    }
    CHECK(ccq_runtime_destroy(rt) == CCQ_OK, "destroy");
    printf("process %u: late drill OK\n", wrank);
    return 0;
}

/* ---- 5. an idle process outside the communicator ----------------------------------------- */

static int drill_idle(void)
{
    ccq_device_id pair[2] = {0, 1}, d = wrank;
    ccq_runtime *rt;

    bound(60);
    rt = make(1, 3000, NULL);
    if (wrank == 2) {
        sleep(4); /* no ccq call, so no MPI progress from this process */
    } else {
        uint64_t t0 = now_ms();
        CHECK(ccq_comm_init(rt, pair, 2) == CCQ_OK, "comm_init of the pair while process 2 idles");
        printf("process %u: pair formed in %llu ms\n", wrank, (unsigned long long)(now_ms() - t0));
        CHECK(now_ms() - t0 < 2000, "it waited for process 2 (%llu ms)",
              (unsigned long long)(now_ms() - t0));
        for (int k = 0; k < 5; k++)
            expect_works(rt, pair, 2, d, 0, "pair while process 2 idles");
        float x[32], y[32];
        for (int e = 0; e < 32; e++)
            x[e] = (float)(e + 100 * wrank);
        CHECK(ccq_send(rt, d, 1, x, 32, CCQ_FLOAT32, 1 - d) == CCQ_OK, "send");
        CHECK(ccq_recv(rt, d, 1, y, 32, CCQ_FLOAT32, 1 - d) == CCQ_OK, "recv");
        CHECK(fence_end(rt, d, 1) == CCQ_OK, "send/recv while process 2 idles");
        for (int e = 0; e < 32; e++)
            CHECK(y[e] == (float)(e + 100 * (1 - wrank)), "recv [%d]", e);
    }
    CHECK(ccq_runtime_destroy(rt) == CCQ_OK, "destroy");
    printf("process %u: idle drill OK\n", wrank);
    return 0; /* MPI_Finalize runs at exit (ccq initialised MPI) */
}

/* ---- 6. rings, shifts and all pairs on several streams ----------------------------------- */

enum { DEVS = 3, BIG = 20000, SMALL = 37, MID = 3000 };

typedef struct stress_dev {
    ccq_runtime *rt;
    ccq_device_id d;
    uint32_t total, rounds;
    int bad;
    char why[256];
} stress_dev;

static uint32_t val(uint32_t from, uint32_t to, uint32_t round, uint32_t what, uint32_t e)
{
    return from * 100000000u + to * 1000000u + (round % 16) * 60000u + what * 20000u + e;
}

static void *stress_main(void *arg)
{
    stress_dev *s = arg;
    uint32_t n = s->total, d = s->d, next = (d + 1) % n, prev = (d + n - 1) % n;
    uint32_t *buf = malloc(sizeof(uint32_t) * (size_t)BIG * (4 + 2 * n));
    uint32_t *fwd_s = buf, *fwd_r = buf + BIG, *bwd_s = buf + 2 * BIG, *shift = buf + 3 * BIG;
    uint32_t *ap_s = buf + 4 * BIG, *ap_r = buf + (4 + n) * BIG;

    for (uint32_t r = 0; r < s->rounds && !s->bad; r++) {
        /* sizes vary by round, the same on every process (a big one first, at times) */
        size_t big = r % 3 == 0 ? BIG : MID, small = SMALL + r % 5;
        for (size_t e = 0; e < big; e++) {
            fwd_s[e] = val(d, next, r, 0, (uint32_t)e);
            bwd_s[e] = val(d, prev, r, 1, (uint32_t)e);
            shift[e] = val(d, next, r, 2, (uint32_t)e);
        }
        /* stream 1: the ring forward (send, then recv on the same stream) */
        if (ccq_send(s->rt, d, 1, fwd_s, big, CCQ_UINT32, next) != CCQ_OK ||
            ccq_recv(s->rt, d, 1, fwd_r, big, CCQ_UINT32, prev) != CCQ_OK)
            s->bad = 1;
        /* stream 2: the ring backward, its receive into bwd_s's place after the send */
        if (ccq_send(s->rt, d, 2, bwd_s, small, CCQ_UINT32, prev) != CCQ_OK ||
            ccq_recv(s->rt, d, 2, bwd_s, small, CCQ_UINT32, next) != CCQ_OK)
            s->bad = 2;
        /* stream 3: an in-place shift forward */
        if (ccq_send(s->rt, d, 3, shift, big, CCQ_UINT32, next) != CCQ_OK ||
            ccq_recv(s->rt, d, 3, shift, big, CCQ_UINT32, prev) != CCQ_OK)
            s->bad = 3;
        /* streams 4..: all pairs, offset o on stream 4 + o % 3 */
        for (uint32_t o = 1; o < n; o++) {
            uint32_t to = (d + o) % n, from = (d + n - o) % n;
            size_t cnt = o % 2 ? small * 3 : big;
            for (size_t e = 0; e < cnt; e++)
                ap_s[(size_t)to * BIG + e] = val(d, to, r, 3, (uint32_t)e);
            if (ccq_send(s->rt, d, 4 + o % 3, ap_s + (size_t)to * BIG, cnt, CCQ_UINT32, to) !=
                    CCQ_OK ||
                ccq_recv(s->rt, d, 4 + o % 3, ap_r + (size_t)from * BIG, cnt, CCQ_UINT32, from) !=
                    CCQ_OK)
                s->bad = 4;
        }
        for (ccq_stream_id st = 1; st < 7 && !s->bad; st++) {
            ccq_status f = ccq_sync_collective(s->rt, d, st);
            if (f != CCQ_OK) {
                s->bad = 5;
                snprintf(s->why, sizeof s->why, "round %u stream %u: %s: %.200s", r, st,
                         ccq_status_name(f), ccq_last_error_detail());
            }
        }
        if (s->bad)
            break;
        for (size_t e = 0; e < big && !s->bad; e++) {
            uint32_t got = 0, want = 0;
            if (fwd_r[e] != val(prev, d, r, 0, (uint32_t)e))
                s->bad = 6, got = fwd_r[e], want = val(prev, d, r, 0, (uint32_t)e);
            else if (shift[e] != val(prev, d, r, 2, (uint32_t)e))
                s->bad = 7, got = shift[e], want = val(prev, d, r, 2, (uint32_t)e);
            else if (e < small && bwd_s[e] != val(next, d, r, 1, (uint32_t)e))
                s->bad = 8, got = bwd_s[e], want = val(next, d, r, 1, (uint32_t)e);
            if (s->bad)
                snprintf(s->why, sizeof s->why,
                         "round %u: wrong data (check %d) [%zu] = %u, want %u", r, s->bad, e, got,
                         want);
        }
        for (uint32_t o = 1; o < n && !s->bad; o++) {
            uint32_t from = (d + n - o) % n;
            size_t cnt = o % 2 ? small * 3 : big;
            for (size_t e = 0; e < cnt; e++)
                if (ap_r[(size_t)from * BIG + e] != val(from, d, r, 3, (uint32_t)e)) {
                    s->bad = 9;
                    snprintf(s->why, sizeof s->why,
                             "round %u: all pairs from %u [%zu] = %u, want %u", r, from, e,
                             ap_r[(size_t)from * BIG + e], val(from, d, r, 3, (uint32_t)e));
                    break;
                }
        }
        if (s->bad && !s->why[0])
            snprintf(s->why, sizeof s->why, "round %u: wrong data (check %d)", r, s->bad);
    }
    free(buf);
    return NULL;
}

static int drill_stress(uint32_t rounds)
{
    ccq_runtime *rt;
    ccq_device_id first = 0;
    uint32_t cnt = 0;
    pthread_t th[DEVS];
    stress_dev sd[DEVS];
    uint64_t t0;

    bound(120);
    rt = make(DEVS, 15000, NULL);
    CHECK(ccq_local_devices(rt, &first, &cnt) == CCQ_OK && cnt == DEVS, "local devices");
    t0 = now_ms();
    for (uint32_t k = 0; k < DEVS; k++) {
        sd[k] = (stress_dev){rt, first + k, ccq_device_count(rt), rounds, 0, ""};
        pthread_create(&th[k], NULL, stress_main, &sd[k]);
    }
    for (uint32_t k = 0; k < DEVS; k++) {
        pthread_join(th[k], NULL);
        CHECK(sd[k].bad == 0, "device %u: %s", first + k, sd[k].why);
    }
    CHECK(ccq_runtime_destroy(rt) == CCQ_OK, "destroy");
    printf("process %u: stress %u rounds OK in %llu ms\n", wrank, rounds,
           (unsigned long long)(now_ms() - t0));
    return 0;
}

int main(int argc, char **argv)
{
    ccq_config cfg;
    const char *mode = argc > 1 ? argv[1] : "";

    ccq_config_init(&cfg);
    wrank = cfg.world_rank;
    wsize = cfg.world_size;
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* The modes without an argument, and the world size each runs with. */
    static const struct {
        const char *name;
        uint32_t procs;
        int (*run)(void);
    } modes[] = {{"mismatch", 3, drill_mismatch}, {"stall", 3, drill_stall},
                 {"early", 3, drill_early},       {"idle", 3, drill_idle},
                 {"destroy", 2, drill_destroy},   {"late", 2, drill_late},
                 {"told", 4, drill_told},         {"raced", 4, drill_raced}};
    if (strcmp(mode, "dump") == 0 && argc > 2 && wsize == 3)
        return drill_dump(argv[2]);
    if (strcmp(mode, "stress") == 0 && wsize == 3)
        return drill_stress(argc > 2 ? (uint32_t)atoi(argv[2]) : 20);
    for (size_t k = 0; k < sizeof modes / sizeof modes[0]; k++)
        if (strcmp(mode, modes[k].name) == 0 && wsize == modes[k].procs)
            return modes[k].run();
    fprintf(stderr, "usage: mpiexec -n 3 %s dump DIR | stress [ROUNDS]\n", argv[0]);
    for (size_t k = 0; k < sizeof modes / sizeof modes[0]; k++)
        fprintf(stderr, "       mpiexec -n %u %s %s\n", modes[k].procs, argv[0], modes[k].name);
    return 2;
}
