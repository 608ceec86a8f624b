/* Worlds of several processes on the file bootstrap (no MPI): processes forked by the test
 * meet in a fresh directory; global device ids, uneven local device counts, communicators of
 * one process while the others run theirs, refusals naming the owning process, a process
 * that never starts, and disagreeing world sizes. A communicator spanning processes on the
 * host backend: refused by its MPI engine without MPI, working on the UCX engine (the
 * host's engines are tested in depth by test_host_world and test_host_ucx, NCCL's by
 * test_nccl_world_fake). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ccq.h"
#include "procs.h"
#include "test_util.h"

/* Child exit codes: which step went wrong (printed by the parent). */
enum { E_CREATE = 10, E_COUNT, E_LOCAL, E_RANK, E_REMOTE, E_COMM, E_DATA, E_FENCE, E_WANT };

typedef struct world_case {
    char dir[64];
    unsigned devices[8];    /* local devices of each process */
    unsigned world_size[8]; /* what each process claims (0: the real size) */
    uint64_t timeout_ms;
    ccq_status want_create; /* what ccq_runtime_create must return */
    const char *want_detail;
    bool span_comm;       /* form a communicator over every device of the world */
    int skip_comm_rank;   /* that process does not call ccq_comm_init (-1: none) */
    ccq_status want_comm; /* what ccq_comm_init of the spanning set must return */
    const char *want_comm_detail;
    const char *host_engine; /* ccq_config.host_engine (NULL: ccq's choice) */
    bool span_data;          /* and an all_reduce on it, checked */
} world_case;

static ccq_status make_world_rt(const world_case *wc, unsigned rank, unsigned nprocs,
                                ccq_runtime **rt)
{
    ccq_config cfg;
    char boot[96];

    ccq_config_init(&cfg);
    cfg.host_devices = wc->devices[rank];
    cfg.timeout_ms = wc->timeout_ms;
    cfg.world_rank = rank;
    cfg.world_size = wc->world_size[rank] ? wc->world_size[rank] : nprocs;
    cfg.host_engine = wc->host_engine;
    snprintf(boot, sizeof boot, "file:%s", wc->dir);
    cfg.bootstrap = boot;
    return ccq_runtime_create(&cfg, rt);
}

/* An all_reduce over this process's own devices, checked. */
static int local_all_reduce(ccq_runtime *rt, ccq_device_id first, uint32_t count)
{
    enum { N = 257 };
    ccq_device_id devs[8] = {0};
    int32_t in[8][N], out[8][N];

    for (uint32_t i = 0; i < count; i++)
        devs[i] = first + i;
    if (ccq_comm_init(rt, devs, count) != CCQ_OK)
        return E_COMM;
    for (uint32_t i = 0; i < count; i++)
        for (int k = 0; k < N; k++)
            in[i][k] = (int32_t)(first + i) * 1000 + k;
    for (uint32_t i = 0; i < count; i++)
        if (ccq_all_reduce(rt, devs[i], 0, in[i], out[i], N, CCQ_INT32, CCQ_SUM, devs, count) !=
            CCQ_OK)
            return E_COMM;
    for (uint32_t i = 0; i < count; i++)
        if (ccq_sync_collective(rt, devs[i], 0) != CCQ_OK)
            return E_FENCE;
    for (uint32_t i = 0; i < count; i++)
        for (int k = 0; k < N; k++) {
            int32_t want = 0;
            for (uint32_t j = 0; j < count; j++)
                want += in[j][k];
            if (out[i][k] != want)
                return E_DATA;
        }
    return 0;
}

