/* ccq-perf: measure ccq collectives and print nccl-tests' table, so figures compare directly
 * with published NCCL numbers. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ccq.h"
#include "ref.h"

typedef enum {
    COLL_ALL_REDUCE,
    COLL_SENDRECV,
    COLL_BROADCAST,
    COLL_REDUCE,
    COLL_ALL_GATHER,
    COLL_REDUCE_SCATTER,
    COLL_ALLTOALL,
    COLL_GATHER,
    COLL_SCATTER,
    COLL_COUNT_
} coll_kind;

/*
 * What ccq-perf knows about each collective: its name on the command line and in the
 * table (nccl-tests' binary name, without "_perf"), the ccq_kind it runs, and nccl-tests'
 * conventions for it:
 *  - per_rank_n: the size S of a line is the buffer that holds count * n elements (the
 *    receive buffer of all_gather and gather, the send buffer of reduce_scatter and
 *    scatter, either buffer of alltoall); each rank's block is then (S / esize) / n
 *    elements. Otherwise the block is S / esize elements and S is the buffer size.
 *  - busbw: algbw (= S / time) times 2(n-1)/n for all_reduce, (n-1)/n for all_gather,
 *    reduce_scatter, alltoall, gather and scatter, 1 for broadcast, reduce and sendrecv
 *    (nccl-tests' doc/PERFORMANCE.md).
 *  - rooted: -r applies and the root column shows it (-1 otherwise).
 *  - in_place: NCCL defines an in-place form (not alltoall's, not sendrecv's).
 */
typedef struct coll_info {
    const char *name;
    ccq_kind kind;
    bool reduces, rooted, per_rank_n, in_place;
} coll_info;

static const coll_info colls[COLL_COUNT_] = {
    [COLL_ALL_REDUCE] = {"all_reduce", CCQ_KIND_ALL_REDUCE, true, false, false, true},
    [COLL_SENDRECV] = {"sendrecv", CCQ_KIND_SEND, false, false, false, false},
    [COLL_BROADCAST] = {"broadcast", CCQ_KIND_BROADCAST, false, true, false, true},
    [COLL_REDUCE] = {"reduce", CCQ_KIND_REDUCE, true, true, false, true},
    [COLL_ALL_GATHER] = {"all_gather", CCQ_KIND_ALL_GATHER, false, false, true, true},
    [COLL_REDUCE_SCATTER] = {"reduce_scatter", CCQ_KIND_REDUCE_SCATTER, true, false, true, true},
    [COLL_ALLTOALL] = {"alltoall", CCQ_KIND_ALL_TO_ALL, false, false, true, false},
    [COLL_GATHER] = {"gather", CCQ_KIND_GATHER, false, true, true, true},
    [COLL_SCATTER] = {"scatter", CCQ_KIND_SCATTER, false, true, true, true},
};

typedef struct opts {
    size_t minbytes, maxbytes;
    double factor;   /* -f: multiplicative step (nccl-tests' -f) */
    size_t incbytes; /* -i: additive step (nccl-tests' -i), used when factor == 0 */
    uint32_t ndev;
    uint32_t threads;
    int iters, warmup, check, agg;
    ccq_dtype dtype;
    ccq_reduce_op op;
    coll_kind coll;
    uint32_t root; /* -r: the root device of rooted collectives */
    const char *backend;
    bool json;
    bool floor;             /* --floor: time the memory-traffic floor next to each line */
    uint32_t max_batch_ops; /* 0 = the config's default */
} opts;

/* One submitting thread: a device, a stream, its own buffers. */
typedef struct worker {
    struct bench *b;
    ccq_device_id dev;
    ccq_stream_id stream;
    void *src, *dst;   /* memory from ccq_mem_alloc (device memory on NCCL) */
    void *hsrc, *hdst; /* host staging for fills and checks */
    ccq_status err;
    char detail[512];
} worker;

typedef struct bench {
    const opts *o;
    ccq_runtime *rt;
    ccq_device_id *devs;
    /* A world of several processes (mpirun -np P ccq-perf -g G): o->ndev counts every
     * process's devices; this one runs the workers of devices first .. first + nlocal - 1
     * and meets the others with small ccq collectives on stream `ctl` (barrier, the
     * slowest time, the sum of #wrong). */
    uint32_t wrank, wsize, first, nlocal;
    ccq_stream_id ctl;
    worker *w; /* [ndev * threads] */
    pthread_barrier_t bar;
    /* Set by the main thread before each phase. */
    size_t count; /* elements per rank and block: the count argument of the calls */
    int in_place, iters, agg;
    size_t copy_bytes; /* > 0: the phase is the floor's memcpy of this many bytes per worker */
    volatile int quit;
} bench;

