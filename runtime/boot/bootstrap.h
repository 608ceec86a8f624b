/* The bootstrap: how the processes of a world meet. One internal interface (open, then
 * non-blocking exchanges of small records among any sorted set of member processes) over
 * three mechanisms: MPI ("mpi"), a directory every process sees ("file:DIR"), and the
 * embedder's ccq_store. docs/multiprocess.md describes it for users. */
#ifndef CCQ_RUNTIME_BOOTSTRAP_H
#define CCQ_RUNTIME_BOOTSTRAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h" /* ccq_errbuf */
#include "ccq.h"

/* Details: every message a call below leaves in its ccq_errbuf starts with "bootstrap" and,
 * where it knows it, the mechanism ("bootstrap file:/tmp/job: ...", "bootstrap mpi:
 * exchange 'world': ..."), so callers pass it on without a prefix of their own. */

/* A bootstrap handle: this process's end of the world's meeting place. Thread-safe: every
 * call below on one handle (and on its exchanges) is serialised by the handle's lock, so
 * the store callbacks and MPI are never called twice at once through one handle. */
typedef struct ccq_boot ccq_boot;
/* One exchange in progress. */
typedef struct ccq_boot_xchg ccq_boot_xchg;

/* Longest tag (bytes, without the NUL). */
#define CCQ_BOOT_TAG_MAX 256u
/* Most processes in a world (each handle keeps 8 bytes per process). */
#define CCQ_BOOT_WORLD_MAX (1u << 20)
/* Largest record one process contributes to an exchange. */
#define CCQ_BOOT_VALUE_MAX (1u << 20)

/*
 * Open this process's end. spec: "mpi", "file:DIR", or NULL (or "store") for @p store.
 * mpi_comm: the MPI_Fint (MPI_Comm_c2f) of the embedder's communicator, -1 = MPI_COMM_WORLD
 * (only for "mpi"; its rank and size must be world_rank and world_size). Never blocks on
 * other processes (MPI: the communicator's MPI_Comm_idup completes inside later exchanges).
 * Errors (err filled, *out NULL): CCQ_ERR_INVALID_ARGUMENT for a bad spec, world_size 0 or
 * above CCQ_BOOT_WORLD_MAX, world_rank >= world_size, a missing or unusable directory, a
 * NULL or incomplete store, an MPI rank/size that disagrees; CCQ_ERR_UNSUPPORTED for "mpi" in
 * a build without MPI or an MPI initialised below MPI_THREAD_SERIALIZED (or already
 * finalized); CCQ_ERR_NO_MEMORY.
 */
ccq_status ccq_boot_open(const char *spec, const ccq_store *store, int64_t mpi_comm,
                         uint32_t world_rank, uint32_t world_size, ccq_boot **out, ccq_errbuf *err);

/* Close this end; exchanges not freed yet are freed (so must not be used after). Must not
 * race with other calls on the handle. file: removes this job's keys once the last process
 * of the world has closed (see boot/file.c). NULL is a no-op. */
void ccq_boot_close(ccq_boot *boot);

/* "mpi", "file:DIR" or "store", for details. */
const char *ccq_boot_name(const ccq_boot *boot);
/* The job id keys are namespaced with (CCQ_JOB_ID, else a launcher's id, else "default"). */
const char *ccq_boot_job(const ccq_boot *boot);
/* file and store: how many bootstraps this process opened for this job and world rank
 * before this one, part of every key, so the k-th runtime of a rank meets the k-th of the
 * others (records of processes at another generation are refused with a detail). MPI: 0
 * (each handle has its own communicator). */
uint32_t ccq_boot_generation(const ccq_boot *boot);
uint32_t ccq_boot_world_rank(const ccq_boot *boot);
uint32_t ccq_boot_world_size(const ccq_boot *boot);
/* How often a caller polling with ccq_boot_xchg_test should call it (the scheduler's poll
 * interval while an exchange is pending); ccq_boot_xchg_wait backs off up to it. */
uint64_t ccq_boot_poll_interval_ns(const ccq_boot *boot);

/*
 * Start an exchange: each of the n member processes (world ranks, sorted ascending, no
 * duplicates, must include this one) contributes len bytes; every member ends up with all n
 * records in member order. Never blocks. Only the members take part: processes outside the
 * set are never waited for.
 *
 * tag names the exchange: every member must compute the same tag, and a tag is used at most
 * once per boot handle (a second post with it is refused) — e.g. "world",
 * "comm/<id>/uid". The members and len are part of what is checked: a member that posted the
 * tag with another member set, another len or another world_size fails the exchange with a
 * detail (CCQ_ERR_MISMATCH; CCQ_ERR_INVALID_ARGUMENT for world_size).
 * mine is copied. *out is NULL on error.
 */
