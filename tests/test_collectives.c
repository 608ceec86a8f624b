/* The seven collectives besides all_reduce and send/recv, through the public API on the host
 * backend: every kind x dtype x op x 1..8 devices x odd counts x roots x in-place variants,
 * bit-exact against tools/ref/ref.c with guard bytes and poisoned outputs; NULL buffers on
 * non-roots; mismatches; argument validation; stream order of chained collectives. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test_util.h"

#include "ccq.h"
#include "ref.h"

#define NDEV       8
#define NDT        CCQ_DTYPE_COUNT_
#define NOP        CCQ_REDUCE_OP_COUNT_
#define GUARD      32   /* bytes before and after every buffer that nothing may write */
#define GUARD_BYTE 0xa5 /* the guards */
#define POISON     0x5a /* what outputs hold before the operation writes them */
#define NSTREAMS   3

/* Odd counts for the full grid. One op of these stays below the host backend's inline
 * threshold (128 KiB moved) unless it is a count * n kind at 1001 elements, and each op is a
 * single worker chunk; rounds queue many ops at once, so batches go both ways. */
static const size_t small_counts[] = {1, 3, 17, 1001};
#define NSMALL (sizeof small_counts / sizeof small_counts[0])
/* Large cases: an odd count of about this many bytes per block, which puts every kind past
 * the inline threshold and cuts it into two or more worker chunks (256 KiB at least each),
 * the last one partial. */
#define LARGE_BLOCK_BYTES 300000u

static const ccq_dtype all_dts[NDT] = {CCQ_INT8,    CCQ_UINT8,    CCQ_INT32,      CCQ_UINT32,
                                       CCQ_INT64,   CCQ_UINT64,   CCQ_FLOAT16,    CCQ_FLOAT32,
                                       CCQ_FLOAT64, CCQ_BFLOAT16, CCQ_FLOAT8E4M3, CCQ_FLOAT8E5M2};
static const ccq_reduce_op all_ops[NOP] = {CCQ_SUM, CCQ_PROD, CCQ_MAX, CCQ_MIN, CCQ_AVG};
/* The subset that runs at the large count. */
static const ccq_dtype large_dts[] = {CCQ_UINT8, CCQ_INT64, CCQ_BFLOAT16, CCQ_FLOAT32, CCQ_FLOAT64};
static const ccq_reduce_op large_ops[] = {CCQ_SUM, CCQ_MIN, CCQ_AVG};

/* What the test knows about each kind, written from ccq.h, not from the library's table. */
typedef struct kind_desc {
    ccq_kind kind;
    bool reduces, rooted, has_in_place;
} kind_desc;

static const kind_desc kinds[] = {
    {CCQ_KIND_BROADCAST, false, true, true},    {CCQ_KIND_REDUCE, true, true, true},
    {CCQ_KIND_ALL_GATHER, false, false, true},  {CCQ_KIND_REDUCE_SCATTER, true, false, true},
    {CCQ_KIND_ALL_TO_ALL, false, false, false}, {CCQ_KIND_GATHER, false, true, true},
    {CCQ_KIND_SCATTER, false, true, true},
};
#define NKINDS (sizeof kinds / sizeof kinds[0])

static const kind_desc *desc_of(ccq_kind kind)
{
    for (size_t i = 0; i < NKINDS; i++)
        if (kinds[i].kind == kind)
            return &kinds[i];
    fail_msg("no kind %d", (int)kind);
    return NULL;
}

/* Device sets: the prefixes {0..n-1}, n = 1..8, and two others given unsorted, where rank and
 * device id differ (in the second for every rank). */
#define NSETS (NDEV + 2)
typedef struct devset {
    uint32_t n;
    ccq_device_id given[NDEV]; /* as passed to every call (submission order too) */
} devset;

static devset sets[NSETS];

static void init_sets(void)
{
    static const ccq_device_id a[] = {6, 1, 4}, b[] = {7, 3, 5, 2};
    for (uint32_t n = 1; n <= NDEV; n++) {
        sets[n - 1].n = n;
        for (uint32_t i = 0; i < n; i++)
            sets[n - 1].given[i] = i;
    }
    sets[NDEV].n = 3;
    memcpy(sets[NDEV].given, a, sizeof a);
    sets[NDEV + 1].n = 4;
    memcpy(sets[NDEV + 1].given, b, sizeof b);
}

static void sort_set(const ccq_device_id *given, uint32_t n, ccq_device_id *sorted)
{
    memcpy(sorted, given, n * sizeof *given);
    for (uint32_t i = 1; i < n; i++)
        for (uint32_t j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
            ccq_device_id t = sorted[j];
            sorted[j] = sorted[j - 1];
            sorted[j - 1] = t;
        }
}

typedef struct fixture {
    ccq_runtime *rt;
    uint64_t expect_failed; /* commands the test made fail on purpose (mismatches) */
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    ccq_config cfg;

    if (f == NULL)
        return -1;
    init_sets();
    ccq_config_init(&cfg);
    cfg.host_devices = NDEV;
    cfg.host_workers = 3;   /* the same chunking on every machine, and chunks run in parallel */
    cfg.timeout_ms = 60000; /* only matters if something hangs */
    if (ccq_runtime_create(&cfg, &f->rt) != CCQ_OK) {
        free(f);
        return -1;
    }
    for (uint32_t s = 0; s < NSETS; s++)
        if (ccq_comm_init(f->rt, sets[s].given, sets[s].n) != CCQ_OK) {
            ccq_runtime_destroy(f->rt);
            free(f);
            return -1;
        }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    /* Every command ended; exactly the ones made to fail failed; nothing leaked. */
    int rc = all_ended(f->rt, f->expect_failed);
    if (ccq_runtime_destroy(f->rt) != CCQ_OK)
        rc = -1;
    free(f);
    return rc;
}

static void fence_all(ccq_runtime *rt, uint32_t n, const ccq_device_id *devs)
{
    for (uint32_t r = 0; r < n; r++)
        for (ccq_stream_id s = 0; s < NSTREAMS; s++) {
            ccq_status st = ccq_sync_collective(rt, devs[r], s);
            if (st != CCQ_OK)
                fail_msg("fence device %u stream %u: %s (%s)", devs[r], s, ccq_status_name(st),
                         ccq_last_error_detail());
        }
}

/* ------------------------------------------------------------------------------------ */
/* One collective over one device set, with its buffers and expected results ("a case")  */
/* ------------------------------------------------------------------------------------ */

/* A buffer with guards: GUARD bytes, `bytes` of data, GUARD bytes. */
typedef struct region {
    unsigned char *mem;
    unsigned char *want; /* what mem must hold afterwards, guards included */
    size_t bytes;
    const char *what; /* for messages */
} region;

typedef struct part {
    region reg[2];
    uint32_t nreg;
    void *src, *dst; /* what the call gets (inside the regions, or NULL) */
} part;