static const char *nccl_type_name(ccq_dtype d)
{
    static const char *const n[CCQ_DTYPE_COUNT_] = {
        [CCQ_INT8] = "int8",         [CCQ_UINT8] = "uint8",       [CCQ_INT32] = "int32",
        [CCQ_UINT32] = "uint32",     [CCQ_INT64] = "int64",       [CCQ_UINT64] = "uint64",
        [CCQ_FLOAT16] = "half",      [CCQ_FLOAT32] = "float",     [CCQ_FLOAT64] = "double",
        [CCQ_BFLOAT16] = "bfloat16", [CCQ_FLOAT8E4M3] = "f8e4m3", [CCQ_FLOAT8E5M2] = "f8e5m2",
    };
    return n[d];
}

static int parse_dtype(const char *s, ccq_dtype *out)
{
    for (int d = 0; d < CCQ_DTYPE_COUNT_; d++)
        if (strcmp(s, nccl_type_name((ccq_dtype)d)) == 0 ||
            strcmp(s, ccq_dtype_name((ccq_dtype)d)) == 0) {
            *out = (ccq_dtype)d;
            return 0;
        }
    return -1;
}

static int parse_op(const char *s, ccq_reduce_op *out)
{
    for (int o = 0; o < CCQ_REDUCE_OP_COUNT_; o++)
        if (strcmp(s, ccq_reduce_op_name((ccq_reduce_op)o)) == 0) {
            *out = (ccq_reduce_op)o;
            return 0;
        }
    return -1;
}

/* "64M", "8K", "1G", "512" -> bytes. */
static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'G':
    case 'g':
        v *= 1024.0; /* fall through */
    case 'M':
    case 'm':
        v *= 1024.0; /* fall through */
    case 'K':
    case 'k':
        v *= 1024.0;
        break;
    default:
        break;
    }
    return (size_t)v;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: ccq-perf [options]   (flags as nccl-tests)\n"
        "  -b, --minbytes SIZE    smallest size per rank (default 8; K/M/G suffixes)\n"
        "  -e, --maxbytes SIZE    largest size (default 64M)\n"
        "  -f, --stepfactor F     multiply the size by F each step (default 2)\n"
        "  -i, --stepbytes SIZE   add SIZE each step instead (-f 0)\n"
        "  -g, --ngpus N          devices (default: 4 on host, all GPUs on nccl)\n"
        "  -t, --nthreads N       submitting threads per device, each on its own stream\n"
        "  -n, --iters N          timed iterations (default 20)\n"
        "  -w, --warmup_iters N   warm-up iterations (default 5)\n"
        "  -m, --agg_iters N      operations submitted per iteration before the fence\n"
        "  -c, --check 0/1        check results on the first iteration (default 1)\n"
        "  -o, --op OP            sum, prod, max, min, avg (default sum)\n"
        "  -d, --datatype T       float, half, bfloat16, double, int8, uint8, int32, uint32,\n"
        "                         int64, uint64, f8e4m3, f8e5m2 (default float)\n"
        "  -r, --root ROOT        root device of broadcast, reduce, gather, scatter (default 0)\n"
        "      --collective C     all_reduce (default), sendrecv, broadcast, reduce, all_gather,\n"
        "                         reduce_scatter, alltoall, gather, scatter\n"
        "      --backend B        host (default) or nccl\n"
        "      --max-batch-ops N  the runtime's max_batch_ops\n"
        "      --json             one JSON object per size line instead of the table\n"
        "      --floor            host backend: also time a parallel memcpy that moves the\n"
        "                         bytes the collective must read and write (out of place),\n"
        "                         and print that floor and the share of it reached\n");
}

