/* What ccq costs on top of NCCL, on every GPU of the machine (one rank per GPU):
 * (a) ccq all_reduce + fence against ncclAllReduce + cudaStreamSynchronize, float32 sum,
 *     8 B to 64 MiB, median host wall time per operation;
 * (b) 1000 one-element all_reduces then one fence, with the default max_batch_ops and with
 *     max_batch_ops = 1 (ccq_get_stats batches), against NCCL called once per op and in one
 *     group.
 * Usage: gpu_overhead [iterations]   (or CCQ_BENCH_ITERS; default 200). Exits 77 without a
 * GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

#include "gpu_common.h"

#define PROG       "gpu_overhead"
#define MAX_DEV    8
#define MAX_BYTES  ((size_t)64 << 20)
#define SMALL_OPS  1000
#define SMALL_REPS 7

#define NCCL_REQUIRE(call)                                                                         \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess) {                                                                   \
            printf("FAIL %s: %s: NCCL error '%s' (%d): %s\n", PROG, #call, ncclGetErrorString(r_), \
                   (int)r_, ncclGetLastError(NULL));                                               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define CCQ_REQUIRE(call)                                                                          \
    do {                                                                                           \
        ccq_status s_ = (call);                                                                    \
        if (s_ != CCQ_OK) {                                                                        \
            printf("FAIL %s: %s: %s: %s\n", PROG, #call, ccq_status_name(s_),                      \
                   ccq_last_error_detail());                                                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static int ndev;
static ccq_device_id devs[MAX_DEV];
static int devlist[MAX_DEV];
static ncclComm_t comms[MAX_DEV];
static cudaStream_t streams[MAX_DEV];
static float *src[MAX_DEV], *dst[MAX_DEV];

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static const char *size_str(size_t bytes, char *buf, size_t len)
{
    if (bytes >= ((size_t)1 << 20))
        snprintf(buf, len, "%zu MiB", bytes >> 20);
    else if (bytes >= 1024)
        snprintf(buf, len, "%zu KiB", bytes >> 10);
    else
        snprintf(buf, len, "%zu B", bytes);
    return buf;
}

/* One ccq all_reduce over all devices, then the fence of every device; microseconds. */
static double ccq_once(ccq_runtime *rt, size_t off, size_t count)
{
    uint64_t t0 = gpu_now_ns();
    for (int d = 0; d < ndev; d++)
        CCQ_REQUIRE(ccq_all_reduce(rt, devs[d], 0, src[d] + off, dst[d] + off, count, CCQ_FLOAT32,
                                   CCQ_SUM, devs, (size_t)ndev));
    for (int d = 0; d < ndev; d++)
        CCQ_REQUIRE(ccq_sync_collective(rt, devs[d], 0));
    return (double)(gpu_now_ns() - t0) / 1e3;
}

/* The same with NCCL directly: one group over the devices, then synchronize each stream. */
static double nccl_once(size_t off, size_t count)
{
    uint64_t t0 = gpu_now_ns();
    NCCL_REQUIRE(ncclGroupStart());
    for (int d = 0; d < ndev; d++)
        NCCL_REQUIRE(ncclAllReduce(src[d] + off, dst[d] + off, count, ncclFloat32, ncclSum,
                                   comms[d], streams[d]));
    NCCL_REQUIRE(ncclGroupEnd());
    for (int d = 0; d < ndev; d++)
        CUDA_REQUIRE(cudaStreamSynchronize(streams[d]));
    return (double)(gpu_now_ns() - t0) / 1e3;
}

static void check_result(size_t count, const char *what)
{
    float first = 0, last = 0;
    for (int d = 0; d < ndev; d++) {
        CUDA_REQUIRE(cudaMemcpy(&first, dst[d], sizeof first, cudaMemcpyDefault));
        CUDA_REQUIRE(cudaMemcpy(&last, dst[d] + count - 1, sizeof last, cudaMemcpyDefault));
        if (first != (float)ndev || last != (float)ndev) {
            printf("FAIL %s: %s: device %d: dst[0] = %g, dst[%zu] = %g, want %d\n", PROG, what, d,
                   (double)first, count - 1, (double)last, ndev);
            exit(1);
        }
    }
}

static void clear_dst(void)
{
    for (int d = 0; d < ndev; d++) {
        CUDA_REQUIRE(cudaSetDevice(d));
        CUDA_REQUIRE(cudaMemset(dst[d], 0, MAX_BYTES));
        CUDA_REQUIRE(cudaDeviceSynchronize());
    }
    CUDA_REQUIRE(cudaSetDevice(0));
}

