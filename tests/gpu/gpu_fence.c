/* Fences and bound CUDA streams on the NCCL backend: a collective submitted on a bound
 * stream must wait for the work queued on it before the call (copies in, and a copy out of
 * the previous result), and work queued after a fence must see the data; many iterations
 * with changing data and delays on the stream make ordering bugs show. Also many commands
 * before one fence, bind/unbind rules, unbound streams, and two ranks when there are two
 * GPUs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ccq/ccq_nccl.h"
#include "gpu_common.h"

#define PROG "gpu_fence"

static const ccq_device_id one[1] = {0};
static const ccq_device_id pair[2] = {0, 1};

static unsigned iters(unsigned dflt)
{
    const char *v = getenv("CCQ_TEST_ITERS");
    if (v != NULL && *v != '\0') {
        unsigned long x = strtoul(v, NULL, 10);
        if (x > 0 && x < 1000000)
            return (unsigned)x;
    }
    return dflt;
}

/* Stream delay: a host function that sleeps, so that the work queued after it on the same
 * stream starts late and a collective that does not wait for it reads stale data. */
static unsigned delay_us = 500;

static void delay_fn(void *arg)
{
    struct timespec ts = {0, (long)*(const unsigned *)arg * 1000L};
    nanosleep(&ts, NULL);
}

/* Element i of iteration it: every element differs from the iteration before. */
static uint32_t value(unsigned it, size_t i, unsigned rank)
{
    return (uint32_t)(it * 0x01000193u + (uint32_t)i * 7u + rank * 0x10000u);
}

static size_t count_bad(const uint32_t *got, unsigned it, size_t count, unsigned ranks,
                        size_t *first)
{
    size_t nbad = 0;
    for (size_t i = 0; i < count; i++) {
        uint32_t want = 0;
        for (unsigned r = 0; r < ranks; r++)
            want += value(it, i, r);
        if (got[i] != want && nbad++ == 0)
            *first = i;
    }
    return nbad;
}

/* The main ordering loop on device 0's ccq stream 0, bound to @p s. Per iteration, on s:
 * [delay] copy out the previous result, copy in new input; then the all_reduce (must wait
 * for both: it overwrites what the first copy reads and reads what the second writes);
 * fence; copy the result out on s; synchronize s. */
static void bound_loop(ccq_runtime *rt, cudaStream_t s, unsigned n, const char *label)
{
    size_t count = (size_t)1 << 20, bytes = count * sizeof(uint32_t);
    uint32_t *h_in, *h_out, *h_prev;
    void *src = gpu_dev_alloc(0, bytes), *dst = gpu_dev_alloc(0, bytes);
    unsigned bad_out = 0, bad_prev = 0;
    uint64_t t0 = gpu_now_ns();

    gpu_section("%s: %u iterations of copy in / all_reduce / fence / copy out", label, n);
    CUDA_REQUIRE(cudaMallocHost((void **)&h_in, bytes));
    CUDA_REQUIRE(cudaMallocHost((void **)&h_out, bytes));
    CUDA_REQUIRE(cudaMallocHost((void **)&h_prev, bytes));
    for (unsigned it = 0; it < n; it++) {
        size_t first = 0, nbad;
        for (size_t i = 0; i < count; i++)
            h_in[i] = value(it, i, 0);
        if (it % 2 == 0)
            CUDA_REQUIRE(cudaLaunchHostFunc(s, delay_fn, &delay_us));
        if (it > 0)
            CUDA_REQUIRE(cudaMemcpyAsync(h_prev, dst, bytes, cudaMemcpyDeviceToHost, s));
        CUDA_REQUIRE(cudaMemcpyAsync(src, h_in, bytes, cudaMemcpyHostToDevice, s));
        if (!CCQ_EXPECT_OK(ccq_all_reduce(rt, 0, 0, src, dst, count, CCQ_UINT32, CCQ_SUM, one, 1)))
            break;
        if (!CCQ_EXPECT_OK(ccq_sync_collective(rt, 0, 0)))
            break;
        CUDA_REQUIRE(cudaMemcpyAsync(h_out, dst, bytes, cudaMemcpyDeviceToHost, s));
        CUDA_REQUIRE(cudaStreamSynchronize(s));
        nbad = count_bad(h_out, it, count, 1, &first);
        if (nbad != 0 && bad_out++ < 3)
            gpu_fail_at(
                __FILE__, __LINE__,
                "%s: iteration %u: %zu of %zu results wrong (the collective did not wait "
                "for the copy in, or the copy out did not wait for the fence); first [%zu]: "
                "0x%08x, want 0x%08x",
                label, it, nbad, count, first, h_out[first], value(it, first, 0));
        if (it > 0) {
            nbad = count_bad(h_prev, it - 1, count, 1, &first);
            if (nbad != 0 && bad_prev++ < 3)
                gpu_fail_at(__FILE__, __LINE__,
                            "%s: iteration %u: the copy out queued before the collective read "
                            "%zu of %zu overwritten elements (it did not wait for the bound "
                            "stream); first [%zu]: 0x%08x, want 0x%08x",
                            label, it, nbad, count, first, h_prev[first], value(it - 1, first, 0));
        }
    }
    EXPECT(bad_out == 0 && bad_prev == 0,
           "%s: %u iteration(s) with wrong results, %u with the "
           "previous result overwritten too early",
           label, bad_out, bad_prev);
    if (bad_out == 0 && bad_prev == 0)
        printf("ok   %s: %u iterations, %.2f ms per iteration\n", label, n, gpu_since_ms(t0) / n);
    CUDA_REQUIRE(cudaFreeHost(h_in));
    CUDA_REQUIRE(cudaFreeHost(h_out));
    CUDA_REQUIRE(cudaFreeHost(h_prev));
    gpu_dev_free(0, src);
    gpu_dev_free(0, dst);
}

