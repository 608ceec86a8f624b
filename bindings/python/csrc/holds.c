/* The buffers of commands in flight, kept alive per stream until a fence covering their
 * command answers (ccq borrows them until then: a Python caller may drop its last reference
 * to an array while ccq still writes it).
 *
 * Why this is exact without a lock of its own: a hold is appended only after its submitting
 * call returned, and a fence reads `appended` before it calls ccq_fence_begin (or
 * ccq_sync_collective), so every hold it releases belongs to a command whose submission
 * returned before the fence was taken: a command the fence covers. A command submitted
 * concurrently with the fence may be covered without its hold being released then; a later
 * fence releases it. All of this runs with the GIL held, which orders it between threads. */
#include "ccqpy.h"

#include <string.h>

static int grow(ccqpy_holds *h)
{
    size_t cap = h->cap ? h->cap * 2 : 16;
    ccqpy_hold *ring = PyMem_Malloc(cap * sizeof *ring);
    if (ring == NULL)
        return -1;
    /* Unwrap the old ring in order (its records are plain memory: a Py_buffer moves). */
    for (size_t i = 0; i < h->len; i++)
        memcpy(&ring[i], &h->ring[(h->head + i) % h->cap], sizeof *ring);
    PyMem_Free(h->ring);
    h->ring = ring;
    h->cap = cap;
    h->head = 0;
    return 0;
}

int ccqpy_holds_reserve(ccqpy_holds *h)
{
    return h->len < h->cap ? 0 : grow(h);
}

int ccqpy_holds_push(ccqpy_holds *h, ccqpy_buf *bufs, int n)
{
    if (ccqpy_holds_reserve(h) != 0)
        return -1;
    ccqpy_hold *r = &h->ring[(h->head + h->len) % h->cap];
    r->seq = ++h->appended;
    r->n = 0;
    for (int i = 0; i < n; i++) {
        if (bufs[i].kind == CCQPY_BUF_NONE)
            continue;
        memcpy(&r->buf[r->n++], &bufs[i], sizeof bufs[i]);
        bufs[i].kind = CCQPY_BUF_NONE; /* ownership moved into the hold */
    }
    h->len++;
    return 0;
}

void ccqpy_holds_release(ccqpy_holds *h, uint64_t upto)
{
    /* Releasing may run arbitrary code (a DLPack deleter, an exporter's releasebuffer, the
     * last reference's destructor): take each record out of the ring before releasing it,
     * so code that submits or fences on this stream meanwhile sees a consistent ring. */
    while (h->len > 0 && h->ring[h->head].seq <= upto) {
        ccqpy_hold r;
        memcpy(&r, &h->ring[h->head], sizeof r);
        h->head = (h->head + 1) % h->cap;
        h->len--;
        for (int i = 0; i < r.n; i++)
            ccqpy_buf_release(&r.buf[i]);
    }
}

void ccqpy_holds_clear(ccqpy_holds *h)
{
    ccqpy_holds_release(h, UINT64_MAX);
    PyMem_Free(h->ring);
    h->ring = NULL;
    h->cap = h->len = h->head = 0;
}
