/* The host backend across processes through the whole runtime, on either engine
 * (CCQ_HOST_ENGINE: ucx, mpi), under mpiexec (bootstrap "mpi") or tests/launch (CCQ_BOOTSTRAP
 * tcp:// or file:), 2, 3 or 4 processes, process p with 1 + p % 2 host devices (uneven).
 * Every kind x dtype x op against tests/ref.h on a communicator of the whole world, roots in
 * every process, in-place forms; a communicator over a subset of the processes while the
 * others run theirs; send/recv rings and all-pairs between processes; one thread per local
 * device on several streams; a local mismatch still found (the local parts are matched
 * here); a process that never submits: the others end with CCQ_ERR_TIMEOUT naming the MPI
 * operation, its sequence and the member processes, another communicator keeps working, and
 * fences and destroy return.
 *
 * Float inputs are in {-1, 0, 1} so that MPI's order of combining the per-process partials
 * cannot change a bit (see test_host_mpi.c); integers wrap, which is associative. (The UCX
 * engine's own order is fixed; test_host_ucx checks that every process gets the same
 * bits from inputs where the order matters.) */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ccq.h"
#include "common/kinds.h"
#include "ref.h"
#include "world_check.h"

static uint32_t wrank, wsize;

static uint32_t ndev_of(uint32_t p)
{
    return 1 + p % 2;
}

static uint32_t first_of(uint32_t p)
{
    uint32_t f = 0;
    for (uint32_t q = 0; q < p; q++)
        f += ndev_of(q);
    return f;
}

/* One collective on the communicator of devs[0..n-1] (global ids, ascending): this
 * process's devices among them submit on `stream`, then each output is checked. */
static void check_coll(ccq_runtime *rt, const ccq_device_id *devs, uint32_t n, ccq_kind kind,
                       ccq_dtype dt, ccq_reduce_op ro, uint32_t root, size_t count, bool in_place,
                       uint32_t seed)
{
    const ccq_kind_info *ki = &ccq_kinds[kind];
    size_t es = ref_dtype_size(dt);
    size_t sb = (ki->src_n ? n : 1) * count * es, db = (ki->dst_n ? n : 1) * count * es;
    void *inputs[64], *want = malloc(db);
    char *allocs[64], *src[64], *dst[64];
    uint32_t nalloc = 0, mine[64], nmine = 0;
    ccq_device_id first = 0;
    uint32_t cnt = 0;

    ccq_local_devices(rt, &first, &cnt);
    for (uint32_t r = 0; r < n; r++) {
        inputs[r] = malloc(sb);
        ref_fill_exact(dt, inputs[r], sb / es, seed + r);
        if (devs[r] >= first && devs[r] < first + cnt)
            mine[nmine++] = r;
    }
    for (uint32_t k = 0; k < nmine; k++) {
        uint32_t r = mine[k];
        bool is_root = r == root;
        bool us = ki->src_use == CCQ_USE_ALL || (ki->src_use == CCQ_USE_ROOT && is_root);
        bool ud = ki->dst_use == CCQ_USE_ALL || (ki->dst_use == CCQ_USE_ROOT && is_root);
        uint8_t ipr = in_place && us && ud ? ki->inplace : CCQ_INPLACE_NONE;
        size_t at = (ipr == CCQ_INPLACE_SRC_AT_RANK || ipr == CCQ_INPLACE_DST_AT_RANK ? r : root) *
                    count * es;
        src[k] = dst[k] = NULL;
        if (ipr == CCQ_INPLACE_DST_AT_RANK || ipr == CCQ_INPLACE_DST_AT_ROOT) {
            src[k] = allocs[nalloc++] = malloc(sb);
            dst[k] = src[k] + at;
        } else if (ipr != CCQ_INPLACE_NONE) {
            dst[k] = allocs[nalloc++] = malloc(db);
            memset(dst[k], 0x5a, db);
            src[k] = ipr == CCQ_INPLACE_SAME ? dst[k] : dst[k] + at;
        } else {
            if (us)
                src[k] = allocs[nalloc++] = malloc(sb);
            if (ud) {
                dst[k] = allocs[nalloc++] = malloc(db);
                memset(dst[k], 0x5a, db);
            }
        }
        if (src[k] != NULL)
            memcpy(src[k], inputs[r], sb);
    }
    for (uint32_t k = 0; k < nmine; k++)
        CHECK(ref_submit(rt, kind, devs[mine[k]], 0, src[k], dst[k], count, dt, ro, devs[root],
                         devs, n) == CCQ_OK,
              "submit %s", ki->name);
    for (uint32_t k = 0; k < nmine; k++)
        CHECK(ccq_sync_collective(rt, devs[mine[k]], 0) == CCQ_OK, "fence of %s dtype %d op %d",
              ki->name, (int)dt, (int)ro);
    for (uint32_t k = 0; k < nmine; k++) {
        char msg[256] = "";
        size_t got = ref_collective(kind, dt, ro, n, root, (const void *const *)inputs, mine[k],
                                    want, count);
        if (got == 0 || dst[k] == NULL)
            continue;
        CHECK(ref_compare(dt, dst[k], want, got, msg, sizeof msg) == 0,
              "%s dtype %d op %d root %u count %zu%s rank %u: %s", ki->name, (int)dt, (int)ro, root,
              count, in_place ? " in place" : "", mine[k], msg);
    }
    for (uint32_t a = 0; a < nalloc; a++)
        free(allocs[a]);
    for (uint32_t r = 0; r < n; r++)
        free(inputs[r]);
    free(want);
}

