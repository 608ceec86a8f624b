/* The flight recorder's cost: the same work with the recorder off (trace_capacity = 0) and on
 * (--capacity events, default 65536), in one run, the two interleaved run by run (median of
 * --reps).
 *  (1) submit cost: ns per ccq_all_reduce of one element, 1 and 2 producers, each on its own
 *      device with a one-device communicator, streams deep enough for a whole run (as
 *      bench_submit's API column);
 *  (2) scheduler side: small-op throughput, 4 devices with one submitting thread each, one-
 *      element all_reduces (as bench_throughput), with batching (256) and without (1).
 * Options: --items N (submissions per producer), --ops N (collectives per throughput run),
 * --reps N, --capacity N (events when on), --json FILE.
 * Overhead % = (on - off) / off for times, (off - on) / off for rates. Each also reports CPU
 * time, which other processes on a busy machine do not inflate the way they do wall time. */
#define _GNU_SOURCE
#include <pthread.h>

#include "bench_common.h"
#include "bench_tput.h"
#include "ccq.h"

#define MAXP 2
#define NDEV BENCH_TPUT_NDEV

static ccq_runtime *make_rt(uint32_t capacity, uint32_t queue_depth, uint32_t max_batch)
{
    ccq_config cfg;
    ccq_runtime *rt;
    ccq_config_init(&cfg);
    cfg.host_devices = NDEV;
    cfg.trace_capacity = capacity;
    cfg.trace_file = NULL;
    if (queue_depth)
        cfg.queue_depth = queue_depth;
    if (max_batch)
        cfg.max_batch_ops = max_batch;
    if (ccq_runtime_create(&cfg, &rt) != CCQ_OK) {
        fprintf(stderr, "ccq_runtime_create: %s\n", ccq_last_error_detail());
        exit(1);
    }
    return rt;
}

