/* How many cores this process may run on: its CPU affinity (taskset, cgroup cpusets, a
 * launcher's binding), else the online count, at least 1. Sizes the host backend's worker pool
 * and tells the UCX engine whether a job's processes outnumber the cores. */
#ifndef CCQ_COMMON_CORES_H
#define CCQ_COMMON_CORES_H

#include <stdint.h>

uint32_t ccq_usable_cores(void);

#endif /* CCQ_COMMON_CORES_H */
