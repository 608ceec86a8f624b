/* Submit cost: ns per submitted command with 1, 2 and 4 producer threads.
 *  (1) the queue alone: ccq's ck_stack MPSC push + wake-up check vs a pthread mutex +
 *      condvar queue, both drained by one consumer thread, in the same harness;
 *  (2) the whole public call: ccq_all_reduce of one element, each producer on its own
 *      device and stream (communicator {d}), the scheduler draining, matching, running. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "bench_common.h"
#include "ccq.h"
#include "queue/mpsc.h"
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
    int kind; /* 0 ccq, 1 mutex */
    int nprod;
    uint32_t n;
    ccq_mpsc cq;
    ccq_wake wake;
    mqueue mq;
    item *items[MAXP];
    pthread_barrier_t bar;
    _Atomic int stop;
    _Atomic uint64_t consumed;
    double ns_per_op[MAXP];
} harness;

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
    uint64_t t0 = bench_now_ns();
    if (h->kind == 0) {
        for (uint32_t i = 0; i < h->n; i++) {
            ccq_mpsc_push_mpsc(&h->cq, &its[i].node);
            ccq_wake_signal(&h->wake);
        }
    } else {
        for (uint32_t i = 0; i < h->n; i++)
            mq_push(&h->mq, &its[i]);
    }
    h->ns_per_op[a->id] = (double)(bench_now_ns() - t0) / h->n;
    return NULL;
}

static void *consumer(void *arg)
{
    harness *h = arg;
    uint64_t total = (uint64_t)h->nprod * h->n, got = 0;
    pthread_barrier_wait(&h->bar);
    while (got < total) {
        if (h->kind == 0) {
            ccq_mpsc_node *n = ccq_mpsc_pop_all_spsc(&h->cq);
            if (n == NULL) {
                uint32_t s = ccq_wake_prepare(&h->wake);
                if (!ccq_mpsc_empty(&h->cq))
                    ccq_wake_cancel(&h->wake);
                else
                    ccq_wake_sleep(&h->wake, s, 100000000ull);
                continue;
            }
            for (; n != NULL; n = n->next)
                got++;
        } else {
            for (item *it = mq_pop_all(&h->mq, &h->stop); it != NULL; it = it->next)
                got++;
        }
    }
    atomic_store(&h->consumed, got);
    return NULL;
}

/* One run: every producer pushes n items; returns the mean of the producers' ns/op. */
static double queue_run(int kind, int nprod, uint32_t n)
{
    harness *h = calloc(1, sizeof *h);
    pthread_t pt[MAXP], ct;
    prod_arg pa[MAXP];
    double mean = 0;

    h->kind = kind;
    h->nprod = nprod;
    h->n = n;
    ccq_mpsc_init(&h->cq);
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
    pthread_create(&ct, NULL, consumer, h);
    for (int p = 0; p < nprod; p++)
        pthread_join(pt[p], NULL);
    pthread_join(ct, NULL);
    for (int p = 0; p < nprod; p++) {
        mean += h->ns_per_op[p] / nprod;
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

int main(int argc, char **argv)
{
    uint32_t n = (uint32_t)bench_opt(argc, argv, "--items", 200000);
    int reps = (int)bench_opt(argc, argv, "--reps", 7);
    bench_json js;
    double v[64];
    int errors = 0;

    bench_json_open(&js, argc, argv, "submit");
    printf("# Submit cost, ns per command (median of %d runs, %u commands per producer)\n", reps,
           n);
    printf("# %-9s %14s %14s %8s %18s\n", "producers", "ccq queue", "mutex+condvar", "ratio",
           "ccq_all_reduce()");
    for (int nprod = 1; nprod <= MAXP; nprod *= 2) {
        double q, m, api;
        for (int r = 0; r < reps; r++)
            v[r] = queue_run(0, nprod, n);
        q = bench_median(v, (size_t)reps);
        for (int r = 0; r < reps; r++)
            v[r] = queue_run(1, nprod, n);
        m = bench_median(v, (size_t)reps);

        /* The API: a runtime whose streams hold a whole run, so no producer waits for room
         * (that would measure the scheduler, not submission). */
        ccq_config cfg;
        ccq_runtime *rt;
        ccq_config_init(&cfg);
        cfg.host_devices = MAXP;
        cfg.queue_depth = n + 1;
        if (ccq_runtime_create(&cfg, &rt) != CCQ_OK) {
            fprintf(stderr, "ccq_runtime_create: %s\n", ccq_last_error_detail());
            return 1;
        }
        for (int p = 0; p < nprod; p++) {
            ccq_device_id d = (ccq_device_id)p;
            ccq_comm_init(rt, &d, 1);
        }
        api_run(rt, nprod, n, &errors); /* warm-up: touches every queue slot once */
        for (int r = 0; r < reps; r++)
            v[r] = api_run(rt, nprod, n, &errors);
        api = bench_median(v, (size_t)reps);
        ccq_runtime_destroy(rt);

        printf("  %-9d %14.1f %14.1f %7.1fx %18.1f\n", nprod, q, m, m / q, api);
        bench_json_record(&js,
                          "\"producers\": %d, \"ccq_queue_ns\": %.2f, \"mutex_queue_ns\": %.2f, "
                          "\"ratio\": %.2f, \"api_ns\": %.2f",
                          nprod, q, m, m / q, api);
    }
    bench_json_close(&js);
    if (errors)
        fprintf(stderr, "%d submission errors\n", errors);
    return errors ? 1 : 0;
}