static int world_child(unsigned rank, unsigned nprocs, void *arg)
{
    const world_case *wc = arg;
    ccq_runtime *rt = NULL;
    ccq_device_id first = 0;
    uint32_t count = 0, total = 0;
    int rc = 0;

    ccq_status st = make_world_rt(wc, rank, nprocs, &rt);
    if (st != wc->want_create) {
        fprintf(stderr, "rank %u: ccq_runtime_create: %s (%s), want %s\n", rank,
                ccq_status_name(st), ccq_last_error_detail(), ccq_status_name(wc->want_create));
        return E_CREATE;
    }
    if (st != CCQ_OK) {
        if (wc->want_detail && strstr(ccq_last_error_detail(), wc->want_detail) == NULL) {
            fprintf(stderr, "rank %u: detail lacks \"%s\": %s\n", rank, wc->want_detail,
                    ccq_last_error_detail());
            return E_WANT;
        }
        return 0;
    }
    for (unsigned p = 0; p < nprocs; p++)
        total += wc->devices[p];
    if (ccq_device_count(rt) != total || ccq_world_size(rt) != nprocs) {
        rc = E_COUNT;
        goto out;
    }
    if (ccq_world_rank(rt) != rank) {
        rc = E_RANK;
        goto out;
    }
    /* Process p owns the ids after those of lower processes. */
    uint32_t want_first = 0;
    for (unsigned p = 0; p < rank; p++)
        want_first += wc->devices[p];
    if (ccq_local_devices(rt, &first, &count) != CCQ_OK || first != want_first ||
        count != wc->devices[rank]) {
        rc = E_LOCAL;
        goto out;
    }
    /* Another process's device is refused, naming its owner. */
    if (nprocs > 1) {
        unsigned other = (rank + 1) % nprocs;
        ccq_device_id theirs = 0;
        char want[64];
        int32_t buf[4] = {0};
        for (unsigned p = 0; p < other; p++)
            theirs += wc->devices[p];
        snprintf(want, sizeof want, "belongs to process %u", other);
        if (ccq_send(rt, theirs, 0, buf, 4, CCQ_INT32, first) != CCQ_ERR_INVALID_ARGUMENT ||
            strstr(ccq_last_error_detail(), want) == NULL ||
            ccq_sync_collective(rt, theirs, 0) != CCQ_ERR_INVALID_ARGUMENT) {
            fprintf(stderr, "rank %u: submit on device %u: %s\n", rank, theirs,
                    ccq_last_error_detail());
            rc = E_REMOTE;
            goto out;
        }
    }
    /* A communicator of this process's devices works while the others run theirs. */
    rc = local_all_reduce(rt, first, count);
    if (rc != 0)
        goto out;
    if (wc->span_comm && (int)rank != wc->skip_comm_rank) {
        ccq_device_id all[64];
        for (uint32_t d = 0; d < total; d++)
            all[d] = d;
        st = ccq_comm_init(rt, all, total);
        if (st != wc->want_comm || (wc->want_comm_detail && strstr(ccq_last_error_detail(),
                                                                   wc->want_comm_detail) == NULL)) {
            fprintf(stderr, "rank %u: ccq_comm_init of the world: %s: %s (want %s, \"%s\")\n", rank,
                    ccq_status_name(st), ccq_last_error_detail(), ccq_status_name(wc->want_comm),
                    wc->want_comm_detail ? wc->want_comm_detail : "");
            rc = E_WANT;
        }
        if (rc == 0 && st == CCQ_OK && wc->span_data) {
            /* One all_reduce across the processes: every element the sum of every device's. */
            int32_t in[8][100], out[8][100];
            for (uint32_t k = 0; k < count; k++)
                for (int e = 0; e < 100; e++)
                    in[k][e] = (int32_t)(first + k) * 1000 + e;
            for (uint32_t k = 0; k < count && rc == 0; k++)
                if (ccq_all_reduce(rt, first + k, 1, in[k], out[k], 100, CCQ_INT32, CCQ_SUM, all,
                                   total) != CCQ_OK)
                    rc = E_COMM;
            for (uint32_t k = 0; k < count && rc == 0; k++)
                if (ccq_sync_collective(rt, first + k, 1) != CCQ_OK)
                    rc = E_FENCE;
            for (uint32_t k = 0; k < count && rc == 0; k++)
                for (int e = 0; e < 100; e++) {
                    int32_t want = 0;
                    for (uint32_t d = 0; d < total; d++)
                        want += (int32_t)d * 1000 + e;
                    if (out[k][e] != want)
                        rc = E_DATA;
                }
        }
    }
out:
    if (rc != 0)
        fprintf(stderr, "rank %u: failed with code %d (%s)\n", rank, rc, ccq_last_error_detail());
    ccq_runtime_destroy(rt);
    return rc;
}

