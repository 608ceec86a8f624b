/* all_reduce for large buffers: a ring reduce-scatter, then a ring all-gather, pipelined in
 * segments (each segment is a ring all_reduce of its own; ucx_window() of them move at once,
 * so one segment's reduction overlaps another's transfer). Per segment: P blocks; at step s
 * of the reduce-scatter process i sends block i - s to i + 1 and adds block i - s - 1 from
 * i - 1 to its own; after P - 1 steps it holds block i + 1 fully reduced, which the
 * all-gather's P - 1 steps pass around.
 *
 * Each block is reduced once, by a chain that starts at a fixed process, and then copied:
 * every process ends with the same bits. A segment keeps one send in flight at a time
 * (each step's send needs the previous step's receipt anyway), which also means a block is
 * never landed into while a send still reads it.
 *
 * With one part in this process (o->own), its input is not copied into the scratch first:
 * each reduce-scatter step adds the incoming partial to the part's src directly, and only the
 * block a segment sends as it is (step 0) is copied, P times less than the whole buffer. The
 * reductions read the same values in the same order: the same bits. A fused group whose
 * operations each have one part here does the same over their inputs laid end to end (own_at:
 * ucx_fused_own_block copies and reduces piece by piece); its outputs are written at the end
 * (engine.c, fused_outputs), its result scratch whole. Nor is the result copied
 * out at the end (o->out): the last reduce-scatter step writes the block it fully reduces to
 * the part's dst in the same pass as to the scratch (a second output of the kernel; AVG is
 * divided into dst apart, since the scratch keeps the sum the all-gather sends), and each
 * block the all-gather lands is copied there at once (AVG: divided on the way, as
 * local_outputs would). From STREAM_BYTES (ucx/select.c) every output block is instead
 * streamed apart from the scratch's block the pass just wrote (in cache): streaming stores
 * skip reading the user's lines before overwriting them. The one-pass write-out together with
 * the scratch's huge pages (scratch_pool.c), 2 x 1, 15 interleaved runs: 1 MiB 1.11x, 4 MiB
 * 1.28x, 8 MiB 1.19x (medians; fastest runs 1.13-1.58x). Both writes happen in this thread once
 * the block's chain of headers was checked by every member (a message reaches the last step only
 * through all of them), so a mismatch still leaves dst untouched, and nothing writes dst after the
 * operation ended (UCX itself only ever writes the scratch). In place (src == dst) holds: a block
 * of dst is written only after this process's own input for it was read.
 *
 * Then the result scratch (buf[BUF_RES]) need hold only the segments in flight and the ones
 * whose last sends may still be read: segment g uses slot g % (4 x window) of it (x[1] = 1), so
 * a 64 MiB operation keeps 16 MiB of engine scratch, not 64 (1 GiB: 16 MiB, not 1 GiB). A slot
 * is reused only once every send the segment before in it made has left (the peer may still be
 * reading the last one). Measured at 64 MiB, 2 x 1, four interleaved A/B runs: 0.98x with
 * 4 x window slots, 0.955x with 2 x window (the wait for the slot's sends stalls the pipeline
 * more often), within this machine's run-to-run spread either way. A fused group's result
 * scratch holds its packed inputs (ucx/fused.c): it stays whole (x[1] = 0). */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "backends/host/ucx/ucx.h"

/* x[0] = largest block of a segment (elements): the landing slot's size; x[1]: 1 when the
 * result scratch holds 4 x window segments, used in turn, 0 when it holds the whole buffer;
 * x[2]: 1 when a reduce-scatter step's incoming partial lands in the block of the result
 * scratch it is reduced into, 0 when in a landing slot (buf[BUF_TMP]). */

