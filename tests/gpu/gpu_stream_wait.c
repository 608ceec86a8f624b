/* GPU-side waits (ccq_nccl_stream_wait) on a real GPU: a loop of "compute" on a CUDA stream
 * (plain CUDA runtime calls, no kernels: a memset produces the all_reduce's input, copies of
 * the result stand for a kernel that reads it) around an all_reduce, ordered only on the
 * GPU: the stream is bound (the all_reduce waits for the input) and ccq_nccl_stream_wait
 * makes the reads wait for the all_reduce; no host fence inside the loop. Every read is
 * checked against the reference afterwards. Iterations alternate between two pairs of
 * buffers, so consecutive all_reduces have no hazard between them and the scheduler may
 * put them in one batch: an all_reduce submitted after a GPU-side wait must still never
 * share a batch with the one the wait covers (its submission event follows the wait, and
 * the batch would wait for itself: a GPU hang). Run it also with
 * CUDA_DEVICE_MAX_CONNECTIONS=1 (bench/gpu-check.sh does). Then the same loop with the blocking
 * fence (ccq_sync_collective) for comparison, the host time of ccq_nccl_stream_wait, and a wait
 * released by a failure (a lone part the watchdog times out). Exits 77 without a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ccq/ccq_nccl.h"
#include "gpu_common.h"

#define PROG "gpu_stream_wait"

static const ccq_device_id one[1] = {0};
static const ccq_device_id pair[2] = {0, 1};

enum { SAMPLE = 4096, REGIONS = 3 };

static unsigned iters(unsigned dflt)
{
    const char *v = getenv("CCQ_TEST_ITERS");
    if (v != NULL && *v != '\0') {
        unsigned long x = strtoul(v, NULL, 10);
        if (x > 0 && x < 100000)
            return (unsigned)x;
    }
    return dflt;
}

/* The input byte of rank r in iteration it (memset): sums of two stay below 256. */
static unsigned char in_byte(unsigned it, unsigned r)
{
    return (unsigned char)(1u + (it * 7u + r * 61u) % 120u);
}

/* Where the samples of the result are read: the start, the middle and the end. */
static size_t region_at(size_t count, int k)
{
    return k == 0 ? 0 : k == 1 ? count / 2 - SAMPLE / 2 : count - SAMPLE;
}

/*
 * n iterations on ranks 0..nranks-1 (one thread submits for all: the all_reduce of the
 * ranks is one collective). Per iteration and rank, on that rank's compute stream:
 * memset(src) -> all_reduce(src -> dst) -> [GPU-side wait or blocking fence] -> copy the
 * samples of dst into snap[it]. Returns the loop's time in ms, and counts wrong samples.
 */
static double run_loop(ccq_runtime *rt, int nranks, cudaStream_t *cs, void *src[2][2],
                       void *dst[2][2], uint32_t **snap, size_t count, unsigned n, int gpu_side,
                       double *wait_ns)
{
    uint64_t t0 = gpu_now_ns(), wsum = 0;
    const ccq_device_id *set = nranks == 1 ? one : pair;
    size_t bytes = count * sizeof(uint32_t);

    for (unsigned it = 0; it < n; it++) {
        for (int r = 0; r < nranks; r++) {
            CUDA_REQUIRE(cudaSetDevice(r));
            CUDA_REQUIRE(cudaMemsetAsync(src[it % 2][r], in_byte(it, (unsigned)r), bytes, cs[r]));
            if (!CCQ_EXPECT_OK(ccq_all_reduce(rt, (ccq_device_id)r, 0, src[it % 2][r],
                                              dst[it % 2][r], count, CCQ_UINT32, CCQ_SUM, set,
                                              (size_t)nranks)))
                return -1;
        }
        for (int r = 0; r < nranks; r++) {
            if (gpu_side) {
                uint64_t w0 = gpu_now_ns();
                if (!CCQ_EXPECT_OK(ccq_nccl_stream_wait(rt, (ccq_device_id)r, 0, cs[r])))
                    return -1;
                wsum += gpu_now_ns() - w0;
            } else if (!CCQ_EXPECT_OK(ccq_sync_collective(rt, (ccq_device_id)r, 0))) {
                return -1;
            }
            CUDA_REQUIRE(cudaSetDevice(r));
            for (int k = 0; k < REGIONS; k++)
                CUDA_REQUIRE(cudaMemcpyAsync(snap[r] + ((size_t)it * REGIONS + (size_t)k) * SAMPLE,
                                             (uint32_t *)dst[it % 2][r] + region_at(count, k),
                                             SAMPLE * sizeof(uint32_t), cudaMemcpyDeviceToDevice,
                                             cs[r]));
        }
    }
    for (int r = 0; r < nranks; r++)
        CUDA_REQUIRE(cudaStreamSynchronize(cs[r]));
    if (wait_ns != NULL)
        *wait_ns = n ? (double)wsum / ((double)n * nranks) : 0;
    return gpu_since_ms(t0);
}

