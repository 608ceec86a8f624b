/* The one clock of ccq: CLOCK_MONOTONIC in nanoseconds, for deadlines and every event. */
#ifndef CCQ_COMMON_CLOCK_H
#define CCQ_COMMON_CLOCK_H

#include <stdint.h>

uint64_t ccq_now_ns(void);

/* The calling thread's CPU time (user and system) in nanoseconds: the cost of a piece of
 * work, which a preemption in its middle does not inflate (a system call, not the vDSO). */
uint64_t ccq_thread_cpu_ns(void);

/* a + b, or UINT64_MAX where that wraps: every deadline is computed with it, since
 * timeout_ms may be as large as UINT64_MAX / 10^6 (and UINT64_MAX means "none"). */
static inline uint64_t ccq_add_sat(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* The deadline timeout_ns from now (UINT64_MAX, "none", when that does not fit). */
static inline uint64_t ccq_deadline_in(uint64_t timeout_ns)
{
    return ccq_add_sat(ccq_now_ns(), timeout_ns);
}

#endif /* CCQ_COMMON_CLOCK_H */
