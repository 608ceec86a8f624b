/* The NCCL backend across processes, against the fake CUDA/NCCL whose communicators meet in
 * shared memory (tests/fake/fake_xproc.c): worlds of 2 and 3 processes forked by the test
 * meet through the file bootstrap; the lowest member process's ncclUniqueId reaches the
 * others through it; every process initialises its local ranks with their global ranks; an
 * all_reduce over the world, one over a subset spanning two processes, send/recv between
 * processes and comm_init from one thread per device in each process at once all move real
 * data, checked in every process; a process that never calls ccq_comm_init makes the others'
 * fail after timeout_ms naming it; ccq_nccl_stream_wait in process 1 hands the backend its
 * own device (run it under ASan: the global id read past the backend's tables). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ccq.h"
#include "ccq/ccq_nccl.h"
#include "fake/fake_cuda_nccl.h"
#include "procs.h"
#include "test_util.h"

enum { N = 1031, MAXD = 4 };

typedef struct nw_case {
    char dir[64];
    unsigned devices[4]; /* local devices of each process */
    uint64_t timeout_ms;
    int skip_rank; /* a process that never calls ccq_comm_init of the world (-1: none) */
    uint32_t check_signatures;
    int cc[4];   /* compute capability major of each process's devices (0: 9) */
    int variant; /* for children that run several scenarios */
    int (*child)(unsigned rank, unsigned nprocs, void *arg); /* NULL: nw_child */
} nw_case;

#define FAIL(code, ...)                                                                            \
    do {                                                                                           \
        fprintf(stderr, "rank %u: ", rank);                                                        \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, " (%s)\n", ccq_last_error_detail());                                       \
        rc = (code);                                                                               \
        goto out;                                                                                  \
    } while (0)

/* A child's end: destroy its runtime, then (when it passed) fail with code `bad` if the
 * fake saw a misuse. */
static int child_end(ccq_runtime *rt, unsigned rank, int rc, int bad)
{
    ccq_runtime_destroy(rt);
    if (rc == 0) {
        char msg[256];
        if (fake_errors(msg, sizeof msg) != 0) {
            fprintf(stderr, "rank %u: fake errors: %s\n", rank, msg);
            rc = bad;
        }
    }
    return rc;
}

/* Device d's input: a function of (d, k), so every process computes every expected sum. */
static float input(ccq_device_id d, int k)
{
    return (float)((d + 1) * 100 + k % 17);
}

static ccq_runtime *nw_runtime(const nw_case *nc, unsigned rank, unsigned nprocs);

/* check_signatures: process 1 submits another count for the world's all_reduce #1 (and
 * process 2 another dtype for #2): every part on every process fails at once with
 * CCQ_ERR_MISMATCH naming the processes and the field, long before timeout_ms; the
 * collectives around them run. */
static int sig_child(unsigned rank, unsigned nprocs, void *arg)
{
    const nw_case *nc = arg;
    ccq_runtime *rt = nw_runtime(nc, rank, nprocs);
    ccq_device_id first = 0, all[16];
    uint32_t count = 0, total;
    float in[N], out[N];
    int rc = 0;

    if (rt == NULL)
        return 10;
    ccq_local_devices(rt, &first, &count);
    total = ccq_device_count(rt);
    for (uint32_t d = 0; d < total; d++)
        all[d] = d;
    for (int k = 0; k < N; k++)
        in[k] = input(first, k);
    if (ccq_comm_init(rt, all, total) != CCQ_OK)
        FAIL(11, "comm_init");
    uint64_t t0 = now_ns();
    for (int op = 0; op < 4; op++) {
        /* Without the check the mismatched ones are not submitted (they would hang NCCL). */
        bool odd = op == 1 || op == 2;
        if (odd && !nc->check_signatures)
            continue;
        size_t n = op == 1 && rank == 1 ? N - 1 : N;
        ccq_dtype dt = op == 2 && rank == 2 ? CCQ_INT32 : CCQ_FLOAT32;
        if (ccq_all_reduce(rt, first, 0, in, out, n, dt, CCQ_SUM, all, total) != CCQ_OK)
            FAIL(12, "all_reduce %d", op);
        ccq_status st = ccq_sync_collective(rt, first, 0);
        ccq_status want = nc->check_signatures && (op == 1 || op == 2) ? CCQ_ERR_MISMATCH : CCQ_OK;
        const char *field = op == 1 ? "count:" : op == 2 ? "dtype:" : NULL;
        if (st != want || (field && (strstr(ccq_last_error_detail(), field) == NULL ||
                                     strstr(ccq_last_error_detail(), "across processes") == NULL)))
            FAIL(13, "all_reduce %d: %s, want %s", op, ccq_status_name(st), ccq_status_name(want));
        if (getenv("CCQ_TEST_VERBOSE") && field && rank == 0)
            fprintf(stderr, "rank 0, all_reduce %d: %s\n", op, ccq_last_error_detail());
        if (st == CCQ_OK)
            for (int k = 0; k < N; k++) {
                float want_v = 0;
                for (uint32_t j = 0; j < total; j++)
                    want_v += input(j, k);
                if (out[k] != want_v)
                    FAIL(14, "all_reduce %d [%d]", op, k);
            }
    }
    if (now_ns() - t0 > nc->timeout_ms * 1000000ull / 2)
        FAIL(15, "the mismatches took %llu ms (want far below timeout_ms)",
             (unsigned long long)((now_ns() - t0) / 1000000u));
    /* The check's cost, shown with CCQ_TEST_VERBOSE (docs/tracing.md quotes it): fenced
     * all_reduces one after another, with the check and (a second runtime) without. */
    if (getenv("CCQ_TEST_VERBOSE")) {
        enum { M = 50 };
        uint64_t t1 = now_ns();
        for (int op = 0; op < M; op++)
            if (ccq_all_reduce(rt, first, 0, in, out, 8, CCQ_FLOAT32, CCQ_SUM, all, total) !=
                    CCQ_OK ||
                ccq_sync_collective(rt, first, 0) != CCQ_OK)
                FAIL(16, "timed all_reduce %d", op);
        if (rank == 0)
            fprintf(stderr, "rank 0: fenced 8-element all_reduce over 3 processes, %s: %.1f us\n",
                    nc->check_signatures ? "signature check on" : "signature check off",
                    (double)(now_ns() - t1) / M / 1e3);
    }
out:
    ccq_runtime_destroy(rt);
    return rc;
}

