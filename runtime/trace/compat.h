/* 0.1.0's ccq_event, for binaries built against 0.1.0 (internal; runtime/trace/compat.c).
 *
 * 0.2.0 put struct_size first in ccq_event (and moved `type` beside it), which moved every
 * field: a 0.1.0 binary calling ccq_trace_snapshot or reading callback events would misread
 * them. These are the old entry points, converting each event to the old layout, ready to be
 * exported as ccq_trace_snapshot@CCQ_0.1 and ccq_set_event_callback@CCQ_0.1 once the library
 * has a version script (CCQ_0.1 as its first node, so that 0.1.0's unversioned references
 * bind to them). Until then they are not exported. */
#ifndef CCQ_RUNTIME_TRACE_COMPAT_H
#define CCQ_RUNTIME_TRACE_COMPAT_H

#include <stddef.h>
#include <stdint.h>

#include "ccq.h"

typedef struct ccq_event_v0_1 {
    uint64_t time_ns, id, batch, seq, count, bytes;
    uint32_t type, thread, device, stream, comm;
    uint8_t kind, dtype, op, peer_valid;
    int32_t status;
    uint32_t peer;
} ccq_event_v0_1;

typedef void (*ccq_event_fn_v0_1)(const ccq_event_v0_1 *ev, void *user);

/* The fields of `ev` in 0.1.0's layout. */
void ccq_event_to_v0_1(ccq_event_v0_1 *out, const ccq_event *ev);

/* 0.1.0's ccq_trace_snapshot: `out` is an array of cap 0.1.0 events (80 bytes each). */
ccq_status ccq_trace_snapshot_v0_1(ccq_runtime *rt, ccq_event_v0_1 *out, size_t cap, size_t *n,
                                   uint64_t *dropped);

/* 0.1.0's ccq_set_event_callback: `fn` gets each event in 0.1.0's layout. */
ccq_status ccq_set_event_callback_v0_1(ccq_runtime *rt, ccq_event_fn_v0_1 fn, void *user);

#endif /* CCQ_RUNTIME_TRACE_COMPAT_H */