static int parse_opts(int argc, char **argv, opts *o)
{
    static const struct option lo[] = {
        {"minbytes", 1, 0, 'b'},   {"maxbytes", 1, 0, 'e'},
        {"stepfactor", 1, 0, 'f'}, {"stepbytes", 1, 0, 'i'},
        {"ngpus", 1, 0, 'g'},      {"nthreads", 1, 0, 't'},
        {"iters", 1, 0, 'n'},      {"warmup_iters", 1, 0, 'w'},
        {"agg_iters", 1, 0, 'm'},  {"check", 1, 0, 'c'},
        {"op", 1, 0, 'o'},         {"datatype", 1, 0, 'd'},
        {"collective", 1, 0, 'C'}, {"backend", 1, 0, 'B'},
        {"json", 0, 0, 'J'},       {"max-batch-ops", 1, 0, 'M'},
        {"help", 0, 0, 'h'},       {"root", 1, 0, 'r'},
        {"floor", 0, 0, 'F'},      {0, 0, 0, 0},
    };
    int c;
    memset(o, 0, sizeof *o);
    o->minbytes = 8;
    o->maxbytes = 64u << 20;
    o->factor = 2;
    o->threads = 1;
    o->iters = 20;
    o->warmup = 5;
    o->check = 1;
    o->agg = 1;
    o->dtype = CCQ_FLOAT32;
    o->op = CCQ_SUM;
    o->coll = COLL_ALL_REDUCE;
    o->backend = "host";
    while ((c = getopt_long(argc, argv, "b:e:f:i:g:t:n:w:m:c:o:d:r:h", lo, NULL)) != -1) {
        switch (c) {
        case 'b':
            o->minbytes = parse_size(optarg);
            break;
        case 'e':
            o->maxbytes = parse_size(optarg);
            break;
        case 'f':
            o->factor = atof(optarg);
            break;
        case 'i':
            o->incbytes = parse_size(optarg);
            o->factor = 0;
            break;
        case 'g':
            o->ndev = (uint32_t)atoi(optarg);
            break;
        case 't':
            o->threads = (uint32_t)atoi(optarg);
            break;
        case 'n':
            o->iters = atoi(optarg);
            break;
        case 'w':
            o->warmup = atoi(optarg);
            break;
        case 'm':
            o->agg = atoi(optarg);
            break;
        case 'c':
            o->check = atoi(optarg);
            break;
        case 'o':
            if (parse_op(optarg, &o->op)) {
                fprintf(stderr, "ccq-perf: unknown op '%s'\n", optarg);
                return -1;
            }
            break;
        case 'd':
            if (parse_dtype(optarg, &o->dtype)) {
                fprintf(stderr, "ccq-perf: unknown datatype '%s'\n", optarg);
                return -1;
            }
            break;
        case 'C': {
            int k = 0;
            /* ccq's name of alltoall is accepted too. */
            const char *name = strcmp(optarg, "all_to_all") == 0 ? "alltoall" : optarg;
            while (k < COLL_COUNT_ && strcmp(name, colls[k].name) != 0)
                k++;
            if (k == COLL_COUNT_) {
                fprintf(stderr, "ccq-perf: unknown collective '%s'\n", optarg);
                return -1;
            }
            o->coll = (coll_kind)k;
            break;
        }
        case 'r':
            o->root = (uint32_t)atoi(optarg);
            break;
        case 'B':
            o->backend = optarg;
            break;
        case 'J':
            o->json = true;
            break;
        case 'F':
            o->floor = true;
            break;
        case 'M':
            o->max_batch_ops = (uint32_t)atoi(optarg);
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            return -1;
        }
    }
    if (o->threads < 1 || o->iters < 1 || o->warmup < 0 || o->agg < 1 ||
        o->minbytes > o->maxbytes || (o->factor <= 1 && o->incbytes == 0)) {
        fprintf(stderr, "ccq-perf: invalid option values\n");
        usage(stderr);
        return -1;
    }
    return 0;
}

/*
 * The buffers this worker passes. Out of place: its src and dst allocations. In place, as
 * nccl-tests lays it out: src == dst for all_reduce, broadcast and reduce; the small buffer
 * is block `rank` of the big one for the others (all_gather and gather: src = dst + rank *
 * count; reduce_scatter and scatter: dst = src + rank * count), on every rank (non-root
 * ranks of gather and scatter pass a buffer they do not use). Devices are 0..n-1, so a
 * device is its own rank.
 */
static void part_buffers(const worker *w, void **src, void **dst)
{
    const bench *b = w->b;
    size_t off = (size_t)w->dev * b->count * ccq_dtype_size(b->o->dtype);

    *src = w->src;
    *dst = w->dst;
    if (!b->in_place)
        return;
    switch (b->o->coll) {
    case COLL_ALL_GATHER:
    case COLL_GATHER:
        *src = (char *)w->dst + off;
        break;
    case COLL_REDUCE_SCATTER:
    case COLL_SCATTER:
        *dst = (char *)w->src + off;
        break;
    default:
        *dst = w->src;
        break;
    }
}

/* Submit one operation of this worker (one part of a collective, or send + recv). */
static ccq_status submit_one(worker *w)
{
    bench *b = w->b;
    const opts *o = b->o;
    uint32_t n = o->ndev;
    void *src, *dst;

    part_buffers(w, &src, &dst);
    if (o->coll != COLL_SENDRECV)
        return ref_submit(b->rt, colls[o->coll].kind, w->dev, w->stream, src, dst, b->count,
                          o->dtype, o->op, o->root, b->devs, n);
    /* sendrecv as nccl-tests: send to the next rank, receive from the previous one. */
    ccq_status st =
        ccq_send(b->rt, w->dev, w->stream, w->src, b->count, o->dtype, (w->dev + 1) % n);
    if (st != CCQ_OK)
        return st;
    return ccq_recv(b->rt, w->dev, w->stream, w->dst, b->count, o->dtype, (w->dev + n - 1) % n);
}

static void record(worker *w, ccq_status st)
{
    if (st != CCQ_OK && w->err == CCQ_OK) {
        w->err = st;
        snprintf(w->detail, sizeof w->detail, "%s", ccq_last_error_detail());
    }
}