/* A user "kernel" for the fake's stream queues: copies what it reads when it runs. */
typedef struct nw_kernel {
    int runs;
    const float *src;
    float seen[N];
} nw_kernel;

static void nw_kernel_fn(void *arg)
{
    nw_kernel *k = arg;
    k->runs++;
    if (k->src != NULL)
        memcpy(k->seen, k->src, sizeof k->seen);
}

/*
 * ccq_nccl_stream_wait in a process that is not the first of its world: the backend is
 * given its own device (the global id minus the process's first), as every other hook is.
 * Process 1 owns global devices 1 and 2 (its CUDA devices 0 and 1): a wait on global
 * device 2 read past the backend's per-device table (ASan), and the no-context fallback on
 * global device 1 made CUDA device 1 current instead of 0. The wait then orders a kernel
 * after an all_reduce over both processes.
 */
static int wait_child(unsigned rank, unsigned nprocs, void *arg)
{
    const nw_case *nc = arg;
    ccq_runtime *rt = nw_runtime(nc, rank, nprocs);
    ccq_device_id first = 0, all[3] = {0, 1, 2};
    uint32_t count = 0;
    static float in[MAXD][N], out[MAXD][N];
    nw_kernel k = {0};
    int rc = 0;

    if (rt == NULL)
        return 10;
    ccq_local_devices(rt, &first, &count);
    if (ccq_comm_init(rt, all, 3) != CCQ_OK)
        FAIL(11, "comm_init");
    if (rank == 1) {
        cudaStream_t us0 = fake_user_stream(0), us1 = fake_user_stream(1);
        ccq_device_id pair[2] = {1, 2};
        static float pin[2][N], pout[2][N];
        if (ccq_comm_init(rt, pair, 2) != CCQ_OK)
            FAIL(22, "comm_init of {1,2}");
        if (ccq_nccl_stream_wait(rt, 2, 0, us1) != CCQ_OK)
            FAIL(12, "wait on global device 2 (CUDA device 1)");
        /* A command not launched yet (device 2's part comes later): a counter wait. */
        if (ccq_all_reduce(rt, 1, 0, pin[0], pout[0], N, CCQ_FLOAT32, CCQ_SUM, pair, 2) != CCQ_OK)
            FAIL(23, "all_reduce on {1,2} from device 1");
        size_t mark = fake_log_size();
        fake_script("cuStreamWaitValue64", CUDA_ERROR_INVALID_CONTEXT);
        if (ccq_nccl_stream_wait(rt, 1, 0, us0) != CCQ_OK)
            FAIL(13, "wait on global device 1 without a current context");
        if (ccq_all_reduce(rt, 2, 0, pin[1], pout[1], N, CCQ_FLOAT32, CCQ_SUM, pair, 2) != CCQ_OK ||
            ccq_sync_collective(rt, 1, 0) != CCQ_OK || ccq_sync_collective(rt, 2, 0) != CCQ_OK)
            FAIL(24, "all_reduce on {1,2}");
        long a = fake_log_find("cuStreamWaitValue64", mark);
        long b = a >= 0 ? fake_log_find("cuStreamWaitValue64", (size_t)a + 1) : -1;
        fake_call retry;
        if (b < 0 || !fake_log_get((size_t)b, &retry) || retry.result != CUDA_SUCCESS)
            FAIL(14, "the wait was not queued again with the device current");
        if (retry.device != 0)
            FAIL(15, "the retried wait ran with CUDA device %d current, want 0 (global 1)",
                 retry.device);
        /* Then a real wait: a kernel on the stream reads the all_reduce's result. */
        for (uint32_t i = 0; i < count; i++) {
            for (int j = 0; j < N; j++)
                in[i][j] = input(first + i, j);
            if (ccq_all_reduce(rt, first + i, 1, in[i], out[i], N, CCQ_FLOAT32, CCQ_SUM, all, 3) !=
                CCQ_OK)
                FAIL(16, "all_reduce on device %u", first + i);
        }
        if (ccq_nccl_stream_wait(rt, 2, 1, us1) != CCQ_OK)
            FAIL(17, "wait on global device 2 for the all_reduce");
        k.src = out[1];
        fake_user_launch(us1, nw_kernel_fn, &k);
        for (int t = 0; t < 5000 && fake_stream_pending(us1) > 0; t++)
            sleep_ms(1);
        if (k.runs != 1)
            FAIL(18, "the kernel after the wait never ran");
        for (int j = 0; j < N; j++)
            if (k.seen[j] != input(0, j) + input(1, j) + input(2, j))
                FAIL(19, "the kernel after the wait read [%d] = %g", j, (double)k.seen[j]);
    } else {
        for (int j = 0; j < N; j++)
            in[0][j] = input(0, j);
        if (ccq_all_reduce(rt, 0, 1, in[0], out[0], N, CCQ_FLOAT32, CCQ_SUM, all, 3) != CCQ_OK)
            FAIL(16, "all_reduce on device 0");
    }
    for (uint32_t i = 0; i < count; i++)
        if (ccq_sync_collective(rt, first + i, 1) != CCQ_OK)
            FAIL(20, "fence on device %u", first + i);
out:
    return child_end(rt, rank, rc, 21);
}

