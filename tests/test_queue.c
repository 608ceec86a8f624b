/* Tests of the queue layer: the MPSC queue (queue/mpsc.h) and the wake-up primitives
 * (queue/wake.h): ccq_wake, ccq_signal and the futex helpers. */
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "queue/mpsc.h"
#include "queue/wake.h"

/* A sleep that lasts this long can only be a lost wake-up: every sleep in these tests is
 * ended by a wake-up that is due at once, and its timeout is twice as long, so a machine
 * that is merely slow never gets near it. */
#define LOST_NS    (5ull * 1000000000ull)
#define SLEEP_NS   (10ull * 1000000000ull)
#define MAX_PROD   8
#define MAX_EVWAIT 16

/* Iteration counts: a default, overridable by an environment variable. */
static uint64_t env_count(const char *name, uint64_t def)
{
    const char *v = getenv(name);
    char *end;
    unsigned long long x;

    if (v == NULL || *v == '\0')
        return def;
    x = strtoull(v, &end, 10);
    if (*end != '\0' || x == 0) {
        fprintf(stderr, "%s=%s ignored (expected a positive integer)\n", name, v);
        return def;
    }
    return x;
}

/* An item tagged with its producer and its sequence number in that producer. */
typedef struct item {
    ccq_mpsc_node node;
    uint32_t producer;
    uint32_t seq;
} item;

static item *item_of(ccq_mpsc_node *n)
{
    return (item *)((char *)n - offsetof(item, node));
}

/* ---- deterministic edges ------------------------------------------------------------- */

static void test_mpsc_empty_edges(void **state)
{
    (void)state;
    ccq_mpsc q;
    item it[3];

    ccq_mpsc_init(&q);
    assert_true(ccq_mpsc_empty(&q));
    assert_null(ccq_mpsc_pop_all_spsc(&q));
    assert_null(ccq_mpsc_pop_all_spsc(&q));

    /* Single item: the push that makes the queue non-empty says so. */
    it[0].seq = 0;
    assert_true(ccq_mpsc_push_mpsc(&q, &it[0].node));
    assert_false(ccq_mpsc_empty(&q));
    ccq_mpsc_node *n = ccq_mpsc_pop_all_spsc(&q);
    assert_ptr_equal(n, &it[0].node);
    assert_null(n->next);
    assert_true(ccq_mpsc_empty(&q));
    assert_null(ccq_mpsc_pop_all_spsc(&q));

    /* Several items: only the first push reports the empty -> non-empty transition, and
     * the pop returns them oldest first, NULL-terminated. */
    for (uint32_t i = 0; i < 3; i++) {
        it[i].seq = i;
        assert_int_equal(ccq_mpsc_push_mpsc(&q, &it[i].node), i == 0);
    }
    n = ccq_mpsc_pop_all_spsc(&q);
    for (uint32_t i = 0; i < 3; i++) {
        assert_non_null(n);
        assert_int_equal(item_of(n)->seq, i);
        n = n->next;
    }
    assert_null(n);
    assert_true(ccq_mpsc_empty(&q));
    assert_null(ccq_mpsc_pop_all_spsc(&q));

    /* After a pop the queue is empty again: the next push reports the transition again,
     * and nodes can be reused. */
    assert_true(ccq_mpsc_push_mpsc(&q, &it[2].node));
    assert_false(ccq_mpsc_push_mpsc(&q, &it[0].node));
    n = ccq_mpsc_pop_all_spsc(&q);
    assert_ptr_equal(n, &it[2].node);
    assert_ptr_equal(n->next, &it[0].node);
    assert_null(n->next->next);
    assert_true(ccq_mpsc_empty(&q));
}

/* ---- 4 producers x N items, one consumer --------------------------------------------- */

typedef struct mpsc_stress {
    ccq_mpsc q;
    pthread_barrier_t start;
    uint32_t nprod;
    uint32_t nitems;
    item *items[MAX_PROD];
    uint64_t transitions[MAX_PROD]; /* pushes that returned true, per producer */
    _Atomic uint32_t producers_done;
} mpsc_stress;

typedef struct prod_arg {
    mpsc_stress *st;
    uint32_t id;
} prod_arg;

