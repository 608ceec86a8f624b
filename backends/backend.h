/* The backend interface: a struct of function pointers the runtime calls from its
 * scheduler thread only. Modelled on UCC's base component interface. */
#ifndef CCQ_BACKEND_H
#define CCQ_BACKEND_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ccq.h"
#include "common/kinds.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A bounded error detail; backends write their own message (ncclGetErrorString, ...)
 * here so native result codes never cross the backend boundary. */
#define CCQ_DETAIL_LEN 512
typedef struct ccq_errbuf {
    char msg[CCQ_DETAIL_LEN];
} ccq_errbuf;

/* Devices one runtime can have, and so parts one operation can have. */
#define CCQ_MAX_DEVICES 1024u

/* Collective parts are in rank order; each part's src and dst hold count or count * n
 * elements as the kind defines (see ccq.h), and a NULL buffer means "not used by this
 * rank" (non-root ranks of rooted collectives). */

/* One local rank's share of an operation. */
typedef struct ccq_be_part {
    ccq_device_id device;
    uint32_t rank;         /* rank in the communicator (position in its sorted device set) */
    uint32_t stream_index; /* device * max_streams + stream id */
    uint32_t slot;         /* the command's slot in its stream (see ccq_be_submit) */
    const void *src;       /* NULL for a recv part */
    void *dst;             /* NULL for a send part */
    uint64_t stream_done;  /* commands of this part's stream that have ended once this batch
                              is done (its ended count then; the same for every part of a
                              stream in a batch): the value a GPU-side wait counter takes
                              after the batch (see stream_wait) */
} ccq_be_part;

typedef struct ccq_be_comm ccq_be_comm; /* a backend's communicator (opaque to the runtime) */

/* What a backend is told about a communicator it creates. Ranks are positions in the sorted
 * set of global device ids, so this process's devices are the contiguous ranks
 * first_rank .. first_rank + nlocal - 1. */
#define CCQ_BE_ROOT_BLOB_MAX 256
/* Largest per-process blob of the world's meeting (world_blob). */
#define CCQ_BE_WORLD_BLOB_MAX 65536u
/* What one member process tells the others about its part of a communicator when they meet
 * (comm_member_blob), e.g. the NCCL backend's lowest compute capability. */
#define CCQ_BE_MEMBER_BLOB_MAX 32
typedef struct ccq_be_member_blob {
    uint32_t len;
    uint8_t bytes[CCQ_BE_MEMBER_BLOB_MAX];
} ccq_be_member_blob;

typedef struct ccq_be_comm_desc {
    uint32_t nranks;                    /* ranks in all processes */
    uint32_t first_rank;                /* rank of this process's first device in it */
    uint32_t nlocal;                    /* this process's ranks */
    const ccq_device_id *local_devices; /* [nlocal]: the backend's device of each local rank */
    uint32_t nprocs;                    /* member processes (1: every rank is here) */
    const uint32_t *procs;              /* [nprocs]: their world ranks, ascending */
    const uint32_t *proc_first;         /* [nprocs + 1]: the rank of each member process's first
                                           device; proc_first[nprocs] = nranks (process p has
                                           ranks proc_first[p] .. proc_first[p + 1] - 1) */
    uint32_t world_rank;                /* this process's */
    const void *root_blob;              /* nprocs > 1: what comm_root_blob gave on the lowest */
    size_t root_blob_len;               /*   member process, the same bytes in every member */
    uint64_t fusion_bytes; /* fusion threshold of this communicator (backends/fuse.h), the same
                              in every member process (0: never fuse its operations) */
    /* nprocs > 1: [nprocs], what comm_member_blob gave in each member process (procs
     * order; len 0 without the hook), the same in every member. NULL otherwise. */
    const ccq_be_member_blob *member_blobs;
} ccq_be_comm_desc;

/* An operation as the backend sees it. Owned by the runtime; valid from issue() until the
 * batch holding it comes back from poll(). */
