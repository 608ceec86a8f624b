/* Host time of ccq_nccl_stream_wait, on the NCCL backend against the fake CUDA/NCCL of
 * tests/fake (no GPU needed): per call, on a stream whose work is done and on one whose
 * command is not even issued (the call must not wait for it). The fake's own cost (one
 * mutex, a log entry per call, its queue) is included; on a GPU the driver's
 * cuStreamWaitValue64 replaces it (tests/gpu/gpu_stream_wait prints that time). */
#define _GNU_SOURCE
#include "bench_common.h"
#include "ccq/ccq_nccl.h"
#include "fake/fake_cuda_nccl.h"

static double per_call_ns(ccq_runtime *rt, ccq_stream_id stream, cudaStream_t us, long n,
                          int *errors)
{
    double v[7];
    for (int r = 0; r < 7; r++) {
        uint64_t t0 = bench_now_ns();
        for (long i = 0; i < n; i++)
            *errors += ccq_nccl_stream_wait(rt, 0, stream, us) != CCQ_OK;
        v[r] = (double)(bench_now_ns() - t0) / (double)n;
        fake_log_reset();
    }
    return bench_median(v, 7);
}

int main(int argc, char **argv)
{
    long n = bench_opt(argc, argv, "--iters", 20000);
    ccq_device_id p01[2] = {0, 1};
    float x[2][16] = {{0}};
    ccq_config cfg;
    ccq_runtime *rt;
    bench_json js;
    int errors = 0;

    ccq_config_init(&cfg);
    cfg.backend = "nccl";
    if (ccq_runtime_create(&cfg, &rt) != CCQ_OK) {
        fprintf(stderr, "create: %s\n", ccq_last_error_detail());
        return 1;
    }
    bench_json_open(&js, argc, argv, "stream_wait_fake");
    cudaStream_t us = fake_user_stream(0);
    errors += ccq_comm_init(rt, p01, 2) != CCQ_OK;
    /* Stream 0: one completed all_reduce. */
    for (ccq_device_id d = 0; d < 2; d++)
        errors += ccq_all_reduce(rt, d, 0, x[d], x[d], 16, CCQ_FLOAT32, CCQ_SUM, p01, 2) != CCQ_OK;
    for (ccq_device_id d = 0; d < 2; d++)
        errors += ccq_sync_collective(rt, d, 0) != CCQ_OK;
    double t_done = per_call_ns(rt, 0, us, n, &errors);
    /* Stream 1: a lone part, never issued while the calls run; a second user stream, whose
     * queue of held-back waits grows (the fake keeps them until released). */
    cudaStream_t us2 = fake_user_stream(0);
    errors += ccq_all_reduce(rt, 0, 1, x[0], x[0], 16, CCQ_FLOAT32, CCQ_SUM, p01, 2) != CCQ_OK;
    long np = n / 10 > 0 ? n / 10 : 1;
    double t_pend = per_call_ns(rt, 1, us2, np, &errors);
    size_t held = fake_stream_pending(us2);
    errors += ccq_all_reduce(rt, 1, 1, x[1], x[1], 16, CCQ_FLOAT32, CCQ_SUM, p01, 2) != CCQ_OK;
    for (ccq_device_id d = 0; d < 2; d++)
        errors += ccq_sync_collective(rt, d, 1) != CCQ_OK;
    size_t left = fake_stream_pending(us2);

    printf("# ccq_nccl_stream_wait host time per call, fake CUDA (ns, median of 7 rounds)\n");
    printf("  %-46s %8.1f\n", "work done", t_done);
    printf("  %-46s %8.1f\n", "command not issued (the wait is queued)", t_pend);
    printf("  waits held back while pending: %zu; after the fence: %zu\n", held, left);
    bench_json_record(&js, "\"done_ns\": %.1f, \"pending_ns\": %.1f, \"held\": %zu", t_done, t_pend,
                      held);
    bench_json_close(&js);
    ccq_runtime_destroy(rt);
    return errors || left != 0 ? 1 : 0;
}