/* One timed phase of one worker: iters x (agg submissions), one fence at the end. */
static void worker_phase(worker *w)
{
    bench *b = w->b;
    if (b->copy_bytes > 0) { /* the floor: host staging buffers, no ccq call */
        for (int it = 0; it < b->iters * b->agg; it++)
            memcpy(w->hdst, w->hsrc, b->copy_bytes);
        return;
    }
    for (int it = 0; it < b->iters; it++)
        for (int a = 0; a < b->agg; a++)
            record(w, submit_one(w));
    record(w, ccq_sync_collective(b->rt, w->dev, w->stream));
}

/* Workers 1.. on threads of their own; the barriers start everybody together and let the
 * main thread, which is worker 0 (nccl-tests' way: with one device the timed loop runs on
 * the thread that times it, as a single-threaded MPI benchmark's does), time the phase. */
static void *worker_main(void *arg)
{
    worker *w = arg;
    bench *b = w->b;
    for (;;) {
        pthread_barrier_wait(&b->bar);
        if (b->quit)
            break;
        worker_phase(w);
        pthread_barrier_wait(&b->bar);
    }
    return NULL;
}

static double world_reduce(bench *b, double v, ccq_reduce_op op);

/* Inputs: tests/ref.c's. Across processes MPI adds the per-process partials in an order of
 * its own, so float inputs are then small integers (-1, 0, 1), whose sums are exact in every
 * type and so the same in any order; integers wrap, in any order alike. */
static void fill_values(const bench *b, void *buf, size_t n, uint32_t seed)
{
    ccq_dtype dt = b->o->dtype;
    size_t es = ccq_dtype_size(dt);
    bool is_float = dt == CCQ_FLOAT16 || dt == CCQ_FLOAT32 || dt == CCQ_FLOAT64 ||
                    dt == CCQ_BFLOAT16 || dt == CCQ_FLOAT8E4M3 || dt == CCQ_FLOAT8E5M2;
    if (b->wsize <= 1 || !is_float) {
        ref_fill(dt, buf, n, seed);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float v = (float)((int)((seed * 7u + i * 3u + (i >> 3)) % 3u) - 1);
        uint64_t code = 0;
        if (dt == CCQ_FLOAT32)
            memcpy(&code, &v, 4);
        else if (dt == CCQ_FLOAT64) {
            double x = v;
            memcpy(&code, &x, 8);
        } else
            code = ref_encode(dt, v);
        memcpy((char *)buf + i * es, &code, es); /* little endian */
    }
}

/* One timed phase; across processes they start together (a world all_reduce as the
 * barrier) and the slowest process's time counts, as nccl-tests reports. */
static double run_phase(bench *b, int iters, int agg)
{
    double t0, t1;
    b->iters = iters;
    b->agg = agg;
    world_reduce(b, 0, CCQ_SUM);
    pthread_barrier_wait(&b->bar); /* start */
    t0 = now_s();
    worker_phase(&b->w[0]);
    pthread_barrier_wait(&b->bar); /* every worker fenced */
    t1 = now_s();
    return world_reduce(b, t1 - t0, CCQ_MAX);
}

/* Elements device dev's src holds in the current phase (0 where the rank does not use it:
 * non-root ranks of broadcast and scatter). */
static size_t src_elems_of(const bench *b, ccq_device_id dev)
{
    const opts *o = b->o;
    if (o->coll == COLL_SENDRECV)
        return b->count;
    return ref_src_count(colls[o->coll].kind, o->ndev, o->root, dev, b->count);
}

/* And this worker's src and dst (dst: 0 for non-root ranks of reduce and gather). */
static size_t src_elems(const bench *b, const worker *w)
{
    return src_elems_of(b, w->dev);
}

/* Across processes: a ccq all_reduce of one value per local device over every device of
 * the world (each local device passes the same value), on the control stream. */
static double world_reduce(bench *b, double v, ccq_reduce_op op)
{
    double in[64], out[64];
    if (b->wsize <= 1)
        return v;
    for (uint32_t k = 0; k < b->nlocal; k++) {
        in[k] = op == CCQ_SUM && k > 0 ? 0 : v;
        ccq_all_reduce(b->rt, b->first + k, b->ctl, &in[k], &out[k], 1, CCQ_FLOAT64, op, b->devs,
                       b->o->ndev);
    }
    for (uint32_t k = 0; k < b->nlocal; k++)
        ccq_sync_collective(b->rt, b->first + k, b->ctl);
    return out[0];
}

static size_t dst_elems(const bench *b, const worker *w)
{
    const opts *o = b->o;
    if (o->coll == COLL_SENDRECV)
        return b->count;
    return ref_dst_count(colls[o->coll].kind, o->ndev, o->root, w->dev, b->count);
}

