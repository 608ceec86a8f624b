/* Internal to the fake (tests/fake): the cross-process cliques of fake_xproc.c and the hooks
 * fake_cuda_nccl.c calls. Tests use fake_cuda_nccl.h only. */
#ifndef CCQ_TESTS_FAKE_XPROC_H
#define CCQ_TESTS_FAKE_XPROC_H

#include <stdbool.h>
#include <stddef.h>

#include <nccl.h>

#include "ccq.h"

/* The ranks of one clique that fake_xproc.c can hold (fake_cuda_nccl.c's FAKE_MAX_RANKS). */
#define FAKE_XP_MAX_RANKS 16

/* One process's view of a clique with ranks in other processes. */
typedef struct fake_xp_clique fake_xp_clique;

/* What a group holds, as fake_xproc.c needs it (the collectives in nccl.h's order). */
enum {
    FAKE_XP_SEND,
    FAKE_XP_RECV,
    FAKE_XP_ALLREDUCE,
    FAKE_XP_BROADCAST,
    FAKE_XP_REDUCE,
    FAKE_XP_ALLGATHER,
    FAKE_XP_REDUCESCATTER,
    FAKE_XP_ALLTOALL,
    FAKE_XP_GATHER,
    FAKE_XP_SCATTER,
};

/* One local rank's call of a group on a cross-process clique. */
typedef struct fake_xp_op {
    int kind; /* FAKE_XP_* */
    fake_xp_clique *q;
    int rank;           /* the calling rank */
    const void *stream; /* the stream it is on (events recorded after it wait for it) */
    const void *src;
    void *dst;
    size_t count;            /* in NCCL's convention (see fake_cuda_nccl.c's coll_call) */
    int nccl_dtype, nccl_op; /* as passed, compared across ranks */
    ccq_dtype dtype;         /* the same, for the host backend's kernels */
    ccq_reduce_op op;
    int root, peer;
} fake_xp_op;

/* ---- Called by fake_cuda_nccl.c, with its lock held ---- */

/* fake_cuda_nccl.c's misuse counter (fake_errors()). */
void fake_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* An id no other process makes: counter, pid and random bytes, as printable text. */
void fake_xp_unique_id(ncclUniqueId *id, unsigned long long counter);
/* This process's view of the clique of id, creating or opening its shared segment; NULL
 * after a fake_error (nranks differs from the segment's, or the segment is unusable). */
fake_xp_clique *fake_xp_attach(const ncclUniqueId *id, int nranks);
/* Register a local rank: ncclSuccess once every rank of the clique has registered,
 * ncclInProgress before, or ncclInvalidArgument (the rank is another process's). */
ncclResult_t fake_xp_join(fake_xp_clique *q, int rank, int device, int cc_major);
/* A blocking init: wait until every rank registered (ncclSuccess) or the timeout passed
 * (ncclSystemError). Called once every local rank of the group has joined. */
ncclResult_t fake_xp_join_wait(fake_xp_clique *q, int rank);
/* Progress, then the rank's state: ncclInProgress while joining, its sticky error, or
 * ncclSuccess. */
ncclResult_t fake_xp_poll(fake_xp_clique *q, int rank);
/* Whether a local rank is still joining (a data call on it is a misuse). */
bool fake_xp_joining(const fake_xp_clique *q, int rank);
/* The lowest compute capability major of the ranks that joined, in every process (NCCL's
 * comm->minCompCap, which its fp8 reduction check uses). */
int fake_xp_min_cc(const fake_xp_clique *q);
/* Launch a group's cross-process calls: first wait until the streams of every call of the
 * group (streams[0..nstreams)) have no cross-process work left (stream order), then give
 * each call its sequence number and publish its input (now, or by later progress once its
 * slot is free); the outputs are written by later progress. ncclSuccess, or
 * ncclSystemError when the wait for the streams times out. */
ncclResult_t fake_xp_launch(const fake_xp_op *ops, size_t n, const void *const *streams,
                            size_t nstreams);
/* An event recorded on stream completes only after the cross-process work before it. */
void fake_xp_event_record(const void *event, const void *stream);
/* Progress, then whether the event still waits for cross-process work. */
bool fake_xp_event_pending(const void *event);
/* The launch count so far (what an item queued on a stream now comes after), and, after
 * progress, whether the stream still has cross-process work launched at or before it. */
uint64_t fake_xp_ticket(void);
/* Whether every rank of the clique, in every process, has launched at least one group with
 * a call on it (fake_xp_launch registers them). */
bool fake_xp_all_launched(const fake_xp_clique *q);
/* The monotonic clock in ns, and that plus the fake's timeout (a peer's deadline). */
long long fake_xp_now(void);
long long fake_xp_deadline(void);
bool fake_xp_stream_pending(const void *stream, uint64_t ticket);
/* A local rank leaves (ncclCommDestroy/Abort): its work is dropped; the last rank of the
 * last process unlinks the segment. */
void fake_xp_leave(fake_xp_clique *q, int rank);
/* fake_reset(): leave every clique, forget every event. */
void fake_xp_reset(void);

#endif /* CCQ_TESTS_FAKE_XPROC_H */