static void part_a(ccq_runtime *rt, int iters)
{
    double *tc = malloc((size_t)iters * sizeof *tc), *tn = malloc((size_t)iters * sizeof *tn);
    /* Fewer iterations for the large sizes (their time is bandwidth, not overhead). */
    int big = iters / 4 > 20 ? iters / 4 : iters < 20 ? iters : 20;
    char sz[32];

    if (tc == NULL || tn == NULL) {
        printf("FAIL %s: out of host memory\n", PROG);
        exit(1);
    }
    printf("\n(a) all_reduce float32 sum over %d rank(s): ccq all_reduce + fence vs "
           "ncclAllReduce + cudaStreamSynchronize\n",
           ndev);
    printf("    host wall time per operation, median of %d (%d for >= 16 MiB), after warm-up\n",
           iters, big);
    printf("    %8s %10s %10s %12s %7s\n", "size", "ccq_us", "nccl_us", "overhead_us", "ratio");
    for (size_t bytes = 8;; bytes = bytes * 8 > MAX_BYTES ? MAX_BYTES : bytes * 8) {
        size_t count = bytes / sizeof(float);
        int n = bytes >= ((size_t)16 << 20) ? big : iters;
        double mc, mn;

        gpu_phase("(a) %s", size_str(bytes, sz, sizeof sz));
        for (int w = 0; w < 10; w++) {
            ccq_once(rt, 0, count);
            nccl_once(0, count);
        }
        /* Both write dst: check each one's result on its own. */
        clear_dst();
        ccq_once(rt, 0, count);
        check_result(count, "(a) ccq after warm-up");
        clear_dst();
        nccl_once(0, count);
        check_result(count, "(a) ncclAllReduce after warm-up");
        /* Interleaved, so drift (clocks, other load) hits both alike. */
        for (int i = 0; i < n; i++) {
            tc[i] = ccq_once(rt, 0, count);
            tn[i] = nccl_once(0, count);
        }
        mc = median(tc, n);
        mn = median(tn, n);
        printf("    %8s %10.1f %10.1f %12.1f %7.2f\n", size_str(bytes, sz, sizeof sz), mc, mn,
               mc - mn, mn > 0 ? mc / mn : 0.0);
        if (bytes == MAX_BYTES)
            break;
    }
    free(tc);
    free(tn);
}

/* 1000 one-element all_reduces on distinct elements (no hazards: they may share batches),
 * then one fence per device. */
static void small_ccq(uint32_t max_batch_ops, const char *label)
{
    ccq_runtime *rt = gpu_runtime(60000, max_batch_ops);
    double t[SMALL_REPS];
    uint64_t batches = 0, maxb = 0;

    gpu_phase("(b) %s", label);
    gpu_comm_init(rt, devs, (size_t)ndev);
    for (int rep = -2; rep < SMALL_REPS; rep++) { /* two warm-up rounds */
        ccq_stats s0 = {.struct_size = sizeof s0}, s1 = {.struct_size = sizeof s1};
        uint64_t t0;
        CCQ_REQUIRE(ccq_get_stats(rt, &s0));
        t0 = gpu_now_ns();
        for (size_t i = 0; i < SMALL_OPS; i++)
            for (int d = 0; d < ndev; d++)
                CCQ_REQUIRE(ccq_all_reduce(rt, devs[d], 0, src[d] + i, dst[d] + i, 1, CCQ_FLOAT32,
                                           CCQ_SUM, devs, (size_t)ndev));
        for (int d = 0; d < ndev; d++)
            CCQ_REQUIRE(ccq_sync_collective(rt, devs[d], 0));
        if (rep >= 0) {
            t[rep] = (double)(gpu_now_ns() - t0) / 1e3;
            CCQ_REQUIRE(ccq_get_stats(rt, &s1));
            batches += s1.batches - s0.batches;
            if (s1.max_batch_ops > maxb)
                maxb = s1.max_batch_ops;
        }
    }
    check_result(SMALL_OPS, label);
    {
        double m = median(t, SMALL_REPS), b = (double)batches / SMALL_REPS;
        printf("    %-28s %10.1f %10.0f %9.1f %9.1f %8llu\n", label, m, SMALL_OPS / (m / 1e6), b,
               b > 0 ? SMALL_OPS / b : 0.0, (unsigned long long)maxb);
    }
    CCQ_REQUIRE(ccq_runtime_destroy(rt));
}