enum { OUT_OF_PLACE, IN_PLACE, MIXED };

typedef struct ccase {
    ccq_kind kind;
    ccq_dtype dt;
    ccq_reduce_op op;
    size_t count;
    const ccq_device_id *given;
    ccq_device_id sorted[NDEV];
    uint32_t n, root; /* root: a rank */
    int mode;         /* OUT_OF_PLACE, IN_PLACE, or MIXED: odd ranks in place, even ones not */
    bool nonroot_buf; /* out of place: ranks that need no src (dst) pass a poisoned buffer
                         that must stay untouched, instead of NULL */
    part p[NDEV];
} ccase;

/*
 * The reference side of a group of cases that share kind, dtype, count and set: every
 * rank's input (the same for every op, root and mode, so it is made once) and the expected
 * outputs per (op, root), computed on first use. The reference is element by element and
 * is most of this test's time, so this sharing is what keeps the whole grid affordable.
 */
#define MAXOUT (NOP * NDEV)
typedef struct refcache {
    ccq_kind kind;
    ccq_dtype dt;
    size_t count;
    uint32_t n;
    void *input[NDEV]; /* rank r's src as the root would have it (the most a rank reads) */
    uint32_t nout;
    struct {
        ccq_reduce_op op;
        uint32_t root;
        void *out[NDEV]; /* NULL where the rank's dst is not written */
    } outs[MAXOUT];
} refcache;

static void refcache_init(refcache *rc, ccq_kind kind, ccq_dtype dt, size_t count,
                          const devset *set, uint32_t salt)
{
    ccq_device_id sorted[NDEV];
    size_t es = ref_dtype_size(dt);

    memset(rc, 0, sizeof *rc);
    rc->kind = kind;
    rc->dt = dt;
    rc->count = count;
    rc->n = set->n;
    sort_set(set->given, set->n, sorted);
    for (uint32_t r = 0; r < set->n; r++) {
        size_t elems = ref_src_count(kind, set->n, r, r, count);
        uint32_t seed = salt * 2654435761u + (uint32_t)kind * 15485863u + (uint32_t)dt * 1000003u +
                        (uint32_t)count * 7919u + sorted[r] * 104729u;
        rc->input[r] = xmalloc(elems * es);
        ref_fill(dt, rc->input[r], elems, seed);
    }
}

/* Rank r's expected dst for (op, root), or NULL where it is not written. */
static const void *refcache_out(refcache *rc, ccq_reduce_op op, uint32_t root, uint32_t r)
{
    const kind_desc *k = desc_of(rc->kind);
    size_t es = ref_dtype_size(rc->dt);
    uint32_t i;

    if (!k->reduces)
        op = CCQ_SUM; /* the op and root of kinds without them do not change the result */
    if (!k->rooted)
        root = 0;
    for (i = 0; i < rc->nout; i++)
        if (rc->outs[i].op == op && rc->outs[i].root == root)
            break;
    if (i == rc->nout) {
        const void *inputs[NDEV];
        assert_true(rc->nout < MAXOUT);
        rc->nout++;
        rc->outs[i].op = op;
        rc->outs[i].root = root;
        for (uint32_t j = 0; j < rc->n; j++)
            inputs[j] = rc->input[j];
        for (uint32_t j = 0; j < rc->n; j++) {
            size_t dc = ref_dst_count(rc->kind, rc->n, root, j, rc->count);
            rc->outs[i].out[j] = NULL;
            if (dc == 0)
                continue;
            rc->outs[i].out[j] = xmalloc(dc * es);
            size_t got = ref_collective(rc->kind, rc->dt, op, rc->n, root, inputs, j,
                                        rc->outs[i].out[j], rc->count);
            assert_int_equal(got, dc);
        }
    }
    return rc->outs[i].out[r];
}

static void refcache_free(refcache *rc)
{
    for (uint32_t r = 0; r < rc->n; r++)
        free(rc->input[r]);
    for (uint32_t i = 0; i < rc->nout; i++)
        for (uint32_t r = 0; r < rc->n; r++)
            free(rc->outs[i].out[r]);
    memset(rc, 0, sizeof *rc);
}

static unsigned char *region_alloc(part *p, size_t bytes, const char *what)
{
    region *g = &p->reg[p->nreg++];
    g->bytes = bytes;
    g->what = what;
    g->want = NULL;
    g->mem = xmalloc(bytes + 2 * GUARD);
    memset(g->mem, GUARD_BYTE, GUARD);
    memset(g->mem + GUARD, POISON, bytes);
    memset(g->mem + GUARD + bytes, GUARD_BYTE, GUARD);
    return g->mem + GUARD;
}

static size_t case_desc(const ccase *c, char *buf, size_t len)
{
    const kind_desc *k = desc_of(c->kind);
    int w = snprintf(buf, len, "%s %s", ccq_kind_name(c->kind), ccq_dtype_name(c->dt));
    if (k->reduces)
        w += snprintf(buf + w, len - (size_t)w, " %s", ccq_reduce_op_name(c->op));
    w += snprintf(buf + w, len - (size_t)w, " n=%u {", c->n);
    for (uint32_t i = 0; i < c->n; i++)
        w += snprintf(buf + w, len - (size_t)w, i ? ",%u" : "%u", c->given[i]);
    w += snprintf(buf + w, len - (size_t)w, "} count=%zu", c->count);
    if (k->rooted)
        w += snprintf(buf + w, len - (size_t)w, " root device %u", c->sorted[c->root]);
    w += snprintf(buf + w, len - (size_t)w, "%s%s",
                  c->mode == IN_PLACE ? " in place"
                  : c->mode == MIXED  ? " in place on odd ranks, out of place on even ones"
                                      : " out of place",
                  c->mode != IN_PLACE && c->nonroot_buf ? ", unused buffers non-NULL" : "");
    return (size_t)w;
}

/* Lay out every rank's buffers for the case (kind, dtype, count and set as rc's), copy
 * the inputs in, and record the expected bytes of every buffer. */
