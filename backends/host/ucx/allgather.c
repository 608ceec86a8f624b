/* all_gather between processes: process p's block is its ranks' inputs (ucx_nl(p) x count
 * elements, at rank fr[p] of the result), uneven when device counts are.
 *  - direct (small): every process sends its block to every other at once, one round.
 *  - ring (large): P - 1 steps; at step s process i passes block i - s to i + 1 and gets
 *    block i - s - 1 from i - 1, pipelined in segments (segment g of every block moves
 *    together). A block lands in the result where it belongs, never into a block being
 *    sent. */
#include <stdio.h>
#include <string.h>

#include "backends/host/ucx/ucx.h"

static size_t block_off(const ucx_op *o, uint32_t p)
{
    return (size_t)o->c->fr[p] * o->count;
}

static size_t block_len(const ucx_op *o, uint32_t p)
{
    return (size_t)ucx_nl(o, p) * o->count;
}

/* ---- direct ---------------------------------------------------------------------------- */

/* x[0]: blocks received so far; BUF_AUX: one flag per member. */

static ccq_status direct_init(ucx_op *o, ccq_errbuf *err)
{
    if (ucx_scratch(o, BUF_AUX, o->P) == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    memset(o->buf[BUF_AUX], 0, o->P);
    o->x[0] = 0;
    return CCQ_OK;
}

static ccq_status direct_advance(ucx_op *o, ccq_errbuf *err)
{
    char *res = o->buf[BUF_RES], *got = o->buf[BUF_AUX];
    size_t es = o->es;
    ccq_status st;

    if (!o->sent) {
        for (uint32_t s = 1; s < o->P; s++) {
            uint32_t q = (o->me + s) % o->P;
            st = ucx_send_step(o, q, 0, res + block_off(o, o->me) * es, block_len(o, o->me) * es, 0,
                               err);
            if (st != CCQ_OK)
                return st;
        }
        o->sent = true;
    }
    for (uint32_t s = 1; s < o->P && o->x[0] < o->P - 1; s++) {
        uint32_t p = (o->me + o->P - s) % o->P;
        char *land = res + block_off(o, p) * es;
        ucx_msg *m;
        if (got[p])
            continue;
        st = ucx_recv_step(o, p, 0, land, block_len(o, p) * es, &m, err);
        if (st == CCQ_IN_PROGRESS)
            continue;
        if (st != CCQ_OK)
            return st;
        if (m->buf != land)
            memcpy(land, m->buf, block_len(o, p) * es);
        ucx_msg_done(o->e, m);
        got[p] = 1;
        o->x[0]++;
    }
    return o->x[0] == o->P - 1 ? CCQ_OK : CCQ_IN_PROGRESS;
}

const ucx_alg ucx_allgather_direct = {"direct", direct_init, direct_advance};

/* ---- ring ------------------------------------------------------------------------------ */

/* Segment g of block p: ucx_block(block_len(p), nseg, g). */

static ccq_status ring_init(ucx_op *o, ccq_errbuf *err)
{
    size_t biggest = 0;
    ccq_status st;
    for (uint32_t p = 0; p < o->P; p++)
        biggest = block_len(o, p) > biggest ? block_len(o, p) : biggest;
    st = ucx_segments(o, biggest, 0, ucx_window(), err);
    if (st == CCQ_OK) /* every block in the same number of segments */
        o->x[0] = o->nseg;
    return st;
}

static ccq_status ring_seg(ucx_op *o, uint32_t g, ccq_errbuf *err)
{
    uint32_t P = o->P, me = o->me, next = (me + 1) % P, prev = (me + P - 1) % P;
    char *res = o->buf[BUF_RES];
    size_t es = o->es;
    ucx_seg *s = &o->seg[g];
    ccq_status st;

    while (s->step < P - 1) {
        uint32_t k = s->step, sb = (me + P - k) % P, rb = (me + 2 * P - k - 1) % P;
        size_t so, sl, ro, rl;
        ucx_msg *m;
        ucx_block(block_len(o, sb), o->nseg, g, &so, &sl);
        ucx_block(block_len(o, rb), o->nseg, g, &ro, &rl);
        if (!s->sent) {
            st = ucx_send_step(o, next, g * P + k, res + (block_off(o, sb) + so) * es, sl * es, g,
                               err);
            if (st != CCQ_OK)
                return st;
            s->sent = 1;
        }
        char *land = res + (block_off(o, rb) + ro) * es;
        if ((st = ucx_recv_step(o, prev, g * P + k, land, rl * es, &m, err)) != CCQ_OK)
            return st;
        if (m->buf != land)
            memcpy(land, m->buf, rl * es);
        ucx_msg_done(o->e, m);
        s->step++;
        s->sent = 0;
    }
    return CCQ_OK;
}

static ccq_status ring_advance(ucx_op *o, ccq_errbuf *err)
{
    return ucx_run_segments(o, ring_seg, err);
}

const ucx_alg ucx_allgather_ring = {"ring", ring_init, ring_advance};
