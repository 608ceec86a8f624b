/* Pairs of devices in two processes (a communicator of two ranks, one in each), over
 * point-to-point messages on the world's MPI duplicate: their send/recv halves and their
 * collectives. No MPI communicator of their own: MPI_Comm_create_group blocks until both call
 * it, so making one lazily at a pair's first collective hung the scheduler (and
 * ccq_runtime_destroy) for ever when the peer never joined, and making them as pairs form
 * deadlocks processes that form their pairs in different orders. Between two processes every
 * collective is an exchange of one buffer, so none is needed.
 *
 * Every operation's messages go under the pair's tags (HMPI_PAIR_TAGS from pair_tag: per
 * channel, header or data, and sender) in the runtime's sequence order, which MPI keeps for one
 * sender, tag and communicator. Each side first sends a header (its hmpi_sig) and, when its part
 * sends data, the data; the receiving side takes the peer's header first and posts the receive
 * of the data only when both agree (count, dtype, and for a collective kind, op and root):
 * otherwise it receives the peer's data into scratch only to drop it, and the operation fails
 * with CCQ_ERR_MISMATCH, the user's buffer untouched. A send completes once its data is copied
 * (ccq_hmpi_detach), so only the receiving side of a send/recv learns of a mismatch. Headers
 * are decided in sequence order per channel, so data receives are posted in the order the data
 * was sent. Reductions combine the two parts in rank order on both sides: both get the same bits.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/host/mpi/impl.h"
#include "backends/host/reduce.h"

enum { CH_P2P, CH_COLL, CH_COLL2 }; /* CH_COLL2: the second exchange of a split all_reduce */

/* All_reduces of at least this many bytes go in two exchanges, as a ring of two would: each
 * side reduces half (the peer's half of its input out, the peer's part of its half in), then
 * they swap their reduced halves. Half the reduction work and less memory traffic than
 * swapping whole inputs, at the price of a second round trip. */
#define PAIR_SPLIT_BYTES (128u * 1024u)

/* The halves of a split all_reduce: rank 0 reduces the first count / 2 elements. */
static size_t half_off(size_t count, int r)
{
    return r ? count / 2 : 0;
}

static size_t half_len(size_t count, int r)
{
    return r ? count - count / 2 : count / 2;
}

static bool split_of(const hmpi_sig *s)
{
    return s->kind == CCQ_KIND_ALL_REDUCE && s->count >= 2 &&
           s->count * hmpi_esize((ccq_dtype)s->dtype) >= PAIR_SPLIT_BYTES;
}
enum { MSG_HDR, MSG_DATA };

static int tag(const ccq_hmpi_comm *c, int chan, int msg, int sender)
{
    return c->pair_tag + chan * 4 + msg * 2 + sender;
}

/* Bytes rank r of a pair sends the other, and receives from it, for the operation s (the
 * first exchange of a split all_reduce). */
static void roles(const hmpi_sig *s, int r, size_t *sends, size_t *recvs)
{
    size_t es = hmpi_esize((ccq_dtype)s->dtype), blk = (size_t)s->count * es;
    bool root = (int)s->root == r;
    *sends = *recvs = 0;
    if (split_of(s)) {
        *sends = half_len(s->count, 1 - r) * es;
        *recvs = half_len(s->count, r) * es;
        return;
    }
    switch (s->kind) {
    case CCQ_KIND_ALL_REDUCE:
    case CCQ_KIND_ALL_GATHER:
    case CCQ_KIND_REDUCE_SCATTER:
    case CCQ_KIND_ALL_TO_ALL:
        *sends = *recvs = blk;
        break;
    case CCQ_KIND_REDUCE:
    case CCQ_KIND_GATHER:
        *(root ? recvs : sends) = blk;
        break;
    case CCQ_KIND_BROADCAST:
    case CCQ_KIND_SCATTER:
        *(root ? sends : recvs) = blk;
        break;
    default: /* a send/recv half: decided by the caller */
        break;
    }
}

