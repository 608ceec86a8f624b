/* broadcast, reduce, all_gather, reduce_scatter, all_to_all, gather and scatter on the NCCL
 * backend against a host reference: on a one-rank communicator (device 0; each collective
 * is then a copy, or a reduce of one input) for float32 and int32 (plus bfloat16, and fp8
 * on compute capability >= 9, for the reducing ones), counts 1, 1000 and 1 << 20, out of
 * place and in place; and on {0, 1} with root device 1 when there are two GPUs. dst starts
 * as a sentinel no expected value has, so a collective that did not run shows. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_common.h"

#define PROG "gpu_collectives"

enum { MAXR = 2 };

enum { K_BROADCAST, K_REDUCE, K_ALL_GATHER, K_REDUCE_SCATTER, K_ALL_TO_ALL, K_GATHER, K_SCATTER };
#define NKINDS 7
enum { U_ALL = 1, U_ROOT = 2 };

/* Each collective as ccq.h defines it: who reads src and writes dst, which of them holds
 * count * n elements, and whether it has an in-place form. */
static const struct gkind {
    const char *name;
    int reduces, rooted, has_in_place;
    int src_use, dst_use;
    int src_n, dst_n;
} kinds[NKINDS] = {
    [K_BROADCAST] = {"broadcast", 0, 1, 1, U_ROOT, U_ALL, 0, 0},
    [K_REDUCE] = {"reduce", 1, 1, 1, U_ALL, U_ROOT, 0, 0},
    [K_ALL_GATHER] = {"all_gather", 0, 0, 1, U_ALL, U_ALL, 0, 1},
    [K_REDUCE_SCATTER] = {"reduce_scatter", 1, 0, 1, U_ALL, U_ALL, 1, 0},
    [K_ALL_TO_ALL] = {"all_to_all", 0, 0, 0, U_ALL, U_ALL, 1, 1},
    [K_GATHER] = {"gather", 0, 1, 1, U_ALL, U_ROOT, 0, 1},
    [K_SCATTER] = {"scatter", 0, 1, 1, U_ROOT, U_ALL, 1, 0},
};

static const size_t counts[] = {1, 1000, (size_t)1 << 20};
static const ccq_device_id one[1] = {0};
static const ccq_device_id pair[2] = {0, 1};

static ccq_runtime *rt;
static int ndev;

static ccq_status submit_kind(int k, ccq_device_id d, const void *src, void *dst, size_t count,
                              ccq_dtype dt, ccq_reduce_op op, ccq_device_id root,
                              const ccq_device_id *devs, size_t n)
{
    switch (k) {
    case K_BROADCAST:
        return ccq_broadcast(rt, d, 0, src, dst, count, dt, root, devs, n);
    case K_REDUCE:
        return ccq_reduce(rt, d, 0, src, dst, count, dt, op, root, devs, n);
    case K_ALL_GATHER:
        return ccq_all_gather(rt, d, 0, src, dst, count, dt, devs, n);
    case K_REDUCE_SCATTER:
        return ccq_reduce_scatter(rt, d, 0, src, dst, count, dt, op, devs, n);
    case K_ALL_TO_ALL:
        return ccq_all_to_all(rt, d, 0, src, dst, count, dt, devs, n);
    case K_GATHER:
        return ccq_gather(rt, d, 0, src, dst, count, dt, root, devs, n);
    default:
        return ccq_scatter(rt, d, 0, src, dst, count, dt, root, devs, n);
    }
}

/* Test data: small values, so that every two-rank result is exact in every type used (fp8
 * integers in [-4, 4], other floats multiples of 0.5 in [-3.5, 3.5]); never the sentinel. */
static double gen(ccq_dtype dt, int rank, size_t i)
{
    uint64_t h = gpu_hash(((uint64_t)dt << 56) ^ ((uint64_t)rank << 48) ^ 0x5eedull ^ (uint64_t)i);
    if (gpu_is_fp8(dt))
        return (double)(int)(h % 9) - 4.0;
    if (gpu_is_float(dt))
        return ((double)(int)(h % 15) - 7.0) / 2.0;
    return (double)(int)(h % 11) - 5.0;
}

/* out = reduce(inputs[0..n-1]) over count elements; one input is its own reduction. */
static void ref_reduce(ccq_dtype dt, ccq_reduce_op op, int n, const unsigned char *const *inputs,
                       unsigned char *out, size_t count)
{
    if (n == 1) {
        memcpy(out, inputs[0], count * ccq_dtype_size(dt));
        return;
    }
    for (size_t i = 0; i < count; i++)
        gpu_store(dt, out, i,
                  gpu_ref2(dt, op, gpu_load(dt, inputs[0], i), gpu_load(dt, inputs[1], i)));
}

