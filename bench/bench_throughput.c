/* Small-op throughput: matched 4-rank one-element all_reduces per second, one submitting
 * thread per device, with batching (max_batch_ops = 256) and without (max_batch_ops = 1).
 * Each op reads and writes its own element, so ops of one stream do not conflict and can
 * share a batch; the fence at the end covers them all. */
#define _GNU_SOURCE
#include <pthread.h>

#include "bench_common.h"
#include "ccq.h"

#define NDEV 4

typedef struct arg {
    ccq_runtime *rt;
    ccq_device_id dev;
    int n;
    float *src, *dst;
    pthread_barrier_t *bar;
    int errors;
} arg;

static void *submitter(void *p)
{
    arg *a = p;
    ccq_device_id devs[NDEV] = {0, 1, 2, 3};
    pthread_barrier_wait(a->bar);
    for (int i = 0; i < a->n; i++)
        a->errors += ccq_all_reduce(a->rt, a->dev, 0, &a->src[i], &a->dst[i], 1, CCQ_FLOAT32,
                                    CCQ_SUM, devs, NDEV) != CCQ_OK;
    a->errors += ccq_sync_collective(a->rt, a->dev, 0) != CCQ_OK;
    pthread_barrier_wait(a->bar);
    return NULL;
}

/* Returns collectives per second; fills the batch statistics. */
static double run(uint32_t max_batch, int n, ccq_stats *st, int *errors)
{
    ccq_config cfg;
    ccq_runtime *rt;
    pthread_t th[NDEV];
    arg a[NDEV];
    pthread_barrier_t bar;
    ccq_device_id devs[NDEV] = {0, 1, 2, 3};

    ccq_config_init(&cfg);
    cfg.host_devices = NDEV;
    cfg.max_batch_ops = max_batch;
    if (ccq_runtime_create(&cfg, &rt) != CCQ_OK) {
        fprintf(stderr, "create: %s\n", ccq_last_error_detail());
        exit(1);
    }
    ccq_comm_init(rt, devs, NDEV);
    pthread_barrier_init(&bar, NULL, NDEV + 1);
    for (int d = 0; d < NDEV; d++) {
        a[d] = (arg){rt,
                     (ccq_device_id)d,
                     n,
                     calloc((size_t)n, sizeof(float)),
                     calloc((size_t)n, sizeof(float)),
                     &bar,
                     0};
        for (int i = 0; i < n; i++)
            a[d].src[i] = (float)(d + 1);
        pthread_create(&th[d], NULL, submitter, &a[d]);
    }
    pthread_barrier_wait(&bar);
    uint64_t t0 = bench_now_ns();
    pthread_barrier_wait(&bar);
    double secs = (double)(bench_now_ns() - t0) / 1e9;
    for (int d = 0; d < NDEV; d++) {
        pthread_join(th[d], NULL);
        *errors += a[d].errors;
        for (int i = 0; i < n; i++)
            *errors += a[d].dst[i] != 10.0f; /* 1 + 2 + 3 + 4 */
        free(a[d].src);
        free(a[d].dst);
    }
    pthread_barrier_destroy(&bar);
    st->struct_size = sizeof *st;
    ccq_get_stats(rt, st);
    ccq_runtime_destroy(rt);
    return n / secs;
}

int main(int argc, char **argv)
{
    int n = (int)bench_opt(argc, argv, "--ops", 200000);
    int reps = (int)bench_opt(argc, argv, "--reps", 5);
    uint32_t batch_sizes[2] = {256, 1};
    double rate[2];
    bench_json js;
    int errors = 0;

    bench_json_open(&js, argc, argv, "throughput");
    printf("# Small-op throughput: %d one-element all_reduces on %d devices (median of %d)\n", n,
           NDEV, reps);
    printf("# %-14s %14s %10s %12s\n", "max_batch_ops", "collectives/s", "batches", "ops/batch");
    for (int k = 0; k < 2; k++) {
        double v[32];
        ccq_stats st;
        for (int r = 0; r < reps; r++)
            v[r] = run(batch_sizes[k], n, &st, &errors);
        rate[k] = bench_median(v, (size_t)reps);
        printf("  %-14u %14.0f %10llu %12.2f\n", batch_sizes[k], rate[k],
               (unsigned long long)st.batches,
               st.batches ? (double)st.batched_ops / (double)st.batches : 0.0);
        bench_json_record(&js,
                          "\"max_batch_ops\": %u, \"collectives_per_s\": %.0f, \"batches\": %llu, "
                          "\"ops_per_batch\": %.2f",
                          batch_sizes[k], rate[k], (unsigned long long)st.batches,
                          st.batches ? (double)st.batched_ops / (double)st.batches : 0.0);
    }
    printf("# batching speed-up: %.1fx\n", rate[0] / rate[1]);
    bench_json_close(&js);
    if (errors)
        fprintf(stderr, "%d errors (submission, fence or wrong result)\n", errors);
    return errors ? 1 : 0;
}
