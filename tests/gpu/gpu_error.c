/* Error paths of the NCCL backend, each bounded in time: the watchdog (a send that never
 * gets its recv; with two GPUs, an all_reduce whose second rank never comes) returns
 * CCQ_ERR_TIMEOUT; mismatched parts return CCQ_ERR_MISMATCH; an issued batch stuck behind
 * a bound stream is aborted; an NCCL argument error (an invalid device pointer, caught with
 * NCCL_CHECK_POINTERS=1) reaches the fence with NCCL's message; and a fresh runtime still
 * works afterwards. Set CCQ_GPU_TEST_FAULT=1 to also provoke an out-of-bounds copy (a
 * sticky CUDA error; off by default). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ccq/ccq_nccl.h"
#include "gpu_common.h"

#define PROG "gpu_error"

static const ccq_device_id one[1] = {0};
static const ccq_device_id pair[2] = {0, 1};

/* Not a status: fence_expect accepts any error. */
#define ANY_ERROR ((ccq_status)1)

/* Fence (device, stream), expecting @p want (or ANY_ERROR) within [min_ms, max_ms] of
 * @p t0. Prints status, time and detail; returns the status. */
static ccq_status fence_expect(ccq_runtime *rt, ccq_device_id dev, ccq_stream_id stream,
                               ccq_status want, uint64_t t0, double min_ms, double max_ms,
                               const char *what)
{
    ccq_status st = ccq_sync_collective(rt, dev, stream);
    double ms = gpu_since_ms(t0);
    const char *detail = ccq_last_error_detail();

    printf("   %s: fence on device %u stream %u returned %s after %.0f ms%s%s\n", what, dev, stream,
           gpu_st(st), ms, st != CCQ_OK ? ": " : "", st != CCQ_OK ? detail : "");
    if (want == ANY_ERROR)
        EXPECT(st != CCQ_OK, "%s: want an error, got CCQ_OK", what);
    else
        EXPECT(st == want, "%s: want %s, got %s (%s)", what, gpu_st(want), gpu_st(st), detail);
    if (st != CCQ_OK)
        EXPECT(detail[0] != '\0', "%s: the error came without a detail", what);
    EXPECT(ms >= min_ms && ms <= max_ms, "%s: took %.0f ms, want %.0f to %.0f ms", what, ms, min_ms,
           max_ms);
    return st;
}

static void fill_f32(int dev, void *dst, size_t count, float base)
{
    float *h = malloc(count * sizeof *h);
    if (h == NULL) {
        gpu_fail_at(__FILE__, __LINE__, "out of host memory");
        exit(1);
    }
    for (size_t i = 0; i < count; i++)
        h[i] = base + (float)(i % 1000);
    gpu_to_dev(dev, dst, h, count * sizeof *h);
    free(h);
}

/* Every element of dst is base + i % 1000 (times @p mult). */
static int check_f32(int dev, const void *src, size_t count, float base, float mult,
                     const char *what)
{
    float *h = malloc(count * sizeof *h);
    size_t nbad = 0, first = 0;
    if (h == NULL) {
        gpu_fail_at(__FILE__, __LINE__, "out of host memory");
        exit(1);
    }
    gpu_to_host(dev, h, src, count * sizeof *h);
    for (size_t i = 0; i < count; i++)
        if (h[i] != (base + (float)(i % 1000)) * mult && nbad++ == 0)
            first = i;
    if (nbad != 0)
        gpu_fail_at(__FILE__, __LINE__, "%s: %zu of %zu wrong; first [%zu]: %g, want %g", what,
                    nbad, count, first, (double)h[first],
                    (double)((base + (float)(first % 1000)) * mult));
    free(h);
    return nbad == 0;
}

/* P1 + P2: one device. A send with no recv times out; other streams go on meanwhile; a
 * late recv fails at once; then mismatched send/recv pairs; then a good pair works. */
