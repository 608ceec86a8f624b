/* Byte ranges of user buffers, for the scheduler's hazard checks. */
#ifndef CCQ_RUNTIME_SPAN_H
#define CCQ_RUNTIME_SPAN_H

#include <stdbool.h>
#include <stdint.h>

/* A byte range [lo, hi); empty ranges are {UINTPTR_MAX, 0} so they never intersect. */
typedef struct ccq_span {
    uintptr_t lo, hi;
} ccq_span;

#define CCQ_SPAN_EMPTY ((ccq_span){UINTPTR_MAX, 0})

static inline bool ccq_span_hit(ccq_span a, ccq_span b)
{
    return a.lo < b.hi && b.lo < a.hi;
}

static inline void ccq_span_add(ccq_span *box, ccq_span s)
{
    if (s.lo < box->lo)
        box->lo = s.lo;
    if (s.hi > box->hi)
        box->hi = s.hi;
}

#endif /* CCQ_RUNTIME_SPAN_H */