static void *stress_producer(void *arg)
{
    prod_arg *a = arg;
    mpsc_stress *st = a->st;
    item *items = st->items[a->id];
    uint64_t trans = 0;

    pthread_barrier_wait(&st->start);
    for (uint32_t i = 0; i < st->nitems; i++)
        trans += ccq_mpsc_push_mpsc(&st->q, &items[i].node);
    st->transitions[a->id] = trans;
    atomic_fetch_add_explicit(&st->producers_done, 1, memory_order_release);
    return NULL;
}

static void test_mpsc_stress(void **state)
{
    (void)state;
    mpsc_stress st;
    pthread_t th[MAX_PROD];
    prod_arg args[MAX_PROD];
    uint32_t next[MAX_PROD] = {0};
    uint64_t received = 0, nonempty_pops = 0, bad_tag = 0, bad_order = 0;
    uint64_t total;

    memset(&st, 0, sizeof st);
    st.nprod = 4;
    st.nitems = (uint32_t)env_count("CCQ_TEST_ITEMS", 1000000);
    total = (uint64_t)st.nprod * st.nitems;
    ccq_mpsc_init(&st.q);
    atomic_init(&st.producers_done, 0);
    for (uint32_t p = 0; p < st.nprod; p++) {
        st.items[p] = malloc((size_t)st.nitems * sizeof(item));
        assert_non_null(st.items[p]);
        for (uint32_t i = 0; i < st.nitems; i++) {
            st.items[p][i].producer = p;
            st.items[p][i].seq = i;
        }
    }
    assert_int_equal(pthread_barrier_init(&st.start, NULL, st.nprod + 1), 0);
    for (uint32_t p = 0; p < st.nprod; p++) {
        args[p].st = &st;
        args[p].id = p;
        assert_int_equal(pthread_create(&th[p], NULL, stress_producer, &args[p]), 0);
    }
    pthread_barrier_wait(&st.start);

    /* Consume concurrently until every producer is done and the queue is drained. */
    for (;;) {
        bool done = atomic_load_explicit(&st.producers_done, memory_order_acquire) == st.nprod;
        ccq_mpsc_node *n = ccq_mpsc_pop_all_spsc(&st.q);
        if (n == NULL) {
            if (done)
                break;
            sched_yield();
            continue;
        }
        nonempty_pops++;
        for (; n != NULL; n = n->next) {
            item *it = item_of(n);
            received++;
            if (it->producer >= st.nprod || it < st.items[it->producer] ||
                it >= st.items[it->producer] + st.nitems) {
                bad_tag++;
                continue;
            }
            /* Exactly the next one of its producer: catches loss, duplication and
             * reordering at once. */
            if (it->seq != next[it->producer] || it != &st.items[it->producer][it->seq])
                bad_order++;
            next[it->producer] = it->seq + 1;
        }
    }
    for (uint32_t p = 0; p < st.nprod; p++)
        pthread_join(th[p], NULL);
    pthread_barrier_destroy(&st.start);

    assert_int_equal(bad_tag, 0);
    assert_int_equal(bad_order, 0);
    assert_int_equal(received, total);
    uint64_t trans = 0;
    for (uint32_t p = 0; p < st.nprod; p++) {
        assert_int_equal(next[p], st.nitems);
        trans += st.transitions[p];
    }
    /* Every non-empty pop emptied the queue, and each empty -> non-empty transition is
     * reported by exactly one push. */
    assert_int_equal(trans, nonempty_pops);
    assert_true(ccq_mpsc_empty(&st.q));
    for (uint32_t p = 0; p < st.nprod; p++)
        free(st.items[p]);
}

/* ---- ccq_wake: the protocol step by step, in one thread ------------------------------ */

