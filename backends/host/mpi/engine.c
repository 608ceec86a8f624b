/* The host backend's MPI engine (see engine.h). Per operation: the local parts are
 * combined into one buffer with the host kernels (reduce.h), one non-blocking MPI
 * operation runs among the member processes, then the result is written to every local
 * output. Ranks are contiguous per process and processes ascend with ranks, so process p's
 * ranks are fr[p] .. fr[p] + nl[p] - 1 and MPI rank p of the communicator is procs[p].
 *
 * Choices measured on Open MPI 4.1.4 (docs/multiprocess-host.md):
 *  - MPI operations are always out of place: libnbc's MPI_Iallreduce falls back to its
 *    binomial schedule in place (2.7x slower at 64 MiB here), so an in-place all_reduce
 *    first copies its input to engine scratch.
 *  - Signed integer SUM and PROD run on the unsigned MPI type of the same width: the bits
 *    are the same in two's complement and unsigned overflow is defined (ccq's integers wrap).
 *  - float16, bfloat16 and the fp8 types, and MAX/MIN of float32/float64 (ccq propagates
 *    NaN, MPI's built-in MAX does not say), reduce with ccq's own kernels as commutative
 *    user MPI_Ops over MPI_Type_contiguous byte types (never MPIX_C_FLOAT16).
 *  - So do int8 and uint8: Open MPI 4.1.4's built-in SUM of 8- and 16-bit integers
 *    saturates (its AVX op component: 100 + 100 as MPI_INT8_T gives 127, 0xF000 + 0xF000 as
 *    MPI_UINT16_T gives 0xffff), where ccq's integers wrap. 32- and 64-bit ones wrap.
 *  - And MAX/MIN of every integer type: MPICH 4.0.2 compares MPI_UINT32_T as signed
 *    (max(5, 3636685248) gave 5). Built-in ops stay for 32/64-bit SUM/PROD and float32/64
 *    SUM/PROD, the hot ones.
 *  - AVG is a SUM, then a division by the communicator's rank count after MPI (integers
 *    truncate, as the local path does). */
#include "backends/host/mpi/engine.h"

#include <inttypes.h>
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/host/reduce.h"
#include "common/mpi_lock.h"

struct ccq_hmpi_world {
    int64_t mpi_comm;
    MPI_Comm dup;
    MPI_Request req;
    bool done;
};

struct ccq_hmpi_comm {
    MPI_Comm mc;
    /* A pair of devices in two processes: send/recv go on the world's duplicate (p2p, not
     * ours; MPI ranks are world ranks) under the pair's tags; a collective on it (a
     * communicator of two devices can have both) makes mc at its first use. */
    bool pair;
    MPI_Comm p2p;
    int pair_tag;     /* the tag of messages from rank 0; rank 1's is pair_tag + 1 */
    int64_t mpi_comm; /* the world communicator (an MPI_Fint, -1 = MPI_COMM_WORLD) */
    uint32_t blob[2]; /* the lowest member's blob, for mc's MPI_Comm_create_group tag */
    int nprocs, me;   /* members; this process's MPI rank in mc */
    uint32_t nranks;  /* ranks of the communicator, in every process */
    uint32_t first_rank, nlocal;
    int *nl, *fr;    /* [nprocs]: local ranks and first rank of each member process */
    uint32_t *procs; /* [nprocs]: their world ranks */
    uint32_t refs;   /* 1 for the communicator + abandoned operations still on it */
};

enum { H_BUF_SCRATCH, H_BUF_RECV, H_NBUF };

struct ccq_hmpi_op {
    ccq_hmpi_comm *c;
    const ccq_be_op *op;         /* NULL once abandoned (a fused operation: ops[0]) */
    const ccq_be_op *const *ops; /* a fused operation: its ops (NULL once abandoned) */
    uint32_t nops;
    size_t total;    /* a fused operation: elements of its ops' blocks in all */
    int64_t *minvec; /* an agreement: the caller's vector (NULL once abandoned) */
    uint32_t nmin;
    MPI_Request req;
    const char *what; /* the MPI call, for details */
    uint64_t start_ns;
    void *buf[H_NBUF]; /* engine scratch (pooled) */
    size_t cap[H_NBUF];
    void *out;                /* where the MPI result lands (post-processing reads it) */
    int *v;                   /* counts / displacements of the v collectives: 4 * nprocs */
    struct ccq_hmpi_op *next; /* abandoned list */
    bool detached;            /* a send completed early (ccq_hmpi_detach): still moving */
};

/* Bytes per element (ccq_dtype_size, without the runtime: the engine's test links only the
 * backend's files). */
static size_t esize(ccq_dtype dt)
{
    static const uint8_t sz[CCQ_DTYPE_COUNT_] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    return (unsigned)dt < CCQ_DTYPE_COUNT_ ? sz[dt] : 0;
}

/* ---- process-wide state (under the MPI lock) ------------------------------------------ */

static ccq_hmpi_op *abandoned;
static uint32_t nabandoned, ndetached;
/* A few freed scratch buffers for reuse: first-touching 64 MiB costs as much as moving it. */
#define POOL_MAX 8
static struct {
    void *p;
    size_t cap;
} pool[POOL_MAX];
static bool types_made;
static MPI_Datatype t_byte2; /* 2-byte elements for float16 and bfloat16 */
static MPI_Datatype t_byte1; /* 1-byte elements for the fp8 types */
static MPI_Op user_ops[CCQ_DTYPE_COUNT_][CCQ_REDUCE_OP_COUNT_];
static bool user_op_made[CCQ_DTYPE_COUNT_][CCQ_REDUCE_OP_COUNT_];

static void *pool_get(size_t bytes, size_t *cap)
{
    int best = -1;
    for (int k = 0; k < POOL_MAX; k++)
        if (pool[k].p != NULL && pool[k].cap >= bytes && (best < 0 || pool[k].cap < pool[best].cap))
            best = k;
    if (best >= 0) {
        void *p = pool[best].p;
        *cap = pool[best].cap;
        pool[best].p = NULL;
        return p;
    }
    *cap = (bytes + 4095) & ~(size_t)4095;
    return aligned_alloc(4096, *cap);
}

static void pool_put(void *p, size_t cap)
{
    int slot = -1;
    if (p == NULL)
        return;
    for (int k = 0; k < POOL_MAX; k++) {
        if (pool[k].p == NULL) {
            slot = k;
            break;
        }
        if (slot < 0 || pool[k].cap < pool[slot].cap)
            slot = k;
    }
    if (pool[slot].p != NULL) { /* full: keep the larger */
        if (pool[slot].cap >= cap) {
            free(p);
            return;
        }
        free(pool[slot].p);
    }
    pool[slot].p = p;
    pool[slot].cap = cap;
}

/* ---- user reduction ops: ccq's kernels ------------------------------------------------ */

#define USER_OP(DT, RO)                                                                            \
    static void uop_##DT##_##RO(void *in, void *inout, int *len, MPI_Datatype *t)                  \
    {                                                                                              \
        const void *s[2] = {in, inout};                                                            \
        void *d[1] = {inout};                                                                      \
        (void)t;                                                                                   \
        ccq_host_reduce_range(DT, RO, 2, s, 1, d, 0, (size_t)*len, 0);                             \
    }
