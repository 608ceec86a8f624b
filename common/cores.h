/* How many cores this process may run on: its CPU affinity (taskset, cgroup cpusets, a
 * launcher's binding), else the online count, at least 1. Tells the world whether a host's
 * processes outnumber their cores (ccq_world_crowded), and with a container's CPU limit sizes
 * the host backend's worker pool (ccq_worker_cores).
 *
 * And a busy-polling thread's yield that notices when its core is shared (ccq_unstack): two
 * processes' progress threads that the kernel placed on one core while another core idles (it
 * wakes them onto busy cores at a burst's start, and then does not move a thread that runs all
 * the time: it is "cache hot") take turns at every message, each turn a context switch: on a
 * 2-core VM, 2 processes x 1 device, a chain of 8-byte all_reduces took 9.2-10.8 us per
 * operation when stacked, 2.4-3.4 us when not, at random from run to run (docs/performance.md).
 * When its yields keep giving the core away, the thread moves itself to another core it may run
 * on (its own affinity mask, restored at once: the kernel keeps it where it landed). */
#ifndef CCQ_COMMON_CORES_H
#define CCQ_COMMON_CORES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

uint32_t ccq_usable_cores(void);
/* This process's CPU limit from its cgroup (a container's: Kubernetes' limits.cpu, docker
 * --cpus, systemd's CPUQuota), in cores rounded up, 0 when there is none: the quota over the
 * period of its cgroup and every ancestor's (the smallest), cgroup v2 (cpu.max) or v1
 * (cpu.cfs_quota_us, cpu.cfs_period_us). A pod limited to 2 CPUs on a 64-core node sees all
 * 64 in its affinity. where (len bytes, may be NULL) receives the directory of the cgroup
 * whose limit it is ("" when none). */
uint32_t ccq_cpu_limit(char *where, size_t len);
/* The threads worth running in parallel for one process's work: ccq_usable_cores, at most
 * ccq_cpu_limit (as Go's GOMAXPROCS, the JVM's and .NET's processor counts): more would only
 * spend the quota sooner and then stand throttled for the rest of its period. Not used for
 * ccq_world_crowded: threads under a quota still run side by side on distinct cores, and the
 * crowded rules (threads taking turns on a core) measured slower there (docs/performance.md,
 * "A container's CPU limit"). */
uint32_t ccq_worker_cores(void);
/* The same from proc_cgroup (the file /proc/self/cgroup) and the cgroup mount root (tests). */
uint32_t ccq_cpu_limit_at(const char *proc_cgroup, const char *root, char *where, size_t len);
/* The cores of ccq_usable_cores as a set: core c is bit c % 8 of set[c / 8] (cores from
 * CCQ_CPU_SET_BYTES * 8 on are left out), every online core when the affinity cannot be read;
 * returns how many it holds. With the other processes' sets it tells the processes of one host
 * apart by where they run, overlaps included (ccq_world_crowded, ccq_world_home_core). */
#define CCQ_CPU_SET_BYTES 128 /* cores 0-1023, as glibc's cpu_set_t */
uint32_t ccq_usable_cpu_set(uint8_t set[CCQ_CPU_SET_BYTES]);

typedef struct ccq_unstack {
    bool enabled;
    uint32_t long_yields;  /* yields in a row that gave the core to another thread */
    uint32_t short_yields; /* yields in a row that did not */
    uint32_t coin;         /* a small generator: of two stacked threads, mostly one moves */
    uint64_t gap_ns;       /* the wait after the next move (backs off) */
    uint64_t next_hop_ns;  /* no move before (ccq_now_ns clock) */
} ccq_unstack;

/* enabled false: ccq_unstack_yield is sched_yield. seed tells stacked threads apart (a pid). */
void ccq_unstack_init(ccq_unstack *u, bool enabled, uint32_t seed);

/* sched_yield, timed: a yield that returned only after another thread ran (UNSTACK_LONG_NS)
 * UNSTACK_AFTER times in a row moves this thread to another of its cores on a coin's throw (two
 * threads stacked on one core both see it; if both moved, they would be stacked again
 * elsewhere), then not again for a while that doubles at each move (cores.c). */
void ccq_unstack_yield(ccq_unstack *u);

/* The policy alone (ccq_unstack_yield's, for tests): a yield of yield_ns ended at now_ns;
 * true when the thread should move now. */
bool ccq_unstack_note(ccq_unstack *u, uint64_t yield_ns, uint64_t now_ns);

/* Move the calling thread off the core it is on, to another core of its affinity mask, which
 * is then restored as it was. Returns the core it left, or -1 (nothing changed) when it may run
 * on one core only or the system refused. */
int ccq_cpu_hop(void);

/* The scheduler's own core while its host's processes outnumber their cores
 * (ccq_world_crowded; runtime/sched.c; by default, never where the scheduler calls MPI:
 * CCQ_SCHED_PIN, runtime/runtime.c). Every busy
 * scheduler then takes turns on the cores with the others; left to the kernel, they move between
 * cores as the other threads of their processes wake and sleep, and the turns come unevenly: on a
 * 2-vCPU VM, 4 processes x 1 device, a chain of 8-byte all_reduces took 8-16 us per operation from
 * run to run, one scheduler on a core of its own 7.8-9.2 (docs/performance.md, "Each scheduler on a
 * core of its own"). Only the scheduler thread is pinned; from a batch with a large operation until
 * the next batch without one it may go anywhere again (their copies are the work, and a core that
 * waits should take it). */
typedef struct ccq_core_pin {
    int cpu;                 /* the core it takes; -1 = it never pins */
    int claim;               /* its index among this process's pinning threads; -1 = none */
    bool pinned;             /* on that core alone now */
    unsigned char mask[128]; /* its affinity before (a cpu_set_t): given back to unpin */
} ccq_core_pin;

/* The k-th core after home (modulo their count) among the calling thread's cores into p->cpu,
 * and that affinity into p->mask, where k is the lowest index no other live ccq_core_pin of this
 * process holds (claimed until ccq_core_pin_fini): home spreads one scheduler per process over
 * the cores the host's processes may run on (ccq_world_home_core), k the schedulers of several
 * runtimes in one process (runtime k of a process whose home is its i-th core takes its core
 * i + k: each process's on distinct cores, and evenly over all where every process has as many).
 * A home that is not among the thread's cores (or -1) counts from its first. p->cpu -1 when the
 * thread may run on one core only or its affinity cannot be read. Pins nothing yet. */
void ccq_core_pin_init(ccq_core_pin *p, int home);
/* Pin the calling thread to p->cpu (on true) or give it p->mask back (false); nothing when it
 * already is so or p->cpu is -1. A refusal of the system leaves it as it was; a refused pin is
 * not tried again (p->cpu becomes -1: a cpuset changed under the process, a seccomp filter),
 * where retrying would cost a system call at every batch; nor is a refused unpin (the thread
 * stays on its core, as the system left it). */
void ccq_core_pin_set(ccq_core_pin *p, bool on);
/* Unpin (as ccq_core_pin_set false) and give the claimed index back. */
void ccq_core_pin_fini(ccq_core_pin *p);

#endif /* CCQ_COMMON_CORES_H */