/* K commands, each after its own copy in on the bound stream, then one fence: each must
 * wait for its own submission point. */
static void bound_batch(ccq_runtime *rt, cudaStream_t s, unsigned rounds)
{
    enum { K = 32 };
    size_t count = 65536, bytes = count * sizeof(uint32_t);
    uint32_t *h_in, *h_out;
    void *src[K], *dst[K];
    unsigned bad = 0;

    gpu_section("bound stream: %u rounds of %d copies in + all_reduces, then one fence", rounds, K);
    CUDA_REQUIRE(cudaMallocHost((void **)&h_in, bytes * K));
    CUDA_REQUIRE(cudaMallocHost((void **)&h_out, bytes * K));
    for (int k = 0; k < K; k++) {
        src[k] = gpu_dev_alloc(0, bytes);
        dst[k] = gpu_dev_alloc(0, bytes);
    }
    for (unsigned r = 0; r < rounds && bad == 0; r++) {
        int ok = 1;
        for (int k = 0; k < K; k++)
            for (size_t i = 0; i < count; i++)
                h_in[(size_t)k * count + i] = value(r * K + (unsigned)k, i, 0);
        CUDA_REQUIRE(cudaLaunchHostFunc(s, delay_fn, &delay_us));
        for (int k = 0; k < K && ok; k++) {
            CUDA_REQUIRE(cudaMemcpyAsync(src[k], h_in + (size_t)k * count, bytes,
                                         cudaMemcpyHostToDevice, s));
            if (k % 8 == 7) /* a later delay too: the last commands must wait longer */
                CUDA_REQUIRE(cudaLaunchHostFunc(s, delay_fn, &delay_us));
            ok = CCQ_EXPECT_OK(
                ccq_all_reduce(rt, 0, 0, src[k], dst[k], count, CCQ_UINT32, CCQ_SUM, one, 1));
        }
        if (!ok || !CCQ_EXPECT_OK(ccq_sync_collective(rt, 0, 0))) {
            bad++;
            break;
        }
        for (int k = 0; k < K; k++)
            CUDA_REQUIRE(cudaMemcpyAsync(h_out + (size_t)k * count, dst[k], bytes,
                                         cudaMemcpyDeviceToHost, s));
        CUDA_REQUIRE(cudaStreamSynchronize(s));
        for (int k = 0; k < K; k++) {
            size_t first = 0, nbad;
            nbad = count_bad(h_out + (size_t)k * count, r * K + (unsigned)k, count, 1, &first);
            if (nbad != 0) {
                if (bad++ < 3)
                    gpu_fail_at(__FILE__, __LINE__,
                                "round %u command %d: %zu of %zu results wrong; first [%zu]: "
                                "0x%08x, want 0x%08x",
                                r, k, nbad, count, first, h_out[(size_t)k * count + first],
                                value(r * K + (unsigned)k, first, 0));
            }
        }
    }
    if (bad == 0)
        printf("ok   bound stream: %u rounds of %d commands before one fence\n", rounds, K);
    for (int k = 0; k < K; k++) {
        gpu_dev_free(0, src[k]);
        gpu_dev_free(0, dst[k]);
    }
    CUDA_REQUIRE(cudaFreeHost(h_in));
    CUDA_REQUIRE(cudaFreeHost(h_out));
}