/*
 * Inputs depend only on the device, so whichever thread's part a collective matches with
 * (threads of one device race for the communicator's sequence numbers), results hold. With
 * `poison`, outputs are overwritten first (before the inputs, which in place may lie inside
 * them), so an element the collective does not write is counted wrong.
 */
static void fill_inputs(bench *b, bool poison)
{
    const opts *o = b->o;
    size_t es = ccq_dtype_size(o->dtype);
    for (uint32_t k = 0; k < b->nlocal * o->threads; k++) {
        worker *w = &b->w[k];
        void *src, *dst;
        size_t sn = src_elems(b, w), dn = dst_elems(b, w);
        part_buffers(w, &src, &dst);
        if (poison && dn > 0) {
            memset(w->hdst, 0x5a, dn * es);
            ccq_mem_copy(b->rt, w->dev, dst, w->hdst, dn * es, CCQ_COPY_TO_DEVICE);
        }
        fill_values(b, w->hsrc, sn, 1000 + w->dev);
        if (sn > 0)
            ccq_mem_copy(b->rt, w->dev, src, w->hsrc, sn * es, CCQ_COPY_TO_DEVICE);
    }
}

/* Run one operation and count wrong elements against the reference (tools/ref/ref.c). */
static size_t check_once(bench *b)
{
    const opts *o = b->o;
    size_t es = ccq_dtype_size(o->dtype), wrong = 0;
    size_t cap = b->count * (colls[o->coll].per_rank_n ? o->ndev : 1u);
    char msg[256];
    void *want = malloc(cap * es + 1);
    const void **ins = calloc(o->ndev, sizeof *ins);
    void **remote = calloc(o->ndev, sizeof *remote);

    fill_inputs(b, true);
    world_reduce(b, 0, CCQ_SUM); /* every process filled before any starts */
    run_phase(b, 1, 1);
    for (uint32_t d = 0; d < o->ndev; d++) {
        if (d >= b->first && d < b->first + b->nlocal) {
            ins[d] = b->w[(d - b->first) * o->threads].hsrc;
            continue;
        }
        /* Another process's device: its inputs depend only on its id (fill_inputs). */
        size_t sn = src_elems_of(b, d);
        remote[d] = malloc(sn * es + 1);
        fill_values(b, remote[d], sn, 1000 + d);
        ins[d] = remote[d];
    }
    for (uint32_t k = 0; k < b->nlocal * o->threads; k++) {
        worker *w = &b->w[k];
        void *src, *dst;
        size_t dn = dst_elems(b, w);
        part_buffers(w, &src, &dst);
        size_t wn = dn;
        if (o->coll == COLL_SENDRECV)
            memcpy(want, ins[(w->dev + o->ndev - 1) % o->ndev], dn * es);
        else
            wn = ref_collective(colls[o->coll].kind, o->dtype, o->op, o->ndev, o->root, ins, w->dev,
                                want, b->count);
        if (wn != dn) { /* the reference disagrees on what this rank receives */
            wrong += wn > dn ? wn : dn;
            continue;
        }
        if (dn == 0)
            continue;
        ccq_mem_copy(b->rt, w->dev, w->hdst, dst, dn * es, CCQ_COPY_TO_HOST);
        wrong += ref_compare(o->dtype, w->hdst, want, dn, msg, sizeof msg);
    }
    free(want);
    free(ins);
    for (uint32_t d = 0; d < o->ndev; d++)
        free(remote[d]);
    free(remote);
    return wrong;
}

static double busbw_factor_num(coll_kind c, uint32_t n)
{
    switch (c) {
    case COLL_ALL_REDUCE:
        return n > 1 ? 2.0 * (n - 1) / n : 0.0;
    case COLL_ALL_GATHER:
    case COLL_REDUCE_SCATTER:
    case COLL_ALLTOALL:
    case COLL_GATHER:
    case COLL_SCATTER:
        return (double)(n - 1) / n;
    default: /* sendrecv, broadcast, reduce */
        return 1.0;
    }
}

/*
 * --floor: the bytes an out-of-place collective of line size S over n ranks must at least
 * read plus write in host memory (each input read once, each output written once):
 * all_reduce, alltoall and sendrecv read and write n*S; broadcast reads S once and writes
 * it n times, reduce reads n*S and writes S, all_gather reads n blocks of S/n and writes n*S,
 * reduce_scatter reads n*S and writes n blocks of S/n: (n+1)*S; gather and scatter move S
 * in and S out: 2*S. A memcpy of X bytes reads and writes X, so the floor is the time the
 * workers take to memcpy half of it in parallel, on their own host buffers, right after
 * the collective at the same size.
 */
