/* broadcast by a binomial tree from the root's process, pipelined in segments: relative to
 * the root (v = (i - root) mod P), process v receives from its parent v - lowbit(v), then
 * sends to its children v + 2^j for every 2^j below its lowest set bit (the root: below P),
 * largest first. */
#include <stdio.h>
#include <string.h>

#include "backends/host/ucx/ucx.h"

static uint32_t lowbit_index(uint32_t v, uint32_t P)
{
    uint32_t j = 0;
    if (v == 0) { /* the root: above its largest child */
        while ((1u << j) < P)
            j++;
        return j;
    }
    while (!(v & (1u << j)))
        j++;
    return j;
}

static ccq_status bcast_init(ucx_op *o, ccq_errbuf *err)
{
    return ucx_segments(o, o->count, 0, ucx_window(), err);
}

static ccq_status bcast_seg(ucx_op *o, uint32_t g, ccq_errbuf *err)
{
    uint32_t P = o->P, v = (o->me + P - o->root_proc) % P, lb = lowbit_index(v, P);
    size_t off0 = (size_t)g * o->seg_elems, es = o->es;
    size_t len = o->count - off0 < o->seg_elems ? o->count - off0 : o->seg_elems;
    char *res = (char *)o->buf[BUF_RES] + off0 * es;
    ucx_seg *s = &o->seg[g];
    ccq_status st;

    if (v != 0 && !s->sent) { /* sent: here, "received from the parent" */
        uint32_t parent = (v - (1u << lb) + o->root_proc) % P;
        ucx_msg *m;
        st = ucx_recv_step(o, parent, g * 32 + lb, res, len * es, &m, err);
        if (st != CCQ_OK)
            return st;
        if (m->buf != res)
            memcpy(res, m->buf, len * es);
        ucx_msg_done(o->e, m);
        s->sent = 1;
    }
    /* Every child at once: the segment is not written again. */
    for (uint32_t j = lb; j-- > 0;) {
        uint32_t c = v + (1u << j);
        if (c >= P)
            continue;
        st = ucx_send_step(o, (c + o->root_proc) % P, g * 32 + j, res, len * es, g, err);
        if (st != CCQ_OK)
            return st;
    }
    return CCQ_OK;
}

static ccq_status bcast_advance(ucx_op *o, ccq_errbuf *err)
{
    return ucx_run_segments(o, bcast_seg, err);
}

const ucx_alg ucx_bcast_binomial = {"binomial tree", bcast_init, bcast_advance};
