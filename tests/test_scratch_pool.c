/* The host engines' scratch pool (backends/host/scratch_pool.h): a buffer given back is the
 * next one of its size class handed out (no page faulted in again), capacities are powers of
 * two of at least a page, many buffers are kept up to the byte budget (operations in flight at
 * once each hold one), and beyond it only a few of each size; 64 KiB to 1 MiB come from 2 MiB
 * slabs of huge pages, given back whole. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "backends/host/scratch_pool.h"

static void test_reuse_and_classes(void **state)
{
    ccq_scratch_pool pool = {{0}};
    size_t cap, cap2;
    (void)state;
    char *a = ccq_pool_get(&pool, 1, &cap);
    assert_non_null(a);
    assert_int_equal(cap, 4096);
    assert_int_equal((uintptr_t)a % 4096, 0);
    memset(a, 1, cap);
    ccq_pool_put(&pool, a, cap);
    assert_int_equal(pool.bytes, 4096);
    assert_ptr_equal(ccq_pool_get(&pool, 4000, &cap2), a); /* same class: reused */
    assert_int_equal(cap2, 4096);
    assert_int_equal(pool.bytes, 0);
    char *b = ccq_pool_get(&pool, 4097, &cap); /* the next class: never the smaller buffer */
    assert_int_equal(cap, 8192);
    ccq_pool_put(&pool, a, cap2);
    char *c = ccq_pool_get(&pool, 5000, &cap2);
    assert_ptr_not_equal(c, a);
    ccq_pool_put(&pool, c, cap2);
    ccq_pool_put(&pool, b, cap);
    ccq_pool_free(&pool);
    assert_int_equal(pool.bytes, 0);
    assert_int_equal(pool.count[12], 0);
}

/* Buffers below 64 KiB are kept up to the byte budget, each on its own: 2048 of 32 KiB fill
 * 64 MiB, more are freed; past the budget only CCQ_POOL_PER_CLASS of a size are kept. */
static void test_budget(void **state)
{
    enum { N = 2100, K = 32 * 1024 };
    static void *p[N];
    ccq_scratch_pool pool = {{0}};
    size_t cap = 0;
    (void)state;
    for (int i = 0; i < N; i++)
        assert_non_null(p[i] = ccq_pool_get(&pool, K, &cap));
    assert_int_equal(cap, K);
    for (int i = 0; i < N; i++)
        ccq_pool_put(&pool, p[i], cap);
    assert_int_equal(pool.bytes, CCQ_POOL_BYTES); /* 2048 kept, the other 52 freed */
    assert_int_equal(pool.nslab, 0);
    char *big[6];
    size_t bcap = 0;
    for (int i = 0; i < 6; i++)
        assert_non_null(big[i] = ccq_pool_get(&pool, (size_t)3 << 20, &bcap));
    assert_int_equal(bcap, (size_t)4 << 20);
    assert_int_equal((uintptr_t)big[0] % (2u << 20), 0); /* huge-page aligned */
    for (int i = 0; i < 6; i++)
        ccq_pool_put(&pool, big[i], bcap);
    assert_int_equal(pool.count[22], CCQ_POOL_PER_CLASS); /* over the budget: 4 of them */
    assert_int_equal(pool.bytes, CCQ_POOL_BYTES + CCQ_POOL_PER_CLASS * bcap);
    ccq_pool_free(&pool);
    assert_int_equal(pool.bytes, 0);
}

/* Whether every slab's buffers are all back, and the kept bytes are exactly whole slabs. */
static void assert_slabs_whole(const ccq_scratch_pool *pool)
{
    for (uint32_t s = 0; s < pool->nslab; s++)
        assert_int_equal(pool->slab[s].out, 0);
    assert_int_equal(pool->bytes, (size_t)pool->nslab * (2u << 20));
}

/* 64 KiB to 1 MiB come from 2 MiB slabs of huge pages: 90 buffers of 256 KiB (a DDP step's
 * scratch in flight) take 12 slabs, come back and are all handed out again without a new
 * slab; past the budget a slab whose buffers are all back goes back to the system whole, one
 * with a buffer still out never does. */
