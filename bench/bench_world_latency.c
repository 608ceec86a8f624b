/* Latency of one small all_reduce across processes, and where its time goes: every process
 * of the world (one host device each unless -g) submits an all_reduce of -b bytes over every
 * device of the world and waits for it (ccq_sync_collective), -n times after -w warm-ups.
 * Prints, per process, the median, 10th and 90th percentile of submit-to-fence-return, and
 * from the event log (median over the iterations) its parts:
 *   queue    submitted -> issued        (the scheduler picks it up, matches, issues)
 *   engine   issued -> completed        (local combine, the messages, waiting for the peers)
 *   wake     completed -> fence return  (the waiter learns of it)
 * Runs in any world: under mpirun, or plain processes with CCQ_BOOTSTRAP (tests/launch). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ccq.h"

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double pct(uint64_t *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof *v, cmp_u64);
    return (double)v[(size_t)(p * (double)(n - 1))] / 1e3;
}

int main(int argc, char **argv)
{
    ccq_config cfg;
    ccq_runtime *rt;
    int iters = 2000, warm = 200;
    size_t bytes = 8;
    uint32_t g = 1, n, cnt;
    ccq_device_id first, devs[256];
    float *in[16], *out[16];
    uint64_t *lat;
    ccq_event *ev;
    size_t nev = 0;

    for (int a = 1; a + 1 < argc; a += 2) {
        if (!strcmp(argv[a], "-n"))
            iters = atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "-w"))
            warm = atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "-b"))
            bytes = (size_t)atol(argv[a + 1]);
        else if (!strcmp(argv[a], "-g"))
            g = (uint32_t)atoi(argv[a + 1]);
    }
    ccq_config_init(&cfg);
    if (cfg.world_size > 1 && cfg.bootstrap == NULL)
        cfg.bootstrap = "mpi";
    cfg.host_devices = g;
    cfg.trace_capacity = 1u << 20;
    if (ccq_runtime_create(&cfg, &rt) != CCQ_OK) {
        fprintf(stderr, "ccq_runtime_create: %s\n", ccq_last_error_detail());
        return 1;
    }
    n = ccq_device_count(rt);
    ccq_local_devices(rt, &first, &cnt);
    for (uint32_t d = 0; d < n; d++)
        devs[d] = d;
    if (ccq_comm_init(rt, devs, n) != CCQ_OK) {
        fprintf(stderr, "ccq_comm_init: %s\n", ccq_last_error_detail());
        return 1;
    }
    size_t count = bytes / 4 ? bytes / 4 : 1;
    for (uint32_t k = 0; k < cnt; k++) {
        in[k] = calloc(count, 4);
        out[k] = calloc(count, 4);
    }
    lat = calloc((size_t)iters, sizeof *lat);
    for (int it = -warm; it < iters; it++) {
        uint64_t t0 = now_ns();
        for (uint32_t k = 0; k < cnt; k++)
            ccq_all_reduce(rt, first + k, 0, in[k], out[k], count, CCQ_FLOAT32, CCQ_SUM, devs, n);
        for (uint32_t k = 0; k < cnt; k++)
            if (ccq_sync_collective(rt, first + k, 0) != CCQ_OK) {
                fprintf(stderr, "fence: %s\n", ccq_last_error_detail());
                return 1;
            }
        if (it >= 0)
            lat[it] = now_ns() - t0;
    }
    /* The event log: per command id on the first device, its submitted/issued/completed
     * times; the fence that followed it. */
    ev = calloc(1u << 20, sizeof *ev);
    ev[0].struct_size = sizeof *ev;
    ccq_trace_snapshot(rt, ev, 1u << 20, &nev, NULL);
    {
        uint64_t *q = calloc((size_t)iters + (size_t)warm, 8), *e = calloc((size_t)iters + warm, 8),
                 *w = calloc((size_t)iters + warm, 8);
        size_t nq = 0, ne = 0, nw = 0;
        uint64_t sub = 0, iss = 0, done = 0;
        for (size_t i = 0; i < nev; i++) {
            const ccq_event *x = &ev[i];
            if (x->device != first)
                continue;
            if (x->type == CCQ_EV_SUBMITTED && x->stream == 0)
                sub = x->time_ns, iss = done = 0;
            else if (x->type == CCQ_EV_ISSUED && sub)
                iss = x->time_ns;
            else if (x->type == CCQ_EV_COMPLETED && iss)
                done = x->time_ns;
            else if (x->type == CCQ_EV_FENCE_END && done) {
                q[nq++] = iss - sub;
                e[ne++] = done - iss;
                w[nw++] = x->time_ns - done;
                sub = 0;
            }
        }
        printf("process %u of %u, %u device(s), %zu B: latency median %.2f us (p10 %.2f, p90 "
               "%.2f) over %d; parts (median): queue %.2f us, engine %.2f us, wake %.2f us\n",
               ccq_world_rank(rt), ccq_world_size(rt), cnt, bytes, pct(lat, (size_t)iters, 0.5),
               pct(lat, (size_t)iters, 0.1), pct(lat, (size_t)iters, 0.9), iters, pct(q, nq, 0.5),
               pct(e, ne, 0.5), pct(w, nw, 0.5));
        free(q);
        free(e);
        free(w);
    }
    free(ev);
    ccq_runtime_destroy(rt);
    return 0;
}
