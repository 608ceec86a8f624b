/* The small-op throughput run shared by bench_throughput and bench_trace: one submitting
 * thread per device of a 4-device runtime, each queuing n one-element all_reduces over all
 * four (each op on its own element, so ops of one stream can share a batch) and fencing once;
 * every result is checked. */
#ifndef CCQ_BENCH_TPUT_H
#define CCQ_BENCH_TPUT_H

#include <pthread.h>
#include <time.h>

#include "bench_common.h"
#include "ccq.h"

#define BENCH_TPUT_NDEV 4

typedef struct bench_tput_arg {
    ccq_runtime *rt;
    ccq_device_id dev;
    int n;
    float *src, *dst;
    pthread_barrier_t *bar;
    int errors;
} bench_tput_arg;

static void *bench_tput_submitter(void *p)
{
    bench_tput_arg *a = p;
    ccq_device_id devs[BENCH_TPUT_NDEV] = {0, 1, 2, 3};
    pthread_barrier_wait(a->bar);
    for (int i = 0; i < a->n; i++)
        a->errors += ccq_all_reduce(a->rt, a->dev, 0, &a->src[i], &a->dst[i], 1, CCQ_FLOAT32,
                                    CCQ_SUM, devs, BENCH_TPUT_NDEV) != CCQ_OK;
    a->errors += ccq_sync_collective(a->rt, a->dev, 0) != CCQ_OK;
    pthread_barrier_wait(a->bar);
    return NULL;
}

static inline uint64_t bench_process_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Collectives per second on rt (which it does not destroy); *cpu (may be NULL): the process's
 * CPU time per collective over the run (submitters, scheduler, host workers). Adds wrong
 * results and failed calls to *errors. */
static inline double bench_tput_run(ccq_runtime *rt, int n, double *cpu, int *errors)
{
    ccq_device_id devs[BENCH_TPUT_NDEV] = {0, 1, 2, 3};
    pthread_t th[BENCH_TPUT_NDEV];
    bench_tput_arg a[BENCH_TPUT_NDEV];
    pthread_barrier_t bar;

    *errors += ccq_comm_init(rt, devs, BENCH_TPUT_NDEV) != CCQ_OK;
    pthread_barrier_init(&bar, NULL, BENCH_TPUT_NDEV + 1);
    for (int d = 0; d < BENCH_TPUT_NDEV; d++) {
        a[d] = (bench_tput_arg){rt,
                                (ccq_device_id)d,
                                n,
                                calloc((size_t)n, sizeof(float)),
                                calloc((size_t)n, sizeof(float)),
                                &bar,
                                0};
        for (int i = 0; i < n; i++)
            a[d].src[i] = (float)(d + 1);
        pthread_create(&th[d], NULL, bench_tput_submitter, &a[d]);
    }
    pthread_barrier_wait(&bar);
    uint64_t t0 = bench_now_ns(), c0 = bench_process_cpu_ns();
    pthread_barrier_wait(&bar);
    double secs = (double)(bench_now_ns() - t0) / 1e9;
    if (cpu != NULL)
        *cpu = (double)(bench_process_cpu_ns() - c0) / n;
    for (int d = 0; d < BENCH_TPUT_NDEV; d++) {
        pthread_join(th[d], NULL);
        *errors += a[d].errors;
        for (int i = 0; i < n; i++)
            *errors += a[d].dst[i] != 10.0f; /* 1 + 2 + 3 + 4 */
        free(a[d].src);
        free(a[d].dst);
    }
    pthread_barrier_destroy(&bar);
    return n / secs;
}

#endif
