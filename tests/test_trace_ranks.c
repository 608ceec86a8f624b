/* Per-process dumps (issue 14): a real world of 3 processes (file bootstrap, host backend,
 * each with its own communicator) whose dumps get their ranks in their names and headers and
 * which tools/ccq-trace analyzes, naming the rank whose device skipped a collective;
 * trace_file names with %r / %p and the rank appended, the dump's "ccq" header (world, pid,
 * host, clock offset, full device sets, reason), commands still queued at a dump, dumps
 * replacing the file whole, and SIGUSR1 dumps (ccq_config.trace_signal): no handler by
 * default, every runtime of the process dumped, the previous handler chained. The world test
 * forks, so it runs first (before this process has threads); the handler stays installed
 * once a runtime asked for it, so the test without it runs before that one.
 * CCQ_TEST_KEEP_DUMPS=DIR keeps the world's dumps there (docs/img/trace-world.png). */
#include <dirent.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "procs.h"
#include "runtime/trace/trace.h"
#include "test_util.h"

#define NDEV 4

static char dir[256];

static void ok(ccq_status st, const char *what)
{
    if (st != CCQ_OK)
        fail_msg("%s: %s: %s", what, ccq_status_name(st), ccq_last_error_detail());
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long len;
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = xmalloc((size_t)len + 1);
    assert_int_equal(fread(buf, 1, (size_t)len, f), (size_t)len);
    buf[len] = '\0';
    fclose(f);
    return buf;
}

static void has(const char *text, const char *want)
{
    if (strstr(text, want) == NULL)
        fail_msg("the dump lacks %s", want);
}

/* The integer after `key` ("\"pid\":") in text. */
static long long num_after(const char *text, const char *key)
{
    const char *at = strstr(text, key);
    if (at == NULL)
        fail_msg("the dump lacks %s", key);
    return strtoll(at + strlen(key), NULL, 10);
}

static ccq_runtime *make_rt(const char *file, uint32_t trace_signal, uint64_t timeout_ms)
{
    ccq_config cfg;
    ccq_runtime *rt = NULL;
    ccq_config_init(&cfg);
    cfg.host_devices = NDEV;
    cfg.fault = NULL;
    cfg.trace_capacity = 4096;
    cfg.trace_file = file;
    cfg.trace_signal = trace_signal;
    cfg.timeout_ms = timeout_ms;
    ok(ccq_runtime_create(&cfg, &rt), "ccq_runtime_create");
    return rt;
}

static void work(ccq_runtime *rt)
{
    static float a[NDEV][16];
    const ccq_device_id all[NDEV] = {0, 1, 2, 3};
    ok(ccq_comm_init(rt, all, NDEV), "ccq_comm_init");
    for (ccq_device_id d = 0; d < NDEV; d++)
        ok(ccq_all_reduce(rt, d, 0, a[d], a[d], 16, CCQ_FLOAT32, CCQ_SUM, all, NDEV), "ar");
    for (ccq_device_id d = 0; d < NDEV; d++)
        ok(ccq_sync_collective(rt, d, 0), "fence");
}

/* ---- a world of 3 processes, 2 devices each (global 0-1, 2-3, 4-5) ---- */

#define WORLD 3
#define ITERS 6

typedef struct world_job {
    char dir[64];
} world_job;

/* Each process all_reduces over its own two devices; rank 1's device 3 stops after #2, so
 * its device 2 waits in #3 until the watchdog fails it. Exit code: 0, or the step that went
 * wrong. */