static void one_device_watchdog(void)
{
    size_t count = 1000, bytes = count * sizeof(float);
    ccq_runtime *rt;
    void *src = gpu_dev_alloc(0, bytes), *dst = gpu_dev_alloc(0, bytes);
    ccq_stats stats = {.struct_size = sizeof stats};
    char buf[512];
    uint64_t t0;
    ccq_status st;

    gpu_section("P1: send to self with no recv, timeout_ms = 2000");
    rt = gpu_runtime(2000, 0);
    gpu_comm_init(rt, one, 1);
    fill_f32(0, src, count, 1.0f);
    t0 = gpu_now_ns();
    if (CCQ_EXPECT_OK(ccq_send(rt, 0, 0, src, count, CCQ_FLOAT32, 0))) {
        /* Another stream is not held up by the stuck one. */
        uint64_t t1 = gpu_now_ns();
        if (CCQ_EXPECT_OK(
                ccq_all_reduce(rt, 0, 1, src, dst, count, CCQ_FLOAT32, CCQ_SUM, one, 1))) {
            fence_expect(rt, 0, 1, CCQ_OK, t1, 0, 1500, "P1 other stream meanwhile");
            check_f32(0, dst, count, 1.0f, 1.0f, "P1 other stream data");
        }
        fence_expect(rt, 0, 0, CCQ_ERR_TIMEOUT, t0, 1500, 8000, "P1 unmatched send");
        st = ccq_stream_last_error(rt, 0, 0, buf, sizeof buf);
        EXPECT(st == CCQ_ERR_TIMEOUT && buf[0] != '\0',
               "P1: ccq_stream_last_error gave %s \"%s\", want CCQ_ERR_TIMEOUT with a detail",
               gpu_st(st), buf);
        /* The recv that would have matched arrives late: it fails at once, same status. */
        gpu_section("P1: the late recv");
        t0 = gpu_now_ns();
        st = ccq_recv(rt, 0, 1, dst, count, CCQ_FLOAT32, 0);
        if (st == CCQ_OK)
            fence_expect(rt, 0, 1, CCQ_ERR_TIMEOUT, t0, 0, 1500, "P1 late recv");
        else
            EXPECT(st == CCQ_ERR_TIMEOUT, "P1 late recv: submit returned %s (%s)", gpu_st(st),
                   ccq_last_error_detail());
    }

    gpu_section("P2: mismatched send/recv pairs");
    t0 = gpu_now_ns();
    if (CCQ_EXPECT_OK(ccq_send(rt, 0, 0, src, count, CCQ_FLOAT32, 0)) &&
        CCQ_EXPECT_OK(ccq_recv(rt, 0, 1, dst, count / 2, CCQ_FLOAT32, 0))) {
        fence_expect(rt, 0, 0, CCQ_ERR_MISMATCH, t0, 0, 1500, "P2 count mismatch, send side");
        fence_expect(rt, 0, 1, CCQ_ERR_MISMATCH, t0, 0, 1500, "P2 count mismatch, recv side");
    }
    t0 = gpu_now_ns();
    if (CCQ_EXPECT_OK(ccq_send(rt, 0, 0, src, count, CCQ_FLOAT32, 0)) &&
        CCQ_EXPECT_OK(ccq_recv(rt, 0, 1, dst, count, CCQ_INT32, 0))) {
        fence_expect(rt, 0, 0, CCQ_ERR_MISMATCH, t0, 0, 1500, "P2 dtype mismatch, send side");
        fence_expect(rt, 0, 1, CCQ_ERR_MISMATCH, t0, 0, 1500, "P2 dtype mismatch, recv side");
    }
    gpu_section("P2: a good pair after the errors");
    CUDA_REQUIRE(cudaMemset(dst, 0, bytes));
    CUDA_REQUIRE(cudaDeviceSynchronize());
    t0 = gpu_now_ns();
    if (CCQ_EXPECT_OK(ccq_send(rt, 0, 0, src, count, CCQ_FLOAT32, 0)) &&
        CCQ_EXPECT_OK(ccq_recv(rt, 0, 1, dst, count, CCQ_FLOAT32, 0))) {
        fence_expect(rt, 0, 0, CCQ_OK, t0, 0, 1500, "P2 good pair, send side");
        fence_expect(rt, 0, 1, CCQ_OK, t0, 0, 1500, "P2 good pair, recv side");
        check_f32(0, dst, count, 1.0f, 1.0f, "P2 good pair data");
    }
    if (CCQ_EXPECT_OK(ccq_get_stats(rt, &stats))) {
        printf("   stats: submitted %llu completed %llu failed %llu pending %llu\n",
               (unsigned long long)stats.submitted, (unsigned long long)stats.completed,
               (unsigned long long)stats.failed, (unsigned long long)stats.pending);
        EXPECT(stats.failed >= 5, "P1/P2: want at least 5 failed commands, stats say %llu",
               (unsigned long long)stats.failed);
    }
    gpu_section("P1/P2: destroy");
    t0 = gpu_now_ns();
    CCQ_EXPECT_OK(ccq_runtime_destroy(rt));
    EXPECT(gpu_since_ms(t0) < 10000, "P1/P2: destroy took %.0f ms", gpu_since_ms(t0));
    gpu_dev_free(0, src);
    gpu_dev_free(0, dst);
    printf("done P1 (watchdog) and P2 (mismatch) on one device\n");
}

