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

/* ---- direct ---------------------------------------------------------------------------- */

/* Sends: this process's block to everyone; receives: p's block where it belongs. */
static void mine_out(const ucx_op *o, uint32_t q, char **at, size_t *len)
{
    (void)q;
    *at = (char *)o->buf[BUF_RES] + ucx_block_off(o, o->me) * o->es;
    *len = ucx_block_len(o, o->me) * o->es;
}

static void block_in(const ucx_op *o, uint32_t p, char **at, size_t *len)
{
    *at = (char *)o->buf[BUF_RES] + ucx_block_off(o, p) * o->es;
    *len = ucx_block_len(o, p) * o->es;
}

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
    return ucx_exchange_all(o, mine_out, block_in, o->buf[BUF_AUX], err);
}

const ucx_alg ucx_allgather_direct = {"direct", direct_init, direct_advance};

/* ---- ring ------------------------------------------------------------------------------ */

/* Segment g of block p: ucx_block(ucx_block_len(p), nseg, g). */

static ccq_status ring_init(ucx_op *o, ccq_errbuf *err)
{
    size_t biggest = 0;
    for (uint32_t p = 0; p < o->P; p++)
        biggest = ucx_block_len(o, p) > biggest ? ucx_block_len(o, p) : biggest;
    return ucx_segments(o, biggest, 0, ucx_window(), err); /* every block in nseg segments */
}

static ccq_status ring_seg(ucx_op *o, uint32_t g, ccq_errbuf *err)
{
    uint32_t P = o->P, me = o->me;
    char *res = o->buf[BUF_RES];
    size_t es = o->es;
    ucx_seg *s = &o->seg[g];
    ccq_status st;

    while (s->step < P - 1) {
        uint32_t k = s->step, sb = (me + P - k) % P, rb = (me + 2 * P - k - 1) % P;
        size_t so, sl, ro, rl;
        ucx_block(ucx_block_len(o, sb), o->nseg, g, &so, &sl);
        ucx_block(ucx_block_len(o, rb), o->nseg, g, &ro, &rl);
        st = ucx_ring_step(o, g, g * P + k, res + (ucx_block_off(o, sb) + so) * es, sl * es,
                           res + (ucx_block_off(o, rb) + ro) * es, rl * es, 0, NULL, NULL, NULL,
                           err);
        if (st != CCQ_OK)
            return st;
    }
    return CCQ_OK;
}

static ccq_status ring_advance(ucx_op *o, ccq_errbuf *err)
{
    return ucx_run_segments(o, ring_seg, err);
}

const ucx_alg ucx_allgather_ring = {"ring", ring_init, ring_advance};
