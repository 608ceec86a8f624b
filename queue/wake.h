/* Sleeping and waking without lost wake-ups: futex words, the consumer's sleep flag and a
 * broadcast "something changed" event for waiters. Linux only (futex). */
#ifndef CCQ_QUEUE_WAKE_H
#define CCQ_QUEUE_WAKE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <ck_pr.h>

#include "queue/tsan.h"

#include "common/clock.h" /* deadlines are on ccq_now_ns() */

/* One step of a bounded polling loop: a few hundred nanoseconds of `pause`, and every
 * eighth step a sched_yield(), so a poller never keeps a runnable thread (often the one
 * doing the work it waits for) off a core when the machine has more threads than cores. */
void ccq_spin_step(unsigned *step);
/* The same with `pauses` pauses per step and a yield every yield_mask + 1 steps (a power of
 * two): ccq_spin_step is (32, 7); the scheduler polling an engine takes shorter steps
 * (runtime/sched.c, sched_poll_step). */
void ccq_spin_step_n(unsigned *step, unsigned pauses, unsigned yield_mask);

/* Block while *word == expected, at most timeout_ns (UINT64_MAX = no limit). Returns
 * early on a wake, a changed value or a signal; callers re-check their condition. */
void ccq_futex_wait(_Atomic uint32_t *word, uint32_t expected, uint64_t timeout_ns);
void ccq_futex_wake_one(_Atomic uint32_t *word);
void ccq_futex_wake_all(_Atomic uint32_t *word);

/*
 * ccq_wake: one consumer (the scheduler) sleeps; any thread wakes it.
 *
 * Protocol (a Dekker pair, so no wake-up is ever lost):
 *   consumer: s = ccq_wake_prepare(w)   -- reads seq, then sets sleeping = 1 (full barrier)
 *             if any work is visible: ccq_wake_cancel(w); else ccq_wake_sleep(w, s, t)
 *   producer: publish the work (an atomic RMW, e.g. the queue CAS), then ccq_wake_signal(w)
 * Either the producer's load of `sleeping` sees 1 and it wakes the consumer, or the
 * consumer's re-check after setting `sleeping` sees the work. A wake that lands between
 * the consumer's check and its futex wait bumps `seq`, so the wait returns at once.
 * While the consumer is awake a signal costs one plain load: no system call, no RMW.
 */
typedef struct ccq_wake {
    _Atomic uint32_t seq;      /* futex word; bumped by every wake */
    _Atomic uint32_t sleeping; /* 1 from prepare until the consumer is awake again */
} ccq_wake;

static inline void ccq_wake_init(ccq_wake *w)
{
    atomic_init(&w->seq, 0);
    atomic_init(&w->sleeping, 0);
}

static inline uint32_t ccq_wake_prepare(ccq_wake *w)
{
    uint32_t s = atomic_load_explicit(&w->seq, memory_order_acquire);
    /* The exchange is a full barrier: the store of `sleeping` is ordered before the
     * consumer's following loads of its work sources (StoreLoad). */
    atomic_exchange_explicit(&w->sleeping, 1, memory_order_seq_cst);
    return s;
}

static inline void ccq_wake_cancel(ccq_wake *w)
{
    atomic_store_explicit(&w->sleeping, 0, memory_order_relaxed);
}

static inline void ccq_wake_sleep(ccq_wake *w, uint32_t s, uint64_t timeout_ns)
{
    ccq_futex_wait(&w->seq, s, timeout_ns);
    atomic_store_explicit(&w->sleeping, 0, memory_order_relaxed);
}

/* Slow path of ccq_wake_signal: only the producer that clears `sleeping` calls futex. */
void ccq_wake_signal_slow(ccq_wake *w);

/* Call after publishing work with an atomic read-modify-write. */
static inline void ccq_wake_signal(ccq_wake *w)
{
    /* Orders the publishing RMW before the load of `sleeping` (StoreLoad). Atomic RMWs
     * are serialising on x86, where this is only a compiler barrier; elsewhere ck emits
     * the fence the architecture needs. */
    ck_pr_fence_atomic_load();
#ifdef CCQ_TSAN
    /* TSan does not model fences; a seq_cst load keeps its view consistent. */
    if (atomic_load_explicit(&w->sleeping, memory_order_seq_cst))
#else
    if (atomic_load_explicit(&w->sleeping, memory_order_relaxed))
#endif
        ccq_wake_signal_slow(w);
}

/* Wake for publishers that did not use an atomic RMW: the seq_cst RMW on `sleeping` is the
 * full barrier (a fence would do too, but ThreadSanitizer does not model fences). */
