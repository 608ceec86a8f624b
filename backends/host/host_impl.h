/* What the host backend's files share (host.c: the backend, its workers and the local
 * kernels' scheduling; xproc.c: operations across processes through an engine). Private to
 * backends/host. */
#ifndef CCQ_HOST_IMPL_H
#define CCQ_HOST_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "backends/backend.h"
#include "backends/host/engine.h"

/* The collectives of one communicator spanning processes that one batch holds at most
 * (ccq_backend_ops.span_batch_ops; CCQ_SPAN_BATCH_OPS overrides it). A DDP step of 600
 * gradients (bench/ab-ddp.sh, 15 runs, the order rotating) ran 1.16-1.19x faster with 64
 * than with max_batch_ops' 256 (2 x 1), 1.32x (2 x 2); 32 and 16 the same as 64, 128 between,
 * 1024 (one batch) 0.78-0.88x: a batch's 1 MiB rings and fused groups all move at once, and
 * fewer at a time run faster on memory two cores share. One process's batches are not capped:
 * small-op throughput in one process is the same at 32, 64 and 256 (bench_throughput). */
#define CCQ_HOST_SPAN_BATCH_OPS 64u

typedef struct host_comm {
    uint32_t n;
    _Atomic uint32_t aborted;
    uint64_t fusion_bytes; /* its fusion threshold (0: off), the same in every member */
    ccq_heng_comm *eng;    /* communicators spanning processes: their engine side */
} host_comm;

/* The cross-process side of a host backend (xproc.c), scheduler thread only. */
typedef struct host_xp {
    ccq_host_engine *engine; /* NULL: this runtime cannot span processes (engine_err says why) */
    ccq_errbuf engine_err;
    char ucx_why[320];            /* by default: why the ucx engine was passed over ("" if not) */
    uint64_t timeout_ns;          /* cfg->timeout_ms (UINT64_MAX: none) */
    uint64_t stream_bytes;        /* for the local ops of its batches */
    struct host_xbatch *xbatches; /* batches with engine operations in flight */
    uint32_t background;          /* engine work given up on or detached, not yet ended */
    uint32_t polls;               /* host_xp_poll calls: deadlines are checked every 8th */
    bool deadlines_due;           /* check them at the next poll (the watchdog asked) */
} host_xp;

static inline bool host_op_aborted(const ccq_be_op *op)
{
    const host_comm *c = (const host_comm *)op->comm;
    return c != NULL && atomic_load_explicit(&c->aborted, memory_order_acquire);
}

static inline ccq_heng_comm *host_op_eng(const ccq_be_op *op)
{
    const host_comm *c = (const host_comm *)op->comm;
    return c != NULL ? c->eng : NULL;
}

/* host.c: run elements [begin, end) of an op on this thread; run a fused group whole. */
void host_run_range(const ccq_be_op *op, size_t begin, size_t end, uint64_t stream_bytes);
void host_run_fused(ccq_be_op *const *ops, uint32_t n, uint64_t stream_bytes);
/* host.c: copy the src of stage_src sends now (*staged: [nops] or NULL); free the copies. */
ccq_status host_stage_sends(ccq_be_batch *b, void ***staged, ccq_errbuf *err);
void host_free_staged(void **staged, uint32_t nops);

/* xproc.c */
/* Pick and create the engine (cfg->host_engine, or by default ucx then mpi); without one,
 * x->engine stays NULL and engine_err says why. */
void host_xp_open(host_xp *x, const ccq_config *cfg, const ccq_be_hooks *hooks);
ccq_status host_xp_world_blob(host_xp *x, void *blob, size_t *len, ccq_errbuf *err);
ccq_status host_xp_world_ready(host_xp *x, uint32_t world_rank, uint32_t world_size, bool crowded,
                               const void *const *blobs, const size_t *blob_len, ccq_errbuf *err);
/* Whether a batch needs the engine (an op on a communicator spanning processes, or a half of
 * a pair across processes). */
bool host_xp_needs(const ccq_be_batch *b);
ccq_status host_xp_issue(host_xp *x, ccq_be_batch *b, ccq_errbuf *err);
/* Progress the engine; append the batches that ended to list. */
ccq_be_batch *host_xp_poll(host_xp *x, ccq_be_batch *list);
uint64_t host_xp_poll_interval(const host_xp *x);
bool host_xp_busy(const host_xp *x);

#endif /* CCQ_HOST_IMPL_H */
