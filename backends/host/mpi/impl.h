/* Private to the MPI engine (backends/host/mpi/): the structures engine.c (communicators, the
 * MPI collectives, an operation's life), check.c (every member's signature compared before any
 * data moves) and pair.c (pairs of devices in two processes, over point-to-point messages)
 * share. Every function here is called with ccq's MPI lock held (common/mpi_lock.h). */
#ifndef CCQ_HOST_MPI_IMPL_H
#define CCQ_HOST_MPI_IMPL_H

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>

#include "backends/host/mpi/engine.h"

/* What one process says about one operation before any of its data moves: the fields its
 * local parts agreed on. The members of a communicator exchange them (check.c: one message
 * per batch to every other member; pair.c: a header before the data) and compare. */
#define HMPI_SIG_MAGIC 0x5eu
typedef struct hmpi_sig {
    uint64_t seq;                /* the operation's sequence number on its channel */
    uint64_t count;              /* elements per part */
    uint32_t root;               /* rooted kinds: the root rank; else 0 */
    uint32_t first_rank, nranks; /* the sender's ranks in the communicator */
    uint32_t comm[2];            /* the communicator's identity (its lowest member's blob) */
    uint8_t kind;                /* either half of a send/recv: CCQ_KIND_SEND */
    uint8_t dtype, redop;        /* redop: kinds that reduce; else 0 */
    uint8_t magic;
} hmpi_sig;

/* Records of one member process not used yet, in sequence order (MPI keeps one sender's
 * messages in order). */
typedef struct hmpi_sigq {
    hmpi_sig *v;
    uint32_t head, n, cap;
} hmpi_sigq;

/* One message of records sent to every other member, until MPI is done with its buffer. */
typedef struct hmpi_sendset {
    struct hmpi_sendset *next;
    uint64_t first_seq; /* the lowest sequence number it carries */
    int n;
    MPI_Request *reqs; /* [n] */
    hmpi_sig *buf;
} hmpi_sendset;

struct ccq_hmpi_world {
    int64_t mpi_comm;
    MPI_Comm dup;
    MPI_Request req;
    bool done;
};

/* Queues of operations waiting for their check, in sequence order (one per channel). */
enum { HMPI_WQ_COLL, HMPI_WQ_P2P, HMPI_NWQ };

struct ccq_hmpi_comm {
    MPI_Comm mc; /* over the member processes (MPI_COMM_NULL for a pair) */
    /* A pair of devices in two processes: everything goes on the world's duplicate (p2p,
     * not ours; MPI ranks are world ranks) under the pair's HMPI_PAIR_TAGS tags. */
    bool pair;
    MPI_Comm p2p;
    int pair_tag;
    uint32_t blob[2]; /* its identity: the lowest member's blob (world rank, count) */
    int nprocs, me;   /* members; this process's MPI rank in mc (its index in procs) */
    uint32_t nranks;  /* ranks of the communicator, in every process */
    uint32_t first_rank, nlocal;
    int *nl, *fr;    /* [nprocs]: local ranks and first rank of each member process */
    uint32_t *procs; /* [nprocs]: their world ranks */
    uint32_t refs;   /* 1 for the communicator + operations and messages still on it */
    struct ccq_hmpi_op *wq[HMPI_NWQ], **wq_tail[HMPI_NWQ];
    /* A pair's large all_reduces between their two exchanges, in sequence order (pair.c). */
    struct ccq_hmpi_op *split, **split_tail;
    /* The check of a communicator over member processes (check.c). */
    hmpi_sig *out; /* this process's records not sent yet */
    uint32_t nout, capout;
    bool dirty; /* on the engine's list of communicators with records to send */
    struct ccq_hmpi_comm *dirty_next;
    hmpi_sigq *in; /* [nprocs] */
    hmpi_sendset *sets, **sets_tail;
};

/* Scratch buffers an operation owns. */
enum { H_BUF_SCRATCH, H_BUF_RECV, H_BUF_SINK, H_NBUF };
/* Its MPI requests (MPI_REQUEST_NULL when unused). */
enum { RQ_OP, RQ_HDR_SEND, RQ_HDR_RECV, RQ_DATA_RECV, RQ_N };
/* Where it is: waiting for the check, its MPI operation running, receiving a mismatched
 * peer's data only to drop it, or failed before any data moved. */
enum { PH_WAIT, PH_RUN, PH_DISCARD, PH_FAILED };