static bool overlap(const void *a, size_t na, const void *b, size_t nb)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na > 0 && nb > 0 && x < y + nb && y < x + na;
}

/* Where this side's data goes out from and the peer's comes in to, for a collective (false:
 * out of memory for scratch). */
static bool coll_buffers(ccq_hmpi_op *h, const ccq_be_op *op, const void **s, void **r)
{
    const ccq_hmpi_comm *c = h->c;
    const ccq_be_part *pt = &op->parts[0];
    size_t blk = op->count * hmpi_esize((ccq_dtype)op->dtype);
    int me = c->me, other = 1 - me;
    bool root = (int)op->root == me;

    *s = NULL;
    *r = NULL;
    switch (op->kind) {
    case CCQ_KIND_ALL_REDUCE:
        if (h->split) {
            size_t es = hmpi_esize((ccq_dtype)op->dtype);
            *s = (const char *)pt->src + half_off(op->count, other) * es;
            *r = hmpi_scratch(h, H_BUF_RECV, half_len(op->count, me) * es);
            break;
        }
        *s = pt->src;
        *r = hmpi_scratch(h, H_BUF_RECV, blk);
        break;
    case CCQ_KIND_REDUCE:
        if (root)
            *r = hmpi_scratch(h, H_BUF_RECV, blk);
        else
            *s = pt->src;
        break;
    case CCQ_KIND_BROADCAST:
        if (root)
            *s = pt->src;
        else
            *r = pt->dst;
        break;
    case CCQ_KIND_ALL_GATHER:
        *s = pt->src;
        *r = (char *)pt->dst + (size_t)other * blk;
        break;
    case CCQ_KIND_REDUCE_SCATTER:
        *s = (const char *)pt->src + (size_t)other * blk;
        *r = hmpi_scratch(h, H_BUF_RECV, blk);
        break;
    case CCQ_KIND_ALL_TO_ALL:
        *s = (const char *)pt->src + (size_t)other * blk;
        *r = (char *)pt->dst + (size_t)other * blk;
        break;
    case CCQ_KIND_GATHER:
        if (root)
            *r = (char *)pt->dst + (size_t)other * blk;
        else
            *s = pt->src;
        break;
    default: /* CCQ_KIND_SCATTER */
        if (root)
            *s = (const char *)pt->src + (size_t)other * blk;
        else
            *r = pt->dst;
        break;
    }
    return *s != NULL || *r != NULL;
}