static ccq_runtime *nw_runtime(const nw_case *nc, unsigned rank, unsigned nprocs)
{
    ccq_config cfg;
    ccq_runtime *rt = NULL;
    char boot[96];

    fake_reset();
    fake_set_devices((int)nc->devices[rank], nc->cc[rank] ? nc->cc[rank] : 9);
    /* ccq's own deadline must speak first: the fake's wait for a peer is longer. */
    fake_set_xproc_timeout_ms((long)nc->timeout_ms * 4 + 5000);
    ccq_config_init(&cfg);
    cfg.backend = "nccl";
    cfg.timeout_ms = nc->timeout_ms;
    cfg.world_rank = rank;
    cfg.world_size = nprocs;
    cfg.check_signatures = nc->check_signatures;
    snprintf(boot, sizeof boot, "file:%s", nc->dir);
    cfg.bootstrap = boot;
    if (ccq_runtime_create(&cfg, &rt) != CCQ_OK)
        fprintf(stderr, "rank %u: ccq_runtime_create: %s\n", rank, ccq_last_error_detail());
    return rt;
}

/* An all_reduce over `set` (global ids) from this process's devices in it, checked. */
static int world_all_reduce(ccq_runtime *rt, const ccq_device_id *set, uint32_t n,
                            ccq_stream_id stream)
{
    ccq_device_id first;
    uint32_t count;
    float *in[MAXD] = {NULL}, *out[MAXD] = {NULL};
    ccq_device_id mine[MAXD];
    uint32_t nmine = 0;
    int bad = 0;

    ccq_local_devices(rt, &first, &count);
    for (uint32_t i = 0; i < n; i++)
        if (set[i] >= first && set[i] < first + count)
            mine[nmine++] = set[i];
    for (uint32_t i = 0; i < nmine; i++) {
        in[i] = xmalloc(N * sizeof(float));
        out[i] = xmalloc(N * sizeof(float));
        for (int k = 0; k < N; k++)
            in[i][k] = input(mine[i], k);
        if (ccq_all_reduce(rt, mine[i], stream, in[i], out[i], N, CCQ_FLOAT32, CCQ_SUM, set, n) !=
            CCQ_OK)
            bad = 1;
    }
    for (uint32_t i = 0; i < nmine && !bad; i++)
        if (ccq_sync_collective(rt, mine[i], stream) != CCQ_OK)
            bad = 2;
    for (uint32_t i = 0; i < nmine && !bad; i++)
        for (int k = 0; k < N; k++) {
            float want = 0;
            for (uint32_t j = 0; j < n; j++)
                want += input(set[j], k);
            if (out[i][k] != want) {
                fprintf(stderr, "device %u [%d]: %g, want %g\n", mine[i], k, (double)out[i][k],
                        (double)want);
                bad = 3;
                break;
            }
        }
    for (uint32_t i = 0; i < nmine; i++) {
        free(in[i]);
        free(out[i]);
    }
    return bad;
}

