/* One process of a world of plain processes running N float32 sum all_reduces of MIB MiB (one
 * device, out of place), each followed by ccq_sync_collective; world rank 0 prints each one's
 * time in ms. Launched as in ../../../../bench/ab-libs.sh (CCQ_WORLD_RANK, CCQ_WORLD_SIZE,
 * CCQ_BOOTSTRAP=tcp://..., CCQ_HOST_ENGINE=ucx); see README.md.
 * Build: cc -O2 -I include -o allreduce_loop allreduce_loop.c -L build -lccq */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ccq.h"

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

int main(int argc, char **argv)
{
    size_t bytes = argc > 1 ? (size_t)atoi(argv[1]) << 20 : 32u << 20;
    int iters = argc > 2 ? atoi(argv[2]) : 25;
    ccq_config cfg;
    ccq_runtime *rt;
    ccq_device_id first, all[64];
    uint32_t count, n;
    double *t = calloc((size_t)iters, sizeof *t);
    float *x = malloc(bytes), *y = malloc(bytes);

    if (t == NULL || x == NULL || y == NULL || iters <= 0)
        return 2;
    ccq_config_init(&cfg);
    cfg.host_devices = 1;
    if (ccq_runtime_create(&cfg, &rt) != CCQ_OK) {
        fprintf(stderr, "%s\n", ccq_last_error_detail());
        return 1;
    }
    ccq_local_devices(rt, &first, &count);
    n = ccq_device_count(rt);
    if (n > 64) {
        fprintf(stderr, "%u devices: at most 64 here\n", n);
        return 2;
    }
    for (uint32_t d = 0; d < n; d++)
        all[d] = d;
    memset(x, 1, bytes);
    memset(y, 0, bytes);
    if (ccq_comm_init(rt, all, n) != CCQ_OK) {
        fprintf(stderr, "%s\n", ccq_last_error_detail());
        return 1;
    }
    for (int i = 0; i < iters; i++) {
        double a = now_ms();
        ccq_all_reduce(rt, first, 0, x, y, bytes / 4, CCQ_FLOAT32, CCQ_SUM, all, n);
        if (ccq_sync_collective(rt, first, 0) != CCQ_OK) {
            fprintf(stderr, "%s\n", ccq_last_error_detail());
            return 1;
        }
        t[i] = now_ms() - a;
    }
    if (ccq_world_rank(rt) == 0) {
        for (int i = 0; i < iters; i++)
            printf("%.2f ", t[i]);
        printf("\n");
    }
    ccq_runtime_destroy(rt);
    return 0;
}