static void case_setup(ccase *c, refcache *rc)
{
    size_t es = ref_dtype_size(c->dt), blk = c->count * es;
    uint32_t n = c->n;

    assert_true(rc->kind == c->kind && rc->dt == c->dt && rc->count == c->count && rc->n == n);

    sort_set(c->given, n, c->sorted);
    for (uint32_t r = 0; r < n; r++) {
        part *p = &c->p[r];
        bool is_root = r == c->root;
        size_t sc = ref_src_count(c->kind, n, c->root, r, c->count);
        unsigned char *a;

        memset(p, 0, sizeof *p);
        if (c->mode == OUT_OF_PLACE || (c->mode == MIXED && r % 2 == 0)) {
            if (sc > 0)
                p->src = region_alloc(p, sc * es, "src");
            else if (c->nonroot_buf)
                p->src = region_alloc(p, ref_src_count(c->kind, n, c->root, c->root, c->count) * es,
                                      "unused src");
            size_t dc = ref_dst_count(c->kind, n, c->root, r, c->count);
            if (dc > 0)
                p->dst = region_alloc(p, dc * es, "dst");
            else if (c->nonroot_buf)
                p->dst = region_alloc(p, ref_dst_count(c->kind, n, c->root, c->root, c->count) * es,
                                      "unused dst");
        } else {
            /* NCCL's in-place positions (ccq.h). Non-root ranks of broadcast and reduce pass
             * the same buffer as src and dst, as callers of ncclBcast do. */
            switch (c->kind) {
            case CCQ_KIND_BROADCAST:
            case CCQ_KIND_REDUCE:
                a = region_alloc(p, blk, "src == dst");
                p->src = p->dst = a;
                break;
            case CCQ_KIND_ALL_GATHER:
                a = region_alloc(p, n * blk, "dst, src = block rank");
                p->src = a + r * blk;
                p->dst = a;
                break;
            case CCQ_KIND_REDUCE_SCATTER:
                a = region_alloc(p, n * blk, "src, dst = block rank");
                p->src = a;
                p->dst = a + r * blk;
                break;
            case CCQ_KIND_GATHER:
                if (is_root) {
                    a = region_alloc(p, n * blk, "dst, src = block root");
                    p->src = a + r * blk;
                    p->dst = a;
                } else {
                    p->src = region_alloc(p, blk, "src");
                }
                break;
            case CCQ_KIND_SCATTER:
                if (is_root) {
                    a = region_alloc(p, n * blk, "src, dst = block root");
                    p->src = a;
                    p->dst = a + r * blk;
                } else {
                    p->dst = region_alloc(p, blk, "dst");
                }
                break;
            default:
                fail_msg("%s has no in-place form", ccq_kind_name(c->kind));
            }
        }
        if (sc > 0)
            memcpy(p->src, rc->input[r], sc * es);
        for (uint32_t k = 0; k < p->nreg; k++) {
            region *g = &p->reg[k];
            g->want = xmalloc(g->bytes + 2 * GUARD);
            memcpy(g->want, g->mem, g->bytes + 2 * GUARD);
        }
    }
    /* Every rank's dst as the reference computes it, written over the expected bytes of the
     * region that holds it; everything else must keep its bytes. */
    for (uint32_t r = 0; r < n; r++) {
        part *p = &c->p[r];
        size_t dc = ref_dst_count(c->kind, n, c->root, r, c->count);
        if (dc == 0)
            continue;
        const void *out = refcache_out(rc, c->op, c->root, r);
        assert_non_null(out);
        uint32_t k = 0;
        while (k < p->nreg && !((unsigned char *)p->dst >= p->reg[k].mem + GUARD &&
                                (unsigned char *)p->dst < p->reg[k].mem + GUARD + p->reg[k].bytes))
            k++;
        assert_true(k < p->nreg);
        memcpy(p->reg[k].want + ((unsigned char *)p->dst - p->reg[k].mem), out, dc * es);
    }
}

/* A case of rc's kind, dtype and count over `set` (rc's set), set up. */
static void case_make(ccase *c, refcache *rc, const devset *set, ccq_reduce_op op, uint32_t root,
                      int mode, bool nonroot_buf)
{
    c->kind = rc->kind;
    c->dt = rc->dt;
    c->op = op;
    c->count = rc->count;
    c->given = set->given;
    c->n = set->n;
    c->root = root;
    c->mode = mode;
    c->nonroot_buf = nonroot_buf;
    case_setup(c, rc);
}

static uint32_t rank_of(const ccase *c, ccq_device_id dev)
{
    uint32_t r = 0;
    while (c->sorted[r] != dev)
        r++;
    return r;
}

static void case_submit(ccq_runtime *rt, const ccase *c, ccq_device_id dev, ccq_stream_id s)
{
    const part *p = &c->p[rank_of(c, dev)];
    ccq_status st = ref_submit(rt, c->kind, dev, s, p->src, p->dst, c->count, c->dt, c->op,
                               c->sorted[c->root], c->given, c->n);
    if (st != CCQ_OK) {
        char d[256];
        case_desc(c, d, sizeof d);
        fail_msg("%s: submit on device %u: %s (%s)", d, dev, ccq_status_name(st),
                 ccq_last_error_detail());
    }
}

/* Every byte of every region of every rank, guards included, is what it should be. */
static void case_check(const ccase *c)
{
    size_t es = ref_dtype_size(c->dt);
    for (uint32_t r = 0; r < c->n; r++)
        for (uint32_t k = 0; k < c->p[r].nreg; k++) {
            const region *g = &c->p[r].reg[k];
            char msg[256], d[256];
            size_t bad =
                ref_compare(c->dt, g->mem + GUARD, g->want + GUARD, g->bytes / es, msg, sizeof msg);
            bool guards = memcmp(g->mem, g->want, GUARD) == 0 &&
                          memcmp(g->mem + GUARD + g->bytes, g->want + GUARD + g->bytes, GUARD) == 0;
            if (bad == 0 && guards)
                continue;
            case_desc(c, d, sizeof d);
            if (bad)
                fail_msg("%s: rank %u (device %u) %s: %zu of %zu elements wrong; %s", d, r,
                         c->sorted[r], g->what, bad, g->bytes / es, msg);
            fail_msg("%s: rank %u (device %u) %s: a guard byte was written", d, r, c->sorted[r],
                     g->what);
        }
}

static void case_free(ccase *c)
{
    for (uint32_t r = 0; r < c->n; r++) {
        for (uint32_t k = 0; k < c->p[r].nreg; k++) {
            free(c->p[r].reg[k].mem);
            free(c->p[r].reg[k].want);
        }
        c->p[r].nreg = 0;
    }
}

/*
 * Queue every case (all over the same set), rank by rank in the order the set was given,
 * each case on a stream that depends on the device (so the ranks of one collective sit on
 * different streams); then fence and check everything.
 */
static void run_cases(ccq_runtime *rt, ccase *cs, size_t ncs)
{
    const ccq_device_id *given = cs[0].given;
    uint32_t n = cs[0].n;

    for (uint32_t k = 0; k < n; k++)
        for (size_t i = 0; i < ncs; i++)
            case_submit(rt, &cs[i], given[k], (ccq_stream_id)((i + given[k]) % NSTREAMS));
    fence_all(rt, n, given);
    for (size_t i = 0; i < ncs; i++) {
        case_check(&cs[i]);
        case_free(&cs[i]);
    }
}