typedef struct init_job {
    ccq_runtime *rt;
    const ccq_device_id *set;
    uint32_t n;
    ccq_status st;
} init_job;

static void *init_thread(void *arg)
{
    init_job *j = arg;
    j->st = ccq_comm_init(j->rt, j->set, j->n);
    return NULL;
}

static int nw_child(unsigned rank, unsigned nprocs, void *arg)
{
    const nw_case *nc = arg;
    ccq_runtime *rt = nw_runtime(nc, rank, nprocs);
    ccq_device_id first = 0, all[16];
    uint32_t count = 0, total;
    int rc = 0;

    if (rt == NULL)
        return 10;
    ccq_local_devices(rt, &first, &count);
    total = ccq_device_count(rt);
    for (uint32_t d = 0; d < total; d++)
        all[d] = d;

    if (nc->skip_rank >= 0) {
        /* Everyone but skip_rank forms the world's communicator; they time out naming it. */
        if ((int)rank == nc->skip_rank) {
            sleep_ms((unsigned)(nc->timeout_ms * 2));
            goto out;
        }
        char want[64];
        snprintf(want, sizeof want, "process %d never joined", nc->skip_rank);
        ccq_status st = ccq_comm_init(rt, all, total);
        if (st != CCQ_ERR_TIMEOUT || strstr(ccq_last_error_detail(), want) == NULL)
            FAIL(11, "comm_init without process %d: %s", nc->skip_rank, ccq_status_name(st));
        goto out;
    }

    /* comm_init of the world from one thread per local device, in every process at once. */
    pthread_t th[MAXD];
    init_job jobs[MAXD];
    for (uint32_t i = 0; i < count; i++) {
        jobs[i] = (init_job){rt, all, total, CCQ_OK};
        pthread_create(&th[i], NULL, init_thread, &jobs[i]);
    }
    for (uint32_t i = 0; i < count; i++) {
        pthread_join(th[i], NULL);
        if (jobs[i].st != CCQ_OK)
            FAIL(12, "comm_init of the world from thread %u: %s", i, ccq_status_name(jobs[i].st));
    }
    if (getenv("CCQ_TEST_VERBOSE"))
        fprintf(stderr, "rank %u: world communicator ready\n", rank);
    if (world_all_reduce(rt, all, total, 0) != 0)
        FAIL(13, "all_reduce over the world");
    /* Twice more on another stream: sequence numbers keep every process in step. */
    if (world_all_reduce(rt, all, total, 1) != 0 || world_all_reduce(rt, all, total, 1) != 0)
        FAIL(14, "repeated all_reduce over the world");

    if (getenv("CCQ_TEST_VERBOSE"))
        fprintf(stderr, "rank %u: world all_reduces done\n", rank);
    /* A subset spanning processes 0 and 1: their last and first devices. Processes not in
     * it do not call ccq_comm_init. */
    ccq_device_id sub[2] = {nc->devices[0] - 1, nc->devices[0]};
    if (rank <= 1) {
        if (ccq_comm_init(rt, sub, 2) != CCQ_OK)
            FAIL(15, "comm_init of {%u,%u}", sub[0], sub[1]);
        if (world_all_reduce(rt, sub, 2, 2) != 0)
            FAIL(16, "all_reduce over {%u,%u}", sub[0], sub[1]);
    }

    if (getenv("CCQ_TEST_VERBOSE"))
        fprintf(stderr, "rank %u: subset done\n", rank);
    /* send/recv between processes: device `first` of each process sends to the first
     * device of the next process (a ring over processes), with global ids. */
    {
        unsigned next = (rank + 1) % nprocs, prev = (rank + nprocs - 1) % nprocs;
        ccq_device_id to = 0, from = 0;
        for (unsigned p = 0; p < next; p++)
            to += nc->devices[p];
        for (unsigned p = 0; p < prev; p++)
            from += nc->devices[p];
        float *sbuf = xmalloc(N * sizeof(float)), *rbuf = xmalloc(N * sizeof(float));
        for (int k = 0; k < N; k++) {
            sbuf[k] = input(first, k) * 2;
            rbuf[k] = -1;
        }
        if (ccq_send(rt, first, 3, sbuf, N, CCQ_FLOAT32, to) != CCQ_OK ||
            ccq_recv(rt, first, 4, rbuf, N, CCQ_FLOAT32, from) != CCQ_OK ||
            ccq_sync_collective(rt, first, 3) != CCQ_OK ||
            ccq_sync_collective(rt, first, 4) != CCQ_OK) {
            free(sbuf);
            free(rbuf);
            FAIL(17, "send to device %u / recv from device %u", to, from);
        }
        for (int k = 0; k < N; k++)
            if (rbuf[k] != input(from, k) * 2) {
                double got = rbuf[k];
                if (getenv("CCQ_TEST_VERBOSE"))
                    fake_log_dump();
                free(sbuf);
                free(rbuf);
                FAIL(18, "recv from device %u: [%d] = %g", from, k, got);
            }
        free(sbuf);
        free(rbuf);
    }
    /* A last collective before leaving: a process must not exit while a peer still reads
     * what it sent (as with NCCL, whose send may complete before the peer has the data). */
    if (world_all_reduce(rt, all, total, 5) != 0)
        FAIL(20, "the closing all_reduce over the world");
out:
    return child_end(rt, rank, rc, 19);
}