typedef struct ccq_be_op {
    uint8_t kind;  /* ccq_kind; a send/recv pair is CCQ_KIND_SEND (common/kinds.h); a half
                      whose peer is in another process is CCQ_KIND_SEND or CCQ_KIND_RECV with
                      one part and `peer` set */
    uint8_t dtype; /* ccq_dtype */
    uint8_t redop; /* ccq_reduce_op (collectives that reduce) */
    uint32_t root; /* root rank (broadcast, reduce, gather, scatter) */
    uint32_t peer; /* a send or recv half: the peer's rank in the communicator */
    size_t count;  /* elements per part */
    ccq_be_comm *comm;
    uint32_t comm_size; /* ranks in the communicator */
    uint32_t nparts;    /* this process's parts below, in rank order (all ranks, for a
                           communicator of one process) */
    ccq_be_part *parts;
    ccq_status status;    /* set by the backend before the batch is returned */
    uint8_t comm_aborted; /* set by the backend when it aborted `comm` itself (after an
                             asynchronous error): the runtime then fails everything queued
                             on that communicator and refuses new work on it */
    uint64_t seq;         /* its position in its channel (collectives, or one direction of a
                             pair), the same in every process: engines matching across
                             processes can use it (MPI tags) */
    uint8_t stage_src;    /* SENDRECV, only for backends with stages_sends: a later command of
                             the sender's stream in this batch writes the send's src (an
                             in-place exchange or ring shift: stream order says the send reads
                             the old data). Read src before any op of the batch writes. */
    uint8_t done_early;   /* Backends whose operations complete independently of their batch
                             (the host backend's engine operations across processes) set it,
                             with status, when this op has finished (its buffers no longer
                             touched) before the batch comes back, and count it in the batch's
                             ndone_early: the runtime then ends its commands at once, in stream
                             order, so one operation waiting for another process never holds
                             the streams of the others (nor what they queue next). */
    /* Fusion (docs/fusion.md), set by the backend before the batch is returned: on the first
     * op of a fused engine operation, how many ops of the batch it ran (this one and the
     * next ones in batch->ops, consecutive sequence numbers of one communicator), and when it
     * started and ended (ccq_now_ns); 0 on every other op. The runtime clears them at issue
     * and turns them into trace events; each op still carries its own status. */
    uint32_t fused;
    uint64_t fused_t0, fused_t1;
} ccq_be_op;

/* A batch: what the runtime found ready in one pass, issued as one backend group. */
typedef struct ccq_be_batch {
    uint64_t id;
    uint32_t nops;
    ccq_be_op **ops;
    ccq_status status;              /* CCQ_OK, or the group's failure (ops carry their own) */
    ccq_errbuf detail;              /* the backend's message when status != CCQ_OK */
    struct ccq_be_batch *next_done; /* link for poll()'s list; owned by the backend meanwhile */
    void *be_priv;                  /* backend scratch */
    uint32_t ndone_early;           /* ops of it with done_early set (the backend counts them) */
} ccq_be_batch;

typedef struct ccq_backend ccq_backend;

/* What the submit hooks see of a command. `slot` identifies the command among those
 * outstanding on its stream (0 <= slot < the runtime's ring size, a power of two >=
 * queue_depth); a backend can keep per-slot state, such as a CUDA event, indexed by it. */
typedef struct ccq_be_submit {
    ccq_device_id device;
    uint32_t stream_index;
    uint32_t slot;
    uint8_t kind; /* ccq_kind of the command (CCQ_KIND_SEND or CCQ_KIND_RECV for a pair) */
    uint8_t dtype;
    uint8_t redop;
    /* This process's devices of the communicator (a send/recv: of its two devices, or one),
     * as the runtime's global ids, sorted, valid during the hook; minus device_first they are
     * the backend's devices. For a check that depends on every device of the communicator
     * (another process checks its own). */
    const ccq_device_id *devices;
    uint32_t ndevices;
    ccq_device_id device_first;
    /* The communicator's backend handle once it formed (what comm_create gave), NULL while
     * it forms: a check that depends on every rank (member processes included). Read-only. */
    const ccq_be_comm *comm;
} ccq_be_submit;

/* Completion notification: a backend calls notify(notify_arg) from any thread when it has
 * completions for poll(), so the scheduler can sleep instead of polling. */