/* Roots (ranks) to try: all of them for small sets, four spread out for larger ones. */
static uint32_t roots_of(uint32_t n, uint32_t *out)
{
    if (n <= 4) {
        for (uint32_t r = 0; r < n; r++)
            out[r] = r;
        return n;
    }
    out[0] = 0;
    out[1] = 1;
    out[2] = n / 2;
    out[3] = n - 1;
    return 4;
}

/*
 * Streaming (non-temporal) output stores, which the host backend uses once an op moves
 * host_stream_bytes (64 MiB by default, more than this test can afford per case): a
 * runtime with the threshold at 1 byte runs the same checks with every output streamed, at
 * odd offsets (uint8 blocks of odd length), through the rounding write-out of bfloat16,
 * inline (a small count) and on the workers (a large one), out of place and mixed with in
 * place (outputs that are inputs keep plain stores), a root that is not rank 0, over the set
 * given unsorted.
 */
static size_t run_streaming(ccq_kind kind, ccase *cs)
{
    static const ccq_dtype dts[] = {CCQ_UINT8, CCQ_BFLOAT16};
    static const ccq_reduce_op ops[] = {CCQ_SUM, CCQ_AVG};
    const kind_desc *k = desc_of(kind);
    const devset *set = &sets[NDEV]; /* {6, 1, 4} */
    size_t ncases = 0;
    ccq_runtime *rt;
    ccq_config cfg;

    ccq_config_init(&cfg);
    cfg.host_devices = NDEV;
    cfg.host_workers = 3;
    cfg.timeout_ms = 60000;
    cfg.host_stream_bytes = 1;
    assert_int_equal(ccq_runtime_create(&cfg, &rt), CCQ_OK);
    assert_int_equal(ccq_comm_init(rt, set->given, set->n), CCQ_OK);
    for (size_t a = 0; a < sizeof dts / sizeof dts[0]; a++)
        for (int big = 0; big <= 1; big++) {
            size_t count = big ? (LARGE_BLOCK_BYTES / ref_dtype_size(dts[a])) | 1 : 1001;
            refcache rc;
            refcache_init(&rc, kind, dts[a], count, set, 3);
            for (int m = OUT_OF_PLACE; m <= (k->has_in_place ? MIXED : OUT_OF_PLACE); m += MIXED) {
                case_make(&cs[0], &rc, set, ops[a], k->rooted ? 1 : 0, m, false);
                run_cases(rt, cs, 1);
                ncases++;
            }
            refcache_free(&rc);
        }
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
    return ncases;
}

/*
 * The full grid of one kind: every set x small count x dtype x op x root x {out of place,
 * in place} (plus mixed at count 17), one round (queued together, then fenced) per (set,
 * count, dtype). Then the worker-pool path for a subset: a few sets, dtypes, ops and roots
 * (the last rank and the middle one, never 0 when n > 1), every mode, one case per round to
 * bound memory.
 */
static void run_kind(fixture *f, ccq_kind kind)
{
    const kind_desc *k = desc_of(kind);
    enum { MAXCASES = NOP * NDEV * 3 };
    ccase *cs = calloc(MAXCASES, sizeof *cs);
    uint32_t roots[NDEV];
    size_t ncases = 0;

    assert_non_null(cs);
    for (uint32_t s = 0; s < NSETS; s++) {
        uint32_t n = sets[s].n;
        uint32_t nroots = k->rooted ? roots_of(n, roots) : 1;
        if (!k->rooted)
            roots[0] = 0;
        for (size_t ci = 0; ci < NSMALL; ci++)
            for (uint32_t a = 0; a < NDT; a++) {
                size_t nc = 0;
                /* Mixed modes at one count; they need two ranks to mean anything. */
                int nmodes = !k->has_in_place ? OUT_OF_PLACE : ci == 2 && n > 1 ? MIXED : IN_PLACE;
                refcache rc;
                refcache_init(&rc, kind, all_dts[a], small_counts[ci], &sets[s], 1);
                for (uint32_t b = 0; b < (k->reduces ? NOP : 1u); b++)
                    for (uint32_t ri = 0; ri < nroots; ri++)
                        for (int m = OUT_OF_PLACE; m <= nmodes; m++)
                            case_make(&cs[nc++], &rc, &sets[s], all_ops[b], roots[ri], m,
                                      ((ci + ri) & 1) != 0);
                run_cases(f->rt, cs, nc);
                refcache_free(&rc);
                ncases += nc;
            }
    }

    static const uint32_t large_sets[] = {0, 1, 2, NDEV - 1, NDEV}; /* n = 1, 2, 3, 8, {6,1,4} */
    for (size_t si = 0; si < sizeof large_sets / sizeof large_sets[0]; si++) {
        const devset *set = &sets[large_sets[si]];
        uint32_t n = set->n;
        uint32_t lroots[2] = {n - 1, n / 2};
        uint32_t nroots = k->rooted && n > 2 ? 2 : 1;
        int nmodes = !k->has_in_place ? OUT_OF_PLACE : n >= 3 ? MIXED : IN_PLACE;
        for (size_t a = 0; a < sizeof large_dts / sizeof large_dts[0]; a++) {
            size_t es = ref_dtype_size(large_dts[a]);
            size_t count = (LARGE_BLOCK_BYTES / es) | 1;
            refcache rc;
            refcache_init(&rc, kind, large_dts[a], count, set, 2);
            for (size_t b = 0; b < (k->reduces ? sizeof large_ops / sizeof large_ops[0] : 1u); b++)
                for (uint32_t ri = 0; ri < nroots; ri++)
                    for (int m = OUT_OF_PLACE; m <= nmodes; m++) {
                        case_make(&cs[0], &rc, set, large_ops[b], k->rooted ? lroots[ri] : 0, m,
                                  ri == 0);
                        run_cases(f->rt, cs, 1);
                        ncases++;
                    }
            refcache_free(&rc);
        }
    }
    ncases += run_streaming(kind, cs);
    free(cs);
    print_message("%s: %zu cases checked\n", ccq_kind_name(kind), ncases);
}

static void test_broadcast(void **state)
{
    run_kind(*state, CCQ_KIND_BROADCAST);
}

static void test_reduce(void **state)
{
    run_kind(*state, CCQ_KIND_REDUCE);
}

static void test_all_gather(void **state)
{
    run_kind(*state, CCQ_KIND_ALL_GATHER);
}

static void test_reduce_scatter(void **state)
{
    run_kind(*state, CCQ_KIND_REDUCE_SCATTER);
}

static void test_all_to_all(void **state)
{
    run_kind(*state, CCQ_KIND_ALL_TO_ALL);
}

static void test_gather(void **state)
{
    run_kind(*state, CCQ_KIND_GATHER);
}

static void test_scatter(void **state)
{
    run_kind(*state, CCQ_KIND_SCATTER);
}

/* count == 0 with NULL buffers everywhere is accepted and completes, for every kind, set
 * and root, and writes nothing (a guarded buffer passed on some ranks stays as it was). */
