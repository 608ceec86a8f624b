/* The module loader through libccq.so, as an application meets it. This program runs against
 * a copy of libccq.so.0 alone in a directory (tests/modules/CMakeLists.txt puts it there and
 * sets LD_LIBRARY_PATH), so no module is beside it: each module must come from
 * CCQ_MODULE_PATH, and a missing or refused one must be CCQ_ERR_UNSUPPORTED with a detail
 * that names the module, every path tried and why (dlerror(), the ABI, the version).
 * usage: test_modules <the copy's directory> <fake modules' root> <the real modules' directory>
 * The fake modules (fake_module.c) are refused before anything in them runs (they abort). */
/* _GNU_SOURCE (dladdr) comes from the build. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ccq.h"
#include "procs.h"

#ifdef CCQ_TEST_WITH_NCCL
#include "fake/fake_cuda_nccl.h"
#endif

static const char *lib_dir, *fakes, *real_dir;

/* The detail must hold every string given (NULL-terminated). */
static void detail_has(const char *first, ...)
{
    const char *d = ccq_last_error_detail();
    va_list ap;
    print_message("detail: %s\n", d);
    va_start(ap, first);
    for (const char *s = first; s != NULL; s = va_arg(ap, const char *)) {
        if (strstr(d, s) == NULL)
            fail_msg("the detail lacks \"%s\":\n%s", s, d);
    }
    va_end(ap);
}

static ccq_status create(const char *backend, const char *module_path, ccq_runtime **rt)
{
    ccq_config cfg;
    if (module_path != NULL)
        setenv("CCQ_MODULE_PATH", module_path, 1);
    else
        unsetenv("CCQ_MODULE_PATH");
    ccq_config_init(&cfg);
    cfg.backend = backend;
    cfg.host_devices = 2;
    *rt = NULL;
    return ccq_runtime_create(&cfg, rt);
}

/* A path the detail names: dir/libccq-nccl.so.0 (dir under the fake modules' root). */
static const char *fake_path(const char *dir, char *buf, size_t len)
{
    snprintf(buf, len, "%s/%s/libccq-nccl.so.0", fakes, dir);
    return buf;
}

/* The program really runs against the lonely copy: else the modules beside the build's
 * libccq.so would be found and nothing below would test anything. */
static void test_runs_against_the_copy(void **state)
{
    Dl_info info;
    char dir[PATH_MAX], want[PATH_MAX];
    (void)state;
    assert_int_not_equal(dladdr((const void *)&ccq_version, &info), 0);
    snprintf(dir, sizeof dir, "%s", info.dli_fname);
    *strrchr(dir, '/') = '\0';
    assert_non_null(realpath(dir, want));
    assert_non_null(realpath(lib_dir, dir));
    assert_string_equal(want, dir);
}

/* No module anywhere: the detail names the file, libccq's own directory and dlerror(). */
static void test_nccl_missing(void **state)
{
    ccq_runtime *rt;
    char path[PATH_MAX];
    (void)state;
    assert_int_equal(create("nccl", NULL, &rt), CCQ_ERR_UNSUPPORTED);
    assert_null(rt);
    snprintf(path, sizeof path, "%s/libccq-nccl.so.0 (cannot open shared object file", lib_dir);
    detail_has("the nccl backend needs libccq-nccl.so.0", "CCQ_MODULE_PATH", "unset now", path,
               NULL);
    /* CCQ_MODULE_PATH's directories are tried after libccq's, in order, empty ones skipped. */
    assert_int_equal(create("nccl", "::/nonexistent-a:/nonexistent-b:", &rt), CCQ_ERR_UNSUPPORTED);
    detail_has(path, "; /nonexistent-a/libccq-nccl.so.0 (cannot open shared object file",
               "; /nonexistent-b/libccq-nccl.so.0 (cannot open", NULL);
    assert_null(strstr(ccq_last_error_detail(), "unset now"));
    /* The host backend needs no module. */
    assert_int_equal(create("host", NULL, &rt), CCQ_OK);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

/* A module of another ABI or ccq version, one that names another module, a library without
 * the entry symbol, and one whose own library is missing: each refused, with its reason. */
static void test_nccl_refused(void **state)
{
    static const struct {
        const char *dir, *why;
    } cases[] = {
        {"abi", "built for module ABI 1000, this libccq needs "},
        {"version", "built with ccq 0.1.0, this libccq is " CCQ_VERSION_STRING},
        {"name", "its entry names module \"mpi\""},
        {"noentry", "not a ccq module: undefined symbol: ccq_module_nccl"},
        {"nodep", "(libccq-test-dep.so.0: cannot open shared object file"},
    };
    char path[PATH_MAX], dir[PATH_MAX];
    ccq_runtime *rt;
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(dir, sizeof dir, "%s/%s", fakes, cases[i].dir);
        assert_int_equal(create("nccl", dir, &rt), CCQ_ERR_UNSUPPORTED);
        detail_has("the nccl backend needs libccq-nccl.so.0",
                   fake_path(cases[i].dir, path, sizeof path), cases[i].why, NULL);
    }
}

/* Bootstrap "mpi" without its module: refused before anything meets. */
static void test_mpi_bootstrap_missing(void **state)
{
    ccq_config cfg;
    ccq_runtime *rt = NULL;
    (void)state;
    unsetenv("CCQ_MODULE_PATH");
    ccq_config_init(&cfg);
    cfg.world_rank = 0;
    cfg.world_size = 2;
    cfg.bootstrap = "mpi";
    cfg.timeout_ms = 5000;
    assert_int_equal(ccq_runtime_create(&cfg, &rt), CCQ_ERR_UNSUPPORTED);
    detail_has("bootstrap \"mpi\" needs libccq-mpi.so.0", "cannot open shared object file", NULL);
}