/* Unbound ccq stream: the caller makes buffers ready before the call (blocking copies). */
static void unbound_loop(ccq_runtime *rt, ccq_stream_id stream, unsigned n)
{
    size_t count = 100000, bytes = count * sizeof(uint32_t);
    uint32_t *h_in = malloc(bytes), *h_out = malloc(bytes);
    void *src = gpu_dev_alloc(0, bytes), *dst = gpu_dev_alloc(0, bytes);
    unsigned bad = 0;

    gpu_section("unbound stream %u: %u iterations", stream, n);
    if (h_in == NULL || h_out == NULL) {
        gpu_fail_at(__FILE__, __LINE__, "out of host memory");
        exit(1);
    }
    for (unsigned it = 0; it < n; it++) {
        size_t first = 0, nbad;
        for (size_t i = 0; i < count; i++)
            h_in[i] = value(it, i, 0);
        gpu_to_dev(0, src, h_in, bytes);
        if (!CCQ_EXPECT_OK(
                ccq_all_reduce(rt, 0, stream, src, dst, count, CCQ_UINT32, CCQ_SUM, one, 1)) ||
            !CCQ_EXPECT_OK(ccq_sync_collective(rt, 0, stream))) {
            bad++;
            break;
        }
        gpu_to_host(0, h_out, dst, bytes);
        nbad = count_bad(h_out, it, count, 1, &first);
        if (nbad != 0 && bad++ < 3)
            gpu_fail_at(__FILE__, __LINE__,
                        "unbound iteration %u: %zu of %zu wrong; first [%zu]: 0x%08x, want 0x%08x",
                        it, nbad, count, first, h_out[first], value(it, first, 0));
    }
    if (bad == 0)
        printf("ok   unbound stream %u: %u iterations\n", stream, n);
    free(h_in);
    free(h_out);
    gpu_dev_free(0, src);
    gpu_dev_free(0, dst);
}

/* Binding rules: not while commands are outstanding, NULL unbinds, bad ids, and only on
 * the NCCL backend. */
static void bind_rules(ccq_runtime *rt, cudaStream_t s, cudaStream_t s2)
{
    size_t count = 1000, bytes = count * sizeof(float);
    void *src = gpu_dev_alloc(0, bytes), *dst = gpu_dev_alloc(0, bytes);
    ccq_runtime *host = NULL;
    ccq_config cfg;
    ccq_status st;

    gpu_section("bind rules");
    /* A send to self with no recv yet stays outstanding on (0, 0). */
    if (CCQ_EXPECT_OK(ccq_send(rt, 0, 0, src, count, CCQ_FLOAT32, 0))) {
        st = ccq_nccl_bind_stream(rt, 0, 0, s2);
        EXPECT(st == CCQ_ERR_INVALID_ARGUMENT,
               "bind with a command outstanding: want CCQ_ERR_INVALID_ARGUMENT, got %s",
               gpu_st(st));
        if (CCQ_EXPECT_OK(ccq_recv(rt, 0, 1, dst, count, CCQ_FLOAT32, 0))) {
            CCQ_EXPECT_OK(ccq_sync_collective(rt, 0, 0));
            CCQ_EXPECT_OK(ccq_sync_collective(rt, 0, 1));
        }
    }
    CCQ_EXPECT_OK(ccq_nccl_bind_stream(rt, 0, 0, s2)); /* rebind after the fence */
    CCQ_EXPECT_OK(ccq_nccl_bind_stream(rt, 0, 0, s));
    st = ccq_nccl_bind_stream(rt, ccq_device_count(rt), 0, s);
    EXPECT(st == CCQ_ERR_INVALID_ARGUMENT, "bind on a device that does not exist: got %s",
           gpu_st(st));
    st = ccq_nccl_bind_stream(rt, 0, 1u << 30, s);
    EXPECT(st == CCQ_ERR_INVALID_ARGUMENT, "bind on a stream id out of range: got %s", gpu_st(st));

    ccq_config_init(&cfg);
    cfg.backend = "host";
    cfg.host_devices = 1;
    if (CCQ_EXPECT_OK(ccq_runtime_create(&cfg, &host))) {
        st = ccq_nccl_bind_stream(host, 0, 0, s);
        EXPECT(st == CCQ_ERR_UNSUPPORTED,
               "bind on the host backend: want CCQ_ERR_UNSUPPORTED, "
               "got %s",
               gpu_st(st));
        ccq_runtime_destroy(host);
    }
    gpu_dev_free(0, src);
    gpu_dev_free(0, dst);
    printf("ok   bind rules checked (%d failure(s) so far)\n", gpu_failures);
}