static void run(nw_case *nc, unsigned nprocs)
{
    int status[4];
    char env[96];
    fake_xproc_cleanup(); /* segments a crashed earlier run may have left */
    procs_tmpdir(nc->dir, sizeof nc->dir);
    /* Each forked process must not see another test's bootstrap records. */
    snprintf(env, sizeof env, "%s", nc->dir + 5);
    setenv("CCQ_JOB_ID", env, 1);
    int bad = procs_run(nprocs, nc->child ? nc->child : nw_child, nc, 90, status);
    procs_rmdir(nc->dir);
    fake_xproc_cleanup();
    for (unsigned r = 0; r < nprocs; r++)
        if (status[r] != 0)
            fail_msg("process %u of %u exited with %d", r, nprocs, status[r]);
    assert_int_equal(bad, 0);
}

static void test_two_processes(void **state)
{
    (void)state;
    nw_case nc = {.devices = {2, 1}, .timeout_ms = 20000, .skip_rank = -1};
    run(&nc, 2);
}

static void test_three_processes_uneven(void **state)
{
    (void)state;
    nw_case nc = {.devices = {1, 3, 2}, .timeout_ms = 20000, .skip_rank = -1};
    run(&nc, 3);
}

static void test_member_never_joins(void **state)
{
    (void)state;
    nw_case nc = {.devices = {1, 1, 1}, .timeout_ms = 500, .skip_rank = 2};
    run(&nc, 3);
}

static void test_signature_check(void **state)
{
    (void)state;
    nw_case nc = {.devices = {1, 1, 1},
                  .timeout_ms = 20000,
                  .skip_rank = -1,
                  .check_signatures = 1,
                  .child = sig_child};
    run(&nc, 3);
}

/* The same job without the check (its cost, next to test_signature_check's). */
static void test_signature_check_off(void **state)
{
    (void)state;
    nw_case nc = {.devices = {1, 1, 1}, .timeout_ms = 20000, .skip_rank = -1, .child = sig_child};
    run(&nc, 3);
}

/*
 * NCCL refuses an fp8 reduction by the lowest compute capability of every rank, in every
 * process. Process 0 has devices 0 and 1 (9.x), process 1 device 2 (8.x). On A = {0,2} both
 * processes refuse an fp8 all_reduce at submission (process 0 knows from the communicator's
 * meeting), the communicator stays usable, and fp8 data still moves (all_gather). On
 * B = {1,2}, process 0 submits an fp8 all_reduce while B still forms (process 1 joins late):
 * its own devices pass, and the backend refuses the operation before the group once B
 * formed, instead of NCCL failing it and aborting B.
 */