#define USER_OPS(DT)                                                                               \
    USER_OP(DT, CCQ_SUM) USER_OP(DT, CCQ_PROD) USER_OP(DT, CCQ_MAX) USER_OP(DT, CCQ_MIN)
USER_OPS(CCQ_INT8)
USER_OPS(CCQ_UINT8)
USER_OPS(CCQ_FLOAT16)
USER_OPS(CCQ_BFLOAT16)
USER_OPS(CCQ_FLOAT8E4M3)
USER_OPS(CCQ_FLOAT8E5M2)
USER_OP(CCQ_INT32, CCQ_MAX)
USER_OP(CCQ_INT32, CCQ_MIN)
USER_OP(CCQ_UINT32, CCQ_MAX)
USER_OP(CCQ_UINT32, CCQ_MIN)
USER_OP(CCQ_INT64, CCQ_MAX)
USER_OP(CCQ_INT64, CCQ_MIN)
USER_OP(CCQ_UINT64, CCQ_MAX)
USER_OP(CCQ_UINT64, CCQ_MIN)
USER_OP(CCQ_FLOAT32, CCQ_MAX)
USER_OP(CCQ_FLOAT32, CCQ_MIN)
USER_OP(CCQ_FLOAT64, CCQ_MAX)
USER_OP(CCQ_FLOAT64, CCQ_MIN)

static int make_types(void)
{
    int rc;
    if (types_made)
        return MPI_SUCCESS;
    rc = MPI_Type_contiguous(2, MPI_BYTE, &t_byte2);
    if (rc == MPI_SUCCESS)
        rc = MPI_Type_commit(&t_byte2);
    if (rc == MPI_SUCCESS)
        rc = MPI_Type_contiguous(1, MPI_BYTE, &t_byte1);
    if (rc == MPI_SUCCESS)
        rc = MPI_Type_commit(&t_byte1);
#define MK(DT, RO)                                                                                 \
    if (rc == MPI_SUCCESS)                                                                         \
        rc = MPI_Op_create(uop_##DT##_##RO, 1, &user_ops[DT][RO]);                                 \
    if (rc == MPI_SUCCESS)                                                                         \
        user_op_made[DT][RO] = true;
#define MKS(DT) MK(DT, CCQ_SUM) MK(DT, CCQ_PROD) MK(DT, CCQ_MAX) MK(DT, CCQ_MIN)
    MKS(CCQ_INT8)
    MKS(CCQ_UINT8)
    MKS(CCQ_FLOAT16)
    MKS(CCQ_BFLOAT16)
    MKS(CCQ_FLOAT8E4M3)
    MKS(CCQ_FLOAT8E5M2)
    MK(CCQ_INT32, CCQ_MAX)
    MK(CCQ_INT32, CCQ_MIN)
    MK(CCQ_UINT32, CCQ_MAX)
    MK(CCQ_UINT32, CCQ_MIN)
    MK(CCQ_INT64, CCQ_MAX)
    MK(CCQ_INT64, CCQ_MIN)
    MK(CCQ_UINT64, CCQ_MAX)
    MK(CCQ_UINT64, CCQ_MIN)
    MK(CCQ_FLOAT32, CCQ_MAX)
    MK(CCQ_FLOAT32, CCQ_MIN)
    MK(CCQ_FLOAT64, CCQ_MAX)
    MK(CCQ_FLOAT64, CCQ_MIN)
#undef MKS
#undef MK
    if (rc == MPI_SUCCESS)
        types_made = true;
    return rc;
}

/* The MPI type that moves elements of dt (and reduces them with built-in ops). */
static MPI_Datatype mpi_type(ccq_dtype dt)
{
    switch (dt) {
    case CCQ_INT8:
        return MPI_INT8_T;
    case CCQ_UINT8:
        return MPI_UINT8_T;
    case CCQ_INT32:
        return MPI_INT32_T;
    case CCQ_UINT32:
        return MPI_UINT32_T;
    case CCQ_INT64:
        return MPI_INT64_T;
    case CCQ_UINT64:
        return MPI_UINT64_T;
    case CCQ_FLOAT32:
        return MPI_FLOAT;
    case CCQ_FLOAT64:
        return MPI_DOUBLE;
    case CCQ_FLOAT16:
    case CCQ_BFLOAT16:
        return t_byte2;
    default:
        return t_byte1;
    }
}

/* The type and op of a reduction of dt by ro (AVG reduces as SUM). */
static void mpi_reduction(ccq_dtype dt, ccq_reduce_op ro, MPI_Datatype *t, MPI_Op *op)
{
    bool wrap;
    if (ro == CCQ_AVG)
        ro = CCQ_SUM;
    *t = mpi_type(dt);
    if (user_op_made[dt][ro]) {
        *op = user_ops[dt][ro];
        return;
    }
    wrap = ro == CCQ_SUM || ro == CCQ_PROD;
    if (wrap && dt == CCQ_INT8)
        *t = MPI_UINT8_T;
    else if (wrap && dt == CCQ_INT32)
        *t = MPI_UINT32_T;
    else if (wrap && dt == CCQ_INT64)
        *t = MPI_UINT64_T;
    *op = ro == CCQ_SUM ? MPI_SUM : ro == CCQ_PROD ? MPI_PROD : ro == CCQ_MAX ? MPI_MAX : MPI_MIN;
}

/* ---- local steps ---------------------------------------------------------------------- */

/* x[i] /= n for AVG (reduce.h: the kernels' semantics, vectorized; a power-of-two n
 * multiplies by 1/n, which gives the same bits). */
static void divide(ccq_dtype dt, void *buf, size_t count, uint32_t n)
{
    ccq_host_divide(dt, buf, buf, count, n);
}

static void copy(void *dst, const void *src, size_t bytes)
{
    if (dst != src && bytes > 0)
        memmove(dst, src, bytes);
}

/* Combine the local parts' src (offset `off` bytes, `count` elements) into dst. */
static void combine(const ccq_be_op *op, size_t off, size_t count, void *dst)
{
    const void *src[CCQ_MAX_DEVICES];
    void *d[1] = {dst};
    ccq_reduce_op ro = op->redop == CCQ_AVG ? CCQ_SUM : (ccq_reduce_op)op->redop;
    for (uint32_t k = 0; k < op->nparts; k++)
        src[k] = (const char *)op->parts[k].src + off;
    ccq_host_reduce_range((ccq_dtype)op->dtype, ro, op->nparts, src, 1, d, 0, count, 0);
}

/* ---- the communicator ----------------------------------------------------------------- */

static ccq_status mpi_err(ccq_errbuf *err, int rc, const char *what)
{
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(rc, s, &n) != MPI_SUCCESS)
        snprintf(s, sizeof s, "MPI error %d", rc);
    /* bounded: MPICH's MPI_MAX_ERROR_STRING is the size of the whole detail */
    snprintf(err->msg, sizeof err->msg, "%.64s failed: %.400s", what, s);
    return CCQ_ERR_BACKEND;
}

