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
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* clock_gettime */
#endif
#include "backends/host/mpi/impl.h"

#include <inttypes.h>
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/host/convert.h"
#include "backends/host/reduce.h"
#include "backends/host/scratch_pool.h"
#include "common/mpi_lock.h"

/* Bytes per element (ccq_dtype_size, without the runtime: the engine's test links only the
 * backend's files). */
size_t hmpi_esize(ccq_dtype dt)
{
    static const uint8_t sz[CCQ_DTYPE_COUNT_] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    return (unsigned)dt < CCQ_DTYPE_COUNT_ ? sz[dt] : 0;
}

/* ---- process-wide state (under the MPI lock) ------------------------------------------ */

static ccq_hmpi_op *abandoned;
static uint32_t nabandoned, ndetached;
static uint64_t last_step; /* hmpi_stepped */
/* Freed scratch buffers kept for reuse (backends/host/scratch_pool.c). */
static ccq_scratch_pool pool;
static bool types_made;
static MPI_Datatype t_byte2; /* 2-byte elements for float16 and bfloat16 */
static MPI_Datatype t_byte1; /* 1-byte elements for the fp8 types */
static MPI_Op user_ops[CCQ_DTYPE_COUNT_][CCQ_REDUCE_OP_COUNT_];
static bool user_op_made[CCQ_DTYPE_COUNT_][CCQ_REDUCE_OP_COUNT_];

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
MPI_Datatype hmpi_mpi_type(ccq_dtype dt)
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
void hmpi_reduction(ccq_dtype dt, ccq_reduce_op ro, MPI_Datatype *t, MPI_Op *op)
{
    bool wrap;
    if (ro == CCQ_AVG)
        ro = CCQ_SUM;
    *t = hmpi_mpi_type(dt);
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

/* x[i] /= n for AVG (reduce.h: the local kernels' semantics, vectorized; a power-of-two n
 * multiplies by 1/n, which gives the same bits). */
void hmpi_divide(ccq_dtype dt, void *buf, size_t count, uint32_t n)
{
    ccq_host_divide(dt, buf, buf, count, n);
}

void hmpi_copy(void *dst, const void *src, size_t bytes)
{
    if (dst != src && bytes > 0)
        memmove(dst, src, bytes);
}

/* Combine the local parts' src (offset `off` bytes, `count` elements) into dst. */
void hmpi_combine(const ccq_be_op *op, size_t off, size_t count, void *dst)
{
    const void *src[CCQ_MAX_DEVICES];
    void *d[1] = {dst};
    ccq_reduce_op ro = op->redop == CCQ_AVG ? CCQ_SUM : (ccq_reduce_op)op->redop;
    for (uint32_t k = 0; k < op->nparts; k++)
        src[k] = (const char *)op->parts[k].src + off;
    ccq_host_reduce_range((ccq_dtype)op->dtype, ro, op->nparts, src, 1, d, 0, count, 0);
}

/* ---- the communicator ----------------------------------------------------------------- */

ccq_status hmpi_mpi_err(ccq_errbuf *err, int rc, const char *what)
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
        return hmpi_mpi_err(err, rc, "MPI_Comm_idup of the world communicator");
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
        return hmpi_mpi_err(err, rc, "MPI_Comm_idup of the world communicator");
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

static void comm_queues_init(ccq_hmpi_comm *c)
{
    for (int q = 0; q < HMPI_NWQ; q++) {
        c->wq[q] = NULL;
        c->wq_tail[q] = &c->wq[q];
    }
    c->split = NULL;
    c->split_tail = &c->split;
    c->sets = NULL;
    c->sets_tail = &c->sets;
}

void hmpi_wq_push(ccq_hmpi_comm *c, int q, ccq_hmpi_op *h)
{
    h->wq = q;
    h->wnext = NULL;
    *c->wq_tail[q] = h;
    c->wq_tail[q] = &h->wnext;
}

void hmpi_wq_remove(ccq_hmpi_comm *c, ccq_hmpi_op *h)
{
    int q = h->wq;
    if (q < 0)
        return;
    for (ccq_hmpi_op **pp = &c->wq[q]; *pp != NULL; pp = &(*pp)->wnext) {
        if (*pp != h)
            continue;
        *pp = h->wnext;
        if (c->wq_tail[q] == &h->wnext)
            c->wq_tail[q] = pp;
        break;
    }
    h->wq = -1;
    h->wnext = NULL;
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
    memcpy(c->blob, v, sizeof v);
    c->p2p = w->dup;
    c->mc = MPI_COMM_NULL;
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
        hmpi_comm_unref(c);
        snprintf(err->msg, sizeof err->msg, "MPI_Type_contiguous / MPI_Op_create failed");
        return CCQ_ERR_BACKEND;
    }
    ccq_mpi_unlock();
    /* The pair's identity, from what the lower process chose (how many communicators it
     * made): messages are matched by sender, so only pairs of these two processes need tags
     * apart, and the lower process is the same for all of them. HMPI_PAIR_TAGS per pair:
     * unique while the count stays below (tag upper bound + 1) / 16 (134 million on Open
     * MPI and MPICH, 2048 where MPI allows only the standard's minimum 32767). */
    c->pair_tag = (int)((v[1] % (((uint64_t)ub + 1) / HMPI_PAIR_TAGS)) * HMPI_PAIR_TAGS);
    comm_queues_init(c);
    *out = c;
    return CCQ_OK;
}