ccq_status hmpi_pair_start(ccq_hmpi_op *h, const ccq_be_op *op, ccq_errbuf *err)
{
    ccq_hmpi_comm *c = h->c;
    ccq_dtype dt = (ccq_dtype)op->dtype;
    size_t blk = op->count * hmpi_esize(dt);
    int me = c->me, other = 1 - me, peer = (int)c->procs[other], n = (int)op->count, rc;
    MPI_Datatype t = hmpi_mpi_type(dt);
    bool coll = ccq_kinds[op->kind].collective;
    int ch = coll ? CH_COLL : CH_P2P;

    hmpi_sig_of(c, op, &h->mine);
    h->mine.first_rank = (uint32_t)me; /* one rank per process */
    h->mine.nranks = 1;
    h->what = coll                        ? "MPI_Isend/MPI_Irecv (a pair's exchange)"
              : op->kind == CCQ_KIND_SEND ? "MPI_Isend"
                                          : "MPI_Irecv";
    if (op->kind == CCQ_KIND_RECV) {
        /* The peer's header first; the data receive is posted once it agrees. */
        rc = MPI_Irecv(&h->theirs, (int)sizeof h->theirs, MPI_BYTE, peer,
                       tag(c, ch, MSG_HDR, other), c->p2p, &h->req[RQ_HDR_RECV]);
        if (rc != MPI_SUCCESS)
            return hmpi_mpi_err(err, rc, "MPI_Irecv of a header");
        hmpi_wq_push(c, HMPI_WQ_P2P, h);
        return CCQ_OK;
    }
    rc = MPI_Isend(&h->mine, (int)sizeof h->mine, MPI_BYTE, peer, tag(c, ch, MSG_HDR, me), c->p2p,
                   &h->req[RQ_HDR_SEND]);
    if (rc != MPI_SUCCESS)
        return hmpi_mpi_err(err, rc, "MPI_Isend of a header");
    if (!coll && blk == 0) {
        h->phase = PH_RUN;
        return CCQ_OK;
    }
    if (!coll) {
        /* Always from a copy: the send completes at once (ccq_hmpi_detach), so a send then a
         * recv on one stream (a ring) cannot wait for the peer's send behind its own. */
        void *cp = hmpi_scratch(h, H_BUF_SCRATCH, blk);
        if (cp == NULL)
            goto oom;
        hmpi_copy(cp, op->parts[0].src, blk);
        rc = MPI_Isend(cp, n, t, peer, tag(c, ch, MSG_DATA, me), c->p2p, &h->req[RQ_OP]);
        if (rc != MPI_SUCCESS)
            return hmpi_mpi_err(err, rc, "MPI_Isend");
        h->phase = PH_RUN;
        return CCQ_OK;
    }
    {
        const void *s;
        void *r;
        size_t sends, recvs;
        h->split = split_of(&h->mine);
        roles(&h->mine, me, &sends, &recvs);
        if (!coll_buffers(h, op, &s, &r))
            goto oom;
        if (s != NULL && overlap(s, blk, r, r != NULL ? blk : 0)) {
            /* in place (all_to_all): the peer's block lands where ours leaves from */
            void *cp = hmpi_scratch(h, H_BUF_SCRATCH, blk);
            if (cp == NULL)
                goto oom;
            hmpi_copy(cp, s, blk);
            s = cp;
        }
        h->out = r;
        if (sends > 0) { /* a data message exists exactly when its byte count is not 0 */
            rc = MPI_Isend(s, (int)(sends / hmpi_esize(dt)), t, peer, tag(c, ch, MSG_DATA, me),
                           c->p2p, &h->req[RQ_OP]);
            if (rc != MPI_SUCCESS)
                return hmpi_mpi_err(err, rc, "MPI_Isend");
        }
    }
    rc = MPI_Irecv(&h->theirs, (int)sizeof h->theirs, MPI_BYTE, peer, tag(c, ch, MSG_HDR, other),
                   c->p2p, &h->req[RQ_HDR_RECV]);
    if (rc != MPI_SUCCESS)
        return hmpi_mpi_err(err, rc, "MPI_Irecv of a header");
    hmpi_wq_push(c, HMPI_WQ_COLL, h);
    return CCQ_OK;
oom:
    snprintf(err->msg, sizeof err->msg, "out of memory for MPI scratch");
    return CCQ_ERR_NO_MEMORY;
}

