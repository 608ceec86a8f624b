/* Issue 11: a binary built against ccq 0.1.0 keeps working with this library. It is
 * compiled with a copy of 0.1.0's ccq_config (not ccq.h) and calls the old
 * ccq_config_init symbol (CCQ_0.1), linked against the shared library: the library must
 * write exactly 0.1.0's layout (guard bytes after it stay intact) and accept it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* ccq 0.1.0's ccq_config, field for field. */
typedef struct v0_config {
    uint32_t struct_size;
    const char *backend;
    uint32_t host_devices;
    uint32_t max_streams;
    uint32_t queue_depth;
    uint32_t max_batch_ops;
    uint64_t timeout_ms;
    uint32_t host_workers;
    uint32_t flags;
    const char *env_error;
    uint32_t spin_us;
    const char *fault;
    uint32_t trace_capacity;
    const char *trace_file;
    uint64_t host_stream_bytes;
} v0_config;

/* 0.1.0's declarations of the calls used (ccq_status is an int-sized enum). */
typedef struct ccq_runtime ccq_runtime;
void ccq_config_init(v0_config *cfg);
int ccq_runtime_create(const v0_config *cfg, ccq_runtime **out);
int ccq_runtime_destroy(ccq_runtime *rt);
uint32_t ccq_device_count(const ccq_runtime *rt);
const char *ccq_last_error_detail(void);

enum { GUARD = 256 };
static struct {
    v0_config cfg;
    unsigned char guard[GUARD];
} mem;

static void test_v0_config_init(void **state)
{
    (void)state;
    memset(&mem, 0xA5, sizeof mem);
    ccq_config_init(&mem.cfg);
    for (int k = 0; k < GUARD; k++)
        if (mem.guard[k] != 0xA5)
            fail_msg("ccq_config_init wrote guard byte %d past 0.1.0's ccq_config", k);
    assert_int_equal(mem.cfg.struct_size, sizeof(v0_config));
    assert_string_equal(mem.cfg.backend, "host");
    assert_int_equal(mem.cfg.max_streams, 64);
    assert_int_equal(mem.cfg.timeout_ms, 600000);
    assert_int_equal(mem.cfg.host_stream_bytes, 0);
    assert_null(mem.cfg.env_error);

    mem.cfg.host_devices = 3;
    ccq_runtime *rt = NULL;
    int st = ccq_runtime_create(&mem.cfg, &rt);
    if (st != 0)
        fail_msg("ccq_runtime_create: %d: %s", st, ccq_last_error_detail());
    assert_int_equal(ccq_device_count(rt), 3);
    assert_int_equal(ccq_runtime_destroy(rt), 0);
    for (int k = 0; k < GUARD; k++)
        assert_int_equal(mem.guard[k], 0xA5);
}

/* The symbol this program bound to is the CCQ_0.1 one. */
static void test_v0_symbol_version(void **state)
{
    (void)state;
    void *v01 = dlvsym(RTLD_DEFAULT, "ccq_config_init", "CCQ_0.1");
    assert_non_null(v01);
    assert_ptr_equal(v01, (void *)ccq_config_init);
    assert_non_null(dlvsym(RTLD_DEFAULT, "ccq_config_init_sized", "CCQ_0.2"));
    /* 0.1.0's event-log calls (80-byte events) are not today's (struct_size events). */
    for (int k = 0; k < 2; k++) {
        const char *name = k ? "ccq_set_event_callback" : "ccq_trace_snapshot";
        void *old = dlvsym(RTLD_DEFAULT, name, "CCQ_0.1"),
             *cur = dlvsym(RTLD_DEFAULT, name, "CCQ_0.2");
        assert_non_null(old);
        assert_non_null(cur);
        assert_ptr_not_equal(old, cur);
    }
}

int main(void)
{
    unsetenv("CCQ_HOST_DEVICES");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_v0_config_init),
        cmocka_unit_test(test_v0_symbol_version),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