typedef struct ccq_be_hooks {
    void (*notify)(void *arg);
    void *notify_arg;
    /* An engine that learns that a peer process failed (UCX's peer error handling, a closed
     * connection) calls peer_failed(notify_arg, its world rank), from any thread: the runtime
     * declares it lost (job health), and every survivor learns it. NULL-safe to skip. */
    void (*peer_failed)(void *arg, uint32_t world_rank);
} ccq_be_hooks;

typedef struct ccq_backend_ops {
    const char *name;
    /* Create the backend for cfg. On failure return a status and fill err. */
    ccq_status (*create)(const ccq_config *cfg, const ccq_be_hooks *hooks, ccq_backend **out,
                         ccq_errbuf *err);
    /* Free everything; every issued batch has been returned by poll() before this. */
    void (*destroy)(ccq_backend *be);
    uint32_t (*device_count)(const ccq_backend *be);
    /* Communicators spanning processes (desc->nprocs > 1): on the lowest member process
     * only, the bytes every member passes to comm_create (NCCL: a new ncclUniqueId), at most
     * CCQ_BE_ROOT_BLOB_MAX. NULL for a backend that cannot span processes. */
    ccq_status (*comm_root_blob)(ccq_backend *be, const struct ccq_be_comm_desc *desc, void *blob,
                                 size_t *len, ccq_errbuf *err);
    /* Optional, communicators spanning processes: in every member process, the bytes it
     * contributes to the meeting (at most CCQ_BE_MEMBER_BLOB_MAX; desc->local_devices are
     * its devices of the communicator); comm_create gets every member's in
     * desc->member_blobs. For what the backend must know of all ranks before any operation
     * (NCCL refuses fp8 reductions by the lowest compute capability of all ranks). */
    ccq_status (*comm_member_blob)(ccq_backend *be, const struct ccq_be_comm_desc *desc,
                                   ccq_be_member_blob *blob, ccq_errbuf *err);
    /* Start creating a communicator: CCQ_OK when it is ready, CCQ_IN_PROGRESS when comm_test
     * must be polled until it is (*out is set either way), or an error. Must not block. */
    ccq_status (*comm_create)(ccq_backend *be, const struct ccq_be_comm_desc *desc,
                              ccq_be_comm **out, ccq_errbuf *err);
    /* Optional: in a world of several processes, this process's bytes for the world's
     * meeting (the UCX engine's worker address), at most CCQ_BE_WORLD_BLOB_MAX (*len in:
     * room, out: used; 0 = none). Called once, on the thread creating the runtime, before
     * the processes meet; every process's world_ready receives every process's bytes. */
    ccq_status (*world_blob)(ccq_backend *be, void *blob, size_t *len, ccq_errbuf *err);
    /* Optional: called once in every process of a world of several, right after the
     * processes met (ccq_runtime_create), before any comm_create. Every process calls it at
     * the same point, so a backend can start an operation collective over the whole world
     * there (the host backend's MPI_Comm_idup for send/recv between processes). blobs[p]
     * (blob_len[p] bytes) is what process p's world_blob gave (NULL and 0 when none), valid
     * during the call. An error (with err) says this backend cannot span these processes:
     * the runtime then refuses every communicator spanning processes at once, with that
     * detail, instead of meeting. crowded: this host's processes of the world outnumber the
     * cores they may run on (ccq_world_crowded), so threads that progress them take turns. */
    ccq_status (*world_ready)(ccq_backend *be, uint32_t world_rank, uint32_t world_size,
                              bool crowded, const void *const *blobs, const size_t *blob_len,
                              ccq_errbuf *err);
    /* Poll a communicator comm_create left in progress: CCQ_OK, CCQ_IN_PROGRESS, or an
     * error (the runtime then destroys it). NULL when comm_create never returns
     * CCQ_IN_PROGRESS. */
    ccq_status (*comm_test)(ccq_backend *be, ccq_be_comm *comm, ccq_errbuf *err);
    void (*comm_destroy)(ccq_backend *be, ccq_be_comm *comm);
    /* Start a batch asynchronously (one group). On CCQ_OK the batch belongs to the backend
     * until poll() returns it with every op's status set. On an error nothing was started
     * and the runtime fails the batch's ops with err. */
    ccq_status (*issue)(ccq_backend *be, ccq_be_batch *batch, ccq_errbuf *err);
    /* Return the list (next_done links) of batches completed since the last call, or NULL. */
    ccq_be_batch *(*poll)(ccq_backend *be);
    /* Optional: the watchdog found a batch still in flight timeout_ms after its issue. A
     * backend with deadlines of its own that come before the watchdog's, so that a stuck
     * operation fails alone naming what it waits for (the host backend's engines), checks
     * them at its next poll() even where it reads the clock only every few polls; the
     * watchdog aborts what is still in flight a pass later. NULL: it aborts at once. Without
     * this, a scheduler that stood still past both deadlines (its process stopped or
     * preempted) would find the watchdog's first. */
    void (*check_deadlines)(ccq_backend *be);
    /* Abort a communicator: issued work on it must still come back through poll() (failed
     * with CCQ_ERR_ABORTED) once the backend no longer touches its buffers. */
    void (*abort)(ccq_backend *be, ccq_be_comm *comm);
    /* Optional: a member process of comm was lost (the runtime's job health). As abort (issued
     * work comes back failed once its buffers are no longer touched; nothing more is issued on
     * it), but the backend may keep it as the parent of comm_shrink. NULL: abort. */
    void (*revoke)(ccq_backend *be, ccq_be_comm *comm);
    /* Optional, with revoke: whether the survivors can make a communicator by shrinking this
     * revoked one (answered the same way in every member process). */
    bool (*comm_shrinkable)(ccq_backend *be, ccq_be_comm *parent);
    /* Optional: create the communicator of desc by shrinking `parent` (NCCL: ncclCommShrink),
     * leaving out the parent's ranks in exclude[0..nexclude) (ascending), which are all ranks
     * of lost processes; every other rank's process calls it with the same parent and
     * exclusions. Ranks keep their order. As comm_create: CCQ_OK, CCQ_IN_PROGRESS (poll
     * comm_test), or an error. */
    ccq_status (*comm_shrink)(ccq_backend *be, ccq_be_comm *parent, const uint32_t *exclude,
                              uint32_t nexclude, const struct ccq_be_comm_desc *desc,
                              ccq_be_comm **out, ccq_errbuf *err);
    /* If nonzero, the scheduler polls at this interval while batches are in flight
     * (for backends that cannot notify); 0 when notify() is always called. */
    uint64_t poll_interval_ns;
    /* Optional (NULL: poll_interval_ns). The interval to poll at now: for a backend whose
     * work only progresses when polled (the host backend's MPI requests), 0 when notify()
     * covers everything. Nonzero also makes the scheduler poll with no batch in flight
     * (background work, e.g. sends the backend completed early that MPI still moves). */
    uint64_t (*poll_interval)(const ccq_backend *be);
    /* Optional (NULL: no). Whether the scheduler's polls call MPI (the host backend's MPI
     * engine). The runtime then never pins its scheduler to a core (common/cores.h,
     * ccq_core_pin): Open MPI, whose node is oversubscribed, yields the core in every progress
     * call, and a pinned thread that yields waits out its core's other threads each time while
     * it holds the process's MPI lock (docs/performance.md, "Each scheduler on a core of its
     * own"). */
    bool (*calls_mpi)(const ccq_backend *be);
    /* True if the backend honours ccq_be_op.stage_src. Without it, a send whose src a later
     * command of its stream in the same group overwrites is refused (CCQ_ERR_UNSUPPORTED). */
    bool stages_sends;
    /* Grouping across processes (DESIGN.md): the collectives of one communicator spanning
     * processes a batch may hold, unless its member processes agreed on a grouping (the
     * runtime's ccq_comm.group_limit starts at this). 1 for a backend whose engine plans a
     * group per communicator from all its collectives together, so that each process's
     * cut of the same sequence must be the same (NCCL: algorithm, protocol and channels of
     * a collective depend on the others in its group); 0 = no limit, for engines that run
     * every operation on its own (the host backend's MPI and UCX). Send/recv halves are
     * not limited: NCCL matches them per peer in order whatever the grouping, and an
     * exchange between processes needs both directions in one group. */
    uint32_t span_group_limit;
    /* Where span_group_limit is 0: the collectives of one communicator spanning processes a
     * batch holds at most, by choice, not for correctness (0 = as many as max_batch_ops).
     * Each process cuts alone, which such an engine allows; the runtime's ccq_comm.group_limit
     * starts at this (CCQ_SPAN_BATCH_OPS overrides it). The host backend's 64: its engines run
     * a batch's operations all at once, and a DDP step's 1 MiB rings and fused groups all in
     * flight together ran slower than fewer at a time (docs/performance.md, "Batches across
     * processes"). */
    uint32_t span_batch_ops;

    /* ---- Optional hooks called on user threads (NULL when unused). They must be
     * thread-safe and must not call into anything that is not (no NCCL calls): they exist
     * because some device work has to happen at the call, in the caller's stream order. */
    /* Before a command is accepted: refuse what the backend cannot run (nothing queued). */
    ccq_status (*check)(ccq_backend *be, const ccq_be_submit *s, ccq_errbuf *err);
    /* After it is accepted, before the scheduler can see it (e.g. record an event on the
     * caller's stream). An error fails the command; the fence reports it. */
    ccq_status (*submit)(ccq_backend *be, const ccq_be_submit *s, ccq_errbuf *err);
    /* After a fence on the stream saw every covered command complete (e.g. make the
     * caller's stream wait for the completion event). */
    void (*fence)(ccq_backend *be, uint32_t stream_index);
    /* Bind a native stream (cudaStream_t for NCCL) to a ccq stream, or unbind with NULL.
     * Called on a user thread while the stream has nothing outstanding. */
    ccq_status (*bind_stream)(ccq_backend *be, ccq_device_id device, uint32_t stream_index,
                              void *native, ccq_errbuf *err);
    /* GPU-side waits (ccq_nccl_stream_wait), on a user thread: queue on `native` a wait
     * until `target` commands of the stream have ended, and return at once. The backend
     * keeps a per-stream counter of ended commands that the device reads, advanced on the
     * device after each batch (to the parts' stream_done) and by stream_ended below; after
     * it armed the stream it raises the counter to *ended (the runtime's count), so a count
     * published meanwhile is never missed. */
    ccq_status (*stream_wait)(ccq_backend *be, ccq_device_id device, uint32_t stream_index,
                              void *native, uint64_t target, const _Atomic uint64_t *ended,
                              ccq_errbuf *err);
    /* Scheduler: `ended` commands of the stream have ended (called after each publication).
     * Commands that end without reaching the device (failed, aborted, timed out, cancelled
     * by shutdown) advance the counter only through this. */
    void (*stream_ended)(ccq_backend *be, uint32_t stream_index, uint64_t ended);
    /* Memory the device's collectives can use (ccq_mem_*); user threads, thread-safe. */
    ccq_status (*mem_alloc)(ccq_backend *be, ccq_device_id device, size_t bytes, void **out,
                            ccq_errbuf *err);
    void (*mem_free)(ccq_backend *be, ccq_device_id device, void *ptr);
    ccq_status (*mem_copy)(ccq_backend *be, ccq_device_id device, void *dst, const void *src,
                           size_t bytes, int to_device, ccq_errbuf *err);
} ccq_backend_ops;

/* Slots per stream for a queue depth (the runtime's ring size): a power of two. */
static inline uint32_t ccq_ring_size(uint32_t queue_depth)
{
    uint32_t n = 1;
    while (n < queue_depth)
        n <<= 1;
    return n;
}

/* The base every backend struct embeds as its first member. */
struct ccq_backend {
    const ccq_backend_ops *ops;
};

#define ccq_container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

/* The backends' tables: the host backend is part of libccq; the NCCL backend is a module
 * (backends/module.h), reached through ccq_module_get("nccl") only. */
extern const ccq_backend_ops ccq_host_backend_ops;
extern const ccq_backend_ops ccq_nccl_backend_ops;

#ifdef __cplusplus
}
#endif

#endif /* CCQ_BACKEND_H */
