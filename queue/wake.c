/* Futex-based sleep/wake primitives (see wake.h for the protocols). */
#define _GNU_SOURCE
#include "queue/wake.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

void ccq_spin_step_n(unsigned *step, unsigned pauses, unsigned yield_mask)
{
    for (unsigned k = 0; k < pauses; k++)
        ck_pr_stall();
    if ((++*step & yield_mask) == 0)
        sched_yield();
}

void ccq_spin_step(unsigned *step)
{
    ccq_spin_step_n(step, 32, 7);
}

void ccq_futex_wait(_Atomic uint32_t *word, uint32_t expected, uint64_t timeout_ns)
{
    struct timespec ts, *tsp = NULL;

    if (timeout_ns != UINT64_MAX) {
        ts.tv_sec = (time_t)(timeout_ns / 1000000000ull);
        ts.tv_nsec = (long)(timeout_ns % 1000000000ull);
        tsp = &ts;
    }
    /* EAGAIN (value changed), EINTR and ETIMEDOUT all mean "re-check"; nothing to do. */
    (void)syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expected, tsp, NULL, 0);
}

void ccq_futex_wake_one(_Atomic uint32_t *word)
{
    (void)syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

void ccq_futex_wake_all(_Atomic uint32_t *word)
{
    (void)syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

void ccq_wake_signal_slow(ccq_wake *w)
{
    /* Only the thread that flips `sleeping` from 1 to 0 pays for the system call; the
     * others know the consumer will re-check all work sources once it runs. */
    if (atomic_exchange_explicit(&w->sleeping, 0, memory_order_acq_rel) == 1) {
        atomic_fetch_add_explicit(&w->seq, 1, memory_order_release);
        ccq_futex_wake_one(&w->seq);
    }
}

void ccq_signal_notify_slow(ccq_signal *ev)
{
    /* Every sleeper wakes and names its level again: forget the old ones first (see
     * wake.h, Levels, for why this order loses none). */
    atomic_store_explicit(&ev->wake_at, UINT64_MAX, memory_order_seq_cst);
    atomic_fetch_add_explicit(&ev->gen, 1, memory_order_seq_cst);
    ccq_futex_wake_all(&ev->gen);
}

/* How long a waiter polls before it sleeps on the futex. */
#define CCQ_WAIT_SPIN_NS 20000u

bool ccq_signal_wait(ccq_signal *ev, bool (*pred)(void *), void *arg, uint64_t deadline_ns)
{
    return ccq_signal_wait_spin(ev, pred, arg, deadline_ns, CCQ_WAIT_SPIN_NS);
}

bool ccq_signal_wait_spin(ccq_signal *ev, bool (*pred)(void *), void *arg, uint64_t deadline_ns,
                          uint64_t spin_ns)
{
    return ccq_signal_wait_level(ev, pred, NULL, arg, deadline_ns, spin_ns);
}

/* Lower ev->wake_at to at most lv. */
static void name_level(ccq_signal *ev, uint64_t lv)
{
    uint64_t cur = atomic_load_explicit(&ev->wake_at, memory_order_relaxed);
    while (lv < cur && !atomic_compare_exchange_weak_explicit(
                           &ev->wake_at, &cur, lv, memory_order_seq_cst, memory_order_relaxed))
        ;
    if (lv >= cur) /* a full barrier all the same: the check that follows is ordered after */
        atomic_fetch_add_explicit(&ev->wake_at, 0, memory_order_seq_cst);
}

bool ccq_signal_wait_level(ccq_signal *ev, bool (*pred)(void *), uint64_t (*level)(void *),
                           void *arg, uint64_t deadline_ns, uint64_t spin_ns)
{
    return ccq_signal_wait_level_flags(ev, pred, level, arg, deadline_ns, spin_ns, 0);
}

bool ccq_signal_wait_level_flags(ccq_signal *ev, bool (*pred)(void *), uint64_t (*level)(void *),
                                 void *arg, uint64_t deadline_ns, uint64_t spin_ns, unsigned flags)
{
    bool ok;
    uint64_t spin_end = 0;

    /* A short optimistic spin: small operations complete within microseconds, and sleeping
     * costs two system calls plus a wake-up (tens of microseconds on a busy machine).
     * Bounded by spin_ns and yielding, so a long wait does not burn a core. */
    for (unsigned step = 0; spin_ns > 0;) {
        if (pred(arg))
            return true;
        /* CCQ_WAIT_HANDOFF, not done after one step (~1 us): give the core away once, at
         * once rather than at the 8th step. Such a waiter has just handed work to another
         * thread (a fence after a submission: the scheduler); where threads outnumber cores
         * that thread may be waiting for this very core, and each step spun delays it. Where
         * a core is free the yield costs one system call: in one process a back-to-back
         * fence paid it (0.8x), so the runtime asks for it only across processes
         * (docs/performance.md, "A waiter's first yield"). */
        if (step == 1 && (flags & CCQ_WAIT_HANDOFF))
            sched_yield();
        ccq_spin_step(&step);
        uint64_t now = ccq_now_ns();
        if (spin_end == 0)
            spin_end = now + spin_ns;
        else if (now >= spin_end || now >= deadline_ns)
            break;
    }

    atomic_fetch_add_explicit(&ev->waiters, 1, memory_order_seq_cst);
    for (;;) {
        uint32_t g = atomic_load_explicit(&ev->gen, memory_order_acquire);
        /* Done already (woken by the notify that made it true): leave without naming a
         * level, which would stay behind and cost the next notify a needless wake. */
        if (level != NULL && pred(arg)) {
            ok = true;
            break;
        }
        /* After reading gen: a wake that forgets this level bumps gen after, so the sleep
         * below returns at once and the next round names it again. */
        name_level(ev, level != NULL ? level(arg) : 0);
        /* waiters++ and the level (seq_cst) are ordered before this check; see wake.h. */
        ok = pred(arg);
        if (ok)
            break;
        uint64_t now = ccq_now_ns();
        if (deadline_ns != UINT64_MAX && now >= deadline_ns)
            break;
        ccq_futex_wait(&ev->gen, g, deadline_ns == UINT64_MAX ? UINT64_MAX : deadline_ns - now);
    }
    atomic_fetch_sub_explicit(&ev->waiters, 1, memory_order_relaxed);
    return ok;
}