static unsigned check_snaps(int nranks, uint32_t **snap, unsigned n, const char *label)
{
    size_t per = (size_t)n * REGIONS * SAMPLE;
    uint32_t *h = malloc(per * sizeof *h);
    unsigned bad = 0;

    if (h == NULL) {
        gpu_fail_at(__FILE__, __LINE__, "out of host memory");
        return 1;
    }
    for (int r = 0; r < nranks; r++) {
        gpu_to_host(r, h, snap[r], per * sizeof *h);
        for (unsigned it = 0; it < n; it++) {
            unsigned b = 0;
            for (int q = 0; q < nranks; q++)
                b += in_byte(it, (unsigned)q);
            uint32_t want = b * 0x01010101u;
            for (size_t i = 0; i < (size_t)REGIONS * SAMPLE; i++) {
                uint32_t got = h[(size_t)it * REGIONS * SAMPLE + i];
                if (got != want) {
                    if (bad++ < 3)
                        gpu_fail_at(__FILE__, __LINE__,
                                    "%s: rank %d iteration %u: sample %zu read 0x%08x, want "
                                    "0x%08x (the read did not wait for the all_reduce)",
                                    label, r, it, i, got, want);
                    break;
                }
            }
        }
    }
    free(h);
    return bad;
}

/* A lone part (its peer never submits): the watchdog fails it, and the GPU-side wait queued
 * for it is released; the host fence reports the timeout. */
static void released_by_failure(int ndev)
{
    if (ndev < 2) {
        printf("note: 1 GPU: the released-by-failure check needs 2 and was not run\n");
        return;
    }
    gpu_section("a wait released by a failed command (watchdog, 1 s)");
    ccq_runtime *rt = gpu_runtime(1000, 0);
    gpu_comm_init(rt, pair, 2);
    void *src = gpu_dev_alloc(0, 4096), *dst = gpu_dev_alloc(0, 4096);
    cudaStream_t s;
    CUDA_REQUIRE(cudaSetDevice(0));
    CUDA_REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CCQ_EXPECT_OK(ccq_all_reduce(rt, 0, 3, src, dst, 1024, CCQ_UINT32, CCQ_SUM, pair, 2));
    CCQ_EXPECT_OK(ccq_nccl_stream_wait(rt, 0, 3, s));
    uint64_t t0 = gpu_now_ns();
    cudaError_t q = cudaErrorNotReady;
    while ((q = cudaStreamQuery(s)) == cudaErrorNotReady && gpu_since_ms(t0) < 20000)
        gpu_sleep_ms(5);
    EXPECT(q == cudaSuccess, "the waiting stream was not released (%s)", cudaGetErrorName(q));
    ccq_status st = ccq_sync_collective(rt, 0, 3);
    EXPECT(st == CCQ_ERR_TIMEOUT, "fence after the failure: %s (%s)", gpu_st(st),
           ccq_last_error_detail());
    if (q == cudaSuccess && st == CCQ_ERR_TIMEOUT)
        printf("ok   the waiting stream was released %.0f ms after the call; the fence said "
               "CCQ_ERR_TIMEOUT\n",
               gpu_since_ms(t0));
    CCQ_EXPECT_OK(ccq_runtime_destroy(rt));
    CUDA_REQUIRE(cudaStreamDestroy(s));
    gpu_dev_free(0, src);
    gpu_dev_free(0, dst);
}