static void run_case(world_case *wc, unsigned nprocs, unsigned started)
{
    int status[8] = {0}; /* procs_run fills the first `started` */
    procs_tmpdir(wc->dir, sizeof wc->dir);
    int bad = procs_run(started, world_child, wc, 60, status);
    procs_rmdir(wc->dir);
    for (unsigned r = 0; r < started; r++)
        if (status[r] != 0)
            fail_msg("process %u of %u exited with %d", r, nprocs, status[r]);
    assert_int_equal(bad, 0);
}

static world_case base_case(void)
{
    world_case wc;
    memset(&wc, 0, sizeof wc);
    wc.timeout_ms = 20000;
    wc.want_create = CCQ_OK;
    wc.skip_comm_rank = -1;
    return wc;
}

/* Worlds of 1, 2 and 3 processes with uneven device counts. */
static void test_world_layouts(void **state)
{
    (void)state;
    world_case one = base_case();
    one.devices[0] = 3;
    run_case(&one, 1, 1);
    world_case two = base_case();
    two.devices[0] = 2;
    two.devices[1] = 1;
    run_case(&two, 2, 2);
    world_case three = base_case();
    three.devices[0] = 1;
    three.devices[1] = 3;
    three.devices[2] = 2;
    run_case(&three, 3, 3);
}

/* Process 2 of 3 never starts: the others' ccq_runtime_create fails after timeout_ms,
 * naming it. */
static void test_world_process_missing(void **state)
{
    (void)state;
    world_case wc = base_case();
    wc.devices[0] = wc.devices[1] = wc.devices[2] = 1;
    wc.world_size[0] = wc.world_size[1] = 3;
    wc.timeout_ms = 400;
    wc.want_create = CCQ_ERR_TIMEOUT;
    wc.want_detail = "process 2 never arrived";
    run_case(&wc, 3, 2);
}

/* Process 0 says the world has 2 processes, process 1 says 3: process 0 is refused naming
 * the disagreement (process 1 waits for a third that never comes: a timeout). */
static int mismatch_child(unsigned rank, unsigned nprocs, void *arg)
{
    const world_case *wc = arg;
    ccq_runtime *rt = NULL;
    ccq_status st = make_world_rt(wc, rank, nprocs, &rt);
    ccq_runtime_destroy(rt);
    if (rank == 0 &&
        (st != CCQ_ERR_INVALID_ARGUMENT || strstr(ccq_last_error_detail(), "world_size") == NULL)) {
        fprintf(stderr, "rank 0: %s: %s\n", ccq_status_name(st), ccq_last_error_detail());
        return E_WANT;
    }
    if (rank == 0)
        return 0;
    return st == CCQ_ERR_TIMEOUT || st == CCQ_ERR_INVALID_ARGUMENT ? 0 : E_WANT;
}

static void test_world_size_mismatch(void **state)
{
    (void)state;
    world_case wc = base_case();
    int status[2];
    wc.devices[0] = wc.devices[1] = 1;
    wc.world_size[0] = 2;
    wc.world_size[1] = 3;
    wc.timeout_ms = 600;
    procs_tmpdir(wc.dir, sizeof wc.dir);
    int bad = procs_run(2, mismatch_child, &wc, 30, status);
    procs_rmdir(wc.dir);
    if (bad)
        fail_msg("processes exited with %d, %d", status[0], status[1]);
}

