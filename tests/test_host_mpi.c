/* The host backend's MPI engine (backends/host/mpi/engine.c) under mpiexec, without the
 * runtime: a world of P processes, process p holding 1 + p % 2 local ranks (uneven), every
 * kind x dtype x op against tests/ref.h across processes, roots in every process, the
 * in-place forms, a communicator over a subset of the processes, send/recv halves between
 * every pair of processes and every collective on a pair (over point-to-point messages), a
 * member that does not arrive (the operation stays pending, other communicators keep working,
 * the abandoned request is freed once it completes), and mismatches across processes (found
 * before any data moves, on every member).
 *
 * Inputs are chosen so that every association order gives the same bits (MPI combines the
 * per-process partials in an order of its own): integers wrap (associative), and floats
 * take values in {-1, 0, 1}, whose sums and products are exact in every ccq type. */
#include <mpi.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "backends/host/mpi/engine.h"
#include "common/kinds.h"
#include "ref.h"

static int wrank, wsize;

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* A communicator over the world processes procs[0..np-1] (ascending, this one among them),
 * process procs[i] holding nl_of(procs[i]) ranks. */
typedef struct tcomm {
    ccq_hmpi_comm *c;
    uint32_t np, procs[16], nl[16]; /* members, their world ranks and local rank counts */
    uint32_t nranks, first, nlocal;
    uint64_t seq; /* the next operation's sequence number (as the runtime's, per channel) */
} tcomm;

static ccq_hmpi_world *world; /* the world's duplicate, made at the start (as world_ready) */

static uint32_t nl_of(uint32_t p)
{
    return 1 + p % 2;
}

static void tcomm_make(tcomm *t, const uint32_t *procs, uint32_t np, uint32_t creator_blob)
{
    ccq_be_comm_desc d;
    ccq_device_id dev[4];
    ccq_errbuf err = {{0}};
    uint8_t blob[CCQ_HMPI_BLOB_LEN];
    uint32_t v[2] = {procs[0], creator_blob};

    memset(t, 0, sizeof *t);
    t->np = np;
    memcpy(t->procs, procs, np * sizeof *procs);
    for (uint32_t i = 0; i < np; i++) {
        t->nl[i] = nl_of(procs[i]);
        if (procs[i] == (uint32_t)wrank) {
            t->first = t->nranks;
            t->nlocal = nl_of(procs[i]);
        }
        t->nranks += nl_of(procs[i]);
    }
    for (uint32_t k = 0; k < t->nlocal; k++)
        dev[k] = k;
    memcpy(blob, v, sizeof v); /* what ccq_hmpi_root_blob would give on procs[0] */
    d.nranks = t->nranks;
    d.first_rank = t->first;
    d.nlocal = t->nlocal;
    d.local_devices = dev;
    d.nprocs = np;
    d.procs = t->procs;
    d.world_rank = (uint32_t)wrank;
    d.root_blob = blob;
    d.root_blob_len = sizeof blob;
    assert_int_equal(ccq_hmpi_comm_create(&d, world, blob, sizeof blob, &t->c, &err), CCQ_OK);
}

/* A pair: one rank in each of two processes, as the runtime makes for two devices in two
 * processes (point-to-point on the world's duplicate; no communicator of its own). */
static void tpair_make(tcomm *t, uint32_t p, uint32_t q, uint32_t creator_blob)
{
    ccq_be_comm_desc d;
    ccq_device_id dev = 0;
    ccq_errbuf err = {{0}};
    uint32_t v[2] = {p, creator_blob};

    memset(t, 0, sizeof *t);
    t->np = 2;
    t->procs[0] = p;
    t->procs[1] = q;
    t->nl[0] = t->nl[1] = 1;
    t->nranks = 2;
    t->first = p == (uint32_t)wrank ? 0 : 1;
    t->nlocal = 1;
    d.nranks = 2;
    d.first_rank = t->first;
    d.nlocal = 1;
    d.local_devices = &dev;
    d.nprocs = 2;
    d.procs = t->procs;
    d.world_rank = (uint32_t)wrank;
    d.root_blob = v;
    d.root_blob_len = sizeof v;
    assert_int_equal(ccq_hmpi_pair_create(&d, world, v, sizeof v, &t->c, &err), CCQ_OK);
}