static int fp8_child(unsigned rank, unsigned nprocs, void *arg)
{
    const nw_case *nc = arg;
    ccq_runtime *rt = nw_runtime(nc, rank, nprocs);
    ccq_device_id a[2] = {0, 2}, b[2] = {1, 2};
    ccq_device_id mine = rank == 0 ? 0 : 2; /* this process's device in A */
    uint8_t in8[N], out8[2 * N];
    float in[N], out[N];
    int rc = 0;

    if (rt == NULL)
        return 10;
    if (ccq_comm_init(rt, a, 2) != CCQ_OK)
        FAIL(11, "comm_init");
    ccq_status st = ccq_all_reduce(rt, mine, 0, in8, in8, N, CCQ_FLOAT8E4M3, CCQ_SUM, a, 2);
    if (st != CCQ_ERR_UNSUPPORTED || strstr(ccq_last_error_detail(), "9.0") == NULL)
        FAIL(12, "fp8 all_reduce with an sm80 rank in process 1: %s, want CCQ_ERR_UNSUPPORTED",
             ccq_status_name(st));
    if (rank == 0 && strstr(ccq_last_error_detail(), "another member process") == NULL)
        FAIL(13, "the refusal does not say the old GPU is another process's");
    for (int k = 0; k < N; k++) {
        in[k] = input(mine, k);
        in8[k] = (uint8_t)(rank * 16 + k % 7);
    }
    if (ccq_all_gather(rt, mine, 0, in8, out8, N, CCQ_FLOAT8E5M2, a, 2) != CCQ_OK ||
        ccq_all_reduce(rt, mine, 0, in, out, N, CCQ_FLOAT32, CCQ_SUM, a, 2) != CCQ_OK)
        FAIL(14, "submit after the refusal");
    if (ccq_sync_collective(rt, mine, 0) != CCQ_OK)
        FAIL(15, "the communicator after the refusal");
    for (int k = 0; k < N; k++)
        if (out[k] != input(0, k) + input(2, k) || out8[k] != (uint8_t)(k % 7) ||
            out8[N + k] != (uint8_t)(16 + k % 7))
            FAIL(16, "data after the refusal [%d]", k);

    /* B, submitted to while it forms. */
    ccq_device_id bdev = rank == 0 ? 1 : 2;
    if (rank == 0) {
        init_job *job = xmalloc(sizeof *job);
        pthread_t th;
        *job = (init_job){rt, b, 2, CCQ_OK};
        pthread_create(&th, NULL, init_thread, job);
        /* Its registry entry exists once ccq_comm_init started; process 1 is not there. */
        do
            st = ccq_all_reduce(rt, 1, 0, in8, in8, N, CCQ_FLOAT8E4M3, CCQ_SUM, b, 2);
        while (st == CCQ_ERR_NOT_INITIALIZED);
        pthread_join(th, NULL);
        ccq_status init_st = job->st;
        free(job);
        if (st != CCQ_OK || init_st != CCQ_OK)
            FAIL(17, "fp8 all_reduce on B while it forms: %s (init %s)", ccq_status_name(st),
                 ccq_status_name(init_st));
        st = ccq_sync_collective(rt, 1, 0);
        if (st != CCQ_ERR_UNSUPPORTED || strstr(ccq_last_error_detail(), "9.0") == NULL)
            FAIL(18, "fp8 all_reduce submitted while B formed: %s, want CCQ_ERR_UNSUPPORTED",
                 ccq_status_name(st));
    } else {
        sleep_ms(300);
        if (ccq_comm_init(rt, b, 2) != CCQ_OK)
            FAIL(19, "comm_init of B");
    }
    for (int k = 0; k < N; k++)
        in[k] = input(bdev, k);
    if (ccq_all_reduce(rt, bdev, 0, in, out, N, CCQ_FLOAT32, CCQ_SUM, b, 2) != CCQ_OK ||
        ccq_sync_collective(rt, bdev, 0) != CCQ_OK)
        FAIL(20, "B after the refusal");
    for (int k = 0; k < N; k++)
        if (out[k] != input(1, k) + input(2, k))
            FAIL(22, "data on B [%d]", k);
out:
    return child_end(rt, rank, rc, 21);
}

/* The NCCL groups (ncclGroupEnd) this process logged: for each that holds an ncclAllReduce,
 * how many it holds of a communicator of `nranks` ranks, into counts[]. */
static size_t groups_of(int nranks, int *counts, size_t max)
{
    size_t n = 0;
    int cur = 0;
    bool any = false;
    fake_call c;
    for (size_t i = 0; fake_log_get(i, &c); i++) {
        if (strcmp(c.fn, "ncclAllReduce") == 0) {
            cur += c.nranks == nranks;
            any = true;
        }
        if (strcmp(c.fn, "ncclGroupEnd") == 0) {
            if (any && n < max)
                counts[n++] = cur;
            cur = 0;
            any = false;
        }
    }
    return n;
}

/*
 * Grouping across processes. Process A (devices 0, 1) submits c1 and c2 on the world's
 * communicator {0,1,2} and c3 on its own {0,1} before its scheduler wakes (held inside the
 * creation of a third communicator); process B (device 2) submits c2 only after c1 ended.
 * A's scheduler alone would put c1 and c2 in one NCCL group while B runs them in two: NCCL
 * plans a group per communicator, so the fake fails that with ncclInternalError. A runs
 * them in two groups (one spanning operation per group), and c3, whose communicator spans
 * no process, shares c1's group.
 */
