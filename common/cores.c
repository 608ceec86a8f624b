/* (cores.h) */
#define _GNU_SOURCE
#include "common/cores.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
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

uint32_t ccq_worker_cores(void)
{
    uint32_t n = ccq_usable_cores(), limit = ccq_cpu_limit(NULL, 0);
    return limit > 0 && limit < n ? limit : n;
}

/* ---- A cgroup's CPU limit ----------------------------------------------------------------- */

/* Cores of quota per period, rounded up (a limit of 1.5 lets two threads run at 3/4 each). */
static uint32_t quota_cores(long long quota, long long period)
{
    if (quota <= 0 || period <= 0)
        return 0;
    long long n = (quota + period - 1) / period;
    return n > (long long)UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

/* The first line of dir/name, or false. */
static bool read_line(const char *dir, const char *name, char *text, size_t len)
{
    char file[PATH_MAX + 32];
    FILE *f;
    bool ok;

    snprintf(file, sizeof file, "%s/%s", dir, name);
    if ((f = fopen(file, "re")) == NULL)
        return false;
    ok = fgets(text, (int)len, f) != NULL;
    fclose(f);
    return ok;
}

/* One cgroup directory's limit: v2 "cpu.max" ("max 100000" or "QUOTA PERIOD"), v1
 * "cpu.cfs_quota_us" (-1: none) over "cpu.cfs_period_us". 0: none, or no such files. */
static uint32_t dir_limit(const char *dir, bool v2)
{
    char text[64], text2[64];
    long long quota = 0, period = 0;

    if (v2) {
        if (!read_line(dir, "cpu.max", text, sizeof text) ||
            sscanf(text, "%lld %lld", &quota, &period) != 2) /* "max ...": none */
            return 0;
    } else if (!read_line(dir, "cpu.cfs_quota_us", text, sizeof text) ||
               !read_line(dir, "cpu.cfs_period_us", text2, sizeof text2) ||
               sscanf(text, "%lld", &quota) != 1 || sscanf(text2, "%lld", &period) != 1) {
        return 0;
    }
    return quota_cores(quota, period);
}

/* The smallest limit of dir and its ancestors down to (and with) base; where = the
 * directory it comes from. */
static uint32_t walk_up(const char *base, const char *path, bool v2, uint32_t best, char *where,
                        size_t len)
{
    char dir[PATH_MAX];
    size_t blen = strlen(base);
    int n = snprintf(dir, sizeof dir, "%s%s%s", base, path[0] == '/' ? "" : "/", path);
    size_t dlen = (size_t)n;

    if (n < 0 || dlen >= sizeof dir)
        return best;
    while (dlen > blen && dir[dlen - 1] == '/')
        dir[--dlen] = '\0';
    /* From the cgroup's own directory up to base, each ancestor cut off at its last '/'. */
    for (;;) {
        uint32_t lim = dir_limit(dir, v2);
        if (lim > 0 && (best == 0 || lim < best)) {
            best = lim;
            if (where != NULL && len > 0)
                snprintf(where, len, "%s", dir);
        }
        char *slash = strrchr(dir, '/');
        if (dlen <= blen || slash == NULL || (size_t)(slash - dir) < blen)
            break;
        *slash = '\0';
        dlen = (size_t)(slash - dir);
    }
    return best;
}

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Whether the comma-separated list holds `name`. */
static bool lists(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *c = list; *c != '\0';) {
        const char *e = strchr(c, ',');
        size_t l = e ? (size_t)(e - c) : strlen(c);
        if (l == n && strncmp(c, name, n) == 0)
            return true;
        c += l + (e ? 1 : 0);
    }
    return false;
}