ccq_status ccq_boot_xchg_post(ccq_boot *boot, const char *tag, const uint32_t *members, uint32_t n,
                              const void *mine, size_t len, ccq_boot_xchg **out, ccq_errbuf *err);

/*
 * Make progress without blocking: CCQ_OK once every member's record arrived (out, n * len
 * bytes, receives them in member order; it may be NULL before that), CCQ_IN_PROGRESS while
 * some have not (out untouched), or an error (err filled; the exchange stays failed and
 * later calls return the same error). Calling it again after CCQ_OK copies out again.
 * It asks the mechanism (opens files, calls the store's get, calls MPI) at most once per
 * ccq_boot_poll_interval_ns; calls in between return CCQ_IN_PROGRESS at once.
 */
ccq_status ccq_boot_xchg_test(ccq_boot_xchg *x, void *out, ccq_errbuf *err);

/* The members not heard from yet, ascending: writes up to cap of them to ranks (NULL with
 * cap 0 just counts) and returns how many there are. */
size_t ccq_boot_xchg_missing(ccq_boot_xchg *x, uint32_t *ranks, size_t cap);

/* Test until done or until deadline_ns (CLOCK_MONOTONIC, see ccq_boot_now_ns; 0 = no
 * deadline), sleeping between tests (backing off from 20 us to the poll interval). On
 * timeout: CCQ_ERR_TIMEOUT with a detail naming the exchange and the processes that never
 * arrived ("process 2 (of 3) never arrived" ...). */
ccq_status ccq_boot_xchg_wait(ccq_boot_xchg *x, void *out, uint64_t deadline_ns, ccq_errbuf *err);

/* Free an exchange, finished or not (a record this process published stays published). */
void ccq_boot_xchg_free(ccq_boot_xchg *x);

/* post + wait + free. */
ccq_status ccq_boot_exchange(ccq_boot *boot, const char *tag, const uint32_t *members, uint32_t n,
                             const void *mine, size_t len, void *out, uint64_t deadline_ns,
                             ccq_errbuf *err);

/* CLOCK_MONOTONIC in nanoseconds (the clock of deadline_ns). */
uint64_t ccq_boot_now_ns(void);

/* "2, 5 and 7" into buf (at most 16 ranks, then "and N more"); returns what it wrote. */
size_t ccq_boot_format_ranks(char *buf, size_t len, const uint32_t *ranks, size_t n);

/*
 * Whether the processes are still there, as the bootstrap can tell (tcp:// only: its
 * connections stay open for the job). World rank 0 serves the rendezvous and sees every
 * other process's connection; the others see their own connection to rank 0 and learn of
 * the rest from rank 0. A connection that closes after the process said goodbye (it closed
 * its bootstrap: ccq_runtime_destroy) is LEFT; one that closes otherwise is LOST (the
 * process died, or its host or the network went away).
 */
typedef enum ccq_boot_peer {
    CCQ_BOOT_PEER_UNKNOWN = 0, /* not known (yet), or the mechanism cannot tell */
    CCQ_BOOT_PEER_ALIVE = 1,   /* connected */
    CCQ_BOOT_PEER_LEFT = 2,    /* closed its bootstrap */
    CCQ_BOOT_PEER_LOST = 3,    /* its connection closed without goodbye */
} ccq_boot_peer;

/* What this process knows of world rank `rank` now. */
ccq_boot_peer ccq_boot_peer_state(ccq_boot *boot, uint32_t rank);

/* Call fn(arg, rank, state) when a process becomes LEFT or LOST (also for what was known
 * before the call). fn runs on the bootstrap's own I/O thread, never holding the handle's
 * lock: it must be quick and thread-safe (e.g. record it and wake the scheduler). One
 * watcher per handle; NULL removes it. CCQ_ERR_UNSUPPORTED for mechanisms that cannot tell
 * (file, store, mpi). */
ccq_status ccq_boot_watch_peers(ccq_boot *boot,
                                void (*fn)(void *arg, uint32_t rank, ccq_boot_peer state),
                                void *arg);

/* ---- Job health (runtime/health/): heartbeat records, one per process, last write wins ---- */

/* Whether this mechanism carries heartbeats (file, store, tcp; not MPI). */
bool ccq_boot_has_heartbeats(const ccq_boot *boot);
/* Publish this process's heartbeat record (at most CCQ_BOOT_BEAT_MAX bytes), replacing the
 * previous one. */