/* One collective over ranks 0..n-1 (devices 0..n-1): buffers per rank (device memory;
 * NULL where the rank uses none), the inputs, and the expected dst. */
typedef struct gcase {
    int k, n, root, in_place;
    ccq_dtype dt;
    ccq_reduce_op op;
    size_t count, es;
    const ccq_device_id *devs;
    size_t sb[MAXR], db[MAXR];
    int ip[MAXR]; /* rank r's src and dst share one allocation (NCCL's in-place position) */
    void *mem[MAXR][2];
    const void *src[MAXR];
    void *dst[MAXR];
    unsigned char *in[MAXR], *want[MAXR];
} gcase;

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (p == NULL) {
        gpu_fail_at(__FILE__, __LINE__, "out of host memory");
        exit(1);
    }
    return p;
}

static void reference(gcase *c)
{
    size_t blk = c->count * c->es;
    const unsigned char *inputs[MAXR];
    int n = c->n, root = c->root;

    switch (c->k) {
    case K_BROADCAST:
        for (int r = 0; r < n; r++)
            memcpy(c->want[r], c->in[root], blk);
        break;
    case K_REDUCE:
        for (int j = 0; j < n; j++)
            inputs[j] = c->in[j];
        ref_reduce(c->dt, c->op, n, inputs, c->want[root], c->count);
        break;
    case K_ALL_GATHER:
        for (int r = 0; r < n; r++)
            for (int j = 0; j < n; j++)
                memcpy(c->want[r] + (size_t)j * blk, c->in[j], blk);
        break;
    case K_REDUCE_SCATTER:
        for (int r = 0; r < n; r++) {
            for (int j = 0; j < n; j++)
                inputs[j] = c->in[j] + (size_t)r * blk;
            ref_reduce(c->dt, c->op, n, inputs, c->want[r], c->count);
        }
        break;
    case K_ALL_TO_ALL:
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++)
                memcpy(c->want[j] + (size_t)i * blk, c->in[i] + (size_t)j * blk, blk);
        break;
    case K_GATHER:
        for (int j = 0; j < n; j++)
            memcpy(c->want[root] + (size_t)j * blk, c->in[j], blk);
        break;
    default: /* K_SCATTER */
        for (int r = 0; r < n; r++)
            memcpy(c->want[r], c->in[root] + (size_t)r * blk, blk);
        break;
    }
}

/* Buffers, data (dst = sentinel 0xA5, then the inputs, which may lie inside it) and the
 * expected results. */
static void setup(gcase *c)
{
    const struct gkind *t = &kinds[c->k];
    size_t blk = c->count * c->es;

    for (int r = 0; r < c->n; r++) {
        int dev = (int)c->devs[r], is_root = r == c->root;
        int use_src = t->src_use == U_ALL || is_root;
        int use_dst = t->dst_use == U_ALL || is_root;
        c->sb[r] = use_src ? blk * (size_t)(t->src_n ? c->n : 1) : 0;
        c->db[r] = use_dst ? blk * (size_t)(t->dst_n ? c->n : 1) : 0;
        c->ip[r] = c->in_place && t->has_in_place && use_src && use_dst;
        if (c->ip[r]) {
            char *buf = gpu_dev_alloc(dev, c->sb[r] > c->db[r] ? c->sb[r] : c->db[r]);
            c->mem[r][0] = buf;
            switch (c->k) {
            case K_ALL_GATHER: /* src == dst + rank * count */
                c->dst[r] = buf;
                c->src[r] = buf + (size_t)r * blk;
                break;
            case K_REDUCE_SCATTER: /* dst == src + rank * count */
                c->src[r] = buf;
                c->dst[r] = buf + (size_t)r * blk;
                break;
            case K_GATHER: /* root: src == dst + root * count */
                c->dst[r] = buf;
                c->src[r] = buf + (size_t)c->root * blk;
                break;
            case K_SCATTER: /* root: dst == src + root * count */
                c->src[r] = buf;
                c->dst[r] = buf + (size_t)c->root * blk;
                break;
            default: /* src == dst */
                c->src[r] = c->dst[r] = buf;
                break;
            }
        } else {
            if (use_src)
                c->src[r] = c->mem[r][0] = gpu_dev_alloc(dev, c->sb[r]);
            if (use_dst)
                c->dst[r] = c->mem[r][1] = gpu_dev_alloc(dev, c->db[r]);
        }
        if (use_dst) {
            CUDA_REQUIRE(cudaSetDevice(dev));
            CUDA_REQUIRE(cudaMemset(c->dst[r], 0xA5, c->db[r]));
            CUDA_REQUIRE(cudaDeviceSynchronize());
            c->want[r] = xmalloc(c->db[r]);
        }
        if (use_src) {
            c->in[r] = xmalloc(c->sb[r]);
            for (size_t i = 0; i < c->sb[r] / c->es; i++)
                gpu_store(c->dt, c->in[r], i, gen(c->dt, r, i));
            gpu_to_dev(dev, (void *)(uintptr_t)c->src[r], c->in[r], c->sb[r]);
        }
    }
    CUDA_REQUIRE(cudaSetDevice(0));
    reference(c);
}