static void test_wake_protocol_single_thread(void **state)
{
    (void)state;
    ccq_wake w;
    uint64_t t0;

    ccq_wake_init(&w);
    /* A signal while the consumer is awake changes nothing (no system call). */
    ccq_wake_signal(&w);
    ccq_wake_signal_fenced(&w);
    assert_int_equal(atomic_load(&w.seq), 0);
    assert_int_equal(atomic_load(&w.sleeping), 0);

    /* prepare announces the sleep; cancel withdraws it. */
    uint32_t s = ccq_wake_prepare(&w);
    assert_int_equal(s, 0);
    assert_int_equal(atomic_load(&w.sleeping), 1);
    ccq_wake_cancel(&w);
    assert_int_equal(atomic_load(&w.sleeping), 0);

    /* A signal after prepare wakes: it clears the flag and bumps seq, so the sleep that
     * follows returns at once instead of waiting for its timeout. */
    s = ccq_wake_prepare(&w);
    ccq_wake_signal(&w);
    assert_int_equal(atomic_load(&w.sleeping), 0);
    assert_int_equal(atomic_load(&w.seq), s + 1);
    t0 = ccq_now_ns();
    ccq_wake_sleep(&w, s, SLEEP_NS);
    assert_true(ccq_now_ns() - t0 < LOST_NS);
    assert_int_equal(atomic_load(&w.sleeping), 0);

    /* Only the first of several signals pays: later ones see the flag cleared. */
    s = ccq_wake_prepare(&w);
    ccq_wake_signal(&w);
    ccq_wake_signal(&w);
    ccq_wake_signal_fenced(&w);
    assert_int_equal(atomic_load(&w.seq), s + 1);

    /* seq wraps around without harm. */
    atomic_store(&w.seq, UINT32_MAX);
    s = ccq_wake_prepare(&w);
    assert_int_equal(s, UINT32_MAX);
    ccq_wake_signal_fenced(&w);
    assert_int_equal(atomic_load(&w.seq), 0);
    t0 = ccq_now_ns();
    ccq_wake_sleep(&w, s, SLEEP_NS);
    assert_true(ccq_now_ns() - t0 < LOST_NS);

    /* A sleep with nothing to wake it ends at its timeout. */
    s = ccq_wake_prepare(&w);
    t0 = ccq_now_ns();
    ccq_wake_sleep(&w, s, 20000000ull);
    assert_true(ccq_now_ns() - t0 < LOST_NS);
    assert_int_equal(atomic_load(&w.sleeping), 0);
}

/* ---- ccq_wake: the sleep/wake race, looped ------------------------------------------- */

typedef struct wake_race {
    ccq_mpsc q;
    ccq_wake w;
    pthread_barrier_t start;
    uint32_t nprod;
    uint64_t rounds;
    item *items[MAX_PROD];     /* [rounds] per producer */
    _Atomic uint64_t acked;    /* rounds the consumer has fully received */
    _Atomic uint32_t ack_word; /* futex word bumped with every ack */
    _Atomic uint32_t stop;     /* set by the consumer on a lost wake-up */
    /* Consumer results. */
    uint64_t received, lost, bad, sleeps;
} wake_race;

typedef struct race_arg {
    wake_race *r;
    uint32_t id;
} race_arg;

static void *race_consumer(void *arg)
{
    wake_race *r = arg;
    uint32_t next[MAX_PROD] = {0};

    pthread_barrier_wait(&r->start);
    for (uint64_t round = 0; round < r->rounds; round++) {
        uint64_t want = (round + 1) * r->nprod;
        while (r->received < want) {
            ccq_mpsc_node *n;
            /* The scheduler's protocol: announce, re-check the work source, then sleep. */
            uint32_t s = ccq_wake_prepare(&r->w);
            if (ccq_mpsc_empty(&r->q)) {
                uint64_t t0 = ccq_now_ns();
                ccq_wake_sleep(&r->w, s, SLEEP_NS);
                r->sleeps++;
                if (ccq_now_ns() - t0 >= LOST_NS) {
                    r->lost++;
                    atomic_store(&r->stop, 1);
                    return NULL;
                }
            } else {
                ccq_wake_cancel(&r->w);
            }
            for (n = ccq_mpsc_pop_all_spsc(&r->q); n != NULL; n = n->next) {
                item *it = item_of(n);
                r->received++;
                if (it->producer >= r->nprod || it->seq != next[it->producer])
                    r->bad++;
                else
                    next[it->producer]++;
            }
        }
        atomic_store_explicit(&r->acked, round + 1, memory_order_release);
        atomic_fetch_add_explicit(&r->ack_word, 1, memory_order_seq_cst);
        ccq_futex_wake_all(&r->ack_word);
    }
    return NULL;
}

