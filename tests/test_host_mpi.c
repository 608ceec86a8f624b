/* The host backend's MPI engine (backends/host/mpi/engine.c) under mpiexec, without the
 * runtime: a world of P processes, process p holding 1 + p % 2 local ranks (uneven), every
 * kind x dtype x op against tests/ref.h across processes, roots in every process, the
 * in-place forms, a communicator over a subset of the processes, send/recv halves between
 * every pair of processes, and a member that does not arrive (the operation stays pending,
 * other communicators keep working, the abandoned request is freed once it completes).
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
    uint32_t np, procs[16];
    uint32_t nranks, first, nlocal;
} tcomm;

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
    assert_int_equal(ccq_hmpi_comm_create(&d, -1, blob, sizeof blob, &t->c, &err), CCQ_OK);
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
    op.seq = seed;
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
                        r0 += nl_of(t->procs[p]);
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

    /* Every process makes its pairs in the same global order (create_group blocks). */
    for (int p = 0; p < wsize; p++)
        for (int q = p + 1; q < wsize; q++) {
            uint32_t pr[2] = {(uint32_t)p, (uint32_t)q};
            if (p != wrank && q != wrank)
                continue;
            /* A pair communicator: one rank per process. */
            ccq_be_comm_desc d;
            ccq_device_id dev = 0;
            uint32_t v[2] = {(uint32_t)p, 100u + (uint32_t)(p * wsize + q)};
            memset(&pc[npairs], 0, sizeof pc[npairs]);
            pc[npairs].np = 2;
            memcpy(pc[npairs].procs, pr, sizeof pr);
            pc[npairs].nranks = 2;
            pc[npairs].first = p == wrank ? 0 : 1;
            pc[npairs].nlocal = 1;
            d.nranks = 2;
            d.first_rank = pc[npairs].first;
            d.nlocal = 1;
            d.local_devices = &dev;
            d.nprocs = 2;
            d.procs = pc[npairs].procs;
            d.world_rank = (uint32_t)wrank;
            assert_int_equal(ccq_hmpi_comm_create(&d, -1, v, sizeof v, &pc[npairs].c, &err),
                             CCQ_OK);
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
        ccq_hmpi_comm_destroy(pc[i].c);
    }
}

/* Process 1 does not arrive at an all_reduce on a communicator: process 0's stays pending
 * (no hang: test returns CCQ_IN_PROGRESS), the detail names the MPI call, the sequence and
 * the processes; another communicator keeps working meanwhile; once abandoned, the engine
 * frees the request when it completes (process 1 arrives late, as a restarted peer cannot). */
static void test_missing_member(void **state)
{
    tcomm a, b;
    ccq_be_op op;
    ccq_be_part parts[2];
    float src[2][64], dst[2][64];
    ccq_hmpi_op *h = NULL;
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
        }
        ccq_hmpi_abandon(h);
    }
    /* The other communicator works while `a` has a pending collective. */
    all_kinds(&b, 9, false);
    MPI_Barrier(MPI_COMM_WORLD);
    if (wrank == 1) { /* arrives late: the others' abandoned requests can complete */
        run_op(&a, &op);
    } else {
        uint64_t t1 = now_ns();
        while (ccq_hmpi_reap(now_ns(), UINT64_MAX) > 0)
            assert_true(now_ns() - t1 < 20000000000ull);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    ccq_hmpi_comm_destroy(a.c);
    ccq_hmpi_comm_destroy(b.c);
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
        cmocka_unit_test(test_missing_member),
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
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    MPI_Finalize();
    return rc;
}
