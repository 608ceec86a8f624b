/* The MPI engine's fused operations (docs/fusion.md): a group of small collectives of one
 * communicator that every member agreed on (check.c cuts it, from the records every member
 * has) runs as one MPI collective over their blocks, packed into pooled scratch. The group's
 * first operation (the head) posts it and, once MPI completed it, writes every op's outputs;
 * the others wait for the head and return what it ended with, in the same test pass.
 *
 * Layout (off_i: the elements of the ops before op i; T: of all of them):
 *  - all_reduce: [op 0 | op 1 | ...], each the local combine of the op's parts;
 *  - broadcast: the root process packs its parts' src the same way;
 *  - all_gather: each process sends [op i: its nl ranks' blocks] (nl * T elements), received
 *    per process p at fr[p] * T: [op i: p's nl[p] blocks at nl[p] * off_i];
 *  - reduce_scatter: the combined input ordered per destination process p (at fr[p] * T):
 *    [op i: blocks fr[p] .. fr[p] + nl[p] - 1 of its combined input], so MPI's counts are
 *    nl[p] * T; this process gets [op i: its nl blocks at nl * off_i].
 * Each element meets the same local kernel and the same MPI datatype and op as unfused. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/host/mpi/impl.h"
#include "backends/host/reduce.h"
#include "common/clock.h"

void hmpi_fused_unref(hmpi_fused *fz)
{
    if (fz != NULL && --fz->refs == 0)
        free(fz);
}

void hmpi_fused_end(ccq_hmpi_op *h, ccq_status st, const char *detail)
{
    hmpi_fused *fz = h->fz;
    if (fz == NULL || fz->state != HMPI_FZ_RUNNING)
        return;
    fz->state = st == CCQ_OK ? HMPI_FZ_DONE : HMPI_FZ_FAILED;
    fz->st = st;
    snprintf(fz->detail, sizeof fz->detail, "%s", detail ? detail : "");
}

/* Post the group's one MPI operation (lock held). */
static int post(ccq_hmpi_op *h, hmpi_fused *fz)
{
    ccq_hmpi_comm *c = h->c;
    const ccq_be_op *op0 = h->op;
    ccq_dtype dt = (ccq_dtype)op0->dtype;
    size_t es = hmpi_esize(dt), T = fz->total, off;
    uint32_t nl = op0->nparts, nr = c->nranks;
    int P = c->nprocs, me = c->me;
    int *cnts = h->v, *disp = h->v + P;
    MPI_Datatype t = hmpi_mpi_type(dt), rt;
    MPI_Op mop;

    switch (op0->kind) {
    case CCQ_KIND_ALL_REDUCE: {
        char *in = hmpi_scratch(h, H_BUF_SCRATCH, T * es), *o = hmpi_scratch(h, H_BUF_RECV, T * es);
        if (in == NULL || o == NULL)
            return -1;
        off = 0;
        for (uint32_t i = 0; i < fz->n; i++) {
            const ccq_be_op *op = fz->part[i].op;
            if (nl > 1)
                hmpi_combine(op, 0, op->count, in + off * es);
            else
                hmpi_copy(in + off * es, op->parts[0].src, op->count * es);
            off += op->count;
        }
        h->out = o;
        hmpi_reduction(dt, (ccq_reduce_op)op0->redop, &rt, &mop);
        h->what = "MPI_Iallreduce";
        return MPI_Iallreduce(in, o, (int)T, rt, mop, c->mc, &h->req[RQ_OP]);
    }
    case CCQ_KIND_BROADCAST: {
        int rp = hmpi_owner(c, op0->root);
        char *b = hmpi_scratch(h, H_BUF_SCRATCH, T * es);
        if (b == NULL)
            return -1;
        off = 0;
        for (uint32_t i = 0; rp == me && i < fz->n; i++) {
            const ccq_be_op *op = fz->part[i].op;
            hmpi_copy(b + off * es, op->parts[op->root - c->first_rank].src, op->count * es);
            off += op->count;
        }
        h->out = b;
        h->what = "MPI_Ibcast";
        return MPI_Ibcast(b, (int)T, t, rp, c->mc, &h->req[RQ_OP]);
    }
    case CCQ_KIND_ALL_GATHER: {
        char *sb = hmpi_scratch(h, H_BUF_SCRATCH, nl * T * es),
             *rb = hmpi_scratch(h, H_BUF_RECV, nr * T * es);
        if (sb == NULL || rb == NULL)
            return -1;
        off = 0;
        for (uint32_t i = 0; i < fz->n; i++) {
            const ccq_be_op *op = fz->part[i].op;
            for (uint32_t k = 0; k < nl; k++)
                hmpi_copy(sb + (nl * off + k * op->count) * es, op->parts[k].src, op->count * es);
            off += op->count;
        }
        for (int p = 0; p < P; p++) {
            cnts[p] = c->nl[p] * (int)T;
            disp[p] = c->fr[p] * (int)T;
        }
        h->out = rb;
        h->what = "MPI_Iallgatherv";
        return MPI_Iallgatherv(sb, (int)(nl * T), t, rb, cnts, disp, t, c->mc, &h->req[RQ_OP]);
    }
    case CCQ_KIND_REDUCE_SCATTER: {
        char *in = hmpi_scratch(h, H_BUF_SCRATCH, nr * T * es),
             *r = hmpi_scratch(h, H_BUF_RECV, nl * T * es);
        if (in == NULL || r == NULL)
            return -1;
        off = 0;
        for (uint32_t i = 0; i < fz->n; i++) {
            const ccq_be_op *op = fz->part[i].op;
            size_t cnt = op->count;
            for (int p = 0; p < P; p++) {
                char *d = in + ((size_t)c->fr[p] * T + (size_t)c->nl[p] * off) * es;
                size_t first = (size_t)c->fr[p] * cnt, n = (size_t)c->nl[p] * cnt;
                if (nl > 1)
                    hmpi_combine(op, first * es, n, d);
                else
                    hmpi_copy(d, (const char *)op->parts[0].src + first * es, n * es);
            }
            off += cnt;
        }
        for (int p = 0; p < P; p++)
            cnts[p] = c->nl[p] * (int)T;
        h->out = r;
        hmpi_reduction(dt, (ccq_reduce_op)op0->redop, &rt, &mop);
        h->what = "MPI_Ireduce_scatter";
        return MPI_Ireduce_scatter(in, r, cnts, rt, mop, c->mc, &h->req[RQ_OP]);
    }
    default:
        h->what = "?";
        return MPI_ERR_OP;
    }
}