uint32_t ccq_cpu_limit_at(const char *proc_cgroup, const char *root, char *where, size_t len)
{
    char line[PATH_MAX + 64], base[PATH_MAX + 64];
    uint32_t best = 0;
    FILE *f = fopen(proc_cgroup, "re");

    if (where != NULL && len > 0)
        where[0] = '\0';
    if (f == NULL)
        return 0;
    /* "ID:CONTROLLERS:PATH" per hierarchy; v2's is "0::PATH". The path is the cgroup's under
     * its hierarchy's root, which a container sees mounted at root (with a cgroup namespace
     * the path is "/" and the mount is its own cgroup; without, the mount may still be its
     * own cgroup: then the path's directories do not exist under it and walking up ends at
     * the mount's own files). */
    while (fgets(line, sizeof line, f) != NULL) {
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL, *path;
        if (c2 == NULL)
            continue;
        *c1 = *c2 = '\0';
        path = c2 + 1;
        path[strcspn(path, "\n")] = '\0';
        if (c1[1] == '\0' && strcmp(line, "0") == 0) { /* v2 (or hybrid: under "unified") */
            snprintf(base, sizeof base, "%s/cgroup.controllers", root);
            if (access(base, F_OK) == 0)
                snprintf(base, sizeof base, "%s", root);
            else
                snprintf(base, sizeof base, "%s/unified", root);
            best = walk_up(base, path, true, best, where, len);
        } else if (lists(c1 + 1, "cpu")) { /* v1: mounted as its controllers, or cpu alone */
            snprintf(base, sizeof base, "%s/%s", root, c1 + 1);
            if (!is_dir(base))
                snprintf(base, sizeof base, "%s/cpu", root);
            best = walk_up(base, path, false, best, where, len);
        }
    }
    fclose(f);
    return best;
}

uint32_t ccq_cpu_limit(char *where, size_t len)
{
    return ccq_cpu_limit_at("/proc/self/cgroup", "/sys/fs/cgroup", where, len);
}

uint32_t ccq_usable_cpu_set(uint8_t set[CCQ_CPU_SET_BYTES])
{
    cpu_set_t cpus;
    uint32_t n = 0;

    memset(set, 0, CCQ_CPU_SET_BYTES);
    if (sched_getaffinity(0, sizeof cpus, &cpus) != 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        CPU_ZERO(&cpus);
        for (long c = 0; c < (online > 0 ? online : 1) && c < CPU_SETSIZE; c++)
            CPU_SET((int)c, &cpus);
    }
    for (uint32_t c = 0; c < CCQ_CPU_SET_BYTES * 8u && c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &cpus)) {
            set[c / 8] |= (uint8_t)(1u << c % 8);
            n++;
        }
    return n;
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

/* ---- The scheduler's own core ------------------------------------------------------------ */

_Static_assert(sizeof(cpu_set_t) <= sizeof(((ccq_core_pin *)0)->mask), "cpu_set_t fits");

/* The indices of this process's live pins (bit k: claimed). 64 runtimes pinning at once is far
 * beyond any use: past them each shares index 63's core, claiming nothing. */
static pthread_mutex_t pin_claims_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t pin_claims;

static int pin_claim(void)
{
    int k = 0;
    pthread_mutex_lock(&pin_claims_lock);
    while (k < 64 && (pin_claims >> k & 1u))
        k++;
    if (k < 64)
        pin_claims |= (uint64_t)1 << k;
    pthread_mutex_unlock(&pin_claims_lock);
    return k < 64 ? k : -1;
}

void ccq_core_pin_init(ccq_core_pin *p, int home)
{
    cpu_set_t set;
    int n, k, at = 0;

    memset(p, 0, sizeof *p);
    p->cpu = -1;
    p->claim = -1;
    if (sched_getaffinity(0, sizeof set, &set) != 0 || (n = CPU_COUNT(&set)) < 2)
        return;
    memcpy(p->mask, &set, sizeof set);
    p->claim = pin_claim();
    k = p->claim >= 0 ? p->claim : 63;
    if (home >= 0 && home < CPU_SETSIZE && CPU_ISSET(home, &set))
        for (int c = 0; c < home; c++)
            at += CPU_ISSET(c, &set) ? 1 : 0;
    for (int c = 0, i = 0, want = (at + k) % n; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set) && i++ == want) {
            p->cpu = c;
            return;
        }
}

void ccq_core_pin_set(ccq_core_pin *p, bool on)
{
    cpu_set_t set;

    if (p->cpu < 0 || p->pinned == on)
        return;
    if (on) {
        CPU_ZERO(&set);
        CPU_SET(p->cpu, &set);
    } else {
        memcpy(&set, p->mask, sizeof set);
    }
    if (sched_setaffinity(0, sizeof set, &set) == 0) {
        p->pinned = on;
    } else {
        /* Given up either way: a pin left the thread as it was; an unpin leaves it on its
         * core (not pinned as far as ccq goes: nothing tries again). */
        p->cpu = -1;
        p->pinned = false;
    }
}

void ccq_core_pin_fini(ccq_core_pin *p)
{
    ccq_core_pin_set(p, false);
    if (p->claim >= 0) {
        pthread_mutex_lock(&pin_claims_lock);
        pin_claims &= ~((uint64_t)1 << p->claim);
        pthread_mutex_unlock(&pin_claims_lock);
    }
    p->claim = -1;
}