static void *race_producer(void *arg)
{
    race_arg *a = arg;
    wake_race *r = a->r;
    item *items = r->items[a->id];

    pthread_barrier_wait(&r->start);
    for (uint64_t round = 0; round < r->rounds; round++) {
        ccq_mpsc_push_mpsc(&r->q, &items[round].node);
        ccq_wake_signal(&r->w);
        /* Wait for the consumer to take the whole round before the next push, so every
         * round races a fresh sleep against a fresh push. Spin first (the push then lands
         * while the consumer heads for its sleep), then sleep on the ack word so that a
         * loaded machine does not starve the consumer. */
        for (uint32_t spin = 0; atomic_load_explicit(&r->acked, memory_order_acquire) <= round;
             spin++) {
            if (atomic_load(&r->stop))
                return NULL;
            if (spin < 2000) {
                ck_pr_stall();
                continue;
            }
            uint32_t v = atomic_load_explicit(&r->ack_word, memory_order_seq_cst);
            if (atomic_load_explicit(&r->acked, memory_order_acquire) > round)
                break;
            ccq_futex_wait(&r->ack_word, v, 100000000ull);
        }
    }
    return NULL;
}

static void run_wake_race(uint32_t nprod)
{
    wake_race *r = calloc(1, sizeof *r);
    pthread_t cons, prod[MAX_PROD];
    race_arg args[MAX_PROD];

    assert_non_null(r);
    r->nprod = nprod;
    r->rounds = env_count("CCQ_TEST_WAKE_ROUNDS", 100000);
    ccq_mpsc_init(&r->q);
    ccq_wake_init(&r->w);
    /* Start near the top so the futex word wraps during the run. */
    atomic_store(&r->w.seq, UINT32_MAX - 1000);
    atomic_init(&r->acked, 0);
    atomic_init(&r->ack_word, 0);
    atomic_init(&r->stop, 0);
    for (uint32_t p = 0; p < nprod; p++) {
        r->items[p] = malloc(r->rounds * sizeof(item));
        assert_non_null(r->items[p]);
        for (uint64_t i = 0; i < r->rounds; i++) {
            r->items[p][i].producer = p;
            r->items[p][i].seq = (uint32_t)i;
        }
    }
    assert_int_equal(pthread_barrier_init(&r->start, NULL, nprod + 1), 0);
    assert_int_equal(pthread_create(&cons, NULL, race_consumer, r), 0);
    for (uint32_t p = 0; p < nprod; p++) {
        args[p].r = r;
        args[p].id = p;
        assert_int_equal(pthread_create(&prod[p], NULL, race_producer, &args[p]), 0);
    }
    pthread_join(cons, NULL);
    for (uint32_t p = 0; p < nprod; p++)
        pthread_join(prod[p], NULL);
    pthread_barrier_destroy(&r->start);

    if (r->lost != 0)
        print_error("lost wake-up after %" PRIu64 " items (%" PRIu64 " sleeps)\n", r->received,
                    r->sleeps);
    assert_int_equal(r->lost, 0);
    assert_int_equal(r->bad, 0);
    assert_int_equal(r->received, r->rounds * nprod);
    assert_int_equal(atomic_load(&r->acked), r->rounds);
    assert_true(ccq_mpsc_empty(&r->q));
    for (uint32_t p = 0; p < nprod; p++)
        free(r->items[p]);
    free(r);
}

static void test_wake_race_1_producer(void **state)
{
    (void)state;
    run_wake_race(1);
}

static void test_wake_race_2_producers(void **state)
{
    (void)state;
    run_wake_race(2);
}

/* ---- ccq_signal ----------------------------------------------------------------------- */

typedef struct ev_test {
    ccq_signal ev;
    _Atomic uint64_t value;
    pthread_barrier_t start;
    uint64_t rounds;
    _Atomic uint64_t acks; /* waits that returned, over all waiters */
    _Atomic uint32_t stop;
} ev_test;

typedef struct ev_waiter {
    ev_test *t;
    uint64_t target;  /* single shot: wait for value >= target */
    uint64_t timeout; /* deadline from the start of the wait, ns */
    bool result;
    uint64_t elapsed;
    uint64_t lost;            /* stress: waits that took a lost-wake-up time */
    uint64_t bad;             /* stress: waits that returned false */
    _Atomic uint64_t checks;  /* levels: how often the condition was checked */
    uint32_t seed;            /* level stress: this waiter's random levels */
    _Atomic uint64_t pending; /* level stress: the level waited for, 0 none, MAX done */
} ev_waiter;

static void ev_test_init(ev_test *t)
{
    memset(t, 0, sizeof *t);
    ccq_signal_init(&t->ev);
    atomic_init(&t->value, 0);
    atomic_init(&t->acks, 0);
    atomic_init(&t->stop, 0);
}