void hmpi_comm_unref(ccq_hmpi_comm *c)
{
    if (--c->refs > 0)
        return;
    hmpi_check_free(c);
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
        return hmpi_mpi_err(err, rc, "MPI_Comm_create_group");
    MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
    return CCQ_OK;
}

ccq_status ccq_hmpi_comm_create(const ccq_be_comm_desc *d, ccq_hmpi_world *w, const void *blob,
                                size_t blob_len, ccq_hmpi_comm **out, ccq_errbuf *err)
{
    ccq_hmpi_comm *c;
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
        c->in = calloc(d->nprocs, sizeof *c->in);
    }
    if (c == NULL || ranks == NULL || c->nl == NULL || c->procs == NULL || c->in == NULL) {
        if (c != NULL) {
            free(c->nl);
            free(c->procs);
            free(c->in);
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
    c->fusion_bytes = d->fusion_bytes;
    c->me = -1;
    memcpy(c->blob, v, sizeof v);
    comm_queues_init(c);
    for (uint32_t p = 0; p < d->nprocs; p++) {
        ranks[p] = (int)d->procs[p];
        c->procs[p] = d->procs[p];
        if (d->procs[p] == d->world_rank)
            c->me = (int)p;
    }

    ccq_mpi_lock();
    rc = make_types();
    if (rc != MPI_SUCCESS) {
        st = hmpi_mpi_err(err, rc, "MPI_Type_contiguous / MPI_Op_create");
        goto out;
    }
    /* On ccq's duplicate of the world (errors return there; the world's own handler is the
     * embedder's, fatal by default). */
    if ((st = group_comm(w->dup, ranks, c->nprocs, v, &c->mc, err)) != CCQ_OK)
        goto out;
    {
        int mine = (int)d->nlocal;
        rc = MPI_Allgather(&mine, 1, MPI_INT, c->nl, 1, MPI_INT, c->mc);
        if (rc != MPI_SUCCESS) {
            st = hmpi_mpi_err(err, rc, "MPI_Allgather of the local rank counts");
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
        hmpi_comm_unref(c);
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
    hmpi_comm_unref(c);
    ccq_mpi_unlock();
}

/* ---- operations ----------------------------------------------------------------------- */

static void op_free(ccq_hmpi_op *h)
{
    for (int k = 0; k < H_NBUF; k++)
        ccq_pool_put(&pool, h->buf[k], h->cap[k]);
    hmpi_comm_unref(h->c);
    hmpi_fused_unref(h->fz);
    free(h);
}

void *hmpi_scratch(ccq_hmpi_op *h, int k, size_t bytes)
{
    h->buf[k] = ccq_pool_get(&pool, bytes ? bytes : 1, &h->cap[k]);
    return h->buf[k];
}

/* The process owning rank r. */
int hmpi_owner(const ccq_hmpi_comm *c, uint32_t r)
{
    int p = 0;
    while (p + 1 < c->nprocs && (uint32_t)c->fr[p + 1] <= r)
        p++;
    return p;
}

const char *hmpi_kind_name(uint8_t kind)
{
    return kind < CCQ_KIND_COUNT_ ? ccq_kinds[kind].name : "?";
}

const char *hmpi_dtype_name(uint8_t dt)
{
    static const char *const names[CCQ_DTYPE_COUNT_] = {
        "int8",    "uint8",   "int32",   "uint32",   "int64",      "uint64",
        "float16", "float32", "float64", "bfloat16", "float8e4m3", "float8e5m2"};
    return dt < CCQ_DTYPE_COUNT_ ? names[dt] : "?";
}

/* Post the MPI collective of op (after the local combine). Lock held. */
int hmpi_post_collective(ccq_hmpi_op *h, const ccq_be_op *op)
{
    ccq_hmpi_comm *c = h->c;
    ccq_dtype dt = (ccq_dtype)op->dtype;
    size_t es = hmpi_esize(dt), cnt = op->count, blk = cnt * es;
    uint32_t nl = op->nparts, nr = c->nranks;
    int n = (int)cnt, me = c->me, P = c->nprocs;
    int *cnts = h->v, *disp = h->v + P, *cnts2 = h->v + 2 * P, *disp2 = h->v + 3 * P;
    MPI_Datatype t = hmpi_mpi_type(dt), rt;
    MPI_Op mop;
    const ccq_be_part *pt = op->parts;

    switch (op->kind) {
    case CCQ_KIND_ALL_REDUCE: {
        const void *in = pt[0].src;
        if (nl > 1 || pt[0].src == pt[0].dst) {
            in = hmpi_scratch(h, H_BUF_SCRATCH, blk);
            if (in == NULL)
                return -1;
            if (nl > 1)
                hmpi_combine(op, 0, cnt, (void *)in);
            else
                hmpi_copy((void *)in, pt[0].src, blk);
        }
        h->out = pt[0].dst;
        hmpi_reduction(dt, (ccq_reduce_op)op->redop, &rt, &mop);
        h->what = "MPI_Iallreduce";
        return MPI_Iallreduce(in, h->out, n, rt, mop, c->mc, &h->req[RQ_OP]);
    }
    case CCQ_KIND_REDUCE: {
        uint32_t rl = op->root - c->first_rank; /* the root's local part, if here */
        int rp = hmpi_owner(c, op->root);
        const void *in = pt[0].src;
        void *outp = rp == me ? pt[rl].dst : NULL;
        if (nl > 1 || (outp != NULL && outp == in)) {
            in = hmpi_scratch(h, H_BUF_SCRATCH, blk);
            if (in == NULL)
                return -1;
            if (nl > 1)
                hmpi_combine(op, 0, cnt, (void *)in);
            else
                hmpi_copy((void *)in, pt[0].src, blk);
        }
        h->out = outp;
        hmpi_reduction(dt, (ccq_reduce_op)op->redop, &rt, &mop);
        h->what = "MPI_Ireduce";
        return MPI_Ireduce(in, outp, n, rt, mop, rp, c->mc, &h->req[RQ_OP]);
    }
    case CCQ_KIND_BROADCAST: {
        int rp = hmpi_owner(c, op->root);
        void *b = rp == me ? (void *)pt[op->root - c->first_rank].src : pt[0].dst;
        h->out = b;
        h->what = "MPI_Ibcast";
        return MPI_Ibcast(b, n, t, rp, c->mc, &h->req[RQ_OP]);
    }
    case CCQ_KIND_ALL_GATHER: {
        char *d0 = pt[0].dst;
        for (uint32_t k = 0; k < nl; k++)
            hmpi_copy(d0 + (size_t)(c->first_rank + k) * blk, pt[k].src, blk);
        for (int p = 0; p < P; p++) {
            cnts[p] = c->nl[p] * n;
            disp[p] = c->fr[p] * n;
        }
        h->out = d0;
        h->what = "MPI_Iallgatherv";
        return MPI_Iallgatherv(MPI_IN_PLACE, 0, t, d0, cnts, disp, t, c->mc, &h->req[RQ_OP]);
    }
    case CCQ_KIND_REDUCE_SCATTER: {
        /* Combine all local srcs (nr blocks) into scratch, MPI_Ireduce_scatter to this
         * process's nl blocks, then each local rank takes its block. */
        const char *s0 = pt[0].src, *d0 = pt[0].dst;
        bool alias = d0 >= s0 && d0 < s0 + blk * nr; /* in place: MPI must not read dst */
        void *in = nl == 1 && !alias ? (void *)s0 : hmpi_scratch(h, H_BUF_SCRATCH, blk * nr);
        void *r = nl == 1 ? pt[0].dst : hmpi_scratch(h, H_BUF_RECV, blk * nl);
        if (in == NULL || r == NULL)
            return -1;
        if (in != s0)
            hmpi_combine(op, 0, cnt * nr, in);
        for (int p = 0; p < P; p++)
            cnts[p] = c->nl[p] * n;
        h->out = r;
        hmpi_reduction(dt, (ccq_reduce_op)op->redop, &rt, &mop);
        h->what = "MPI_Ireduce_scatter";
        return MPI_Ireduce_scatter(in, r, cnts, rt, mop, c->mc, &h->req[RQ_OP]);
    }
    case CCQ_KIND_ALL_TO_ALL: {
        /* Pack per destination process q: [local rank k][q's rank j] = block fr[q]+j of
         * src_k; receive from p: [p's rank i][local rank j]. */
        char *sb = hmpi_scratch(h, H_BUF_SCRATCH, blk * nr * nl);
        char *rb = hmpi_scratch(h, H_BUF_RECV, blk * nr * nl);
        size_t o = 0;
        if (sb == NULL || rb == NULL)
            return -1;
        for (int q = 0; q < P; q++) {
            cnts[q] = (int)nl * c->nl[q] * n;
            disp[q] = (int)(o / es);
            for (uint32_t k = 0; k < nl; k++)
                for (int j = 0; j < c->nl[q]; j++, o += blk)
                    hmpi_copy(sb + o, (const char *)pt[k].src + (size_t)(c->fr[q] + j) * blk, blk);
        }
        for (int p = 0, ro = 0; p < P; p++) {
            cnts2[p] = c->nl[p] * (int)nl * n;
            disp2[p] = ro;
            ro += cnts2[p];
        }
        h->out = rb;
        h->what = "MPI_Ialltoallv";
        return MPI_Ialltoallv(sb, cnts, disp, t, rb, cnts2, disp2, t, c->mc, &h->req[RQ_OP]);
    }
    case CCQ_KIND_GATHER: {
        int rp = hmpi_owner(c, op->root);
        for (int p = 0; p < P; p++) {
            cnts[p] = c->nl[p] * n;
            disp[p] = c->fr[p] * n;
        }
        h->what = "MPI_Igatherv";
        if (rp == me) {
            char *d = pt[op->root - c->first_rank].dst;
            for (uint32_t k = 0; k < nl; k++)
                hmpi_copy(d + (size_t)(c->first_rank + k) * blk, pt[k].src, blk);
            return MPI_Igatherv(MPI_IN_PLACE, 0, t, d, cnts, disp, t, rp, c->mc, &h->req[RQ_OP]);
        }
        {
            const void *in = pt[0].src;
            if (nl > 1) {
                char *s = hmpi_scratch(h, H_BUF_SCRATCH, blk * nl);
                if (s == NULL)
                    return -1;
                for (uint32_t k = 0; k < nl; k++)
                    hmpi_copy(s + k * blk, pt[k].src, blk);
                in = s;
            }
            return MPI_Igatherv(in, (int)nl * n, t, NULL, cnts, disp, t, rp, c->mc, &h->req[RQ_OP]);
        }
    }
    case CCQ_KIND_SCATTER: {
        int rp = hmpi_owner(c, op->root);
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
                hmpi_copy(pt[k].dst, s + (size_t)(c->first_rank + k) * blk, blk);
            h->out = NULL;
            return MPI_Iscatterv(s, cnts, disp, t, MPI_IN_PLACE, 0, t, rp, c->mc, &h->req[RQ_OP]);
        }
        {
            void *r = nl == 1 ? pt[0].dst : hmpi_scratch(h, H_BUF_RECV, blk * nl);
            if (r == NULL)
                return -1;
            h->out = r;
            return MPI_Iscatterv(NULL, cnts, disp, t, r, (int)nl * n, t, rp, c->mc, &h->req[RQ_OP]);
        }
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
    size_t es = hmpi_esize(dt), cnt = op->count, blk = cnt * es;
    uint32_t nl = op->nparts;
    bool avg = op->redop == CCQ_AVG;
    const ccq_be_part *pt = op->parts;

    switch (op->kind) {
    case CCQ_KIND_ALL_REDUCE:
        if (avg)
            hmpi_divide(dt, h->out, cnt, c->nranks);
        for (uint32_t k = 1; k < nl; k++)
            hmpi_copy(pt[k].dst, h->out, blk);
        break;
    case CCQ_KIND_REDUCE:
        if (avg && h->out != NULL)
            hmpi_divide(dt, h->out, cnt, c->nranks);
        break;
    case CCQ_KIND_BROADCAST:
        for (uint32_t k = 0; k < nl; k++)
            hmpi_copy(pt[k].dst, h->out, blk);
        break;
    case CCQ_KIND_ALL_GATHER:
        for (uint32_t k = 1; k < nl; k++)
            hmpi_copy(pt[k].dst, h->out, blk * c->nranks);
        break;
    case CCQ_KIND_REDUCE_SCATTER:
        if (avg)
            hmpi_divide(dt, h->out, cnt * nl, c->nranks);
        for (uint32_t k = 0; k < nl; k++)
            hmpi_copy(pt[k].dst, (const char *)h->out + k * blk, blk);
        break;
    case CCQ_KIND_ALL_TO_ALL: {
        const char *rb = h->out;
        for (int p = 0; p < c->nprocs; p++)
            for (int i = 0; i < c->nl[p]; i++)
                for (uint32_t j = 0; j < nl; j++, rb += blk)
                    hmpi_copy((char *)pt[j].dst + (size_t)(c->fr[p] + i) * blk, rb, blk);
        break;
    }
    case CCQ_KIND_SCATTER:
        if (h->out != NULL)
            for (uint32_t k = 0; k < nl; k++)
                hmpi_copy(pt[k].dst, (const char *)h->out + k * blk, blk);
        break;
    default:
        break;
    }
}

/* The MPI collective a communicator over member processes runs for a kind (for details). */
static const char *collective_call(uint8_t kind)
{
    switch (kind) {
    case CCQ_KIND_ALL_REDUCE:
        return "MPI_Iallreduce";
    case CCQ_KIND_REDUCE:
        return "MPI_Ireduce";
    case CCQ_KIND_BROADCAST:
        return "MPI_Ibcast";
    case CCQ_KIND_ALL_GATHER:
        return "MPI_Iallgatherv";
    case CCQ_KIND_REDUCE_SCATTER:
        return "MPI_Ireduce_scatter";
    case CCQ_KIND_ALL_TO_ALL:
        return "MPI_Ialltoallv";
    case CCQ_KIND_GATHER:
        return "MPI_Igatherv";
    case CCQ_KIND_SCATTER:
        return "MPI_Iscatterv";
    default:
        return "?";
    }
}

static uint64_t mono_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

void hmpi_stepped(void)
{
    last_step = mono_ns();
}

uint64_t ccq_hmpi_last_step(void)
{
    uint64_t t;
    ccq_mpi_lock();
    t = last_step;
    ccq_mpi_unlock();
    return t;
}

void hmpi_fail(ccq_hmpi_op *h, ccq_status st, const char *detail)
{
    h->phase = PH_FAILED;
    h->fail = st;
    size_t n = strlen(detail) + 1;
    free(h->fail_detail);
    h->fail_detail = malloc(n);
    if (h->fail_detail != NULL)
        memcpy(h->fail_detail, detail, n);
}

static void op_release(ccq_hmpi_op *h)
{
    free(h->fail_detail);
    op_free(h);
}

/* Keep h until MPI completes its requests (tested by ccq_hmpi_reap). Lock held. */
static void keep(ccq_hmpi_op *h)
{
    h->op = NULL;
    h->next = abandoned;
    abandoned = h;
    nabandoned++;
}

/* Free h now if MPI is done with it (MPI_Testall frees completed requests), else keep it. */
static void release_or_keep(ccq_hmpi_op *h)
{
    int flag = 0;
    h->op = NULL;
    if (MPI_Testall(RQ_N, h->req, &flag, MPI_STATUSES_IGNORE) == MPI_SUCCESS && flag)
        op_release(h);
    else
        keep(h);
}

/* Start op; run_op: op as ccq_hmpi_start_run gave it, followed by `run` more of its run.
 * locked: the caller holds the MPI lock. */
static ccq_status start_one(ccq_hmpi_comm *c, const ccq_be_op *op, ccq_be_op *run_op, uint32_t run,
                            bool locked, uint64_t now_ns, ccq_hmpi_op **out, ccq_errbuf *err)
{
    ccq_hmpi_op *h;
    const ccq_kind_info *ki = &ccq_kinds[op->kind < CCQ_KIND_COUNT_ ? op->kind : 0];
    size_t total = op->count;
    ccq_status st;

    *out = NULL;
    if (ki->src_n || ki->dst_n) /* the v collectives count every rank's block */
        total = (double)op->count * c->nranks * (op->nparts ? op->nparts : 1) > (double)INT_MAX
                    ? (size_t)INT_MAX + 1
                    : op->count * c->nranks * (op->nparts ? op->nparts : 1);
    if (op->count > (size_t)INT_MAX || total > (size_t)INT_MAX) {
        snprintf(err->msg, sizeof err->msg,
                 "%s of %zu elements on %u ranks across processes: MPI's int counts hold at "
                 "most %d elements per call",
                 hmpi_kind_name(op->kind), op->count, c->nranks, INT_MAX);
        return CCQ_ERR_UNSUPPORTED;
    }
    if (!c->pair && !ki->collective) {
        snprintf(err->msg, sizeof err->msg,
                 "internal: a %s half on a communicator of %d processes (halves across processes "
                 "travel on their pair's)",
                 ki->name, c->nprocs);
        return CCQ_ERR_BACKEND;
    }
    h = calloc(1, sizeof *h + 4 * (size_t)c->nprocs * sizeof(int));
    if (h == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    h->v = (int *)(h + 1);
    h->c = c;
    h->op = op;
    for (int k = 0; k < RQ_N; k++)
        h->req[k] = MPI_REQUEST_NULL;
    h->start_ns = now_ns;
    h->seq = op->seq;
    h->wq = -1;
    h->phase = PH_WAIT;
    h->what = collective_call(op->kind);
    h->run_op = run_op;
    if (!locked)
        ccq_mpi_lock();
    c->refs++;
    if (c->pair) {
        st = hmpi_pair_start(h, op, err);
    } else {
        st = hmpi_check_start(h, op, run);
        if (st != CCQ_OK)
            snprintf(err->msg, sizeof err->msg, "out of memory");
    }
    if (st != CCQ_OK) {
        /* Requests already posted (a header sent) finish on their own: keep h until then. */
        hmpi_wq_remove(c, h);
        release_or_keep(h);
        if (!locked)
            ccq_mpi_unlock();
        return st;
    }
    if (!locked)
        ccq_mpi_unlock();
    *out = h;
    return CCQ_OK;
}

ccq_status ccq_hmpi_start(ccq_hmpi_comm *c, const ccq_be_op *op, uint64_t now_ns, ccq_hmpi_op **out,
                          ccq_errbuf *err)
{
    return start_one(c, op, NULL, 0, false, now_ns, out, err);
}

ccq_status ccq_hmpi_start_run(ccq_hmpi_comm *c, ccq_be_op *const *ops, uint32_t n, uint64_t now_ns,
                              ccq_hmpi_op **out, uint32_t *nstarted, ccq_errbuf *err)
{
    ccq_status st = CCQ_OK;
    uint32_t i;

    /* Under one hold of the lock: another runtime's thread must not flush the run's records
     * halfway (the members count on a run's records arriving in one message). A pair has no
     * records to carry the members' runs (pair.c): its ops never fuse. */
    ccq_mpi_lock();
    for (i = 0; i < n && st == CCQ_OK; i++)
        st = start_one(c, ops[i], c->pair ? NULL : ops[i], c->pair ? 0 : n - 1 - i, true, now_ns,
                       &out[i], err);
    *nstarted = st == CCQ_OK ? n : i - 1;
    if (st != CCQ_OK && !c->pair) {
        /* The records not sent yet must not promise the ops that did not start. */
        for (uint32_t k = 0; k < c->nout; k++)
            if (c->out[k].seq >= ops[0]->seq && c->out[k].seq < ops[0]->seq + *nstarted)
                c->out[k].run = (uint32_t)(ops[0]->seq + *nstarted - 1 - c->out[k].seq);
        for (uint32_t k = 0; k < *nstarted; k++)
            out[k]->mine.run = *nstarted - 1 - k;
    }
    ccq_mpi_unlock();
    return st;
}

/* An operation that ended with an error, its requests completed or given to the abandoned
 * list (MPI_Testall did not free them): report st with its detail. Lock held. */
static ccq_status op_failed(ccq_hmpi_op *h, ccq_status st, ccq_errbuf *err)
{
    snprintf(err->msg, sizeof err->msg, "%s", h->fail_detail ? h->fail_detail : "?");
    release_or_keep(h);
    return st;
}

ccq_status ccq_hmpi_test(ccq_hmpi_op *h, ccq_errbuf *err)
{
    ccq_hmpi_comm *c = h->c;
    int flag = 0, rc;

    ccq_mpi_lock();
    hmpi_check_flush();        /* the records of the batch just started leave together */
    if (h->phase == PH_WAIT) { /* each MPI call is a progress pass of MPI: only when needed */
        if (c->pair)
            hmpi_pair_progress(c);
        else
            hmpi_check_progress(c);
    }
    if (h->phase == PH_WAIT) {
        ccq_mpi_unlock();
        return CCQ_IN_PROGRESS;
    }
    if (h->phase == PH_FAILED) {
        ccq_status st;
        /* Every member hears this process's record before it goes on (it would else wait for
         * a record this process has not sent). */
        if (!c->pair && !hmpi_check_sent(c, h->seq)) {
            ccq_mpi_unlock();
            return CCQ_IN_PROGRESS;
        }
        st = op_failed(h, h->fail, err);
        ccq_mpi_unlock();
        return st;
    }
    if (h->fz != NULL && h->fi > 0) {
        /* In a fused group: the head's test ends it (in batch order, the same pass). */
        hmpi_fused *fz = h->fz;
        ccq_status st = CCQ_IN_PROGRESS;
        if (fz->state == HMPI_FZ_FAILED) {
            hmpi_fail(h, fz->st, fz->detail);
            st = op_failed(h, fz->st, err);
        } else if (fz->state == HMPI_FZ_DONE && hmpi_check_sent(c, h->seq)) {
            op_release(h);
            st = CCQ_OK;
        }
        ccq_mpi_unlock();
        return st;
    }
    rc = MPI_Testall(RQ_N, h->req, &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
        ccq_errbuf e;
        hmpi_mpi_err(&e, rc, h->what);
        hmpi_fail(h, CCQ_ERR_BACKEND, e.msg);
        hmpi_fused_end(h, CCQ_ERR_BACKEND, e.msg);
        rc = op_failed(h, CCQ_ERR_BACKEND, err);
        ccq_mpi_unlock();
        return (ccq_status)rc;
    }
    if (!flag || (!c->pair && !hmpi_check_sent(c, h->seq))) {
        ccq_mpi_unlock();
        return CCQ_IN_PROGRESS;
    }
    if (h->phase == PH_DISCARD) { /* the mismatched peer's data is in and dropped */
        ccq_status st = op_failed(h, h->fail, err);
        ccq_mpi_unlock();
        return st;
    }
    if (c->pair) {
        bool wait = false;
        if (hmpi_pair_split_due(h, &wait)) { /* a large all_reduce's second exchange */
            ccq_status st;
            ccq_mpi_unlock();
            hmpi_pair_reduce_half(h);
            ccq_mpi_lock();
            if ((st = hmpi_pair_second(h, err)) != CCQ_OK) {
                hmpi_fail(h, st, err->msg);
                st = op_failed(h, st, err);
            } else {
                st = CCQ_IN_PROGRESS;
                hmpi_stepped();
            }
            ccq_mpi_unlock();
            return st;
        }
        if (wait) {
            ccq_mpi_unlock();
            return CCQ_IN_PROGRESS;
        }
    }
    ccq_mpi_unlock();
    if (c->pair)
        hmpi_pair_finish(h, h->op);
    else if (h->fz != NULL)
        hmpi_finish_fused(h);
    else
        finish(h, h->op);
    ccq_mpi_lock();
    hmpi_fused_end(h, CCQ_OK, NULL);
    op_release(h);
    ccq_mpi_unlock();
    return CCQ_OK;
}

void ccq_hmpi_describe(const ccq_hmpi_op *h, uint64_t now_ns, ccq_errbuf *err)
{
    const ccq_hmpi_comm *c = h->c;
    const ccq_be_op *op = h->op;
    size_t w;
    w = (size_t)snprintf(err->msg, sizeof err->msg,
                         "%s (%s, %zu x %s, sequence %" PRIu64 ") among processes ", h->what,
                         op ? hmpi_kind_name(op->kind) : "?", op ? op->count : 0,
                         op ? hmpi_dtype_name(op->dtype) : "?", h->seq);
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
        w += (size_t)snprintf(err->msg + w, sizeof err->msg - w, "(%u ranks; this is process %u) ",
                              c->nranks, c->procs[c->me]);
    if (w < sizeof err->msg && h->phase == PH_WAIT) {
        char who[160];
        ccq_mpi_lock();
        if (c->pair)
            snprintf(who, sizeof who, "process %u", c->procs[1 - c->me]);
        else
            hmpi_check_missing(h, who, sizeof who);
        ccq_mpi_unlock();
        /* Nothing was posted: no data moves before every member submitted it. */
        snprintf(err->msg + w, sizeof err->msg - w,
                 "not started after %.0f ms: %s never submitted it (died, hangs, or stopped "
                 "submitting on this communicator)",
                 (double)(now_ns - h->start_ns) / 1e6, who);
    } else if (w < sizeof err->msg) {
        snprintf(err->msg + w, sizeof err->msg - w,
                 "still pending after %.0f ms: a member process died, hangs, or stopped "
                 "submitting on this communicator",
                 (double)(now_ns - h->start_ns) / 1e6);
    }
}

void ccq_hmpi_detach(ccq_hmpi_op *h)
{
    ccq_mpi_lock();
    h->detached = true;
    keep(h);
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
    /* A fused group's other ops never end before their head: given up (an abort, the engine's
     * deadline) they are given up too, in the same poll pass, each with its own detail. A
     * given-up op's outputs are never written. */
    if (h->fz != NULL)
        h->fz->part[h->fi].op = NULL;
    hmpi_wq_remove(h->c, h);
    if (h->split == 1)
        hmpi_pair_split_remove(h);
    /* Receives can be cancelled (collectives cannot): a pair's receive into a user buffer
     * that is cancelled before it matched never writes it later. One already matched
     * completes; MPI_Cancel then does nothing. */
    for (int k = RQ_HDR_RECV; k < RQ_N; k++)
        if (h->req[k] != MPI_REQUEST_NULL)
            MPI_Cancel(&h->req[k]);
    keep(h);
    ccq_mpi_unlock();
}

uint32_t ccq_hmpi_reap(uint64_t timeout_ns)
{
    uint64_t now_ns = 0; /* read once, if a detached send needs it */
    uint32_t left;
    ccq_mpi_lock();
    hmpi_check_flush();
    for (ccq_hmpi_op **pp = &abandoned; *pp != NULL;) {
        ccq_hmpi_op *h = *pp;
        int flag = 0;
        /* flag says whether all completed, also when one of them failed */
        MPI_Testall(RQ_N, h->req, &flag, MPI_STATUSES_IGNORE);
        if (!flag) {
            if (h->detached && now_ns == 0)
                now_ns = mono_ns();
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
        op_release(h);
    }
    left = nabandoned;
    ccq_mpi_unlock();
    return left;
}
