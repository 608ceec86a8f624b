/* all_to_all between processes by pairwise exchange: process i sends process i + s (for s =
 * 1 .. P - 1) the blocks its ranks send that process's ranks, packed in one message, and
 * receives from i - s; every message is posted at once (no step needs another) and lands
 * where the unpacking reads it.
 *
 * Packing for destination q: [local rank k][q's rank j] = block fr[q] + j of rank k's src, at
 * nl(me) x fr[q] x count; what arrives from p is [p's rank i][local rank j], at
 * fr[p] x nl(me) x count. */
#include <stdio.h>
#include <string.h>

#include "backends/host/ucx/ucx.h"

static ccq_status a2a_init(ucx_op *o, ccq_errbuf *err)
{
    const ccq_be_op *op = o->op;
    uint32_t nl = ucx_nl(o, o->me), nr = o->c->nranks;
    size_t blk = o->count * o->es;
    char *sb = ucx_scratch(o, BUF_AUX, blk * nl * nr), *rb = ucx_scratch(o, BUF_RES, blk * nl * nr);
    char *got = ucx_scratch(o, BUF_TMP, o->P);

    if (sb == NULL || rb == NULL || got == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory for UCX scratch");
        return CCQ_ERR_NO_MEMORY;
    }
    memset(got, 0, o->P);
    for (uint32_t q = 0; q < o->P; q++) {
        uint32_t nq = ucx_nl(o, q);
        char *d = sb + (size_t)nl * o->c->fr[q] * blk;
        for (uint32_t k = 0; k < nl; k++)
            for (uint32_t j = 0; j < nq; j++, d += blk)
                memcpy(d, (const char *)op->parts[k].src + (size_t)(o->c->fr[q] + j) * blk, blk);
    }
    /* This process's own blocks never leave it. */
    memcpy(rb + (size_t)o->c->fr[o->me] * nl * blk, sb + (size_t)nl * o->c->fr[o->me] * blk,
           (size_t)nl * nl * blk);
    o->x[0] = 0;
    return CCQ_OK;
}

/* To q: the packed blocks for q; from p: where p's blocks are unpacked from. */
static void packed_out(const ucx_op *o, uint32_t q, char **at, size_t *len)
{
    size_t blk = o->count * o->es, nl = ucx_nl(o, o->me);
    *at = (char *)o->buf[BUF_AUX] + nl * o->c->fr[q] * blk;
    *len = nl * ucx_nl(o, q) * blk;
}

static void packed_in(const ucx_op *o, uint32_t p, char **at, size_t *len)
{
    size_t blk = o->count * o->es, nl = ucx_nl(o, o->me);
    *at = (char *)o->buf[BUF_RES] + (size_t)o->c->fr[p] * nl * blk;
    *len = (size_t)ucx_nl(o, p) * nl * blk;
}

static ccq_status a2a_advance(ucx_op *o, ccq_errbuf *err)
{
    const ccq_be_op *op = o->op;
    uint32_t nl = ucx_nl(o, o->me);
    size_t blk = o->count * o->es;
    ccq_status st = ucx_exchange_all(o, packed_out, packed_in, o->buf[BUF_TMP], err);

    if (st != CCQ_OK)
        return st;
    /* Unpack into every local rank's output. */
    for (uint32_t p = 0; p < o->P; p++) {
        const char *r = (const char *)o->buf[BUF_RES] + (size_t)o->c->fr[p] * nl * blk;
        for (uint32_t i = 0; i < ucx_nl(o, p); i++)
            for (uint32_t j = 0; j < nl; j++, r += blk)
                memcpy((char *)op->parts[j].dst + (size_t)(o->c->fr[p] + i) * blk, r, blk);
    }
    return CCQ_OK;
}

const ucx_alg ucx_alltoall_pairwise = {"pairwise exchange", a2a_init, a2a_advance};