/* The peer's header of h has arrived: post the data receive, or drop the peer's data. */
static void decide(ccq_hmpi_op *h)
{
    ccq_hmpi_comm *c = h->c;
    const ccq_be_op *op = h->op;
    bool coll = ccq_kinds[op->kind].collective;
    int other = 1 - c->me, peer = (int)c->procs[other], ch = coll ? CH_COLL : CH_P2P, rc;
    hmpi_sig rec[2];
    char why[CCQ_DETAIL_LEN], d[CCQ_DETAIL_LEN];
    size_t mine_in = 0, theirs_out = 0, dummy;

    rec[c->me] = h->mine;
    rec[other] = h->theirs;
    bool ours = h->theirs.magic == HMPI_SIG_MAGIC && h->theirs.comm[0] == c->blob[0] &&
                h->theirs.comm[1] == c->blob[1];
    if (ours && !hmpi_sig_differ(rec, c->procs, 2, why, sizeof why)) {
        if (coll) {
            roles(&h->mine, c->me, &dummy, &mine_in);
        } else {
            mine_in = op->count * hmpi_esize((ccq_dtype)op->dtype);
            h->out = op->parts[0].dst;
        }
        if (mine_in > 0) {
            rc = MPI_Irecv(h->out, (int)(mine_in / hmpi_esize((ccq_dtype)op->dtype)),
                           hmpi_mpi_type((ccq_dtype)op->dtype), peer, tag(c, ch, MSG_DATA, other),
                           c->p2p, &h->req[RQ_DATA_RECV]);
            if (rc != MPI_SUCCESS) {
                ccq_errbuf e;
                hmpi_mpi_err(&e, rc, "MPI_Irecv");
                hmpi_fail(h, CCQ_ERR_BACKEND, e.msg);
                return;
            }
        }
        h->phase = PH_RUN;
        if (h->split) { /* second exchanges start in sequence order: queue it */
            h->split_next = NULL;
            *c->split_tail = h;
            c->split_tail = &h->split_next;
        }
        return;
    }
    if (!ours)
        snprintf(why, sizeof why,
                 "process %u sent a header of another communicator, or a malformed one",
                 c->procs[other]);
    snprintf(d, sizeof d,
             "checked across processes before any data moved (this process's buffers are "
             "untouched): %s%.360s",
             coll ? "" : "the send and the recv disagree: ", why);
    /* The peer sent its data if its own record says so: receive it, only to drop it, so the
     * pair's next messages pair up. */
    if (ours) {
        if (coll)
            roles(&h->theirs, other, &theirs_out, &dummy);
        else
            theirs_out = h->theirs.count * hmpi_esize((ccq_dtype)h->theirs.dtype);
    }
    hmpi_fail(h, CCQ_ERR_MISMATCH, d);
    if (theirs_out > 0 && theirs_out <= (size_t)INT32_MAX) {
        void *sink = hmpi_scratch(h, H_BUF_SINK, theirs_out);
        if (sink != NULL &&
            MPI_Irecv(sink, (int)theirs_out, MPI_BYTE, peer, tag(c, ch, MSG_DATA, other), c->p2p,
                      &h->req[RQ_DATA_RECV]) == MPI_SUCCESS)
            h->phase = PH_DISCARD;
    }
}