static int group_child(unsigned rank, unsigned nprocs, void *arg)
{
    const nw_case *nc = arg;
    ccq_runtime *rt = nw_runtime(nc, rank, nprocs);
    ccq_device_id all[3] = {0, 1, 2}, local[2] = {0, 1}, zero = 0;
    static float in[3][2][N], out[3][2][N];
    ccq_device_id first = 0;
    uint32_t count = 0;
    int rc = 0;

    if (rt == NULL)
        return 10;
    ccq_local_devices(rt, &first, &count);
    if (ccq_comm_init(rt, all, 3) != CCQ_OK || (rank == 0 && ccq_comm_init(rt, local, 2) != CCQ_OK))
        FAIL(11, "comm_init");
    for (int j = 0; j < 3; j++)
        for (uint32_t i = 0; i < count; i++)
            for (int k = 0; k < N; k++)
                in[j][i][k] = input(first + i, k) + (float)(j * 1000);
    if (rank == 0) {
        init_job job = {rt, &zero, 1, CCQ_OK};
        pthread_t th;
        fake_hold_init(true);
        pthread_create(&th, NULL, init_thread, &job);
        while (fake_inits_blocked() == 0)
            sleep_ms(1);
        /* The scheduler is held: c1, c2 (world) and c3 (this process's pair) all wait. */
        for (uint32_t i = 0; i < count; i++)
            if (ccq_all_reduce(rt, i, 0, in[0][i], out[0][i], N, CCQ_FLOAT32, CCQ_SUM, all, 3) !=
                    CCQ_OK ||
                ccq_all_reduce(rt, i, 1, in[1][i], out[1][i], N, CCQ_FLOAT32, CCQ_SUM, all, 3) !=
                    CCQ_OK ||
                ccq_all_reduce(rt, i, 2, in[2][i], out[2][i], N, CCQ_FLOAT32, CCQ_SUM, local, 2) !=
                    CCQ_OK)
                FAIL(12, "submit c1, c2, c3 on device %u", i);
        fake_hold_init(false);
        pthread_join(th, NULL);
        if (job.st != CCQ_OK)
            FAIL(13, "comm_init of {0}");
    } else {
        if (ccq_all_reduce(rt, 2, 0, in[0][0], out[0][0], N, CCQ_FLOAT32, CCQ_SUM, all, 3) !=
                CCQ_OK ||
            ccq_sync_collective(rt, 2, 0) != CCQ_OK)
            FAIL(14, "c1 (%s)", ccq_last_error_detail());
        if (ccq_all_reduce(rt, 2, 1, in[1][0], out[1][0], N, CCQ_FLOAT32, CCQ_SUM, all, 3) !=
            CCQ_OK)
            FAIL(15, "submit c2");
    }
    for (uint32_t i = 0; i < count; i++)
        for (ccq_stream_id s = 0; s < (rank == 0 ? 3u : 2u); s++)
            if (ccq_sync_collective(rt, first + i, s) != CCQ_OK)
                FAIL(16, "fence of device %u stream %u", first + i, s);
    for (int j = 0; j < (rank == 0 ? 3 : 2); j++)
        for (uint32_t i = 0; i < count; i++)
            for (int k = 0; k < N; k++) {
                float want = j < 2 ? input(0, k) + input(1, k) + input(2, k) + (float)(3 * j * 1000)
                                   : input(0, k) + input(1, k) + 4000.0f;
                if (out[j][i][k] != want)
                    FAIL(17, "c%d on device %u [%d] = %g, want %g", j + 1, first + i, k,
                         (double)out[j][i][k], (double)want);
            }
    if (rank == 0) {
        /* Two groups with the world's all_reduces (its 2 local parts each); c3's 2 parts
         * in the first. */
        int world[8], pair[8];
        size_t ng = groups_of(3, world, 8);
        size_t np = groups_of(2, pair, 8);
        if (ng != 2 || world[0] != 2 || world[1] != 2 || np != 2 || pair[0] != 2 || pair[1] != 0)
            FAIL(18,
                 "A's groups: %zu with world parts %d, %d and pair parts %d, %d; want 2 groups, "
                 "2 + 2 world parts, c3's 2 parts in the first",
                 ng, world[0], ng > 1 ? world[1] : -1, pair[0], np > 1 ? pair[1] : -1);
    }
out:
    return child_end(rt, rank, rc, 21);
}

/* Wait (bounded) until this process logged more than `n` calls of fn. */
static bool logged_more(const char *fn, size_t n)
{
    for (int i = 0; i < 10000; i++) {
        if (fake_log_count(fn) > n)
            return true;
        sleep_ms(1);
    }
    return false;
}

/*
 * Launches are serialized per GPU, and the first launch of a communicator spanning
 * processes connects to its peers (NCCL_RUNTIME_CONNECT: it stays ncclInProgress until every
 * member process launched its own; the fake models that). Process A (devices 0, 1, 2) and B
 * (device 3) use C1 = {0,3} and C2 = {0,1,3}, which share device 0 in A and 3 in B.
 * variant 0: both use C1 then C2: A's C2 waits for C1's launch, which ends once B launched
 * C1; everything completes. variant 1, opposite orders (A: C1 then C2, B: C2 then C1): each
 * process's second launch waits for its first, which waits for the other process's second,
 * until the watchdog ends it. Either way the scheduler never waits for a launch: an
 * all_reduce on A's device 2 alone completes at once meanwhile (before, issue slept until
 * the earlier launch finished, up to timeout_ms).
 */