/* Every kind x dtype x op (every dtype at a small count; float32 and int32 at a larger). */
static void every_kind(ccq_runtime *rt, const ccq_device_id *devs, uint32_t n,
                       const uint32_t *procs, uint32_t np, size_t count, bool every_dtype)
{
    uint32_t seed = 1;
    for (int kind = 0; kind < CCQ_KIND_COUNT_; kind++) {
        const ccq_kind_info *ki = &ccq_kinds[kind];
        if (!ki->collective)
            continue;
        for (int dt = 0; dt < CCQ_DTYPE_COUNT_; dt++) {
            if (!every_dtype && dt != CCQ_FLOAT32 && dt != CCQ_INT32)
                continue;
            for (int ro = 0; ro < (ki->reduces ? CCQ_REDUCE_OP_COUNT_ : 1); ro++) {
                uint32_t roots[17], nroots = 0, r = 0;
                roots[nroots++] = 0;
                if (ki->rooted)
                    for (uint32_t p = 0; p < np; p++) {
                        r += ndev_of(procs[p]);
                        roots[nroots++] = r - 1; /* the last rank of every member process */
                    }
                for (uint32_t q = 0; q < nroots; q++)
                    for (int ip = 0; ip < 2; ip++)
                        if (!ip || ki->inplace != CCQ_INPLACE_NONE)
                            check_coll(rt, devs, n, (ccq_kind)kind, (ccq_dtype)dt,
                                       (ccq_reduce_op)ro, roots[q], count, ip != 0, seed++);
            }
        }
    }
}

/* Sends on stream 1, receives on stream 2 (a send waits for its receiver: on one stream a
 * ring would wait for itself). */
static void ring_and_pairs(ccq_runtime *rt, uint32_t total, ccq_device_id first, uint32_t cnt)
{
    enum { N = 3000 };
    static uint32_t sbuf[8][64][N], rbuf[8][64][N];
    for (int pass = 0; pass < 2; pass++) { /* 0: ring; 1: all pairs */
        for (uint32_t k = 0; k < cnt; k++) {
            ccq_device_id d = first + k;
            for (uint32_t o = 1; o < total; o++) {
                ccq_device_id to = (d + o) % total, from = (d + total - o) % total;
                if (pass == 0 && o > 1)
                    break;
                for (uint32_t e = 0; e < N; e++)
                    sbuf[k][to][e] = d * 1000000u + to * 1000u + e;
                CHECK(ccq_send(rt, d, 1, sbuf[k][to], N, CCQ_UINT32, to) == CCQ_OK, "send");
                CHECK(ccq_recv(rt, d, 2, rbuf[k][from], N, CCQ_UINT32, from) == CCQ_OK, "recv");
            }
        }
        for (uint32_t k = 0; k < cnt; k++) {
            CHECK(ccq_sync_collective(rt, first + k, 1) == CCQ_OK, "send fence");
            CHECK(ccq_sync_collective(rt, first + k, 2) == CCQ_OK, "recv fence");
        }
        for (uint32_t k = 0; k < cnt; k++) {
            ccq_device_id d = first + k;
            for (uint32_t o = 1; o < total && (pass == 1 || o == 1); o++) {
                ccq_device_id from = (d + total - o) % total;
                for (uint32_t e = 0; e < N; e++)
                    CHECK(rbuf[k][from][e] == from * 1000000u + d * 1000u + e,
                          "pass %d: %u from %u [%u] = %u", pass, d, from, e, rbuf[k][from][e]);
            }
        }
    }
}

