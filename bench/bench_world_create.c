/* What it costs to start a world: ccq_runtime_create (the processes meet through the
 * bootstrap; the UCX engine starts and its addresses are exchanged), then ccq_comm_init of
 * every device of the world, then the first all_reduce over it (its endpoints connect).
 * Each process prints one JSON line with its times in ms; bench/world-create.sh runs it for
 * several world sizes and bootstraps and reports the slowest process. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ccq.h"

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

int main(void)
{
    ccq_config cfg;
    ccq_runtime *rt;
    ccq_device_id first, devs[1024];
    uint32_t cnt, n;
    float x[256] = {0}, y[256];
    double t0, t1, t2, t3;

    ccq_config_init(&cfg);
    if (cfg.world_size > 1 && cfg.bootstrap == NULL)
        cfg.bootstrap = "mpi";
    cfg.host_devices = 1;
    t0 = now_ms();
    if (ccq_runtime_create(&cfg, &rt) != CCQ_OK) {
        fprintf(stderr, "ccq_runtime_create: %s\n", ccq_last_error_detail());
        return 1;
    }
    t1 = now_ms();
    n = ccq_device_count(rt);
    ccq_local_devices(rt, &first, &cnt);
    for (uint32_t d = 0; d < n; d++)
        devs[d] = d;
    if (ccq_comm_init(rt, devs, n) != CCQ_OK) {
        fprintf(stderr, "ccq_comm_init: %s\n", ccq_last_error_detail());
        return 1;
    }
    t2 = now_ms();
    if (ccq_all_reduce(rt, first, 0, x, y, 256, CCQ_FLOAT32, CCQ_SUM, devs, n) != CCQ_OK ||
        ccq_sync_collective(rt, first, 0) != CCQ_OK) {
        fprintf(stderr, "all_reduce: %s\n", ccq_last_error_detail());
        return 1;
    }
    t3 = now_ms();
    printf("{\"rank\": %u, \"size\": %u, \"create_ms\": %.3f, \"comm_init_ms\": %.3f, "
           "\"first_all_reduce_ms\": %.3f, \"total_ms\": %.3f}\n",
           ccq_world_rank(rt), ccq_world_size(rt), t1 - t0, t2 - t1, t3 - t2, t3 - t0);
    fflush(stdout);
    ccq_runtime_destroy(rt);
    return 0;
}
