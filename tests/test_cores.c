/* ccq_usable_cores (common/cores.h): what the host backend sizes its worker pool by and the
 * UCX engine compares a world's process count with. It must follow the CPU affinity (a
 * launcher's binding, taskset), not the machine's core count. */
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/cores.h"

static void test_follows_affinity(void **state)
{
    (void)state;
    cpu_set_t all, one;
    int first = -1;

    assert_int_equal(sched_getaffinity(0, sizeof all, &all), 0);
    assert_int_equal(ccq_usable_cores(), (uint32_t)CPU_COUNT(&all));
    for (int c = 0; c < CPU_SETSIZE && first < 0; c++)
        if (CPU_ISSET(c, &all))
            first = c;
    assert_true(first >= 0);
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
    assert_int_equal(ccq_usable_cores(), 1);
    assert_int_equal(sched_setaffinity(0, sizeof all, &all), 0);
    assert_int_equal(ccq_usable_cores(), (uint32_t)CPU_COUNT(&all));
    /* Never more than the machine has online. */
    assert_true(ccq_usable_cores() <= (uint32_t)sysconf(_SC_NPROCESSORS_ONLN));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_follows_affinity),
    };
    return cmocka_run_group_tests_name("cores", tests, NULL, NULL);
}