/* P3: two devices. Rank 1 never submits: timeout; its late part fails at once; then
 * mismatched counts; then a good all_reduce. */
static void two_device_watchdog(void)
{
    size_t count = 1000, bytes = count * sizeof(float);
    ccq_runtime *rt;
    void *src[2], *dst[2];
    uint64_t t0;
    ccq_status st;

    gpu_section("P3: all_reduce on devices {0,1} whose rank 1 never comes, timeout_ms = 2000");
    rt = gpu_runtime(2000, 0);
    gpu_comm_init(rt, pair, 2);
    for (int d = 0; d < 2; d++) {
        src[d] = gpu_dev_alloc(d, bytes);
        dst[d] = gpu_dev_alloc(d, bytes);
        fill_f32(d, src[d], count, 1.0f + (float)d);
    }
    t0 = gpu_now_ns();
    if (CCQ_EXPECT_OK(
            ccq_all_reduce(rt, 0, 0, src[0], dst[0], count, CCQ_FLOAT32, CCQ_SUM, pair, 2))) {
        char buf[512];
        fence_expect(rt, 0, 0, CCQ_ERR_TIMEOUT, t0, 1500, 8000, "P3 missing rank 1");
        st = ccq_stream_last_error(rt, 0, 0, buf, sizeof buf);
        EXPECT(st == CCQ_ERR_TIMEOUT && strstr(buf, "rank") != NULL,
               "P3: ccq_stream_last_error gave %s \"%s\", want CCQ_ERR_TIMEOUT naming the rank",
               gpu_st(st), buf);
    }
    gpu_section("P3: rank 1's late part");
    t0 = gpu_now_ns();
    st = ccq_all_reduce(rt, 1, 0, src[1], dst[1], count, CCQ_FLOAT32, CCQ_SUM, pair, 2);
    if (st == CCQ_OK)
        fence_expect(rt, 1, 0, CCQ_ERR_TIMEOUT, t0, 0, 1500, "P3 rank 1 late part");
    else
        EXPECT(st == CCQ_ERR_TIMEOUT, "P3 late part: submit returned %s", gpu_st(st));

    gpu_section("P3: mismatched counts across ranks");
    t0 = gpu_now_ns();
    if (CCQ_EXPECT_OK(
            ccq_all_reduce(rt, 0, 0, src[0], dst[0], count, CCQ_FLOAT32, CCQ_SUM, pair, 2)) &&
        CCQ_EXPECT_OK(
            ccq_all_reduce(rt, 1, 0, src[1], dst[1], count / 2, CCQ_FLOAT32, CCQ_SUM, pair, 2))) {
        fence_expect(rt, 0, 0, CCQ_ERR_MISMATCH, t0, 0, 1500, "P3 count mismatch, rank 0");
        fence_expect(rt, 1, 0, CCQ_ERR_MISMATCH, t0, 0, 1500, "P3 count mismatch, rank 1");
    }
    gpu_section("P3: a good all_reduce after the errors");
    t0 = gpu_now_ns();
    if (CCQ_EXPECT_OK(
            ccq_all_reduce(rt, 0, 0, src[0], dst[0], count, CCQ_FLOAT32, CCQ_SUM, pair, 2)) &&
        CCQ_EXPECT_OK(
            ccq_all_reduce(rt, 1, 0, src[1], dst[1], count, CCQ_FLOAT32, CCQ_SUM, pair, 2))) {
        /* (1 + x) + (2 + x) = 2 * (1.5 + x) */
        if (fence_expect(rt, 0, 0, CCQ_OK, t0, 0, 1500, "P3 good, rank 0") == CCQ_OK)
            check_f32(0, dst[0], count, 1.5f, 2.0f, "P3 good, rank 0 data");
        if (fence_expect(rt, 1, 0, CCQ_OK, t0, 0, 1500, "P3 good, rank 1") == CCQ_OK)
            check_f32(1, dst[1], count, 1.5f, 2.0f, "P3 good, rank 1 data");
    }
    gpu_section("P3: destroy");
    CCQ_EXPECT_OK(ccq_runtime_destroy(rt));
    for (int d = 0; d < 2; d++) {
        gpu_dev_free(d, src[d]);
        gpu_dev_free(d, dst[d]);
    }
    printf("done P3 (watchdog and mismatch across two devices)\n");
}