static void test_count_zero(void **state)
{
    fixture *f = *state;
    unsigned char buf[NDEV][16];
    uint64_t submitted = 0;
    ccq_stats before = stats_of(f->rt);

    memset(buf, 0x3c, sizeof buf);
    for (uint32_t s = 0; s < NSETS; s++) {
        const devset *set = &sets[s];
        ccq_device_id sorted[NDEV];
        sort_set(set->given, set->n, sorted);
        for (size_t ki = 0; ki < NKINDS; ki++)
            for (uint32_t root = 0; root < set->n; root++) {
                if (!kinds[ki].rooted && root > 0)
                    break;
                for (uint32_t i = 0; i < set->n; i++) {
                    ccq_device_id d = set->given[i];
                    void *b = (i & 1) ? buf[d] : NULL;
                    ccq_status st = ref_submit(f->rt, kinds[ki].kind, d, i % NSTREAMS, b, b, 0,
                                               all_dts[(s + ki) % NDT], all_ops[root % NOP],
                                               sorted[root], set->given, set->n);
                    if (st != CCQ_OK)
                        fail_msg("%s count 0 on device %u: %s (%s)", ccq_kind_name(kinds[ki].kind),
                                 d, ccq_status_name(st), ccq_last_error_detail());
                    submitted++;
                }
            }
        fence_all(f->rt, set->n, set->given);
    }
    for (uint32_t d = 0; d < NDEV; d++)
        for (int i = 0; i < 16; i++)
            assert_int_equal(buf[d][i], 0x3c);
    ccq_stats after = stats_of(f->rt);
    assert_int_equal(after.submitted - before.submitted, submitted);
    assert_int_equal(after.completed - before.completed, submitted);
}

/* ------------------------------------------------------------------------------------ */
/* Mismatches                                                                            */
/* ------------------------------------------------------------------------------------ */

typedef enum field { F_COUNT, F_DTYPE, F_OP, F_ROOT, F_KIND } field;
static const char *const field_names[] = {"count", "dtype", "op", "root", "kind"};

/*
 * One rank (`odd`, a rank) submits a part that differs from the others in one field. Every
 * rank's fence must return CCQ_ERR_MISMATCH with the field and the odd device named, and
 * nothing may be executed: every buffer keeps its bytes. Buffers are large enough
 * everywhere, so only the matching can object; with null_unused, each rank passes NULL
 * where its own call needs no buffer (as a rank that believes it is not the root does).
 */
static void mismatch_one(fixture *f, ccq_kind kind, field fld, ccq_kind other_kind,
                         const devset *set, uint32_t odd, bool null_unused)
{
    enum { COUNT = 17 };
    uint32_t n = set->n;
    size_t bytes = (size_t)n * (COUNT + 1) * 8;
    ccq_device_id sorted[NDEV];
    unsigned char *src[NDEV], *dst[NDEV], *snap_src[NDEV], *snap_dst[NDEV];
    uint32_t root = n > 1 ? 1 : 0;
    ccq_stats before = stats_of(f->rt);
    char what[128];

    sort_set(set->given, n, sorted);
    snprintf(what, sizeof what, "%s with a different %s on device %u", ccq_kind_name(kind),
             field_names[fld], sorted[odd]);
    for (uint32_t r = 0; r < n; r++) {
        src[r] = xmalloc(bytes);
        dst[r] = xmalloc(bytes);
        ref_fill(CCQ_UINT8, src[r], bytes, 77 + r);
        memset(dst[r], POISON, bytes);
        snap_src[r] = xmalloc(bytes);
        snap_dst[r] = xmalloc(bytes);
        memcpy(snap_src[r], src[r], bytes);
        memcpy(snap_dst[r], dst[r], bytes);
    }
    for (uint32_t i = 0; i < n; i++) {
        ccq_device_id d = set->given[i];
        uint32_t r = 0;
        while (sorted[r] != d)
            r++;
        ccq_kind k = kind;
        size_t count = COUNT;
        ccq_dtype dt = CCQ_FLOAT32;
        ccq_reduce_op op = CCQ_SUM;
        uint32_t rt_root = root;
        if (r == odd) {
            switch (fld) {
            case F_COUNT:
                count = COUNT + 1;
                break;
            case F_DTYPE:
                dt = CCQ_FLOAT64;
                break;
            case F_OP:
                op = CCQ_MAX;
                break;
            case F_ROOT:
                rt_root = (root + 1) % n;
                break;
            case F_KIND:
                k = other_kind;
                break;
            }
        }
        bool need_src = ref_src_count(k, n, rt_root, r, count) > 0;
        bool need_dst = ref_dst_count(k, n, rt_root, r, count) > 0;
        ccq_status st = ref_submit(f->rt, k, d, 0, need_src || !null_unused ? src[r] : NULL,
                                   need_dst || !null_unused ? dst[r] : NULL, count, dt, op,
                                   sorted[rt_root], set->given, n);
        if (st != CCQ_OK)
            fail_msg("%s: submit on device %u: %s (%s)", what, d, ccq_status_name(st),
                     ccq_last_error_detail());
    }
    for (uint32_t r = 0; r < n; r++) {
        char want_field[32], want_dev[32], buf[512];
        ccq_status st = ccq_sync_collective(f->rt, sorted[r], 0);
        const char *detail = ccq_last_error_detail();
        snprintf(want_field, sizeof want_field, " %s: ", field_names[fld]);
        snprintf(want_dev, sizeof want_dev, "(device %u)", sorted[odd]);
        if (st != CCQ_ERR_MISMATCH || strstr(detail, want_field) == NULL ||
            strstr(detail, want_dev) == NULL)
            fail_msg("%s: fence on device %u: %s, detail \"%s\" (want CCQ_ERR_MISMATCH naming "
                     "\"%s\" and \"%s\")",
                     what, sorted[r], ccq_status_name(st), detail, want_field, want_dev);
        /* The same error is kept for any thread to read. */
        assert_int_equal(ccq_stream_last_error(f->rt, sorted[r], 0, buf, sizeof buf),
                         CCQ_ERR_MISMATCH);
        assert_non_null(strstr(buf, want_field));
        /* Reported once: the next fence is clean. */
        assert_int_equal(ccq_sync_collective(f->rt, sorted[r], 0), CCQ_OK);
    }
    for (uint32_t r = 0; r < n; r++) {
        if (memcmp(src[r], snap_src[r], bytes) != 0 || memcmp(dst[r], snap_dst[r], bytes) != 0)
            fail_msg("%s: rank %u (device %u): a buffer changed, so something was executed", what,
                     r, sorted[r]);
        free(src[r]);
        free(dst[r]);
        free(snap_src[r]);
        free(snap_dst[r]);
    }
    ccq_stats after = stats_of(f->rt);
    assert_int_equal(after.failed - before.failed, n);
    assert_int_equal(after.submitted - before.submitted, n);
    f->expect_failed += n;
}

