/* Smoke test: one all_reduce over 4 devices and a send/recv, through the public API; every
 * thread ccq starts carries a "ccq-" name (common/thread_name.h) and is gone after destroy. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "ccq.h"

static void test_allreduce_sum(void **state)
{
    (void)state;
    ccq_config cfg;
    ccq_runtime *rt;
    ccq_config_init(&cfg);
    cfg.host_devices = 4;
    assert_int_equal(ccq_runtime_create(&cfg, &rt), CCQ_OK);
    ccq_device_id devs[4] = {0, 1, 2, 3};
    assert_int_equal(ccq_comm_init(rt, devs, 4), CCQ_OK);
    float in[4][100], out[4][100];
    for (int d = 0; d < 4; d++)
        for (int i = 0; i < 100; i++)
            in[d][i] = (float)(d * 1000 + i);
    for (int d = 0; d < 4; d++)
        assert_int_equal(
            ccq_all_reduce(rt, d, 0, in[d], out[d], 100, CCQ_FLOAT32, CCQ_SUM, devs, 4), CCQ_OK);
    for (int d = 0; d < 4; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_OK);
    for (int d = 0; d < 4; d++)
        for (int i = 0; i < 100; i++)
            assert_true(out[d][i] == (float)(6000 + 4 * i));
    float a[10], b[10];
    for (int i = 0; i < 10; i++)
        a[i] = (float)i;
    assert_int_equal(ccq_send(rt, 0, 1, a, 10, CCQ_FLOAT32, 2), CCQ_OK);
    assert_int_equal(ccq_recv(rt, 2, 1, b, 10, CCQ_FLOAT32, 0), CCQ_OK);
    assert_int_equal(ccq_sync_collective(rt, 2, 1), CCQ_OK);
    assert_memory_equal(a, b, sizeof a);
    ccq_stats st = {.struct_size = sizeof st};
    assert_int_equal(ccq_get_stats(rt, &st), CCQ_OK);
    assert_int_equal(st.submitted, 6);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

/* The library says the version of the header it was built with, in both encodings. */
static void test_version(void **state)
{
    (void)state;
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", CCQ_VERSION_MAJOR, CCQ_VERSION_MINOR,
             CCQ_VERSION_PATCH);
    assert_string_equal(ccq_version(), want);
    assert_string_equal(ccq_version(), CCQ_VERSION_STRING);
    assert_int_equal(ccq_version_number(), CCQ_VERSION_HEX);
    assert_int_equal(ccq_version_number() >> 16, CCQ_VERSION_MAJOR);
    assert_int_equal((ccq_version_number() >> 8) & 0xff, CCQ_VERSION_MINOR);
    assert_int_equal(ccq_version_number() & 0xff, CCQ_VERSION_PATCH);
    /* The minor version grew with ccq_version itself (and struct_size on ccq_event). */
    assert_true(ccq_version_number() >= 0x000200u);
}

/* This process's threads: how many, how many named "ccq-..." and how many "ccq-sched". */
static void count_threads(int *all, int *ccq, int *sched)
{
    DIR *d = opendir("/proc/self/task");
    struct dirent *t;
    *all = *ccq = *sched = 0;
    assert_non_null(d);
    while ((t = readdir(d)) != NULL) {
        char path[300], name[32] = "";
        FILE *f;
        if (t->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", t->d_name);
        if ((f = fopen(path, "r")) == NULL)
            continue; /* it ended meanwhile */
        if (fgets(name, sizeof name, f) == NULL)
            name[0] = '\0';
        fclose(f);
        name[strcspn(name, "\n")] = '\0';
        (*all)++;
        *ccq += strncmp(name, "ccq-", 4) == 0;
        *sched += strcmp(name, "ccq-sched") == 0;
    }
    closedir(d);
}

static void test_thread_names(void **state)
{
    (void)state;
    ccq_config cfg;
    ccq_runtime *rt;
    int before, ccq0, sched0, all, ccq, sched;
    ccq_config_init(&cfg);
    cfg.host_devices = 4;
    count_threads(&before, &ccq0, &sched0);
    assert_int_equal(ccq0, 0);
    assert_int_equal(ccq_runtime_create(&cfg, &rt), CCQ_OK);
    count_threads(&all, &ccq, &sched);
    /* Each thread names itself first thing; one may not have run yet. */
    for (int k = 0; k < 1000 && ccq < all - before; k++) {
        struct timespec ms = {0, 1000000L};
        nanosleep(&ms, NULL);
        count_threads(&all, &ccq, &sched);
    }
    printf("threads: %d before, %d with a runtime, %d of them named ccq-*\n", before, all, ccq);
    assert_true(all > before);
    assert_int_equal(ccq, all - before);
    assert_int_equal(sched, 1);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
    count_threads(&all, &ccq, &sched);
    for (int k = 0; k < 1000 && ccq > 0; k++) { /* a joined thread's task may linger a moment */
        struct timespec ms = {0, 1000000L};
        nanosleep(&ms, NULL);
        count_threads(&all, &ccq, &sched);
    }
    assert_int_equal(ccq, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_allreduce_sum),
                                       cmocka_unit_test(test_version),
                                       cmocka_unit_test(test_thread_names)};
    return cmocka_run_group_tests_name("smoke", tests, NULL, NULL);
}