/* With one part (own), from this size a reduce-scatter step lands its incoming partial in the
 * block of the result scratch the step then reduces into, in place: nothing else is there yet
 * (the part's input is read from its src) and no send reads it (a block is sent only once
 * reduced, or at step 0 from this process's own block, never one it lands), and the operation
 * keeps no landing slots, a window of blocks less in the cache. Same operands, same order:
 * the same bits. With several parts the result scratch holds their combine there: a slot.
 * Measured 2 x 1 on the 2-vCPU AMD VM (bench/ab-libs.sh, 9-11 interleaved runs, medians, the
 * fastest run in parentheses): 1 MiB 1.07x (1.03x), 2 MiB 1.16x (1.03x), 4 MiB 1.48x (1.08x),
 * 8 MiB 1.23x (1.28x) faster in place; 4 x 1 2 MiB 1.52x (1.05x), 8 MiB 1.11x (1.20x); but
 * 256 KiB 0.95x (0.95x) and 512 KiB 0.93x (0.95x), where the slots stay in cache anyway. */
#define LAND_IN_PLACE_BYTES (1u << 20)

static ccq_status ring_init(ucx_op *o, ccq_errbuf *err)
{
    ccq_status st = ucx_segments(o, o->count, 0, ucx_window(), err);
    size_t res_elems = o->count;
    if (st != CCQ_OK)
        return st;
    o->x[0] = (uint32_t)((o->seg_elems + o->P - 1) / o->P);
    o->x[1] = (o->own != NULL || o->parts_lazy) && o->nseg > 4 * o->window;
    if (o->x[1])
        res_elems = (size_t)4 * o->window * o->seg_elems;
    o->x[2] = (o->own != NULL || o->own_at != NULL) && o->count * o->es >= LAND_IN_PLACE_BYTES;
    if (ucx_scratch(o, BUF_RES, res_elems * o->es) == NULL ||
        (!o->x[2] && ucx_scratch(o, BUF_TMP, (size_t)o->window * o->x[0] * o->es) == NULL)) {
        snprintf(err->msg, sizeof err->msg, "out of memory for UCX scratch");
        return CCQ_ERR_NO_MEMORY;
    }
    return CCQ_OK;
}

/* Where a finished block goes (element `at` of the operation, `rel` of the segment): the
 * one part's dst (out: the segment's), or with parts_lazy every part's; their number. */
static uint32_t outputs(const ucx_op *o, char *out, size_t at, size_t rel, void **dst)
{
    const ccq_be_op *op = o->op;
    if (out != NULL) {
        dst[0] = out + rel * o->es;
        return 1;
    }
    if (!o->parts_lazy)
        return 0;
    for (uint32_t k = 0; k < op->nparts; k++)
        dst[k] = (char *)op->parts[k].dst + at * o->es;
    return op->nparts;
}

