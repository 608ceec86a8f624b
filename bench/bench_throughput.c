/* Small-op throughput: matched 4-rank one-element all_reduces per second, one submitting
 * thread per device, with batching (max_batch_ops = 256) and without (max_batch_ops = 1).
 * Each op reads and writes its own element, so ops of one stream do not conflict and can
 * share a batch; the fence at the end covers them all. */
#define _GNU_SOURCE
#include "bench_tput.h"

static double run(uint32_t max_batch, int n, ccq_stats *st, int *errors)
{
    ccq_config cfg;
    ccq_runtime *rt;
    double rate;

    ccq_config_init(&cfg);
    cfg.host_devices = BENCH_TPUT_NDEV;
    cfg.max_batch_ops = max_batch;
    if (ccq_runtime_create(&cfg, &rt) != CCQ_OK) {
        fprintf(stderr, "create: %s\n", ccq_last_error_detail());
        exit(1);
    }
    rate = bench_tput_run(rt, n, NULL, errors);
    st->struct_size = sizeof *st;
    ccq_get_stats(rt, st);
    ccq_runtime_destroy(rt);
    return rate;
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
           BENCH_TPUT_NDEV, reps);
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
