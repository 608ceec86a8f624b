/* all_reduce for small buffers: two schedules with the same combines.
 *
 * Recursive doubling: log2(P) rounds in which partners swap their whole partial sums. With P
 * not a power of two, the first 2R processes (R = P - P2, P2 the largest power of two <= P)
 * pair up first: the even one hands its buffer to the odd one and gets the result back at
 * the end.
 *
 * Every combine puts the partial of the lower-ranked processes first, and both partners of
 * a round combine the same two partials, so every process ends with the same bits (float
 * sums too), whatever the order the messages arrived in: the result is one fixed tree over
 * the processes' inputs (the pairs of the fold, then the rounds' halves).
 *
 * Direct (opt-in: ucx/select.c, DIRECT_AR_BYTES; three processes or more, the smallest
 * buffers): every process sends its buffer to every other at once, one round, and combines
 * the P buffers itself along that same tree.
 * The bits are recursive doubling's (a fused group of such operations runs recursive
 * doubling over its parts: ucx/fused.c), and no process waits for a partner's earlier round:
 * one message on the way to each process instead of 2 in a row with 4 processes, or 3 with 3
 * (the fold, the round, the unfold). It costs P - 1 messages and combines per process instead
 * of log2(P), so it stops at a size and a world size (ucx/select.c, DIRECT_AR_BYTES). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backends/host/ucx/ucx.h"

enum { ST_FOLD, ST_ROUNDS, ST_UNFOLD, ST_WAIT_FINAL, ST_DONE };
#define STEP_FOLD  0u
#define STEP_FINAL 100u

/* x[0] = P2, x[1] = R, x[2] = log2(P2) */

/* P2, the largest power of two <= P, and its log2 (*lg): the tree both schedules follow. */
static uint32_t pow2_below(uint32_t P, uint32_t *lg)
{
    uint32_t p2 = 1;
    *lg = 0;
    while (p2 * 2 <= P) {
        p2 *= 2;
        ++*lg;
    }
    return p2;
}

static ccq_status rd_init(ucx_op *o, ccq_errbuf *err)
{
    uint32_t lg, p2 = pow2_below(o->P, &lg);
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
    o->wrote_out = true;
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

/* ---- direct ---------------------------------------------------------------------------- */

/* BUF_TMP: one slot per member, where its buffer lands (this process's own slot, unused by
 * the exchange, holds a partial of the tree); BUF_AUX: one flag per member. x[0] counts the
 * arrivals (ucx_exchange_all), x[1] = R, x[2] = log2(P2), x[3] = P2. */

static char *slot(const ucx_op *o, uint32_t p)
{
    return (char *)o->buf[BUF_TMP] + (size_t)p * o->count * o->es;
}

static void whole_out(const ucx_op *o, uint32_t q, char **at, size_t *len)
{
    (void)q;
    *at = o->buf[BUF_RES];
    *len = o->count * o->es;
}

static void slot_in(const ucx_op *o, uint32_t p, char **at, size_t *len)
{
    *at = slot(o, p);
    *len = o->count * o->es;
}

static ccq_status direct_init(ucx_op *o, ccq_errbuf *err)
{
    uint32_t lg, p2 = pow2_below(o->P, &lg);
    if (o->P > UCX_DIRECT_AR_MAX_P) { /* ucx_select never picks it there */
        snprintf(err->msg, sizeof err->msg, "the direct all_reduce spans at most %u processes",
                 UCX_DIRECT_AR_MAX_P);
        return CCQ_ERR_BACKEND;
    }
    if (ucx_scratch(o, BUF_TMP, o->count * o->es * o->P) == NULL ||
        ucx_scratch(o, BUF_AUX, o->P) == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory for UCX scratch");
        return CCQ_ERR_NO_MEMORY;
    }
    memset(o->buf[BUF_AUX], 0, o->P);
    o->x[0] = 0;
    o->x[1] = o->P - p2;
    o->x[2] = lg;
    o->x[3] = p2;
    o->stage = ST_ROUNDS; /* anything but ST_DONE: the tree not combined yet */
    return CCQ_OK;
}

/* Member p's buffer: this process's own in res, the others' where they landed. */
static const char *input_of(const ucx_op *o, uint32_t p)
{
    return p == o->me ? o->buf[BUF_RES] : slot(o, p);
}

/* Recursive doubling's tree over the P buffers, every combine the lower-ranked partial
 * first: the fold's pairs (2v, 2v + 1) for v < R, then log2(P2) levels of halves. Node v's
 * partial is written into the slot of real_of(v), which holds nothing else needed any more;
 * the root's into res (this process's own sends, which read res, have left by then). */
static void direct_tree(ucx_op *o)
{
    uint32_t R = o->x[1], lg = o->x[2], P2 = o->x[3];
    const void *node[UCX_DIRECT_AR_MAX_P];
    for (uint32_t v = 0; v < P2; v++) {
        if (v < R) {
            const void *src[2] = {input_of(o, 2 * v), input_of(o, 2 * v + 1)};
            ucx_reduce(o, 2, src, slot(o, 2 * v + 1), o->count);
            node[v] = slot(o, 2 * v + 1);
        } else {
            node[v] = input_of(o, v + R);
        }
    }
    for (uint32_t k = 0; k < lg; k++) {
        for (uint32_t v = 0; v < P2; v += 2u << k) {
            const void *src[2] = {node[v], node[v + (1u << k)]};
            void *dst = k + 1 == lg ? o->buf[BUF_RES] : slot(o, real_of(o, v));
            ucx_reduce(o, 2, src, dst, o->count);
            node[v] = dst;
        }
    }
}

static ccq_status direct_advance(ucx_op *o, ccq_errbuf *err)
{
    ccq_status st;
    if (o->stage == ST_DONE)
        return CCQ_OK;
    if ((st = ucx_exchange_all(o, whole_out, slot_in, o->buf[BUF_AUX], err)) != CCQ_OK)
        return st;
    /* res is written by the tree's root: its sends must have left. */
    if (!ucx_sends_done(o, 0, &st, err))
        return st != CCQ_OK ? st : CCQ_IN_PROGRESS;
    if (st != CCQ_OK)
        return st;
    direct_tree(o);
    o->stage = ST_DONE;
    return CCQ_OK;
}

const ucx_alg ucx_allreduce_direct = {"direct", direct_init, direct_advance};
