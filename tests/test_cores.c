/* ccq_usable_cores (common/cores.h): what the host backend sizes its worker pool by and the
 * UCX engine compares a world's process count with. It must follow the CPU affinity (a
 * launcher's binding, taskset), not the machine's core count.
 * ccq_cpu_hop and ccq_unstack_yield: a polling thread that shares its core with another busy
 * thread moves itself to another of its cores, its affinity mask left as it was.
 * ccq_world_crowded (runtime/world.h): whether a host's processes outnumber the cores they may
 * run on together, from what each said when the world formed. */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/clock.h"
#include "common/cores.h"
#include "runtime/world.h"

/* Two CPUs this process may run on, or false. */
static bool two_cpus(int *a, int *b)
{
    cpu_set_t all;
    *a = *b = -1;
    if (sched_getaffinity(0, sizeof all, &all) != 0)
        return false;
    for (int c = 0; c < CPU_SETSIZE && *b < 0; c++)
        if (CPU_ISSET(c, &all))
            *(*a < 0 ? a : b) = c;
    return *b >= 0;
}

static void set_cpus(int a, int b)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(a, &s);
    if (b >= 0)
        CPU_SET(b, &s);
    assert_int_equal(sched_setaffinity(0, sizeof s, &s), 0);
}

/* A hop lands on another CPU and leaves the mask as it was; with one CPU it does nothing. The
 * kernel may move the thread too (between the hop and the look, under load), so most hops,
 * not all, must be seen elsewhere; a hop that moved nothing would be seen elsewhere almost
 * never. */
static void test_hop(void **state)
{
    (void)state;
    cpu_set_t all, after;
    int a, b, elsewhere = 0;

    assert_int_equal(sched_getaffinity(0, sizeof all, &all), 0);
    if (!two_cpus(&a, &b)) {
        assert_int_equal(ccq_cpu_hop(), -1);
        skip();
    }
    set_cpus(a, -1); /* now on a */
    assert_int_equal(sched_getcpu(), a);
    assert_int_equal(ccq_cpu_hop(), -1); /* one CPU: nowhere to go */
    assert_int_equal(sched_getcpu(), a);
    set_cpus(a, b);
    for (int k = 0; k < 16; k++) {
        int left = ccq_cpu_hop();
        assert_true(left == a || left == b);
        elsewhere += sched_getcpu() != left;
        assert_int_equal(sched_getaffinity(0, sizeof after, &after), 0);
        assert_int_equal(CPU_COUNT(&after), 2);
        assert_true(CPU_ISSET(a, &after) && CPU_ISSET(b, &after));
    }
    assert_true(elsewhere >= 12);
    assert_int_equal(sched_setaffinity(0, sizeof all, &all), 0);
}

/* The policy: only a run of long yields (another thread had the core) moves the thread, on a
 * coin's throw, then not again for a gap that doubles at each move up to a bound, and starts
 * small again once the thread's yields stayed short (it has a core of its own). */
static void test_unstack_policy(void **state)
{
    (void)state;
    enum { LONG = 20000, SHORT = 500, STEP = 10000 }; /* ns */
    ccq_unstack u;
    uint64_t now = 1000000000ull, last = 0, gap_seen[64];
    int moves = 0, long_in_row = 0;

    ccq_unstack_init(&u, true, 7);
    /* Short yields never move it; long ones alternating with short never either. */
    for (int k = 0; k < 5000; k++)
        assert_false(ccq_unstack_note(&u, k % 2 ? LONG : SHORT, now += STEP));
    /* Long yields only: moves, each at least 4 long yields after the last look, the gaps
     * between moves doubling from 100 us to 128 ms. */
    for (int k = 0; k < 400000 && moves < 64; k++) {
        now += STEP;
        long_in_row++;
        if (ccq_unstack_note(&u, LONG, now)) {
            assert_true(long_in_row >= 4);
            if (last != 0)
                gap_seen[moves - 1] = now - last;
            last = now;
            moves++;
            long_in_row = 0;
        }
    }
    assert_true(moves >= 12);
    for (int m = 0; m + 1 < moves - 1; m++) {
        uint64_t want = 100000ull << (m < 20 ? m : 20);
        want = want < 128000000ull ? want : 128000000ull;
        assert_true(gap_seen[m] >= want);
        assert_true(gap_seen[m] <= want + 64 * STEP); /* the coin delays a move a few looks */
    }
    /* Settled (1024 short yields in a row): the next move may come 100 us after the last. */
    for (int k = 0; k < 1024; k++)
        assert_false(ccq_unstack_note(&u, SHORT, now += STEP));
    now += 128000000ull; /* past the last gap set */
    while (!ccq_unstack_note(&u, LONG, now += STEP))
        ;
    last = now;
    while (!ccq_unstack_note(&u, LONG, now += STEP))
        ;
    assert_true(now - last >= 100000 && now - last <= 100000 + 64 * STEP);
    /* Two threads stacked both look: seeded apart, their coins differ in some looks, so one
     * moves while the other stays. */
    ccq_unstack x, y;
    int apart = 0;
    ccq_unstack_init(&x, true, 1234);
    ccq_unstack_init(&y, true, 5678);
    for (int k = 0; k < 400; k++) {
        now += 200000000ull; /* every look past its gap */
        bool mx = false, my = false;
        for (int j = 0; j < 4; j++) {
            mx = ccq_unstack_note(&x, LONG, now + (uint64_t)j);
            my = ccq_unstack_note(&y, LONG, now + (uint64_t)j);
        }
        apart += mx != my;
    }
    assert_true(apart > 100);
}

