/* reduce by a binomial tree towards the root's process, pipelined in segments. Relative to
 * the root (v = (i - root) mod P), process v first adds the partials of its children v + 1,
 * v + 2, v + 4, ... (those below its lowest set bit), then sends the sum to its parent
 * v - lowbit(v). The root's process ends with the result.
 *
 * A combine puts the partial covering the lower relative indices first (its own, then the
 * child's): the tree and the order depend only on P and the root, so a run is repeatable. */
#include <stdio.h>

#include "backends/host/ucx/ucx.h"

/* x[0] = largest segment (elements): the landing slot's size. */

static ccq_status reduce_init(ucx_op *o, ccq_errbuf *err)
{
    ccq_status st = ucx_segments(o, o->count, 0, ucx_window(), err);
    if (st != CCQ_OK)
        return st;
    o->x[0] = (uint32_t)o->seg_elems;
    if (ucx_scratch(o, BUF_TMP, (size_t)o->window * o->seg_elems * o->es) == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory for UCX scratch");
        return CCQ_ERR_NO_MEMORY;
    }
    return CCQ_OK;
}

static ccq_status reduce_seg(ucx_op *o, uint32_t g, ccq_errbuf *err)
{
    uint32_t P = o->P, v = (o->me + P - o->root_proc) % P;
    size_t off0 = (size_t)g * o->seg_elems, es = o->es;
    size_t len = o->count - off0 < o->seg_elems ? o->count - off0 : o->seg_elems;
    char *res = (char *)o->buf[BUF_RES] + off0 * es;
    char *slot = (char *)o->buf[BUF_TMP] + (size_t)(g % o->window) * o->seg_elems * es;
    ucx_seg *s = &o->seg[g];
    ccq_status st = CCQ_OK;

    for (;;) {
        uint32_t mask = 1u << s->step;
        if (s->step >= 32 || mask >= P)
            return CCQ_OK; /* the root: every child added */
        if (v & mask) {    /* to the parent, then this segment is done here */
            if (!s->sent) {
                uint32_t parent = (v - mask + o->root_proc) % P;
                st = ucx_send_step(o, parent, g * 32 + s->step, res, len * es, g, err);
                if (st != CCQ_OK)
                    return st;
                s->sent = 1;
            }
            return CCQ_OK;
        }
        if (v + mask < P) {
            uint32_t child = (v + mask + o->root_proc) % P;
            ucx_msg *m;
            st = ucx_recv_step(o, child, g * 32 + s->step, slot, len * es, &m, err);
            if (st != CCQ_OK)
                return st;
            const void *src[2] = {res, m->buf};
            ucx_reduce(o, 2, src, res, len);
            ucx_msg_done(o->e, m);
        }
        s->step++;
    }
}

static ccq_status reduce_advance(ucx_op *o, ccq_errbuf *err)
{
    return ucx_run_segments(o, reduce_seg, err);
}

const ucx_alg ucx_reduce_binomial = {"binomial tree", reduce_init, reduce_advance};
