/* The world: the processes of a job, this one's place among them, and the global device ids
 * (process p owns the ids [first[p], first[p + 1])). A world of one process is the default
 * and needs no bootstrap. */
#ifndef CCQ_RUNTIME_WORLD_H
#define CCQ_RUNTIME_WORLD_H

#include <stdbool.h>
#include <stdint.h>

#include "ccq.h"
#include "common/cores.h"

struct ccq_boot;

/* Who a process is, as it said when the world formed: job health watches the processes of
 * this host through it from the start (runtime/health/oswatch.c). */
typedef struct ccq_world_proc {
    uint32_t pid;
    uint32_t cores; /* how many cores it may run on (its affinity: ccq_usable_cores) */
    /* Its job-health settings (ccq_config.heartbeat_ms, 0 = none; the timeout it applies,
     * its default resolved): ccq_world_heartbeat. */
    uint32_t heartbeat_ms, heartbeat_timeout_ms;
    uint64_t host_id;    /* boot id, host name and pid namespace; 0 = unknown */
    uint64_t start_time; /* clock ticks since boot */
    /* The kernel it runs under (its boot id alone): the machine whose cores it shares, with
     * the processes of other containers on it too (ccq_world_crowded); 0 = unknown. */
    uint64_t kernel_id;
    /* Which cores (ccq_usable_cpu_set): ccq_world_crowded, ccq_world_home_core. */
    uint8_t cpus[CCQ_CPU_SET_BYTES];
} ccq_world_proc;

typedef struct ccq_world {
    uint32_t rank, size;
    uint32_t *first;       /* [size + 1]: prefix sums of the processes' local device counts */
    ccq_world_proc *procs; /* [size] (NULL in a world of one) */
    /* This host's processes of the world outnumber the cores they may run on
     * (ccq_world_crowded): the threads that progress them then take turns on the cores. */
    bool crowded;
    struct ccq_boot *boot; /* how processes meet; NULL in a world of one */
    /* Every process's backend blob (world_blob), until ccq_world_drop_blobs: blob[p] has
     * blob_len[p] bytes (NULL when no process has one). */
    const void **blob;
    size_t *blob_len;
    unsigned char *blob_data;
} ccq_world;

/* Meet the other processes (cfg->bootstrap / store / mpi_comm), exchange local device
 * counts and check that everyone agrees on the world; waits at most timeout_ns and then
 * names the processes that never arrived. blob (blob_len bytes, 0 = none) is this process's
 * backend bytes for the others (a second exchange, padded to the longest, carries them
 * when any process has some). Sets the thread's error detail on failure. */
ccq_status ccq_world_setup(ccq_world *w, const ccq_config *cfg, const char *backend,
                           uint32_t local_devices, const void *blob, size_t blob_len,
                           uint64_t timeout_ns);
/* Free the blobs (once the backend has taken what it needs). */
void ccq_world_drop_blobs(ccq_world *w);
void ccq_world_fini(ccq_world *w);

/* Whether the processes of process me's machine (those with its kernel_id, whatever their
 * container; every process when it is 0, unknown) outnumber the cores they may run on: whether
 * they cannot each have a core of its own among those of its affinity (procs[p].cpus), a
 * maximum matching of processes to cores (host_cpus at most, this machine's online count; 0 =
 * unknown). Processes with one affinity (or none: every process may use every core) share its
 * cores, processes bound apart (a launcher's binding, one core or one socket each) have their
 * own, and overlapping affinities count as they overlap: cores 0-3, core 1 and core 1 again are
 * crowded (the last two share core 1), though they span four cores. A process sees only its own
 * affinity; this is the host's view the world's exchange gives everyone alike. An empty set
 * (unknown) counts as core 0. */
bool ccq_world_crowded(const ccq_world_proc *procs, uint32_t n, uint32_t me, uint32_t host_cpus);

/* Job health's settings for every process alike, from what each said (ccq_world_proc): no
 * heartbeats if any process has none, else the longest interval and the longest timeout. A
 * process that published more seldom than another's timeout, or not at all, was declared lost
 * by it while alive (one with heartbeat_ms 0 among defaults: after 10 s). */
void ccq_world_heartbeat(const ccq_world_proc *procs, uint32_t n, uint32_t *heartbeat_ms,
                         uint32_t *heartbeat_timeout_ms);

/* The core process me's scheduler pins itself to while crowded (ccq_core_pin): the processes of
 * its machine (as ccq_world_crowded) take the cores of their affinities in turn, the most
 * confined first (fewest cores, then world rank), each the core of its set that the fewest
 * processes took before it (the lowest of those): processes with one affinity take its cores by
 * world rank, one after another, and a process bound to one core leaves that core to the ones
 * that may go elsewhere. -1 when its set is empty. */
int ccq_world_home_core(const ccq_world_proc *procs, uint32_t n, uint32_t me);

/* The process that owns global device d (d < first[size]). O(log size). */
uint32_t ccq_world_owner(const ccq_world *w, ccq_device_id d);

#endif /* CCQ_RUNTIME_WORLD_H */