static bool ev_reached(void *arg)
{
    ev_waiter *w = arg;
    return atomic_load_explicit(&w->t->value, memory_order_acquire) >= w->target;
}

static bool never(void *arg)
{
    (void)arg;
    return false;
}

static void *ev_wait_once(void *arg)
{
    ev_waiter *w = arg;
    pthread_barrier_wait(&w->t->start);
    uint64_t t0 = ccq_now_ns();
    w->result = ccq_signal_wait(&w->t->ev, ev_reached, w, t0 + w->timeout);
    w->elapsed = ccq_now_ns() - t0;
    atomic_fetch_add(&w->t->acks, 1);
    return NULL;
}

/* Wait (not timed: a bound only against hangs) until n waiters are registered, so the
 * notify below really has sleepers to wake. */
static void wait_for_waiters(ccq_signal *ev, uint32_t n)
{
    uint64_t deadline = ccq_now_ns() + 60ull * 1000000000ull;
    while (atomic_load(&ev->waiters) < n) {
        assert_true(ccq_now_ns() < deadline);
        sched_yield();
    }
}

static void test_event_notify_wakes_waiter(void **state)
{
    (void)state;
    ev_test t;
    ev_waiter w = {.t = &t, .target = 1, .timeout = SLEEP_NS};
    pthread_t th;

    ev_test_init(&t);
    assert_int_equal(pthread_barrier_init(&t.start, NULL, 2), 0);
    assert_int_equal(pthread_create(&th, NULL, ev_wait_once, &w), 0);
    pthread_barrier_wait(&t.start);
    wait_for_waiters(&t.ev, 1);
    atomic_store_explicit(&t.value, 1, memory_order_release);
    ccq_signal_notify(&t.ev);
    pthread_join(th, NULL);
    pthread_barrier_destroy(&t.start);
    assert_true(w.result);
    assert_true(w.elapsed < LOST_NS);
    assert_int_equal(atomic_load(&t.ev.waiters), 0);

    /* A condition already true returns at once, without registering. */
    uint64_t t0 = ccq_now_ns();
    assert_true(ccq_signal_wait(&t.ev, ev_reached, &w, UINT64_MAX));
    assert_true(ccq_now_ns() - t0 < LOST_NS);
    assert_int_equal(atomic_load(&t.ev.waiters), 0);

    /* A notify with nobody waiting is harmless. */
    ccq_signal_notify(&t.ev);
}

static void test_event_deadline(void **state)
{
    (void)state;
    ccq_signal ev;
    const uint64_t d = 30000000ull; /* 30 ms */

    ccq_signal_init(&ev);
    uint64_t t0 = ccq_now_ns();
    assert_false(ccq_signal_wait(&ev, never, NULL, t0 + d));
    uint64_t el = ccq_now_ns() - t0;
    /* It gives up only once the deadline has passed, and not much later. */
    assert_true(el >= d);
    assert_true(el < LOST_NS);
    assert_int_equal(atomic_load(&ev.waiters), 0);

    /* A deadline already in the past: one check, then false. */
    assert_false(ccq_signal_wait(&ev, never, NULL, ccq_now_ns() - 1));
    assert_false(ccq_signal_wait(&ev, never, NULL, 0));
    assert_int_equal(atomic_load(&ev.waiters), 0);

    /* The condition wins over a passed deadline. */
    ev_test t;
    memset(&t, 0, sizeof t);
    atomic_init(&t.value, 5);
    ev_waiter w = {.t = &t, .target = 5};
    assert_true(ccq_signal_wait(&ev, ev_reached, &w, 0));
}

static void test_event_many_waiters(void **state)
{
    (void)state;
    enum { N = 12 };
    ev_test t;
    ev_waiter w[N];
    pthread_t th[N];

    ev_test_init(&t);
    assert_int_equal(pthread_barrier_init(&t.start, NULL, N + 1), 0);
    for (int i = 0; i < N; i++) {
        w[i] = (ev_waiter){.t = &t, .target = 1, .timeout = SLEEP_NS};
        assert_int_equal(pthread_create(&th[i], NULL, ev_wait_once, &w[i]), 0);
    }
    pthread_barrier_wait(&t.start);
    wait_for_waiters(&t.ev, N);
    /* Nobody returns before the condition holds. */
    assert_int_equal(atomic_load(&t.acks), 0);
    atomic_store_explicit(&t.value, 1, memory_order_release);
    ccq_signal_notify(&t.ev);
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&t.start);
    for (int i = 0; i < N; i++) {
        assert_true(w[i].result);
        assert_true(w[i].elapsed < LOST_NS);
    }
    assert_int_equal(atomic_load(&t.acks), N);
    assert_int_equal(atomic_load(&t.ev.waiters), 0);
}

