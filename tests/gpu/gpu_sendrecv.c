/* send/recv on the NCCL backend: device 0 to itself on one stream (send first and recv
 * first) and on two streams, many pairs matched in per-pair order before one fence, and
 * an exchange between devices 0 and 1 when there are two GPUs. Data is checked bit for bit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_common.h"

#define PROG "gpu_sendrecv"

static const ccq_dtype dtypes[] = {CCQ_UINT8, CCQ_FLOAT16, CCQ_FLOAT32, CCQ_INT64, CCQ_FLOAT8E4M3};
static const size_t counts[] = {1, 1000, 12345, (size_t)1 << 20};

static ccq_runtime *rt;

static void reset(const char *why)
{
    printf("   resetting the runtime after: %s\n", why);
    ccq_runtime_destroy(rt);
    rt = gpu_runtime(30000, 0);
}

/* Random bytes for the source; the destination starts as their complement, so every byte
 * a receive fails to write shows. */
static unsigned char *make_data(size_t bytes, uint64_t seed, unsigned char **inv)
{
    unsigned char *in = malloc(bytes ? bytes : 1);
    *inv = malloc(bytes ? bytes : 1);
    if (in == NULL || *inv == NULL) {
        gpu_fail_at(__FILE__, __LINE__, "out of host memory");
        exit(1);
    }
    for (size_t i = 0; i < bytes; i++) {
        in[i] = (unsigned char)gpu_hash(seed * 0x100000001ull + i);
        (*inv)[i] = (unsigned char)~in[i];
    }
    return in;
}

static int same(const char *what, const unsigned char *want, const unsigned char *got, size_t bytes)
{
    size_t nbad = 0, first = 0;
    if (memcmp(want, got, bytes) == 0)
        return 1;
    for (size_t i = 0; i < bytes; i++)
        if (want[i] != got[i] && nbad++ == 0)
            first = i;
    gpu_fail_at(__FILE__, __LINE__,
                "%s: %zu of %zu bytes differ; first at byte %zu: 0x%02x, want 0x%02x", what, nbad,
                bytes, first, got[first], want[first]);
    return 0;
}

/* Device 0 sends to itself: send on stream ss, recv on stream rs. */
static int self_pair(ccq_dtype dt, size_t count, ccq_stream_id ss, ccq_stream_id rs, int recv_first)
{
    size_t bytes = count * ccq_dtype_size(dt);
    unsigned char *inv, *in = make_data(bytes, (uint64_t)dt * 131 + count, &inv);
    unsigned char *out = malloc(bytes);
    void *src = gpu_dev_alloc(0, bytes), *dst = gpu_dev_alloc(0, bytes);
    char what[160];
    int ok = 1;

    snprintf(what, sizeof what, "self %s x %zu, send on stream %u, recv on stream %u%s",
             ccq_dtype_name(dt), count, ss, rs, recv_first ? ", recv submitted first" : "");
    gpu_phase("%s", what);
    if (out == NULL) {
        gpu_fail_at(__FILE__, __LINE__, "out of host memory");
        exit(1);
    }
    gpu_to_dev(0, src, in, bytes);
    gpu_to_dev(0, dst, inv, bytes);
    for (int k = 0; k < 2 && ok; k++) {
        if (k == recv_first)
            ok = CCQ_EXPECT_OK(ccq_send(rt, 0, ss, src, count, dt, 0));
        else
            ok = CCQ_EXPECT_OK(ccq_recv(rt, 0, rs, dst, count, dt, 0));
    }
    if (ok) {
        ok &= CCQ_EXPECT_OK(ccq_sync_collective(rt, 0, ss));
        if (rs != ss)
            ok &= CCQ_EXPECT_OK(ccq_sync_collective(rt, 0, rs));
    }
    if (ok) {
        gpu_to_host(0, out, dst, bytes);
        ok = same(what, in, out, bytes);
    } else {
        reset(what);
    }
    gpu_dev_free(0, src);
    gpu_dev_free(0, dst);
    free(in);
    free(inv);
    free(out);
    return ok;
}

/* Many pairs before one fence per stream: the i-th send pairs with the i-th recv. */
static void many_pairs(void)
{
    enum { NPAIRS = 64, COUNT = 4096 };
    size_t bytes = COUNT * sizeof(float);
    unsigned char *in[NPAIRS], *inv[NPAIRS], *out = malloc(bytes);
    void *src[NPAIRS], *dst[NPAIRS];
    ccq_stats s0 = {.struct_size = sizeof s0}, s1 = {.struct_size = sizeof s1};
    int ok = 1, good = 0;
    uint64_t t0;

    gpu_section("self: %d pairs, sends on stream 2, recvs on stream 3, one fence each", NPAIRS);
    if (out == NULL) {
        gpu_fail_at(__FILE__, __LINE__, "out of host memory");
        exit(1);
    }
    for (int i = 0; i < NPAIRS; i++) {
        in[i] = make_data(bytes, 7000 + (uint64_t)i, &inv[i]);
        src[i] = gpu_dev_alloc(0, bytes);
        dst[i] = gpu_dev_alloc(0, bytes);
        gpu_to_dev(0, src[i], in[i], bytes);
        gpu_to_dev(0, dst[i], inv[i], bytes);
    }
    ccq_get_stats(rt, &s0);
    t0 = gpu_now_ns();
    for (int i = 0; i < NPAIRS && ok; i++)
        ok = CCQ_EXPECT_OK(ccq_send(rt, 0, 2, src[i], COUNT, CCQ_FLOAT32, 0));
    for (int i = 0; i < NPAIRS && ok; i++)
        ok = CCQ_EXPECT_OK(ccq_recv(rt, 0, 3, dst[i], COUNT, CCQ_FLOAT32, 0));
    if (ok)
        ok = CCQ_EXPECT_OK(ccq_sync_collective(rt, 0, 2)) &
             CCQ_EXPECT_OK(ccq_sync_collective(rt, 0, 3));
    if (ok) {
        double ms = gpu_since_ms(t0);
        ccq_get_stats(rt, &s1);
        for (int i = 0; i < NPAIRS; i++) {
            char what[64];
            snprintf(what, sizeof what, "pair %d of %d", i, NPAIRS);
            gpu_to_host(0, out, dst[i], bytes);
            good += same(what, in[i], out, bytes);
        }
        if (good == NPAIRS)
            printf("ok   %d self pairs across two streams in %.2f ms, %llu batch(es)\n", NPAIRS, ms,
                   (unsigned long long)(s1.batches - s0.batches));
    } else {
        reset("many pairs");
    }
    for (int i = 0; i < NPAIRS; i++) {
        gpu_dev_free(0, src[i]);
        gpu_dev_free(0, dst[i]);
        free(in[i]);
        free(inv[i]);
    }
    free(out);
}