static int world_child(unsigned rank, unsigned nprocs, void *arg)
{
    const world_job *j = arg;
    char boot[96], file[128];
    static float a[2][65536];
    ccq_config cfg;
    ccq_runtime *rt;
    ccq_device_id devs[2] = {2 * rank, 2 * rank + 1};

    ccq_config_init(&cfg);
    cfg.host_devices = 2;
    cfg.host_workers = 1;
    cfg.fault = NULL;
    cfg.world_rank = rank;
    cfg.world_size = nprocs;
    snprintf(boot, sizeof boot, "file:%s", j->dir);
    cfg.bootstrap = boot;
    snprintf(file, sizeof file, "%s/trace.json", j->dir); /* no %r: trace.rank<R>.json */
    cfg.trace_file = file;
    cfg.timeout_ms = 300;
    if (ccq_runtime_create(&cfg, &rt) != CCQ_OK) {
        fprintf(stderr, "rank %u: %s\n", rank, ccq_last_error_detail());
        return 10;
    }
    if (ccq_comm_init(rt, devs, 2) != CCQ_OK)
        return 11;
    for (int i = 0; i < ITERS; i++) {
        for (int k = 0; k < 2; k++) {
            if (rank == 1 && k == 1 && i >= 3)
                continue; /* device 3 "hangs" before #3 */
            if (ccq_all_reduce(rt, devs[k], 0, a[k], a[k], 65536, CCQ_FLOAT32, CCQ_SUM, devs, 2) !=
                CCQ_OK)
                return 12;
        }
        sleep_ms(1); /* some "compute" between steps */
    }
    ccq_status st0 = ccq_sync_collective(rt, devs[0], 0), st1 = ccq_sync_collective(rt, devs[1], 0);
    if (st1 != CCQ_OK || st0 != (rank == 1 ? CCQ_ERR_TIMEOUT : CCQ_OK)) {
        fprintf(stderr, "rank %u: fences %s, %s\n", rank, ccq_status_name(st0),
                ccq_status_name(st1));
        return 13;
    }
    return ccq_runtime_destroy(rt) == CCQ_OK ? 0 : 14;
}

static void world_dumps(void **state)
{
    (void)state;
    world_job j;
    int status[WORLD];
    char path[160], want[160], cmd[1024];

    procs_tmpdir(j.dir, sizeof j.dir);
    if (procs_run(WORLD, world_child, &j, 60, status) != 0) {
        for (unsigned r = 0; r < WORLD; r++)
            fprintf(stderr, "rank %u exited with %d\n", r, status[r]);
        procs_rmdir(j.dir);
        fail_msg("the world's processes failed");
    }
    for (unsigned r = 0; r < WORLD; r++) {
        snprintf(path, sizeof path, "%s/trace.rank%u.json", j.dir, r);
        char *text = slurp(path);
        if (text == NULL)
            fail_msg("no dump %s", path);
        snprintf(want, sizeof want, "\"world_rank\":%u,\"world_size\":3,\"local_devices\":[%u,2]",
                 r, 2 * r);
        has(text, want);
        snprintf(want, sizeof want, "\"name\":\"device %u\"", 2 * r + 1);
        has(text, want);
        free(text);
    }
#if defined(CCQ_PYTHON) && defined(CCQ_TRACE_TOOL)
    /* The analysis of the three real dumps names process 1's device 3 (rank 1 of {2,3}) and
     * #3. */
    snprintf(cmd, sizeof cmd,
             "'%s' '%s' analyze %s/trace.rank0.json %s/trace.rank1.json %s/trace.rank2.json "
             "> %s/out.txt; rc=$?; cat %s/out.txt; test $rc = 1 && grep -qF 'not all ranks "
             "joined all_reduce #3: missing rank 1 (device 3, process 1)' %s/out.txt && grep "
             "-qF 'comm {0,1}:' %s/out.txt",
             CCQ_PYTHON, CCQ_TRACE_TOOL, j.dir, j.dir, j.dir, j.dir, j.dir, j.dir, j.dir);
    if (system(cmd) != 0)
        fail_msg("ccq-trace analyze did not name process 1's device 3 and #3");
#else
    (void)cmd;
#endif
    const char *keep = getenv("CCQ_TEST_KEEP_DUMPS");
    if (keep != NULL && *keep != '\0') {
        snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp %s/trace.rank*.json '%s'/", keep, j.dir,
                 keep);
        assert_int_equal(system(cmd), 0);
    }
    procs_rmdir(j.dir);
}

static void expand(void **state)
{
    (void)state;
    char out[64];
    struct {
        const char *tmpl;
        uint32_t rank, size;
        const char *want;
    } cases[] = {
        {"/tmp/t.json", 0, 1, "/tmp/t.json"},              /* a world of one: as given */
        {"/tmp/t.json", 1, 3, "/tmp/t.rank1.json"},        /* before the extension */
        {"/tmp/t", 2, 3, "/tmp/t.rank2"},                  /* none: at the end */
        {"/tmp/a.d/t", 2, 3, "/tmp/a.d/t.rank2"},          /* a dot in a directory is not one */
        {"/tmp/.t", 2, 3, "/tmp/.t.rank2"},                /* nor a leading dot */
        {"/tmp/t.%r.json", 1, 3, "/tmp/t.1.json"},         /* %r: nothing appended */
        {"/tmp/%p-%r", 7, 9, "/tmp/4242-7"},               /* %p */
        {"/tmp/100%%.json", 1, 2, "/tmp/100%.rank1.json"}, /* %% */
        {"/tmp/%x.json", 0, 1, "/tmp/%x.json"},            /* other % sequences are kept */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        size_t n = ccq_trace_expand_path(out, sizeof out, cases[k].tmpl, cases[k].rank,
                                         cases[k].size, 4242);
        assert_int_equal(n, strlen(cases[k].want));
        assert_string_equal(out, cases[k].want);
    }
    /* Too long: the length it would need, and a terminated prefix. */
    assert_true(ccq_trace_expand_path(out, 8, "/tmp/t.json", 1, 3, 1) >= 8);
    assert_int_equal(strlen(out), 7);
}