ccq_status ccq_hmpi_ready(ccq_errbuf *err)
{
    int init = 0, fin = 0, level = MPI_THREAD_SINGLE;

    ccq_mpi_lock();
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin)
        MPI_Query_thread(&level);
    ccq_mpi_unlock();
    if (!init || fin) {
        snprintf(err->msg, sizeof err->msg,
                 "the host backend cannot span processes here: it moves data between them with "
                 "MPI, which is %s in this "
                 "process: launch the job under mpirun (or mpiexec) with bootstrap \"mpi\" "
                 "(CCQ_BOOTSTRAP=mpi), or initialise MPI before ccq_runtime_create",
                 fin ? "already finalized" : "not initialised");
        return CCQ_ERR_UNSUPPORTED;
    }
    if (level < MPI_THREAD_SERIALIZED) {
        snprintf(err->msg, sizeof err->msg,
                 "MPI was initialised at %s; the host backend calls MPI from ccq's scheduler "
                 "thread, so it needs MPI_THREAD_SERIALIZED (MPI_THREAD_MULTIPLE if the "
                 "application calls MPI while ccq runs): initialise MPI with MPI_Init_thread",
                 level == MPI_THREAD_SINGLE ? "MPI_THREAD_SINGLE" : "MPI_THREAD_FUNNELED");
        return CCQ_ERR_UNSUPPORTED;
    }
    return CCQ_OK;
}

void ccq_hmpi_root_blob(uint32_t world_rank, void *blob)
{
    /* The lowest member's world rank and how many communicators it made: two communicators
     * forming at once differ in one or the other. */
    static uint32_t made; /* scheduler threads of several runtimes: under the lock */
    uint32_t v[2];
    ccq_mpi_lock();
    v[0] = world_rank;
    v[1] = made++;
    ccq_mpi_unlock();
    memcpy(blob, v, sizeof v);
}

static void comm_unref(ccq_hmpi_comm *c);

static int tag_ub_of(MPI_Comm comm)
{
    int flag = 0, *attr = NULL;
    MPI_Comm_get_attr(comm, MPI_TAG_UB, &attr, &flag);
    return flag && attr != NULL && *attr > 0 ? *attr : 32767;
}