/* Several waiters and one notifier, many rounds: round r's waits end only when the
 * notifier publishes r; a lost notify shows as a wait that lasts the whole timeout. */
static void *ev_stress_waiter(void *arg)
{
    ev_waiter *w = arg;
    ev_test *t = w->t;

    pthread_barrier_wait(&t->start);
    for (uint64_t r = 1; r <= t->rounds; r++) {
        w->target = r;
        uint64_t t0 = ccq_now_ns();
        if (!ccq_signal_wait(&t->ev, ev_reached, w, t0 + SLEEP_NS))
            w->bad++;
        if (ccq_now_ns() - t0 >= LOST_NS) {
            w->lost++;
            atomic_store(&t->stop, 1);
            atomic_fetch_add(&t->acks, t->rounds); /* release the notifier */
            return NULL;
        }
        atomic_fetch_add_explicit(&t->acks, 1, memory_order_release);
    }
    return NULL;
}

static void test_event_stress(void **state)
{
    (void)state;
    enum { N = 3 };
    ev_test t;
    ev_waiter w[N];
    pthread_t th[N];

    ev_test_init(&t);
    t.rounds = env_count("CCQ_TEST_EVENT_ROUNDS", 20000);
    assert_int_equal(pthread_barrier_init(&t.start, NULL, N + 1), 0);
    for (int i = 0; i < N; i++) {
        w[i] = (ev_waiter){.t = &t};
        assert_int_equal(pthread_create(&th[i], NULL, ev_stress_waiter, &w[i]), 0);
    }
    pthread_barrier_wait(&t.start);
    for (uint64_t r = 1; r <= t.rounds && !atomic_load(&t.stop); r++) {
        atomic_store_explicit(&t.value, r, memory_order_release);
        ccq_signal_notify(&t.ev);
        while (atomic_load_explicit(&t.acks, memory_order_acquire) < r * N)
            sched_yield();
    }
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&t.start);
    for (int i = 0; i < N; i++) {
        assert_int_equal(w[i].lost, 0);
        assert_int_equal(w[i].bad, 0);
    }
    assert_int_equal(atomic_load(&t.ev.waiters), 0);
}

/* ---- ccq_signal levels ------------------------------------------------------------------ */

static bool lv_reached(void *arg)
{
    ev_waiter *w = arg;
    atomic_fetch_add_explicit(&w->checks, 1, memory_order_relaxed);
    return atomic_load_explicit(&w->t->value, memory_order_acquire) >= w->target;
}

static uint64_t lv_level(void *arg)
{
    return ((ev_waiter *)arg)->target;
}

static void *lv_wait_once(void *arg)
{
    ev_waiter *w = arg;
    pthread_barrier_wait(&w->t->start);
    uint64_t t0 = ccq_now_ns();
    w->result = ccq_signal_wait_level(&w->t->ev, lv_reached, lv_level, w, t0 + w->timeout, 0);
    w->elapsed = ccq_now_ns() - t0;
    return NULL;
}

/* A waiter for level 10 sleeps through notifies of 1..9 (its condition is not even checked
 * again: no wake-up) and wakes at 10; a plain notify still wakes it. */
