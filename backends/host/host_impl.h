/* What the host backend's files share (host.c: the backend, its workers and the local
 * kernels' scheduling; xproc.c: operations across processes through an engine, with the
 * fusion agreement). Private to backends/host. */
#ifndef CCQ_HOST_IMPL_H
#define CCQ_HOST_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "backends/backend.h"
#include "backends/host/engine.h"

struct host_xbatch;

/* An operation of a communicator spanning processes waiting to start on the engine: op k
 * of batch m (xproc.c keeps them per communicator, in sequence order). */
typedef struct host_xq_item {
    struct host_xbatch *m;
    uint32_t k;
} host_xq_item;

typedef struct host_comm {
    uint32_t n;
    _Atomic uint32_t aborted;
    uint64_t fusion_bytes; /* its fusion threshold (0: off), the same in every member */
    ccq_heng_comm *eng;    /* communicators spanning processes: their engine side */
    /* Across processes, scheduler thread only (xproc.c): its collectives not started yet, in
     * sequence order (a ring), and the fusion agreement they wait for. */
    host_xq_item *q;
    uint32_t qhead, qlen, qcap;
    bool window;         /* ops below window_end are inside an agreed window */
    uint64_t window_end; /* (see xproc.c: the agreement) */
    ccq_heng_op *agree;  /* the agreement the queue waits for, or NULL */
    int64_t *agree_vec;  /* its vector */
    uint64_t agree_seq;  /* where it was started */
    uint32_t agree_mine; /* what this process offered */
    bool listed;         /* on the list of communicators with queued operations */
    struct host_comm *list_next;
} host_comm;

/* The cross-process side of a host backend (xproc.c), scheduler thread only. */
typedef struct host_xp {
    ccq_host_engine *engine; /* NULL: this runtime cannot span processes (engine_err says why) */
    ccq_errbuf engine_err;
    uint64_t timeout_ns;          /* cfg->timeout_ms (UINT64_MAX: none) */
    uint64_t stream_bytes;        /* for the local ops of its batches */
    struct host_xbatch *xbatches; /* batches with engine operations in flight */
    host_comm *queued;            /* communicators with operations waiting to start */
    uint32_t background;          /* engine work given up on or detached, not yet ended */
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

/* xproc.c */
/* Whether a batch needs the engine (an op on a communicator spanning processes, or a half of
 * a pair across processes). */
bool host_xp_needs(const ccq_be_batch *b);
ccq_status host_xp_issue(host_xp *x, ccq_be_batch *b, ccq_errbuf *err);
/* Progress the engine; append the batches that ended to list. */
ccq_be_batch *host_xp_poll(host_xp *x, ccq_be_batch *list);
uint64_t host_xp_poll_interval(const host_xp *x);
bool host_xp_busy(const host_xp *x);
/* A communicator's cross-process state at its destruction (nothing of it is in flight). */
void host_xp_comm_fini(host_xp *x, host_comm *c);

#endif /* CCQ_HOST_IMPL_H */