/* Run op to completion. */
static void run_op(tcomm *t, ccq_be_op *op)
{
    ccq_hmpi_op *h = NULL;
    ccq_errbuf err = {{0}};
    ccq_status st = ccq_hmpi_start(t->c, op, now_ns(), &h, &err);
    if (st != CCQ_OK)
        fail_msg("start: %s", err.msg);
    while ((st = ccq_hmpi_test(h, &err)) == CCQ_IN_PROGRESS)
        ;
    if (st != CCQ_OK)
        fail_msg("test: %s", err.msg);
}

/* One collective: every rank's input from its seed, the op on the local ranks, each local
 * output against ref_collective over all ranks. */
static void check_one(tcomm *t, ccq_kind kind, ccq_dtype dt, ccq_reduce_op ro, uint32_t root,
                      size_t count, bool in_place, uint32_t seed)
{
    const ccq_kind_info *ki = &ccq_kinds[kind];
    size_t es = ref_dtype_size(dt), n = t->nranks;
    size_t sb = (ki->src_n ? n : 1) * count * es, db = (ki->dst_n ? n : 1) * count * es;
    void *inputs[64];
    char *allocs[8], *want = malloc(db);
    uint32_t nalloc = 0;
    ccq_be_part parts[4];
    ccq_be_op op;

    assert_true(n <= 64);
    for (uint32_t r = 0; r < n; r++) {
        inputs[r] = malloc(sb);
        ref_fill_exact(dt, inputs[r], sb / es, seed + r);
    }
    memset(&op, 0, sizeof op);
    op.kind = (uint8_t)kind;
    op.dtype = (uint8_t)dt;
    op.redop = (uint8_t)ro;
    op.root = root;
    op.count = count;
    op.comm_size = t->nranks;
    op.nparts = t->nlocal;
    op.parts = parts;
    op.seq = t->seq++;
    for (uint32_t k = 0; k < t->nlocal; k++) {
        uint32_t r = t->first + k;
        bool is_root = r == root;
        bool uses_src = ki->src_use == CCQ_USE_ALL || (ki->src_use == CCQ_USE_ROOT && is_root);
        bool uses_dst = ki->dst_use == CCQ_USE_ALL || (ki->dst_use == CCQ_USE_ROOT && is_root);
        char *src = NULL, *dst = NULL;
        uint8_t ipr = in_place && uses_src && uses_dst ? ki->inplace : CCQ_INPLACE_NONE;
        size_t at = (ipr == CCQ_INPLACE_SRC_AT_RANK || ipr == CCQ_INPLACE_DST_AT_RANK ? r : root) *
                    count * es;
        if (ipr == CCQ_INPLACE_DST_AT_RANK || ipr == CCQ_INPLACE_DST_AT_ROOT) {
            src = allocs[nalloc++] = malloc(sb); /* dst inside src */
            dst = src + at;
        } else if (ipr != CCQ_INPLACE_NONE) { /* src inside dst (or the same) */
            dst = allocs[nalloc++] = malloc(db);
            memset(dst, 0xa5, db);
            src = ipr == CCQ_INPLACE_SAME ? dst : dst + at;
        } else {
            if (uses_src)
                src = allocs[nalloc++] = malloc(sb);
            if (uses_dst) {
                dst = allocs[nalloc++] = malloc(db);
                memset(dst, 0xa5, db);
            }
        }
        if (src != NULL)
            memcpy(src, inputs[r], sb);
        parts[k].src = src;
        parts[k].dst = dst;
        parts[k].rank = r;
    }
    run_op(t, &op);
    for (uint32_t k = 0; k < t->nlocal; k++) {
        uint32_t r = t->first + k;
        size_t got = ref_collective(kind, dt, ro, (uint32_t)n, root, (const void *const *)inputs, r,
                                    want, count);
        char msg[256] = "";
        if (got == 0 || parts[k].dst == NULL)
            continue;
        if (ref_compare(dt, parts[k].dst, want, got, msg, sizeof msg) != 0)
            fail_msg("process %d rank %u: %s %s op %d root %u count %zu%s: %s", wrank, r, ki->name,
                     ref_dtype_size(dt) ? "" : "?", (int)ro, root, count,
                     in_place ? " in place" : "", msg);
    }
    for (uint32_t a = 0; a < nalloc; a++)
        free(allocs[a]);
    for (uint32_t r = 0; r < n; r++)
        free(inputs[r]);
    free(want);
}