static inline void ccq_wake_signal_fenced(ccq_wake *w)
{
    if (atomic_fetch_add_explicit(&w->sleeping, 0, memory_order_seq_cst))
        ccq_wake_signal_slow(w);
}

/*
 * ccq_signal: many waiters wait for a condition that one thread makes true.
 *   waiter:   ccq_signal_wait(ev, pred, arg, deadline_ns)
 *   notifier: make the condition true (release store), then ccq_signal_notify(ev)
 * The notifier's store and its read of `waiters` are ordered by a seq_cst RMW, as are the
 * waiter's increment of `waiters` and its check of the condition, so either the waiter
 * sees the condition or the notifier sees the waiter and bumps `gen` (the futex word).
 * A notify with no waiters costs one uncontended locked instruction.
 *
 * Levels: where the condition is "a counter the notifier raises reached some value" (a
 * stream's ended count: a fence's target, room in the queue), a waiter can name that value
 * (ccq_signal_wait_level) and the notifier say how far the counter is now
 * (ccq_signal_notify_level): only a notify that reaches the lowest level a sleeper named
 * wakes anyone. A fence over 20 commands then sleeps through 19 of their ends instead of
 * being woken, re-checking and sleeping again at each (a system call for the notifier and
 * a context switch that takes the core from the thread doing the work, per command).
 *   waiter, every round: g = gen; wake_at = min(wake_at, level) (seq_cst); check; sleep on g
 *   notifier:            if waiters and level >= wake_at: wake_at = MAX; gen++; wake all
 * A waiter whose level a wake did not reach names it again in its next round. If the
 * notifier's reset of wake_at comes after a waiter named its level, the notifier's gen++
 * follows it too, so that waiter's sleep on its older g returns at once: no level is lost.
 * Plain waiters name level 0 (every notify wakes them); ccq_signal_notify wakes everyone.
 */
typedef struct ccq_signal {
    _Atomic uint32_t gen;
    _Atomic uint32_t waiters;
    _Atomic uint64_t wake_at; /* lowest level a waiter named since the last wake */
} ccq_signal;

static inline void ccq_signal_init(ccq_signal *ev)
{
    atomic_init(&ev->gen, 0);
    atomic_init(&ev->waiters, 0);
    atomic_init(&ev->wake_at, UINT64_MAX);
}

void ccq_signal_notify_slow(ccq_signal *ev);

static inline void ccq_signal_notify(ccq_signal *ev)
{
    /* A seq_cst read-modify-write of `waiters` orders the caller's preceding store before
     * this read of the count (a full barrier, like a fence, but visible to TSan). Either
     * it sees the waiter's increment, or the waiter's increment (seq_cst) comes later and
     * the waiter's check then sees the condition. */
    if (atomic_fetch_add_explicit(&ev->waiters, 0, memory_order_seq_cst))
        ccq_signal_notify_slow(ev);
}

/* The counter the waiters' levels are on is now `level` (stored with release before). */
static inline void ccq_signal_notify_level(ccq_signal *ev, uint64_t level)
{
    if (atomic_fetch_add_explicit(&ev->waiters, 0, memory_order_seq_cst) &&
        level >= atomic_load_explicit(&ev->wake_at, memory_order_seq_cst))
        ccq_signal_notify_slow(ev);
}

/* Wait until pred(arg) is true or deadline_ns (ccq_now_ns() clock; UINT64_MAX = none)
 * passes. Returns pred's last value. Spins a few hundred nanoseconds first (no longer: it
 * must not burn a core), then sleeps on the futex. */
bool ccq_signal_wait(ccq_signal *ev, bool (*pred)(void *), void *arg, uint64_t deadline_ns);

/* The same with an explicit polling budget (0 = sleep at once). */
bool ccq_signal_wait_spin(ccq_signal *ev, bool (*pred)(void *), void *arg, uint64_t deadline_ns,
                          uint64_t spin_ns);

/* The same, woken only by notifies that reach level(arg) (re-read every round: the level
 * may move) or by plain notifies. pred must become true no earlier than that level. */
bool ccq_signal_wait_level(ccq_signal *ev, bool (*pred)(void *), uint64_t (*level)(void *),
                           void *arg, uint64_t deadline_ns, uint64_t spin_ns);

/* The same with options: CCQ_WAIT_HANDOFF yields once after the first spin step (a waiter
 * that just handed work to a thread that may need this core; see wake.c). */
#define CCQ_WAIT_HANDOFF 1u
bool ccq_signal_wait_level_flags(ccq_signal *ev, bool (*pred)(void *), uint64_t (*level)(void *),
                                 void *arg, uint64_t deadline_ns, uint64_t spin_ns, unsigned flags);

#endif /* CCQ_QUEUE_WAKE_H */
