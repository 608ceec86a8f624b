/* Job health: heartbeats with progress, lost processes, live progress (docs/multiprocess.md,
 * "When a process dies"). A thread of its own per runtime (monitor.c) publishes this process's
 * heartbeat record through the bootstrap, reads the others', and declares a process lost when
 * the OS says it is gone (pidfd of a peer on this host, a closed rendezvous connection, an
 * engine's peer error) or when its heartbeat is older than heartbeat_timeout_ms. Its record
 * then lists the loss, so every survivor learns it at its next read and agrees; a process
 * that finds itself listed while alive (it was stopped, or cut off) is fenced off. The
 * scheduler applies each loss (apply.c): every communicator with the lost process as a member
 * fails with CCQ_ERR_PROCESS_LOST, others are untouched.
 *
 * Threads: the monitor thread, the scheduler (apply.c), user threads (api.c, comm_init's
 * check). Process states are atomics; details and records are under the health lock. */
#ifndef CCQ_RUNTIME_HEALTH_H
#define CCQ_RUNTIME_HEALTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ccq.h"

struct ccq_runtime;
struct ccq_comm;
typedef struct ccq_health ccq_health;

/* Defaults (ccq_config.heartbeat_ms, heartbeat_timeout_ms = this many heartbeats). */
#define CCQ_HEARTBEAT_MS_DEFAULT     1000u
#define CCQ_HEARTBEAT_TIMEOUT_FACTOR 10u

/* The timeout a configuration applies: its heartbeat_timeout_ms, else the default multiple of
 * heartbeat_ms (0 with heartbeats off). */
static inline uint32_t ccq_heartbeat_timeout_ms(const ccq_config *cfg)
{
    return cfg->heartbeat_timeout_ms ? cfg->heartbeat_timeout_ms
                                     : cfg->heartbeat_ms * CCQ_HEARTBEAT_TIMEOUT_FACTOR;
}

/* ---- lifetime (runtime.c, world.c) ---- */

struct ccq_world_proc;
/* This process's identity for the world exchange (pid, host, kernel, start time). */
void ccq_health_identity(struct ccq_world_proc *out);

/* Before the scheduler starts: the process table (every process alive). A world of one gets
 * none (rt->health stays NULL). Sets the thread's detail on failure. */
ccq_status ccq_health_create(struct ccq_runtime *rt);
/* Once the scheduler runs: start the monitor thread when heartbeats are on and the bootstrap
 * carries them (no thread otherwise). */
ccq_status ccq_health_start(struct ccq_runtime *rt);
/* At destroy, after the scheduler stopped and before the bootstrap closes: a process that
 * shuts down cleanly publishes one last record saying it left (the others read
 * CCQ_PROCESS_LEFT, never LOST); the thread stops. Then frees everything. NULL is a no-op. */
void ccq_health_destroy(struct ccq_runtime *rt);

/* ---- user threads ---- */

/* The state of a world rank (CCQ_PROCESS_ALIVE when there is no table). */
ccq_process_state ccq_health_state(struct ccq_runtime *rt, uint32_t process);
/* ccq_comm_init's check of a sorted device set: CCQ_OK, or CCQ_ERR_PROCESS_LOST with the
 * thread's detail naming the lost member process (or this one, fenced off, for a set that
 * spans processes). */
ccq_status ccq_health_check_set(struct ccq_runtime *rt, const char *fn, const uint32_t *sorted,
                                uint32_t n);

/* ---- scheduler thread (apply.c) ---- */

/* Whether the scheduler has something to do for health (a loss not applied yet, a progress
 * request): one or two atomic loads. */
bool ccq_health_due(struct ccq_runtime *rt);
/* Apply losses not applied yet (fail what involves them, record CCQ_EV_PROCESS_LOST, dump)
 * and answer a progress request. True if it did anything. */
bool ccq_health_serve(struct ccq_runtime *rt);
/* A batch on comm failed in the engine: ask the OS now whether a member process on this host
 * is gone (so the failure is reported as the loss it is), and apply what it finds. True if a
 * member of comm is lost (comm then fails with CCQ_ERR_PROCESS_LOST). */
bool ccq_health_probe(struct ccq_runtime *rt, struct ccq_comm *comm);
/* Whether a member process of comm (or this one, fenced off, when comm spans processes) is
 * lost; if so, why (the detail every failed command carries) into buf. For communicators
 * still forming (comm_form.c). */
bool ccq_health_comm_lost(struct ccq_runtime *rt, const struct ccq_comm *comm, char *buf,
                          size_t len);
/* For the watchdog's detail: how each other member process of comm is doing, from its latest
 * heartbeat ("; process 2: alive, heartbeat 0.4 s ago, submitted #56 and completed #55 on
 * it (this process waits at #57)"), appended to buf; returns the bytes written. */
size_t ccq_health_describe_members(struct ccq_runtime *rt, const struct ccq_comm *comm,
                                   uint64_t wait_seq, char *buf, size_t len);

/* ---- any thread ---- */

/* The data engine found that a peer process failed (UCX peer error): a suspicion, which the
 * judge weighs with the other processes' (judge.c) before one process is declared lost; where
 * no records travel or heartbeats are off, it is declared lost at once. */
void ccq_health_peer_failed(struct ccq_runtime *rt, uint32_t process);

#endif /* CCQ_RUNTIME_HEALTH_H */
