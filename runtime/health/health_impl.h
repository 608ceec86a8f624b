/* The private state of job health (the files of runtime/health/ only). */
#ifndef CCQ_RUNTIME_HEALTH_IMPL_H
#define CCQ_RUNTIME_HEALTH_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "queue/wake.h"
#include "runtime/health/health.h"
#include "runtime/health/record.h"

struct ccq_boot;

/* One suspicion the judge weighs: process `by`'s data engine reported `rank` failed. */
typedef struct hsuspicion {
    uint32_t by, rank;
    uint64_t seen_ns; /* when the judge first saw it */
    bool live;        /* scratch of one pass: still listed */
} hsuspicion;

/* What this process knows of one process of the world. */
typedef struct hpeer {
    _Atomic uint32_t state; /* ccq_process_state; only ever leaves ALIVE, once */
    /* Set with the state (under the lock), read under it. */
    uint32_t by, how;     /* who saw the loss first, and how (CCQ_HOW_*) */
    uint64_t lost_ns;     /* CLOCK_MONOTONIC when this process learned it */
    uint64_t hb_age_ns;   /* age of its last heartbeat when it was declared */
    uint64_t realtime_ns; /* when `by` declared it (its CLOCK_REALTIME) */
    bool applied;         /* scheduler only: its communicators were failed */
    /* The monitor's view of its heartbeats (monitor thread; rec also read under the lock). */
    uint64_t beat;      /* last beat number read */
    uint64_t change_ns; /* CLOCK_MONOTONIC when that beat was first read (its record's age) */
    void *rec;          /* its latest record, decoded fine (malloc'd) */
    size_t rec_len;
    /* Its process, when it runs on this host (oswatch.c). */
    int pidfd;    /* -1: none */
    bool watched; /* tried to watch it (do not retry every read) */
    bool by_poll; /* no pidfd here: checked with kill(pid, 0) at each read */
    uint32_t pid;
    uint64_t start_time;
} hpeer;

struct ccq_health {
    struct ccq_runtime *rt;
    struct ccq_boot *boot; /* NULL: no mechanism (cannot happen in a world of several) */
    uint32_t rank, size;
    uint32_t first_device, ndevices; /* this process's */
    uint64_t hb_ns, timeout_ns;      /* hb_ns 0: heartbeats off */
    bool beats;                      /* the monitor thread publishes and reads records */
    /* An engine's word goes to the judge (judge.c): heartbeats on and records that travel. Set
     * by ccq_health_create, before the scheduler thread starts (which reads it, as the engines'
     * callers do), so no later write races those reads. */
    bool judged;
    bool records; /* the bootstrap carries heartbeat records (not MPI) */

    pthread_mutex_t lock; /* details, records, pidfds, `mine` */
    hpeer *peers;         /* [size]; peers[rank] is this process */
    /* Bumped (release) whenever a process leaves ALIVE; the scheduler applies up to it. */
    _Atomic uint64_t epoch;
    uint64_t applied_epoch; /* scheduler only */

    /* Losses this process lists in its record (seen or relayed), in the order learned. */
    ccq_hb_lost *lost;
    uint32_t nlost;
    /* Peers this process's data engine reported failed (ccq_health_peer_failed): suspicions,
     * listed in its record after the losses until the judge decides (judge.c). [size], under
     * the lock. */
    uint8_t *suspects;
    /* The judge's view (monitor thread only, judge.c): the suspicions of the processes alive,
     * each with when this process first saw it, and when the set last grew. */
    struct hsuspicion *sus;
    uint32_t nsus, sus_cap;
    uint64_t sus_grew_ns;

    /* This process's progress, made by the scheduler on request (apply.c): ccq_hb_comm
     * entries with their ranges, and the local comm id of each (for ccq_world_progress). */
    _Atomic uint32_t prog_req; /* 1: asked; the scheduler sets 0 when `mine` is fresh */
    ccq_signal prog_sig;
    unsigned char *mine;
    size_t mine_len, mine_cap;
    uint32_t mine_n;
    uint32_t *mine_ids;
    uint64_t mine_ns; /* when it was made */

    /* The monitor thread. */
    pthread_t thread;
    bool started;
    int wake_fd;              /* eventfd: stop, publish now */
    _Atomic uint32_t stop;    /* 1: stop (publishing a last record saying `final_state`) */
    _Atomic uint32_t publish; /* 1: publish now (a loss was declared) */
    uint32_t final_state;     /* CCQ_HB_LEFT at a clean destroy */
    uint64_t beat;            /* this process's beats so far */
    uint64_t quorum_ns;       /* when this process last heard a quorum (check_quorum) */
    /* Identity, for the others' pidfd watch. */
    uint32_t pid;
    uint64_t host_id, start_time;
    char hostname[64];
};

/* ---- monitor.c ---- */
/* Declare `process` lost (seen by `by`, how, its heartbeat hb_age_ns old, declared at
 * realtime_ns of `by`): once; wakes the scheduler and the monitor (which publishes at once).
 * Takes the lock. True if this changed its state. */
bool ccq_health_declare(ccq_health *h, uint32_t process, uint32_t by, uint32_t how,
                        uint64_t hb_age_ns, uint64_t realtime_ns);
/* The OS says process q exited: it left if its last record says so (a clean destroy
 * publishes that before it exits), else it is lost. Any thread. */
void ccq_health_exited(ccq_health *h, uint32_t q);
/* CLOCK_REALTIME in nanoseconds: when a loss was declared, for the records' readers. */
uint64_t ccq_health_realtime_ns(void);
/* Wake the monitor thread (publish now, or stop). */
void ccq_health_kick(ccq_health *h);

/* ---- judge.c: the data engines' suspicions ---- */
/* If this process is the judge (the lowest alive whose beat is at most fresh_ns old, or
 * itself), weigh the suspicions of the processes alive and, once they settled and this process
 * hears a quorum, declare the one process they point at. Monitor thread, after its reads. */
void ccq_health_judge(ccq_health *h, uint64_t now, uint64_t fresh_ns, bool quorum);

/* ---- oswatch.c: the OS's word on processes of this host ---- */
/* This process's identity: pid, host id (boot id + host name + pid namespace), start time,
 * host name, and (kernel_id non-NULL) the kernel's id (boot id alone: ccq_world_proc). */
void ccq_os_identity(uint32_t *pid, uint64_t *host_id, uint64_t *start_time, char *hostname,
                     size_t len, uint64_t *kernel_id);
/* Start watching p's process if it runs on this host (its identity says so). Lock held.
 * False if it is already gone (then declare it). */
bool ccq_os_watch(ccq_health *h, hpeer *p, uint32_t pid, uint64_t host_id, uint64_t start_time);
/* Whether a watched process has exited (pidfd readable, or kill(pid, 0) fails). Lock held. */
bool ccq_os_exited(hpeer *p);
void ccq_os_unwatch(hpeer *p);

/* ---- describe.c ---- */
/* "process 2 (devices 4..5) was lost 3.1 s ago: process 0 saw its heartbeat stop (the last
 * one 10.2 s old)": the detail of everything failed because of it. Lock held. */
size_t ccq_health_describe_loss(const ccq_health *h, uint32_t process, char *buf, size_t len);
const char *ccq_health_how_name(uint32_t how);

static inline uint32_t ccq_health_state_of(const ccq_health *h, uint32_t p)
{
    return atomic_load_explicit(&h->peers[p].state, memory_order_acquire);
}

#endif /* CCQ_RUNTIME_HEALTH_IMPL_H */