/* The host backend in a world of two processes (file bootstrap) without its engines' modules:
 * they meet, and a communicator spanning both is refused at once, naming the modules: both
 * by default (ucx, then mpi), the one asked for by host_engine (CCQ_HOST_ENGINE). */
static const char *engine_want;   /* CCQ_HOST_ENGINE in the children, or NULL */
static const char *engine_say[2]; /* what their detail must say */

static int engine_child(unsigned rank, unsigned nprocs, void *arg)
{
    ccq_device_id all[2] = {0, 1};
    ccq_runtime *rt = NULL;
    ccq_config cfg;
    char boot[96];
    int rc = 0;

    unsetenv("CCQ_MODULE_PATH");
    if (engine_want != NULL)
        setenv("CCQ_HOST_ENGINE", engine_want, 1);
    else
        unsetenv("CCQ_HOST_ENGINE");
    ccq_config_init(&cfg);
    cfg.world_rank = rank;
    cfg.world_size = nprocs;
    cfg.host_devices = 1;
    cfg.timeout_ms = 20000;
    snprintf(boot, sizeof boot, "file:%s", (const char *)arg);
    cfg.bootstrap = boot;
    if (ccq_runtime_create(&cfg, &rt) != CCQ_OK) {
        fprintf(stderr, "rank %u: create: %s\n", rank, ccq_last_error_detail());
        return 1;
    }
    if (ccq_comm_init(rt, all, 2) != CCQ_ERR_UNSUPPORTED ||
        strstr(ccq_last_error_detail(), engine_say[0]) == NULL ||
        (engine_say[1] != NULL && strstr(ccq_last_error_detail(), engine_say[1]) == NULL)) {
        fprintf(stderr, "rank %u: comm_init: %s\n", rank, ccq_last_error_detail());
        rc = 2;
    }
    /* Its own devices still work. */
    if (ccq_comm_init(rt, &all[rank], 1) != CCQ_OK)
        rc = 3;
    ccq_runtime_destroy(rt);
    return rc;
}

static void engine_missing(const char *want, const char *say0, const char *say1)
{
    char dir[64];
    int status[2] = {-1, -1};
    engine_want = want;
    engine_say[0] = say0;
    engine_say[1] = say1;
    procs_tmpdir(dir, sizeof dir);
    int bad = procs_run(2, engine_child, dir, 60, status);
    procs_rmdir(dir);
    if (bad != 0)
        fail_msg("host_engine %s: processes exited with %d, %d", want ? want : "NULL", status[0],
                 status[1]);
}

static void test_engine_missing(void **state)
{
    (void)state;
    engine_missing(NULL,
                   "the host backend cannot span processes: its ucx engine needs libccq-ucx.so.0",
                   "; its mpi engine needs libccq-mpi.so.0");
    engine_missing("ucx",
                   "the host backend cannot span processes: its ucx engine needs libccq-ucx.so.0",
                   NULL);
    engine_missing("mpi",
                   "the host backend cannot span processes: its mpi engine needs libccq-mpi.so.0",
                   NULL);
}

#ifdef CCQ_TEST_WITH_NCCL
/* The real module from the second directory of CCQ_MODULE_PATH (the first holds a refused
 * one), bound to this program's fake CUDA and NCCL; loaded once, then kept. */
static void test_nccl_from_module_path(void **state)
{
    const ccq_device_id devs[2] = {0, 1};
    float src[2][4] = {{1, 2, 3, 4}, {10, 20, 30, 40}}, dst[2][4];
    char path[2 * PATH_MAX + 2];
    ccq_runtime *rt;
    (void)state;
    fake_reset();
    snprintf(path, sizeof path, "%s/abi:%s", fakes, real_dir);
    assert_int_equal(create("nccl", path, &rt), CCQ_OK);
    assert_string_equal(ccq_backend_name(rt), "nccl");
    assert_int_equal(ccq_device_count(rt), 4); /* the fake's */
    assert_int_equal(ccq_comm_init(rt, devs, 2), CCQ_OK);
    for (ccq_device_id d = 0; d < 2; d++)
        assert_int_equal(ccq_all_reduce(rt, d, 0, src[d], dst[d], 4, CCQ_FLOAT32, CCQ_SUM, devs, 2),
                         CCQ_OK);
    for (ccq_device_id d = 0; d < 2; d++)
        assert_int_equal(ccq_sync_collective(rt, d, 0), CCQ_OK);
    for (int i = 0; i < 4; i++)
        assert_true(dst[0][i] == 11.0f * (float)(i + 1) && dst[1][i] == dst[0][i]);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
    /* Kept: found again with CCQ_MODULE_PATH gone. */
    assert_int_equal(create("nccl", NULL, &rt), CCQ_OK);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}
#endif

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runs_against_the_copy), cmocka_unit_test(test_nccl_missing),
        cmocka_unit_test(test_nccl_refused),          cmocka_unit_test(test_mpi_bootstrap_missing),
        cmocka_unit_test(test_engine_missing),
#ifdef CCQ_TEST_WITH_NCCL
        cmocka_unit_test(test_nccl_from_module_path), /* last: it keeps the module loaded */
#endif
    };
    if (argc != 4) {
        fprintf(stderr, "usage: %s <libccq copy's dir> <fake modules' root> <modules' dir>\n",
                argv[0]);
        return 2;
    }
    lib_dir = argv[1];
    fakes = argv[2];
    real_dir = argv[3];
    return cmocka_run_group_tests(tests, NULL, NULL);
}
