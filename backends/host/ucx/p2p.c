/* send and recv halves between two processes: one message each way, on the pair's channel
 * (its sender's rank) under the runtime's per-pair sequence, so halves pair in order. The
 * send's payload is a copy (taken at start), posted at once: the host backend reports it
 * complete (detach) while UCX finishes it, as a buffered send. */
#include <stdio.h>
#include <string.h>

#include "backends/host/ucx/ucx.h"

static ccq_status send_init(ucx_op *o, ccq_errbuf *err)
{
    return ucx_send_step(o, o->peer_proc, 0, o->buf[BUF_RES], o->count * o->es, 0, err);
}

static ccq_status send_advance(ucx_op *o, ccq_errbuf *err)
{
    ccq_status st = CCQ_OK;
    if (!ucx_sends_done(o, UCX_ALL, &st, err))
        return st != CCQ_OK ? st : CCQ_IN_PROGRESS;
    return st;
}

const ucx_alg ucx_send_direct = {"direct", send_init, send_advance};

static ccq_status recv_init(ucx_op *o, ccq_errbuf *err)
{
    if (ucx_scratch(o, BUF_RES, o->count * o->es) == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory for UCX scratch");
        return CCQ_ERR_NO_MEMORY;
    }
    return CCQ_OK;
}

static ccq_status recv_advance(ucx_op *o, ccq_errbuf *err)
{
    size_t bytes = o->count * o->es;
    ucx_msg *m;
    ccq_status st = ucx_recv_step(o, o->peer_proc, 0, o->buf[BUF_RES], bytes, &m, err);
    if (st != CCQ_OK)
        return st;
    if (m->buf != o->buf[BUF_RES])
        memcpy(o->buf[BUF_RES], m->buf, bytes);
    ucx_msg_done(o->e, m);
    return CCQ_OK;
}

const ucx_alg ucx_recv_direct = {"direct", recv_init, recv_advance};