static void test_event_level_sleeps_through(void **state)
{
    (void)state;
    ev_test t;
    ev_waiter w = {.t = &t, .target = 10, .timeout = SLEEP_NS};
    pthread_t th;

    ev_test_init(&t);
    atomic_init(&w.checks, 0);
    assert_int_equal(pthread_barrier_init(&t.start, NULL, 2), 0);
    assert_int_equal(pthread_create(&th, NULL, lv_wait_once, &w), 0);
    pthread_barrier_wait(&t.start);
    wait_for_waiters(&t.ev, 1);
    while (atomic_load(&t.ev.wake_at) != 10) /* it named its level (then checks once) */
        sched_yield();
    struct timespec ms = {0, 2000000};
    nanosleep(&ms, NULL);
    uint64_t before = atomic_load(&w.checks);
    for (uint64_t v = 1; v < 10; v++) {
        atomic_store_explicit(&t.value, v, memory_order_release);
        ccq_signal_notify_level(&t.ev, v);
    }
    nanosleep(&ms, NULL);
    assert_int_equal(atomic_load(&w.checks), before); /* not woken */
    assert_int_equal(atomic_load(&t.ev.waiters), 1);
    atomic_store_explicit(&t.value, 10, memory_order_release);
    ccq_signal_notify_level(&t.ev, 10);
    pthread_join(th, NULL);
    assert_true(w.result);
    assert_true(w.elapsed < LOST_NS);
    assert_int_equal(atomic_load(&t.ev.waiters), 0);

    /* A plain notify wakes a level waiter (it checks, and sleeps again when not there). */
    w = (ev_waiter){.t = &t, .target = 20, .timeout = SLEEP_NS};
    atomic_init(&w.checks, 0);
    assert_int_equal(pthread_create(&th, NULL, lv_wait_once, &w), 0);
    pthread_barrier_wait(&t.start);
    wait_for_waiters(&t.ev, 1);
    while (atomic_load(&t.ev.wake_at) != 20)
        sched_yield();
    nanosleep(&ms, NULL);
    before = atomic_load(&w.checks);
    ccq_signal_notify(&t.ev);
    while (atomic_load(&w.checks) == before)
        sched_yield();
    atomic_store_explicit(&t.value, 20, memory_order_release);
    ccq_signal_notify_level(&t.ev, 20);
    pthread_join(th, NULL);
    pthread_barrier_destroy(&t.start);
    assert_true(w.result);
    assert_true(w.elapsed < LOST_NS);
}

/* Waiters with levels of their own (a few ahead of the counter, random), one notifier
 * raising the counter by one at a time and going on only once every waiter whose level it
 * reached has returned: a lost wake-up is never rescued by a later notify, and shows as a
 * wait that lasts LOST_NS. */
static void *lv_stress_waiter(void *arg)
{
    ev_waiter *w = arg;
    ev_test *t = w->t;

    pthread_barrier_wait(&t->start);
    for (uint64_t r = 0; r < t->rounds && !atomic_load(&t->stop); r++) {
        w->seed = w->seed * 1103515245u + 12345u;
        w->target = atomic_load_explicit(&t->value, memory_order_acquire) + 1 + (w->seed >> 16) % 4;
        atomic_store_explicit(&w->pending, w->target, memory_order_release);
        uint64_t t0 = ccq_now_ns();
        bool ok = ccq_signal_wait_level(&t->ev, lv_reached, lv_level, w, t0 + SLEEP_NS, 0);
        if (!ok)
            w->bad++;
        if (ccq_now_ns() - t0 >= LOST_NS) {
            w->lost++;
            atomic_store(&t->stop, 1);
        }
        atomic_store_explicit(&w->pending, 0, memory_order_release);
    }
    atomic_store_explicit(&w->pending, UINT64_MAX, memory_order_release); /* done */
    return NULL;
}

static void test_event_level_stress(void **state)
{
    (void)state;
    enum { N = 4 };
    ev_test t;
    ev_waiter w[N];
    pthread_t th[N];

    ev_test_init(&t);
    t.rounds = env_count("CCQ_TEST_EVENT_ROUNDS", 20000) / 4;
    assert_int_equal(pthread_barrier_init(&t.start, NULL, N + 1), 0);
    for (int i = 0; i < N; i++) {
        w[i] = (ev_waiter){.t = &t, .seed = 7u + (uint32_t)i};
        atomic_init(&w[i].checks, 0);
        atomic_init(&w[i].pending, 0);
        assert_int_equal(pthread_create(&th[i], NULL, lv_stress_waiter, &w[i]), 0);
    }
    pthread_barrier_wait(&t.start);
    for (uint64_t v = 1;; v++) {
        atomic_store_explicit(&t.value, v, memory_order_release);
        ccq_signal_notify_level(&t.ev, v);
        /* On once no waiter waits for a level this reached; stop once all are done. */
        int done = 0;
        for (int i = 0; i < N; i++) {
            uint64_t p;
            while ((p = atomic_load_explicit(&w[i].pending, memory_order_acquire)) != 0 && p <= v)
                sched_yield();
            done += p == UINT64_MAX;
        }
        if (done == N)
            break;
    }
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&t.start);
    for (int i = 0; i < N; i++) {
        assert_int_equal(w[i].lost, 0);
        assert_int_equal(w[i].bad, 0);
    }
    assert_int_equal(atomic_load(&t.ev.waiters), 0);
}

