/* The world: the processes of a job, this one's place among them, and the global device ids
 * (process p owns the ids [first[p], first[p + 1])). A world of one process is the default
 * and needs no bootstrap. */
#ifndef CCQ_RUNTIME_WORLD_H
#define CCQ_RUNTIME_WORLD_H

#include <stdbool.h>
#include <stdint.h>

#include "ccq.h"

struct ccq_boot;

/* Who a process is, as it said when the world formed: job health watches the processes of
 * this host through it from the start (runtime/health/oswatch.c). */
typedef struct ccq_world_proc {
    uint32_t pid;
    uint32_t cores;      /* how many cores it may run on (its affinity: ccq_usable_cores)... */
    uint64_t host_id;    /* boot id, host name and pid namespace; 0 = unknown */
    uint64_t start_time; /* clock ticks since boot */
    uint32_t first_core; /* ...and the lowest of them (ccq_world_crowded) */
    uint32_t reserved;
    /* The kernel it runs under (its boot id alone): the machine whose cores it shares, with
     * the processes of other containers on it too (ccq_world_crowded); 0 = unknown. */
    uint64_t kernel_id;
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
 * container; every process when it is 0, unknown) outnumber the cores they may run on
 * together, host_cpus at most (this machine's online count). The cores together are counted from
 * what each process said: processes that start at the same core with as many cores are taken to
 * share them (one affinity, or none: every process may use every core), others to have their own (a
 * launcher's binding, one core or one socket each). A process sees only its own affinity; this is
 * the host's view the world's exchange gives everyone alike. procs[p].cores 0 (unknown) counts
 * as 1. */
bool ccq_world_crowded(const ccq_world_proc *procs, uint32_t n, uint32_t me, uint32_t host_cpus);

/* Which of the processes that share process me's cores it is: how many processes before it
 * in the world run on its machine (kernel_id, as ccq_world_crowded) with the same cores as it
 * (first_core and cores). Those processes each pin their scheduler to the slot-th of their
 * cores while crowded (ccq_core_pin), so that the schedulers spread evenly over the cores. */
uint32_t ccq_world_core_slot(const ccq_world_proc *procs, uint32_t n, uint32_t me);

/* The process that owns global device d (d < first[size]). O(log size). */
uint32_t ccq_world_owner(const ccq_world *w, ccq_device_id d);

#endif /* CCQ_RUNTIME_WORLD_H */