static void teardown(gcase *c)
{
    for (int r = 0; r < c->n; r++) {
        gpu_dev_free((int)c->devs[r], c->mem[r][0]);
        gpu_dev_free((int)c->devs[r], c->mem[r][1]);
        free(c->in[r]);
        free(c->want[r]);
    }
}

/* Does an expected dst hold the sentinel anywhere? Then a collective that never ran could
 * pass: a bug of the test data, reported as such. */
static int has_sentinel(const unsigned char *want, size_t bytes, size_t es)
{
    unsigned char s[8];
    memset(s, 0xA5, sizeof s);
    for (size_t i = 0; i + es <= bytes; i += es)
        if (memcmp(want + i, s, es) == 0)
            return 1;
    return 0;
}

/* Run one case; 1 if it passed. */
static int run_case(gcase *c, const char *what)
{
    ccq_device_id root_dev = c->devs[c->root];
    int ok = 1, submitted = 0;

    gpu_phase("%s: setup", what);
    setup(c);
    gpu_phase("%s: submit", what);
    for (int r = 0; r < c->n; r++) {
        ccq_status st = submit_kind(c->k, c->devs[r], c->src[r], c->dst[r], c->count, c->dt, c->op,
                                    root_dev, c->devs, (size_t)c->n);
        if (st != CCQ_OK) {
            gpu_fail_at(__FILE__, __LINE__, "%s: submit on device %u: %s: %s", what, c->devs[r],
                        gpu_st(st), ccq_last_error_detail());
            ok = 0;
            break;
        }
        submitted++;
    }
    if (!ok) {
        if (submitted > 0)
            rt = gpu_runtime_reset(rt, ndev, what); /* a lone part would wait out timeout_ms */
        teardown(c);
        return 0;
    }
    gpu_phase("%s: fence", what);
    for (int r = 0; r < c->n; r++) {
        ccq_status st = ccq_sync_collective(rt, c->devs[r], 0);
        if (st != CCQ_OK) {
            gpu_fail_at(__FILE__, __LINE__, "%s: fence on device %u: %s: %s", what, c->devs[r],
                        gpu_st(st), ccq_last_error_detail());
            ok = 0;
        }
    }
    if (!ok) {
        rt = gpu_runtime_reset(rt, ndev, what);
        teardown(c);
        return 0;
    }
    gpu_phase("%s: check", what);
    for (int r = 0; r < c->n; r++) {
        unsigned char *out;
        size_t nbad = 0, first = 0, n = c->db[r] / c->es;
        if (c->dst[r] == NULL)
            continue;
        if (!c->ip[r] && has_sentinel(c->want[r], c->db[r], c->es)) {
            gpu_fail_at(__FILE__, __LINE__, "%s: rank %d: test data holds the sentinel", what, r);
            ok = 0;
        }
        out = xmalloc(c->db[r]);
        gpu_to_host((int)c->devs[r], out, c->dst[r], c->db[r]);
        for (size_t i = 0; i < n; i++)
            if (memcmp(out + i * c->es, c->want[r] + i * c->es, c->es) != 0 && nbad++ == 0)
                first = i;
        if (nbad != 0) {
            gpu_fail_at(__FILE__, __LINE__,
                        "%s: rank %d (device %u): %zu of %zu elements wrong; first [%zu] (block "
                        "%zu): got %g%s, want %g",
                        what, r, c->devs[r], nbad, n, first, first / c->count,
                        gpu_load(c->dt, out, first),
                        has_sentinel(out + first * c->es, c->es, c->es) ? " (the sentinel: never "
                                                                          "written)"
                                                                        : "",
                        gpu_load(c->dt, c->want[r], first));
            ok = 0;
        }
        free(out);
    }
    teardown(c);
    return ok;
}

/* Every placement (and op) of one kind, dtype and count over n ranks, with one summary
 * line when all passed. */
