/* Launches serialized per device, on the NCCL backend against the fake CUDA/NCCL of
 * tests/fake (no GPU needed). Every NCCL group launches non-blocking: ncclGroupEnd returns
 * ncclInProgress (as NCCL does for non-blocking communicators) and the launch lasts
 * --launch-us microseconds (default 100). An all_reduce A over devices 0-2 on stream 0,
 * then, once A's group was launched, an all_reduce B over the same devices on stream 1 and
 * 20 us later a one-device all_reduce C on device 3: B's batch finds A's launch in progress on its
 * devices and waits for it; C shares no device with them. Prints each one's latency
 * (submission to its fence's return), median of --iters rounds. Before issue 26 item 5 the
 * scheduler slept in 100 us steps inside B's issue until A's launch ended, and C waited for
 * that too; now B waits in the backend, is launched at the poll (every ~20 us) after A's
 * launch ended, and C goes at once.
 * Usage: bench_launch_fake [--iters N] [--launch-us U] [--json FILE]. */
#define _GNU_SOURCE
#include "bench_common.h"
#include "ccq.h"
#include "fake/fake_cuda_nccl.h"

enum { NDEV = 3, COUNT = 16 };

int main(int argc, char **argv)
{
    long n = bench_opt(argc, argv, "--iters", 200);
    long launch_us = bench_opt(argc, argv, "--launch-us", 100);
    ccq_device_id all[NDEV] = {0, 1, 2}, d3[1] = {3};
    static float a[NDEV][COUNT], b[NDEV][COUNT], c[COUNT];
    double *alone = calloc((size_t)n, sizeof *alone), *behind = calloc((size_t)n, sizeof *behind);
    double *other = calloc((size_t)n, sizeof *other);
    ccq_config cfg;
    ccq_runtime *rt;
    bench_json js;
    int errors = 0;

    if (alone == NULL || behind == NULL || other == NULL)
        return 1;
    fake_set_devices(NDEV + 1, 9);
    ccq_config_init(&cfg);
    cfg.backend = "nccl";
    cfg.max_streams = 2;
    if (ccq_runtime_create(&cfg, &rt) != CCQ_OK) {
        fprintf(stderr, "create: %s\n", ccq_last_error_detail());
        return 1;
    }
    bench_json_open(&js, argc, argv, "launch_fake");
    errors += ccq_comm_init(rt, all, NDEV) != CCQ_OK;
    errors += ccq_comm_init(rt, d3, 1) != CCQ_OK;
    fake_set_launch_in_progress(true, launch_us);
    for (long i = 0; i < n; i++) {
        /* A alone. */
        uint64_t t0 = bench_now_ns();
        for (ccq_device_id d = 0; d < NDEV; d++)
            errors += ccq_all_reduce(rt, d, 0, a[d], a[d], COUNT, CCQ_FLOAT32, CCQ_SUM, all,
                                     NDEV) != CCQ_OK;
        for (ccq_device_id d = 0; d < NDEV; d++)
            errors += ccq_sync_collective(rt, d, 0) != CCQ_OK;
        alone[i] = (double)(bench_now_ns() - t0) / 1e3;
        /* A, then B right behind it, once A's group was launched (still in progress). */
        size_t groups = fake_log_count("ncclGroupEnd");
        for (ccq_device_id d = 0; d < NDEV; d++)
            errors += ccq_all_reduce(rt, d, 0, a[d], a[d], COUNT, CCQ_FLOAT32, CCQ_SUM, all,
                                     NDEV) != CCQ_OK;
        while (fake_log_count("ncclGroupEnd") == groups)
            ;
        t0 = bench_now_ns();
        for (ccq_device_id d = 0; d < NDEV; d++)
            errors += ccq_all_reduce(rt, d, 1, b[d], b[d], COUNT, CCQ_FLOAT32, CCQ_SUM, all,
                                     NDEV) != CCQ_OK;
        /* C a little later, so that it is not found in B's pass (one batch with B). */
        while (bench_now_ns() - t0 < 20000)
            ;
        uint64_t t1 = bench_now_ns();
        errors += ccq_all_reduce(rt, 3, 0, c, c, COUNT, CCQ_FLOAT32, CCQ_SUM, d3, 1) != CCQ_OK;
        errors += ccq_sync_collective(rt, 3, 0) != CCQ_OK;
        other[i] = (double)(bench_now_ns() - t1) / 1e3;
        for (ccq_device_id d = 0; d < NDEV; d++)
            errors += ccq_sync_collective(rt, d, 1) != CCQ_OK;
        behind[i] = (double)(bench_now_ns() - t0) / 1e3;
        for (ccq_device_id d = 0; d < NDEV; d++)
            errors += ccq_sync_collective(rt, d, 0) != CCQ_OK;
    }
    double m_alone = bench_median(alone, (size_t)n), m_behind = bench_median(behind, (size_t)n);
    double m_other = bench_median(other, (size_t)n);
    printf("# all_reduce of %d floats (A, B over devices 0-2, C on device 3), every launch "
           "ncclInProgress for %ld us; latency in us, median of %ld\n",
           COUNT, launch_us, n);
    printf("  %-52s %8.1f\n", "A alone (submit to fence)", m_alone);
    printf("  %-52s %8.1f\n", "B right behind A's launch, on another stream", m_behind);
    printf("  %-52s %8.1f\n", "C on device 3 alone, submitted 20 us after B", m_other);
    bench_json_record(&js,
                      "\"alone_us\": %.1f, \"behind_us\": %.1f, \"other_us\": %.1f, "
                      "\"launch_us\": %ld",
                      m_alone, m_behind, m_other, launch_us);
    bench_json_close(&js);
    ccq_runtime_destroy(rt);
    free(alone);
    free(behind);
    free(other);
    return errors ? 1 : 0;
}