void hmpi_pair_progress(ccq_hmpi_comm *c)
{
    for (int q = 0; q < HMPI_NWQ; q++) {
        while (c->wq[q] != NULL) {
            ccq_hmpi_op *h = c->wq[q];
            int flag = 0;
            if (MPI_Test(&h->req[RQ_HDR_RECV], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
                hmpi_fail(h, CCQ_ERR_BACKEND, "MPI_Irecv of the peer's header failed");
                hmpi_wq_remove(c, h);
                continue;
            }
            if (!flag)
                break;
            hmpi_wq_remove(c, h);
            decide(h);
            hmpi_stepped();
        }
    }
}

void hmpi_pair_split_remove(ccq_hmpi_op *h)
{
    ccq_hmpi_comm *c = h->c;
    for (ccq_hmpi_op **pp = &c->split; *pp != NULL; pp = &(*pp)->split_next) {
        if (*pp != h)
            continue;
        *pp = h->split_next;
        if (c->split_tail == &h->split_next)
            c->split_tail = pp;
        break;
    }
}

bool hmpi_pair_split_due(ccq_hmpi_op *h, bool *wait)
{
    *wait = false;
    if (h->split != 1)
        return false;
    if (h->c->split != h) { /* an earlier one first: the peer sends them in that order */
        *wait = true;
        return false;
    }
    return true;
}

/* This side's half: rank order on both sides (the same bits), AVG divided once. */
void hmpi_pair_reduce_half(ccq_hmpi_op *h)
{
    const ccq_be_op *op = h->op;
    const ccq_be_part *pt = &op->parts[0];
    ccq_dtype dt = (ccq_dtype)op->dtype;
    size_t es = hmpi_esize(dt), off = half_off(op->count, h->c->me) * es;
    size_t n = half_len(op->count, h->c->me);
    const void *src[2];
    void *dst[1] = {(char *)pt->dst + off};
    src[h->c->me] = (const char *)pt->src + off;
    src[1 - h->c->me] = h->out;
    ccq_host_reduce_range(dt, op->redop == CCQ_AVG ? CCQ_SUM : (ccq_reduce_op)op->redop, 2, src, 1,
                          dst, 0, n, 0);
    if (op->redop == CCQ_AVG)
        hmpi_divide(dt, dst[0], n, 2);
}

/* Swap the reduced halves: ours out, the peer's into our output. */
ccq_status hmpi_pair_second(ccq_hmpi_op *h, ccq_errbuf *err)
{
    ccq_hmpi_comm *c = h->c;
    const ccq_be_op *op = h->op;
    char *d = op->parts[0].dst;
    ccq_dtype dt = (ccq_dtype)op->dtype;
    MPI_Datatype t = hmpi_mpi_type(dt);
    size_t es = hmpi_esize(dt);
    int me = c->me, other = 1 - me, peer = (int)c->procs[other], rc;

    hmpi_pair_split_remove(h);
    h->split = 2;
    rc = MPI_Isend(d + half_off(op->count, me) * es, (int)half_len(op->count, me), t, peer,
                   tag(c, CH_COLL2, MSG_DATA, me), c->p2p, &h->req[RQ_OP]);
    if (rc == MPI_SUCCESS)
        rc = MPI_Irecv(d + half_off(op->count, other) * es, (int)half_len(op->count, other), t,
                       peer, tag(c, CH_COLL2, MSG_DATA, other), c->p2p, &h->req[RQ_DATA_RECV]);
    if (rc != MPI_SUCCESS)
        return hmpi_mpi_err(err, rc, "MPI_Isend/MPI_Irecv of a reduced half");
    return CCQ_OK;
}

void hmpi_pair_finish(ccq_hmpi_op *h, const ccq_be_op *op)
{
    const ccq_hmpi_comm *c = h->c;
    const ccq_be_part *pt = &op->parts[0];
    ccq_dtype dt = (ccq_dtype)op->dtype;
    size_t cnt = op->count, blk = cnt * hmpi_esize(dt);
    int me = c->me;
    bool root = (int)op->root == me, avg = op->redop == CCQ_AVG;
    ccq_reduce_op ro = avg ? CCQ_SUM : (ccq_reduce_op)op->redop;
    const void *src[2];
    void *dst[1];

    if (h->split) /* both halves are in place */
        return;
    switch (op->kind) {
    case CCQ_KIND_ALL_REDUCE:
    case CCQ_KIND_REDUCE:
    case CCQ_KIND_REDUCE_SCATTER:
        if (op->kind == CCQ_KIND_REDUCE && !root)
            break;
        /* rank order on both sides, so both get the same bits */
        src[me] = op->kind == CCQ_KIND_REDUCE_SCATTER ? (const char *)pt->src + (size_t)me * blk
                                                      : pt->src;
        src[1 - me] = h->out;
        dst[0] = pt->dst;
        ccq_host_reduce_range(dt, ro, 2, src, 1, dst, 0, cnt, 0);
        if (avg)
            hmpi_divide(dt, pt->dst, cnt, 2);
        break;
    case CCQ_KIND_BROADCAST:
        if (root)
            hmpi_copy(pt->dst, pt->src, blk);
        break;
    case CCQ_KIND_ALL_GATHER:
        hmpi_copy((char *)pt->dst + (size_t)me * blk, pt->src, blk);
        break;
    case CCQ_KIND_ALL_TO_ALL:
        hmpi_copy((char *)pt->dst + (size_t)me * blk, (const char *)pt->src + (size_t)me * blk,
                  blk);
        break;
    case CCQ_KIND_GATHER:
        if (root)
            hmpi_copy((char *)pt->dst + (size_t)me * blk, pt->src, blk);
        break;
    case CCQ_KIND_SCATTER:
        if (root)
            hmpi_copy(pt->dst, (const char *)pt->src + (size_t)me * blk, blk);
        break;
    default: /* send/recv halves: the data is where it belongs */
        break;
    }
}