/* Devices 0 and 1 swap buffers; each does send then recv on its stream 0 (a ring of two,
 * which only completes if both halves go into one group). */
static void exchange(size_t count)
{
    size_t bytes = count * sizeof(float);
    unsigned char *in[2], *inv[2], *out = malloc(bytes);
    void *src[2], *dst[2];
    char what[96];
    int ok = 1;

    snprintf(what, sizeof what, "exchange devices 0 <-> 1, float32 x %zu", count);
    gpu_phase("%s", what);
    if (out == NULL) {
        gpu_fail_at(__FILE__, __LINE__, "out of host memory");
        exit(1);
    }
    for (int d = 0; d < 2; d++) {
        in[d] = make_data(bytes, 9000 + (uint64_t)d * 17 + count, &inv[d]);
        src[d] = gpu_dev_alloc(d, bytes);
        dst[d] = gpu_dev_alloc(d, bytes);
        gpu_to_dev(d, src[d], in[d], bytes);
        gpu_to_dev(d, dst[d], inv[d], bytes);
    }
    for (int d = 0; d < 2 && ok; d++) {
        ccq_device_id me = (ccq_device_id)d, peer = (ccq_device_id)(1 - d);
        ok = CCQ_EXPECT_OK(ccq_send(rt, me, 0, src[d], count, CCQ_FLOAT32, peer)) &&
             CCQ_EXPECT_OK(ccq_recv(rt, me, 0, dst[d], count, CCQ_FLOAT32, peer));
    }
    if (ok)
        ok = CCQ_EXPECT_OK(ccq_sync_collective(rt, 0, 0)) &
             CCQ_EXPECT_OK(ccq_sync_collective(rt, 1, 0));
    if (ok) {
        int good = 1;
        for (int d = 0; d < 2; d++) {
            gpu_to_host(d, out, dst[d], bytes);
            good &= same(what, in[1 - d], out, bytes);
        }
        if (good)
            printf("ok   %s\n", what);
    } else {
        reset(what);
    }
    for (int d = 0; d < 2; d++) {
        gpu_dev_free(d, src[d]);
        gpu_dev_free(d, dst[d]);
        free(in[d]);
        free(inv[d]);
    }
    free(out);
}

int main(void)
{
    int ndev = gpu_init(PROG, 100);
    ccq_stats st = {.struct_size = sizeof st};

    rt = gpu_runtime(30000, 0);
    for (size_t t = 0; t < sizeof dtypes / sizeof dtypes[0]; t++) {
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
            uint64_t t0 = gpu_now_ns();
            int ok = self_pair(dtypes[t], counts[c], 0, 0, 0);
            ok &= self_pair(dtypes[t], counts[c], 0, 0, 1);
            ok &= self_pair(dtypes[t], counts[c], 0, 1, 0);
            ok &= self_pair(dtypes[t], counts[c], 1, 0, 1);
            if (ok)
                printf("ok   self %-9s x %-8zu: one stream (send first, recv first), two streams "
                       "(%.1f ms)\n",
                       ccq_dtype_name(dtypes[t]), counts[c], gpu_since_ms(t0));
        }
    }
    many_pairs();
    if (ndev >= 2) {
        exchange(1);
        exchange(1000);
        exchange((size_t)1 << 20);
    } else {
        printf("note: 1 GPU: the device 0 <-> 1 exchange needs 2 and was not run\n");
    }

    gpu_section("stats and shutdown");
    if (CCQ_EXPECT_OK(ccq_get_stats(rt, &st))) {
        printf("stats (since the last runtime reset): submitted %llu completed %llu failed %llu "
               "pending %llu batches %llu\n",
               (unsigned long long)st.submitted, (unsigned long long)st.completed,
               (unsigned long long)st.failed, (unsigned long long)st.pending,
               (unsigned long long)st.batches);
        EXPECT(st.pending == 0, "%llu commands still pending after their fences",
               (unsigned long long)st.pending);
    }
    CCQ_EXPECT_OK(ccq_runtime_destroy(rt));
    return gpu_finish(PROG);
}