typedef struct worker {
    ccq_runtime *rt;
    const ccq_device_id *devs;
    uint32_t n, rank; /* the device's rank */
    int bad;
} worker;

/* One thread per local device: 40 all_reduces over 4 streams, all in flight at once. */
static void *worker_main(void *arg)
{
    worker *w = arg;
    enum { OPS = 40, N = 256 };
    static __thread float in[OPS][N], out[OPS][N];
    for (int i = 0; i < OPS; i++) {
        for (int e = 0; e < N; e++)
            in[i][e] = (float)(w->rank + i + e % 5);
        if (ccq_all_reduce(w->rt, w->devs[w->rank], (ccq_stream_id)(i % 4), in[i], out[i], N,
                           CCQ_FLOAT32, CCQ_SUM, w->devs, w->n) != CCQ_OK)
            w->bad = 1;
    }
    for (ccq_stream_id s = 0; s < 4; s++)
        if (ccq_sync_collective(w->rt, w->devs[w->rank], s) != CCQ_OK)
            w->bad = 2;
    for (int i = 0; i < OPS; i++)
        for (int e = 0; e < N; e++) {
            float want = 0;
            for (uint32_t r = 0; r < w->n; r++)
                want += (float)(r + (uint32_t)i + (uint32_t)(e % 5));
            if (out[i][e] != want)
                w->bad = 3;
        }
    return NULL;
}

static uint64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000u + (uint64_t)t.tv_nsec / 1000000u;
}