int main(void)
{
    int ndev = gpu_init(PROG, 200);
    int nranks = ndev >= 2 ? 2 : 1;
    unsigned n = iters(100);
    size_t count = (size_t)8 << 20; /* 32 MiB per rank: the reads would catch a partial result */
    cudaStream_t cs[2];
    void *src[2][2], *dst[2][2]; /* [iteration parity][rank] */
    uint32_t *snap[2];

    ccq_runtime *rt = gpu_runtime(30000, 0);
    gpu_comm_init(rt, one, 1);
    if (nranks == 2)
        gpu_comm_init(rt, pair, 2);
    gpu_section("GPU-side waits supported?");
    CUDA_REQUIRE(cudaSetDevice(0));
    CUDA_REQUIRE(cudaStreamCreateWithFlags(&cs[0], cudaStreamNonBlocking));
    ccq_status st = ccq_nccl_stream_wait(rt, 0, 7, cs[0]);
    if (st == CCQ_ERR_UNSUPPORTED) {
        printf("SKIP " PROG ": GPU-side waits unsupported here: %s\n", ccq_last_error_detail());
        ccq_runtime_destroy(rt);
        return GPU_EXIT_SKIP;
    }
    CCQ_EXPECT_OK(st);
    for (int r = 0; r < nranks; r++) {
        if (r > 0) {
            CUDA_REQUIRE(cudaSetDevice(r));
            CUDA_REQUIRE(cudaStreamCreateWithFlags(&cs[r], cudaStreamNonBlocking));
        }
        for (int p = 0; p < 2; p++) {
            src[p][r] = gpu_dev_alloc(r, count * sizeof(uint32_t));
            dst[p][r] = gpu_dev_alloc(r, count * sizeof(uint32_t));
        }
        snap[r] = gpu_dev_alloc(r, (size_t)n * REGIONS * SAMPLE * sizeof(uint32_t));
        if (!CCQ_EXPECT_OK(ccq_nccl_bind_stream(rt, (ccq_device_id)r, 0, cs[r])))
            return gpu_finish(PROG);
    }

    double wait_ns = 0;
    gpu_section("%d rank(s): %u iterations of memset / all_reduce / ccq_nccl_stream_wait / reads",
                nranks, n);
    double t_gpu = run_loop(rt, nranks, cs, src, dst, snap, count, n, 1, &wait_ns);
    unsigned bad = t_gpu < 0 ? 1 : check_snaps(nranks, snap, n, "GPU-side wait");
    if (bad == 0)
        printf("ok   GPU-side wait: %u iterations, %.3f ms each; ccq_nccl_stream_wait took %.0f ns "
               "of host time per call\n",
               n, t_gpu / n, wait_ns);
    for (int r = 0; r < nranks; r++)
        CCQ_EXPECT_OK(ccq_sync_collective(rt, (ccq_device_id)r, 0));

    gpu_section("the same loop with the blocking fence (ccq_sync_collective)");
    double t_blk = run_loop(rt, nranks, cs, src, dst, snap, count, n, 0, NULL);
    bad = t_blk < 0 ? 1 : check_snaps(nranks, snap, n, "blocking fence");
    if (bad == 0)
        printf("ok   blocking fence: %u iterations, %.3f ms each (GPU-side wait: %.2fx)\n", n,
               t_blk / n, t_gpu > 0 ? t_blk / t_gpu : 0.0);

    gpu_section("shutdown");
    CCQ_EXPECT_OK(ccq_runtime_destroy(rt));
    for (int r = 0; r < nranks; r++) {
        for (int p = 0; p < 2; p++) {
            gpu_dev_free(r, src[p][r]);
            gpu_dev_free(r, dst[p][r]);
        }
        gpu_dev_free(r, snap[r]);
        CUDA_REQUIRE(cudaStreamDestroy(cs[r]));
    }
    released_by_failure(ndev);
    return gpu_finish(PROG);
}