static void config(void **state)
{
    (void)state;
    ccq_config cfg;
    ccq_runtime *rt = NULL;
    ccq_config_init(&cfg);
    assert_int_equal(cfg.trace_signal, 0);
    cfg.trace_signal = 2;
    assert_int_equal(ccq_runtime_create(&cfg, &rt), CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(ccq_last_error_detail(), "trace_signal is 2"));
    setenv("CCQ_TRACE_SIGNAL", "1", 1);
    ccq_config_init(&cfg);
    assert_int_equal(cfg.trace_signal, 1);
    setenv("CCQ_TRACE_SIGNAL", "yes", 1);
    ccq_config_init(&cfg);
    assert_non_null(cfg.env_error);
    assert_non_null(strstr(cfg.env_error, "CCQ_TRACE_SIGNAL"));
    unsetenv("CCQ_TRACE_SIGNAL");
}

/* The header of a real dump, its file name from %p, no temporary file left behind. */
static void header(void **state)
{
    (void)state;
    char tmpl[300], path[300], host[64];
    snprintf(tmpl, sizeof tmpl, "%s/h.%%p.json", dir);
    snprintf(path, sizeof path, "%s/h.%ld.json", dir, (long)getpid());
    ccq_runtime *rt = make_rt(tmpl, 0, 60000);
    work(rt);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
    char *text = slurp(path);
    if (text == NULL)
        fail_msg("no dump at %s", path);
    has(text, "\"ccq\":{\"format\":1,\"version\":\"" CCQ_VERSION_STRING "\",\"world_rank\":0,"
              "\"world_size\":1,\"local_devices\":[0,4],");
    assert_int_equal(num_after(text, "\"pid\":"), getpid());
    assert_int_equal(gethostname(host, sizeof host), 0);
    host[sizeof host - 1] = '\0';
    char want[128];
    snprintf(want, sizeof want, "\"hostname\":\"%s\",\"backend\":\"host\",\"reason\":\"destroy\"",
             host);
    has(text, want);
    has(text, "\"comms\":[{\"id\":0,\"set\":\"{0,1,2,3}\",\"devices\":[0,1,2,3]}]");
    /* The offset: realtime - monotonic, as measured here (within a second: NTP may slew). */
    struct timespec r, m;
    clock_gettime(CLOCK_REALTIME, &r);
    clock_gettime(CLOCK_MONOTONIC, &m);
    long long off = ((long long)r.tv_sec - m.tv_sec) * 1000000000LL + (r.tv_nsec - m.tv_nsec);
    long long got = num_after(text, "\"realtime_offset_ns\":");
    assert_true(got - off < 1000000000LL && off - got < 1000000000LL);
    assert_true(num_after(text, "\"dump_ns\":") >= num_after(text, "\"t0_ns\":"));
    has(text, "\"kind\":\"all_reduce\",\"state\":\"completed\"");
    free(text);
    DIR *d = opendir(dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (strstr(e->d_name, ".tmp.") != NULL)
            fail_msg("a temporary file was left: %s", e->d_name);
    closedir(d);
    remove(path);
}

/* A dump taken while a command waits for a part that never comes: it says "queued". */
static void queued_at_dump(void **state)
{
    (void)state;
    static float a[16];
    const ccq_device_id pair[2] = {0, 1};
    char path[300];
    snprintf(path, sizeof path, "%s/q.json", dir);
    ccq_runtime *rt = make_rt(NULL, 0, 0);
    ok(ccq_comm_init(rt, pair, 2), "ccq_comm_init");
    ok(ccq_all_reduce(rt, 0, 0, a, a, 16, CCQ_FLOAT32, CCQ_SUM, pair, 2), "ar");
    char *text = NULL;
    /* The scheduler records the submission when it takes the command: dump until it has. */
    for (int i = 0; i < 1000; i++) {
        ok(ccq_trace_dump(rt, path), "ccq_trace_dump");
        text = slurp(path);
        if (text != NULL && strstr(text, "\"state\":\"queued\"") != NULL)
            break;
        free(text);
        text = NULL;
        sleep_ms(2);
    }
    if (text == NULL)
        fail_msg("the dump never showed the command queued");
    has(text, "\"reason\":\"api\"");
    has(text, "{\"ph\":\"e\",\"cat\":\"queued\",\"name\":\"all_reduce #0\"");
    has(text, "\"args\":{\"state\":\"queued\"}}");
    free(text);
    remove(path);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

static volatile sig_atomic_t theirs;
static void their_handler(int sig)
{
    (void)sig;
    theirs++;
}

/* Wait until the dump thread has served n requests in all. */
static void wait_dumps(unsigned long n)
{
    for (int i = 0; i < 5000 && ccq_trace_signal_dumps() < n; i++)
        sleep_ms(2);
    assert_true(ccq_trace_signal_dumps() >= n);
}

static void no_handler_by_default(void **state)
{
    (void)state;
    struct sigaction now;
    ccq_runtime *rt = make_rt(NULL, 0, 60000);
    assert_int_equal(sigaction(SIGUSR1, NULL, &now), 0);
    assert_true(!(now.sa_flags & SA_SIGINFO) && now.sa_handler == SIG_DFL);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

static void sigusr1(void **state)
{
    (void)state;
    char p1[300], p2[300];
    snprintf(p1, sizeof p1, "%s/s1.json", dir);
    snprintf(p2, sizeof p2, "%s/s2.json", dir);
    assert_true(signal(SIGUSR1, their_handler) != SIG_ERR); /* the embedder's, before ccq's */
    unsigned long before = ccq_trace_signal_dumps();

    /* rt2 did not ask for the handler, but has a trace_file: dumped too. */
    ccq_runtime *rt1 = make_rt(p1, 1, 60000), *rt2 = make_rt(p2, 0, 60000);
    work(rt1);
    work(rt2);
    assert_null(slurp(p1)); /* nothing written before the signal */
    assert_int_equal(kill(getpid(), SIGUSR1), 0);
    wait_dumps(before + 1);
    assert_int_equal(theirs, 1); /* chained */
    char *t1 = slurp(p1), *t2 = slurp(p2);
    assert_non_null(t1);
    assert_non_null(t2);
    has(t1, "\"reason\":\"signal\"");
    has(t2, "\"reason\":\"signal\"");
    has(t1, "\"state\":\"completed\"");
    free(t1);
    free(t2);
    remove(p1);
    remove(p2);

    /* Again: each signal is a dump. */
    assert_int_equal(kill(getpid(), SIGUSR1), 0);
    wait_dumps(before + 2);
    t1 = slurp(p1);
    assert_non_null(t1);
    free(t1);
    assert_int_equal(ccq_runtime_destroy(rt1), CCQ_OK);
    assert_int_equal(ccq_runtime_destroy(rt2), CCQ_OK);
    remove(p1);
    remove(p2);

    /* With no runtime left, the handler still chains and nothing dumps (nor dies). */
    unsigned long served = ccq_trace_signal_dumps();
    assert_int_equal(kill(getpid(), SIGUSR1), 0);
    for (int i = 0; i < 1000 && theirs < 3; i++)
        sleep_ms(1);
    assert_int_equal(theirs, 3);
    sleep_ms(20);
    assert_int_equal(ccq_trace_signal_dumps(), served);
    assert_null(slurp(p1));

    /* A new runtime asking for it starts a dump thread again; stale requests are ignored. */
    unsigned long now = ccq_trace_signal_dumps();
    rt1 = make_rt(p1, 1, 60000);
    sleep_ms(20);
    assert_int_equal(ccq_trace_signal_dumps(), now);
    assert_int_equal(kill(getpid(), SIGUSR1), 0);
    wait_dumps(now + 1);
    assert_int_equal(ccq_runtime_destroy(rt1), CCQ_OK);
    t1 = slurp(p1);
    assert_non_null(t1);
    free(t1);
    remove(p1);
}

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/ccq_trace_ranks.XXXXXX", tmp != NULL && *tmp ? tmp : "/tmp");
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    unsetenv("CCQ_TRACE_FILE");
    unsetenv("CCQ_TRACE_SIGNAL");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(world_dumps),    cmocka_unit_test(expand),
        cmocka_unit_test(config),         cmocka_unit_test(header),
        cmocka_unit_test(queued_at_dump), cmocka_unit_test(no_handler_by_default),
        cmocka_unit_test(sigusr1),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(dir);
    return rc;
}
