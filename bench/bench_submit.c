/* Submit cost: ns per submitted command with 1, 2 and 4 producer threads.
 *  (1) the queue alone: ccq's ck_stack MPSC push + wake-up check vs a pthread mutex +
 *      condvar queue, both drained by one consumer thread, in the same harness; each
 *      consumer waits the way its design does (ccq: the scheduler's bounded poll, then
 *      the futex protocol; mutex: pthread_cond_wait);
 *  (2) the whole public call: ccq_all_reduce of one element, each producer on its own
 *      device and stream (communicator {d}), the scheduler draining, matching, running. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "bench_common.h"
#include "ccq.h"
#include "queue/mpsc.h"
#include "backends/backend.h"
#include "queue/wake.h"

#define MAXP 4

typedef struct item {
    ccq_mpsc_node node; /* ccq queue link */
    struct item *next;  /* mutex queue link */
    uint32_t producer, seq;
} item;

/* ---- the mutex + condvar queue: what a straightforward implementation would do ---- */
typedef struct mqueue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    item *head, *tail;
    bool waiting; /* consumer asleep: producers signal only then */
} mqueue;

static void mq_push(mqueue *q, item *it)
{
    it->next = NULL;
    pthread_mutex_lock(&q->mu);
    if (q->tail)
        q->tail->next = it;
    else
        q->head = it;
    q->tail = it;
    if (q->waiting)
        pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

/* Take everything (as the ccq consumer does); block while empty unless stopping. */
static item *mq_pop_all(mqueue *q, const _Atomic int *stop)
{
    item *all;
    pthread_mutex_lock(&q->mu);
    while (q->head == NULL && !atomic_load(stop)) {
        q->waiting = true;
        pthread_cond_wait(&q->cv, &q->mu);
        q->waiting = false;
    }
    all = q->head;
    q->head = q->tail = NULL;
    pthread_mutex_unlock(&q->mu);
    return all;
}

typedef struct harness {
    int kind; /* 0 ccq (one shared queue), 1 mutex (one shared queue), 2 ccq (one per producer) */
    int nprod;
    uint32_t n;
    ccq_mpsc cq;
    ccq_mpsc pq[MAXP]; /* kind 2 */
    ccq_wake wake;
    mqueue mq;
    item *items[MAXP];
    pthread_barrier_t bar;
    _Atomic int stop;
    _Atomic uint64_t consumed;
    double ns_per_op[MAXP];
    double cpu_ns_per_op[MAXP];
} harness;

static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

typedef struct prod_arg {
    harness *h;
    int id;
} prod_arg;

static void *producer(void *arg)
{
    prod_arg *a = arg;
    harness *h = a->h;
    item *its = h->items[a->id];
    pthread_barrier_wait(&h->bar);
    uint64_t t0 = bench_now_ns(), c0 = thread_cpu_ns();
    if (h->kind == 0 || h->kind == 2) {
        ccq_mpsc *q = h->kind == 0 ? &h->cq : &h->pq[a->id];
        for (uint32_t i = 0; i < h->n; i++) {
            ccq_mpsc_push_mpsc(q, &its[i].node);
            ccq_wake_signal(&h->wake);
        }
    } else {
        for (uint32_t i = 0; i < h->n; i++)
            mq_push(&h->mq, &its[i]);
    }
    h->ns_per_op[a->id] = (double)(bench_now_ns() - t0) / h->n;
    h->cpu_ns_per_op[a->id] = (double)(thread_cpu_ns() - c0) / h->n;
    return NULL;
}

/* The consumer's view of "anything queued?" and "take it all", for both ccq layouts. */
static bool ccq_empty(harness *h)
{
    if (h->kind == 0)
        return ccq_mpsc_empty(&h->cq);
    for (int p = 0; p < h->nprod; p++)
        if (!ccq_mpsc_empty(&h->pq[p]))
            return false;
    return true;
}

/* What a consumer does with each item in both designs: read it and check per-producer
 * order (as the scheduler reads every command it drains). */
static uint32_t next_seq[MAXP];
static int order_errors;

static int consume(harness *h, const item *it)
{
    (void)h;
    if (it->seq != next_seq[it->producer]++)
        order_errors++;
    return 1;
}

static void *consumer(void *arg)
{
    harness *h = arg;
    uint64_t total = (uint64_t)h->nprod * h->n, got = 0;
    pthread_barrier_wait(&h->bar);
    while (got < total) {
        if (h->kind == 0 || h->kind == 2) {
            ccq_mpsc_node *n = NULL;
            if (h->kind == 0) {
                n = ccq_mpsc_pop_all_spsc(&h->cq);
            } else {
                for (int p = 0; p < h->nprod; p++)
                    for (ccq_mpsc_node *m = ccq_mpsc_pop_all_spsc(&h->pq[p]); m != NULL;
                         m = m->next)
                        got += consume(h, ccq_container_of(m, item, node));
            }
            if (n == NULL && h->kind == 2 && got > 0 && !ccq_empty(h))
                continue;
            if (n == NULL) {
                /* As the scheduler does: poll up to 50 us before announcing sleep, so
                 * producers of a busy queue never pay for a futex wake. */
                uint64_t t0 = bench_now_ns();
                while (ccq_empty(h) && bench_now_ns() - t0 < 50000)
                    for (int k = 0; k < 32; k++) /* ~1 us between looks at the head line */
                        ck_pr_stall();
                if (!ccq_empty(h))
                    continue;
                if (got >= total)
                    break;
                uint32_t s = ccq_wake_prepare(&h->wake);
                if (!ccq_empty(h))
                    ccq_wake_cancel(&h->wake);
                else
                    ccq_wake_sleep(&h->wake, s, 100000000ull);
                continue;
            }
            for (; n != NULL; n = n->next)
                got += consume(h, ccq_container_of(n, item, node));
        } else {
            for (item *it = mq_pop_all(&h->mq, &h->stop); it != NULL; it = it->next)
                got += consume(h, it);
        }
    }
    atomic_store(&h->consumed, got);
    return NULL;
}

/* One run: every producer pushes n items; returns the mean of the producers' ns/op (wall
 * clock) and sets *cpu to the mean of their CPU time per op. */
static double queue_run(int kind, int nprod, uint32_t n, double *cpu)
{
    harness *h = calloc(1, sizeof *h);
    pthread_t pt[MAXP], ct;
    prod_arg pa[MAXP];
    double mean = 0;

    h->kind = kind;
    h->nprod = nprod;
    h->n = n;
    ccq_mpsc_init(&h->cq);
    for (int p = 0; p < MAXP; p++)
        ccq_mpsc_init(&h->pq[p]);
    ccq_wake_init(&h->wake);
    pthread_mutex_init(&h->mq.mu, NULL);
    pthread_cond_init(&h->mq.cv, NULL);
    pthread_barrier_init(&h->bar, NULL, (unsigned)nprod + 1);
    for (int p = 0; p < nprod; p++) {
        h->items[p] = calloc(n, sizeof(item));
        for (uint32_t i = 0; i < n; i++) { /* touch the pages outside the timed loop */
            h->items[p][i].producer = (uint32_t)p;
            h->items[p][i].seq = i;
        }
        pa[p].h = h;
        pa[p].id = p;
        pthread_create(&pt[p], NULL, producer, &pa[p]);
    }
    memset(next_seq, 0, sizeof next_seq);
    pthread_create(&ct, NULL, consumer, h);
    for (int p = 0; p < nprod; p++)
        pthread_join(pt[p], NULL);
    pthread_join(ct, NULL);
    *cpu = 0;
    for (int p = 0; p < nprod; p++) {
        mean += h->ns_per_op[p] / nprod;
        *cpu += h->cpu_ns_per_op[p] / nprod;
        free(h->items[p]);
    }
    pthread_barrier_destroy(&h->bar);
    free(h);
    return mean;
}

/* ---- the public call ---- */
typedef struct api_arg {
    ccq_runtime *rt;
    ccq_device_id dev;
    uint32_t n;
    float *buf;
    pthread_barrier_t *bar;
    double ns_per_op;
    int errors;
} api_arg;

static void *api_producer(void *arg)
{
    api_arg *a = arg;
    ccq_device_id set[1] = {a->dev};
    pthread_barrier_wait(a->bar);
    uint64_t t0 = bench_now_ns();
    for (uint32_t i = 0; i < a->n; i++)
        a->errors += ccq_all_reduce(a->rt, a->dev, 0, a->buf, a->buf, 1, CCQ_FLOAT32, CCQ_SUM, set,
                                    1) != CCQ_OK;
    a->ns_per_op = (double)(bench_now_ns() - t0) / a->n;
    a->errors += ccq_sync_collective(a->rt, a->dev, 0) != CCQ_OK;
    return NULL;
}

static double api_run(ccq_runtime *rt, int nprod, uint32_t n, int *errors)
{
    pthread_t th[MAXP];
    api_arg a[MAXP];
    float buf[MAXP][16];
    pthread_barrier_t bar;
    double mean = 0;

    pthread_barrier_init(&bar, NULL, (unsigned)nprod);
    for (int p = 0; p < nprod; p++) {
        a[p] = (api_arg){rt, (ccq_device_id)p, n, buf[p], &bar, 0, 0};
        pthread_create(&th[p], NULL, api_producer, &a[p]);
    }
    for (int p = 0; p < nprod; p++) {
        pthread_join(th[p], NULL);
        mean += a[p].ns_per_op / nprod;
        *errors += a[p].errors;
    }
    pthread_barrier_destroy(&bar);
    return mean;
}

/* The API: a runtime whose streams hold a whole run, so no producer waits for room (that
 * would measure the scheduler, not submission). Median ns per call, or -1. */
static double api_median(int nprod, uint32_t n, int reps, int *errors)
{
    ccq_config cfg;
    ccq_runtime *rt;
    double v[64];

    ccq_config_init(&cfg);
    cfg.host_devices = MAXP;
    cfg.queue_depth = n + 1;
    if (ccq_runtime_create(&cfg, &rt) != CCQ_OK) {
        fprintf(stderr, "ccq_runtime_create: %s\n", ccq_last_error_detail());
        return -1;
    }
    for (int p = 0; p < nprod; p++) {
        ccq_device_id d = (ccq_device_id)p;
        ccq_comm_init(rt, &d, 1);
    }
    api_run(rt, nprod, n, errors); /* warm-up: touches every queue slot once */
    for (int r = 0; r < reps; r++)
        v[r] = api_run(rt, nprod, n, errors);
    ccq_runtime_destroy(rt);
    return bench_median(v, (size_t)reps);
}

int main(int argc, char **argv)
{
    uint32_t n = (uint32_t)bench_opt(argc, argv, "--items", 200000);
    int reps = (int)bench_opt(argc, argv, "--reps", 7);
    if (reps < 1 || reps > 64) {
        fprintf(stderr, "--reps must be 1..64\n");
        return 2;
    }
    /* --producers N: only that row (to profile one configuration). */
    int only = (int)bench_opt(argc, argv, "--producers", 0);
    /* --no-api 1: skip the public-call column (to profile the queues alone). */
    int no_api = (int)bench_opt(argc, argv, "--no-api", 0);
    bench_json js;
    double v[64];
    int errors = 0;

    bench_json_open(&js, argc, argv, "submit");
    printf("# Submit cost, ns per command (median of %d runs, %u commands per producer)\n", reps,
           n);
    printf("# queue: one queue shared by all producers, ccq (ck_stack MPSC) vs mutex+condvar,\n"
           "#        wall clock and CPU time per push; per-stream: ccq with one queue per\n"
           "#        producer, as producers on different streams use it; API: ccq_all_reduce()\n");
    printf("# %-5s %9s %9s %6s %9s %9s %6s %11s %9s\n", "prod", "ccq wall", "mtx wall", "ratio",
           "ccq cpu", "mtx cpu", "ratio", "per-stream", "API");
    for (int nprod = 1; nprod <= MAXP; nprod *= 2) {
        if (only > 0 && nprod != only)
            continue;
        double q, m, qc, mc, ps, api, cv[64];
        for (int r = 0; r < reps; r++)
            v[r] = queue_run(0, nprod, n, &cv[r]);
        q = bench_median(v, (size_t)reps);
        qc = bench_median(cv, (size_t)reps);
        for (int r = 0; r < reps; r++)
            v[r] = queue_run(1, nprod, n, &cv[r]);
        m = bench_median(v, (size_t)reps);
        mc = bench_median(cv, (size_t)reps);
        for (int r = 0; r < reps; r++)
            v[r] = queue_run(2, nprod, n, &cv[r]);
        ps = bench_median(v, (size_t)reps);

        api = no_api ? 0.0 : api_median(nprod, n, reps, &errors);
        if (api < 0)
            return 1;

        printf("  %-5d %9.1f %9.1f %5.1fx %9.1f %9.1f %5.1fx %11.1f %9.1f\n", nprod, q, m, m / q,
               qc, mc, mc / qc, ps, api);
        bench_json_record(
            &js,
            "\"producers\": %d, \"ccq_queue_ns\": %.2f, \"mutex_queue_ns\": %.2f, "
            "\"ratio\": %.2f, \"ccq_queue_cpu_ns\": %.2f, \"mutex_queue_cpu_ns\": "
            "%.2f, \"cpu_ratio\": %.2f, \"ccq_per_stream_ns\": %.2f, \"api_ns\": %.2f",
            nprod, q, m, m / q, qc, mc, mc / qc, ps, api);
    }
    bench_json_close(&js);
    if (order_errors) {
        fprintf(stderr, "%d items out of per-producer order\n", order_errors);
        errors += order_errors;
    }
    if (errors)
        fprintf(stderr, "%d submission errors\n", errors);
    return errors ? 1 : 0;
}