static void all_kinds(tcomm *t, size_t count, bool every_dtype)
{
    uint32_t seed = 1;
    for (int kind = 0; kind < CCQ_KIND_COUNT_; kind++) {
        const ccq_kind_info *ki = &ccq_kinds[kind];
        if (!ki->collective)
            continue;
        for (int dt = 0; dt < CCQ_DTYPE_COUNT_; dt++) {
            if (!every_dtype && dt != CCQ_FLOAT32 && dt != CCQ_INT32)
                continue;
            for (int ro = 0; ro < (ki->reduces ? CCQ_REDUCE_OP_COUNT_ : 1); ro++) {
                /* Roots: the last rank of every member process (and rank 0). */
                uint32_t roots[17], nroots = 0, r0 = 0;
                if (ki->rooted) {
                    roots[nroots++] = 0;
                    for (uint32_t p = 0; p < t->np; p++) {
                        r0 += t->nl[p];
                        roots[nroots++] = r0 - 1;
                    }
                } else {
                    roots[nroots++] = 0;
                }
                for (uint32_t q = 0; q < nroots; q++)
                    for (int ip = 0; ip < 2; ip++) {
                        if (ip && ki->inplace == CCQ_INPLACE_NONE)
                            continue;
                        check_one(t, (ccq_kind)kind, (ccq_dtype)dt, (ccq_reduce_op)ro, roots[q],
                                  count, ip != 0, seed++);
                    }
            }
        }
    }
}

static uint32_t world_procs[16];

static void test_world_every_kind(void **state)
{
    tcomm t;
    (void)state;
    tcomm_make(&t, world_procs, (uint32_t)wsize, 0);
    all_kinds(&t, 37, true);
    all_kinds(&t, 70001, false); /* beyond the eager limits: MPI's rendezvous path */
    ccq_hmpi_comm_destroy(t.c);
}

