/* Many submitting threads (DESIGN rule 8): 64 threads on 16 overlapping communicators
 * with results checked against the reference, and 32 threads exchanging tagged send/recv
 * payloads; exact counts at the end. Clean under ThreadSanitizer (no unsynchronised
 * shared state in the test itself). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test_util.h"

#include <pthread.h>
#include <stdatomic.h>

#include "ccq.h"
#include "ref.h"

/* A thread's first failure, reported by the main thread (cmocka asserts are not for
 * other threads). */
typedef struct thread_error {
    int failed;
    char msg[640];
} thread_error;

static void thread_fail(thread_error *e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void thread_fail(thread_error *e, const char *fmt, ...)
{
    va_list ap;
    if (e->failed)
        return;
    e->failed = 1;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------------------------ */
/* All-reduce on 16 overlapping communicators                                            */
/* ------------------------------------------------------------------------------------ */

enum { AR_NDEV = 8, AR_NCOMM = 16, AR_RANKS = 4, AR_MAXCOUNT = 4096 };

typedef struct ar_shared {
    ccq_runtime *rt;
    ccq_device_id sets[AR_NCOMM][AR_RANKS]; /* sorted */
    unsigned iters;
    pthread_barrier_t start;
} ar_shared;

typedef struct ar_thread {
    pthread_t th;
    ar_shared *sh;
    uint32_t comm, rank;
    uint64_t done;
    thread_error err;
} ar_thread;

/* What collective `iter` of communicator `comm` is: all members derive the same. */
static void ar_params(uint32_t comm, uint32_t iter, ccq_dtype *dtype, ccq_reduce_op *op,
                      size_t *count)
{
    static const size_t counts[] = {1, 3, 16, 63, 64, 255, 1000, 1024, 4096, 0, 777, 2048};
    uint32_t h = comm * 2654435761u ^ iter * 40503u;
    h ^= h >> 13;
    *dtype = (ccq_dtype)((h + iter) % CCQ_DTYPE_COUNT_);
    *op = (ccq_reduce_op)((h >> 5) % CCQ_REDUCE_OP_COUNT_);
    *count = counts[(h >> 9) % (sizeof counts / sizeof counts[0])];
}

static uint32_t ar_seed(uint32_t comm, ccq_device_id dev, uint32_t iter)
{
    return (comm * 1000003u) ^ (dev * 7919u) ^ (iter * 104729u);
}

static void *ar_thread_main(void *arg)
{
    ar_thread *t = arg;
    ar_shared *sh = t->sh;
    const ccq_device_id *set = sh->sets[t->comm];
    const ccq_device_id me = set[t->rank];
    const size_t cap = AR_MAXCOUNT * 8;
    unsigned char *in[AR_RANKS], *out = malloc(cap), *want = malloc(cap);
    char msg[256];
    int ok = out != NULL && want != NULL;

    for (int r = 0; r < AR_RANKS; r++) {
        in[r] = malloc(cap);
        ok = ok && in[r] != NULL;
    }
    pthread_barrier_wait(&sh->start);
    for (uint32_t it = 0; ok && it < sh->iters && !t->err.failed; it++) {
        ccq_dtype dt;
        ccq_reduce_op op;
        size_t count;
        const void *inputs[AR_RANKS];
        ar_params(t->comm, it, &dt, &op, &count);
        for (int r = 0; r < AR_RANKS; r++) {
            ref_fill(dt, in[r], count, ar_seed(t->comm, set[r], it));
            inputs[r] = in[r];
        }
        ref_allreduce(dt, op, AR_RANKS, inputs, want, count);
        /* Every third iteration in place, on this rank only (a local choice). */
        int inplace = (it + t->rank) % 3 == 0;
        void *dst = inplace ? in[t->rank] : out;
        if (!inplace)
            memset(out, 0xa5, cap);
        ccq_status st =
            ccq_all_reduce(sh->rt, me, t->comm, in[t->rank], dst, count, dt, op, set, AR_RANKS);
        if (st != CCQ_OK) {
            thread_fail(&t->err, "comm %u dev %u iter %u: all_reduce: %s: %s", t->comm, me, it,
                        ccq_status_name(st), ccq_last_error_detail());
            break;
        }
        st = ccq_sync_collective(sh->rt, me, t->comm);
        if (st != CCQ_OK) {
            thread_fail(&t->err, "comm %u dev %u iter %u: fence: %s: %s", t->comm, me, it,
                        ccq_status_name(st), ccq_last_error_detail());
            break;
        }
        size_t bad = ref_compare(dt, dst, want, count, msg, sizeof msg);
        if (bad != 0) {
            thread_fail(&t->err, "comm %u dev %u iter %u (%s %s x %zu): %zu wrong: %s", t->comm, me,
                        it, ccq_dtype_name(dt), ccq_reduce_op_name(op), count, bad, msg);
            break;
        }
        t->done++;
    }
    if (!ok)
        thread_fail(&t->err, "out of memory");
    for (int r = 0; r < AR_RANKS; r++)
        free(in[r]);
    free(out);
    free(want);
    return NULL;
}

static void sort_set(ccq_device_id *s, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && s[j - 1] > s[j]; j--) {
            ccq_device_id x = s[j];
            s[j] = s[j - 1];
            s[j - 1] = x;
        }
}

/*
 * 8 devices, 16 communicators of 4: {d, d+1, d+2, d+4} and {d, d+3, d+5, d+6} (mod 8).
 * One thread per (communicator, member): 8 per device, 64 in all, each on its own stream
 * (stream id = communicator index), all started on one barrier.
 */
static void test_threads_allreduce_overlapping_comms(void **state)
{
    (void)state;
    static const uint32_t shapes[2][AR_RANKS] = {{0, 1, 2, 4}, {0, 3, 5, 6}};
    ar_shared sh;
    ar_thread *t = calloc(AR_NCOMM * AR_RANKS, sizeof *t);
    ccq_config cfg;
    int per_dev[AR_NDEV] = {0};

    assert_non_null(t);
    memset(&sh, 0, sizeof sh);
    sh.iters = env_iters(200);
    for (uint32_t c = 0; c < AR_NCOMM; c++) {
        for (int r = 0; r < AR_RANKS; r++)
            sh.sets[c][r] = (shapes[c / AR_NDEV][r] + c % AR_NDEV) % AR_NDEV;
        sort_set(sh.sets[c], AR_RANKS);
        for (int r = 0; r < AR_RANKS; r++)
            per_dev[sh.sets[c][r]]++;
        for (uint32_t p = 0; p < c; p++)
            assert_memory_not_equal(sh.sets[c], sh.sets[p], sizeof sh.sets[c]);
    }
    for (int d = 0; d < AR_NDEV; d++)
        assert_int_equal(per_dev[d], 8);

    ccq_config_init(&cfg);
    cfg.host_devices = AR_NDEV;
    cfg.max_streams = AR_NCOMM;
    cfg.timeout_ms = 60000; /* a hang becomes a reported timeout, not a killed test */
    assert_int_equal(ccq_runtime_create(&cfg, &sh.rt), CCQ_OK);
    for (uint32_t c = 0; c < AR_NCOMM; c++)
        assert_int_equal(ccq_comm_init(sh.rt, sh.sets[c], AR_RANKS), CCQ_OK);
    assert_int_equal(pthread_barrier_init(&sh.start, NULL, AR_NCOMM * AR_RANKS), 0);
    for (uint32_t c = 0; c < AR_NCOMM; c++)
        for (uint32_t r = 0; r < AR_RANKS; r++) {
            ar_thread *x = &t[c * AR_RANKS + r];
            x->sh = &sh;
            x->comm = c;
            x->rank = r;
            assert_int_equal(pthread_create(&x->th, NULL, ar_thread_main, x), 0);
        }
    uint64_t done = 0;
    int failures = 0;
    for (int k = 0; k < AR_NCOMM * AR_RANKS; k++) {
        assert_int_equal(pthread_join(t[k].th, NULL), 0);
        if (t[k].err.failed) {
            print_error("%s\n", t[k].err.msg);
            failures++;
        }
        done += t[k].done;
    }
    assert_int_equal(failures, 0);
    assert_int_equal(done, (uint64_t)AR_NCOMM * AR_RANKS * sh.iters);
    ccq_stats st = stats_of(sh.rt);
    assert_int_equal(st.submitted, (uint64_t)AR_NCOMM * AR_RANKS * sh.iters);
    assert_int_equal(st.completed, st.submitted);
    assert_int_equal(st.failed, 0);
    assert_int_equal(st.cancelled, 0);
    assert_int_equal(st.pending, 0);
    print_message("%u iterations: %llu batches for %llu ops (largest %llu)\n", sh.iters,
                  (unsigned long long)st.batches, (unsigned long long)st.batched_ops,
                  (unsigned long long)st.max_batch_ops);
    assert_int_equal(pthread_barrier_destroy(&sh.start), 0);
    assert_int_equal(ccq_runtime_destroy(sh.rt), CCQ_OK);
    free(t);
}

/* ------------------------------------------------------------------------------------ */
/* Tagged send/recv from 32 threads                                                      */
/* ------------------------------------------------------------------------------------ */

/*
 * 4 devices, 8 threads each on its own stream: threads 0-3 send, 4-7 receive. Sender k of
 * device d sends to d + 1 + (k % 3) (mod 4); receiver j of device b receives from
 * b - 1 - (j % 3) (mod 4). So each direction d -> d+1 has two concurrent senders and two
 * concurrent receivers (which send meets which recv is then decided by per-pair order,
 * arbitrary across threads), while d -> d+2 and d -> d+3 have one of each (deterministic).
 * Every message of a direction has the same size; its payload says who sent it and when,
 * and its body is derived from that, so a receiver checks integrity, the main thread
 * checks that every message arrived exactly once, and per (sender, receiver) the
 * iterations arrive in increasing order (both sides' sequence numbers increase).
 */
enum { SR_NDEV = 4, SR_PER_DEV = 8, SR_SENDERS = SR_NDEV * 4, SR_HDR = 4 };

typedef struct sr_shared {
    ccq_runtime *rt;
    unsigned iters;
    pthread_barrier_t start;
    _Atomic uint32_t *seen; /* [SR_SENDERS * iters]: times each message was received */
} sr_shared;

typedef struct sr_thread {
    pthread_t th;
    sr_shared *sh;
    ccq_device_id dev;
    uint32_t k; /* 0..7 on its device; also its stream */
    uint64_t ops;
    thread_error err;
} sr_thread;

static ccq_device_id sr_peer(ccq_device_id dev, uint32_t k)
{
    return k < 4 ? (dev + 1 + k % 3) % SR_NDEV : (dev + SR_NDEV * 2 - 1 - (k - 4) % 3) % SR_NDEV;
}

static size_t sr_count(ccq_device_id from, ccq_device_id to)
{
    return 16 + 97 * (from * SR_NDEV + to);
}

static uint32_t sr_word(uint32_t sender, uint32_t iter, size_t i)
{
    uint32_t x = sender * 0x9e3779b9u ^ iter * 0x85ebca6bu ^ (uint32_t)i * 0xc2b2ae35u;
    x ^= x >> 16;
    return x * 0x27d4eb2du;
}

static void *sr_thread_main(void *arg)
{
    sr_thread *t = arg;
    sr_shared *sh = t->sh;
    const ccq_device_id peer = sr_peer(t->dev, t->k);
    const int sender = t->k < 4;
    const size_t count = sender ? sr_count(t->dev, peer) : sr_count(peer, t->dev);
    uint32_t *buf = malloc(count * sizeof *buf);
    int64_t last_iter[SR_SENDERS];

    for (int s = 0; s < SR_SENDERS; s++)
        last_iter[s] = -1;
    pthread_barrier_wait(&sh->start);
    if (buf == NULL) {
        thread_fail(&t->err, "out of memory");
        return NULL;
    }
    for (uint32_t it = 0; it < sh->iters; it++) {
        ccq_status st;
        if (sender) {
            uint32_t id = t->dev * 4 + t->k;
            buf[0] = 0xccc00000u | t->dev;
            buf[1] = id;
            buf[2] = it;
            buf[3] = peer;
            for (size_t i = SR_HDR; i < count; i++)
                buf[i] = sr_word(id, it, i);
            st = ccq_send(sh->rt, t->dev, t->k, buf, count, CCQ_UINT32, peer);
        } else {
            memset(buf, 0, count * sizeof *buf);
            st = ccq_recv(sh->rt, t->dev, t->k, buf, count, CCQ_UINT32, peer);
        }
        if (st != CCQ_OK) {
            thread_fail(&t->err, "dev %u thread %u iter %u: submit: %s: %s", t->dev, t->k, it,
                        ccq_status_name(st), ccq_last_error_detail());
            break;
        }
        st = ccq_sync_collective(sh->rt, t->dev, t->k);
        if (st != CCQ_OK) {
            thread_fail(&t->err, "dev %u thread %u iter %u: fence: %s: %s", t->dev, t->k, it,
                        ccq_status_name(st), ccq_last_error_detail());
            break;
        }
        t->ops++;
        if (sender)
            continue;
        /* Who sent it, and is it intact? */
        uint32_t id = buf[1], iter = buf[2];
        if (buf[0] != (0xccc00000u | peer) || buf[3] != t->dev || id >= SR_SENDERS ||
            id / 4 != peer || iter >= sh->iters || sr_peer(peer, id % 4) != t->dev) {
            thread_fail(&t->err, "dev %u thread %u: bad header %08x %u %u %u from peer %u", t->dev,
                        t->k, buf[0], buf[1], buf[2], buf[3], peer);
            break;
        }
        for (size_t i = SR_HDR; i < count; i++)
            if (buf[i] != sr_word(id, iter, i)) {
                thread_fail(&t->err, "dev %u thread %u: message (%u, %u) corrupt at word %zu",
                            t->dev, t->k, id, iter, i);
                break;
            }
        if ((int64_t)iter <= last_iter[id]) {
            thread_fail(&t->err, "dev %u thread %u: from sender %u iteration %u after %lld", t->dev,
                        t->k, id, iter, (long long)last_iter[id]);
            break;
        }
        last_iter[id] = iter;
        atomic_fetch_add_explicit(&sh->seen[(size_t)id * sh->iters + iter], 1,
                                  memory_order_relaxed);
    }
    free(buf);
    return NULL;
}

static void test_threads_sendrecv_tagged(void **state)
{
    (void)state;
    sr_shared sh;
    sr_thread t[SR_NDEV * SR_PER_DEV];
    ccq_config cfg;

    memset(&sh, 0, sizeof sh);
    memset(t, 0, sizeof t);
    sh.iters = env_iters(200);
    sh.seen = calloc((size_t)SR_SENDERS * sh.iters, sizeof *sh.seen);
    assert_non_null(sh.seen);
    /* Each direction has as many senders as receivers. */
    int dir_send[SR_NDEV][SR_NDEV] = {{0}}, dir_recv[SR_NDEV][SR_NDEV] = {{0}};
    for (ccq_device_id d = 0; d < SR_NDEV; d++)
        for (uint32_t k = 0; k < SR_PER_DEV; k++) {
            ccq_device_id p = sr_peer(d, k);
            assert_int_not_equal(p, d);
            if (k < 4)
                dir_send[d][p]++;
            else
                dir_recv[p][d]++;
        }
    assert_memory_equal(dir_send, dir_recv, sizeof dir_send);

    ccq_config_init(&cfg);
    cfg.host_devices = SR_NDEV;
    cfg.max_streams = SR_PER_DEV;
    cfg.timeout_ms = 60000;
    assert_int_equal(ccq_runtime_create(&cfg, &sh.rt), CCQ_OK);
    assert_int_equal(pthread_barrier_init(&sh.start, NULL, SR_NDEV * SR_PER_DEV), 0);
    for (ccq_device_id d = 0; d < SR_NDEV; d++)
        for (uint32_t k = 0; k < SR_PER_DEV; k++) {
            sr_thread *x = &t[d * SR_PER_DEV + k];
            x->sh = &sh;
            x->dev = d;
            x->k = k;
            assert_int_equal(pthread_create(&x->th, NULL, sr_thread_main, x), 0);
        }
    int failures = 0;
    uint64_t ops = 0;
    for (int k = 0; k < SR_NDEV * SR_PER_DEV; k++) {
        assert_int_equal(pthread_join(t[k].th, NULL), 0);
        if (t[k].err.failed) {
            print_error("%s\n", t[k].err.msg);
            failures++;
        }
        ops += t[k].ops;
    }
    assert_int_equal(failures, 0);
    /* Nothing lost, nothing duplicated. */
    for (size_t i = 0; i < (size_t)SR_SENDERS * sh.iters; i++)
        if (atomic_load(&sh.seen[i]) != 1)
            fail_msg("message (sender %zu, iter %zu) received %u times", i / sh.iters, i % sh.iters,
                     atomic_load(&sh.seen[i]));
    assert_int_equal(ops, (uint64_t)2 * SR_SENDERS * sh.iters);
    ccq_stats st = stats_of(sh.rt);
    assert_int_equal(st.submitted, ops);
    assert_int_equal(st.completed, ops);
    assert_int_equal(st.failed, 0);
    assert_int_equal(st.cancelled, 0);
    assert_int_equal(st.pending, 0);
    assert_int_equal(st.batched_ops, ops / 2); /* one op per send/recv pair */
    assert_int_equal(pthread_barrier_destroy(&sh.start), 0);
    assert_int_equal(ccq_runtime_destroy(sh.rt), CCQ_OK);
    free(sh.seen);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threads_allreduce_overlapping_comms),
        cmocka_unit_test(test_threads_sendrecv_tagged),
    };
    return cmocka_run_group_tests_name("threads", tests, NULL, NULL);
}
