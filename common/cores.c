/* (cores.h) */
#define _GNU_SOURCE
#include "common/cores.h"

#include <sched.h>
#include <unistd.h>

#include "common/clock.h"

/* A yield with nobody else runnable is one system call (0.3-0.5 us on the VMs measured); one
 * that let another thread run returns after that thread's turn (several us). */
#define UNSTACK_LONG_NS 4000u
#define UNSTACK_AFTER   4u
/* After a move the next waits UNSTACK_GAP_NS, doubled at each move up to UNSTACK_GAP_MAX_NS
 * (where moving does not help, e.g. every core busy, the thread soon stops trying), and back to
 * the start once UNSTACK_SETTLED yields in a row were short (it found a core of its own). */
#define UNSTACK_GAP_NS     100000u
#define UNSTACK_GAP_MAX_NS 128000000u
#define UNSTACK_SETTLED    1024u

uint32_t ccq_usable_cores(void)
{
    cpu_set_t set;
    long n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    if (n <= 0)
        n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (uint32_t)n : 1u;
}

uint32_t ccq_first_usable_core(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0)
        return 0;
    for (uint32_t c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set))
            return c;
    return 0;
}

int ccq_cpu_hop(void)
{
    cpu_set_t mask, others;
    int cpu = sched_getcpu();
    if (cpu < 0 || cpu >= CPU_SETSIZE || sched_getaffinity(0, sizeof mask, &mask) != 0 ||
        !CPU_ISSET(cpu, &mask) || CPU_COUNT(&mask) < 2)
        return -1;
    others = mask;
    CPU_CLR(cpu, &others);
    /* The kernel moves a thread whose mask loses its core before the call returns; the mask
     * restored, nothing pulls it back while its new core is not busier. */
    if (sched_setaffinity(0, sizeof others, &others) != 0)
        return -1;
    (void)sched_setaffinity(0, sizeof mask, &mask);
    return cpu;
}

void ccq_unstack_init(ccq_unstack *u, bool enabled, uint32_t seed)
{
    u->enabled = enabled;
    u->long_yields = 0;
    u->short_yields = 0;
    u->coin = seed * 2654435761u + 1u;
    u->gap_ns = UNSTACK_GAP_NS;
    u->next_hop_ns = 0;
}

bool ccq_unstack_note(ccq_unstack *u, uint64_t yield_ns, uint64_t now_ns)
{
    if (yield_ns < UNSTACK_LONG_NS) {
        u->long_yields = 0;
        if (++u->short_yields >= UNSTACK_SETTLED)
            u->gap_ns = UNSTACK_GAP_NS;
        return false;
    }
    u->short_yields = 0;
    if (++u->long_yields < UNSTACK_AFTER || now_ns < u->next_hop_ns)
        return false;
    u->long_yields = 0;
    u->coin = u->coin * 1664525u + 1013904223u;
    if ((u->coin >> 16) & 1u) /* the other one's turn, perhaps: look again */
        return false;
    u->next_hop_ns = now_ns + u->gap_ns;
    u->gap_ns = u->gap_ns < UNSTACK_GAP_MAX_NS / 2 ? 2 * u->gap_ns : UNSTACK_GAP_MAX_NS;
    return true;
}

void ccq_unstack_yield(ccq_unstack *u)
{
    if (!u->enabled) {
        sched_yield();
        return;
    }
    uint64_t t0 = ccq_now_ns();
    sched_yield();
    uint64_t t1 = ccq_now_ns();
    if (ccq_unstack_note(u, t1 - t0, t1))
        (void)ccq_cpu_hop();
}