static ccq_status ring_seg(ucx_op *o, uint32_t g, ccq_errbuf *err)
{
    uint32_t P = o->P, me = o->me;
    size_t off0 = (size_t)g * o->seg_elems, es = o->es;
    size_t len = o->count - off0 < o->seg_elems ? o->count - off0 : o->seg_elems;
    char *res = (char *)o->buf[BUF_RES] +
                (o->x[1] ? (size_t)(g % (4 * o->window)) * o->seg_elems : off0) * es;
    const char *own = o->own != NULL ? o->own + off0 * es : res; /* this process's input */
    char *out = o->out != NULL ? o->out + off0 * es : NULL;      /* its output, or none */
    /* Where a reduce-scatter step's incoming partial lands (x[2], LAND_IN_PLACE_BYTES): in
     * the block of the result scratch the step reduces into, or in a slot of its own. */
    char *slot = o->x[2] ? NULL : (char *)o->buf[BUF_TMP] + (size_t)(g % o->window) * o->x[0] * es;
    ucx_seg *s = &o->seg[g];
    ccq_status st = CCQ_OK;

    /* A shared result slot: the segment before in it is done (the window moved past it), but
     * its last send may still be read by the peer. */
    if (o->x[1] && g >= 4 * o->window && s->step == 0 && !s->sent) {
        bool left = ucx_sends_done(o, g - 4 * o->window, &st, err);
        if (st != CCQ_OK)
            return st;
        if (!left)
            return CCQ_IN_PROGRESS;
    }

    while (s->step < 2 * P - 2) {
        uint32_t k = s->step, sb, rb, nout = 0;
        void *into[1 + CCQ_MAX_DEVICES]; /* the scratch's block, then the outputs' */
        ucx_msg *m, **taken = NULL;
        size_t so, sl, ro, rl;
        bool scatter = k < P - 1; /* the reduce-scatter half, then the all-gather half */
        if (scatter) {
            sb = (me + 2 * P - k) % P;
            rb = (me + 2 * P - k - 1) % P;
        } else {
            uint32_t t = k - (P - 1);
            sb = (me + 1 + 2 * P - t) % P;
            rb = (me + 2 * P - t) % P;
        }
        ucx_block(len, P, sb, &so, &sl);
        ucx_block(len, P, rb, &ro, &rl);
        if (k == 0 && !s->sent) {
            if (own != res)
                memcpy(res + so * es, own + so * es, sl * es);
            else if (o->own_at != NULL && (st = ucx_fused_own_block(o, off0 + so, sl, NULL,
                                                                    res + so * es, err)) != CCQ_OK)
                return st;
        }
        if (o->parts_lazy && scatter && s->combined <= k) {
            /* This step's blocks: the one step 0 sends as it is, the one each step adds to.
             * Every block is combined once, before any dst is written (in place holds). */
            if (k == 0)
                ucx_part_combine(o, o->op, (off0 + so) * es, res + so * es, sl, 0);
            ucx_part_combine(o, o->op, (off0 + ro) * es, res + ro * es, rl, 0);
            s->combined = k + 1;
        }
        /* The reduce-scatter's last step reduces its block into the outputs too, in the same
         * pass (AVG divides its outputs apart: res keeps the sum the all-gather sends; streamed
         * outputs are copied apart too, from the block the pass left in cache). */
        into[0] = res + ro * es;
        if (k == P - 2 && o->redop != CCQ_AVG && !o->out_nt)
            nout = outputs(o, out, off0 + ro, ro, into + 1);
        /* The all-gather's last block is sent on by no one: it goes to the outputs straight
         * from the message (an eager payload is not copied into res first). */
        if (k == 2 * P - 3 && (nout = outputs(o, out, off0 + ro, ro, into + 1)) > 0)
            taken = &m;
        /* A fused group read in place reduces with its parts' inputs itself (below). */
        if (scatter && o->own_at != NULL)
            taken = &m;
        st = ucx_ring_step(o, g, g * (2 * P) + k, res + so * es, sl * es,
                           scatter && slot != NULL ? slot : res + ro * es, rl * es,
                           scatter && taken == NULL ? 1 + nout : 0, into,
                           scatter ? own + ro * es : NULL, taken, err);
        if (st != CCQ_OK)
            return st;
        if (taken != NULL) {
            if (scatter) /* the incoming partial first, then this process's, as above */
                st = ucx_fused_own_block(o, off0 + ro, rl, m->buf, res + ro * es, err);
            else
                ucx_write_result(o, into + 1, nout, m->buf, rl);
            ucx_msg_done(o->e, m);
            if (st != CCQ_OK)
                return st;
            continue;
        }
        /* Fully reduced here (the reduce-scatter's last step) or landed (the all-gather). */
        if (k >= P - 2 && nout == 0 && (nout = outputs(o, out, off0 + ro, ro, into + 1)) > 0)
            ucx_write_result(o, into + 1, nout, res + ro * es, rl);
    }
    return CCQ_OK;
}

static ccq_status ring_advance(ucx_op *o, ccq_errbuf *err)
{
    return ucx_run_segments(o, ring_seg, err);
}

const ucx_alg ucx_allreduce_ring = {"ring", ring_init, ring_advance};