/* One correct collective of `kind` over the set, checked (the communicator still works and
 * the ranks still agree on the sequence numbers). */
static void run_one_ok(fixture *f, ccq_kind kind, const devset *set, uint32_t root)
{
    ccase c;
    refcache rc;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.dt = CCQ_FLOAT32;
    c.op = CCQ_SUM;
    c.count = 17;
    c.given = set->given;
    c.n = set->n;
    c.root = root;
    refcache_init(&rc, kind, c.dt, c.count, set, 3);
    case_setup(&c, &rc);
    run_cases(f->rt, &c, 1);
    refcache_free(&rc);
}

static void test_mismatch(void **state)
{
    fixture *f = *state;
    const devset *four = &sets[3], *odd_set = &sets[NDEV]; /* {0,1,2,3} and {6,1,4} */
    uint32_t i = 0;

    for (size_t ki = 0; ki < NKINDS; ki++) {
        const kind_desc *k = &kinds[ki];
        for (int fld = F_COUNT; fld <= F_ROOT; fld++) {
            if ((fld == F_OP && !k->reduces) || (fld == F_ROOT && !k->rooted))
                continue;
            /* The odd rank moves around, rank 0 included (then all others differ from it). */
            mismatch_one(f, k->kind, (field)fld, k->kind, four, i % 4, i % 2 == 0);
            mismatch_one(f, k->kind, (field)fld, k->kind, odd_set, (i + 1) % 3, i % 2 != 0);
            i++;
        }
        run_one_ok(f, k->kind, four, 2);
        run_one_ok(f, k->kind, odd_set, 2);
    }
    /* Different kinds at the same sequence number. */
    mismatch_one(f, CCQ_KIND_ALL_GATHER, F_KIND, CCQ_KIND_ALL_TO_ALL, four, 3, false);
    mismatch_one(f, CCQ_KIND_BROADCAST, F_KIND, CCQ_KIND_SCATTER, odd_set, 0, true);
    mismatch_one(f, CCQ_KIND_REDUCE, F_KIND, CCQ_KIND_ALL_REDUCE, four, 1, true);
    mismatch_one(f, CCQ_KIND_REDUCE_SCATTER, F_KIND, CCQ_KIND_GATHER, four, 2, false);
    for (size_t ki = 0; ki < NKINDS; ki++)
        run_one_ok(f, kinds[ki].kind, four, 3);
}

/* ------------------------------------------------------------------------------------ */
/* Argument validation                                                                   */
/* ------------------------------------------------------------------------------------ */

/* A refused call: CCQ_ERR_INVALID_ARGUMENT, a detail that mentions `want`, nothing queued. */
static void expect_invalid(fixture *f, const char *what, ccq_kind kind, ccq_device_id dev,
                           const void *src, void *dst, size_t count, ccq_device_id root,
                           const devset *set, const char *want)
{
    uint64_t before = stats_of(f->rt).submitted, depth = 1;
    ccq_status st = ref_submit(f->rt, kind, dev, 0, src, dst, count, CCQ_FLOAT32, CCQ_SUM, root,
                               set->given, set->n);
    const char *detail = ccq_last_error_detail();
    if (st != CCQ_ERR_INVALID_ARGUMENT || strstr(detail, want) == NULL)
        fail_msg("%s %s on device %u: %s, detail \"%s\" (want CCQ_ERR_INVALID_ARGUMENT naming "
                 "\"%s\")",
                 ccq_kind_name(kind), what, dev, ccq_status_name(st), detail, want);
    if (stats_of(f->rt).submitted != before)
        fail_msg("%s %s: refused call queued a command", ccq_kind_name(kind), what);
    assert_int_equal(ccq_stream_queue_depth(f->rt, dev, 0, &depth), CCQ_OK);
    assert_int_equal(depth, 0);
}