static double floor_traffic(coll_kind c, uint32_t n, size_t bytes)
{
    switch (c) {
    case COLL_ALL_REDUCE:
    case COLL_ALLTOALL:
    case COLL_SENDRECV:
        return 2.0 * n * (double)bytes;
    case COLL_GATHER:
    case COLL_SCATTER:
        return 2.0 * (double)bytes;
    default: /* broadcast, reduce, all_gather, reduce_scatter */
        return (n + 1.0) * (double)bytes;
    }
}

typedef struct result {
    double us, algbw, busbw;
    double floor_us; /* 0 when not measured */
    size_t wrong;
    bool skipped;
} result;

/* Time the floor's parallel memcpy of `bytes` bytes per worker, per operation. */
static double measure_floor(bench *b, size_t bytes)
{
    const opts *o = b->o;
    b->copy_bytes = bytes;
    run_phase(b, 1, 1); /* warm: page faults and caches */
    double t = run_phase(b, o->iters, o->agg);
    b->copy_bytes = 0;
    return t * 1e6 / ((double)o->iters * o->agg);
}

static result measure(bench *b, size_t bytes)
{
    const opts *o = b->o;
    result r = {0};

    if (b->in_place && !colls[o->coll].in_place) {
        /* sendrecv: a send and a recv on one buffer conflict, so the ring could not form
         * one group. alltoall: NCCL has no in-place form (ccq refuses it). */
        r.skipped = true;
        return r;
    }
    if (o->check) /* every process checks its devices; the table shows the world's sum */
        r.wrong = (size_t)world_reduce(b, (double)check_once(b), CCQ_SUM);
    else
        fill_inputs(b, false);
    if (o->warmup > 0)
        run_phase(b, o->warmup, o->agg);
    double t = run_phase(b, o->iters, o->agg);
    r.us = t * 1e6 / ((double)o->iters * o->agg);
    r.algbw = r.us > 0 ? (double)bytes / r.us / 1e3 : 0;
    r.busbw = r.algbw * busbw_factor_num(o->coll, o->ndev);
    if (o->floor && !b->in_place) {
        /* Each of the `threads` streams of a device runs its own collective in an
         * iteration, so each worker copies one device's share of one collective. */
        double per_worker = floor_traffic(o->coll, o->ndev, bytes) / 2 / o->ndev;
        if (per_worker >= 1)
            r.floor_us = measure_floor(b, (size_t)per_worker);
    }
    return r;
}

static void print_result(const result *r)
{
    if (r->skipped)
        printf("  %7s  %6s  %6s  %6s", "N/A", "N/A", "N/A", "N/A");
    else
        printf("  %7.2f  %6.2f  %6.2f  %6zu", r->us, r->algbw, r->busbw, r->wrong);
}

static void json_result(const char *name, const result *r)
{
    if (r->skipped)
        printf("\"%s\": null", name);
    else {
        printf("\"%s\": {\"time_us\": %.3f, \"algbw\": %.4f, \"busbw\": %.4f, \"wrong\": %zu", name,
               r->us, r->algbw, r->busbw, r->wrong);
        if (r->floor_us > 0)
            printf(", \"floor_us\": %.3f, \"of_floor\": %.4f", r->floor_us, r->floor_us / r->us);
        printf("}");
    }
}

static int first_error(bench *b)
{
    for (uint32_t k = 0; k < b->nlocal * b->o->threads; k++)
        if (b->w[k].err != CCQ_OK) {
            fprintf(stderr, "ccq-perf: device %u stream %u: %s: %s\n", b->w[k].dev, b->w[k].stream,
                    ccq_status_name(b->w[k].err), b->w[k].detail);
            return 1;
        }
    return 0;
}

