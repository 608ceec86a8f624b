/* The host backend's engines: what moves data between the member processes of a
 * communicator spanning processes, after the local parts are combined (one buffer per
 * process). host.c calls an engine through this table only; each engine lives in a folder
 * of its own (mpi/, and the next ones beside it) and knows nothing of the runtime.
 *
 * Threads: the host backend calls every function from the scheduler thread only (one
 * thread at a time per engine object), so an engine can run its transport single-threaded.
 * An engine progresses only inside these calls: the host backend polls it at the interval
 * poll_interval() asks for while it has work in flight. */
#ifndef CCQ_HOST_ENGINE_H
#define CCQ_HOST_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "backends/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ccq_host_engine ccq_host_engine; /* one per host backend (runtime) */
typedef struct ccq_heng_comm ccq_heng_comm;     /* a communicator's engine side */
typedef struct ccq_heng_op ccq_heng_op;         /* one operation in flight */

/* Bytes of the lowest member's blob every member's comm_create receives (at most). */
#define CCQ_HENG_BLOB_MAX 64u

typedef struct ccq_host_engine_ops {
    const char *name; /* "ucx", "mpi" */
    /* Create the engine for a runtime of cfg. err says why it cannot be had here (and what
     * to do): the host backend then refuses communicators spanning processes with it. */
    ccq_status (*create)(const ccq_config *cfg, ccq_host_engine **out, ccq_errbuf *err);
    void (*destroy)(ccq_host_engine *e);
    /* Optional: this process's bytes for the world's meeting (backend world_blob; *len in:
     * room, out: used), e.g. a transport address every other process needs. */
    ccq_status (*world_blob)(ccq_host_engine *e, void *blob, size_t *len, ccq_errbuf *err);
    /* Every process of the world calls it at the same point, right after the processes met
     * (backend world_ready), with every process's world_blob bytes (blobs[p], blob_len[p];
     * blobs NULL when no process gave any). An error says this engine cannot span these
     * processes. crowded: as the backend's world_ready was told. */
    ccq_status (*world_ready)(ccq_host_engine *e, uint32_t world_rank, uint32_t world_size,
                              bool crowded, const void *const *blobs, const size_t *blob_len,
                              ccq_errbuf *err);
    /* On the lowest member process only: the bytes every member's comm_create gets in
     * d->root_blob (at most CCQ_HENG_BLOB_MAX; *len in: room, out: used). */
    ccq_status (*root_blob)(ccq_host_engine *e, const ccq_be_comm_desc *d, void *blob, size_t *len,
                            ccq_errbuf *err);
    /* Start the engine side of a communicator spanning d->nprocs > 1 processes: CCQ_OK when
     * ready, CCQ_IN_PROGRESS when comm_test must be polled (*out is set either way), or an
     * error. d (and what it points to) is valid during the call only. */
    ccq_status (*comm_create)(ccq_host_engine *e, const ccq_be_comm_desc *d, ccq_heng_comm **out,
                              ccq_errbuf *err);
    ccq_status (*comm_test)(ccq_host_engine *e, ccq_heng_comm *c, ccq_errbuf *err);
    /* Free it; operations still pending on it (abandoned) keep what they need alive. */
    void (*comm_destroy)(ccq_host_engine *e, ccq_heng_comm *c);
    /* Start an operation (the local combine included): op stays valid until test() returns
     * other than CCQ_IN_PROGRESS, or abandon()/detach() is called. */
    ccq_status (*start)(ccq_host_engine *e, ccq_heng_comm *c, const ccq_be_op *op, uint64_t now_ns,
                        ccq_heng_op **out, ccq_errbuf *err);
    /* CCQ_OK: done, every local output written, h freed; CCQ_IN_PROGRESS; or an error (h
     * freed or kept by the engine, err set). */
    ccq_status (*test)(ccq_host_engine *e, ccq_heng_op *h, ccq_errbuf *err);
    /* (An error test returns aborts the communicator in the runtime, a mismatch aside, unless
     * the engine sets ccq_host_engine.op_error_only before returning it.) */
    /* What h waits for, for a timeout's detail. */
    void (*describe)(ccq_host_engine *e, const ccq_heng_op *h, uint64_t now_ns, ccq_errbuf *err);
    /* Give up on h (timeout, abort): the engine keeps what the transport may still touch and
     * frees it when the transport lets go of it (reap), never writing user buffers later. */
    void (*abandon)(ccq_host_engine *e, ccq_heng_op *h);
    /* A send whose data the engine copied: true if it may be reported complete now (the
     * engine finishes it in the background, moved by reap). */
    bool (*detach)(ccq_host_engine *e, ccq_heng_op *h);
    /* Background work (abandoned and detached operations): progress it, free what ended;
     * returns how many are left. Called at every poll: the engine reads the clock itself,
     * and only for background work that has a deadline (reads of the clock at every poll
     * added up to a fifth of a scheduler's time per operation, docs/performance.md). */
    uint32_t (*reap)(ccq_host_engine *e);
    /* How often the host backend must poll now: while operations are in flight (busy),
     * or with background work that only polling moves; 0 = no need. */
    uint64_t (*poll_interval)(ccq_host_engine *e, bool busy);

    /* ---- Fusion (docs/fusion.md). Optional: an engine without it leaves it NULL, and the
     * host backend then starts every operation alone (start) and never fuses
     * (ccq_fuse_threshold gives its communicators spanning processes 0). ---- */
    /* Start ops[0..n-1] (n >= 1): collectives of one communicator spanning processes, from one
     * batch, with consecutive sequence numbers, in that order; out[i] gets ops[i]'s operation,
     * tested, described and abandoned like start()'s. The engine tells the member processes,
     * with what it sends them anyway for each operation (the MPI engine: its signature
     * records; the UCX engine: its message headers), how many operations of the run follow
     * each one; the window at an operation is the fewest any member has (the UCX engine
     * learns it when an all_reduce ends: its window follows it), and it cuts the window into
     * fused groups by the rule of
     * backends/fuse.h (the communicator's fusion_bytes from comm_create; the kinds it has a
     * layout for), so every member runs the same engine operations without waiting for
     * anything. On the first op of a fused group it sets fused and fused_t0 (ccq_now_ns) when
     * the group starts, fused_t1 when it ends; the group's ops end in the same test pass, in
     * batch order (the host tests them so). *nstarted: how many of ops started (all of them
     * unless an error is returned). */
    ccq_status (*start_run)(ccq_host_engine *e, ccq_heng_comm *c, ccq_be_op *const *ops, uint32_t n,
                            uint64_t now_ns, ccq_heng_op **out, uint32_t *nstarted,
                            ccq_errbuf *err);
} ccq_host_engine_ops;

/* The base every engine struct embeds first. */
struct ccq_host_engine {
    const ccq_host_engine_ops *ops;
    /* Set by the host backend after create (NULL until then): an engine that learns that a
     * peer process failed (UCX's peer error) calls it with that process's world rank, from
     * inside one of its functions; the runtime's job health declares the process lost. */
    void (*peer_failed)(void *arg, uint32_t world_rank);
    void *peer_failed_arg;
    /* Set by test with an error that is that operation's alone: the communicator stays usable
     * (the UCX engine, when a member that left cleanly never sent what the operation needs:
     * operations that have their messages still complete). The host backend clears it before
     * each test. */
    bool op_error_only;
};

/* The engines' tables. Each engine is a module (backends/module.h) whose entry names its table
 * (modules/<name>.c): the host backend reaches one through ccq_module_get(name) only, never by
 * this symbol, so libccq.so links no engine. */
extern const ccq_host_engine_ops ccq_host_engine_mpi_ops;
extern const ccq_host_engine_ops ccq_host_engine_ucx_ops;

#ifdef __cplusplus
}
#endif

#endif /* CCQ_HOST_ENGINE_H */
