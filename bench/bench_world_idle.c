/* Scheduler CPU while idle in a world of 2 processes (under mpirun -np 2, or plain processes
 * with CCQ_BOOTSTRAP; either engine, CCQ_HOST_ENGINE): after an all_reduce across the
 * processes has completed, nothing is in flight and the scheduler must sleep, not poll the
 * engine. Prints, per process, the CPU time the whole process used over one idle second
 * (getrusage), then over one second with an all_reduce stuck in flight (process 1 holds its
 * part back), where the scheduler polls the engine at its interval until timeout_ms. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bench_common.h"
#include "ccq.h"

int main(void)
{
    ccq_config cfg;
    ccq_runtime *rt;
    ccq_device_id first = 0, devs[64];
    uint32_t n = 0, rank;
    float x[1024], y[1024];

    ccq_config_init(&cfg);
    rank = cfg.world_rank;
    if (cfg.world_size < 2) {
        fprintf(stderr, "run under mpirun -np 2 (or 2 processes with CCQ_BOOTSTRAP)\n");
        return 77;
    }
    if (cfg.bootstrap == NULL) /* under mpirun; else CCQ_BOOTSTRAP (tcp://, file:) */
        cfg.bootstrap = "mpi";
    cfg.host_devices = 1;
    cfg.timeout_ms = 3000;
    if (ccq_runtime_create(&cfg, &rt) != CCQ_OK) {
        fprintf(stderr, "%s\n", ccq_last_error_detail());
        return 1;
    }
    ccq_local_devices(rt, &first, &n);
    for (uint32_t d = 0; d < ccq_device_count(rt); d++)
        devs[d] = d;
    memset(x, 0, sizeof x);
    ccq_comm_init(rt, devs, ccq_device_count(rt));
    ccq_all_reduce(rt, first, 0, x, y, 1024, CCQ_FLOAT32, CCQ_SUM, devs, ccq_device_count(rt));
    ccq_sync_collective(rt, first, 0);
    bench_sleep_s(0.2); /* past the scheduler's spin_us */
    double c0 = bench_cpu_s();
    bench_sleep_s(1.0);
    double idle = bench_cpu_s() - c0;
    /* One all_reduce in flight that cannot finish (process 1 submits its part late). */
    if (rank == 0)
        ccq_all_reduce(rt, first, 0, x, y, 1024, CCQ_FLOAT32, CCQ_SUM, devs, ccq_device_count(rt));
    bench_sleep_s(0.2);
    c0 = bench_cpu_s();
    bench_sleep_s(1.0);
    double busy = bench_cpu_s() - c0;
    if (rank == 1)
        ccq_all_reduce(rt, first, 0, x, y, 1024, CCQ_FLOAT32, CCQ_SUM, devs, ccq_device_count(rt));
    ccq_sync_collective(rt, first, 0);
    printf("process %u: CPU over an idle second %.1f ms; over a second with a request in flight "
           "(%s) %.1f ms\n",
           rank, idle * 1e3, rank == 0 ? "its own" : "the peer's", busy * 1e3);
    ccq_runtime_destroy(rt);
    return 0;
}
