/* Small-op latency when launches wait for each other, on a GPU (issue 26 item 5). NCCL
 * launches each non-blocking group on a thread of its own, so ccq launches a batch only once
 * every earlier launch on its devices finished. All on communicator {0} (one rank: runs on
 * any machine with a GPU), 4-byte all_reduces:
 *   A alone: submit, fence (the reference);
 *   B on stream 1 submitted right after A on stream 0: it waits for A's launch;
 *   C on communicator {1} (2 GPUs or more), submitted 20 us after B: shares no device.
 * Latency = submission to its fence's return, median and p90 of N rounds. Before the fix
 * the scheduler slept in 100 us steps inside B's issue until A's launch ended (C waited for
 * that too); after, B waits in the backend and is launched at the next poll (~20 us), and C
 * goes at once. The program uses the public API only: bench/gpu-check.sh builds it once and
 * runs it against this tree's libccq and, with CCQ_GPU_CHECK_BASE=<rev>, an older one's.
 * Usage: gpu_launch_latency [rounds] (default 300). Exits 77 without a GPU. */
#include <stdio.h>
#include <stdlib.h>

#include "gpu_common.h"

#define PROG "gpu_launch_latency"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

static void spin_until(uint64_t t)
{
    while (gpu_now_ns() < t)
        ;
}

int main(int argc, char **argv)
{
    int ndev = gpu_init(PROG, 120);
    int n = argc > 1 ? atoi(argv[1]) : 300;
    static const ccq_device_id d0[1] = {0}, d1[1] = {1};
    double *alone, *behind, *other;
    void *a, *b, *c = NULL;

    if (n < 10)
        n = 10;
    alone = calloc((size_t)n, sizeof *alone);
    behind = calloc((size_t)n, sizeof *behind);
    other = calloc((size_t)n, sizeof *other);
    if (alone == NULL || behind == NULL || other == NULL)
        return 1;
    ccq_runtime *rt = gpu_runtime(30000, 0);
    gpu_comm_init(rt, d0, 1);
    if (ndev >= 2)
        gpu_comm_init(rt, d1, 1);
    a = gpu_dev_alloc(0, 4);
    b = gpu_dev_alloc(0, 4);
    if (ndev >= 2)
        c = gpu_dev_alloc(1, 4);
    gpu_section("%d rounds: A alone; B right behind A; C on another GPU", n);
    for (int i = -20; i < n; i++) { /* 20 warm-up rounds */
        uint64_t t0 = gpu_now_ns();
        CCQ_EXPECT_OK(ccq_all_reduce(rt, 0, 0, a, a, 1, CCQ_FLOAT32, CCQ_SUM, d0, 1));
        CCQ_EXPECT_OK(ccq_sync_collective(rt, 0, 0));
        uint64_t t1 = gpu_now_ns();
        CCQ_EXPECT_OK(ccq_all_reduce(rt, 0, 0, a, a, 1, CCQ_FLOAT32, CCQ_SUM, d0, 1));
        uint64_t t2 = gpu_now_ns();
        CCQ_EXPECT_OK(ccq_all_reduce(rt, 0, 1, b, b, 1, CCQ_FLOAT32, CCQ_SUM, d0, 1));
        uint64_t t3 = 0, t4 = 0;
        if (c != NULL) {
            spin_until(t2 + 20000);
            t3 = gpu_now_ns();
            CCQ_EXPECT_OK(ccq_all_reduce(rt, 1, 0, c, c, 1, CCQ_FLOAT32, CCQ_SUM, d1, 1));
            CCQ_EXPECT_OK(ccq_sync_collective(rt, 1, 0));
            t4 = gpu_now_ns();
        }
        CCQ_EXPECT_OK(ccq_sync_collective(rt, 0, 1));
        uint64_t t5 = gpu_now_ns();
        CCQ_EXPECT_OK(ccq_sync_collective(rt, 0, 0));
        if (i >= 0) {
            alone[i] = (double)(t1 - t0) / 1e3;
            behind[i] = (double)(t5 - t2) / 1e3;
            other[i] = (double)(t4 - t3) / 1e3;
        }
    }
    printf("launch latency (us, median / p90): A alone %.1f / %.1f; B behind A's launch %.1f / "
           "%.1f",
           pct(alone, n, 0.5), pct(alone, n, 0.9), pct(behind, n, 0.5), pct(behind, n, 0.9));
    if (c != NULL)
        printf("; C on GPU 1 meanwhile %.1f / %.1f", pct(other, n, 0.5), pct(other, n, 0.9));
    printf("\n");
    CCQ_EXPECT_OK(ccq_runtime_destroy(rt));
    gpu_dev_free(0, a);
    gpu_dev_free(0, b);
    if (c != NULL)
        gpu_dev_free(1, c);
    free(alone);
    free(behind);
    free(other);
    return gpu_finish(PROG);
}
