/* CHECK for the tests run as the processes of a world (tests/launch, mpiexec): a failed
 * condition prints the process's world rank (the including file's `wrank`, declared before
 * its first CHECK), the place, the message and the calling thread's last ccq error detail, and
 * ends the process with status 1, which the launcher reports. */
#ifndef CCQ_TESTS_WORLD_CHECK_H
#define CCQ_TESTS_WORLD_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "ccq.h"

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "process %u: FAILED %s:%d: ", (unsigned)wrank, __FILE__, __LINE__);    \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, " (%s)\n", ccq_last_error_detail());                                   \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#endif /* CCQ_TESTS_WORLD_CHECK_H */
