/* A data-parallel training step through ccq (issue 27, docs/performance.md): one Mean
 * all_reduce per parameter on every local device, in place (as burn's DDP does), submitted
 * parameter by parameter by one thread, then a fence per device. The step time is the
 * slowest process's; the median over steps is reported.
 *
 * One process with -g devices, or a world: under mpirun (bootstrap "mpi"), or whatever
 * bootstrap the environment names (CCQ_BOOTSTRAP: file:DIR, tcp://HOST:PORT, with
 * CCQ_WORLD_RANK/SIZE; over tcp:// the runtime of the v-th --fusion value meets on PORT + v).
 * --fusion takes a list of fusion_bytes values: one runtime per value, all alive at once, their
 * steps interleaved round by round so every value sees the same machine (side by side in one run).
 *
 * --kind reduce_scatter or all_gather runs a sharded step's collective instead (as FSDP and
 * ZeRO reduce-scatter the gradients, Mean, and all-gather the parameters), one per parameter:
 * each parameter's block per rank is its size, the wide side (reduce_scatter's input,
 * all_gather's output) that times the ranks.
 *
 * Usage: ddp_step [-g DEVICES] [-n STEPS] [-w WARMUP] [-r ROUNDS] [--params SPEC]
 *                 [--order interleaved|grouped] [--fusion LIST] [--json FILE]
 *                 [--kind all_reduce|reduce_scatter|all_gather]
 *   SPEC: N1xBYTES1,N2xBYTES2,... (default 500x1K,90x64K,10x1M); LIST: bytes with K/M/G,
 *   comma-separated; "default" = ccq's default (default: "default,0"). */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "ccq.h"
#include "ddp_params.h"

#define MAX_VALUES 16
#define MAX_DEV    64

typedef struct bench {
    ddp_params p;
    uint32_t g, nsteps, warmup, rounds;
    const char *order, *spec;
    uint64_t fusion[MAX_VALUES];
    bool dflt[MAX_VALUES];
    uint32_t nvalues;
    ccq_kind kind; /* all_reduce (default), reduce_scatter or all_gather */
    /* one set of buffers, shared by the runtimes (used one at a time) */
    float *buf[MAX_DEV];
    float *wide[MAX_DEV]; /* reduce_scatter, all_gather: nranks x buf, parameter i at nranks x
                             off[i] */
    uint32_t nranks;
    size_t *off; /* [n]: each parameter's offset in a device's buffer */
} bench;

typedef struct rtv {
    ccq_runtime *rt;
    ccq_device_id first, devs[MAX_DEV];
    uint32_t cnt, total, world_rank, world_size;
    double *ms; /* [rounds * nsteps] this process's step times, then the world's max */
    uint64_t engine_ops;
} rtv;

static void die(const char *what, ccq_status st)
{
    fprintf(stderr, "ddp_step: %s: %s: %s\n", what, ccq_status_name(st), ccq_last_error_detail());
    exit(1);
}

#define OK(call, what)                                                                             \
    do {                                                                                           \
        ccq_status st_ = (call);                                                                   \
        if (st_ != CCQ_OK)                                                                         \
            die(what, st_);                                                                        \
    } while (0)

static void open_rt(bench *b, rtv *r, uint32_t v)
{
    ccq_config cfg;
    ccq_config_init(&cfg);
    cfg.host_devices = b->g;
    static char spec[MAX_VALUES][256];
    if (cfg.world_size > 1 && cfg.bootstrap == NULL)
        cfg.bootstrap = "mpi"; /* under mpirun */
    if (v > 0 && cfg.bootstrap != NULL && strncmp(cfg.bootstrap, "tcp://", 6) == 0) {
        /* One rendezvous serves one world at a time: runtime v meets on port + v. */
        const char *colon = strrchr(cfg.bootstrap, ':');
        if (colon != NULL) {
            snprintf(spec[v], sizeof spec[v], "%.*s:%ld", (int)(colon - cfg.bootstrap),
                     cfg.bootstrap, strtol(colon + 1, NULL, 10) + (long)v);
            cfg.bootstrap = spec[v];
        }
    }
    if (!b->dflt[v])
        cfg.fusion_bytes = b->fusion[v];
    b->fusion[v] = cfg.fusion_bytes;
    OK(ccq_runtime_create(&cfg, &r->rt), "ccq_runtime_create");
    OK(ccq_local_devices(r->rt, &r->first, &r->cnt), "ccq_local_devices");
    r->total = ccq_device_count(r->rt);
    r->world_rank = ccq_world_rank(r->rt);
    r->world_size = ccq_world_size(r->rt);
    if (r->total > MAX_DEV) {
        fprintf(stderr, "ddp_step: %u devices, at most %d\n", r->total, MAX_DEV);
        exit(1);
    }
    for (uint32_t d = 0; d < r->total; d++)
        r->devs[d] = d;
    OK(ccq_comm_init(r->rt, r->devs, r->total), "ccq_comm_init");
    r->ms = calloc((size_t)b->rounds * b->nsteps, sizeof *r->ms);
}

