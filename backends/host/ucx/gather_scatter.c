/* gather and scatter by binomial trees rooted at the root's process. Relative to the root
 * (v = (i - root) mod P), process v's subtree is v .. v + lowbit(v) - 1 (the root's: all of
 * them); its blocks lie contiguous in relative order, at roff[v] (elements) in a buffer
 * that only the root holds whole.
 *  - gather: v adds its children's subtrees (v + 1, v + 2, v + 4, ...) behind its own block,
 *    then sends its subtree to v - lowbit(v); the root reorders them by rank.
 *  - scatter: the root packs its input in relative order; v receives its subtree from its
 *    parent and passes each child its part, largest first.
 * Uneven device counts make uneven blocks (process p's: ucx_nl(p) x count elements). */
#include <stdio.h>
#include <string.h>

#include "backends/host/ucx/ucx.h"

/* BUF_AUX: roff[P + 1]; x[0] = v, x[1] = index of v's lowest set bit (the root: log2 P
 * rounded up). */

static uint32_t real_of(const ucx_op *o, uint32_t u)
{
    return (u + o->root_proc) % o->P;
}

static size_t *roffs(ucx_op *o)
{
    return o->buf[BUF_AUX];
}

/* The end of v's subtree (relative index, exclusive). */
static uint32_t sub_end(const ucx_op *o, uint32_t v)
{
    uint32_t end = v == 0 ? o->P : v + (1u << o->x[1]);
    return end < o->P ? end : o->P;
}

static ccq_status tree_init(ucx_op *o, ccq_errbuf *err)
{
    uint32_t P = o->P, v = (o->me + P - o->root_proc) % P, lb = 0;
    size_t *roff = ucx_scratch(o, BUF_AUX, (P + 1) * sizeof(size_t));

    if (roff == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    roff[0] = 0;
    for (uint32_t u = 0; u < P; u++)
        roff[u + 1] = roff[u] + (size_t)ucx_nl(o, real_of(o, u)) * o->count;
    if (v == 0)
        while ((1u << lb) < P)
            lb++;
    else
        while (!(v & (1u << lb)))
            lb++;
    o->x[0] = v;
    o->x[1] = lb;
    o->k = 0;
    if (ucx_scratch(o, BUF_RES, (roff[sub_end(o, v)] - roff[v]) * o->es + 1) == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory for UCX scratch");
        return CCQ_ERR_NO_MEMORY;
    }
    return CCQ_OK;
}

/* ---- gather ---------------------------------------------------------------------------- */

static ccq_status gather_init(ucx_op *o, ccq_errbuf *err)
{
    ccq_status st = tree_init(o, err);
    size_t blk = o->count * o->es;
    if (st != CCQ_OK)
        return st;
    for (uint32_t k = 0; k < o->op->nparts; k++)
        memcpy((char *)o->buf[BUF_RES] + k * blk, o->op->parts[k].src, blk);
    return CCQ_OK;
}

static ccq_status gather_advance(ucx_op *o, ccq_errbuf *err)
{
    uint32_t P = o->P, v = o->x[0];
    size_t *roff = roffs(o), es = o->es;
    char *res = o->buf[BUF_RES];
    ccq_status st;

    for (; o->k < 32 && (1u << o->k) < P; o->k++) {
        uint32_t mask = 1u << o->k;
        if (v & mask) { /* my subtree is complete: to the parent */
            uint32_t end = sub_end(o, v);
            if (!o->sent) {
                st = ucx_send_step(o, real_of(o, v - mask), o->k, res, (roff[end] - roff[v]) * es,
                                   0, err);
                if (st != CCQ_OK)
                    return st;
                o->sent = true;
            }
            return CCQ_OK;
        }
        if (v + mask < P) {
            uint32_t c = v + mask, end = c + mask < P ? c + mask : P;
            char *land = res + (roff[c] - roff[v]) * es;
            size_t len = (roff[end] - roff[c]) * es;
            ucx_msg *m;
            if ((st = ucx_recv_step(o, real_of(o, c), o->k, land, len, &m, err)) != CCQ_OK)
                return st;
            if (m->buf != land)
                memcpy(land, m->buf, len);
            ucx_msg_done(o->e, m);
        }
    }
    if (v != 0)
        return CCQ_OK;
    /* The root: every block, by rank, into the root rank's output. */
    {
        char *dst = o->op->parts[o->root - o->c->fr[o->me]].dst;
        for (uint32_t u = 0; u < P; u++) {
            uint32_t p = real_of(o, u);
            memmove(dst + (size_t)o->c->fr[p] * o->count * es, res + roff[u] * es,
                    (roff[u + 1] - roff[u]) * es);
        }
    }
    return CCQ_OK;
}

const ucx_alg ucx_gather_binomial = {"binomial tree", gather_init, gather_advance};

/* ---- scatter --------------------------------------------------------------------------- */

static ccq_status scatter_init(ucx_op *o, ccq_errbuf *err)
{
    ccq_status st = tree_init(o, err);
    size_t blk = o->count * o->es, *roff = roffs(o);
    if (st != CCQ_OK || o->x[0] != 0)
        return st;
    /* The root packs its input in relative order. */
    {
        const char *src = o->op->parts[o->root - o->c->fr[o->me]].src;
        char *res = o->buf[BUF_RES];
        for (uint32_t u = 0; u < o->P; u++) {
            uint32_t p = real_of(o, u);
            memcpy(res + roff[u] * o->es, src + (size_t)o->c->fr[p] * blk,
                   (size_t)ucx_nl(o, p) * blk);
        }
    }
    o->got = true;
    return CCQ_OK;
}

static ccq_status scatter_advance(ucx_op *o, ccq_errbuf *err)
{
    uint32_t P = o->P, v = o->x[0], lb = o->x[1];
    size_t *roff = roffs(o), es = o->es, blk = o->count * es;
    char *res = o->buf[BUF_RES];
    ccq_status st;

    if (!o->got) { /* my subtree from the parent */
        size_t len = (roff[sub_end(o, v)] - roff[v]) * es;
        ucx_msg *m;
        st = ucx_recv_step(o, real_of(o, v - (1u << lb)), lb, res, len, &m, err);
        if (st != CCQ_OK)
            return st;
        if (m->buf != res)
            memcpy(res, m->buf, len);
        ucx_msg_done(o->e, m);
        o->got = true;
    }
    if (!o->sent) {
        for (uint32_t j = lb; j-- > 0;) {
            uint32_t c = v + (1u << j), end;
            if (c >= P)
                continue;
            end = c + (1u << j) < P ? c + (1u << j) : P;
            st = ucx_send_step(o, real_of(o, c), j, res + (roff[c] - roff[v]) * es,
                               (roff[end] - roff[c]) * es, 0, err);
            if (st != CCQ_OK)
                return st;
        }
        o->sent = true;
    }
    /* My own block is at the start of my subtree. */
    for (uint32_t k = 0; k < o->op->nparts; k++)
        memmove(o->op->parts[k].dst, res + k * blk, blk);
    return CCQ_OK;
}

const ucx_alg ucx_scatter_binomial = {"binomial tree", scatter_init, scatter_advance};