int main(int argc, char **argv)
{
    opts o;
    bench b;
    ccq_config cfg;
    ccq_status st;
    pthread_t *th;
    uint32_t nw;
    size_t esize, wrong_total = 0;
    double bw_sum = 0;
    int nbw = 0, rc = 0;

    if (parse_opts(argc, argv, &o) != 0)
        return 2;
    ccq_config_init(&cfg);
    cfg.backend = o.backend;
    if (strcmp(o.backend, "host") == 0)
        cfg.host_devices = o.ndev ? o.ndev : 4;
    if (o.max_batch_ops)
        cfg.max_batch_ops = o.max_batch_ops;
    if (o.threads + 1 > cfg.max_streams) /* + the control stream */
        cfg.max_streams = o.threads + 1;
    /* Under mpirun (the launcher's world in the environment, read by ccq_config_init), as
     * nccl-tests: -g is the devices of each process, the processes meet through MPI. */
    if (cfg.world_size > 1 && cfg.bootstrap == NULL)
        cfg.bootstrap = "mpi";
    memset(&b, 0, sizeof b);
    b.o = &o;
    st = ccq_runtime_create(&cfg, &b.rt);
    if (st != CCQ_OK) {
        fprintf(stderr, "ccq-perf: ccq_runtime_create: %s: %s\n", ccq_status_name(st),
                ccq_last_error_detail());
        return st == CCQ_ERR_UNSUPPORTED ? 77 : 1;
    }
    b.wrank = ccq_world_rank(b.rt);
    b.wsize = ccq_world_size(b.rt);
    ccq_local_devices(b.rt, &b.first, &b.nlocal);
    b.ctl = o.threads;
    if (b.wsize > 1 || o.ndev == 0 || o.ndev > ccq_device_count(b.rt))
        o.ndev = ccq_device_count(b.rt); /* a world: every process's devices */
    if (b.wsize == 1)
        b.nlocal = o.ndev;
    if (o.floor && strcmp(ccq_backend_name(b.rt), "host") != 0) {
        fprintf(stderr, "ccq-perf: --floor times host memory copies; it needs --backend host\n");
        ccq_runtime_destroy(b.rt);
        return 2;
    }
    if (colls[o.coll].rooted && o.root >= o.ndev) {
        fprintf(stderr, "ccq-perf: root %u is not one of the %u devices\n", o.root, o.ndev);
        ccq_runtime_destroy(b.rt);
        return 2;
    }
    esize = ccq_dtype_size(o.dtype);
    b.devs = calloc(o.ndev, sizeof *b.devs);
    for (uint32_t d = 0; d < o.ndev; d++)
        b.devs[d] = d;
    if ((o.coll != COLL_SENDRECV || b.wsize > 1) &&
        (st = ccq_comm_init(b.rt, b.devs, o.ndev)) != CCQ_OK) {
        fprintf(stderr, "ccq-perf: ccq_comm_init: %s: %s\n", ccq_status_name(st),
                ccq_last_error_detail());
        ccq_runtime_destroy(b.rt);
        return 1;
    }
    nw = b.nlocal * o.threads;
    b.w = calloc(nw, sizeof *b.w);
    th = calloc(nw, sizeof *th);
    for (uint32_t k = 0; k < nw; k++) {
        worker *w = &b.w[k];
        w->b = &b;
        w->dev = b.first + k / o.threads;
        w->stream = k % o.threads;
        w->hsrc = malloc(o.maxbytes + esize);
        w->hdst = malloc(o.maxbytes + esize);
        if (w->hsrc == NULL || w->hdst == NULL ||
            ccq_mem_alloc(b.rt, w->dev, o.maxbytes + esize, &w->src) != CCQ_OK ||
            ccq_mem_alloc(b.rt, w->dev, o.maxbytes + esize, &w->dst) != CCQ_OK) {
            fprintf(stderr, "ccq-perf: cannot allocate %zu bytes for device %u: %s\n", o.maxbytes,
                    w->dev, ccq_last_error_detail());
            return 1;
        }
        if (o.floor) { /* the floor copies whole staging buffers: no untouched (zero) pages */
            memset(w->hsrc, 1, o.maxbytes + esize);
            memset(w->hdst, 2, o.maxbytes + esize);
        }
    }
    pthread_barrier_init(&b.bar, NULL, nw);
    for (uint32_t k = 1; k < nw; k++)
        pthread_create(&th[k], NULL, worker_main, &b.w[k]);

    /* nccl-tests prints one line per rank of the world: gather (pid, host) of every device
     * with a ccq all_gather, and only world rank 0 prints (the table too). */
    bool quiet = b.wrank != 0;
    if (!o.json && b.wsize > 1) {
        typedef struct {
            int32_t pid, proc;
            char host[56];
        } who;
        who mine[64], *all = calloc(o.ndev, sizeof *all);
        char host[56] = "?";
        gethostname(host, sizeof host - 1);
        for (uint32_t k = 0; k < b.nlocal; k++) {
            mine[k].pid = (int32_t)getpid();
            mine[k].proc = (int32_t)b.wrank;
            snprintf(mine[k].host, sizeof mine[k].host, "%s", host);
        }
        who *gathered[64];
        for (uint32_t k = 0; k < b.nlocal; k++) {
            gathered[k] = calloc(o.ndev, sizeof *all);
            ccq_all_gather(b.rt, b.first + k, b.ctl, &mine[k], gathered[k], sizeof(who), CCQ_UINT8,
                           b.devs, o.ndev);
        }
        for (uint32_t k = 0; k < b.nlocal; k++)
            ccq_sync_collective(b.rt, b.first + k, b.ctl);
        memcpy(all, gathered[0], o.ndev * sizeof *all);
        for (uint32_t k = 0; k < b.nlocal; k++)
            free(gathered[k]);
        if (!quiet) {
            printf("# ccq-perf %s: %s, backend %s, %u processes\n", CCQ_VERSION_STRING,
                   colls[o.coll].name, ccq_backend_name(b.rt), b.wsize);
            printf("#\n# Using devices\n");
            for (uint32_t d = 0; d < o.ndev; d++)
                printf("#  Rank %2u Group  0 Pid %6d on %10s device %2u [host] ccq %s process %d\n",
                       d, all[d].pid, all[d].host, d, ccq_backend_name(b.rt), all[d].proc);
        }
        free(all);
    }
    if (quiet) {
        /* the table is world rank 0's; this process still runs and checks its devices */
    } else if (!o.json) {
        if (b.wsize == 1)
            printf("# ccq-perf %s: %s, backend %s\n", CCQ_VERSION_STRING, colls[o.coll].name,
                   ccq_backend_name(b.rt));
        printf("# nThread %u nGpus %u minBytes %zu maxBytes %zu step: %g(%s) warmup iters: %d "
               "iters: %d agg iters: %d validation: %d\n",
               o.threads, o.ndev, o.minbytes, o.maxbytes, o.factor ? o.factor : (double)o.incbytes,
               o.factor ? "factor" : "bytes", o.warmup, o.iters, o.agg, o.check);
        printf("#\n#%75s%35s\n", "out-of-place", "in-place");
        printf("#%11s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s", "size",
               "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
               "algbw", "busbw", "#wrong");
        printf(o.floor ? "  %8s  %6s\n" : "\n", "floor", "of");
        printf("#%11s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s", "(B)",
               "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)",
               "");
        printf(o.floor ? "  %8s  %6s\n" : "\n", "(us)", "floor");
    } else {
        printf("[\n");
    }
    if (quiet) /* only world rank 0 prints */
        if (freopen("/dev/null", "w", stdout) == NULL)
            quiet = true;
    bool first = true;
    for (size_t size = o.minbytes; size <= o.maxbytes;) {
        result oop, ip;
        /* nccl-tests: `count` is size / esize; the collectives that split a buffer of n
         * blocks take count / n per rank, and the line reports the larger buffer. */
        size_t count = size / esize;
        b.count = colls[o.coll].per_rank_n ? count / o.ndev : count;
        size_t bytes = b.count * esize * (colls[o.coll].per_rank_n ? o.ndev : 1u);
        const char *opname = colls[o.coll].reduces ? ccq_reduce_op_name(o.op) : "none";
        int root = colls[o.coll].rooted ? (int)o.root : -1;
        b.in_place = 0;
        oop = measure(&b, bytes);
        b.in_place = 1;
        ip = measure(&b, bytes);
        if (first_error(&b)) {
            rc = 1;
            break;
        }
        wrong_total += oop.wrong + ip.wrong;
        bw_sum += oop.busbw;
        nbw++;
        if (!ip.skipped) {
            bw_sum += ip.busbw;
            nbw++;
        }
        if (o.json) {
            printf("%s  {\"collective\": \"%s\", \"backend\": \"%s\", \"ndev\": %u, "
                   "\"threads\": %u, \"size\": %zu, \"count\": %zu, \"type\": \"%s\", "
                   "\"redop\": \"%s\", \"root\": %d, ",
                   first ? "" : ",\n", colls[o.coll].name, ccq_backend_name(b.rt), o.ndev,
                   o.threads, bytes, count, nccl_type_name(o.dtype), opname, root);
            json_result("out_of_place", &oop);
            printf(", ");
            json_result("in_place", &ip);
            printf("}");
        } else {
            printf("%12zu  %12zu  %8s  %6s  %6d", bytes, count, nccl_type_name(o.dtype), opname,
                   root);
            print_result(&oop);
            print_result(&ip);
            if (o.floor)
                printf("  %8.2f  %5.0f%%", oop.floor_us,
                       oop.us > 0 ? 100 * oop.floor_us / oop.us : 0);
            printf("\n");
        }
        fflush(stdout);
        first = false;
        size_t next = o.factor ? (size_t)((double)size * o.factor) : size + o.incbytes;
        if (next <= size)
            break;
        size = next;
    }
    if (o.json)
        printf("\n]\n");
    else {
        printf("# Out of bounds values : %zu %s\n", wrong_total, wrong_total ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %g \n#\n", nbw ? bw_sum / nbw : 0.0);
    }

    b.quit = 1;
    pthread_barrier_wait(&b.bar);
    for (uint32_t k = 1; k < nw; k++)
        pthread_join(th[k], NULL);
    pthread_barrier_destroy(&b.bar);
    for (uint32_t k = 0; k < nw; k++) {
        ccq_mem_free(b.rt, b.w[k].dev, b.w[k].src);
        ccq_mem_free(b.rt, b.w[k].dev, b.w[k].dst);
        free(b.w[k].hsrc);
        free(b.w[k].hdst);
    }
    ccq_runtime_destroy(b.rt);
    free(b.w);
    free(th);
    free(b.devs);
    return rc ? rc : (wrong_total ? 1 : 0);
}
