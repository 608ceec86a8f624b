/* Dispatch latency: submit -> issued -> completed for a one-element all_reduce on 4 devices,
 * p50 and p99, with the scheduler awake (ops back to back) and after it went to sleep.
 * "Issued" is timestamped inside the host backend's issue() (a wrapper around the real
 * host backend); "completed" is when the fence returns to the submitting thread.
 * Then the host cost of fence values: ccq_fence_begin + ccq_fence_test when done, a test
 * while the work is pending, and a test whose answer is an error (the locked path). */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <unistd.h>

#include "bench_common.h"
#include "runtime/internal.h"

static _Atomic uint64_t issued_ns;
static ccq_backend_ops wrapped;

static ccq_status issue_stamped(ccq_backend *be, ccq_be_batch *b, ccq_errbuf *err)
{
    atomic_store_explicit(&issued_ns, ccq_now_ns(), memory_order_relaxed);
    return ccq_host_backend_ops.issue(be, b, err);
}

typedef struct lat {
    double *issue_us, *done_us;
} lat;

static int run(ccq_runtime *rt, int n, uint64_t gap_us, lat *out)
{
    ccq_device_id devs[4] = {0, 1, 2, 3};
    float buf[4] = {1, 2, 3, 4};
    int errors = 0;

    for (int i = 0; i < n; i++) {
        if (gap_us)
            usleep((useconds_t)gap_us);
        atomic_store(&issued_ns, 0);
        for (ccq_device_id d = 0; d < 4; d++)
            errors += ccq_all_reduce(rt, d, 0, &buf[d], &buf[d], 1, CCQ_FLOAT32, CCQ_MAX, devs,
                                     4) != CCQ_OK;
        uint64_t t0 = ccq_now_ns(); /* every part is queued: the op is submitted */
        for (ccq_device_id d = 0; d < 4; d++)
            errors += ccq_sync_collective(rt, d, 0) != CCQ_OK;
        uint64_t t2 = ccq_now_ns();
        uint64_t t1 = atomic_load(&issued_ns);
        /* The scheduler may issue before the submitting thread takes t0 (it runs on the
         * other core): count that as zero. */
        out->issue_us[i] = t1 > t0 ? (double)(t1 - t0) / 1e3 : 0.0;
        out->done_us[i] = (double)(t2 - t0) / 1e3;
    }
    return errors;
}

/* Median over `reps` rounds of the ns per iteration of `fn` run `n` times. */
typedef struct fence_case {
    ccq_runtime *rt;
    ccq_stream_id stream;
    ccq_fence f;
    int mode; /* 0: begin + test, 1: test only */
    ccq_status want;
} fence_case;

static double fence_ns(fence_case *c, long n, int reps, int *errors)
{
    double v[16];
    for (int r = 0; r < reps && r < 16; r++) {
        uint64_t t0 = bench_now_ns();
        for (long i = 0; i < n; i++) {
            ccq_fence f = c->f;
            if (c->mode == 0 && ccq_fence_begin(c->rt, 0, c->stream, &f) != CCQ_OK)
                (*errors)++;
            if (ccq_fence_test(c->rt, 0, c->stream, f) != c->want)
                (*errors)++;
        }
        v[r] = (double)(bench_now_ns() - t0) / (double)n;
    }
    return bench_median(v, (size_t)(reps < 16 ? reps : 16));
}

