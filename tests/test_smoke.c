/* Smoke test: one all_reduce over 4 devices and a send/recv, through the public API. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_allreduce_sum),
                                       cmocka_unit_test(test_version)};
    return cmocka_run_group_tests_name("smoke", tests, NULL, NULL);
}
