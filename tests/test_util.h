/* Small helpers shared by the CMocka test programs. Include after <cmocka.h>. */
#ifndef CCQ_TEST_UTIL_H
#define CCQ_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ccq.h"

/* Iteration counts; CCQ_TEST_ITERS overrides (stress runs, slow sanitizer builds). */
static inline unsigned env_iters(unsigned dflt)
{
    const char *v = getenv("CCQ_TEST_ITERS");
    if (v != NULL && *v != '\0') {
        unsigned long x = strtoul(v, NULL, 10);
        if (x > 0)
            return (unsigned)x;
    }
    return dflt;
}

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void sleep_ms(unsigned ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* malloc that never returns NULL (0 bytes gives a valid pointer) or fails the test. */
static inline void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

/* The runtime's counters; fails the test if they cannot be read. */
static inline ccq_stats stats_of(ccq_runtime *rt)
{
    ccq_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    assert_int_equal(ccq_get_stats(rt, &st), CCQ_OK);
    return st;
}

/*
 * Fence expecting a watchdog error. The fence's own deadline is timeout_ms plus a grace
 * after the fence call, so on a badly stalled machine it may return a bare CCQ_ERR_TIMEOUT
 * before the scheduler recorded why; the recorded error then comes with a later fence.
 * @p detail (may be NULL) receives the last detail.
 */
static inline ccq_status fence_watchdog(ccq_runtime *rt, ccq_device_id d, ccq_stream_id s,
                                        char *detail, size_t len)
{
    ccq_status st = CCQ_OK;
    for (int tries = 0; tries < 3; tries++) {
        st = ccq_sync_collective(rt, d, s);
        if (detail != NULL)
            snprintf(detail, len, "%s", ccq_last_error_detail());
        if (st != CCQ_ERR_TIMEOUT || strstr(ccq_last_error_detail(), "still pending") == NULL)
            break;
    }
    return st;
}

/* Teardown check: every command ended (none pending or cancelled) and exactly
 * @p expect_failed of them failed. 0 if so; -1 after printing the counters. */
static inline int all_ended(ccq_runtime *rt, uint64_t expect_failed)
{
    ccq_stats st = {.struct_size = sizeof st};
    if (ccq_get_stats(rt, &st) == CCQ_OK && st.pending == 0 && st.cancelled == 0 &&
        st.failed == expect_failed && st.submitted == st.completed + st.failed)
        return 0;
    fprintf(stderr,
            "stats: submitted %llu completed %llu failed %llu (expected %llu) cancelled %llu "
            "pending %llu\n",
            (unsigned long long)st.submitted, (unsigned long long)st.completed,
            (unsigned long long)st.failed, (unsigned long long)expect_failed,
            (unsigned long long)st.cancelled, (unsigned long long)st.pending);
    return -1;
}

#endif /* CCQ_TEST_UTIL_H */
