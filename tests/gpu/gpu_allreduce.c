/* all_reduce on the NCCL backend: every dtype x op x count on a one-rank communicator
 * (device 0; out of place, so a command that never ran shows), and on two ranks against a
 * host reference when there are two GPUs. fp8 must be refused at submission below compute
 * capability 9.0 and must work from 9.0 on. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_common.h"

#define PROG "gpu_allreduce"

static const size_t counts[] = {1, 1000, (size_t)1 << 20};
static const ccq_device_id one[1] = {0};
static const ccq_device_id pair[2] = {0, 1};

static ccq_runtime *rt;
static int ndev;

/* Test data: small values, so that every two-rank result is exact in every type. fp8 gets
 * integers in [-4, 4] (sums need at most 3 significant bits, as e5m2 has); the other floats
 * multiples of 0.5 in [-3.5, 3.5] (products need 6 bits, bfloat16 has 8). */
static double gen(ccq_dtype dt, int rank, size_t i)
{
    uint64_t h = gpu_hash(((uint64_t)dt << 56) ^ ((uint64_t)rank << 48) ^ (uint64_t)i);
    if (gpu_is_fp8(dt))
        return (double)(int)(h % 9) - 4.0;
    if (gpu_is_float(dt))
        return ((double)(int)(h % 15) - 7.0) / 2.0;
    if (gpu_is_signed(dt))
        return (double)(int)(h % 11) - 5.0;
    return (double)(h % 11);
}

static int fence_ok(ccq_device_id dev, const char *what)
{
    ccq_status st = ccq_sync_collective(rt, dev, 0);
    if (st == CCQ_OK)
        return 1;
    gpu_fail_at(__FILE__, __LINE__, "%s: fence on device %u: %s: %s", what, dev, gpu_st(st),
                ccq_last_error_detail());
    return 0;
}

/* One rank: for every op the result is the input (AVG divides by 1). */
static void one_rank(ccq_dtype dt, size_t count, int fp8_ok)
{
    size_t es = ccq_dtype_size(dt), bytes = count * es;
    unsigned char *in = malloc(bytes), *out = malloc(bytes);
    void *src = gpu_dev_alloc(0, bytes), *dst = gpu_dev_alloc(0, bytes);
    char done[64] = "";
    uint64_t t0 = gpu_now_ns();
    int bad = 0;

    if (in == NULL || out == NULL) {
        gpu_fail_at(__FILE__, __LINE__, "out of host memory");
        exit(1);
    }
    for (size_t i = 0; i < count; i++)
        gpu_store(dt, in, i, gen(dt, 0, i));
    gpu_to_dev(0, src, in, bytes);
    for (int op = 0; op < CCQ_REDUCE_OP_COUNT_; op++) {
        const char *opn = ccq_reduce_op_name((ccq_reduce_op)op);
        char what[128];
        ccq_status st;

        snprintf(what, sizeof what, "1 rank %s x %zu %s", ccq_dtype_name(dt), count, opn);
        gpu_phase("%s", what);
        /* A sentinel no test value has, so a command that did not run fails every element. */
        CUDA_REQUIRE(cudaMemset(dst, 0xA5, bytes));
        CUDA_REQUIRE(cudaDeviceSynchronize());
        st = ccq_all_reduce(rt, 0, 0, src, dst, count, dt, (ccq_reduce_op)op, one, 1);
        if (gpu_is_fp8(dt) && !fp8_ok) {
            EXPECT(st == CCQ_ERR_UNSUPPORTED,
                   "%s: compute capability < 9 must refuse fp8 with CCQ_ERR_UNSUPPORTED, got %s",
                   what, gpu_st(st));
            if (st == CCQ_ERR_UNSUPPORTED)
                EXPECT(ccq_last_error_detail()[0] != '\0', "%s: no detail", what);
            if (st == CCQ_OK)
                fence_ok(0, what);
            continue;
        }
        if (!CCQ_EXPECT_OK(st)) {
            bad = 1;
            rt = gpu_runtime_reset(rt, ndev, what);
            continue;
        }
        if (!fence_ok(0, what)) {
            bad = 1;
            rt = gpu_runtime_reset(rt, ndev, what);
            continue;
        }
        gpu_to_host(0, out, dst, bytes);
        if (memcmp(in, out, bytes) != 0) {
            size_t nbad = 0, first = 0;
            for (size_t i = 0; i < count; i++)
                if (memcmp(in + i * es, out + i * es, es) != 0 && nbad++ == 0)
                    first = i;
            gpu_fail_at(__FILE__, __LINE__,
                        "%s: %zu of %zu elements differ; first [%zu]: got %g, want %g", what, nbad,
                        count, first, gpu_load(dt, out, first), gpu_load(dt, in, first));
            bad = 1;
            continue;
        }
        strncat(done, " ", sizeof done - strlen(done) - 1);
        strncat(done, opn, sizeof done - strlen(done) - 1);
    }
    if (!bad)
        printf("ok   1 rank  %-9s x %-8zu:%s (%.1f ms)\n", ccq_dtype_name(dt), count,
               done[0] ? done : " refused (fp8 below cc 9.0, as expected)", gpu_since_ms(t0));
    gpu_dev_free(0, src);
    gpu_dev_free(0, dst);
    free(in);
    free(out);
}