ccq_status ccq_boot_beat_publish(ccq_boot *boot, const void *rec, size_t len, ccq_errbuf *err);
/* The latest heartbeat record of world rank `rank`: CCQ_OK with *rec (malloc'd; free it) and
 * *len, CCQ_IN_PROGRESS while there is none yet, or an error (err filled). */
ccq_status ccq_boot_beat_fetch(ccq_boot *boot, uint32_t rank, void **rec, size_t *len,
                               ccq_errbuf *err);
/* Processes whose connection to this one closed since the last call (the OS says they are
 * gone; only connection-based mechanisms report any): up to cap world ranks into ranks,
 * returns how many were written. */
size_t ccq_boot_closed_peers(ccq_boot *boot, uint32_t *ranks, size_t cap);
/* The heartbeat period and timeout job health runs with (tcp: the server sends every process
 * something at least every hb_ns, and a process that hears nothing from it for timeout_ns
 * takes the rendezvous over). No-op for mechanisms that need neither. */
void ccq_boot_beat_config(ccq_boot *boot, uint64_t hb_ns, uint64_t timeout_ns);
/* Processes this one stopped hearing from for the timeout while connected (tcp: the process
 * serving the rendezvous, stopped or hung; its connection stays open), each reported once and
 * never also by ccq_boot_closed_peers. */
size_t ccq_boot_silent_peers(ccq_boot *boot, uint32_t *ranks, size_t cap);
/* Whether the others gave this process up (tcp: it served the rendezvous, fell silent, and a
 * successor took over, which it learned when it ran again): true with *by, the process that
 * serves in its place. From then on it is fenced off: nothing it sends reaches anyone. */
bool ccq_boot_given_up(ccq_boot *boot, uint32_t *by);
/* When the others' heartbeat records could reach this process (CLOCK_MONOTONIC ns): from
 * *since until *until (tcp: since it last connected to the rendezvous, until a heartbeat
 * after the server last sent anything). A record's age counts only within that window: a
 * process is not silent while whatever relays its records is. 0 and UINT64_MAX where records
 * come without a relay (file, store). */
void ccq_boot_relay_window(ccq_boot *boot, uint64_t *since, uint64_t *until);
/* Fault injection (CCQ_FAULT "lag:us=U", drills only): what this process reads from the
 * rendezvous takes effect lag_ns after its bytes arrive (tcp; a no-op elsewhere). */
void ccq_boot_fault_lag(ccq_boot *boot, uint64_t lag_ns);
/* This handle's nonce (random per open), and the nonce world rank `rank` used in the
 * records this handle took from it (0 when none yet): a heartbeat record carries its
 * writer's, so one of an earlier job with the same id is told apart. */
uint64_t ccq_boot_nonce(const ccq_boot *boot);
uint64_t ccq_boot_peer_nonce(ccq_boot *boot, uint32_t rank);

/* Every MPI call here is made holding ccq's one MPI lock (common/mpi_lock.h). */

/*
 * This process's place in the world from the environment, most specific first: CCQ_WORLD_RANK
 * and CCQ_WORLD_SIZE; else the launcher's: OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE (Open
 * MPI's mpirun), PMI_RANK / PMI_SIZE (MPICH's hydra, Intel MPI), SLURM_PROCID / SLURM_NTASKS
 * (srun), RANK / WORLD_SIZE (torchrun) — torchrun's right after ccq's for a child of torchrun
 * (TORCHELASTIC_RUN_ID set), whose srun or mpirun variables describe torchrun itself. The
 * first family with either variable set is used, and must have both. Writes *rank and *size
 * only when a family is found (so callers keep their defaults, 0 and 1, otherwise). Returns
 * CCQ_OK, or CCQ_ERR_INVALID_ARGUMENT with *err set (if it was NULL) to a static message naming
 * the variable: a value that is not a decimal integer, a size of 0 or above 2^31, a rank >=
 * size, half of a family.
 */
ccq_status ccq_boot_world_from_env(uint32_t *rank, uint32_t *size, const char **err);

/*
 * The bootstrap torchrun's variables give when CCQ_BOOTSTRAP is unset: "tcp://MASTER_ADDR:
 * MASTER_PORT" (an IPv6 address in brackets) when both are set, "torchstore://..." where
 * torchrun's agent serves its store there (TORCHELASTIC_USE_AGENT_STORE=True), else NULL. The
 * string lives as long as the process (one copy per distinct value).
 */
const char *ccq_boot_spec_from_env(void);

#endif /* CCQ_RUNTIME_BOOTSTRAP_H */