/* Every rank meets the others (a one-element all_reduce on stream 1, fenced). */
static void barrier(rtv *r)
{
    static float one[MAX_DEV], out[MAX_DEV];
    for (uint32_t k = 0; k < r->cnt; k++)
        OK(ccq_all_reduce(r->rt, r->first + k, 1, &one[k], &out[k], 1, CCQ_FLOAT32, CCQ_SUM,
                          r->devs, r->total),
           "barrier");
    for (uint32_t k = 0; k < r->cnt; k++)
        OK(ccq_sync_collective(r->rt, r->first + k, 1), "barrier fence");
}

/* One parameter's collective on local device k. */
static ccq_status submit_param(bench *b, rtv *r, size_t i, uint32_t k)
{
    float *x = b->buf[k] + b->off[i];
    float *w = b->wide[k] != NULL ? b->wide[k] + (size_t)b->nranks * b->off[i] : NULL;
    switch (b->kind) {
    case CCQ_KIND_REDUCE_SCATTER:
        return ccq_reduce_scatter(r->rt, r->first + k, 0, w, x, b->p.count[i], CCQ_FLOAT32, CCQ_AVG,
                                  r->devs, r->total);
    case CCQ_KIND_ALL_GATHER:
        return ccq_all_gather(r->rt, r->first + k, 0, x, w, b->p.count[i], CCQ_FLOAT32, r->devs,
                              r->total);
    default: /* DDP: Mean all_reduce in place */
        return ccq_all_reduce(r->rt, r->first + k, 0, x, x, b->p.count[i], CCQ_FLOAT32, CCQ_AVG,
                              r->devs, r->total);
    }
}

/* One step: every parameter's collective on every local device, then the fences. */
static double step(bench *b, rtv *r)
{
    uint64_t t0;
    barrier(r);
    t0 = bench_now_ns();
    for (size_t i = 0; i < b->p.n; i++)
        for (uint32_t k = 0; k < r->cnt; k++)
            OK(submit_param(b, r, i, k), ccq_kind_name(b->kind));
    for (uint32_t k = 0; k < r->cnt; k++)
        OK(ccq_sync_collective(r->rt, r->first + k, 0), "fence");
    return (double)(bench_now_ns() - t0) / 1e6;
}

/* A step with known inputs (rank + i % 3 + e % 2 in every block) gives the mean everywhere,
 * or every rank's block (all_gather): checked before timing. */
static void check(bench *b, rtv *r)
{
    double want_base = (double)(r->total - 1) / 2.0;
    bool rs = b->kind == CCQ_KIND_REDUCE_SCATTER, ag = b->kind == CCQ_KIND_ALL_GATHER;
    for (uint32_t k = 0; k < r->cnt; k++)
        for (size_t i = 0; i < b->p.n; i++)
            for (uint32_t j = 0; j < (rs ? b->nranks : 1); j++)
                for (size_t e = 0; e < b->p.count[i]; e++) {
                    float v = (float)(r->first + k + i % 3 + e % 2);
                    if (rs)
                        b->wide[k][(size_t)b->nranks * b->off[i] + j * b->p.count[i] + e] = v;
                    else
                        b->buf[k][b->off[i] + e] = v;
                }
    (void)step(b, r);
    for (uint32_t k = 0; k < r->cnt; k++)
        for (size_t i = 0; i < b->p.n; i++)
            for (uint32_t j = 0; j < (ag ? b->nranks : 1); j++)
                for (size_t e = 0; e < b->p.count[i]; e += 97) {
                    float want = (float)((ag ? (double)j : want_base) + (double)(i % 3 + e % 2));
                    float got =
                        ag ? b->wide[k][(size_t)b->nranks * b->off[i] + j * b->p.count[i] + e]
                           : b->buf[k][b->off[i] + e];
                    if (got != want) {
                        fprintf(stderr,
                                "ddp_step: wrong result: param %zu block %u element %zu: %g, "
                                "want %g\n",
                                i, j, e, (double)got, (double)want);
                        exit(1);
                    }
                }
}