static void test_slabs(void **state)
{
    enum { N = 300, K = 256 * 1024, PER = (2 << 20) / K };
    static char *p[N];
    ccq_scratch_pool pool = {{0}};
    size_t cap = 0;
    (void)state;
    for (int i = 0; i < 90; i++) {
        assert_non_null(p[i] = ccq_pool_get(&pool, 200 * 1024, &cap));
        assert_int_equal(cap, K);
        assert_int_equal((uintptr_t)p[i] % K, 0);
        memset(p[i], i, cap); /* every byte of it is this process's to write */
    }
    assert_int_equal(pool.nslab, (90 + PER - 1) / PER);
    assert_int_equal(pool.bytes, (size_t)(pool.nslab * PER - 90) * K); /* the 12th's rest */
    for (uint32_t s = 0; s < pool.nslab; s++) {
        assert_int_equal((uintptr_t)pool.slab[s].base % (2u << 20), 0);
        if (s > 0) /* in address order */
            assert_true(pool.slab[s - 1].base < pool.slab[s].base);
    }
    for (int i = 0; i < 90; i++)
        for (int j = 0; j < i; j++)
            assert_ptr_not_equal(p[i], p[j]);
    for (int i = 0; i < 90; i++)
        ccq_pool_put(&pool, p[i], cap);
    assert_slabs_whole(&pool);
    for (int i = 0; i < 90; i++) /* every one reused */
        assert_non_null(p[i] = ccq_pool_get(&pool, K, &cap));
    assert_int_equal(pool.nslab, (90 + PER - 1) / PER);
    for (int i = 90; i < N; i++)
        assert_non_null(p[i] = ccq_pool_get(&pool, K, &cap));
    assert_int_equal(pool.nslab, (N + PER - 1) / PER); /* 75 MiB out */
    /* All back but p[0]: over the budget, whole slabs go until the pool is within a slab of
     * it; p[0]'s slab stays. */
    for (int i = 1; i < N; i++)
        ccq_pool_put(&pool, p[i], cap);
    assert_true(pool.bytes <= CCQ_POOL_BYTES + (2u << 20));
    assert_true(pool.bytes > CCQ_POOL_BYTES - (2u << 20));
    assert_true(pool.count[18] >= CCQ_POOL_PER_CLASS);
    uint32_t s0 = 0;
    while (s0 < pool.nslab &&
           !(p[0] >= pool.slab[s0].base && p[0] < pool.slab[s0].base + (2 << 20)))
        s0++;
    assert_true(s0 < pool.nslab);
    assert_int_equal(pool.slab[s0].out, 1);
    memset(p[0], 7, cap); /* still its own */
    ccq_pool_put(&pool, p[0], cap);
    assert_slabs_whole(&pool);
    ccq_pool_free(&pool);
    assert_int_equal(pool.bytes, 0);
    assert_int_equal(pool.nslab, 0);
    ccq_pool_put(&pool, p[0], cap); /* its slab is gone: ignored (defensive) */
    assert_int_equal(pool.bytes, 0);
}

/* CCQ_SCRATCH_POISON: a buffer handed out again untouched passes; one written after it was
 * given back (a transfer outliving its operation) aborts the process at the next get. */
static void test_poison(void **state)
{
    ccq_scratch_pool pool = {{0}};
    size_t cap;
    int status;
    (void)state;
    setenv("CCQ_SCRATCH_POISON", "1", 1);
    char *a = ccq_pool_get(&pool, 64 * 1024, &cap);
    assert_non_null(a);
    memset(a, 3, cap);
    ccq_pool_put(&pool, a, cap);
    assert_int_equal(pool.poison, 2);
    assert_int_equal((unsigned char)a[0], 0xa5);
    assert_ptr_equal(ccq_pool_get(&pool, 64 * 1024, &cap), a); /* untouched: handed out */
    ccq_pool_put(&pool, a, cap);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(2);    /* the abort's message is expected */
        a[1000] = 1; /* a late write */
        (void)ccq_pool_get(&pool, 64 * 1024, &cap);
        _exit(0);
    }
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
    ccq_pool_free(&pool);
    unsetenv("CCQ_SCRATCH_POISON");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reuse_and_classes),
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_slabs),
        cmocka_unit_test(test_poison),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
