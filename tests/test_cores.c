/* ccq_usable_cores (common/cores.h): what the host backend sizes its worker pool by and the
 * UCX engine compares a world's process count with. It must follow the CPU affinity (a
 * launcher's binding, taskset), not the machine's core count.
 * ccq_cpu_hop and ccq_unstack_yield: a polling thread that shares its core with another busy
 * thread moves itself to another of its cores, its affinity mask left as it was.
 * ccq_world_crowded (runtime/world.h): whether a host's processes outnumber the cores they may
 * run on together, from what each said when the world formed.
 * ccq_cpu_limit_at: a container's cgroup CPU limit, on cgroup trees made here; with the
 * affinity it sizes the host backend's worker pool (ccq_worker_cores). */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* Keep this thread's affinity in *all (to give back) and confine it to its first two CPUs
 * (*a < *b); false (nothing changed) when it has only one. */
static bool confine_two(cpu_set_t *all, int *a, int *b)
{
    assert_int_equal(sched_getaffinity(0, sizeof *all, all), 0);
    if (!two_cpus(a, b))
        return false;
    set_cpus(*a, *b);
    return true;
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

/* The mask's count, or this process's cgroup CPU limit where that is smaller (ccq_worker_cores;
 * CI may run in a container that has one). */
static uint32_t affinity_or_limit(const cpu_set_t *set)
{
    uint32_t n = (uint32_t)CPU_COUNT(set), limit = ccq_cpu_limit(NULL, 0);
    return limit > 0 && limit < n ? limit : n;
}

/* ccq_usable_cpu_set holds exactly the cores of set (below its 1024) and counts them. */
static bool same_set(const cpu_set_t *set)
{
    uint8_t bits[CCQ_CPU_SET_BYTES];
    uint32_t n = ccq_usable_cpu_set(bits), count = 0;
    for (uint32_t c = 0; c < CCQ_CPU_SET_BYTES * 8u && c < CPU_SETSIZE; c++) {
        if (((bits[c / 8] >> (c % 8)) & 1u) != (CPU_ISSET(c, set) ? 1u : 0u))
            return false;
        count += CPU_ISSET(c, set) ? 1u : 0u;
    }
    return n == count;
}

static void test_follows_affinity(void **state)
{
    (void)state;
    cpu_set_t all, one;
    int first = -1;

    assert_int_equal(sched_getaffinity(0, sizeof all, &all), 0);
    assert_int_equal(ccq_usable_cores(), (uint32_t)CPU_COUNT(&all));
    assert_int_equal(ccq_worker_cores(), affinity_or_limit(&all));
    for (int c = 0; c < CPU_SETSIZE && first < 0; c++)
        if (CPU_ISSET(c, &all))
            first = c;
    assert_true(first >= 0);
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    assert_true(same_set(&all));
    assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
    assert_int_equal(ccq_usable_cores(), 1);
    assert_int_equal(ccq_worker_cores(), 1);
    assert_true(same_set(&one));
    {
        int a, b;
        if (sched_setaffinity(0, sizeof all, &all) == 0 && two_cpus(&a, &b)) {
            set_cpus(b, -1); /* the set follows the mask */
            CPU_ZERO(&one);
            CPU_SET(b, &one);
            assert_true(same_set(&one));
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
    ccq_world_proc p = {.pid = 1, .host_id = ++container, .kernel_id = k, .start_time = 1};
    p.cores = count;
    for (uint32_t c = first; c < first + count; c++)
        p.cpus[c / 8] |= (uint8_t)(1u << c % 8);
    return p;
}

/* proc on cores a and b (b < 0: a alone). */
static ccq_world_proc proc2(uint64_t k, int a, int b)
{
    ccq_world_proc p = proc(k, (uint32_t)a, 1);
    if (b >= 0) {
        p.cpus[b / 8] |= (uint8_t)(1u << b % 8);
        p.cores = 2;
    }
    return p;
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
    /* A set unknown (empty) counts as core 0. */
    w[0] = proc(7, 0, 0);
    w[1] = proc(7, 0, 0);
    assert_true(ccq_world_crowded(w, 2, 0, 8));
    w[1] = proc(7, 1, 1);
    assert_false(ccq_world_crowded(w, 2, 0, 8));
    /* Overlapping sets count as they overlap: cores 0-3, core 1 and core 1 again span four
     * cores, but the last two share one (before, judged by first core and count: apart). */
    w[0] = proc(7, 0, 4);
    w[1] = proc(7, 1, 1);
    w[2] = proc(7, 1, 1);
    assert_true(ccq_world_crowded(w, 3, 0, 4));
    w[2] = proc(7, 2, 1);
    assert_false(ccq_world_crowded(w, 3, 0, 4));
    /* A fit that needs a process moved: cores {0, 1} takes core 0 first, core {0} needs it. */
    w[0] = proc2(7, 0, 1);
    w[1] = proc2(7, 0, -1);
    assert_false(ccq_world_crowded(w, 2, 1, 2));
    w[2] = proc2(7, 1, -1);
    assert_true(ccq_world_crowded(w, 3, 1, 4));
    /* Apart by the set, not by first core and count: {0, 2} and {0, 1}... */
    w[0] = proc2(7, 0, 2);
    w[1] = proc2(7, 0, 1);
    w[2] = proc2(7, 0, 1);
    assert_false(ccq_world_crowded(w, 3, 0, 4));
    w[0] = proc2(7, 0, 1); /* ...and three on {0, 1} */
    assert_true(ccq_world_crowded(w, 3, 0, 4));
}

/* The scheduler's own core (ccq_core_pin): its home among the thread's cores (its first where
 * the home is not one of them); pinned and given its cores back; nothing with one core. */
static void test_core_pin(void **state)
{
    (void)state;
    cpu_set_t all, now;
    ccq_core_pin p;
    int a, b;

    assert_int_equal(sched_getaffinity(0, sizeof all, &all), 0);
    if (!two_cpus(&a, &b)) {
        ccq_core_pin_init(&p, 0);
        assert_int_equal(p.cpu, -1);
        ccq_core_pin_fini(&p);
        skip();
    }
    set_cpus(a, -1);
    ccq_core_pin_init(&p, 1);
    assert_int_equal(p.cpu, -1); /* one core: it never pins */
    assert_int_equal(p.claim, -1);
    ccq_core_pin_set(&p, true);
    assert_false(p.pinned);
    ccq_core_pin_fini(&p);
    set_cpus(a, b); /* a < b */
    for (uint32_t slot = 0; slot < 5; slot++) {
        /* Home a, b, then none (-1), a core beyond every one (both count from the first: a),
         * a again. */
        int home = slot == 2 ? -1 : slot == 3 ? CPU_SETSIZE + 5 : slot % 2 ? b : a;
        ccq_core_pin_init(&p, home);
        assert_int_equal(p.claim, 0); /* the last one's given back */
        assert_int_equal(p.cpu, home == b ? b : a);
        ccq_core_pin_set(&p, true);
        assert_true(p.pinned);
        assert_int_equal(sched_getaffinity(0, sizeof now, &now), 0);
        assert_int_equal(CPU_COUNT(&now), 1);
        assert_true(CPU_ISSET(p.cpu, &now));
        assert_int_equal(sched_getcpu(), p.cpu);
        ccq_core_pin_set(&p, true); /* already: nothing */
        assert_true(p.pinned);
        ccq_core_pin_set(&p, false);
        assert_false(p.pinned);
        assert_int_equal(sched_getaffinity(0, sizeof now, &now), 0);
        assert_int_equal(CPU_COUNT(&now), 2);
        assert_true(CPU_ISSET(a, &now) && CPU_ISSET(b, &now));
        if (slot % 2)
            ccq_core_pin_set(&p, true); /* fini unpins too */
        ccq_core_pin_fini(&p);
        assert_int_equal(sched_getaffinity(0, sizeof now, &now), 0);
        assert_int_equal(CPU_COUNT(&now), 2);
    }
    assert_int_equal(sched_setaffinity(0, sizeof all, &all), 0);
}

/* Several pins alive in one process (the schedulers of several runtimes): each claims the
 * lowest free index and takes the core that many after its home, so one process's
 * schedulers never share a core while it has as many; a freed index is taken again. */
static void test_core_pin_claims(void **state)
{
    (void)state;
    cpu_set_t all;
    ccq_core_pin p[3], q;
    int a, b;

    if (!confine_two(&all, &a, &b))
        skip();
    for (int k = 0; k < 3; k++) {
        ccq_core_pin_init(&p[k], b);
        assert_int_equal(p[k].claim, k);
        assert_int_equal(p[k].cpu, k % 2 ? a : b); /* k after b */
    }
    ccq_core_pin_fini(&p[1]);
    ccq_core_pin_init(&q, a);
    assert_int_equal(q.claim, 1);
    assert_int_equal(q.cpu, b);
    ccq_core_pin_fini(&q);
    ccq_core_pin_fini(&p[0]);
    ccq_core_pin_fini(&p[2]);
    ccq_core_pin_init(&q, a);
    assert_int_equal(q.claim, 0);
    ccq_core_pin_fini(&q);
    assert_int_equal(sched_setaffinity(0, sizeof all, &all), 0);
}

/* A pin the system refuses (here a core that does not exist; in use a cpuset that changed under
 * the process) leaves the thread as it was and is not tried again at every batch; nor is an
 * unpin it refuses. */
static void test_core_pin_refused(void **state)
{
    (void)state;
    cpu_set_t all, now;
    ccq_core_pin p;
    int a, b;

    if (sysconf(_SC_NPROCESSORS_CONF) >= CPU_SETSIZE || !confine_two(&all, &a, &b))
        skip();
    ccq_core_pin_init(&p, a);
    assert_int_equal(p.cpu, a);
    p.cpu = CPU_SETSIZE - 1; /* beyond every core the kernel has */
    ccq_core_pin_set(&p, true);
    assert_false(p.pinned);
    assert_int_equal(p.cpu, -1);
    assert_int_equal(sched_getaffinity(0, sizeof now, &now), 0);
    assert_int_equal(CPU_COUNT(&now), 2);
    ccq_core_pin_set(&p, true); /* given up: nothing */
    assert_false(p.pinned);
    ccq_core_pin_fini(&p);
    /* An unpin refused (here a mask of no core) leaves the thread on its core, given up too:
     * before, every batch made the failing call again. */
    ccq_core_pin_init(&p, b);
    ccq_core_pin_set(&p, true);
    assert_true(p.pinned);
    memset(p.mask, 0, sizeof p.mask);
    ccq_core_pin_set(&p, false);
    assert_false(p.pinned);
    assert_int_equal(p.cpu, -1);
    assert_int_equal(sched_getaffinity(0, sizeof now, &now), 0);
    assert_int_equal(CPU_COUNT(&now), 1);
    assert_true(CPU_ISSET(b, &now));
    ccq_core_pin_set(&p, true); /* nothing either way */
    ccq_core_pin_set(&p, false);
    assert_int_equal(sched_getaffinity(0, sizeof now, &now), 0);
    assert_int_equal(CPU_COUNT(&now), 1);
    ccq_core_pin_fini(&p);
    assert_int_equal(sched_setaffinity(0, sizeof all, &all), 0);
}

/* The core each process of a host pins its scheduler to: the most confined first, each the
 * core of its set the fewest took before it; machines apart. */
static void test_world_home_core(void **state)
{
    (void)state;
    ccq_world_proc w[8];
    static const int twos[] = {0, 1, 0, 1}, sockets[] = {0, 2, 1, 3, 0, 2};
    static const int bound[] = {0, 0, 1, 1}, one_bound[] = {2, 0, 1, 3};

    for (int p = 0; p < 4; p++) /* 4 unbound processes of one machine of 2 cores */
        w[p] = proc(7, 0, 2);
    for (uint32_t me = 0; me < 4; me++)
        assert_int_equal(ccq_world_home_core(w, 4, me), twos[me]);
    /* Two machines alternating: each counts its own. */
    for (int p = 0; p < 8; p++)
        w[p] = proc(p % 2 ? 9 : 7, 0, 4);
    for (uint32_t me = 0; me < 8; me++)
        assert_int_equal(ccq_world_home_core(w, 8, me), (int)me / 2);
    /* Bound per socket (cores 0-1, 2-3 alternating): each socket's processes apart. */
    for (int p = 0; p < 6; p++)
        w[p] = proc(7, p % 2 ? 2 : 0, 2);
    for (uint32_t me = 0; me < 6; me++)
        assert_int_equal(ccq_world_home_core(w, 6, me), sockets[me]);
    /* Two bound to core 0, two free on cores 0-1: the free ones take core 1 (by first core
     * and count, the first of them took core 0, three on it). */
    w[0] = proc(7, 0, 1);
    w[1] = proc(7, 0, 1);
    w[2] = proc(7, 0, 2);
    w[3] = proc(7, 0, 2);
    for (uint32_t me = 0; me < 4; me++)
        assert_int_equal(ccq_world_home_core(w, 4, me), bound[me]);
    /* One bound to core 2 of four: the others leave it to it. */
    for (int p = 0; p < 4; p++)
        w[p] = proc(7, 0, 4);
    w[0] = proc(7, 2, 1);
    for (uint32_t me = 0; me < 4; me++)
        assert_int_equal(ccq_world_home_core(w, 4, me), one_bound[me]);
    w[1] = proc(7, 0, 0); /* a set unknown: no core */
    assert_int_equal(ccq_world_home_core(w, 4, 1), -1);
}

/* ---- cgroup CPU limits, on trees made here (ccq_cpu_limit_at) ----------------------------- */

static char tree[64];

static void put(const char *rel, const char *text)
{
    char path[256], cmd[300], *slash;
    snprintf(path, sizeof path, "%s/%s", tree, rel);
    slash = strrchr(path, '/');
    *slash = '\0'; /* mkdir -p of the file's directory */
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", path);
    *slash = '/';
    assert_int_equal(system(cmd), 0);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* The limit of the tree with /proc/self/cgroup saying `self`; where, relative to the tree. */
static uint32_t limit_of(const char *self, char *where, size_t len)
{
    char file[128], w[512];
    uint32_t n;
    snprintf(file, sizeof file, "%s/self-cgroup", tree);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fputs(self, f);
    fclose(f);
    n = ccq_cpu_limit_at(file, tree, w, sizeof w);
    snprintf(where, len, "%s", strncmp(w, tree, strlen(tree)) == 0 ? w + strlen(tree) : w);
    return n;
}

static void new_tree(void)
{
    char cmd[128];
    if (tree[0] != '\0') {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tree);
        assert_int_equal(system(cmd), 0);
    }
    snprintf(tree, sizeof tree, "/tmp/ccq-cgroup-XXXXXX");
    assert_non_null(mkdtemp(tree));
}

/* A container's CPU limit caps the cores its processes count (Kubernetes limits.cpu, docker
 * --cpus), whatever their affinity shows: cgroup v2 (the cgroup's cpu.max or an ancestor's,
 * the smallest), v1 (cpu.cfs_quota_us over cpu.cfs_period_us), the hybrid layout, a
 * container's own cgroup mounted at the root; rounded up; none where no limit is set. */
static void test_cpu_limit(void **state)
{
    char where[512];
    (void)state;

    /* cgroup v2, a pod's limit of 2 above its container's "max". */
    new_tree();
    put("cgroup.controllers", "cpu memory\n");
    put("kubepods/pod1/cpu.max", "200000 100000\n");
    put("kubepods/pod1/c1/cpu.max", "max 100000\n");
    assert_int_equal(limit_of("0::/kubepods/pod1/c1\n", where, sizeof where), 2);
    assert_string_equal(where, "/kubepods/pod1");
    /* The container's own, tighter, rounded up: 1.5 -> 2; then 0.5 -> 1. */
    put("kubepods/pod1/c1/cpu.max", "150000 100000\n");
    assert_int_equal(limit_of("0::/kubepods/pod1/c1\n", where, sizeof where), 2);
    put("kubepods/pod1/c1/cpu.max", "50000 100000\n");
    assert_int_equal(limit_of("0::/kubepods/pod1/c1\n", where, sizeof where), 1);
    assert_string_equal(where, "/kubepods/pod1/c1");
    /* A cgroup namespace: the path is "/" and the root is the container's cgroup. */
    put("cpu.max", "300000 100000\n");
    assert_int_equal(limit_of("0::/\n", where, sizeof where), 3);
    /* No namespace, but its own cgroup mounted at the root (the path is not there). */
    assert_int_equal(limit_of("0::/system.slice/docker-1.scope\n", where, sizeof where), 3);
    assert_string_equal(where, "");
    /* No limit anywhere. */
    new_tree();
    put("cgroup.controllers", "cpu\n");
    put("a/cpu.max", "max 100000\n");
    assert_int_equal(limit_of("0::/a\n", where, sizeof where), 0);
    assert_string_equal(where, "");

    /* The hybrid layout: v2 under "unified", the cpu controller in v1 (this VM's). */
    new_tree();
    put("unified/a/cpu.max", "100000 100000\n");
    put("cpu/a/cpu.cfs_quota_us", "-1\n");
    put("cpu/a/cpu.cfs_period_us", "100000\n");
    assert_int_equal(limit_of("1:cpu:/a\n0::/a\n", where, sizeof where), 1);
    assert_string_equal(where, "/unified/a");
    /* v1 alone, mounted as "cpu,cpuacct", 2.5 -> 3. */
    new_tree();
    put("cpu,cpuacct/docker/x/cpu.cfs_quota_us", "250000\n");
    put("cpu,cpuacct/docker/x/cpu.cfs_period_us", "100000\n");
    assert_int_equal(limit_of("4:cpu,cpuacct:/docker/x\n1:memory:/docker/x\n", where, sizeof where),
                     3);
    assert_string_equal(where, "/cpu,cpuacct/docker/x");
    /* v1, "-1": none; the container's own cgroup at the mount's root, found by walking up. */
    put("cpu,cpuacct/docker/x/cpu.cfs_quota_us", "-1\n");
    assert_int_equal(limit_of("4:cpu,cpuacct:/docker/x\n", where, sizeof where), 0);
    put("cpu,cpuacct/cpu.cfs_quota_us", "100000\n");
    put("cpu,cpuacct/cpu.cfs_period_us", "100000\n");
    assert_int_equal(limit_of("4:cpu,cpuacct:/docker/y\n", where, sizeof where), 1);
    /* Lines it cannot read are skipped; "cpuacct" alone is not "cpu"; no file: none. */
    assert_int_equal(limit_of("garbage\n2:cpuacct:/docker/x\n::\n", where, sizeof where), 0);
    assert_int_equal(ccq_cpu_limit_at("/nonexistent/cgroup", tree, where, sizeof where), 0);
    new_tree();
    rmdir(tree);
    tree[0] = '\0';
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_follows_affinity), cmocka_unit_test(test_hop),
        cmocka_unit_test(test_unstack_policy),   cmocka_unit_test(test_world_crowded),
        cmocka_unit_test(test_cpu_limit),        cmocka_unit_test(test_core_pin),
        cmocka_unit_test(test_core_pin_claims),  cmocka_unit_test(test_core_pin_refused),
        cmocka_unit_test(test_world_home_core),
    };
    return cmocka_run_group_tests_name("cores", tests, NULL, NULL);
}
