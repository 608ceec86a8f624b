/* The one clock of ccq: CLOCK_MONOTONIC in nanoseconds, for deadlines and every event. */
#ifndef CCQ_COMMON_CLOCK_H
#define CCQ_COMMON_CLOCK_H

#include <stdint.h>

uint64_t ccq_now_ns(void);

#endif /* CCQ_COMMON_CLOCK_H */