static void sleep_fn(void *arg)
{
    gpu_sleep_ms(*(const unsigned *)arg);
}

/* P4: an issued batch that cannot complete (it waits behind a 3 s host function on its
 * bound stream) with timeout_ms = 1000: the watchdog aborts its communicator. Nothing may
 * hang; later use of the communicator reports CCQ_ERR_ABORTED. */
static void issued_abort(void)
{
    static unsigned block_ms = 3000;
    size_t count = 1000, bytes = count * sizeof(float);
    ccq_runtime *rt;
    void *src = gpu_dev_alloc(0, bytes), *dst = gpu_dev_alloc(0, bytes);
    cudaStream_t s;
    uint64_t t0;
    ccq_status st, st2 = CCQ_OK;

    gpu_section("P4: issued batch stuck behind the bound stream, timeout_ms = 1000");
    rt = gpu_runtime(1000, 0);
    gpu_comm_init(rt, one, 1);
    fill_f32(0, src, count, 3.0f);
    CUDA_REQUIRE(cudaSetDevice(0));
    CUDA_REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    if (!CCQ_EXPECT_OK(ccq_nccl_bind_stream(rt, 0, 0, s)))
        goto out;
    CUDA_REQUIRE(cudaLaunchHostFunc(s, sleep_fn, &block_ms));
    t0 = gpu_now_ns();
    if (!CCQ_EXPECT_OK(ccq_all_reduce(rt, 0, 0, src, dst, count, CCQ_FLOAT32, CCQ_SUM, one, 1)))
        goto out;
    /* Either the fence's own deadline (timeout_ms + grace) or the watchdog's abort. */
    st = fence_expect(rt, 0, 0, ANY_ERROR, t0, 800, 6000, "P4 stuck batch");
    EXPECT(st == CCQ_ERR_TIMEOUT || st == CCQ_ERR_ABORTED,
           "P4: want CCQ_ERR_TIMEOUT or CCQ_ERR_ABORTED, got %s", gpu_st(st));
    gpu_section("P4: let the bound stream drain");
    CUDA_REQUIRE(cudaStreamSynchronize(s));
    printf("   bound stream drained %.0f ms after the submission\n", gpu_since_ms(t0));
    gpu_section("P4: second fence");
    t0 = gpu_now_ns();
    st = ccq_sync_collective(rt, 0, 0);
    printf("   second fence: %s after %.0f ms%s%s\n", gpu_st(st), gpu_since_ms(t0),
           st != CCQ_OK ? ": " : "", st != CCQ_OK ? ccq_last_error_detail() : "");
    EXPECT(gpu_since_ms(t0) < 3000, "P4: the second fence took %.0f ms", gpu_since_ms(t0));

    gpu_section("P4: use of the aborted communicator");
    t0 = gpu_now_ns();
    st = ccq_all_reduce(rt, 0, 0, src, dst, count, CCQ_FLOAT32, CCQ_SUM, one, 1);
    if (st == CCQ_OK) {
        st2 = ccq_sync_collective(rt, 0, 0);
        printf("   all_reduce on the aborted communicator: queued, fence %s after %.0f ms: %s\n",
               gpu_st(st2), gpu_since_ms(t0), ccq_last_error_detail());
    } else {
        printf("   all_reduce on the aborted communicator: %s: %s\n", gpu_st(st),
               ccq_last_error_detail());
    }
    EXPECT(st == CCQ_ERR_ABORTED || st2 == CCQ_ERR_ABORTED,
           "P4: want CCQ_ERR_ABORTED for later use of the communicator, got submit %s, fence %s",
           gpu_st(st), gpu_st(st2));
    CCQ_EXPECT_OK(ccq_nccl_bind_stream(rt, 0, 0, NULL));
out:
    gpu_section("P4: destroy");
    t0 = gpu_now_ns();
    CCQ_EXPECT_OK(ccq_runtime_destroy(rt));
    EXPECT(gpu_since_ms(t0) < 15000, "P4: destroy took %.0f ms", gpu_since_ms(t0));
    CUDA_REQUIRE(cudaStreamSynchronize(s));
    CUDA_REQUIRE(cudaStreamDestroy(s));
    gpu_dev_free(0, src);
    gpu_dev_free(0, dst);
    printf("done P4 (watchdog abort of an issued batch)\n");
}