static uint64_t cpu_ns(clockid_t clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- (1) submit cost ---- */
typedef struct prod {
    ccq_runtime *rt;
    ccq_device_id dev;
    uint32_t n;
    float buf[16];
    pthread_barrier_t *bar;
    double ns_per_op, cpu_per_op;
    int errors;
} prod;

static void *producer(void *arg)
{
    prod *p = arg;
    ccq_device_id set[1] = {p->dev};
    pthread_barrier_wait(p->bar);
    uint64_t t0 = bench_now_ns(), c0 = cpu_ns(CLOCK_THREAD_CPUTIME_ID);
    for (uint32_t i = 0; i < p->n; i++)
        p->errors += ccq_all_reduce(p->rt, p->dev, 0, p->buf, p->buf, 1, CCQ_FLOAT32, CCQ_SUM, set,
                                    1) != CCQ_OK;
    p->ns_per_op = (double)(bench_now_ns() - t0) / p->n;
    p->cpu_per_op = (double)(cpu_ns(CLOCK_THREAD_CPUTIME_ID) - c0) / p->n;
    p->errors += ccq_sync_collective(p->rt, p->dev, 0) != CCQ_OK;
    return NULL;
}

/* One run: every producer submits n commands; the mean of their ns per submission (wall
 * clock; *cpu: their CPU time, which preemption by other processes does not inflate). */
static double submit_run(ccq_runtime *rt, int nprod, uint32_t n, double *cpu, int *errors)
{
    pthread_t th[MAXP];
    prod p[MAXP];
    pthread_barrier_t bar;
    double mean = 0;

    *cpu = 0;
    pthread_barrier_init(&bar, NULL, (unsigned)nprod);
    for (int k = 0; k < nprod; k++) {
        memset(&p[k], 0, sizeof p[k]);
        p[k].rt = rt;
        p[k].dev = (ccq_device_id)k;
        p[k].n = n;
        p[k].bar = &bar;
        pthread_create(&th[k], NULL, producer, &p[k]);
    }
    for (int k = 0; k < nprod; k++) {
        pthread_join(th[k], NULL);
        mean += p[k].ns_per_op / nprod;
        *cpu += p[k].cpu_per_op / nprod;
        *errors += p[k].errors;
    }
    pthread_barrier_destroy(&bar);
    return mean;
}

/* ---- (2) scheduler throughput ---- */
/* Collectives per second of one run on a fresh runtime; *cpu: the process's CPU time per
 * collective over the run (submitters, scheduler, host workers: where recording costs). */
static double tput_run(uint32_t capacity, uint32_t max_batch, int n, double *cpu, int *errors)
{
    ccq_runtime *rt = make_rt(capacity, 0, max_batch);
    double rate = bench_tput_run(rt, n, cpu, errors);
    ccq_runtime_destroy(rt);
    return rate;
}

/* The overhead of `on` over `off` in percent: positive when on is slower (times: on - off;
 * rates, rate = 1: off - on). */
static double overhead(double off, double on, int rate)
{
    return (rate ? off - on : on - off) / off * 100;
}

int main(int argc, char **argv)
{
    uint32_t n = (uint32_t)bench_opt(argc, argv, "--items", 100000);
    int ops = (int)bench_opt(argc, argv, "--ops", 50000);
    int reps = (int)bench_opt(argc, argv, "--reps", 7);
    const uint32_t on_cap = (uint32_t)bench_opt(argc, argv, "--capacity", 65536);
    double off[64], on[64], coff[64], con[64];
    bench_json js;
    int errors = 0;

    if (reps < 1 || reps > 64) {
        fprintf(stderr, "--reps must be 1..64\n");
        return 2;
    }
    bench_json_open(&js, argc, argv, "trace");
    printf("# Flight recorder cost: off (trace_capacity = 0) vs on (%u events), interleaved, "
           "median of %d\n",
           on_cap, reps);
    printf("# submit: ns per ccq_all_reduce (one element, %u per producer, own device and "
           "stream), wall clock and the producer's CPU time\n",
           n);
    printf("# %-9s %8s %8s %9s %8s %8s %9s\n", "producers", "off ns", "on ns", "overhead",
           "off cpu", "on cpu", "overhead");
    for (int nprod = 1; nprod <= MAXP; nprod++) {
        /* Both runtimes live for the whole comparison; the idle one sleeps. */
        ccq_runtime *rt_off = make_rt(0, n + 1, 0), *rt_on = make_rt(on_cap, n + 1, 0);
        double c;
        for (int k = 0; k < nprod; k++) {
            ccq_device_id d = (ccq_device_id)k;
            ccq_comm_init(rt_off, &d, 1);
            ccq_comm_init(rt_on, &d, 1);
        }
        submit_run(rt_off, nprod, n, &c, &errors); /* warm-up: touches every queue slot once */
        submit_run(rt_on, nprod, n, &c, &errors);
        for (int r = 0; r < reps; r++) { /* alternate which goes first */
            if (r % 2 == 0) {
                off[r] = submit_run(rt_off, nprod, n, &coff[r], &errors);
                on[r] = submit_run(rt_on, nprod, n, &con[r], &errors);
            } else {
                on[r] = submit_run(rt_on, nprod, n, &con[r], &errors);
                off[r] = submit_run(rt_off, nprod, n, &coff[r], &errors);
            }
        }
        ccq_runtime_destroy(rt_off);
        ccq_runtime_destroy(rt_on);
        double moff = bench_median(off, (size_t)reps), mon = bench_median(on, (size_t)reps);
        double mcoff = bench_median(coff, (size_t)reps), mcon = bench_median(con, (size_t)reps);
        printf("  %-9d %8.1f %8.1f %8.1f%% %8.1f %8.1f %8.1f%%\n", nprod, moff, mon,
               overhead(moff, mon, 0), mcoff, mcon, overhead(mcoff, mcon, 0));
        bench_json_record(&js,
                          "\"test\": \"submit\", \"producers\": %d, \"off_ns\": %.2f, "
                          "\"on_ns\": %.2f, \"overhead_pct\": %.2f, \"off_cpu_ns\": %.2f, "
                          "\"on_cpu_ns\": %.2f, \"cpu_overhead_pct\": %.2f",
                          nprod, moff, mon, overhead(moff, mon, 0), mcoff, mcon,
                          overhead(mcoff, mcon, 0));
    }

    printf("# scheduler: small-op throughput, %d one-element all_reduces on %d devices; CPU: "
           "process CPU ns per collective\n",
           ops, NDEV);
    printf("# %-13s %10s %10s %9s %8s %8s %9s\n", "max_batch_ops", "off coll/s", "on coll/s",
           "overhead", "off cpu", "on cpu", "overhead");
    static const uint32_t batch[2] = {256, 1};
    for (int k = 0; k < 2; k++) {
        for (int r = 0; r < reps; r++) {
            if (r % 2 == 0) {
                off[r] = tput_run(0, batch[k], ops, &coff[r], &errors);
                on[r] = tput_run(on_cap, batch[k], ops, &con[r], &errors);
            } else {
                on[r] = tput_run(on_cap, batch[k], ops, &con[r], &errors);
                off[r] = tput_run(0, batch[k], ops, &coff[r], &errors);
            }
        }
        double moff = bench_median(off, (size_t)reps), mon = bench_median(on, (size_t)reps);
        double mcoff = bench_median(coff, (size_t)reps), mcon = bench_median(con, (size_t)reps);
        printf("  %-13u %10.0f %10.0f %8.1f%% %8.0f %8.0f %8.1f%%\n", batch[k], moff, mon,
               overhead(moff, mon, 1), mcoff, mcon, overhead(mcoff, mcon, 0));
        bench_json_record(&js,
                          "\"test\": \"throughput\", \"max_batch_ops\": %u, \"off_per_s\": "
                          "%.0f, \"on_per_s\": %.0f, \"overhead_pct\": %.2f, \"off_cpu_ns\": "
                          "%.0f, \"on_cpu_ns\": %.0f, \"cpu_overhead_pct\": %.2f",
                          batch[k], moff, mon, overhead(moff, mon, 1), mcoff, mcon,
                          overhead(mcoff, mcon, 0));
    }
    bench_json_close(&js);
    if (errors)
        fprintf(stderr, "%d errors (submission, fence or wrong result)\n", errors);
    return errors ? 1 : 0;
}