ccq_status ccq_hmpi_world_post(int64_t mpi_comm, ccq_hmpi_world **out, ccq_errbuf *err)
{
    ccq_hmpi_world *w;
    ccq_status st;
    int rc;

    *out = NULL;
    if ((st = ccq_hmpi_ready(err)) != CCQ_OK)
        return st;
    w = calloc(1, sizeof *w);
    if (w == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    w->mpi_comm = mpi_comm;
    ccq_mpi_lock();
    rc = MPI_Comm_idup(mpi_comm >= 0 ? MPI_Comm_f2c((MPI_Fint)mpi_comm) : MPI_COMM_WORLD, &w->dup,
                       &w->req);
    ccq_mpi_unlock();
    if (rc != MPI_SUCCESS) {
        free(w);
        return mpi_err(err, rc, "MPI_Comm_idup of the world communicator");
    }
    *out = w;
    return CCQ_OK;
}

ccq_status ccq_hmpi_world_test(ccq_hmpi_world *w, ccq_errbuf *err)
{
    int flag = 0, rc;
    if (w->done)
        return CCQ_OK;
    ccq_mpi_lock();
    rc = MPI_Test(&w->req, &flag, MPI_STATUS_IGNORE);
    if (rc == MPI_SUCCESS && flag) {
        MPI_Comm_set_errhandler(w->dup, MPI_ERRORS_RETURN);
        w->done = true;
    }
    ccq_mpi_unlock();
    if (rc != MPI_SUCCESS)
        return mpi_err(err, rc, "MPI_Comm_idup of the world communicator");
    return w->done ? CCQ_OK : CCQ_IN_PROGRESS;
}

void ccq_hmpi_world_free(ccq_hmpi_world *w)
{
    if (w == NULL)
        return;
    ccq_mpi_lock();
    if (w->done) /* pairs still holding abandoned operations borrow it: keep it then */
        MPI_Comm_free(&w->dup);
    ccq_mpi_unlock();
    free(w);
}

ccq_status ccq_hmpi_pair_create(const ccq_be_comm_desc *d, ccq_hmpi_world *w, const void *blob,
                                size_t blob_len, ccq_hmpi_comm **out, ccq_errbuf *err)
{
    ccq_hmpi_comm *c = calloc(1, sizeof *c);
    uint32_t v[2] = {0, 0};
    int ub;

    *out = NULL;
    if (c != NULL) {
        c->nl = malloc(4 * sizeof *c->nl);
        c->procs = malloc(2 * sizeof *c->procs);
    }
    if (c == NULL || c->nl == NULL || c->procs == NULL) {
        if (c != NULL) {
            free(c->nl);
            free(c->procs);
        }
        free(c);
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    if (blob_len == CCQ_HMPI_BLOB_LEN)
        memcpy(v, blob, sizeof v);
    c->refs = 1;
    c->pair = true;
    c->p2p = w->dup;
    c->mc = MPI_COMM_NULL;
    c->mpi_comm = w->mpi_comm;
    memcpy(c->blob, v, sizeof v);
    c->nprocs = 2;
    c->fr = c->nl + 2;
    c->nl[0] = c->nl[1] = 1;
    c->fr[0] = 0;
    c->fr[1] = 1;
    c->nranks = 2;
    c->first_rank = d->first_rank;
    c->nlocal = 1;
    c->procs[0] = d->procs[0];
    c->procs[1] = d->procs[1];
    c->me = d->world_rank == d->procs[0] ? 0 : 1;
    ccq_mpi_lock();
    ub = tag_ub_of(w->dup);
    if (make_types() != MPI_SUCCESS) {
        ccq_mpi_unlock();
        comm_unref(c);
        snprintf(err->msg, sizeof err->msg, "MPI_Type_contiguous / MPI_Op_create failed");
        return CCQ_ERR_BACKEND;
    }
    ccq_mpi_unlock();
    /* The pair's identity, from what the lower process chose (its world rank, how many
     * communicators it made): unique among the pairs of these two processes while the
     * count stays below 2^15; ranks 0 and 1 send under two consecutive tags. */
    c->pair_tag = (int)((((uint64_t)v[0] << 16 | (v[1] & 0x7fffu) << 1)) % (uint64_t)(ub & ~1));
    *out = c;
    return CCQ_OK;
}

static void comm_unref(ccq_hmpi_comm *c)
{
    if (--c->refs > 0)
        return;
    if (c->mc != MPI_COMM_NULL)
        MPI_Comm_free(&c->mc);
    free(c->nl);
    free(c->procs);
    free(c);
}

/* An MPI communicator over world ranks[0..n-1] only, its MPI_Comm_create_group tag from the
 * lowest member's blob v (two communicators forming at once differ in it). Collective over
 * the members only (MPI_Comm_split would need every process) and blocking until all of
 * them call it. Lock held. */
static ccq_status group_comm(MPI_Comm world, const int *ranks, int n, const uint32_t *v,
                             MPI_Comm *out, ccq_errbuf *err)
{
    MPI_Group wg = MPI_GROUP_NULL, g = MPI_GROUP_NULL;
    int tag = (int)(((uint64_t)v[0] * 65536u + (v[1] & 0xffffu)) % (uint64_t)tag_ub_of(world));
    int rc = MPI_Comm_group(world, &wg);

    if (rc == MPI_SUCCESS)
        rc = MPI_Group_incl(wg, n, ranks, &g);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_create_group(world, g, tag, out);
    if (g != MPI_GROUP_NULL)
        MPI_Group_free(&g);
    if (wg != MPI_GROUP_NULL)
        MPI_Group_free(&wg);
    if (rc != MPI_SUCCESS)
        return mpi_err(err, rc, "MPI_Comm_create_group");
    MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
    return CCQ_OK;
}

ccq_status ccq_hmpi_comm_create(const ccq_be_comm_desc *d, int64_t mpi_comm, const void *blob,
                                size_t blob_len, ccq_hmpi_comm **out, ccq_errbuf *err)
{
    ccq_hmpi_comm *c;
    MPI_Comm world = MPI_COMM_WORLD;
    int *ranks = NULL, rc;
    uint32_t v[2] = {0, 0};
    ccq_status st = CCQ_OK;

    *out = NULL;
    if ((st = ccq_hmpi_ready(err)) != CCQ_OK)
        return st;
    if (blob_len == CCQ_HMPI_BLOB_LEN)
        memcpy(v, blob, sizeof v);
    c = calloc(1, sizeof *c);
    ranks = malloc(d->nprocs * sizeof *ranks);
    if (c != NULL) {
        c->nl = malloc(2 * d->nprocs * sizeof *c->nl);
        c->procs = malloc(d->nprocs * sizeof *c->procs);
    }
    if (c == NULL || ranks == NULL || c->nl == NULL || c->procs == NULL) {
        if (c != NULL) {
            free(c->nl);
            free(c->procs);
        }
        free(c);
        free(ranks);
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    c->refs = 1;
    c->mc = MPI_COMM_NULL;
    c->nprocs = (int)d->nprocs;
    c->fr = c->nl + d->nprocs;
    c->nranks = d->nranks;
    c->first_rank = d->first_rank;
    c->nlocal = d->nlocal;
    c->me = -1;
    for (uint32_t p = 0; p < d->nprocs; p++) {
        ranks[p] = (int)d->procs[p];
        c->procs[p] = d->procs[p];
        if (d->procs[p] == d->world_rank)
            c->me = (int)p;
    }

    ccq_mpi_lock();
    if (mpi_comm >= 0)
        world = MPI_Comm_f2c((MPI_Fint)mpi_comm);
    rc = make_types();
    if (rc != MPI_SUCCESS) {
        st = mpi_err(err, rc, "MPI_Type_contiguous / MPI_Op_create");
        goto out;
    }
    if ((st = group_comm(world, ranks, c->nprocs, v, &c->mc, err)) != CCQ_OK)
        goto out;
    {
        int mine = (int)d->nlocal;
        rc = MPI_Allgather(&mine, 1, MPI_INT, c->nl, 1, MPI_INT, c->mc);
        if (rc != MPI_SUCCESS) {
            st = mpi_err(err, rc, "MPI_Allgather of the local rank counts");
            goto out;
        }
    }
    {
        int f = 0;
        for (int p = 0; p < c->nprocs; p++) {
            c->fr[p] = f;
            f += c->nl[p];
        }
        if ((uint32_t)f != d->nranks || c->me < 0 || (uint32_t)c->fr[c->me] != d->first_rank) {
            snprintf(err->msg, sizeof err->msg,
                     "the member processes disagree on the communicator's ranks (%d in all, "
                     "this process's first %d; expected %u and %u)",
                     f, c->me >= 0 ? c->fr[c->me] : -1, d->nranks, d->first_rank);
            st = CCQ_ERR_MISMATCH;
        }
    }
out:
    if (st != CCQ_OK)
        comm_unref(c);
    ccq_mpi_unlock();
    free(ranks);
    if (st == CCQ_OK)
        *out = c;
    return st;
}

void ccq_hmpi_comm_destroy(ccq_hmpi_comm *c)
{
    if (c == NULL)
        return;
    ccq_mpi_lock();
    comm_unref(c);
    ccq_mpi_unlock();
}

/* ---- operations ----------------------------------------------------------------------- */

static ccq_status launch(ccq_hmpi_op *h, bool collective, ccq_hmpi_op **out, ccq_errbuf *err);
static ccq_hmpi_op *op_new(ccq_hmpi_comm *c, const ccq_be_op *op, uint64_t now_ns, ccq_errbuf *err);
static int post_fused(ccq_hmpi_op *h);
static int post_min(ccq_hmpi_op *h);
static void finish_fused(ccq_hmpi_op *h);

static void op_free(ccq_hmpi_op *h)
{
    for (int k = 0; k < H_NBUF; k++)
        pool_put(h->buf[k], h->cap[k]);
    comm_unref(h->c);
    free(h);
}

static void *scratch(ccq_hmpi_op *h, int k, size_t bytes)
{
    h->buf[k] = pool_get(bytes ? bytes : 1, &h->cap[k]);
    return h->buf[k];
}

/* The process owning rank r. */
static int owner(const ccq_hmpi_comm *c, uint32_t r)
{
    int p = 0;
    while (p + 1 < c->nprocs && (uint32_t)c->fr[p + 1] <= r)
        p++;
    return p;
}

static const char *kind_name(uint8_t kind)
{
    return kind < CCQ_KIND_COUNT_ ? ccq_kinds[kind].name : "?";
}

static const char *dtype_name(uint8_t dt)
{
    static const char *const names[CCQ_DTYPE_COUNT_] = {
        "int8",    "uint8",   "int32",   "uint32",   "int64",      "uint64",
        "float16", "float32", "float64", "bfloat16", "float8e4m3", "float8e5m2"};
    return dt < CCQ_DTYPE_COUNT_ ? names[dt] : "?";
}

/* Post the MPI operation of op (after the local combine). Lock held. */
static int post(ccq_hmpi_op *h, const ccq_be_op *op)
{
    ccq_hmpi_comm *c = h->c;
    ccq_dtype dt = (ccq_dtype)op->dtype;
    size_t es = esize(dt), cnt = op->count, blk = cnt * es;
    uint32_t nl = op->nparts, nr = c->nranks;
    int n = (int)cnt, me = c->me, P = c->nprocs;
    int *cnts = h->v, *disp = h->v + P, *cnts2 = h->v + 2 * P, *disp2 = h->v + 3 * P;
    MPI_Datatype t = mpi_type(dt), rt;
    MPI_Op mop;
    const ccq_be_part *pt = op->parts;

    switch (op->kind) {
    case CCQ_KIND_ALL_REDUCE: {
        const void *in = pt[0].src;
        if (nl > 1 || pt[0].src == pt[0].dst) {
            in = scratch(h, H_BUF_SCRATCH, blk);
            if (in == NULL)
                return -1;
            if (nl > 1)
                combine(op, 0, cnt, (void *)in);
            else
                copy((void *)in, pt[0].src, blk);
        }
        h->out = pt[0].dst;
        mpi_reduction(dt, (ccq_reduce_op)op->redop, &rt, &mop);
        h->what = "MPI_Iallreduce";
        return MPI_Iallreduce(in, h->out, n, rt, mop, c->mc, &h->req);
    }
    case CCQ_KIND_REDUCE: {
        uint32_t rl = op->root - c->first_rank; /* the root's local part, if here */
        int rp = owner(c, op->root);
        const void *in = pt[0].src;
        void *outp = rp == me ? pt[rl].dst : NULL;
        if (nl > 1 || (outp != NULL && outp == in)) {
            in = scratch(h, H_BUF_SCRATCH, blk);
            if (in == NULL)
                return -1;
            if (nl > 1)
                combine(op, 0, cnt, (void *)in);
            else
                copy((void *)in, pt[0].src, blk);
        }
        h->out = outp;
        mpi_reduction(dt, (ccq_reduce_op)op->redop, &rt, &mop);
        h->what = "MPI_Ireduce";
        return MPI_Ireduce(in, outp, n, rt, mop, rp, c->mc, &h->req);
    }
    case CCQ_KIND_BROADCAST: {
        int rp = owner(c, op->root);
        void *b = rp == me ? (void *)pt[op->root - c->first_rank].src : pt[0].dst;
        h->out = b;
        h->what = "MPI_Ibcast";
        return MPI_Ibcast(b, n, t, rp, c->mc, &h->req);
    }
    case CCQ_KIND_ALL_GATHER: {
        char *d0 = pt[0].dst;
        for (uint32_t k = 0; k < nl; k++)
            copy(d0 + (size_t)(c->first_rank + k) * blk, pt[k].src, blk);
        for (int p = 0; p < P; p++) {
            cnts[p] = c->nl[p] * n;
            disp[p] = c->fr[p] * n;
        }
        h->out = d0;
        h->what = "MPI_Iallgatherv";
        return MPI_Iallgatherv(MPI_IN_PLACE, 0, t, d0, cnts, disp, t, c->mc, &h->req);
    }
    case CCQ_KIND_REDUCE_SCATTER: {
        /* Combine all local srcs (nr blocks) into scratch, MPI_Ireduce_scatter to this
         * process's nl blocks, then each local rank takes its block. */
        const char *s0 = pt[0].src, *d0 = pt[0].dst;
        bool alias = d0 >= s0 && d0 < s0 + blk * nr; /* in place: MPI must not read dst */
        void *in = nl == 1 && !alias ? (void *)s0 : scratch(h, H_BUF_SCRATCH, blk * nr);
        void *r = nl == 1 ? pt[0].dst : scratch(h, H_BUF_RECV, blk * nl);
        if (in == NULL || r == NULL)
            return -1;
        if (in != s0)
            combine(op, 0, cnt * nr, in);
        for (int p = 0; p < P; p++)
            cnts[p] = c->nl[p] * n;
        h->out = r;
        mpi_reduction(dt, (ccq_reduce_op)op->redop, &rt, &mop);
        h->what = "MPI_Ireduce_scatter";
        return MPI_Ireduce_scatter(in, r, cnts, rt, mop, c->mc, &h->req);
    }
    case CCQ_KIND_ALL_TO_ALL: {
        /* Pack per destination process q: [local rank k][q's rank j] = block fr[q]+j of
         * src_k; receive from p: [p's rank i][local rank j]. */
        char *sb = scratch(h, H_BUF_SCRATCH, blk * nr * nl);
        char *rb = scratch(h, H_BUF_RECV, blk * nr * nl);
        size_t o = 0;
        if (sb == NULL || rb == NULL)
            return -1;
        for (int q = 0; q < P; q++) {
            cnts[q] = (int)nl * c->nl[q] * n;
            disp[q] = (int)(o / es);
            for (uint32_t k = 0; k < nl; k++)
                for (int j = 0; j < c->nl[q]; j++, o += blk)
                    copy(sb + o, (const char *)pt[k].src + (size_t)(c->fr[q] + j) * blk, blk);
        }
        for (int p = 0, ro = 0; p < P; p++) {
            cnts2[p] = c->nl[p] * (int)nl * n;
            disp2[p] = ro;
            ro += cnts2[p];
        }
        h->out = rb;
        h->what = "MPI_Ialltoallv";
        return MPI_Ialltoallv(sb, cnts, disp, t, rb, cnts2, disp2, t, c->mc, &h->req);
    }
    case CCQ_KIND_GATHER: {
        int rp = owner(c, op->root);
        for (int p = 0; p < P; p++) {
            cnts[p] = c->nl[p] * n;
            disp[p] = c->fr[p] * n;
        }
        h->what = "MPI_Igatherv";
        if (rp == me) {
            char *d = pt[op->root - c->first_rank].dst;
            for (uint32_t k = 0; k < nl; k++)
                copy(d + (size_t)(c->first_rank + k) * blk, pt[k].src, blk);
            return MPI_Igatherv(MPI_IN_PLACE, 0, t, d, cnts, disp, t, rp, c->mc, &h->req);
        }
        {
            const void *in = pt[0].src;
            if (nl > 1) {
                char *s = scratch(h, H_BUF_SCRATCH, blk * nl);
                if (s == NULL)
                    return -1;
                for (uint32_t k = 0; k < nl; k++)
                    copy(s + k * blk, pt[k].src, blk);
                in = s;
            }
            return MPI_Igatherv(in, (int)nl * n, t, NULL, cnts, disp, t, rp, c->mc, &h->req);
        }
    }
    case CCQ_KIND_SCATTER: {
        int rp = owner(c, op->root);
        for (int p = 0; p < P; p++) {
            cnts[p] = c->nl[p] * n;
            disp[p] = c->fr[p] * n;
        }
        h->what = "MPI_Iscatterv";
        if (rp == me) {
            const char *s = pt[op->root - c->first_rank].src;
            /* The root's own blocks never cross MPI; in place (dst = src + root * count)
             * the root's block is already there. */
            for (uint32_t k = 0; k < nl; k++)
                copy(pt[k].dst, s + (size_t)(c->first_rank + k) * blk, blk);
            h->out = NULL;
            return MPI_Iscatterv(s, cnts, disp, t, MPI_IN_PLACE, 0, t, rp, c->mc, &h->req);
        }
        {
            void *r = nl == 1 ? pt[0].dst : scratch(h, H_BUF_RECV, blk * nl);
            if (r == NULL)
                return -1;
            h->out = r;
            return MPI_Iscatterv(NULL, cnts, disp, t, r, (int)nl * n, t, rp, c->mc, &h->req);
        }
    }
    case CCQ_KIND_SEND:
    case CCQ_KIND_RECV: {
        /* One half of a pair whose other half is in the peer process. The pair's MPI
         * communicator is its own, and MPI does not overtake messages of one sender on one
         * communicator and tag, so halves pair in the runtime's per-pair sequence; the tag
         * carries that sequence too (a check, and a reader's help in MPI traces). */
        int peer = owner(c, op->peer), tag;
        if (c->pair) {
            /* On the world's duplicate: the peer's world rank, the pair's tag of the sender */
            tag = c->pair_tag + (op->kind == CCQ_KIND_SEND ? c->me : 1 - c->me);
            peer = (int)c->procs[peer];
        } else {
            tag = (int)(op->seq % (uint64_t)tag_ub_of(c->mc));
        }
        MPI_Comm pc = c->pair ? c->p2p : c->mc;
        if (op->kind == CCQ_KIND_SEND) {
            const void *s = pt[0].src;
            /* Always from a copy: the send completes at once (ccq_hmpi_detach), so a send
             * then a recv on one stream (a ring) cannot wait for the peer's send behind its
             * own; also covers stage_src (a later op of its stream in the batch writes src). */
            {
                void *cp = scratch(h, H_BUF_SCRATCH, blk);
                if (cp == NULL)
                    return -1;
                copy(cp, s, blk);
                s = cp;
            }
            h->what = "MPI_Isend";
            return MPI_Isend(s, n, t, peer, tag, pc, &h->req);
        }
        h->what = "MPI_Irecv";
        return MPI_Irecv(pt[0].dst, n, t, peer, tag, pc, &h->req);
    }
    default:
        h->what = "?";
        return MPI_ERR_OP;
    }
}

/* After MPI completed: write every local output. */
static void finish(ccq_hmpi_op *h, const ccq_be_op *op)
{
    ccq_hmpi_comm *c = h->c;
    ccq_dtype dt = (ccq_dtype)op->dtype;
    size_t es = esize(dt), cnt = op->count, blk = cnt * es;
    uint32_t nl = op->nparts;
    bool avg = op->redop == CCQ_AVG;
    const ccq_be_part *pt = op->parts;

    switch (op->kind) {
    case CCQ_KIND_ALL_REDUCE:
        if (avg)
            divide(dt, h->out, cnt, c->nranks);
        for (uint32_t k = 1; k < nl; k++)
            copy(pt[k].dst, h->out, blk);
        break;
    case CCQ_KIND_REDUCE:
        if (avg && h->out != NULL)
            divide(dt, h->out, cnt, c->nranks);
        break;
    case CCQ_KIND_BROADCAST:
        for (uint32_t k = 0; k < nl; k++)
            copy(pt[k].dst, h->out, blk);
        break;
    case CCQ_KIND_ALL_GATHER:
        for (uint32_t k = 1; k < nl; k++)
            copy(pt[k].dst, h->out, blk * c->nranks);
        break;
    case CCQ_KIND_REDUCE_SCATTER:
        if (avg)
            divide(dt, h->out, cnt * nl, c->nranks);
        for (uint32_t k = 0; k < nl; k++)
            copy(pt[k].dst, (const char *)h->out + k * blk, blk);
        break;
    case CCQ_KIND_ALL_TO_ALL: {
        const char *rb = h->out;
        for (int p = 0; p < c->nprocs; p++)
            for (int i = 0; i < c->nl[p]; i++)
                for (uint32_t j = 0; j < nl; j++, rb += blk)
                    copy((char *)pt[j].dst + (size_t)(c->fr[p] + i) * blk, rb, blk);
        break;
    }
    case CCQ_KIND_SCATTER:
        if (h->out != NULL)
            for (uint32_t k = 0; k < nl; k++)
                copy(pt[k].dst, (const char *)h->out + k * blk, blk);
        break;
    default:
        break;
    }
}

ccq_status ccq_hmpi_start(ccq_hmpi_comm *c, const ccq_be_op *op, uint64_t now_ns, ccq_hmpi_op **out,
                          ccq_errbuf *err)
{
    ccq_hmpi_op *h;
    const ccq_kind_info *ki = &ccq_kinds[op->kind < CCQ_KIND_COUNT_ ? op->kind : 0];
    size_t total = op->count;

    *out = NULL;
    if (ki->src_n || ki->dst_n) /* the v collectives count every rank's block */
        total = (double)op->count * c->nranks * (op->nparts ? op->nparts : 1) > (double)INT_MAX
                    ? (size_t)INT_MAX + 1
                    : op->count * c->nranks * (op->nparts ? op->nparts : 1);
    if (op->count > (size_t)INT_MAX || total > (size_t)INT_MAX) {
        snprintf(err->msg, sizeof err->msg,
                 "%s of %zu elements on %u ranks across processes: MPI's int counts hold at "
                 "most %d elements per call",
                 kind_name(op->kind), op->count, c->nranks, INT_MAX);
        return CCQ_ERR_UNSUPPORTED;
    }
    if ((h = op_new(c, op, now_ns, err)) == NULL)
        return CCQ_ERR_NO_MEMORY;
    return launch(h, ccq_kinds[op->kind].collective, out, err);
}

/* A new operation on c (with room for the v collectives' counts), or NULL (err set). */
static ccq_hmpi_op *op_new(ccq_hmpi_comm *c, const ccq_be_op *op, uint64_t now_ns, ccq_errbuf *err)
{
    ccq_hmpi_op *h = calloc(1, sizeof *h + 4 * (size_t)c->nprocs * sizeof(int));
    if (h == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return NULL;
    }
    h->v = (int *)(h + 1);
    h->c = c;
    h->op = op;
    h->req = MPI_REQUEST_NULL;
    h->start_ns = now_ns;
    return h;
}

/* Post the MPI operation h describes (one op, a fused group or an agreement) and hand it
 * out, or free it and say why. */
static ccq_status launch(ccq_hmpi_op *h, bool collective, ccq_hmpi_op **out, ccq_errbuf *err)
{
    ccq_hmpi_comm *c = h->c;
    int rc;

    ccq_mpi_lock();
    if (c->pair && c->mc == MPI_COMM_NULL && collective) {
        /* A collective on a pair's communicator: its own MPI communicator, at first use. */
        int ranks[2] = {(int)c->procs[0], (int)c->procs[1]};
        MPI_Comm world = c->mpi_comm >= 0 ? MPI_Comm_f2c((MPI_Fint)c->mpi_comm) : MPI_COMM_WORLD;
        ccq_status st = group_comm(world, ranks, 2, c->blob, &c->mc, err);
        if (st != CCQ_OK) {
            ccq_mpi_unlock();
            free(h);
            return st;
        }
    }
    c->refs++;
    rc = h->minvec != NULL ? post_min(h) : h->ops != NULL ? post_fused(h) : post(h, h->op);
    if (rc != MPI_SUCCESS) {
        ccq_status st;
        if (rc == -1) {
            snprintf(err->msg, sizeof err->msg, "out of memory for MPI scratch");
            st = CCQ_ERR_NO_MEMORY;
        } else {
            st = mpi_err(err, rc, h->what);
        }
        op_free(h);
        ccq_mpi_unlock();
        return st;
    }
    ccq_mpi_unlock();
    *out = h;
    return CCQ_OK;
}

/* ---- fusion (docs/fusion.md) ---------------------------------------------------------- */

/*
 * Post one MPI operation over a fused group's ops (h->ops, h->nops; h->total elements of
 * their blocks), their blocks laid out so one call moves all of them (off_i: the elements of
 * the ops before op i; T = h->total):
 *  - all_reduce: [op 0 | op 1 | ...], each the local combine of the op's parts;
 *  - broadcast: the root process packs its parts' src the same way;
 *  - all_gather: each process sends [op i: its nl ranks' blocks] (nl * T elements), received
 *    per process p at fr[p] * T: [op i: p's nl[p] blocks at nl[p] * off_i];
 *  - reduce_scatter: the combined input ordered per destination process p (at fr[p] * T):
 *    [op i: blocks fr[p] .. fr[p] + nl[p] - 1 of its combined input], so MPI's counts are
 *    nl[p] * T; this process gets [op i: its nl blocks at nl * off_i].
 * Each element meets the same local kernel and the same MPI datatype and op as unfused.
 * Lock held.
 */
static int post_fused(ccq_hmpi_op *h)
{
    ccq_hmpi_comm *c = h->c;
    const ccq_be_op *op0 = h->ops[0];
    ccq_dtype dt = (ccq_dtype)op0->dtype;
    size_t es = esize(dt), T = h->total, off;
    uint32_t nl = op0->nparts, nr = c->nranks;
    int P = c->nprocs, me = c->me;
    int *cnts = h->v, *disp = h->v + P;
    MPI_Datatype t = mpi_type(dt), rt;
    MPI_Op mop;

    switch (op0->kind) {
    case CCQ_KIND_ALL_REDUCE: {
        char *in = scratch(h, H_BUF_SCRATCH, T * es), *o = scratch(h, H_BUF_RECV, T * es);
        if (in == NULL || o == NULL)
            return -1;
        off = 0;
        for (uint32_t i = 0; i < h->nops; i++) {
            const ccq_be_op *op = h->ops[i];
            if (nl > 1)
                combine(op, 0, op->count, in + off * es);
            else
                copy(in + off * es, op->parts[0].src, op->count * es);
            off += op->count;
        }
        h->out = o;
        mpi_reduction(dt, (ccq_reduce_op)op0->redop, &rt, &mop);
        h->what = "MPI_Iallreduce";
        return MPI_Iallreduce(in, o, (int)T, rt, mop, c->mc, &h->req);
    }
    case CCQ_KIND_BROADCAST: {
        int rp = owner(c, op0->root);
        char *b = scratch(h, H_BUF_SCRATCH, T * es);
        if (b == NULL)
            return -1;
        off = 0;
        for (uint32_t i = 0; rp == me && i < h->nops; i++) {
            const ccq_be_op *op = h->ops[i];
            copy(b + off * es, op->parts[op->root - c->first_rank].src, op->count * es);
            off += op->count;
        }
        h->out = b;
        h->what = "MPI_Ibcast";
        return MPI_Ibcast(b, (int)T, t, rp, c->mc, &h->req);
    }
    case CCQ_KIND_ALL_GATHER: {
        char *sb = scratch(h, H_BUF_SCRATCH, nl * T * es),
             *rb = scratch(h, H_BUF_RECV, nr * T * es);
        if (sb == NULL || rb == NULL)
            return -1;
        off = 0;
        for (uint32_t i = 0; i < h->nops; i++) {
            const ccq_be_op *op = h->ops[i];
            for (uint32_t k = 0; k < nl; k++)
                copy(sb + (nl * off + k * op->count) * es, op->parts[k].src, op->count * es);
            off += op->count;
        }
        for (int p = 0; p < P; p++) {
            cnts[p] = c->nl[p] * (int)T;
            disp[p] = c->fr[p] * (int)T;
        }
        h->out = rb;
        h->what = "MPI_Iallgatherv";
        return MPI_Iallgatherv(sb, (int)(nl * T), t, rb, cnts, disp, t, c->mc, &h->req);
    }
    case CCQ_KIND_REDUCE_SCATTER: {
        char *in = scratch(h, H_BUF_SCRATCH, nr * T * es), *r = scratch(h, H_BUF_RECV, nl * T * es);
        if (in == NULL || r == NULL)
            return -1;
        off = 0;
        for (uint32_t i = 0; i < h->nops; i++) {
            const ccq_be_op *op = h->ops[i];
            size_t cnt = op->count;
            for (int p = 0; p < P; p++) {
                char *d = in + ((size_t)c->fr[p] * T + (size_t)c->nl[p] * off) * es;
                size_t first = (size_t)c->fr[p] * cnt, n = (size_t)c->nl[p] * cnt;
                if (nl > 1)
                    combine(op, first * es, n, d);
                else
                    copy(d, (const char *)op->parts[0].src + first * es, n * es);
            }
            off += cnt;
        }
        for (int p = 0; p < P; p++)
            cnts[p] = c->nl[p] * (int)T;
        h->out = r;
        mpi_reduction(dt, (ccq_reduce_op)op0->redop, &rt, &mop);
        h->what = "MPI_Ireduce_scatter";
        return MPI_Ireduce_scatter(in, r, cnts, rt, mop, c->mc, &h->req);
    }
    default:
        h->what = "?";
        return MPI_ERR_OP;
    }
}

/* After MPI completed a fused operation: every op's local outputs, from h->out. */
static void finish_fused(ccq_hmpi_op *h)
{
    ccq_hmpi_comm *c = h->c;
    const ccq_be_op *op0 = h->ops[0];
    ccq_dtype dt = (ccq_dtype)op0->dtype;
    size_t es = esize(dt), T = h->total, off = 0;
    uint32_t nl = op0->nparts;
    bool avg = op0->redop == CCQ_AVG;
    const char *o = h->out;

    for (uint32_t i = 0; i < h->nops; i++) {
        const ccq_be_op *op = h->ops[i];
        size_t cnt = op->count, blk = cnt * es;
        for (uint32_t k = 0; k < nl; k++) {
            char *d = op->parts[k].dst;
            switch (op0->kind) {
            case CCQ_KIND_ALL_REDUCE: /* AVG divides on the way out, once (one pass) */
                if (k > 0)
                    copy(d, op->parts[0].dst, blk);
                else if (avg)
                    ccq_host_divide(dt, o + off * es, d, cnt, c->nranks);
                else
                    copy(d, o + off * es, blk);
                break;
            case CCQ_KIND_BROADCAST:
                copy(d, o + off * es, blk);
                break;
            case CCQ_KIND_ALL_GATHER:
                for (int p = 0; p < c->nprocs; p++)
                    for (int j = 0; j < c->nl[p]; j++)
                        copy(d + (size_t)(c->fr[p] + j) * blk,
                             o + ((size_t)c->fr[p] * T + (size_t)c->nl[p] * off + j * cnt) * es,
                             blk);
                break;
            default: /* reduce_scatter */
                if (avg)
                    ccq_host_divide(dt, o + (nl * off + k * cnt) * es, d, cnt, c->nranks);
                else
                    copy(d, o + (nl * off + k * cnt) * es, blk);
                break;
            }
        }
        off += cnt;
    }
}

ccq_status ccq_hmpi_start_fused(ccq_hmpi_comm *c, const ccq_be_op *const *ops, uint32_t n,
                                uint64_t now_ns, ccq_hmpi_op **out, ccq_errbuf *err)
{
    ccq_hmpi_op *h;
    double total = 0, all;
    uint8_t kind = ops[0]->kind;

    *out = NULL;
    for (uint32_t i = 0; i < n; i++)
        total += (double)ops[i]->count;
    /* The largest count MPI sees: every rank's blocks for all_gather and reduce_scatter. */
    all =
        kind == CCQ_KIND_ALL_GATHER || kind == CCQ_KIND_REDUCE_SCATTER ? total * c->nranks : total;
    if (all > (double)INT_MAX) {
        snprintf(err->msg, sizeof err->msg,
                 "%u fused %s of %.0f elements on %u ranks across processes: MPI's int counts "
                 "hold at most %d elements per call",
                 n, kind_name(kind), total, c->nranks, INT_MAX);
        return CCQ_ERR_UNSUPPORTED;
    }
    if ((h = op_new(c, ops[0], now_ns, err)) == NULL)
        return CCQ_ERR_NO_MEMORY;
    h->ops = ops;
    h->nops = n;
    h->total = (size_t)total;
    return launch(h, true, out, err);
}

/* Post an agreement: MIN of h->minvec (copied to engine scratch, so one given up never writes
 * the caller's vector). Lock held. */
static int post_min(ccq_hmpi_op *h)
{
    int64_t *buf = scratch(h, H_BUF_SCRATCH, h->nmin * sizeof *buf);
    if (buf == NULL)
        return -1;
    memcpy(buf, h->minvec, h->nmin * sizeof *buf);
    h->what = "MPI_Iallreduce";
    return MPI_Iallreduce(MPI_IN_PLACE, buf, (int)h->nmin, MPI_INT64_T, MPI_MIN, h->c->mc, &h->req);
}

ccq_status ccq_hmpi_start_min(ccq_hmpi_comm *c, int64_t *vec, uint32_t n, uint64_t now_ns,
                              ccq_hmpi_op **out, ccq_errbuf *err)
{
    ccq_hmpi_op *h;

    *out = NULL;
    if ((h = op_new(c, NULL, now_ns, err)) == NULL)
        return CCQ_ERR_NO_MEMORY;
    h->minvec = vec;
    h->nmin = n;
    h->what = "MPI_Iallreduce";
    return launch(h, true, out, err);
}

ccq_status ccq_hmpi_test(ccq_hmpi_op *h, ccq_errbuf *err)
{
    int flag = 0, rc;

    ccq_mpi_lock();
    rc = MPI_Test(&h->req, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
        ccq_status st = mpi_err(err, rc, h->what);
        /* The request is freed by a failed MPI_Test only if it completed; keep it. */
        h->op = NULL;
        h->ops = NULL;
        h->minvec = NULL;
        h->next = abandoned;
        abandoned = h;
        nabandoned++;
        ccq_mpi_unlock();
        return st;
    }
    if (!flag) {
        ccq_mpi_unlock();
        return CCQ_IN_PROGRESS;
    }
    ccq_mpi_unlock();
    if (h->minvec != NULL)
        memcpy(h->minvec, h->buf[H_BUF_SCRATCH], h->nmin * sizeof *h->minvec);
    else if (h->ops != NULL)
        finish_fused(h);
    else
        finish(h, h->op);
    ccq_mpi_lock();
    op_free(h);
    ccq_mpi_unlock();
    return CCQ_OK;
}

void ccq_hmpi_describe(const ccq_hmpi_op *h, uint64_t now_ns, ccq_errbuf *err)
{
    const ccq_hmpi_comm *c = h->c;
    const ccq_be_op *op = h->op;
    size_t w;
    if (h->nmin > 0)
        w = (size_t)snprintf(err->msg, sizeof err->msg,
                             "%s (fusion agreement, %u x int64) among processes ", h->what,
                             h->nmin);
    else if (h->nops > 1)
        w = (size_t)snprintf(
            err->msg, sizeof err->msg,
            "%s (%u fused %s, %zu x %s in all, sequences %" PRIu64 "-%" PRIu64 ") among processes ",
            h->what, h->nops, op ? kind_name(op->kind) : "?", h->total,
            op ? dtype_name(op->dtype) : "?", op ? op->seq : 0, op ? op->seq + h->nops - 1 : 0);
    else
        w = (size_t)snprintf(err->msg, sizeof err->msg,
                             "%s (%s, %zu x %s, sequence %" PRIu64 ") among processes ", h->what,
                             op ? kind_name(op->kind) : "?", op ? op->count : 0,
                             op ? dtype_name(op->dtype) : "?", op ? op->seq : 0);
    for (int p = 0; p < c->nprocs && w < sizeof err->msg; p++) {
        if (p == 16) {
            w +=
                (size_t)snprintf(err->msg + w, sizeof err->msg - w, "and %d more ", c->nprocs - 16);
            break;
        }
        w += (size_t)snprintf(err->msg + w, sizeof err->msg - w, "%u%s", c->procs[p],
                              p + 1 == c->nprocs   ? " "
                              : p + 2 == c->nprocs ? " and "
                                                   : ", ");
    }
    if (w < sizeof err->msg)
        snprintf(err->msg + w, sizeof err->msg - w,
                 "(%u ranks; this is process %u) still pending after %.0f ms: a member process "
                 "died, hangs, or stopped submitting on this communicator",
                 c->nranks, c->procs[c->me], (double)(now_ns - h->start_ns) / 1e6);
}

void ccq_hmpi_detach(ccq_hmpi_op *h)
{
    ccq_mpi_lock();
    h->op = NULL;
    h->detached = true;
    h->next = abandoned;
    abandoned = h;
    nabandoned++;
    ndetached++;
    ccq_mpi_unlock();
}

uint32_t ccq_hmpi_detached(void)
{
    uint32_t n;
    ccq_mpi_lock();
    n = ndetached;
    ccq_mpi_unlock();
    return n;
}

void ccq_hmpi_abandon(ccq_hmpi_op *h)
{
    ccq_mpi_lock();
    h->op = NULL;
    h->ops = NULL;
    h->minvec = NULL;
    h->next = abandoned;
    abandoned = h;
    nabandoned++;
    ccq_mpi_unlock();
}

uint32_t ccq_hmpi_reap(uint64_t now_ns, uint64_t timeout_ns)
{
    uint32_t left;
    ccq_mpi_lock();
    for (ccq_hmpi_op **pp = &abandoned; *pp != NULL;) {
        ccq_hmpi_op *h = *pp;
        int flag = 0;
        if (h->req == MPI_REQUEST_NULL ||
            MPI_Test(&h->req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag) {
            if (h->detached && now_ns - h->start_ns > timeout_ns) {
                /* Nobody received it within timeout_ms: stop polling for it. */
                h->detached = false;
                ndetached--;
            }
            pp = &h->next;
            continue;
        }
        *pp = h->next;
        nabandoned--;
        ndetached -= h->detached;
        op_free(h);
    }
    left = nabandoned;
    ccq_mpi_unlock();
    return left;
}