struct ccq_hmpi_op {
    ccq_hmpi_comm *c;
    const ccq_be_op *op; /* NULL once abandoned or detached */
    MPI_Request req[RQ_N];
    const char *what; /* the MPI call, for details */
    uint64_t start_ns, seq;
    void *buf[H_NBUF]; /* engine scratch (pooled) */
    size_t cap[H_NBUF];
    void *out;                /* where the MPI result lands (post-processing reads it) */
    int *v;                   /* counts / displacements of the v collectives: 4 * nprocs */
    struct ccq_hmpi_op *next; /* abandoned list */
    struct ccq_hmpi_op *wnext;
    int wq; /* the wait queue it is on, or -1 */
    uint8_t phase;
    uint8_t split;                  /* a pair's large all_reduce: 1 first exchange, 2 second */
    struct ccq_hmpi_op *split_next; /* on its comm's split queue during the first */
    bool detached;                  /* a send completed early (ccq_hmpi_detach): still moving */
    hmpi_sig mine, theirs;          /* this process's record; a pair's: the peer's header */
    ccq_status fail;                /* PH_FAILED, PH_DISCARD: what test() returns */
    char *fail_detail;              /* malloc'd */
};

/* engine.c */
size_t hmpi_esize(ccq_dtype dt);
const char *hmpi_kind_name(uint8_t kind);
const char *hmpi_dtype_name(uint8_t dt);
MPI_Datatype hmpi_mpi_type(ccq_dtype dt);
void *hmpi_scratch(ccq_hmpi_op *h, int k, size_t bytes);
void hmpi_copy(void *dst, const void *src, size_t bytes);
void hmpi_divide(ccq_dtype dt, void *buf, size_t count, uint32_t n);
void hmpi_fail(ccq_hmpi_op *h, ccq_status st, const char *detail);
ccq_status hmpi_mpi_err(ccq_errbuf *err, int rc, const char *what);
/* An operation took a step that was not its end (posted once its check passed): see
 * ccq_hmpi_last_step. */
void hmpi_stepped(void);
void hmpi_comm_unref(ccq_hmpi_comm *c);
void hmpi_wq_push(ccq_hmpi_comm *c, int q, ccq_hmpi_op *h);
void hmpi_wq_remove(ccq_hmpi_comm *c, ccq_hmpi_op *h);
/* Post the MPI collective of a communicator over member processes (the local combine
 * included); an MPI error code, or -1 for out of memory. */
int hmpi_post_collective(ccq_hmpi_op *h, const ccq_be_op *op);

/* check.c */
void hmpi_sig_of(const ccq_hmpi_comm *c, const ccq_be_op *op, hmpi_sig *s);
/* Compare the records of rec[0..n-1] (process procs[k], in rank order); on a difference,
 * write what differs ("count: process 0 (rank 0) 1024, process 2 (rank 2) 2048") to why and
 * return true. Only the fields that matter for the kind are compared (op when it reduces,
 * root when rooted; count and dtype for a send/recv). */
bool hmpi_sig_differ(const hmpi_sig *rec, const uint32_t *procs, int n, char *why, size_t len);
/* A communicator over member processes: record this process's signature of h (sent with the
 * rest of its batch at the next flush) and queue h for the check. */
ccq_status hmpi_check_start(ccq_hmpi_op *h, const ccq_be_op *op);
/* Send every communicator's records recorded since the last flush. */
void hmpi_check_flush(void);
/* Receive the members' records and decide the waiting operations of c in sequence order:
 * post each one every member agrees on; fail the others (no data moves). */
void hmpi_check_progress(ccq_hmpi_comm *c);
/* Whether the records carrying sequence seq have left (a decided operation is reported only
 * then, so every member hears from this process whatever it does next). */
bool hmpi_check_sent(ccq_hmpi_comm *c, uint64_t seq);
/* The members whose record for h has not arrived, as "process 2" / "processes 1, 3". */
void hmpi_check_missing(const ccq_hmpi_op *h, char *buf, size_t len);
void hmpi_check_free(ccq_hmpi_comm *c);

/* pair.c */
#define HMPI_PAIR_TAGS 16
ccq_status hmpi_pair_start(ccq_hmpi_op *h, const ccq_be_op *op, ccq_errbuf *err);
/* Take the peer's headers that arrived, in sequence order: post what agrees, drop what does
 * not (receiving the peer's data into scratch). */
void hmpi_pair_progress(ccq_hmpi_comm *c);
void hmpi_pair_finish(ccq_hmpi_op *h, const ccq_be_op *op);
/* A pair's large all_reduce whose first exchange completed: true if it has a second to
 * start (then call hmpi_pair_reduce_half without the lock, then hmpi_pair_second; the
 * operation is not done), false if it is done or must wait for an earlier one's turn
 * (*wait). */
bool hmpi_pair_split_due(ccq_hmpi_op *h, bool *wait);
void hmpi_pair_reduce_half(ccq_hmpi_op *h);
ccq_status hmpi_pair_second(ccq_hmpi_op *h, ccq_errbuf *err);
void hmpi_pair_split_remove(ccq_hmpi_op *h);

#endif /* CCQ_HOST_MPI_IMPL_H */