/* A good one-rank all_reduce on a fresh runtime: the process and the GPU still work. */
static void fresh_runtime_works(const char *what)
{
    size_t count = 4096, bytes = count * sizeof(float);
    void *src = gpu_dev_alloc(0, bytes), *dst = gpu_dev_alloc(0, bytes);
    ccq_runtime *rt;
    uint64_t t0;

    gpu_section("%s: a fresh runtime", what);
    rt = gpu_runtime(5000, 0);
    gpu_comm_init(rt, one, 1);
    fill_f32(0, src, count, 5.0f);
    t0 = gpu_now_ns();
    if (CCQ_EXPECT_OK(ccq_all_reduce(rt, 0, 0, src, dst, count, CCQ_FLOAT32, CCQ_SUM, one, 1)) &&
        fence_expect(rt, 0, 0, CCQ_OK, t0, 0, 3000, what) == CCQ_OK)
        check_f32(0, dst, count, 5.0f, 1.0f, what);
    CCQ_EXPECT_OK(ccq_runtime_destroy(rt));
    gpu_dev_free(0, src);
    gpu_dev_free(0, dst);
}

/* P5: NCCL rejects a pointer that is no device memory (NCCL_CHECK_POINTERS=1, set at the
 * start of main): the fence returns the error with NCCL's message, nothing hangs. */
