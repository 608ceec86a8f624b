/* all_reduce by recursive doubling, for small buffers: log2(P) rounds in which partners swap
 * their whole partial sums. With P not a power of two, the first 2R processes (R = P - P2, P2
 * the largest power of two <= P) pair up first: the even one hands its buffer to the odd
 * one and gets the result back at the end.
 *
 * Every combine puts the partial of the lower-ranked processes first, and both partners of
 * a round combine the same two partials, so every process ends with the same bits (float
 * sums too), whatever the order the messages arrived in. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backends/host/ucx/ucx.h"

enum { ST_FOLD, ST_ROUNDS, ST_UNFOLD, ST_WAIT_FINAL, ST_DONE };
#define STEP_FOLD  0u
#define STEP_FINAL 100u

/* x[0] = P2, x[1] = R, x[2] = log2(P2) */

static ccq_status rd_init(ucx_op *o, ccq_errbuf *err)
{
    uint32_t p2 = 1, lg = 0;
    while (p2 * 2 <= o->P) {
        p2 *= 2;
        lg++;
    }
    o->x[0] = p2;
    o->x[1] = o->P - p2;
    o->x[2] = lg;
    o->stage = ST_FOLD;
    o->k = 0;
    if (ucx_scratch(o, BUF_TMP, o->count * o->es) == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory for UCX scratch");
        return CCQ_ERR_NO_MEMORY;
    }
    return CCQ_OK;
}

/* The member index of virtual rank v among the P2 processes of the rounds. */
static uint32_t real_of(const ucx_op *o, uint32_t v)
{
    return v < o->x[1] ? 2 * v + 1 : v + o->x[1];
}

/* res = first (+) second, the lower-ranked partial first. The last round's combine of a
 * process that hands nothing on (no unfold) writes the outputs instead, as local_outputs
 * would from res, so no copy out is left (AVG: each output's sum divided in place, the bits
 * local_outputs gives); a fused group's parts are written from res (fused_outputs). */
static void combine(ucx_op *o, const void *lower, const void *higher)
{
    const void *src[2] = {lower, higher};
    const ccq_be_op *op = o->op;
    void *out[CCQ_MAX_DEVICES];
    if (o->fz != NULL || o->k + 1 != o->x[2] || o->me < 2 * o->x[1] || o->stage != ST_ROUNDS) {
        ucx_reduce(o, 2, src, o->buf[BUF_RES], o->count);
        return;
    }
    for (uint32_t k = 0; k < op->nparts; k++)
        out[k] = op->parts[k].dst;
    ucx_reduce_to(o, 2, src, op->nparts, out, o->count);
    for (uint32_t k = 0; o->redop == CCQ_AVG && k < op->nparts; k++)
        ucx_write_result(o, out + k, 1, out[k], o->count); /* each sum divided in place */
    o->rd_out = true;
}

static ccq_status rd_advance(ucx_op *o, ccq_errbuf *err)
{
    size_t bytes = o->count * o->es;
    uint32_t R = o->x[1], me = o->me;
    char *res = o->buf[BUF_RES];
    ccq_status st = CCQ_OK;
    ucx_msg *m;

    for (;;) {
        switch (o->stage) {
        case ST_FOLD:
            if (me >= 2 * R) {
                o->stage = ST_ROUNDS;
                break;
            }
            if (me % 2 == 0) { /* hand the buffer to the odd neighbour, wait for the result */
                if ((st = ucx_send_step(o, me + 1, STEP_FOLD, res, bytes, 0, err)) != CCQ_OK)
                    return st;
                o->stage = ST_WAIT_FINAL;
                break;
            }
            st = ucx_recv_step(o, me - 1, STEP_FOLD, o->buf[BUF_TMP], bytes, &m, err);
            if (st != CCQ_OK)
                return st;
            combine(o, m->buf, res);
            ucx_msg_done(o->e, m);
            o->stage = ST_ROUNDS;
            break;
        case ST_ROUNDS: {
            uint32_t v = me < 2 * R ? me / 2 : me - R, pv, peer;
            if (o->k == o->x[2]) {
                o->stage = ST_UNFOLD;
                break;
            }
            pv = v ^ (1u << o->k);
            peer = real_of(o, pv);
            if (!o->sent) {
                if ((st = ucx_send_step(o, peer, 1 + o->k, res, bytes, 0, err)) != CCQ_OK)
                    return st;
                o->sent = true;
            }
            /* res is combined into in place: its send must have left first. */
            st = ucx_recv_step(o, peer, 1 + o->k, o->buf[BUF_TMP], bytes, &m, err);
            if (st != CCQ_OK)
                return st;
            if (!ucx_sends_done(o, 0, &st, err)) {
                /* keep m: it is consumed once the send completed */
                m->next = o->arrivals;
                o->arrivals = m;
                m->state = MSG_READY;
                return st != CCQ_OK ? st : CCQ_IN_PROGRESS;
            }
            if (st != CCQ_OK) {
                ucx_msg_done(o->e, m);
                return st;
            }
            if (pv < v)
                combine(o, m->buf, res);
            else
                combine(o, res, m->buf);
            ucx_msg_done(o->e, m);
            o->k++;
            o->sent = false;
            break;
        }
        case ST_UNFOLD:
            if (me < 2 * R &&
                (st = ucx_send_step(o, me - 1, STEP_FINAL, res, bytes, 0, err)) != CCQ_OK)
                return st;
            o->stage = ST_DONE;
            break;
        case ST_WAIT_FINAL:
            st = ucx_recv_step(o, me + 1, STEP_FINAL, o->buf[BUF_TMP], bytes, &m, err);
            if (st != CCQ_OK)
                return st;
            /* res is overwritten: the fold's send must have left. */
            if (!ucx_sends_done(o, 0, &st, err)) {
                m->next = o->arrivals;
                o->arrivals = m;
                return st != CCQ_OK ? st : CCQ_IN_PROGRESS;
            }
            memcpy(res, m->buf, bytes);
            ucx_msg_done(o->e, m);
            o->stage = ST_DONE;
            break;
        default:
            return CCQ_OK;
        }
    }
}

const ucx_alg ucx_allreduce_rd = {"recursive doubling", rd_init, rd_advance};