int main(void)
{
    ccq_config cfg;
    ccq_runtime *rt = NULL;
    ccq_device_id first = 0, devs[64];
    uint32_t cnt = 0, total, procs[16];

    ccq_config_init(&cfg);
    wrank = cfg.world_rank;
    wsize = cfg.world_size;
    CHECK(wsize >= 2 && wsize <= 16,
          "run me under mpiexec -n 2..16, or tests/launch with CCQ_BOOTSTRAP (world_size %u)",
          wsize);
    if (cfg.bootstrap == NULL) /* under mpiexec; else CCQ_BOOTSTRAP (tcp://, file:) */
        cfg.bootstrap = "mpi";
    cfg.host_devices = ndev_of(wrank);
    cfg.timeout_ms = 30000; /* a hang reports its detail well inside ctest's TIMEOUT */
    CHECK(ccq_runtime_create(&cfg, &rt) == CCQ_OK, "ccq_runtime_create");
    CHECK(ccq_local_devices(rt, &first, &cnt) == CCQ_OK && first == first_of(wrank), "local");
    total = ccq_device_count(rt);
    for (uint32_t d = 0; d < total; d++)
        devs[d] = d;
    for (uint32_t p = 0; p < wsize; p++)
        procs[p] = p;

    /* The world. */
    CHECK(ccq_comm_init(rt, devs, total) == CCQ_OK, "comm_init of the world");
    every_kind(rt, devs, total, procs, wsize, 19, true);
    every_kind(rt, devs, total, procs, wsize, 40000, false);
    /* all_reduce at 1 MiB, where a process with one part lands its partials in the result
     * scratch (ucx/allreduce_ring.c, LAND_IN_PLACE_BYTES; streamed outputs from 4 MiB:
     * test_host_world_ucx_stream_np3): every op, in place and not, on float32 and int32. */
    static const ccq_dtype large_dtypes[2] = {CCQ_INT32, CCQ_FLOAT32};
    for (int t = 0; t < 2; t++)
        for (int ro = 0; ro < CCQ_REDUCE_OP_COUNT_; ro++)
            for (int ip = 0; ip < 2; ip++)
                check_coll(rt, devs, total, CCQ_KIND_ALL_REDUCE, large_dtypes[t], (ccq_reduce_op)ro,
                           0, 1u << 18, ip != 0, 7000u + (uint32_t)(t * 100 + ro * 2 + ip));

    /* A subset spanning the first and the last process; the others meanwhile run one of
     * their own (one process, or several). */
    {
        ccq_device_id sub[64];
        uint32_t ns = 0, sp[16], nsp = 0;
        bool ends = wrank == 0 || wrank == wsize - 1;
        for (uint32_t p = 0; p < wsize; p++) {
            bool in = (p == 0 || p == wsize - 1) == ends;
            if (!in)
                continue;
            sp[nsp++] = p;
            for (uint32_t k = 0; k < ndev_of(p); k++)
                sub[ns++] = first_of(p) + k;
        }
        CHECK(ccq_comm_init(rt, sub, ns) == CCQ_OK, "comm_init of a subset");
        every_kind(rt, sub, ns, sp, nsp, 23, false);
    }

    ring_and_pairs(rt, total, first, cnt);

    /* Threads and streams. */
    {
        pthread_t th[8];
        worker w[8];
        for (uint32_t k = 0; k < cnt; k++) {
            w[k] = (worker){rt, devs, total, first + k, 0};
            pthread_create(&th[k], NULL, worker_main, &w[k]);
        }
        for (uint32_t k = 0; k < cnt; k++) {
            pthread_join(th[k], NULL);
            CHECK(w[k].bad == 0, "worker of device %u: %d", first + k, w[k].bad);
        }
    }

    /* A local mismatch (this process's two parts disagree) is still found here: the
     * process with two devices gets CCQ_ERR_MISMATCH at once. (The others would wait for it
     * until timeout_ms, so they are not part of this communicator.) */
    if (cnt == 2) {
        float a[16] = {0}, b[16] = {0};
        ccq_device_id mine[2] = {first, first + 1};
        CHECK(ccq_comm_init(rt, mine, 2) == CCQ_OK, "local comm");
        CHECK(ccq_all_reduce(rt, first, 3, a, b, 16, CCQ_FLOAT32, CCQ_SUM, mine, 2) == CCQ_OK, "a");
        CHECK(ccq_all_reduce(rt, first + 1, 3, a, b, 8, CCQ_FLOAT32, CCQ_SUM, mine, 2) == CCQ_OK,
              "b");
        CHECK(ccq_sync_collective(rt, first, 3) == CCQ_ERR_MISMATCH, "mismatch found");
        CHECK(ccq_sync_collective(rt, first + 1, 3) == CCQ_ERR_MISMATCH, "mismatch found");
    }
    CHECK(ccq_runtime_destroy(rt) == CCQ_OK, "destroy");

    /* A process that never submits: a second runtime with a short timeout. The last process
     * joins communicator A but submits nothing on it; everyone uses B. */
    cfg.timeout_ms = 1500;
    CHECK(ccq_runtime_create(&cfg, &rt) == CCQ_OK, "second runtime");
    {
        float x[8][64], y[8][64];
        ccq_device_id a[64], b[64];
        uint32_t na = total, nb = 0;
        for (uint32_t d = 0; d < total; d++)
            a[d] = d;
        for (uint32_t p = 0; p + 1 < wsize || p == 0; p++)
            for (uint32_t k = 0; k < ndev_of(p); k++)
                b[nb++] = first_of(p) + k; /* B: every process but the last (or process 0) */
        for (uint32_t k = 0; k < cnt; k++)
            for (int e = 0; e < 64; e++)
                x[k][e] = 1.0f;
        CHECK(ccq_comm_init(rt, a, na) == CCQ_OK, "comm A");
        if (wrank + 1 < wsize) {
            uint64_t t0 = now_ms();
            ccq_status st;
            char detail[1024];
            for (uint32_t k = 0; k < cnt; k++)
                CHECK(ccq_all_reduce(rt, first + k, 0, x[k], y[k], 64, CCQ_FLOAT32, CCQ_SUM, a,
                                     na) == CCQ_OK,
                      "submit on A");
            /* B keeps working while A's all_reduce is stuck (other streams, other comm). */
            CHECK(ccq_comm_init(rt, b, nb) == CCQ_OK, "comm B");
            for (uint32_t k = 0; k < cnt; k++)
                CHECK(ccq_all_reduce(rt, first + k, 1, x[k], y[k], 64, CCQ_FLOAT32, CCQ_SUM, b,
                                     nb) == CCQ_OK,
                      "submit on B");
            for (uint32_t k = 0; k < cnt; k++)
                CHECK(ccq_sync_collective(rt, first + k, 1) == CCQ_OK, "B works");
            CHECK(now_ms() - t0 < 1400, "B finished before A's deadline (%llu ms)",
                  (unsigned long long)(now_ms() - t0));
            /* The fence's own wait can end first (it started later than the command, and
             * on a loaded machine the command may have been issued later still): the
             * command is then still pending and the next fence sees how it ended. */
            do {
                st = ccq_sync_collective(rt, first, 0);
                snprintf(detail, sizeof detail, "%s", ccq_last_error_detail());
            } while (st == CCQ_ERR_TIMEOUT && strstr(detail, "commands it covers still pending"));
            /* The UCX engine may see the silent process leave first (it destroys its runtime
             * at once), or another member that gave A up at its own deadline and left before
             * this one's came (its goodbye arrives at once): then CCQ_ERR_BACKEND naming it
             * (test_host_ucx checks the timeout of a process that stays). */
            char last[32];
            snprintf(last, sizeof last, "process %u", wsize - 1);
            if (st == CCQ_ERR_BACKEND && (strstr(detail, last) != NULL ||
                                          strstr(detail, " left (destroyed its runtime)") != NULL))
                goto a_done;
            CHECK(st == CCQ_ERR_TIMEOUT || st == CCQ_ERR_ABORTED, "A: %s", ccq_status_name(st));
            CHECK(now_ms() - t0 >= 1000, "A failed after about timeout_ms");
            /* The engine's deadline (a little before the watchdog's) names what A waits for,
             * also where a loaded machine wakes the scheduler past both at once (the watchdog
             * lets the engine look first: drill_late). */
            CHECK((strstr(detail, "MPI_Iallreduce") != NULL ||
                   strstr(detail, "UCX all_reduce") != NULL) &&
                      strstr(detail, "sequence 0") != NULL &&
                      strstr(detail, "among processes 0") != NULL,
                  "detail: %s", detail);
        a_done:
            for (uint32_t k = 1; k < cnt; k++)
                CHECK(ccq_sync_collective(rt, first + k, 0) != CCQ_OK, "A fails on every part");
        } else {
            /* The last process: the others wait about timeout_ms for A to fail before they
             * destroy their runtime and meet again below, where everyone waits timeout_ms
             * for the others. Leaving now, it would arrive that much ahead of them and its
             * wait could end first on a loaded machine: wait as they do. */
            struct timespec ts = {(time_t)(cfg.timeout_ms / 1000),
                                  (long)(cfg.timeout_ms % 1000) * 1000000L};
            while (nanosleep(&ts, &ts) != 0)
                ;
        }
        /* The others spend about timeout_ms on A: the silent one waits as long before it
         * moves on, so that all of them create the next runtime at about the same time
         * (its creation waits timeout_ms for everyone). */
        if (wrank + 1 == wsize) {
            struct timespec t = {1, 500000000L};
            nanosleep(&t, NULL);
        }
        CHECK(ccq_runtime_destroy(rt) == CCQ_OK, "destroy returns with a pending operation");
    }

    /* A mismatch between this process's own parts of a communicator spanning processes is
     * still found here, at once (matching is local): a process with two devices submits
     * counts 16 and 8; the others, whose operation then never gets that process's record for
     * the engine's check, end with the engine's timeout ("not started ... never submitted
     * it"). The last process left the previous runtime at once, the others only after their
     * 1.5 s timeout: a longer timeout_ms here, or its ccq_runtime_create could give up on
     * them before they come. */
    cfg.timeout_ms = 4000;
    CHECK(ccq_runtime_create(&cfg, &rt) == CCQ_OK, "third runtime");
    {
        float x[2][16] = {{0}}, y[2][16];
        uint64_t t0 = now_ms();
        CHECK(ccq_comm_init(rt, devs, total) == CCQ_OK, "comm of the world");
        for (uint32_t k = 0; k < cnt; k++)
            CHECK(ccq_all_reduce(rt, first + k, 0, x[k], y[k], k == 0 ? 16 : 8, CCQ_FLOAT32,
                                 CCQ_SUM, devs, total) == CCQ_OK,
                  "submit");
        ccq_status st = ccq_sync_collective(rt, first, 0);
        if (cnt == 2) {
            CHECK(st == CCQ_ERR_MISMATCH && now_ms() - t0 < 1000, "local mismatch: %s",
                  ccq_status_name(st));
            CHECK(strstr(ccq_last_error_detail(), "count") != NULL, "the detail names the count");
        } else {
            while (st == CCQ_ERR_TIMEOUT &&
                   strstr(ccq_last_error_detail(), "commands it covers still pending"))
                st = ccq_sync_collective(rt, first, 0);
            /* (UCX: or the mismatching process's departure, seen first; job health may
             * call it a loss when the process exited before its "left" record was read) */
            CHECK(st == CCQ_ERR_TIMEOUT || st == CCQ_ERR_ABORTED || st == CCQ_ERR_BACKEND ||
                      st == CCQ_ERR_PROCESS_LOST,
                  "partner of a mismatch: %s", ccq_status_name(st));
        }
        /* The processes that found the mismatch stay while the others still form and wait:
         * the UCX engine cannot connect to a process whose runtime is gone. */
        if (cnt == 2) {
            struct timespec t = {1, 500000000L};
            nanosleep(&t, NULL);
        }
        CHECK(ccq_runtime_destroy(rt) == CCQ_OK, "destroy");
    }
    printf("process %u of %u: OK\n", wrank, wsize);
    return 0;
}
