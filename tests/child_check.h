/* A check in a forked child of a multi-process test: print what failed (the child's pid, file
 * and line, then the message) and make the child exit with 1, which its parent reports. */
#ifndef CCQ_TESTS_CHILD_CHECK_H
#define CCQ_TESTS_CHILD_CHECK_H

#include <stdio.h>
#include <unistd.h>

#define CHILD_CHECK(cond, ...)                                                                     \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "child %d: %s:%d: ", (int)getpid(), __FILE__, __LINE__);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

#endif