static void test_follows_affinity(void **state)
{
    (void)state;
    cpu_set_t all, one;
    int first = -1;

    assert_int_equal(sched_getaffinity(0, sizeof all, &all), 0);
    assert_int_equal(ccq_usable_cores(), (uint32_t)CPU_COUNT(&all));
    for (int c = 0; c < CPU_SETSIZE && first < 0; c++)
        if (CPU_ISSET(c, &all))
            first = c;
    assert_true(first >= 0);
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    assert_int_equal(ccq_first_usable_core(), (uint32_t)first);
    assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
    assert_int_equal(ccq_usable_cores(), 1);
    assert_int_equal(ccq_first_usable_core(), (uint32_t)first);
    {
        int a, b;
        if (sched_setaffinity(0, sizeof all, &all) == 0 && two_cpus(&a, &b)) {
            set_cpus(b, -1); /* the lowest follows the mask */
            assert_int_equal(ccq_first_usable_core(), (uint32_t)b);
        }
    }
    assert_int_equal(sched_setaffinity(0, sizeof all, &all), 0);
    assert_int_equal(ccq_usable_cores(), (uint32_t)CPU_COUNT(&all));
    /* Never more than the machine has online. */
    assert_true(ccq_usable_cores() <= (uint32_t)sysconf(_SC_NPROCESSORS_ONLN));
}

/* proc: on the machine of kernel k (its containers alike: their host ids differ), cores
 * [first, first + count). */
static ccq_world_proc proc(uint64_t k, uint32_t first, uint32_t count)
{
    static uint64_t container;
    return (ccq_world_proc){.pid = 1,
                            .host_id = ++container,
                            .kernel_id = k,
                            .start_time = 1,
                            .cores = count,
                            .first_core = first};
}

/* The host's view: the processes of this machine only, in whatever container (others and
 * their cores do not count), processes that say the same cores share them, processes bound
 * apart do not. */
static void test_world_crowded(void **state)
{
    (void)state;
    ccq_world_proc w[8];

    /* 4 processes, no binding, 2 cores: crowded; 2 of them: not. */
    for (int p = 0; p < 4; p++)
        w[p] = proc(7, 0, 2);
    assert_true(ccq_world_crowded(w, 4, 0, 2));
    assert_false(ccq_world_crowded(w, 2, 1, 2));
    /* Each bound to a core of its own (mpirun --bind-to core): 2 on 2 cores fit, though each
     * sees one core; two bound to one core do not. */
    w[0] = proc(7, 0, 1);
    w[1] = proc(7, 1, 1);
    assert_false(ccq_world_crowded(w, 2, 0, 2));
    w[1] = proc(7, 0, 1);
    assert_true(ccq_world_crowded(w, 2, 1, 2));
    /* Two hosts of 4 cores, 4 processes each, unbound: 8 processes fit (each host's 4 do);
     * 5 on one host do not, for every process of that host, and the other host's fit. */
    for (int p = 0; p < 8; p++)
        w[p] = proc(p < 4 ? 7 : 9, 0, 4);
    for (uint32_t me = 0; me < 8; me++)
        assert_false(ccq_world_crowded(w, 8, me, 4));
    w[4] = proc(7, 0, 4);
    assert_true(ccq_world_crowded(w, 8, 0, 4));
    assert_false(ccq_world_crowded(w, 8, 5, 4));
    /* Bound per socket (2 x 2 cores): 4 processes on 4 cores fit; 6 do not. */
    for (int p = 0; p < 6; p++)
        w[p] = proc(7, p % 2 ? 2 : 0, 2);
    assert_false(ccq_world_crowded(w, 4, 0, 4));
    assert_true(ccq_world_crowded(w, 6, 0, 4));
    /* Never more cores than the host has online (affinities that claim more). */
    for (int p = 0; p < 4; p++)
        w[p] = proc(7, (uint32_t)p, 4);
    assert_false(ccq_world_crowded(w, 4, 0, 0));
    assert_true(ccq_world_crowded(w, 4, 0, 2));
    /* A machine unknown (0): every process counts as this one's, as a process alone judges. */
    for (int p = 0; p < 4; p++)
        w[p] = proc(p < 2 ? 0 : 3, 0, 2);
    assert_true(ccq_world_crowded(w, 4, 0, 2));
    assert_false(ccq_world_crowded(w, 4, 2, 2));
    /* A count unknown (0) counts as one core. */
    w[0] = proc(7, 0, 0);
    w[1] = proc(7, 0, 0);
    assert_true(ccq_world_crowded(w, 2, 0, 8));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_follows_affinity),
        cmocka_unit_test(test_hop),
        cmocka_unit_test(test_unstack_policy),
        cmocka_unit_test(test_world_crowded),
    };
    return cmocka_run_group_tests_name("cores", tests, NULL, NULL);
}