/* Engine operations of the last step: parameters minus what fusion saved (CCQ_EV_FUSED
 * events after t0 on the world communicator, id 0). */
static uint64_t engine_ops_since(bench *b, rtv *r, uint64_t t0)
{
    size_t cap = 1u << 17, n = 0;
    ccq_event *ev = malloc(cap * sizeof *ev);
    uint64_t ops = b->p.n;
    ev[0].struct_size = sizeof *ev;
    if (ccq_trace_snapshot(r->rt, ev, cap, &n, NULL) != CCQ_OK)
        n = 0;
    for (size_t e = 0; e < n; e++)
        if (ev[e].type == CCQ_EV_FUSED && ev[e].comm == 0 && ev[e].time_ns >= t0)
            ops -= ev[e].count - 1;
    free(ev);
    return ops;
}

static int parse_list(bench *b, const char *s)
{
    b->nvalues = 0;
    while (*s != '\0' && b->nvalues < MAX_VALUES) {
        char *end;
        if (strncmp(s, "default", 7) == 0) {
            b->dflt[b->nvalues] = true;
            end = (char *)s + 7;
        } else {
            b->dflt[b->nvalues] = false;
            b->fusion[b->nvalues] = ddp_parse_size(s, &end);
            if (end == s)
                return -1;
        }
        b->nvalues++;
        s = end;
        if (*s == ',')
            s++;
        else if (*s != '\0')
            return -1;
    }
    return b->nvalues > 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    bench b = {.g = 1, .nsteps = 20, .warmup = 3, .rounds = 3, .spec = DDP_DEFAULT_SPEC};
    rtv r[MAX_VALUES];
    bench_json js;
    const char *list = "default,0", *kind = "all_reduce";

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL && strcmp(a, "-h") != 0)
            goto usage;
        if (strcmp(a, "-g") == 0)
            b.g = (uint32_t)atoi(v);
        else if (strcmp(a, "-n") == 0)
            b.nsteps = (uint32_t)atoi(v);
        else if (strcmp(a, "-w") == 0)
            b.warmup = (uint32_t)atoi(v);
        else if (strcmp(a, "-r") == 0)
            b.rounds = (uint32_t)atoi(v);
        else if (strcmp(a, "--params") == 0)
            b.spec = v;
        else if (strcmp(a, "--order") == 0)
            b.order = v;
        else if (strcmp(a, "--fusion") == 0)
            list = v;
        else if (strcmp(a, "--kind") == 0)
            kind = v;
        else if (strcmp(a, "--json") == 0)
            ;
        else
            goto usage;
        i++;
    }
    if (strcmp(kind, "all_reduce") == 0)
        b.kind = CCQ_KIND_ALL_REDUCE;
    else if (strcmp(kind, "reduce_scatter") == 0)
        b.kind = CCQ_KIND_REDUCE_SCATTER;
    else if (strcmp(kind, "all_gather") == 0)
        b.kind = CCQ_KIND_ALL_GATHER;
    else
        goto usage;
    if (b.g == 0 || b.g > MAX_DEV || b.nsteps == 0 || b.rounds == 0 || parse_list(&b, list) != 0 ||
        ddp_params_make(&b.p, b.spec, b.order) != 0)
        goto usage;
    {
        ccq_config c0; /* only world rank 0 writes the JSON (every process parses argv) */
        ccq_config_init(&c0);
        js.f = NULL;
        js.n = 0;
        if (c0.world_rank == 0)
            bench_json_open(&js, argc, argv, "ddp_step");
    }
    b.off = malloc(b.p.n * sizeof *b.off);
    for (size_t i = 0, o = 0; i < b.p.n; i++) {
        b.off[i] = o;
        o += (b.p.count[i] + 15) & ~(size_t)15; /* 64-byte aligned parameters */
    }
    for (uint32_t k = 0; k < b.g; k++) {
        size_t bytes = (b.off[b.p.n - 1] + b.p.count[b.p.n - 1] + 16) * sizeof(float);
        b.buf[k] = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
        memset(b.buf[k], 0, bytes);
    }
    for (uint32_t v = 0; v < b.nvalues; v++) {
        open_rt(&b, &r[v], v);
        if (v == 0 && b.kind != CCQ_KIND_ALL_REDUCE) { /* the wide side, now that nranks is known */
            size_t bytes = (b.off[b.p.n - 1] + b.p.count[b.p.n - 1] + 16) * sizeof(float);
            b.nranks = r[0].total;
            bytes *= b.nranks;
            for (uint32_t k = 0; k < b.g; k++) {
                b.wide[k] = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
                memset(b.wide[k], 0, bytes);
            }
        }
        check(&b, &r[v]);
    }
    for (uint32_t round = 0; round < b.rounds; round++)
        for (uint32_t v = 0; v < b.nvalues; v++) {
            uint64_t t_last = 0;
            for (uint32_t s = 0; s < b.warmup; s++)
                (void)step(&b, &r[v]);
            for (uint32_t s = 0; s < b.nsteps; s++) {
                t_last = bench_now_ns();
                r[v].ms[round * b.nsteps + s] = step(&b, &r[v]);
            }
            if (round + 1 == b.rounds)
                r[v].engine_ops = engine_ops_since(&b, &r[v], t_last);
        }
    for (uint32_t v = 0; v < b.nvalues; v++) {
        rtv *x = &r[v];
        size_t n = (size_t)b.rounds * b.nsteps;
        double *mx = malloc(n * sizeof *mx);
        /* The slowest process's time of each step. */
        for (uint32_t k = 0; k < x->cnt; k++)
            OK(ccq_all_reduce(x->rt, x->first + k, 1, x->ms, mx, n, CCQ_FLOAT64, CCQ_MAX, x->devs,
                              x->total),
               "max of the step times");
        for (uint32_t k = 0; k < x->cnt; k++)
            OK(ccq_sync_collective(x->rt, x->first + k, 1), "fence");
        double med = bench_median(mx, n), lo = bench_percentile(mx, n, 0),
               p90 = bench_percentile(mx, n, 90);
        if (x->world_rank == 0) {
            printf("ddp_step: %s, %u processes x %u devices, %zu params (%.1f MiB, %s), "
                   "fusion_bytes %llu: median %.3f ms (min %.3f, p90 %.3f) over %zu steps, %llu "
                   "engine ops per step\n",
                   ccq_kind_name(b.kind), x->world_size, b.g, b.p.n,
                   (double)b.p.total * 4 / 1048576.0, b.order ? b.order : "interleaved",
                   (unsigned long long)b.fusion[v], med, lo, p90, n,
                   (unsigned long long)x->engine_ops);
            bench_json_record(&js,
                              "\"mode\": \"ccq\", \"kind\": \"%s\", \"procs\": %u, "
                              "\"devices\": %u, \"params\": %zu, "
                              "\"bytes\": %zu, \"order\": \"%s\", \"fusion_bytes\": %llu, "
                              "\"default\": %s, \"median_ms\": %.4f, \"min_ms\": %.4f, \"p90_ms\": "
                              "%.4f, \"steps\": %zu, \"engine_ops\": %llu",
                              ccq_kind_name(b.kind), x->world_size, b.g, b.p.n, b.p.total * 4,
                              b.order ? b.order : "interleaved", (unsigned long long)b.fusion[v],
                              b.dflt[v] ? "true" : "false", med, lo, p90, n,
                              (unsigned long long)x->engine_ops);
        }
        free(mx);
    }
    for (uint32_t v = 0; v < b.nvalues; v++) {
        OK(ccq_runtime_destroy(r[v].rt), "destroy");
        free(r[v].ms);
    }
    bench_json_close(&js);
    for (uint32_t k = 0; k < b.g; k++) {
        free(b.buf[k]);
        free(b.wide[k]);
    }
    free(b.off);
    ddp_params_free(&b.p);
    return 0;
usage:
    fprintf(stderr,
            "usage: ddp_step [-g DEVICES] [-n STEPS] [-w WARMUP] [-r ROUNDS] [--params SPEC]\n"
            "                [--order interleaved|grouped] [--fusion LIST] [--json FILE]\n"
            "                [--kind all_reduce|reduce_scatter|all_gather]\n"
            "  SPEC: N1xBYTES1,... (default %s); LIST: fusion_bytes values (K/M/G), or\n"
            "  \"default\" (default: default,0). Under mpirun: one world (bootstrap \"mpi\").\n",
            DDP_DEFAULT_SPEC);
    return 2;
}