/* Two ranks, each ccq stream bound to a CUDA stream of its own device. */
static void two_ranks_bound(ccq_runtime *rt, unsigned n)
{
    size_t count = 262144, bytes = count * sizeof(uint32_t);
    cudaStream_t s[2];
    uint32_t *h_in[2], *h_out[2];
    void *src[2], *dst[2];
    unsigned bad = 0;

    gpu_section("two ranks with bound streams: %u iterations", n);
    for (int d = 0; d < 2; d++) {
        CUDA_REQUIRE(cudaSetDevice(d));
        CUDA_REQUIRE(cudaStreamCreateWithFlags(&s[d], cudaStreamNonBlocking));
        CUDA_REQUIRE(cudaMallocHost((void **)&h_in[d], bytes));
        CUDA_REQUIRE(cudaMallocHost((void **)&h_out[d], bytes));
        src[d] = gpu_dev_alloc(d, bytes);
        dst[d] = gpu_dev_alloc(d, bytes);
        CCQ_EXPECT_OK(ccq_nccl_bind_stream(rt, (ccq_device_id)d, 2, s[d]));
    }
    CUDA_REQUIRE(cudaSetDevice(0));
    for (unsigned it = 0; it < n && bad == 0; it++) {
        int ok = 1;
        for (int d = 0; d < 2; d++) {
            for (size_t i = 0; i < count; i++)
                h_in[d][i] = value(it, i, (unsigned)d);
            if (it % 2 == (unsigned)d)
                CUDA_REQUIRE(cudaLaunchHostFunc(s[d], delay_fn, &delay_us));
            CUDA_REQUIRE(cudaMemcpyAsync(src[d], h_in[d], bytes, cudaMemcpyHostToDevice, s[d]));
        }
        for (int d = 0; d < 2 && ok; d++)
            ok = CCQ_EXPECT_OK(ccq_all_reduce(rt, (ccq_device_id)d, 2, src[d], dst[d], count,
                                              CCQ_UINT32, CCQ_SUM, pair, 2));
        if (!ok) {
            bad++;
            break;
        }
        for (int d = 0; d < 2; d++)
            ok &= CCQ_EXPECT_OK(ccq_sync_collective(rt, (ccq_device_id)d, 2));
        if (!ok) {
            bad++;
            break;
        }
        for (int d = 0; d < 2; d++) {
            size_t first = 0, nbad;
            CUDA_REQUIRE(cudaMemcpyAsync(h_out[d], dst[d], bytes, cudaMemcpyDeviceToHost, s[d]));
            CUDA_REQUIRE(cudaStreamSynchronize(s[d]));
            nbad = count_bad(h_out[d], it, count, 2, &first);
            if (nbad != 0 && bad++ < 3)
                gpu_fail_at(__FILE__, __LINE__,
                            "two ranks, iteration %u, rank %d: %zu of %zu wrong; first [%zu]: "
                            "0x%08x, want 0x%08x",
                            it, d, nbad, count, first, h_out[d][first],
                            value(it, first, 0) + value(it, first, 1));
        }
    }
    if (bad == 0)
        printf("ok   two ranks with bound streams: %u iterations\n", n);
    for (int d = 0; d < 2; d++) {
        CCQ_EXPECT_OK(ccq_nccl_bind_stream(rt, (ccq_device_id)d, 2, NULL));
        CUDA_REQUIRE(cudaSetDevice(d));
        CUDA_REQUIRE(cudaStreamDestroy(s[d]));
        CUDA_REQUIRE(cudaFreeHost(h_in[d]));
        CUDA_REQUIRE(cudaFreeHost(h_out[d]));
        gpu_dev_free(d, src[d]);
        gpu_dev_free(d, dst[d]);
    }
    CUDA_REQUIRE(cudaSetDevice(0));
}

int main(void)
{
    int ndev = gpu_init(PROG, 100);
    unsigned n = iters(200);
    ccq_runtime *rt;
    cudaStream_t s, s2;

    rt = gpu_runtime(30000, 0);
    gpu_comm_init(rt, one, 1);
    if (ndev >= 2)
        gpu_comm_init(rt, pair, 2);
    CUDA_REQUIRE(cudaSetDevice(0));
    CUDA_REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_REQUIRE(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));

    gpu_section("bind device 0 stream 0");
    if (!CCQ_EXPECT_OK(ccq_nccl_bind_stream(rt, 0, 0, s)))
        return gpu_finish(PROG);
    bound_loop(rt, s, n, "bound stream");
    bound_batch(rt, s, n / 10 + 1);
    bind_rules(rt, s, s2);
    if (CCQ_EXPECT_OK(ccq_nccl_bind_stream(rt, 0, 0, s2)))
        bound_loop(rt, s2, n / 4 + 1, "rebound to a second stream");
    /* Unbinding turns (0, 0) back into an unbound stream. */
    CCQ_EXPECT_OK(ccq_nccl_bind_stream(rt, 0, 0, NULL));
    unbound_loop(rt, 0, n / 4 + 1);
    unbound_loop(rt, 1, n / 4 + 1);
    if (ndev >= 2)
        two_ranks_bound(rt, n / 4 + 1);
    else
        printf("note: 1 GPU: the two-rank bound-stream check needs 2 and was not run\n");

    gpu_section("shutdown");
    CCQ_EXPECT_OK(ccq_runtime_destroy(rt));
    CUDA_REQUIRE(cudaStreamDestroy(s));
    CUDA_REQUIRE(cudaStreamDestroy(s2));
    return gpu_finish(PROG);
}