static int fence_values(ccq_runtime *rt, long n, bench_json *js)
{
    ccq_device_id devs[4] = {0, 1, 2, 3}, p01[2] = {0, 1};
    float buf[4] = {1, 2, 3, 4}, x[4] = {0};
    int errors = 0;

    /* Stream 1: some completed work. */
    for (ccq_device_id d = 0; d < 4; d++)
        errors +=
            ccq_all_reduce(rt, d, 1, &buf[d], &buf[d], 1, CCQ_FLOAT32, CCQ_MAX, devs, 4) != CCQ_OK;
    for (ccq_device_id d = 0; d < 4; d++)
        errors += ccq_sync_collective(rt, d, 1) != CCQ_OK;
    fence_case done = {rt, 1, 0, 0, CCQ_OK};
    double t_done = fence_ns(&done, n, 7, &errors);
    /* Stream 2: a lone part (device 1's never comes until the end): pending. */
    errors += ccq_comm_init(rt, p01, 2) != CCQ_OK;
    errors += ccq_all_reduce(rt, 0, 2, &x[0], &x[0], 1, CCQ_FLOAT32, CCQ_SUM, p01, 2) != CCQ_OK;
    fence_case pend = {rt, 2, 0, 1, CCQ_IN_PROGRESS};
    errors += ccq_fence_begin(rt, 0, 2, &pend.f) != CCQ_OK;
    double t_pend = fence_ns(&pend, n, 7, &errors);
    errors += ccq_all_reduce(rt, 1, 2, &x[1], &x[1], 1, CCQ_FLOAT32, CCQ_SUM, p01, 2) != CCQ_OK;
    errors += ccq_sync_collective(rt, 0, 2) != CCQ_OK;
    errors += ccq_sync_collective(rt, 1, 2) != CCQ_OK;
    /* Stream 3: a mismatch the value covers: the answer comes from the locked path. */
    errors += ccq_all_reduce(rt, 0, 3, &x[0], &x[0], 1, CCQ_FLOAT32, CCQ_SUM, p01, 2) != CCQ_OK;
    errors += ccq_all_reduce(rt, 1, 3, &x[1], &x[1], 1, CCQ_FLOAT32, CCQ_MAX, p01, 2) != CCQ_OK;
    fence_case err = {rt, 3, 0, 1, CCQ_ERR_MISMATCH};
    errors += ccq_fence_begin(rt, 0, 3, &err.f) != CCQ_OK;
    errors += ccq_fence_wait(rt, 0, 3, err.f, 10000) != CCQ_ERR_MISMATCH;
    double t_err = fence_ns(&err, n / 10 > 0 ? n / 10 : 1, 7, &errors);

    printf("# Fence values, host cost per call (ns, median of 7 rounds of %ld)\n", n);
    printf("  %-44s %8.1f\n", "ccq_fence_begin + ccq_fence_test, done", t_done);
    printf("  %-44s %8.1f\n", "ccq_fence_test, work pending", t_pend);
    printf("  %-44s %8.1f\n", "ccq_fence_test, answer an error (locked path)", t_err);
    bench_json_record(js,
                      "\"case\": \"fence_values\", \"begin_test_done_ns\": %.1f, "
                      "\"test_pending_ns\": %.1f, \"test_error_ns\": %.1f",
                      t_done, t_pend, t_err);
    return errors;
}

int main(int argc, char **argv)
{
    int n_awake = (int)bench_opt(argc, argv, "--awake", 20000);
    int n_sleep = (int)bench_opt(argc, argv, "--asleep", 1000);
    int gap = (int)bench_opt(argc, argv, "--gap-us", 2000);
    ccq_config cfg;
    ccq_runtime *rt;
    bench_json js;
    int errors = 0;

    wrapped = ccq_host_backend_ops;
    wrapped.issue = issue_stamped;
    ccq_config_init(&cfg);
    cfg.host_devices = 4;
    if (ccq_runtime_create_with(&cfg, &wrapped, &rt) != CCQ_OK) {
        fprintf(stderr, "create: %s\n", ccq_last_error_detail());
        return 1;
    }
    ccq_device_id devs[4] = {0, 1, 2, 3};
    ccq_comm_init(rt, devs, 4);
    bench_json_open(&js, argc, argv, "latency");

    printf("# Dispatch latency, one-element all_reduce on 4 devices (us)\n");
    printf("# %-22s %8s %8s %8s %8s %8s\n", "scheduler", "ops", "issue50", "issue99", "done50",
           "done99");
    for (int c = 0; c < 2; c++) {
        int n = c == 0 ? n_awake : n_sleep;
        lat l = {calloc((size_t)n, sizeof(double)), calloc((size_t)n, sizeof(double))};
        run(rt, n < 100 ? n : 100, c == 0 ? 0 : (uint64_t)gap, &l); /* warm-up */
        errors += run(rt, n, c == 0 ? 0 : (uint64_t)gap, &l);
        double i50 = bench_percentile(l.issue_us, (size_t)n, 50);
        double i99 = bench_percentile(l.issue_us, (size_t)n, 99);
        double d50 = bench_percentile(l.done_us, (size_t)n, 50);
        double d99 = bench_percentile(l.done_us, (size_t)n, 99);
        const char *name = c == 0 ? "awake (back to back)" : "asleep (2 ms idle gap)";
        printf("  %-22s %8d %8.2f %8.2f %8.2f %8.2f\n", name, n, i50, i99, d50, d99);
        bench_json_record(&js,
                          "\"case\": \"%s\", \"ops\": %d, \"issue_p50_us\": %.3f, "
                          "\"issue_p99_us\": %.3f, \"done_p50_us\": %.3f, \"done_p99_us\": %.3f",
                          c == 0 ? "awake" : "asleep", n, i50, i99, d50, d99);
        free(l.issue_us);
        free(l.done_us);
    }
    errors += fence_values(rt, bench_opt(argc, argv, "--fence-iters", 2000000), &js);
    bench_json_close(&js);
    ccq_runtime_destroy(rt);
    return errors ? 1 : 0;
}
