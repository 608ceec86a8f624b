/* 0.1.0's event-log entry points (see compat.h): the same events, in the old layout. */
#include "runtime/trace/compat.h"

#include <stdlib.h>

#include "runtime/internal.h"
#include "runtime/trace/trace.h"

_Static_assert(sizeof(ccq_event_v0_1) == 80 && offsetof(ccq_event_v0_1, type) == 48 &&
                   offsetof(ccq_event_v0_1, peer) == 76,
               "ccq_event_v0_1 must be 0.1.0's ccq_event");

void ccq_event_to_v0_1(ccq_event_v0_1 *out, const ccq_event *ev)
{
    out->time_ns = ev->time_ns;
    out->id = ev->id;
    out->batch = ev->batch;
    out->seq = ev->seq;
    out->count = ev->count;
    out->bytes = ev->bytes;
    out->type = ev->type;
    out->thread = ev->thread;
    out->device = ev->device;
    out->stream = ev->stream;
    out->comm = ev->comm;
    out->kind = ev->kind;
    out->dtype = ev->dtype;
    out->op = ev->op;
    out->peer_valid = ev->peer_valid;
    out->status = ev->status;
    out->peer = ev->peer;
}

/* libccq.so binds 0.1.0 binaries' ccq_trace_snapshot and ccq_set_event_callback to these
 * (CCQ_0.1 in runtime/ccq.map; today's are CCQ_0.2). A static link never sees these
 * versioned names and resolves against today's. */
__asm__(".symver ccq_trace_snapshot_v0_1, ccq_trace_snapshot@CCQ_0.1");
__asm__(".symver ccq_set_event_callback_v0_1, ccq_set_event_callback@CCQ_0.1");
#define CCQ_COMPAT_API CCQ_API

CCQ_COMPAT_API ccq_status ccq_trace_snapshot_v0_1(ccq_runtime *rt, ccq_event_v0_1 *out, size_t cap,
                                                  size_t *n, uint64_t *dropped)
{
    ccq_event *tmp = NULL;
    ccq_status st;

    ccq_clear_detail();
    if (rt == NULL || n == NULL || (out == NULL && cap > 0))
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_trace_snapshot: %s is NULL",
                        rt == NULL  ? "rt"
                        : n == NULL ? "n"
                                    : "out");
    if (cap > 0) {
        tmp = malloc(cap * sizeof *tmp);
        if (tmp == NULL)
            return ccq_fail(CCQ_ERR_NO_MEMORY, "ccq_trace_snapshot: out of memory (%zu events)",
                            cap);
        tmp[0].struct_size = sizeof *tmp;
    }
    st = ccq_trace_snapshot(rt, tmp, cap, n, dropped);
    if (st == CCQ_OK)
        for (size_t k = 0; k < *n; k++)
            ccq_event_to_v0_1(&out[k], &tmp[k]);
    free(tmp);
    return st;
}

CCQ_COMPAT_API ccq_status ccq_set_event_callback_v0_1(ccq_runtime *rt, ccq_event_fn_v0_1 fn,
                                                      void *user)
{
    ccq_clear_detail();
    if (rt == NULL)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_set_event_callback: rt is NULL");
    return ccq_trace_set_callback(&rt->trace, NULL, fn, user);
}
