/* reduce_scatter between processes: after the local combine each process holds the sum of
 * its ranks' inputs (nranks x count elements); process p must end with its block (its
 * ranks' ucx_nl(p) x count elements, at rank fr[p]) reduced over every process.
 *  - direct (small): every process sends block q to process q at once; each reduces the P
 *    versions of its block in process order (0, 1, ..., P - 1): the same order everywhere.
 *  - ring (large): P - 1 steps; at step s process i sends block i - s - 1 to i + 1 and adds
 *    block i - s - 2 from i - 1 to its own, so after P - 1 steps it holds block i reduced;
 *    pipelined in segments. The result lands at rank fr[me] of the buffer, where the local
 *    write takes it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/host/ucx/ucx.h"

/* ---- direct ---------------------------------------------------------------------------- */

/* BUF_TMP: P slots of this process's block, where every version lands (a rendezvous) or is
 * copied (an eager message, released at once); BUF_AUX: one flag per member. */

static void block_out(const ucx_op *o, uint32_t q, char **at, size_t *len)
{
    *at = (char *)o->buf[BUF_RES] + ucx_block_off(o, q) * o->es;
    *len = ucx_block_len(o, q) * o->es;
}

static void slot_in(const ucx_op *o, uint32_t p, char **at, size_t *len)
{
    *len = ucx_block_len(o, o->me) * o->es;
    *at = (char *)o->buf[BUF_TMP] + (size_t)p * *len;
}

static ccq_status direct_init(ucx_op *o, ccq_errbuf *err)
{
    size_t mine = ucx_block_len(o, o->me) * o->es;
    if (ucx_scratch(o, BUF_TMP, mine * o->P) == NULL || ucx_scratch(o, BUF_AUX, o->P) == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory for UCX scratch");
        return CCQ_ERR_NO_MEMORY;
    }
    memset(o->buf[BUF_AUX], 0, o->P);
    o->x[0] = 0;
    return CCQ_OK;
}

static ccq_status direct_advance(ucx_op *o, ccq_errbuf *err)
{
    const void *src[CCQ_MAX_DEVICES];
    const void **srcs;
    size_t mine = ucx_block_len(o, o->me);
    char *out = (char *)o->buf[BUF_RES] + ucx_block_off(o, o->me) * o->es;
    ccq_status st = ucx_exchange_all(o, block_out, slot_in, o->buf[BUF_AUX], err);

    if (st != CCQ_OK)
        return st;
    /* Every version here: reduce in process order into this process's block (its own sends
     * read the other blocks of res, never this one). */
    srcs = o->P <= CCQ_MAX_DEVICES ? src : malloc(o->P * sizeof *srcs);
    if (srcs == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    for (uint32_t p = 0; p < o->P; p++)
        srcs[p] = p == o->me ? out : (char *)o->buf[BUF_TMP] + (size_t)p * mine * o->es;
    ucx_reduce(o, o->P, srcs, out, mine);
    if (srcs != src)
        free(srcs);
    return CCQ_OK;
}

const ucx_alg ucx_reduce_scatter_direct = {"direct", direct_init, direct_advance};

/* ---- ring ------------------------------------------------------------------------------ */

/* x[0] = the largest block segment (elements): a landing slot's size. */

static ccq_status ring_init(ucx_op *o, ccq_errbuf *err)
{
    size_t biggest = 0;
    ccq_status st;
    for (uint32_t p = 0; p < o->P; p++)
        biggest = ucx_block_len(o, p) > biggest ? ucx_block_len(o, p) : biggest;
    st = ucx_segments(o, biggest, 0, ucx_window(), err);
    if (st != CCQ_OK)
        return st;
    o->x[0] = (uint32_t)((biggest + o->nseg - 1) / o->nseg);
    if (ucx_scratch(o, BUF_TMP, (size_t)o->window * o->x[0] * o->es) == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory for UCX scratch");
        return CCQ_ERR_NO_MEMORY;
    }
    return CCQ_OK;
}

static ccq_status ring_seg(ucx_op *o, uint32_t g, ccq_errbuf *err)
{
    uint32_t P = o->P, me = o->me;
    char *res = o->buf[BUF_RES];
    char *slot = (char *)o->buf[BUF_TMP] + (size_t)(g % o->window) * o->x[0] * o->es;
    size_t es = o->es;
    ucx_seg *s = &o->seg[g];
    ccq_status st;

    while (s->step < P - 1) {
        uint32_t k = s->step, sb = (me + 2 * P - k - 1) % P, rb = (me + 2 * P - k - 2) % P;
        size_t so, sl, ro, rl;
        void *into[1];
        ucx_block(ucx_block_len(o, sb), o->nseg, g, &so, &sl);
        ucx_block(ucx_block_len(o, rb), o->nseg, g, &ro, &rl);
        into[0] = res + (ucx_block_off(o, rb) + ro) * es;
        st = ucx_ring_step(o, g, g * P + k, res + (ucx_block_off(o, sb) + so) * es, sl * es, slot,
                           rl * es, 1, into, NULL, NULL, err);
        if (st != CCQ_OK)
            return st;
    }
    return CCQ_OK;
}

static ccq_status ring_advance(ucx_op *o, ccq_errbuf *err)
{
    return ucx_run_segments(o, ring_seg, err);
}

const ucx_alg ucx_reduce_scatter_ring = {"ring", ring_init, ring_advance};