/* A communicator over the whole world on the host backend's MPI engine without MPI
 * initialised (plain processes): every process meets the others, then the host backend
 * refuses it, saying what to do. */
static void test_world_comm_span_host(void **state)
{
    (void)state;
    world_case wc = base_case();
    wc.devices[0] = 2;
    wc.devices[1] = 1;
    wc.span_comm = true;
    wc.host_engine = "mpi";
    wc.want_comm = CCQ_ERR_UNSUPPORTED;
    wc.want_comm_detail = "cannot span processes";
    run_case(&wc, 2, 2);
}

/* The same on ccq's default engine: UCX when built with it (plain processes need nothing
 * else), and the data crosses; without UCX it is refused as above. */
static void test_world_comm_span_default(void **state)
{
    (void)state;
    world_case wc = base_case();
    wc.devices[0] = 2;
    wc.devices[1] = 1;
    wc.span_comm = true;
#ifdef CCQ_HAVE_UCX
    wc.want_comm = CCQ_OK;
    wc.span_data = true;
#else
    wc.want_comm = CCQ_ERR_UNSUPPORTED;
    wc.want_comm_detail = "cannot span processes";
#endif
    run_case(&wc, 2, 2);
}

/* Bad worlds are refused before anything starts. */
static void test_world_bad_config(void **state)
{
    ccq_config cfg;
    ccq_runtime *rt = NULL;
    (void)state;
    ccq_config_init(&cfg);
    cfg.world_rank = 2;
    cfg.world_size = 2;
    cfg.bootstrap = "file:/tmp";
    assert_int_equal(ccq_runtime_create(&cfg, &rt), CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(ccq_last_error_detail(), "world_rank"));
    assert_null(rt);
    cfg.world_rank = 0;
    cfg.world_size = 0;
    assert_int_equal(ccq_runtime_create(&cfg, &rt), CCQ_ERR_INVALID_ARGUMENT);
    cfg.world_size = 2;
    /* A directory that cannot be made (a missing one is created): the detail says
     * "bootstrap" once, as the bootstrap wrote it, with the path and the reason. */
    cfg.bootstrap = "file:/dev/null/ccq-no-such-dir";
    assert_int_equal(ccq_runtime_create(&cfg, &rt), CCQ_ERR_INVALID_ARGUMENT);
    assert_null(rt);
    assert_string_equal(ccq_last_error_detail(),
                        "bootstrap file:/dev/null/ccq-no-such-dir: Not a directory (the "
                        "directory must be seen by every process of the world)");
    cfg.bootstrap = NULL;
    assert_int_equal(ccq_runtime_create(&cfg, &rt), CCQ_ERR_INVALID_ARGUMENT);
    assert_null(rt);
    assert_ptr_equal(strstr(ccq_last_error_detail(), "bootstrap: a world of 2 processes needs a "
                                                     "way to meet"),
                     ccq_last_error_detail());
    /* A world of one behaves as before: ids from 0, nothing to meet. */
    ccq_config_init(&cfg);
    cfg.host_devices = 2;
    assert_int_equal(ccq_runtime_create(&cfg, &rt), CCQ_OK);
    ccq_device_id first = 7;
    uint32_t count = 0;
    assert_int_equal(ccq_local_devices(rt, &first, &count), CCQ_OK);
    assert_int_equal(first, 0);
    assert_int_equal(count, 2);
    assert_int_equal(ccq_world_rank(rt), 0);
    assert_int_equal(ccq_world_size(rt), 1);
    assert_int_equal(ccq_device_count(rt), 2);
    ccq_runtime_destroy(rt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_world_bad_config),
        cmocka_unit_test(test_world_layouts),
        cmocka_unit_test(test_world_process_missing),
        cmocka_unit_test(test_world_size_mismatch),
        cmocka_unit_test(test_world_comm_span_host),
        cmocka_unit_test(test_world_comm_span_default),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