static void nccl_argument_error(void)
{
    size_t count = 1000, bytes = count * sizeof(float);
    void *bogus = (void *)(uintptr_t)0x1000; /* never device memory */
    void *dst = gpu_dev_alloc(0, bytes), *src = gpu_dev_alloc(0, bytes);
    ccq_runtime *rt;
    const char *detail;
    uint64_t t0;
    ccq_status st;

    gpu_section("P5: all_reduce from an invalid device pointer (NCCL_CHECK_POINTERS=1)");
    rt = gpu_runtime(5000, 0);
    gpu_comm_init(rt, one, 1);
    t0 = gpu_now_ns();
    if (CCQ_EXPECT_OK(ccq_all_reduce(rt, 0, 0, bogus, dst, count, CCQ_FLOAT32, CCQ_SUM, one, 1))) {
        st = fence_expect(rt, 0, 0, ANY_ERROR, t0, 0, 3000, "P5 invalid pointer");
        detail = ccq_last_error_detail();
        EXPECT(st == CCQ_ERR_INVALID_ARGUMENT || st == CCQ_ERR_BACKEND,
               "P5: want CCQ_ERR_INVALID_ARGUMENT or CCQ_ERR_BACKEND, got %s", gpu_st(st));
        EXPECT(st == CCQ_OK || strstr(detail, "NCCL") != NULL || strstr(detail, "nccl") != NULL,
               "P5: the detail does not carry NCCL's message: %s", detail);
    }
    /* NCCL may have poisoned the communicator: later work must end (any status), not hang. */
    gpu_section("P5: a valid all_reduce on the same runtime afterwards");
    fill_f32(0, src, count, 2.0f);
    t0 = gpu_now_ns();
    st = ccq_all_reduce(rt, 0, 0, src, dst, count, CCQ_FLOAT32, CCQ_SUM, one, 1);
    if (st == CCQ_OK) {
        st = ccq_sync_collective(rt, 0, 0);
        printf("   after the error, same runtime: fence %s after %.0f ms%s%s\n", gpu_st(st),
               gpu_since_ms(t0), st != CCQ_OK ? ": " : "",
               st != CCQ_OK ? ccq_last_error_detail() : "");
        if (st == CCQ_OK)
            check_f32(0, dst, count, 2.0f, 1.0f, "P5 same runtime afterwards");
    } else {
        printf("   after the error, same runtime: submit %s: %s\n", gpu_st(st),
               ccq_last_error_detail());
    }
    EXPECT(gpu_since_ms(t0) < 7000, "P5: the follow-up took %.0f ms", gpu_since_ms(t0));
    gpu_section("P5: destroy");
    t0 = gpu_now_ns();
    CCQ_EXPECT_OK(ccq_runtime_destroy(rt));
    EXPECT(gpu_since_ms(t0) < 10000, "P5: destroy took %.0f ms", gpu_since_ms(t0));
    gpu_dev_free(0, src);
    gpu_dev_free(0, dst);
    fresh_runtime_works("P5 recovery");
    printf("done P5 (NCCL argument error)\n");
}

/* P6 (opt-in): a copy that reads past its allocation. The CUDA error this gives may be
 * sticky (the process's context is lost), so it runs last and only on request. */
static void sticky_fault(void)
{
    size_t small = (size_t)2 << 20, count = (size_t)256 << 20; /* 2 MiB read as 1 GiB */
    void *src = gpu_dev_alloc(0, small), *dst = gpu_dev_alloc(0, count * sizeof(float));
    ccq_runtime *rt;
    uint64_t t0;

    gpu_section("P6: out-of-bounds read (CCQ_GPU_TEST_FAULT=1)");
    rt = gpu_runtime(5000, 0);
    gpu_comm_init(rt, one, 1);
    t0 = gpu_now_ns();
    if (CCQ_EXPECT_OK(ccq_all_reduce(rt, 0, 0, src, dst, count, CCQ_FLOAT32, CCQ_SUM, one, 1)))
        fence_expect(rt, 0, 0, ANY_ERROR, t0, 0, 7000, "P6 out-of-bounds read");
    gpu_section("P6: destroy");
    t0 = gpu_now_ns();
    ccq_runtime_destroy(rt);
    EXPECT(gpu_since_ms(t0) < 15000, "P6: destroy took %.0f ms", gpu_since_ms(t0));
    printf("done P6 (CUDA context state afterwards: %s)\n",
           cudaGetErrorName(cudaDeviceSynchronize()));
}

int main(void)
{
    int ndev;

    /* NCCL reads it once, at its first communicator: set it before any. */
    setenv("NCCL_CHECK_POINTERS", "1", 0);
    ndev = gpu_init(PROG, 100);
    /* The first communicator of a process loads NCCL's state (NVML, topology, proxy
     * threads), which can take seconds: do it once with a generous deadline, so the short
     * timeout_ms of the parts below only ever covers what they test. */
    {
        ccq_runtime *rt = gpu_runtime(60000, 0);
        gpu_comm_init(rt, one, 1);
        if (ndev >= 2)
            gpu_comm_init(rt, pair, 2);
        ccq_runtime_destroy(rt);
    }
    one_device_watchdog();
    if (ndev >= 2)
        two_device_watchdog();
    else
        printf("note: 1 GPU: P3 (a second rank that never comes) needs 2 and was not run\n");
    issued_abort();
    nccl_argument_error();
    if (getenv("CCQ_GPU_TEST_FAULT") != NULL && strcmp(getenv("CCQ_GPU_TEST_FAULT"), "1") == 0)
        sticky_fault();
    return gpu_finish(PROG);
}