static void test_validation(void **state)
{
    fixture *f = *state;
    const devset *set = &sets[3]; /* {0,1,2,3}; devices 4..7 exist but are not in it */
    enum { C = 17, N = 4 };
    size_t blk = C * sizeof(float);
    float *mem[N];
    unsigned char *b[N];

    for (uint32_t r = 0; r < N; r++) {
        mem[r] = xmalloc(4 * N * blk);
        memset(mem[r], 0, 4 * N * blk);
        b[r] = (unsigned char *)mem[r] + N * blk; /* room on both sides */
    }
    /* Roots that are not in the set: an existing device, and one that does not exist. */
    for (size_t ki = 0; ki < NKINDS; ki++) {
        if (!kinds[ki].rooted)
            continue;
        ccq_kind k = kinds[ki].kind;
        expect_invalid(f, "root 5", k, 0, b[0], b[0] + N * blk, C, 5, set,
                       "root device 5 is not in the device set");
        expect_invalid(f, "root 1000", k, 2, b[2], b[2] + N * blk, C, 1000, set,
                       "root device 1000");
        expect_invalid(f, "root 6, count 0", k, 1, NULL, NULL, 0, 6, set, "root device 6");
    }
    /* NULL where this rank needs a buffer (root device 1 = rank 1). */
    unsigned char *x = b[1], *y = b[1] + N * blk;
    expect_invalid(f, "root src NULL", CCQ_KIND_BROADCAST, 1, NULL, y, C, 1, set, "src is NULL");
    expect_invalid(f, "root dst NULL", CCQ_KIND_BROADCAST, 1, x, NULL, C, 1, set, "dst is NULL");
    expect_invalid(f, "non-root dst NULL", CCQ_KIND_BROADCAST, 2, x, NULL, C, 1, set,
                   "dst is NULL");
    expect_invalid(f, "non-root src NULL", CCQ_KIND_REDUCE, 2, NULL, y, C, 1, set, "src is NULL");
    expect_invalid(f, "root src NULL", CCQ_KIND_REDUCE, 1, NULL, y, C, 1, set, "src is NULL");
    expect_invalid(f, "root dst NULL", CCQ_KIND_REDUCE, 1, x, NULL, C, 1, set, "dst is NULL");
    expect_invalid(f, "src NULL", CCQ_KIND_ALL_GATHER, 0, NULL, y, C, 0, set, "src is NULL");
    expect_invalid(f, "dst NULL", CCQ_KIND_ALL_GATHER, 3, x, NULL, C, 0, set, "dst is NULL");
    expect_invalid(f, "src NULL", CCQ_KIND_REDUCE_SCATTER, 0, NULL, y, C, 0, set, "src is NULL");
    expect_invalid(f, "dst NULL", CCQ_KIND_REDUCE_SCATTER, 3, x, NULL, C, 0, set, "dst is NULL");
    expect_invalid(f, "src NULL", CCQ_KIND_ALL_TO_ALL, 2, NULL, y, C, 0, set, "src is NULL");
    expect_invalid(f, "dst NULL", CCQ_KIND_ALL_TO_ALL, 1, x, NULL, C, 0, set, "dst is NULL");
    expect_invalid(f, "non-root src NULL", CCQ_KIND_GATHER, 3, NULL, y, C, 1, set, "src is NULL");
    expect_invalid(f, "root src NULL", CCQ_KIND_GATHER, 1, NULL, y, C, 1, set, "src is NULL");
    expect_invalid(f, "root dst NULL", CCQ_KIND_GATHER, 1, x, NULL, C, 1, set, "dst is NULL");
    expect_invalid(f, "root src NULL", CCQ_KIND_SCATTER, 1, NULL, y, C, 1, set, "src is NULL");
    expect_invalid(f, "non-root dst NULL", CCQ_KIND_SCATTER, 0, x, NULL, C, 1, set, "dst is NULL");
    expect_invalid(f, "root dst NULL", CCQ_KIND_SCATTER, 1, x, NULL, C, 1, set, "dst is NULL");

    /* Overlaps other than the in-place position (rank 2 = device 2; root device 1 = rank 1). */
    unsigned char *z = b[2];
    size_t e = sizeof(float);
    expect_invalid(f, "src = dst + 1 element", CCQ_KIND_BROADCAST, 1, b[1] + e, b[1], C, 1, set,
                   "overlap");
    expect_invalid(f, "dst = src + 1 element", CCQ_KIND_BROADCAST, 1, b[1], b[1] + e, C, 1, set,
                   "overlap");
    expect_invalid(f, "src = dst + 1 element", CCQ_KIND_REDUCE, 1, b[1] + e, b[1], C, 1, set,
                   "overlap");
    expect_invalid(f, "src = dst - 1 element", CCQ_KIND_REDUCE, 1, b[1] - e, b[1], C, 1, set,
                   "overlap");
    expect_invalid(f, "src = dst (block 0, rank 2)", CCQ_KIND_ALL_GATHER, 2, z, z, C, 0, set,
                   "overlap");
    expect_invalid(f, "src = dst + block 3", CCQ_KIND_ALL_GATHER, 2, z + 3 * blk, z, C, 0, set,
                   "overlap");
    expect_invalid(f, "src = dst + block 2 + 1 element", CCQ_KIND_ALL_GATHER, 2, z + 2 * blk + e, z,
                   C, 0, set, "overlap");
    expect_invalid(f, "src = dst - 1 element", CCQ_KIND_ALL_GATHER, 2, z - e, z, C, 0, set,
                   "overlap");
    expect_invalid(f, "dst = src (block 0, rank 2)", CCQ_KIND_REDUCE_SCATTER, 2, z, z, C, 0, set,
                   "overlap");
    expect_invalid(f, "dst = src + block 1", CCQ_KIND_REDUCE_SCATTER, 2, z, z + blk, C, 0, set,
                   "overlap");
    expect_invalid(f, "dst = src + block 2 - 1 element", CCQ_KIND_REDUCE_SCATTER, 2, z,
                   z + 2 * blk - e, C, 0, set, "overlap");
    expect_invalid(f, "src == dst", CCQ_KIND_ALL_TO_ALL, 2, z, z, C, 0, set, "overlap");
    expect_invalid(f, "dst = src + block 2 (the rank's block)", CCQ_KIND_ALL_TO_ALL, 2, z,
                   z + 2 * blk, C, 0, set, "overlap");
    expect_invalid(f, "src = dst - block 3", CCQ_KIND_ALL_TO_ALL, 2, z - 3 * blk, z, C, 0, set,
                   "overlap");
    expect_invalid(f, "root src = dst (block 0, root rank 1)", CCQ_KIND_GATHER, 1, b[1], b[1], C, 1,
                   set, "overlap");
    expect_invalid(f, "root src = dst + block 1 + 1 element", CCQ_KIND_GATHER, 1, b[1] + blk + e,
                   b[1], C, 1, set, "overlap");
    expect_invalid(f, "root dst = src (block 0, root rank 1)", CCQ_KIND_SCATTER, 1, b[1], b[1], C,
                   1, set, "overlap");
    expect_invalid(f, "root dst = src + block 1 - 1 element", CCQ_KIND_SCATTER, 1, b[1],
                   b[1] + blk - e, C, 1, set, "overlap");
    /* Counts whose bytes overflow: one block, or only the n blocks of the kinds that hold
     * count * n elements (count * 4 bytes fits, count * 4 bytes * 4 ranks does not). */
    size_t huge = (size_t)PTRDIFF_MAX / sizeof(float) / 2;
    expect_invalid(f, "count * esize overflows", CCQ_KIND_BROADCAST, 1, x, y, SIZE_MAX / 2, 1, set,
                   "overflows");
    expect_invalid(f, "count * n * esize overflows", CCQ_KIND_ALL_GATHER, 0, x, y, huge, 0, set,
                   "overflows");
    expect_invalid(f, "count * n * esize overflows", CCQ_KIND_REDUCE_SCATTER, 0, x, y, huge, 0, set,
                   "overflows");
    expect_invalid(f, "count * n * esize overflows", CCQ_KIND_ALL_TO_ALL, 0, x, y, huge, 0, set,
                   "overflows");
    expect_invalid(f, "count * n * esize overflows", CCQ_KIND_GATHER, 1, x, y, huge, 1, set,
                   "overflows");
    expect_invalid(f, "count * n * esize overflows", CCQ_KIND_SCATTER, 1, x, y, huge, 1, set,
                   "overflows");
    for (uint32_t r = 0; r < N; r++)
        free(mem[r]);

    /* Nothing refused took a sequence number: every kind still matches across the ranks. */
    for (size_t ki = 0; ki < NKINDS; ki++)
        run_one_ok(f, kinds[ki].kind, set, 1);
}

/* ------------------------------------------------------------------------------------ */
/* Stream order                                                                          */
/* ------------------------------------------------------------------------------------ */

/*
 * Two collectives chained on one stream per rank, queued together before one fence: the
 * second reads what the first wrote, so it must see the first's result (the scheduler may
 * not batch them so that they overlap). Expected values chain tools/ref/ref.c the same way.
 *  - reduce_scatter in place, then all_gather in place on the same buffer = all_reduce;
 *  - scatter from one root, then gather to another = the first root's buffer;
 *  - broadcast from one root, then reduce to another = n times the first root's data;
 *  - all_to_all twice = the identity.
 */
