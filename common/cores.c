/* (cores.h) */
#define _GNU_SOURCE
#include "common/cores.h"

#include <sched.h>
#include <unistd.h>

uint32_t ccq_usable_cores(void)
{
    cpu_set_t set;
    long n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    if (n <= 0)
        n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (uint32_t)n : 1u;
}