static void small_nccl(int grouped, const char *label)
{
    double t[SMALL_REPS];

    gpu_phase("(b) %s", label);
    for (int rep = -2; rep < SMALL_REPS; rep++) {
        uint64_t t0 = gpu_now_ns();
        if (grouped)
            NCCL_REQUIRE(ncclGroupStart());
        for (size_t i = 0; i < SMALL_OPS; i++) {
            if (!grouped && ndev > 1)
                NCCL_REQUIRE(ncclGroupStart());
            for (int d = 0; d < ndev; d++)
                NCCL_REQUIRE(ncclAllReduce(src[d] + i, dst[d] + i, 1, ncclFloat32, ncclSum,
                                           comms[d], streams[d]));
            if (!grouped && ndev > 1)
                NCCL_REQUIRE(ncclGroupEnd());
        }
        if (grouped)
            NCCL_REQUIRE(ncclGroupEnd());
        for (int d = 0; d < ndev; d++)
            CUDA_REQUIRE(cudaStreamSynchronize(streams[d]));
        if (rep >= 0)
            t[rep] = (double)(gpu_now_ns() - t0) / 1e3;
    }
    check_result(SMALL_OPS, label);
    {
        double m = median(t, SMALL_REPS);
        printf("    %-28s %10.1f %10.0f %9s %9s %8s\n", label, m, SMALL_OPS / (m / 1e6), "-", "-",
               "-");
    }
}

static void part_b(void)
{
    ccq_config dflt;
    char label[64];

    ccq_config_init(&dflt);
    printf("\n(b) %d x 1-element float32 all_reduce over %d rank(s), then one fence; median of "
           "%d\n",
           SMALL_OPS, ndev, SMALL_REPS);
    printf("    %-28s %10s %10s %9s %9s %8s\n", "mode", "total_us", "ops/s", "batches", "ops/batch",
           "max_ops");
    clear_dst();
    snprintf(label, sizeof label, "ccq max_batch_ops=%u", dflt.max_batch_ops);
    small_ccq(0, label);
    clear_dst();
    small_ccq(1, "ccq max_batch_ops=1");
    clear_dst();
    small_nccl(0, "nccl, one call per op");
    clear_dst();
    small_nccl(1, "nccl, all in one group");
}

int main(int argc, char **argv)
{
    const char *env = getenv("CCQ_BENCH_ITERS");
    int iters = argc > 1 ? atoi(argv[1]) : env != NULL ? atoi(env) : 200;
    int nccl_version = 0;
    float *ones;
    ccq_runtime *rt;
    uint64_t t0 = gpu_now_ns();

    ndev = gpu_init(PROG, 280);
    gpu_quiet = 1; /* the self-timeout still names the phase */
    if (ndev > MAX_DEV)
        ndev = MAX_DEV;
    if (iters < 5)
        iters = 5;
    NCCL_REQUIRE(ncclGetVersion(&nccl_version));
    printf("%s: NCCL %d, %d rank(s), one per GPU\n", PROG, nccl_version, ndev);

    gpu_phase("setup");
    ones = malloc(MAX_BYTES);
    if (ones == NULL) {
        printf("FAIL %s: out of host memory\n", PROG);
        return 1;
    }
    for (size_t i = 0; i < MAX_BYTES / sizeof(float); i++)
        ones[i] = 1.0f;
    for (int d = 0; d < ndev; d++) {
        devs[d] = (ccq_device_id)d;
        devlist[d] = d;
        CUDA_REQUIRE(cudaSetDevice(d));
        CUDA_REQUIRE(cudaStreamCreateWithFlags(&streams[d], cudaStreamNonBlocking));
        src[d] = gpu_dev_alloc(d, MAX_BYTES);
        dst[d] = gpu_dev_alloc(d, MAX_BYTES);
        gpu_to_dev(d, src[d], ones, MAX_BYTES);
    }
    free(ones);
    CUDA_REQUIRE(cudaSetDevice(0));
    NCCL_REQUIRE(ncclCommInitAll(comms, ndev, devlist));
    rt = gpu_runtime(60000, 0);
    gpu_comm_init(rt, devs, (size_t)ndev);

    part_a(rt, iters);
    CCQ_REQUIRE(ccq_runtime_destroy(rt));
    part_b();

    gpu_phase("cleanup");
    for (int d = 0; d < ndev; d++) {
        NCCL_REQUIRE(ncclCommDestroy(comms[d]));
        gpu_dev_free(d, src[d]);
        gpu_dev_free(d, dst[d]);
        CUDA_REQUIRE(cudaSetDevice(d));
        CUDA_REQUIRE(cudaStreamDestroy(streams[d]));
    }
    printf("\n%s: done in %.1f s\n", PROG, gpu_since_ms(t0) / 1e3);
    return 0;
}