static void chain_round(fixture *f, const devset *set, ccq_dtype dt, ccq_reduce_op op, size_t count)
{
    uint32_t n = set->n, ra = n - 1, rb = n / 2; /* roots (ranks) of the rooted chains */
    size_t es = ref_dtype_size(dt), blk = count * es, full = n * blk;
    ccq_device_id sorted[NDEV];
    unsigned char *buf[NDEV], *in[NDEV], *mid[NDEV], *out[NDEV], *want;
    const void *inputs[NDEV];
    char what[160];

    sort_set(set->given, n, sorted);
    snprintf(what, sizeof what, "%s %s n=%u count=%zu", ccq_dtype_name(dt), ccq_reduce_op_name(op),
             n, count);
    for (uint32_t r = 0; r < n; r++) {
        in[r] = xmalloc(full);
        ref_fill(dt, in[r], n * count, 4242 + sorted[r]);
        inputs[r] = in[r];
    }
    for (int chain = 0; chain < 4; chain++) {
        for (uint32_t r = 0; r < n; r++) {
            buf[r] = xmalloc(full);
            mid[r] = xmalloc(full);
            out[r] = xmalloc(full + GUARD);
            memcpy(buf[r], in[r], full);
            memset(mid[r], POISON, full);
            memset(out[r], POISON, full + GUARD);
        }
        for (uint32_t i = 0; i < n; i++) {
            ccq_device_id d = set->given[i];
            uint32_t r = 0;
            ccq_status s1, s2;
            while (sorted[r] != d)
                r++;
            switch (chain) {
            case 0:
                s1 = ccq_reduce_scatter(f->rt, d, 1, buf[r], buf[r] + r * blk, count, dt, op,
                                        set->given, n);
                s2 =
                    ccq_all_gather(f->rt, d, 1, buf[r] + r * blk, buf[r], count, dt, set->given, n);
                break;
            case 1:
                s1 = ccq_scatter(f->rt, d, 1, r == ra ? buf[r] : NULL, mid[r], count, dt,
                                 sorted[ra], set->given, n);
                s2 = ccq_gather(f->rt, d, 1, mid[r], r == rb ? out[r] : NULL, count, dt, sorted[rb],
                                set->given, n);
                break;
            case 2:
                s1 = ccq_broadcast(f->rt, d, 1, r == ra ? buf[r] : NULL, mid[r], count, dt,
                                   sorted[ra], set->given, n);
                s2 = ccq_reduce(f->rt, d, 1, mid[r], r == rb ? out[r] : NULL, count, dt, op,
                                sorted[rb], set->given, n);
                break;
            default:
                s1 = ccq_all_to_all(f->rt, d, 1, buf[r], mid[r], count, dt, set->given, n);
                s2 = ccq_all_to_all(f->rt, d, 1, mid[r], out[r], count, dt, set->given, n);
                break;
            }
            if (s1 != CCQ_OK || s2 != CCQ_OK)
                fail_msg("chain %d %s: submit on device %u: %s %s (%s)", chain, what, d,
                         ccq_status_name(s1), ccq_status_name(s2), ccq_last_error_detail());
        }
        fence_all(f->rt, n, set->given);

        want = xmalloc(full);
        for (uint32_t r = 0; r < n; r++) {
            const unsigned char *got;
            size_t elems;
            char msg[256];
            switch (chain) {
            case 0:
                ref_allreduce(dt, op, n, inputs, want, n * count);
                got = buf[r];
                elems = n * count;
                break;
            case 1:
                if (r != rb)
                    continue;
                memcpy(want, in[ra], full);
                got = out[r];
                elems = n * count;
                break;
            case 2: {
                const void *same[NDEV];
                if (r != rb)
                    continue;
                for (uint32_t j = 0; j < n; j++)
                    same[j] = in[ra];
                ref_allreduce(dt, op, n, same, want, count);
                got = out[r];
                elems = count;
                break;
            }
            default:
                memcpy(want, in[r], full);
                got = out[r];
                elems = n * count;
                break;
            }
            size_t bad = ref_compare(dt, got, want, elems, msg, sizeof msg);
            if (bad)
                fail_msg("chain %d %s: rank %u (device %u): %zu wrong; %s", chain, what, r,
                         sorted[r], bad, msg);
        }
        for (uint32_t r = 0; r < n; r++) {
            /* Bytes of out the chain writes on this rank (checked above); the rest, the
             * guard included, must keep the poison: non-roots of gather and reduce, and
             * chain 0, which works in buf, write nothing there. */
            size_t written = 0;
            if (chain == 3 || (chain == 1 && r == rb))
                written = full;
            else if (chain == 2 && r == rb)
                written = blk;
            for (size_t i = written; i < full + GUARD; i++)
                if (out[r][i] != POISON)
                    fail_msg("chain %d %s: rank %u (device %u): byte %zu of out written", chain,
                             what, r, sorted[r], i);
            free(buf[r]);
            free(mid[r]);
            free(out[r]);
        }
        free(want);
    }
    for (uint32_t r = 0; r < n; r++)
        free(in[r]);
}

static void test_stream_order(void **state)
{
    fixture *f = *state;
    static const uint32_t set_idx[] = {0, 2, 3, NDEV - 1, NDEV, NDEV + 1};
    static const ccq_dtype dts[] = {CCQ_FLOAT32, CCQ_BFLOAT16, CCQ_INT32, CCQ_FLOAT64};
    static const ccq_reduce_op ops[] = {CCQ_SUM, CCQ_AVG, CCQ_PROD};

    for (size_t s = 0; s < sizeof set_idx / sizeof set_idx[0]; s++)
        for (size_t a = 0; a < sizeof dts / sizeof dts[0]; a++) {
            chain_round(f, &sets[set_idx[s]], dts[a], ops[(s + a) % 3], 17);
            chain_round(f, &sets[set_idx[s]], dts[a], ops[(s + a + 1) % 3], 1001);
        }
    /* Big enough for the worker pool, where two ops of one batch could overlap. */
    chain_round(f, &sets[3], CCQ_FLOAT32, CCQ_SUM, (LARGE_BLOCK_BYTES / 4) | 1);
    chain_round(f, &sets[NDEV - 1], CCQ_FLOAT64, CCQ_AVG, (LARGE_BLOCK_BYTES / 8) | 1);
    chain_round(f, &sets[NDEV], CCQ_BFLOAT16, CCQ_MAX, (LARGE_BLOCK_BYTES / 2) | 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_broadcast, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reduce, setup, teardown),
        cmocka_unit_test_setup_teardown(test_all_gather, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reduce_scatter, setup, teardown),
        cmocka_unit_test_setup_teardown(test_all_to_all, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gather, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scatter, setup, teardown),
        cmocka_unit_test_setup_teardown(test_count_zero, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mismatch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_validation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stream_order, setup, teardown),
    };
    /* CCQ_TEST_FILTER=pattern runs only the matching tests (cmocka's wildcard syntax). */
    const char *filter = getenv("CCQ_TEST_FILTER");
    if (filter != NULL && *filter != '\0')
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests_name("collectives", tests, NULL, NULL);
}