/* A communicator of the first and last process only; the others meanwhile run theirs. */
static void test_subset(void **state)
{
    uint32_t ends[2] = {0, (uint32_t)wsize - 1}, mid[16], nm = 0;
    tcomm t;
    (void)state;
    for (int p = 1; p < wsize - 1; p++)
        mid[nm++] = (uint32_t)p;
    if (wrank == 0 || wrank == wsize - 1) {
        tcomm_make(&t, ends, 2, 1);
        all_kinds(&t, 33, false);
        ccq_hmpi_comm_destroy(t.c);
    } else if (nm >= 2) {
        tcomm_make(&t, mid, nm, 2);
        all_kinds(&t, 33, false);
        ccq_hmpi_comm_destroy(t.c);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

/* Send/recv halves between every pair of processes, both directions, several in flight,
 * each pair on its own two-process communicator (as the runtime makes a pair's). */
static void test_pairs(void **state)
{
    enum { MSGS = 4, COUNT = 5000 };
    tcomm pc[16];
    ccq_hmpi_op *h[16][2 * MSGS];
    ccq_be_op ops[16][2 * MSGS];
    ccq_be_part parts[16][2 * MSGS];
    uint32_t *sbuf[16][MSGS], *rbuf[16][MSGS];
    uint32_t peer_of[16], npairs = 0;
    ccq_errbuf err = {{0}};
    (void)state;

    /* Pairs never block to form (no communicator of their own): any order will do. */
    for (int p = 0; p < wsize; p++)
        for (int q = p + 1; q < wsize; q++) {
            if (p != wrank && q != wrank)
                continue;
            tpair_make(&pc[npairs], (uint32_t)p, (uint32_t)q, 100u + (uint32_t)(p * wsize + q));
            peer_of[npairs] = (uint32_t)(p == wrank ? q : p);
            npairs++;
        }
    for (uint32_t i = 0; i < npairs; i++) {
        uint32_t me = pc[i].first, other = 1 - me;
        for (uint32_t m = 0; m < MSGS; m++) {
            sbuf[i][m] = malloc(COUNT * 4);
            rbuf[i][m] = calloc(COUNT, 4);
            for (uint32_t e = 0; e < COUNT; e++)
                sbuf[i][m][e] = (uint32_t)wrank * 1000000u + peer_of[i] * 10000u + m * 100u + e;
            for (int dir = 0; dir < 2; dir++) {
                ccq_be_op *op = &ops[i][2 * m + dir];
                ccq_be_part *pt = &parts[i][2 * m + dir];
                memset(op, 0, sizeof *op);
                memset(pt, 0, sizeof *pt);
                op->kind = dir == 0 ? CCQ_KIND_SEND : CCQ_KIND_RECV;
                op->dtype = CCQ_UINT32;
                op->count = COUNT;
                op->peer = other;
                op->comm_size = 2;
                op->nparts = 1;
                op->parts = pt;
                op->seq = m;
                pt->rank = me;
                pt->src = dir == 0 ? sbuf[i][m] : NULL;
                pt->dst = dir == 0 ? NULL : rbuf[i][m];
                assert_int_equal(ccq_hmpi_start(pc[i].c, op, now_ns(), &h[i][2 * m + dir], &err),
                                 CCQ_OK);
            }
        }
    }
    for (bool busy = true; busy;) {
        busy = false;
        for (uint32_t i = 0; i < npairs; i++)
            for (uint32_t k = 0; k < 2 * MSGS; k++) {
                ccq_status st;
                if (h[i][k] == NULL)
                    continue;
                st = ccq_hmpi_test(h[i][k], &err);
                if (st == CCQ_IN_PROGRESS) {
                    busy = true;
                    continue;
                }
                assert_int_equal(st, CCQ_OK);
                h[i][k] = NULL;
            }
    }
    for (uint32_t i = 0; i < npairs; i++) {
        for (uint32_t m = 0; m < MSGS; m++) {
            for (uint32_t e = 0; e < COUNT; e++)
                if (rbuf[i][m][e] !=
                    peer_of[i] * 1000000u + (uint32_t)wrank * 10000u + m * 100u + e)
                    fail_msg("process %d from %u message %u element %u: %u", wrank, peer_of[i], m,
                             e, rbuf[i][m][e]);
            free(sbuf[i][m]);
            free(rbuf[i][m]);
        }
    }
    /* Every collective on every pair (over point-to-point messages), pairs in turn. */
    for (uint32_t i = 0; i < npairs; i++)
        all_kinds(&pc[i], (pc[i].procs[0] + pc[i].procs[1]) % 2 ? 17 : 5003,
                  pc[i].procs[0] == 0 && pc[i].procs[1] == 1);
    /* beyond 128 KiB: all_reduce in two exchanges (each side reduces half), rendezvous */
    for (uint32_t i = 0; i < npairs; i++)
        if (pc[i].procs[0] == 0 && pc[i].procs[1] == 1)
            all_kinds(&pc[i], 70001, false);
    for (uint32_t i = 0; i < npairs; i++)
        ccq_hmpi_comm_destroy(pc[i].c);
    while (ccq_hmpi_reap(UINT64_MAX) > 0) /* the detached sends */
        ;
}

/* A member that does not submit, on a communicator over member processes. Sequence 41:
 * process 1 submits it, lets its record go, then stops testing: the others' check passes, their
 * MPI_Iallreduce is posted and stays pending (no hang: test returns CCQ_IN_PROGRESS), the
 * detail names the MPI call, the sequence and the processes; they give it up; another
 * communicator keeps working meanwhile; once process 1 goes on (as a late peer would), their
 * abandoned requests complete and are freed. Sequence 42: process 1 never submits it: the
 * others never post anything (no data moves before every member submitted), the detail names
 * process 1, and giving it up leaves nothing behind. */
static void test_missing_member(void **state)
{
    tcomm a, b;
    ccq_be_op op;
    ccq_be_part parts[2];
    float src[2][64], dst[2][64];
    ccq_hmpi_op *h = NULL, *late = NULL;
    ccq_errbuf err = {{0}};
    uint64_t t0;
    (void)state;

    tcomm_make(&a, world_procs, (uint32_t)wsize, 3);
    tcomm_make(&b, world_procs, (uint32_t)wsize, 4);
    memset(&op, 0, sizeof op);
    op.kind = CCQ_KIND_ALL_REDUCE;
    op.dtype = CCQ_FLOAT32;
    op.redop = CCQ_SUM;
    op.count = 64;
    op.comm_size = a.nranks;
    op.nparts = a.nlocal;
    op.parts = parts;
    op.seq = 41;
    for (uint32_t k = 0; k < a.nlocal; k++) {
        for (int e = 0; e < 64; e++)
            src[k][e] = 1.0f;
        parts[k].src = src[k];
        parts[k].dst = dst[k];
        parts[k].rank = a.first + k;
    }
    if (wrank == 1) {
        assert_int_equal(ccq_hmpi_start(a.c, &op, now_ns(), &late, &err), CCQ_OK);
        (void)ccq_hmpi_test(late, &err); /* its record leaves */
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (wrank != 1) {
        assert_int_equal(ccq_hmpi_start(a.c, &op, now_ns(), &h, &err), CCQ_OK);
        t0 = now_ns();
        while (now_ns() - t0 < 100000000u)
            assert_int_equal(ccq_hmpi_test(h, &err), CCQ_IN_PROGRESS);
        ccq_hmpi_describe(h, now_ns(), &err);
        if (wrank == 0) {
            assert_non_null(
                strstr(err.msg, "MPI_Iallreduce (all_reduce, 64 x float32, sequence 41)"));
            assert_non_null(strstr(err.msg, wsize == 2 ? "among processes 0 and 1 (3 ranks"
                                                       : "among processes 0, 1"));
            assert_non_null(strstr(err.msg, "still pending after"));
            assert_null(strstr(err.msg, "not started"));
        }
        ccq_hmpi_abandon(h);
        /* 42: process 1 never submits it */
        op.seq = 42;
        assert_int_equal(ccq_hmpi_start(a.c, &op, now_ns(), &h, &err), CCQ_OK);
        t0 = now_ns();
        while (now_ns() - t0 < 50000000u)
            assert_int_equal(ccq_hmpi_test(h, &err), CCQ_IN_PROGRESS);
        ccq_hmpi_describe(h, now_ns(), &err);
        if (wrank == 0) {
            assert_non_null(strstr(err.msg, "sequence 42"));
            assert_non_null(strstr(err.msg, "not started after"));
            assert_non_null(strstr(err.msg, "ms: process 1 never submitted it"));
        }
        ccq_hmpi_abandon(h);
    }
    /* The other communicator works while `a` has a pending collective. */
    all_kinds(&b, 9, false);
    MPI_Barrier(MPI_COMM_WORLD);
    if (wrank == 1) { /* goes on late: the others' abandoned requests can complete */
        ccq_status st;
        while ((st = ccq_hmpi_test(late, &err)) == CCQ_IN_PROGRESS)
            ;
        assert_int_equal(st, CCQ_OK);
    }
    {
        uint64_t t1 = now_ns();
        while (ccq_hmpi_reap(UINT64_MAX) > 0)
            assert_true(now_ns() - t1 < 20000000000ull);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    ccq_hmpi_comm_destroy(a.c);
    ccq_hmpi_comm_destroy(b.c);
}

/* Mismatches across processes never reach MPI: every member fails the operation with
 * CCQ_ERR_MISMATCH naming the processes, ranks and field, and the next operation runs. On a
 * communicator over member processes (the last process passes another count) and on a pair
 * (a collective's op, a send/recv's count: the receiver fails, its buffer untouched). */
static ccq_status run_status(tcomm *t, ccq_be_op *op, char *detail, size_t len)
{
    ccq_hmpi_op *h = NULL;
    ccq_errbuf err = {{0}};
    ccq_status st = ccq_hmpi_start(t->c, op, now_ns(), &h, &err);
    if (st != CCQ_OK)
        fail_msg("start: %s", err.msg);
    while ((st = ccq_hmpi_test(h, &err)) == CCQ_IN_PROGRESS)
        ;
    snprintf(detail, len, "%s", err.msg);
    return st;
}

static void test_mismatch(void **state)
{
    tcomm t;
    ccq_be_op op;
    ccq_be_part parts[2];
    float src[2][256], dst[2][256];
    char detail[512];
    (void)state;

    tcomm_make(&t, world_procs, (uint32_t)wsize, 5);
    memset(&op, 0, sizeof op);
    op.kind = CCQ_KIND_ALL_REDUCE;
    op.dtype = CCQ_FLOAT32;
    op.redop = CCQ_SUM;
    op.comm_size = t.nranks;
    op.nparts = t.nlocal;
    op.parts = parts;
    for (uint32_t k = 0; k < t.nlocal; k++) {
        for (int e = 0; e < 256; e++)
            src[k][e] = 1.0f, dst[k][e] = -3.0f;
        parts[k].src = src[k];
        parts[k].dst = dst[k];
        parts[k].rank = t.first + k;
    }
    op.count = wrank == wsize - 1 ? 128 : 64;
    op.seq = t.seq++;
    assert_int_equal(run_status(&t, &op, detail, sizeof detail), CCQ_ERR_MISMATCH);
    assert_non_null(strstr(detail, "count: process 0 (rank"));
    assert_non_null(strstr(detail, ") 64, process"));
    assert_non_null(strstr(detail, ") 128"));
    for (uint32_t k = 0; k < t.nlocal; k++)
        assert_true(dst[k][0] == -3.0f && dst[k][255] == -3.0f); /* nothing written */
    op.count = 64;
    op.seq = t.seq++;
    assert_int_equal(run_status(&t, &op, detail, sizeof detail), CCQ_OK);
    for (uint32_t k = 0; k < t.nlocal; k++)
        assert_true(dst[k][0] == (float)t.nranks);
    ccq_hmpi_comm_destroy(t.c);

    /* a pair of processes 0 and 1 */
    if (wrank < 2) {
        tcomm p;
        tpair_make(&p, 0, 1, 6);
        op.comm_size = 2;
        op.nparts = 1;
        parts[0].rank = p.first;
        op.redop = wrank == 0 ? CCQ_MAX : CCQ_SUM;
        op.seq = p.seq++;
        assert_int_equal(run_status(&p, &op, detail, sizeof detail), CCQ_ERR_MISMATCH);
        assert_non_null(strstr(detail, "op: process 0 (rank 0) max, process 1 (rank 1) sum"));
        op.redop = CCQ_SUM;
        op.seq = p.seq++;
        assert_int_equal(run_status(&p, &op, detail, sizeof detail), CCQ_OK);
        assert_true(dst[0][0] == 2.0f);
        /* send/recv counts */
        memset(&op, 0, sizeof op);
        op.dtype = CCQ_FLOAT32;
        op.comm_size = 2;
        op.nparts = 1;
        op.parts = parts;
        op.peer = 1 - p.first;
        op.seq = 0;
        op.kind = wrank == 0 ? CCQ_KIND_SEND : CCQ_KIND_RECV;
        op.count = wrank == 0 ? 200 : 100;
        for (int e = 0; e < 256; e++)
            dst[0][e] = -5.0f;
        parts[0].src = wrank == 0 ? src[0] : NULL;
        parts[0].dst = wrank == 0 ? NULL : dst[0];
        {
            ccq_status st = run_status(&p, &op, detail, sizeof detail);
            if (wrank == 1) {
                assert_int_equal(st, CCQ_ERR_MISMATCH);
                assert_non_null(strstr(detail, "count: process 0 (rank 0) 200, process 1"));
                assert_true(dst[0][0] == -5.0f && dst[0][99] == -5.0f);
            } else {
                assert_int_equal(st, CCQ_OK);
            }
        }
        op.count = 100;
        op.seq = 1;
        assert_int_equal(run_status(&p, &op, detail, sizeof detail), CCQ_OK);
        if (wrank == 1)
            assert_true(dst[0][0] == 1.0f && dst[0][99] == 1.0f);
        ccq_hmpi_comm_destroy(p.c);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

/* Without MPI_THREAD_SERIALIZED the engine refuses, saying why. */
static void test_ready(void **state)
{
    ccq_errbuf err = {{0}};
    (void)state;
    assert_int_equal(ccq_hmpi_ready(&err), CCQ_OK);
}

int main(int argc, char **argv)
{
    int provided = 0, rc;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ready),          cmocka_unit_test(test_world_every_kind),
        cmocka_unit_test(test_subset),         cmocka_unit_test(test_pairs),
        cmocka_unit_test(test_missing_member), cmocka_unit_test(test_mismatch),
    };
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
    MPI_Comm_size(MPI_COMM_WORLD, &wsize);
    if (wsize < 2 || wsize > 16) {
        fprintf(stderr, "run under mpiexec -n 2..16\n");
        MPI_Finalize();
        return 77;
    }
    for (int p = 0; p < wsize; p++)
        world_procs[p] = (uint32_t)p;
    {
        ccq_errbuf err = {{0}};
        ccq_status st;
        if (ccq_hmpi_world_post(-1, &world, &err) != CCQ_OK) {
            fprintf(stderr, "world: %s\n", err.msg);
            return 1;
        }
        while ((st = ccq_hmpi_world_test(world, &err)) == CCQ_IN_PROGRESS)
            ;
        if (st != CCQ_OK) {
            fprintf(stderr, "world: %s\n", err.msg);
            return 1;
        }
    }
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    ccq_hmpi_world_free(world);
    MPI_Finalize();
    return rc;
}
