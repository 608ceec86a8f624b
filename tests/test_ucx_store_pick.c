/* ucx/store_pick.c: the mapped all_reduce's choice between plain and streaming stores for its
 * copy into its slots, driven here with made-up costs (the end-to-end case is
 * test_host_world_ucx_mapped*: every result checked, whichever way each copy went). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "backends/host/ucx/ucx.h"

#define MIB (1u << 20)

/* One copy of `bytes` at the given CPU cost per MiB of each way; returns its way. */
static bool copy(ucx_store_pick *k, size_t bytes, uint64_t plain_ns, uint64_t streamed_ns)
{
    bool timed, nt = ucx_store_pick_next(k, bytes, &timed);
    if (timed)
        ucx_store_pick_note(k, nt, (nt ? streamed_ns : plain_ns) * bytes / MIB, bytes);
    return nt;
}

/* CCQ_UCX_MAPPED_STREAM=0 or 1: that way always, nothing timed. */
static void test_fixed(void **state)
{
    (void)state;
    for (int way = 0; way <= 1; way++) {
        ucx_store_pick k = {.fixed = way};
        for (int i = 0; i < 200; i++) {
            bool timed;
            assert_int_equal(ucx_store_pick_next(&k, MIB, &timed), way);
            assert_false(timed);
        }
        assert_int_equal(k.cost[0], 0);
        assert_int_equal(k.cost[1], 0);
    }
}

/* Plain measured first, then streaming; equal costs keep plain (the members read a slot from
 * the shared cache), and so does streaming dearer by less than a quarter. */
static void test_measures_both_then_plain(void **state)
{
    ucx_store_pick k = {.fixed = -1};
    (void)state;
    assert_false(copy(&k, MIB, 100000, 100000));
    assert_true(copy(&k, MIB, 100000, 100000));
    assert_int_not_equal(k.cost[0], 0);
    assert_int_not_equal(k.cost[1], 0);
    for (int i = 0; i < 300; i++)
        copy(&k, MIB, 120000, 100000);
    assert_false(ucx_store_pick_streamed(&k));
}

/* Plain stores three times as dear (the slow phase): streaming, with one timed copy in 64 the
 * other way; then plain cheap again: back to plain, within 8 of those. */
static void test_follows_the_phase(void **state)
{
    ucx_store_pick k = {.fixed = -1};
    int streamed = 0, n = 640;
    (void)state;
    copy(&k, MIB, 300000, 100000);
    copy(&k, MIB, 300000, 100000);
    assert_true(ucx_store_pick_streamed(&k));
    for (int i = 0; i < n; i++)
        streamed += copy(&k, MIB, 300000, 100000);
    assert_int_equal(streamed, n - n / 64);
    for (int i = 0; i < 8 * 64 && ucx_store_pick_streamed(&k); i++)
        copy(&k, MIB, 100000, 100000);
    assert_false(ucx_store_pick_streamed(&k));
    /* ...and streaming again when the phase comes back. */
    for (int i = 0; i < 8 * 64 && !ucx_store_pick_streamed(&k); i++)
        copy(&k, MIB, 300000, 100000);
    assert_true(ucx_store_pick_streamed(&k));
}

/* Copies below UCX_PICK_MIN_BYTES go the way chosen, untimed and uncounted. */
static void test_small_copies_untimed(void **state)
{
    ucx_store_pick k = {.fixed = -1};
    bool timed;
    (void)state;
    assert_false(ucx_store_pick_next(&k, UCX_PICK_MIN_BYTES - 1, &timed));
    assert_false(timed);
    copy(&k, MIB, 300000, 100000);
    copy(&k, MIB, 300000, 100000);
    for (int i = 0; i < 200; i++) {
        assert_true(ucx_store_pick_next(&k, 4096, &timed));
        assert_false(timed);
    }
    assert_int_equal(k.timed, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixed),
        cmocka_unit_test(test_measures_both_then_plain),
        cmocka_unit_test(test_follows_the_phase),
        cmocka_unit_test(test_small_copies_untimed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
