/* ucx/prior.c: what each member made of the collectives before the one a message is of.
 * A process keeps, per communicator, how far every collective ended (prior_upto, moved on by
 * ends out of order too) and a sum over those it failed alone over a disagreement; a member's
 * message that says otherwise fails the operation it is of (CCQ_ERR_MISMATCH); one that says
 * more than this process has ended yet is taken as it is. The end-to-end case
 * is test_host_drills' raced drill (4 processes); these are the bookkeeping's corners. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backends/host/ucx/ucx.h"

typedef struct fixture {
    ucx_comm c;
    uint32_t procs[3];
    ucx_op o;
} fixture;

/* A communicator of 3 processes (this one is 0: world rank 10) and its collective of
 * sequence seq, in flight. */
static fixture *fixture_new(uint64_t seq)
{
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->procs[0] = 10;
    f->procs[1] = 11;
    f->procs[2] = 12;
    f->c.procs = f->procs;
    f->c.nprocs = 3;
    f->o.c = &f->c;
    f->o.kind = CCQ_KIND_ALL_REDUCE;
    f->o.seq = seq;
    f->o.status = CCQ_IN_PROGRESS;
    return f;
}

static ucx_hdr from(uint32_t src, uint64_t upto, uint64_t sum)
{
    ucx_hdr h = {.src = src, .prior_upto = upto, .prior_sum = sum};
    return h;
}

static void test_in_order_and_out_of_order(void **state)
{
    (void)state;
    fixture *f = fixture_new(0);
    ucx_hdr h = {0};

    ucx_prior_stamp(&f->c, &h);
    assert_int_equal(h.prior_upto, 0); /* nothing ended: nothing to compare */
    ucx_prior_ended(&f->c, 0, 1, false);
    ucx_prior_ended(&f->c, 2, 1, false); /* out of order: 1 has not ended */
    assert_int_equal(f->c.prior_upto, 1);
    ucx_prior_ended(&f->c, 3, 2, false); /* a fused group of 3 and 4 */
    assert_int_equal(f->c.prior_upto, 1);
    ucx_prior_ended(&f->c, 1, 1, false);
    assert_int_equal(f->c.prior_upto, 5);
    ucx_prior_stamp(&f->c, &h);
    assert_int_equal(h.prior_upto, 5);
    assert_int_equal(h.prior_sum, 0);
    /* A fused group longer than the slots, at prior_upto: passed one by one. */
    ucx_prior_ended(&f->c, 5, 3 * UCX_PRIOR_SLOTS, false);
    assert_false(f->c.prior_off);
    assert_int_equal(f->c.prior_upto, 5 + 3 * UCX_PRIOR_SLOTS);
    free(f);
}

static void test_alone_differs(void **state)
{
    (void)state;
    fixture *f = fixture_new(5);
    ucx_hdr h;

    ucx_prior_ended(&f->c, 0, 3, false);
    ucx_prior_ended(&f->c, 3, 1, true); /* failed alone over a disagreement */
    ucx_prior_ended(&f->c, 4, 1, false);
    ucx_prior_stamp(&f->c, &h);
    assert_int_equal(h.prior_upto, 5);
    assert_true(h.prior_sum == ucx_prior_mix(3));
    /* A member that failed 3 alone too agrees, whichever prefix it saw. */
    h = from(1, 5, ucx_prior_mix(3));
    assert_true(ucx_prior_agrees(&f->o, &h));
    h = from(1, 3, 0);
    assert_true(ucx_prior_agrees(&f->o, &h));
    assert_int_equal(f->o.status, CCQ_IN_PROGRESS);
    /* One that completed 3: the operation fails, the communicator with it, naming both. */
    h = from(2, 4, 0);
    f->o.op_only = true;
    assert_false(ucx_prior_agrees(&f->o, &h));
    assert_int_equal(f->o.status, CCQ_ERR_MISMATCH);
    assert_false(f->o.op_only);
    assert_non_null(strstr(f->o.detail.msg, "process 12 and process 10 (this one) ended the "
                                            "collectives before sequence 4 differently"));
    assert_non_null(strstr(f->o.detail.msg, "this process failed sequence 3 alone"));
    free(f);
}

static void test_member_failed_alone(void **state)
{
    (void)state;
    fixture *f = fixture_new(2);
    ucx_hdr h;

    ucx_prior_ended(&f->c, 0, 2, false);
    /* It failed 1 alone, which completed here. */
    h = from(1, 2, ucx_prior_mix(1));
    assert_false(ucx_prior_agrees(&f->o, &h));
    assert_non_null(strstr(f->o.detail.msg, "this process failed none of the last 64 alone"));
    /* Distinct sequences do not cancel out: failing 1 differs from failing 0. */
    assert_true(ucx_prior_mix(0) != ucx_prior_mix(1));
    free(f);
}

/* Collective 3 in flight here, 0 ended, 1 and 2 still running; a member's message says it
 * ended 0-2 and failed 1 alone. This process cannot tell yet: the message is taken as it is
 * (its own messages of this time said nothing of 1 either), and the operation goes on. */
static void test_member_ahead_taken(void **state)
{
    (void)state;
    fixture *f = fixture_new(3);
    ucx_hdr h = from(1, 3, ucx_prior_mix(1));

    ucx_prior_ended(&f->c, 0, 1, false);
    assert_true(ucx_prior_agrees(&f->o, &h));
    assert_int_equal(f->o.status, CCQ_IN_PROGRESS);
    /* Once 1 and 2 ended here, the same message is compared: 1 completed here, so it differs. */
    ucx_prior_ended(&f->c, 2, 1, false);
    ucx_prior_ended(&f->c, 1, 1, false);
    assert_false(ucx_prior_agrees(&f->o, &h));
    assert_int_equal(f->o.status, CCQ_ERR_MISMATCH);
    free(f);
}

static void test_too_far(void **state)
{
    (void)state;
    fixture *f = fixture_new(UCX_PRIOR_HIST + 10);
    ucx_hdr h;

    ucx_prior_ended(&f->c, 0, UCX_PRIOR_HIST + 10, false);
    /* A prefix this process passed too long ago: not compared. */
    h = from(1, 5, 12345);
    assert_true(ucx_prior_agrees(&f->o, &h));
    assert_int_equal(f->o.status, CCQ_IN_PROGRESS);
    /* An end further above prior_upto than it marks: nothing is stamped or compared again. */
    ucx_prior_ended(&f->c, f->c.prior_upto + 1 + UCX_PRIOR_SLOTS, 1, false);
    assert_true(f->c.prior_off);
    ucx_prior_stamp(&f->c, &h);
    assert_int_equal(h.prior_upto, 0);
    h = from(1, f->c.prior_upto, 12345);
    assert_true(ucx_prior_agrees(&f->o, &h));
    assert_int_equal(f->o.status, CCQ_IN_PROGRESS);
    free(f);
}

static void test_other_channels(void **state)
{
    (void)state;
    fixture *f = fixture_new(2);
    ucx_hdr h = from(1, 2, 99);

    ucx_prior_ended(&f->c, 0, 2, false);
    f->o.chan = 1; /* a pair's sends: not compared */
    assert_true(ucx_prior_agrees(&f->o, &h));
    free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_in_order_and_out_of_order),
        cmocka_unit_test(test_alone_differs),
        cmocka_unit_test(test_member_failed_alone),
        cmocka_unit_test(test_member_ahead_taken),
        cmocka_unit_test(test_too_far),
        cmocka_unit_test(test_other_channels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