int hmpi_post_fused(ccq_hmpi_op *h, uint32_t n)
{
    hmpi_fused *fz = calloc(1, sizeof *fz + n * sizeof fz->part[0]);
    uint8_t kind = h->op->kind;
    double total = 0, all;
    uint32_t i = 0;
    int rc;

    if (fz == NULL)
        return -1;
    for (ccq_hmpi_op *g = h; g != NULL; g = g->fnext, i++) {
        fz->part[i].op = g->run_op;
        fz->part[i].count = g->op->count;
        total += (double)g->op->count;
    }
    fz->n = n;
    fz->total = (size_t)total;
    /* The largest count MPI sees: every rank's blocks for all_gather and reduce_scatter. The
     * members compute the same, so all of them fail it alike (each op unfused would pass). */
    all = kind == CCQ_KIND_ALL_GATHER || kind == CCQ_KIND_REDUCE_SCATTER ? total * h->c->nranks
                                                                         : total;
    if (all > (double)INT_MAX) {
        free(fz);
        return MPI_ERR_COUNT;
    }
    if ((rc = post(h, fz)) != MPI_SUCCESS) {
        free(fz);
        return rc;
    }
    i = 0;
    for (ccq_hmpi_op *g = h; g != NULL; g = g->fnext, i++) {
        g->fz = fz;
        g->fi = i;
        g->what = h->what;
        fz->refs++;
    }
    h->run_op->fused = n;
    h->run_op->fused_t0 = ccq_now_ns();
    return MPI_SUCCESS;
}

void hmpi_finish_fused(ccq_hmpi_op *h)
{
    ccq_hmpi_comm *c = h->c;
    hmpi_fused *fz = h->fz;
    const ccq_be_op *op0 = h->op;
    ccq_dtype dt = (ccq_dtype)op0->dtype;
    size_t es = hmpi_esize(dt), T = fz->total, off = 0;
    uint32_t nl = op0->nparts;
    bool avg = op0->redop == CCQ_AVG;
    const char *o = h->out;

    for (uint32_t i = 0; i < fz->n; i++) {
        const ccq_be_op *op = fz->part[i].op;
        size_t cnt = fz->part[i].count, blk = cnt * es;
        for (uint32_t k = 0; op != NULL && k < nl; k++) {
            char *d = op->parts[k].dst;
            switch (op0->kind) {
            case CCQ_KIND_ALL_REDUCE: /* AVG divides on the way out, once (one pass) */
                if (k > 0)
                    hmpi_copy(d, op->parts[0].dst, blk);
                else if (avg)
                    ccq_host_divide(dt, o + off * es, d, cnt, c->nranks);
                else
                    hmpi_copy(d, o + off * es, blk);
                break;
            case CCQ_KIND_BROADCAST:
                hmpi_copy(d, o + off * es, blk);
                break;
            case CCQ_KIND_ALL_GATHER:
                for (int p = 0; p < c->nprocs; p++)
                    for (int j = 0; j < c->nl[p]; j++)
                        hmpi_copy(d + (size_t)(c->fr[p] + j) * blk,
                                  o + ((size_t)c->fr[p] * T + (size_t)c->nl[p] * off + j * cnt) *
                                          es,
                                  blk);
                break;
            default: /* reduce_scatter */
                if (avg)
                    ccq_host_divide(dt, o + (nl * off + k * cnt) * es, d, cnt, c->nranks);
                else
                    hmpi_copy(d, o + (nl * off + k * cnt) * es, blk);
                break;
            }
        }
        off += cnt;
    }
    if (fz->part[0].op != NULL)
        fz->part[0].op->fused_t1 = ccq_now_ns();
}
