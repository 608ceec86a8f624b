/* One process of the network-partition drill (tests/health/partition.sh): processes in network
 * namespaces of their own, their host data over UCX's TCP, meeting at a tcp:// rendezvous; the
 * script cuts the network between them. This process runs a loop of exact all_reduces over
 * every device of the world; on CCQ_ERR_PROCESS_LOST it inits a communicator over the devices
 * of the processes alive in its view and goes on, until it finds itself lost (fenced off) or
 * the script says stop (creates STOPFILE; 120 s at most). It prints "ready" after its first
 * all_reduce, and at the end one line the script checks:
 *
 *   END rank=R state=alive|lost steps=S after=A group=D fenced_ms=T
 *
 * steps: all_reduces completed; after: those completed on a communicator it formed after the
 * first loss; group: the devices of its last communicator; fenced_ms: CLOCK_REALTIME (ms) when
 * it found itself lost (0: never). A wrong sum exits 1 at once.
 *
 *   drill_partition STOPFILE   (world, bootstrap and engine from CCQ_* variables) */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ccq.h"

enum { N = 1024, MAXP = 64 };

static double mono_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t real_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (uint64_t)t.tv_sec * 1000u + (uint64_t)t.tv_nsec / 1000000u;
}

/* The devices of the processes alive in this process's view, into group; their count. */
static uint32_t alive_devices(ccq_runtime *rt, uint32_t nprocs, uint32_t per, ccq_device_id *group)
{
    uint32_t m = 0;
    for (uint32_t p = 0; p < nprocs; p++) {
        ccq_process_state ps;
        if (ccq_world_process_state(rt, p, &ps) == CCQ_OK && ps == CCQ_PROCESS_ALIVE)
            for (uint32_t i = 0; i < per; i++)
                group[m++] = p * per + i;
    }
    return m;
}

int main(int argc, char **argv)
{
    ccq_config cfg;
    ccq_runtime *rt;
    ccq_device_id first, group[MAXP];
    uint32_t per, n, nprocs, rank;
    uint64_t steps = 0, after = 0, fenced_ms = 0;
    bool reformed = false;
    float *buf;
    const char *stop = argc > 1 ? argv[1] : "/nonexistent";
    double secs = 120.0, t0;
    ccq_process_state me = CCQ_PROCESS_ALIVE;

    setvbuf(stdout, NULL, _IOLBF, 0);
    ccq_config_init(&cfg);
    if (ccq_runtime_create(&cfg, &rt) != CCQ_OK) {
        printf("ccq_runtime_create: %s\n", ccq_last_error_detail());
        return 1;
    }
    rank = cfg.world_rank;
    nprocs = cfg.world_size;
    ccq_local_devices(rt, &first, &per);
    n = ccq_device_count(rt);
    if (nprocs > MAXP || n > MAXP || n != nprocs * per) {
        printf("this drill wants the same number of devices in every process, %u at most\n", MAXP);
        return 1;
    }
    for (uint32_t d = 0; d < n; d++)
        group[d] = d;
    if (ccq_comm_init(rt, group, n) != CCQ_OK ||
        ccq_mem_alloc(rt, first, N * sizeof(float), (void **)&buf) != CCQ_OK) {
        printf("process %u: %s\n", rank, ccq_last_error_detail());
        return 1;
    }
    t0 = mono_s();
    while (mono_s() - t0 < secs && me == CCQ_PROCESS_ALIVE && access(stop, F_OK) != 0) {
        for (int k = 0; k < N; k++)
            buf[k] = 1.0f;
        ccq_status st = ccq_all_reduce(rt, first, 0, buf, buf, N, CCQ_FLOAT32, CCQ_SUM, group, n);
        if (st == CCQ_OK)
            st = ccq_sync_collective(rt, first, 0);
        if (st == CCQ_OK) {
            for (int k = 0; k < N; k++)
                if (buf[k] != (float)n) {
                    printf("process %u: step %" PRIu64 ": element %d is %g, not %u\n", rank, steps,
                           k, (double)buf[k], n);
                    return 1;
                }
            if (steps++ == 0)
                printf("ready\n");
            after += reformed;
            /* (a process fenced off still runs what involves only its own devices) */
            ccq_world_process_state(rt, rank, &me);
            usleep(10000); /* the step's compute */
            continue;
        }
        printf("process %u at %.1f s: %s: %s\n", rank, mono_s() - t0, ccq_status_name(st),
               ccq_last_error_detail());
        ccq_world_process_state(rt, rank, &me);
        if (st != CCQ_ERR_PROCESS_LOST) {
            usleep(200000); /* (an init among processes that cannot meet: its deadline) */
            continue;
        }
        while (me == CCQ_PROCESS_ALIVE && mono_s() - t0 < secs && access(stop, F_OK) != 0) {
            n = alive_devices(rt, nprocs, per, group);
            st = ccq_comm_init(rt, group, n);
            printf("process %u at %.1f s: ccq_comm_init over %u devices: %s\n", rank, mono_s() - t0,
                   n, ccq_status_name(st));
            if (st == CCQ_OK)
                break;
            ccq_world_process_state(rt, rank, &me);
            usleep(100000);
        }
        reformed = true;
    }
    ccq_world_process_state(rt, rank, &me);
    if (me != CCQ_PROCESS_ALIVE)
        fenced_ms = real_ms();
    printf("END rank=%u state=%s steps=%" PRIu64 " after=%" PRIu64 " group=", rank,
           me == CCQ_PROCESS_ALIVE ? "alive" : "lost", steps, after);
    for (uint32_t d = 0; d < n; d++)
        printf("%s%u", d ? "," : "", group[d]);
    printf(" fenced_ms=%" PRIu64 "\n", fenced_ms);
    ccq_mem_free(rt, first, buf);
    ccq_runtime_destroy(rt);
    return 0;
}