static int order_child(unsigned rank, unsigned nprocs, void *arg)
{
    const nw_case *nc = arg;
    ccq_runtime *rt = nw_runtime(nc, rank, nprocs);
    ccq_device_id c1[2] = {0, 3}, c2[3] = {0, 1, 3}, l[1] = {2};
    static float in[3][N], out[3][N], in2[N], out2[N];
    bool opposite = nc->variant == 1;
    int rc = 0;

    if (rt == NULL)
        return 10;
    if (ccq_comm_init(rt, c1, 2) != CCQ_OK || ccq_comm_init(rt, c2, 3) != CCQ_OK ||
        (rank == 0 && ccq_comm_init(rt, l, 1) != CCQ_OK))
        FAIL(11, "comm_init");
    for (int k = 0; k < N; k++) {
        in[0][k] = (float)k;
        in[1][k] = (float)(2 * k);
        in[2][k] = (float)(3 * k);
        in2[k] = (float)(5 * k);
    }
    ccq_device_id d0 = rank == 0 ? 0 : 3;
    bool c2_first = rank == 1 && opposite;
    for (int step = 0; step < 2; step++) {
        size_t groups = fake_log_count("ncclGroupEnd");
        bool use_c2 = (step == 0) == c2_first;
        if (use_c2) {
            if (ccq_all_reduce(rt, d0, 1, in[1], out[1], N, CCQ_FLOAT32, CCQ_SUM, c2, 3) !=
                    CCQ_OK ||
                (rank == 0 &&
                 ccq_all_reduce(rt, 1, 1, in2, out2, N, CCQ_FLOAT32, CCQ_SUM, c2, 3) != CCQ_OK))
                FAIL(12, "submit on C2");
        } else if (ccq_all_reduce(rt, d0, 0, in[0], out[0], N, CCQ_FLOAT32, CCQ_SUM, c1, 2) !=
                   CCQ_OK) {
            FAIL(13, "submit on C1");
        }
        /* The first is launched (a group) before the second is submitted; the second waits. */
        if (step == 0 && !logged_more("ncclGroupEnd", groups))
            FAIL(14, "the first launch never came");
    }
    if (rank == 0) {
        sleep_ms(50); /* the second batch is issued and waits for the first launch */
        uint64_t t0 = now_ns();
        if (ccq_all_reduce(rt, 2, 2, in[2], out[2], N, CCQ_FLOAT32, CCQ_SUM, l, 1) != CCQ_OK ||
            ccq_sync_collective(rt, 2, 2) != CCQ_OK)
            FAIL(15, "the all_reduce on device 2 alone");
        uint64_t ms = (now_ns() - t0) / 1000000u;
        if (ms > nc->timeout_ms / 3)
            FAIL(16,
                 "an all_reduce on device 2 alone took %llu ms while launches on device 0 "
                 "waited (the scheduler was blocked)",
                 (unsigned long long)ms);
        for (int k = 0; k < N; k++)
            if (out[2][k] != in[2][k])
                FAIL(17, "device 2 [%d]", k);
    }
    ccq_status s0 = ccq_sync_collective(rt, d0, 0), s1 = ccq_sync_collective(rt, d0, 1);
    if (rank == 0 && ccq_sync_collective(rt, 1, 1) != s1)
        FAIL(18, "C2's two parts in process 0 ended differently");
    if (!opposite) {
        if (s0 != CCQ_OK || s1 != CCQ_OK)
            FAIL(19, "same order: C1 %s, C2 %s", ccq_status_name(s0), ccq_status_name(s1));
        for (int k = 0; k < N; k++)
            if (out[0][k] != 2 * in[0][k] || out[1][k] != 2 * in[1][k] + in2[k])
                FAIL(20, "same order: data [%d]", k);
    } else if (getenv("CCQ_TEST_VERBOSE")) {
        fprintf(stderr, "rank %u, opposite orders: C1 %s, C2 %s\n", rank, ccq_status_name(s0),
                ccq_status_name(s1));
    }
out:
    return child_end(rt, rank, rc, 21);
}

static void test_launch_order_across_processes(void **state)
{
    (void)state;
    nw_case nc = {.devices = {3, 1}, .timeout_ms = 3000, .skip_rank = -1, .child = order_child};
    run(&nc, 2);
    nc.variant = 1;
    run(&nc, 2);
}

static void test_grouping_across_processes(void **state)
{
    (void)state;
    nw_case nc = {.devices = {2, 1}, .timeout_ms = 20000, .skip_rank = -1, .child = group_child};
    run(&nc, 2);
}

static void test_fp8_capability_across_processes(void **state)
{
    (void)state;
    nw_case nc = {
        .devices = {2, 1}, .cc = {9, 8}, .timeout_ms = 20000, .skip_rank = -1, .child = fp8_child};
    run(&nc, 2);
}

static void test_stream_wait_in_process_one(void **state)
{
    (void)state;
    nw_case nc = {.devices = {1, 2}, .timeout_ms = 20000, .skip_rank = -1, .child = wait_child};
    run(&nc, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_signature_check),
        cmocka_unit_test(test_signature_check_off),
        cmocka_unit_test(test_two_processes),
        cmocka_unit_test(test_three_processes_uneven),
        cmocka_unit_test(test_member_never_joins),
        cmocka_unit_test(test_stream_wait_in_process_one),
        cmocka_unit_test(test_fp8_capability_across_processes),
        cmocka_unit_test(test_grouping_across_processes),
        cmocka_unit_test(test_launch_order_across_processes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