static void run_group(int k, int n, ccq_dtype dt, size_t count, int cc_ok)
{
    const struct gkind *t = &kinds[k];
    int nops = t->reduces ? (n == 1 ? CCQ_REDUCE_OP_COUNT_ : 2) : 1;
    static const ccq_reduce_op two_rank_ops[2] = {CCQ_SUM, CCQ_MAX};
    char done[128] = "";
    uint64_t t0 = gpu_now_ns();
    int bad = 0;

    for (int ip = 0; ip < 2; ip++) {
        if (ip && !t->has_in_place)
            continue;
        for (int o = 0; o < nops; o++) {
            ccq_reduce_op op = n == 1 ? (ccq_reduce_op)o : two_rank_ops[o];
            char what[160];
            gcase c;
            memset(&c, 0, sizeof c);
            c.k = k;
            c.n = n;
            c.root = t->rooted ? n - 1 : 0; /* root device 1 on {0, 1} */
            c.in_place = ip;
            c.dt = dt;
            c.op = op;
            c.count = count;
            c.es = ccq_dtype_size(dt);
            c.devs = n == 1 ? one : pair;
            snprintf(what, sizeof what, "%d rank%s %s %s x %zu%s%s%s", n, n == 1 ? "" : "s",
                     t->name, ccq_dtype_name(dt), count, ip ? " in place" : "",
                     t->reduces ? " " : "", t->reduces ? ccq_reduce_op_name(op) : "");
            if (!cc_ok) {
                /* fp8 reduction below compute capability 9.0: refused at the call. */
                ccq_status st;
                gpu_phase("%s: expecting a refusal", what);
                setup(&c);
                st = submit_kind(k, 0, c.src[0], c.dst[0], count, dt, op, c.devs[c.root], c.devs,
                                 (size_t)n);
                EXPECT(st == CCQ_ERR_UNSUPPORTED,
                       "%s: compute capability < 9 must refuse fp8 reductions with "
                       "CCQ_ERR_UNSUPPORTED, got %s",
                       what, gpu_st(st));
                if (st == CCQ_ERR_UNSUPPORTED)
                    EXPECT(ccq_last_error_detail()[0] != '\0', "%s: no detail", what);
                else if (st == CCQ_OK && ccq_sync_collective(rt, 0, 0) != CCQ_OK)
                    rt = gpu_runtime_reset(rt, ndev, what);
                teardown(&c);
                continue;
            }
            if (!run_case(&c, what)) {
                bad = 1;
                continue;
            }
            if (o == 0)
                strncat(done,
                        ip ? " | in place:" : " out of place:", sizeof done - strlen(done) - 1);
            if (t->reduces) {
                strncat(done, " ", sizeof done - strlen(done) - 1);
                strncat(done, ccq_reduce_op_name(op), sizeof done - strlen(done) - 1);
            } else {
                strncat(done, " ok", sizeof done - strlen(done) - 1);
            }
        }
    }
    if (!bad)
        printf("ok   %d rank%s %-14s %-9s x %-8zu:%s (%.1f ms)\n", n, n == 1 ? " " : "s", t->name,
               ccq_dtype_name(dt), count,
               cc_ok ? done : " refused (fp8 reduction below cc 9.0, as expected)",
               gpu_since_ms(t0));
}

int main(void)
{
    static const ccq_dtype copy_types[] = {CCQ_FLOAT32, CCQ_INT32};
    static const ccq_dtype reduce_types[] = {CCQ_FLOAT32, CCQ_INT32, CCQ_BFLOAT16, CCQ_FLOAT8E4M3};
    ccq_stats stats = {.struct_size = sizeof stats};
    int cc0;

    ndev = gpu_init(PROG, 220);
    cc0 = gpu_cc_major(0);
    printf("fp8 reduce and reduce_scatter are expected to %s on device 0 (compute capability "
           "%d.x)\n",
           cc0 >= 9 ? "work" : "be refused with CCQ_ERR_UNSUPPORTED", cc0);
    gpu_section("runtime and communicators");
    rt = gpu_runtime_up(ndev);

    gpu_section("one rank (device 0)");
    for (int k = 0; k < NKINDS; k++) {
        const ccq_dtype *types = kinds[k].reduces ? reduce_types : copy_types;
        size_t ntypes = kinds[k].reduces ? sizeof reduce_types / sizeof reduce_types[0]
                                         : sizeof copy_types / sizeof copy_types[0];
        for (size_t t = 0; t < ntypes; t++)
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
                run_group(k, 1, types[t], counts[c], !gpu_is_fp8(types[t]) || cc0 >= 9);
    }
    if (ndev >= 2) {
        gpu_section("two ranks (devices 0 and 1, root device 1)");
        for (int k = 0; k < NKINDS; k++)
            for (size_t t = 0; t < sizeof copy_types / sizeof copy_types[0]; t++)
                for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
                    run_group(k, 2, copy_types[t], counts[c], 1);
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