/* Two ranks (devices 0 and 1) against the host reference. */
static void two_ranks(ccq_dtype dt, size_t count, int cc0, int cc1)
{
    size_t es = ccq_dtype_size(dt), bytes = count * es;
    unsigned char *in[2], *out = malloc(bytes);
    double *want = malloc(count * sizeof *want);
    void *src[2], *dst[2];
    char done[64] = "";
    uint64_t t0 = gpu_now_ns();
    int bad = 0;

    for (int r = 0; r < 2; r++) {
        in[r] = malloc(bytes);
        if (in[r] == NULL) {
            gpu_fail_at(__FILE__, __LINE__, "out of host memory");
            exit(1);
        }
        for (size_t i = 0; i < count; i++)
            gpu_store(dt, in[r], i, gen(dt, r, i));
        src[r] = gpu_dev_alloc(r, bytes);
        dst[r] = gpu_dev_alloc(r, bytes);
        gpu_to_dev(r, src[r], in[r], bytes);
    }
    if (out == NULL || want == NULL) {
        gpu_fail_at(__FILE__, __LINE__, "out of host memory");
        exit(1);
    }
    for (int op = 0; op < CCQ_REDUCE_OP_COUNT_; op++) {
        const char *opn = ccq_reduce_op_name((ccq_reduce_op)op);
        char what[128];
        ccq_status st;
        int fenced = 1, submitted = 1, opbad = 0;

        /* fp8: only ops whose results stay exact and need no rounding convention. */
        if (gpu_is_fp8(dt) && op != CCQ_SUM && op != CCQ_MAX && op != CCQ_MIN)
            continue;
        snprintf(what, sizeof what, "2 ranks %s x %zu %s", ccq_dtype_name(dt), count, opn);
        gpu_phase("%s", what);
        if (gpu_is_fp8(dt) && (cc0 < 9 || cc1 < 9)) {
            /* Submit only on a refusing device, so no part is left waiting for its peer. */
            ccq_device_id d = cc0 < 9 ? 0 : 1;
            st = ccq_all_reduce(rt, d, 0, src[d], dst[d], count, dt, (ccq_reduce_op)op, pair, 2);
            EXPECT(st == CCQ_ERR_UNSUPPORTED, "%s: device %u (cc < 9) must refuse fp8, got %s",
                   what, d, gpu_st(st));
            continue;
        }
        for (int r = 0; r < 2; r++) {
            CUDA_REQUIRE(cudaSetDevice(r));
            CUDA_REQUIRE(cudaMemset(dst[r], 0xA5, bytes));
            CUDA_REQUIRE(cudaDeviceSynchronize());
        }
        CUDA_REQUIRE(cudaSetDevice(0));
        for (size_t i = 0; i < count; i++)
            want[i] =
                gpu_ref2(dt, (ccq_reduce_op)op, gpu_load(dt, in[0], i), gpu_load(dt, in[1], i));
        for (int r = 0; r < 2 && submitted; r++)
            submitted = CCQ_EXPECT_OK(ccq_all_reduce(rt, (ccq_device_id)r, 0, src[r], dst[r], count,
                                                     dt, (ccq_reduce_op)op, pair, 2));
        if (!submitted) {
            /* A lone part would wait out timeout_ms: the reset's shutdown cancels it. */
            bad = 1;
            rt = gpu_runtime_reset(rt, ndev, what);
            continue;
        }
        for (int r = 0; r < 2; r++)
            fenced &= fence_ok((ccq_device_id)r, what);
        if (!fenced) {
            bad = 1;
            rt = gpu_runtime_reset(rt, ndev, what);
            continue;
        }
        for (int r = 0; r < 2; r++) {
            size_t nbad = 0, first = 0;
            gpu_to_host(r, out, dst[r], bytes);
            for (size_t i = 0; i < count; i++)
                if (gpu_load(dt, out, i) != want[i] && nbad++ == 0)
                    first = i;
            if (nbad != 0) {
                gpu_fail_at(__FILE__, __LINE__,
                            "%s: rank %d: %zu of %zu elements wrong; first [%zu]: %g op %g gave "
                            "%g, want %g",
                            what, r, nbad, count, first, gpu_load(dt, in[0], first),
                            gpu_load(dt, in[1], first), gpu_load(dt, out, first), want[first]);
                opbad = 1;
            }
        }
        bad |= opbad;
        if (!opbad) {
            strncat(done, " ", sizeof done - strlen(done) - 1);
            strncat(done, opn, sizeof done - strlen(done) - 1);
        }
    }
    if (!bad)
        printf("ok   2 ranks %-9s x %-8zu:%s (%.1f ms)\n", ccq_dtype_name(dt), count,
               done[0] ? done : " refused (fp8 below cc 9.0, as expected)", gpu_since_ms(t0));
    for (int r = 0; r < 2; r++) {
        gpu_dev_free(r, src[r]);
        gpu_dev_free(r, dst[r]);
        free(in[r]);
    }
    free(out);
    free(want);
}