/* ---- futex helpers ------------------------------------------------------------------- */

typedef struct futex_test {
    _Atomic uint32_t word;
    pthread_barrier_t start;
    _Atomic uint32_t woken;
} futex_test;

typedef struct futex_waiter {
    futex_test *t;
    uint64_t elapsed;
} futex_waiter;

static void *futex_wait_thread(void *arg)
{
    futex_waiter *w = arg;
    futex_test *t = w->t;
    pthread_barrier_wait(&t->start);
    uint64_t t0 = ccq_now_ns();
    /* Re-check around spurious returns, as every caller must. */
    while (atomic_load(&t->word) == 0 && ccq_now_ns() - t0 < SLEEP_NS)
        ccq_futex_wait(&t->word, 0, SLEEP_NS);
    w->elapsed = ccq_now_ns() - t0;
    atomic_fetch_add(&t->woken, 1);
    return NULL;
}

static void run_futex_wake(uint32_t n, bool all)
{
    futex_test t;
    futex_waiter w[8];
    pthread_t th[8];

    memset(&t, 0, sizeof t);
    atomic_init(&t.word, 0);
    atomic_init(&t.woken, 0);
    assert_int_equal(pthread_barrier_init(&t.start, NULL, n + 1), 0);
    for (uint32_t i = 0; i < n; i++) {
        w[i].t = &t;
        assert_int_equal(pthread_create(&th[i], NULL, futex_wait_thread, &w[i]), 0);
    }
    pthread_barrier_wait(&t.start);
    atomic_store(&t.word, 1);
    if (all) {
        ccq_futex_wake_all(&t.word);
    } else {
        /* wake_one wakes one sleeper per call; the others may not have slept yet (then
         * they see the word changed), so wake until everyone is out. */
        uint64_t deadline = ccq_now_ns() + 60ull * 1000000000ull;
        while (atomic_load(&t.woken) < n && ccq_now_ns() < deadline) {
            ccq_futex_wake_one(&t.word);
            sched_yield();
        }
    }
    for (uint32_t i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&t.start);
    for (uint32_t i = 0; i < n; i++)
        assert_true(w[i].elapsed < LOST_NS);
    assert_int_equal(atomic_load(&t.woken), n);
}

static void test_futex(void **state)
{
    (void)state;
    _Atomic uint32_t word;
    uint64_t t0, a, b;

    /* The clock is monotonic. */
    a = ccq_now_ns();
    b = ccq_now_ns();
    assert_true(b >= a);

    /* A value other than the expected one returns at once. */
    atomic_init(&word, 7);
    t0 = ccq_now_ns();
    ccq_futex_wait(&word, 6, SLEEP_NS);
    assert_true(ccq_now_ns() - t0 < LOST_NS);
    /* A timeout returns. */
    t0 = ccq_now_ns();
    ccq_futex_wait(&word, 7, 10000000ull);
    assert_true(ccq_now_ns() - t0 < LOST_NS);
    /* Wakes with nobody waiting are harmless. */
    ccq_futex_wake_one(&word);
    ccq_futex_wake_all(&word);
    assert_int_equal(atomic_load(&word), 7);

    run_futex_wake(1, false);
    run_futex_wake(4, false);
    run_futex_wake(8, true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mpsc_empty_edges),
        cmocka_unit_test(test_mpsc_stress),
        cmocka_unit_test(test_wake_protocol_single_thread),
        cmocka_unit_test(test_wake_race_1_producer),
        cmocka_unit_test(test_wake_race_2_producers),
        cmocka_unit_test(test_event_notify_wakes_waiter),
        cmocka_unit_test(test_event_deadline),
        cmocka_unit_test(test_event_many_waiters),
        cmocka_unit_test(test_event_stress),
        cmocka_unit_test(test_event_level_sleeps_through),
        cmocka_unit_test(test_event_level_stress),
        cmocka_unit_test(test_futex),
    };
    /* CCQ_TEST_FILTER=pattern runs only the matching tests (cmocka's wildcard syntax). */
    const char *filter = getenv("CCQ_TEST_FILTER");
    if (filter != NULL && *filter != '\0')
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests_name("queue", tests, NULL, NULL);
}