/* Sanity of the host codecs the references rely on (cheap; catches a broken helper before
 * it is mistaken for a GPU bug). */
static void check_codecs(void)
{
    static const double vals[] = {0.0, 0.5, -0.5, 1.0, -3.5, 3.5, 4.0, -4.0, 7.0, 6.5, -8.0};
    unsigned char buf[8];
    for (int dt = 0; dt < CCQ_DTYPE_COUNT_; dt++) {
        for (size_t k = 0; k < sizeof vals / sizeof vals[0]; k++) {
            double v = vals[k];
            if (!gpu_is_float((ccq_dtype)dt))
                v = trunc(v);
            if (!gpu_is_signed((ccq_dtype)dt) && v < 0)
                continue;
            if ((ccq_dtype)dt == CCQ_FLOAT8E5M2 && v == 6.5)
                continue; /* not representable in e5m2; never generated for it */
            gpu_store((ccq_dtype)dt, buf, 0, v);
            EXPECT(gpu_load((ccq_dtype)dt, buf, 0) == v, "codec %s: %g round-trips to %g",
                   ccq_dtype_name((ccq_dtype)dt), v, gpu_load((ccq_dtype)dt, buf, 0));
        }
    }
    /* Known encodings: 1.0 in float16 is 0x3C00, in bfloat16 0x3F80, in e4m3 0x38, in e5m2
     * 0x3C; -2.0 in e4m3 is 0xC0. */
    gpu_store(CCQ_FLOAT16, buf, 0, 1.0);
    EXPECT(((uint16_t *)buf)[0] == 0x3C00, "float16 1.0 encodes to 0x%04x", ((uint16_t *)buf)[0]);
    gpu_store(CCQ_BFLOAT16, buf, 0, 1.0);
    EXPECT(((uint16_t *)buf)[0] == 0x3F80, "bfloat16 1.0 encodes to 0x%04x", ((uint16_t *)buf)[0]);
    gpu_store(CCQ_FLOAT8E4M3, buf, 0, 1.0);
    EXPECT(buf[0] == 0x38, "e4m3 1.0 encodes to 0x%02x", buf[0]);
    gpu_store(CCQ_FLOAT8E4M3, buf, 0, -2.0);
    EXPECT(buf[0] == 0xC0, "e4m3 -2.0 encodes to 0x%02x", buf[0]);
    gpu_store(CCQ_FLOAT8E5M2, buf, 0, 1.0);
    EXPECT(buf[0] == 0x3C, "e5m2 1.0 encodes to 0x%02x", buf[0]);
}

int main(void)
{
    int cc0, cc1 = 0;
    ccq_stats stats = {.struct_size = sizeof stats};

    ndev = gpu_init(PROG, 200);
    cc0 = gpu_cc_major(0);
    if (ndev >= 2)
        cc1 = gpu_cc_major(1);
    printf("fp8 all_reduce is expected to %s on device 0 (compute capability %d.x)\n",
           cc0 >= 9 ? "work" : "be refused with CCQ_ERR_UNSUPPORTED", cc0);
    gpu_section("host codecs");
    check_codecs();
    gpu_section("runtime and communicators");
    rt = gpu_runtime_up(ndev);

    for (int dt = 0; dt < CCQ_DTYPE_COUNT_; dt++)
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
            one_rank((ccq_dtype)dt, counts[c], cc0 >= 9);
    if (ndev >= 2) {
        for (int dt = 0; dt < CCQ_DTYPE_COUNT_; dt++)
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
                two_ranks((ccq_dtype)dt, counts[c], cc0, cc1);
    } else {
        printf("note: 1 GPU: the two-rank checks need 2 and were not run\n");
    }

    gpu_section("stats and shutdown");
    if (CCQ_EXPECT_OK(ccq_get_stats(rt, &stats))) {
        printf("stats (since the last runtime reset): submitted %llu completed %llu failed %llu "
               "cancelled %llu pending %llu batches %llu\n",
               (unsigned long long)stats.submitted, (unsigned long long)stats.completed,
               (unsigned long long)stats.failed, (unsigned long long)stats.cancelled,
               (unsigned long long)stats.pending, (unsigned long long)stats.batches);
        EXPECT(stats.pending == 0, "%llu commands still pending after their fences",
               (unsigned long long)stats.pending);
        EXPECT(stats.submitted == stats.completed + stats.failed + stats.cancelled,
               "stats do not add up");
    }
    CCQ_EXPECT_OK(ccq_runtime_destroy(rt));
    return gpu_finish(PROG);
}
